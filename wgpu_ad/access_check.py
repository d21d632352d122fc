"""The run-time check of the global data access rules (passes/autodiff/access.py, shadow.py): what
a failed check carries from the compiler to the runtime, and the message it becomes.

Where the compiler cannot prove that a kernel's accesses are safe for reverse mode (an index read
from a field, a counter stepped conditionally), a forward launch that a gradient may be asked for
runs a checked variant: per element of such a field a shadow word, zeroed before the launch,
records what happened to the element (READ by a checked load, UPDATED by a checked atomic, and
one STORED bit per task for the checked stores). A checked write that finds a bit it must not (the
element stored before, or read before it was overwritten) reports itself through the error buffer
as an ASSERT whose attr is an AccessCheck; the launcher raises DataAccessError. The records are
plain data (they pickle into the offline cache with their kernel); no IR here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .errors import DataAccessError, SourceLoc
from .nan_check import element_index, element_label

READ = 1      # a checked load read the element
UPDATED = 2   # a checked atomic updated it


def stored(task: int) -> int:
    """The bit of a checked store in task `task` (tasks from the 30th on share the last bit: a
    store of a later dispatch over one of an earlier one is right, so they never test it)."""
    return 1 << (2 + min(task, 29))


@dataclass(eq=False)
class AccessCheck:
    """The check of one write (a plain store, or with `update` an atomic) of `field` (its plan
    source `source`) at `loc` in kernel `kernel`; `loads`: the lines of the checked reads that it
    may overwrite. The ASSERT reports the shadow word it found (`old`) and the element's linear
    index."""

    kernel: str
    field: str
    source: object
    loc: SourceLoc | None
    loads: tuple = ()
    update: bool = False

    def __repr__(self) -> str:
        line = f" line {self.loc.line}" if self.loc else ""
        return f"<{self.field} accessed safely{line}>"

    def format(self, *values) -> str:
        """The message (the interpreter formats assert templates with .format)."""
        return self._message(values, None)[0]

    def error(self, values, storage: Callable | None = None) -> DataAccessError:
        """The error for the reported (old shadow word, linear index). storage(source): the name,
        shape and element shape of the storage the field's source names in the failed launch, or
        None (elements are then named by their position in the buffer)."""
        text, index = self._message(values, storage)
        return DataAccessError(text, kernel=self.kernel, field=self.field, index=index,
                               line=self.loc.line if self.loc else None)

    def _message(self, values, storage) -> tuple[str, tuple | None]:
        old, linear = int(values[0]), int(values[1])
        geometry = storage(self.source) if storage is not None else None
        if geometry is None:
            name, index = f"{self.field}[scalar #{linear}]", None
        else:
            label, shape, element_shape = geometry
            name = element_label(label or self.field, shape, element_shape, linear)
            index = element_index(shape, element_shape, linear)
        what = "updated" if self.update else "stored"
        head = f"kernel '{self.kernel}': {name} was "
        if old & READ:
            reads = " or ".join(f"line {loc.line}" for loc in self.loads) or "another line"
            text = (f"{head}read ({reads}) and then {what} ({_line(self.loc)}) by the same launch. The "
                    f"gradient kernel replays the forward computation with the values after the launch, so "
                    f"the gradient would be silently wrong. The indices depend on the data, so this was "
                    f"checked at run time (the compiler could not prove they never meet). Write the result "
                    f"to another field, or make sure no element the launch reads is also written by it")
        else:
            text = (f"{head}stored twice by the same launch ({_line(self.loc)}): only the last value "
                    f"survives, so the gradient would be silently wrong. The index depends on the data, so "
                    f"this was checked at run time (the compiler could not prove that it never repeats). "
                    f"Store each element once (e.g. index by a permutation), or accumulate with += "
                    f"(atomic add)")
        if self.loc is not None:
            text += f"\n{self.loc.excerpt()}"
        return text, index


def _line(loc: SourceLoc | None) -> str:
    return f"line {loc.line}" if loc else "an unknown line"
