// Builds fetch-check.js into a component: node build.mjs OUT.wasm
// It reuses the componentize-js that `npm ci` installed for the
// decorator-lite example (../js/node_modules): an ES module import does not
// read NODE_PATH, so it is imported by path. World `outbound-plugin`, with
// the `http` feature left on: that is what backs `fetch`. No AOT (weval
// downloads a binary at first use).
import { writeFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";

const here = (path) => fileURLToPath(new URL(path, import.meta.url));
const { componentize } = await import(
  new URL("../js/node_modules/@bytecodealliance/componentize-js/src/componentize.js", import.meta.url)
);
const out = process.argv[2] ?? here("fetch-check.wasm");

const { component } = await componentize({
  sourcePath: here("fetch-check.js"),
  witPath: process.env.SLUICE_WIT ?? here("../../../wit"),
  worldName: "outbound-plugin",
  disableFeatures: ["stdio", "random", "clocks", "fetch-event"],
});
await writeFile(out, component);
console.log(`wrote ${out} (${component.length} bytes)`);
