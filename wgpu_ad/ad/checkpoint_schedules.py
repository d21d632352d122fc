"""The schedules of ti.ad.checkpoint: in which order the backward pass runs steps again, and which
copies of the state it keeps meanwhile (checkpoint.py's docstring compares them), with what a run
kept and did (CheckpointStats).

"revolve": the binomial schedule of Griewank and Walther; "bisect": halve each segment; "sqrt" and
"store_all": the forward pass keeps a copy every `every` steps (checkpoint_run.Run.forward), and
each segment between two is reversed, last first.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

SCHEDULES = ("revolve", "bisect", "sqrt", "store_all")


@dataclass
class CheckpointStats:
    """What a checkpointed run kept and did: the most state copies held at once (checkpoints, the
    final state and a step's start), their bytes, the most bytes of one step's pre-launch copies
    held while it was differentiated, and how many steps the backward pass ran again."""

    steps: int
    schedule: str
    snapshots: int = 0
    bytes: int = 0
    step_bytes: int = 0
    recomputed_steps: int = 0


class Schedules:
    """Mixed into checkpoint_run.Run: its copies (_copy, _restore, _drop), _advance (run steps
    again), _segment and _step_backward (differentiate steps) are what the schedules arrange."""

    def _reverse_steps(self, start: list) -> None:
        """Steps [0, steps) backwards by the run's schedule, from `start`: a copy of the state before
        step 0, which the schedule lets go."""
        if self.schedule == "bisect":
            self._bisect(0, self.steps, start)
        elif self.schedule == "revolve":
            free = self.snapshots or max(1, math.ceil(math.log2(max(self.steps, 2))))
            self._revolve(0, self.steps, start, free)
        else:
            self._from_saved(start)

    def _from_saved(self, start: list) -> None:
        """sqrt and store_all: the segments between the copies the forward pass kept, last first."""
        self.saved[0] = start
        starts = sorted(self.saved)
        for k in reversed(range(len(starts))):
            a = starts[k]
            b = starts[k + 1] if k + 1 < len(starts) else self.steps
            copies = self.saved.pop(a)
            self._restore(copies)
            self._segment(a, b)
            self._drop(copies)

    def _revolve(self, a: int, b: int, start: list, free: int) -> None:
        """Steps [a, b) backwards from the state before step a (kept by the caller), with `free`
        more copies allowed: the binomial split (checkpoint.py docstring)."""
        n = b - a
        if n <= 1:
            self._restore(start)
            self._segment(a, b)
            self._drop(start)
            return
        if free == 0:  # no copy left: run from the start to each step, last first
            for t in reversed(range(a, b)):
                self._restore(start)
                self._advance(a, t)
                self._step_backward(t)
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
            self._restore(start)
            self._segment(a, b)
            self._drop(start)
            return
        mid = (a + b) // 2
        self._restore(start)
        self._advance(a, mid)
        middle = self._copy()
        self._bisect(mid, b, middle)
        self._bisect(a, mid, start)
