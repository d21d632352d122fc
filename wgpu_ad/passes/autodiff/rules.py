"""Derivatives, one table for both modes.

PARTIALS[op](d, *operands, r) gives the partial derivative of the op's result `r` with respect to
each operand, written like the math: `Op.SIN: [cos x]`, `Op.MUL: [y, x]`. `d` is the emitter
(reverse.py AdjointEmitter or forward.py TangentEmitter); its helpers emit at its position. From
these two things are derived, for every op alike:
  reverse mode, adjoint(): operand k receives g * partial_k (g: the result's incoming adjoint);
  forward mode, tangent(): the result's tangent is the sum over k of partial_k * (operand k's tangent).
A partial is a statement, or one of:
  None            the operand gets no derivative (a select's condition, an integer cast's operand);
  ONE             1: g itself is passed on (no multiplication);
  minus(p)        -p: g * p is negated (g * -1 is neg(g); a tangent term is subtracted);
  over(p)         1 / p: g is divided by p (one rounding: g / (1 + x^2), not g * (1 / (1 + x^2)));
  d.lazy(fn)      built only where it is needed (d/dy of x**y when y varies).

OWN_RULES holds the few ops whose adjoint and tangent are written by hand, each with the reason.
ZERO holds the ops with a zero derivative (piecewise constant, integer or boolean). Every ALU op
is in exactly one of PARTIALS, OWN_RULES and ZERO (tests/test_op_tables.py names the one missing).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...ir.ops import GroupOp, Op
from ...types import f32


def active_values(stmts: list, source, active: set) -> None:
    """Activity analysis shared by both modes: adds to `active` the ids of the f32 values among
    `stmts` that depend on a differentiated input, and of the mutable locals that store them, to a
    fixpoint (a loop's later iterations). source(s): whether a global load or an atomic is such an
    input (reverse mode: a load of a buffer with a gradient; forward mode: with a dual)."""
    changed = True
    while changed:
        changed = False
        for s in stmts:
            if id(s) in active:
                continue
            act = False
            if s.op in (Op.GLOBAL_LOAD, Op.ATOMIC):
                act = s.dtype == f32 and source(s)
            elif s.op is Op.LOCAL_LOAD:
                act = id(s.args[0]) in active
            elif s.op is Op.LOCAL_STORE:
                if id(s.args[1]) in active and id(s.args[0]) not in active:
                    active.add(id(s.args[0]))
                    changed = True
                continue
            elif s.op in GroupOp.ALU and s.op not in ZERO:
                act = s.dtype == f32 and any(id(a) in active for a in s.args)
            if act:
                active.add(id(s))
                changed = True


class Lazy:
    """A factor built only when it is needed (d/dy of x**y): an adjoint the operand needs, a
    tangent that is not zero."""

    def __init__(self, fn):
        self.fn = fn


def force(v):
    return v.fn() if isinstance(v, Lazy) else v


class _One:
    def __repr__(self) -> str:
        return "ONE"


ONE = _One()


@dataclass(frozen=True)
class minus:
    """The partial -p."""
    p: object


@dataclass(frozen=True)
class over:
    """The partial 1 / p."""
    p: object


class RuleBuilder:
    """What the rules below call on both emitters (reverse.py AdjointEmitter, forward.py
    TangentEmitter) besides their own arithmetic: statements at the builder's position `self.b`."""

    def emit(self, op, args, dtype=None):
        return self.b.emit(op, args, dtype)

    def const(self, v, dtype=f32):
        return self.b.const(v, dtype)

    @property
    def zero(self):
        return self.const(0.0)

    @property
    def one(self):
        return self.const(1.0)

    @property
    def half(self):
        return self.const(0.5)

    def lazy(self, fn):
        return Lazy(fn)


def _sech2(d, e):
    s = d.add(d.one, e)
    return d.div(d.mul(d.const(4.0), e), d.mul(s, s))


PARTIALS: dict[Op, Callable] = {
    Op.NEG: lambda d, x, r: [minus(ONE)],
    Op.ABS: lambda d, x, r: [d.emit(Op.SIGN, [x])],
    Op.SIN: lambda d, x, r: [d.emit(Op.COS, [x])],
    Op.COS: lambda d, x, r: [minus(d.emit(Op.SIN, [x]))],
    Op.TAN: lambda d, x, r: [d.add(d.one, d.mul(r, r))],                              # 1 + tan^2 x
    # 1 / sqrt(1 - x^2), factored: exact near +-1, where 1 - x^2 cancels (5e-4 of it at 0.9999)
    Op.ASIN: lambda d, x, r: [d.emit(Op.RSQRT, [d.mul(d.sub(d.one, x), d.add(d.one, x))])],
    Op.ACOS: lambda d, x, r: [minus(d.emit(Op.RSQRT, [d.mul(d.sub(d.one, x), d.add(d.one, x))]))],
    Op.ATAN: lambda d, x, r: [over(d.add(d.one, d.mul(x, x)))],                       # 1 / (1 + x^2)
    # 1 - tanh^2 x = 4 e / (1 + e)^2, e = exp(-2 |x|): 1 - r^2 keeps only the error of r where
    # tanh x is near 1 (3e-4 of it at x = 5, 0 instead of 6e-8 at x = 9)
    Op.TANH: lambda d, x, r: [_sech2(d, d.emit(Op.EXP, [d.mul(d.const(-2.0), d.emit(Op.ABS, [x]))]))],
    Op.EXP: lambda d, x, r: [r],
    Op.LOG: lambda d, x, r: [over(x)],
    Op.RSQRT: lambda d, x, r: [d.mul(d.const(-0.5), d.mul(r, d.mul(r, r)))],          # -x^(-3/2) / 2
    Op.ASINH: lambda d, x, r: [d.emit(Op.RSQRT, [d.add(d.one, d.mul(x, x))])],        # 1 / sqrt(1 + x^2)
    # 1 / sqrt(x^2 - 1) and 1 / (1 - x^2), factored: exact near 1, where x^2 - 1 would cancel
    Op.ACOSH: lambda d, x, r: [d.emit(Op.RSQRT, [d.mul(d.sub(x, d.one), d.add(x, d.one))])],
    Op.ATANH: lambda d, x, r: [over(d.mul(d.sub(d.one, x), d.add(d.one, x)))],
    Op.LOG1P: lambda d, x, r: [over(d.add(d.one, x))],                                # 1 / (1 + x)
    Op.EXPM1: lambda d, x, r: [d.emit(Op.EXP, [x])],               # e^x (expm1 x + 1 cancels for x << 0)
    Op.CAST: lambda d, x, r: [ONE if x.dtype == f32 else None],  # from an integer: no derivative
    Op.ADD: lambda d, x, y, r: [ONE, ONE],
    Op.SUB: lambda d, x, y, r: [ONE, minus(ONE)],
    Op.MUL: lambda d, x, y, r: [y, x],
    # d/dx x^y = y x^(y-1); d/dy x^y = x^y log x (only built where y varies)
    Op.POW: lambda d, x, y, r: [d.mul(y, d.emit(Op.POW, [x, d.sub(y, d.one)])),
                                d.lazy(lambda: d.mul(r, d.emit(Op.LOG, [x])))],
    # x mod y = x - y floor(x / y)
    Op.MOD: lambda d, x, y, r: [ONE, minus(d.lazy(lambda: d.emit(Op.FLOOR, [d.div(x, y)])))],
}


def _times(d, t, p):
    """t * p for a tangent or adjoint t and a partial p (None: zero), as PARTIALS reads."""
    if t is None or p is None:
        return None
    if p is ONE:
        return t
    if isinstance(p, minus):
        inner = _times(d, t, p.p)
        return Lazy(lambda: d.neg(force(inner))) if isinstance(inner, Lazy) else d.neg(inner)
    if isinstance(p, over):
        return d.div(t, p.p)
    if isinstance(p, Lazy):
        return Lazy(lambda: _times(d, t, p.fn()))
    return d.mul(t, p)


def _strong_zero(d, g, v):
    """v, a derivative term proportional to g, or 0 where g is exactly 0: sqrt's 1 / sqrt(0) is
    inf, and 0 * inf would make NaN of a zero adjoint or tangent (|a|**2 at a = 0, a root whose
    argument no input moves). None (forward mode's zero tangent) stays None."""
    if g is None or v is None:
        return None
    return d.select(d.emit(Op.NE, [g, d.zero]), v, d.zero)


def _div_adjoint(d, x, y, r, g):
    inv = d.div(d.one, y)  # one reciprocal per divisor (see SQRT)
    return [_strong_zero(d, g, d.mul(g, inv)), _strong_zero(d, g, d.neg(d.mul(d.mul(g, r), inv)))]


def _cmp_select(d, op, x, y, g):
    """(g, 0) where x op y holds, else (0, g): min/max send the adjoint to the chosen operand."""
    c = d.emit(op, [x, y])
    return [d.select(c, g, d.zero), d.select(c, d.zero, g)]


@dataclass(frozen=True)
class Own:
    """An op's hand-written rules: adjoint(d, *operands, r, g) -> one contribution per operand;
    tangent(d, *operands, r, *operand_tangents) -> the result's tangent; why not PARTIALS."""
    adjoint: Callable
    tangent: Callable
    why: str


OWN_RULES: dict[Op, Own] = {
    Op.SQRT: Own(
        lambda d, x, r, g: [_strong_zero(d, g, d.mul(d.mul(g, d.half), d.div(d.one, r)))],
        lambda d, x, r, dx: _strong_zero(d, dx, d.mul(d.mul(dx, d.half), d.lazy(lambda: d.div(d.one, r)))),
        why="1 / (2 sqrt x) is inf at x = 0: a term whose adjoint or tangent is exactly 0 is left out "
            "(|v| at v = 0, fuzz); 1 / sqrt x is the reciprocal a division by the root shares (CSE)"),
    Op.DIV: Own(
        _div_adjoint,
        # (dx - r dy) / y, with the reciprocal the adjoint shares
        lambda d, x, y, r, dx, dy: d.mul(d.sub(dx, d.mul(r, dy)), d.lazy(lambda: d.div(d.one, y))),
        why="adjoint: 1 / y and -x / y^2 are inf at y = 0, a term with a zero adjoint is left out "
            "(ti.select(m > 0, v / m, 0.0) at m = 0, seed 000); tangent: one reciprocal for both terms"),
    Op.ATAN2: Own(
        lambda d, y, x, r, g: [d.div(d.mul(g, x), d.add(d.mul(x, x), d.mul(y, y))),
                               d.neg(d.div(d.mul(g, y), d.add(d.mul(x, x), d.mul(y, y))))],
        lambda d, y, x, r, dy, dx: d.div(d.sub(d.mul(x, dy), d.mul(y, dx)), d.add(d.mul(x, x), d.mul(y, y))),
        why="g x / (x^2 + y^2) and (x dy - y dx) / (x^2 + y^2) divide once, after the product; "
            "the partials x / (x^2 + y^2) would round differently"),
    Op.MIN: Own(
        lambda d, x, y, r, g: _cmp_select(d, Op.LE, x, y, g),
        lambda d, x, y, r, dx, dy: d.select(d.emit(Op.LE, [x, y]), dx, dy),
        why="routes the adjoint or tangent to the chosen operand (the first on a tie) with a select; "
            "g * 0 for the other would be NaN for an infinite g"),
    Op.MAX: Own(
        lambda d, x, y, r, g: _cmp_select(d, Op.GE, x, y, g),
        lambda d, x, y, r, dx, dy: d.select(d.emit(Op.GE, [x, y]), dx, dy),
        why="as MIN"),
    Op.SELECT: Own(
        lambda d, c, x, y, r, g: [None, d.select(c, g, d.zero), d.select(c, d.zero, g)],
        lambda d, c, x, y, r, dc, dx, dy: d.select(c, dx, dy),
        why="as MIN: the branch not taken gets 0, not 0 * g (NaN for an infinite g)"),
}


# ops whose partials are not finite at some finite operands (log at 0, asin at 1, x**y at x = 0,
# atan2 at the origin, ...): there a term whose adjoint or tangent is exactly 0 is left out, as
# sqrt and / do in OWN_RULES, because g * inf would make NaN of a branch that does not reach the
# result (ti.select(z > 0, ti.log(z), 0.0) at z = 0). nancheck.py DOMAIN tests these points only
# where g is not 0.
SINGULAR = frozenset({Op.LOG, Op.LOG1P, Op.RSQRT, Op.ASIN, Op.ACOS, Op.ACOSH, Op.ATANH, Op.POW,
                      Op.MOD, Op.ATAN2})


def _guarded(d, t, term):
    """_strong_zero for a term that may be Lazy (built only where it is needed)."""
    if isinstance(term, Lazy):
        return Lazy(lambda: _strong_zero(d, t, force(term)))
    return _strong_zero(d, t, term)


def adjoint(d, op: Op, ops: list, r, g) -> list:
    """The contributions of statement op(*ops) = r with incoming adjoint g to its operands (None:
    nothing; a Lazy: built only when the operand needs it)."""
    own = OWN_RULES.get(op)
    out = own.adjoint(d, *ops, r, g) if own is not None else [_times(d, g, p) for p in PARTIALS[op](d, *ops, r)]
    return [_guarded(d, g, c) for c in out] if op in SINGULAR else out


def tangent(d, op: Op, ops: list, r, tangents: list):
    """The tangent of statement op(*ops) = r given its operands' tangents (None: zero)."""
    own = OWN_RULES.get(op)
    if own is not None:
        if op in SINGULAR:  # one term per operand with a tangent: each left out where that tangent is 0
            acc = None
            for k, t in enumerate(tangents):
                if t is not None:
                    alone = [t if j == k else None for j in range(len(tangents))]
                    acc = d.add(acc, _strong_zero(d, t, force(own.tangent(d, *ops, r, *alone))))
            return acc
        return own.tangent(d, *ops, r, *tangents)
    acc = None
    for p, t in zip(PARTIALS[op](d, *ops, r), tangents):
        if isinstance(p, minus):
            term = force(_times(d, t, p.p))
            acc = d.sub(acc, _strong_zero(d, t, term) if op in SINGULAR else term)
        else:
            term = force(_times(d, t, p))
            acc = d.add(acc, _strong_zero(d, t, term) if op in SINGULAR else term)
    return acc


# ops whose contributions are the incoming adjoint itself, negated, times a sign or zero: finite
# wherever it is, so the NaN check (nancheck.py) does not test them
PASS_THROUGH = frozenset({Op.NEG, Op.ABS, Op.CAST, Op.ADD, Op.SUB, Op.MIN, Op.MAX, Op.SELECT})

# zero derivative almost everywhere, or not real-valued
ZERO = GroupOp.NotDifferentiable | frozenset({Op.FLOORDIV})

DIFFERENTIABLE = frozenset(PARTIALS) | frozenset(OWN_RULES)

assert not (set(PARTIALS) & set(OWN_RULES)), "an op has both partials and hand-written rules"
assert not (DIFFERENTIABLE & ZERO), "an op is both differentiable and zero-gradient"
