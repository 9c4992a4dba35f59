// Builds decorator-lite.js into a component: node build.mjs OUT.wasm
// componentize-js is called directly (not through `jco componentize`), with
// every WASI feature disabled so the component imports only sluice:plugin,
// and without AOT (weval downloads a binary at first use).
import { writeFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { componentize } from "@bytecodealliance/componentize-js";

const here = (path) => fileURLToPath(new URL(path, import.meta.url));
const out = process.argv[2] ?? here("decorator-lite.wasm");

const { component } = await componentize({
  sourcePath: here("decorator-lite.js"),
  witPath: process.env.SLUICE_WIT ?? here("../../../wit"),
  worldName: "plugin",
  disableFeatures: ["stdio", "random", "clocks", "http", "fetch-event"],
});
await writeFile(out, component);
console.log(`wrote ${out} (${component.length} bytes)`);
