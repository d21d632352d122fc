"""Functions users call in kernels (ti.sin, ti.atomic_add, ti.select ...): one table.

Each Builtin is a real Python callable (it works in Python scope on numbers and NumPy arrays)
and knows how to lower itself: `lower(ops, *args, **kwargs)` gets frontend values (Stmt, Mat or
Python objects) and returns one.
"""
from __future__ import annotations

import builtins as _py
import math

import numpy as np

from ..errors import CompileError
from ..ir.ops import AtomicKind, Op
from ..types import f32, i32, to_dtype
from .values import Mat, Ops, is_static


class Builtin:
    def __init__(self, name: str, py, lower, ref_first_arg: bool = False):
        self.name, self.py, self.lower, self.ref_first_arg = name, py, lower, ref_first_arg
        self.__name__ = name

    def __call__(self, *args, **kwargs):
        if self.py is None:
            raise RuntimeError(f"ti.{self.name}() can only be called inside a kernel or ti.func")
        return self.py(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<wgpu_ad builtin {self.name}>"


def _unary(name: str, op: Op, npf):
    return Builtin(name, npf, lambda o, x: o.unary(op, x))


def _with_dtype(name: str, op: Op, npf):
    def lower(o: Ops, x, dtype=None):
        r = o.unary(op, x)
        return o.cast(r, to_dtype(dtype)) if dtype is not None else r
    return Builtin(name, lambda x, dtype=None: npf(x) if dtype is None else to_dtype(dtype).np.type(npf(x)), lower)


def _minmax(op: Op, pyf):
    def lower(o: Ops, *xs):
        if len(xs) == 1 and isinstance(xs[0], Mat):
            return o.reduce(op, xs[0])
        if len(xs) == 1 and isinstance(xs[0], (list, tuple)):
            xs = tuple(xs[0])
        acc = xs[0]
        for x in xs[1:]:
            acc = o.binary(op, acc, x)
        return acc
    return lower


def _rsqrt(x):
    return 1 / np.sqrt(x)


sin = _unary("sin", Op.SIN, np.sin)
cos = _unary("cos", Op.COS, np.cos)
tan = _unary("tan", Op.TAN, np.tan)
asin = _unary("asin", Op.ASIN, np.arcsin)
acos = _unary("acos", Op.ACOS, np.arccos)
tanh = _unary("tanh", Op.TANH, np.tanh)
exp = _unary("exp", Op.EXP, np.exp)
log = _unary("log", Op.LOG, np.log)
sqrt = _unary("sqrt", Op.SQRT, np.sqrt)
rsqrt = _unary("rsqrt", Op.RSQRT, _rsqrt)
asinh = _unary("asinh", Op.ASINH, np.arcsinh)
acosh = _unary("acosh", Op.ACOSH, np.arccosh)
atanh = _unary("atanh", Op.ATANH, np.arctanh)
log1p = _unary("log1p", Op.LOG1P, np.log1p)
expm1 = _unary("expm1", Op.EXPM1, np.expm1)
abs = _unary("abs", Op.ABS, np.abs)
sign = _unary("sign", Op.SIGN, np.sign)
floor = _with_dtype("floor", Op.FLOOR, np.floor)
ceil = _with_dtype("ceil", Op.CEIL, np.ceil)
round = _with_dtype("round", Op.ROUND, np.round)


def _atan(o: Ops, y, x=None):
    return o.unary(Op.ATAN, y) if x is None else o.binary(Op.ATAN2, y, x)


atan = Builtin("atan", lambda y, x=None: np.arctan(y) if x is None else np.arctan2(y, x), _atan)
atan2 = Builtin("atan2", np.arctan2, lambda o, y, x: o.binary(Op.ATAN2, y, x))
pow = Builtin("pow", np.power, lambda o, x, y: o.binary(Op.POW, x, y))
max = Builtin("max", np.maximum, _minmax(Op.MAX, _py.max))
min = Builtin("min", np.minimum, _minmax(Op.MIN, _py.min))


def _select(o: Ops, cond, a, b):
    return o.select(cond, a, b)


select = Builtin("select", np.where, _select)


def _cast(o: Ops, x, dtype):
    return o.cast(x, to_dtype(dtype), explicit=True)


cast = Builtin("cast", lambda x, dtype: to_dtype(dtype).np.type(x), _cast)


def _random(o: Ops, dtype=None):
    dt = to_dtype(dtype) if dtype is not None else f32
    o.b.uses_random = True
    r = o.b.emit(Op.RANDOM, (), dt if dt != f32 else f32)
    return r


random = Builtin("random", lambda dtype=None: float(np.random.random()), _random)


def _stop_grad(o: Ops, x):
    """Identity whose derivative is zero: a bitcast to the same type (BITCAST is not differentiable).
    Given a field or an ndarray argument: no gradient flows into it from this kernel (its adjoint
    leaves x.grad alone), Taichi's `ti.stop_grad(x)` on a field."""
    if hasattr(x, "gpu_buffer") or getattr(x, "is_array_arg", False):
        o.b.no_grad.append(x)
        return None
    if isinstance(x, Mat):
        return Mat([_stop_grad(o, e) for e in x.entries], x.shape)
    if is_static(x):
        return x
    return o.b.emit(Op.BITCAST, [x], x.dtype)


stop_grad = Builtin("stop_grad", lambda x: x, _stop_grad)


def _block_local(o: Ops, *fields):
    """Taichi's hint to cache fields in GPU shared memory (its BLS): a performance hint with no
    effect on values or gradients. wgpu_ad reads global memory directly, so it generates nothing."""
    for f in fields:
        if not (hasattr(f, "gpu_buffer") or getattr(f, "is_array_arg", False)):
            raise CompileError(f"ti.block_local() takes fields, got {f!r}")
    return None


block_local = Builtin("block_local", lambda *fields: None, _block_local)


def _clamp(o: Ops, x, lo, hi):
    return o.binary(Op.MIN, o.binary(Op.MAX, x, lo), hi)


clamp = Builtin("clamp", np.clip, _clamp)


def _mix(o: Ops, x, y, a):
    return o.binary(Op.ADD, x, o.binary(Op.MUL, o.binary(Op.SUB, y, x), a))


mix = Builtin("mix", lambda x, y, a: x + (y - x) * a, _mix)
fract = Builtin("fract", lambda x: x - np.floor(x), lambda o, x: o.binary(Op.SUB, x, o.unary(Op.FLOOR, x)))
step = Builtin("step", lambda edge, x: np.where(x < edge, 0.0, 1.0),
               lambda o, edge, x: o.select(o.binary(Op.LT, x, edge), 0.0, 1.0))


def _smoothstep(o: Ops, e0, e1, x):
    t = _clamp(o, o.binary(Op.DIV, o.binary(Op.SUB, x, e0), o.binary(Op.SUB, e1, e0)), 0.0, 1.0)
    return o.binary(Op.MUL, o.binary(Op.MUL, t, t), o.binary(Op.SUB, 3.0, o.binary(Op.MUL, 2.0, t)))


smoothstep = Builtin("smoothstep", None, _smoothstep)
log2 = Builtin("log2", np.log2, lambda o, x: o.binary(Op.MUL, o.unary(Op.LOG, x), 1.0 / math.log(2.0)))
exp2 = Builtin("exp2", np.exp2, lambda o, x: o.unary(Op.EXP, o.binary(Op.MUL, x, math.log(2.0))))
radians = Builtin("radians", np.radians, lambda o, x: o.binary(Op.MUL, x, math.pi / 180))
degrees = Builtin("degrees", np.degrees, lambda o, x: o.binary(Op.MUL, x, 180 / math.pi))


def _need_mat(name, *xs):
    for x in xs:
        if not isinstance(x, Mat):
            raise TypeError(f"ti.math.{name}() needs vectors, got {type(x).__name__}")


def _mat_method(name: str, method, npf=None):
    def lower(o: Ops, *xs, **kw):
        if not isinstance(xs[0], Mat):
            raise CompileError(f"ti.math.{name}() needs a vector or matrix argument", o.b.loc)
        return method(o, *xs, **kw)
    return Builtin(name, npf, lower)


dot = _mat_method("dot", Ops.dot, np.dot)
cross = _mat_method("cross", Ops.cross, np.cross)
length = _mat_method("length", lambda o, v: o.norm(v), np.linalg.norm)
normalize = _mat_method("normalize", lambda o, v: o.normalized(v), lambda v: v / np.linalg.norm(v))
distance = Builtin("distance", lambda a, b: np.linalg.norm(np.asarray(a) - np.asarray(b)),
                   lambda o, a, b: o.norm(o.binary(Op.SUB, a, b)))
reflect = Builtin("reflect", lambda x, n: np.asarray(x) - 2 * np.dot(n, x) * np.asarray(n),
                  lambda o, x, n: o.binary(Op.SUB, x, o.binary(Op.MUL, o.binary(Op.MUL, 2.0, o.dot(n, x)), n)))


def _rotation2d(o: Ops, a):
    c, s = o.unary(Op.COS, a), o.unary(Op.SIN, a)
    return Mat([c, o.unary(Op.NEG, s), s, c], (2, 2))


rotation2d = Builtin("rotation2d", lambda a: np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]], np.float32),
                     _rotation2d)
eye = Builtin("eye", lambda n: np.eye(n, dtype=np.float32),
              lambda o, n: Mat([1.0 if i == j else 0.0 for i in range(n) for j in range(n)], (n, n)))
determinant = _mat_method("determinant", Ops.determinant, np.linalg.det)
inverse = _mat_method("inverse", Ops.inverse, np.linalg.inv)


# ---- atomics: the first argument is a reference (a field element or a local variable) -------
def _atomic(kind: AtomicKind):
    def lower(o: Ops, ref, value):
        return ref.atomic(o, kind, value)
    return Builtin(f"atomic_{kind.value}", None, lower, ref_first_arg=True)


atomic_add = _atomic(AtomicKind.ADD)
atomic_sub = _atomic(AtomicKind.SUB)
atomic_min = _atomic(AtomicKind.MIN)
atomic_max = _atomic(AtomicKind.MAX)
atomic_and = _atomic(AtomicKind.AND)
atomic_or = _atomic(AtomicKind.OR)
atomic_xor = _atomic(AtomicKind.XOR)

# Python's own functions that kernels may call, by the op they compute: each is lowered like its
# ti.* counterpart, the Builtin next to it. A test checks every ALU op is here or in _NO_PY_FUNCTION.
_PY_FUNCTIONS = {
    Op.ABS: (abs, [_py.abs]), Op.MAX: (max, [_py.max]), Op.MIN: (min, [_py.min]),
    Op.POW: (pow, [_py.pow, math.pow]), Op.ROUND: (round, [_py.round]),
    Op.SIN: (sin, [math.sin]), Op.COS: (cos, [math.cos]), Op.TAN: (tan, [math.tan]),
    Op.ASIN: (asin, [math.asin]), Op.ACOS: (acos, [math.acos]), Op.ATAN: (atan, [math.atan]),
    Op.ATAN2: (atan2, [math.atan2]), Op.TANH: (tanh, [math.tanh]), Op.EXP: (exp, [math.exp]),
    Op.LOG: (log, [math.log]), Op.SQRT: (sqrt, [math.sqrt]), Op.FLOOR: (floor, [math.floor]),
    Op.CEIL: (ceil, [math.ceil]), Op.ASINH: (asinh, [math.asinh]), Op.ACOSH: (acosh, [math.acosh]),
    Op.ATANH: (atanh, [math.atanh]), Op.LOG1P: (log1p, [math.log1p]), Op.EXPM1: (expm1, [math.expm1]),
}


def op_functions() -> dict[str, "Builtin"]:
    """ti.sin, ti.asinh, ...: the function of every op in _PY_FUNCTIONS by its name. wgpu_ad and
    ti.math export these, so a new op is public once it is in _PY_FUNCTIONS."""
    return {b.name: b for b, _ in _PY_FUNCTIONS.values()}


# ALU ops with no Python function above, on purpose
_NO_PY_FUNCTION = frozenset({
    # written with an operator (expressions.py's visit_BinOp / UnaryOp / Compare / BoolOp / IfExp)
    Op.NEG, Op.NOT, Op.BIT_NOT, Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.FLOORDIV, Op.MOD,
    Op.BIT_AND, Op.BIT_OR, Op.BIT_XOR, Op.SHL, Op.SHR, Op.AND, Op.OR,
    Op.LT, Op.LE, Op.GT, Op.GE, Op.EQ, Op.NE, Op.SELECT,
    Op.CAST,                        # int(x), float(x), ti.f32(x): methods.lower_call
    Op.SIGN, Op.RSQRT, Op.BITCAST,  # Python has no such function (math.copysign is not sign)
})
PY_BUILTINS = {f: b for b, fs in _PY_FUNCTIONS.values() for f in fs}


def lower_int(o: Ops, x):
    return o.cast(x, i32, explicit=True)


def lower_float(o: Ops, x):
    return o.cast(x, f32)


__all__ = [n for n, v in list(globals().items()) if isinstance(v, Builtin)]
