"""What the examples share: the headless switch, PNG frame names, and a terminal progress bar.

The examples put their own folder on sys.path (Python does that for `python examples/x.py`), so
`import _common` works both as a script and when a test imports an example by path.
"""
from __future__ import annotations

import argparse
import os
import sys
import time


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
    """A one-line progress bar: tqdm when it is installed, else plain carriage-return output."""

    def __init__(self, total: int, desc: str = "", width: int = 30, enabled: bool = True):
        self.total, self.desc, self.width, self.enabled = total, desc, width, enabled
        self.n, self.postfix, self.t0 = 0, "", time.perf_counter()
        self._tqdm = None
        if enabled:
            try:
                from tqdm import tqdm
                self._tqdm = tqdm(total=total, desc=desc, ncols=90)
            except ImportError:
                pass

    def update(self, postfix: str = "") -> None:
        self.n += 1
        self.postfix = postfix
        if not self.enabled:
            return
        if self._tqdm is not None:
            self._tqdm.set_postfix_str(postfix, refresh=False)
            self._tqdm.update(1)
            return
        done = self.width * self.n // max(self.total, 1)
        dt = time.perf_counter() - self.t0
        eta = dt / self.n * (self.total - self.n)
        bar = "#" * done + "-" * (self.width - done)
        sys.stdout.write(f"\r{self.desc} [{bar}] {self.n}/{self.total} {dt:5.1f}s eta {eta:5.1f}s {postfix}")
        sys.stdout.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self._tqdm is not None:
            self._tqdm.close()
        else:
            sys.stdout.write("\n")
            sys.stdout.flush()
