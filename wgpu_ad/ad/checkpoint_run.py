"""One checkpointed run (Run): its forward pass, which keeps the copies its schedule asks for and
watches for hidden state; its backward pass, a tape entry's grad(), which restores copies, runs
steps again and differentiates each step by recording it (checkpoint_recorder.py) and undoing its
launches last first. The order in which steps are run again is the schedule's
(checkpoint_schedules.py).
"""
from __future__ import annotations

import contextlib
import math

from ..errors import WgpuAdError
from ..session import runtime as get_runtime
from .. import session
from .checkpoint_recorder import Recorder
from .checkpoint_schedules import CheckpointStats, Schedules
from .launches import zero_overwritten
from .naming import describe


class Run(Schedules):
    """One checkpointed run: its forward pass, and its backward pass as a tape entry's grad()."""

    __name__ = "checkpoint"

    def __init__(self, step, steps, fields, snapshots, schedule):
        self.step, self.steps, self.fields, self.schedule = step, steps, fields, schedule
        self.every = 1 if schedule == "store_all" else max(1, math.ceil(steps / max(1, snapshots))) \
            if snapshots else max(1, math.isqrt(max(steps, 1)))
        self.stats = CheckpointStats(steps, schedule)
        self.snapshots = snapshots
        self.state_ids = {id(f) for f in fields}
        self.saved: dict[int, list] = {}  # step -> copies of the state before it
        self.initial: list | None = None  # the state before step 0
        self.final: tuple | None = None   # (copies, fields outside the state) at the backward pass's start
        self.written: dict[int, tuple] = {}  # fields outside the state the steps write: id -> (field, by, t)
        self.read_first: dict[int, tuple] = {}  # ... the steps read before writing them: id -> (field, by, t)
        self.stored: set[int] = set()  # ... the steps store to (not only accumulate into)
        self.seeds: list[int] | None = None  # each step's position in the random stream
        self.done = False
        self._held = 0
        self._bytes = 0
        self._at: list | None = None  # the copies the state fields hold the values of, if known
        self._spare: dict = {}  # (dtype, shape, element shape) -> copies no longer needed
        self._accesses: dict = {}  # kernel -> (reads, stores, accumulations): scalar arguments only

    # ---- copies ------------------------------------------------------------------------------
    def clone(self, f):
        """A copy of one field (from the pool of copies no longer needed when it can)."""
        from ..lang.ndarray import Ndarray
        spare = self._spare.get((f.dtype.name, f.shape, f.element_shape))
        c = spare.pop() if spare else Ndarray(f.dtype, f.shape, f.element_shape, name=f"{f.name}_checkpoint")
        c._copy_from(f)
        return c

    def _release(self, c) -> None:
        self._spare.setdefault((c.dtype.name, c.shape, c.element_shape), []).append(c)

    def _copy(self, fields=None) -> list:
        """Copies of `fields` (default: the state), counted as one more snapshot held."""
        out = [self.clone(f) for f in (fields or self.fields)]
        if fields is None:
            self._at = out
        self._held += 1
        self._bytes += sum(c.nbytes for c in out)
        self.stats.snapshots = max(self.stats.snapshots, self._held)
        self.stats.bytes = max(self.stats.bytes, self._bytes)
        return out

    def _drop(self, copies: list) -> None:
        if copies is self._at:
            self._at = None
        self._held -= 1
        self._bytes -= sum(c.nbytes for c in copies)
        for c in copies:
            self._release(c)

    def _restore(self, copies: list, fields=None) -> None:
        if fields is None:
            if copies is self._at:
                return  # the state holds these values already (nothing ran since they were taken)
            self._at = copies
        else:
            self._at = None
        for f, c in zip(fields or self.fields, copies):
            f._copy_from(c)

    # ---- what each launch touches --------------------------------------------------------------
    def accesses(self, kernel, args) -> tuple[list, list, list]:
        """(fields read, stored to, accumulated into) by a launch (primal fields; atomic min / max
        count as accumulations); cached for kernels whose arguments are all scalars (the same
        fields whatever the values)."""
        scalar = getattr(kernel, "_scalar_only", False)
        acc = self._accesses.get(kernel) if scalar else None
        if acc is None:
            kinds: dict = {}
            for obj, kind, _ in kernel.footprint(*args):
                if not getattr(obj, "is_grad", False):
                    kinds.setdefault(kind in ("load", "load_before") and "r" or kind == "store" and "s" or "a",
                                     {})[id(obj)] = obj
            acc = tuple(list(kinds.get(k, {}).values()) for k in "rsa")
            if scalar:
                self._accesses[kernel] = acc
        return acc

    def watch_launch(self, rec: Recorder, who: str, reads, stores, adds) -> None:
        """The forward pass: refuse a field outside the state that carries values from one step
        into another: read in a step before that step stores to it, after a step wrote (or
        accumulated into) it, or the other way round."""
        t = rec.t
        for r in reads:
            i = id(r)
            if i in self.state_ids or i in rec._stored or i in self.read_first:
                continue
            if i in self.written:
                _, by, tw = self.written[i]
                if i not in self.stored:  # only accumulated into: it keeps what the earlier steps left
                    self._hidden(r, f"{by} adds to it in step {tw} and no kernel stores to it first (clears it), "
                                    f"so what {who} reads in step {t} includes what was there before the step")
                self._hidden(r, f"{by} writes it in step {tw} and {who} reads it in step {t} before the step "
                                f"writes it")
            self.read_first[i] = (r, who, t)
        for w in stores + adds:
            i = id(w)
            if i in self.state_ids:
                continue
            if i in self.read_first:
                _, by, tr = self.read_first[i]
                self._hidden(w, f"{by} reads it in step {tr} before the step writes it, and {who} writes it in "
                                f"step {t}")
            self.written.setdefault(i, (w, who, t))
        rec._stored.update(id(w) for w in stores)  # an accumulation keeps what was there before
        self.stored.update(id(w) for w in stores)

    def _hidden(self, f, how: str) -> None:
        raise WgpuAdError(
            f"ti.ad.checkpoint: {describe(f)} carries values from one step to the next but is not in state=: {how}. "
            f"The backward pass restores only the state before it runs steps again, so they would read other "
            f"values and the gradient would be silently wrong: add it to state= "
            f"(state=[{', '.join([g.name or '...' for g in self.fields] + [f.name or 'it'])}]), or have each step "
            f"write it before reading it")

    def check_earlier(self, entries) -> None:
        """Kernels launched on the tape before the checkpoint run their gradients after its backward
        pass: refuse one that reads a field the steps write outside the state (its value then is
        whatever the steps' last recomputation left)."""
        if not self.written:
            return
        for e in entries:
            if e.kind == "no_grad" or getattr(e, "opaque", False):
                continue
            for k, a in e.launches():
                accessed = getattr(k, "accessed", None)
                if accessed is None:
                    continue
                for r in accessed(*a)[0]:
                    if id(r) in self.written:
                        _, by, _t = self.written[id(r)]
                        raise WgpuAdError(
                            f"ti.ad.checkpoint: kernel '{k.__name__}', launched on the tape before the checkpointed "
                            f"steps, reads {describe(r)}, which the steps overwrite ({by}) and which is not in "
                            f"state=; its gradient would replay the wrong values. Add {r.name or 'it'} to state=, "
                            f"or write it in another field in the steps")

    @contextlib.contextmanager
    def _running(self, rec: Recorder | None, copies: bool):
        """Steps run inside: launches told to `rec` (None: to nobody), kernels updating fields in
        place keep copies for their adjoints only when `copies`."""
        self._at = None
        ctx = session.ad()
        prev = (ctx.tape, ctx.in_backward, ctx.keep_copies, ctx.host_guard)
        if rec is None:
            ctx.in_backward = True
        else:
            ctx.tape, ctx.in_backward, ctx.host_guard = rec, False, rec.host
        ctx.keep_copies = copies
        try:
            yield
        finally:
            ctx.tape, ctx.in_backward, ctx.keep_copies, ctx.host_guard = prev

    def _seek(self, t: int) -> None:
        if self.seeds is not None:
            get_runtime().random_position = self.seeds[t]

    # ---- the passes --------------------------------------------------------------------------
    def forward(self) -> None:
        rt = get_runtime()
        keep_all = self.schedule in ("sqrt", "store_all")
        seeds = []
        rec = Recorder(self, watch=True)
        self.initial = self._copy()
        for t in range(self.steps):
            if t and keep_all and t % self.every == 0:
                self.saved[t] = self._copy()
            seeds.append(rt.random_position)
            rec.t, rec._stored = t, set()
            with self._running(rec, copies=False):
                self.step(t)
        if seeds and rt.random_position != seeds[0]:
            self.seeds = seeds  # the steps drew random numbers: rerun each from its own position

    def grad(self) -> None:
        """The backward pass (the tape calls it in reverse order with the other entries). The
        steps run again here print nothing: their lines were printed by the forward pass."""
        if self.done:
            raise WgpuAdError("ti.ad.checkpoint: the backward pass of this checkpointed run already ran (its "
                              "checkpoints are gone); record the run again for another backward pass")
        self.done = True
        with get_runtime().mute_prints():
            self._grad()

    def _grad(self) -> None:
        rt = get_runtime()
        position = rt.random_position
        initial = self.initial
        # what the fields hold at the end of the forward pass (the kernels after the checkpoint
        # included), put back by finish()
        extra = [f for f, _, _ in self.written.values()]
        self.final = (self._copy(self.fields + extra), extra)
        if self.steps:
            self._reverse_steps(self._copy(initial))  # the first checkpoint, let go by the schedule
        # the earlier entries of the tape see the state from before step 0; finish() puts the final back
        self._restore(initial)
        rt.random_position = position

    def finish(self) -> None:
        """After the tape's backward pass: the fields hold the values of the end of the forward pass."""
        if self.final is None:
            return
        copies, extra = self.final
        self._restore(copies, self.fields + extra)
        self._drop(copies)
        self._drop(self.initial)
        self.final = self.initial = None

    def _advance(self, a: int, b: int) -> None:
        """Run steps [a, b) again, unrecorded, to reach the state before step b."""
        with self._running(None, copies=False):
            for t in range(a, b):
                self._seek(t)
                self.step(t)
        self.stats.recomputed_steps += b - a

    def _segment(self, a: int, b: int) -> None:
        """Steps [a, b) backwards, from the state before step a (restored by the caller): a copy of
        the state before each step, then each step differentiated, last first."""
        if b - a == 1:
            self._step_backward(a)
            return
        befores = [self._copy()]
        for t in range(a, b - 1):
            self._advance(t, t + 1)
            befores.append(self._copy())
        for t in reversed(range(a, b)):
            self._restore(befores[t - a])
            self._step_backward(t)
            self._drop(befores[t - a])

    def _step_backward(self, t: int) -> None:
        """Step t backwards, from the state before it: the state's gradients go from after the step
        to before it. The step runs once more, recorded (Recorder, record mode); then its launches
        are undone last first, each kernel's adjoint running on the fields as its launch saw them."""
        rec = Recorder(self, watch=False)
        rec.t = t
        self._seek(t)
        with self._running(rec, copies=True):
            self.step(t)
        self.stats.recomputed_steps += 1
        held = sum(f.nbytes for e in rec.entries for f, _ in e.undo)
        self.stats.step_bytes = max(self.stats.step_bytes, held)
        ctx = session.ad()
        prev = ctx.in_backward
        ctx.in_backward = True
        try:
            for e in reversed(rec.entries):
                for f, c in reversed(e.undo):
                    f._copy_from(c)
                    self._release(c)
                if e.kind == "kernel" or e.kind == "custom":
                    e.fn.grad(*e.args, **e.kwargs)
                elif e.kind == "no_grad":  # nothing flows back through what it writes
                    for kernel, args in reversed(e.launches()):
                        zero_overwritten(kernel, args)
                elif e.kind == "host" and e.fn.needs_grad:  # nothing depends on the values overwritten
                    index = e.args[0]
                    if index is None:
                        e.fn.grad.fill(0)
                    else:
                        e.fn.grad[index] = 0
        finally:
            ctx.in_backward = prev
