"""Optimisation passes: the IR shape each produces, and that the reference interpreter computes
the same thing before and after (hand-built programs and many random ones)."""
from __future__ import annotations

import math
import random
from contextlib import contextmanager

import numpy as np
import pytest

from wgpu_ad import plan
from wgpu_ad.ir.builder import Builder
from wgpu_ad.ir.interpreter import run_kernel
from wgpu_ad.ir.nodes import ArgSlot, Block, Buffer, Kernel, Stmt, Task, walk
from wgpu_ad.ir.ops import AtomicKind, Op
from wgpu_ad.ir.utils import replace_uses, use_counts, walk_kernel
from wgpu_ad.ir.verifier import VerifyError, verify
from wgpu_ad.passes import PASSES, constant_fold, cse, dce, optimize
from wgpu_ad.types import f32, i32, u1, u32

IMIN, IMAX = -2**31, 2**31 - 1


# ---- helpers -----------------------------------------------------------------------------

def serial_kernel(*bufs: Buffer, args=(), ret=None) -> tuple[Kernel, Builder]:
    t = Task("serial", Block(), name="main")
    return Kernel("k", [t], list(args), list(bufs), ret=ret), Builder(t.body)


def range_kernel(n: int, *bufs: Buffer, args=()) -> tuple[Kernel, Builder, Task]:
    t = Task("range", Block(), name="par")
    k = Kernel("k", [t], list(args), list(bufs))
    b = Builder(t.bounds)
    t.begin, t.end = b.const(0, i32), b.const(n, i32)
    b.block = t.body
    return k, b, t


def buf(name, dt, source="own"):
    return Buffer(name, dt, object() if source == "own" else source)


def load(b, bf, ix):
    return b.emit(Op.GLOBAL_LOAD, [ix], bf.dtype, bf)


def store(b, bf, ix, v):
    return b.emit(Op.GLOBAL_STORE, [ix, v], None, bf)


def ops_of(k: Kernel) -> list[Op]:
    return [s.op for s in walk_kernel(k)]


def count(k: Kernel, op: Op) -> int:
    return ops_of(k).count(op)


def stored_value(k: Kernel, which: int = 0) -> Stmt:
    return [s for s in walk_kernel(k) if s.op is Op.GLOBAL_STORE][which].args[1]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype.kind == "f":
        nan = np.isnan(a) & np.isnan(b)
        return bool(np.all(nan | (a.view(np.uint32) == b.view(np.uint32))))
    return bool(np.array_equal(a, b))


def run_all(k: Kernel, inputs: list[tuple[list[np.ndarray], list]], seed=0):
    """Runs k on copies of each (buffers, args); returns the final buffers and return values."""
    out = []
    for bufs, args in inputs:
        bufs = [x.copy() for x in bufs]
        r = run_kernel(k, bufs, args, seed=seed)
        out.append((bufs, r))
    return out


def assert_same_results(before, after):
    for (b1, r1), (b2, r2) in zip(before, after):
        for x, y in zip(b1, b2):
            assert same_bits(x, y), f"{x} != {y}"
        assert (r1 is None and r2 is None) or same_bits(np.array([r1]), np.array([r2]))


def check_pass(k: Kernel, fn, inputs) -> Kernel:
    """Runs pass fn on k; checks the verifier and that results are unchanged."""
    verify(k)
    before = run_all(k, inputs)
    k = fn(k)
    verify(k)
    assert_same_results(before, run_all(k, inputs))
    return k


# ---- constant folding ----------------------------------------------------------------------

def test_fold_float_arithmetic_bit_exact():
    out = buf("out", f32)
    k, b = serial_kernel(out)
    s = b.add(b.const(0.1, f32), b.const(0.2, f32))
    t = b.emit(Op.SQRT, [b.mul(s, b.const(3.0, f32))])
    store(b, out, b.const(0, i32), t)
    k = check_pass(k, constant_fold, [([np.zeros(1, np.float32)], [])])
    v = stored_value(k)
    expect = np.sqrt((np.float32(0.1) + np.float32(0.2)) * np.float32(3.0))
    assert v.op is Op.CONST and np.float32(v.attr).tobytes() == expect.tobytes()
    assert float(v.attr) == float(expect)  # the attr is the float32 value exactly


@pytest.mark.parametrize("op,dt,a,b,expected", [
    (Op.ADD, i32, IMAX, 1, IMIN), (Op.DIV, i32, -7, 2, -3), (Op.FLOORDIV, i32, -7, 2, -4),
    (Op.MOD, i32, -7, 2, 1), (Op.SHR, u32, 0x80000000, 4, 0x08000000), (Op.LT, i32, -1, 0, True),
    (Op.MOD, f32, -7.0, 2.0, 1.0), (Op.POW, f32, -2.0, 3.0, -8.0), (Op.MIN, f32, 0.0, -0.0, -0.0),
])
def test_fold_binary(op, dt, a, b, expected):
    k, bl = serial_kernel(ret=u1 if isinstance(expected, bool) else dt)
    r = bl.emit(op, [bl.const(a, dt), bl.const(b, dt)])
    bl.emit(Op.RETURN, [r])
    before = run_kernel(k, [], [])
    constant_fold(k)
    verify(k)
    assert r.op is Op.CONST and r.attr == expected and type(r.attr) is type(expected)
    if isinstance(expected, float):
        assert math.copysign(1, r.attr) == math.copysign(1, expected)
    assert run_kernel(k, [], []).tobytes() == before.tobytes()


def test_fold_cast_and_chain():
    k, b = serial_kernel(ret=i32)
    x = b.cast(b.mul(b.const(3.7, f32), b.const(-1.0, f32)), i32)
    b.emit(Op.RETURN, [b.add(x, b.const(10, i32))])
    constant_fold(k)
    dce(k)
    verify(k)
    assert ops_of(k) == [Op.CONST, Op.RETURN] and run_kernel(k, [], []) == 7


def test_fold_leaves_inf_and_nan_results():
    k, b = serial_kernel(ret=f32)
    d = b.div(b.const(1.0, f32), b.const(0.0, f32))
    b.emit(Op.RETURN, [d])
    constant_fold(k)
    assert d.op is Op.DIV and run_kernel(k, [], []) == np.inf


def _unary_program(dt, build):
    """out[0] = build(b, x) with x = inp[0]."""
    inp, out = buf("inp", dt), buf("out", dt)
    k, b = serial_kernel(inp, out)
    x = load(b, inp, b.const(0, i32))
    store(b, out, b.const(0, i32), build(b, x))
    return k, x


FLOAT_INPUTS = [-0.0, 0.0, 1.5, -3.0, math.inf, math.nan]


@pytest.mark.parametrize("name,build,simplified", [
    ("x*1", lambda b, x: b.mul(x, b.const(1.0, f32)), True),
    ("1*x", lambda b, x: b.mul(b.const(1.0, f32), x), True),
    ("x/1", lambda b, x: b.div(x, b.const(1.0, f32)), True),
    ("x-0", lambda b, x: b.sub(x, b.const(0.0, f32)), True),
    ("x+(-0)", lambda b, x: b.add(x, b.const(-0.0, f32)), True),
    ("--x", lambda b, x: b.unary(Op.NEG, b.unary(Op.NEG, x)), True),
    ("x+0 is not an identity (-0.0)", lambda b, x: b.add(x, b.const(0.0, f32)), False),
    ("x-(-0) is not an identity", lambda b, x: b.sub(x, b.const(-0.0, f32)), False),
    ("x*0 is not 0 (NaN, inf, -0)", lambda b, x: b.mul(x, b.const(0.0, f32)), False),
    ("x-x is not 0 (NaN, inf)", lambda b, x: b.sub(x, x), False),
])
def test_float_identities(name, build, simplified):
    k, x = _unary_program(f32, build)
    inputs = [([np.array([v], np.float32), np.zeros(1, np.float32)], []) for v in FLOAT_INPUTS]
    k = check_pass(k, lambda k: dce(constant_fold(k)), inputs)
    assert (stored_value(k) is x) == simplified, name


@pytest.mark.parametrize("name,build,result", [
    ("x+0", lambda b, x: b.add(x, b.const(0, i32)), "x"),
    ("0+x", lambda b, x: b.add(b.const(0, i32), x), "x"),
    ("x*1", lambda b, x: b.mul(x, b.const(1, i32)), "x"),
    ("x*0", lambda b, x: b.mul(x, b.const(0, i32)), 0),
    ("x-x", lambda b, x: b.sub(x, x), 0),
    ("x/1", lambda b, x: b.div(x, b.const(1, i32)), "x"),
    ("x//1", lambda b, x: b.emit(Op.FLOORDIV, [x, b.const(1, i32)]), "x"),
    ("x%1", lambda b, x: b.emit(Op.MOD, [x, b.const(1, i32)]), 0),
    ("x&-1", lambda b, x: b.emit(Op.BIT_AND, [x, b.const(-1, i32)]), "x"),
    ("x&0", lambda b, x: b.emit(Op.BIT_AND, [x, b.const(0, i32)]), 0),
    ("x|-1", lambda b, x: b.emit(Op.BIT_OR, [x, b.const(-1, i32)]), -1),
    ("x^x", lambda b, x: b.emit(Op.BIT_XOR, [x, x]), 0),
    ("x<<32", lambda b, x: b.emit(Op.SHL, [x, b.const(32, i32)]), "x"),
    ("x<<1", lambda b, x: b.emit(Op.SHL, [x, b.const(1, i32)]), None),
    ("select(x<x)", lambda b, x: b.cast(b.lt(x, x), i32), 0),
])
def test_int_identities(name, build, result):
    k, x = _unary_program(i32, build)
    inputs = [([np.array([v], np.int32), np.zeros(1, np.int32)], []) for v in [0, 5, -9, IMAX, IMIN]]
    k = check_pass(k, lambda k: dce(constant_fold(k)), inputs)
    v = stored_value(k)
    if result == "x":
        assert v is x, name
    elif result is None:
        assert v.op is not Op.CONST and v is not x, name
    else:
        assert v.op is Op.CONST and v.attr == result, name


def test_select_and_bool_identities():
    inp, out = buf("inp", f32), buf("out", f32)
    k, b = serial_kernel(inp, out)
    x = load(b, inp, b.const(0, i32))
    c = b.lt(x, b.const(1.0, f32))
    t = b.select(b.const(True, u1), x, b.const(2.0, f32))           # -> x
    c2 = b.emit(Op.AND, [c, b.const(True, u1)])                      # -> c
    c3 = b.emit(Op.NOT, [b.emit(Op.NOT, [c2])])                      # -> c
    r = b.select(c3, t, b.const(5.0, f32))
    store(b, out, b.const(0, i32), r)
    inputs = [([np.array([v], np.float32), np.zeros(1, np.float32)], []) for v in [0.0, 3.0, math.nan]]
    k = check_pass(k, constant_fold, inputs)
    assert r.args == [c, x, r.args[2]]


def test_if_with_constant_condition_inlines_taken_block_with_break():
    # acc = 0; for i in range(10): if (1 < 2): { if i == 3: break }  else: { acc += 100 }; acc += 1
    k, b = serial_kernel(ret=i32)
    acc = b.alloca(i32, "acc")
    loop = b.range_for(b.const(0, i32), b.const(10, i32))
    with b.at(loop.blocks[0]):
        i = b.loop_index(loop)
        outer = b.if_(b.lt(b.const(1, i32), b.const(2, i32)))
        with b.at(outer.blocks[0]):
            inner = b.if_(b.emit(Op.EQ, [i, b.const(3, i32)]))
            with b.at(inner.blocks[0]):
                b.emit(Op.BREAK)
        with b.at(outer.blocks[1]):
            b.store(acc, b.add(b.load(acc), b.const(100, i32)))
        b.store(acc, b.add(b.load(acc), b.const(1, i32)))
    b.emit(Op.RETURN, [b.load(acc)])
    k = check_pass(k, constant_fold, [([], [])])
    body = loop.blocks[0].stmts
    assert outer not in body and inner in body  # inlined into the loop body
    assert [s.op for s in walk(Block(body))].count(Op.BREAK) == 1
    assert run_kernel(k, [], []) == 3


def test_if_false_takes_else_and_empty_range_for_is_removed():
    out = buf("out", i32)
    k, b = serial_kernel(out)
    br = b.if_(b.const(False, u1))
    with b.at(br.blocks[0]):
        store(b, out, b.const(0, i32), b.const(1, i32))
    with b.at(br.blocks[1]):
        store(b, out, b.const(0, i32), b.const(2, i32))
    loop = b.range_for(b.const(5, i32), b.add(b.const(2, i32), b.const(3, i32)))
    with b.at(loop.blocks[0]):
        store(b, out, b.const(1, i32), b.const(9, i32))
    k = check_pass(k, constant_fold, [([np.zeros(2, np.int32)], [])])
    assert Op.IF not in ops_of(k) and Op.RANGE_FOR not in ops_of(k)
    assert stored_value(k).attr == 2


# ---- CSE -----------------------------------------------------------------------------------

def test_cse_merges_duplicates_and_commutative_operands():
    inp, out = buf("inp", f32), buf("out", f32)
    k, b = serial_kernel(inp, out)
    x, y = load(b, inp, b.const(0, i32)), load(b, inp, b.const(1, i32))
    s1, s2, s3 = b.add(x, y), b.add(x, y), b.add(y, x)
    d1, d2 = b.sub(x, y), b.sub(y, x)
    r = b.add(b.add(s1, s2), b.add(s3, b.mul(d1, d2)))
    store(b, out, b.const(0, i32), r)
    k = check_pass(k, cse, [([np.array([1.5, -2.25], np.float32), np.zeros(1, np.float32)], [])])
    assert count(k, Op.GLOBAL_LOAD) == 2
    adds = [s for s in walk_kernel(k) if s.op is Op.ADD]
    assert len(adds) == 4 and count(k, Op.SUB) == 2


def test_cse_constants_keep_signed_zero_apart():
    k, b = serial_kernel(ret=f32)
    z, nz, z2 = b.const(0.0, f32), b.const(-0.0, f32), b.const(0.0, f32)
    b.emit(Op.RETURN, [b.add(b.add(z, nz), z2)])
    k = check_pass(k, cse, [([], [])])
    consts = [s for s in walk_kernel(k) if s.op is Op.CONST]
    assert len(consts) == 2


def test_cse_respects_dominance():
    inp, out = buf("inp", i32), buf("out", i32)
    k, b = serial_kernel(inp, out)
    x = load(b, inp, b.const(0, i32))
    outer = b.mul(x, x)
    br = b.if_(b.lt(x, b.const(0, i32)))
    with b.at(br.blocks[0]):
        dup_outer = b.mul(x, x)                    # dominated by `outer`: merged
        t = b.add(x, b.const(1, i32))
        store(b, out, b.const(0, i32), b.add(dup_outer, t))
    with b.at(br.blocks[1]):
        e = b.add(x, b.const(1, i32))              # sibling of `t`: kept
        store(b, out, b.const(0, i32), e)
    after = b.add(x, b.const(1, i32))              # after the IF: not dominated by t or e
    store(b, out, b.const(1, i32), b.add(after, outer))
    inputs = [([np.array([v], np.int32), np.zeros(2, np.int32)], []) for v in [-4, 4]]
    k = check_pass(k, cse, inputs)
    assert count(k, Op.MUL) == 1
    assert sum(1 for s in walk_kernel(k) if s.op is Op.ADD) == 5  # t, e, after, 2 sums


def test_cse_global_loads_are_killed_by_stores_to_the_same_buffer():
    a, other = buf("a", f32), buf("other", f32)
    k, b = serial_kernel(a, other)
    i0 = b.const(0, i32)
    l1 = load(b, a, i0)
    l2 = load(b, a, i0)                          # merged with l1
    store(b, other, b.const(1, i32), l2)         # another field: does not kill
    l3 = load(b, a, i0)                          # merged with l1
    store(b, a, b.const(1, i32), b.add(l3, l1))  # kills loads of a
    l4 = load(b, a, i0)                          # kept
    store(b, other, i0, b.add(l4, l2))
    k = check_pass(k, cse, [([np.array([1.0, 2.0], np.float32), np.zeros(2, np.float32)], [])])
    assert count(k, Op.GLOBAL_LOAD) == 2


def test_cse_ndarray_arguments_may_alias():
    a, c = buf("a", f32, plan.Arg(0)), buf("c", f32, plan.ArgGrad(1))
    k, b = serial_kernel(a, c)
    i0 = b.const(0, i32)
    l1 = load(b, a, i0)
    store(b, c, i0, b.const(7.0, f32))           # the same array may be bound as a and c
    l2 = load(b, a, i0)
    store(b, c, b.const(1, i32), b.add(l1, l2))
    k = cse(k)
    assert count(k, Op.GLOBAL_LOAD) == 2


def test_cse_loads_in_a_loop_that_stores_are_not_merged_with_loads_before_it():
    a, out = buf("a", i32), buf("out", i32)
    k, b = serial_kernel(a, out)
    i0, i1 = b.const(0, i32), b.const(1, i32)
    before = load(b, a, i0)
    pre_out = load(b, out, i0)
    loop = b.range_for(b.const(0, i32), b.const(3, i32))
    with b.at(loop.blocks[0]):
        inside = load(b, a, i0)                  # sees the previous iteration's store
        store(b, a, i0, b.add(inside, i1))
    loop2 = b.range_for(b.const(0, i32), b.const(2, i32))
    with b.at(loop2.blocks[0]):
        same = load(b, out, i0)                  # loop2 never stores to out: merged with pre-loop load
        store(b, a, i1, same)
    after = load(b, a, i0)
    store(b, out, i1, b.add(b.add(before, after), b.mul(pre_out, b.const(0, i32))))
    k = check_pass(k, cse, [([np.array([5, 0], np.int32), np.array([4, 0], np.int32)], [])])
    assert inside in loop.blocks[0].stmts and same not in loop2.blocks[0].stmts
    assert count(k, Op.GLOBAL_LOAD) == 4  # before, pre_out, inside, after
    a_data, out_data = np.array([5, 0], np.int32), np.array([4, 0], np.int32)
    run_kernel(k, [a_data, out_data], [])
    assert out_data[1] == 5 + 8 and a_data[1] == 4


def test_cse_range_task_body_is_a_loop_for_loads_in_the_bounds():
    # bounds: end = a[0]; body (each thread in turn): v = a[0]; a[0] = v + 1; out[i] = v
    a, out = buf("a", i32), buf("out", i32)
    t = Task("range", Block(), name="par")
    k = Kernel("k", [t], [], [a, out])
    b = Builder(t.bounds)
    t.begin, t.end = b.const(0, i32), load(b, a, b.const(0, i32))
    b.block = t.body
    v = load(b, a, b.const(0, i32))              # later threads see earlier threads' stores
    store(b, a, b.const(0, i32), b.add(v, b.const(1, i32)))
    store(b, out, b.loop_index(t), v)
    k = check_pass(k, cse, [([np.array([3], np.int32), np.zeros(4, np.int32)], [])])
    assert v in t.body.stmts


def test_cse_atomic_kills_loads():
    a, out = buf("a", i32), buf("out", i32)
    k, b = serial_kernel(a, out)
    i0 = b.const(0, i32)
    l1 = load(b, a, i0)
    b.emit(Op.ATOMIC, [i0, b.const(5, i32)], i32, (AtomicKind.ADD, a))
    l2 = load(b, a, i0)
    store(b, out, i0, b.sub(l2, l1))
    k = check_pass(k, cse, [([np.array([1], np.int32), np.zeros(1, np.int32)], [])])
    assert count(k, Op.GLOBAL_LOAD) == 2


def test_cse_local_loads():
    out = buf("out", i32)
    k, b = serial_kernel(out)
    v = b.alloca(i32, "v")
    b.store(v, b.const(3, i32))
    l1, l2 = b.load(v), b.load(v)                # merged
    br = b.if_(b.lt(l1, b.const(10, i32)))
    with b.at(br.blocks[0]):
        l3 = b.load(v)                           # no store in between: merged with l1
        b.store(v, b.add(l3, b.const(1, i32)))
    l4 = b.load(v)                               # a nested store may have run: kept
    store(b, out, b.const(0, i32), b.add(b.add(l1, l2), l4))
    k = check_pass(k, cse, [([np.zeros(1, np.int32)], [])])
    assert count(k, Op.LOCAL_LOAD) == 2


def test_cse_merges_loop_indices_and_args():
    n, out = ArgSlot("n", i32, 0), buf("out", i32)
    k, b, t = range_kernel(4, out, args=[n])
    i1, i2 = b.loop_index(t), b.loop_index(t)
    a1, a2 = b.emit(Op.ARG, (), i32, n), b.emit(Op.ARG, (), i32, n)
    store(b, out, i1, b.add(b.mul(i2, a1), a2))
    k = check_pass(k, cse, [([np.zeros(4, np.int32)], [3])])
    assert count(k, Op.LOOP_INDEX) == 1 and count(k, Op.ARG) == 1


# ---- DCE -----------------------------------------------------------------------------------

def test_dce_removes_dead_chains_and_keeps_effects():
    acc, out = buf("acc", i32), buf("out", i32)
    k, b = serial_kernel(acc, out)
    x = load(b, out, b.const(0, i32))
    dead = b.mul(b.add(x, b.const(1, i32)), x)             # unused chain
    b.emit(Op.ATOMIC, [b.const(0, i32), b.const(2, i32)], i32, (AtomicKind.ADD, acc))  # unused result
    b.emit(Op.RANDOM, (), f32)                               # unused draw: still an effect
    store(b, out, b.const(1, i32), x)
    k = check_pass(k, dce, [([np.zeros(1, np.int32), np.array([4, 0], np.int32)], [])])
    assert dead not in walk_kernel(k) and Op.ADD not in ops_of(k)
    assert count(k, Op.ATOMIC) == 1 and count(k, Op.RANDOM) == 1 and count(k, Op.GLOBAL_STORE) == 1


def test_dce_removes_never_loaded_variables_with_their_stores():
    out = buf("out", f32)
    k, b = serial_kernel(out)
    v, w = b.alloca(f32, "v"), b.alloca(f32, "w")
    b.store(v, b.emit(Op.SIN, [b.const(1.0, f32)]))
    loop = b.range_for(b.const(0, i32), b.const(3, i32))
    with b.at(loop.blocks[0]):
        b.store(v, b.cast(b.loop_index(loop), f32))         # the loop then becomes empty
        b.store(w, b.add(b.load(w), b.const(1.0, f32)))
    store(b, out, b.const(0, i32), b.load(w))
    k = check_pass(k, dce, [([np.zeros(1, np.float32)], [])])
    assert v not in walk_kernel(k) and Op.SIN not in ops_of(k) and Op.CAST not in ops_of(k)
    assert count(k, Op.ALLOCA) == 1 and count(k, Op.RANGE_FOR) == 1


def test_dce_removes_empty_control_flow_and_unreachable_code():
    out = buf("out", i32)
    k, b = serial_kernel(out)
    x = load(b, out, b.const(0, i32))
    br = b.if_(b.lt(x, b.const(0, i32)))
    with b.at(br.blocks[0]):
        b.add(x, x)                                          # dead: the IF becomes empty
    loop = b.range_for(b.const(0, i32), x)
    with b.at(loop.blocks[0]):
        b.mul(x, x)
    loop2 = b.range_for(b.const(0, i32), b.const(4, i32))
    with b.at(loop2.blocks[0]):
        store(b, out, b.const(1, i32), b.loop_index(loop2))
        b.emit(Op.BREAK)
        store(b, out, b.const(1, i32), b.const(99, i32))    # unreachable
    k = check_pass(k, dce, [([np.array([3, 0], np.int32)], [])])
    assert Op.IF not in ops_of(k) and count(k, Op.RANGE_FOR) == 1 and count(k, Op.GLOBAL_STORE) == 1
    assert Op.LT not in ops_of(k)


def test_dce_removes_a_variable_read_only_to_update_itself():
    """f += sin(x) under an `if`, f then only feeding a dead value: the loads of f feed only its
    own stores, a cycle the use counts cannot break; the mark-and-sweep drops f, the sin and the
    IF, and keeps what the store needs."""
    out = buf("out", f32)
    k, b = serial_kernel(out)
    x = load(b, out, b.const(0, i32))
    f, g = b.alloca(f32, "f"), b.alloca(f32, "g")
    b.store(f, b.const(0.0, f32))
    b.store(g, x)
    br = b.if_(b.emit(Op.GT, [x, b.const(0.0, f32)]))
    with b.at(br.blocks[0]):
        b.store(f, b.add(b.load(f), b.emit(Op.SIN, [x])))
        b.store(g, b.mul(b.load(g), x))
    b.mul(b.load(f), b.const(2.0, f32))                      # f's only other use: dead
    store(b, out, b.const(1, i32), b.load(g))
    k = check_pass(k, dce, [([np.array([v, 0], np.float32)], []) for v in (0.5, -0.5)])
    assert f not in walk_kernel(k) and Op.SIN not in ops_of(k)
    assert g in walk_kernel(k) and count(k, Op.IF) == 1 and count(k, Op.GLOBAL_STORE) == 1


def test_mem2reg_forwards_stores_within_a_block_and_drops_overwritten_and_stored_back_values():
    """In a block: a load after a store reads the stored value, a store overwritten before any
    read is dead, and storing back the value just loaded changes nothing (the reverse of
    `f = f + s` when only f is active), while a variable touched in a nested block stays."""
    from wgpu_ad.passes.mem2reg import mem2reg
    out = buf("out", f32)
    k, b = serial_kernel(out)
    x = load(b, out, b.const(0, i32))
    v = b.alloca(f32, "v")
    br = b.if_(b.emit(Op.GT, [x, b.const(0.0, f32)]))       # v is touched in two blocks
    with b.at(br.blocks[0]):
        b.store(v, x)
    with b.at(br.blocks[1]):
        b.store(v, b.emit(Op.NEG, [x]))
        old = b.load(v)
        b.store(v, b.const(0.0, f32))                        # overwritten before any read
        b.store(v, old)                                      # stores back what v holds
        b.store(v, b.add(b.load(v), b.const(1.0, f32)))      # the load reads -x
    store(b, out, b.const(1, i32), b.load(v))
    k = check_pass(k, mem2reg, [([np.array([v_, 0], np.float32)], []) for v_ in (0.5, -0.5)])
    else_block = [s for s in walk_kernel(k) if s.op is Op.IF][0].blocks[1]
    assert [s.op for s in else_block.stmts].count(Op.LOCAL_STORE) == 1
    assert Op.LOCAL_LOAD not in [s.op for s in else_block.stmts]


def test_mem2reg_keeps_a_store_the_block_may_be_left_after():
    """v = k; if v > 1: break; v = 99 in a loop: the first store is read after the loop when the
    break is taken, so it is not dead although the block stores v again."""
    from wgpu_ad.passes.mem2reg import mem2reg
    out = buf("out", i32)
    k, b = serial_kernel(out)
    v = b.alloca(i32, "v")
    loop = b.range_for(b.const(0, i32), b.const(4, i32))
    with b.at(loop.blocks[0]):
        b.store(v, b.loop_index(loop))
        br = b.if_(b.emit(Op.GT, [b.load(v), b.const(1, i32)]))
        with b.at(br.blocks[0]):
            b.emit(Op.BREAK)
        b.store(v, b.const(99, i32))
    store(b, out, b.const(0, i32), b.load(v))
    k = check_pass(k, mem2reg, [([np.zeros(1, np.int32)], [])])
    assert run_all(k, [([np.zeros(1, np.int32)], [])])[0][0][0][0] == 2


# ---- utilities and the pipeline ------------------------------------------------------------

def test_replace_uses_rewrites_operands_and_task_bounds():
    out = buf("out", i32)
    k, b, t = range_kernel(4, out)
    old_end = t.end
    new_end = Builder(t.bounds).const(2, i32)
    store(b, out, b.loop_index(t), old_end)
    assert replace_uses(k, old_end, new_end) == 2
    assert t.end is new_end and stored_value(k) is new_end
    assert use_counts(k).get(old_end, 0) == 0
    with pytest.raises(TypeError, match="f32"):
        replace_uses(k, new_end, b.const(1.0, f32))


def test_pipeline_lists_named_passes_and_prints_ir(capsys, monkeypatch):
    assert [name for name, _ in PASSES] == ["mem2reg", "constant_fold", "cse", "licm", "dce"]
    k, b = serial_kernel(ret=i32)
    b.emit(Op.RETURN, [b.add(b.const(1, i32), b.const(2, i32))])
    optimize(k, print_ir=True)
    text = capsys.readouterr().out
    for name, _ in PASSES:
        assert f"after {name} (round 1)" in text
    assert "const 3()" in text
    monkeypatch.setenv("WGPU_AD_PRINT_IR", "1")
    optimize(k)
    assert "after dce" in capsys.readouterr().out
    monkeypatch.setenv("WGPU_AD_PRINT_IR", "0")
    optimize(k)
    assert capsys.readouterr().out == ""


def test_pipeline_verify_names_the_bad_pass():
    def broken(k):
        k.tasks[0].body.stmts.pop(0)  # drops a definition that is still used
        return k
    k, b = serial_kernel(ret=i32)
    b.emit(Op.RETURN, [b.add(b.const(1, i32), b.emit(Op.RANDOM, (), i32))])
    with pytest.raises(VerifyError, match="after pass broken"):
        optimize(k, verify=True, passes=[("broken", broken)])


# ---- random programs: optimize() preserves results bit for bit ------------------------------

F_CONSTS = [0.0, -0.0, 1.0, -1.0, 2.0, 0.5, 3.0, 1e30, 1e-3, 7.25]
I_CONSTS = [0, 1, -1, 2, 3, 7, 31, 32, IMAX, IMIN]
U_CONSTS = [0, 1, 2, 5, 0x80000000, 0xFFFFFFFF]
F_UNARY = [Op.NEG, Op.ABS, Op.SIGN, Op.SIN, Op.COS, Op.TAN, Op.ASIN, Op.ACOS, Op.ATAN, Op.TANH,
           Op.EXP, Op.LOG, Op.SQRT, Op.RSQRT, Op.FLOOR, Op.CEIL, Op.ROUND]
F_BINARY = [Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.FLOORDIV, Op.MOD, Op.POW, Op.ATAN2, Op.MIN, Op.MAX]
I_UNARY = [Op.NEG, Op.ABS, Op.SIGN, Op.BIT_NOT]
I_BINARY = [Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.FLOORDIV, Op.MOD, Op.MIN, Op.MAX,  # POW: float only
            Op.BIT_AND, Op.BIT_OR, Op.BIT_XOR, Op.SHL, Op.SHR]
CMP = [Op.LT, Op.LE, Op.GT, Op.GE, Op.EQ, Op.NE]
N, K = 5, 3  # range task size, outputs per thread and dtype


class RandomProgram:
    """A random range kernel mixing every ALU op with loads, stores, locals, IFs and loops.

    Never bitcasts a float to an int: that would expose NaN payload bits, which IEEE leaves to
    the hardware (x * 1.0 may quiet a signalling NaN)."""

    def __init__(self, seed: int):
        self.r = random.Random(seed)
        self.ins = {dt: buf(f"in_{dt}", dt) for dt in (f32, i32, u32)}
        self.outs = {dt: buf(f"out_{dt}", dt) for dt in (f32, i32, u32)}
        self.acc = buf("acc", i32)
        self.args = {dt: ArgSlot(f"a_{dt}", dt, k) for k, dt in enumerate((f32, i32, u32))}
        bufs = list(self.ins.values()) + list(self.outs.values()) + [self.acc]
        self.k, self.b, t = range_kernel(N, *bufs, args=list(self.args.values()))
        self.i = self.b.loop_index(t)
        self.pool = {f32: [], i32: [self.i], u32: [], u1: []}
        self.exprs: list[Stmt] = []

    def const(self, dt):
        table = {f32: F_CONSTS, i32: I_CONSTS, u32: U_CONSTS, u1: [True, False]}[dt]
        return self.b.const(self.r.choice(table), dt)

    def pick(self, dt) -> Stmt:
        p = self.pool[dt]
        if not p or self.r.random() < 0.15:
            v = self.const(dt) if dt != u1 or self.r.random() < 0.3 else self.compare()
            p.append(v)
            return v
        return p[-self.r.randint(1, min(len(p), 5))] if self.r.random() < 0.6 else self.r.choice(p)

    def compare(self) -> Stmt:
        dt = self.r.choice([f32, i32, u32])
        return self.b.emit(self.r.choice(CMP), [self.pick(dt), self.pick(dt)])

    def out_index(self, j: int) -> Stmt:
        b = self.b
        return b.add(b.mul(self.i, b.const(K, i32)), b.const(j, i32))

    def alu(self) -> None:
        r, b = self.r, self.b
        dt = r.choice([f32, f32, i32, i32, u32, u1])
        if dt == u1:
            kind = r.randrange(4)
            if kind == 0:
                v = self.compare()
            elif kind == 1:
                v = b.emit(Op.NOT, [self.pick(u1)])
            elif kind == 2:
                v = b.emit(r.choice([Op.AND, Op.OR]), [self.pick(u1), self.pick(u1)])
            else:
                v = b.emit(Op.CAST, [self.pick(r.choice([f32, i32, u32]))], u1)
        else:
            kind = r.randrange(10)
            unary, binary = (F_UNARY, F_BINARY) if dt == f32 else (I_UNARY, I_BINARY)
            if kind < 3:
                v = b.emit(r.choice(unary), [self.pick(dt)])
            elif kind < 7:
                v = b.emit(r.choice(binary), [self.pick(dt), self.pick(dt)])
            elif kind == 7:
                v = b.select(self.pick(u1), self.pick(dt), self.pick(dt))
            elif kind == 8:
                v = b.emit(Op.CAST, [self.pick(r.choice([f32, i32, u32, u1]))], dt)
            elif dt == f32:  # int bits -> float (NaNs with any payload included)
                v = b.emit(Op.BITCAST, [self.pick(r.choice([i32, u32]))], dt)
            else:
                v = b.emit(Op.BITCAST, [self.pick(i32 if dt == u32 else u32)], dt)
        self.pool[v.dtype].append(v)
        self.exprs.append(v)

    def duplicate(self) -> None:
        if self.exprs:
            s = self.r.choice(self.exprs)
            self.pool[s.dtype].append(self.b.emit(s.op, list(s.args), s.dtype, s.attr))

    def store_reload(self) -> None:
        dt = self.r.choice([f32, i32, u32])
        b, o = self.b, self.outs[dt]
        store(b, o, self.out_index(self.r.randrange(K)), self.pick(dt))
        self.pool[dt].append(load(b, o, self.out_index(self.r.randrange(K))))

    def atomic(self) -> None:
        b = self.b
        old = b.emit(Op.ATOMIC, [b.const(0, i32), self.pick(i32)], i32,
                     (self.r.choice(list(AtomicKind)), self.acc))
        self.pool[i32].append(old)

    @contextmanager
    def scope(self, block: Block):
        """Emit into a nested block; its values are not visible after it."""
        saved = ({dt: list(p) for dt, p in self.pool.items()}, list(self.exprs))
        with self.b.at(block):
            yield
        self.pool, self.exprs = saved

    def steps(self, lo: int, hi: int) -> None:
        for _ in range(self.r.randint(lo, hi)):
            self.step(nested=True)

    def if_(self) -> None:
        b, dt = self.b, self.r.choice([f32, i32, u32])
        var = b.alloca(dt, "v")
        b.store(var, self.pick(dt))
        cond = self.const(u1) if self.r.random() < 0.3 else self.pick(u1)
        br = b.if_(cond)
        for blk in br.blocks:
            if self.r.random() < 0.8:
                with self.scope(blk):
                    b.store(var, self.pick(dt))
                    self.steps(1, 4)
                    b.store(var, self.pick(dt))
        self.pool[dt].append(b.load(var))

    def loop(self) -> None:
        b, dt = self.b, self.r.choice([f32, i32])
        var = b.alloca(dt, "acc")
        is_while = self.r.random() < 0.3
        if is_while:
            n = b.alloca(i32, "n")
            lp = b.emit(Op.WHILE, blocks=[Block()])
        else:
            lo, hi = self.r.choice([(0, 3), (1, 3), (2, 2), (3, 1)])
            lp = b.range_for(b.const(lo, i32), b.const(hi, i32))
        with self.scope(lp.blocks[0]):
            if is_while:  # count to 3 in n, then break
                stop = b.if_(b.emit(Op.GE, [b.load(n), b.const(3, i32)]))
                with b.at(stop.blocks[0]):
                    b.emit(Op.BREAK)
                b.store(n, b.add(b.load(n), b.const(1, i32)))
            else:
                self.pool[i32].append(b.loop_index(lp))
            self.steps(1, 4)
            b.store(var, b.emit(Op.ADD, [b.load(var), self.pick(dt)]))
            if self.r.random() < 0.3:
                stop = b.if_(self.pick(u1))
                with b.at(stop.blocks[0]):
                    b.emit(self.r.choice([Op.BREAK, Op.CONTINUE]))
        self.pool[dt].append(b.load(var))

    def step(self, nested=False) -> None:
        x = self.r.random()
        if x < 0.62:
            self.alu()
        elif x < 0.72:
            self.duplicate()
        elif x < 0.80:
            self.store_reload()
        elif x < 0.83:
            self.atomic()
        elif x < 0.85:
            self.pool[f32].append(self.b.emit(Op.RANDOM, (), f32))
        elif x < 0.93 and not nested:
            self.if_()
        elif not nested:
            self.loop()
        else:
            self.alu()

    def build(self) -> Kernel:
        b = self.b
        for dt in (f32, i32, u32):
            self.pool[dt].append(load(b, self.ins[dt], self.i))
            self.pool[dt].append(b.emit(Op.ARG, (), dt, self.args[dt]))
        for _ in range(self.r.randint(15, 35)):
            self.step()
        for dt in (f32, i32, u32):
            for j in range(K):
                store(b, self.outs[dt], self.out_index(j), self.pick(dt))
        return self.k

    def inputs(self, n_sets: int):
        r = self.r
        vals = {f32: F_CONSTS + [math.inf, math.nan, -2.5, 0.3], i32: I_CONSTS + [-5, 100],
                u32: U_CONSTS + [77]}
        sets = []
        for _ in range(n_sets):
            def draw(dt):
                if r.random() < 0.5:
                    return vals[dt][r.randrange(len(vals[dt]))]
                if dt == f32:
                    return r.uniform(-10, 10)
                v = r.randint(-50, 50)
                return v % 2**32 if dt == u32 else v
            bufs = [np.array([draw(dt) for _ in range(N)], dt.np) for dt in (f32, i32, u32)]
            bufs += [np.zeros(N * K, dt.np) for dt in (f32, i32, u32)] + [np.zeros(1, np.int32)]
            sets.append((bufs, [draw(dt) for dt in (f32, i32, u32)]))
        return sets


def _size(k: Kernel) -> int:
    return sum(1 for _ in walk_kernel(k))


@pytest.mark.parametrize("chunk", range(4))
def test_random_programs_keep_their_results(chunk):
    shrunk = 0
    seeds = range(chunk * 40, chunk * 40 + 40)
    for seed in seeds:
        gen = RandomProgram(seed)
        k = gen.build()
        verify(k)
        inputs = gen.inputs(3)
        before = run_all(k, inputs, seed=seed)
        size = _size(k)
        k = optimize(k, verify=True)
        try:
            assert_same_results(before, run_all(k, inputs, seed=seed))
        except AssertionError as e:
            raise AssertionError(f"random program seed {seed} changed its results: {e}") from None
        shrunk += _size(k) < size
    assert shrunk >= len(seeds) * 0.9  # the passes do real work on these programs


def test_mem2reg_turns_single_store_and_straight_line_variables_into_values():
    k, b = serial_kernel(ret=i32)
    v = b.alloca(i32, "v")
    b.store(v, b.add(b.const(4, i32), b.const(5, i32)))
    w = b.alloca(i32, "w")  # stored twice, in its own block only: each load is the store before it
    b.store(w, b.const(1, i32))
    b.store(w, b.add(b.load(w), b.load(v)))
    u = b.alloca(i32, "u")  # stored in a nested block: stays a variable
    b.store(u, b.load(w))
    cond = b.if_(b.lt(b.load(w), b.const(20, i32)))
    with b.at(cond.blocks[0]):
        b.store(u, b.add(b.load(u), b.const(100, i32)))
    r = b.alloca(i32, "r")  # read before its first store: that load is the initial zero
    first = b.load(r)
    b.store(r, b.add(first, b.load(u)))
    b.emit(Op.RETURN, [b.load(r)])
    before = run_kernel(k, [], [])
    from wgpu_ad.passes.mem2reg import mem2reg
    mem2reg(k)
    verify(k)
    allocas = [s for s in k.tasks[0].body.stmts if s.op is Op.ALLOCA]
    assert [a.name for a in allocas] == ["u"]
    assert r.op is Op.CONST and r.attr == 0  # the variable's initial zero, which its first load read
    assert run_kernel(k, [], []) == before == 110


# ---- loop-invariant code motion ------------------------------------------------------------

def test_licm_hoists_invariant_values_and_read_only_loads_out_of_nested_loops():
    from wgpu_ad.passes.licm import licm
    x, out = buf("x", f32), buf("out", f32)
    k, b, t = range_kernel(4, x, out)
    i = b.loop_index(t)
    outer = b.range_for(b.const(0, i32), b.const(3, i32))
    with b.at(outer.blocks[0]):
        j = b.loop_index(outer)
        inner = b.range_for(b.const(0, i32), b.const(2, i32))
        with b.at(inner.blocks[0]):
            xi = load(b, x, i)                         # depends on the thread only: out of both loops
            scaled = b.mul(xi, b.const(2.0, f32))
            xj = load(b, x, j)                         # depends on the outer loop: out of the inner one
            cond = b.emit(Op.LT, [xj, scaled], u1)
            s = b.if_(cond)
            with b.at(s.blocks[0]):
                guarded = b.add(xi, b.const(1.0, f32))  # inside an IF: stays
                b.emit(Op.ATOMIC, [i, guarded], f32, (AtomicKind.ADD, out))
            b.emit(Op.ATOMIC, [i, b.add(scaled, xj)], f32, (AtomicKind.ADD, out))
    xs = np.array([0.5, -1.0, 2.0, 3.0], np.float32)
    k = check_pass(k, licm, [([xs, np.zeros(4, np.float32)], [])])
    body = t.body.stmts
    assert xi in body and scaled in body and body.index(scaled) < body.index(outer)
    assert xj in outer.blocks[0].stmts and body.index(outer) > 0
    assert guarded in s.blocks[0].stmts
    # against NumPy: out[i] = sum_j sum_k (2 x_i + x_j) + [x_j < 2 x_i] (x_i + 1)
    res = np.zeros(4, np.float32)
    run_kernel(k, [xs.copy(), res], [])
    x64 = xs.astype(np.float64)
    want = [2 * sum((2 * xi_ + x64[j_]) + (x64[j_] < 2 * xi_) * (xi_ + 1) for j_ in range(3)) for xi_ in x64]
    np.testing.assert_allclose(res, want, rtol=1e-6)


def test_licm_keeps_loads_of_written_buffers_and_variables_the_loop_writes():
    from wgpu_ad.passes.licm import licm
    a, out = buf("a", i32), buf("out", i32)
    k, b = serial_kernel(a, out)
    i0, i1 = b.const(0, i32), b.const(1, i32)
    acc = b.alloca(i32, "acc")
    b.store(acc, i0)
    fixed = b.alloca(i32, "fixed")
    b.store(fixed, b.const(7, i32))
    loop = b.range_for(i0, b.const(3, i32))
    with b.at(loop.blocks[0]):
        seen = load(b, out, i0)      # `out` is written in the task (after the loop): stays
        cur = b.load(acc)            # acc is written in the loop: stays
        f = b.load(fixed)            # fixed is not: moves
        b.store(acc, b.add(b.add(cur, f), load(b, a, i0)))   # `a` is read-only: its load moves
        b.store(acc, b.add(b.load(acc), seen))
    store(b, out, i1, b.load(acc))
    store(b, out, i0, b.const(1, i32))
    k = check_pass(k, licm, [([np.array([5, 0], np.int32), np.array([4, 0], np.int32)], [])])
    inside = loop.blocks[0].stmts
    assert seen in inside and cur in inside and f not in inside
    assert not any(s.op is Op.GLOBAL_LOAD and s.attr is a for s in inside)
    a_data, out_data = np.array([5, 0], np.int32), np.array([4, 0], np.int32)
    run_kernel(k, [a_data, out_data], [])
    assert out_data[1] == 3 * (7 + 5 + 4)


def test_licm_keeps_the_loop_index_and_values_of_a_while_loop_that_change():
    from wgpu_ad.passes.licm import licm
    out = buf("out", i32)
    k, b = serial_kernel(out)
    n = b.alloca(i32, "n")
    b.store(n, b.const(0, i32))
    w = b.emit(Op.WHILE, [], None, blocks=[Block()])
    with b.at(w.blocks[0]):
        ten = b.mul(b.const(5, i32), b.const(2, i32))
        cur = b.load(n)
        stop = b.if_(b.emit(Op.GE, [cur, ten], u1))
        with b.at(stop.blocks[0]):
            b.emit(Op.BREAK)
        b.store(n, b.add(cur, b.const(3, i32)))
    store(b, out, b.const(0, i32), b.load(n))
    k = check_pass(k, licm, [([np.zeros(1, np.int32)], [])])
    assert ten not in w.blocks[0].stmts and cur in w.blocks[0].stmts
    res = np.zeros(1, np.int32)
    run_kernel(k, [res], [])
    assert res[0] == 12


def test_licm_moves_what_every_thread_computes_alike_into_the_range_task_bounds():
    from wgpu_ad.passes.licm import licm
    seed, x, out = buf("seed", f32), buf("x", f32), buf("out", f32)
    k, b, t = range_kernel(6, seed, x, out, args=[ArgSlot("s", f32, 0)])
    i = b.loop_index(t)
    g = load(b, seed, b.const(0, i32))                    # the same in every thread: to the bounds
    scale = b.mul(g, b.emit(Op.ARG, [], f32, k.args[0]))  # so is this
    xi = load(b, x, i)                                     # thread-dependent: stays
    prev = load(b, out, b.const(0, i32))                   # `out` is written in the task: stays
    store(b, out, i, b.add(b.mul(xi, scale), b.mul(prev, b.const(0.0, f32))))
    xs = np.arange(6, dtype=np.float32)
    k = check_pass(k, licm, [([np.array([2.0], np.float32), xs, np.zeros(6, np.float32)], [3.0])])
    assert g in t.bounds.stmts and scale in t.bounds.stmts
    assert xi in t.body.stmts and prev in t.body.stmts
    res = np.zeros(6, np.float32)
    run_kernel(k, [np.array([2.0], np.float32), xs.copy(), res], [3.0])
    np.testing.assert_array_equal(res, xs * 6.0)
