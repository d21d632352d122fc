"""ti.ad.FwdMode: forward-mode autodiff (Jacobian-vector products) over the kernels of a `with` block.

    x = ti.field(ti.f32, shape=n, needs_dual=True)       # or ti.root.lazy_dual()
    with ti.ad.FwdMode(loss=L, param=x, seed=v):        # x.dual = v
        compute(...)                                    # each launch runs its dual kernel
    L.dual.to_numpy()                                   # dL/dx . v

Every kernel launched inside the block runs its dual kernel instead (compiler/driver.py
compile_dual, passes/autodiff/forward.py): one launch that computes the primal values and, for
every field with a dual that it writes, the tangent, from the duals of what it reads. Nothing is
recorded and nothing runs on exit but clearing the seed: forward mode needs no tape.
As in Taichi, entering zeroes every dual (clear_gradients=True) and seeds `param.dual`; leaving
zeroes `param.dual` again. The loss is not zeroed (kernels usually accumulate into it; Taichi
does not zero it either). `ti.ad.Tape` and `FwdMode` do not nest (Taichi would leave the kernels
of one out of the other silently), and `kernel.grad()` is refused inside FwdMode.
"""
from __future__ import annotations

import sys

import numpy as np

from ..errors import WgpuAdError
from .. import session
from .naming import describe, quoted


def clear_all_duals() -> None:
    """Set the dual of every field and ndarray that has one to zero."""
    from ..lang.storage import live_storages
    for s in live_storages():
        if s.is_dual and s._buffer is not None:  # never written: still unallocated, so zero
            s.fill(0)


def _is_storage(x) -> bool:
    return hasattr(x, "gpu_buffer") and hasattr(x, "is_grad")


def _check_has_dual(x, what: str) -> None:
    if not _is_storage(x):
        raise WgpuAdError(f"ti.ad.FwdMode({what}=...): expected a field or an ndarray, got {type(x).__name__}")
    if x.is_grad or x.is_dual:
        raise WgpuAdError(f"ti.ad.FwdMode({what}=...): {describe(x)} is a {'dual' if x.is_dual else 'gradient'}; "
                          f"pass the primal field")
    if not x.dtype.is_float:
        raise WgpuAdError(f"ti.ad.FwdMode({what}=...): {describe(x)} has dtype {x.dtype}: forward mode needs "
                          f"float fields")
    if not x.needs_dual:
        lazy = " (or call ti.root.lazy_dual())" if x.is_field else ""
        raise WgpuAdError(f"ti.ad.FwdMode({what}=...): {describe(x)} has no dual: create it with needs_dual=True"
                          f"{lazy} before entering FwdMode")


class FwdMode:
    """Forward-mode autodiff over the kernel launches in a `with` block (Taichi's ti.ad.FwdMode).

    loss: a field (any shape), or a list of fields, with duals; after the block their duals hold
        the derivatives d loss / d param in the direction `seed`.
    param: the field (or ndarray) with a dual whose direction is seeded: a scalar, vector or
        matrix field; its dual is set to `seed` on entry and to zero on exit.
    seed: the direction, one number per scalar of `param` (param.shape + element shape,
        row-major, flattened); may be left out when `param` holds one number (it is then [1.0]).
    clear_gradients: zero every dual on entry (Taichi's behaviour).
    `parameters=` is accepted for `param` (Taichi's earlier name).
    """

    def __init__(self, loss, param=None, seed=None, clear_gradients: bool = True, parameters=None):
        if param is None:
            param = parameters
        elif parameters is not None:
            raise WgpuAdError("ti.ad.FwdMode: pass param= or parameters= (its older name), not both")
        if param is None:
            raise WgpuAdError("ti.ad.FwdMode: param= is required (the field whose dual is seeded)")
        losses = list(loss) if isinstance(loss, (list, tuple)) else [loss]
        for L in losses:
            _check_has_dual(L, "loss")
        _check_has_dual(param, "param")
        self.loss = losses if isinstance(loss, (list, tuple)) else loss
        self._losses = losses
        self.param = param
        self.seed = seed
        self.clear_gradients = bool(clear_gradients)
        self.entered = False
        self._where = ""
        # float storages without a dual that a kernel inside the block computed from values with
        # tangents: id -> (that kernel's name, the storage); see note_launch
        self._carried: dict[int, tuple] = {}

    def _seed_array(self) -> np.ndarray:
        p = self.param
        n = p.n_scalars
        full = tuple(p.shape) + tuple(p.element_shape)
        seed = self.seed
        if seed is None:
            if n != 1:
                raise WgpuAdError(
                    f"ti.ad.FwdMode(seed=...): {describe(p)} holds {n} numbers (shape {full}), so the seed, "
                    f"the direction of the derivative, must be given: a list of {n} numbers, one per number "
                    f"of {describe(p)} in row-major order (e.g. a 1 at position k and zeros elsewhere for the "
                    f"derivative with respect to its k-th number)")
            seed = [1.0]
        try:
            arr = np.asarray(seed, dtype=np.float64)
        except (TypeError, ValueError):
            raise WgpuAdError(f"ti.ad.FwdMode(seed=...): expected a list of numbers, got {seed!r}") from None
        if arr.size != n:
            raise WgpuAdError(
                f"ti.ad.FwdMode(seed=...): the seed has {arr.size} number(s), but {describe(p)} holds {n} "
                f"(shape {full}): give one number per number of the parameter, in row-major order")
        return arr.reshape(full).astype(np.float32)

    def __enter__(self) -> "FwdMode":
        if self.entered:
            raise WgpuAdError("this ti.ad.FwdMode was already used; create a new FwdMode for each `with` block")
        if session.ad().fwd is not None:
            raise WgpuAdError(f"ti.ad.FwdMode: another FwdMode is active (entered at {session.ad().fwd._where}); "
                              f"they cannot be nested: seed one parameter per `with` block")
        tape = session.ad().tape
        if tape is not None:
            raise WgpuAdError(
                f"ti.ad.FwdMode cannot be used inside ti.ad.Tape (entered at {tape._where}): kernels inside "
                f"FwdMode run their dual kernels and the tape could not differentiate them. Finish the tape's "
                f"`with` block first, or compute the derivative in one mode")
        seed = self._seed_array()
        f = sys._getframe(1)
        self._where = f"{f.f_code.co_filename}:{f.f_lineno}"
        self.entered = True
        if self.clear_gradients:
            clear_all_duals()
        self.param.dual.from_numpy(seed)
        session.ad().fwd = self
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if session.ad().fwd is self:
            session.ad().fwd = None
        self.param.dual.fill(0)  # the seed is cleared (Taichi's behaviour)
        return False

    def note_launch(self, name: str, reads: list, writes: list) -> None:
        """A kernel launched inside the block (not @ti.ad.no_grad) that reads `reads` and writes
        `writes`. Refuse it when it reads a field without a dual that an earlier kernel computed
        here from values with tangents, and writes a field with one: the tangent stopped at that
        field, so the derivative would silently miss its part (reverse mode's tape refuses the
        same with gradients, tape.py). Else remember which dual-less fields it computed."""
        if any(w.needs_dual for w in writes):
            for r in reads:
                seen = self._carried.get(id(r))
                if seen is not None and seen[1] is r and not r.needs_dual:
                    raise WgpuAdError(
                        f"ti.ad.FwdMode: kernel '{name}' reads {describe(r)}, which '{seen[0]}' computed inside "
                        f"the FwdMode block from values with tangents, but {quoted(r)} has no dual: the tangent "
                        f"stops there and the derivative would silently miss everything that flows through it. "
                        f"Create {quoted(r)} with needs_dual=True (or call ti.root.lazy_dual() before creating "
                        f"the fields); if stopping the tangent is intended, mark '{seen[0]}' with @ti.ad.no_grad")
        if any(r.dtype.is_float and (r.needs_dual or id(r) in self._carried) for r in reads):
            for w in writes:
                if w.dtype.is_float and not w.needs_dual:
                    self._carried.setdefault(id(w), (name, w))

    def __repr__(self) -> str:
        return f"<ti.ad.FwdMode param={describe(self.param)}>"
