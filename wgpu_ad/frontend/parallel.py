"""The parallel loop: an outermost `for` of a kernel becomes one range task (one dispatch), its
iterations the task's threads; an ndrange's dimensions are decoded from the one loop index, and
on CPU adapters its trailing dimensions may run as serial loops inside each thread
(parallel_prefix).
"""
from __future__ import annotations

import ast

from ..ir.nodes import Block, Task
from ..ir.ops import Op
from ..types import i32
from .context import LoopCtx
from .kernel_context import KernelContext
from .kernel_scope import forget_moved, replay
from .loops import analyze_iter, bind_targets, loop_var_name, trip_count
from .values import is_static


def range_task(k: KernelContext, new_lowerer, task_env, prelude, tasks, st: ast.For, env: dict, cfg: dict) -> Task:
    """The parallel loop `st` as a range task: its bounds (after the kernel-scope values it needs,
    recomputed), its loop index decoded into the loop's indices, then its body."""
    n = len(tasks)
    task = Task("range", Block(), Block(), block_dim=cfg.get("block_dim"), name=f"{k.name}_t{n}")
    o = k.ops
    with k.builder.at(task.bounds):
        fl = new_lowerer(task_env(env))
        for entry in prelude:
            replay(fl, entry, tasks)
        forget_moved(fl, k)
        fl.scopes[0].update(env)
        k.builder.loc = fl.pf.loc(st)
        spec = analyze_iter(fl, st)
        if spec.static_items is not None:
            raise fl.error(st, "internal: static loop reached the parallel loop builder")
        if len(spec.dims) == 1:
            lo, hi = trip_count(fl, *spec.dims[0], spec.step)
            begin, end = o.to_stmt(lo, i32), o.to_stmt(hi, i32)
            extents = None
        else:
            extents = [o.binary(Op.SUB, hi, lo) if not (is_static(hi) and is_static(lo)) else hi - lo
                       for lo, hi in spec.dims]
            npar = parallel_prefix(extents, k.min_parallel)
            total = 1
            for e in extents[:npar]:
                total = o.binary(Op.MUL, total, e)
            begin, end = o.to_stmt(0, i32), o.to_stmt(total, i32)
        task.begin, task.end = begin, end
    with k.builder.at(task.body):
        k.builder.loc = fl.pf.loc(st)
        b = k.builder
        idx = b.loop_index(task, name="i" if isinstance(st.target, ast.Name) else "idx")
        if extents is None:
            # dimension 0 of the task: the analyses name it the same way in the IR and its clones
            k.kernel.loop_dims[idx] = (task, 0)
            indices = [idx if spec.step == 1 else o.binary(Op.ADD, spec.dims[0][0], o.binary(Op.MUL, idx, spec.step))]
        else:
            indices, rest = [None] * len(extents), idx
            for d in range(npar - 1, -1, -1):
                if d == 0:
                    q = rest
                else:
                    div = o.idiv(rest, extents[d])
                    q = o.binary(Op.SUB, rest, o.binary(Op.MUL, div, extents[d]))
                lo = spec.dims[d][0]
                k.kernel.loop_dims[q] = (task, d)
                indices[d] = q if is_static(lo) and lo == 0 else o.binary(Op.ADD, q, lo)
                if d:
                    rest = div
            for d in range(npar, len(extents)):  # the trailing dimensions: serial loops in each thread
                loop = b.range_for(o.to_stmt(0, i32), o.to_stmt(extents[d], i32),
                                   name=loop_var_name(st.target, d, spec.grouped))
                b.block = loop.blocks[0]
                q = b.loop_index(loop, name=loop.name)
                lo = spec.dims[d][0]
                indices[d] = q if is_static(lo) and lo == 0 else o.binary(Op.ADD, q, lo)
        bindings = bind_targets(fl, st, spec, indices)
        k.in_parallel = True
        fl.parallel_scope = len(fl.scopes)
        try:
            fl._loop_body(LoopCtx("parallel", task), st.body, bindings)
        finally:
            k.in_parallel = False
    return task


def parallel_prefix(extents: list, min_parallel: int | None) -> int:
    """How many leading dimensions of a parallel ndrange run in parallel.

    All of them by default. With min_parallel (set on CPU adapters, where a few thousand threads
    fill every core), the fewest leading dimensions whose extents give at least that many threads:
    each thread then loops over the trailing dimensions itself, so what depends only on the
    leading indices (x[i] in a pair sum, an accumulation into y[i]) is loaded or accumulated once
    per thread instead of once per iteration (passes/licm.py hoists it out of the inner loops).
    Iterations of a parallel loop may run in any order, so this changes no result."""
    n = len(extents)
    if min_parallel is None or not all(isinstance(e, int) for e in extents):
        return n
    threads = 1
    for d, e in enumerate(extents):
        threads *= e
        if threads >= min_parallel:
            return d + 1
    return n
