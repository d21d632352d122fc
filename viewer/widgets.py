"""Sliders, buttons, labels and checkboxes, drawn with the 2-D primitives and driven by the mouse.

ti.GUI's widgets are retained (gui.slider(...) once, .value read every frame); GGUI's
window.GUI.sub_window(...) widgets are immediate (called every frame, returning the value).
Both go through one Panel: it draws the widgets at show() time and remembers where each one
was, so mouse events (which arrive between frames) are matched against the last frame's
layout. A press on a widget is consumed: the program does not also see it as a click.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import canvas2d as c2d
from . import events as ev
from .font import CELL_H, CELL_W
from .renderer import Frame
from .sources import const

_PANEL_BG = (0.08, 0.08, 0.10, 0.78)
_TRACK = (0.22, 0.24, 0.28, 1.0)
_FILL = (0.25, 0.55, 0.85, 1.0)
_BUTTON = (0.30, 0.33, 0.38, 1.0)
_TEXT = (0.95, 0.95, 0.95, 1.0)


@dataclass(eq=False)
class Slider:
    """ti.GUI slider: read .value each frame (the mouse changes it)."""

    name: str
    minimum: float
    maximum: float
    step: float
    value: float

    def set(self, v: float) -> None:
        v = min(max(float(v), self.minimum), self.maximum)
        if self.step:
            v = self.minimum + round((v - self.minimum) / self.step) * self.step
            v = min(max(v, self.minimum), self.maximum)
        self.value = v


@dataclass(eq=False)
class Label:
    """ti.GUI label: shows `name: value`; assign .value."""

    name: str
    value: Any = ""


@dataclass(eq=False)
class Button:
    name: str
    event_name: str


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.3e}"
    return str(v)


class Panel:
    """Widget layout, drawing and mouse handling for one window (size in pixels)."""

    def __init__(self, queue: ev.EventQueue, size: tuple[int, int]):
        self.queue = queue
        self.size = size
        self.scale = 2 if min(size) >= 400 else 1
        self.row_h = CELL_H * self.scale + 8
        self.retained: list = []
        self.rects: dict = {}        # widget key -> (x0, y0, x1, y1) in pixels from the top left, last frame
        self.kinds: dict = {}        # widget key -> 'slider' / 'button' / 'checkbox'
        self.active = None           # the slider being dragged
        self.captured = False        # the left button went down on a widget
        self.pending: dict = {}      # immediate widgets: key -> new value / click from input
        self.values: dict = {}       # immediate sliders: key -> (minimum, maximum)
        self._frame_rects: dict = {}
        queue.listeners.append(self.on_event)

    # ---- retained (ti.GUI) --------------------------------------------------------------------

    def add(self, widget):
        self.retained.append(widget)
        return widget

    # ---- input --------------------------------------------------------------------------------

    def _hit(self, pos) -> Any:
        x, y = pos[0] * self.size[0], (1.0 - pos[1]) * self.size[1]
        for key, (x0, y0, x1, y1) in self.rects.items():
            if self.kinds.get(key) != "label" and x0 <= x <= x1 and y0 <= y <= y1:
                return key
        return None

    def _slide(self, key, pos) -> None:
        x0, _, x1, _ = self.rects[key]
        t = min(max((pos[0] * self.size[0] - x0) / max(x1 - x0, 1.0), 0.0), 1.0)
        if isinstance(key, Slider):
            key.set(key.minimum + t * (key.maximum - key.minimum))
        else:
            lo, hi = self.values.get(key, (0.0, 1.0))
            self.pending[key] = lo + t * (hi - lo)

    def on_event(self, e: ev.Event) -> bool:
        """EventQueue listener: True when a widget took the event.

        A left press on a widget captures the mouse until the release: the program sees neither.
        """
        if e.key == ev.LMB and e.type == ev.PRESS:
            key = self._hit(e.pos)
            if key is None:
                return False
            self.captured = True
            kind = self.kinds.get(key)
            if kind == "slider":
                self.active = key
                self._slide(key, e.pos)
            elif kind == "button":
                if isinstance(key, Button):
                    self.queue.events.append(ev.Event(ev.PRESS, key.event_name, e.pos))
                else:
                    self.pending[key] = True
            elif kind == "checkbox":
                self.pending[key] = True
            return True
        if self.captured:
            if e.type == ev.MOTION and e.key == ev.MOVE and self.active is not None:
                self._slide(self.active, e.pos)
                return True
            if e.key == ev.LMB and e.type == ev.RELEASE:
                self.active = None
                self.captured = False
                return True
        return False

    # ---- drawing ------------------------------------------------------------------------------

    def _norm(self, x: float, y: float) -> tuple[float, float]:
        return x / self.size[0], 1.0 - y / self.size[1]

    def _rect(self, frame: Frame, x0, y0, x1, y1, color) -> None:
        ax, ay = self._norm(x0, y1)
        bx, by = self._norm(x1, y0)
        c2d.fill_rect(frame, ax, ay, bx, by, const(*color))

    def _text(self, frame: Frame, s: str, x: float, y: float) -> None:
        c2d.text(frame, s, x, self.size[1] - y, CELL_H * self.scale, const(*_TEXT))

    def _row(self, frame: Frame, key, kind: str, x0: float, y: float, width: float, text: str,
             fraction: float | None = None) -> None:
        x1, y1 = x0 + width, y + self.row_h - 4
        self._frame_rects[key] = (x0, y, x1, y1)
        self.kinds[key] = kind
        if kind in ("slider", "button", "checkbox"):
            self._rect(frame, x0, y, x1, y1, _BUTTON if kind != "slider" else _TRACK)
        if fraction is not None:
            self._rect(frame, x0, y, x0 + (x1 - x0) * min(max(fraction, 0.0), 1.0), y1, _FILL)
        self._text(frame, text, x0 + 4, y + 2 + (self.row_h - 4 - 7 * self.scale) // 2)

    def draw_retained(self, frame: Frame) -> None:
        """ti.GUI's widgets in a panel at the top left."""
        if not self.retained:
            return
        width = min(self.size[0] * 0.45, 40 * CELL_W * self.scale)
        x0, y = 8.0, 8.0
        self._rect(frame, x0 - 4, y - 4, x0 + width + 4, y + len(self.retained) * self.row_h, _PANEL_BG)
        for w in self.retained:
            if isinstance(w, Slider):
                span = w.maximum - w.minimum
                frac = (w.value - w.minimum) / span if span else 0.0
                self._row(frame, w, "slider", x0, y, width, f"{w.name} {_fmt(w.value)}", frac)
            elif isinstance(w, Button):
                self._row(frame, w, "button", x0, y, width, w.name)
            else:
                self._row(frame, w, "label", x0, y, width, f"{w.name}: {_fmt(w.value)}")
            y += self.row_h

    def end_frame(self) -> None:
        """The layout drawn this frame becomes what the next events are matched against."""
        self.rects = self._frame_rects
        self._frame_rects = {}


class SubWindow:
    """GGUI's `with window.GUI.sub_window(name, x, y, w, h) as w:` (fractions of the window, top left)."""

    def __init__(self, panel: Panel, frame: Frame, name: str, x: float, y: float, w: float, h: float):
        self.panel, self.frame, self.name = panel, frame, name
        W, H = panel.size
        self.x0, self.y0, self.w, self.h = x * W, y * H, w * W, h * H
        self.cursor_y = self.y0 + 4
        panel._rect(frame, self.x0, self.y0, self.x0 + self.w, self.y0 + self.h, _PANEL_BG)
        panel._text(frame, name, self.x0 + 4, self.cursor_y)
        self.cursor_y += panel.row_h

    def __enter__(self) -> "SubWindow":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def _next(self) -> float:
        y = self.cursor_y
        self.cursor_y += self.panel.row_h
        return y

    def slider_float(self, text: str, value: float, minimum: float, maximum: float) -> float:
        key = (self.name, text)
        p = self.panel
        p.values[key] = (float(minimum), float(maximum))
        if key in p.pending:
            value = p.pending.pop(key)
        span = maximum - minimum
        frac = (value - minimum) / span if span else 0.0
        p._row(self.frame, key, "slider", self.x0 + 4, self._next(), self.w - 8, f"{text} {_fmt(float(value))}", frac)
        return value

    def slider_int(self, text: str, value: int, minimum: int, maximum: int) -> int:
        return int(round(self.slider_float(text, float(value), float(minimum), float(maximum))))

    def button(self, text: str) -> bool:
        key = (self.name, text)
        clicked = bool(self.panel.pending.pop(key, False))
        self.panel._row(self.frame, key, "button", self.x0 + 4, self._next(), self.w - 8, text)
        return clicked

    def checkbox(self, text: str, old_value: bool) -> bool:
        key = (self.name, text)
        value = bool(old_value) ^ bool(self.panel.pending.pop(key, False))
        self.panel._row(self.frame, key, "checkbox", self.x0 + 4, self._next(), self.w - 8,
                        f"[{'x' if value else ' '}] {text}")
        return value

    def text(self, text: str, color=None) -> None:
        self.panel._row(self.frame, (self.name, "text", self.cursor_y), "label", self.x0 + 4, self._next(),
                        self.w - 8, str(text))
