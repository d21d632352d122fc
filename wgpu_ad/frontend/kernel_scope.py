"""Kernel-scope variables: which top-level statements of a kernel only define values (pure: they
write no field, draw no random number, print nothing and call only such functions), and their
recomputation at the start of every later task that may use them, refused when a task in between
wrote a field they read. kernel.py decides what runs where; this says what may run again.
"""
from __future__ import annotations

import ast
import builtins
import types

from ..ir.nodes import Block, Task, walk
from ..ir.ops import Op
from . import builtins as B
from .context import static_globals
from .inline import inlinable
from .kernel_context import KernelContext
from .lower import FuncLowerer
from .methods import static


def is_pure(fl_globals: dict, st: ast.stmt) -> bool:
    """A top-level statement that only defines locals: safe to recompute in every task."""
    if not isinstance(st, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.If, ast.Expr)):
        return False
    if isinstance(st, ast.Expr):
        return False
    for n in ast.walk(st):
        if isinstance(n, (ast.Subscript, ast.Attribute)) and isinstance(n.ctx, ast.Store):
            return False
        if isinstance(n, (ast.Return, ast.For, ast.While)):
            return False
        if isinstance(n, ast.Call):
            f = resolve(fl_globals, n.func)
            if _is_print(f, n.func):
                return False
            if f is B.random or (isinstance(f, B.Builtin) and f.ref_first_arg) or \
                    _callee(f) is not None and not _func_is_pure(_callee(f), set()):
                return False
    return True


def _func_is_pure(f, seen: set) -> bool:
    """A @ti.func that computes a value only: it writes no field or ndarray element (nor any
    subscript or attribute: a local vector's component counts, conservatively), draws no random
    number, makes no atomic, and calls only such functions. Its value can be recomputed in every
    task like any kernel-scope expression."""
    if id(f) in seen:
        return False  # recursion: not inlinable anyway
    seen.add(id(f))
    try:
        tree = f.parsed().tree
    except Exception:
        return False
    g = static_globals(f.fn)
    for n in ast.walk(tree):
        if isinstance(n, (ast.Subscript, ast.Attribute)) and isinstance(n.ctx, ast.Store):
            return False
        if isinstance(n, ast.Call):
            c = resolve(g, n.func)
            if _is_print(c, n.func):
                return False  # printing is an effect: not recomputed in every task
            if c is B.random or (isinstance(c, B.Builtin) and c.ref_first_arg):
                return False
            if _callee(c) is not None and not _func_is_pure(_callee(c), seen):
                return False
    return True


def _callee(f):
    """The function a kernel-scope call inlines, if any (a method's function, for obj.f(...))."""
    return inlinable(f.__func__ if isinstance(f, types.MethodType) else f)


def _is_print(resolved, func: ast.expr) -> bool:
    return resolved is builtins.print or (resolved is None and isinstance(func, ast.Name) and func.id == "print")


def resolve(g: dict, node):
    if isinstance(node, ast.Name):
        return g.get(node.id)
    if isinstance(node, ast.Attribute):
        base = resolve(g, node.value)
        return getattr(base, node.attr, None) if base is not None else None
    return None


def loop_is_static(fl: FuncLowerer, node: ast.For) -> bool:
    it = node.iter
    return isinstance(it, ast.Call) and resolve(fl.globals, it.func) is static


def with_env(fl: FuncLowerer, env: dict, f):
    fl.scopes[0].update(env)
    return f()


def _written(task: Task) -> set:
    out = set()
    for blk in (task.bounds, task.body):
        for s in walk(blk):
            if s.op is Op.GLOBAL_STORE:
                out.add(s.attr)
            elif s.op is Op.ATOMIC:
                out.add(s.attr[1])
    return out


def forget_moved(fl: FuncLowerer, k: KernelContext) -> None:
    """Variables an earlier serial part assigned cannot reach this task: looking them up gives
    the error that says why, instead of their stale recomputed value."""
    for scope in fl.scopes:
        for name in k.moved_names:
            scope.pop(name, None)


def replay(fl: FuncLowerer, entry, tasks: list[Task]) -> None:
    """Recompute a kernel-scope variable definition in a later task; refuse when a task in
    between wrote a field it reads (the recomputed value would differ from Python's order)."""
    st, env, before = entry
    block = fl.b.block
    start = len(block.stmts)
    with_env(fl, env, lambda: fl.visit(st))
    reads = {s.attr for s in walk(Block(block.stmts[start:])) if s.op is Op.GLOBAL_LOAD}
    for t in tasks[before:]:
        clash = reads & _written(t)
        if clash:
            names = ", ".join(sorted(f"'{b.name}'" for b in clash))
            raise fl.error(st, f"this kernel-scope variable reads field {names}, which a later loop of the kernel "
                               f"writes before the variable is used again; wgpu_ad recomputes kernel-scope variables "
                               f"in every GPU pass, so the value would change. Read the field inside the loop that "
                               f"uses it, or split the kernel in two")
