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

from typing import Callable

from ..errors import WgpuAdError
from .. import session
from .checkpoint_recorder import Recorder
from .checkpoint_run import Run
from .checkpoint_schedules import SCHEDULES, CheckpointStats

__all__ = ["checkpoint", "CheckpointStats", "SCHEDULES"]


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
    if isinstance(tape, Recorder):
        raise WgpuAdError("ti.ad.checkpoint cannot be nested: a step of a checkpointed run calls "
                          "ti.ad.checkpoint again; checkpoint the outer loop only")
    run = Run(step, steps, fields, snapshots, schedule)
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
