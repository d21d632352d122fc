"""ti.ad.checkpoint on the cloth: time and memory of each schedule against storing every step.

    python -m benchmarks --only checkpoint [--checkpoint-steps T]   (part of the full run)
    python -m benchmarks.checkpoint [--steps T] [--n N] [--reps R]   (alone; prints the block)

The cloth of workloads/cloth.py (n x n, springs to the 8 neighbours, T steps, loss at the end),
forward + backward from the same initial state, three ways:
  stored       workloads/cloth.py as it is: x[t, i, j], v[t, i, j] with a time axis, one plain
               ti.ad.Tape (Taichi's way: every step kept);
  checkpoint   the same physics written in place (forces into f, then x, v updated in place), under
               ti.ad.checkpoint with each schedule;
  taichi       the stored program under Taichi (CPU, and Vulkan where it starts), when `import
               taichi` works; skipped with a note otherwise.
Memory is what a program keeps for its backward pass beyond the fields it needs anyway: the stored
trajectory (T + 1 copies of x and v; their gradients take as much again) against the checkpoints'
bytes (CheckpointStats.bytes, plus one step's pre-launch copies). Every variant's loss and gradient
entry is checked against the float64 NumPy reference of workloads/cloth.py.
"""
from __future__ import annotations

import argparse
import statistics
import time

from benchmarks import child

SCHEDULES = ("revolve", "bisect", "sqrt", "store_all")


def params(quick: bool, steps: int | None = None, n: int | None = None) -> dict:
    return {"n": n or (8 if quick else 32), "steps": steps or (40 if quick else 2000)}


def inplace(ti, p: dict, inp: dict):
    """The cloth of workloads/cloth.py written in place: (run(schedule) -> stats, result())."""
    import math

    import numpy as np

    from benchmarks.workloads import cloth as wl

    n, steps = p["n"], p["steps"]
    dx = wl.spacing(n)
    rest = [dx * math.sqrt(di * di + dj * dj) for di, dj in wl.OFFSETS]
    tx, ty, tz = wl.TARGET
    inv_nn = 1.0 / (n * n)
    x = ti.Vector.field(3, dtype=ti.f32, shape=(n, n), needs_grad=True)
    v = ti.Vector.field(3, dtype=ti.f32, shape=(n, n), needs_grad=True)
    f = ti.Vector.field(3, dtype=ti.f32, shape=(n, n), needs_grad=True)
    loss = ti.field(dtype=ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def forces():
        for i, j in ti.ndrange(n, n):
            xi = x[i, j]
            acc = ti.Vector([0.0, -wl.GRAVITY * wl.MASS, 0.0])
            for k in ti.static(range(8)):
                i2 = i + ti.static(wl.OFFSETS[k][0])
                j2 = j + ti.static(wl.OFFSETS[k][1])
                if 0 <= i2 < n and 0 <= j2 < n:
                    d = x[i2, j2] - xi
                    length = d.norm()
                    acc += wl.KS * (length - ti.static(rest[k])) / length * d
            f[i, j] = acc

    @ti.kernel
    def integrate():
        for i, j in ti.ndrange(n, n):
            vn = v[i, j] * wl.DAMPING + (wl.DT / wl.MASS) * f[i, j]
            v[i, j] = vn
            x[i, j] = x[i, j] + wl.DT * vn

    @ti.kernel
    def compute_loss():
        for i, j in ti.ndrange(n, n):
            d = x[i, j] - ti.Vector([tx, ty, tz])
            loss[None] += d.dot(d) * inv_nn

    def step(t):
        forces()
        integrate()

    def run(schedule: str):
        snapshots = None
        if schedule == "revolve r=2":
            schedule, snapshots = "revolve", snapshots_for(steps, 2)
        x.from_numpy(inp["x0"])
        v.from_numpy(inp["v0"])
        with ti.ad.Tape(loss=loss):
            stats = ti.ad.checkpoint(step, steps=steps, state=[x, v], schedule=schedule, snapshots=snapshots)
            compute_loss()
        ti.sync()
        return stats

    def result():
        c = n // 2
        return float(loss[None]), float(np.asarray(v.grad[c, c])[0])

    run.step = step  # for measuring the bare steps
    return run, result


def snapshots_for(steps: int, repetitions: int) -> int:
    """The fewest revolve snapshots s with which no step runs more than `repetitions` times again:
    C(s + r, s) >= steps (Griewank and Walther's binomial bound)."""
    import math
    s = 1
    while math.comb(s + repetitions, s) < steps:
        s += 1
    return s


def measure_wgpu_ad(p: dict, reps: int, schedules=SCHEDULES) -> dict:
    """Stored and checkpointed runs in this process, interleaved (stored, revolve, ... per rep).
    Besides the schedules with their defaults: revolve with the snapshots that bound the reruns of
    a step to 2 ('revolve r=2'), the trade-off between memory and time."""
    import wgpu_ad as ti

    from benchmarks.workloads import cloth as wl

    ti.init()
    inp = wl.inputs(p)
    stored = wl.build(ti, p, inp)
    run, result = inplace(ti, p, inp)
    schedules = (*schedules, "revolve r=2")
    out = {"ms": {}, "stats": {}, "checks": {}, "r2_snapshots": snapshots_for(p["steps"], 2)}
    stored.ops["fwd+bwd"]()  # compile and warm up
    out["checks"]["stored"] = stored.result()
    for s in schedules:
        st = run(s)
        out["checks"][s] = result()
        out["stats"][s] = {"snapshots": st.snapshots, "bytes": st.bytes, "step_bytes": st.step_bytes,
                           "recomputed_steps": st.recomputed_steps}
    times = {k: [] for k in ("stored", *schedules)}
    for _ in range(reps):
        t0 = time.perf_counter()
        stored.ops["fwd+bwd"]()
        times["stored"].append(time.perf_counter() - t0)
        for s in schedules:
            t0 = time.perf_counter()
            run(s)
            times[s].append(time.perf_counter() - t0)
    out["ms"] = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    out["stored_bytes"] = 2 * (p["steps"] + 1) * p["n"] * p["n"] * 3 * 4
    return out


def measure_taichi(p: dict, reps: int, arch: str) -> dict:
    """workloads/cloth.py's stored program under Taichi (in this process)."""
    import taichi as ti

    from benchmarks.workloads import cloth as wl

    ti.init(arch=getattr(ti, arch))
    if ti.lang.impl.current_cfg().arch != getattr(ti, arch):
        raise RuntimeError(f"Taichi could not start arch={arch}")
    prog = wl.build(ti, p, wl.inputs(p))
    prog.ops["fwd+bwd"]()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        prog.ops["fwd+bwd"]()
        times.append(time.perf_counter() - t0)
    return {"ms": statistics.median(times) * 1e3, "check": prog.result()}


def _subprocess(call: str, timeout: float) -> dict:
    return child.run("benchmarks.checkpoint", call.replace("c.", "m.", 1), timeout)


def measure(quick: bool, reps: int | None, steps: int | None = None, n: int | None = None,
            taichi: bool = True) -> dict:
    """Every variant, each system in a fresh process (Taichi allows one arch per process)."""
    from benchmarks.systems import taichi_available
    from benchmarks.workloads import cloth as wl

    p = params(quick, steps, n)
    reps = reps or (1 if quick else 3)
    out = {"params": p, "reps": reps, "wgpu_ad": _subprocess(f"c.measure_wgpu_ad({p!r}, {reps})", 3600),
           "taichi": {}}
    if taichi and taichi_available():
        for arch in ("cpu", "vulkan"):
            out["taichi"][arch] = _subprocess(f"c.measure_taichi({p!r}, {reps}, {arch!r})", 3600)
    else:
        out["taichi"] = None
    out["reference"] = wl.reference(p, wl.inputs(p))
    return out


def wl_grad_name() -> str:
    from benchmarks.workloads import cloth as wl
    return wl.GRAD


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)


def block(r: dict) -> str:
    p = r["params"]
    lines = [f"== checkpoint: cloth n={p['n']} T={p['steps']}, forward + backward (median of {r['reps']})"]
    w = r["wgpu_ad"]
    if "error" in w:
        return "\n".join(lines + [f"  not measured: {w['error']}", ""])
    ref_loss, ref_grad = r["reference"]

    stored_grad = w["checks"]["stored"][1]

    def check(c) -> str:
        loss, grad = c
        return (f"loss {_rel(loss, ref_loss):.1e}, grad {_rel(grad, ref_grad):.1e}; "
                f"grad vs stored {_rel(grad, stored_grad):.0e}")

    mb = 1 / 2 ** 20
    base = w["ms"]["stored"]
    lines.append(f"  float64 reference: loss {ref_loss:.6g}, {wl_grad_name()} {ref_grad:.6g} (float32 over T steps "
                 f"drifts from it; the variants agree with each other)")
    lines.append(f"  {'variant':<28} {'ms':>9} {'/stored':>8} {'kept MB':>9} {'/stored':>8} {'steps rerun':>12}  "
                 f"relative error vs float64")
    lines.append(f"  {'stored x[t] (wgpu_ad)':<28} {base:9.0f} {1.0:8.2f} {w['stored_bytes'] * mb:9.2f} {1.0:8.2f} "
                 f"{0:12d}  {check(w['checks']['stored'])}")
    for s, st in w["stats"].items():
        kept = st["bytes"] + st["step_bytes"]
        label = f"revolve s={w['r2_snapshots']}" if s == "revolve r=2" else s
        lines.append(f"  {'checkpoint ' + label:<28} {w['ms'][s]:9.0f} {w['ms'][s] / base:8.2f} {kept * mb:9.3f} "
                     f"{kept / w['stored_bytes']:8.4f} {st['recomputed_steps']:12d}  {check(w['checks'][s])}")
    if r["taichi"] is None:
        lines.append("  taichi: not installed (pip install taichi), so not compared")
    else:
        for arch, t in r["taichi"].items():
            if "error" in t:
                lines.append(f"  {'stored x[t] taichi-' + arch:<28} not measured: {t['error']}")
                continue
            lines.append(f"  {'stored x[t] taichi-' + arch:<28} {t['ms']:9.0f} {t['ms'] / base:8.2f} "
                         f"{w['stored_bytes'] * mb:9.2f} {1.0:8.2f} {0:12d}  {check(t['check'])}")
            lines.append(f"    revolve / taichi-{arch}: {w['ms']['revolve'] / t['ms']:.2f}x the time")
    r2 = w["ms"]["revolve r=2"] / base
    lines.append(f"  revolve with s={w['r2_snapshots']} snapshots (each step rerun at most twice): {r2:.2f}x the "
                 f"time of stored")
    lines.append(f"  revolve / store_all: {w['ms']['revolve'] / w['ms']['store_all']:.2f}x the time (goal <= 2.5)")
    lines.append(f"  revolve / stored: {w['ms']['revolve'] / base:.2f}x the time, "
                 f"{(w['stats']['revolve']['bytes'] + w['stats']['revolve']['step_bytes']) / w['stored_bytes']:.4f}x "
                 f"the memory (the gradients of x and v: (T + 1) copies stored, 1 with checkpoints)")
    return "\n".join(lines) + "\n"


def targets(r: dict) -> dict | None:
    w = r.get("wgpu_ad", {})
    if "ms" not in w:
        return None
    return {"revolve_over_stored": w["ms"]["revolve"] / w["ms"]["stored"],
            "revolve_over_store_all": w["ms"]["revolve"] / w["ms"]["store_all"]}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m benchmarks.checkpoint", description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=None, help="time steps T (default 2000; 40 with --quick)")
    ap.add_argument("--n", type=int, default=None, help="vertices per side (default 32)")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-taichi", action="store_true", help="skip Taichi even where it is installed")
    a = ap.parse_args()
    print(block(measure(a.quick, a.reps, a.steps, a.n, taichi=not a.no_taichi)))
