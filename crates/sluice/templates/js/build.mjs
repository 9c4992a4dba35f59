// Builds filter.js into a component: node build.mjs OUT.wasm [WORLD]
// componentize-js is called directly (not through `jco componentize`), with
// every WASI feature disabled so the component imports only what the gateway
// grants, and without AOT (weval downloads a binary at first use).
import { writeFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { componentize } from "@bytecodealliance/componentize-js";

const here = (path) => fileURLToPath(new URL(path, import.meta.url));
const out = process.argv[2] ?? here("{{name}}.wasm");
const worldName = process.argv[3] ?? "plugin";

const { component } = await componentize({
  sourcePath: here("filter.js"),
  witPath: here("wit"),
  worldName,
  disableFeatures: ["stdio", "random", "clocks", "http", "fetch-event"],
});
await writeFile(out, component);
console.log(`wrote ${out} (${component.length} bytes)`);
