"""Atomic demotion in adjoint tasks.

The adjoint of a load x[I] is `x.grad[I] += adj` from every thread. When every accumulation into
a gradient buffer in a task has the same parallel part of its index, and that part is injective
in the parallel loop (each parallel dimension alone in a dimension of the index), no two threads
touch the same element: a plain load/add/store is enough, much cheaper than an atomic (above all
the compare-exchange loop of emulated float atomics).

A gradient buffer whose only accesses in the whole adjoint kernel are such accumulations outside
any loop, into pairwise different elements (the components of a vector), is a *zero-store
candidate* (Kernel.zero_stores): each element is written at most once per launch. When the
launcher knows such a gradient is all zeros (lang/storage.py tracks that; a tape clears every
gradient before its backward pass), it launches the adjoint's variant compiled with the buffer
in `zero`, which stores the value instead of reading, adding and writing it back (0 + v == v). A
variant rather than a uniform branch: on llvmpipe the branch cost more than the load it saves.
"""
from __future__ import annotations

from ...ir.nodes import Block, Stmt, Task, walk
from ...ir.ops import AtomicKind, Op
from . import access


def parallel_keys(loop_dims: dict, task: Task) -> list:
    dims = sorted({d for (t, d) in loop_dims.values() if t is task})
    return [("pdim", id(task), d) for d in dims] if dims else [("ploop", id(task))]


def index_signature(s: Stmt, keys: list, loop_dims: dict):
    """The dims of s's index that hold the parallel keys, as affine forms; None if unproven."""
    if s.index is None:
        return None
    dims = [access.affine(x, loop_dims) for x in s.index]
    sig, used = [], set()
    for key in keys:
        hit = next((k for k, a in enumerate(dims) if k not in used and
                    {x for x in a if x is not None and x[0] != "arg"} == {key} and a[key] != 0), None)
        if hit is None:
            return None
        used.add(hit)
        sig.append((hit, tuple(sorted(dims[hit].items(), key=repr))))
    return tuple(sig)


def demote_atomics(loop_dims: dict, task: Task, orig: Task,
                   shared: set = frozenset(), zero: set = frozenset()) -> set:
    """Rewrite `task`'s gradient accumulations into plain read-modify-writes where safe.

    loop_dims: the primal kernel's (Kernel.loop_dims), which name the statements of `orig`, the
    primal task `task` is the adjoint of (its multi-indices, Stmt.index, name them too).
    shared: ids of the buffers other tasks of the adjoint kernel access too. zero: ids of gradient
    buffers known to be all zeros at launch: their zero-store candidates become plain stores.
    Returns the ids of this task's zero-store candidates."""
    if task.kind != "range":
        return set()
    keys = parallel_keys(loop_dims, orig)
    groups: dict[int, list] = {}
    for s in walk(task.body):
        if s.op is Op.ATOMIC:
            groups.setdefault(id(s.attr[1]), []).append(s)
    demote, candidates = set(), set()
    in_loops = _in_loops(task.body)
    other = task_buffers(task, body_atomics=False)
    for buf_id, stmts in groups.items():
        if not all(s.attr[0] is AtomicKind.ADD and getattr(s, "index", None) is not None and s.attr[1].grad
                   for s in stmts):
            continue
        sigs = {index_signature(s, keys, loop_dims) for s in stmts}
        if len(sigs) == 1 and None not in sigs:
            demote.update(id(s) for s in stmts)
            if (buf_id not in shared and buf_id not in other and _distinct(stmts, loop_dims)
                    and not any(id(s) in in_loops for s in stmts)):
                candidates.add(buf_id)
    if demote:
        _rewrite(task.body, demote, candidates & set(zero))
    return candidates


def _in_loops(block: Block, inside: bool = False, out: set | None = None) -> set:
    """ids of the statements of `block` that run inside a serial loop (RANGE_FOR / WHILE)."""
    out = set() if out is None else out
    for s in block.stmts:
        if inside:
            out.add(id(s))
        for b in s.blocks:
            _in_loops(b, inside or s.op in (Op.RANGE_FOR, Op.WHILE), out)
    return out


def _distinct(stmts: list, loop_dims: dict) -> bool:
    """No two of the statements can touch the same element in one iteration: each pair's indices
    differ by a nonzero constant in some dimension (the components of a vector element)."""
    forms = [[access.affine(x, loop_dims) for x in s.index] for s in stmts]
    for n, a in enumerate(forms):
        for b in forms[:n]:
            if len(a) != len(b) or not any(
                    set(d := access._combine(x, y, -1)) <= {None} and d.get(None, 0) != 0
                    for x, y in zip(a, b)):
                return False
    return True


def task_buffers(task: Task, body_atomics: bool = True) -> set:
    """ids of the buffers `task` accesses (without the atomics of its body: body_atomics=False)."""
    out = set()
    for blk in (task.bounds, task.body, task.epilogue):
        for s in walk(blk):
            if s.op in (Op.GLOBAL_LOAD, Op.GLOBAL_STORE):
                out.add(id(s.attr))
            elif s.op is Op.ATOMIC and (body_atomics or blk is not task.body):
                out.add(id(s.attr[1]))
    return out


def _rewrite(block: Block, demote: set, store: set) -> None:
    out = []
    for s in block.stmts:
        for b in s.blocks:
            _rewrite(b, demote, store)
        if id(s) in demote:
            kind, buf = s.attr
            idx, val = s.args
            if id(buf) in store:  # the only write of a still-zero element: 0 + val == val
                out.append(Stmt(Op.GLOBAL_STORE, None, [idx, val], buf, loc=s.loc))
                continue
            old = Stmt(Op.GLOBAL_LOAD, buf.dtype, [idx], buf, name=buf.name.replace(".", "_"), loc=s.loc)
            new = Stmt(Op.ADD, buf.dtype, [old, val], loc=s.loc)
            out += [old, new, Stmt(Op.GLOBAL_STORE, None, [idx, new], buf, loc=s.loc)]
        else:
            out.append(s)
    block.stmts = out
