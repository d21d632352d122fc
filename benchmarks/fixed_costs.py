"""Fixed costs on the adapter (issue #29 item 3): a sync with nothing pending, and the README's
gravity forward (reset + kernel + sync) against the hand-written WGSL, in one process.

    python -m benchmarks.fixed_costs [--N 1024] [--reps 40] [--inner 10] [--json out.json]

All variants run interleaved (A B C ... A B C ...), each rep `inner` calls back to back, so the
machine's noise hits them alike; medians of the per-call times. Variants:
  sync           ti.sync() with nothing pending (after one that waited)
  wgsl sync      the hand-written baseline's wait: a 4-byte read-back (rawgpu.RawGpu.sync)
  fwd            clear(); compute_U(); ti.sync(): what the gravity workload times
  fwd, map READ  the same with read-backs mapped as before this change: map_sync(READ), which
                 makes wgpu-py submit an empty command buffer before every map (Runtime._map_mode)
  kernel         compute_U(); ti.sync(): the kernel alone
  wgsl fwd       the hand-written WGSL forward (two dispatches, one read-back)
Not part of `python -m benchmarks`; benchmarks/RESULTS.md records its runs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import wgpu

import wgpu_ad as ti
from benchmarks.rawgpu import RawGpu
from benchmarks.workloads import gravity


def measure(n: int, reps: int, inner: int) -> dict:
    ti.init()
    p = {"N": n}
    inp = gravity.inputs(p)
    k = gravity.kernels(ti, p)
    k.x.from_numpy(inp["pos"])
    gpu = RawGpu()
    wgsl = gravity.build_wgsl(gpu, p, inp)
    rt = ti.get_runtime()
    mode_now = rt._map_mode

    def fwd():
        k.clear()
        k.compute_U()
        ti.sync()

    def fwd_map_read():
        rt._map_mode = wgpu.MapMode.READ
        try:
            fwd()
        finally:
            rt._map_mode = mode_now

    def kernel():
        k.compute_U()
        ti.sync()

    variants = {"sync": ti.sync, "wgsl sync": gpu.sync, "fwd": fwd, "fwd, map READ": fwd_map_read,
                "kernel": kernel, "wgsl fwd": wgsl.ops["fwd"]}
    for f in variants.values():
        f()
    times = {name: [] for name in variants}
    for _ in range(reps):
        for name, f in variants.items():
            t0 = time.perf_counter()
            for _ in range(inner):
                f()
            times[name].append((time.perf_counter() - t0) / inner)
    us = {name: statistics.median(t) * 1e6 for name, t in times.items()}
    fwd()
    U = float(k.U[None])
    ref, _ = gravity.reference(p, inp)
    return {"N": n, "reps": reps, "inner": inner, "us": us, "device": str(ti.get_runtime()),
            "map_mode": str(mode_now), "U_rel_err": abs(U - ref) / abs(ref),
            "ratios": {"fwd / wgsl fwd": us["fwd"] / us["wgsl fwd"],
                       "fwd, map READ / wgsl fwd": us["fwd, map READ"] / us["wgsl fwd"],
                       "kernel / wgsl fwd": us["kernel"] / us["wgsl fwd"]},
            "load_avg": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.fixed_costs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--N", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--inner", type=int, default=10)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    r = measure(args.N, args.reps, args.inner)
    print(f"fixed costs on {r['device']}, gravity N={r['N']} (median of {r['reps']} x {r['inner']} calls; "
          f"load average {r['load_avg']:.2f}; U rel err {r['U_rel_err']:.1e})")
    for name, v in r["us"].items():
        print(f"  {name:<14} {v:10.1f} us")
    for name, v in r["ratios"].items():
        print(f"  {name:<26} {v:.3f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
