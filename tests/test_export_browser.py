"""Exported kernels (ti.export) run by wgpu_ad.js in node + Dawn and in headless Chromium, both on
SwiftShader, against the same kernels run by wgpu_ad in Python and against float64 references.

Each case is one script of operations (write a field, run a kernel, a tape, read a field ...) that
runs twice: in Python on wgpu_ad (run_python) and in JavaScript on wgpu_ad.js (DRIVER, through
tests/browser_env.py). Gradients are also checked against analytic or central-difference float64
references, never only against wgpu_ad's own numbers.

Tolerances are per op (TOL): WGSL allows sin and cos an absolute error (SwiftShader's sin is off by
up to 6e-4, lavapipe's far less), the arithmetic and sqrt are within a few ulps; sums of float32
atomics may add in another order, which the relative part covers.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import browser_env as B
import wgpu_ad as ti

pytestmark = pytest.mark.gpu
ENVS = ["node", "chromium"]

# (rtol, atol) by the least accurate op a result goes through
TOL = {"arith": (2e-5, 1e-6), "sqrt": (5e-5, 1e-6), "sin": (1e-4, 2e-3)}

DRIVER = """
import { load } from "./export/wgpu_ad.js";
export default async function (device, ctx) {
  const arrays = {}, out = {};
  const argsOf = (a) => Object.fromEntries(Object.entries(a || {}).map(([k, v]) => [k, v && v.nd ? arrays[v.nd] : v]));
  const target = (op) => (op.nd ? (op.grad ? arrays[op.nd].grad : arrays[op.nd]) : null);
  async function exec(ops, t) {
    for (const op of ops) {
      if (op.op === "ndarray") arrays[op.id] = prog.ndarray(op.dtype, op.shape, { elementShape: op.elementShape || [], grad: op.grad });
      else if (op.op === "write") op.nd ? target(op).write(op.data) : prog.write(op.name, op.data);
      else if (op.op === "run") { const r = await (t || prog).run(op.kernel, argsOf(op.args)); if (op.as) out[op.as] = r; }
      else if (op.op === "grad") await prog.grad(op.kernel, argsOf(op.args));
      else if (op.op === "tape" && op.recorder) await prog.tape(op.loss, (rec) => exec(op.body, rec));
      else if (op.op === "tape") await prog.tape(op.loss, () => exec(op.body));
      else if (op.op === "intrude") {  // an event handler's launch, while the body awaits
        setTimeout(async () => {
          try { if (op.wait) await prog.idle(); await prog.run(op.kernel, argsOf(op.args)); out[op.as] = "ran"; }
          catch (e) { out[op.as] = String(e.message); }
        }, 0);
      } else if (op.op === "sleep") await new Promise((r) => setTimeout(r, op.ms));
      else if (op.op === "read") out[op.as] = op.nd ? await target(op).read() : await prog.read(op.name);
      else if (op.op === "fwd_mode") {  // ti.ad.FwdMode(loss, param, seed): zero the duals, seed, run duals
        for (const [name, b] of Object.entries(prog.fields)) if (b.role === "dual") prog.fill(name, 0);
        prog.write(op.param + ".dual", op.seed);
        for (const r of op.body) await prog.fwd(r.kernel, argsOf(r.args));
      } else if (op.op === "error") {
        try { await prog[op.call](op.kernel, argsOf(op.args)); out[op.as] = null; } catch (e) { out[op.as] = String(e.message); }
      }
      else throw new Error("unknown op " + op.op);
    }
  }
  out.maxStorageBuffersPerShaderStage = device.limits.maxStorageBuffersPerShaderStage;
  if (ctx.args.loadOnly) {
    try { await load(device, new URL("export/", ctx.base)); out.loadError = null; } catch (e) { out.loadError = String(e.message); }
    return out;
  }
  const errors = [];
  if (ctx.args.subgroups) {  // a device of our own, with the feature (the harness's has none)
    // the harness's adapter made its device: a new one (node: the `webgpu` package by its file URL)
    const gpu = ctx.env === "node" ? (await import(ctx.args.webgpu)).create([]) : navigator.gpu;
    const adapter = await gpu.requestAdapter();
    if (!adapter.features.has("subgroups")) return { noSubgroups: true };
    device = await adapter.requestDevice({ requiredFeatures: ["subgroups"] });
    device.onuncapturederror = (e) => errors.push(e.error.message);
  }
  const prog = await load(device, new URL("export/", ctx.base));
  out.variant = prog.variant;
  await exec(ctx.args.ops);
  await device.queue.onSubmittedWorkDone();
  if (errors.length) throw new Error("WebGPU errors: " + errors.join("\\n"));
  return out;
}
"""


def run_python(ops: list, fields: dict, kernels: dict) -> dict:
    """The same script on wgpu_ad in Python."""
    arrays, out = {}, {}

    def args_of(a):
        return {k: arrays[v["nd"]] if isinstance(v, dict) else v for k, v in (a or {}).items()}

    def target(op):
        st = arrays[op["nd"]] if op.get("nd") else fields[op["name"].split(".")[0]]
        if op.get("name", "").endswith(".dual"):
            return st.dual
        return st.grad if op.get("grad") or op.get("name", "").endswith(".grad") else st

    def run(ops):
        for op in ops:
            kind = op["op"]
            if kind == "ndarray":
                es = op.get("elementShape") or []
                dt = ti.types.vector(es[0], ti.f32) if es else ti.f32
                arrays[op["id"]] = ti.ndarray(dt, tuple(op["shape"]), needs_grad=op.get("grad", False))
            elif kind == "write":
                st = target(op)
                st.from_numpy(np.asarray(op["data"], np.float32).reshape(tuple(st.shape) + tuple(st.element_shape)))
            elif kind == "run":
                args = {k: ti.Vector(v) if isinstance(v, list) else v for k, v in args_of(op.get("args")).items()}
                r = kernels[op["kernel"]](**args)
                if op.get("as"):
                    out[op["as"]] = r
            elif kind == "grad":
                kernels[op["kernel"]].grad(**args_of(op.get("args")))
            elif kind == "fwd_mode":
                with ti.ad.FwdMode(loss=fields[op["loss"]], param=fields[op["param"]], seed=op["seed"]):
                    run(op["body"])
            elif kind == "tape":
                with ti.ad.Tape(loss=fields[op["loss"]]):
                    run(op["body"])
            elif kind == "read":
                out[op["as"]] = target(op).to_numpy().astype(np.float32).ravel()
    run(ops)
    return out


def run_js(env: str, tmp_path, args: dict, chromium=None, limits: str = "default") -> dict:
    B.require(env)
    (tmp_path / "driver.mjs").write_text(DRIVER)
    return B.run_module(env, tmp_path / "driver.mjs", tmp_path, args, browser=chromium, limits=limits,
                        timeout=120)


def close(a, b, tol: str, scale: float = 1.0):
    rtol, atol = TOL[tol]
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=rtol, atol=atol * scale)


# ---- the cases ----------------------------------------------------------------------------------

def gravity_case():
    n, eps = 7, 0.05
    x = ti.Vector.field(2, ti.f32, shape=n, needs_grad=True, name="x")
    U = ti.field(ti.f32, shape=(), needs_grad=True, name="U")

    @ti.kernel
    def potential():
        for i in range(n):
            for j in range(n):
                if i < j:
                    r = x[i] - x[j]
                    U[None] += -1.0 / ti.sqrt(r.dot(r) + eps)

    p = np.random.default_rng(1).uniform(-1, 1, (n, 2))
    ops = [{"op": "write", "name": "x", "data": p.ravel().tolist()},
           {"op": "tape", "loss": "U", "body": [{"op": "run", "kernel": "potential"}]},
           {"op": "read", "name": "U", "as": "U"}, {"op": "read", "name": "x.grad", "as": "grad"}]
    p = p.astype(np.float32).astype(np.float64)
    d = p[:, None, :] - p[None, :, :]
    r2 = (d ** 2).sum(-1) + eps
    iu = np.triu_indices(n, 1)
    ref_u = -(1 / np.sqrt(r2[iu])).sum()
    ref_grad = (d / r2[..., None] ** 1.5 * (1 - np.eye(n))[..., None]).sum(1)  # dU/dx_i
    return dict(fields={"x": x, "U": U}, kernels={"potential": potential}, exports=[potential], ops=ops,
                ref={"U": [ref_u], "grad": ref_grad.ravel()}, tol="sqrt")


def cloth_case():
    """difftaichi's pattern: the state indexed by the step, springs on a w x w grid."""
    w, k, dt, g, steps = 4, 30.0, 0.01, -9.8, 3
    n, rest = w * w, 1.0 / (w - 1)
    x = ti.Vector.field(2, ti.f32, shape=(steps + 1, n), needs_grad=True, name="x")
    v = ti.Vector.field(2, ti.f32, shape=(steps + 1, n), needs_grad=True, name="v")
    f = ti.Vector.field(2, ti.f32, shape=(steps, n), needs_grad=True, name="f")
    L = ti.field(ti.f32, shape=(), needs_grad=True, name="L")

    @ti.kernel
    def forces(t: ti.i32):
        for i in range(n):
            acc = ti.Vector([0.0, g])
            r, c = i // w, i % w
            for o in ti.static(range(4)):
                dr, dc = ti.static([(0, 1), (0, -1), (1, 0), (-1, 0)][o])
                if 0 <= r + dr < w and 0 <= c + dc < w:
                    d = x[t, (r + dr) * w + c + dc] - x[t, i]
                    length = d.norm()
                    acc += k * (length - rest) * d / length
            f[t, i] = acc

    @ti.kernel
    def update(t: ti.i32, dt: ti.f32):
        for i in range(n):
            v[t + 1, i] = v[t, i] + dt * f[t, i]
            x[t + 1, i] = x[t, i] + dt * v[t + 1, i]

    @ti.kernel
    def loss():
        for i in range(n):
            L[None] += x[steps, i][1] + 0.3 * x[steps, i][0] * x[steps, i][0]

    rng = np.random.default_rng(2)
    grid = np.stack(np.meshgrid(np.arange(w), np.arange(w), indexing="ij"), -1).reshape(n, 2)[:, ::-1] * rest
    x0 = (grid + rng.uniform(-0.05, 0.05, (n, 2))).astype(np.float32)
    v0 = rng.uniform(-0.1, 0.1, (n, 2)).astype(np.float32)
    body = [op for t in range(steps) for op in ({"op": "run", "kernel": "forces", "args": {"t": t}},
                                               {"op": "run", "kernel": "update", "args": {"t": t, "dt": dt}})]
    body.append({"op": "run", "kernel": "loss"})
    pad = np.zeros((steps, n, 2), np.float32)
    ops = [{"op": "write", "name": "x", "data": np.concatenate([x0[None], pad]).ravel().tolist()},
           {"op": "write", "name": "v", "data": np.concatenate([v0[None], pad]).ravel().tolist()},
           {"op": "tape", "loss": "L", "body": body},
           {"op": "read", "name": "L", "as": "L"}, {"op": "read", "name": "x", "as": "x"},
           {"op": "read", "name": "x.grad", "as": "gx"}, {"op": "read", "name": "v.grad", "as": "gv"}]

    def simulate(xs, vs):
        hist = [xs]
        for _ in range(steps):
            fs = np.tile([0.0, g], (n, 1))
            for i in range(n):
                r, c = divmod(i, w)
                for dr, dc in ((0, 1), (0, -1), (1, 0), (-1, 0)):
                    if 0 <= r + dr < w and 0 <= c + dc < w:
                        d = xs[(r + dr) * w + c + dc] - xs[i]
                        ln = np.linalg.norm(d)
                        fs[i] += k * (ln - rest) * d / ln
            vs = vs + dt * fs
            xs = xs + dt * vs
            hist.append(xs)
        return (xs[:, 1] + 0.3 * xs[:, 0] ** 2).sum(), np.stack(hist)

    x64, v64 = x0.astype(np.float64), v0.astype(np.float64)
    ref_l, ref_x = simulate(x64, v64)
    gx, gv, h = np.zeros_like(x64), np.zeros_like(v64), 1e-6
    for arr, out in ((x64, gx), (v64, gv)):
        for idx in np.ndindex(arr.shape):
            arr[idx] += h
            up = simulate(x64, v64)[0]
            arr[idx] -= 2 * h
            down = simulate(x64, v64)[0]
            arr[idx] += h
            out[idx] = (up - down) / (2 * h)
    # the gradients of step 0 (the initial state) are the ones a reference is computed for
    first = slice(0, n * 2)
    return dict(fields={"x": x, "v": v, "f": f, "L": L}, kernels={"forces": forces, "update": update, "loss": loss},
                exports=[forces, update, loss], ops=ops, pick={"gx": first, "gv": first},
                ref={"L": [ref_l], "x": ref_x.ravel(), "gx": gx.ravel(), "gv": gv.ravel()}, tol="sqrt", scale=10)


def in_place_case():
    """A kernel that updates a field in place: its adjoint reads the copy taken before its launch
    (a snapshot in the launch sequence)."""
    n, s = 6, 1.5
    x = ti.field(ti.f32, shape=n, needs_grad=True, name="x")
    L = ti.field(ti.f32, shape=(), needs_grad=True, name="L")

    @ti.kernel
    def square_in_place(s: ti.f32):
        for i in range(n):
            x[i] = x[i] * x[i] * s

    @ti.kernel
    def total():
        for i in range(n):
            L[None] += x[i]

    x0 = np.linspace(-1, 1, n).astype(np.float32)
    ops = [{"op": "write", "name": "x", "data": x0.tolist()},
           {"op": "tape", "loss": "L", "body": [{"op": "run", "kernel": "square_in_place", "args": {"s": s}},
                                                {"op": "run", "kernel": "total"}]},
           {"op": "read", "name": "x", "as": "x"}, {"op": "read", "name": "x.grad", "as": "grad"}]
    x64 = x0.astype(np.float64)
    return dict(fields={"x": x, "L": L}, kernels={"square_in_place": square_in_place, "total": total},
                exports=[square_in_place, total], ops=ops, ref={"x": s * x64 ** 2, "grad": 2 * s * x64}, tol="arith")


def loop_stack_case():
    n, iters = 5, 6
    a = ti.field(ti.f32, shape=n, needs_grad=True, name="a")
    y = ti.field(ti.f32, shape=n, needs_grad=True, name="y")
    L = ti.field(ti.f32, shape=(), needs_grad=True, name="L")

    @ti.kernel
    def iterate(k: ti.i32):
        for i in range(n):
            t = a[i]
            for j in range(k):
                t = ti.sin(t) * 1.3 + 0.2 * t
            y[i] = t

    @ti.kernel
    def total():
        for i in range(n):
            L[None] += y[i]

    a0 = np.linspace(-1.2, 1.4, n).astype(np.float32)
    ops = [{"op": "write", "name": "a", "data": a0.tolist()},
           {"op": "tape", "loss": "L", "body": [{"op": "run", "kernel": "iterate", "args": {"k": iters}},
                                                {"op": "run", "kernel": "total"}]},
           {"op": "read", "name": "y", "as": "y"}, {"op": "read", "name": "a.grad", "as": "grad"}]
    t, dt_ = a0.astype(np.float64), np.ones(n)
    for _ in range(iters):
        t, dt_ = np.sin(t) * 1.3 + 0.2 * t, dt_ * (np.cos(t) * 1.3 + 0.2)
    return dict(fields={"a": a, "y": y, "L": L}, kernels={"iterate": iterate, "total": total},
                exports=[iterate, total], ops=ops, ref={"y": t, "grad": dt_}, tol="sin", scale=iters)


def reduction_case():
    n = 300
    x = ti.field(ti.f32, shape=n, needs_grad=True, name="x")
    S = ti.field(ti.f32, shape=(), needs_grad=True, name="S")

    @ti.kernel
    def sum_squares():
        for i in x:
            S[None] += x[i] * x[i]

    x0 = np.random.default_rng(3).uniform(-1, 1, n).astype(np.float32)
    ops = [{"op": "write", "name": "x", "data": x0.tolist()},
           {"op": "tape", "loss": "S", "body": [{"op": "run", "kernel": "sum_squares"}]},
           {"op": "read", "name": "S", "as": "S"}, {"op": "read", "name": "x.grad", "as": "grad"}]
    x64 = x0.astype(np.float64)
    return dict(fields={"x": x, "S": S}, kernels={"sum_squares": sum_squares}, exports=[sum_squares], ops=ops,
                ref={"S": [(x64 ** 2).sum()], "grad": 2 * x64}, tol="arith")


def ndarray_case():
    n, s = 9, 0.7
    L = ti.field(ti.f32, shape=(), needs_grad=True, name="L")

    @ti.kernel
    def cubes(a: ti.types.ndarray(), s: ti.f32) -> ti.f32:
        for i in range(a.shape[0]):
            L[None] += s * a[i] * a[i] * a[i]
        return s * 2.0

    arr = ti.ndarray(ti.f32, (n,), needs_grad=True)
    a0 = np.linspace(-1, 1.5, n).astype(np.float32)
    ops = [{"op": "ndarray", "id": "a", "dtype": "f32", "shape": [n], "grad": True},
           {"op": "write", "nd": "a", "data": a0.tolist()},
           {"op": "write", "name": "L", "data": [0.0]},
           {"op": "run", "kernel": "cubes", "args": {"a": {"nd": "a"}, "s": s}, "as": "ret"},
           {"op": "write", "name": "L.grad", "data": [1.0]},
           {"op": "grad", "kernel": "cubes", "args": {"a": {"nd": "a"}, "s": s}},
           {"op": "read", "name": "L", "as": "L"}, {"op": "read", "nd": "a", "grad": True, "as": "grad"}]
    a64 = a0.astype(np.float64)
    return dict(fields={"L": L}, kernels={"cubes": cubes}, exports=[(cubes, (arr, s))], ops=ops,
                ref={"L": [s * (a64 ** 3).sum()], "grad": 3 * s * a64 ** 2, "ret": 2 * s}, tol="arith")


def dual_case():
    """Forward mode: the dual kernel (ti.export(..., dual=True)) gives dL/dx . seed."""
    n = 5
    x = ti.field(ti.f32, shape=n, needs_dual=True, name="x")
    L = ti.field(ti.f32, shape=(), needs_dual=True, name="L")

    @ti.kernel
    def energy(s: ti.f32):
        for i in range(n):
            L[None] += s * ti.sqrt(x[i] * x[i] + 1.0)

    x0 = np.linspace(-2, 2, n).astype(np.float32)
    seed = np.linspace(0.5, 1.5, n).astype(np.float32)
    ops = [{"op": "write", "name": "x", "data": x0.tolist()}, {"op": "write", "name": "L", "data": [0.0]},
           {"op": "fwd_mode", "loss": "L", "param": "x", "seed": seed.tolist(),
            "body": [{"op": "run", "kernel": "energy", "args": {"s": 2.0}}]},
           {"op": "read", "name": "L", "as": "L"}, {"op": "read", "name": "L.dual", "as": "jvp"}]
    x64 = x0.astype(np.float64)
    return dict(fields={"x": x, "L": L}, kernels={"energy": energy}, exports=[energy], export_kw={"dual": True},
                ops=ops, ref={"L": [2 * np.sqrt(x64 ** 2 + 1).sum()], "jvp": [(2 * x64 / np.sqrt(x64 ** 2 + 1) * seed).sum()]},
                tol="sqrt")


def vector_arg_case():
    """A vector argument (its components are uniform words) and a matrix field (row-major elements)."""
    n = 3
    p = ti.Vector.field(2, ti.f32, shape=n, name="p")
    M = ti.Matrix.field(2, 2, ti.f32, shape=n, name="M")

    @ti.kernel
    def shift(d: ti.types.vector(2, ti.f32), s: ti.f32):
        for i in range(n):
            p[i] = p[i] * s + d
            M[i] = p[i].outer_product(d)

    p0 = np.arange(2 * n, dtype=np.float32).reshape(n, 2)
    d, s = np.array([0.5, -2.0]), 3.0
    ops = [{"op": "write", "name": "p", "data": p0.ravel().tolist()},
           {"op": "run", "kernel": "shift", "args": {"d": d.tolist(), "s": s}},
           {"op": "read", "name": "p", "as": "p"}, {"op": "read", "name": "M", "as": "M"}]
    p1 = p0 * s + d
    return dict(fields={"p": p, "M": M}, kernels={"shift": shift}, exports=[shift], ops=ops,
                ref={"p": p1.ravel(), "M": np.einsum("ij,k->ijk", p1, d).ravel()}, tol="arith")


CASES = {"dual": dual_case, "vector_arg": vector_arg_case, "gravity": gravity_case, "cloth": cloth_case, "loop_stack": loop_stack_case, "in_place": in_place_case,
         "reduction_0d": reduction_case, "ndarray_and_scalar": ndarray_case}


def check_case(env, tmp_path, chromium, case: str, subgroups: bool = False):
    c = CASES[case]()
    m = ti.export(tmp_path / "export", c["exports"], subgroups=subgroups, **c.get("export_kw", {}))
    py = run_python(c["ops"], c["fields"], c["kernels"])
    webgpu = (B.HARNESS / "node_modules" / "webgpu" / "index.js").as_uri()
    js = run_js(env, tmp_path, {"ops": c["ops"], "subgroups": subgroups, "webgpu": webgpu}, chromium)
    if js.get("noSubgroups"):
        pytest.skip(f"{env}'s adapter has no 'subgroups' feature")
    scale = c.get("scale", 1)
    for key, ref in c["ref"].items():
        pick = c.get("pick", {}).get(key, slice(None))
        got_js = np.atleast_1d(np.asarray(js[key], np.float64))[pick]
        got_py = np.atleast_1d(np.asarray(py[key], np.float64))[pick]
        close(got_py, ref, c["tol"], scale)       # wgpu_ad in Python against the float64 reference
        close(got_js, ref, c["tol"], scale)       # wgpu_ad.js against it
        close(got_js, got_py, c["tol"], scale)    # and the two runtimes against each other
    return m, js


@pytest.mark.parametrize("env", ENVS)
@pytest.mark.parametrize("case", list(CASES))
def test_exported_kernels_match_python_and_reference(case, env, tmp_path, chromium):
    B.require(env)
    m, js = check_case(env, tmp_path, chromium, case)
    assert js["variant"] == "portable"


@pytest.mark.parametrize("env", ENVS)
@pytest.mark.parametrize("case", ["gravity", "cloth"])
def test_the_subgroup_variant_where_the_device_has_the_feature(case, env, tmp_path, chromium):
    """ti.export(..., subgroups=True): kernels whose atomic adds a subgroup sums first get a variant
    (with `enable subgroups;`), which wgpu_ad.js runs on a device with the feature, with the same results."""
    B.require(env)
    m, js = check_case(env, tmp_path, chromium, case, subgroups=True)
    assert m["optional_features"] == ["subgroups"]
    assert js["variant"] == "subgroups"
    variant = next(k["variants"]["subgroups"] for k in m["kernels"].values() if "variants" in k)
    code = [(tmp_path / "export" / t["file"]).read_text() for p in ("forward", "grad") if variant[p]
            for t in variant[p]["tasks"]]
    assert any(c.startswith("enable subgroups;\ndiagnostic(off, subgroup_uniformity);\n") for c in code)


def over_limit_case():
    n = 4
    fs = [ti.field(ti.f32, shape=n, name=f"f{k}") for k in range(9)]
    out = ti.field(ti.f32, shape=n, name="out")

    @ti.kernel
    def nine_fields():
        for i in range(n):
            out[i] = fs[0][i] + fs[1][i] + fs[2][i] + fs[3][i] + fs[4][i] + fs[5][i] + fs[6][i] + fs[7][i] + fs[8][i]

    return fs, out, nine_fields


@pytest.mark.parametrize("env", ENVS)
def test_over_the_storage_buffer_limit(env, tmp_path, chromium):
    """Ten storage buffers in one shader: ti.export refuses it under the default limits, naming the
    kernel, the limit and the count; exported for a device with more, a page with the default
    limits is told which limit to request, and one that requests the adapter's runs it."""
    B.require(env)
    fs, out, nine_fields = over_limit_case()
    with pytest.raises(ti.ExportError) as e:
        ti.export(tmp_path / "export", [nine_fields])
    assert "kernel 'nine_fields', task 0" in str(e.value)
    assert "is 10, over WebGPU's maxStorageBuffersPerShaderStage (8)" in str(e.value)
    ti.export(tmp_path / "export", [nine_fields], limits={"maxStorageBuffersPerShaderStage": 10})
    res = run_js(env, tmp_path, {"loadOnly": True}, chromium)
    if res["maxStorageBuffersPerShaderStage"] < 10:  # what a page gets by default
        assert "needs maxStorageBuffersPerShaderStage >= 10" in res["loadError"]
        assert "requiredLimits: {maxStorageBuffersPerShaderStage: 10}" in res["loadError"]
    n = out.shape[0]
    vals = [np.full(n, k + 1, np.float32) for k in range(9)]
    ops = [{"op": "write", "name": f"f{k}", "data": v.tolist()} for k, v in enumerate(vals)]
    ops += [{"op": "run", "kernel": "nine_fields"}, {"op": "read", "name": "out", "as": "out"}]
    js = run_js(env, tmp_path, {"ops": ops}, chromium, limits="adapter")
    np.testing.assert_array_equal(js["out"], np.full(n, 45, np.float32))


def test_default_storage_buffer_limit_is_what_node_and_chromium_give(tmp_path, chromium):
    """BROWSER_LIMITS agrees with the default device of each runtime installed here."""
    from wgpu_ad.export import BROWSER_LIMITS
    seen = 0
    for env in ENVS:
        if B.skip_reason(env):
            continue
        x = ti.field(ti.f32, shape=1, name="x")

        @ti.kernel
        def one():
            x[0] = 1.0
        ti.export(tmp_path / "export", [one])
        res = run_js(env, tmp_path, {"ops": [{"op": "run", "kernel": "one"}, {"op": "read", "name": "x", "as": "x"}]},
                     chromium)
        assert res["maxStorageBuffersPerShaderStage"] >= BROWSER_LIMITS["maxStorageBuffersPerShaderStage"]
        assert res["x"][0] == 1.0
        seen += 1
    if not seen:
        B.require("node")


@pytest.mark.parametrize("env", ENVS)
def test_bad_arguments_in_javascript_name_the_kernel_and_argument(env, tmp_path, chromium):
    c = ndarray_case()
    ti.export(tmp_path / "export", c["exports"])
    nd = {"op": "ndarray", "id": "a", "dtype": "f32", "shape": [3], "grad": False}
    nd2 = {"op": "ndarray", "id": "b", "dtype": "i32", "shape": [3], "grad": False}
    ops = [nd, nd2,
           {"op": "error", "call": "run", "kernel": "cubes", "args": {"a": {"nd": "a"}}, "as": "missing"},
           {"op": "error", "call": "run", "kernel": "cubes", "args": {"a": {"nd": "a"}, "s": 1, "t": 2}, "as": "unknown"},
           {"op": "error", "call": "run", "kernel": "cubes", "args": {"a": {"nd": "b"}, "s": 1}, "as": "dtype"},
           {"op": "error", "call": "run", "kernel": "cube", "args": {}, "as": "kernel"},
           {"op": "error", "call": "grad", "kernel": "cubes", "args": {"a": {"nd": "a"}, "s": 1}, "as": "no_grad"}]
    js = run_js(env, tmp_path, {"ops": ops}, chromium)
    assert js["missing"] == "wgpu_ad.js: kernel 'cubes': missing argument 's' (scalar f32)"
    assert js["unknown"] == "wgpu_ad.js: kernel 'cubes' has no parameter 't'; its parameters: a, s"
    assert js["dtype"] == ("wgpu_ad.js: kernel 'cubes': argument 'a' must be an ndarray made by "
                           "prog.ndarray(\"f32\", <1 extents>, {elementShape: []})")
    assert js["kernel"] == "wgpu_ad.js: no kernel 'cube' in the export; it has cubes"
    assert js["no_grad"] == "wgpu_ad.js: kernel 'cubes': argument 'a' needs a grad: make it with prog.ndarray(..., {grad: true})"


EVAL_DRIVER = """
import { evaluate } from "./export/wgpu_ad.js";
export default async function (device, ctx) {
  return ctx.args.exprs.map((e) => evaluate(e, ctx.args.words));
}
"""


def test_javascript_evaluates_launch_expressions_as_python_does(tmp_path):
    """wgpu_ad.js's evaluate() (grid sizes, stack depths) against wgpu_ad/plan.py's, on random
    expressions over 32-bit words, overflow, negative division and comparisons included."""
    B.require("node")
    from wgpu_ad import plan
    rng = np.random.default_rng(5)
    words = [int(v) for v in rng.integers(-2 ** 31, 2 ** 31, 6)] + [0, -1, 7, -7]
    ops2 = ["add", "sub", "mul", "div", "floordiv", "mod", "min", "max", "lt", "le", "gt", "ge", "eq", "ne"]

    def expr(depth):
        if depth == 0 or rng.random() < 0.3:
            return ("word", int(rng.integers(len(words)))) if rng.random() < 0.7 else ("const", int(rng.integers(-9, 10)))
        dt = str(rng.choice(["i32", "u32"]))
        r = rng.random()
        if r < 0.15:
            return (str(rng.choice(["neg", "abs", "cast"])), dt, expr(depth - 1))
        if r < 0.25:
            return ("select", dt, expr(depth - 1), expr(depth - 1), expr(depth - 1))
        return (str(rng.choice(ops2)), dt, expr(depth - 1), expr(depth - 1))

    exprs = [expr(4) for _ in range(300)]
    want = [int(plan.evaluate(e, words)) for e in exprs]
    (tmp_path / "export").mkdir()
    ti.export(tmp_path / "export", [])
    (tmp_path / "eval.mjs").write_text(EVAL_DRIVER)
    got = B.run_module("node", tmp_path / "eval.mjs", tmp_path, {"exprs": exprs, "words": words})
    assert got == want


@pytest.mark.parametrize("env", ENVS)
def test_an_overflowing_loop_stack_is_reported_at_the_next_read(env, tmp_path, chromium):
    """A data-dependent loop runs longer than its autodiff stack holds (ad_stack_size): the adjoint
    reports it in the error buffer, and wgpu_ad.js throws the compiler's message at the next read,
    as wgpu_ad raises it in Python."""
    ti.set_compile_options(ad_stack_size=4)
    a = ti.field(ti.f32, shape=2, needs_grad=True, name="a")
    L = ti.field(ti.f32, shape=(), needs_grad=True, name="L")

    @ti.kernel
    def grow():
        for i in range(2):
            t = a[i]
            while t < 100.0:
                t = t * 1.5 + 1.0
            L[None] += t

    ti.export(tmp_path / "export", [grow])
    ops = [{"op": "write", "name": "a", "data": [1.0, 2.0]},
           {"op": "tape", "loss": "L", "body": [{"op": "run", "kernel": "grow"}]},
           {"op": "error", "call": "read", "kernel": "a.grad", "as": "overflow"},
           {"op": "read", "name": "L", "as": "after"}]  # reported once; the next read goes through
    js = run_js(env, tmp_path, {"ops": ops}, chromium)
    line = grow.fn.__code__.co_firstlineno + 4
    assert js["overflow"] == (
        f"wgpu_ad.js: the adjoint of kernel 'grow': the serial loop at {__file__}:{line} ran more than 4 "
        f"iterations in one thread, more than its autodiff stack holds; raise the limit with "
        f"ti.init(ad_stack_size=...) (it is 4)")
    t = np.array([1.0, 2.0])
    while (t < 100).any():
        t = np.where(t < 100, t * 1.5 + 1.0, t)
    np.testing.assert_allclose(js["after"], [t.sum()], rtol=1e-6)
    with pytest.raises(ti.KernelRuntimeError, match="more than its autodiff stack holds"):
        a.from_numpy(np.array([1.0, 2.0], np.float32))
        with ti.ad.Tape(loss=L):
            grow()
        a.grad.to_numpy()


@pytest.mark.parametrize("env", ENVS)
def test_a_launch_from_an_event_handler_while_a_tape_records_is_refused_or_waits(env, tmp_path, chromium):
    """A tape whose body takes the recorder (prog.tape(loss, async (t) => ...)) records only the
    body's launches: a prog.run() from an event handler while the body awaits throws, naming the
    fix, instead of joining the tape (before: its launch was recorded, and its adjoint ran in the
    backward pass, silently); after `await prog.idle()` it runs once the tape is done."""
    B.require(env)
    c = gravity_case()
    ti.export(tmp_path / "export", c["exports"])
    write, read_u, read_grad = c["ops"][0], c["ops"][2], c["ops"][3]
    body = [{"op": "run", "kernel": "potential"}, {"op": "intrude", "kernel": "potential", "as": "handler"},
            {"op": "sleep", "ms": 30}]
    ops = [write, {"op": "tape", "loss": "U", "recorder": True, "body": body}, read_u, read_grad]
    js = run_js(env, tmp_path, {"ops": ops}, chromium)
    assert js["handler"] == ("wgpu_ad.js: run('potential') while a tape is recording: inside the tape's body launch "
                             "through the recorder it is given (t.run); elsewhere (an event handler) wait for the "
                             "tape: await prog.idle()")
    close(js["U"], c["ref"]["U"], c["tol"])
    close(js["grad"], c["ref"]["grad"], c["tol"])

    body[1] = dict(body[1], wait=True)
    ops = [write, {"op": "tape", "loss": "U", "recorder": True, "body": body}, read_grad,
           {"op": "sleep", "ms": 30}, read_u]
    js = run_js(env, tmp_path, {"ops": ops}, chromium)
    assert js["handler"] == "ran"
    close(js["grad"], c["ref"]["grad"], c["tol"])          # not recorded
    close(js["U"], 2 * np.asarray(c["ref"]["U"]), c["tol"])  # it ran after the tape: U added twice
