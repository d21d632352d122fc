"""Checks IR invariants between passes: defined before use, operand types agree, loops nest.

Run after every pass in tests and with ti.init(debug=True); a failure prints the bad node.
"""
from __future__ import annotations

from ..errors import WgpuAdError
from ..types import u1
from .nodes import Block, Kernel, Stmt, Task
from .ops import GroupOp, Op
from .printer import format_kernel, format_stmt


class VerifyError(WgpuAdError):
    pass


def verify(kernel: Kernel) -> None:
    buffers = set(map(id, kernel.buffers))
    args = set(map(id, kernel.args))

    def fail(s: Stmt, why: str):
        raise VerifyError(f"IR verification failed: {why}\n  at {format_stmt(s)}\n\n{format_kernel(kernel)}")

    def check_block(block: Block, defined: set, loops: list, task: Task):
        local = set(defined)
        for s in block.stmts:
            for a in s.args:
                if not isinstance(a, Stmt):
                    fail(s, f"operand {a!r} is not a statement")
                if id(a) not in local:
                    fail(s, f"operand {a!r} used before it is defined (or outside its block)")
            op = s.op
            if op in GroupOp.Binary and op not in (Op.SHL, Op.SHR):
                if s.args[0].dtype != s.args[1].dtype:
                    fail(s, f"operand types differ: {s.args[0].dtype} vs {s.args[1].dtype}")
            if op in GroupOp.Comparison or op in (Op.AND, Op.OR, Op.NOT):
                if s.dtype != u1:
                    fail(s, "comparison must produce u1")
            if op is Op.SELECT and (s.args[0].dtype != u1 or s.args[1].dtype != s.args[2].dtype):
                fail(s, "select needs a u1 condition and equal branch types")
            if op in (Op.IF,) and s.args[0].dtype != u1:
                fail(s, "if condition must be u1")
            if op in (Op.LOCAL_LOAD, Op.LOCAL_STORE) and s.args[0].op is not Op.ALLOCA:
                fail(s, "local load/store needs an alloca operand")
            if op is Op.LOCAL_STORE and s.args[1].dtype != s.args[0].dtype:
                fail(s, f"stores {s.args[1].dtype} into a {s.args[0].dtype} variable")
            if op in (Op.GLOBAL_LOAD, Op.GLOBAL_STORE, Op.ATOMIC):
                buf = s.attr[1] if op is Op.ATOMIC else s.attr
                if id(buf) not in buffers:
                    fail(s, f"buffer {buf!r} is not declared in kernel.buffers")
                if s.args[0].dtype.is_float:
                    fail(s, "global index must be an integer")
                if op is not Op.GLOBAL_LOAD and s.args[1].dtype != buf.dtype:
                    fail(s, f"stores {s.args[1].dtype} into {buf!r} of {buf.dtype}")
            if op is Op.ARG and id(s.attr) not in args:
                fail(s, f"argument {s.attr!r} is not declared in kernel.args")
            if op is Op.BREAK and not loops:
                fail(s, "break outside a serial loop")
            if op is Op.CONTINUE and not loops and task.kind != "range":
                fail(s, "continue outside a loop")
            if op is Op.LOOP_INDEX and not (s.attr is task or s.attr in loops):
                fail(s, "loop index outside its loop")
            if op is Op.PRINT and len(s.args) != len(s.attr.values):
                fail(s, f"print has {len(s.args)} values for the {len(s.attr.values)} of its line")
            if op in GroupOp.FloatOnly and op is not Op.POW and s.args[0].dtype.is_int:
                fail(s, f"{op.name} needs float operands")
            for b in s.blocks:
                inner = loops + [s] if op in (Op.RANGE_FOR, Op.WHILE) else loops
                check_block(b, local, inner, task)
            local.add(id(s))

    for t in kernel.tasks:
        check_block(t.bounds, set(), [], t)
        defined = {id(s) for s in t.bounds.stmts}
        if t.kind == "range":
            if t.begin is None or t.end is None or id(t.begin) not in defined | {id(s) for s in t.bounds.stmts} :
                raise VerifyError(f"range task {t.name} has no bounds defined in its bounds block")
        check_block(t.body, defined, [], t)
        check_block(t.epilogue, defined, [], t)
