"""Derivative rules, one per differentiable op, written like the math: the adjoint (RULES, reverse
mode) and the tangent (JVP, forward mode) of each op side by side.

An adjoint rule gets the AdjointEmitter `d`, the primal statement's replayed operands `x`, `y`,
`z`, its replayed result `r` and the incoming adjoint `g`, and returns one contribution per
operand (None where the operand gets nothing).

A tangent rule gets the TangentEmitter `d` (passes/autodiff/forward.py), the operands, the result
`r` and then the operands' tangents `dx`, `dy`, `dz`, and returns the result's tangent. A tangent
may be None, meaning zero: the emitter's arithmetic treats it so (`d.mul(None, c)` is None,
`d.add(None, t)` is t), so a rule is written once for every combination of varying operands.

Ops with a zero derivative (piecewise constant, integer or boolean) are listed in ZERO; every ALU
op must be in exactly one of RULES and ZERO, and in exactly one of JVP and ZERO (tests check it).
"""
from __future__ import annotations

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


def _cmp_select(d, op, x, y, g):
    """(g, 0) where x op y holds, else (0, g): min/max send the adjoint to the chosen operand."""
    c = d.emit(op, [x, y])
    return [d.select(c, g, d.zero), d.select(c, d.zero, g)]


def _strong_zero(d, g, v):
    """v, a derivative term proportional to g, or 0 where g is exactly 0: sqrt's 1 / sqrt(0) is
    inf, and 0 * inf would make NaN of a zero adjoint or tangent (|a|**2 at a = 0, a root whose
    argument no input moves). None (forward mode's zero tangent) stays None."""
    if g is None or v is None:
        return None
    return d.select(d.emit(Op.NE, [g, d.zero]), v, d.zero)


def _div(d, x, y, r, g):
    """x / y: 1 / y and -x / y^2, both infinite at y = 0. A zero adjoint contributes zero there
    (_strong_zero): ti.select(m > 0, v / m, 0.0) at m = 0 sends 0 to the division, and its
    gradient is then 0, not 0 * inf = NaN (seed 000)."""
    inv = d.div(d.one, y)  # one reciprocal per divisor (see SQRT)
    return [_strong_zero(d, g, d.mul(g, inv)), _strong_zero(d, g, d.neg(d.mul(d.mul(g, r), inv)))]


RULES = {
    Op.NEG: lambda d, x, r, g: [d.neg(g)],
    Op.ABS: lambda d, x, r, g: [d.mul(g, d.emit(Op.SIGN, [x]))],
    Op.SIN: lambda d, x, r, g: [d.mul(g, d.emit(Op.COS, [x]))],
    Op.COS: lambda d, x, r, g: [d.neg(d.mul(g, d.emit(Op.SIN, [x])))],
    Op.TAN: lambda d, x, r, g: [d.mul(g, d.add(d.one, d.mul(r, r)))],
    Op.ASIN: lambda d, x, r, g: [d.mul(g, d.emit(Op.RSQRT, [d.sub(d.one, d.mul(x, x))]))],
    Op.ACOS: lambda d, x, r, g: [d.neg(d.mul(g, d.emit(Op.RSQRT, [d.sub(d.one, d.mul(x, x))])))],
    Op.ATAN: lambda d, x, r, g: [d.div(g, d.add(d.one, d.mul(x, x)))],
    Op.TANH: lambda d, x, r, g: [d.mul(g, d.sub(d.one, d.mul(r, r)))],
    Op.EXP: lambda d, x, r, g: [d.mul(g, r)],
    Op.LOG: lambda d, x, r, g: [d.div(g, x)],
    # one reciprocal per divisor, shared by the rules through CSE (1/sqrt(x) of SQRT is the 1/y
    # of a division by that root, as in every 1/|r| potential): fewer divisions in adjoints
    Op.SQRT: lambda d, x, r, g: [_strong_zero(d, g, d.mul(d.mul(g, d.half), d.div(d.one, r)))],
    Op.RSQRT: lambda d, x, r, g: [d.mul(g, d.mul(d.const(-0.5), d.mul(r, d.mul(r, r))))],
    Op.CAST: lambda d, x, r, g: [d.cast_adjoint(g, x)],
    Op.ADD: lambda d, x, y, r, g: [g, g],
    Op.SUB: lambda d, x, y, r, g: [g, d.neg(g)],
    Op.MUL: lambda d, x, y, r, g: [d.mul(g, y), d.mul(g, x)],
    Op.DIV: _div,
    # d/dx x^y = y x^(y-1); d/dy x^y = x^y log x (only asked for when y is active)
    Op.POW: lambda d, x, y, r, g: [d.mul(g, d.mul(y, d.emit(Op.POW, [x, d.sub(y, d.one)]))),
                                  d.lazy(lambda: d.mul(g, d.mul(r, d.emit(Op.LOG, [x]))))],
    Op.ATAN2: lambda d, y, x, r, g: [d.div(d.mul(g, x), d.add(d.mul(x, x), d.mul(y, y))),
                                    d.neg(d.div(d.mul(g, y), d.add(d.mul(x, x), d.mul(y, y))))],
    Op.MIN: lambda d, x, y, r, g: _cmp_select(d, Op.LE, x, y, g),
    Op.MAX: lambda d, x, y, r, g: _cmp_select(d, Op.GE, x, y, g),
    # x mod y = x - y floor(x / y)
    Op.MOD: lambda d, x, y, r, g: [g, d.lazy(lambda: d.neg(d.mul(g, d.emit(Op.FLOOR, [d.div(x, y)]))))],
    Op.SELECT: lambda d, c, x, y, r, g: [None, d.select(c, g, d.zero), d.select(c, d.zero, g)],
}

# tangents: d r = sum over operands of (d r / d operand) * d operand
JVP = {
    Op.NEG: lambda d, x, r, dx: d.neg(dx),
    Op.ABS: lambda d, x, r, dx: d.mul(dx, d.emit(Op.SIGN, [x])),
    Op.SIN: lambda d, x, r, dx: d.mul(dx, d.emit(Op.COS, [x])),
    Op.COS: lambda d, x, r, dx: d.neg(d.mul(dx, d.emit(Op.SIN, [x]))),
    Op.TAN: lambda d, x, r, dx: d.mul(dx, d.add(d.one, d.mul(r, r))),
    Op.ASIN: lambda d, x, r, dx: d.mul(dx, d.emit(Op.RSQRT, [d.sub(d.one, d.mul(x, x))])),
    Op.ACOS: lambda d, x, r, dx: d.neg(d.mul(dx, d.emit(Op.RSQRT, [d.sub(d.one, d.mul(x, x))]))),
    Op.ATAN: lambda d, x, r, dx: d.div(dx, d.add(d.one, d.mul(x, x))),
    Op.TANH: lambda d, x, r, dx: d.mul(dx, d.sub(d.one, d.mul(r, r))),
    Op.EXP: lambda d, x, r, dx: d.mul(dx, r),
    Op.LOG: lambda d, x, r, dx: d.div(dx, x),
    # one reciprocal per divisor, as in the adjoint rules: 1/sqrt(x) here is the 1/y of DIV's
    # rule when the root divides (every 1/|r| potential), so CSE leaves one division for both
    Op.SQRT: lambda d, x, r, dx: _strong_zero(d, dx, d.mul(d.mul(dx, d.half), d.lazy(lambda: d.div(d.one, r)))),
    Op.RSQRT: lambda d, x, r, dx: d.mul(dx, d.mul(d.const(-0.5), d.mul(r, d.mul(r, r)))),
    Op.CAST: lambda d, x, r, dx: d.cast_tangent(dx, x),
    Op.ADD: lambda d, x, y, r, dx, dy: d.add(dx, dy),
    Op.SUB: lambda d, x, y, r, dx, dy: d.sub(dx, dy),
    Op.MUL: lambda d, x, y, r, dx, dy: d.add(d.mul(dx, y), d.mul(x, dy)),
    # (dx - r dy) / y
    Op.DIV: lambda d, x, y, r, dx, dy: d.mul(d.sub(dx, d.mul(r, dy)), d.lazy(lambda: d.div(d.one, y))),
    # d x^y = y x^(y-1) dx + x^y log(x) dy (the log only where y varies)
    Op.POW: lambda d, x, y, r, dx, dy: d.add(d.mul(dx, d.mul(y, d.emit(Op.POW, [x, d.sub(y, d.one)]))),
                                            d.mul(dy, d.lazy(lambda: d.mul(r, d.emit(Op.LOG, [x]))))),
    Op.ATAN2: lambda d, y, x, r, dy, dx: d.div(d.sub(d.mul(x, dy), d.mul(y, dx)), d.add(d.mul(x, x), d.mul(y, y))),
    # the chosen operand's tangent, with the reverse rules' tie-breaking (the first operand)
    Op.MIN: lambda d, x, y, r, dx, dy: d.select(d.emit(Op.LE, [x, y]), dx, dy),
    Op.MAX: lambda d, x, y, r, dx, dy: d.select(d.emit(Op.GE, [x, y]), dx, dy),
    # x mod y = x - y floor(x / y)
    Op.MOD: lambda d, x, y, r, dx, dy: d.sub(dx, d.mul(dy, d.lazy(lambda: d.emit(Op.FLOOR, [d.div(x, y)])))),
    Op.SELECT: lambda d, c, x, y, r, dc, dx, dy: d.select(c, dx, dy),
}

# rules whose contributions are the incoming adjoint itself, negated, times a sign or zero: finite
# wherever it is, so the NaN check (nancheck.py) does not test them
PASS_THROUGH = frozenset({Op.NEG, Op.ABS, Op.CAST, Op.ADD, Op.SUB, Op.MIN, Op.MAX, Op.SELECT})

# zero derivative almost everywhere, or not real-valued
ZERO = GroupOp.NotDifferentiable | frozenset({Op.FLOORDIV})

assert not (set(RULES) & ZERO), "an op is both differentiable and zero-gradient"
assert not (set(JVP) & ZERO), "an op has a tangent rule and a zero derivative"
