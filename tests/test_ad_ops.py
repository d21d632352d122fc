"""Reverse mode, one op at a time: every differentiable op of the rules table as users write it
(ti.sin(x), x ** y, x % y, ti.select ...), the zero-gradient ops, ti.stop_grad, vector/matrix
operations and atomic accumulation, each against float64 NumPy central differences of a NumPy
reimplementation (or an analytic derivative)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

import wgpu_ad as ti
from ad_util import assert_grad, central_diff, central_diffs, f32
from test_math_functions import FUNCS
from wgpu_ad.ir.nodes import walk
from wgpu_ad.ir.ops import GroupOp, Op
from wgpu_ad.passes.autodiff.rules import DIFFERENTIABLE, ZERO

pytestmark = pytest.mark.gpu

N = 6


def ops_in(kernel, *args) -> set:
    """The ops of the compiled forward IR (checks that an expression really lowers to its op)."""
    ir = kernel._get(args)[0].ir
    return {s.op for t in ir.tasks for blk in (t.bounds, t.body) for s in walk(blk)}


def vals(lo: float, hi: float, seed: int, n: int = N) -> np.ndarray:
    return f32(np.random.default_rng(seed).uniform(lo, hi, n))


def weights(seed: int, n: int = N) -> np.ndarray:
    """Output seeds of both signs, so a sign error in a rule cannot hide."""
    r = np.random.default_rng(100 + seed)
    return f32(r.uniform(0.5, 1.5, n) * r.choice([-1.0, 1.0], n))


# ---- unary ops --------------------------------------------------------------------------------
@ti.func
def f_neg(a): return -a
@ti.func
def f_abs(a): return ti.abs(a)
@ti.func
def f_pyabs(a): return abs(a)
@ti.func
def f_sin(a): return ti.sin(a)
@ti.func
def f_cos(a): return ti.cos(a)
@ti.func
def f_tan(a): return ti.tan(a)
@ti.func
def f_asin(a): return ti.asin(a)
@ti.func
def f_acos(a): return ti.acos(a)
@ti.func
def f_atan(a): return ti.atan(a)
@ti.func
def f_tanh(a): return ti.tanh(a)
@ti.func
def f_exp(a): return ti.exp(a)
@ti.func
def f_log(a): return ti.log(a)
@ti.func
def f_sqrt(a): return ti.sqrt(a)
@ti.func
def f_rsqrt(a): return ti.rsqrt(a)
@ti.func
def f_float(a): return float(a)
@ti.func
def f_cast(a): return ti.cast(a, ti.f32) * a
@ti.func
def f_pow_int(a): return a ** 3                 # small integer exponents lower to multiplies
@ti.func
def f_pow_neg(a): return a ** -2
@ti.func
def f_pow_big(a): return a ** 10.0              # stays a POW; negative bases too
@ti.func
def f_clamp(a): return ti.math.clamp(a, -0.5, 0.5)
@ti.func
def f_minmax_n(a): return ti.max(a, 0.5 * a, -a - 0.2) + ti.min(ti.Vector([a, 2.0 * a, a * a]))
@ti.func
def f_fract(a): return ti.math.fract(a)
@ti.func
def f_log2(a): return ti.math.log2(a)
@ti.func
def f_exp2(a): return ti.math.exp2(a)
@ti.func
def f_chain(a): return ti.exp(ti.sin(a) * a) / (1.0 + a * a)


@dataclass
class U:
    name: str
    op: Op | None     # the op the expression lowers to (None: a frontend composite)
    fn: Callable
    ref: Callable     # NumPy float64 reimplementation
    lo: float
    hi: float
    xs: tuple = ()    # explicit inputs instead of uniform [lo, hi)


def _clamp(a): return np.clip(a, -0.5, 0.5)


UNARY = [
    U("neg", Op.NEG, f_neg, lambda a: -a, -2, 2),
    U("abs", Op.ABS, f_abs, np.abs, 0, 0, (-1.5, -0.7, -0.2, 0.3, 0.8, 1.9)),
    U("py_abs", Op.ABS, f_pyabs, np.abs, 0, 0, (-1.1, -0.4, 0.25, 0.6, 1.3, -2.0)),
    U("sin", Op.SIN, f_sin, np.sin, -3, 3),
    U("cos", Op.COS, f_cos, np.cos, -3, 3),
    U("tan", Op.TAN, f_tan, np.tan, -1.2, 1.2),
    U("asin", Op.ASIN, f_asin, np.arcsin, -0.9, 0.9),
    U("acos", Op.ACOS, f_acos, np.arccos, -0.9, 0.9),
    U("atan", Op.ATAN, f_atan, np.arctan, -3, 3),
    U("tanh", Op.TANH, f_tanh, np.tanh, -2, 2),
    U("exp", Op.EXP, f_exp, np.exp, -2, 2),
    U("log", Op.LOG, f_log, np.log, 0.2, 3),
    U("sqrt", Op.SQRT, f_sqrt, np.sqrt, 0.2, 3),
    U("rsqrt", Op.RSQRT, f_rsqrt, lambda a: 1 / np.sqrt(a), 0.2, 3),
    U("float_cast", None, f_float, lambda a: a, -2, 2),
    U("cast_f32", None, f_cast, lambda a: a * a, -2, 2),
    U("pow_int", Op.MUL, f_pow_int, lambda a: a ** 3, -2, 2),
    U("pow_neg_int", Op.DIV, f_pow_neg, lambda a: a ** -2.0, 0, 0, (-1.7, -0.6, 0.4, 0.9, 1.5, 2.2)),
    U("pow_big_int", Op.POW, f_pow_big, lambda a: a ** 10.0, 0, 0, (-1.1, -0.8, -0.5, 0.6, 0.9, 1.05)),
    U("clamp", Op.MIN, f_clamp, _clamp, 0, 0, (-1.3, -0.7, -0.3, 0.1, 0.45, 0.9)),
    U("minmax_n", Op.MAX, f_minmax_n,
      lambda a: np.maximum(np.maximum(a, 0.5 * a), -a - 0.2) + np.minimum(np.minimum(a, 2 * a), a * a),
      0, 0, (-1.3, -0.7, -0.15, 0.3, 0.7, 1.6)),
    U("fract", Op.FLOOR, f_fract, lambda a: a - np.floor(a), 0, 0, (-1.3, -0.6, 0.2, 0.7, 1.4, 2.9)),
    U("log2", Op.LOG, f_log2, np.log2, 0.2, 3),
    U("exp2", Op.EXP, f_exp2, np.exp2, -2, 2),
    U("chain", None, f_chain, lambda a: np.exp(np.sin(a) * a) / (1 + a * a), -2, 2),
]


def run_unary(fn, xv: np.ndarray, w: np.ndarray):
    x = ti.field(ti.f32, shape=len(xv), needs_grad=True)
    y = ti.field(ti.f32, shape=len(xv), needs_grad=True)

    @ti.kernel
    def unary():
        for i in x:
            y[i] = fn(x[i])

    x.from_numpy(xv)
    unary()
    y.grad.from_numpy(w)
    unary.grad()
    return y.to_numpy(), x.grad.to_numpy(), unary


@pytest.mark.parametrize("case", UNARY, ids=lambda c: c.name)
def test_unary_op_gradient(case: U):
    xv = f32(case.xs) if case.xs else vals(case.lo, case.hi, seed=len(case.name))
    w = weights(len(case.name), len(xv))
    y, g, k = run_unary(case.fn, xv, w)
    x64 = xv.astype(np.float64)
    np.testing.assert_allclose(y, case.ref(x64), rtol=2e-5, atol=2e-6, err_msg="forward value")
    ref = central_diff(lambda a: np.sum(w * case.ref(a)), x64)
    assert_grad(g, ref, what=f"d/dx of {case.name}")
    if case.op is not None:
        assert case.op in ops_in(k), f"{case.name} did not lower to {case.op}"


# ---- binary ops: both operands with gradients, or one of them constant / without gradient -----
@ti.func
def f_add(a, b): return a + b
@ti.func
def f_sub(a, b): return a - b
@ti.func
def f_mul(a, b): return a * b
@ti.func
def f_div(a, b): return a / b
@ti.func
def f_pow(a, b): return a ** b
@ti.func
def f_tipow(a, b): return ti.pow(a, b)
@ti.func
def f_atan2(a, b): return ti.atan2(a, b)
@ti.func
def f_atan_2arg(a, b): return ti.atan(a, b)
@ti.func
def f_min(a, b): return ti.min(a, b)
@ti.func
def f_max(a, b): return ti.max(a, b)
@ti.func
def f_pymin(a, b): return min(a, b)
@ti.func
def f_pymax(a, b): return max(a, b)
@ti.func
def f_mod(a, b): return a % b
@ti.func
def f_mix(a, b): return ti.math.mix(a, b, 0.3)
@ti.func
def f_poly(a, b): return (a * b - b) / (1.0 + a * a) + a * ti.sin(b)


@dataclass
class B:
    name: str
    op: Op | None
    fn: Callable
    ref: Callable
    a: tuple
    b: tuple
    ca: float          # constant first operand (domain-safe with every b)
    cb: float          # constant second operand (domain-safe with every a)


_A = (-1.7, -0.8, -0.3, 0.4, 1.1, 1.9)
_B = (1.3, -0.6, 0.9, -1.4, 0.7, -2.1)
_POS_A = (0.4, 0.8, 1.3, 1.9, 0.6, 2.4)
_POS_B = (-1.3, 0.7, 2.6, -0.4, 1.7, 0.35)
# a and b differ by at least 0.2 everywhere: min/max pick a side clearly
_MB = (-1.2, -1.1, 0.3, 0.1, 1.4, 1.5)


def _mod_safe(a, b) -> bool:
    q = np.asarray(a, np.float64) / np.asarray(b, np.float64)
    f = q - np.floor(q)
    return bool(np.all((f > 0.05) & (f < 0.95)))


BINARY = [
    B("add", Op.ADD, f_add, lambda a, b: a + b, _A, _B, -0.7, 1.5),
    B("sub", Op.SUB, f_sub, lambda a, b: a - b, _A, _B, -0.7, 1.5),
    B("mul", Op.MUL, f_mul, lambda a, b: a * b, _A, _B, -0.7, 1.5),
    B("div", Op.DIV, f_div, lambda a, b: a / b, _A, _B, -0.7, 1.5),
    B("pow", Op.POW, f_pow, np.power, _POS_A, _POS_B, 1.7, 2.5),
    B("ti_pow", Op.POW, f_tipow, np.power, _POS_A, _POS_B, 0.6, -1.5),
    B("atan2", Op.ATAN2, f_atan2, np.arctan2, _A, _B, -0.9, 1.2),
    B("atan_2arg", Op.ATAN2, f_atan_2arg, np.arctan2, _A, _B, 0.8, -1.1),
    B("min", Op.MIN, f_min, np.minimum, _A, _MB, 0.0, 0.0),
    B("max", Op.MAX, f_max, np.maximum, _A, _MB, 0.0, 0.0),
    B("py_min", Op.MIN, f_pymin, np.minimum, _A, _MB, 0.6, 0.6),
    B("py_max", Op.MAX, f_pymax, np.maximum, _A, _MB, -0.5, -0.5),
    B("mod", Op.MOD, f_mod, np.mod, (-2.3, -0.35, 0.45, 1.2, 2.75, 3.3), (0.7, 1.3, -0.9, 0.55, -1.6, 1.15),
      1.9, 0.65),
    B("mix", None, f_mix, lambda a, b: a + (b - a) * 0.3, _A, _B, -0.7, 1.5),
    B("poly", None, f_poly, lambda a, b: (a * b - b) / (1 + a * a) + a * np.sin(b), _A, _B, -0.7, 1.5),
]


def run_binary(fn, av, bv, w, mode: str, ca: float, cb: float):
    """mode: 'both' (a, b fields with gradients), 'const_a', 'const_b' (a literal operand), or
    'nograd_b' (b is a field without a gradient)."""
    a = ti.field(ti.f32, shape=len(av), needs_grad=True)
    b = ti.field(ti.f32, shape=len(av), needs_grad=mode != "nograd_b")
    y = ti.field(ti.f32, shape=len(av), needs_grad=True)

    @ti.kernel
    def both():
        for i in a:
            y[i] = fn(a[i], b[i])

    @ti.kernel
    def const_a():
        for i in a:
            y[i] = fn(ca, b[i])

    @ti.kernel
    def const_b():
        for i in a:
            y[i] = fn(a[i], cb)

    k = {"both": both, "nograd_b": both, "const_a": const_a, "const_b": const_b}[mode]
    a.from_numpy(av)
    b.from_numpy(bv)
    k()
    y.grad.from_numpy(w)
    k.grad()
    ga = a.grad.to_numpy()
    gb = b.grad.to_numpy() if mode != "nograd_b" else None
    return y.to_numpy(), ga, gb, k


@pytest.mark.parametrize("mode", ["both", "const_a", "const_b", "nograd_b"])
@pytest.mark.parametrize("case", BINARY, ids=lambda c: c.name)
def test_binary_op_gradient(case: B, mode: str):
    av, bv = f32(case.a), f32(case.b)
    w = weights(len(case.name))
    a64, b64 = av.astype(np.float64), bv.astype(np.float64)
    ca, cb = float(np.float32(case.ca)), float(np.float32(case.cb))
    if case.op is Op.MOD:
        assert _mod_safe(a64, b64) and _mod_safe(ca, b64) and _mod_safe(a64, cb), "inputs on a jump of %"
    y, ga, gb, k = run_binary(case.fn, av, bv, w, mode, case.ca, case.cb)
    if mode == "const_a":
        ref_y = case.ref(ca, b64)
        ref_gb = central_diff(lambda b: np.sum(w * case.ref(ca, b)), b64)
        ref_ga = np.zeros(N)  # a is not read
    elif mode == "const_b":
        ref_y = case.ref(a64, cb)
        ref_ga = central_diff(lambda a: np.sum(w * case.ref(a, cb)), a64)
        ref_gb = np.zeros(N)
    else:
        ref_y = case.ref(a64, b64)
        ref_ga, ref_gb = central_diffs(lambda a, b: np.sum(w * case.ref(a, b)), [a64, b64])
    np.testing.assert_allclose(y, ref_y, rtol=2e-5, atol=2e-6, err_msg="forward value")
    assert_grad(ga, ref_ga, what=f"d/da of {case.name} ({mode})")
    if gb is not None:
        assert_grad(gb, ref_gb, what=f"d/db of {case.name} ({mode})")
    if case.op is not None and mode in ("both", "nograd_b"):
        assert case.op in ops_in(k), f"{case.name} did not lower to {case.op}"


# ---- select -----------------------------------------------------------------------------------
def test_select_sends_the_gradient_to_the_chosen_operand():
    c = ti.field(ti.i32, shape=N)
    a = ti.field(ti.f32, shape=N, needs_grad=True)
    b = ti.field(ti.f32, shape=N, needs_grad=True)
    y = ti.field(ti.f32, shape=N, needs_grad=True)
    z = ti.field(ti.f32, shape=N, needs_grad=True)

    @ti.kernel
    def sel():
        for i in a:
            y[i] = ti.select(c[i] > 0, a[i] * a[i], ti.sin(b[i]))
            z[i] = ti.select(a[i] > 0.0, 2.0, b[i])   # one branch a constant, condition on a value

    cv = np.array([1, 0, 0, 1, 1, 0], np.int32)
    av, bv = f32(_A), f32(_B)
    wy, wz = weights(1), weights(2)
    c.from_numpy(cv)
    a.from_numpy(av)
    b.from_numpy(bv)
    sel()
    y.grad.from_numpy(wy)
    z.grad.from_numpy(wz)
    sel.grad()
    assert Op.SELECT in ops_in(sel)

    def loss(a_, b_):
        return np.sum(wy * np.where(cv > 0, a_ * a_, np.sin(b_)) + wz * np.where(a_ > 0, 2.0, b_))
    ref_a, ref_b = central_diffs(loss, [av, bv])
    assert_grad(a.grad.to_numpy(), ref_a, what="d/da")
    assert_grad(b.grad.to_numpy(), ref_b, what="d/db")


# ---- zero-gradient ops and stop_grad ----------------------------------------------------------
@ti.func
def z_floor(a): return ti.floor(a) * a
@ti.func
def z_ceil(a): return ti.ceil(a) * a
@ti.func
def z_round(a): return ti.round(a) * a
@ti.func
def z_sign(a): return ti.math.sign(a) * a
@ti.func
def z_lt(a): return float(a < 0.5) * a
@ti.func
def z_le(a): return float(a <= 0.5) * a + a
@ti.func
def z_gt(a): return ti.cast(a > -0.5, ti.f32) * a
@ti.func
def z_ge(a): return ti.select(a >= 0.2, 3.0, -1.0) * a
@ti.func
def z_eq(a): return float(a == 0.5) * a + 2.0 * a
@ti.func
def z_ne(a): return float(a != 0.3) * a
@ti.func
def z_floordiv(a): return (a // 0.25) * a
@ti.func
def z_int(a): return int(a * 3.0) * a
@ti.func
def z_cast_i32(a): return ti.cast(a * 2.0, ti.i32) * a
@ti.func
def z_step(a): return ti.math.step(0.2, a) * a


_ZX = (-1.3, -0.63, -0.1, 0.37, 0.88, 1.41)  # away from integers, halves and quarters
ZERO_CASES = [
    ("floor", Op.FLOOR, z_floor, lambda a: np.floor(a) * a),
    ("ceil", Op.CEIL, z_ceil, lambda a: np.ceil(a) * a),
    ("round", Op.ROUND, z_round, lambda a: np.round(a) * a),
    ("sign", Op.SIGN, z_sign, lambda a: np.sign(a) * a),
    ("lt", Op.LT, z_lt, lambda a: (a < 0.5) * a),
    ("le", Op.LE, z_le, lambda a: (a <= 0.5) * a + a),
    ("gt", Op.GT, z_gt, lambda a: (a > -0.5) * a),
    ("ge", Op.GE, z_ge, lambda a: np.where(a >= 0.2, 3.0, -1.0) * a),
    ("eq", Op.EQ, z_eq, lambda a: (a == 0.5) * a + 2 * a),
    ("ne", Op.NE, z_ne, lambda a: (a != 0.3) * a),
    ("floordiv", Op.FLOORDIV, z_floordiv, lambda a: np.floor(a / 0.25) * a),
    ("int", Op.CAST, z_int, lambda a: np.trunc(a * 3.0) * a),
    ("cast_i32", Op.CAST, z_cast_i32, lambda a: np.trunc(a * 2.0) * a),
    ("step", Op.LT, z_step, lambda a: np.where(a < 0.2, 0.0, 1.0) * a),
]


@pytest.mark.parametrize("name,op,fn,ref", ZERO_CASES, ids=[c[0] for c in ZERO_CASES])
def test_zero_gradient_op(name, op, fn, ref):
    """g(x) * x with g piecewise constant: the gradient is g(x) (g contributes nothing)."""
    xv = f32(_ZX)
    w = weights(3)
    y, g, k = run_unary(fn, xv, w)
    x64 = xv.astype(np.float64)
    np.testing.assert_allclose(y, ref(x64), rtol=2e-6, atol=1e-6, err_msg="forward value")
    assert_grad(g, central_diff(lambda a: np.sum(w * ref(a)), x64), what=f"gradient through {name}")
    assert op in ops_in(k), f"{name} did not lower to {op}"


@ti.func
def s_alone(a): return ti.stop_grad(a)
@ti.func
def s_factor(a): return ti.stop_grad(a) * a
@ti.func
def s_expr(a): return ti.stop_grad(ti.sin(a) * a) * a + ti.cos(a)


@pytest.mark.parametrize("fn,dfdx", [
    (s_alone, lambda a: 0 * a),
    (s_factor, lambda a: a),                                  # d/da [c * a] with c = a held fixed
    (s_expr, lambda a: np.sin(a) * a - np.sin(a)),
], ids=["alone", "factor", "expr"])
def test_stop_grad_blocks_the_gradient(fn, dfdx):
    xv = vals(-2, 2, seed=7)
    w = weights(4)
    _, g, _ = run_unary(fn, xv, w)
    assert_grad(g, w * dfdx(xv.astype(np.float64)), what="gradient through stop_grad")


def test_every_alu_op_has_exactly_one_rule():
    alu = set(GroupOp.ALU)
    missing = sorted(op.name for op in alu if op not in DIFFERENTIABLE and op not in ZERO)
    both = sorted(op.name for op in alu if op in DIFFERENTIABLE and op in ZERO)
    assert not missing, f"ALU ops with no derivative (rules.PARTIALS or OWN_RULES) and not in ZERO: {missing}"
    assert not both, f"ALU ops both differentiable and in ZERO: {both}"
    assert DIFFERENTIABLE <= alu, f"derivatives of non-ALU ops: {sorted(o.name for o in DIFFERENTIABLE - alu)}"


def test_the_tables_above_cover_every_rule():
    # SELECT has its own test; CAST: float(x) / ti.cast(x, ti.f32) fold away on f32 values (the
    # float_cast and cast_f32 cases), and int casts are in the zero-gradient table
    # (the math functions asinh ... expm1 are tested in test_math_functions.py)
    covered = {c.op for c in UNARY} | {c.op for c in BINARY} | {c.op for c in FUNCS} | {Op.SELECT, Op.CAST}
    missing = sorted(op.name for op in DIFFERENTIABLE if op not in covered)
    assert not missing, f"differentiable ops without a gradient test here: {missing}"
    zero_covered = {c[1] for c in ZERO_CASES}
    float_zero = {Op.SIGN, Op.FLOOR, Op.CEIL, Op.ROUND, Op.FLOORDIV} | GroupOp.Comparison
    assert float_zero <= zero_covered, sorted(o.name for o in float_zero - zero_covered)


# ---- vectors and matrices ---------------------------------------------------------------------
@ti.func
def m_norm(a, b, m, m2, v): return a.norm(1e-2) + (a - b).norm()
@ti.func
def m_dot(a, b, m, m2, v): return ti.sin(a.dot(b)) + ti.math.dot(a, a)
@ti.func
def m_cross3(a, b, m, m2, v): return a.cross(b).norm_sqr() + ti.math.cross(a, b)[0]
@ti.func
def m_cross2(a, b, m, m2, v): return ti.Vector([a[0], a[1]]).cross(v) * v[0]
@ti.func
def m_outer(a, b, m, m2, v): return (a.outer_product(b) * m).sum()
@ti.func
def m_transpose(a, b, m, m2, v): return (m.transpose() @ m @ a).dot(b) + m2.transpose()[0, 1]
@ti.func
def m_det2(a, b, m, m2, v): return m2.determinant() * v[1]
@ti.func
def m_det3(a, b, m, m2, v): return ti.sin(m.determinant()) + ti.math.determinant(m)
@ti.func
def m_inv2(a, b, m, m2, v): return (m2.inverse() @ v).dot(v)
@ti.func
def m_inv3(a, b, m, m2, v): return (m.inverse() @ a).dot(b)
@ti.func
def m_normalized(a, b, m, m2, v): return a.normalized().dot(b) + b.normalized(1e-3)[2]
@ti.func
def m_matvec(a, b, m, m2, v): return (m @ a).norm_sqr() + (m2 @ v)[1]


def _n(x, eps=0.0): return np.sqrt(np.sum(x * x) + eps)


MAT_CASES = [
    ("norm_eps", m_norm, lambda a, b, m, m2, v: _n(a, 1e-2) + _n(a - b)),
    ("dot", m_dot, lambda a, b, m, m2, v: np.sin(a @ b) + a @ a),
    ("cross3", m_cross3, lambda a, b, m, m2, v: np.sum(np.cross(a, b) ** 2) + np.cross(a, b)[0]),
    ("cross2", m_cross2, lambda a, b, m, m2, v: (a[0] * v[1] - a[1] * v[0]) * v[0]),
    ("outer_product", m_outer, lambda a, b, m, m2, v: np.sum(np.outer(a, b) * m)),
    ("transpose", m_transpose, lambda a, b, m, m2, v: (m.T @ m @ a) @ b + m2[1, 0]),
    ("determinant2", m_det2, lambda a, b, m, m2, v: np.linalg.det(m2) * v[1]),
    ("determinant3", m_det3, lambda a, b, m, m2, v: np.sin(np.linalg.det(m)) + np.linalg.det(m)),
    ("inverse2", m_inv2, lambda a, b, m, m2, v: (np.linalg.inv(m2) @ v) @ v),
    ("inverse3", m_inv3, lambda a, b, m, m2, v: (np.linalg.inv(m) @ a) @ b),
    ("normalized", m_normalized, lambda a, b, m, m2, v: (a / _n(a)) @ b + (b / (_n(b) + 1e-3))[2]),
    ("matvec", m_matvec, lambda a, b, m, m2, v: np.sum((m @ a) ** 2) + (m2 @ v)[1]),
]


def mat_case_program(fn, n: int, **needs):
    """The fields a, b, m, m2, v of MAT_CASES (with `needs`: needs_grad=True or needs_dual=True)
    holding inputs (the matrices well conditioned, for the inverses), the loss, and the kernel
    adding fn over the n elements into it; also used by test_forward_mode.py."""
    a = ti.Vector.field(3, ti.f32, shape=n, **needs)
    b = ti.Vector.field(3, ti.f32, shape=n, **needs)
    m = ti.Matrix.field(3, 3, ti.f32, shape=n, **needs)
    m2 = ti.Matrix.field(2, 2, ti.f32, shape=n, **needs)
    v = ti.Vector.field(2, ti.f32, shape=n, **needs)
    loss = ti.field(ti.f32, shape=(), **needs)

    @ti.kernel
    def compute():
        for i in a:
            loss[None] += fn(a[i], b[i], m[i], m2[i], v[i])

    r = np.random.default_rng(11)
    data = [f32(r.uniform(-1, 1, (n, 3))), f32(r.uniform(-1, 1, (n, 3))),
            f32(2 * np.eye(3) + r.uniform(-0.5, 0.5, (n, 3, 3))),
            f32(2 * np.eye(2) + r.uniform(-0.5, 0.5, (n, 2, 2))), f32(r.uniform(-1, 1, (n, 2)))]
    fields = [a, b, m, m2, v]
    for f, d in zip(fields, data):
        f.from_numpy(d)
    return fields, data, loss, compute


@pytest.mark.parametrize("name,fn,ref", MAT_CASES, ids=[c[0] for c in MAT_CASES])
def test_vector_matrix_gradient(name, fn, ref):
    n = 3
    fields, data, loss, compute = mat_case_program(fn, n, needs_grad=True)
    compute()
    loss.grad[None] = 0.75
    compute.grad()

    def total(*xs):
        return sum(ref(*(x[i] for x in xs)) for i in range(n))
    d64 = [d.astype(np.float64) for d in data]
    assert loss[None] == pytest.approx(total(*d64), rel=1e-4, abs=1e-5)
    refs = central_diffs(lambda *xs: 0.75 * total(*xs), d64)
    for f, g, label in zip(fields, refs, ["a", "b", "m", "m2", "v"]):
        assert_grad(f.grad.to_numpy(), g, rtol=2e-4, what=f"d loss / d {label} ({name})")


# ---- stores with user seeds -------------------------------------------------------------------
def test_vector_and_matrix_stores_with_user_seeded_grads():
    n = 5
    x = ti.Vector.field(2, ti.f32, shape=n, needs_grad=True)
    y = ti.Vector.field(3, ti.f32, shape=n, needs_grad=True)
    z = ti.Matrix.field(2, 2, ti.f32, shape=n, needs_grad=True)

    @ti.kernel
    def store():
        for i in x:
            p = x[i]
            y[i] = ti.Vector([p[0] * p[1], ti.sin(p[0]), p.norm()])
            z[i] = p.outer_product(p) + ti.Matrix([[p[1], 0.0], [0.0, 1.0]])

    r = np.random.default_rng(12)
    xv = f32(r.uniform(-1, 1, (n, 2)))
    sy, sz = f32(r.uniform(-1, 1, (n, 3))), f32(r.uniform(-1, 1, (n, 2, 2)))
    x.from_numpy(xv)
    store()
    y.grad.from_numpy(sy)
    z.grad.from_numpy(sz)
    store.grad()

    def loss(p):
        yy = np.stack([p[:, 0] * p[:, 1], np.sin(p[:, 0]), np.sqrt((p ** 2).sum(1))], 1)
        zz = p[:, :, None] * p[:, None, :]
        zz[:, 0, 0] += p[:, 1]
        zz[:, 1, 1] += 1
        return np.sum(sy * yy) + np.sum(sz * zz)
    assert_grad(x.grad.to_numpy(), central_diff(loss, xv))


# ---- atomic accumulation ----------------------------------------------------------------------
@pytest.mark.parametrize("init", [{}, {"arch": ti.cpu, "force_emulated_atomics": True}],
                         ids=["default", "emulated_atomics"])
def test_accumulated_loss_with_contended_gradients(init):
    """Many threads add into one loss and into the same few x.grad elements."""
    ti.init(**init)
    n, k = 2048, 4
    x = ti.field(ti.f32, shape=k, needs_grad=True)
    w = ti.field(ti.f32, shape=n)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def accumulate():
        for i in range(n):
            loss[None] += ti.sin(x[i % k] * w[i])

    xv = f32([0.1, 0.25, 0.4, 0.5])
    wv = f32(np.random.default_rng(5).uniform(0.1, 1.0, n))
    x.from_numpy(xv)
    w.from_numpy(wv)
    accumulate()
    loss.grad[None] = 0.5
    accumulate.grad()
    x64, w64 = xv.astype(np.float64), wv.astype(np.float64)
    xi = x64[np.arange(n) % k]
    assert loss[None] == pytest.approx(np.sin(xi * w64).sum(), rel=1e-4)
    ref = np.array([0.5 * np.sum((w64 * np.cos(xi * w64))[np.arange(n) % k == j]) for j in range(k)])
    assert_grad(x.grad.to_numpy(), ref, what="contended x.grad")
    wgsl = accumulate.get_wgsl(grad=True)
    emulated = "let old = bitcast<f32>(seen);" in wgsl   # shaders/atomics.wgsl cas_f32 (assert.wgsl has a CAS too)
    assert emulated == (not ti.get_runtime().has_float_atomics), "float atomics took the wrong path"
    if init:
        assert emulated


def test_subtracted_loss():
    n = 300
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def sub():
        for i in x:
            loss[None] -= x[i] * x[i] * 0.5 + ti.exp(0.1 * x[i])

    xv = vals(-1, 1, seed=8, n=n)
    x.from_numpy(xv)
    sub()
    loss.grad[None] = 2.0
    sub.grad()
    x64 = xv.astype(np.float64)
    assert loss[None] == pytest.approx(-(0.5 * x64 ** 2 + np.exp(0.1 * x64)).sum(), rel=1e-4)
    assert_grad(x.grad.to_numpy(), -2.0 * (x64 + 0.1 * np.exp(0.1 * x64)))


def test_accumulated_gradient_from_pairs():
    """x.grad[i] gets contributions from the (i, j) and (j, i) threads of an ndrange."""
    n = 16
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def pairs():
        for i, j in ti.ndrange(n, n):
            loss[None] += ti.cos(x[i] - 2.0 * x[j])

    xv = vals(-1, 1, seed=9, n=n)
    x.from_numpy(xv)
    pairs()
    loss.grad[None] = 1.0
    pairs.grad()
    ref = central_diff(lambda p: np.cos(p[:, None] - 2 * p[None, :]).sum(), xv)
    assert_grad(x.grad.to_numpy(), ref)


@pytest.mark.parametrize("kind", ["max", "min"])
def test_atomic_max_min_gradient_goes_to_the_extreme_element(kind):
    n = 64
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    m = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def amax():
        for i in x:
            ti.atomic_max(m[None], 2.0 * x[i] + 1.0)

    @ti.kernel
    def amin():
        for i in x:
            ti.atomic_min(m[None], 2.0 * x[i] + 1.0)

    k = amax if kind == "max" else amin
    xv = f32(np.random.default_rng(10).permutation(n) * 0.1 - 3.0)  # distinct values
    x.from_numpy(xv)
    m[None] = -1e30 if kind == "max" else 1e30
    k()
    m.grad[None] = 1.5
    k.grad()
    j = int(np.argmax(xv) if kind == "max" else np.argmin(xv))
    assert m[None] == pytest.approx(2.0 * float(xv[j]) + 1.0)
    ref = np.zeros(n)
    ref[j] = 2.0 * 1.5
    assert_grad(x.grad.to_numpy(), ref, what=f"atomic_{kind} gradient")
