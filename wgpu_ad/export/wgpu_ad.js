/**
 * wgpu_ad.js: run kernels exported by wgpu_ad (`ti.export(...)`) in a browser or in node + `webgpu`.
 * A dependency-free ES module; it reads the folder `ti.export` wrote (manifest.json and one .wgsl file
 * per task) and needs nothing but a GPUDevice. The manifest's format: wgpu_ad/export/FORMAT.md.
 *
 *   import { load } from "./wgpu_ad.js";
 *   const adapter = await navigator.gpu.requestAdapter();
 *   const device = await adapter.requestDevice();        // default limits are enough (ti.export checked)
 *   const prog = await load(device, new URL("./export/", import.meta.url));   // the folder's URL
 *   // options: {read: async (file) => text} instead of fetch; {subgroups: false}: the portable shaders
 *   // even where the export has a subgroup variant and the device the "subgroups" feature
 *   prog.variant                              // "subgroups" where that variant runs, else "portable"
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
 *   await prog.tape("loss", async (t) => {         // ti.ad.Tape(loss=...): zeroes every gradient
 *     await t.run("step", {...});                   //   and the loss, records the runs made through t,
 *     await t.run("compute_loss", {});              //   seeds loss.grad = 1, then runs each recorded
 *   });                                             //   launch's gradient sequence in reverse order.
 *                                                   // While it records, prog.run / grad / fwd / tape /
 *                                                   // clearGradients throw (an event handler's launch
 *                                                   // would join the tape): `await prog.idle()` first.
 *                                                   // A body without a parameter records every
 *                                                   // prog.run() made until it ends, from anywhere.
 *   await prog.idle()                               // resolves when no tape is recording
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

// WebGPU's numeric flags (the globals GPUBufferUsage / GPUShaderStage / GPUMapMode may be absent in node)
const MAP_READ = 1, COPY_SRC = 4, COPY_DST = 8, UNIFORM = 64, STORAGE = 128, COMPUTE = 4;
const FORMAT = "wgpu_ad-export", VERSION = 1;
const ERROR_WORDS = 16;          // wgpu_ad/plan.py: the error buffer's words (+1: the loop-limit word)
const DYNAMIC_WORKGROUPS = 1024; // a range read from fields: this many workgroups grid-stride over it
const TYPED = { f32: Float32Array, i32: Int32Array, u32: Uint32Array, u1: Uint32Array, f16: Uint16Array };

/** Load an exported folder: its manifest, its WGSL, every pipeline (a shader the device refuses fails here). */
export async function load(device, base, options = {}) {
  const read = options.read ?? reader(base);
  const manifest = JSON.parse(await read("manifest.json"));
  if (manifest.format !== FORMAT || manifest.version !== VERSION) {
    throw new Error(`wgpu_ad.js: ${base} holds format ${manifest.format} version ${manifest.version}; ` +
                    `this wgpu_ad.js reads ${FORMAT} version ${VERSION} (export again with this wgpu_ad)`);
  }
  for (const f of manifest.features) {
    if (!device.features.has(f)) throw new Error(`wgpu_ad.js: the export needs the device feature '${f}'; request it in requestDevice({requiredFeatures: [...]})`);
  }
  for (const [k, v] of Object.entries(manifest.required_limits)) {
    if (!(device.limits[k] >= v)) throw new Error(`wgpu_ad.js: the export needs ${k} >= ${v}, the device has ${device.limits[k]}; request it in requestDevice({requiredLimits: {${k}: ${v}}})`);
  }
  // the subgroup variant of a kernel, where exported (ti.export(..., subgroups=True)), on a device with the feature
  const files = new Set();
  const useSub = options.subgroups !== false && device.features.has("subgroups");
  for (const k of Object.values(manifest.kernels)) {
    const v = useSub && k.variants && k.variants.subgroups;
    for (const p of programs(v || k)) for (const t of p.tasks) files.add(t.file);
  }
  const texts = {};
  await Promise.all([...files].map(async (f) => { texts[f] = await read(f); }));
  const prog = new Program(device, manifest);
  prog.variant = "portable";
  for (const k of Object.values(manifest.kernels)) {
    const v = k.variants && k.variants.subgroups;
    if (useSub && v) {
      Object.assign(k, { forward: v.forward, grad: v.grad, dual: v.dual, call: v.call });
      prog.variant = "subgroups";
    }
  }
  await prog._build(texts);
  return prog;
}

function reader(base) {
  let url = String(base instanceof URL ? base.href : base);
  if (!url.endsWith("/")) url += "/";
  return async (name) => {
    const u = new URL(name, url);
    if (u.protocol === "file:") {  // node: fetch() does not read files
      const fs = await import("node:fs/promises");
      return fs.readFile(u, "utf8");
    }
    const r = await fetch(u);
    if (!r.ok) throw new Error(`wgpu_ad.js: could not fetch ${u}: ${r.status} ${r.statusText}`);
    return r.text();
  };
}

function programs(k) { return [k.forward, k.grad, k.dual].filter((p) => p); }
function padded(bytes) { return Math.max(16, Math.ceil(bytes / 16) * 16); }

/** An ndarray made by prog.ndarray(): a buffer, its shape, and its gradient / dual handles. */
class Ndarray {
  constructor(prog, dtype, shape, elementShape, role) {
    if (!TYPED[dtype]) throw new Error(`wgpu_ad.js: ndarray dtype must be one of ${Object.keys(TYPED).join(", ")}, got ${dtype}`);
    this.prog = prog; this.dtype = dtype; this.shape = [...shape]; this.elementShape = [...elementShape];
    this.scalars = [...shape, ...elementShape].reduce((a, b) => a * b, 1);
    this.buffer = prog._storage(this.scalars * 4, `ndarray${role}`);
    this.grad = null; this.dual = null; this.role = role;
  }
  write(data) { this.prog._write(this.buffer, this.dtype, this.scalars, data, "ndarray"); }
  read() { return this.prog._read(this.buffer, this.dtype, this.scalars); }
  fill(v) { this.write(new TYPED[this.dtype](this.scalars).fill(v)); }
  destroy() { for (const a of [this, this.grad, this.dual]) if (a) { a.buffer.destroy(); this.prog._arrays.delete(a); } }
}

class Program {
  constructor(device, manifest) {
    this.device = device; this.manifest = manifest;
    this.fields = manifest.buffers; this.kernels = manifest.kernels;
    this.buffers = {};
    for (const [name, b] of Object.entries(manifest.buffers)) this.buffers[name] = this._storage(b.bytes, name);
    this.errorBuffer = this._storage((ERROR_WORDS + 1) * 4, "wgpu_ad.errors");
    this.retBuffer = this._storage(16, "wgpu_ad.ret");
    this.stackBuffer = null;
    this.maxScratch = Math.min(device.limits.maxStorageBufferBindingSize, device.limits.maxBufferSize, 1 << 28);
    this._arrays = new Set();   // live ndarray gradients (clearGradients zeroes them)
    this._last = {};            // kernel -> its latest forward launch (what .grad() reads)
    this._tape = null;          // the launches a tape records
    this._recorder = null;      // the recorder a tape's body launches through (tape(loss, async (t) => ...))
    this._tapeDone = null;      // settles when that tape is done (idle())
    this._asserting = new Map(); // programs with asserts launched since the last check -> what they are
    this._seed = 0;
  }

  async _build(texts) {
    const jobs = [];
    for (const k of Object.values(this.kernels)) {
      for (const p of programs(k)) {
        p._uniform = p.uniform.words.length ? this.device.createBuffer({ size: p.uniform.bytes, usage: UNIFORM | COPY_DST }) : null;
        for (const t of p.tasks) jobs.push(this._pipeline(t, texts[t.file]));
      }
    }
    await Promise.all(jobs);
  }

  async _pipeline(t, code) {
    const d = this.device;
    const module = d.createShaderModule({ label: t.name, code });
    const layout = d.createBindGroupLayout({ label: t.name, entries: t.bindings.map((b) => ({ binding: b.binding, visibility: COMPUTE, buffer: { type: b.type } })) });
    t._layout = layout;
    try {
      t._pipeline = await d.createComputePipelineAsync({ label: t.name, layout: d.createPipelineLayout({ bindGroupLayouts: [layout] }), compute: { module, entryPoint: t.entry_point } });
    } catch (e) {
      const info = await module.getCompilationInfo();
      const msgs = info.messages.map((m) => `${t.file}:${m.lineNum}:${m.linePos}: ${m.type}: ${m.message}`).join("\n");
      throw new Error(`wgpu_ad.js: the device refused task '${t.name}' (${t.file}): ${e.message}${msgs ? "\n" + msgs : ""}`);
    }
  }

  _storage(bytes, label) {
    return this.device.createBuffer({ label, size: padded(bytes), usage: STORAGE | COPY_SRC | COPY_DST });
  }

  _field(name) {
    const b = this.buffers[name];
    if (!b) throw new Error(`wgpu_ad.js: no field '${name}' in the export; it has ${Object.keys(this.buffers).join(", ")}`);
    return b;
  }

  // ---- fields ---------------------------------------------------------------------------------
  write(name, data) { const f = this.fields[name]; this._write(this._field(name), f.dtype, f.scalars, data, `field '${name}'`); }
  read(name) { const f = this.fields[name]; return this._read(this._field(name), f.dtype, f.scalars); }
  fill(name, v) { const f = this.fields[name]; this.write(name, new TYPED[f.dtype](f.scalars).fill(v)); }

  _write(buffer, dtype, n, data, what) {
    if (data.length !== n) throw new Error(`wgpu_ad.js: ${what} has ${n} scalars, got ${data.length} values`);
    const arr = data instanceof TYPED[dtype] ? data : TYPED[dtype].from(data, dtype === "u1" ? Number : undefined);
    const bytes = new Uint8Array(padded(arr.byteLength));
    bytes.set(new Uint8Array(arr.buffer, arr.byteOffset, arr.byteLength));
    this.device.queue.writeBuffer(buffer, 0, bytes);
  }

  async _read(buffer, dtype, n) {
    await this._checkErrors();
    const out = await this._readBytes(buffer, buffer.size);
    return new TYPED[dtype](out.buffer, 0, n);
  }

  async _readBytes(buffer, size) {
    const staging = this.device.createBuffer({ size, usage: MAP_READ | COPY_DST });
    const enc = this.device.createCommandEncoder();
    enc.copyBufferToBuffer(buffer, 0, staging, 0, size);
    this.device.queue.submit([enc.finish()]);
    await staging.mapAsync(MAP_READ);
    const copy = new Uint8Array(staging.getMappedRange().slice(0));
    staging.unmap(); staging.destroy();
    return copy;
  }

  ndarray(dtype, shape, opts = {}) {
    const es = opts.elementShape ?? [];
    const a = new Ndarray(this, dtype, shape, es, "");
    if (opts.grad) { a.grad = new Ndarray(this, dtype, shape, es, ".grad"); this._arrays.add(a.grad); }
    if (opts.dual) a.dual = new Ndarray(this, dtype, shape, es, ".dual");
    return a;
  }

  clearGradients() {
    this._free("clearGradients()");
    this._clearGradients();
  }

  _clearGradients() {
    const enc = this.device.createCommandEncoder();
    for (const [name, b] of Object.entries(this.fields)) if (b.role === "grad") enc.clearBuffer(this.buffers[name]);
    for (const a of this._arrays) enc.clearBuffer(a.buffer);
    this.device.queue.submit([enc.finish()]);
  }

  async sync() { await this.device.queue.onSubmittedWorkDone(); }

  // ---- launches -------------------------------------------------------------------------------
  async run(kernel, args = {}) {
    this._free(`run('${kernel}')`);
    return this._run(kernel, args);
  }

  async _run(kernel, args) {
    const k = this._kernel(kernel);
    const vals = this._args(kernel, k, args);
    const rec = { kernel, vals, snaps: [], scratch: [] };
    const enc = this.device.createCommandEncoder();
    let ret;
    for (const step of k.call.forward) {
      if (step.op === "snapshot") {
        const src = this._resolve(step.of, rec, kernel);
        const copy = this.device.createBuffer({ label: `${kernel}.snapshot${step.index}`, size: src.size, usage: STORAGE | COPY_SRC | COPY_DST });
        enc.copyBufferToBuffer(src, 0, copy, 0, src.size);
        rec.snaps[step.index] = copy;
      } else if (step.op === "scratch") {
        const s = k.forward.scratch[step.index];
        const make = (r) => this._storage(s.count * 4, `${kernel}.sum${r}`);
        rec.scratch[step.index] = { buf: make(""), grad: make(".grad"), dual: make(".dual") };
      } else if (step.op === "dispatch") {
        this._dispatch(enc, kernel, k[step.program], step.task, rec);
      } else if (step.op === "read_return") {
        ret = step.dtype;
      } else throw new Error(`wgpu_ad.js: unknown step '${step.op}' in kernel '${kernel}' (newer export?)`);
    }
    this.device.queue.submit([enc.finish()]);
    if (this._tape) this._tape.push(rec);
    else if (this._last[kernel] && !this._last[kernel].taped) release(this._last[kernel]);
    rec.taped = !!this._tape;
    this._last[kernel] = rec;
    if (ret) {
      await this._checkErrors();
      const bytes = await this._readBytes(this.retBuffer, 16);
      return new TYPED[ret](bytes.buffer, 0, 1)[0];
    }
    return undefined;
  }

  async grad(kernel, args = {}) {
    this._free(`grad('${kernel}')`);
    const k = this._kernel(kernel);
    if (!k.grad) throw new Error(`wgpu_ad.js: kernel '${kernel}' was exported without a gradient (nothing it touches had needs_grad=True, it reads or writes gradients itself, or grad=False)`);
    const vals = this._args(kernel, k, args);
    const last = this._last[kernel];
    if ((k.forward.snapshots.length || k.forward.scratch.length) && !last) {
      throw new Error(`wgpu_ad.js: ${kernel}.grad() needs the values kept by its forward launch: run it before its grad()`);
    }
    this._gradLaunch({ kernel, vals, snaps: last ? last.snaps : [], scratch: last ? last.scratch : [] });
  }

  async fwd(kernel, args = {}) {
    this._free(`fwd('${kernel}')`);
    const k = this._kernel(kernel);
    if (!k.dual) throw new Error(`wgpu_ad.js: kernel '${kernel}' was exported without a dual kernel (export with dual=True, fields with needs_dual=True)`);
    const rec = { kernel, vals: this._args(kernel, k, args), snaps: [], scratch: [] };
    rec.scratch = k.forward.scratch.map((s) => ({ buf: this._storage(s.count * 4), grad: null, dual: this._storage(s.count * 4) }));
    const enc = this.device.createCommandEncoder();
    k.dual.tasks.forEach((_, n) => this._dispatch(enc, kernel, k.dual, n, rec));
    this.device.queue.submit([enc.finish()]);
  }

  async tape(loss, body) {
    this._free(`tape('${loss}')`);
    if (this._tape) throw new Error("wgpu_ad.js: tape() inside tape()");
    const lossGrad = this.fields[loss] && this.fields[loss].grad;
    if (!lossGrad) throw new Error(`wgpu_ad.js: tape('${loss}'): the loss must be an exported field with a gradient (needs_grad=True)`);
    this._clearGradients();
    this.fill(loss, 0);
    const recs = this._tape = [];
    // a body that takes the recorder launches through it, and the program refuses other launches
    // until the tape is done (an event handler's run() while the body awaits would be recorded)
    let done = () => {};
    if (body.length >= 1) {
      this._recorder = { run: (kernel, args = {}) => this._run(kernel, args) };
      this._tapeDone = new Promise((resolve) => { done = resolve; });
    }
    try { await body(this._recorder); } finally {
      this._tape = null; this._recorder = null; this._tapeDone = null; done();
    }
    this.fill(lossGrad, 1);
    for (let n = recs.length - 1; n >= 0; n--) {
      if (this.kernels[recs[n].kernel].grad) this._gradLaunch(recs[n]);
      if (this._last[recs[n].kernel] !== recs[n]) release(recs[n]);
      else recs[n].taped = false;
    }
  }

  /** Resolves when no tape is recording (see tape()): `await prog.idle()` before launching from an event handler. */
  idle() { return this._tapeDone ?? Promise.resolve(); }

  _free(what) {
    if (this._recorder) {
      throw new Error(`wgpu_ad.js: ${what} while a tape is recording: inside the tape's body launch through the ` +
                      "recorder it is given (t.run); elsewhere (an event handler) wait for the tape: await prog.idle()");
    }
  }

  _gradLaunch(rec) {
    const k = this.kernels[rec.kernel];
    const enc = this.device.createCommandEncoder();
    for (const step of k.call.grad) {
      if (step.op === "zero") enc.clearBuffer(rec.scratch[step.target.index].grad);
      else if (step.op === "dispatch") this._dispatch(enc, rec.kernel, k.grad, step.task, rec);
      else throw new Error(`wgpu_ad.js: unknown step '${step.op}' in kernel '${rec.kernel}' (newer export?)`);
    }
    this.device.queue.submit([enc.finish()]);
  }

  _kernel(name) {
    const k = this.kernels[name];
    if (!k) throw new Error(`wgpu_ad.js: no kernel '${name}' in the export; it has ${Object.keys(this.kernels).join(", ")}`);
    return k;
  }

  _args(kernel, k, args) {
    const names = new Set(k.params.map((p) => p.name));
    for (const a of Object.keys(args)) {
      if (!names.has(a)) throw new Error(`wgpu_ad.js: kernel '${kernel}' has no parameter '${a}'; its parameters: ${[...names].join(", ") || "none"}`);
    }
    return k.params.map((p) => {
      const v = args[p.name];
      if (p.kind === "template") return null;  // compiled in by ti.export
      if (v === undefined) throw new Error(`wgpu_ad.js: kernel '${kernel}': missing argument '${p.name}' (${p.kind} ${p.dtype})`);
      if (p.kind === "scalar") {
        if (typeof v !== "number" && typeof v !== "boolean") throw new Error(`wgpu_ad.js: kernel '${kernel}': argument '${p.name}' must be a ${p.dtype} number, got ${typeof v}`);
        if (p.dtype !== "f32" && p.dtype !== "f16" && !Number.isInteger(Number(v))) throw new Error(`wgpu_ad.js: kernel '${kernel}': argument '${p.name}' must be an integer (${p.dtype}), got ${v}`);
        return Number(v);
      }
      if (p.kind === "vector") {
        const n = p.shape.reduce((a, b) => a * b, 1);
        const flat = Array.from(v).flat(2);
        if (flat.length !== n) throw new Error(`wgpu_ad.js: kernel '${kernel}': argument '${p.name}' must have ${n} components, got ${flat.length}`);
        return flat.map(Number);
      }
      if (!(v instanceof Ndarray) || v.dtype !== p.dtype || v.shape.length !== p.ndim || String(v.elementShape) !== String(p.element_shape)) {
        throw new Error(`wgpu_ad.js: kernel '${kernel}': argument '${p.name}' must be an ndarray made by prog.ndarray("${p.dtype}", <${p.ndim} extents>, {elementShape: [${p.element_shape}]})`);
      }
      return v;
    });
  }

  _resolve(src, rec, kernel) {
    const need = (a, what) => {
      if (!a) throw new Error(`wgpu_ad.js: kernel '${kernel}': argument '${src.name}' needs a ${what}: make it with prog.ndarray(..., {${what}: true})`);
      return a.buffer;
    };
    switch (src.kind) {
      case "field": return this._field(src.name);
      case "arg": return rec.vals[src.arg].buffer;
      case "arg_grad": return need(rec.vals[src.arg].grad, "grad");
      case "arg_dual": return need(rec.vals[src.arg].dual, "dual");
      case "snapshot": return rec.snaps[src.index];
      case "scratch": return rec.scratch[src.index].buf;
      case "scratch_grad": return rec.scratch[src.index].grad;
      case "scratch_dual": return rec.scratch[src.index].dual;
      default: throw new Error(`wgpu_ad.js: unknown buffer source '${src.kind}' (newer export?)`);
    }
  }

  _words(p, rec) {
    const w = p.uniform.words;
    const vals = w.map((word) => {
      const s = word.source;
      switch (s.kind) {
        case "scalar": return rec.vals[s.arg];
        case "component": return rec.vals[s.arg][s.index];
        case "extent": return rec.vals[s.arg].shape[s.dim];
        case "seed": return this._nextSeed();
        case "stack_capacity": return 0;
        default: throw new Error(`wgpu_ad.js: unknown uniform word '${s.kind}' (newer export?)`);
      }
    });
    w.forEach((word, n) => {
      if (word.source.kind === "stack_capacity") vals[n] = Math.max(1, evaluate(word.source.end, vals) - evaluate(word.source.begin, vals));
    });
    return vals;
  }

  _dispatch(enc, kernel, p, n, rec) {
    if (!p._vals || p._rec !== rec) {  // one uniform block per launch of a program
      p._vals = this._words(p, rec); p._rec = rec;
      if (p._uniform) {
        const dv = new DataView(new ArrayBuffer(p.uniform.bytes));
        p.uniform.words.forEach((word, i) => {
          const v = p._vals[i];
          if (word.type === "f32") dv.setFloat32(i * 4, v, true);
          else if (word.type === "i32") dv.setInt32(i * 4, v, true);
          else dv.setUint32(i * 4, Number(v) >>> 0, true);
        });
        this.device.queue.writeBuffer(p._uniform, 0, dv.buffer);
      }
    }
    const t = p.tasks[n], vals = p._vals;
    const stack = t.stack.words + t.stack.plus_uniform_words.reduce((a, i) => a + vals[i], 0);
    let wg = 1;
    if (!t.serial) {
      const cap = t.grid_cap == null ? p.grid_cap : Math.min(p.grid_cap, t.grid_cap);
      if (t.range == null) wg = Math.min(DYNAMIC_WORKGROUPS, cap);
      else {
        const count = Math.max(0, evaluate(t.range[1], vals) - evaluate(t.range[0], vals));
        if (count <= 0) return;
        wg = Math.min(Math.ceil(count / t.workgroup_size), cap);
      }
      if (stack) wg = Math.max(1, Math.min(wg, Math.floor(this.maxScratch / (stack * 4 * t.workgroup_size))));
    }
    if (stack) this._stack((t.serial ? 1 : wg * t.workgroup_size) * stack * 4, kernel);
    if (p.asserts.length) {
      const k = this.kernels[kernel];
      this._asserting.set(p, p === k.grad ? `the adjoint of kernel '${kernel}'` : p === k.dual ? `the dual kernel of '${kernel}'` : `kernel '${kernel}'`);
    }
    const entries = t.bindings.map((b) => {
      let buffer;
      if (b.kind === "args") return { binding: b.binding, resource: { buffer: p._uniform, offset: 0, size: p.uniform.bytes } };
      if (b.kind === "buffer") buffer = this._resolve(p.buffers[b.buffer], rec, kernel);
      else buffer = { error: this.errorBuffer, ret: this.retBuffer, stack: this.stackBuffer }[b.kind];
      if (!buffer) throw new Error(`wgpu_ad.js: kernel '${kernel}': no buffer for binding ${b.binding} (${b.kind})`);
      return { binding: b.binding, resource: { buffer } };
    });
    const pass = enc.beginComputePass({ label: t.name });
    pass.setPipeline(t._pipeline);
    pass.setBindGroup(0, this.device.createBindGroup({ layout: t._layout, entries }));
    pass.dispatchWorkgroups(wg);
    pass.end();
  }

  _stack(bytes, kernel) {
    if (bytes > this.maxScratch) throw new Error(`wgpu_ad.js: kernel '${kernel}': its autodiff stacks need ${bytes} bytes, more than the device's largest storage binding (${this.maxScratch})`);
    if (!this.stackBuffer || this.stackBuffer.size < bytes) {
      if (this.stackBuffer) this.stackBuffer.destroy();
      let size = 1 << 16;
      while (size < bytes) size *= 2;
      this.stackBuffer = this._storage(Math.min(size, this.maxScratch), "wgpu_ad.ad_stacks");
    }
  }

  async _checkErrors() {
    if (!this._asserting.size) return;
    const ran = [...this._asserting];
    this._asserting.clear();
    const bytes = await this._readBytes(this.errorBuffer, this.errorBuffer.size);
    const words = new Uint32Array(bytes.buffer);
    if (!words[0]) return;
    this.device.queue.writeBuffer(this.errorBuffer, 0, new Uint32Array(ERROR_WORDS + 1));
    // the launches since the last check share the error buffer: name the first that has such an assert
    const [p, what] = ran.find(([q]) => q.asserts.length >= words[0]) ?? ran[0];
    const a = p.asserts[words[0] - 1];
    if (!a) throw new Error(`wgpu_ad.js: ${what} failed assert #${words[0]}`);
    const view = new DataView(bytes.buffer);
    let k = 0;
    const message = a.message.replace(/\{[^}]*\}/g, () => {
      k += 1;
      const dt = a.dtypes[k - 1];
      return String(dt === "f32" ? view.getFloat32(4 * k, true) : dt === "i32" ? view.getInt32(4 * k, true) : words[k]);
    });
    throw new Error(`wgpu_ad.js: ${what}: ${message}`);
  }

  _nextSeed() {  // splitmix32, as the Python runtime's next_seed (seed 0)
    this._seed += 1;
    let z = Math.imul(this._seed, 0x6D2B79F5) >>> 0;
    z = Math.imul(z ^ (z >>> 16), 0x85EBCA6B) >>> 0;
    z = Math.imul(z ^ (z >>> 13), 0xC2B2AE35) >>> 0;
    return (z ^ (z >>> 16)) >>> 0;
  }
}

function release(rec) {
  for (const b of rec.snaps) if (b) b.destroy();
  for (const s of rec.scratch) for (const b of [s.buf, s.grad, s.dual]) if (b) b.destroy();
}

// wgpu_ad/plan.py evaluate(): expressions over the uniform words, on 32-bit integers
const WRAP = { i32: (v) => BigInt.asIntN(32, v), u32: (v) => BigInt.asUintN(32, v), u1: (v) => (v ? 1n : 0n) };
const OPS = {
  add: (a, b) => a + b, sub: (a, b) => a - b, mul: (a, b) => a * b,
  div: (a, b) => (b === 0n ? a : a / b),
  floordiv: (a, b) => (b === 0n ? a : (a / b) - (((a % b) !== 0n && ((a < 0n) !== (b < 0n))) ? 1n : 0n)),
  mod: (a, b) => (b === 0n ? 0n : (((a % b) + b) % b)),
  min: (a, b) => (a < b ? a : b), max: (a, b) => (a > b ? a : b),
  neg: (a) => -a, abs: (a) => (a < 0n ? -a : a), cast: (a) => a,
  select: (c, a, b) => (c ? a : b),
  lt: (a, b) => a < b, le: (a, b) => a <= b, gt: (a, b) => a > b, ge: (a, b) => a >= b, eq: (a, b) => a === b, ne: (a, b) => a !== b,
};
function evalBig(e, words) {
  if (e[0] === "const") return BigInt(e[1]);
  if (e[0] === "word") return BigInt(Math.trunc(Number(words[e[1]])));
  const args = e.slice(2).map((x) => evalBig(x, words));
  const r = OPS[e[0]](...args);
  return WRAP[e[1]](typeof r === "boolean" ? (r ? 1n : 0n) : r);
}
export function evaluate(e, words) { return Number(evalBig(e, words)); }
