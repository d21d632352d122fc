"""Global data access rules across the kernels of a tape, checked from their footprints.

Each launch knows which elements it touches: per field, an index with the dimensions that are the
same for every thread (computed from constants and the launch's arguments) and wildcards for the
rest (kernel.footprint). Before the backward pass, the tape refuses
  - a launch that writes elements an earlier launch read: the earlier kernel's gradient would
    replay with the new values (Taichi's rule #1, across kernels);
  - a launch that combines with an atomic min / max / bit op into elements an earlier launch
    wrote (rule #2; a store is fine: its adjoint consumes the element's gradient, so the earlier
    value, which nothing read, gets zero, and an accumulation adds to it as its adjoint expects).
Step-indexed state (x[t + 1] = f(x[t])) passes: its launches touch different elements.
Tape(validation=True) replaces this check with an exact one on the values.
"""
from __future__ import annotations

from ..errors import DataAccessRuleError
from ..lang.launch import overlap
from .naming import describe


class _Bucketed:
    """Footprints of one storage, bucketed by their first index component, so that step-indexed
    state (x[t, ...]) compares each launch only with the entries of the same step: linear."""

    def __init__(self):
        self.by_first: dict = {}
        self.wild: list = []   # first component unknown: meets everything

    def add(self, idx: tuple, item) -> None:
        first = idx[0] if idx else None
        (self.wild if first is None else self.by_first.setdefault(first, [])).append((idx, item))

    def candidates(self, idx: tuple):
        first = idx[0] if idx else None
        if first is None:
            for lst in self.by_first.values():
                yield from lst
        else:
            yield from self.by_first.get(first, ())
        yield from self.wild


def check_overwrites(entries) -> None:
    reads: dict[int, _Bucketed] = {}   # id(storage) -> (index, (kernel name, launch number))
    writes: dict[int, _Bucketed] = {}
    n = 0
    for e in entries:
        if e.kind == "custom" or getattr(e, "opaque", False):
            return  # a hand-written gradient: what it needs is the user's business
        for kernel, args in e.launches():
            n += 1
            fp = kernel.footprint(*args)
            name = kernel.__name__
            for obj, kind, idx in fp:
                if kind in ("load", "load_before") or getattr(obj, "is_grad", False):
                    continue
                bucket = reads.get(id(obj))
                for r_idx, (r_name, r_n) in (bucket.candidates(idx) if bucket else ()):
                    if overlap(idx, r_idx):
                        raise DataAccessRuleError(
                            f"ti.ad.Tape: kernel '{name}' (launch {n} on the tape) writes elements of "
                            f"{describe(obj)} that kernel '{r_name}' (launch {r_n}) read before; the gradient "
                            f"of '{r_name}' replays it with the values after the tape and would be silently "
                            f"wrong. Keep every version in its own elements (e.g. index the field by the "
                            f"step: x[t + 1] = f(x[t])), run steps that update their state in place under "
                            f"ti.ad.checkpoint(step, steps=T, state=[...]), or check the actual values with "
                            f"ti.ad.Tape(..., validation=True)")
                if kind == "atomic":
                    bucket = writes.get(id(obj))
                    for w_idx, (w_name, w_n) in (bucket.candidates(idx) if bucket else ()):
                        if overlap(idx, w_idx):
                            raise DataAccessRuleError(
                                f"ti.ad.Tape: kernel '{name}' (launch {n} on the tape) combines elements of "
                                f"{describe(obj)} that kernel '{w_name}' (launch {w_n}) wrote with an atomic "
                                f"min / max / bit operation; its gradient cannot tell which value won, so the "
                                f"gradient of the first value could be silently wrong. Store each version in "
                                f"its own elements, or check the actual values with ti.ad.Tape(..., "
                                f"validation=True)")
            if e.kind == "no_grad":
                continue  # no gradient replays its reads
            seen = set()
            for obj, kind, idx in fp:
                if kind == "load_before":
                    continue  # its gradient replays a copy taken before the launch
                key = (id(obj), kind == "load", idx)
                if key in seen:
                    continue  # the same elements through several statements: one entry
                seen.add(key)
                table = reads if kind == "load" else writes
                table.setdefault(id(obj), _Bucketed()).add(idx, (name, n))
