"""The cost of ti.init(deterministic=True): bitwise reproducible float sums and gradients.

    python -m benchmarks --only determinism        (part of the full run; wgpu_ad only)
    python -m benchmarks.determinism [--quick]       (alone, in this process; prints JSON)

Under deterministic=True a task that adds floats with atomics (a reduction `x[None] += ...`, the
gradient accumulation of an adjoint) runs its iterations in order in one invocation instead of
spreading them over the device. Per case, the workload's own program (benchmarks/workloads) is
built once and its fwd and fwd+bwd runs are timed with the option off and on, interleaved
(A B A B ...; the option is part of the compile cache key, so each setting runs its own
compiled kernels), medians. Both settings' loss and gradient entry are checked against the
workload's float64 reference, and two deterministic runs must agree bit for bit.

Drivers that stop an invocation's loops after 65,535 iterations (older Mesa llvmpipe) refuse the
larger cases in deterministic mode with a clear error: those rows say so instead of a time.
"""
from __future__ import annotations

import json
import statistics
import sys
import time

from benchmarks import child


def cases(quick: bool) -> list[tuple[str, dict]]:
    if quick:
        return [("gravity", {"N": 64}), ("cloth", {"n": 8, "steps": 20}), ("scatter", {"particles": 2048, "grid": 32})]
    return [("gravity", {"N": 128}), ("gravity", {"N": 1024}), ("cloth", {"n": 32, "steps": 200}),
            ("scatter", {"particles": 16_384, "grid": 64}), ("scatter", {"particles": 262_144, "grid": 128})]


def measure_here(quick: bool, reps: int) -> dict:
    import wgpu_ad as ti
    from benchmarks.workloads import Case

    out = []
    for workload, p in cases(quick):
        ti.init()
        mod = Case(workload, p).module()
        inp = mod.inputs(p)
        prog = mod.build(ti, p, inp)
        ref_loss, ref_grad = mod.reference(p, inp)
        rec = {"workload": workload, "params": p, "ms": {}, "checks": {}}
        try:
            results = {}
            for det in (False, True, True):   # warm-up (compiles), checks, and the repeat
                ti.set_compile_options(deterministic=det)
                results.setdefault(det, []).append(prog.result())
            rec["bitwise"] = results[True][0] == results[True][1]
            for det, (loss, grad) in ((False, results[False][0]), (True, results[True][0])):
                err = max(abs(loss - ref_loss) / max(abs(ref_loss), 1e-30),
                          abs(grad - ref_grad) / max(abs(ref_grad), 1e-30))
                rec["checks"]["deterministic" if det else "default"] = err
            times = {(m, det): [] for m in prog.ops for det in (False, True)}
            for _ in range(reps):
                for m, fn in prog.ops.items():
                    for det in (False, True):
                        ti.set_compile_options(deterministic=det)
                        t0 = time.perf_counter()
                        fn()
                        times[(m, det)].append(time.perf_counter() - t0)
            for m in prog.ops:
                a, b = (statistics.median(times[(m, d)]) * 1e3 for d in (False, True))
                rec["ms"][m] = {"default": a, "deterministic": b, "ratio": b / a}
        except ti.WgpuAdError as e:   # a driver's loop limit (see the docstring)
            rec["error"] = str(e).split(":")[0] + ": " + ("the driver's loop limit" if "65,535" in str(e) else str(e)[:160])
        out.append(rec)
        ti.reset()
    return {"reps": reps, "cases": out}


def measure(quick: bool, reps: int | None) -> dict:
    """Run measure_here in a fresh process."""
    return child.run("benchmarks.determinism", f"m.measure_here({quick!r}, {reps or (1 if quick else 7)})")


def block(res: dict) -> str:
    title = "== ti.init(deterministic=True): its cost against the default, wgpu_ad"
    if "error" in res:
        return f"{title}\n  not measured: {res['error']}\n"
    lines = [f"{title} (median of {res['reps']}; ratio = deterministic / default)"]
    for c in res["cases"]:
        label = c["workload"] + " " + " ".join(f"{k}={v}" for k, v in c["params"].items())
        if "error" in c:
            lines.append(f"  {label:<32} deterministic mode refused: {c['error']}")
            continue
        cells = " | ".join(f"{m} {t['default']:.3g} -> {t['deterministic']:.3g} ms [{t['ratio']:.2f}x]"
                           for m, t in c["ms"].items())
        ok = "ok" if max(c["checks"].values()) <= 1e-3 else "OUT OF TOLERANCE"
        same = "bitwise equal" if c["bitwise"] else "NOT BITWISE EQUAL"
        lines.append(f"  {label:<32} {cells}  (vs float64: {ok}; two deterministic runs {same})")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(json.dumps(measure_here("--quick" in sys.argv, 1 if "--quick" in sys.argv else 7), indent=1))
