"""What a user who installed the wheel does first, run against the installed package (not the
checkout): import, one kernel and its gradient against the analytic derivative, `python -m
wgpu_ad`, the viewer's import and an offscreen frame, and the README's examples (its Python blocks, in order).

    python tests/installed_smoke.py README.md     # from a folder outside the checkout

tests/test_wheel.py runs it with the wheel installed into a temporary folder; `.ci/run` runs it in a
fresh virtual environment holding only the wheel and its dependencies. Exits non-zero, saying
what failed, on any problem.
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path


def python_blocks(readme: Path) -> str:
    """The README's Python blocks, in order, as one script (each may use what the ones before made)."""
    blocks = re.findall(r"```python\n(.*?)```", readme.read_text(encoding="utf-8"), re.S)
    if not blocks:
        raise SystemExit(f"{readme}: no ```python block")
    return "\n".join(blocks)


def main(readme: Path) -> None:
    import numpy as np

    import wgpu_ad as ti

    pkg = Path(ti.__file__).resolve().parent
    print(f"wgpu_ad from {pkg}")
    # the installed copy, with its shaders and viewer inside the package folder
    for sub in ("shaders/math.wgsl", "shaders/atomics.wgsl", "viewer/__init__.py"):
        if not (pkg / sub).is_file():
            raise SystemExit(f"the installed package lacks {sub} (in {pkg})")
    if readme.parent in pkg.parents:
        raise SystemExit(f"wgpu_ad was imported from a checkout ({pkg}), not from the installed wheel")

    ti.init()
    n = 64
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def energy():
        for i in x:
            loss[None] += ti.sin(x[i]) * x[i]

    xs = np.linspace(-2, 2, n).astype(np.float32)
    x.from_numpy(xs)
    with ti.ad.Tape(loss=loss):
        energy()
    expected = np.cos(xs.astype(np.float64)) * xs + np.sin(xs.astype(np.float64))
    err = np.abs(x.grad.to_numpy() - expected).max()
    if not err < 1e-5:
        raise SystemExit(f"gradient of sum(sin(x) x) is off by {err} from cos(x) x + sin(x)")
    print(f"kernel and gradient: ok (max error {err:.1e})")

    r = ti.field(ti.f32, shape=1000)

    @ti.kernel
    def noise():
        for i in r:
            r[i] = ti.random()  # a helper from shaders/random.wgsl

    noise()
    rs = r.to_numpy()
    if not (rs.min() >= 0 and rs.max() < 1 and 0.4 < rs.mean() < 0.6):
        raise SystemExit(f"ti.random() gave values outside [0, 1) or far from uniform: mean {rs.mean()}")

    out = subprocess.run([sys.executable, "-m", "wgpu_ad"], capture_output=True, text=True, timeout=120)
    if out.returncode != 0 or "wgpu_ad would use" not in out.stdout:
        raise SystemExit(f"python -m wgpu_ad failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    print("python -m wgpu_ad: " + out.stdout.splitlines()[0])

    import wgpu_ad.viewer  # noqa: F401  (the viewer ships inside the package)

    gui = ti.GUI("smoke", res=(64, 48), show_gui=False)
    gui.circles(np.array([[0.5, 0.5]], np.float32), radius=8, color=0xFF0000)
    gui.show()
    img = gui.get_image()
    if img.shape[:2] != (64, 48) or not np.any(img[..., 0] > 0.5):
        raise SystemExit(f"the viewer drew nothing: image {img.shape}, max {img.max()}")
    print("viewer: ok")

    ti.reset()
    # as a user runs it: pasted into a file of their own
    script = Path(tempfile.mkdtemp(prefix="wgpu_ad_smoke_")) / "readme_examples.py"
    script.write_text(python_blocks(readme), encoding="utf-8")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise SystemExit(f"the README's examples failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    print("README's examples: ok; they printed " + " | ".join(out.stdout.split("\n")[:3]))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python installed_smoke.py README.md")
    main(Path(sys.argv[1]).resolve())
