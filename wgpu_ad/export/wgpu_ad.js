/**
 * wgpu_ad.js: run kernels exported by wgpu_ad (`ti.export(...)`) in a browser or in node + `webgpu`.
 * A dependency-free ES module; it reads the folder `ti.export` wrote (manifest.json and one .wgsl file
 * per task) and needs nothing but a GPUDevice. The manifest's format: wgpu_ad/export/FORMAT.md.
 *
 *   import { load } from "./wgpu_ad.js";
 *   const adapter = await navigator.gpu.requestAdapter();
 *   const device = await adapter.requestDevice();        // default limits are enough (ti.export checked)
 *   const prog = await load(device, new URL("./export/", import.meta.url));   // folder URL, or {fetch}
 *
 * Fields (by the name in the manifest; "x.grad" and "x.dual" are the companions):
 *   prog.write("x", typedArray | number[])   // flat, row-major over the shape, components innermost;
 *                                            // length = the field's scalar count (manifest buffers[..].scalars)
 *   await prog.read("x")                     // -> Float32Array | Int32Array | Uint32Array, same order
 *   prog.fill("x", 0)                        // every scalar
 *   prog.fields                              // the manifest's buffer records, by name
 *
 * ndarray arguments: handles made here, passed to kernels by parameter name.
 *   const a = prog.ndarray("f32", [n], {elementShape: [3], grad: true, dual: false});
 *   a.write(typedArray); await a.read(); a.fill(0);
 *   a.grad  // the gradient's handle (when grad: true), with write / read / fill
 *   a.shape, a.dtype, a.destroy()
 *
 * Launches (scalar arguments by parameter name; vectors as arrays; ndarrays as handles):
 *   await prog.run("substep", {dt: 1e-3, pos: a})   // the forward kernel; resolves to its return value
 *                                                   // (a number) or undefined; the work is submitted
 *   await prog.grad("substep", {dt: 1e-3, pos: a})  // kernel.grad(): its adjoint, reading the
 *                                                   // snapshots / sums of this kernel's latest run
 *   await prog.fwd("substep", {...})                // the dual kernel (forward mode), when exported with dual=True
 *   await prog.tape("loss", async () => {          // ti.ad.Tape(loss=...): zeroes every gradient
 *     await prog.run("step", {...});                //   and the loss, records the runs inside,
 *     await prog.run("compute_loss", {});           //   seeds loss.grad = 1, then runs each recorded
 *   });                                             //   launch's gradient sequence in reverse order
 *   prog.clearGradients()                           // every gradient (fields' and ndarrays') to zero
 *   await prog.sync()                               // wait for submitted work
 *
 * Errors: a bad name, argument or array length throws an Error naming the kernel, the argument and what
 * was expected. Failed asserts of a kernel (an autodiff loop stack that overflowed) are checked at the
 * next read() and thrown there with the kernel's message. Everything else (pipelines, bind groups) is
 * validated by WebGPU; load() waits for every pipeline, so a shader the browser refuses fails in load().
 *
 * What runs: each kernel's unchecked forward and its adjoint (the data access rules that wgpu_ad checks
 * on a tape in Python are not checked here: check the program in Python first, see docs/browser.md).
 */
