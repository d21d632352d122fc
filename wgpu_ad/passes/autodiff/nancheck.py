"""The NaN / Inf check of an adjoint task (CompileOptions.check_nan; records and messages in
wgpu_ad/nan_check.py).

Thread-local variables declared at the start of the task's body hold the first non-finite local
derivative of the thread: its site (1 + its position in the kernel's list of Origins, 0 while
none), the element index of a gradient read, and the operation's values (x, y, result, incoming
adjoint, contribution). Every contribution to a gradient buffer is an ASSERT that it is finite,
reporting them. Finite means the exponent bits are not all ones: WGSL has no isnan, and `x != x`
may be folded away by a fast-math shader compiler.

A shader compiler may fold a NaN or inf away too (WGSL allows it; lavapipe turns `0.0 / z`,
`x * 0.0`, `x - x` into 0 whatever x and z hold), so a non-finite derivative is also found from
its operands: DOMAIN says, per op, where its contribution is not finite in IEEE arithmetic (a zero
divisor, sqrt / log of a value <= 0, ...) for finite operands. Such a point is remembered as an
origin, and it sets the thread's `nan_dom`, which fails the next gradient write's check even when
the value written looks finite.
"""
from __future__ import annotations

from ...ir.builder import Builder
from ...ir.nodes import Buffer, Stmt
from ...ir.ops import Op
from ...nan_check import GradCheck, Origin
from ...types import f32, i32, u32

_EXPONENT = 0x7F800000


def _c(b: Builder, v: float, like: Stmt) -> Stmt:
    return b.const(v, like.dtype)


def _cmp(b: Builder, op: Op, x: Stmt, v: float) -> Stmt:
    return b.emit(op, [x, _c(b, v, x)])


def _any(b: Builder, *conds: Stmt) -> Stmt:
    out = conds[0]
    for c in conds[1:]:
        out = b.emit(Op.OR, [out, c])
    return out


def _all(b: Builder, *conds: Stmt) -> Stmt:
    out = conds[0]
    for c in conds[1:]:
        out = b.emit(Op.AND, [out, c])
    return out


def _used(b: Builder, g: Stmt) -> Stmt:
    return _cmp(b, Op.NE, g, 0.0)


def _abs(b: Builder, x: Stmt) -> Stmt:
    return b.emit(Op.ABS, [x])


def _log_like(b: Builder, x: Stmt, g: Stmt, at: float) -> Stmt:
    """g / (x - at): not finite at x = at; below it the op's value is NaN."""
    return _all(b, _cmp(b, Op.LE, x, at), _used(b, g))


# Where an op's contribution to operand k is not finite in IEEE arithmetic, for finite operands
# `ops` and incoming adjoint g (rules.py's formulas): op -> fn(b, k, ops, g) -> a u1, or None.
# sqrt, / and the ops of rules.SINGULAR leave a term out where g is exactly 0 (rules.py
# _strong_zero: ti.select(x > 0, ti.log(x), 0.0) at x <= 0 has a zero adjoint there), so g != 0
# is part of every condition.
DOMAIN = {
    Op.SQRT: lambda b, k, o, g: _all(b, _cmp(b, Op.LE, o[0], 0.0), _used(b, g)),
    Op.RSQRT: lambda b, k, o, g: _all(b, _cmp(b, Op.LE, o[0], 0.0), _used(b, g)),
    Op.LOG: lambda b, k, o, g: _log_like(b, o[0], g, 0.0),
    Op.LOG1P: lambda b, k, o, g: _log_like(b, o[0], g, -1.0),
    Op.ASIN: lambda b, k, o, g: _all(b, _cmp(b, Op.GE, _abs(b, o[0]), 1.0), _used(b, g)),
    Op.ACOS: lambda b, k, o, g: _all(b, _cmp(b, Op.GE, _abs(b, o[0]), 1.0), _used(b, g)),
    Op.ACOSH: lambda b, k, o, g: _all(b, _cmp(b, Op.LE, _abs(b, o[0]), 1.0), _used(b, g)),
    Op.ATANH: lambda b, k, o, g: _all(b, _cmp(b, Op.EQ, _abs(b, o[0]), 1.0), _used(b, g)),
    Op.DIV: lambda b, k, o, g: _all(b, _cmp(b, Op.EQ, o[1], 0.0), _used(b, g)),
    Op.MOD: lambda b, k, o, g: _all(b, _cmp(b, Op.EQ, o[1], 0.0), _used(b, g)) if k == 1 else None,
    Op.ATAN2: lambda b, k, o, g: _all(b, _cmp(b, Op.EQ, o[0], 0.0), _cmp(b, Op.EQ, o[1], 0.0), _used(b, g)),
    # d/dx x^y = y x^(y-1): inf at x = 0 for y < 1, NaN for x < 0 and y not an integer;
    # d/dy x^y = x^y log x: not finite for x <= 0
    Op.POW: lambda b, k, o, g: _all(b, _used(b, g), (
        _cmp(b, Op.LE, o[0], 0.0) if k == 1 else
        _any(b, _all(b, _cmp(b, Op.EQ, o[0], 0.0), _cmp(b, Op.LT, o[1], 1.0)),
             _all(b, _cmp(b, Op.LT, o[0], 0.0), b.emit(Op.NE, [o[1], b.emit(Op.FLOOR, [o[1]])]))))),
}


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
        for name, dt in (("site", i32), ("at", i32), ("x", f32), ("y", f32), ("r", f32), ("g", f32), ("c", f32),
                         ("dom", i32)):
            self.vars[name] = b.alloca(dt, f"nan_{name}")

    def _remember(self, b: Builder, value: Stmt, origin: Origin, values: dict, domain: Stmt | None = None) -> None:
        """if value is not finite (or `domain` holds: it is not in IEEE arithmetic) and the thread
        has no origin yet: remember this one."""
        if domain is not None:
            n = b.if_(domain)
            with b.at(n.blocks[0]):
                b.store(self.vars["dom"], b.const(1, i32))
        elif value.op is Op.CONST:
            return  # a finite constant (the rules make no others)
        self.origins.append(origin)
        first = b.emit(Op.EQ, [b.load(self.vars["site"]), b.const(0, i32)])
        bad = b.emit(Op.NOT, [is_finite(b, value)])
        if domain is not None:
            bad = b.emit(Op.OR, [bad, domain])
        n = b.if_(b.emit(Op.AND, [bad, first]))
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
        rule = DOMAIN.get(s.op)
        domain = rule(b, operand, ops, g) if rule is not None else None
        self._remember(b, contribution, Origin(s.loc, s.op.name.lower(), operand, len(ops)), vals, domain)

    def read(self, b: Builder, value: Stmt, index: Stmt, primal: Buffer, gbuf: Buffer, loc) -> None:
        """A gradient the adjoint reads (the output's, y.grad[j] for a store y[j] = ...)."""
        self._remember(b, value, Origin(loc, None, field=_name(primal, gbuf), source=gbuf.source), {"at": index, "x": value})

    def write(self, b: Builder, value: Stmt, index: Stmt, primal: Buffer, gbuf: Buffer, loc) -> None:
        """ASSERT that a contribution to gradient buffer gbuf (primal's) at index is finite, and that
        no derivative before it in the thread was at a point where it is not (nan_dom)."""
        ok = b.emit(Op.EQ, [b.load(self.vars["dom"]), b.const(0, i32)])
        if value.op is not Op.CONST:
            ok = b.emit(Op.AND, [is_finite(b, value), ok])
        reported = [value, b.cast(index, i32)] + [b.load(self.vars[k]) for k in ("site", "at", "x", "y", "r", "g", "c")]
        b.emit(Op.ASSERT, [ok] + reported, None, GradCheck(self.kernel, _name(primal, gbuf), gbuf.source, loc,
                                                           self.origins))


def _name(primal: Buffer, gbuf: Buffer) -> str:
    """The field's name (a snapshot's, x_before, reads its field's gradient x.grad)."""
    return gbuf.name[:-len(".grad")] if gbuf.name.endswith(".grad") else primal.name
