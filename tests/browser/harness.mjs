// The one harness that tests/browser_env.py runs in both places, headless Chromium (harness.html)
// and node + the `webgpu` package (run_node.mjs): get a GPUDevice, run the test module's default
// export `async function (device, ctx)`, fail on any WebGPU error, and encode the result as JSON.
//
// WebGPU validation errors do not throw: they go to the device's uncapturederror event and the
// command is skipped, so a broken pipeline reads back zeros. The harness collects them and fails
// the run with their messages, after waiting for the submitted work.

export async function runTest(gpu, moduleUrl, ctx) {
  if (!gpu) {
    throw new Error("WebGPU is not available here (navigator.gpu is undefined): Chromium needs " +
                    "--enable-unsafe-webgpu on http://localhost pages served without https");
  }
  const adapter = await gpu.requestAdapter();
  if (!adapter) throw new Error("requestAdapter() returned null: no WebGPU adapter");
  // "default": the limits every WebGPU device has, what a web page gets unless it asks for more
  // (8 storage buffers per stage); "adapter": everything the adapter offers.
  const requiredLimits = {};
  if (ctx.limits === "adapter") {
    for (const key in adapter.limits) requiredLimits[key] = adapter.limits[key];
  }
  const device = await adapter.requestDevice({ requiredLimits });
  const gpuErrors = [];
  device.onuncapturederror = (event) => gpuErrors.push(event.error.message);
  let lost = null;
  device.lost.then((info) => { lost = info; });

  const mod = await import(moduleUrl);
  if (typeof mod.default !== "function") {
    throw new Error(`${moduleUrl} has no default export: write "export default async function (device, ctx) {...}"`);
  }
  const value = await mod.default(device, { ...ctx, adapter });
  await device.queue.onSubmittedWorkDone();
  if (gpuErrors.length) throw new Error("WebGPU reported errors:\n" + gpuErrors.join("\n"));
  if (lost) throw new Error(`the WebGPU device was lost (${lost.reason}): ${lost.message}`);
  device.destroy();
  return encode(value);
}

// Typed arrays travel bit-exact (NaN, -0 and all) as base64; Python decodes them to NumPy arrays.
export function encode(value) {
  if (ArrayBuffer.isView(value) && !(value instanceof DataView)) {
    const bytes = new Uint8Array(value.buffer, value.byteOffset, value.byteLength);
    let binary = "";
    for (let i = 0; i < bytes.length; i += 0x8000) {
      binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
    }
    return { $typed: value.constructor.name, base64: btoa(binary) };
  }
  if (Array.isArray(value)) return value.map(encode);
  if (value && typeof value === "object") {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, encode(v)]));
  }
  return value;
}
