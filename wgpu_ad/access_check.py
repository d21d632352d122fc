"""The run-time check of the global data access rules (passes/autodiff/access.py, shadow.py): what
a failed check carries from the compiler to the runtime, and the message it becomes.

Where the compiler cannot prove that a kernel's accesses are safe for reverse mode (an index read
from a field, a counter stepped conditionally, index ranges that meet for some arguments), a forward
launch that a gradient may be asked for runs a checked variant. Per field and task with checked
accesses, a shadow buffer of one u32 per scalar, zeroed before the launch, records what happened to
each element in that task: READ (a checked load), UPDATED (a checked atomic), and the owner of a
checked store (1 + the iteration of the parallel loop that stored it, shifted by OWNER_SHIFT). A
checked access that finds what it must not (the element stored twice, or read and then overwritten,
or stored by one iteration and read by another) reports itself through the error buffer as an ASSERT
whose attr is an AccessCheck; the launcher raises DataAccessError. The records are plain data (they
pickle into the offline cache with their kernel); no IR here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .errors import DataAccessError, SourceLoc
from .nan_check import element_index, element_label

READ = 1         # a checked load read the element
UPDATED = 2      # a checked atomic updated it
OWNER_SHIFT = 2  # above: 1 + the parallel iteration whose checked store stored it (0: none)


@dataclass(eq=False)
class AccessCheck:
    """The check of one access of `field` (its plan source `source`) at `loc` in kernel `kernel`:
    `kind` 'store', 'update' (an atomic) or 'load'; `others`: the lines of the checked accesses it
    may meet (the loads a write may overwrite, the writes a load may see); `cause`: why the compiler
    could not decide, 'data' (indices read from fields) or 'arguments' (affine indices whose ranges
    meet for some values of the kernel's arguments). The ASSERT reports the
    shadow word it found, the element's linear index and its own owner code."""

    kernel: str
    field: str
    source: object
    loc: SourceLoc | None
    kind: str
    others: tuple = ()
    cause: str = "data"

    def __repr__(self) -> str:
        line = f" line {self.loc.line}" if self.loc else ""
        return f"<{self.field} {self.kind} is safe for reverse mode{line}>"

    def format(self, *values) -> str:
        """The message (the interpreter formats assert templates with .format)."""
        return self._message(values, None)[0]

    def error(self, values, storage: Callable | None = None) -> DataAccessError:
        """The error for the reported (shadow word, linear index, owner code). storage(source):
        the name, shape and element shape of the storage the field's source names in the failed
        launch, or None (elements are then named by their position in the buffer)."""
        text, index = self._message(values, storage)
        return DataAccessError(text, kernel=self.kernel, field=self.field, index=index,
                               line=self.loc.line if self.loc else None)

    def _message(self, values, storage) -> tuple[str, tuple | None]:
        found, linear = int(values[0]), int(values[1])
        geometry = storage(self.source) if storage is not None else None
        if geometry is None:
            name, index = f"{self.field}[scalar #{linear}]", None
        else:
            label, shape, element_shape = geometry
            name = element_label(label or self.field, shape, element_shape, linear)
            index = element_index(shape, element_shape, linear)
        here, others = _line(self.loc), " or ".join(f"line {loc.line}" for loc in self.others) or "another line"
        head = f"kernel '{self.kernel}': {name} was "
        why = ("The indices depend on the data, so this is checked at run time (the compiler cannot prove that "
               "they never meet)") if self.cause == "data" else (
            "Whether the indices meet depends on the kernel's arguments (the loops' ranges), so this is checked "
            "at run time")
        repeat = ("The index depends on the data, so this is checked at run time (the compiler cannot prove that "
                  "it never repeats)") if self.cause == "data" else why
        if self.kind == "load" and found & UPDATED:
            text = (f"{head}read ({here}) after an atomic update ({others}) in the same launch: the read saw a "
                    f"partial result and the gradient kernel replays it with the final one, so the gradient "
                    f"would be silently wrong. {why}. Read it in a separate kernel, or "
                    f"make sure no element the launch updates is also read by it")
        elif self.kind == "load":
            text = (f"{head}stored ({others}) by one iteration of the parallel loop and read ({here}) by "
                    f"another in the same launch: the gradient kernel runs the iterations in no fixed order "
                    f"and would lose the gradient that flows through the stored value, so it would be silently "
                    f"wrong. {why}. Write the result to another field (or read it in a "
                    f"later kernel)")
        elif found & READ:
            what = "updated" if self.kind == "update" else "stored"
            text = (f"{head}read ({others}) and then {what} ({here}) by the same launch: the gradient kernel "
                    f"replays the forward computation with the values after the launch, so the gradient "
                    f"would be silently wrong. {why}. Write the result to another "
                    f"field, or make sure no element the launch reads is also written by it")
        else:
            text = (f"{head}stored twice by the same launch ({here}): only the last value survives, so the "
                    f"gradient would be silently wrong. {repeat}. Store each "
                    f"element once (e.g. index by a permutation), or accumulate with += (atomic add)")
        if self.loc is not None:
            text += f"\n{self.loc.excerpt()}"
        return text, index


def _line(loc: SourceLoc | None) -> str:
    return f"line {loc.line}" if loc else "an unknown line"
