"""Forward mode's cost: a JVP (ti.ad.FwdMode) against the forward pass alone, on gravity and cloth.

    python -m benchmarks --only fwdmode        (part of the full run; wgpu_ad only)
    python -m benchmarks.forward_mode [--quick]  (alone, in this process; prints JSON)

The programs are the gravity and cloth workloads' own kernels (workloads/gravity.py,
workloads/cloth.py), their fields given duals with ti.root.lazy_dual(). Per case, interleaved
(A B C A B C ...), medians:
  fwd        the forward pass (as the workloads time it, ending with a sync);
  dual       the same launches inside FwdMode, their dual kernels only (the block entered and
             synced before the timer starts): the JVP's own cost;
  fwdmode    the whole `with ti.ad.FwdMode(loss, param, seed): ...` block, its seeding (zeroing
             every dual, uploading the seed) and clearing included.
The goal of the issue is dual <= 2x fwd. The JVP is checked against a float64 reference (gravity:
the analytic gradient dotted with the seed; cloth: central differences of the float64
simulation along the seed). It runs in a subprocess of the driver, like the torch benchmark.
"""
from __future__ import annotations

import json
import statistics
import sys
import time

from benchmarks import child

import numpy as np


def cases(quick: bool) -> list[tuple[str, dict]]:
    if quick:
        return [("gravity", {"N": 256}), ("cloth", {"n": 8, "steps": 20})]
    return [("gravity", {"N": 1024}), ("gravity", {"N": 4096}), ("cloth", {"n": 32, "steps": 200}),
            ("cloth", {"n": 64, "steps": 200})]


def _gravity(ti, p: dict):
    from benchmarks.workloads import gravity
    inp = gravity.inputs(p)
    k = gravity.kernels(ti, p)
    k.x.from_numpy(inp["pos"])
    seed = np.random.default_rng(7).uniform(-1, 1, (p["N"], 2)).astype(np.float32)

    def run():
        k.clear()
        k.compute_U()

    x = inp["pos"].astype(np.float64)
    grad = np.zeros_like(x)
    for a in range(0, len(x), 512):  # dU/dx_i = 2 sum_j (x_i - x_j) / (|x_i - x_j|^2 + eps)^1.5
        d = x[a:a + 512, None, :] - x[None, :, :]
        grad[a:a + 512] = 2.0 * (d / ((d ** 2).sum(-1, keepdims=True) + gravity.EPS) ** 1.5).sum(1)
    return run, k.U, k.x, seed, float((grad * seed).sum())


def _cloth(ti, p: dict):
    from benchmarks.workloads import cloth
    inp = cloth.inputs(p)
    k = cloth.kernels(ti, p)
    cloth.set_initial_state(k, p, inp)
    n, steps = p["n"], p["steps"]
    dv0 = np.random.default_rng(7).uniform(-1, 1, (n, n, 3))
    seed = np.zeros((steps + 1, n, n, 3), np.float32)  # the direction: initial velocities only
    seed[0] = dv0

    def run():
        k.clear()
        for t in range(steps):
            k.step(t)
        k.compute_loss()

    h = 1e-6
    v0 = inp["v0"].astype(np.float64)
    ref = (cloth._simulate(p, inp["x0"], v0 + h * dv0) - cloth._simulate(p, inp["x0"], v0 - h * dv0)) / (2 * h)
    return run, k.loss, k.v, seed, float(ref)


def measure_here(quick: bool, reps: int) -> dict:
    import wgpu_ad as ti

    out = []
    for workload, p in cases(quick):
        ti.init()
        ti.root.lazy_dual()
        run, loss, param, seed, ref = {"gravity": _gravity, "cloth": _cloth}[workload](ti, p)

        def fwd():
            run()
            ti.sync()

        def dual():
            with ti.ad.FwdMode(loss=loss, param=param, seed=seed):
                ti.sync()
                t0 = time.perf_counter()
                run()
                ti.sync()
                return time.perf_counter() - t0

        def fwdmode():
            with ti.ad.FwdMode(loss=loss, param=param, seed=seed):
                run()
            ti.sync()

        fwd(), dual(), fwdmode()  # warm-up (compiles)
        jvp = float(loss.dual[None])
        times = {"fwd": [], "dual": [], "fwdmode": []}
        for _ in range(reps):
            for name, fn in (("fwd", fwd), ("dual", dual), ("fwdmode", fwdmode)):
                _busy(0.05)
                t0 = time.perf_counter()
                inner = fn()
                times[name].append(inner if inner is not None else time.perf_counter() - t0)
        med = {m: statistics.median(v) * 1e3 for m, v in times.items()}
        out.append({"workload": workload, "params": p, "ms": med, "ratio": med["dual"] / med["fwd"],
                    "ratio_fwdmode": med["fwdmode"] / med["fwd"], "jvp": jvp, "reference": ref,
                    "rel_err": abs(jvp - ref) / max(abs(ref), 1e-30)})
        ti.reset()
    return {"reps": reps, "cases": out}


def _busy(seconds: float) -> None:
    """Keep the CPU awake before a timed run (see benchmarks/README.md, 'Warm')."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def measure(quick: bool, reps: int | None) -> dict:
    """Run measure_here in a fresh process."""
    return child.run("benchmarks.forward_mode", f"m.measure_here({quick!r}, {reps or (1 if quick else 7)})")


def block(res: dict) -> str:
    title = "== forward mode (ti.ad.FwdMode): a JVP against the forward pass, wgpu_ad"
    if "error" in res:
        return f"{title}\n  not measured: {res['error']}\n"
    lines = [f"{title} (median of {res['reps']}; goal: dual kernels <= 2x the forward pass)"]
    for c in res["cases"]:
        label = c["workload"] + " " + " ".join(f"{k}={v}" for k, v in c["params"].items())
        ms = c["ms"]
        ok = "ok" if c["rel_err"] <= 1e-3 else "OUT OF TOLERANCE"
        lines.append(f"  {label:<24} fwd {ms['fwd']:.3g} ms | dual {ms['dual']:.3g} ms [dual/fwd {c['ratio']:.2f}] | "
                     f"whole FwdMode block {ms['fwdmode']:.3g} ms [{c['ratio_fwdmode']:.2f}]  "
                     f"JVP rel. err {c['rel_err']:.1e} ({ok})")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(json.dumps(measure_here("--quick" in sys.argv, 1 if "--quick" in sys.argv else 7), indent=1))
