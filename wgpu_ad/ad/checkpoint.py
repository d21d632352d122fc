"""ti.ad.checkpoint: a long simulation that updates its state in place, differentiated with
bounded memory by recomputation.

    state = [x, v]
    def step(t):                 # plain Python: launches kernels that update x, v in place
        substep(t)
    with ti.ad.Tape(loss):
        stats = ti.ad.checkpoint(step, steps=T, state=state)
        compute_loss()

The forward pass runs step(0..T-1) without recording it and keeps copies of the state fields at a
few points (checkpoints). The backward pass walks the steps backwards segment by segment: it
restores the checkpoint that starts the segment, runs the segment again under a tape of its own
(kernels that update the state in place keep their pre-launch copies there, passes/autodiff/
promote.py) and runs its adjoints, so the state's gradients flow from the end of the segment to its
start and the gradients of parameters (fields the steps read but never write) accumulate.

Schedules: "revolve" (default) is the binomial schedule of Griewank and Walther: with s free
checkpoints (`snapshots`, default ceil(log2 T)) it places each one where the two sides can be
reversed with the fewest steps run again (a split after C(s + r - 1, s) steps, r the fewest
repetitions with C(s + r, s) >= the steps left), and keeps at most s + 3 copies of the state.
"bisect" halves each segment (log2(T) + 3 copies, each step run O(log T) times again). "sqrt" keeps
about sqrt(T) copies and runs every step once again. "store_all" keeps T + 1 copies and runs each
step once in the backward pass.

What the step does must be the same when it runs again: it may read `t`, fields outside `state`
that no step writes (parameters), and its own state. The state fields hold the final state again
after the backward pass. In the backward pass each launch of a step runs again with the launches
before it in that step (K launches per step: K (K + 1) / 2 forward launches), so that its adjoint
sees the fields exactly as its own launch did.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from ..errors import WgpuAdError
from ..runtime.device import get_runtime
from . import state as ad_state

SCHEDULES = ("revolve", "bisect", "sqrt", "store_all")


@dataclass
class CheckpointStats:
    """What a checkpointed run kept and did: the most state copies held at once, their bytes, and
    how many steps the backward pass ran again."""

    steps: int
    schedule: str
    snapshots: int = 0
    bytes: int = 0
    recomputed_steps: int = 0


def checkpoint(step: Callable[[int], None], steps: int, state: list, snapshots: int | None = None,
               schedule: str = "revolve") -> CheckpointStats:
    """Run step(0), ..., step(steps - 1) and, inside ti.ad.Tape, differentiate them with bounded
    memory; returns a CheckpointStats (filled in by the backward pass). `snapshots`: for "sqrt",
    how many checkpoints to keep (default about sqrt(steps))."""
    if not callable(step):
        raise WgpuAdError(f"ti.ad.checkpoint: step must be a function of the step number, got {type(step).__name__}")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise WgpuAdError(f"ti.ad.checkpoint: steps must be a non-negative integer, got {steps!r}")
    if schedule not in SCHEDULES:
        raise WgpuAdError(f"ti.ad.checkpoint: unknown schedule {schedule!r}; use one of {', '.join(SCHEDULES)}")
    if snapshots is not None and (not isinstance(snapshots, int) or isinstance(snapshots, bool) or snapshots < 1):
        raise WgpuAdError(f"ti.ad.checkpoint: snapshots must be a positive integer (how many copies of the state "
                          f"to keep) or None to choose, got {snapshots!r}")
    fields = list(state) if isinstance(state, (list, tuple)) else [state]
    if not fields or not all(hasattr(f, "gpu_buffer") and hasattr(f, "copy_from") for f in fields):
        raise WgpuAdError("ti.ad.checkpoint: state must be a list of the fields (or ndarrays) a step reads and "
                          "overwrites, e.g. state=[x, v]")
    run = _Run(step, steps, fields, snapshots, schedule)
    tape = ad_state.current_tape
    recording = tape is not None and tape.recording and not ad_state.in_backward
    if not recording:  # no gradient will be asked for: just the steps
        for t in range(steps):
            step(t)
        return run.stats
    tape.recording = False  # the steps are not recorded: the backward pass runs them again
    try:
        run.forward()
    finally:
        tape.recording = True
    tape.insert(run, ())
    return run.stats


class _Run:
    """One checkpointed run: its forward pass, and its backward pass as a tape entry's grad()."""

    __name__ = "checkpoint"

    def __init__(self, step, steps, fields, snapshots, schedule):
        self.step, self.steps, self.fields, self.schedule = step, steps, fields, schedule
        self.every = 1 if schedule == "store_all" else max(1, math.ceil(steps / max(1, snapshots))) \
            if snapshots else max(1, math.isqrt(max(steps, 1)))
        self.stats = CheckpointStats(steps, schedule)
        self.snapshots = snapshots
        self.saved: dict[int, list] = {}  # step -> copies of the state before it
        self.final: list | None = None
        self._held = 0
        self._spare: dict = {}  # (dtype, shape, element shape) -> copies no longer needed

    # ---- state copies ------------------------------------------------------------------------
    def _copy(self) -> list:
        from ..lang.ndarray import Ndarray
        out = []
        for f in self.fields:
            spare = self._spare.get((f.dtype.name, f.shape, f.element_shape))
            c = spare.pop() if spare else Ndarray(f.dtype, f.shape, f.element_shape, name=f"{f.name}_checkpoint")
            c.copy_from(f)
            out.append(c)
        self._held += 1
        self.stats.snapshots = max(self.stats.snapshots, self._held)
        self.stats.bytes = max(self.stats.bytes, self._held * sum(f.nbytes for f in self.fields))
        return out

    def _drop(self, copies: list) -> None:
        self._held -= 1
        for c in copies:
            self._spare.setdefault((c.dtype.name, c.shape, c.element_shape), []).append(c)

    def _restore(self, copies: list) -> None:
        for f, c in zip(self.fields, copies):
            f.copy_from(c)

    # ---- the passes --------------------------------------------------------------------------
    def forward(self) -> None:
        keep_all = self.schedule in ("sqrt", "store_all")
        for t in range(self.steps):
            if t == 0 or keep_all and t % self.every == 0:
                self.saved[t] = self._copy()
            self.step(t)
        self.final = self._copy()

    def grad(self) -> None:
        """The backward pass (the tape calls it in reverse order with the other entries). The
        steps run again here print nothing: their lines were printed by the forward pass."""
        with get_runtime().mute_prints():
            self._grad()

    def _grad(self) -> None:
        if self.steps:
            if self.schedule == "bisect":
                self._bisect(0, self.steps, self.saved.pop(0))
            elif self.schedule == "revolve":
                free = self.snapshots or max(1, math.ceil(math.log2(max(self.steps, 2))))
                self._revolve(0, self.steps, self.saved.pop(0), free)
            else:
                starts = sorted(self.saved)
                for k in reversed(range(len(starts))):
                    a = starts[k]
                    b = starts[k + 1] if k + 1 < len(starts) else self.steps
                    copies = self.saved.pop(a)
                    self._restore(copies)
                    self._segment(a, b)
                    self._drop(copies)
        self._restore(self.final)  # the fields end with the final state, as after the forward pass
        self._drop(self.final)

    def _last_steps(self, a: int, b: int, start: list) -> None:
        """The end of a recursion: steps [a, b) backwards from `start`, which is then let go."""
        self._restore(start)
        self._segment(a, b)
        self._drop(start)

    def _revolve(self, a: int, b: int, start: list, free: int) -> None:
        """Steps [a, b) backwards from the state before step a (kept by the caller), with `free`
        more copies allowed: the binomial split (module docstring)."""
        n = b - a
        if n <= 1:
            self._last_steps(a, b, start)
            return
        if free == 0:  # no copy left: run from the start to each step, last first
            for t in reversed(range(a, b)):
                self._restore(start)
                self._advance(a, t)
                self._segment(t, t + 1)
            self._drop(start)
            return
        r = 1
        while math.comb(free + r, free) < n:
            r += 1
        m = a + max(1, min(n - 1, math.comb(free + r - 1, free)))
        self._restore(start)
        self._advance(a, m)
        middle = self._copy()
        self._revolve(m, b, middle, free - 1)
        self._revolve(a, m, start, free)

    def _bisect(self, a: int, b: int, start: list) -> None:
        """Steps [a, b) backwards, given the state before step a (kept by the caller)."""
        if b - a <= 1:
            self._last_steps(a, b, start)
            return
        mid = (a + b) // 2
        self._restore(start)
        self._advance(a, mid)
        middle = self._copy()
        self._bisect(mid, b, middle)
        self._bisect(a, mid, start)

    def _advance(self, a: int, b: int) -> None:
        """Run steps [a, b) again, unrecorded, to reach the state before step b."""
        prev = ad_state.in_backward
        ad_state.in_backward = True  # launches here are not recorded anywhere
        try:
            for t in range(a, b):
                self.step(t)
        finally:
            ad_state.in_backward = prev
        self.stats.recomputed_steps += b - a

    def _segment(self, a: int, b: int) -> None:
        """Steps [a, b) backwards, from the state before step a (restored by the caller): the
        state's gradients go from the state after step b - 1 to the state before step a.

        Each kernel's adjoint must see the fields as its own launch saw them, and a later kernel of
        the step may overwrite what an earlier one read (kick reads x, drift then moves x). So each
        step's launches are recorded once, and for each launch, last first, the state before the
        step is restored, the launches before it run again, and it runs on a tape of its own, whose
        gradient is taken at once."""
        from .tape import Tape
        befores, launches = [], []
        for t in range(a, b):
            befores.append(self._copy())
            rec = Tape(clear_gradients=False)
            rec.keep_copies = False  # only recorded: in-place kernels keep no copies for it
            with rec:
                self.step(t)
            launches.append(rec.entries)
        self.stats.recomputed_steps += b - a
        for t in reversed(range(a, b)):
            start, entries = befores[t - a], launches[t - a]
            for j in reversed(range(len(entries))):
                self._restore(start)
                prev = ad_state.in_backward
                ad_state.in_backward = True  # the launches before it: not recorded
                try:
                    for e in entries[:j]:
                        e.forward()
                finally:
                    ad_state.in_backward = prev
                one = Tape(clear_gradients=False)
                with one:
                    entries[j].forward()
                one.grad()
            self._drop(start)
