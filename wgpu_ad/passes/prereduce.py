"""Workgroup pre-reduction of accumulations into one address.

`U[None] += v` from every iteration of a parallel loop is one atomic per iteration, all on one
address: the slowest thing a GPU does (and a compare-exchange loop where float atomics are
emulated). Each thread adds into a private accumulator instead; after the loop, the workgroup sums
the accumulators in shared memory and one thread does a single atomic. The tree sum is also far
more accurate than millions of float atomics in arrival order.

Applied on a copy of the optimised IR just before code generation (the IR given to autodiff and
shown by get_ir() keeps the atomics). Only for range tasks whose target element is the same for
every thread (a constant, an argument, or a value of the bounds block) and whose buffer the task
touches in no other way; not in tasks that can stop a thread early (asserts, autodiff stacks,
return), since the workgroup sum needs every thread.
"""
from __future__ import annotations

from ..ir.builder import Builder
from ..ir.nodes import Block, Kernel, Stmt, Task, walk
from ..ir.ops import AtomicKind, Op

_EARLY_EXIT = (Op.ASSERT, Op.STACK_PUSH, Op.RETURN)


def prereduce(kernel: Kernel) -> Kernel:
    for t in kernel.tasks:
        if t.kind == "range":
            _task(t)
    return kernel


def _task(t: Task) -> None:
    stmts = list(walk(t.bounds)) + list(walk(t.body))
    if any(s.op in _EARLY_EXIT for s in stmts):
        return
    used = {id(a) for s in stmts for a in s.args}
    bounds = {id(s) for s in walk(t.bounds)}
    touches: dict[int, list] = {}
    for s in stmts:
        if s.op in (Op.GLOBAL_LOAD, Op.GLOBAL_STORE, Op.ATOMIC):
            buf = s.attr[1] if s.op is Op.ATOMIC else s.attr
            touches.setdefault(id(buf), []).append(s)
    only_adds = {b: all(x.op is Op.ATOMIC and x.attr[0] in (AtomicKind.ADD, AtomicKind.SUB) for x in xs)
                 for b, xs in touches.items()}  # (once per buffer: N adds to one buffer were N² checks)
    groups: dict[tuple, list] = {}
    for s in stmts:
        if s.op is not Op.ATOMIC or s.attr[0] not in (AtomicKind.ADD, AtomicKind.SUB) or id(s) in used:
            continue
        buf, idx = s.attr[1], s.args[0]
        if not only_adds[id(buf)]:
            continue
        if idx.op is Op.CONST:
            key = (id(buf), "const", idx.attr)
        elif idx.op is Op.ARG or id(idx) in bounds:
            key = (id(buf), "stmt", id(idx))
        else:
            continue
        groups.setdefault(key, []).append(s)
    if not groups:
        return
    replace: dict[int, Stmt] = {}
    b = Builder(t.bounds)
    ep = Builder(t.epilogue)
    for members in groups.values():
        first = members[0]
        buf, idx = first.attr[1], first.args[0]
        b.loc = ep.loc = first.loc
        acc = b.alloca(buf.dtype, f"{buf.name.replace('.', '_')}_partial")  # starts at zero
        for s in members:
            replace[id(s)] = acc
        total = ep.emit(Op.WG_SUM, [ep.load(acc)], buf.dtype)
        lead = ep.if_(ep.emit(Op.WG_LEADER, (), None))
        with ep.at(lead.blocks[0]):
            at = idx if idx.op is not Op.CONST else ep.const(idx.attr, idx.dtype)
            ep.emit(Op.ATOMIC, [at, total], buf.dtype, (AtomicKind.ADD, buf))
    _rewrite(t.body, replace)


def _rewrite(block: Block, replace: dict) -> None:
    out = []
    for s in block.stmts:
        for x in s.blocks:
            _rewrite(x, replace)
        acc = replace.get(id(s))
        if acc is None:
            out.append(s)
            continue
        kind, buf = s.attr
        old = Stmt(Op.LOCAL_LOAD, acc.dtype, [acc], loc=s.loc)
        new = Stmt(Op.ADD if kind is AtomicKind.ADD else Op.SUB, acc.dtype, [old, s.args[1]], loc=s.loc)
        out += [old, new, Stmt(Op.LOCAL_STORE, None, [acc, new], loc=s.loc)]
    block.stmts = out
