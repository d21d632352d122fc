"""Common subexpression elimination, scoped by block dominance.

A statement dominates the later statements of its own block and everything nested in them, so a
value computed in an outer block is reused in nested blocks; values of sibling blocks (the two
branches of an IF, consecutive loops) are never shared.

Pure ops (ALU, CONST, ARG, LOOP_INDEX) are merged when (op, dtype, operands, attr) agree, with the
operands of commutative ops sorted. Memory reads are merged only when nothing may have written
their location in between: every location (a buffer's alias class, a local variable) carries an
epoch that each write bumps, and a read's key includes the epoch. A loop (and a range task's body,
which each thread repeats) bumps the epochs of everything its body writes before the body is
scanned, so a read inside is never merged with one before the loop when a later iteration's
write could sit between them. Writes inside nested blocks bump the epoch for good, so reads after
an IF or loop that may write are not merged with reads before it.
"""
from __future__ import annotations

import itertools

from ..ir.nodes import Block, Kernel, Stmt
from ..ir.ops import GroupOp, Op
from ..ir.utils import PURE, adopt_name, buffer_alias_key, const_key, writes_in

_LOOPS = frozenset({Op.RANGE_FOR, Op.WHILE})


def cse(kernel: Kernel) -> Kernel:
    for task in kernel.tasks:
        _CSE().run(task)
    return kernel


def _attr_key(s: Stmt) -> object:
    if s.op is Op.CONST:
        return const_key(s)
    a = s.attr
    try:
        hash(a)
    except TypeError:
        return ("id", id(a))
    return a


class _CSE:
    def __init__(self):
        self.epochs: dict[object, int] = {}
        self.counter = itertools.count(1)
        self.repl: dict[Stmt, Stmt] = {}

    def bump(self, locations) -> None:
        for loc in locations:
            self.epochs[loc] = next(self.counter)

    def run(self, task) -> None:
        scopes: list[dict] = [{}]
        self.block(task.bounds, scopes)
        self.bump(writes_in(task.body))  # every thread repeats the body: it is a loop
        self.block(task.body, scopes + [{}])
        task.begin = self.repl.get(task.begin, task.begin)
        task.end = self.repl.get(task.end, task.end)

    def key(self, s: Stmt):
        op = s.op
        args = tuple(s.args)
        if op in GroupOp.Commutative:
            args = tuple(sorted(args, key=lambda a: a.id))
        if op in PURE:
            return (op, s.dtype, args, _attr_key(s))
        if op is Op.GLOBAL_LOAD:
            return (op, s.dtype, args, id(s.attr), self.epochs.get(buffer_alias_key(s.attr), 0))
        if op is Op.LOCAL_LOAD:
            return (op, s.dtype, args, self.epochs.get(("local", s.args[0]), 0))
        return None

    def block(self, block: Block, scopes: list[dict]) -> None:
        table = scopes[-1]
        out: list[Stmt] = []
        repl = self.repl
        for s in block.stmts:
            if repl:
                s.args = [repl.get(a, a) for a in s.args]
            op = s.op
            k = self.key(s)
            if k is not None:
                hit = None
                for scope in reversed(scopes):
                    hit = scope.get(k)
                    if hit is not None:
                        break
                if hit is not None:
                    repl[s] = hit
                    if hit.name is None:
                        adopt_name(hit, s.name)
                    continue
                table[k] = s
            elif op is Op.GLOBAL_STORE:
                self.bump([buffer_alias_key(s.attr)])
            elif op is Op.ATOMIC:
                self.bump([buffer_alias_key(s.attr[1])])
            elif op is Op.LOCAL_STORE:
                self.bump([("local", s.args[0])])
            elif op is Op.ALLOCA:
                self.bump([("local", s)])
            if s.blocks:
                if op in _LOOPS:
                    self.bump(writes_in(s.blocks[0]))
                for b in s.blocks:
                    self.block(b, scopes + [{}])
            out.append(s)
        block.stmts[:] = out
