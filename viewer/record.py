"""Recording shown frames into a GIF or MP4 (with imageio, optional), or numbered PNG files.

GUI(..., record="out.gif") / ui.Window(..., record=...) add every shown frame; record(gui, path)
does the same for a window made without it. Without imageio, the frames go to PNG files in a
folder next to the requested file (one line says so), so headless runs always leave pictures.
"""
from __future__ import annotations

import os

import numpy as np

from wgpu_ad.errors import WgpuAdError

from .png import write_png


def _imageio():
    try:
        import imageio.v2 as imageio  # noqa: PLC0415 (optional dependency)
    except ImportError:
        return None
    return imageio


class Recorder:
    """Collects (h, w, 3|4) uint8 frames; close() writes them."""

    def __init__(self, path: str | os.PathLike, fps: float = 30.0, every: int = 1):
        self.path = os.fspath(path)
        ext = os.path.splitext(self.path)[1].lower()
        if ext not in (".gif", ".mp4"):
            raise WgpuAdError(f"record: {self.path!r} should end in .gif or .mp4")
        if fps <= 0 or int(every) < 1:
            raise WgpuAdError(f"record: fps must be > 0 and every >= 1 (got fps={fps}, every={every})")
        self.fps = float(fps)
        self.every = int(every)
        self.frames: list[np.ndarray] = []
        self.seen = 0
        self.written: str | None = None
        self.imageio = _imageio()
        self.frame_dir = os.path.splitext(self.path)[0] + "_frames"
        if self.imageio is None:
            print(f"wgpu_ad.viewer: imageio is not installed (pip install 'wgpu_ad[record]'); writing the frames "
                  f"of {self.path} as PNG files in {self.frame_dir}/", flush=True)

    def add(self, image: np.ndarray) -> None:
        self.seen += 1
        if (self.seen - 1) % self.every:
            return
        rgb = np.ascontiguousarray(image[:, :, :3])
        if self.imageio is None:
            write_png(os.path.join(self.frame_dir, f"frame_{len(self.frames):05d}.png"), rgb)
            self.frames.append(np.empty(0))  # counted, not kept
        else:
            self.frames.append(rgb)

    def close(self) -> str | None:
        """Write the file (imageio) and return its path, or the PNG folder's."""
        if self.written is not None or not self.frames:
            return self.written
        if self.imageio is None:
            self.written = self.frame_dir
        else:
            folder = os.path.dirname(self.path)
            if folder:
                os.makedirs(folder, exist_ok=True)
            if self.path.lower().endswith(".gif"):
                self.imageio.mimsave(self.path, self.frames, duration=1.0 / self.fps, loop=0)
            else:
                self.imageio.mimsave(self.path, self.frames, fps=self.fps)
            self.written = self.path
        self.frames = []
        return self.written


def record(target, path: str | os.PathLike, fps: float = 30.0, every: int = 1) -> Recorder:
    """Record every `every`-th frame a ti.GUI or ti.ui.Window shows from now on into path (.gif/.mp4).

    The file is written when the window is closed (gui.close() / window.destroy()), or by the
    returned Recorder's close().
    """
    display = getattr(target, "_display", None)
    if display is None:
        raise WgpuAdError(f"record: expected a ti.GUI or ti.ui.Window, got {type(target).__name__}")
    if display.recorder is not None:
        display.recorder.close()
    display.recorder = Recorder(path, fps, every)
    return display.recorder
