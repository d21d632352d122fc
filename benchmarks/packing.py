"""The cost of packed bindings (codegen/packing.py): a kernel binding more storage buffers than
the limit copies its packed fields into one buffer before each launch and the written ones back.

    python -m benchmarks.packing [--quick]      (alone, in this process; prints JSON)

One program, `y[i] = sum_k x_k[i] * w_k + x_k[i]**2` over 12 fields with gradients and
`loss = sum(y**2)`, timed as a forward launch and as a ti.ad.Tape (forward and backward), with
ti.set_compile_options(max_storage_buffers=10) (a browser's limit: forward and adjoint packed)
and without packing (the device's own limit), interleaved (A B A B ...), medians. Each setting's
loss and one gradient are checked against float64 NumPy first.
"""
from __future__ import annotations

import json
import statistics
import sys
import time

FIELDS = 12


def measure(quick: bool = False, reps: int | None = None) -> dict:
    import numpy as np

    import wgpu_ad as ti

    ti.init(offline_cache=False)
    if ti.get_runtime().limits["max-storage-buffers-per-shader-stage"] < 2 * FIELDS + 2:
        return {"skipped": "this adapter binds too few storage buffers to run the program unpacked"}
    reps = reps or (3 if quick else 15)
    out = {}
    for n in ((1 << 12,) if quick else (1 << 12, 1 << 18)):
        xs = [ti.field(ti.f32, shape=n, needs_grad=True) for _ in range(FIELDS)]
        y = ti.field(ti.f32, shape=n, needs_grad=True)
        loss = ti.field(ti.f32, shape=(), needs_grad=True)
        x0 = [np.linspace(-1.0, 1.0, n).astype(np.float32) + np.float32(0.01 * k) for k in range(FIELDS)]
        for x, v in zip(xs, x0):
            x.from_numpy(v)
        w = [0.5 + 0.25 * k for k in range(FIELDS)]

        @ti.kernel
        def f():
            for i in range(n):
                s = 0.0
                for k in ti.static(range(FIELDS)):
                    s += xs[k][i] * w[k] + xs[k][i] ** 2
                y[i] = s

        @ti.kernel
        def total():
            for i in range(n):
                loss[None] += y[i] * y[i]

        def forward():
            f()
            ti.sync()

        def tape():
            with ti.ad.Tape(loss=loss):
                f()
                total()
            ti.sync()

        want = sum(w[k] * v.astype(np.float64) + v.astype(np.float64) ** 2 for k, v in enumerate(x0))
        settings = {"packed": 10, "unpacked": None}
        checks = {}
        for name, limit in settings.items():
            ti.set_compile_options(max_storage_buffers=limit)
            tape()
            g = xs[3].grad.to_numpy()
            ref = 2 * want * (w[3] + 2 * x0[3].astype(np.float64))
            checks[name] = {"loss": abs(loss[None] - (want ** 2).sum()) / (want ** 2).sum(),
                            "grad": float(np.abs(g - ref).max() / np.abs(ref).max())}
        times = {(op, name): [] for op in ("forward", "tape") for name in settings}
        for _ in range(reps):
            for op, fn in (("forward", forward), ("tape", tape)):
                for name, limit in settings.items():
                    ti.set_compile_options(max_storage_buffers=limit)
                    t0 = time.perf_counter()
                    fn()
                    times[(op, name)].append(1e3 * (time.perf_counter() - t0))
        out[str(n)] = {"ms": {f"{op} {name}": round(statistics.median(v), 3) for (op, name), v in times.items()},
                       "relative_errors": checks}
    return {"adapter": str(ti.get_runtime()), "fields": FIELDS, "reps": reps, "by_size": out}


if __name__ == "__main__":
    print(json.dumps(measure("--quick" in sys.argv), indent=1))
