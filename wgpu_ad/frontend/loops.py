"""Loop iterables (range, ti.ndrange, ti.grouped, struct-for over fields) and serial loops.

Every iterable becomes a list of (lo, hi) dimensions; the parallel loop (kernel.py) flattens
them into one range and the serial loop nests RANGE_FORs.
"""
from __future__ import annotations

import ast
import builtins as _py
import itertools
from dataclasses import dataclass

from ..ir.ops import Op
from ..types import i32
from .context import LoopCtx
from .methods import field_like, static
from .values import Mat, is_static


class NdRange:
    """ti.ndrange(4, (1, 5)): a multi-dimensional range; iterable in Python scope too."""

    def __init__(self, *dims):
        self.dims = []
        for d in dims:
            if isinstance(d, (tuple, list)):
                if len(d) != 2:
                    raise ValueError(f"ti.ndrange dimension must be an extent or a (begin, end) pair, got {d!r}")
                self.dims.append((d[0], d[1]))
            else:
                self.dims.append((0, d))

    def __iter__(self):
        it = itertools.product(*(_py.range(lo, hi) for lo, hi in self.dims))
        return it if len(self.dims) != 1 else (t[0] for t in it)


class Grouped:
    """ti.grouped(x): iterate index vectors instead of separate indices."""

    def __init__(self, x):
        self.x = x

    def __iter__(self):
        src = self.x if isinstance(self.x, NdRange) else NdRange(*getattr(self.x, "shape", ()))
        for t in itertools.product(*(_py.range(lo, hi) for lo, hi in src.dims)):
            yield t


def ndrange(*dims) -> NdRange:
    return NdRange(*dims)


def grouped(x) -> Grouped:
    return Grouped(x)


# called in a kernel with GPU values (kernel arguments, ndarray shapes), these build the loop's
# description at compile time: lower_call (methods.py) calls them like a compile-time function
ndrange._wgpu_ad_iterable = True
grouped._wgpu_ad_iterable = True


@dataclass
class LoopSpec:
    dims: list            # [(lo, hi)], ints or i32 Stmts
    grouped: bool = False
    step: int = 1
    static_items: object = None  # a Python iterable to unroll, when the loop is static


def analyze_iter(fl, node: ast.For) -> LoopSpec:
    it = node.iter
    if isinstance(it, ast.Call):
        callee = fl.visit(it.func)
        if callee is _py.range:
            args = [fl.visit(a) for a in it.args]
            if not 1 <= len(args) <= 3:
                raise fl.error(it, "range() takes 1 to 3 arguments")
            for a in args:
                if isinstance(a, Mat) or (is_static(a) and not isinstance(a, int)):
                    raise fl.error(it, f"range() bounds must be integers, got {a!r}")
                if not is_static(a) and a.dtype.is_float:
                    raise fl.error(it, "range() bounds must be integers; convert with int(...)")
            lo, hi = (0, args[0]) if len(args) == 1 else (args[0], args[1])
            step = args[2] if len(args) == 3 else 1
            if not (is_static(step) and isinstance(step, int)) or step == 0:
                raise fl.error(it, "range() step must be a nonzero compile-time integer")
            return LoopSpec([(_i32(fl, lo), _i32(fl, hi))], step=step)
        if callee is static:
            v = fl.visit(it)
            if isinstance(v, Grouped):  # ti.static(ti.grouped(ti.ndrange(3, 3))): index vectors, as in Taichi
                return LoopSpec([], static_items=[Mat(list(t), (len(t),)) for t in v])
            return LoopSpec([], static_items=v.entries if isinstance(v, Mat) else v)
    v = fl.visit(it)
    if isinstance(v, NdRange):
        return LoopSpec([(_i32(fl, lo), _i32(fl, hi)) for lo, hi in v.dims])
    if isinstance(v, Grouped):
        inner = v.x
        if isinstance(inner, NdRange):
            return LoopSpec([(_i32(fl, lo), _i32(fl, hi)) for lo, hi in inner.dims], grouped=True)
        if field_like(inner):
            return LoopSpec([(0, n) for n in inner.shape], grouped=True)
        raise fl.error(it, "ti.grouped() takes a field, an ndarray or a ti.ndrange")
    if field_like(v):
        if not v.shape:
            raise fl.error(it, "cannot loop over a 0-dimensional field")
        return LoopSpec([(0, n) for n in v.shape])
    if isinstance(v, Mat):
        return LoopSpec([], static_items=v.entries if v.is_vector else [Mat(r, (v.m,)) for r in v.rows()])
    if is_static(v) and hasattr(v, "__iter__"):
        return LoopSpec([], static_items=v)
    raise fl.error(it, f"cannot iterate over {type(v).__name__} in a kernel")


def _i32(fl, v):
    if is_static(v):
        return int(v)
    return fl.o.cast(v, i32)


def bind_targets(fl, node: ast.For, spec: LoopSpec, indices: list) -> dict:
    """Loop variables -> index values; grouped loops bind one vector."""
    t = node.target
    if spec.grouped:
        if not isinstance(t, ast.Name):
            raise fl.error(t, "a ti.grouped loop has exactly one loop variable (an index vector)")
        return {t.id: Mat(list(indices), (len(indices),))}
    names = [t] if isinstance(t, ast.Name) else list(t.elts) if isinstance(t, (ast.Tuple, ast.List)) else None
    if names is None or not all(isinstance(n, ast.Name) for n in names):
        raise fl.error(t, "loop variables must be plain names")
    if len(names) != len(indices):
        raise fl.error(t, f"the loop has {len(indices)} dimension(s) but {len(names)} loop variable(s)")
    return {n.id: ix for n, ix in zip(names, indices)}


def trip_count(fl, lo, hi, step: int):
    o = fl.o
    if step == 1:
        return lo, hi
    span = o.binary(Op.SUB, hi, lo) if step > 0 else o.binary(Op.SUB, lo, hi)
    s = abs(step)
    n = o.binary(Op.FLOORDIV, o.binary(Op.ADD, span, s - 1), s)
    return 0, o.binary(Op.MAX, n, 0)


def lower_serial_for(fl, node: ast.For) -> None:
    spec = analyze_iter(fl, node)
    if spec.static_items is not None:
        for item in spec.static_items:
            fl.loops.append(LoopCtx("static"))
            fl.scopes.append({})
            try:
                fl._bind_static_target(node.target, item)
                fl.lower_body(node.body)
            finally:
                fl.scopes.pop()
                fl.loops.pop()
        return
    o, b = fl.o, fl.b
    indices, bindings = [], None
    outer = None
    block = b.block
    nd = len(spec.dims)
    for k, (lo, hi) in enumerate(spec.dims):
        lo2, hi2 = trip_count(fl, lo, hi, spec.step)
        with b.at(block):
            loop = b.range_for(o.to_stmt(lo2, i32), o.to_stmt(hi2, i32),
                               name=loop_var_name(node.target, k, spec.grouped))
        outer = outer or loop
        block = loop.blocks[0]
        with b.at(block):
            ix = b.loop_index(loop, name=loop.name)
            if spec.step != 1:
                ix = o.binary(Op.ADD, lo, o.binary(Op.MUL, ix, spec.step))
        indices.append(ix)
    bindings = bind_targets(fl, node, spec, indices)
    with b.at(block):
        fl._loop_body(LoopCtx("multi" if nd > 1 else "serial", outer), node.body, bindings)
    fl._after_loop(node)


def loop_var_name(t: ast.expr, k: int, grouped: bool) -> str | None:
    if isinstance(t, ast.Name):
        return t.id if not grouped else f"{t.id}_{k}"
    if isinstance(t, (ast.Tuple, ast.List)) and k < len(t.elts) and isinstance(t.elts[k], ast.Name):
        return t.elts[k].id
    return None
