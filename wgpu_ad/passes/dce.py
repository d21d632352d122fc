"""Dead code elimination.

Removes, until nothing changes:
  - statements after a BREAK / CONTINUE / RETURN in the same block (never executed; every use of
    their values is after them in that block, so unreachable too);
  - pure values and memory reads whose value is unused;
  - local variables that are never read: the ALLOCA and all its stores;
  - IFs with two empty blocks and RANGE_FORs with an empty body (their operands are pure values).
Effects (global stores, atomics, RANDOM draws, asserts, returns, WHILE loops) always stay.
"""
from __future__ import annotations

from ..ir.nodes import Block, Kernel, Stmt
from ..ir.ops import Op
from ..ir.utils import PURE, READS, TERMINATORS, kernel_blocks, use_counts, walk_kernel


def dce(kernel: Kernel) -> Kernel:
    for block in kernel_blocks(kernel):
        _drop_unreachable(block)
    while _sweep_kernel(kernel):
        pass
    return kernel


def _drop_unreachable(block: Block) -> None:
    for k, s in enumerate(block.stmts):
        if s.op in TERMINATORS:
            del block.stmts[k + 1:]
            return


def _sweep_kernel(kernel: Kernel) -> bool:
    counts = use_counts(kernel)
    # a variable is read by any use other than as the target of a LOCAL_STORE
    loaded = {a for s in walk_kernel(kernel) for k, a in enumerate(s.args)
              if a.op is Op.ALLOCA and not (k == 0 and s.op is Op.LOCAL_STORE)}
    changed = False
    for task in kernel.tasks:
        # the body comes after the bounds in program order: sweep it first
        changed |= _sweep(task.body, counts, loaded)
        changed |= _sweep(task.bounds, counts, loaded)
    return changed


def _sweep(block: Block, counts: dict[Stmt, int], loaded: set) -> bool:
    """One backward pass: every use of a value comes after it in program order, so by the time a
    statement is visited all its users have been visited (and removed if dead)."""
    changed = False
    keep: list[Stmt] = []
    for s in reversed(block.stmts):
        for b in reversed(s.blocks):
            changed |= _sweep(b, counts, loaded)
        if _dead(s, counts, loaded):
            for a in s.args:
                counts[a] -= 1
            changed = True
            continue
        keep.append(s)
    keep.reverse()
    block.stmts[:] = keep
    return changed


def _dead(s: Stmt, counts: dict[Stmt, int], loaded: set) -> bool:
    op = s.op
    if op in PURE or op in READS or op is Op.ALLOCA:
        return counts.get(s, 0) == 0
    if op is Op.LOCAL_STORE:
        return s.args[0] not in loaded
    if op is Op.IF:
        return all(len(b) == 0 for b in s.blocks)
    if op is Op.RANGE_FOR:
        return len(s.blocks[0]) == 0
    return False
