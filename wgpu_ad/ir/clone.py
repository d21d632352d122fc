"""Deep copies of IR kernels (the adjoint is built from a private copy of the forward IR)."""
from __future__ import annotations

from .nodes import Block, Kernel, Stmt, Task, walk_task


def clone_kernel(kernel: Kernel, mapping: dict | None = None, own_indices: bool = False) -> Kernel:
    """A deep copy; `mapping`, when given, receives id(original statement or task) -> its copy.

    By default the copy's multi-indices (Stmt.index) and loop_dims keys are the original's
    statements, so that analyses of the copy name the original's. With own_indices=True they are
    the copy's own (statements no block holds any more are copied too): a copy that a pass
    rewrites (promote.py) and analyses read on its own, as if it were the original."""
    m: dict[int, object] = {} if mapping is None else mapping
    tasks = []
    for t in kernel.tasks:
        nt = Task(t.kind, Block(), Block(), block_dim=t.block_dim, name=t.name, no_grad=t.no_grad)
        m[id(t)] = nt
        nt.bounds = clone_block(t.bounds, m)
        nt.body = clone_block(t.body, m)
        nt.epilogue = clone_block(t.epilogue, m)
        nt.begin = m.get(id(t.begin)) if t.begin is not None else None
        nt.end = m.get(id(t.end)) if t.end is not None else None
        if t.replay is not None:
            nt.replay = {m[id(s)] for s in t.replay if id(s) in m}
        tasks.append(nt)
    k = Kernel(kernel.name, tasks, list(kernel.args), list(kernel.buffers), kernel.ret,
               kernel.uses_random, kernel.debug, kernel.loc)
    # the analyses of a clone read multi-indices (Stmt.index, shared with the original) through
    # loop_dims, so both keep naming the original's statements; only the tasks are the clone's
    k.loop_dims = {key: (m.get(id(t), t), d) for key, (t, d) in kernel.loop_dims.items()}
    k.no_grad = kernel.no_grad
    if own_indices:
        _own_indices(k, m)
    return k


def _own_indices(k: Kernel, m: dict) -> None:
    """Point the copy's multi-indices and loop_dims keys at its own statements."""
    def own(x):
        if not isinstance(x, Stmt):
            return x
        c = m.get(id(x))
        if c is None:  # a statement only an index holds (no block): a copy of its own
            attr = m.get(id(x.attr), x.attr) if isinstance(x.attr, (Stmt, Task)) else x.attr
            c = m[id(x)] = Stmt(x.op, x.dtype, [], attr, [], x.name, x.loc, index=x.index)
            c.args = [own(a) for a in x.args]
        return c
    for t in k.tasks:
        for s in walk_task(t):
            if s.index is not None:
                s.index = tuple(own(x) for x in s.index)
    k.loop_dims = {own(key): v for key, v in k.loop_dims.items()}


def clone_block(block: Block, m: dict) -> Block:
    out = Block()
    for s in block.stmts:
        attr = s.attr
        if isinstance(attr, (Stmt, Task)):
            attr = m[id(attr)]
        n = Stmt(s.op, s.dtype, [m[id(a)] for a in s.args], attr, [], s.name, s.loc, index=s.index)
        m[id(s)] = n
        n.blocks = [clone_block(b, m) for b in s.blocks]
        out.stmts.append(n)
    return out
