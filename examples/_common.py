"""What the examples share: the headless switch, PNG frame names, and a progress display.

The examples put their own folder on sys.path (Python does that for `python examples/x.py`), so
`import _common` works both as a script and when a test imports an example by path.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np


def add_view_args(parser: argparse.ArgumentParser, default_frames: int = 8) -> None:
    """--headless, --frames, --out: the switches every drawing example understands."""
    parser.add_argument("--headless", action="store_true",
                        help="render offscreen and write PNG frames (automatic without a display)")
    parser.add_argument("--frames", type=int, default=None,
                        help=f"stop after this many frames (headless default: {default_frames})")
    parser.add_argument("--out", default="frames",
                        help="folder for the headless PNG frames (default: ./frames)")
    parser.set_defaults(_default_frames=default_frames)


def has_display() -> bool:
    """False on Linux/BSD without X11 or Wayland (CI, ssh, containers); elsewhere assume a screen."""
    if sys.platform.startswith(("linux", "freebsd", "openbsd")):
        return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    return True


def resolve_view(args: argparse.Namespace, name: str) -> tuple[bool, int | None]:
    """(headless, frame limit) from the parsed arguments, saying so when there is no display."""
    headless = bool(args.headless)
    if not headless and not has_display():
        print(f"{name}: no display found (DISPLAY/WAYLAND_DISPLAY unset): running headless, "
              f"writing PNG frames to {args.out}/")
        headless = True
    frames = args.frames
    if headless:
        frames = args._default_frames if frames is None else frames
        os.makedirs(args.out, exist_ok=True)
    return headless, frames


def adopt_headless(args: argparse.Namespace, viewer_headless: bool, headless: bool,
                   frames: int | None) -> tuple[bool, int | None]:
    """The viewer may go headless by itself (no glfw, no window): then write frames like --headless."""
    if viewer_headless and not headless:
        frames = args._default_frames if args.frames is None else args.frames
        os.makedirs(args.out, exist_ok=True)
        return True, frames
    return headless, frames


def frame_file(out: str, prefix: str, i: int) -> str:
    return os.path.join(out, f"{prefix}_{i:04d}.png")


class Progress:
    """Progress of a loop: tqdm's bar in a terminal or a notebook (`pip install tqdm`, in the
    examples' extra); in a log (stdout not a terminal) or without tqdm, one plain line at every
    tenth of the way, so a log gets at most 11 lines and no carriage returns."""

    def __init__(self, total: int, desc: str = "", enabled: bool = True, stream=None):
        self.total, self.desc, self.enabled = total, desc, enabled
        self.stream = stream if stream is not None else sys.stdout
        self.n, self.postfix, self.t0, self._next_line = 0, "", time.perf_counter(), 0
        self._tqdm = None
        interactive = "ipykernel" in sys.modules or getattr(self.stream, "isatty", lambda: False)()
        if enabled and interactive:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._tqdm = tqdm(total=total, desc=desc, file=self.stream, dynamic_ncols=True)

    def update(self, postfix: str = "") -> None:
        self.n += 1
        self.postfix = postfix
        if not self.enabled:
            return
        if self._tqdm is not None:
            self._tqdm.set_postfix_str(postfix, refresh=False)
            self._tqdm.update(1)
        elif self.n >= self._next_line or self.n == self.total:
            self._next_line = self.n + max(1, self.total // 10)
            dt = time.perf_counter() - self.t0
            print(f"{self.desc}: {self.n}/{self.total} {dt:.1f}s {postfix}".rstrip(), file=self.stream, flush=True)

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()


def plot_loss(history: list[float], path: str, title: str, headless: bool = True) -> None:
    """The loss curve (log scale) drawn with the viewer's 2-D lines and saved as a PNG."""
    import wgpu_ad as ti
    x0, x1, y0, y1 = 0.12, 0.96, 0.14, 0.86   # the plot area in [0, 1]^2
    gui = ti.GUI(f"{title}: loss", res=(640, 400), background_color=0xFFFFFF, headless=headless)
    y = np.log10(np.maximum(np.asarray(history, np.float64), 1e-30))
    lo, hi = math.floor(y.min()), math.ceil(y.max())
    hi = hi if hi > lo else lo + 1
    px = x0 + (x1 - x0) * np.arange(len(y)) / max(len(y) - 1, 1)
    py = y0 + (y1 - y0) * (y - lo) / (hi - lo)
    pts = np.stack([px, py], 1).astype(np.float32)
    for dec in range(lo, hi + 1):  # a grid line and a label at every decade
        yy = y0 + (y1 - y0) * (dec - lo) / (hi - lo)
        gui.line((x0, yy), (x1, yy), radius=1, color=0xDDDDDD)
        gui.text(f"1e{dec}", (0.01, yy + 0.02), font_size=14, color=0x444444)
    gui.line((x0, y0), (x1, y0), radius=1.5, color=0x333333)
    gui.line((x0, y0), (x0, y1), radius=1.5, color=0x333333)
    if len(pts) > 1:
        gui.lines(pts[:-1], pts[1:], radius=2, color=0x1565C0)
    gui.circles(pts, radius=3, color=0x1565C0)
    gui.text("0", (x0 - 0.01, y0 - 0.03), font_size=14, color=0x444444)
    gui.text(str(len(y) - 1), (x1 - 0.02, y0 - 0.03), font_size=14, color=0x444444)
    gui.text("iteration", (0.47, y0 - 0.03), font_size=14, color=0x444444)
    gui.text(f"{title}: loss {history[0]:.3g} -> {history[-1]:.3g} ({history[0] / max(history[-1], 1e-30):.0f}x lower)",
             (x0, 0.97), font_size=15, color=0x222222)
    gui.show(path)
    gui.close()
