"""What a kernel's forward launches keep for their adjoints, and the pools it comes from.

- Pre-launch copies of the fields a launch updates in place (plan.snapshots, passes/autodiff/
  promote.py): the adjoint's replay reads them. A tape keeps one set per launch, a launch outside a
  tape only the last.
- Scratch buffers (plan.Scratch): the sums of kernel-scope variables reduced over a parallel loop.
  Fresh ones per launch a tape records (each adjoint reads its own launch's sums), else one set.
- Spare shadow buffers of access-checked launches (passes/autodiff/shadow.py).

Everything made before a ti.reset() / ti.init() is dropped: it is gone with the device.
"""
from __future__ import annotations

import weakref

from ..errors import WgpuAdError
from .. import session as _device
from ..types import to_dtype
from .ndarray import Ndarray


class LaunchKeep:
    def __init__(self, name: str):
        self.name = name             # the kernel's, for messages
        # ids of fields updated in place -> (weak references to them, stack of their pre-launch
        # copies): an entry whose fields are gone is dropped, and never found by fields made later
        # at their addresses
        self.snaps: dict = {}
        self.spare: dict = {}        # (dtype, shape, element shape) -> copies an adjoint launch has used
        # scratch sets per forward Launcher (held weakly: a Launcher goes with the storage it was
        # specialised for, Kernel._get): for launches no tape records, a stack of per-launch sets
        # for taped ones, the set of the latest launch, spares
        self.scratch_own = weakref.WeakKeyDictionary()
        self.scratch_taped = weakref.WeakKeyDictionary()
        self.scratch_last = weakref.WeakKeyDictionary()
        self.scratch_spare = weakref.WeakKeyDictionary()
        self.shadow_spare: dict = {}  # spare shadow buffers by size
        self.generation = None       # the runtime generation all of it belongs to

    def scratch(self, lc, taped: bool) -> tuple:
        """The scratch buffers of a forward launch (plan.Scratch: the sums of kernel-scope variables
        reduced across a parallel loop): fresh ones per launch a tape records (each adjoint reads
        its own launch's sums), else the same set again."""
        if not lc.plan.scratch:
            return ()
        self.drop_dead()
        key = lc
        if taped:
            spare = self.scratch_spare.get(key)
            objs = spare.pop() if spare else self._new_scratch(lc)
            self.scratch_taped.setdefault(key, []).append(objs)
        else:
            objs = self.scratch_own.get(key)
            if objs is None:
                objs = self.scratch_own[key] = self._new_scratch(lc)
        self.scratch_last[key] = objs
        return objs

    def _new_scratch(self, lc) -> tuple:
        out = []
        for src in lc.plan.scratch:
            arr = Ndarray(to_dtype(src.dtype), (), (src.count,) if src.count > 1 else (), name=f"{self.name}.sum")
            if src.dtype in ("f32", "f16"):
                arr._attach_grad()
                arr._attach_dual()  # forward mode: the tangent of the sum
            out.append(arr)
        return tuple(out)

    def scratch_for_grad(self, lc, in_backward: bool) -> tuple:
        """The scratch buffers an adjoint reads: its own launch's in a tape's backward pass, else
        those of the latest forward launch; their gradients zeroed."""
        if not lc.plan.scratch:
            return ()
        key = lc
        stack = self.scratch_taped.get(key)
        if in_backward and stack:
            objs = stack.pop()
        else:
            objs = self.scratch_last.get(key)
            if objs is None:
                raise WgpuAdError(
                    f"{self.name}.grad(): kernel '{self.name}' sums a kernel-scope variable over a "
                    f"parallel loop, and its gradient needs the sum of its forward launch: launch it before its "
                    f".grad() (or inside ti.ad.Tape)")
        for arr in objs:
            if arr.grad is not None and not arr.grad.all_zero:
                arr.grad.fill(0)
        return objs

    def recycle_scratch(self, lc, objs: tuple) -> None:
        key = lc
        if objs and objs is not self.scratch_own.get(key) and objs is not self.scratch_last.get(key) \
                and not any(objs is o for o in self.scratch_taped.get(key, ())):
            self.scratch_spare.setdefault(key, []).append(objs)

    def drop_dead(self) -> None:
        """Copies and scratch buffers made before a ti.reset() / ti.init() are gone with the device."""
        gen = _device.generation()
        if self.generation != gen:
            self.generation = gen
            for pool in (self.snaps, self.spare, self.scratch_own, self.scratch_taped, self.scratch_last,
                         self.scratch_spare, self.shadow_spare):
                pool.clear()

    def keep_snapshots(self, lc, args, taped: bool, always: bool = False) -> None:
        """Before a forward launch that updates fields in place (passes/autodiff/promote.py):
        copy them, for its adjoint's replay. Only when a gradient may be asked for (something it
        reads has one), unless `always`; a tape keeps one copy per launch, a launch outside a tape
        only the last. (lc: the Launcher whose plan names the fields: the forward's, or a no_grad
        kernel's zeroing kernel's.)"""
        if not always and not any(get(args).needs_grad for get in lc.loads + lc.snapshots):
            return
        self.drop_dead()
        fields = [get(args) for get in lc.snapshots]
        copies = []
        for st in fields:
            spare = self.spare.get((st.dtype.name, st.shape, st.element_shape))
            if spare:
                c = spare.pop()
            else:
                c = Ndarray(st.dtype, st.shape, st.element_shape, name=f"{st.name}_before")
            c._copy_from(st)
            copies.append(c)
        stack = self._snapshots(fields)
        if stack is None:
            stack, key = [], tuple(map(id, fields))
            forget = self.snaps.pop  # (a field's death drops the entry at once, copies and all)
            self.snaps[key] = (tuple(weakref.ref(st, lambda _r, key=key: forget(key, None)) for st in fields), stack)
        if not taped:
            for old in stack:
                self.recycle(old)  # only the last launch's copies are kept: reuse the older ones
            stack.clear()
        stack.append(copies)

    def pop_snapshots(self, lc, args) -> tuple:
        """The copies kept for the latest forward launch with these fields (see keep_snapshots)."""
        if not lc.snapshots:
            return ()
        fields = [get(args) for get in lc.snapshots]
        stack = self._snapshots(fields)
        if not stack:
            names = ", ".join(st._label() for st in fields)
            raise WgpuAdError(
                f"{self.name}.grad(): kernel '{self.name}' updates {names} in place, so its gradient "
                f"needs the values from before its forward launch, and none were kept: launch it right "
                f"before its .grad() (or inside ti.ad.Tape) while something it reads has a gradient")
        return tuple(stack.pop())

    def _snapshots(self, fields: list) -> list | None:
        """The stack of copies kept for these very fields, or None."""
        entry = self.snaps.get(tuple(map(id, fields)))
        if entry is None or any(r() is not st for r, st in zip(entry[0], fields)):
            return None
        return entry[1]

    def recycle(self, copies: tuple) -> None:
        """Copies an adjoint launch has read go back to the pool: a later copy into one is recorded
        after that launch, so it cannot change what the launch reads."""
        for c in copies:
            self.spare.setdefault((c.dtype.name, c.shape, c.element_shape), []).append(c)
