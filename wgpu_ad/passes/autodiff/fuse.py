"""A kernel's forward pass and its adjoint in one launch: the tail of a tape.

`with ti.ad.Tape(loss): compute_loss()` runs the kernel, seeds loss.grad = 1 and runs its adjoint.
The adjoint replays the forward computation anyway (reverse.py), so the forward launch adds a
whole pass over the data for nothing but its writes (the loss). When the last launch of a tape is
held back until the tape exits (ad/tape.py), both run as one *fused* kernel: the forward's tasks
but the last, then the last task's adjoint whose replay also does the forward's global writes,
then the other adjoint tasks. On lavapipe that removes one of the two passes of a reduction.

Running the two parts of the fused task in one pass, in an order no one controls across threads,
gives the same values as one after the other when neither reads or writes what the other one
writes: the forward's writes (`fwd_writes`) are read by nothing in the task and written by nothing
else, and the primal fields the task reads (the forward's reads and the adjoint's replays of them)
are not among the gradients the adjoint writes. These are storages, known only at launch (an
ndarray passed twice, a gradient passed as a field), so the fused kernel carries its buffers by
kind (`Fused`) and the launcher checks them (lang/launch.py make_fuse_check); the tape falls back
to the two launches otherwise.

Not fused (NotFusable): a last task whose bounds block writes, that returns, or whose adjoint
needs stacks (an early exit on overflow would stop the workgroup pre-reduction of the forward's
accumulations, passes/prereduce.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...ir.nodes import Buffer, Task, walk
from ...ir.ops import Op

_WRITES = (Op.GLOBAL_STORE, Op.ATOMIC)


class NotFusable(Exception):
    """The kernel's last task cannot run fused with its adjoint (the reason is the message)."""


@dataclass
class Fused:
    """The buffers of the fused task by kind: what the launcher checks (module docstring)."""

    primal_reads: list[Buffer]
    grad_reads: list[Buffer]
    fwd_writes: list[Buffer]
    adj_writes: list[Buffer]


def check_fusable(task: Task) -> None:
    """Raise NotFusable when the primal `task` cannot run fused with its adjoint."""
    if any(s.op in _WRITES for s in walk(task.bounds)):
        raise NotFusable("its bounds block writes to a field")
    if any(s.op is Op.RETURN for s in walk(task.body)):
        raise NotFusable("it returns a value")
    if any(s.op is Op.PRINT for s in walk(task.body)):
        raise NotFusable("it prints (the adjoint's replay does not)")


def fused_access(task: Task, kept: set) -> Fused:
    """The buffers of the adjoint `task` built with the forward's writes (reverse.py
    AdjointEmitter(effects=True)), by kind; `kept`: the ids of those writes."""
    if any(s.op is Op.STACK_ALLOC for s in walk(task.body)):
        raise NotFusable("its adjoint keeps stacks for loops")
    kinds: list[dict[int, Buffer]] = [{}, {}, {}, {}]
    for blk in (task.bounds, task.body):
        for s in walk(blk):
            if s.op is Op.GLOBAL_LOAD:
                kinds[1 if s.attr.grad else 0][id(s.attr)] = s.attr
            elif s.op in _WRITES:
                buf = s.attr[1] if s.op is Op.ATOMIC else s.attr
                kinds[2 if id(s) in kept else 3][id(buf)] = buf
    return Fused(*(list(k.values()) for k in kinds))
