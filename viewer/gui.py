"""ti.GUI: Taichi's 2-D GUI, drawing fields straight from their GPU buffers.

    gui = ti.GUI("demo", res=512)
    while gui.running:
        step()
        gui.circles(x, radius=3, color=0x66CCFF)   # x: a ti.Vector.field(2, ti.f32, N) in [0, 1]^2
        gui.show()

Positions are in [0, 1]^2 with the origin at the bottom left; radii and widths are in pixels;
colours are 0xRRGGBB (or per element: an int array / field, or float RGB rows). A window opens
when there is a display; otherwise the GUI is headless by itself and show(file) writes PNGs.
Keys p / s / r pause, step (while paused) and request a reset: see paused, should_advance() and
take_reset(); they are delivered as events too. Escape or closing the window ends `running`.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from wgpu_ad.errors import WgpuAdError

from . import canvas2d as c2d
from . import events as ev
from .colormap import to_rgba
from .core import Display
from .sources import K_PALETTE, Src, gui_colors, scalars, vectors, words
from .widgets import Button, Label, Slider


class GUI:
    # event types and keys, as Taichi spells them
    PRESS, RELEASE, MOTION, WHEEL = ev.PRESS, ev.RELEASE, ev.MOTION, ev.WHEEL
    LMB, MMB, RMB = ev.LMB, ev.MMB, ev.RMB
    ESCAPE, RETURN, TAB, BACKSPACE, SPACE = ev.ESCAPE, ev.RETURN, ev.TAB, ev.BACKSPACE, ev.SPACE
    UP, DOWN, LEFT, RIGHT = ev.UP, ev.DOWN, ev.LEFT, ev.RIGHT
    SHIFT, CTRL, ALT, CAPSLOCK = ev.SHIFT, ev.CTRL, ev.ALT, ev.CAPSLOCK
    EXIT, MOVE = ev.EXIT, ev.MOVE

    def __init__(self, name: str = "wgpu_ad", res=512, background_color: int = 0x112F41, show_gui: bool = True,
                 fast_gui: bool = False, headless: bool | None = None, show_fps: bool | None = None,
                 record: str | None = None, fps_limit: float | None = None, vsync: bool = False):
        if not show_gui:
            headless = True
        self._display = Display(name, res, headless, vsync, show_fps, record, fps_limit)
        self.background_color = background_color
        self.event: ev.Event | None = None

    # ---- state --------------------------------------------------------------------------------

    @property
    def res(self) -> tuple[int, int]:
        return self._display.size

    @property
    def running(self) -> bool:
        return self._display.running

    @running.setter
    def running(self, value: bool) -> None:
        if not value:
            self._display.queue.close_requested = True
        else:
            self._display.queue.close_requested = False

    @property
    def frame(self) -> int:
        """Frames shown so far."""
        return self._display.frame_count

    @property
    def headless(self) -> bool:
        return self._display.headless

    @property
    def fps(self) -> float:
        return self._display.fps

    @property
    def paused(self) -> bool:
        """Toggled by the p key."""
        return self._display.queue.paused

    @paused.setter
    def paused(self, value: bool) -> None:
        self._display.queue.paused = bool(value)

    def should_advance(self) -> bool:
        """True when the simulation should step this frame: not paused, or s was pressed."""
        return self._display.queue.should_advance()

    def take_reset(self) -> bool:
        """True once after each r press."""
        return self._display.queue.take_reset()

    @property
    def image_reads(self) -> int:
        """Frames read back from the GPU (saving, recording); field data is never read back."""
        return self._display.renderer.image_reads

    # ---- drawing ------------------------------------------------------------------------------

    def _frame(self):
        return self._display.draw_frame()

    def circles(self, pos, radius=1.0, color=0xFFFFFF, palette=None, palette_indices=None) -> None:
        """Circles at pos (N 2-vectors); radius in pixels; colour constant or per circle."""
        f = self._frame()
        p = vectors(pos, 2, "gui.circles(pos)", f.up)
        r = scalars(radius, "gui.circles(radius)", f.up)
        pal = None
        if palette is not None:
            if palette_indices is None:
                raise WgpuAdError("gui.circles: palette= needs palette_indices= (an int per circle)")
            colors = np.asarray([int(c) for c in palette], dtype=np.uint32)
            pal = words(colors, f.up, 1, 0)
            c = gui_colors(palette_indices if not isinstance(palette_indices, (int, np.integer))
                           else np.full(p.count, palette_indices), "gui.circles(palette_indices)", f.up)
            c = Src(c.buffer, c.base, c.stride, 1, K_PALETTE, c.count, c.shape)
        else:
            c = gui_colors(color, "gui.circles(color)", f.up)
        count = p.count
        c2d.check_count("gui.circles", pos=count, radius=_n(r), color=_n(c))
        c2d.circles(f, p, r, c, count, pal)

    def circle(self, pos, color=0xFFFFFF, radius=1.0) -> None:
        self.circles(np.asarray(pos, dtype=np.float32).reshape(1, 2), radius, color)

    def lines(self, begin, end, radius=1.0, color=0xFFFFFF) -> None:
        """Segments begin[i]-end[i]; radius = half the width in pixels (round caps)."""
        f = self._frame()
        a = vectors(begin, 2, "gui.lines(begin)", f.up)
        b = vectors(end, 2, "gui.lines(end)", f.up)
        r = scalars(radius, "gui.lines(radius)", f.up)
        c = gui_colors(color, "gui.lines(color)", f.up)
        count = c2d.check_count("gui.lines", begin=a.count, end=b.count, radius=_n(r), color=_n(c))
        c2d.segments(f, a, b, r, c, count)

    def line(self, begin, end, radius=1.0, color=0xFFFFFF) -> None:
        self.lines(np.reshape(begin, (1, 2)), np.reshape(end, (1, 2)), radius, color)

    def triangles(self, a, b, c, color=0xFFFFFF) -> None:
        f = self._frame()
        srcs = [vectors(x, 2, f"gui.triangles({n})", f.up) for x, n in ((a, "a"), (b, "b"), (c, "c"))]
        col = gui_colors(color, "gui.triangles(color)", f.up)
        count = c2d.check_count("gui.triangles", a=srcs[0].count, b=srcs[1].count, c=srcs[2].count, color=_n(col))
        c2d.triangles(f, *srcs, col, count)

    def triangle(self, a, b, c, color=0xFFFFFF) -> None:
        self.triangles(np.reshape(a, (1, 2)), np.reshape(b, (1, 2)), np.reshape(c, (1, 2)), color)

    def arrows(self, orig, direction, radius=1.0, color=0xFFFFFF, **kwargs) -> None:
        """Arrows from orig[i] along direction[i] (both in [0, 1] units); radius = shaft half width."""
        f = self._frame()
        o = vectors(orig, 2, "gui.arrows(orig)", f.up)
        d = vectors(direction, 2, "gui.arrows(direction)", f.up)
        r = scalars(radius, "gui.arrows(radius)", f.up)
        c = gui_colors(color, "gui.arrows(color)", f.up)
        count = c2d.check_count("gui.arrows", orig=o.count, direction=d.count, radius=_n(r), color=_n(c))
        c2d.arrows(f, o, d, r, c, count)

    def arrow(self, orig, direction, radius=1.0, color=0xFFFFFF, **kwargs) -> None:
        self.arrows(np.reshape(orig, (1, 2)), np.reshape(direction, (1, 2)), radius, color)

    def rect(self, topleft, bottomright, radius=1.0, color=0xFFFFFF) -> None:
        """The outline of the axis-aligned rectangle with these opposite corners."""
        (x0, y0), (x1, y1) = np.asarray(topleft, dtype=np.float32), np.asarray(bottomright, dtype=np.float32)
        corners = np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], dtype=np.float32)
        self.lines(corners, np.roll(corners, -1, axis=0), radius, color)

    def set_image(self, img, cmap="viridis", vmin: float = 0.0, vmax: float = 1.0) -> None:
        """Fill the window with img[x, y] (shape (w, h): scalars through cmap over [vmin, vmax];
        (w, h, 3): RGB in [0, 1], or 0..255 for integer arrays)."""
        c2d.image(self._frame(), img, cmap, vmin, vmax)

    def text(self, content, pos, font_size: float = 15, color=0xFFFFFF) -> None:
        """Text with its top-left corner at pos (built-in 5x7 bitmap font, scaled to font_size)."""
        w, h = self.res
        c2d.text(self._frame(), str(content), float(pos[0]) * w, float(pos[1]) * h, font_size,
                 gui_colors(color, "gui.text(color)", self._frame().up))

    # ---- widgets ------------------------------------------------------------------------------

    def slider(self, text: str, minimum: float, maximum: float, step: float = 1) -> Slider:
        """A slider in the widget panel; read .value (set it to move the slider)."""
        if not maximum > minimum:
            raise WgpuAdError(f"gui.slider({text!r}): maximum ({maximum}) must be greater than minimum ({minimum})")
        s = Slider(str(text), float(minimum), float(maximum), float(step), float(minimum))
        return self._display.panel.add(s)

    def label(self, text: str) -> Label:
        """A `text: value` line in the widget panel; assign .value."""
        return self._display.panel.add(Label(str(text)))

    def button(self, text: str, event_name: str | None = None) -> str:
        """A button; clicking it delivers a PRESS event whose key is the returned event name."""
        name = str(event_name or text)
        self._display.panel.add(Button(str(text), name))
        return name

    # ---- frames -------------------------------------------------------------------------------

    def show(self, file: str | None = None) -> None:
        """Finish the frame: render it, show it in the window, write it to `file` (PNG) if given."""
        d = self._display
        frame = d.draw_frame()
        if not d.rendered:
            d.panel.draw_retained(frame)
        d.render(to_rgba(self.background_color, "background_color"))
        if file:
            d.save(file)
        d.present_and_poll()

    def get_image(self) -> np.ndarray:
        """The last rendered frame as Taichi lays images out: (w, h, 4) float32, [x, y] from the bottom left."""
        img = self._display.read_image().astype(np.float32) / 255.0
        return np.ascontiguousarray(img[::-1].transpose(1, 0, 2))

    def close(self) -> None:
        self._display.close()

    def __enter__(self) -> "GUI":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- events -------------------------------------------------------------------------------

    def get_event(self, *types: str) -> bool:
        """Take the next event (of one of `types`, if given) into gui.event; False when none is left."""
        self._display.poll()
        self.event = self._display.queue.pop(*types)
        return self.event is not None

    def get_events(self, *types: str) -> Iterator[ev.Event]:
        """Every pending event (of one of `types`, if given)."""
        self._display.poll()
        return self._display.queue.drain(*types)

    def has_key_event(self) -> bool:
        return bool(self._display.queue.events)

    def is_pressed(self, *keys: str) -> bool:
        return self._display.queue.is_pressed(*keys)

    def get_cursor_pos(self) -> tuple[float, float]:
        """The cursor in [0, 1]^2, origin at the bottom left."""
        return self._display.queue.cursor

    @property
    def events(self):
        """The event queue (tests and advanced use: its on_* methods are the glfw callbacks)."""
        return self._display.queue


def _n(src: Src) -> int | None:
    """Element count of a per-element input, None for a constant."""
    return None if src.kind == 0 else src.count
