"""What a checkpointed step does, as it runs: the Recorder stands in for the tape while
ti.ad.checkpoint runs a step (the launcher and grad_replaced functions tell it what they launch),
either watching the forward pass's first run for hidden state or recording a run to differentiate
it, with the copies that undo each launch (checkpoint.py's docstring says why).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from ..errors import WgpuAdError
from .naming import describe


@dataclass
class Entry:
    """One thing a step did, recorded while it runs to be differentiated: a launch, a grad_replaced
    call (with the launches inside it) or a Python-scope write, with the copies that undo it."""

    fn: object
    args: tuple
    kwargs: dict
    kind: str                  # 'kernel' | 'custom' | 'no_grad' | 'host'
    undo: list                 # (field, its copy from before the write), in order
    inner: list = field(default_factory=list)  # a no_grad function's launches: (kernel, args)

    def launches(self) -> list:
        """The kernel launches this entry made."""
        return [(self.fn, self.args)] if getattr(self.fn, "_wgpu_ad_kernel", False) else self.inner


class Recorder:
    """Stands in for the tape while ti.ad.checkpoint runs a step: the kernel launcher and
    grad_replaced functions tell it what they launch (as they tell a tape).

    watch: the forward pass's first run: checks each launch for hidden state (checkpoint.py docstring).
    record: a run to differentiate the step: before each launch, copies of the fields it writes
    that earlier launches of the step read (what their adjoints will need back), then the launch."""

    keep_copies = True

    def __init__(self, run, watch: bool):  # run: checkpoint_run.Run
        self.run, self.watch = run, watch
        self.recording = not watch  # kernels updating fields in place keep their copies (record)
        self.t = 0
        self.entries: list[Entry] = []
        self._custom: Entry | None = None
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
            self._custom.inner.append((kernel, tuple(args)))
        else:
            kind = "no_grad" if getattr(kernel, "_no_grad", False) else "kernel"
            self.entries.append(Entry(kernel, tuple(args), {}, kind, undo))

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
        entry = Entry(fn, tuple(args), dict(kwargs), "no_grad" if fn.no_grad else "custom", [])
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
        if not (is_storage and (what.startswith(("fill", "from_numpy", "from_torch", "copy_from")) or "] = " in what)):
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
                self.entries.append(Entry(obj, (index,), {}, "host", undo))
