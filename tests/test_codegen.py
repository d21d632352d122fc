"""WGSL code generator: hand-built IR kernels (control flow, range tasks, atomics, random numbers,
asserts, bindings, names) compiled and run on the adapter (lavapipe here), checked against NumPy
or plain Python. The op table is tested in test_codegen_ops.py; the harness is raw wgpu-py."""
from __future__ import annotations

import re

import numpy as np
import pytest

import _wgsl_harness as H
from _wgsl_harness import KB, arg, atomic, compile_run, load, store
from wgpu_ad import plan
from wgpu_ad.codegen import format_wgsl, generate
from wgpu_ad.ir.nodes import Block
from wgpu_ad.ir.ops import AtomicKind, Op
from wgpu_ad.types import f32, i32, u1, u32

F32, I32, U32 = np.float32, np.int32, np.uint32


# ---------------------------------------------------------------- control flow and locals

def test_serial_control_flow_matches_python():
    """Nested RANGE_FOR, WHILE with BREAK and CONTINUE, IF/else and locals, against Python."""
    def reference(n):
        total, trace = 0, []
        for a in range(n):
            for c in range(2, a):
                total += a * c if (a + c) % 3 == 0 else -c
        k = 0
        while True:
            k += 1
            if k % 4 == 0:
                continue
            if k > 20:
                break
            trace.append(k)
        return total, sum(trace), k

    kb = KB("flow")
    O = kb.buf("out", i32)
    N = kb.arg("n", i32)
    b = kb.serial()
    total = b.alloca(i32, "total")
    b.store(total, b.const(0, i32))
    outer = b.range_for(b.const(0, i32), arg(b, N), name="a")
    with b.at(outer.blocks[0]):
        av = b.loop_index(outer, "a")
        inner = b.range_for(b.const(2, i32), av, name="c")
        with b.at(inner.blocks[0]):
            cv = b.loop_index(inner, "c")
            cond = b.emit(Op.EQ, [b.emit(Op.MOD, [b.add(av, cv), b.const(3, i32)]), b.const(0, i32)])
            br = b.if_(cond)
            with b.at(br.blocks[0]):
                b.store(total, b.add(b.load(total), b.mul(av, cv)))
            with b.at(br.blocks[1]):
                b.store(total, b.sub(b.load(total), cv))
    k, acc = b.alloca(i32, "k"), b.alloca(i32, "loop")     # 'loop' is a WGSL keyword
    b.store(k, b.const(0, i32))
    b.store(acc, b.const(0, i32))
    w = b.emit(Op.WHILE, blocks=[Block()])
    with b.at(w.blocks[0]):
        kv = b.add(b.load(k), b.const(1, i32))
        b.store(k, kv)
        skip = b.if_(b.emit(Op.EQ, [b.emit(Op.BIT_AND, [kv, b.const(3, i32)]), b.const(0, i32)]))
        with b.at(skip.blocks[0]):
            b.emit(Op.CONTINUE)
        stop = b.if_(b.emit(Op.GT, [kv, b.const(20, i32)]))
        with b.at(stop.blocks[0]):
            b.emit(Op.BREAK)
        b.store(acc, b.add(b.load(acc), kv))
    for j, var in enumerate((total, acc, k)):
        store(b, O, b.const(j, i32), b.load(var))
    ck, res = compile_run(kb.kernel(), [np.zeros(3, I32)], [9])
    assert tuple(res.buffers[0]) == reference(9)
    wgsl = ck.tasks[0].wgsl
    assert "var loop_: i32" in wgsl and "for (var a: i32" in wgsl and "for (var c: i32" in wgsl


def test_range_task_continue_and_offset_begin():
    kb = KB("evens")
    O = kb.buf("out", i32)
    b, i = kb.range(3, 1003)
    odd = b.if_(b.emit(Op.NE, [b.emit(Op.BIT_AND, [i, b.const(1, i32)]), b.const(0, i32)]))
    with b.at(odd.blocks[0]):
        b.emit(Op.CONTINUE)
    store(b, O, b.sub(i, b.const(3, i32)), b.mul(i, b.const(10, i32)))
    out = np.full(1000, -1, I32)
    # ir.verifier rejects CONTINUE directly in a range body, though the IR contract allows it
    _, res = compile_run(kb.kernel(check=False), [out], groups=3)
    idx = np.arange(3, 1003)
    np.testing.assert_array_equal(res.buffers[0], np.where(idx % 2 == 0, idx * 10, -1))


@pytest.mark.parametrize("n, wants_loop", [(256, False), (257, True)])
def test_constant_ranges_the_grid_covers_get_one_iteration_per_thread(n, wants_loop):
    """generate(grid_cap=4): a constant range of at most 4 workgroups of 64 threads runs one
    iteration per thread; a longer one keeps the grid-stride loop. Each gets the grid the
    launcher would give it (at most grid_cap workgroups) and writes every element."""
    kb = KB("cover")
    O = kb.buf("out", i32)
    b, i = kb.range(0, n, block_dim=64)
    store(b, O, i, b.mul(i, b.const(3, i32)))
    ck, res = compile_run(kb.kernel(), [np.full(n + 1, -1, I32)], groups=min(-(-n // 64), 4), grid_cap=4)
    assert ck.plan.tasks[0].one_pass != wants_loop
    assert ("for (var iter" in ck.tasks[0].wgsl) == wants_loop
    np.testing.assert_array_equal(res.buffers[0], np.append(np.arange(n) * 3, -1))


def test_ranges_from_arguments_or_with_continue_keep_the_loop():
    kb = KB("args")
    O = kb.buf("out", i32)
    b, i = kb.range(0, kb.arg("n", i32))
    store(b, O, i, i)
    assert not generate(kb.kernel(), float_atomics=False, debug=False, grid_cap=256).plan.tasks[0].one_pass
    kb = KB("cont")
    O = kb.buf("out", i32)
    b, i = kb.range(0, 100)
    odd = b.if_(b.emit(Op.NE, [b.emit(Op.BIT_AND, [i, b.const(1, i32)]), b.const(0, i32)]))
    with b.at(odd.blocks[0]):
        b.emit(Op.CONTINUE)  # goes to the parallel loop: it must stay a loop
    store(b, O, i, i)
    ck, res = compile_run(kb.kernel(check=False), [np.full(100, -1, I32)], groups=1, grid_cap=256)
    assert not ck.plan.tasks[0].one_pass
    np.testing.assert_array_equal(res.buffers[0], np.where(np.arange(100) % 2 == 0, np.arange(100), -1))


def test_range_larger_than_one_dispatch():
    """10M elements with at most 65535 workgroups of 128 threads: the grid-stride loop covers it."""
    n = 10_000_000
    kb = KB("big")
    O = kb.buf("out", i32)
    N = kb.arg("n", i32)
    b, i = kb.range(5, N)
    store(b, O, b.sub(i, b.const(5, i32)), b.mul(i, b.const(2, i32)))
    _, res = compile_run(kb.kernel(), [np.zeros(n, I32)], [n + 5], groups=65535)
    np.testing.assert_array_equal(res.buffers[0], np.arange(5, n + 5, dtype=I32) * 2)


@pytest.mark.parametrize("begin", [2**31 - 1 - 1000, -2**31], ids=["near-max", "min"])
def test_range_at_the_ends_of_i32(begin):
    """A naive `i += stride` would overflow i32 here and loop forever or write garbage."""
    kb = KB("ends")
    O = kb.buf("out", i32)
    B, E = kb.arg("begin", i32), kb.arg("end", i32)
    b, i = kb.range(B, E)
    store(b, O, b.sub(i, arg(b, B)), i)
    _, res = compile_run(kb.kernel(), [np.full(1001, 7, I32)], [begin, begin + 1000], groups=65535)
    want = np.append(np.arange(begin, begin + 1000, dtype=np.int64), 7).astype(I32)
    np.testing.assert_array_equal(res.buffers[0], want)
    _, res = compile_run(kb.kernel(), [np.full(4, 7, I32)], [5, -5])      # empty range: no thread runs
    np.testing.assert_array_equal(res.buffers[0], 7)


def test_results_do_not_depend_on_dispatch_shape_and_block_dim():
    kb = KB("shape")
    X, O = kb.buf("x", f32), kb.buf("out", f32)
    b, i = kb.range(0, 5000, block_dim=64)
    store(b, O, i, b.add(b.mul(load(b, X, i), load(b, X, i)), b.emit(Op.RANDOM, (), f32)))
    kb.seed()
    k = kb.kernel()
    x = np.linspace(-1, 1, 5000).astype(F32)
    ck, r1 = compile_run(k, [x, np.zeros(5000, F32)], [np.uint32(3)], groups=1)
    assert ck.tasks[0].workgroup_size == 64 and "@workgroup_size(64)" in ck.tasks[0].wgsl
    _, r2 = compile_run(k, [x, np.zeros(5000, F32)], [np.uint32(3)], groups=1000)
    np.testing.assert_array_equal(r1.buffers[1], r2.buffers[1])
    assert np.all((r1.buffers[1] - x * x >= 0) & (r1.buffers[1] - x * x < 1))


def test_serial_task_return_value():
    kb = KB("ret")
    X = kb.buf("x", f32)
    b = kb.serial()
    s = b.alloca(f32, "s")
    b.store(s, b.const(0.0, f32))
    loop = b.range_for(b.const(0, i32), b.const(10, i32))
    with b.at(loop.blocks[0]):
        b.store(s, b.add(b.load(s), load(b, X, b.loop_index(loop))))
    b.emit(Op.RETURN, [b.load(s)])
    store(b, X, b.const(0, i32), b.const(-1.0, f32))   # after the return: never runs
    x = np.arange(10, dtype=F32)
    ck, res = compile_run(kb.kernel(ret=f32), [x])
    assert [s.kind for s in ck.tasks[0].bindings] == ["buffer", "ret"]
    assert res.ret.view(F32)[0] == 45.0 and res.buffers[0][0] == 0.0


# ---------------------------------------------------------------- atomics

@pytest.mark.parametrize("float_atomics", [True, False], ids=["native", "cas"])
def test_f32_atomic_add_contention_and_old_values(float_atomics):
    if float_atomics and not H.has_feature("shader-float32-atomic"):
        pytest.skip("adapter lacks shader-float32-atomic")
    n = 1_000_000
    kb = KB("count")
    Acc, Old = kb.buf("acc", f32), kb.buf("old", f32)
    b, i = kb.range(0, n)
    old = atomic(b, AtomicKind.ADD, Acc, b.const(0, i32), b.const(1.0, f32), name="before")
    store(b, Old, i, old)
    atomic(b, AtomicKind.SUB, Acc, b.const(1, i32), b.const(0.5, f32))
    ck, res = compile_run(kb.kernel(), [np.zeros(2, F32), np.zeros(n, F32)], float_atomics=float_atomics,
                          groups=4096)
    wgsl = ck.tasks[0].wgsl
    assert ("array<atomic<f32>>" in wgsl) == float_atomics
    assert ("atomicCompareExchangeWeak" in wgsl) != float_atomics
    assert res.buffers[0][0] == n and res.buffers[0][1] == -n / 2
    np.testing.assert_array_equal(np.sort(res.buffers[1]), np.arange(n, dtype=F32))


@pytest.mark.parametrize("float_atomics", [True, False], ids=["native-flag", "cas"])
def test_f32_atomic_min_max_use_compare_exchange(float_atomics):
    rng = np.random.default_rng(1)
    v = rng.normal(0, 100, 200_000).astype(F32)
    kb = KB("minmax")
    V, Acc, Old = kb.buf("v", f32), kb.buf("acc", f32), kb.buf("olds", f32)
    b, i = kb.range(0, len(v))
    x = load(b, V, i)
    atomic(b, AtomicKind.MIN, Acc, b.const(0, i32), x)
    atomic(b, AtomicKind.MAX, Acc, b.const(1, i32), x)
    store(b, Old, i, atomic(b, AtomicKind.ADD, Acc, b.const(2, i32), b.const(2.0, f32)))
    acc = np.array([np.inf, -np.inf, 0.0], F32)
    ck, res = compile_run(kb.kernel(), [v, acc, np.zeros(len(v), F32)], float_atomics=float_atomics)
    assert "array<atomic<u32>>" in ck.tasks[0].wgsl   # min/max force emulation for the whole buffer
    assert res.buffers[1][0] == v.min() and res.buffers[1][1] == v.max()
    assert res.buffers[1][2] == 2 * len(v)
    np.testing.assert_array_equal(np.sort(res.buffers[2]), 2 * np.arange(len(v), dtype=F32))


def test_emulated_float_atomic_on_nan_terminates():
    """The compare-exchange loop compares bits, so a NaN in memory (NaN != NaN) cannot spin forever."""
    kb = KB("nan")
    Acc = kb.buf("acc", f32)
    b, i = kb.range(0, 10_000)
    atomic(b, AtomicKind.ADD, Acc, b.const(0, i32), b.const(1.0, f32))
    atomic(b, AtomicKind.MAX, Acc, b.const(1, i32), b.cast(i, f32))
    _, res = compile_run(kb.kernel(), [np.array([np.nan, np.nan], F32)], float_atomics=False)
    assert np.isnan(res.buffers[0][0])


def test_int_atomics():
    n = 1_000_000
    kb = KB("ints")
    C, Old, Bits = kb.buf("counter", i32), kb.buf("old", i32), kb.buf("bits", u32)
    b, i = kb.range(0, n)
    store(b, Old, i, atomic(b, AtomicKind.ADD, C, b.const(0, i32), b.const(1, i32)))
    atomic(b, AtomicKind.SUB, C, b.const(1, i32), b.const(3, i32))
    atomic(b, AtomicKind.MAX, C, b.const(2, i32), i)
    atomic(b, AtomicKind.MIN, C, b.const(3, i32), b.sub(b.const(0, i32), i))
    iu = b.cast(i, u32)
    atomic(b, AtomicKind.OR, Bits, b.const(0, i32), b.emit(Op.SHL, [b.const(1, u32), b.emit(Op.BIT_AND, [iu, b.const(15, u32)])]))
    atomic(b, AtomicKind.AND, Bits, b.const(1, i32), b.emit(Op.BIT_NOT, [b.emit(Op.SHL, [b.const(1, u32), b.emit(Op.MOD, [iu, b.const(7, u32)])])]))
    atomic(b, AtomicKind.XOR, Bits, b.const(2, i32), iu)
    _, res = compile_run(kb.kernel(), [np.zeros(4, I32), np.zeros(n, I32), np.array([0, 2**32 - 1, 0], U32)],
                         groups=4096)
    assert list(res.buffers[0]) == [n, -3 * n, n - 1, -(n - 1)]
    np.testing.assert_array_equal(np.sort(res.buffers[1]), np.arange(n, dtype=I32))
    xor = np.bitwise_xor.reduce(np.arange(n, dtype=U32))
    assert list(res.buffers[2]) == [0xFFFF, (2**32 - 1) & ~0x7F, xor]


@pytest.mark.parametrize("float_atomics", [True, False], ids=["native", "cas"])
def test_subgroup_aggregated_adds_to_elements_every_thread_shares(float_atomics):
    """Atomic adds whose old value is unused and whose element is the same in every thread (a
    constant, or a serial loop's index: the j of a pair sum) go through the subgroup helper: one
    atomic per subgroup. Counts and sums of small integers are exact in f32, so every element is
    checked exactly, through f32, i32 and u32 buffers, with add and sub; the thread count is no
    multiple of any subgroup size, so the last subgroup is partial."""
    if not H.has_feature("subgroup"):
        pytest.skip("adapter lacks subgroup operations")
    if float_atomics and not H.has_feature("shader-float32-atomic"):
        pytest.skip("adapter lacks shader-float32-atomic")
    n, m = 20_003, 7
    kb = KB("agg")
    One, Row, Mod, Each = kb.buf("one", f32), kb.buf("row", f32), kb.buf("mod3", i32), kb.buf("each", u32)
    b, i = kb.range(0, n)
    fi = b.cast(b.emit(Op.MOD, [i, b.const(5, i32)]), f32)
    atomic(b, AtomicKind.ADD, One, b.const(0, i32), fi)
    atomic(b, AtomicKind.SUB, One, b.const(1, i32), b.const(1.0, f32))
    atomic(b, AtomicKind.ADD, Each, i, b.const(3, u32))            # a different element per thread
    loop = b.range_for(b.const(0, i32), b.const(m, i32))
    with b.at(loop.blocks[0]):
        k = b.loop_index(loop)
        atomic(b, AtomicKind.ADD, Row, k, b.mul(fi, b.cast(k, f32)))
        atomic(b, AtomicKind.ADD, Mod, b.emit(Op.MOD, [b.add(k, b.const(1, i32)), b.const(3, i32)]), b.const(2, i32))
    bufs = [np.zeros(2, F32), np.zeros(m, F32), np.zeros(3, I32), np.zeros(n, U32)]
    ck, res = compile_run(kb.kernel(), bufs, float_atomics=float_atomics, subgroups=True, groups=13)
    wgsl = ck.tasks[0].wgsl
    assert wgsl.count("subgroupAdd(operand)") == 4 and "subgroupAll(elem == first)" in wgsl
    assert "subgroup_add_each" not in wgsl     # thread-dependent elements keep the plain atomic
    ii = np.arange(n)
    assert res.buffers[0][0] == (ii % 5).sum() and res.buffers[0][1] == -n
    np.testing.assert_array_equal(res.buffers[1], (ii % 5).sum() * np.arange(m, dtype=F32))
    np.testing.assert_array_equal(res.buffers[2], np.bincount((np.arange(m) + 1) % 3) * 2 * n)
    np.testing.assert_array_equal(res.buffers[3], np.full(n, 3, U32))


def test_subgroup_helper_only_for_adds_whose_old_value_is_unused():
    kb = KB("old")
    Acc, Old = kb.buf("acc", i32), kb.buf("old", i32)
    b, i = kb.range(0, 1000)
    store(b, Old, i, atomic(b, AtomicKind.ADD, Acc, b.const(0, i32), b.const(1, i32)))  # old value used
    atomic(b, AtomicKind.MAX, Acc, b.const(1, i32), i)                                  # not an add
    atomic(b, AtomicKind.ADD, Acc, b.const(2, i32), b.const(1, i32))
    with_sg = generate(kb.kernel(), float_atomics=False, debug=False, subgroups=True).tasks[0].wgsl
    without = generate(kb.kernel(), float_atomics=False, debug=False).tasks[0].wgsl
    assert with_sg.count("subgroup_add_acc(") == 2   # its definition and the one call
    assert "atomicAdd(&acc[0i], 1i)" in with_sg and "atomicMax(&acc[1i], " in with_sg
    assert "subgroup" not in without


def test_plain_access_to_an_atomic_buffer_in_the_same_task():
    import wgpu_ad
    native = wgpu_ad.get_runtime().has_float_atomics  # (the native path needs shader-float32-atomic)
    for float_atomics in (True, False) if native else (False,):
        kb = KB("mixed")
        Acc, Out = kb.buf("acc", f32), kb.buf("out", f32)
        b, i = kb.range(0, 100)
        slot = b.add(i, b.const(1, i32))
        store(b, Acc, slot, b.cast(i, f32))
        atomic(b, AtomicKind.ADD, Acc, b.const(0, i32), b.const(1.0, f32))
        store(b, Out, i, load(b, Acc, slot))
        _, res = compile_run(kb.kernel(), [np.zeros(101, F32), np.zeros(100, F32)], float_atomics=float_atomics)
        assert res.buffers[0][0] == 100
        np.testing.assert_array_equal(res.buffers[1], np.arange(100, dtype=F32))


def test_vector_view_only_for_element_and_component_addresses():
    """A read-only buffer of vec2 elements is declared array<vec2<f32>> when every load's address
    is element * 2 + component with the component in [0, 2); an address like i * 2 + 2 (the next
    element's first component, written that way) keeps the scalar array. Values as NumPy's."""
    src = np.arange(40, dtype=F32) * 0.5
    for offset, view in ((1, True), (2, False)):
        kb = KB("vec")
        X, Out = kb.buf("x", f32), kb.buf("out", f32)
        X.vector = 2
        b, i = kb.range(0, 19)
        base = b.mul(i, b.const(2, i32))
        store(b, Out, i, b.add(load(b, X, base), load(b, X, b.add(base, b.const(offset, i32)))))
        ck, res = compile_run(kb.kernel(), [src, np.zeros(19, F32)])
        assert ("array<vec2<f32>>" in ck.tasks[0].wgsl) == view
        np.testing.assert_array_equal(res.buffers[1], src[0:38:2] + src[offset:38 + offset:2])


# ---------------------------------------------------------------- random numbers

def _random_kernel(dtype=f32, draws=2):
    kb = KB("rand")
    outs = [kb.buf(f"r{k}", dtype) for k in range(draws)]
    N = kb.arg("n", i32)
    kb.seed()
    b, i = kb.range(0, N)
    for o in outs:
        store(b, o, i, b.emit(Op.RANDOM, (), dtype))
    return kb.kernel()


def test_random_f32_uniform_and_seeded():
    n = 200_000
    k = _random_kernel()
    zeros = [np.zeros(n, F32), np.zeros(n, F32)]
    _, r1 = compile_run(k, zeros, [n, np.uint32(1)])
    _, r1b = compile_run(k, zeros, [n, np.uint32(1)], groups=7)
    _, r2 = compile_run(k, zeros, [n, np.uint32(2)])
    a, a2 = r1.buffers
    assert a.min() >= 0 and a.max() < 1
    assert abs(a.mean() - 0.5) < 0.005 and abs(a.std() - np.sqrt(1 / 12)) < 0.005
    assert abs(np.corrcoef(a[:-1], a[1:])[0, 1]) < 0.01 and abs(np.corrcoef(a, a2)[0, 1]) < 0.01
    assert np.mean(a == a2) < 0.001 and np.mean(a == r2.buffers[0]) < 0.001
    np.testing.assert_array_equal(a, r1b.buffers[0])      # same seed: same numbers, any dispatch
    assert len(np.unique(a)) > 0.99 * n


def test_random_in_a_serial_task_with_a_loop():
    kb = KB("rand_serial")
    O = kb.buf("out", f32)
    kb.seed()
    b = kb.serial()
    loop = b.range_for(b.const(0, i32), b.const(4000, i32))
    with b.at(loop.blocks[0]):
        store(b, O, b.loop_index(loop), b.emit(Op.RANDOM, (), f32))
    k = kb.kernel()
    _, r1 = compile_run(k, [np.zeros(4000, F32)], [np.uint32(11)])
    _, r2 = compile_run(k, [np.zeros(4000, F32)], [np.uint32(12)])
    a = r1.buffers[0]
    assert a.min() >= 0 and a.max() < 1 and abs(a.mean() - 0.5) < 0.02 and len(np.unique(a)) > 3990
    assert np.mean(a == r2.buffers[0]) < 0.01


@pytest.mark.parametrize("dtype", [u32, i32])
def test_random_int_bits(dtype):
    n = 50_000
    _, res = compile_run(_random_kernel(dtype, 1), [np.zeros(n, dtype.np)], [n, np.uint32(9)])
    bits = np.unpackbits(res.buffers[0].view(np.uint8))
    assert abs(bits.mean() - 0.5) < 0.005
    if dtype == i32:
        assert (res.buffers[0] < 0).any() and (res.buffers[0] > 0).any()


# ---------------------------------------------------------------- asserts

def _assert_kernel():
    kb = KB("checked")
    X, O = kb.buf("x", f32), kb.buf("out", i32)
    b, i = kb.range(0, 1000)
    ok = b.lt(i, b.const(2000, i32))
    b.emit(Op.ASSERT, [ok, i], None, "never fails {}")
    x = load(b, X, i, name="x")
    b.emit(Op.ASSERT, [b.lt(x, b.const(900.0, f32)), i, x, b.lt(i, b.const(0, i32))], None,
           "x[{}] = {} too big ({})")
    store(b, O, i, b.const(1, i32))
    return kb.kernel()


def test_assert_reports_index_and_values_in_debug_mode():
    x = np.arange(1000, dtype=F32)
    ck, res = compile_run(_assert_kernel(), [x, np.zeros(1000, I32)], debug=True)
    assert ck.asserts == [("never fails {}", [i32]), ("x[{}] = {} too big ({})", [i32, f32, u1])]
    assert [b.kind for b in ck.tasks[0].bindings] == ["buffer", "buffer", "error"]
    err = res.error
    assert err[0] == 2
    i = int(err[1].view(I32))
    assert 900 <= i < 1000 and err[2].view(F32) == x[i] and err[3] == 0
    out = res.buffers[1]
    assert out[:900].all() and not out[900:].any()       # failing threads stopped before the store


def test_asserts_are_dropped_without_debug():
    x = np.arange(1000, dtype=F32)
    ck, res = compile_run(_assert_kernel(), [x, np.zeros(1000, I32)], debug=False)
    assert ck.asserts == [] and res.error is None
    assert "report_error" not in ck.tasks[0].wgsl
    assert res.buffers[1].all()


# ---------------------------------------------------------------- bindings, names, text

def test_binding_contract_and_readable_names():
    kb = KB("contract")
    X, G, _, Y = kb.buf("x", f32), kb.buf("x.grad", f32), kb.buf("unused", f32), kb.buf("y", i32)
    N, S = kb.arg("n", i32), kb.arg("scale", f32)
    b, i = kb.range(0, N)
    v = load(b, X, i, name="v")
    v2 = b.emit(Op.MUL, [v, arg(b, S)], name="v")
    store(b, G, i, v2)
    s = kb.serial()
    store(s, Y, s.const(0, i32), s.const(3, i32))
    k = kb.kernel()
    ck = generate(k, float_atomics=False, debug=False)
    assert ck.arg_words == 2 and ck.plan.buffers == tuple(plan.Arg(j) for j in range(4)) and ck.ret_dtype is None
    t0, t1 = ck.tasks
    assert [(b.binding, b.kind, b.key, b.read_only) for b in t0.bindings] == \
        [(0, "args", -1, False), (1, "buffer", 0, True), (2, "buffer", 1, False)]
    assert [(b.kind, b.key, b.read_only) for b in t1.bindings] == [("buffer", 3, False)]
    assert t1.serial and not t0.serial and t1.workgroup_size == 1 and t0.workgroup_size == 128
    w = t0.wgsl
    assert w.startswith("// wgpu_ad kernel contract, task 0 (range)")
    assert "var<storage, read> x: array<f32>;" in w and "var<storage, read_write> x_grad: array<f32>;" in w
    assert "let v = x[i];" in w and "let v_1 = v * args.scale;" in w and "x_grad[i] = v_1;" in w
    assert "// forward" in w and "unused" not in w
    assert "args" not in t1.wgsl
    text = format_wgsl(k)
    assert text.count("fn main(") == 2 and "task 1 (serial)" in text
    # deterministic: the same kernel gives the same text
    assert generate(k, float_atomics=False, debug=False).tasks[0].wgsl == w
    x = np.arange(8, dtype=F32)
    res = H.run(ck, [x, np.zeros(8, F32), np.zeros(1, F32), np.zeros(1, I32)], [8, 2.5])
    np.testing.assert_array_equal(res.buffers[1], x * 2.5)
    assert res.buffers[3][0] == 3


def test_names_are_valid_and_unique():
    kb = KB("names")
    O = kb.buf("loop", f32)            # a WGSL keyword as a buffer name
    b, i = kb.range(0, 4)
    vals = [b.emit(Op.ADD, [b.cast(i, f32), b.const(float(k), f32)], name=nm)
            for k, nm in enumerate(["x", "x", "__y", "2d", "min", "é", "fn"])]
    acc = vals[0]
    for v in vals[1:]:
        acc = b.add(acc, v)
    store(b, O, i, acc)
    ck, res = compile_run(kb.kernel(), [np.zeros(4, F32)])
    w = ck.tasks[0].wgsl
    lets = re.findall(r"let (\w+) =", w)
    assert len(lets) == len(set(lets))
    for name in ("loop_", "x", "x_1", "y", "v2d", "min_", "fn_"):
        assert re.search(rf"\b{name}\b", w), name
    np.testing.assert_array_equal(res.buffers[0], 7 * np.arange(4) + 21)


def test_unsupported_atomic_is_a_clear_error():
    kb = KB("bad")
    A = kb.buf("a", f32)
    b, i = kb.range(0, 4)
    atomic(b, AtomicKind.XOR, A, i, b.const(1.0, f32))
    with pytest.raises(Exception, match=r"atomic xor needs an integer buffer, 'a' holds f32"):
        generate(kb.kernel(), float_atomics=True, debug=False)
