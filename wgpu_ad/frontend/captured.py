"""The Python numbers a kernel read when it compiled: globals, closure variables and attributes
(`dt`, `self.k`, `config.g`). They are compile-time constants, as in Taichi: the compiled kernel
keeps the value it saw. A program that changes one later (`dt = 2.0` after the first launch)
would go on computing with the old value, silently; the launcher compares them at each launch
(Captured.changed) and warns once, naming the kernel, the name, the line, both values and the fix.
"""
from __future__ import annotations

import types
import weakref
from typing import Any

import numpy as np

_MISSING = object()


def is_number(v) -> bool:
    """Whether v is a value a kernel compiles in: a number, a small NumPy array (a constant vector
    or matrix: lower._constant), or a tuple / list of numbers."""
    if isinstance(v, (int, float, np.number)):
        return True
    if isinstance(v, np.ndarray):
        return v.dtype.kind in "fiub" and v.ndim in (1, 2) and 0 < v.size <= 64
    if type(v) in (tuple, list):
        return 0 < len(v) <= 64 and all(isinstance(x, (int, float, np.number)) for x in v)
    return False


def _snapshot(v):
    """A value to compare later: an array's bytes (it may be changed in place), a list's items."""
    if isinstance(v, np.ndarray):
        return ("array", v.dtype.str, v.shape, v.tobytes())
    if type(v) in (tuple, list):
        return (type(v), tuple(map(_snapshot, v)))
    return (type(v), v)


def _same(a, b) -> bool:
    return a is b or a == b


def _show(v) -> str:
    if isinstance(v, np.ndarray):
        return np.array2string(v, separator=", ")
    return repr(v.item() if isinstance(v, np.generic) else v)


def _argument_for(name: str, v) -> str:
    """The kernel argument that would pass v at each launch, as the user would write it."""
    shape = np.shape(v)
    kind = "ti.i32" if all(isinstance(x, (int, np.integer)) and not isinstance(x, bool)
                          for x in np.ravel(np.asarray(v, dtype=object))) else "ti.f32"
    if not shape:
        return f"{name}: {kind}"
    if len(shape) == 1:
        return f"{name}: ti.types.vector({shape[0]}, {kind})"
    return f"{name}: ti.types.matrix({shape[0]}, {shape[1]}, {kind})"


class _Entry:
    __slots__ = ("what", "read", "value", "shown", "loc", "hint")

    def __init__(self, what: str, read, value, loc):
        self.what, self.read, self.loc = what, read, loc
        self.value, self.shown = _snapshot(value), _show(value)
        self.hint = _argument_for(what.rsplit(".", 1)[-1], value)


def _reader_of_name(fn, name: str):
    """A function giving the current value of `name` as fn sees it (a closure cell or a global)."""
    code = getattr(fn, "__code__", None)
    if code is not None and fn.__closure__ and name in code.co_freevars:
        cell = fn.__closure__[code.co_freevars.index(name)]

        def read_cell():
            try:
                return cell.cell_contents
            except ValueError:
                return _MISSING
        return read_cell
    g = fn.__globals__
    return lambda: g.get(name, _MISSING)


def _reader_of_attr(obj, attr: str):
    try:
        ref = weakref.ref(obj)
    except TypeError:  # (no weak reference: held; such objects are kept by the kernel anyway)
        return lambda: getattr(obj, attr, _MISSING)

    def read():
        o = ref()
        return _MISSING if o is None else getattr(o, attr, _MISSING)
    return read


class Captured:
    """What one compilation read (frontend: note_*); what changed since (launcher: changed)."""

    __slots__ = ("entries", "_seen")

    def __init__(self):
        self.entries: list[_Entry] = []
        self._seen: set = set()

    def note_name(self, fn, name: str, value, loc) -> None:
        key = ("name", id(getattr(fn, "__globals__", None)), name)
        if key not in self._seen:
            self._seen.add(key)
            self.entries.append(_Entry(name, _reader_of_name(fn, name), value, loc))

    def note_attr(self, obj, attr: str, value, loc) -> None:
        key = ("attr", id(obj), attr)
        if key not in self._seen:
            self._seen.add(key)
            owner = obj.__name__ if isinstance(obj, (types.ModuleType, type)) else type(obj).__name__
            what = f"{owner}.{attr}"
            self.entries.append(_Entry(what, _reader_of_attr(obj, attr), value, loc))

    def __bool__(self) -> bool:
        return bool(self.entries)

    def changed(self) -> list[tuple[str, Any, Any, Any]]:
        """(name, value compiled in, value now (as text), source location, the argument that would pass
        it) of each value that changed since
        the kernel compiled; each is reported once (then forgotten)."""
        out, keep = [], []
        for e in self.entries:
            now = e.read()
            if now is not _MISSING and not _same(_snapshot(now), e.value):
                out.append((e.what, e.shown, _show(now), e.loc, e.hint))
            else:
                keep.append(e)
        if out:
            self.entries = keep
        return out
