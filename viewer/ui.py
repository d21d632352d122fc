"""ti.ui: Taichi GGUI's names (Window, Canvas, Scene, Camera, window.GUI sub-windows).

    window = ti.ui.Window("cloth", (800, 800))
    canvas, scene, camera = window.get_canvas(), ti.ui.Scene(), ti.ui.Camera()
    while window.running:
        camera.track_user_inputs(window, hold_key=ti.ui.RMB)
        scene.set_camera(camera)
        scene.point_light(pos=(0, 1, 2), color=(1, 1, 1))
        scene.mesh(x, indices=idx, color=(0.8, 0.4, 0.2), two_sided=True)
        canvas.scene(scene)
        window.show()

2-D canvas calls take positions in [0, 1]^2 (origin bottom left) and sizes as fractions of the
window height, as GGUI does; colours are (r, g, b) floats.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from . import canvas2d as c2d
from . import events as ev
from .canvas2d import Input
from .colormap import to_rgba
from .core import Display
from .scene import Camera, Scene
from .sources import const, indices as index_src, rgb_colors, scalars, vectors
from .widgets import SubWindow

PRESS, RELEASE, MOTION, WHEEL = ev.PRESS, ev.RELEASE, ev.MOTION, ev.WHEEL
LMB, MMB, RMB = ev.LMB, ev.MMB, ev.RMB
ESCAPE, RETURN, TAB, BACKSPACE, SPACE = ev.ESCAPE, ev.RETURN, ev.TAB, ev.BACKSPACE, ev.SPACE
UP, DOWN, LEFT, RIGHT = ev.UP, ev.DOWN, ev.LEFT, ev.RIGHT
SHIFT, CTRL, ALT, CAPSLOCK = ev.SHIFT, ev.CTRL, ev.ALT, ev.CAPSLOCK
EXIT = ev.EXIT


class Canvas:
    """The 2-D surface of a Window (window.get_canvas())."""

    def __init__(self, window: "Window"):
        self._window = window
        self.background = (0.0, 0.0, 0.0, 1.0)

    def _frame(self):
        return self._window._display.draw_frame()

    def _px(self, size: float) -> float:
        return float(size) * self._window._display.size[1]

    def set_background_color(self, color) -> None:
        self.background = to_rgba(color, "canvas.set_background_color")

    def set_image(self, img, cmap="viridis", vmin: float = 0.0, vmax: float = 1.0) -> None:
        c2d.image(self._frame(), img, cmap, vmin, vmax)

    def scene(self, scene: Scene) -> None:
        """Draw the scene's items for this frame (then the scene starts empty for the next)."""
        scene.draw_into(self._frame(), self._window._display.size)

    def _colors(self, f, color, per_vertex_color, what: str):
        if per_vertex_color is not None:
            return rgb_colors(per_vertex_color, f"{what}(per_vertex_color)", f.up), True
        return const(*to_rgba(color, f"{what}(color)")), False

    def circles(self, centers, radius: float, color=(1.0, 1.0, 1.0), per_vertex_color=None,
                index_offset: int = 0, index_count: int | None = None) -> None:
        f = self._frame()
        p = vectors(centers, 2, "canvas.circles(centers)", f.up)
        r = scalars(self._px(radius), "canvas.circles(radius)", f.up)
        col, _ = self._colors(f, color, per_vertex_color, "canvas.circles")
        n = p.count - index_offset if index_count is None else index_count
        c2d.circles(f, Input(p, 1, index_offset), r, Input(col, 1, index_offset), max(n, 0))

    def lines(self, vertices, width: float, indices=None, color=(1.0, 1.0, 1.0), per_vertex_color=None,
              vertex_offset: int = 0, vertex_count: int | None = None, index_offset: int = 0,
              index_count: int | None = None) -> None:
        """Segments between vertex pairs (2 k, 2 k + 1), or index pairs; width: fraction of the height."""
        f = self._frame()
        v, ix, ends, add = _vertex_range(f, "canvas.lines", vertices, indices, vertex_offset, vertex_count,
                                         index_offset, index_count)
        col, _ = self._colors(f, color, per_vertex_color, "canvas.lines")
        c2d.segments(f, Input(v, 2, add, ix), Input(v, 2, add + 1, ix), const(self._px(width) / 2),
                     Input(col, 2, add, ix), max(ends, 0) // 2)

    def triangles(self, vertices, color=(1.0, 1.0, 1.0), indices=None, per_vertex_color=None,
                  vertex_offset: int = 0, vertex_count: int | None = None, index_offset: int = 0,
                  index_count: int | None = None) -> None:
        f = self._frame()
        v, ix, corners, add = _vertex_range(f, "canvas.triangles", vertices, indices, vertex_offset,
                                            vertex_count, index_offset, index_count)
        col, per_vertex = self._colors(f, color, per_vertex_color, "canvas.triangles")
        corners_in = [Input(v, 3, add + k, ix) for k in range(3)]
        c2d.triangles(f, *corners_in, Input(col, 1 if per_vertex else 3, add, ix), max(corners, 0) // 3,
                      per_vertex_color=per_vertex)

    def text(self, content, pos, font_size: float = 0.03, color=(1.0, 1.0, 1.0)) -> None:
        """Text with its top-left corner at pos; font_size: fraction of the window height."""
        w, h = self._window._display.size
        c2d.text(self._frame(), str(content), float(pos[0]) * w, float(pos[1]) * h, self._px(font_size),
                 const(*to_rgba(color, "canvas.text(color)")))


class WindowGUI:
    """window.GUI: immediate-mode widgets in sub-windows (x, y, w, h: fractions of the window, top left)."""

    def __init__(self, window: "Window"):
        self._window = window
        self._current: SubWindow | None = None

    def sub_window(self, name: str, x: float, y: float, width: float, height: float) -> SubWindow:
        d = self._window._display
        return SubWindow(d.panel, d.draw_frame(), str(name), x, y, width, height)

    def begin(self, name: str, x: float, y: float, width: float, height: float) -> None:
        self._current = self.sub_window(name, x, y, width, height)

    def end(self) -> None:
        self._current = None

    def _sub(self) -> SubWindow:
        if self._current is None:
            self._current = self.sub_window("", 0.02, 0.02, 0.4, 0.3)
        return self._current

    def slider_float(self, text: str, value: float, minimum: float, maximum: float) -> float:
        return self._sub().slider_float(text, value, minimum, maximum)

    def slider_int(self, text: str, value: int, minimum: int, maximum: int) -> int:
        return self._sub().slider_int(text, value, minimum, maximum)

    def button(self, text: str) -> bool:
        return self._sub().button(text)

    def checkbox(self, text: str, old_value: bool) -> bool:
        return self._sub().checkbox(text, old_value)

    def text(self, text: str, color=None) -> None:
        self._sub().text(text, color)


class Window:
    """A GGUI window (headless by itself when there is no display)."""

    def __init__(self, name: str = "wgpu_ad", res=(800, 800), vsync: bool = False, show_window: bool = True,
                 fps_limit: float | None = None, pos=None, headless: bool | None = None,
                 show_fps: bool | None = None, record: str | None = None):
        if not show_window:
            headless = True
        self._display = Display(name, res, headless, vsync, show_fps, record, fps_limit)
        self._canvas = Canvas(self)
        self.GUI = WindowGUI(self)
        self.event: ev.Event | None = None

    @property
    def running(self) -> bool:
        return self._display.running

    @running.setter
    def running(self, value: bool) -> None:
        self._display.queue.close_requested = not value

    @property
    def headless(self) -> bool:
        return self._display.headless

    @property
    def res(self) -> tuple[int, int]:
        return self._display.size

    @property
    def paused(self) -> bool:
        return self._display.queue.paused

    def should_advance(self) -> bool:
        return self._display.queue.should_advance()

    def take_reset(self) -> bool:
        return self._display.queue.take_reset()

    def get_canvas(self) -> Canvas:
        return self._canvas

    def get_scene(self) -> Scene:
        return Scene()

    def show(self) -> None:
        """Render this frame, show it, and take in events."""
        self.GUI._current = None
        self._display.render(self._canvas.background)
        self._display.present_and_poll()

    def save_image(self, filename: str) -> None:
        """Write this frame as a PNG (rendering it if show() has not yet)."""
        self._display.render(self._canvas.background)
        self._display.save(filename)

    def get_image_buffer_as_numpy(self) -> np.ndarray:
        """The rendered frame as (w, h, 4) float32, [x, y] from the bottom left (as GGUI)."""
        self._display.render(self._canvas.background)
        img = self._display.read_image().astype(np.float32) / 255.0
        return np.ascontiguousarray(img[::-1].transpose(1, 0, 2))

    def get_event(self, *types: str) -> bool:
        self._display.poll()
        self.event = self._display.queue.pop(*types)
        return self.event is not None

    def get_events(self, *types: str) -> Iterator[ev.Event]:
        self._display.poll()
        return list(self._display.queue.drain(*types))

    def is_pressed(self, *keys: str) -> bool:
        return self._display.queue.is_pressed(*keys)

    def get_cursor_pos(self) -> tuple[float, float]:
        return self._display.queue.cursor

    @property
    def events(self):
        return self._display.queue

    def destroy(self) -> None:
        self._display.close()

    close = destroy

    def __enter__(self) -> "Window":
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()


__all__ = ["Window", "Canvas", "Scene", "Camera", "WindowGUI", "PRESS", "RELEASE", "MOTION", "WHEEL", "LMB",
           "MMB", "RMB", "ESCAPE", "RETURN", "TAB", "BACKSPACE", "SPACE", "UP", "DOWN", "LEFT", "RIGHT", "SHIFT",
           "CTRL", "ALT", "CAPSLOCK", "EXIT"]


def _vertex_range(f, what: str, vertices, indices, vertex_offset, vertex_count, index_offset, index_count):
    """(vertex source, index source or None, how many vertices/indices to draw, first one)."""
    v = vectors(vertices, 2, f"{what}(vertices)", f.up)
    ix = None if indices is None else index_src(indices, f"{what}(indices)", f.up)
    if ix is not None:
        return v, ix, (ix.count - index_offset if index_count is None else index_count), index_offset
    return v, None, (v.count - vertex_offset if vertex_count is None else vertex_count), vertex_offset
