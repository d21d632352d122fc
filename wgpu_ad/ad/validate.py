"""ti.ad.Tape(validation=True): catch, before the backward pass, what makes the gradients of a
tape silently wrong across kernels (the compiler checks the same rules within one kernel).

A kernel's adjoint replays its forward computation with the field values as they are when the
backward pass runs, i.e. after the whole tape, and reads the gradient of what it wrote. So:

  rule #1: nothing a kernel read may be overwritten by a later kernel.
(An element a kernel wrote may be stored again later: the later store's adjoint consumes the
element's gradient, so the earlier value, which nothing read, gets zero.)

The tape knows fields, not single loads, so the rule is checked on values. For every kernel on
the tape the contents of the fields it touches are copied before and after its launch. Rule #1:
if an element of a field it read changed after it ran (other than elements it wrote itself),
the kernel is launched again with those fields as they are now; different results mean it read
a changed element (x[t + 1] = f(x[t]) over a time axis passes: what changed was not read).
The refusal names the kernels, the field, an element and what to do.

Costs a copy of the touched fields per launch and some relaunches: a debugging aid. Calls of
grad_replaced functions are not checked (their gradient is the user's).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import DataAccessRuleError
from ..session import runtime as get_runtime
from .. import session
from .naming import describe, name_of


def _unique(storages) -> list:
    out, seen = [], set()
    for s in storages:
        if id(s) not in seen:
            seen.add(id(s))
            out.append(s)
    return out


def _copy(storages) -> dict:
    return {id(s): np.array(s.to_numpy(), copy=True) for s in storages}


def _differs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise 'not the same value' (NaN equals NaN)."""
    same = a == b
    if a.dtype.kind == "f":
        same |= np.isnan(a) & np.isnan(b)
    return ~same


@dataclass
class _Launch:
    entry: object          # TapeEntry (kernel entries only) or None for launches not checked
    name: str
    position: int
    reads: list
    writes: list
    before: dict | None = None
    after: dict | None = None

    @property
    def touched(self) -> list:
        return _unique(self.reads + self.writes)


class Validator:
    def __init__(self):
        self.launches: list[_Launch] = []
        self._pending: _Launch | None = None
        # (launches before it, values): fields a later entry's backward pass puts back to these
        # values before the adjoints of the launches before it run (ti.ad.checkpoint's state)
        self.restores: list[tuple[int, dict]] = []

    def note_restore(self, storages) -> None:
        """The backward pass of what runs now (unrecorded) ends with `storages` holding their
        current values again: the launches before see those, not the values after the tape."""
        self._finish_pending()
        self.restores.append((len(self.launches), _copy(_unique(storages))))

    def before_launch(self, entry, acc) -> None:
        """A launch is about to run; entry is the tape's kernel entry, or None (inside a custom call)."""
        self._finish_pending()
        reads, writes = _unique(acc[0]), _unique(acc[1])
        checked = entry is not None and entry.kind == "kernel"
        name = getattr(entry.fn, "__name__", "?") if entry is not None else "a kernel in a grad_replaced function"
        launch = _Launch(entry if checked else None, name, len(self.launches), reads, writes)
        if checked:
            launch.before = _copy(launch.touched)
            self._pending = launch
        self.launches.append(launch)

    def finish(self) -> None:
        self._finish_pending()

    def _finish_pending(self) -> None:
        p = self._pending
        if p is not None:
            p.after = _copy(p.touched)
            self._pending = None

    # ---- the check ----------------------------------------------------------------------------

    def check(self) -> None:
        checked = [k for k in self.launches if k.entry is not None and k.after is not None]
        for k in checked:
            self._check_launch(k)

    def _check_launch(self, k: _Launch) -> None:
        now = _copy(k.touched)
        final = dict(now)  # what k's adjoint will see
        for pos, values in reversed(self.restores):  # the earliest one after k is the last to run
            if pos > k.position:
                final.update((i, v) for i, v in values.items() if i in final)
        wrote = {id(s): _differs(k.before[id(s)], k.after[id(s)]) for s in k.touched}
        changed = []  # (field, mask of elements changed after k ran that k did not write)
        for r in k.reads:
            mask = _differs(k.after[id(r)], final[id(r)]) & ~wrote[id(r)]
            if mask.any():
                changed.append((r, mask))
        if not changed or self._same_outputs(k, final, wrote, now):
            return
        if len(changed) > 1:  # name the fields whose new values alone change what k computes
            changed = [c for c in changed if not self._same_outputs(k, final, wrote, now, only=id(c[0]))] or changed
        r, mask = changed[0]
        i = tuple(int(v) for v in np.argwhere(mask)[0])
        n = name_of(r) or "x"
        nd = len(r.shape)
        where = (f"[{', '.join(map(str, i[:nd]))}]" if nd else "[None]") + \
            (f"[{', '.join(map(str, i[nd:]))}]" if i[nd:] else "")
        writers = [w.name for w in self.launches[k.position + 1:] if any(s is r for s in w.writes)]
        by = f"kernel '{writers[0]}'" if writers else "a later Python-scope assignment"
        others = "".join(f", {describe(s)}" for s, _ in changed[1:])
        raise DataAccessRuleError(
            f"ti.ad.Tape(validation=True): kernel '{k.name}' read {describe(r)}{others}, which {by} "
            f"overwrote later on the tape ({n}{where} was {k.after[id(r)][i].item()!r} when '{k.name}' ran and is "
            f"{final[id(r)][i].item()!r} now). The gradient of '{k.name}' would be computed from the new values and "
            f"be silently wrong (global data access rule #1: once read, an element must not be "
            f"overwritten). Write the new values to another field, or keep one copy per step "
            f"({n}[t + 1] = f({n}[t]))")

    def _same_outputs(self, k: _Launch, final: dict, wrote: dict, now: dict, only: int | None = None) -> bool:
        """Relaunch k on (its inputs as its adjoint will see them, its outputs as before it ran):
        same outputs as then? With `only` (a field's id), just that input as the adjoint will see
        it, the others as k read them. The fields get their values `now` back."""
        read_ids = {id(s) for s in k.reads} if only is None else {only}
        start = {}
        for s in k.touched:
            b = k.before[id(s)]
            start[id(s)] = np.where(wrote[id(s)], b, final[id(s)]) if id(s) in read_ids else b
            s.from_numpy(start[id(s)])
        prev = session.ad().in_backward
        session.ad().in_backward = True  # not recorded anywhere
        try:
            with get_runtime().mute_prints():  # a check, not the program: no lines printed twice
                k.entry.forward()
            again = _copy(k.writes)
        finally:
            session.ad().in_backward = prev
            for s in k.touched:
                s.from_numpy(now[id(s)])
        for s in k.writes:
            # what k wrote then, over what it was started from now
            a, b = np.where(wrote[id(s)], k.after[id(s)], start[id(s)]), again[id(s)]
            if a.dtype.kind == "f":
                scale = max(1.0, float(np.nanmax(np.abs(a))) if a.size else 1.0)
                if not np.allclose(a, b, rtol=1e-5, atol=1e-6 * scale, equal_nan=True):
                    return False
            elif not np.array_equal(a, b):
                return False
        return True
