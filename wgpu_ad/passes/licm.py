"""Loop-invariant code motion: values a serial loop computes the same way in every iteration are
computed once, before the loop.

Moved out of a loop body (its top level only, inner loops first so values can travel out of
several loops; a range task's parallel loop last, into its bounds block, which every thread runs
once before its grid-stride loop): pure ops whose operands are all defined outside the loop or already moved,
loads of thread-local variables the loop does not write, and loads of global buffers that no
statement of the task writes (other threads could write them between iterations otherwise).
Moving a statement before the loop evaluates it even when the loop runs zero times or leaves
before reaching it: harmless, since none of these ops has an effect or can trap (WGSL integer
division by zero is defined, and out-of-range loads are clamped by WebGPU's bounds checks; the
debug-mode index ASSERTs stay where they were).

The shader compiler cannot do this itself for global loads: it cannot prove that a read-only
binding does not alias a written one. Pair sums (`for j in range(N): r = x[i] - x[j]`) load x[i]
once per thread instead of once per pair, which halves their time on lavapipe; an adjoint reads
the seed loss.grad[None] once per thread instead of once per element (a reduction's adjoint
23 -> 17 ms there).
"""
from __future__ import annotations

from ..ir.nodes import Block, Kernel, Stmt, walk
from ..ir.ops import Op
from ..ir.utils import PURE, buffer_alias_key, writes_in

_LOOPS = frozenset({Op.RANGE_FOR, Op.WHILE})


def licm(kernel: Kernel) -> Kernel:
    for t in kernel.tasks:
        written = writes_in(t.bounds) | writes_in(t.body) | writes_in(t.epilogue)
        _block(t.body, written)
        if t.kind == "range":  # the parallel loop is a loop too: its invariants go to the bounds block
            t.bounds.stmts.extend(_hoist_from(t.body, t, {id(x) for x in walk(t.body)}, writes_in(t.body), written))
    return kernel


def _block(block: Block, task_writes: set) -> None:
    out: list[Stmt] = []
    for s in block.stmts:
        for b in s.blocks:
            _block(b, task_writes)
        if s.op in _LOOPS:
            out.extend(_hoist(s, task_writes))
        out.append(s)
    block.stmts[:] = out


def _hoist(loop: Stmt, task_writes: set) -> list[Stmt]:
    """Remove the invariant statements from the top level of loop's body and return them."""
    body = loop.blocks[0]
    return _hoist_from(body, loop, {id(x) for b in loop.blocks for x in walk(b)}, writes_in(body), task_writes)


def _hoist_from(body: Block, loop, inside: set, loop_writes: set, task_writes: set) -> list[Stmt]:
    """Remove from body (the loop's, or a range task's) the statements invariant in `loop` (a
    RANGE_FOR / WHILE stmt, or the Task for its parallel index) and return them in order."""
    moved: list[Stmt] = []
    moved_ids: set[int] = set()
    keep: list[Stmt] = []
    for s in body.stmts:
        if _movable(s, loop, loop_writes, task_writes) and all(
                id(a) not in inside or id(a) in moved_ids for a in s.args):
            moved.append(s)
            moved_ids.add(id(s))
        else:
            keep.append(s)
    if moved:
        body.stmts[:] = keep
    return moved


def _movable(s: Stmt, loop, loop_writes: set, task_writes: set) -> bool:
    if s.blocks:
        return False
    if s.op is Op.LOOP_INDEX:
        return s.attr is not loop
    if s.op in PURE:
        return True
    if s.op is Op.GLOBAL_LOAD:
        return buffer_alias_key(s.attr) not in task_writes
    if s.op is Op.LOCAL_LOAD:
        return ("local", s.args[0]) not in loop_writes
    return False
