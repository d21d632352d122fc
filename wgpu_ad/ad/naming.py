"""Names for fields in autodiff messages.

Fields are named after the variable their creating line assigns them to (`x = ti.field(...)`,
user_code.assigned_name), and after the variable a kernel reads them by when one is compiled. A
field made otherwise (in a list, say) may need a name before that (the loss, checked when the tape
is entered): then it is looked up among the variables of the user's frames, as a reader would.
"""
from __future__ import annotations

from ..user_code import user_frames


def name_of(s) -> str | None:
    """The storage's name, or the name of a user variable bound to it, or None."""
    if s.name:
        return s.name
    primal = getattr(s, "primal", None)
    if getattr(s, "is_grad", False) and primal is not None:
        n = name_of(primal)
        return None if n is None else f"{n}.grad"
    for f in user_frames():
        for scope in (f.f_locals, f.f_globals):
            for k, v in scope.items():
                if v is s and not k.startswith("_"):
                    s.name = k  # remember it: later messages and generated WGSL agree
                    return k
    return None


def describe(s) -> str:
    """"field 'x'" / "ndarray 'a'" / "unnamed field", for messages."""
    kind = getattr(s, "_kind", "field")
    n = name_of(s)
    return f"{kind} '{n}'" if n else f"unnamed {kind}"


def quoted(s) -> str:
    """"'x'" (or "an unnamed field"), for lists of fields in messages."""
    n = name_of(s)
    return f"'{n}'" if n else f"an unnamed {getattr(s, '_kind', 'field')}"
