"""Constant folding and algebraic simplification.

Folding evaluates an ALU op whose operands are all CONSTs with the reference semantics table, so
the folded value is the float32 / wrapped-int result the GPU computes (transcendentals: NumPy's
float32 value). Results that are inf or NaN are not folded: WGSL has no literal for them.

Identities are applied only where they are exact for every input, NaN, inf and -0.0 included:
  floats: x * 1.0, 1.0 * x, x / 1.0, x - 0.0, x + (-0.0), -(-x)  ->  x
          (NOT x + 0.0: -0.0 + 0.0 is +0.0; NOT x * 0.0: NaN and inf; NOT x - x)
  ints:   x + 0, x - 0, x * 1, x / 1, x // 1, x | 0, x ^ 0, x & -1, x << 0, x >> 0, x | x, x & x
          -> x;  x % n -> x where a loop's range proves 0 <= x < n (`for i in range(n)`: i % n);
          x + (y - x), (y - x) + x -> y;  x * 0, x & 0, x % 1, x - x, x ^ x -> 0;  x == x etc. -> constant
  bools:  x and True, x or False, x and x, x or x, not not x -> x;  x and False -> False, ...
  select with a constant condition or equal branches; cast to the operand's own type.
An IF with a constant condition is replaced by the statements of the taken block (BREAK and
CONTINUE inside keep referring to the same enclosing loop); a RANGE_FOR with constant bounds that
runs no iteration is removed.
"""
from __future__ import annotations

import math

import numpy as np

from ..ir.nodes import Block, Kernel, Stmt
from ..ir.ops import GroupOp, Op
from ..ir.semantics import evaluate
from ..ir.utils import adopt_name, const_value, make_const
from ..types import u1


def constant_fold(kernel: Kernel) -> Kernel:
    for task in kernel.tasks:
        repl: dict[Stmt, Stmt] = {}
        _fold_block(task.bounds, repl)
        _fold_block(task.body, repl)
        task.begin = repl.get(task.begin, task.begin)
        task.end = repl.get(task.end, task.end)
    return kernel


def _fold_block(block: Block, repl: dict[Stmt, Stmt]) -> None:
    """Folds a block in program order; `repl` maps removed statements to their replacement
    (always an earlier statement, which dominates every later use)."""
    out: list[Stmt] = []
    work = list(reversed(block.stmts))  # a stack, so an inlined block is folded next
    while work:
        s = work.pop()
        if repl:
            s.args = [repl.get(a, a) for a in s.args]
            if s.index is not None:  # the access analyses read multi-indices: keep them current
                s.index = tuple(repl.get(x, x) if isinstance(x, Stmt) else x for x in s.index)
        op = s.op
        if op is Op.IF and s.args[0].op is Op.CONST:
            taken = 0 if s.args[0].attr else 1
            if taken < len(s.blocks):
                work.extend(reversed(s.blocks[taken].stmts))
            continue
        if op is Op.RANGE_FOR and all(a.op is Op.CONST for a in s.args):
            if int(s.args[0].attr) >= int(s.args[1].attr):
                continue  # no iteration
        for b in s.blocks:
            _fold_block(b, repl)
        if op in GroupOp.ALU:
            new = simplify_stmt(s)
            if new is not None:
                repl[s] = new
                if new.name is None:
                    adopt_name(new, s.name)
                continue
        out.append(s)
    block.stmts[:] = out


def simplify_stmt(s: Stmt) -> Stmt | None:
    """Fold or simplify one ALU statement. Returns an existing statement that replaces `s`, or
    None when `s` stays (possibly turned into a CONST in place)."""
    args = s.args
    if all(a.op is Op.CONST for a in args):
        try:
            value = evaluate(s.op, s.dtype, *[const_value(a) for a in args])
        except TypeError:
            return None  # ill-typed: leave it for the verifier / runtime to report
        if isinstance(value, np.floating) and not math.isfinite(value):
            return None
        make_const(s, value)
        return None
    rule = _RULES.get(s.op)
    if rule is None:
        return None
    new = rule(s, *args)
    if new is None or new is s:
        return None
    if isinstance(new, Stmt):
        return new if new.dtype == s.dtype else None
    make_const(s, new[0])  # a 1-tuple: the constant value s becomes
    return None


# ---- identity rules: (stmt, *args) -> replacement Stmt, (const value,), or None ------------

def _c(s: Stmt, value) -> bool:
    """s is a CONST equal to value; floats compare bits, so 0.0 and -0.0 differ."""
    if s.op is not Op.CONST:
        return False
    v = const_value(s)
    if isinstance(v, np.floating):
        return v.tobytes() == v.dtype.type(value).tobytes()
    return v == value


def _is_int(s: Stmt) -> bool:
    return s.dtype is not None and s.dtype.is_int


def _all_ones(s: Stmt) -> bool:
    return s.op is Op.CONST and _is_int(s) and (int(s.attr) & 0xFFFFFFFF) == 0xFFFFFFFF


def _add(s, a, b):
    if _is_int(s):
        # x + (y - x) -> y (wrapping arithmetic): a flattened (i, j) loop's i * n + (k - i * n)
        if b.op is Op.SUB and b.args[1] is a and b.args[0].dtype == s.dtype:
            return b.args[0]
        if a.op is Op.SUB and a.args[1] is b and a.args[0].dtype == s.dtype:
            return a.args[0]
        return b if _c(a, 0) else a if _c(b, 0) else None
    return b if _c(a, -0.0) else a if _c(b, -0.0) else None


def _sub(s, a, b):
    if _is_int(s):
        if a is b:
            return (0,)
        return a if _c(b, 0) else None
    return a if _c(b, 0.0) else None


def _mul(s, a, b):
    if _c(b, 1):
        return a
    if _c(a, 1):
        return b
    if _is_int(s) and (_c(a, 0) or _c(b, 0)):
        return (0,)
    return None


def _div(s, a, b):
    return a if _c(b, 1) else None


def _floordiv(s, a, b):
    return a if _is_int(s) and _c(b, 1) else None


def _mod(s, a, b):
    if not _is_int(s):
        return None
    if _c(b, 1):
        return (0,)
    return a if _below(a, b) else None  # i % n with 0 <= i < n (a loop's range): i


def _below(a: Stmt, b: Stmt) -> bool:
    """0 <= a < b for every value a takes, proven from loop ranges: a loop index whose loop starts
    at a constant >= 0 and ends at b itself (`for i in range(n)`), or integer bounds of a (_bounds)
    below a positive constant b."""
    if b.op is Op.CONST:
        r = _bounds(a)
        return r is not None and r[0] >= 0 and r[1] < int(b.attr)
    if a.op is Op.LOOP_INDEX:
        lo, hi = _loop_range(a)
        return lo is not None and lo.op is Op.CONST and int(lo.attr) >= 0 and _same_value(hi, b)
    return False


def _loop_range(i: Stmt) -> tuple:
    """(begin, end) statements of the loop a LOOP_INDEX counts: a serial loop's arguments, or a
    range task's bounds (its threads' indices)."""
    loop = i.attr
    if isinstance(loop, Stmt):
        return (loop.args[0], loop.args[1]) if loop.op is Op.RANGE_FOR else (None, None)
    return (getattr(loop, "begin", None), getattr(loop, "end", None))


def _same_value(a: Stmt | None, b: Stmt) -> bool:
    return a is b or (a is not None and a.op is b.op is Op.ARG and a.attr == b.attr and a.dtype == b.dtype)


def _bounds(a: Stmt, depth: int = 0) -> tuple | None:
    """Inclusive integer bounds (lo, hi) of a's values, from constants and constant loop ranges
    through +, -, * and // by constants; None when unknown."""
    if depth > 8 or a.dtype is None or not a.dtype.is_int:
        return None
    if a.op is Op.CONST:
        return int(a.attr), int(a.attr)
    if a.op is Op.LOOP_INDEX:
        lo, hi = _loop_range(a)
        if lo is None or hi is None or lo.op is not Op.CONST or hi.op is not Op.CONST:
            return None
        return (int(lo.attr), int(hi.attr) - 1) if int(hi.attr) > int(lo.attr) else None
    if a.op not in (Op.ADD, Op.SUB, Op.MUL, Op.FLOORDIV) or len(a.args) != 2:
        return None
    x, y = a.args
    if a.op is Op.SUB and y.op is Op.MUL and y.args[1].op is Op.CONST and y.args[0].op is Op.FLOORDIV \
            and y.args[0].args[0] is x and _c(y.args[0].args[1], int(y.args[1].attr)) and int(y.args[1].attr) > 0:
        rx = _bounds(x, depth + 1)  # x - (x // e) * e: x mod e, an ndrange's inner index
        return (0, int(y.args[1].attr) - 1) if rx is not None and rx[0] >= 0 else None
    rx, ry = _bounds(x, depth + 1), _bounds(y, depth + 1)
    if rx is None or ry is None:
        return None
    if a.op is Op.ADD:
        out = rx[0] + ry[0], rx[1] + ry[1]
    elif a.op is Op.SUB:
        out = rx[0] - ry[1], rx[1] - ry[0]
    elif a.op is Op.MUL:
        p = [u * v for u in rx for v in ry]
        out = min(p), max(p)
    elif ry[0] == ry[1] and ry[0] > 0 and rx[0] >= 0:  # // by a positive constant
        out = rx[0] // ry[0], rx[1] // ry[0]
    else:
        return None
    return out if -2**31 <= out[0] and out[1] < 2**31 else None  # no wrapping in between


def _bit_and(s, a, b):
    if s.dtype == u1:
        return _and(s, a, b)
    if a is b:
        return a
    if _c(a, 0) or _c(b, 0):
        return (0,)
    return b if _all_ones(a) else a if _all_ones(b) else None


def _bit_or(s, a, b):
    if s.dtype == u1:
        return _or(s, a, b)
    if a is b:
        return a
    if _all_ones(a) or _all_ones(b):
        return (-1,)
    return b if _c(a, 0) else a if _c(b, 0) else None


def _bit_xor(s, a, b):
    if s.dtype == u1:
        return (False,) if a is b else None
    if a is b:
        return (0,)
    return b if _c(a, 0) else a if _c(b, 0) else None


def _shift(s, a, b):
    return a if b.op is Op.CONST and int(b.attr) & 31 == 0 else None


def _and(s, a, b):
    if a is b:
        return a
    if _c(a, False) or _c(b, False):
        return (False,)
    return b if _c(a, True) else a if _c(b, True) else None


def _or(s, a, b):
    if a is b:
        return a
    if _c(a, True) or _c(b, True):
        return (True,)
    return b if _c(a, False) else a if _c(b, False) else None


def _involution(s, x):
    return x.args[0] if x.op is s.op else None  # not not x, -(-x)


def _select(s, c, a, b):
    if c.op is Op.CONST:
        return a if c.attr else b
    if a is b:
        return a
    if s.dtype == u1 and _c(a, True) and _c(b, False):
        return c
    return None


def _cast(s, x):
    return x if x.dtype == s.dtype else None


def _self_compare(result: bool):
    def rule(s, a, b):
        return (result,) if a is b and _is_int(a) else None  # floats: NaN != NaN
    return rule


def _self_minmax(s, a, b):
    return a if a is b and _is_int(s) else None


_RULES = {
    Op.ADD: _add, Op.SUB: _sub, Op.MUL: _mul, Op.DIV: _div, Op.FLOORDIV: _floordiv, Op.MOD: _mod,
    Op.BIT_AND: _bit_and, Op.BIT_OR: _bit_or, Op.BIT_XOR: _bit_xor, Op.SHL: _shift, Op.SHR: _shift,
    Op.AND: _and, Op.OR: _or, Op.NOT: _involution, Op.NEG: _involution, Op.SELECT: _select,
    Op.CAST: _cast, Op.MIN: _self_minmax, Op.MAX: _self_minmax,
    Op.EQ: _self_compare(True), Op.LE: _self_compare(True), Op.GE: _self_compare(True),
    Op.NE: _self_compare(False), Op.LT: _self_compare(False), Op.GT: _self_compare(False),
}
