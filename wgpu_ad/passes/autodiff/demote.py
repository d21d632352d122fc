"""Atomic demotion in adjoint tasks.

The adjoint of a load x[I] is `x.grad[I] += adj` from every thread. When every accumulation into
a gradient buffer in a task has the same parallel part of its index, and that part is injective
in the parallel loop (each parallel dimension alone in a dimension of the index), no two threads
touch the same element: a plain load/add/store is enough, much cheaper than an atomic (above all
the compare-exchange loop of emulated float atomics).
"""
from __future__ import annotations

from ...ir.nodes import Block, Kernel, Stmt, Task, walk
from ...ir.ops import AtomicKind, Op
from . import access


def _parallel_keys(kernel: Kernel, task: Task) -> list:
    dims = sorted({d for (t, d) in kernel.loop_dims.values() if t is task})
    return [("pdim", id(task), d) for d in dims] if dims else [("ploop", id(task))]


def _signature(s: Stmt, keys: list):
    """The dims of s's index that hold the parallel keys, as affine forms; None if unproven."""
    if s.index is None:
        return None
    dims = [access.affine(x) for x in s.index]
    sig, used = [], set()
    for key in keys:
        hit = next((k for k, a in enumerate(dims) if k not in used and
                    {x for x in a if x is not None and x[0] != "arg"} == {key} and a[key] != 0), None)
        if hit is None:
            return None
        used.add(hit)
        sig.append((hit, tuple(sorted(dims[hit].items(), key=repr))))
    return tuple(sig)


def demote_atomics(kernel: Kernel, primal: Kernel, task: Task, orig: Task) -> None:
    """Rewrite `task`'s gradient accumulations into plain read-modify-writes where safe."""
    if task.kind != "range":
        return
    access._loop_dims = primal.loop_dims
    try:
        keys = _parallel_keys(primal, orig)
        groups: dict[int, list] = {}
        for s in walk(task.body):
            if s.op is Op.ATOMIC:
                groups.setdefault(id(s.attr[1]), []).append(s)
        demote = set()
        for buf_id, stmts in groups.items():
            if not all(s.attr[0] is AtomicKind.ADD and getattr(s, "index", None) is not None and s.attr[1].grad
                       for s in stmts):
                continue
            sigs = {_signature(s, keys) for s in stmts}
            if len(sigs) == 1 and None not in sigs:
                demote.update(id(s) for s in stmts)
    finally:
        access._loop_dims = {}
    if demote:
        _rewrite(task.body, demote)


def _rewrite(block: Block, demote: set) -> None:
    out = []
    for s in block.stmts:
        for b in s.blocks:
            _rewrite(b, demote)
        if id(s) in demote:
            kind, buf = s.attr
            idx, val = s.args
            old = Stmt(Op.GLOBAL_LOAD, buf.dtype, [idx], buf, name=buf.name.replace(".", "_"), loc=s.loc)
            new = Stmt(Op.ADD, buf.dtype, [old, val], loc=s.loc)
            out += [old, new, Stmt(Op.GLOBAL_STORE, None, [idx, new], buf, loc=s.loc)]
        else:
            out.append(s)
    block.stmts = out
