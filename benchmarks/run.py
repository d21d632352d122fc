"""wgpu_ad against hand-written WGSL, Taichi (Vulkan, CUDA, CPU), Warp, PyTorch and JAX, interleaved.

    python -m benchmarks [--quick] [--json out.json] [--only NAME[,NAME]] [--systems a,b] [--reps R]
    python benchmarks/run.py ...          (the same)

NAME is a workload (gravity, cloth, reduction, scatter, launch), `compile`, `torch` (the PyTorch
bridge against bare kernels, wgpu_ad only; when torch is installed), `checkpoint` (ti.ad.checkpoint
on the cloth, n=32 T=2000; --checkpoint-steps T for a quicker run; benchmarks/checkpoint.py) or
`fwdmode` (forward mode's JVP against the forward pass on gravity and cloth, wgpu_ad only),
`determinism` (ti.init(deterministic=True) against the default, wgpu_ad only) or `memory`
(benchmarks/memory.py: GPU buffers and RSS over create / use / drop cycles, wgpu_ad only). Each system runs
in its own worker process; within every repetition the systems take turns (A B C D A B C D ...)
so machine noise hits all of them alike. Medians are printed with the ratio wgpu_ad / system
(below 1: wgpu_ad is faster), then each system's loss and gradient entry against a float64
NumPy reference, the compile times, and the targets of the benchmark issue.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import checkpoint, compile_time, determinism, forward_mode, memory, report, torch_bridge
from benchmarks.systems import ALL_SYSTEMS, NEEDS, Worker, WorkerError, WorkerSkip, default_systems, installed
from benchmarks.workloads import Case, full_cases, quick_cases

LIBRARY = {"taichi": "Taichi", "warp": "NVIDIA Warp", "torch": "PyTorch", "jax": "JAX"}
WORKLOADS = ("gravity", "cloth", "reduction", "scatter", "launch", "compile", "torch", "checkpoint", "fwdmode",
             "determinism", "memory")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one repetition (a smoke test)")
    ap.add_argument("--json", metavar="PATH", help="also write every measurement to this JSON file")
    ap.add_argument("--only", metavar="NAME", action="append", default=[],
                    help=f"run only these workloads (comma-separated or repeated): {', '.join(WORKLOADS)}")
    ap.add_argument("--systems", metavar="LIST", default=None,
                    help=f"comma-separated subset of {', '.join(ALL_SYSTEMS)} (default: all installed but "
                         f"wgpu_ad-cas; Taichi, Warp, PyTorch, JAX when they import; taichi-cuda, torch and jax "
                         f"run on the GPU when they see one, taichi-cuda skips without one)")
    ap.add_argument("--reps", type=int, default=None, help="repetitions per case (default: per case)")
    ap.add_argument("--checkpoint-steps", type=int, default=None, metavar="T",
                    help="time steps of the checkpoint benchmark (default 2000; 40 with --quick)")
    args = ap.parse_args(argv)
    args.only = [w for item in args.only for w in item.split(",") if w]
    bad = [w for w in args.only if w not in WORKLOADS]
    if bad:
        ap.error(f"--only: unknown workload(s) {bad}; expected some of {', '.join(WORKLOADS)}")
    if args.systems is None:
        args.systems = default_systems()
    else:
        args.systems = [s for s in args.systems.split(",") if s]
        bad = [s for s in args.systems if s not in ALL_SYSTEMS]
        if bad:
            ap.error(f"--systems: unknown system(s) {bad}; expected some of {', '.join(ALL_SYSTEMS)}")
        for s in args.systems:
            if not installed(s):
                pkg, hint = NEEDS[s]
                ap.error(f"--systems: {s} needs {LIBRARY[pkg]} in this Python: {hint}")
    if args.checkpoint_steps is not None and args.checkpoint_steps < 1:
        ap.error(f"--checkpoint-steps must be at least 1, got {args.checkpoint_steps}")
    if args.reps is not None and args.reps < 1:
        ap.error(f"--reps must be at least 1, got {args.reps}")
    return args


def _rel_err(value, ref):
    if value is None or ref is None:
        return None
    return abs(value - ref) / max(abs(ref), 1e-30)


def run_case(case: Case, workers: dict[str, Worker], reps: int) -> dict:
    """Set the case up on every system, time it interleaved, then check the results."""
    mod = case.module()
    rec = {"case": case.label, "workload": case.workload, "params": case.params, "unit": mod.UNIT,
           "modes": list(mod.MODES), "loss_name": mod.LOSS, "grad_name": mod.GRAD, "tol": case.tol,
           "devices": {}, "times": {}, "median": {}, "checks": {}, "errors": {}, "skipped": {}}
    live = []
    for name, w in workers.items():
        try:
            rec["devices"][name] = w.call("setup", case.workload, case.params)
            live.append(name)
            rec["times"][name] = {m: [] for m in mod.MODES}
        except WorkerSkip as e:
            rec["skipped"][name] = str(e)
        except WorkerError as e:
            rec["errors"][name] = str(e)
    for _ in range(reps):
        for name in list(live):
            try:
                for m in mod.MODES:
                    rec["times"][name][m].append(workers[name].call("time", m))
            except WorkerError as e:
                rec["errors"][name] = str(e)
                live.remove(name)
    scale = 1e3 if mod.UNIT == "ms" else 1e6 / case.params.get("launches", 1)
    for name in live:
        rec["median"][name] = {m: statistics.median(ts) * scale for m, ts in rec["times"][name].items()}
    if case.workload == "reduction":  # its physical limit: a device memory copy of the same bytes
        rec["copy"], rec["copy_errors"] = {}, {}
        for name in ("wgsl", "torch"):
            if name in workers:
                try:
                    rec["copy"][name] = workers[name].call("copy", 4 * case.params["n"], reps)
                except WorkerError as e:
                    rec["copy_errors"][name] = str(e)
    ref_loss, ref_grad = mod.reference(case.params, mod.inputs(case.params))
    rec["reference"] = {"loss": ref_loss, "grad": ref_grad}
    for name in live:
        try:
            loss, grad = workers[name].call("result")
        except WorkerError as e:
            rec["errors"][name] = str(e)
            continue
        le, ge = _rel_err(loss, ref_loss), _rel_err(grad, ref_grad)
        rec["checks"][name] = {"loss": loss, "grad": grad, "loss_rel_err": le, "grad_rel_err": ge,
                               "ok": all(e is None or e <= case.tol for e in (le, ge))}
    return rec


def machine_info() -> dict:
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"date": time.strftime("%Y-%m-%d"), "cpu": cpu, "cores": os.cpu_count(),
            "python": platform.python_version(), "platform": platform.platform(),
            "load_avg_at_start": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


def _write_json(path: str | None, out: dict) -> bool:
    if not path:
        return False
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
    os.replace(path + ".tmp", path)
    return True


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cases = quick_cases() if args.quick else full_cases()
    if args.only:
        cases = [c for c in cases if c.workload in args.only]
    do_compile = not args.only or "compile" in args.only
    do_torch = (not args.only or "torch" in args.only) and "wgpu_ad" in args.systems
    do_checkpoint = (not args.only or "checkpoint" in args.only) and "wgpu_ad" in args.systems
    do_fwdmode = (not args.only or "fwdmode" in args.only) and "wgpu_ad" in args.systems
    do_determinism = (not args.only or "determinism" in args.only) and "wgpu_ad" in args.systems
    do_memory = (not args.only or "memory" in args.only) and "wgpu_ad" in args.systems
    out = {"machine": machine_info(), "quick": args.quick, "complete": False, "systems": args.systems, "cases": [], "compile": None,
           "torch": None, "checkpoint": None, "fwdmode": None, "determinism": None, "memory": None}
    print(f"benchmarks on {out['machine']['cpu']} ({out['machine']['cores']} cores); systems: "
          f"{', '.join(args.systems)}{' (quick)' if args.quick else ''}", flush=True)
    load = out["machine"]["load_avg_at_start"]
    if load is not None and load > 0.5:
        print(f"note: the 1-minute load average is {load:.2f}: other processes use the CPU, so timings "
              f"will be noisy (interleaving spreads the noise over all systems alike)", flush=True)
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="wgpu_ad_bench_") as tmp:
        workers = {s: Worker(s, tmp) for s in args.systems} if cases else {}
        try:
            for case in cases:
                t0 = time.perf_counter()
                rec = run_case(case, workers, args.reps or case.reps)
                out["cases"].append(rec)
                print(report.case_block(rec, args.systems) + f"  ({time.perf_counter() - t0:.0f} s)\n", flush=True)
                _write_json(args.json, out)  # a run stopped at a time limit keeps the cases done
        finally:
            for w in workers.values():
                w.close()
        if cases:
            out["devices"] = {s: d for rec in out["cases"] for s, d in rec["devices"].items()}
        if do_compile:
            out["compile"] = compile_time.measure(args.systems, quick=args.quick, reps=args.reps, tmp=tmp)
            print(report.compile_block(out["compile"]), flush=True)
    if do_torch:
        out["torch"] = torch_bridge.measure(args.quick, args.reps)
        print(torch_bridge.block(out["torch"]), flush=True)
    if do_checkpoint:
        out["checkpoint"] = checkpoint.measure(args.quick, args.reps, args.checkpoint_steps,
                                               taichi=any(s.startswith("taichi") for s in args.systems))
        print(checkpoint.block(out["checkpoint"]), flush=True)
    if do_fwdmode:
        out["fwdmode"] = forward_mode.measure(args.quick, args.reps)
        print(forward_mode.block(out["fwdmode"]), flush=True)
    if do_determinism:
        out["determinism"] = determinism.measure(args.quick, args.reps)
        print(determinism.block(out["determinism"]), flush=True)
    if do_memory:
        out["memory"] = memory.measure(args.quick)
        print(memory.block(out["memory"]), flush=True)
    print(report.summary_table(out), flush=True)
    if not args.quick:
        out["targets"] = report.targets(out)
        print(report.targets_block(out["targets"]), flush=True)
    out["total_s"] = time.perf_counter() - t_start
    if hasattr(os, "getloadavg"):
        out["machine"]["load_avg_at_end"] = os.getloadavg()[0]
    print(f"total {out['total_s']:.0f} s", flush=True)
    out["complete"] = True
    if _write_json(args.json, out):
        print(f"wrote {args.json}")
    wrong = [(rec["case"], s) for rec in out["cases"] for s, c in rec["checks"].items() if not c["ok"]]
    if wrong:
        print("results outside tolerance: " + ", ".join(f"{s} on {c}" for c, s in wrong))
    return 0


if __name__ == "__main__":
    sys.exit(main())
