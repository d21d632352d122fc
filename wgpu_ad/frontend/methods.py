"""Calls in kernels (builtins, ti.func inlining, vector methods, constructors) and references."""
from __future__ import annotations

import ast
import builtins as _py
import types

from ..errors import UnsupportedError
from ..ir.nodes import Stmt
from ..ir.ops import Op
from ..types import DType, MatrixType, VectorType, f32, i32, to_dtype, u1
from . import builtins as B
from .inline import NUMERIC_MODULES, PlainFunc, inline_func, inlinable, module_root
from .printing import lower_print
from .refs import (GlobalRef, Ref, bounds_assert, component_ref, dynamic_component_ref, linear_index,
                   swizzle_ref)
from .values import Mat, dtype_of, is_static


class StaticMarker:
    """ti.static(x): returns x in Python scope; in kernels it demands a compile-time value."""

    def __call__(self, x, *more):
        return (x,) + more if more else x


static = StaticMarker()


class LoopConfig:
    def __call__(self, block_dim=None, serialize=False, parallelize=None, block_dim_adaptive=None):
        return None  # Python scope: no effect


loop_config = LoopConfig()


def field_like(v) -> bool:
    return hasattr(v, "gpu_buffer") or getattr(v, "is_array_arg", False)


def global_ref(fl, obj, key, node) -> GlobalRef:
    """obj[key] for a field / ndarray (global or kernel argument)."""
    o = fl.o
    if getattr(obj, "is_array_arg", False):
        buf, shape, label_name = obj.buffer, list(obj.shape), obj.name
        what = f"ndarray '{obj.name}'"
    else:
        buf = fl.k.buffer_for(obj)
        shape, label_name = list(obj.shape), obj.name or "?"
        what = f"field '{label_name}'"
    if key is None:
        keys = []
    else:
        raw = list(key) if isinstance(key, tuple) else [key]
        keys = []
        for kv in raw:
            keys.extend(kv.entries if isinstance(kv, Mat) else [kv])
    if len(keys) != len(shape):
        if not shape:
            raise fl.error(node, f"{what} is 0-dimensional: index it with [None]")
        raise fl.error(node, f"{what} has {len(shape)} dimension(s) but is indexed with {len(keys)} index(es)")
    ints = []
    for kv in keys:
        if isinstance(kv, (list, tuple)) or kv is None:
            raise fl.error(node, f"bad index {kv!r} for {what}")
        dt = dtype_of(kv)
        if dt.is_float:
            raise fl.error(node, f"index of {what} must be an integer, got {dt}; convert it with int(...)")
        if is_static(kv) and isinstance(shape[len(ints)], int) and not 0 <= kv < shape[len(ints)]:
            raise fl.error(node, f"index {kv} is out of range for axis {len(ints)} of {what} with shape {tuple(shape)}")
        ints.append(o.cast(kv, i32) if not is_static(kv) else kv)
    label = f"{label_name}[{', '.join(ast.unparse(node.slice).split(', ')) if hasattr(ast, 'unparse') else '...'}]"
    if fl.k.debug and shape:
        bounds_assert(o, ints, shape, fl.k.name, what)
    elem = obj.element_shape
    esize = 1
    for e in elem:
        esize *= e
    flat = linear_index(o, ints, shape, esize) if shape else o.to_stmt(0, i32)
    indices = [flat] if esize == 1 else [o.to_stmt(o.binary(Op.ADD, flat, c), i32) for c in range(esize)]
    return GlobalRef(buf, indices, tuple(elem), label, [tuple(ints) + (c,) for c in range(esize)])


def eval_ref_or_value(fl, node: ast.expr, store: bool = False):
    """Like visiting an expression, but a field element (or a component/swizzle of one) comes
    back as a GlobalRef and a mutable local as its LocalRef, so it can be assigned to."""
    if isinstance(node, ast.Name):
        return fl.lookup(node.id, node)
    if isinstance(node, ast.Subscript):
        base = eval_ref_or_value(fl, node.value)
        key = fl.visit(node.slice)
        if field_like(base):
            return global_ref(fl, base, key, node)
        if isinstance(base, Ref):
            static_key = is_static(key) and not isinstance(key, (list,)) and key is not None
            if static_key and all(isinstance(k, int) for k in (key if isinstance(key, tuple) else (key,))):
                return component_ref(fl.o, base, key)
            if store and base.shape and key is not None and not isinstance(key, (list, Mat)) and all(
                    not isinstance(k, Mat) for k in (key if isinstance(key, tuple) else (key,))):
                return dynamic_component_ref(fl.o, base, key)  # m[i][j, k] = ... with j, k on the GPU
            base = base.load(fl.o)
        return fl._mat_index(base, key, node) if isinstance(base, Mat) else fl._index_static(base, key, node)
    if isinstance(node, ast.Attribute):
        base = eval_ref_or_value(fl, node.value)
        if isinstance(base, Ref):
            r = swizzle_ref(fl.o, base, node.attr)
            if r is not None:
                return r
            base = base.load(fl.o)
        return fl._attr_value(base, node)
    return fl.visit(node)


def make_ref(fl, node: ast.expr) -> Ref:
    r = eval_ref_or_value(fl, node, store=True)
    if isinstance(r, Ref):
        return r
    if isinstance(node, ast.Name):
        raise fl.error(node, f"'{node.id}' cannot be modified here: it is not a mutable variable "
                             f"(a name assigned only once is a constant in kernels; assign it a first value "
                             f"before changing it)")
    raise fl.error(node, "this expression cannot be assigned to; only variables and field elements can")


class MatMethod:
    """A bound method of a vector/matrix value, e.g. v.norm."""

    def __init__(self, m: Mat, name: str, node):
        self.m, self.name, self.node = m, name, node

    def call(self, fl, args, kwargs):
        o, m, n = fl.o, self.m, self.name
        table = {
            "norm": lambda eps=0: o.norm(m, eps),
            "norm_sqr": lambda: o.norm_sqr(m),
            "norm_inv": lambda eps=0: o.binary(Op.DIV, 1.0, o.norm(m, eps)),
            "normalized": lambda eps=0: o.normalized(m, eps),
            "dot": lambda w: o.dot(m, w),
            "cross": lambda w: o.cross(m, w),
            "outer_product": lambda w: o.outer(m, w),
            "transpose": lambda: o.transpose(m),
            "determinant": lambda: o.determinant(m),
            "inverse": lambda: o.inverse(m),
            "sum": lambda: o.reduce(Op.ADD, m),
            "max": lambda: o.reduce(Op.MAX, m),
            "min": lambda: o.reduce(Op.MIN, m),
            "trace": lambda: o.sum([m.at(i, i) for i in range(min(m.n, m.m))]),
            "cast": lambda dtype: o.cast(m, to_dtype(dtype), explicit=True),
            "any": lambda: o.reduce(Op.OR, Mat([o.truth(e) for e in m.entries], m.shape)),
            "all": lambda: o.reduce(Op.AND, Mat([o.truth(e) for e in m.entries], m.shape)),
        }
        if n not in table:
            raise fl.error(self.node, f"vectors/matrices have no method '{n}' in kernels")
        try:
            return table[n](*args, **kwargs)
        except TypeError as e:
            raise fl.error(self.node, f"bad arguments to .{n}(): {e}") from None


def construct(fl, kind: str, args, kwargs, node):
    """ti.Vector([...]) / ti.Matrix([[...]]) / ti.math.vec3(...) in a kernel."""
    dt = kwargs.pop("dt", None) or kwargs.pop("dtype", None)
    if kwargs:
        raise fl.error(node, f"unexpected keyword(s) {sorted(kwargs)}")
    if len(args) != 1:
        raise fl.error(node, f"ti.{kind}() takes one list")
    data = args[0]
    if isinstance(data, Mat):
        m = data
    elif kind == "Matrix" and isinstance(data, (list, tuple)) and data and isinstance(data[0], (list, tuple, Mat)):
        rows = [list(r.entries) if isinstance(r, Mat) else list(r) for r in data]
        if len({len(r) for r in rows}) != 1:
            raise fl.error(node, "matrix rows must have the same length")
        m = Mat([e for r in rows for e in r], (len(rows), len(rows[0])))
    elif isinstance(data, (list, tuple)):
        ents = []
        for e in data:
            ents.extend(e.entries if isinstance(e, Mat) else [e])
        m = Mat(ents, (len(ents),))
    else:
        raise fl.error(node, f"ti.{kind}() needs a list of values")
    return fl.o.cast(m, to_dtype(dt)) if dt is not None else m


def construct_typed(fl, t, args, node):
    """ti.math.vec3(1, 2, 3) / vec3(v.xy, 0) / mat2([[..],[..]]) / vec3(0)."""
    flat = []
    for a in args:
        if isinstance(a, Mat):
            flat.extend(a.entries)
        elif isinstance(a, (list, tuple)):
            for e in a:
                flat.extend(e.entries if isinstance(e, Mat) else (list(e) if isinstance(e, (list, tuple)) else [e]))
        else:
            flat.append(a)
    size = t.n if isinstance(t, VectorType) else t.n * t.m
    if len(flat) == 1:
        flat = flat * size
    if len(flat) != size:
        raise fl.error(node, f"{_type_name(t)} needs {size} values, got {len(flat)}")
    shape = (t.n,) if isinstance(t, VectorType) else (t.n, t.m)
    return fl.o.cast(Mat(flat, shape), t.dtype)


def _type_name(t) -> str:
    return f"vector({t.n}, {t.dtype})" if isinstance(t, VectorType) else f"matrix({t.n}, {t.m}, {t.dtype})"


def lower_call(fl, node: ast.Call):
    o = fl.o
    # the callee: a method of a vector value, or any other object
    if isinstance(node.func, ast.Attribute):
        base = eval_ref_or_value(fl, node.func.value)
        if isinstance(base, Ref):
            base = base.load(o)
        callee = MatMethod(base, node.func.attr, node) if isinstance(base, Mat) else fl._attr_value(base, node.func)
    else:
        callee = fl.visit(node.func)
    if isinstance(callee, (Mat, Stmt)):
        raise fl.error(node, _not_callable(callee, node))
    if isinstance(callee, MatMethod):
        args, kwargs = _args(fl, node)
        return callee.call(fl, args, kwargs)
    if callee is static:
        args, kwargs = _args(fl, node)
        for a in args:
            if not is_static(a) or isinstance(a, Stmt):
                raise fl.error(node, "ti.static() needs a value known at compile time (a Python constant, "
                                     "a template argument, a field's shape ...), not a value computed on the GPU")
        return args[0] if len(args) == 1 else tuple(args)
    if callee is loop_config:
        args, kwargs = _args(fl, node)
        fl.k.set_loop_config(node, **kwargs)
        return None
    if isinstance(callee, B.Builtin):
        if callee.ref_first_arg:
            if not node.args:
                raise fl.error(node, f"ti.{callee.name}() needs a target")
            target = eval_ref_or_value(fl, node.args[0], store=True)
            if hasattr(target, "gpu_buffer") and target.shape == ():
                # ti.atomic_add(loss, v) with a 0-d field: its element, as loss[None]
                sub = ast.copy_location(ast.Subscript(node.args[0], ast.Constant(None), ast.Load()), node.args[0])
                ref = global_ref(fl, target, None, sub)
            else:
                ref = make_ref(fl, node.args[0])
            rest = [fl.visit(a) for a in node.args[1:]]
            return callee.lower(o, ref, *rest)
        args, kwargs = _args(fl, node)
        if callee is B.random:
            fl.k.uses_random = True
        try:
            return callee.lower(o, *args, **kwargs)
        except TypeError as e:
            raise fl.error(node, f"bad arguments to ti.{callee.name}(): {e}") from None
    func, first = inlinable(callee), []
    bound = callee if isinstance(callee, types.MethodType) else getattr(callee, "__call__", None)
    if func is None and isinstance(bound, types.MethodType) and not isinstance(callee, type):
        func = inlinable(bound.__func__)  # obj.method(...) or a callable object: self comes first
        first = [bound.__self__]
    if func is not None:
        args, kwargs = _args(fl, node)
        if isinstance(func, PlainFunc) and all(is_static(a) for a in args) and \
                all(is_static(v) for v in kwargs.values()) and func.python_only():
            return callee(*args, **kwargs)  # Python-only code on compile-time values: run it
        return inline_func(fl, func, first + args, kwargs, node)
    if getattr(callee, "_wgpu_ad_kernel", False):
        raise fl.error(node, "a kernel cannot call another kernel; decorate the callee with @ti.func instead")
    if isinstance(callee, (VectorType, MatrixType)):
        args, kwargs = _args(fl, node)
        return construct_typed(fl, callee, args, node)
    ctor = getattr(callee, "_wgpu_ad_construct", None)
    if ctor is not None:
        args, kwargs = _args(fl, node)
        return construct(fl, ctor, args, kwargs, node)
    if callee is _py.print:
        return lower_print(fl, node)
    args, kwargs = _args(fl, node)
    if callee is _py.sum:
        return lower_sum(fl, node, args, kwargs)
    all_static = all(is_static(a) for a in args) and all(is_static(v) for v in kwargs.values())
    if callee in (_py.int, _py.float):
        dt = i32 if callee is _py.int else f32
        return callee(args[0]) if all_static else o.cast(args[0], dt)
    if callee is _py.len:
        a = args[0]
        return a.n if isinstance(a, Mat) else len(a)
    if getattr(callee, "_wgpu_ad_iterable", False):  # ti.ndrange / ti.grouped: built at compile time
        if kwargs:
            raise fl.error(node, f"ti.{callee.__name__}() takes no keyword arguments")
        if callee.__name__ == "ndrange":
            for d in (d for a in args for d in (a if isinstance(a, (tuple, list)) else (a,))):
                if isinstance(d, Mat) or isinstance(d, float) or (isinstance(d, Stmt) and d.dtype.is_float):
                    raise fl.error(node, "ti.ndrange() bounds must be integers; convert with int(...)")
        try:
            return callee(*args)
        except ValueError as e:
            raise fl.error(node, str(e)) from None
    if callee is _py.range and not all_static:
        raise fl.error(node, "range() with GPU-computed bounds can only be used as a for loop's iterable")
    if callee in B.PY_BUILTINS:
        if all_static and not _holds_gpu_values(args):  # max([a, b]): a list of GPU values is not static
            return callee(*args, **kwargs)
        return B.PY_BUILTINS[callee].lower(o, *args, **kwargs)
    if isinstance(callee, DType):
        return callee.np.type(args[0]).item() if all_static else o.cast(args[0], callee, explicit=True)
    if all_static and callable(callee):
        try:
            return callee(*args, **kwargs)  # plain Python on compile-time values (like ti.static code)
        except TypeError:
            if not _holds_gpu_values([*args, *kwargs.values()]):
                raise
            # sorted([a, b]) and the like: GPU values inside a list; the error below says so
    name = getattr(callee, "__name__", type(callee).__name__)
    lib = module_root(callee)
    if lib in NUMERIC_MODULES:
        raise fl.error(node, f"'{ast.unparse(node.func)}' is a {_LIBRARY_NAMES.get(lib, lib)} function and cannot run "
                             f"on GPU values in a kernel; use {_ti_equivalent(name)}")
    origin = f" (from {lib.lstrip('_')})" if lib and lib != "builtins" else ""
    raise fl.error(node, f"'{name}'{origin} cannot run on GPU values in a kernel: only "
                         f"@ti.func, Python functions and lambdas defined in your code, and wgpu_ad builtins can")


def lower_sum(fl, node: ast.Call, args: list, kwargs: dict):
    """Python's sum() over a list, tuple or vector holding kernel values: unrolled into additions,
    left to right as Python adds (so its gradient is that of the additions)."""
    if not 1 <= len(args) + len(kwargs) <= 2 or set(kwargs) - {"start"} or (len(args) == 2 and kwargs):
        raise fl.error(node, "sum() takes a list, tuple or vector and an optional start value")
    items = args[0] if args else None
    has_start = len(args) == 2 or "start" in kwargs
    start = args[1] if len(args) == 2 else kwargs.get("start", 0)
    if isinstance(items, Mat):
        if not items.is_vector:
            raise fl.error(node, "sum() of a matrix would add its rows; for the sum of its entries write m.sum()")
        items = items.entries
    if not isinstance(items, (list, tuple)):
        raise fl.error(node, f"sum() in a kernel needs a list, tuple or vector of values, got "
                             f"{_value_kind(items)}; a sum over a loop is written 's += ...' in a for loop")
    if is_static(start) and not _holds_gpu_values(items):
        return _py.sum(items, start)  # all Python values: evaluated when the kernel is compiled
    acc, first = (start, 0) if has_start or not items else (items[0], 1)
    if isinstance(acc, Stmt) and acc.dtype == u1:
        acc = fl.o.cast(acc, i32)  # sum([a > 0, b > 0]) counts, as in Python (True + True == 2)
    for e in items[first:]:
        if isinstance(e, (list, tuple)):
            raise fl.error(node, "sum() in a kernel adds numbers, vectors or matrices, not lists")
        acc = fl.o.binary(Op.ADD, acc, e)
    return acc


def _holds_gpu_values(values) -> bool:
    """Whether a list / tuple (or one nested in it) holds values computed on the GPU."""
    return any(not is_static(v) or (isinstance(v, (list, tuple)) and _holds_gpu_values(v)) for v in values)


def _value_kind(v) -> str:
    if isinstance(v, Mat):
        return "a vector" if v.is_vector else "a matrix"
    if isinstance(v, Stmt):
        return f"a {v.dtype} value"
    return f"{type(v).__name__} {v!r}"


def _not_callable(v, node: ast.Call) -> str:
    """v(0) on a vector: what to write instead (v[0])."""
    name = ast.unparse(node.func)
    msg = f"'{name}' is {_value_kind(v)}, not a function: it cannot be called"
    if isinstance(v, Mat) and node.args and not node.keywords:
        msg += f"; to read an entry, index it with square brackets: {name}[{', '.join(map(ast.unparse, node.args))}]"
    return msg


_LIBRARY_NAMES = {"numpy": "NumPy", "math": "math module", "cmath": "cmath module", "torch": "PyTorch",
                  "scipy": "SciPy", "jax": "JAX", "cupy": "CuPy"}
# NumPy / math names whose wgpu_ad spelling differs (the rest: ti.<same name> where it exists)
_TI_SPELLING = {"arcsin": "ti.asin", "arccos": "ti.acos", "arctan": "ti.atan", "arctan2": "ti.atan2",
                "absolute": "ti.abs", "fabs": "ti.abs", "rint": "ti.round", "power": "ti.pow",
                "maximum": "ti.max", "fmax": "ti.max", "minimum": "ti.min", "fmin": "ti.min",
                "clip": "ti.math.clamp", "dot": "ti.math.dot (or a.dot(b))", "cross": "ti.math.cross",
                "norm": "v.norm()", "hypot": "ti.sqrt(x * x + y * y)", "square": "x * x",
                "exp2": "ti.math.exp2", "log2": "ti.math.log2", "degrees": "ti.math.degrees",
                "radians": "ti.math.radians", "sign": "ti.math.sign", "fmod": "x - y * ti.floor(x / y) or %",
                "inv": "m.inverse()", "det": "m.determinant()", "transpose": "m.transpose()",
                "svd": "ti.svd", "where": "ti.select"}


def _ti_equivalent(name: str) -> str:
    if name in _TI_SPELLING:
        return _TI_SPELLING[name]
    if isinstance(getattr(B, name, None), B.Builtin):
        return f"ti.{name}"
    return "the ti. functions (ti.sin, ti.exp, ti.sqrt, ti.math.clamp ...: see the README's supported list)"


def _args(fl, node: ast.Call):
    args = []
    for a in node.args:
        if isinstance(a, ast.Starred):
            v = fl.visit(a.value)
            args.extend(v.entries if isinstance(v, Mat) else v)
        else:
            args.append(fl.visit(a))
    kwargs = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise fl.error(node, "**kwargs is not supported in kernels", UnsupportedError)
        kwargs[kw.arg] = fl.visit(kw.value)
    return args, kwargs
