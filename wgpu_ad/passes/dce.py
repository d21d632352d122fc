"""Dead code elimination.

Removes, until nothing changes:
  - statements after a BREAK / CONTINUE / RETURN in the same block (never executed; every use of
    their values is after them in that block, so unreachable too);
  - pure values and memory reads whose value is unused;
  - local variables that are never read: the ALLOCA and all its stores;
  - IFs with two empty blocks and RANGE_FORs with an empty body (their operands are pure values);
  - then, in one mark-and-sweep, whatever no effect needs (`_useful`): a variable read only to
    compute what is stored back into it or into other such variables (`f += spring(k)` in an
    adjoint's replay whose result is not needed) goes with all its stores, and IFs and RANGE_FORs
    with nothing needed inside. The sweep above cannot see those cycles.
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
    useful = _useful(kernel)
    for task in kernel.tasks:
        _drop_useless(task.body, useful)
        _drop_useless(task.bounds, useful)
    return kernel


_REMOVABLE = PURE | READS | frozenset({Op.ALLOCA, Op.LOCAL_STORE, Op.IF, Op.RANGE_FOR})


def _useful(kernel: Kernel) -> set:
    """The statements some effect needs: the effects, their operands, the stores of the variables
    they read, the IFs and loops around them, transitively."""
    parent: dict[Stmt, Stmt] = {}
    stores: dict[Stmt, list] = {}
    todo: list = []

    def scan(block: Block, around: Stmt | None) -> None:
        for s in block.stmts:
            if around is not None:
                parent[s] = around
            if s.op is Op.LOCAL_STORE:
                stores.setdefault(s.args[0], []).append(s)
            if s.op not in _REMOVABLE:
                todo.append(s)
            for b in s.blocks:
                scan(b, s)
    for t in kernel.tasks:
        for blk in (t.bounds, t.body, t.epilogue):
            scan(blk, None)
        todo.extend(a for a in (t.begin, t.end) if a is not None)
        todo.extend(t.epilogue.stmts)
    useful: set = set()
    while todo:
        s = todo.pop()
        if s in useful:
            continue
        useful.add(s)
        for k, a in enumerate(s.args):
            todo.append(a)
            if a.op is Op.ALLOCA and not (k == 0 and s.op is Op.LOCAL_STORE):
                todo.extend(stores.get(a, ()))  # the variable is read: all its stores count
        if s in parent:
            todo.append(parent[s])
        if isinstance(s.attr, Stmt):  # a serial loop's index: the loop
            todo.append(s.attr)
    return useful


def _drop_useless(block: Block, useful: set) -> None:
    block.stmts[:] = [s for s in block.stmts if s in useful or s.op not in _REMOVABLE]
    for s in block.stmts:
        for b in s.blocks:
            _drop_useless(b, useful)


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
