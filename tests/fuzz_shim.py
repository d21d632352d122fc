"""A float64 stand-in for the `ti` names the random programs of fuzz_gen.py use, so the same
kernel source runs in plain Python as an independent reference (nothing here imports wgpu_ad).

Fields are float64 (or int64) NumPy arrays; a kernel is the Python function itself, so parallel
loops run serially, in order. That is one valid schedule, and the only one that matters: the
generator writes race-free programs (each element is stored by its own iteration; += is the only
write several iterations share). Semantics follow Taichi's documentation: `/` is true division,
`v.norm(eps)` is sqrt(sum v_k^2 + eps),
`v.normalized(eps)` is v / (v.norm() + eps), `ti.select(c, a, b)` is `a if c else b`.

`run_module` executes a module's source with every comparison rewritten to `_fuzz_cmp(...)`, which
records how close its two sides came (`margin()`): ti.max / ti.min / ti.abs / a norm record theirs
too. A program evaluated within a step of a kink or a branch switch has no derivative there, and
float32 may take the other side, so callers redraw inputs whose margin is small.
"""
from __future__ import annotations

import ast
import builtins
import itertools
import math
import operator

import numpy as np

f32 = "f32"
i32 = "i32"

_margin = [math.inf]


def reset_margin() -> None:
    _margin[0] = math.inf


def margin() -> float:
    return _margin[0]


def _note(a, b) -> None:
    if isinstance(a, (float, np.floating)) or isinstance(b, (float, np.floating)):
        d = builtins.abs(float(a) - float(b))
        if d > 0.0:  # an exact tie is of values no input moves (abs(i * 0.2) at i = 0)
            _margin[0] = builtins.min(_margin[0], d)


_CMP = {"Lt": operator.lt, "LtE": operator.le, "Gt": operator.gt, "GtE": operator.ge,
        "Eq": operator.eq, "NotEq": operator.ne}


def _fuzz_cmp(a, op, b):
    _note(a, b)
    return _CMP[op](a, b)


class _Comparisons(ast.NodeTransformer):
    def visit_Compare(self, node):
        self.generic_visit(node)
        # a chained comparison (`0 <= i - 1 < n`) as `and` of its pairs (the generated operands are pure)
        lefts = [node.left] + node.comparators[:-1]
        calls = [ast.Call(ast.Name("_fuzz_cmp", ast.Load()), [left, ast.Constant(type(op).__name__), right], [])
                 for left, op, right in zip(lefts, node.ops, node.comparators)]
        out = calls[0] if len(calls) == 1 else ast.BoolOp(ast.And(), calls)
        return ast.copy_location(out, node)


def run_module(source: str, filename: str = "<fuzz>") -> dict:
    """Execute `source` with comparisons instrumented; returns its namespace."""
    tree = ast.fix_missing_locations(_Comparisons().visit(ast.parse(source)))
    ns = {"_fuzz_cmp": _fuzz_cmp, "__name__": "fuzz_shim_program"}
    exec(compile(tree, filename, "exec"), ns)
    return ns


# ---- values --------------------------------------------------------------------------------

class Vec:
    """A small immutable vector (value semantics, like a Taichi local)."""

    __slots__ = ("e",)

    def __init__(self, e):
        self.e = np.array(e, dtype=np.float64)

    def _op(self, other, f):
        o = other.e if isinstance(other, Vec) else other
        return Vec(f(self.e, o))

    def _rop(self, other, f):
        return Vec(f(other, self.e))

    __add__ = lambda s, o: s._op(o, operator.add)
    __sub__ = lambda s, o: s._op(o, operator.sub)
    __mul__ = lambda s, o: s._op(o, operator.mul)
    __truediv__ = lambda s, o: s._op(o, operator.truediv)
    __radd__ = lambda s, o: s._rop(o, operator.add)
    __rsub__ = lambda s, o: s._rop(o, operator.sub)
    __rmul__ = lambda s, o: s._rop(o, operator.mul)
    __rtruediv__ = lambda s, o: s._rop(o, operator.truediv)

    def __neg__(self):
        return Vec(-self.e)

    def __getitem__(self, k):
        return float(self.e[k])

    @property
    def x(self):
        return float(self.e[0])

    @property
    def y(self):
        return float(self.e[1])

    def dot(self, other):
        return float(np.dot(self.e, other.e))

    def norm(self, eps=0.0):
        r = math.sqrt(float(np.dot(self.e, self.e)) + eps)
        _note(r, 0.0)
        return r

    def norm_sqr(self):
        return float(np.dot(self.e, self.e))

    def normalized(self, eps=0.0):
        return Vec(self.e * (1.0 / (self.norm() + eps)))


class _VectorNS:
    def __call__(self, e):
        return Vec([float(c) for c in e])

    @staticmethod
    def field(n, dtype, shape, needs_grad=False):
        return Field(dtype, shape, (n,))


Vector = _VectorNS()


class Field:
    def __init__(self, dtype, shape, element_shape=()):
        self.shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.element_shape = tuple(element_shape)
        self.dtype = dtype
        self.a = np.zeros(self.shape + self.element_shape, np.int64 if dtype == i32 else np.float64)

    def _key(self, idx):
        return () if idx is None else idx

    def __getitem__(self, idx):
        v = self.a[self._key(idx)]
        if self.element_shape:
            return Vec(v)
        return int(v) if self.dtype == i32 else float(v)

    def __setitem__(self, idx, value):
        self.a[self._key(idx)] = value.e if isinstance(value, Vec) else value

    def __iter__(self):
        if len(self.shape) == 1:
            return iter(range(self.shape[0]))
        return itertools.product(*(range(s) for s in self.shape))

    def from_numpy(self, arr):
        self.a[...] = arr

    def to_numpy(self):
        return self.a.copy()


def field(dtype, shape, needs_grad=False):
    return Field(dtype, shape)


def kernel(fn):
    return fn


def func(fn):
    return fn


def static(x):
    return x


def ndrange(*dims):
    return itertools.product(*(range(d) for d in dims))


def select(c, a, b):
    return a if c else b


def max(a, b):  # noqa: A001 (Taichi's name)
    _note(a, b)
    return a if a > b else b


def min(a, b):  # noqa: A001
    _note(a, b)
    return a if a < b else b


def abs(a):  # noqa: A001
    _note(a, 0.0)
    return a if a >= 0 else -a


sin, cos, tanh, exp, log, sqrt, atan2 = math.sin, math.cos, math.tanh, math.exp, math.log, math.sqrt, math.atan2
