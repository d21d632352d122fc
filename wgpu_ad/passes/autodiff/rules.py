"""Adjoint rules, one per differentiable op, written like the math.

A rule gets the AdjointEmitter `d`, the primal statement `s` (its replayed operands are `x`, `y`,
`z` and its replayed result `r`) and the incoming adjoint `g`, and returns one contribution per
operand (None where the operand gets nothing). Ops with a zero derivative (piecewise constant,
integer or boolean) are listed in ZERO; every ALU op must be in exactly one of the two tables.
"""
from __future__ import annotations

from ...ir.ops import GroupOp, Op


def _cmp_select(d, op, x, y, g):
    """(g, 0) where x op y holds, else (0, g): min/max send the adjoint to the chosen operand."""
    c = d.emit(op, [x, y])
    return [d.select(c, g, d.zero), d.select(c, d.zero, g)]


def _div(d, x, y, r, g):
    inv = d.div(d.one, y)  # one reciprocal per divisor (see SQRT)
    return [d.mul(g, inv), d.neg(d.mul(d.mul(g, r), inv))]


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
    Op.SQRT: lambda d, x, r, g: [d.mul(d.mul(g, d.half), d.div(d.one, r))],
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

# rules whose contributions are the incoming adjoint itself, negated, times a sign or zero: finite
# wherever it is, so the NaN check (nancheck.py) does not test them
PASS_THROUGH = frozenset({Op.NEG, Op.ABS, Op.CAST, Op.ADD, Op.SUB, Op.MIN, Op.MAX, Op.SELECT})

# zero derivative almost everywhere, or not real-valued
ZERO = GroupOp.NotDifferentiable | frozenset({Op.FLOORDIV})

assert not (set(RULES) & ZERO), "an op is both differentiable and zero-gradient"
