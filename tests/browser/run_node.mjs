// node run_node.mjs MODULE.mjs CTX.json OUT.json: the node side of tests/browser_env.py.
// Dawn (the `webgpu` package, Chrome's own WebGPU) on the Vulkan driver named by VK_ICD_FILENAMES.
import { readFileSync, writeFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import { create, globals } from "webgpu";
import { runTest } from "./harness.mjs";

Object.assign(globalThis, globals);  // GPUBufferUsage, GPUMapMode, ... as in a browser
// as in Chromium, anything logged at the error level fails the run
const logged = [];
const consoleError = console.error;
console.error = (...args) => { logged.push(args.join(" ")); consoleError(...args); };

const [modulePath, ctxPath, outPath] = process.argv.slice(2);
const ctx = JSON.parse(readFileSync(ctxPath, "utf8"));
try {
  const value = await runTest(create([]), pathToFileURL(modulePath).href, { ...ctx, env: "node" });
  if (logged.length) throw new Error("the module logged errors (above)");
  writeFileSync(outPath, JSON.stringify(value));
  process.exit(0);
} catch (error) {
  consoleError(String((error && error.stack) || error));
  process.exit(1);
}
