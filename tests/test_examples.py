"""The demos run: each draws a few frames headless (in a subprocess, as a user would start it) and
writes PNG images of the right size that are not blank; the differentiable cloth's gradient
matches central differences and its optimisation lowers the loss at least 10x (in-process).

The PNG files are read back by a small decoder here, independent of the viewer's writer.
"""
from __future__ import annotations

import importlib.util
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TIMEOUT = 240  # seconds per subprocess; each takes a few seconds on lavapipe


# ---- a minimal PNG reader (8-bit RGB / RGBA, not interlaced) -----------------------------------

def read_png(path: Path) -> np.ndarray:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG file (bad signature)"
    pos, idat, ihdr = 8, b"", None
    while pos < len(data):
        (length,), tag = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert zlib.crc32(tag + body) == crc, f"{path.name}: bad CRC in chunk {tag!r}"
        if tag == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif tag == b"IDAT":
            idat += body
        elif tag == b"IEND":
            break
        pos += 12 + length
    assert ihdr is not None, f"{path.name}: no IHDR chunk"
    w, h, depth, ctype, _, _, interlace = ihdr
    assert depth == 8 and ctype in (2, 6) and interlace == 0, f"{path.name}: unexpected format {ihdr}"
    bpp = 3 if ctype == 2 else 4
    raw = zlib.decompress(idat)
    stride = w * bpp
    assert len(raw) == h * (stride + 1), f"{path.name}: image data has the wrong length"
    out = np.zeros((h, stride), np.int32)
    prev = np.zeros(stride, np.int32)
    for y in range(h):
        ftype = raw[y * (stride + 1)]
        row = np.frombuffer(raw, np.uint8, stride, y * (stride + 1) + 1).astype(np.int32)
        if ftype == 0:
            cur = row
        elif ftype == 2:
            cur = (row + prev) & 255
        else:  # Sub, Average, Paeth depend on the left neighbour: go pixel by pixel
            cur = np.zeros(stride, np.int32)
            for i in range(stride):
                a = cur[i - bpp] if i >= bpp else 0
                b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
                if ftype == 1:
                    p = a
                elif ftype == 3:
                    p = (a + b) // 2
                elif ftype == 4:
                    pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                    p = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                else:
                    raise AssertionError(f"{path.name}: bad filter type {ftype} in row {y}")
                cur[i] = (row[i] + p) & 255
        out[y] = cur
        prev = cur
    return out.reshape(h, w, bpp).astype(np.uint8)


def check_image(path: Path, size: tuple[int, int], min_colors: int = 2) -> np.ndarray:
    """A valid PNG of size (w, h) with at least `min_colors` distinct colours; returns RGB."""
    assert path.exists(), f"{path} was not written"
    img = read_png(path)
    assert (img.shape[1], img.shape[0]) == size, f"{path.name}: size {img.shape[1]}x{img.shape[0]}, expected {size}"
    rgb = img[..., :3].reshape(-1, 3)
    colors = np.unique(rgb[:, 0].astype(np.int64) << 16 | rgb[:, 1].astype(np.int64) << 8 | rgb[:, 2])
    assert len(colors) >= min_colors, f"{path.name} is blank: {len(colors)} colour(s)"
    return img[..., :3]


def run_example(script: str, args: list[str], env_drop: tuple = ()) -> str:
    env = {k: v for k, v in os.environ.items() if k not in env_drop}
    p = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True,
                       timeout=TIMEOUT, env=env, cwd=str(EXAMPLES.parent))
    assert p.returncode == 0, f"{script} {' '.join(args)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr[-4000:]}"
    return p.stdout


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---- the demos, headless -----------------------------------------------------------------------

def test_gravity_switches_to_headless_and_writes_frames(tmp_path):
    # no --headless and no display: the example must notice, say so, and write PNG frames
    out = run_example("gravity.py", ["--n", "64", "--frames", "3", "--substeps", "2", "--arrows",
                                     "--res", "256", "--out", str(tmp_path)],
                      env_drop=("DISPLAY", "WAYLAND_DISPLAY"))
    assert "headless" in out, out
    assert "E = K + U" in out, out
    for i in range(3):
        img = check_image(tmp_path / f"gravity_{i:04d}.png", (256, 256))
    # particles are drawn over the background: the most common colour is not everywhere
    flat = img.reshape(-1, 3)
    _, counts = np.unique(flat, axis=0, return_counts=True)
    assert counts.max() < 0.999 * len(flat), "only the background was drawn"


def test_cloth_headless_frames(tmp_path):
    out = run_example("cloth.py", ["--headless", "--n", "12", "--frames", "3", "--res", "320",
                                   "--out", str(tmp_path)])
    assert "3 frames" in out, out
    lowest = []
    for i in range(3):
        img = check_image(tmp_path / f"cloth_{i:04d}.png", (320, 240), min_colors=4)
        # the cloth (warm checker colours) is in the picture, not just the sphere and the ground
        r, g, b = (img[..., k].astype(int) for k in range(3))
        cloth = (r > b + 60) & (r > 120)
        assert cloth.sum() > 50, f"no cloth pixels in frame {i}"
        lowest.append(np.nonzero(cloth.any(axis=1))[0].max())  # image rows count from the top
    # the frames span the fall: the cloth hangs down over the sphere in the last one (it was still
    # flat above the sphere when each headless frame was 1/60 s)
    assert lowest[2] > lowest[0] + 0.1 * 240, f"the cloth's lowest pixel rows {lowest}: it did not drape"


def test_cloth_optimize_cli_writes_loss_plot(tmp_path):
    out = run_example("cloth.py", ["--optimize", "--headless", "--iters", "3", "--opt-n", "6", "--steps", "60",
                                   "--duration", "0.1", "--frames", "2", "--res", "320", "--out", str(tmp_path)])
    assert "lower" in out, out
    assert "iteration   2  loss" in out, out
    assert "memory kept for the backward pass" in out and "to store every step" in out, out
    check_image(tmp_path / "cloth_loss.png", (640, 400), min_colors=3)
    for i in range(2):
        check_image(tmp_path / f"cloth_opt_{i:04d}.png", (320, 240), min_colors=4)


def test_gravity_forces_from_the_tape_and_energy_drift():
    import wgpu_ad as ti
    gravity = load_example("gravity")
    n = 96
    drifts = []
    for refine in (1, 2):  # the same simulated time with dt and dt / 2
        ti.init(random_seed=3)
        sim = gravity.Gravity(n, 2.5e-3 / n / refine)
        sim.init()
        if refine == 1:
            with ti.ad.Tape(loss=sim.U):
                sim.compute_U()
            x = sim.x.to_numpy().astype(np.float64)
            d = x[:, None] - x[None]
            r2 = (d ** 2).sum(-1) + gravity.EPS
            f_ref = (-2 * d / r2[..., None] ** 1.5).sum(1)  # -dU/dx_i: the (i, j) and (j, i) terms
            f = -sim.x.grad.to_numpy()
            assert np.abs(f - f_ref).max() <= 1e-4 * np.abs(f_ref).max(), "tape forces differ from -dU/dx"
        k0, u0 = sim.energy()
        for _ in range(200 * refine):
            sim.substep()
        k1, u1 = sim.energy()
        assert k1 > 1000 * max(k0, 1.0), "the particles should have started to fall together"
        drifts.append((k1 + u1 - k0 - u0) / abs(k0 + u0))
    # symplectic Euler: a small energy error, first order in dt (halving dt halves it)
    assert abs(drifts[1]) < 1e-3, f"energy drift {drifts[1]:.2e}"
    assert 1.5 < drifts[0] / drifts[1] < 2.5, f"drift {drifts[0]:.2e} with dt, {drifts[1]:.2e} with dt / 2"


# ---- the differentiable cloth, in-process --------------------------------------------------------

def test_cloth_gradient_matches_central_differences():
    import wgpu_ad as ti
    cloth = load_example("cloth")
    ti.init()
    # 0.1 s of free fall: no contact yet, so the loss is smooth and differences are meaningful
    opt = cloth.ClothOptimizer(6, 40, stiffness=2e3, dt=0.1 / 40)
    rng = np.random.default_rng(1)
    p = rng.normal(0, 0.5, (6, 6, 3)).astype(np.float32)
    _, g = opt.forward(p)
    for e in (np.broadcast_to(np.float32([1, 0, 0]), p.shape), rng.normal(size=p.shape).astype(np.float32)):
        h = 0.02
        lp, _ = opt.forward(p + h * e, grad=False)
        lm, _ = opt.forward(p - h * e, grad=False)
        fd, ad = (lp - lm) / (2 * h), float((g * e).sum())
        assert abs(fd - ad) <= 0.02 * abs(fd) + 1e-4, f"directional derivative: tape {ad}, differences {fd}"


def test_cloth_optimization_lowers_loss_10x():
    import wgpu_ad as ti
    cloth = load_example("cloth")
    ti.init()
    history = cloth.optimize(n=8, duration=0.45, steps=150, iters=10, progress=False)
    assert len(history) == 10 and all(np.isfinite(history))
    assert history[0] > 0.1, f"the initial guess should be far from the target, loss {history[0]}"
    assert history[0] / history[-1] >= 10, f"loss {history[0]:.4g} -> {history[-1]:.4g}: less than 10x lower"


def test_cloth_mouse_picks_and_drags_a_vertex():
    import wgpu_ad as ti
    cloth = load_example("cloth")
    ti.init()
    n, res = 12, (320, 240)
    live = cloth.LiveCloth(n, res, headless=True)
    rt = ti.get_runtime()
    before = rt.readback_count
    live.frame()
    live.frame()
    assert rt.readback_count == before, "stepping and drawing the cloth read field data back to the CPU"
    cam = live.view.camera
    # aim the cursor at the middle vertex with the viewer's own camera matrices
    k = (n // 2) * n + n // 2
    p = live.cloth.x.to_numpy()[live.cur].reshape(-1, 3)[k]
    clip = cam.projection_matrix(res[0] / res[1]) @ cam.view_matrix() @ np.append(p, 1.0)
    sx, sy = (clip[:2] / clip[3] + 1) / 2
    q = live.view.window.events
    q.on_cursor_pos(None, sx * res[0], (1 - sy) * res[1])  # glfw: screen pixels from the top left
    q.on_mouse_button(None, 0, 1, 0)                        # left button down
    before = rt.readback_count
    live.frame()
    assert live.picked == k, f"picked vertex {live.picked}, expected {k} under the cursor"
    assert rt.readback_count == before + 1, "picking reads the positions back once per click"
    q.on_cursor_pos(None, sx * res[0], (1 - sy - 0.25) * res[1])  # drag upwards, hold it there
    for _ in range(12):
        live.frame()
    xs = live.cloth.x.to_numpy()[live.cur].reshape(-1, 3)
    target = np.asarray(live.target)
    assert target[1] > p[1] + 0.1, f"the drag target {target} should be above the picked vertex {p}"
    assert np.linalg.norm(xs[k] - target) < 0.05, f"vertex at {xs[k]}, the cursor's point is {target}"
    assert xs[:, 1].mean() > p[1], "the cloth should be lifted with its picked vertex, not fall"
    q.on_mouse_button(None, 0, 0, 0)  # released: the cloth falls freely again
    live.frame()
    assert live.picked == -1


def test_torch_splats_fits_and_writes_images(tmp_path):
    """The PyTorch example: torch.optim.Adam through a wgpu_ad kernel lowers the loss and writes
    the side-by-side picture and the loss curve."""
    pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
    out = run_example("torch_splats.py", ["--iters", "12", "--splats", "16", "--res", "24", "--out", str(tmp_path)])
    first, last = (float(v) for v in out.split("loss ")[-1].split(" (")[0].split(" -> "))
    assert last < first / 2, out
    check_image(tmp_path / "torch_splats.png", (2 * 24 * 4 + 2 * 4, 24 * 4), min_colors=8)
    check_image(tmp_path / "torch_splats_loss.png", (640, 400), min_colors=3)


def _progress_class():
    spec = importlib.util.spec_from_file_location("examples_common", EXAMPLES / "_common.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.Progress


def test_progress_in_a_log_is_a_few_plain_lines():
    """Not a terminal (a log, CI): a line at every tenth, no carriage returns (it was one 28 KB line)."""
    import io

    out = io.StringIO()
    bar = _progress_class()(1000, "fitting", stream=out)
    for i in range(1000):
        bar.update(f"loss {1.0 / (i + 1):.4f}")
    bar.close()
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert 10 <= len(lines) <= 11, lines
    assert lines[0].startswith("fitting: 1/1000 ") and lines[0].endswith("loss 1.0000")
    assert lines[-1].startswith("fitting: 1000/1000 ")


def test_progress_in_a_terminal_is_tqdms_bar():
    import io

    pytest.importorskip("tqdm", reason="tqdm is not installed (pip install tqdm; it is in the test extra)")

    class Tty(io.StringIO):
        def isatty(self):
            return True

    out = Tty()
    bar = _progress_class()(50, "fitting", stream=out)
    for _ in range(50):
        bar.update("loss 0.5")
    bar.close()
    assert "fitting: 100%" in out.getvalue() and "50/50" in out.getvalue()
