"""The NaN / Inf check of an adjoint task (CompileOptions.check_nan; records and messages in
wgpu_ad/nan_check.py).

Thread-local variables declared at the start of the task's body hold the first non-finite local
derivative of the thread: its site (1 + its position in the kernel's list of Origins, 0 while
none), the element index of a gradient read, and the operation's values (x, y, result, incoming
adjoint, contribution). Every contribution to a gradient buffer is an ASSERT that it is finite,
reporting them. Finite means the exponent bits are not all ones: WGSL has no isnan, and `x != x`
may be folded away by a fast-math shader compiler.
"""
from __future__ import annotations

from ...ir.builder import Builder
from ...ir.nodes import Buffer, Stmt
from ...ir.ops import Op
from ...nan_check import GradCheck, Origin
from ...types import f32, i32, u32

_EXPONENT = 0x7F800000


def is_finite(b: Builder, x: Stmt) -> Stmt:
    bits = b.emit(Op.BITCAST, [x], u32)
    return b.emit(Op.NE, [b.emit(Op.BIT_AND, [bits, b.const(_EXPONENT, u32)]), b.const(_EXPONENT, u32)])


class NanChecks:
    """Emits the checks of one adjoint task; `origins` is shared by the kernel's tasks."""

    def __init__(self, kernel: str, origins: list):
        self.kernel, self.origins = kernel, origins
        self.vars: dict[str, Stmt] = {}

    def declare(self, b: Builder) -> None:
        """The thread's origin variables, at the current position (the start of the task body:
        per iteration of a parallel loop; shared by the iterations of the serial loops in it)."""
        for name, dt in (("site", i32), ("at", i32), ("x", f32), ("y", f32), ("r", f32), ("g", f32), ("c", f32)):
            self.vars[name] = b.alloca(dt, f"nan_{name}")

    def _remember(self, b: Builder, value: Stmt, origin: Origin, values: dict) -> None:
        """if value is not finite and the thread has no origin yet: remember this one."""
        if value.op is Op.CONST:
            return  # a finite constant (the rules make no others)
        self.origins.append(origin)
        first = b.emit(Op.EQ, [b.load(self.vars["site"]), b.const(0, i32)])
        cond = b.emit(Op.AND, [b.emit(Op.NOT, [is_finite(b, value)]), first])
        n = b.if_(cond)
        with b.at(n.blocks[0]):
            b.store(self.vars["site"], b.const(len(self.origins), i32))
            for name, v in values.items():
                if v is not None:
                    b.store(self.vars[name], b.cast(v, self.vars[name].dtype))

    def derivative(self, b: Builder, contribution: Stmt, s: Stmt, operand: int, ops: list, r: Stmt, g: Stmt) -> None:
        """A rule's contribution to operand `operand` of primal statement s (operands `ops`
        replayed, result r, incoming adjoint g)."""
        vals = {"x": ops[0], "y": ops[1] if len(ops) > 1 else None, "r": r, "g": g, "c": contribution}
        vals = {k: v for k, v in vals.items() if v is None or v.dtype in (f32, i32, u32)}
        self._remember(b, contribution, Origin(s.loc, s.op.name.lower(), operand, len(ops)), vals)

    def read(self, b: Builder, value: Stmt, index: Stmt, primal: Buffer, gbuf: Buffer, loc) -> None:
        """A gradient the adjoint reads (the output's, y.grad[j] for a store y[j] = ...)."""
        self._remember(b, value, Origin(loc, None, field=_name(primal, gbuf), source=gbuf.source), {"at": index, "x": value})

    def write(self, b: Builder, value: Stmt, index: Stmt, primal: Buffer, gbuf: Buffer, loc) -> None:
        """ASSERT that a contribution to gradient buffer gbuf (primal's) at index is finite."""
        if value.op is Op.CONST:
            return
        ok = is_finite(b, value)
        reported = [value, b.cast(index, i32)] + [b.load(self.vars[k]) for k in ("site", "at", "x", "y", "r", "g", "c")]
        b.emit(Op.ASSERT, [ok] + reported, None, GradCheck(self.kernel, _name(primal, gbuf), gbuf.source, loc,
                                                           self.origins))


def _name(primal: Buffer, gbuf: Buffer) -> str:
    """The field's name (a snapshot's, x_before, reads its field's gradient x.grad)."""
    return gbuf.name[:-len(".grad")] if gbuf.name.endswith(".grad") else primal.name
