"""Kernel-scope reductions: a kernel-scope variable that a parallel loop only accumulates into with
+= or -= becomes an atomic sum over the loop's iterations (Taichi's meaning), held in a Scratch
buffer of the launch (kernel_context.py) and added to the variable after the loop.
"""
from __future__ import annotations

import ast
import copy
import math

from ..ir.nodes import Block, Stmt
from ..types import f32, i32
from .kernel_context import KernelContext, Scratch
from .kernel_scope import forget_moved, replay
from .values import Mat


_REDUCE_OPS = (ast.Add, ast.Sub)


def atomic_reductions(k: KernelContext, new_lowerer, task_env, prelude, tasks, st: ast.For, env: dict):
    """Kernel-scope variables that the parallel loop `st` only accumulates into with += or -=
    become atomic reductions (Taichi's meaning): returns the loop with `s += e` turned into
    `s_sum[None] += e` on a Scratch, its env (binding the scratches), and ([the statements that
    zero them], [the statements `s = s + s_sum[None]` that follow the loop]), or () when the loop
    reduces nothing."""
    aug, other, reads = {}, set(), {}
    targets = set()
    for n in ast.walk(ast.Module(body=st.body, type_ignores=[])):
        if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name):
            targets.add(id(n.target))
            if isinstance(n.op, _REDUCE_OPS):
                aug.setdefault(n.target.id, []).append(n)
            else:
                other.add(n.target.id)
    for n in ast.walk(ast.Module(body=st.body, type_ignores=[])):
        if isinstance(n, ast.Name) and id(n) not in targets:
            if isinstance(n.ctx, ast.Store):
                other.add(n.id)
            else:
                reads.setdefault(n.id, n)
    for n in ast.walk(st.target):
        if isinstance(n, ast.Name):
            other.add(n.id)
    names = [name for name in aug if name not in other]
    if not names:
        return st, env, ()
    # what the names are before the loop: replay the kernel-scope definitions in a throwaway block
    found = {}
    with k.builder.at(Block()):
        fl = new_lowerer(task_env(env))
        for entry in prelude:
            replay(fl, entry, tasks)
        forget_moved(fl, k)
        fl.scopes[0].update(env)
        for name in names:
            v = next((scope[name] for scope in reversed(fl.scopes) if name in scope), None)
            kind = _numeric_kind(v)
            if kind is not None:
                found[name] = kind
    if not found:
        return st, env, ()
    for name in found:
        if name in reads:
            raise fl.error(reads[name], f"kernel-scope variable '{name}' is accumulated with += in this parallel "
                                        f"loop (an atomic reduction over its iterations) and also read in it; "
                                        f"its value there would depend on the order the iterations run. Read "
                                        f"'{name}' after the loop, or sum into a variable defined inside the loop")
    env = dict(env)
    zero, post, slots = [], [], {}
    for name, (dtype, shape) in found.items():
        sc = Scratch(len(k.scratch), dtype, shape, f"{name}_sum")
        k.scratch.append(sc)
        slot, zname = f"__{name}_sum{sc.index}", f"__{name}_zero{sc.index}"
        env[slot] = sc
        env[zname] = Mat([0] * math.prod(shape), shape) if shape else 0
        slots[name] = slot
        here = dict(lineno=st.lineno, col_offset=st.col_offset, end_lineno=st.end_lineno,
                    end_col_offset=st.end_col_offset)
        ref = lambda ctx: ast.Subscript(ast.Name(slot, ast.Load(), **here), ast.Constant(None, **here), ctx, **here)  # noqa: E731
        zero.append((ast.Assign([ref(ast.Store())], ast.Name(zname, ast.Load(), **here), **here), env))
        post.append(ast.Assign([ast.Name(name, ast.Store(), **here)],
                               ast.BinOp(ast.Name(name, ast.Load(), **here), ast.Add(), ref(ast.Load()), **here),
                               **here))
    loop = copy.deepcopy(st)
    for n in ast.walk(loop):
        if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name) and n.target.id in slots:
            t = n.target
            n.target = ast.copy_location(ast.Subscript(ast.copy_location(ast.Name(slots[t.id], ast.Load()), t),
                                                       ast.copy_location(ast.Constant(None), t), ast.Store()), t)
    return loop, env, (zero, post)


def _numeric_kind(v):
    """(dtype, element shape) of a kernel-scope numeric value (a local, a vector, a constant), or
    None for anything else."""
    from .refs import LocalRef
    if isinstance(v, LocalRef):
        return v.dtype(), tuple(v.shape)
    if isinstance(v, Stmt):
        return v.dtype, ()
    if isinstance(v, Mat):
        dts = {e.dtype if isinstance(e, Stmt) else (f32 if isinstance(e, float) else i32) for e in v.entries}
        return (f32 if f32 in dts else next(iter(dts))), tuple(v.shape)
    if isinstance(v, bool):
        return None
    if isinstance(v, float):
        return f32, ()
    if isinstance(v, int):
        return i32, ()
    return None
