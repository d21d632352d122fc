"""ti.ad.checkpoint: a long simulation that updates its state in place, differentiated with
bounded memory by recomputation.

    state = [x, v]
    def step(t):                 # plain Python: launches kernels that update x, v in place
        substep(t)
    with ti.ad.Tape(loss):
        stats = ti.ad.checkpoint(step, steps=T, state=state)
        compute_loss()

The forward pass runs step(0..T-1) without recording it and keeps copies of the state fields at a
few points (checkpoints). The backward pass walks the steps backwards: it restores the checkpoint
before a stretch of steps, runs forward again to each step, and differentiates that one step: it
runs the step once more, copying before each launch the fields the launch overwrites (one step's
worth of memory), then undoes the launches last first, restoring those copies so that each
kernel's adjoint sees the fields exactly as its own launch did. The state's gradients flow from the
end of the run to its start, and the gradients of parameters (fields the steps read but never
write) accumulate over all steps.

Schedules: "revolve" (default) is the binomial schedule of Griewank and Walther: with s free
checkpoints (`snapshots`, default ceil(log2 T)) it places each one where the two sides can be
reversed with the fewest steps run again (a split after C(s + r - 1, s) steps, r the fewest
repetitions with C(s + r, s) >= the steps left), and keeps at most s + 3 copies of the state.
"bisect" halves each segment (log2(T) + 3 copies, each step run O(log T) times again). "sqrt" keeps
about sqrt(T) copies and runs every step about twice again. "store_all" keeps T + 2 copies and runs
each step once again (to differentiate it).

A step must do the same thing when it runs again, and the first run checks what it can:
  - ti.random() draws the same numbers again: each step's position in the random stream is kept
    (one integer per step, only when the steps draw random numbers) and set back before it reruns;
  - a field outside `state` that a step writes must not carry values into a later step (read, or
    accumulated into, before being stored to in a step): a hidden state, refused with its name
    ("add it to state="); the check is per field, not per element;
  - reading a field back to Python inside a step (to_numpy, x[i], a kernel's return value) is
    refused: the step runs again during the backward pass, so whatever Python does with the value
    would happen again, out of order. Python-scope writes (fill, from_numpy, x[i] = v) are fine:
    they are undone like launches.
After the backward pass the fields (the state and what the steps wrote) hold the values of the end
of the forward pass again; while the tape's other entries run their gradients they hold the state
from before step 0, which is what the kernels launched before the checkpoint saw.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable

from ..errors import WgpuAdError
from ..session import runtime as get_runtime
from .. import session
from .naming import describe

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


def checkpoint(step: Callable[[int], None], steps: int, state: list, snapshots: int | None = None,
               schedule: str = "revolve") -> CheckpointStats:
    """Run step(0), ..., step(steps - 1) and, inside ti.ad.Tape, differentiate them with bounded
    memory; returns a CheckpointStats (filled in by the backward pass). `snapshots`: how many
    checkpoints to keep (revolve: free ones, default ceil(log2 steps); sqrt: default about
    sqrt(steps); bisect and store_all place their own). Outside a tape it only runs the steps."""
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
    tape = session.ad().tape
    if isinstance(tape, _Recorder):
        raise WgpuAdError("ti.ad.checkpoint cannot be nested: a step of a checkpointed run calls "
                          "ti.ad.checkpoint again; checkpoint the outer loop only")
    run = _Run(step, steps, fields, snapshots, schedule)
    recording = tape is not None and tape.recording and not session.ad().in_backward
    if not recording:  # no gradient will be asked for: just the steps
        for t in range(steps):
            step(t)
        return run.stats
    if getattr(tape, "_validator", None) is not None:  # ti.ad.Tape(validation=True)
        tape._validator.note_restore(fields)  # the launches before see the state as it is now
    tape.recording = False  # the steps are not recorded: the backward pass runs them again
    try:
        run.forward()
    finally:
        tape.recording = True
    run.check_earlier(tape.entries)
    tape.insert(run, ())
    tape.after_backward(run.finish)
    return run.stats


@dataclass
class _Entry:
    """One thing a step did, recorded while it runs to be differentiated: a launch, a grad_replaced
    call (with the launches inside it) or a Python-scope write, with the copies that undo it."""

    fn: object
    args: tuple
    kwargs: dict
    kind: str                  # 'kernel' | 'custom' | 'no_grad' | 'host'
    undo: list                 # (field, its copy from before the write), in order


class _Recorder:
    """Stands in for the tape while ti.ad.checkpoint runs a step: the kernel launcher and
    grad_replaced functions tell it what they launch (as they tell a tape).

    watch: the forward pass's first run: checks each launch for hidden state (module docstring).
    record: a run to differentiate the step: before each launch, copies of the fields it writes
    that earlier launches of the step read (what their adjoints will need back), then the launch."""

    keep_copies = True

    def __init__(self, run: "_Run", watch: bool):
        self.run, self.watch = run, watch
        self.recording = not watch  # kernels updating fields in place keep their copies (record)
        self.t = 0
        self.entries: list[_Entry] = []
        self._custom: _Entry | None = None
        self._read: set = set()      # record: ids of the fields read so far in this step
        self._stored: set = set()    # watch: ids of fields outside the state stored to in this step

    # ---- what the launcher calls ---------------------------------------------------------------
    def record(self, kernel, args: tuple) -> None:
        reads, stores, adds = self.run.accesses(kernel, args)
        if self.watch:
            self.run.watch_launch(self, f"kernel '{kernel.__name__}'", reads, stores, adds)
            return
        writes = stores + adds
        if self._custom is not None:  # the gradient function may read what the inner launches read
            self._read.update(map(id, reads))
        # what an earlier launch read (its adjoint needs it back); a kernel updating a field in
        # place keeps its own copy for its adjoint (lang/kernel.py)
        undo = [(w, self.run.clone(w)) for w in writes if id(w) in self._read]
        self._read.update(map(id, reads))
        if self._custom is not None:
            self._custom.undo += undo
        else:
            kind = "no_grad" if getattr(kernel, "_no_grad", False) else "kernel"
            self.entries.append(_Entry(kernel, tuple(args), {}, kind, undo))

    def defer(self, *args) -> bool:
        return False  # never fused with its adjoint: launched now

    def insert(self, func, args) -> None:
        raise WgpuAdError("ti.ad.checkpoint: a step calls ti.ad.Tape.insert (or a nested ti.ad.checkpoint); "
                          "a checkpointed step may only launch kernels and grad_replaced functions")

    @contextlib.contextmanager
    def custom_call(self, fn, args: tuple, kwargs: dict):
        if self.watch or self._custom is not None:
            yield
            return
        entry = _Entry(fn, tuple(args), dict(kwargs), "no_grad" if fn.no_grad else "custom", [])
        self.entries.append(entry)
        self._custom = entry
        try:
            yield
        finally:
            self._custom = None

    def host(self, obj, what: str, index=None) -> None:
        """The session's host guard: a Python-scope access inside the step: of a storage (`what`: the
        method), or a kernel's return value or host arrays (`what` says which)."""
        is_storage = hasattr(obj, "gpu_buffer")
        if not (is_storage and (what.startswith(("fill", "from_numpy", "copy_from")) or "] = " in what)):
            thing = f"{describe(obj)} ({what})" if is_storage else what
            raise WgpuAdError(
                f"ti.ad.checkpoint: step {self.t} reads {thing} back to Python while it runs. The backward pass "
                f"runs every step again (several times with revolve), so whatever Python does with the value "
                f"(logging it, a decision) would happen again, out of order, and each read waits for the GPU. Read "
                f"it after ti.ad.checkpoint returns; to log a value per step, store it from a kernel into a field "
                f"indexed by the step (log[t] = ...) and read that after the tape")
        if self.watch:
            self.run.watch_launch(self, f"Python-scope {what}", [], [obj], [])
        else:  # undone like a launch; its adjoint zeroes the gradient of what it overwrote
            undo = [(obj, self.run.clone(obj))] if id(obj) in self._read else []
            if self._custom is not None:
                self._custom.undo += undo
            else:
                self.entries.append(_Entry(obj, (index,), {}, "host", undo))


class _Run:
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

    def watch_launch(self, rec: _Recorder, who: str, reads, stores, adds) -> None:
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
    def _running(self, rec: _Recorder | None, copies: bool):
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
        rec = _Recorder(self, watch=True)
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
            start = self._copy(initial)  # the first checkpoint, let go by the recursion
            if self.schedule == "bisect":
                self._bisect(0, self.steps, start)
            elif self.schedule == "revolve":
                free = self.snapshots or max(1, math.ceil(math.log2(max(self.steps, 2))))
                self._revolve(0, self.steps, start, free)
            else:
                self.saved[0] = start
                starts = sorted(self.saved)
                for k in reversed(range(len(starts))):
                    a = starts[k]
                    b = starts[k + 1] if k + 1 < len(starts) else self.steps
                    copies = self.saved.pop(a)
                    self._restore(copies)
                    self._segment(a, b)
                    self._drop(copies)
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

    def _revolve(self, a: int, b: int, start: list, free: int) -> None:
        """Steps [a, b) backwards from the state before step a (kept by the caller), with `free`
        more copies allowed: the binomial split (module docstring)."""
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
        to before it. The step runs once more, recorded (_Recorder, record mode); then its launches
        are undone last first, each kernel's adjoint running on the fields as its launch saw them."""
        rec = _Recorder(self, watch=False)
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
                elif e.kind == "host" and e.fn.needs_grad:  # nothing depends on the values overwritten
                    index = e.args[0]
                    if index is None:
                        e.fn.grad.fill(0)
                    else:
                        e.fn.grad[index] = 0
        finally:
            ctx.in_backward = prev
