"""A float64 stand-in for the `ti` names the random programs of fuzz_gen.py use, so the same
kernel source runs in plain Python as an independent reference (nothing here imports wgpu_ad).

Fields are float64 (or int64) NumPy arrays; a kernel is the Python function itself, so parallel
loops run serially, in order. That is one valid schedule, and the only one that matters: the
generator writes race-free programs (each element is stored by its own iteration; += is the only
write several iterations share). Semantics follow Taichi's documentation: `/` is true division,
`v.norm(eps)` is sqrt(sum v_k^2 + eps),
`v.normalized(eps)` is v / (v.norm() + eps), `ti.select(c, a, b)` is `a if c else b`; a matrix's
`norm` is the Frobenius norm, `A @ B` the matrix product, `*` elementwise. ndarrays are fields
passed as arguments (`ti.types.ndarray()` annotates nothing here). `ti.ad.checkpoint(step, T, ...)`
runs step(0) .. step(T - 1); ti.stop_grad is the identity and an @ti.ad.no_grad kernel runs as
any, except inside central differences (`stops` below: what they hold fixed).

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
_noting = [True]  # off while central differences run the program again and again


def reset_margin() -> None:
    _margin[0] = math.inf
    _trig[0] = 0.0


def margin() -> float:
    return _margin[0]


def _note(a, b) -> None:
    if _noting[0] and (isinstance(a, float) or isinstance(b, float)):  # np.float64 is a float
        d = builtins.abs(float(a) - float(b))
        if d > 0.0:  # an exact tie is of values no input moves (abs(i * 0.2) at i = 0)
            _margin[0] = builtins.min(_margin[0], d)
        elif (type(a) is _Stopped) != (type(b) is _Stopped):
            # but ti.max(ti.stop_grad(x), x) ties a value central differences hold with one they
            # move: a kink they see from both sides (fuzz seed 1873)
            _margin[0] = 0.0


class _Stopped(float):
    """What ti.stop_grad returned (outside central differences): arithmetic on it gives plain floats."""


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


class _Atomics(ast.NodeTransformer):
    """`ti.atomic_add(x[i], e)` (and sub, max, min) as a statement: `x[i] = x[i] + e`, or
    `x[i] = ti.max(x[i], e)` (which records its margin); the generated targets are pure."""

    _OPS = {"atomic_add": ast.Add(), "atomic_sub": ast.Sub()}

    def visit_Expr(self, node):
        call = node.value
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and call.func.attr in ("atomic_add", "atomic_sub", "atomic_max", "atomic_min")):
            return node
        target, e = call.args
        load = ast.fix_missing_locations(_with_ctx(target, ast.Load()))
        if call.func.attr in self._OPS:
            value = ast.BinOp(load, self._OPS[call.func.attr], e)
        else:
            value = ast.Call(ast.Attribute(call.func.value, call.func.attr[len("atomic_"):], ast.Load()), [load, e], [])
        out = ast.Assign([_with_ctx(target, ast.Store())], value)
        return ast.fix_missing_locations(ast.copy_location(out, node))


def _with_ctx(node, ctx):
    import copy
    node = copy.deepcopy(node)
    node.ctx = ctx
    return node


def noting(on: bool) -> None:
    """Record margins (on) or not (faster: for runs whose margin nobody reads)."""
    _noting[0] = on


class _Overwrites(ast.NodeTransformer):
    """In a @ti.ad.no_grad kernel, each store that overwrites an element of a field (not `x[k] +=
    e`, `-=`, nor `x[k] = x[k] + e` or `x[k] - e`: accumulations, docs/autodiff.md) first tells
    `stops` which element, or which entry of a vector or matrix element (`_fuzz_over(x, k)`,
    `_fuzz_over(x[k], (r, c))`); stores to locals tell it nothing. Runs after _Atomics (an atomic
    add is `x[k] = x[k] + e` then)."""

    def visit_FunctionDef(self, node):
        if any(ast.unparse(d) == "ti.ad.no_grad" for d in node.decorator_list):
            return _MarkStores().visit(node)
        return self.generic_visit(node)   # (the kernels are defined inside build())


class _MarkStores(ast.NodeTransformer):
    def visit_Assign(self, node):
        (target,) = node.targets
        if not isinstance(target, ast.Subscript) or _accumulates(node.value, ast.dump(_with_ctx(target, ast.Load()))):
            return node
        return [_mark(target, node), node]

    def visit_AugAssign(self, node):
        if not isinstance(node.target, ast.Subscript) or isinstance(node.op, (ast.Add, ast.Sub)):
            return node
        return [_mark(node.target, node), node]


def _accumulates(value, target: str) -> bool:
    """Is `value` the target's own old value plus or minus something (`x[k] + e`, `e + x[k]`,
    `x[k] - e`, and sums of those)?"""
    if ast.dump(value) == target:
        return True
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add):
        return _accumulates(value.left, target) or _accumulates(value.right, target)
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Sub):
        return _accumulates(value.left, target)
    return False


def _mark(target, node):
    call = ast.Call(ast.Name("_fuzz_over", ast.Load()),
                    [_with_ctx(target.value, ast.Load()), _with_ctx(target.slice, ast.Load())], [])
    return ast.fix_missing_locations(ast.copy_location(ast.Expr(call), node))


def _fuzz_over(obj, key) -> None:
    stops.overwrite(obj, key)


def run_module(source: str, filename: str = "<fuzz>", instrument: bool = True) -> dict:
    """Execute `source` with comparisons instrumented (unless not `instrument`) and the
    overwrites of no_grad kernels marked; returns its namespace."""
    tree = ast.fix_missing_locations(_Overwrites().visit(_Atomics().visit(ast.parse(source))))
    if instrument:
        tree = ast.fix_missing_locations(_Comparisons().visit(tree))
    ns = {"_fuzz_cmp": _fuzz_cmp, "_fuzz_over": _fuzz_over, "__name__": "fuzz_shim_program"}
    exec(compile(tree, filename, "exec"), ns)
    return ns


# ---- values --------------------------------------------------------------------------------
# Plain Python floats throughout: central differences run a program once per input element, and
# NumPy's per-call cost on 2- to 9-element arrays would dominate.

class Vec:
    """A small vector (shape (n,)) or matrix ((n, m), entries row by row) with value semantics,
    like a Taichi local. A value read from a field remembers where it came from, so that
    `x[i][r, c] += e` writes through to the field."""

    __slots__ = ("e", "shape", "owner")

    def __init__(self, e: list, shape: tuple, owner=None):
        self.e = e            # a list of floats, owned by this value
        self.shape = shape
        self.owner = owner    # (the field's dict, key) or None

    def _op(self, other, f):
        if isinstance(other, Vec):
            assert other.shape == self.shape, (self.shape, other.shape)
            return Vec([f(x, y) for x, y in zip(self.e, other.e)], self.shape)
        return Vec([f(x, other) for x in self.e], self.shape)

    def _rop(self, other, f):
        return Vec([f(other, x) for x in self.e], self.shape)

    __add__ = lambda s, o: s._op(o, operator.add)
    __sub__ = lambda s, o: s._op(o, operator.sub)
    __mul__ = lambda s, o: s._op(o, operator.mul)
    __truediv__ = lambda s, o: s._op(o, operator.truediv)
    __radd__ = lambda s, o: s._rop(o, operator.add)
    __rsub__ = lambda s, o: s._rop(o, operator.sub)
    __rmul__ = lambda s, o: s._rop(o, operator.mul)
    __rtruediv__ = lambda s, o: s._rop(o, operator.truediv)

    def __neg__(self):
        return Vec([-x for x in self.e], self.shape)

    def _rows(self):
        n, m = self.shape
        return [self.e[r * m:(r + 1) * m] for r in range(n)]

    def _cols(self):
        n, m = self.shape
        return [self.e[c::m] for c in range(m)]

    def __matmul__(self, other):
        a, b = self.shape, other.shape
        if len(a) == 1 and len(b) == 1:
            return self.dot(other)
        if len(b) == 1:    # matrix @ vector
            assert a[1] == b[0]
            return Vec([_dot(r, other.e) for r in self._rows()], (a[0],))
        if len(a) == 1:    # vector @ matrix: a row vector
            assert a[0] == b[0]
            return Vec([_dot(self.e, c) for c in other._cols()], (b[1],))
        assert a[1] == b[0]
        return Vec([_dot(r, c) for r in self._rows() for c in other._cols()], (a[0], b[1]))

    def _flat(self, k):
        if isinstance(k, tuple):
            r, c = k
            n, m = self.shape
            assert 0 <= r < n and 0 <= c < m, (k, self.shape)
            return r * m + c
        assert len(self.shape) == 1 and 0 <= k < self.shape[0], (k, self.shape)
        return k

    def __getitem__(self, k):
        return self.e[self._flat(k)]

    def __setitem__(self, k, value):
        self.e[self._flat(k)] = float(value)
        if self.owner is not None:
            d, key = self.owner
            d[key] = list(self.e)

    @property
    def x(self):
        return self.e[0]

    @property
    def y(self):
        return self.e[1]

    def __getattr__(self, name):  # swizzles: .yx, .xx, ... (a new vector, as in Taichi)
        if len(name) > 1 and all(c in "xyzw" for c in name):
            return Vec([self.e["xyzw".index(c)] for c in name], (len(name),))
        raise AttributeError(name)

    def dot(self, other):
        assert self.shape == other.shape
        return _dot(self.e, other.e)

    def norm(self, eps=0.0):
        r = math.sqrt(self.norm_sqr() + eps)
        _note(r, 0.0)
        return r

    def norm_sqr(self):
        return _dot(self.e, self.e)

    def normalized(self, eps=0.0):
        return self * (1.0 / (self.norm() + eps))

    def transpose(self):
        n, m = self.shape
        return Vec([x for c in self._cols() for x in c], (m, n))

    def trace(self):
        n, m = self.shape
        return sum(self.e[k * m + k] for k in range(min(n, m)))

    def determinant(self):
        return _det(self._rows())

    def outer_product(self, other):
        return Vec([x * y for x in self.e for y in other.e], (len(self.e), len(other.e)))

    def sum(self):
        return sum(self.e)


def _dot(xs, ys):
    return sum(x * y for x, y in zip(xs, ys))


def _det(rows):
    """Laplace expansion along the first row."""
    if len(rows) == 1:
        return rows[0][0]
    return sum((-1) ** j * rows[0][j] * _det([r[:j] + r[j + 1:] for r in rows[1:]]) for j in range(len(rows)))


class _VectorNS:
    def __call__(self, e):
        return Vec([float(c) for c in e], (len(e),))

    @staticmethod
    def field(n, dtype, shape, needs_grad=False, needs_dual=False):
        return Field(dtype, shape, (n,))

    ndarray = field


class _MatrixNS:
    def __call__(self, rows):
        return Vec([float(c) for row in rows for c in row], (len(rows), len(rows[0])))

    @staticmethod
    def field(n, m, dtype, shape, needs_grad=False, needs_dual=False):
        return Field(dtype, shape, (n, m))

    ndarray = field


class _TypesNS:
    @staticmethod
    def ndarray(*args, **kwargs):
        return None


Vector, Matrix, types = _VectorNS(), _MatrixNS(), _TypesNS()


class Field:
    """A field or ndarray: its elements in a dict by index (an int, a tuple, or None for 0-d), a
    vector or matrix element as a flat list."""

    def __init__(self, dtype, shape, element_shape=()):
        self.shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.element_shape = tuple(element_shape)
        self.dtype = dtype
        self.from_numpy(np.zeros(self.shape + self.element_shape))

    def __getitem__(self, idx):
        return Vec(list(self.d[idx]), self.element_shape, (self.d, idx))

    def __setitem__(self, idx, value):
        assert value.shape == self.element_shape, (value.shape, self.element_shape)
        self.d[idx] = list(value.e)

    def __iter__(self):
        if len(self.shape) == 1:
            return iter(range(self.shape[0]))
        return itertools.product(*(range(s) for s in self.shape))

    def _keys(self):
        if not self.shape:
            return [None]
        return range(self.shape[0]) if len(self.shape) == 1 else itertools.product(*(range(s) for s in self.shape))

    def from_numpy(self, arr):
        arr = np.asarray(arr, np.int64 if self.dtype == i32 else np.float64).reshape(self.shape + self.element_shape)
        flat = arr.reshape((-1,) + ((int(np.prod(self.element_shape)),) if self.element_shape else ())).tolist()
        self.d = dict(zip(self._keys(), flat))

    def to_numpy(self):
        out = np.zeros(self.shape + self.element_shape, np.int64 if self.dtype == i32 else np.float64)
        for k, x in self.d.items():
            out[() if k is None else k] = np.reshape(x, self.element_shape) if self.element_shape else x
        return out


class ScalarField(Field):
    def __getitem__(self, idx):
        return self.d[idx]

    def __setitem__(self, idx, value):
        self.d[idx] = int(value) if self.dtype == i32 else float(value)


def field(dtype, shape, needs_grad=False, needs_dual=False):
    return ScalarField(dtype, shape)


ndarray = field


# ---- gradients stopped on purpose ----------------------------------------------------------
# ti.stop_grad and @ti.ad.no_grad cut a path on purpose: the reference derivative is that of the
# program with what they stop held at its unperturbed value. Central differences get it from a
# recorded run: the unperturbed run (record) keeps, per kernel launch, every value ti.stop_grad
# returned, the fields ti.stop_grad(field) named as they were at the launch, and what each
# @ti.ad.no_grad launch did to each element; the perturbed runs (replay) return those values, read
# those fields as they were, and redo what the no_grad launch did, as constants, instead of running
# it (docs/autodiff.md): an element (or entry of a vector or matrix element) it overwrote (a store
# _Overwrites marked) ends at the value it had at the end of the recorded launch, even when the
# launch accumulated into it after; one it only accumulated into gets what the launch added.
# Perturbed runs take the same branches (their inputs are MARGIN away from any switch), so the
# n-th stop_grad of a launch is the same one in both.

class _Stops:
    def __init__(self):
        self.mode = "off"        # "off" (identity), "record" or "replay"
        self.fields: list = []   # every field of the program (what a no_grad launch may change)
        self.top = 0             # the program's launch being run (a checkpoint runs several kernels)
        self.sub = 0             # kernels run so far in it
        self.log: dict = {}      # (top, sub) -> [values], {id(field): its dict}, no_grad effects
        self.cur = None
        self.pos = 0
        self.frozen: list = []   # replay: (field, its dict) put back when the kernel ends
        self.over: set | None = None  # record, in a no_grad launch: (id(dict), key, entry or None) overwritten

    def launch(self, top: int) -> None:
        self.top, self.sub = top, 0

    def run_kernel(self, fn, no_grad: bool, args):
        key = (self.top, self.sub)
        self.sub += 1
        if self.mode == "record":
            self.cur = self.log[key] = ([], {}, [])
            if no_grad:
                return self._record_no_grad(fn, args)
            return fn(*args)
        self.cur, self.pos = self.log[key], 0
        if no_grad:
            for f, k, held, dv in self.cur[2]:
                f.d[k] = _redo(f.d[k], held, dv)
            return None
        try:
            out = fn(*args)
        finally:
            for f, d in self.frozen:
                f.d = d
            self.frozen = []
        assert self.pos == len(self.cur[0]), "a perturbed run met another number of ti.stop_grad calls"
        return out

    def _record_no_grad(self, fn, args):
        """Run a no_grad kernel, keeping per element it changed or overwrote: (field, key, which
        entries it overwrote, their final values or what was added to the others)."""
        pre = [dict(f.d) for f in self.fields]
        self.over = set()
        try:
            out = fn(*args)
            over = self.over
        finally:
            self.over = None
        for f, d0 in zip(self.fields, pre):
            for k, v in f.d.items():
                whole = (id(f.d), k, None) in over
                if isinstance(v, list):
                    held = [whole or (id(f.d), k, c) in over for c in range(len(v))]
                else:
                    held = whole
                if v != d0[k] or (any(held) if isinstance(held, list) else held):
                    self.cur[2].append((f, k, held, _minus(v, d0[k], held)))
        return out

    def overwrite(self, obj, key) -> None:
        """A no_grad kernel's store is about to overwrite element `key` of field obj, or entry
        `key` of the vector or matrix element obj read from a field."""
        if self.over is None:
            return
        if isinstance(obj, Field):
            self.over.add((id(obj.d), key, None))
        elif isinstance(obj, Vec) and obj.owner is not None:
            d, k = obj.owner
            self.over.add((id(d), k, obj._flat(key)))

    def stop(self, x):
        if isinstance(x, Field):
            if self.mode == "record" and id(x) not in self.cur[1]:
                self.cur[1][id(x)] = dict(x.d)   # the kernel does not write it: as it was at the launch
            elif self.mode == "replay" and all(f is not x for f, _ in self.frozen):
                self.frozen.append((x, x.d))
                x.d = self.cur[1][id(x)]
            return None
        if self.mode == "record":
            self.cur[0].append(_copy(x))
        elif self.mode == "replay":
            assert self.pos < len(self.cur[0]), "a perturbed run met more ti.stop_grad calls"
            x = self.cur[0][self.pos]
            self.pos += 1
        elif isinstance(x, float):
            return _Stopped(x)   # for _note
        return _copy(x)


def _copy(x):
    return Vec(list(x.e), x.shape) if isinstance(x, Vec) else x


def _minus(a, b, held):
    """What a no_grad launch did to an element: its final value where `held`, else what it added."""
    if isinstance(a, list):
        return [x if h else x - y for x, y, h in zip(a, b, held)]
    return a if held else a - b


def _redo(v, held, dv):
    if isinstance(v, list):
        return [d if h else x + d for x, h, d in zip(v, held, dv)]
    return dv if held else v + dv


stops = _Stops()


def stop_grad(x):
    return stops.stop(x)


def kernel(fn):
    def launch(*args):
        return fn(*args) if stops.mode == "off" else stops.run_kernel(fn, launch.no_grad, args)
    launch.no_grad = False
    return launch


class _AdNS:
    @staticmethod
    def no_grad(k):
        k.no_grad = True
        return k

    @staticmethod
    def checkpoint(step, steps, state, snapshots=None, schedule="revolve"):
        for t in range(steps):
            step(t)


ad = _AdNS()


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


tanh, exp, log, sqrt, atan2 = math.tanh, math.exp, math.log, math.sqrt, math.atan2

# sin and cos of a large argument: float32 rounds the argument by |x| * 6e-8 before the function
# sees it, so the result says little (cos(h(p)) with h(p) ~ 4e3 was off by 5e-3: fuzz seed 3482)
_trig = [0.0]


def trig_arg() -> float:
    """The largest |x| of ti.sin(x) / ti.cos(x) since reset_margin()."""
    return _trig[0]


def sin(x):
    if _noting[0] and builtins.abs(x) > _trig[0]:
        _trig[0] = builtins.abs(x)
    return math.sin(x)


def cos(x):
    if _noting[0] and builtins.abs(x) > _trig[0]:
        _trig[0] = builtins.abs(x)
    return math.cos(x)
