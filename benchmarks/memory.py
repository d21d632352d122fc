"""Memory over create / use / drop cycles: what a dropped field, ndarray or kernel leaves behind.

    python -m benchmarks --only memory          (part of the full run; wgpu_ad only)
    python -m benchmarks.memory [--quick]        (alone, in this process; prints JSON)

Issue 25: each of these patterns kept 4 MiB per cycle until ti.reset(). Per pattern, 1,000 cycles
(50 with --quick), each making a 4 MiB storage (or a kernel), using it and dropping it, with a
long-lived field written by every launch (so autodiff's write logs see them); sampled ten times:
GPU buffers alive and their MiB, bind groups alive (ti.runtime_stats(), after gc.collect()), and
the process's RSS. Flat curves are the goal; the first samples include the driver's warm-up.
  field     a new kernel reads a new field and writes the long-lived one
  ndarray   a new ndarray, launched 10 times (10,000 launches in all)
  template  a new field passed as a ti.template() argument (a new specialisation each time)
  kernel    a new kernel, launched once
"""

import gc
import json
import os
import subprocess
import sys

PATTERNS = ("field", "ndarray", "template", "kernel")
MIB4 = 1 << 20  # f32 elements in 4 MiB


def _sample(ti) -> dict:
    ti.sync()
    gc.collect()
    st = ti.runtime_stats()
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * 4096
    return {"buffers": st["buffers"], "buffer_mib": st["buffer_bytes"] / 2**20, "bind_groups": st["bind_groups"],
            "rss_mib": rss / 2**20}


def run_pattern(ti, pattern: str, cycles: int) -> list[dict]:
    acc = ti.field(ti.f32, shape=4, needs_grad=True)

    @ti.kernel
    def use_template(a: ti.template()):
        for i in range(4):
            acc[i] += a[i]

    @ti.kernel
    def use_ndarray(a: ti.types.ndarray()):
        for i in range(4):
            acc[i] += a[i]

    def one():
        if pattern == "field":
            f = ti.field(ti.f32, shape=MIB4)

            @ti.kernel
            def k():
                for i in range(4):
                    acc[i] += f[i]
            k()
        elif pattern == "ndarray":
            a = ti.ndarray(ti.f32, shape=MIB4)
            for _ in range(10):
                use_ndarray(a)
        elif pattern == "template":
            use_template(ti.field(ti.f32, shape=MIB4))
        else:
            @ti.kernel
            def k2(v: ti.f32):
                for i in range(4):
                    acc[i] += v
            k2(1.0)

    every = max(1, cycles // 10)
    out = []
    for c in range(cycles):
        one()
        if c % every == 0 or c == cycles - 1:
            out.append({"cycle": c + 1, **_sample(ti)})
    return out


def measure_here(quick: bool) -> dict:
    import wgpu_ad as ti
    cycles = 50 if quick else 1000
    out = {"cycles": cycles, "patterns": {}}
    for pattern in PATTERNS:
        ti.init(offline_cache=False)
        out["patterns"][pattern] = run_pattern(ti, pattern, cycles)
        ti.reset()
    return out


def measure(quick: bool) -> dict:
    """Run measure_here in a fresh process."""
    code = f"import json; from benchmarks.memory import measure_here; print('RESULT ' + json.dumps(measure_here({quick!r})))"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=1800)
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    if r.returncode != 0 or line is None:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": tail[0]}
    return json.loads(line[len("RESULT "):])


def block(res: dict) -> str:
    title = "== memory: a 4 MiB field / ndarray / kernel made, used and dropped per cycle, wgpu_ad"
    if "error" in res:
        return f"{title}\n  not measured: {res['error']}\n"
    lines = [f"{title} ({res['cycles']} cycles; goal: flat)",
             "  pattern    cycle: GPU buffers / their MiB / bind groups / RSS MiB ..."]
    for pattern, samples in res["patterns"].items():
        pts = "  ".join(f"{s['cycle']}: {s['buffers']}/{s['buffer_mib']:.0f}/{s['bind_groups']}/{s['rss_mib']:.0f}"
                        for s in samples)
        lines.append(f"  {pattern:<9}  {pts}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    res = measure_here("--quick" in sys.argv)
    print(block(res))
    print(json.dumps(res))
