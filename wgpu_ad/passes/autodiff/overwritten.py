"""The backward pass of a @ti.ad.no_grad kernel: the gradients of the elements it overwrote, set to 0.

A no_grad kernel is a constant for autodiff: nothing flows back through what it writes. When it
stores `y[i] = v`, the value y[i] held before is gone, so whatever computed that value gets no
gradient from the later uses of y[i]; but y.grad[i], which the adjoints after it on the tape
filled, would still hold those uses' gradient if the backward pass skipped the kernel, and the
kernel that wrote y[i] before it would pass that gradient on (Taichi's no_grad does: a silently
wrong gradient). An accumulation `y[i] += v` keeps the old value (its derivative is 1), so y.grad
passes through unchanged, as skipping gives.

So the backward pass of a no_grad kernel is this kernel, made from its forward IR: each plain
store to a float buffer that has a gradient becomes a store of 0 to that gradient at the same
index, unless it stores the element's own value plus or minus something (`y[i] += v` that one
thread owns, made a read-modify-write); every other store, atomic, print and assert goes, and so
does the return value. What remains computes only the indices
and the control flow of those stores, from the fields as they are at the backward pass (as every
adjoint replays its forward). A value it cannot recompute there (a random number, the old value an
atomic returned) that the indices or the control flow need makes it unavailable (`why`).

Those fields are as the launch left them, so where the indices or the control flow read what the
kernel itself writes (`if y[i] > 0: y[i] = -y[i]`: y[0] was 1 and is -1 after), the zeroing
kernel replays the launch on copies of those fields taken before it (`replay`: their sources, in
the order of plan.Snapshot(j)): it reads them there and keeps its stores and atomics to them, so
that its control flow is the launch's own, a read after the thread's own store included.
"""
from __future__ import annotations

from typing import Callable

from ...ir.clone import clone_kernel
from ...ir.nodes import Block, Buffer, Kernel, Stmt
from ...ir.ops import Op
from ...ir.utils import walk_kernel
from ...types import i32

# the name of a stand-in buffer for values the zeroing kernel cannot recompute: loads of it are
# removed when unused
_UNKNOWN = "no_grad.unknown"


def _is_unknown(b: Buffer) -> bool:
    return b.source is None and b.name == _UNKNOWN


def zeroing_kernel(kernel: Kernel, grad_source: Callable, replay: tuple = (),
                   snapshot: Callable | None = None) -> tuple[Kernel | None, list]:
    """(the IR that zeroes the gradients of the elements `kernel` overwrites, or None when it
    overwrites none; the grad sources it writes, by position of its buffers). The IR still needs
    optimising; `needs_unknown(ir)` afterwards says whether it is usable. The buffers whose
    sources are in `replay` are read and written in their copies, `snapshot(j)` the source of the
    j-th (module docstring)."""
    k = clone_kernel(kernel)
    unknown = Buffer(_UNKNOWN, i32, None)
    grads: dict[int, Buffer] = {}
    by_source = {b.source: b for b in k.buffers}

    def grad_of(b: Buffer) -> Buffer | None:
        if not b.dtype.is_float or b.grad or b.source is None:
            return None
        src = grad_source(b)
        if src is None:
            return None
        g = grads.get(id(b))
        if g is None:
            g = by_source.get(src) or Buffer(b.name + ".grad", b.dtype, src, grad=True, vector=b.vector)
            by_source[src] = grads[id(b)] = g
        return g

    def rewrite(block: Block) -> None:
        out = []
        for s in block.stmts:
            for b in s.blocks:
                rewrite(b)
            if s.op is Op.GLOBAL_STORE:
                g = None if _accumulates(s) else grad_of(s.attr)
                if g is not None:
                    zero = Stmt(Op.CONST, s.attr.dtype, [], 0.0, loc=s.loc)
                    out += [zero, Stmt(Op.GLOBAL_STORE, None, [s.args[0], zero], g, loc=s.loc, index=s.index)]
                if s.attr.source in replay:
                    out.append(s)  # the replay's copy changes as the field did
                continue
            if s.op is Op.ATOMIC and s.attr[1].source in replay:
                out.append(s)
                continue
            if s.op in (Op.ATOMIC, Op.RANDOM):  # (its value, when something still needs it, is unknown)
                zero = Stmt(Op.CONST, i32, [], 0, loc=s.loc)
                s.op, s.args, s.attr, s.blocks, s.index = Op.GLOBAL_LOAD, [zero], unknown, [], None
                out += [zero, s]  # (the same statement: its uses stay its uses)
                continue
            if s.op in (Op.PRINT, Op.ASSERT):
                continue
            if s.op is Op.RETURN:  # its value is not needed (a kernel-scope sum's, often): only where it ends
                dt = s.args[0].dtype
                value = Stmt(Op.CONST, dt, [], 0.0 if dt.is_float else 0, loc=s.loc)
                s.args = [value]
                out.append(value)
            out.append(s)
        block.stmts = out

    for t in k.tasks:
        for blk in (t.bounds, t.body, t.epilogue):
            rewrite(blk)
            if blk.stmts and blk.stmts[-1].op is Op.RETURN:
                blk.stmts[-2:] = []  # (and its constant) at the end: nothing to return, no read-back
    if not any(s.op is Op.RETURN for s in walk_kernel(k)):
        k.ret = None
    if not grads:
        return None, []
    if replay:
        _redirect(k, replay, snapshot)
    have = {id(b) for b in k.buffers}
    for g in grads.values():
        if id(g) not in have:
            have.add(id(g))
            k.buffers.append(g)
    k.buffers.append(unknown)
    k.uses_random = False
    return k, [g.source for g in grads.values()]


def _redirect(k: Kernel, replay: tuple, snapshot: Callable) -> None:
    """The accesses to the buffers of the sources in `replay` go to their copies."""
    copies: dict = {}
    for b in list(k.buffers):
        if b.source in replay and not b.grad:
            copies[id(b)] = c = Buffer(b.name + "_before", b.dtype, snapshot(replay.index(b.source)),
                                       vector=b.vector, shape=b.shape)
            k.buffers.append(c)
    for s in walk_kernel(k):
        if s.op in (Op.GLOBAL_LOAD, Op.GLOBAL_STORE) and id(s.attr) in copies:
            s.attr = copies[id(s.attr)]
        elif s.op is Op.ATOMIC and id(s.attr[1]) in copies:
            s.attr = (s.attr[0], copies[id(s.attr[1])])


def replayed(kernel: Kernel, zeroing: Kernel, replayable: Callable) -> tuple:
    """The sources of the buffers `kernel` writes that its optimised zeroing kernel reads (the
    indices or the control flow of its overwrites), in order, that `replayable(source)` allows,
    but those whose every read reads what the launch leaves there (_reads_what_it_leaves)."""
    written = {(s.attr if s.op is Op.GLOBAL_STORE else s.attr[1]).source for s in walk_kernel(kernel)
               if s.op in (Op.GLOBAL_STORE, Op.ATOMIC)}
    read = (s.attr.source for s in walk_kernel(zeroing) if s.op is Op.GLOBAL_LOAD and not s.attr.grad)
    return tuple(src for src in dict.fromkeys(read)
                 if src in written and replayable(src) and not _reads_what_it_leaves(kernel, src))


def _reads_what_it_leaves(kernel: Kernel, src) -> bool:
    """Whether every read of the buffer of `src` reads the value the launch leaves in that element
    (`mask[i] = ti.random(); if mask[i] < p: ...`, where replaying would need the random number):
    one plain store to it, in no serial loop, and each load after it in its block (or in a statement
    after it there), at the same index."""
    stores, loads = [], []

    def visit(block: Block, path: tuple, in_loop: bool) -> None:
        for n, s in enumerate(block.stmts):
            here = path + ((id(block), n),)
            buf = s.attr[1] if s.op is Op.ATOMIC else s.attr
            if s.op in (Op.GLOBAL_STORE, Op.ATOMIC) and buf.source == src:
                stores.append((s, here, in_loop or s.op is Op.ATOMIC))
            elif s.op is Op.GLOBAL_LOAD and buf.source == src:
                loads.append((s, here))
            for b in s.blocks:
                visit(b, here, in_loop or s.op in (Op.RANGE_FOR, Op.WHILE))
    for t in kernel.tasks:
        for blk in (t.bounds, t.body, t.epilogue):
            visit(blk, (), False)
    if len(stores) != 1 or stores[0][2]:
        return False
    store, (*_, (block, at)), _ = stores[0]
    return all(x.args[0] is store.args[0] and any(b == block and n > at for b, n in where) for x, where in loads)


def _accumulates(store: Stmt) -> bool:
    """A store of the element's own value plus or minus something (`y[i] += v` as a thread's
    read-modify-write): an accumulation, whose old value keeps its gradient."""
    buf, idx = store.attr, store.args[0]

    def holds_old(v: Stmt) -> bool:
        if v.op is Op.GLOBAL_LOAD:
            return v.attr is buf and v.args[0] is idx
        if v.op is Op.ADD:
            return holds_old(v.args[0]) or holds_old(v.args[1])
        if v.op is Op.SUB:
            return holds_old(v.args[0])
        return False
    return holds_old(store.args[1])


def needs_unknown(kernel: Kernel) -> bool:
    """Whether the optimised zeroing kernel still needs a value it cannot recompute."""
    return any(s.op is Op.GLOBAL_LOAD and _is_unknown(s.attr) for s in walk_kernel(kernel))


def without_unknown(kernel: Kernel) -> Kernel:
    kernel.buffers = [b for b in kernel.buffers if not _is_unknown(b)]
    return kernel
