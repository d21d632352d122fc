"""Fit an image with Gaussian splats: a wgpu_ad kernel renders, PyTorch optimises.

The renderer is one @ti.kernel (every pixel sums the splats' colours weighted by a Gaussian of its
distance to each centre); wgpu_ad.torch.function makes it a torch.autograd.Function, so the splats'
centres, sizes and colours are ordinary torch Parameters that torch.optim.Adam fits to a target
image by gradient descent through the kernel's adjoint.

    python examples/torch_splats.py [--iters 300] [--splats 48] [--res 64] [--out frames]

Writes the target and the fit side by side (torch_splats.png) and the loss curve
(torch_splats_loss.png) to --out. Needs torch (pip install torch).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wgpu_ad as ti  # noqa: E402
import wgpu_ad.torch  # noqa: E402
from _common import Progress, plot_loss  # noqa: E402


@ti.kernel
def render(centers: ti.types.ndarray(dtype=ti.math.vec2), log_sizes: ti.types.ndarray(),
           colors: ti.types.ndarray(dtype=ti.math.vec3), image: ti.types.ndarray(dtype=ti.math.vec3)):
    for i, j in image:
        p = ti.Vector([(j + 0.5) / image.shape[1], (i + 0.5) / image.shape[0]])
        c = ti.Vector([0.0, 0.0, 0.0])
        for k in range(centers.shape[0]):
            d = p - centers[k]
            s = ti.exp(log_sizes[k])
            c += colors[k] * ti.exp(-d.dot(d) / (2.0 * s * s))
        image[i, j] = c


def target_image(res: int) -> np.ndarray:
    """A picture to fit: a warm disc, a blue ring and a green bar on a dark background."""
    y, x = np.mgrid[0:res, 0:res].astype(np.float64)
    u, v = (x + 0.5) / res, (y + 0.5) / res
    img = np.zeros((res, res, 3)) + 0.05
    disc = np.exp(-((u - 0.33) ** 2 + (v - 0.38) ** 2) / 0.012)
    ring = np.exp(-(np.hypot(u - 0.65, v - 0.62) - 0.2) ** 2 / 0.002)
    bar = np.exp(-((v - 0.82) / 0.05) ** 2) * (np.abs(u - 0.4) < 0.3)
    img += disc[..., None] * [0.95, 0.55, 0.2] + ring[..., None] * [0.2, 0.45, 0.95] + bar[..., None] * [0.3, 0.8, 0.35]
    return img.clip(0, 1).astype(np.float32)


def fit(iters: int = 300, splats: int = 48, res: int = 64, lr: float = 0.03, seed: int = 0,
        progress: bool = True) -> dict:
    """Fit the target; returns the loss history, the target and the final render."""
    ti.init()
    rng = np.random.default_rng(seed)
    target = torch.from_numpy(target_image(res))
    centers = torch.nn.Parameter(torch.from_numpy(rng.uniform(0.1, 0.9, (splats, 2)).astype(np.float32)))
    log_sizes = torch.nn.Parameter(torch.full((splats,), float(np.log(0.08)), dtype=torch.float32))
    colors = torch.nn.Parameter(torch.from_numpy(rng.uniform(0.0, 0.3, (splats, 3)).astype(np.float32)))
    draw = wgpu_ad.torch.function(render, outputs={"image": lambda **_: (res, res, 3)})
    opt = torch.optim.Adam([centers, log_sizes, colors], lr=lr)
    history = []
    bar = Progress(iters, "fitting splats", enabled=progress)
    for _ in range(iters):
        opt.zero_grad()
        image = draw(centers, log_sizes, colors)
        loss = ((image - target) ** 2).mean()
        loss.backward()
        opt.step()
        history.append(loss.item())
        bar.update(f"loss {history[-1]:.5f}")
    bar.close()
    with torch.no_grad():
        final = draw(centers, log_sizes, colors)
    return {"history": history, "target": target.numpy(), "image": final.numpy()}


def save_side_by_side(target: np.ndarray, image: np.ndarray, path: str, scale: int = 4) -> None:
    from wgpu_ad.viewer.png import write_png
    pair = np.concatenate([target, np.ones((target.shape[0], 2, 3), np.float32), image.clip(0, 1)], axis=1)
    big = np.repeat(np.repeat(pair, scale, axis=0), scale, axis=1)
    write_png(path, (big * 255 + 0.5).astype(np.uint8))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--splats", type=int, default=48)
    ap.add_argument("--res", type=int, default=64)
    ap.add_argument("--out", default="frames")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    result = fit(args.iters, args.splats, args.res)
    h = result["history"]
    save_side_by_side(result["target"], result["image"], os.path.join(args.out, "torch_splats.png"))
    plot_loss(h, os.path.join(args.out, "torch_splats_loss.png"), "splats")
    print(f"loss {h[0]:.5f} -> {h[-1]:.5f} ({h[0] / max(h[-1], 1e-30):.1f}x lower) after {len(h)} iterations; "
          f"images in {args.out}/")


if __name__ == "__main__":
    main()
