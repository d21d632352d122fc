"""Compile time of the cloth kernels (the step and the loss, forward and gradient).

Each measurement is a fresh process (`python -m benchmarks.compile_time SYSTEM n steps CACHE`):
'first run' with empty cache folders, then 'cached' in a second fresh process given the same
folders, as a user's second run of a script would be. Every cache we know of is pointed there:
XDG_CACHE_HOME and MESA_SHADER_CACHE_DIR (Mesa's shader cache: lavapipe keeps its compiled
pipelines there, ~/.cache/mesa_shader_cache by default), Taichi's offline cache, and
WGPU_AD_CACHE_DIR for wgpu_ad's offline cache (wgpu_ad/lang/cache.py: a cached run still lowers
each kernel with the frontend to find its key, then loads the compiled kernel instead of
optimising and generating WGSL). A kernel's compile time is its first call minus its second call
(both synced), so the time of running it once is not counted. Before that, each process launches one
trivial kernel: the start-up of import, device and driver (lavapipe spends ~0.5 s on its first
pipeline and dispatch, whatever the shader) is reported apart, as `init_ms`.

`python -m benchmarks.compile_time --stores [N ...]` times the compiler alone on a kernel with N
stores to one field (stores_here; N = 500, 1,500, 5,000 by default), which must grow linearly.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

MARK = "COMPILE_RESULT "
PARTS = ("step", "loss", "loss.grad", "step.grad")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def params(quick: bool) -> dict:
    return {"n": 8, "steps": 20} if quick else {"n": 64, "steps": 200}


def _twice(fn, sync) -> float:
    t0 = time.perf_counter()
    fn()
    sync()
    t1 = time.perf_counter()
    fn()
    sync()
    t2 = time.perf_counter()
    return max(0.0, (t1 - t0) - (t2 - t1))


def measure_here(system: str, p: dict, cache: str) -> dict:
    """In the fresh process: seconds spent compiling each cloth kernel on `system`."""
    from benchmarks.workloads import cloth
    t0 = time.perf_counter()
    if system == "wgsl":
        return _measure_wgsl(p, t0)
    if system == "wgpu_ad":
        import wgpu_ad as ti
        ti.init()
    else:
        import taichi as ti
        ti.init(arch=ti.vulkan if system == "taichi-vulkan" else ti.cpu,
                offline_cache=True, offline_cache_file_path=os.path.join(cache, "taichi"))
    warm = ti.field(dtype=ti.f32, shape=1)

    @ti.kernel
    def first_kernel():
        for i in range(1):
            warm[i] = 1.0
    first_kernel()   # the driver's one-time start-up (lavapipe: ~0.5 s) is not the cloth's compile
    ti.sync()
    t_init = time.perf_counter() - t0
    k = cloth.kernels(ti, p)
    cloth.set_initial_state(k, p, cloth.inputs(p))
    ti.sync()
    parts = {"step": _twice(lambda: k.step(0), ti.sync),
             "loss": _twice(k.compute_loss, ti.sync),
             "loss.grad": _twice(k.compute_loss.grad, ti.sync),
             "step.grad": _twice(lambda: k.step.grad(0), ti.sync)}
    return {"parts": parts, "init_s": t_init}


def _measure_wgsl(p: dict, t0: float) -> dict:
    """The hand-written shaders: pipeline creation plus first dispatch minus second dispatch."""
    from benchmarks.rawgpu import RawGpu
    from benchmarks.workloads import cloth
    gpu = RawGpu()
    first = gpu.kernels("launch", {"main": ("uniform", "storage")})["main"]
    gpu.run([(first, gpu.bind(first, gpu.uniforms([[1.0]]), gpu.storage(nbytes=4)), 1, 0)])
    gpu.sync()
    t_init = time.perf_counter() - t0
    n, steps = p["n"], p["steps"]
    nbytes = (steps + 1) * n * n * 3 * 4
    x, v, gx, gv = (gpu.storage(nbytes=nbytes) for _ in range(4))
    ts = gpu.uniforms([[0]])
    parts = {}
    binds = {"step_fwd": (ts, x, v), "loss_bwd": (None, x, None, gx, gv), "step_bwd": (ts, x, None, gx, gv)}
    for part, entry in zip(PARTS, ("step_fwd", "loss_fwd", "loss_bwd", "step_bwd")):
        t1 = time.perf_counter()
        kernels, fin, groups = cloth.wgsl_kernels(gpu, p, entries=(entry,), finish=entry == "loss_fwd")
        k = kernels[entry]
        if entry == "loss_fwd":
            partials, out = gpu.storage(nbytes=4 * groups), gpu.storage(nbytes=4)
            work = [(k, gpu.bind(k, None, x, None, None, None, partials), groups), (fin, gpu.bind(fin, partials, out), 1)]
        else:
            work = [(k, gpu.bind(k, *binds[entry]), groups) + ((0,) if entry.startswith("step") else ())]
        create = time.perf_counter() - t1
        parts[part] = create + _twice(lambda work=work: gpu.run(work), gpu.sync)
    return {"parts": parts, "init_s": t_init}


def _run_one(system: str, p: dict, cache: str) -> dict:
    for sub in ("mesa", "wgpu_ad", "taichi"):
        os.makedirs(os.path.join(cache, sub), exist_ok=True)  # Mesa silently caches nothing otherwise
    env = dict(os.environ)
    env.update({"XDG_CACHE_HOME": cache, "MESA_SHADER_CACHE_DIR": os.path.join(cache, "mesa"),
                "WGPU_AD_CACHE_DIR": os.path.join(cache, "wgpu_ad")})
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "benchmarks.compile_time", system, str(p["n"]), str(p["steps"]), cache]
    try:
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"{system}: compile-time process timed out after 300 s"}
    for line in r.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    tail = "\n".join(ln for ln in (r.stdout + r.stderr).splitlines() if "XDG_RUNTIME_DIR" not in ln)[-1500:]
    return {"error": f"{system}: compile-time process failed (exit {r.returncode}):\n{tail}"}


def measure(systems: list[str], quick: bool, reps: int | None, tmp: str) -> dict:
    """Interleaved fresh-process measurements; medians per system of first-run and cached totals."""
    p = params(quick)
    reps = reps or (1 if quick else 3)
    runs: dict[str, dict[str, list]] = {s: {"first": [], "cached": []} for s in systems}
    errors: dict[str, str] = {}
    for rep in range(reps):
        for phase in ("first", "cached"):
            for s in systems:
                if s in errors:
                    continue
                got = _run_one(s, p, os.path.join(tmp, f"compile_cache_{rep}", s))
                if "error" in got:
                    errors[s] = got["error"]
                else:
                    runs[s][phase].append(got)
    out = {"params": p, "reps": reps, "systems": {}, "errors": errors}
    for s in systems:
        if s in errors or not runs[s]["first"]:
            continue
        res = {}
        for phase in ("first", "cached"):
            totals = [sum(r["parts"].values()) * 1e3 for r in runs[s][phase]]
            res[f"{phase}_ms"] = statistics.median(totals)
            res[f"{phase}_parts_ms"] = {k: statistics.median(r["parts"][k] * 1e3 for r in runs[s][phase])
                                        for k in PARTS}
            res[f"{phase}_all_ms"] = totals
        res["init_ms"] = statistics.median(r["init_s"] * 1e3 for r in runs[s]["first"])
        out["systems"][s] = res
    return out


STORES = (500, 1500, 5000)


def stores_here(counts=STORES, grad: bool = True) -> list[dict]:
    """The compiler's own time (frontend to WGSL; the driver's pipeline is not created) for a
    kernel with N stores to one field, `x[j] = y[j] * 2.0` for j < N in one loop body (an
    unrolled ti.static loop), forward and, with `grad`, its adjoint. Issue 25: the access checks
    made this quadratic (1,500 stores 79 s, 5,000 stores 455 s)."""
    import linecache

    import wgpu_ad as ti
    ti.init(offline_cache=False)
    ti.sync()
    out = []
    for n in (20,) + tuple(counts):  # (the first: the compiler's modules are imported)
        x = ti.field(ti.f32, shape=n, needs_grad=grad)
        y = ti.field(ti.f32, shape=n, needs_grad=grad)
        src = "def k():\n    for i in range(1):\n" + "".join(f"        x[{j}] = y[{j}] * 2.0\n" for j in range(n))
        path = f"<{n} stores>"
        linecache.cache[path] = (len(src), None, src.splitlines(True), path)
        ns = {"x": x, "y": y}
        exec(compile(src, path, "exec"), ns)
        k = ti.kernel(ns["k"])
        t0 = time.perf_counter()
        k._get(())
        t1 = time.perf_counter()
        row = {"stores": n, "forward_s": t1 - t0}
        if grad:
            k._get_grad(())
            row["adjoint_s"] = time.perf_counter() - t1
        if n == 20 and counts[:1] != (20,):
            continue
        out.append(row)
        print(f"{n:6d} stores: forward {row['forward_s']:6.2f} s" +
              (f", adjoint {row['adjoint_s']:6.2f} s" if grad else ""), flush=True)
    return out


if __name__ == "__main__" and sys.argv[1:2] == ["--stores"]:
    # python -m benchmarks.compile_time --stores [N ...]
    stores_here(tuple(int(a) for a in sys.argv[2:]) or STORES)
elif __name__ == "__main__":
    system, n, steps, cache = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    print(MARK + json.dumps(measure_here(system, {"n": n, "steps": steps}, cache)), flush=True)
