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
"""
from __future__ import annotations

from ..ir.nodes import Block, Kernel, Stmt
from ..ir.ops import Op
from ..ir.utils import adopt_name, kernel_blocks, make_const, substitute
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
    if not dead:
        return kernel
    substitute(kernel, mapping)
    for blk in kernel_blocks(kernel):
        blk.stmts = [s for s in blk.stmts if id(s) not in dead]
    return kernel

