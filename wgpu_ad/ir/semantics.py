"""The reference semantics of every ALU op: one table, keyed by op.

Each entry is `fn(dtype, *args) -> value`: `dtype` is the statement's result DType, `args` are NumPy
scalars of the operands' dtypes (np.float32 / np.int32 / np.uint32 / np.bool_; f16 works too), and
the result is a NumPy scalar of `dtype`. The reference interpreter runs these, and constant folding
uses them, so a folded constant is what the GPU computes.

Conventions (WGSL / Taichi; where WGSL leaves a case undefined we pick one and say so):
  floats   computed in the operands' precision (float32 arithmetic, correctly rounded for + - * /
           sqrt; transcendentals are NumPy's float32 versions, which may differ from a GPU by ulps).
  ints     wrap (two's complement); computed with exact Python ints, then wrapped.
  DIV      int: truncates toward zero; x / 0 == x and INT_MIN / -1 == INT_MIN (WGSL's rule).
  FLOORDIV int: Python floor division; x // 0 == x, INT_MIN // -1 == INT_MIN (wraps).
           float: floor(x / y) in float32.
  MOD      int: Python remainder (sign of the divisor); x % 0 == 0.
           float: x - y * floor(x / y), each step rounded to float32.
  POW      float: powf; a negative base with an integral exponent works (-2 ** 3 == -8), a
           non-integral one gives NaN. int: exact power, wrapped; a negative exponent gives the
           exact result truncated toward zero (1 for base 1, +-1 for base -1, else 0).
  SHL/SHR  shift amount taken mod 32; SHR is arithmetic for i32, logical for u32.
  MIN/MAX  float: NaN if either is NaN; min(-0, +0) == -0 and max(-0, +0) == +0, so both are
           commutative bit for bit (the GPU may return either zero or the non-NaN operand).
  SIGN     -1, 0 or 1 of the operand's type (0 for +-0 and NaN).
  ROUND    half to even (WGSL round). RSQRT = 1 / sqrt(x).
  CAST     float -> int truncates toward zero and saturates like WGSL (i32: [-2**31, 2**31-128],
           u32: [0, 2**32-256], the ints exactly representable in f32); NaN -> 0 (WGSL: any value).
           i32 <-> u32 keeps the bits. int -> float rounds to nearest. x -> bool is x != 0;
           bool -> number is 0 / 1.
  BITCAST  reinterprets the bits (same size only).

The frontend folds Python values with this table too (frontend/fold.py), in the precisions Python
computes in: PY_FLOAT (float64) and PY_INT (exact integers: no wrap, shifts not masked, powers
exact). Those two are never the dtype of an IR statement.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..types import DType, u1
from .ops import Op

_F = np.floating

# Python's numbers, for folding compile-time constants in the frontend (see the docstring)
PY_FLOAT = DType("float", "", np.dtype(np.float64), True, True, 8)
PY_INT = DType("int", "", np.dtype(object), False, True, 0)


def wrap(dt: DType, v: int):
    """An exact Python int wrapped into the 32-bit integer dtype `dt` (two's complement); a
    PY_INT stays exact."""
    if dt is PY_INT:
        return v
    if dt.name == "i32":
        return np.int32(((v + 0x80000000) & 0xFFFFFFFF) - 0x80000000)
    if dt.name == "u32":
        return np.uint32(v & 0xFFFFFFFF)
    raise TypeError(f"{dt} is not a 32-bit integer type")


def _float(dt: DType, v):
    return dt.np.type(v)


def _bool_operand(op: str):
    return TypeError(f"{op} needs numbers, got a bool (u1) operand; cast it to i32 first")


def _unary(name: str, float_fn: Callable | None, int_fn: Callable | None) -> Callable:
    """A one-operand rule whose float and integer cases differ (None: not defined for that kind)."""
    def rule(dt, x):
        if isinstance(x, _F):
            if float_fn is None:
                raise TypeError(f"{name} needs an integer operand, got {x.dtype}")
            return float_fn(dt, x)
        if int_fn is None:
            raise TypeError(f"{name} needs a float operand, got {x.dtype}")
        if isinstance(x, np.bool_):
            raise _bool_operand(name)
        return int_fn(dt, int(x))
    rule.__name__ = name.lower()
    return rule


def _binary(name: str, float_fn: Callable | None, int_fn: Callable | None) -> Callable:
    """A two-operand rule whose float and integer cases differ."""
    def rule(dt, a, b):
        if isinstance(a, _F):
            if float_fn is None:
                raise TypeError(f"{name} needs integer operands, got {a.dtype}")
            return float_fn(dt, a, b)
        if int_fn is None:
            raise TypeError(f"{name} needs float operands, got {a.dtype}")
        if isinstance(a, np.bool_):
            raise _bool_operand(name)
        return int_fn(dt, int(a), int(b))
    rule.__name__ = name.lower()
    return rule


# ---- unary ---------------------------------------------------------------------------------

def _sign_float(dt, x):
    return _float(dt, int(x > 0) - int(x < 0))


def _float_only(name: str, npfn: Callable) -> Callable:
    return _unary(name, lambda dt, x: npfn(x), None)


def _rsqrt(x):
    return x.dtype.type(1) / np.sqrt(x)


# saturation bounds of float -> int conversion: the ints exactly representable in f32
_SAT = {"i32": (-2147483648, 2147483520), "u32": (0, 4294967040)}


def _cast(dt: DType, x):
    if dt == u1:
        return np.bool_(x != 0)
    if isinstance(x, np.bool_):
        return dt.np.type(1 if x else 0)
    if dt.is_float:
        return dt.np.type(x)  # int -> float rounds to nearest; float -> float rounds
    if isinstance(x, _F):
        if math.isnan(x):
            return dt.np.type(0)
        lo, hi = _SAT[dt.name]
        if math.isinf(x):
            return dt.np.type(hi if x > 0 else lo)
        return dt.np.type(min(max(math.trunc(float(x)), lo), hi))
    return wrap(dt, int(x))  # i32 <-> u32 keeps the bits


def _bitcast(dt: DType, x):
    if x.dtype.itemsize != dt.np.itemsize or x.dtype == np.bool_ or dt == u1:
        raise TypeError(f"cannot bitcast {x.dtype} to {dt}: sizes differ or bool")
    return np.array(x).view(dt.np)[()]


# ---- binary --------------------------------------------------------------------------------

def _int_div(dt, a, b):
    if b == 0:
        return wrap(dt, a)
    q = abs(a) // abs(b)
    return wrap(dt, q if (a < 0) == (b < 0) else -q)


def _int_floordiv(dt, a, b):
    return wrap(dt, a if b == 0 else a // b)


def _int_mod(dt, a, b):
    return wrap(dt, 0 if b == 0 else a % b)


def _float_floordiv(dt, a, b):
    return np.floor(a / b)


def _float_mod(dt, a, b):
    return a - b * np.floor(a / b)


def _int_pow(dt, a, b):
    if b >= 0:
        return wrap(dt, pow(a, b) if dt is PY_INT else pow(a, b, 1 << 32))
    if a == 1:
        return wrap(dt, 1)
    if a == -1:
        return wrap(dt, -1 if b % 2 else 1)
    return wrap(dt, 0)


def _float_min(dt, a, b):
    if a != a or b != b:
        return _float(dt, np.nan)
    if a == b:
        return a if np.signbit(a) else b
    return a if a < b else b


def _float_max(dt, a, b):
    if a != a or b != b:
        return _float(dt, np.nan)
    if a == b:
        return b if np.signbit(a) else a
    return a if a > b else b


def _shift_amount(dt, b):
    return b if dt is PY_INT else b & 31  # (Python refuses a negative amount: ValueError)


def _shl(dt, a, b):
    return wrap(dt, a << _shift_amount(dt, b))


def _shr(dt, a, b):
    n = _shift_amount(dt, b)
    if dt.name == "u32":
        return wrap(dt, (a & 0xFFFFFFFF) >> n)
    return wrap(dt, a >> n)  # Python's >> on a negative int is arithmetic


def _bitwise(pyop: Callable) -> Callable:
    def rule(dt, a, b):
        if isinstance(a, np.bool_):
            return np.bool_(pyop(bool(a), bool(b)))
        if isinstance(a, _F):
            raise TypeError(f"bitwise operation needs integer operands, got {a.dtype}")
        return wrap(dt, pyop(int(a), int(b)))
    return rule


def _logical(pyop: Callable) -> Callable:
    def rule(dt, a, b):
        return np.bool_(pyop(bool(a), bool(b)))
    return rule


def _compare(pyop: Callable) -> Callable:
    def rule(dt, a, b):
        return np.bool_(pyop(a, b))
    return rule


def _select(dt, c, a, b):
    return a if c else b


SEMANTICS: dict[Op, Callable] = {
    # unary
    Op.NEG: _unary("NEG", lambda dt, x: -x, lambda dt, x: wrap(dt, -x)),
    Op.ABS: _unary("ABS", lambda dt, x: np.abs(x), lambda dt, x: wrap(dt, abs(x))),
    Op.SIGN: _unary("SIGN", _sign_float, lambda dt, x: wrap(dt, (x > 0) - (x < 0))),
    Op.SIN: _float_only("SIN", np.sin), Op.COS: _float_only("COS", np.cos),
    Op.TAN: _float_only("TAN", np.tan), Op.ASIN: _float_only("ASIN", np.arcsin),
    Op.ACOS: _float_only("ACOS", np.arccos), Op.ATAN: _float_only("ATAN", np.arctan),
    Op.TANH: _float_only("TANH", np.tanh), Op.EXP: _float_only("EXP", np.exp),
    Op.LOG: _float_only("LOG", np.log), Op.SQRT: _float_only("SQRT", np.sqrt),
    Op.RSQRT: _float_only("RSQRT", _rsqrt),
    Op.ASINH: _float_only("ASINH", np.arcsinh), Op.ACOSH: _float_only("ACOSH", np.arccosh),
    Op.ATANH: _float_only("ATANH", np.arctanh), Op.LOG1P: _float_only("LOG1P", np.log1p),
    Op.EXPM1: _float_only("EXPM1", np.expm1),
    Op.FLOOR: _float_only("FLOOR", np.floor), Op.CEIL: _float_only("CEIL", np.ceil),
    Op.ROUND: _float_only("ROUND", np.rint),  # rint rounds half to even
    Op.NOT: lambda dt, x: np.bool_(not x),
    Op.BIT_NOT: _unary("BIT_NOT", None, lambda dt, x: wrap(dt, ~x)),
    Op.CAST: _cast,
    Op.BITCAST: _bitcast,
    # binary arithmetic
    Op.ADD: _binary("ADD", lambda dt, a, b: a + b, lambda dt, a, b: wrap(dt, a + b)),
    Op.SUB: _binary("SUB", lambda dt, a, b: a - b, lambda dt, a, b: wrap(dt, a - b)),
    Op.MUL: _binary("MUL", lambda dt, a, b: a * b, lambda dt, a, b: wrap(dt, a * b)),
    Op.DIV: _binary("DIV", lambda dt, a, b: a / b, _int_div),
    Op.FLOORDIV: _binary("FLOORDIV", _float_floordiv, _int_floordiv),
    Op.MOD: _binary("MOD", _float_mod, _int_mod),
    Op.POW: _binary("POW", lambda dt, a, b: np.power(a, b), _int_pow),
    Op.ATAN2: _binary("ATAN2", lambda dt, a, b: np.arctan2(a, b), None),
    Op.MIN: _binary("MIN", _float_min, lambda dt, a, b: wrap(dt, min(a, b))),
    Op.MAX: _binary("MAX", _float_max, lambda dt, a, b: wrap(dt, max(a, b))),
    # bits and logic
    Op.BIT_AND: _bitwise(lambda a, b: a & b),
    Op.BIT_OR: _bitwise(lambda a, b: a | b),
    Op.BIT_XOR: _bitwise(lambda a, b: a ^ b),
    Op.SHL: _binary("SHL", None, _shl),
    Op.SHR: _binary("SHR", None, _shr),
    Op.AND: _logical(lambda a, b: a and b),
    Op.OR: _logical(lambda a, b: a or b),
    # comparisons (IEEE: any comparison with NaN is false, except NE)
    Op.LT: _compare(lambda a, b: a < b), Op.LE: _compare(lambda a, b: a <= b),
    Op.GT: _compare(lambda a, b: a > b), Op.GE: _compare(lambda a, b: a >= b),
    Op.EQ: _compare(lambda a, b: a == b), Op.NE: _compare(lambda a, b: a != b),
    # ternary
    Op.SELECT: _select,
}


def evaluate(op: Op, dtype: DType, *args):
    """Apply the reference semantics of ALU op `op` (result type `dtype`) to NumPy scalars.

    Float warnings (overflow, division by zero, invalid) are silenced: inf and NaN are results.
    """
    try:
        fn = SEMANTICS[op]
    except KeyError:
        raise KeyError(f"no reference semantics for {op.name}: add an entry to SEMANTICS in "
                       f"wgpu_ad/ir/semantics.py") from None
    with np.errstate(all="ignore"):
        out = fn(dtype, *args)
    return out


def to_scalar(value, dtype: DType):
    """A Python number (a CONST's attr, an argument) as a NumPy scalar of `dtype`; ints wrap."""
    if dtype == u1:
        return np.bool_(bool(value))
    if dtype.is_float:
        with np.errstate(all="ignore"):
            return dtype.np.type(float(value))
    return wrap(dtype, int(value))


def to_python(value):
    """A NumPy scalar as a plain Python number (float keeps the float32 value exactly)."""
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.floating):
        return float(value)
    return int(value)
