"""Ops on compile-time constants (Python values in a kernel), folded when the kernel compiles.

The value comes from the IR's semantics table (ir/semantics.py SEMANTICS), evaluated in the
precision Python computes in (float64 floats, exact ints); this module adds only what Python's own
rules decide: the type a result has (int / int and int ** -n are floats, floor / ceil / round of
a float are ints, bools count as ints in arithmetic) and what Python refuses (a division by zero,
a math function outside its domain or range), which is a compile error at the user's line.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import CompileError
from ..ir.ops import GroupOp, Op
from ..ir.semantics import PY_FLOAT, PY_INT, evaluate, to_python

# the ops that keep bool operands bool (True & False is False; True + True is 2)
_ON_BOOLS = frozenset({Op.NOT, Op.AND, Op.OR, Op.BIT_AND, Op.BIT_OR, Op.BIT_XOR, Op.EQ, Op.NE})
# Python gives an int for these of a float (math.floor, math.ceil, round)
_INT_RESULT = frozenset({Op.FLOOR, Op.CEIL, Op.ROUND})
# Python refuses a zero right operand (ZeroDivisionError)
_BY_ZERO = {Op.DIV: "/", Op.FLOORDIV: "//", Op.MOD: "%"}
# float functions Python's math module applies to an int too (math.sin(1)); ** keeps ints
_TO_FLOAT = GroupOp.FloatOnly - {Op.POW}


def _number(x):
    """A Python number (a NumPy scalar becomes one, as math.sin(np.float32(1)) is a float)."""
    if isinstance(x, (bool, int, float)):
        return x
    if isinstance(x, np.generic) and x.dtype.kind in "biuf":
        return x.item()
    raise TypeError(f"a compile-time constant expression needs numbers, got {type(x).__name__} {x!r}")


def _operands(op: Op, xs: tuple) -> tuple:
    """NumPy scalars of the precision Python computes `op` in, and the result's dtype."""
    if all(isinstance(x, bool) for x in xs) and op in _ON_BOOLS:
        return tuple(np.bool_(x) for x in xs), None
    xs = tuple(int(x) if isinstance(x, bool) else x for x in xs)
    floats = any(isinstance(x, float) for x in xs)
    if op is Op.DIV or op in _TO_FLOAT or (op is Op.POW and xs[1] < 0):
        floats = True  # 7 / 2 is 3.5, 2 ** -1 is 0.5
    if floats:
        return tuple(np.float64(x) for x in xs), PY_FLOAT
    return xs, PY_INT


def fold(op: Op, *xs, loc=None):
    """op applied to the Python numbers xs, as Python computes it (see the module docstring)."""
    if op in _BY_ZERO and _number(xs[1]) == 0:
        a, b = xs
        raise CompileError(f"division by zero in a compile-time constant expression ({a!r} {_BY_ZERO[op]} "
                           f"{b!r}): both operands are Python values, evaluated when the kernel is "
                           f"compiled; a float infinity is float('inf') or math.inf", loc)
    xs = tuple(_number(x) for x in xs)
    args, dt = _operands(op, xs)
    try:
        out = to_python(evaluate(op, dt, *args))
    except ValueError as e:  # a negative shift amount
        raise CompileError(f"{op.name.lower()} of compile-time constants {xs!r} failed in Python ({e})", loc) from None
    math_fn = dt is PY_FLOAT and (op in GroupOp.Unary or op is Op.POW)
    if math_fn and not math.isfinite(out) and all(math.isfinite(a) for a in args):
        # what Python raises: ValueError outside the domain (NaN, or a pole such as log(0) or
        # atanh(1)), OverflowError where the true result is finite but too large (exp(1000))
        why = "math domain error" if math.isnan(out) or abs(xs[0]) <= 1 else "math range error"
        what = f"ti.{op.name.lower()}({xs[0]!r})" if op in GroupOp.Unary else f"{xs[0]!r} ** {xs[1]!r}"
        raise CompileError(f"{what} of a compile-time constant failed in Python ({why}): its argument "
                           f"is a Python value, evaluated when the kernel is compiled", loc)
    if op in _INT_RESULT and isinstance(out, float):
        if not math.isfinite(out):
            raise CompileError(f"ti.{op.name.lower()}({xs[0]!r}) of a compile-time constant is not a finite "
                               f"number: Python's {op.name.lower()} gives an int", loc)
        return int(out)
    return out
