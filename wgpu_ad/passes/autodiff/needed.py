"""Which primal values the adjoint reads: a read no derivative needs needs no copy.

The adjoint (reverse.py) replays the forward for two things only: the values its rules' partial
derivatives read (`Op.MUL: [y, x]`: the factor of each operand is the other; `Op.SIN: [cos x]`)
and the values that steer it (branch conditions, loop bounds, the indices it accumulates
gradients at). Everything else the replay computes is dead. A global load whose value reaches
none of these (it is only copied, added, selected, stored or scaled by a constant) may read any
value in the replay: its adjoint is the same.

So a read that an update of the same thread overwrites later in the launch (promote.py
snapshot_loads: `x[i] = 2.0 * x[i]`, the value a promoted element starts a loop with, a field
element a conditional store inside a serial loop may or may not replace) needs no copy of the
field taken before the launch when its value is not needed: the kernel is not "updated in place"
for the launcher (no copy, and `kernel.grad()` works without a forward launch right before it).
The order of the gradients is still the program's (the reads and the overwrite are the same
thread's, which the adjoint walks backwards), which is why only those reads are exempt.

The analysis assumes every float value may be active (the gradients are not known yet).
"""
from __future__ import annotations

from ...ir.nodes import Kernel, Stmt, walk
from ...ir.ops import AtomicKind, GroupOp, Op
from .rules import ZERO

_LINEAR = frozenset({Op.ADD, Op.SUB, Op.NEG, Op.CAST})  # partials are constants (ONE, minus ONE)
_NOT_REPLAYED = frozenset({Op.RETURN, Op.ASSERT, Op.PRINT})


def _operands_read(s: Stmt) -> list:
    """The operands of `s` whose values the adjoint reads (besides those needed to recompute `s`
    itself, when its own value is needed)."""
    op = s.op
    if op is Op.IF:
        return [s.args[0]]
    if op is Op.RANGE_FOR:
        return list(s.args)
    if op in (Op.GLOBAL_LOAD, Op.GLOBAL_STORE):
        return [s.args[0]]
    if op is Op.ATOMIC:  # min / max: the adjoint compares the value with the field's final one
        return [s.args[0]] if s.attr[0] in (AtomicKind.ADD, AtomicKind.SUB) else list(s.args)
    if op in (Op.LOCAL_LOAD, Op.LOCAL_STORE, Op.ALLOCA, Op.LOOP_INDEX, Op.CONST, Op.ARG, Op.WHILE,
              Op.BREAK, Op.CONTINUE) or op in _NOT_REPLAYED:
        return []
    if op in GroupOp.ALU:
        if s.dtype is None or not s.dtype.is_float or op in ZERO or op in _LINEAR:
            return []  # no derivative, or a constant one
        if op is Op.SELECT:
            return [s.args[0]]
        if op is Op.MUL:  # d(x y) = y dx + x dy: each factor is read for the other's derivative
            x, y = s.args
            return [a for a, other in ((x, y), (y, x)) if other.op is not Op.CONST]
        return list(s.args)
    return list(s.args)  # anything else: all of them, to be safe


def unneeded_loads(kernel: Kernel) -> set[int]:
    """Ids of the global loads of `kernel` whose values the adjoint never reads."""
    stmts = [s for t in kernel.tasks for blk in (t.bounds, t.body) for s in walk(blk)]
    stores: dict[int, list] = {}
    for s in stmts:
        if s.op is Op.LOCAL_STORE:
            stores.setdefault(id(s.args[0]), []).append(s.args[1])
    needed: set[int] = set()
    work = [a for s in stmts for a in _operands_read(s)]
    while work:
        v = work.pop()
        if not isinstance(v, Stmt) or id(v) in needed:
            continue
        needed.add(id(v))
        if v.op is Op.LOCAL_LOAD:  # a variable's value is whatever was stored to it
            work.extend(stores.get(id(v.args[0]), ()))
        else:
            work.extend(v.args)  # recomputing v reads its operands
    return {id(s) for s in stmts if s.op is Op.GLOBAL_LOAD and id(s) not in needed}
