"""Before reverse mode: `break` and `continue` become flags.

A loop body with early exits is rewritten so that every statement after a possible exit is
guarded by `if not (brk or cont)`, and the body ends with `if brk: break`. The only BREAK left is
that last one, so an iteration's replay and its reverse run the same statements as the forward
did. A range task's top-level `continue` gets the same treatment (it ends one parallel iteration).
"""
from __future__ import annotations

from ...ir.builder import Builder
from ...ir.nodes import Block, Stmt, Task
from ...ir.ops import Op
from ...types import u1


def _exits(block: Block) -> bool:
    """Does the block contain a BREAK/CONTINUE that belongs to the enclosing loop?"""
    for s in block.stmts:
        if s.op in (Op.BREAK, Op.CONTINUE):
            return True
        if s.op is Op.IF and any(_exits(b) for b in s.blocks):
            return True
    return False


class _Flags:
    def __init__(self, brk: Stmt | None, cont: Stmt):
        self.brk, self.cont = brk, cont


def _rewrite(block: Block, flags: _Flags) -> list[Stmt]:
    b = Builder(Block())
    out = b.block.stmts
    stmts = block.stmts
    for k, s in enumerate(stmts):
        if s.op is Op.BREAK or s.op is Op.CONTINUE:
            flag = flags.brk if s.op is Op.BREAK else flags.cont
            b.loc = s.loc
            b.store(flag, b.const(True, u1))
            return out  # the rest of the block never runs
        if s.op is Op.IF and any(_exits(x) for x in s.blocks):
            for x in s.blocks:
                x.stmts = _rewrite(x, flags)
            out.append(s)
            rest = Block(stmts[k + 1:])
            if rest.stmts:
                b.loc = s.loc
                done = b.load(flags.cont)
                if flags.brk is not None:
                    done = b.emit(Op.OR, [b.load(flags.brk), done])
                guard = b.if_(b.emit(Op.NOT, [done]))
                guard.blocks[0].stmts = _rewrite(rest, flags)
            return out
        out.append(s)
    return out


def normalize_block(block: Block, flags: set) -> None:
    """Normalize every loop inside `block` (recursively); adds the flag variables to `flags`
    (they are false at the start of every iteration, so reverse mode never snapshots them)."""
    new = []
    for s in block.stmts:
        for x in s.blocks:
            normalize_block(x, flags)
        if s.op in (Op.RANGE_FOR, Op.WHILE) and _exits(s.blocks[0]):
            b = Builder(Block())
            b.loc = s.loc
            brk = b.alloca(u1, "brk")
            flags.add(brk)
            b.store(brk, b.const(False, u1))
            cont = b.alloca(u1, "cont")
            flags.add(cont)
            new.extend(b.block.stmts)
            body = s.blocks[0]
            head = Builder(Block())
            head.loc = s.loc
            head.store(cont, head.const(False, u1))
            rewritten = _rewrite(body, _Flags(brk, cont))
            tail = Builder(Block())
            tail.loc = s.loc
            exit_if = tail.if_(tail.load(brk))
            exit_if.blocks[0].stmts.append(Stmt(Op.BREAK, None, loc=s.loc))
            body.stmts = head.block.stmts + rewritten + tail.block.stmts
        new.append(s)
    block.stmts = new


def normalize_task(task: Task) -> set:
    """Normalize a task in place; returns the flag variables it introduced."""
    flags: set = set()
    normalize_block(task.body, flags)
    if task.kind == "range" and _exits(task.body):
        b = Builder(Block())
        cont = b.alloca(u1, "cont")
        b.store(cont, b.const(False, u1))
        task.body.stmts = b.block.stmts + _rewrite(task.body, _Flags(None, cont))
    return flags
