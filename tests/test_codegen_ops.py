"""WGSL code generator, the op table: every ALU op, cast and literal run on the adapter (lavapipe
here) and compared with NumPy. The harness (tests/_wgsl_harness.py) is raw wgpu-py."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

import _wgsl_harness as H
from _wgsl_harness import KB, compile_run, load, store
from reference import numpy_ref
from wgpu_ad.codegen import generate
from wgpu_ad.codegen.ops_table import ALU, spell
from wgpu_ad.ir.nodes import Stmt
from wgpu_ad.ir.ops import GroupOp, Op
from wgpu_ad.types import f16, f32, i32, u1, u32

F32, I32, U32 = np.float32, np.int32, np.uint32


# ---------------------------------------------------------------- the op table

def test_every_alu_op_has_a_spelling():
    missing = sorted(op.name for op in GroupOp.ALU if op not in ALU)
    assert not missing, f"ops without a WGSL spelling in codegen/ops_table.ALU: {missing}"


def _typed_operands(op):
    """The operand dtypes each ALU op must accept."""
    if op in (Op.NOT, Op.AND, Op.OR):
        return [u1]
    if op is Op.POW:
        return [f32, i32, u32]    # ir.verifier calls POW float-only; the WGSL has integer helpers too
    if op in GroupOp.FloatOnly:
        return [f32]
    if op in (Op.BIT_AND, Op.BIT_OR, Op.BIT_XOR):
        return [i32, u32, u1]
    if op in GroupOp.IntOnly:
        return [i32, u32]
    if op in (Op.EQ, Op.NE, Op.SELECT):
        return [f32, i32, u32, u1]
    return [f32, i32, u32]


@pytest.mark.parametrize("op", sorted(GroupOp.ALU - {Op.CAST, Op.BITCAST}, key=lambda o: o.name))
def test_spelling_exists_for_each_operand_type(op):
    for dt in _typed_operands(op):
        n = 3 if op is Op.SELECT else (2 if op in GroupOp.Binary else 1)
        args = [Stmt(Op.RANDOM, u1 if (op is Op.SELECT and k == 0) else dt) for k in range(n)]  # any non-constant
        s = Stmt(op, dt, args)
        assert spell(s, ["a", "b", "c"][:n]), f"{op.name} has no spelling for {dt} operands"


# float32 tolerances per op (asin/acos are emitted as atan2 forms: the drivers' own are loose)
TOL = {Op.SIN: 2e-6, Op.COS: 2e-6, Op.TAN: 1e-5, Op.ASIN: 1e-5, Op.ACOS: 1e-5, Op.ATAN: 1e-5,
       Op.TANH: 1e-5, Op.EXP: 1e-5, Op.LOG: 1e-5, Op.POW: 2e-5, Op.ATAN2: 1e-5, Op.MOD: 1e-5,
       Op.ASINH: 2e-6, Op.ACOSH: 2e-6, Op.ATANH: 2e-6, Op.LOG1P: 2e-6, Op.EXPM1: 1e-5}


def _inputs(op, dt, rng):
    """Operand arrays for op on dtype dt, inside the op's domain, with the edge cases that matter."""
    n = 256
    if dt == f32:
        edge = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.0, -0.0, 1.0, -1.0, 3.7, -3.7], F32)
        a = np.concatenate([edge, rng.uniform(-8, 8, n - len(edge))]).astype(F32)
        b = rng.uniform(-8, 8, n).astype(F32)
        if op in (Op.ASIN, Op.ACOS):
            a = rng.uniform(-0.999, 0.999, n).astype(F32)
        if op in (Op.LOG, Op.SQRT, Op.RSQRT):
            a = rng.uniform(0.01, 100, n).astype(F32)
        if op is Op.TAN:
            a = rng.uniform(-1.4, 1.4, n).astype(F32)
        if op is Op.ACOSH:
            a = np.concatenate([[1.0, 1.0 + 2**-23, 1.001], rng.uniform(1, 50, n - 3)]).astype(F32)
        if op is Op.ATANH:
            a = np.concatenate([[0.0, 1e-6, -0.9999], rng.uniform(-0.999, 0.999, n - 3)]).astype(F32)
        if op is Op.LOG1P:
            a = np.concatenate([[0.0, 1e-6, -0.999], rng.uniform(-0.99, 50, n - 3)]).astype(F32)
        if op in (Op.DIV, Op.FLOORDIV, Op.MOD):
            b = np.where(np.abs(b) < 0.1, 0.5, b).astype(F32)
        if op is Op.POW:
            a = rng.uniform(-3, 3, n).astype(F32)
            b = rng.choice(np.array([-2, -1, 0, 1, 2, 3, 4, 0.5, 1.5, -0.5, 2.25], F32), n)
            a[:4], b[:4] = [-2, -2, 0, 0], [3, 2, 0, 2]
        if op in GroupOp.Comparison:
            b[: n // 4] = a[: n // 4]   # equal pairs
        return a, b
    info = np.iinfo(dt.np)
    edge = np.array([info.min, info.max, 0, 1, 2, 7, info.max - 1] + ([-1, -7, -8, -2] if dt == i32 else [3, 8]),
                    dtype=dt.np)
    a = np.concatenate([edge, rng.integers(info.min, info.max, n - len(edge), endpoint=True, dtype=dt.np)])
    small = rng.integers(-50 if dt == i32 else 0, 50, n, dtype=dt.np)
    a_small = rng.integers(-50 if dt == i32 else 0, 50, n, dtype=dt.np)
    b = rng.integers(info.min, info.max, n, endpoint=True, dtype=dt.np)
    if op in (Op.DIV, Op.FLOORDIV, Op.MOD):
        a = np.concatenate([a_small[: n // 2], a[: n // 2]])   # small values make floor and trunc differ
        b = np.where(small == 0, 3, small).astype(dt.np)
        if dt == i32:
            a[:8], b[:8] = [7, -7, 7, -7, 6, -6, 0, info.min], [2, 2, -2, -2, -3, 3, -5, 7]
    if op in (Op.SHL, Op.SHR):
        b = rng.integers(0, 32, n).astype(dt.np)
    if op is Op.POW:
        a = rng.integers(-7 if dt == i32 else 0, 8, n).astype(dt.np)
        a[:4] = [3, 5, 2, 1]
        b = rng.integers(0, 12, n).astype(dt.np)
        b[:4] = [25, 13, 31, 1000]   # these wrap around
    if op in GroupOp.Comparison or op in (Op.MIN, Op.MAX):
        b[: n // 4] = a[: n // 4]
    return a, b


ALU_CASES = []
for _op in sorted(GroupOp.ALU - {Op.CAST, Op.BITCAST}, key=lambda o: o.name):
    for _dt in _typed_operands(_op):
        ALU_CASES.append(pytest.param(_op, _dt, id=f"{_op.name}-{_dt.name}"))


@pytest.mark.parametrize("op, dt", ALU_CASES)
def test_alu_op_matches_numpy(op, dt):
    rng = np.random.default_rng(zlib.crc32(f"{op.name}-{dt.name}".encode()))
    if dt == u1:   # bools are loaded as u32 0/1 and compared with 0 in the kernel
        a, b, c = (rng.integers(0, 2, 64, dtype=U32) for _ in range(3))
    else:
        a, b = _inputs(op, dt, rng)
        c = _inputs(op, dt, rng)[0]
    n = len(a)
    kb = KB(f"alu_{op.name.lower()}")
    store_dt = dt if dt != u1 else u32
    A, Bf, C = kb.buf("a", store_dt), kb.buf("b", store_dt), kb.buf("c", store_dt)
    out_dt = i32 if (op in GroupOp.Comparison or dt == u1) else dt
    O = kb.buf("out", out_dt)
    body, i = kb.range(0, n)
    x, y, z = (load(body, buf, i) for buf in (A, Bf, C))
    if dt == u1:
        zero = body.const(0, u32)
        x, y, z = (body.emit(Op.NE, [v, zero]) for v in (x, y, z))
    if op is Op.SELECT:
        cond = body.emit(Op.LT, [x, y]) if dt != u1 else x
        r = body.emit(Op.SELECT, [cond, y, z])
    elif op in GroupOp.Binary:
        r = body.emit(op, [x, y])
    else:
        r = body.emit(op, [x])
    store(body, O, i, body.cast(r, out_dt))
    check = not (op is Op.POW and dt != f32)    # the verifier refuses integer POW
    _, res = compile_run(kb.kernel(check=check), [a, b, c, np.zeros(n, out_dt.np)])
    got = res.buffers[3]

    if dt == u1:
        a, b, c = a != 0, b != 0, c != 0
    with np.errstate(all="ignore"):
        if op is Op.SELECT:
            want = np.where(a if dt == u1 else a < b, b, c)
        elif op in GroupOp.Binary:
            want = numpy_ref(op)(a, b)
        else:
            want = numpy_ref(op)(a)
    want = np.asarray(want)
    if want.dtype == bool:
        want = want.astype(I32)
    if dt == f32 and op not in GroupOp.Comparison:
        tol = TOL.get(op, 1e-6)
        np.testing.assert_allclose(got, want.astype(F32), rtol=tol, atol=tol, equal_nan=True,
                                   err_msg=f"{op.name} on {dt}: inputs a={a[:8]} b={b[:8]}")
    else:
        bad = np.nonzero(got != want.astype(out_dt.np))[0]
        assert not len(bad), (f"{op.name} on {dt}: first mismatches at {bad[:5]}: a={a[bad[:5]]} "
                              f"b={b[bad[:5]]} got={got[bad[:5]]} want={want[bad[:5]]}")


CAST_CASES = [(f32, i32), (f32, u32), (i32, f32), (u32, f32), (i32, u32), (u32, i32),
              (f32, u1), (i32, u1), (u1, f32), (u1, i32), (u1, u32)]


@pytest.mark.parametrize("src, dst", CAST_CASES, ids=[f"{s.name}-{d.name}" for s, d in CAST_CASES])
def test_cast(src, dst):
    rng = np.random.default_rng(5)
    if src == f32:
        lo = 0 if dst == u32 else -1e9
        a = np.concatenate([[0.0, -0.0, 0.5, 0.99, 1.0, 2.5, 1e9] + ([] if dst == u32 else [-0.5, -0.99, -2.5, -1e9]),
                            rng.uniform(lo, 1e4, 100)]).astype(F32)
    elif src == u1:
        a = np.array([0, 1, 1, 0, 5], U32)       # stored as u32, turned into bools in the kernel
    else:
        info = np.iinfo(src.np)
        a = np.concatenate([[info.min, info.max, 0, 1, 16777217, 2**24 + 3] + ([-1, -5] if src == i32 else []),
                            rng.integers(info.min, info.max, 100, dtype=src.np)]).astype(src.np)
    kb = KB("cast")
    A = kb.buf("a", u32 if src == u1 else src)
    out_dt = u32 if dst == u1 else dst
    O = kb.buf("out", out_dt)
    b, i = kb.range(0, len(a))
    x = load(b, A, i)
    if src == u1:
        x = b.emit(Op.NE, [x, b.const(0, u32)])
    r = b.emit(Op.CAST, [x], dst)
    store(b, O, i, b.cast(r, out_dt))
    _, res = compile_run(kb.kernel(), [a, np.zeros(len(a), out_dt.np)])
    if src == u1:
        want = (a != 0).astype(out_dt.np)
    elif dst == u1:
        want = (a != 0).astype(U32)
    elif src == f32:
        want = np.trunc(a).astype(dst.np)
    else:
        want = a.astype(dst.np)    # i32 <-> u32 keeps the bits; ints -> f32 round to nearest
    if dst == f32:
        np.testing.assert_allclose(res.buffers[1], want, rtol=2.4e-7)   # rounding mode may differ by 1 ulp
    else:
        np.testing.assert_array_equal(res.buffers[1], want)


@pytest.mark.parametrize("src, dst", [(f32, u32), (f32, i32), (u32, f32), (i32, f32)])
def test_bitcast(src, dst):
    a = np.array([1.0, -2.5, np.inf, 0.0, -0.0, 3e-39], F32).view(src.np)
    kb = KB("bitcast")
    A, O = kb.buf("a", src), kb.buf("out", dst)
    b, i = kb.range(0, len(a))
    store(b, O, i, b.emit(Op.BITCAST, [load(b, A, i)], dst))
    _, res = compile_run(kb.kernel(), [a, np.zeros(len(a), dst.np)])
    np.testing.assert_array_equal(res.buffers[1].view(U32), a.view(U32))


def test_literals_are_exact():
    floats = [np.inf, -np.inf, np.nan, -0.0, 1e-3, 3.4028235e38, 1.17549435e-38, 1e-45, 0.1, 1e20,
              16777217.0, -123.456, 1e39]
    ints = [-2**31, 2**31 - 1, -5, 0, 2**31]          # 2**31 wraps to -2**31
    uints = [2**32 - 1, 0, 7, -1]                       # -1 wraps to 2**32 - 1
    kb = KB("literals")
    Fb, Ib, Ub = kb.buf("f", f32), kb.buf("i", i32), kb.buf("u", u32)
    b = kb.serial()
    for buf, vals in ((Fb, floats), (Ib, ints), (Ub, uints)):
        for k, v in enumerate(vals):
            store(b, buf, b.const(k, i32), b.const(v, buf.dtype))
    ck, res = compile_run(kb.kernel(), [np.zeros(len(floats), F32), np.zeros(len(ints), I32),
                                        np.zeros(len(uints), U32)])
    with np.errstate(over="ignore"):      # 1e39 becomes inf, as in the shader
        want = np.array(floats, F32)
    np.testing.assert_array_equal(res.buffers[0].view(U32), want.view(U32))
    np.testing.assert_array_equal(res.buffers[1], np.array(ints, np.int64).astype(I32))
    np.testing.assert_array_equal(res.buffers[2], np.array(uints, np.int64).astype(U32))
    assert "i32(-2147483647 - 1)" in ck.tasks[0].wgsl


def test_ops_on_constants_only_stay_runtime():
    """5 / 0, an out-of-range conversion and a shift by 40 would be WGSL shader-creation errors
    as const-expressions; the generator keeps them runtime (division by zero gives x in WGSL)."""
    kb = KB("consts")
    O = kb.buf("out", i32)
    b = kb.serial()
    store(b, O, b.const(0, i32), b.emit(Op.DIV, [b.const(5, i32), b.const(0, i32)]))
    store(b, O, b.const(1, i32), b.emit(Op.SHL, [b.const(1, i32), b.const(40, i32)]))
    big = b.emit(Op.CAST, [b.const(1e20, f32)], i32)
    store(b, O, b.const(2, i32), b.emit(Op.BIT_AND, [big, b.const(0, i32)]))
    store(b, O, b.const(3, i32), b.emit(Op.SHR, [b.const(-64, i32), load(b, O, b.const(4, i32))]))
    _, res = compile_run(kb.kernel(), [np.array([0, 0, 9, 0, 35], I32)])
    assert list(res.buffers[0][[0, 1, 2]]) == [5, 1 << (40 & 31), 0]
    assert res.buffers[0][3] == -64 >> (35 & 31)    # runtime amounts are masked to 0..31 too




def test_integer_pow_with_negative_exponent():
    """1 / x^-e truncated: 1 for x = 1, +-1 for x = -1, else 0."""
    x = np.array([1, -1, -1, 2, -3, 0, 5], I32)
    e = np.array([-3, -3, -2, -1, -2, -1, 0], I32)
    kb = KB("ipow")
    X, E, O = kb.buf("x", i32), kb.buf("e", i32), kb.buf("out", i32)
    b, i = kb.range(0, len(x))
    store(b, O, i, b.emit(Op.POW, [load(b, X, i), load(b, E, i)]))
    _, res = compile_run(kb.kernel(check=False), [x, e, np.zeros(len(x), I32)])  # verifier: POW is float-only
    want = [int(1 / (int(a) ** -int(k))) if k < 0 and a != 0 else (int(a) ** int(k) if k >= 0 else 0)
            for a, k in zip(x, e)]
    assert list(res.buffers[2]) == want


def test_f16_ops():
    x = np.array([-2.0, -1.5, 0.5, 1.25, 3.0, 7.5], np.float16)
    y = np.array([3.0, 2.0, 2.0, -0.5, 1.5, 2.0], np.float16)
    kb = KB("half_ops")
    X, Y = kb.buf("x", f16), kb.buf("y", f16)
    outs = {op: kb.buf(f"o_{op.name.lower()}", f16) for op in (Op.POW, Op.MOD, Op.FLOORDIV, Op.MAX)}
    Oi, Oc = kb.buf("o_cast", i32), kb.buf("o_sqrt", f16)
    b, i = kb.range(0, len(x))
    xv, yv = load(b, X, i), load(b, Y, i)
    for op, buf in outs.items():
        store(b, buf, i, b.emit(op, [xv, yv]))
    store(b, Oi, i, b.cast(b.mul(xv, b.const(2.0, f16)), i32))
    store(b, Oc, i, b.emit(Op.SQRT, [b.emit(Op.ABS, [xv])]))
    ck = generate(kb.kernel(), float_atomics=False, debug=False)
    assert "\nenable f16;\n" in ck.tasks[0].wgsl and "array<f16>" in ck.tasks[0].wgsl
    if not H.has_feature("shader-f16"):
        pytest.skip("adapter lacks shader-f16")
    zeros = np.zeros(len(x), np.float16)
    res = H.run(ck, [x, y] + [zeros] * 4 + [np.zeros(len(x), I32), zeros])
    xs, ys = x.astype(np.float64), y.astype(np.float64)
    want = [np.power(xs, ys), np.mod(xs, ys), np.floor_divide(xs, ys), np.maximum(xs, ys)]
    for got, w in zip(res.buffers[2:6], want):
        np.testing.assert_allclose(got.astype(np.float64), w, rtol=2e-3, atol=2e-3)
    np.testing.assert_array_equal(res.buffers[6], np.trunc(xs * 2).astype(I32))
    np.testing.assert_allclose(res.buffers[7].astype(np.float64), np.sqrt(np.abs(xs)), rtol=2e-3)
