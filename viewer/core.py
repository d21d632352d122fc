"""What ti.GUI and ti.ui.Window share: a frame's life (draw, render, show, save), the window or
headless target, events, widgets, the FPS readout and recording.

A frame collects draw commands until it is rendered (show() or save_image()); the next drawing
call starts a new frame. Headless mode is chosen by itself when no window can be opened
(printing one line saying why); every call works the same way, show(file) / save_image(file)
write PNG files.
"""
from __future__ import annotations

import time

import numpy as np

from wgpu_ad.errors import WgpuAdError

from . import canvas2d as c2d
from .events import EventQueue
from .png import write_png
from .renderer import Frame, Renderer
from .sources import const
from .widgets import Panel
from .window import Surface, WindowError, no_window_reason

HEADLESS_NOTICE = "wgpu_ad.viewer: {reason}; rendering headless (offscreen): show(file) / save_image(file) write PNG files"


def normalize_res(res, what: str = "res") -> tuple[int, int]:
    if isinstance(res, (int, np.integer)):
        res = (int(res), int(res))
    try:
        w, h = (int(v) for v in res)
    except (TypeError, ValueError):
        raise WgpuAdError(f"{what}: expected an int or (width, height), got {res!r}") from None
    if w < 1 or h < 1:
        raise WgpuAdError(f"{what}: width and height must be >= 1, got {(w, h)}")
    return w, h


class Display:
    """One window (or offscreen target) and its frames."""

    def __init__(self, name: str, res, headless: bool | None = None, vsync: bool = False,
                 show_fps: bool | None = None, record: str | None = None, fps_limit: float | None = None):
        self.name = str(name)
        self.size = normalize_res(res)
        self.queue = EventQueue(self.size)
        self.renderer = Renderer(self.size)
        self.surface: Surface | None = None
        if headless is None:
            reason = no_window_reason()
            if reason is None:
                try:
                    self.surface = self._open(vsync)
                except WindowError as e:
                    reason = str(e)
            if reason is not None:
                print(HEADLESS_NOTICE.format(reason=reason), flush=True)
        elif not headless:
            reason = no_window_reason()
            if reason is not None:
                raise WindowError(f"cannot open the window '{self.name}': {reason}; pass headless=True (or leave "
                                  f"it out to switch to headless by itself)")
            self.surface = self._open(vsync)
        self.headless = self.surface is None
        self.show_fps = (not self.headless) if show_fps is None else bool(show_fps)
        self.fps_limit = fps_limit
        self.panel = Panel(self.queue, self.size)
        self.frame = self.renderer.new_frame()
        self.rendered = False
        self.frame_count = 0
        self.fps = 0.0
        self._last_show: float | None = None
        self.closed = False
        self.recorder = None
        if record:
            from .record import Recorder  # noqa: PLC0415
            self.recorder = Recorder(record)

    def _open(self, vsync: bool) -> Surface:
        return Surface(self.name, self.size, self.queue, self.renderer.device, self.renderer.rt.adapter, vsync)

    # ---- frames -------------------------------------------------------------------------------

    def draw_frame(self) -> Frame:
        """The frame drawing calls add to (a new one after the last was rendered).

        Drawing still works after the window was closed (nothing is shown): loops end on `running`.
        """
        self.renderer.check_alive()
        if self.rendered:
            self.frame = self.renderer.new_frame()
            self.rendered = False
        return self.frame

    def _overlay(self, frame: Frame) -> None:
        if self.show_fps:
            label = f"FPS {self.fps:5.1f}"
            scale = self.panel.scale
            w = len(label) * 6 * scale
            c2d.text(frame, label, self.size[0] - w - 6, self.size[1] - 6, 9 * scale, const(1.0, 1.0, 1.0, 1.0))

    def render(self, clear) -> None:
        """Render the current frame (once) into the offscreen target."""
        frame = self.draw_frame()
        if self.rendered:
            return
        self._overlay(frame)
        self.renderer.render(frame, clear)
        self.rendered = True

    def read_image(self) -> np.ndarray:
        """The rendered frame, (h, w, 4) uint8, top row first."""
        return self.renderer.read_image()

    def save(self, path) -> None:
        write_png(path, self.read_image()[:, :, :3])

    def present_and_poll(self) -> None:
        """Show the rendered frame in the window, record it, and take in new events."""
        if self.surface is not None and self.surface.is_open:
            self.renderer.present(self.surface)
        if self.recorder is not None:
            self.recorder.add(self.read_image())
        self.panel.end_frame()
        self.poll()
        now = time.perf_counter()
        if self.fps_limit and self._last_show is not None:
            wait = 1.0 / self.fps_limit - (now - self._last_show)
            if wait > 0:
                time.sleep(wait)
                now = time.perf_counter()
        if self._last_show is not None:
            dt = max(now - self._last_show, 1e-6)
            self.fps = 1.0 / dt if self.fps == 0.0 else 0.9 * self.fps + 0.1 / dt
        self._last_show = now
        self.frame_count += 1
        if self.surface is not None and self.surface.is_open and self.frame_count % 30 == 0:
            self.surface.set_title(f"{self.name} ({self.fps:.0f} FPS)")

    def poll(self) -> None:
        if self.surface is not None and self.surface.is_open:
            self.surface.poll()
            if self.queue.close_requested:
                self.close()

    @property
    def running(self) -> bool:
        return not self.closed and not self.queue.close_requested

    def close(self) -> None:
        """Close the window (if any) and finish a recording."""
        if self.surface is not None:
            self.surface.close()
        if self.recorder is not None:
            self.recorder.close()
            self.recorder = None
        self.closed = True
