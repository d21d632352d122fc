"""Small reusable IR utilities for passes: walking, use counts, rewriting uses, purity."""
from __future__ import annotations

from typing import Iterator

import numpy as np

from .. import plan
from .nodes import Block, Buffer, Kernel, Stmt, walk
from .ops import GroupOp, Op
from .semantics import to_scalar

# values with no effects that depend only on their operands (and the launch): safe to CSE / drop
PURE = GroupOp.ALU | frozenset({Op.CONST, Op.ARG, Op.LOOP_INDEX})
# reads of memory: no effects, but their value depends on the stores before them
READS = frozenset({Op.GLOBAL_LOAD, Op.LOCAL_LOAD})
# ops that end the rest of their block
TERMINATORS = frozenset({Op.BREAK, Op.CONTINUE, Op.RETURN})


def jumps_to_loop(block: Block, op: Op) -> bool:
    """Whether `block` has a BREAK or CONTINUE (`op`) for the loop it belongs to: at its top level
    or inside its IFs, not inside its own nested loops."""
    return any(s.op is op or (s.op is Op.IF and any(jumps_to_loop(b, op) for b in s.blocks))
               for s in block.stmts)


def is_pure(s: Stmt) -> bool:
    return s.op in PURE


def kernel_blocks(kernel: Kernel) -> Iterator[Block]:
    """Every block of the kernel, nested ones included (outer before inner)."""
    def rec(block: Block):
        yield block
        for s in block.stmts:
            for b in s.blocks:
                yield from rec(b)
    for t in kernel.tasks:
        yield from rec(t.bounds)
        yield from rec(t.body)
        yield from rec(t.epilogue)


def walk_kernel(kernel: Kernel) -> Iterator[Stmt]:
    for t in kernel.tasks:
        yield from walk(t.bounds)
        yield from walk(t.body)
        yield from walk(t.epilogue)


def use_counts(kernel: Kernel) -> dict[Stmt, int]:
    """How many times each statement is used as an operand (task bounds count as uses)."""
    counts: dict[Stmt, int] = {}
    for s in walk_kernel(kernel):
        for a in s.args:
            counts[a] = counts.get(a, 0) + 1
    for t in kernel.tasks:
        for a in (t.begin, t.end):
            if a is not None:
                counts[a] = counts.get(a, 0) + 1
    return counts


def adopt_name(s: Stmt, name: str | None) -> None:
    """Give `s` the name of the variable that holds it (readable IR and WGSL), unless it has a
    user's name already; a global load's name is its buffer's, a weaker hint. Constants,
    arguments and loop indices keep theirs: they are not written as `let`s (a loop index names
    its loop)."""
    if name and s.op not in (Op.CONST, Op.ARG, Op.LOOP_INDEX) and (s.name is None or s.op is Op.GLOBAL_LOAD):
        s.name = name


def substitute(kernel: Kernel, mapping: dict[Stmt, Stmt]) -> int:
    """Rewrite every use of a key of `mapping` into its value (following chains a->b->c).

    Rewrites operands of all statements and the tasks' begin/end; returns the number of uses
    rewritten."""
    if not mapping:
        return 0

    def resolve(s: Stmt) -> Stmt:
        while s in mapping:
            s = mapping[s]
        return s
    n = 0
    for s in walk_kernel(kernel):
        for k, a in enumerate(s.args):
            if a in mapping:
                s.args[k] = resolve(a)
                n += 1
        if s.index is not None:  # the access analyses read multi-indices: keep them current
            s.index = tuple(resolve(x) if isinstance(x, Stmt) and x in mapping else x for x in s.index)
    for t in kernel.tasks:
        if t.begin is not None and t.begin in mapping:
            t.begin, n = resolve(t.begin), n + 1
        if t.end is not None and t.end in mapping:
            t.end, n = resolve(t.end), n + 1
    return n


def replace_uses(kernel: Kernel, old: Stmt, new: Stmt) -> int:
    """Make every user of `old` use `new` instead; returns the number of uses rewritten."""
    if old.dtype != new.dtype:
        raise TypeError(f"replace_uses: {old!r} is {old.dtype} but its replacement {new!r} is {new.dtype}")
    return substitute(kernel, {old: new})


def make_const(s: Stmt, value) -> Stmt:
    """Turn `s` into a CONST of its own dtype in place (its users need no rewriting)."""
    s.op, s.args, s.blocks = Op.CONST, [], []
    s.attr = const_attr(value, s.dtype)
    return s


def const_attr(value, dtype) -> object:
    """The Python value a CONST of `dtype` holds (float / int / bool), from a number or NumPy scalar."""
    v = to_scalar(value, dtype)
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, np.floating):
        return float(v)
    return int(v)


def const_value(s: Stmt):
    """The NumPy scalar value of a CONST statement."""
    return to_scalar(s.attr, s.dtype)


def const_key(s: Stmt) -> object:
    """A hashable key equal for two CONSTs exactly when their bits are equal (-0.0 != 0.0)."""
    v = const_value(s)
    if isinstance(v, np.floating):
        return v.tobytes()
    return v.item()


def buffer_alias_key(buf: Buffer) -> object:
    """Buffers with equal keys may share storage.

    Fields own one buffer each (gradients are fields of their own), so distinct field sources
    never alias. Buffers bound from kernel arguments (plan.Arg, plan.ArgGrad, plan.ArgDual) may all
    alias each other: the same array can be passed for two arguments."""
    src = buf.source
    if isinstance(src, (plan.Arg, plan.ArgGrad, plan.ArgDual)):
        return "arg"
    if src is None:
        return ("buf", id(buf))
    return ("src", src)


def writes_in(block: Block) -> set:
    """Memory locations a block (nested blocks included) may write: buffer alias keys and
    ("local", alloca) for thread-local variables (an ALLOCA re-zeroes its variable)."""
    out: set = set()
    for s in walk(block):
        if s.op is Op.GLOBAL_STORE:
            out.add(buffer_alias_key(s.attr))
        elif s.op is Op.ATOMIC:
            out.add(buffer_alias_key(s.attr[1]))
        elif s.op is Op.LOCAL_STORE:
            out.add(("local", s.args[0]))
        elif s.op is Op.ALLOCA:
            out.add(("local", s))
    return out
