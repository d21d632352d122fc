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
    return isinstance(v, (int, float, np.number)) and not isinstance(v, np.ndarray)


def _same(a, b) -> bool:
    return a is b or (type(a) is type(b) and a == b)


class _Entry:
    __slots__ = ("what", "read", "value", "loc")

    def __init__(self, what: str, read, value, loc):
        self.what, self.read, self.value, self.loc = what, read, value, loc


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
        """(name, value compiled in, value now, source location) of each number that changed since
        the kernel compiled; each is reported once (then forgotten)."""
        out, keep = [], []
        for e in self.entries:
            now = e.read()
            if now is not _MISSING and not _same(now, e.value):
                out.append((e.what, e.value, now, e.loc))
            else:
                keep.append(e)
        if out:
            self.entries = keep
        return out
