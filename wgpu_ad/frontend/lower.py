"""Python AST -> IR for the statements and expressions of kernels and ti.funcs.

One visit_<Node> per supported construct; anything else is refused with the file, line and a
caret. Kernel-level structure (which loop is parallel, tasks, arguments) is in kernel.py.

FuncLowerer is put together from three files: this one (errors and source locations, looking
names up and binding them), statements.py (the visit_ of each statement) and expressions.py (the
visit_ of each expression).
"""
from __future__ import annotations

import ast
import builtins as _pybuiltins

import numpy as np

from ..errors import CompileError, UnsupportedError, WgpuAdError
from ..ir.builder import Builder
from ..ir.nodes import Stmt
from ..ir.utils import adopt_name
from ..types import DType, i32, u1
from .context import LoopCtx, ParsedFunc, ReturnCtx, construct_name, static_globals
from .expressions import ExpressionLowering
from .refs import LocalRef, Ref
from .captured import is_number
from .statements import StatementLowering
from .values import Mat, Ops, dtype_of_entries, entry_names

__all__ = ["FuncLowerer", "ParsedFunc"]  # ParsedFunc: lang/kernel.py imports it from here


class FuncLowerer(StatementLowering, ExpressionLowering, ast.NodeVisitor):
    """Lowers one function body (the kernel's, or an inlined ti.func's) into the current block."""

    def __init__(self, kctx, pf: ParsedFunc, scopes: list[dict], ret: ReturnCtx):
        self.k = kctx                  # kernel_context.KernelContext: builder, buffers, args, config
        self.b: Builder = kctx.builder
        self.o: Ops = kctx.ops
        self.pf = pf
        self.globals = static_globals(pf.fn)
        self.scopes = scopes
        self.ret = ret
        self.loops: list[LoopCtx] = []

    def for_callee(self, pf: ParsedFunc, scope: dict, ret: ReturnCtx) -> "FuncLowerer":
        """A lowerer for an inlined ti.func's body (inline.py), emitting into the same kernel."""
        return FuncLowerer(self.k, pf, [scope], ret)

    # ---- errors and locations -------------------------------------------------------------
    def error(self, node: ast.AST, msg: str, cls=CompileError) -> CompileError:
        return cls(msg, self.pf.loc(node))

    def visit(self, node):
        return self.run_at(node, super().visit, node)

    def run_at(self, node: ast.AST, fn, *args):
        """fn(*args) with node as the IR's source location; an error without a location gets node's."""
        saved = self.b.loc
        if hasattr(node, "lineno"):
            self.b.loc = self.pf.loc(node)
        try:
            return fn(*args)
        except WgpuAdError as e:
            if isinstance(e, CompileError) and e.loc is not None:
                raise
            raise self.error(node, str(e)) from None
        finally:
            self.b.loc = saved

    def generic_visit(self, node):
        raise self.error(node, f"{construct_name(node)} is not supported in kernels", UnsupportedError)

    # ---- names ----------------------------------------------------------------------------
    def lookup(self, name: str, node: ast.AST):
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        if name in self.globals:
            v = self.globals[name]
            if hasattr(v, "gpu_buffer") and hasattr(v, "name_after"):
                v.name_after(name)  # name fields after the user's variable, for messages and WGSL
            elif is_number(v):
                self.k.captured.note_name(self.pf.fn, name, v, self.pf.loc(node))
            return _constant(v)
        if hasattr(_pybuiltins, name):
            return getattr(_pybuiltins, name)
        hint = self.k.moved_names.get(name)
        if hint:
            raise self.error(node, hint)
        raise self.error(node, f"name '{name}' is not defined")

    def value(self, v):
        """A name's binding as a value (loads locals)."""
        if isinstance(v, Ref):
            return v.load(self.o)
        return v

    def bind_new(self, name: str, value, node: ast.AST, dtype: DType | None = None):
        """Define a local. Names assigned once stay SSA values (and compile-time values stay
        compile-time); names assigned more than once get mutable slots (ALLOCA)."""
        numeric = isinstance(value, (Stmt, Mat, int, float, bool))
        shape = value.shape if isinstance(value, Mat) else ()
        entries = value.entries if isinstance(value, Mat) else [value]
        if dtype is None and (self.pf.assign_counts.get(name, 0) <= 1 or not numeric):
            for s, n in zip(entries, entry_names(name, shape)):
                if isinstance(s, Stmt):
                    adopt_name(s, n)
            self.scopes[-1][name] = value
            return
        if not numeric:
            raise self.error(node, f"cannot give '{name}' a type annotation: its value is a {type(value).__name__}")
        dt = dtype or dtype_of_entries(entries)
        if dt == u1:
            dt = i32
        slots = [self.b.alloca(dt, n) for n in entry_names(name, shape)]
        ref = LocalRef(slots, shape, name)
        ref.store(self.o, value)
        self.scopes[-1][name] = ref

    def _check_kernel_scope_write(self, name: str, depth: int, node):
        if self.k.in_parallel and self.ret.kind == "kernel" and depth < getattr(self, "parallel_scope", 0):
            raise self.error(node, f"kernel-scope variable '{name}' is assigned inside the parallel loop; its "
                                   f"iterations run at the same time, so its value would be undefined. Accumulate "
                                   f"with '{name} += ...' (an atomic reduction over the iterations, as in Taichi) "
                                   f"or into a field, or define '{name}' inside the loop")

    def loops_inside_func(self) -> bool:
        return any(l.kind == "serial" for l in self.loops)


def _constant(v):
    """Python-scope NumPy values (ti.Vector([...]) outside kernels, np.float32(...)) become
    compile-time constants: a 0-d array is a number, a small array a constant vector/matrix."""
    if isinstance(v, (np.generic, np.ndarray)) and v.dtype.kind in "fiub" and v.ndim == 0:
        return v.item()
    if isinstance(v, np.ndarray) and v.dtype.kind in "fiub" and v.ndim in (1, 2) and 0 < v.size <= 64:
        return Mat([x.item() for x in v.ravel()], tuple(v.shape))
    return v
