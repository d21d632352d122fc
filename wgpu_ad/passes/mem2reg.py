"""Variables stored once become values.

A local variable with a single store, in the block that declares it, and read only after that
store, always holds the stored value: its loads are replaced by the value and the variable goes
away. Besides shorter WGSL, this lets the access analyses of autodiff see through index variables
(`nxt = t + 1; v[nxt, i] = ...` is then known to write row t + 1).

A variable stored several times, but loaded and stored only in the block that declares it (no
nested block touches it) and stored before every load, is straight-line code: each load becomes
the value of the store before it (the adjoint's accumulators, `x_adj = x_adj + ...`, are these).
A load before the first store reads the variable's initial zero (WGSL zero-initialises a `var`).
The stored values take the variable's name, for readable WGSL.

Any other variable is still straight-line code between the nested blocks that touch it, in each
block (`_forward_in_blocks`): a load after a store in the same block reads the stored value; a
store overwritten in the same block before any read, and before anything that may leave the
block (a break, continue or return, also inside a nested block), is dead; storing back the value loaded from
the variable, with no store in between, changes nothing. The adjoint's reverse of `f = f + s`,
when only f is active, is `g = f_adj; f_adj = 0; f_adj = g`: it goes away, and with it the `if`
around it (in a stencil gather, passes/autodiff/stencil.py, the other springs' branches).
"""
from __future__ import annotations

from ..ir.nodes import Block, Kernel, Stmt
from ..ir.ops import Op
from ..ir.utils import TERMINATORS, adopt_name, kernel_blocks, make_const, substitute
from ..ir.semantics import to_scalar


def mem2reg(kernel: Kernel) -> Kernel:
    order: dict[int, int] = {}
    parent: dict[int, Block] = {}
    stores: dict[int, list] = {}
    loads: dict[int, list] = {}
    allocas: list[Stmt] = []

    def visit(block: Block):
        for s in block.stmts:
            order[id(s)] = len(order)
            parent[id(s)] = block
            if s.op is Op.ALLOCA:
                allocas.append(s)
            elif s.op is Op.LOCAL_STORE:
                stores.setdefault(id(s.args[0]), []).append(s)
            elif s.op is Op.LOCAL_LOAD:
                loads.setdefault(id(s.args[0]), []).append(s)
            for b in s.blocks:
                visit(b)
    for t in kernel.tasks:
        for blk in (t.bounds, t.body, t.epilogue):
            visit(blk)
    mapping: dict[Stmt, Stmt] = {}
    dead: set[int] = set()
    for a in allocas:
        st = stores.get(id(a), [])
        lds = loads.get(id(a), [])
        if not (st or lds) or any(parent[id(x)] is not parent[id(a)] for x in st + lds):
            continue
        events = sorted(st + lds, key=lambda x: order[id(x)])
        value = None
        for x in events:
            if x.op is Op.LOCAL_STORE:
                value = x.args[1]  # substitute() follows chains through promoted loads
                adopt_name(value, a.name)
            else:
                if value is None:  # read before any store: the variable's initial zero
                    value = make_const(a, to_scalar(0, a.dtype))
                mapping[x] = value
            dead.add(id(x))
        if a.op is Op.ALLOCA:
            dead.add(id(a))
    if dead:
        substitute(kernel, mapping)
        for blk in kernel_blocks(kernel):
            blk.stmts = [s for s in blk.stmts if id(s) not in dead]
    _forward_in_blocks(kernel)
    return kernel


def _touched(s: Stmt, memo: dict) -> set:
    """The variables a statement with blocks reads or writes anywhere inside."""
    got = memo.get(id(s))
    if got is None:
        got = memo[id(s)] = set()
        for b in s.blocks:
            for x in b.stmts:
                got.update(id(a) for a in x.args if a.op is Op.ALLOCA)
                if x.blocks:
                    got |= _touched(x, memo)
    return got


def _exits(s: Stmt, memo: dict) -> bool:
    """Whether a break, continue or return is anywhere inside a statement with blocks."""
    got = memo.get(id(s))
    if got is None:
        got = memo[id(s)] = any(x.op in TERMINATORS or (x.blocks and _exits(x, memo))
                                for b in s.blocks for x in b.stmts)
    return got


def _forward_in_blocks(kernel: Kernel) -> None:
    """Store-to-load forwarding and dead stores within each block (module docstring)."""
    mapping: dict[Stmt, Stmt] = {}
    dead: set[int] = set()
    memo: dict = {}
    exits: dict = {}
    for blk in kernel_blocks(kernel):
        value: dict[int, Stmt] = {}    # variable -> the value its last store in this block wrote
        unread: dict[int, Stmt] = {}   # variable -> its last store, not read since
        version: dict[int, int] = {}   # variable -> stores and barriers seen so far
        loaded: dict[int, tuple] = {}  # load -> (variable, its version then)
        for s in blk.stmts:
            if s.op in TERMINATORS or (s.blocks and _exits(s, exits)):
                unread.clear()  # the block may be left here: every stored value may be read
            if s.blocks or s.op not in (Op.LOCAL_LOAD, Op.LOCAL_STORE):
                hit = _touched(s, memo) if s.blocks else {id(a) for a in s.args if a.op is Op.ALLOCA}
                for a in hit:  # a barrier: the variable may be read or written there
                    value.pop(a, None)
                    unread.pop(a, None)
                    version[a] = version.get(a, 0) + 1
                continue
            a = id(s.args[0])
            if s.op is Op.LOCAL_LOAD:
                if a in value:  # forwarded: the store it reads stays unread
                    mapping[s] = value[a]
                    dead.add(id(s))
                else:
                    unread.pop(a, None)
                    loaded[id(s)] = (a, version.get(a, 0))
                continue
            v = s.args[1]
            if v.op is Op.LOCAL_LOAD and loaded.get(id(v)) == (a, version.get(a, 0)):
                dead.add(id(s))  # stores back what the variable holds
                continue
            if a in unread:
                dead.add(id(unread[a]))
            value[a], unread[a] = v, s
            version[a] = version.get(a, 0) + 1
    if dead:
        substitute(kernel, mapping)
        for blk in kernel_blocks(kernel):
            blk.stmts = [s for s in blk.stmts if id(s) not in dead]

