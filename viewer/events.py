"""Keyboard and mouse events: glfw callbacks turned into Taichi-style events in a queue.

The handlers take exactly the arguments glfw passes to its callbacks, so tests drive them by
calling them directly, and headless windows have the same queue. glfw's key codes are written
here as numbers (they are fixed by the glfw API), so this module does not import glfw.

Event names follow Taichi: e.key is 'a', 'LMB', 'Escape', ' ' ...; e.type is PRESS, RELEASE,
MOTION (cursor moved, key MOVE) or WHEEL (key WHEEL, e.delta = (dx, dy) in scroll steps);
e.pos is the cursor in [0, 1]^2 with the origin at the bottom left.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator

# event types
PRESS, RELEASE, MOTION, WHEEL = "Press", "Release", "Motion", "Wheel"
# keys (Taichi's strings)
LMB, MMB, RMB = "LMB", "MMB", "RMB"
ESCAPE, RETURN, TAB, BACKSPACE, SPACE = "Escape", "Return", "Tab", "BackSpace", " "
UP, DOWN, LEFT, RIGHT = "Up", "Down", "Left", "Right"
SHIFT, CTRL, ALT, SUPER, CAPSLOCK = "Shift", "Control", "Alt", "Super", "Caps_Lock"
EXIT, MOVE = "WMClose", "Motion"

# glfw constants (https://www.glfw.org/docs/latest/group__keys.html)
_GLFW_RELEASE, _GLFW_PRESS, _GLFW_REPEAT = 0, 1, 2
_GLFW_MODS = ((0x1, SHIFT), (0x2, CTRL), (0x4, ALT), (0x8, SUPER))
_GLFW_BUTTONS = {0: LMB, 1: RMB, 2: MMB}
_GLFW_KEYS = {
    32: SPACE, 256: ESCAPE, 257: RETURN, 258: TAB, 259: BACKSPACE, 260: "Insert", 261: "Delete",
    262: RIGHT, 263: LEFT, 264: DOWN, 265: UP, 266: "Prior", 267: "Next", 268: "Home", 269: "End",
    280: CAPSLOCK, 335: RETURN,
    340: SHIFT, 341: CTRL, 342: ALT, 343: SUPER, 344: SHIFT, 345: CTRL, 346: ALT, 347: SUPER,
    39: "'", 44: ",", 45: "-", 46: ".", 47: "/", 59: ";", 61: "=", 91: "[", 92: "\\", 93: "]", 96: "`",
}
_GLFW_KEYS.update({290 + k: f"F{k + 1}" for k in range(12)})
_GLFW_KEYS.update({48 + k: str(k) for k in range(10)})            # digits
_GLFW_KEYS.update({65 + k: chr(ord("a") + k) for k in range(26)})  # letters, lower case as Taichi

# the built-in keys: pause, step one frame while paused, reset
PAUSE_KEY, STEP_KEY, RESET_KEY = "p", "s", "r"


def glfw_key_name(key: int) -> str | None:
    """Taichi's name of a glfw key code (None for keys without one)."""
    return _GLFW_KEYS.get(int(key))


@dataclass
class Event:
    type: str
    key: str
    pos: tuple[float, float] = (0.0, 0.0)
    modifier: list[str] = field(default_factory=list)
    delta: tuple[float, float] = (0.0, 0.0)

    def __repr__(self) -> str:
        return f"Event(type={self.type!r}, key={self.key!r}, pos=({self.pos[0]:.3f}, {self.pos[1]:.3f}))"


def _matches(e: Event, types: tuple) -> bool:
    # Taichi code filters wheel events as MOTION (Taichi delivers them as MOTION + key WHEEL)
    return not types or e.type in types or (e.type == WHEEL and MOTION in types)


class EventQueue:
    """Pending events, key states and the cursor, fed by glfw-style callbacks."""

    def __init__(self, size: tuple[int, int]):
        self.size = size            # window size in screen coordinates (cursor positions use them)
        self.events: deque[Event] = deque()
        self.pressed: set[str] = set()
        self.cursor = (0.5, 0.5)
        self.mods: list[str] = []
        self.paused = False
        self.steps_pending = 0
        self.reset_pending = False
        self.close_requested = False
        self.wheel = 0.0            # scroll steps not yet taken by an orbit camera
        # widgets see mouse input first; a listener returning True keeps the event from the queue
        self.listeners: list[Callable[[Event], bool]] = []

    # ---- feeding ------------------------------------------------------------------------------

    def push(self, e: Event) -> bool:
        """Queue e (after the built-in keys act on it); False when a widget took it instead."""
        for listener in self.listeners:
            if listener(e):
                return False
        if e.type == PRESS:
            if e.key == PAUSE_KEY:
                self.paused = not self.paused
            elif e.key == STEP_KEY:
                self.steps_pending += 1
            elif e.key == RESET_KEY:
                self.reset_pending = True
            elif e.key in (ESCAPE, EXIT):
                self.close_requested = True
        self.events.append(e)
        return True

    def _normalized(self, x: float, y: float) -> tuple[float, float]:
        w, h = self.size
        return float(x) / max(w, 1), 1.0 - float(y) / max(h, 1)

    def _set_mods(self, mods: int) -> None:
        self.mods = [name for bit, name in _GLFW_MODS if mods & bit]

    def on_key(self, window, key: int, scancode: int, action: int, mods: int) -> None:
        """glfw key callback."""
        name = glfw_key_name(key)
        self._set_mods(mods)
        if name is None or action == _GLFW_REPEAT:
            return
        if action == _GLFW_PRESS:
            self.pressed.add(name)
            self.push(Event(PRESS, name, self.cursor, list(self.mods)))
        elif action == _GLFW_RELEASE:
            self.pressed.discard(name)
            self.push(Event(RELEASE, name, self.cursor, list(self.mods)))

    def on_mouse_button(self, window, button: int, action: int, mods: int) -> None:
        """glfw mouse button callback."""
        name = _GLFW_BUTTONS.get(int(button))
        self._set_mods(mods)
        if name is None:
            return
        if action == _GLFW_PRESS:
            if self.push(Event(PRESS, name, self.cursor, list(self.mods))):
                self.pressed.add(name)  # not while the button works a widget
        elif action == _GLFW_RELEASE:
            self.pressed.discard(name)
            self.push(Event(RELEASE, name, self.cursor, list(self.mods)))

    def on_cursor_pos(self, window, x: float, y: float) -> None:
        """glfw cursor position callback (x, y in screen coordinates from the top left)."""
        self.cursor = self._normalized(x, y)
        self.push(Event(MOTION, MOVE, self.cursor, list(self.mods)))

    def on_scroll(self, window, dx: float, dy: float) -> None:
        """glfw scroll callback."""
        self.wheel += float(dy)
        self.push(Event(WHEEL, WHEEL, self.cursor, list(self.mods), (float(dx), float(dy))))

    def on_close(self, window) -> None:
        """glfw window close callback."""
        self.close_requested = True
        self.push(Event(PRESS, EXIT, self.cursor))

    # ---- reading ------------------------------------------------------------------------------

    def pop(self, *types: str) -> Event | None:
        """The next event of one of `types` (any type when none are given); others are dropped."""
        while self.events:
            e = self.events.popleft()
            if _matches(e, types):
                return e
        return None

    def drain(self, *types: str) -> Iterator[Event]:
        """Every pending event of one of `types`, oldest first; the queue is emptied."""
        while self.events:
            e = self.events.popleft()
            if _matches(e, types):
                yield e

    def is_pressed(self, *keys: str) -> bool:
        return any(k in self.pressed for k in keys)

    def should_advance(self) -> bool:
        """True when a simulation should take its next step: not paused, or a step ('s') is pending."""
        if not self.paused:
            return True
        if self.steps_pending:
            self.steps_pending -= 1
            return True
        return False

    def take_wheel(self) -> float:
        """Scroll steps since the last call (the orbit camera's zoom)."""
        w, self.wheel = self.wheel, 0.0
        return w

    def take_reset(self) -> bool:
        """True once after each 'r' press."""
        r, self.reset_pending = self.reset_pending, False
        return r
