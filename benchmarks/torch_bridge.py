"""The PyTorch bridge's cost: wgpu_ad.torch.function against the bare kernels plus the copies a
user would write by hand, and the host <-> device copy bandwidth.

    python -m benchmarks --only torch          (part of the full run when torch is installed)
    python -m benchmarks.torch_bridge          (alone, in this process; prints JSON)

The program is examples/torch_splats.py's renderer (a per-pixel sum over Gaussian splats): one
forward + backward call with fixed inputs and a fixed output seed. 'bridge' is `y = f(...);
y.backward(seed)`; 'bare' does the same with ti.ndarrays made once: inputs copied in, the kernel,
the image copied out, the seed copied in, the input gradients zeroed, kernel.grad, the three
gradients copied out. Both are timed interleaved (A B A B ...) in one process; medians.
It runs in a subprocess of the driver, so the driver never imports torch.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

from benchmarks import child


def params(quick: bool) -> dict:
    return {"res": 32, "splats": 16, "mb": 4} if quick else {"res": 64, "splats": 48, "mb": 64}


def measure_here(p: dict, reps: int) -> dict:
    import numpy as np
    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
    import torch_splats
    import wgpu_ad as ti
    import wgpu_ad.torch as wt

    ti.init()
    res, k = p["res"], p["splats"]
    rng = np.random.default_rng(0)
    c0 = rng.uniform(0.1, 0.9, (k, 2)).astype(np.float32)
    s0 = np.full(k, np.log(0.08), np.float32)
    col0 = rng.uniform(0, 1, (k, 3)).astype(np.float32)
    seed = rng.standard_normal((res, res, 3)).astype(np.float32)
    render = torch_splats.render

    f = wt.function(render, outputs={"image": lambda **_: (res, res, 3)})
    tc, ts, tcol = (torch.tensor(a, requires_grad=True) for a in (c0, s0, col0))
    tseed = torch.from_numpy(seed)

    def bridge():
        for t in (tc, ts, tcol):
            t.grad = None
        f(tc, ts, tcol).backward(tseed)
        return tc.grad.numpy()

    nc = ti.ndarray(ti.math.vec2, shape=k, needs_grad=True)
    ns = ti.ndarray(ti.f32, shape=k, needs_grad=True)
    ncol = ti.ndarray(ti.math.vec3, shape=k, needs_grad=True)
    img = ti.ndarray(ti.math.vec3, shape=(res, res), needs_grad=True)

    def bare():
        nc.from_numpy(tc.detach().numpy())
        ns.from_numpy(ts.detach().numpy())
        ncol.from_numpy(tcol.detach().numpy())
        render(nc, ns, ncol, img)
        torch.from_numpy(img.to_numpy())
        img.grad.from_numpy(seed)
        for a in (nc, ns, ncol):
            a.grad.fill(0)
        render.grad(nc, ns, ncol, img)
        return [torch.from_numpy(a.grad.to_numpy()) for a in (nc, ns, ncol)][0].numpy()

    same = np.allclose(bridge(), bare(), rtol=1e-5, atol=1e-6)  # warm-up, and the same answer
    times = {"bridge": [], "bare": []}
    for _ in range(reps):
        for name, fn in (("bridge", bridge), ("bare", bare)):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    big = ti.ndarray(ti.f32, shape=p["mb"] * 262144)
    host = np.ones(big.shape, np.float32)
    up, down = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        big.from_numpy(host)
        ti.sync()
        up.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        big.to_numpy()
        down.append(time.perf_counter() - t0)
    med = {n: statistics.median(v) * 1e3 for n, v in times.items()}
    return {"params": p, "reps": reps, "ms": med, "ratio": med["bridge"] / med["bare"], "same_gradient": bool(same),
            "upload_mb_s": p["mb"] / statistics.median(up), "download_mb_s": p["mb"] / statistics.median(down)}


def measure(quick: bool, reps: int | None) -> dict:
    """Run measure_here in a fresh process (torch stays out of the driver); an 'error' without torch."""
    p = params(quick)
    out = child.run("benchmarks.torch_bridge", f"m.measure_here({p!r}, {reps or (2 if quick else 21)})", timeout=900)
    return {"params": p, **out} if "error" in out else out


def block(t: dict) -> str:
    p = t["params"]
    title = f"== torch bridge: splat renderer res={p['res']} splats={p['splats']}, forward + backward per call"
    if "error" in t:
        return f"{title}\n  not measured: {t['error']}\n"
    ms = t["ms"]
    return (f"{title} (median of {t['reps']})\n"
            f"  bridge {ms['bridge']:.3g} ms | bare kernels + copies {ms['bare']:.3g} ms "
            f"[bridge/bare {t['ratio']:.2f}]  same gradient: {'yes' if t['same_gradient'] else 'NO'}\n"
            f"  copies of {p['mb']} MB: host -> device {t['upload_mb_s']:.0f} MB/s, "
            f"device -> host {t['download_mb_s']:.0f} MB/s\n")


if __name__ == "__main__":
    print(json.dumps(measure_here(params("--quick" in sys.argv), 5), indent=1))
