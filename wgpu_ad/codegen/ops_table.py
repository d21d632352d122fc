"""The WGSL spelling of every ALU op, literals and conversions: data, one entry per op.

A spelling is a template over the operand expressions {0} {1} {2} (names or literals, never
compound expressions, so no extra parentheses are needed), chosen by the operand dtype.
Ops whose Python meaning differs from WGSL call helpers of shaders/math.wgsl by name; the
code generator copies in each helper a shader calls.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..ir.nodes import Stmt
from ..ir.ops import Op
from ..types import DType, f16, f32, i32, u1, u32


def wgsl_type(dt: DType) -> str:
    return dt.wgsl


def zero(dt: DType) -> str:
    return literal(False if dt == u1 else 0, dt)


def literal(value, dt: DType) -> str:
    """A WGSL literal of dtype dt; negative values come parenthesized so '-' never doubles up."""
    if dt == u1:
        return "true" if value else "false"
    if dt == u32:
        return f"{int(value) % 2**32}u"
    if dt == i32:
        v = (int(value) + 2**31) % 2**32 - 2**31   # two's complement wrap, like the GPU
        if v == -2**31:
            return "i32(-2147483647 - 1)"
        return f"{v}i" if v >= 0 else f"(-{-v}i)"
    if dt == f32:
        return _float_literal(float(value), np.float32, "f")
    if dt == f16:
        return _float_literal(float(value), np.float16, "h")
    raise TypeError(f"no WGSL literal for dtype {dt!r}")


def _float_literal(v: float, npt, suffix: str) -> str:
    with np.errstate(over="ignore"):
        x = npt(v)  # out of range becomes inf, as the cast on the GPU would
    if math.isnan(x) or math.isinf(x):
        bits = 0x7FC00000 if math.isnan(x) else (0x7F800000 if x > 0 else 0xFF800000)
        f = f"bits_f32({bits:#010x}u)"  # not a constant expression (shaders/math.wgsl bits_f32)
        return f if suffix == "f" else f"f16({f})"
    if x == 0 and math.copysign(1.0, float(x)) < 0:
        return f"(-0.0{suffix})"
    text = np.format_float_positional(abs(x), unique=True, trim="0")  # shortest round-trip digits
    if len(text) > 12:
        text = np.format_float_scientific(abs(x), unique=True, trim="0", exp_digits=1)
        mant, exp = text.split("e")
        text = (mant if "." in mant else mant + ".0") + "e" + exp
    if "e" not in text and "." not in text:
        text += ".0"
    out = f"{text}{suffix}"
    return f"(-{out})" if x < 0 else out


def float_bits(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


def convert(expr: str, src: DType, dst: DType) -> str:
    """Value conversion (CAST): bool via select / != 0, numbers via the WGSL constructor.
    f32 -> i32 truncates toward zero; i32 <-> u32 keeps the bits (two's complement)."""
    if src == dst:
        return expr
    if dst == u1:
        return f"({expr} != {zero(src)})"
    if src == u1:
        return f"select({zero(dst)}, {literal(1, dst)}, {expr})"
    return f"{dst.wgsl}({expr})"


@dataclass(frozen=True)
class Spelling:
    """Templates by operand dtype; f16 uses the float template unless it has its own."""

    f: str | None = None
    i: str | None = None
    u: str | None = None
    b: str | None = None
    h: str | None = None

    def template(self, dt: DType) -> str | None:
        if dt == f16:
            return self.h or self.f
        return {f32: self.f, i32: self.i, u32: self.u, u1: self.b}.get(dt)


def num(t: str) -> Spelling:
    return Spelling(f=t, i=t, u=t)


def ints(t: str) -> Spelling:
    return Spelling(i=t, u=t)


def floats(t: str) -> Spelling:
    return Spelling(f=t)


def any_type(t: str) -> Spelling:
    return Spelling(f=t, i=t, u=t, b=t)


def _shift(sym: str) -> Callable[[Stmt, list[str]], str]:
    # the amount must be u32 in WGSL; masked to 0..31 (Taichi/CUDA-like) so a constant
    # amount >= 32 is not a shader-creation error
    def spell(s: Stmt, x: list[str]) -> str:
        amount = s.args[1]
        if amount.op is Op.CONST:
            return f"{x[0]} {sym} {int(amount.attr) & 31}u"
        a = x[1] if amount.dtype == u32 else f"u32({x[1]})"
        return f"{x[0]} {sym} ({a} & 31u)"
    return spell


def helper(name: str) -> Spelling:
    """A float function of shaders/math.wgsl (f32; f16 converts around it)."""
    return Spelling(f=f"{name}({{0}})", h=f"f16({name}(f32({{0}})))")


def _cast(s: Stmt, x: list[str]) -> str:
    return convert(x[0], s.args[0].dtype, s.dtype)


def _bitcast(s: Stmt, x: list[str]) -> str:
    if s.args[0].dtype == s.dtype:
        return x[0]
    return f"bitcast<{s.dtype.wgsl}>({x[0]})"


# One entry per ALU op. Reference semantics: wgpu_ad/ir/ops.py and the IR interpreter.
ALU: dict[Op, Spelling | Callable[[Stmt, list[str]], str]] = {
    Op.NEG: Spelling(f="-{0}", i="-{0}", u="0u - {0}"),
    Op.ABS: num("abs({0})"),
    Op.SIGN: Spelling(f="sign({0})", i="sign({0})", u="select(0u, 1u, {0} != 0u)"),
    # WGSL bounds sin / cos only absolutely, 2^-11 on [-pi, pi] (SwiftShader's: sin 1e-30 = 0)
    Op.SIN: helper("sin_f32"),
    Op.COS: helper("cos_f32"),
    Op.TAN: helper("tan_f32"),
    # atan2 forms: lavapipe's asin/acos lose ~4e-4 near +-1, its atan / atan2 350 ulps everywhere;
    # atan2_f32 of shaders/math.wgsl stays within a few (tests/test_math_accuracy.py has the bounds)
    Op.ASIN: Spelling(f="atan2_f32({0}, sqrt((1.0 - {0}) * (1.0 + {0})))",
                      h="f16(atan2_f32(f32({0}), sqrt((1.0 - f32({0})) * (1.0 + f32({0})))))"),
    Op.ACOS: Spelling(f="atan2_f32(sqrt((1.0 - {0}) * (1.0 + {0})), {0})",
                      h="f16(atan2_f32(sqrt((1.0 - f32({0})) * (1.0 + f32({0}))), f32({0})))"),
    Op.ATAN: helper("atan_f32"),
    Op.TANH: helper("tanh_f32"),                  # lavapipe's: 0.44 of the value off near 1e-7
    Op.EXP: floats("exp({0})"),
    Op.LOG: helper("log_f32"),                    # WGSL's: an absolute error bound near 1, no edges
    Op.SQRT: floats("sqrt({0})"),
    Op.RSQRT: floats("inverseSqrt({0})"),
    # WGSL's asinh / acosh / atanh may be log(x + sqrt(x * x + 1.0)) ... (lavapipe's are): helpers
    # accurate near 0 and 1, like log1p / expm1, which WGSL lacks
    Op.ASINH: helper("asinh_f32"),
    Op.ACOSH: helper("acosh_f32"),
    Op.ATANH: helper("atanh_f32"),
    Op.LOG1P: helper("log1p_f32"),
    Op.EXPM1: helper("expm1_f32"),
    Op.FLOOR: floats("floor({0})"),
    Op.CEIL: floats("ceil({0})"),
    Op.ROUND: floats("round({0})"),               # half to even, like numpy.round
    Op.NOT: Spelling(b="!{0}"),
    Op.BIT_NOT: ints("~{0}"),
    Op.CAST: _cast,
    Op.BITCAST: _bitcast,

    Op.ADD: num("{0} + {1}"),
    Op.SUB: num("{0} - {1}"),
    Op.MUL: num("{0} * {1}"),
    Op.DIV: num("{0} / {1}"),                     # ints truncate; x / 0 = x in WGSL (no trap)
    Op.FLOORDIV: Spelling(f="floor({0} / {1})", i="floordiv_i32({0}, {1})", u="{0} / {1}"),
    Op.MOD: Spelling(f="{0} - {1} * floor({0} / {1})", i="mod_i32({0}, {1})", u="{0} % {1}"),
    Op.POW: Spelling(f="pow_f32({0}, {1})", h="f16(pow_f32(f32({0}), f32({1})))",
                     i="pow_i32({0}, {1})", u="pow_u32({0}, {1})"),
    Op.ATAN2: Spelling(f="atan2_f32({0}, {1})", h="f16(atan2_f32(f32({0}), f32({1})))"),
    Op.MIN: num("min({0}, {1})"),
    Op.MAX: num("max({0}, {1})"),
    Op.BIT_AND: Spelling(i="{0} & {1}", u="{0} & {1}", b="{0} & {1}"),
    Op.BIT_OR: Spelling(i="{0} | {1}", u="{0} | {1}", b="{0} | {1}"),
    Op.BIT_XOR: Spelling(i="{0} ^ {1}", u="{0} ^ {1}", b="{0} != {1}"),
    Op.SHL: _shift("<<"),
    Op.SHR: _shift(">>"),                         # arithmetic for i32, logical for u32 (by type)
    Op.AND: Spelling(b="{0} && {1}"),
    Op.OR: Spelling(b="{0} || {1}"),
    Op.LT: num("{0} < {1}"),
    Op.LE: num("{0} <= {1}"),
    Op.GT: num("{0} > {1}"),
    Op.GE: num("{0} >= {1}"),
    Op.EQ: any_type("{0} == {1}"),
    Op.NE: any_type("{0} != {1}"),

    Op.SELECT: any_type("select({2}, {1}, {0})"),   # WGSL select(if_false, if_true, cond)
}

# helper functions of shaders/math.wgsl that spellings may call; one a helper calls comes after it
MATH_HELPERS = ("floordiv_i32", "mod_i32", "pow_f32", "pow_i32", "pow_u32", "asinh_f32", "acosh_f32",
                "atanh_f32", "tanh_f32", "log1p_f32", "log_f32", "expm1_f32", "atan2_f32", "atan_f32",
                "tan_f32", "sin_f32", "cos_f32", "sincos_f32", "bits_f32")


def spell(s: Stmt, operands: list[str]) -> str | None:
    """The WGSL expression of ALU stmt s, or None when its operand dtype has no spelling."""
    entry = ALU[s.op]
    if callable(entry):
        return entry(s, operands)
    key = s.args[1].dtype if s.op is Op.SELECT else s.args[0].dtype
    t = entry.template(key)
    return None if t is None else t.format(*operands)


def word_dtype(dt: DType) -> DType:
    """The 4-byte type that carries dt in a uniform or return word (bool as u32, f16 as f32)."""
    return {u1: u32, f16: f32}.get(dt, dt)


def from_bits(expr: str, dt: DType) -> str:
    """The inverse of to_bits."""
    if dt == u32:
        return expr
    if dt == u1:
        return f"({expr} != 0u)"
    if dt == f16:
        return f"f16(bitcast<f32>({expr}))"
    return f"bitcast<{dt.wgsl}>({expr})"


def to_bits(expr: str, dt: DType) -> str:
    """The u32 bits of a value, for the error buffer."""
    if dt == u32:
        return expr
    if dt == u1:
        return f"select(0u, 1u, {expr})"
    if dt == f16:
        return f"bitcast<u32>(f32({expr}))"
    return f"bitcast<u32>({expr})"
