"""Builds IR statements into the current block; the frontend and the autodiff passes use it."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any

from ..errors import SourceLoc
from ..types import DType, f32, i32, u1
from .nodes import Block, Stmt
from .ops import GroupOp, Op


def result_dtype(op: Op, args: list[Stmt], dtype: DType | None) -> DType | None:
    if dtype is not None:
        return dtype
    if op in GroupOp.Comparison or op in (Op.AND, Op.OR, Op.NOT, Op.WG_LEADER):
        return u1
    if op is Op.SELECT:
        return args[1].dtype
    if op in (Op.GLOBAL_STORE, Op.LOCAL_STORE, Op.PRINT) or op in GroupOp.Control:
        return None
    if op is Op.LOCAL_LOAD:
        return args[0].dtype
    return args[0].dtype if args else None


class Builder:
    def __init__(self, block: Block | None = None):
        self.block = block if block is not None else Block()
        self.loc: SourceLoc | None = None  # stamped on every new statement
        self.no_grad: list = []  # fields / ndarray arguments named by ti.stop_grad (the frontend's)

    def emit(self, op: Op, args=(), dtype: DType | None = None, attr: Any = None,
             blocks=(), name: str | None = None) -> Stmt:
        args = list(args)
        s = Stmt(op, result_dtype(op, args, dtype), args, attr, list(blocks), name, self.loc)
        self.block.stmts.append(s)
        return s

    @contextmanager
    def at(self, block: Block):
        saved, self.block = self.block, block
        try:
            yield block
        finally:
            self.block = saved

    # small helpers that read like the math
    def const(self, value, dtype: DType) -> Stmt:
        value = float(value) if dtype.is_float else (bool(value) if dtype == u1 else int(value))
        return self.emit(Op.CONST, (), dtype, value)

    def cast(self, x: Stmt, dtype: DType) -> Stmt:
        return x if x.dtype == dtype else self.emit(Op.CAST, [x], dtype)

    def unary(self, op: Op, x: Stmt) -> Stmt:
        return self.emit(op, [x])

    def binary(self, op: Op, a: Stmt, b: Stmt) -> Stmt:
        return self.emit(op, [a, b])

    def add(self, a, b): return self.emit(Op.ADD, [a, b])
    def sub(self, a, b): return self.emit(Op.SUB, [a, b])
    def mul(self, a, b): return self.emit(Op.MUL, [a, b])
    def div(self, a, b): return self.emit(Op.DIV, [a, b])
    def select(self, c, a, b): return self.emit(Op.SELECT, [c, a, b])
    def lt(self, a, b): return self.emit(Op.LT, [a, b])

    def alloca(self, dtype: DType, name: str | None = None) -> Stmt:
        return self.emit(Op.ALLOCA, (), dtype, name, name=name)

    def load(self, var: Stmt) -> Stmt:
        return self.emit(Op.LOCAL_LOAD, [var], var.dtype, name=var.name)

    def store(self, var: Stmt, value: Stmt) -> Stmt:
        return self.emit(Op.LOCAL_STORE, [var, value])

    def if_(self, cond: Stmt) -> Stmt:
        return self.emit(Op.IF, [cond], blocks=[Block(), Block()])

    def range_for(self, begin: Stmt, end: Stmt, name: str | None = None) -> Stmt:
        return self.emit(Op.RANGE_FOR, [begin, end], blocks=[Block()], name=name)

    def loop_index(self, loop: Any, name: str | None = None) -> Stmt:
        return self.emit(Op.LOOP_INDEX, (), i32, loop, name=name)


def is_const(s: Stmt, value=None) -> bool:
    return s.op is Op.CONST and (value is None or s.attr == value)


__all__ = ["Builder", "is_const", "result_dtype", "f32", "i32", "u1"]
