"""Reverse mode through serial loops with mutable locals: the programs of Taichi's own
test_ad_for.py (loops over field-read and argument trip counts, nested and stacked loops, locals
updated at several levels, loops in ti.func), plus what Taichi refuses and wgpu_ad supports
(while, break, continue), deep nests, zero and long trip counts, the autodiff stack limit,
kernel-scope values, branches and serial tasks. Every gradient is checked against float64 NumPy
central differences of an equivalent NumPy program."""
from __future__ import annotations

import numpy as np
import pytest

import wgpu_ad as ti
from ad_util import assert_grad, central_diffs, f32

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def small_ad_stack():
    """Dynamic-trip-count loops get stacks of ad_stack_size entries; lavapipe compiles a shader
    with the default 1024-entry private arrays in about a minute when its cache is cold, so these
    tests (at most a few dozen iterations) use 32. Tests that need another size call ti.init."""
    ti.init(ad_stack_size=32)


def check_program(kernel, inputs, outputs, program, args=(), seed=0, rtol=1e-4):
    """Run `kernel(*args)` on `inputs` [(field, array)], seed every output field's gradient, run
    kernel.grad and compare the forward outputs with `program(*float64 inputs)` (a list, one
    array per output) and every input's gradient with central differences of
    sum(seed * program(...))."""
    r = np.random.default_rng(seed)
    for f, v in inputs:
        f.from_numpy(f32(v))
    kernel(*args)
    seeds = [r.uniform(0.5, 1.5, f.shape + f.element_shape) * r.choice([-1.0, 1.0], f.shape + f.element_shape)
             for f in outputs]
    for f, s in zip(outputs, seeds):
        f.grad.from_numpy(f32(s))
    kernel.grad(*args)
    xs = [f32(v).astype(np.float64) for _, v in inputs]
    want = program(*xs)
    for f, w in zip(outputs, want):
        np.testing.assert_allclose(f.to_numpy(), w, rtol=rtol, atol=rtol * max(1.0, float(np.abs(w).max())),
                                   err_msg=f"forward value of {f}")
    refs = central_diffs(lambda *v: sum(float(np.sum(s * o)) for s, o in zip(seeds, program(*v))), xs)
    for (f, _), g in zip(inputs, refs):
        if f.needs_grad:
            assert_grad(f.grad.to_numpy(), g, rtol=rtol, what=f"gradient of {f}")


def grad_field(n):
    return ti.field(ti.f32, shape=n, needs_grad=True)


# ---- Taichi's test_ad_for programs ------------------------------------------------------------
@pytest.mark.parametrize("form", ["assign", "augmented"])
def test_sum_with_trip_count_from_field(form):
    n = 10
    a, p = grad_field(n), grad_field(n)
    b = ti.field(ti.i32, shape=n)

    @ti.kernel
    def assign():
        for i in range(n):
            ret = 1.0
            for j in range(b[i]):
                ret = ret + a[i]
            p[i] = ret

    @ti.kernel
    def augmented():
        for i in range(n):
            ret = 1.0
            for j in range(b[i]):
                ret += a[i]
            p[i] = ret

    bv = np.arange(n)
    b.from_numpy(bv.astype(np.int32))
    check_program(assign if form == "assign" else augmented,
                  [(a, np.random.default_rng(1).uniform(1, 4, n))], [p], lambda a_: [1 + bv * a_])


def test_power_by_repeated_multiplication():
    n = 10
    a, p = grad_field(n), grad_field(n)
    b = ti.field(ti.i32, shape=n)

    @ti.kernel
    def power():
        for i in range(n):
            ret = 1.0
            for j in range(b[i]):
                ret = ret * a[i]
            p[i] = ret

    bv = np.arange(n)
    b.from_numpy(bv.astype(np.int32))
    check_program(power, [(a, np.random.default_rng(2).uniform(0.8, 1.25, n))], [p], lambda a_: [a_ ** bv])


def test_fibonacci_with_tuple_assignment():
    n = 12
    a, b, f = grad_field(n), grad_field(n), grad_field(n)
    c = ti.field(ti.i32, shape=n)

    @ti.kernel
    def fib():
        for i in range(n):
            p = a[i]
            q = b[i]
            for j in range(c[i]):
                p, q = q, p + q
            f[i] = q

    cv = np.arange(n)
    c.from_numpy(cv.astype(np.int32))

    def program(a_, b_):
        out = np.zeros(n)
        for i in range(n):
            p, q = a_[i], b_[i]
            for _ in range(cv[i]):
                p, q = q, p + q
            out[i] = q
        return [out]
    r = np.random.default_rng(3)
    check_program(fib, [(a, r.uniform(0, 1, n)), (b, r.uniform(0, 1, n))], [f], program)


def test_integer_locals_as_indices_across_two_loops():
    """Integer fibonacci numbers index the fields (test_ad_fibonacci_index); a second parallel
    loop reads what the first accumulated."""
    n, m = 5, 10
    a, b = grad_field(m), grad_field(m)
    f = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def fib():
        for i in range(n):
            p = 0
            q = 1
            for j in range(5):
                p, q = q, p + q
                b[q] += a[q] * a[q]
        for i in range(m):
            f[None] += ti.sin(b[i])

    def program(a_):
        bb = np.zeros(m)
        for _ in range(n):
            p, q = 0, 1
            for _ in range(5):
                p, q = q, p + q
                bb[q] += a_[q] ** 2
        return [bb, np.sin(bb).sum()]
    check_program(fib, [(a, np.random.default_rng(4).uniform(0.1, 0.5, m))], [b, f], program)


def test_integer_local_pointer_into_a_field():
    """test_ad_global_ptr: an integer local walks along a field inside the loop."""
    n = 5
    a, b = grad_field(n), grad_field(n)
    f = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def walk():
        for i in range(n):
            p = 0
            for j in range(n):
                b[i] += a[p] ** 2 * (i + 1)
                p += 1
        for i in range(n):
            f[None] += b[i]

    def program(a_):
        bb = np.array([np.sum(a_ ** 2) * (i + 1) for i in range(n)])
        return [bb, bb.sum()]
    check_program(walk, [(a, np.random.default_rng(5).uniform(-1, 1, n))], [b, f], program)


def test_global_accumulation_in_a_loop_then_overwrite():
    """test_ib_global_load: p[i] is accumulated in an inner loop, then overwritten by a value
    that depends on a (read before the loop); only the last store carries a gradient."""
    n = 10
    a, p = grad_field(n), grad_field(n)
    b = ti.field(ti.i32, shape=n)

    @ti.kernel
    def compute():
        for i in range(n):
            val = a[i]
            for j in range(b[i]):
                p[i] += i
            p[i] = val * i + ti.sin(val)

    b.from_numpy(np.full(n, 2, np.int32))
    ii = np.arange(n)
    check_program(compute, [(a, np.random.default_rng(24).uniform(-1, 1, n))], [p],
                  lambda a_: [a_ * ii + np.sin(a_)])


def test_integer_loop_carried_weight():
    """test_integer_stack: an i32 local multiplied in the loop weighs the f32 sum."""
    n = 5
    a, b, f = grad_field(n), grad_field(n), grad_field(n)
    c = ti.field(ti.i32, shape=n)

    @ti.kernel
    def int_stack():
        for i in range(n):
            weight = 1
            s = 0.0
            for j in range(c[i]):
                s += weight * a[i] + b[i]
                weight *= 10
            f[i] = s

    cv = np.arange(n)
    c.from_numpy(cv.astype(np.int32))

    def program(a_, b_):
        out = np.zeros(n)
        for i in range(n):
            s, wt = 0.0, 1
            for _ in range(cv[i]):
                s += wt * a_[i] + b_[i]
                wt *= 10
            out[i] = s
        return [out]
    r = np.random.default_rng(6)
    check_program(int_stack, [(a, r.uniform(0.5, 1.5, n)), (b, r.uniform(0.5, 1.5, n))], [f], program)


def test_two_stacked_loops_sharing_a_local():
    """test_double_for_loops: the first loop's result is carried into the second."""
    n = 5
    a, b, f = grad_field(n), grad_field(n), grad_field(n)
    c = ti.field(ti.i32, shape=n)

    @ti.kernel
    def double_for():
        for i in range(n):
            weight = 1.0
            for j in range(c[i]):
                weight *= a[i]
            s = 0.0
            for j in range(c[i] * 2):
                s += weight + b[i]
            f[i] = s

    cv = np.arange(n)
    c.from_numpy(cv.astype(np.int32))
    r = np.random.default_rng(7)
    check_program(double_for, [(a, r.uniform(1.5, 2.5, n)), (b, r.uniform(0.5, 1.5, n))], [f],
                  lambda a_, b_: [2 * cv * (a_ ** cv + b_)])


def test_loops_nested_under_a_serial_loop():
    """test_double_for_loops_more_nests: parallel i, serial k, then two stacked loops with a
    trip count read from a 2-D field."""
    n = 6
    a, b = grad_field(n), grad_field(n)
    c = ti.field(ti.i32, shape=(n, n // 2))
    f = ti.field(ti.f32, shape=(n, n // 2), needs_grad=True)

    @ti.kernel
    def double_for():
        for i in range(n):
            for k in range(n // 2):
                weight = 1.0
                for j in range(c[i, k]):
                    weight *= a[i]
                s = 0.0
                for j in range(c[i, k] * 2):
                    s += weight + b[i]
                f[i, k] = s

    cv = np.add.outer(np.arange(n), np.arange(n // 2))
    c.from_numpy(cv.astype(np.int32))
    r = np.random.default_rng(8)
    check_program(double_for, [(a, r.uniform(0.8, 1.2, n)), (b, r.uniform(0.5, 1.5, n))], [f],
                  lambda a_, b_: [2 * cv * (a_[:, None] ** cv + b_[:, None])])


def test_loop_body_with_several_updates_of_a_local():
    """test_complex_body (without the f64 casts): weight is rewritten twice per iteration."""
    n = 5
    a, f = grad_field(n), grad_field(n)
    g = ti.field(ti.f32, shape=n)
    c = ti.field(ti.i32, shape=n)

    @ti.kernel
    def complex_body():
        for i in range(n):
            weight = 2.0 * a[i]
            tot = 0.0
            tot_weight = 0.0
            for j in range(c[i]):
                tot_weight += weight + 1
                tot += (weight + 1) * a[i]
                weight = weight + 1
                weight = weight * 0.5
                weight = ti.cast(weight, ti.f32)
            g[i] = tot_weight
            f[i] = tot

    cv = np.arange(n)
    c.from_numpy(cv.astype(np.int32))

    def program(a_):
        out = np.zeros(n)
        for i in range(n):
            wt, tot = 2 * a_[i], 0.0
            for _ in range(cv[i]):
                tot += (wt + 1) * a_[i]
                wt = (wt + 1) * 0.5
            out[i] = tot
        return [out]
    check_program(complex_body, [(a, np.random.default_rng(9).uniform(0.5, 1.5, n))], [f], program)


def test_triple_loop_with_offset_indices():
    """test_triple_for_loops_bls without the block-local cache."""
    n, m = 8, 3
    a = grad_field(n)
    b = grad_field(2 * n)
    f = ti.field(ti.f32, shape=(n - m, n), needs_grad=True)

    @ti.kernel
    def triple_for():
        for i in range(n - m):
            for k in range(n):
                weight = 1.0
                for j in range(m):
                    weight *= a[i + j]
                s = 0.0
                for j in range(2 * m):
                    s += weight + b[2 * i + j] * (k + 1)
                f[i, k] = s

    def program(a_, b_):
        out = np.zeros((n - m, n))
        for i in range(n - m):
            for k in range(n):
                wt = np.prod(a_[i:i + m])
                out[i, k] = sum(wt + b_[2 * i + j] * (k + 1) for j in range(2 * m))
        return [out]
    r = np.random.default_rng(10)
    check_program(triple_for, [(a, r.uniform(0.8, 1.2, n)), (b, r.uniform(0, 1, 2 * n))], [f], program)


def test_mixed_inner_loops():
    x = ti.field(ti.f32, shape=(), needs_grad=True)
    arr = ti.field(ti.f32, shape=5)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def mixed_inner_loops():
        for i in arr:
            loss[None] += ti.sin(x[None])
            for j in range(2):
                loss[None] += ti.sin(x[None]) + 1.0

    check_program(mixed_inner_loops, [(x, np.array(0.4))], [loss],
                  lambda x_: [5 * (np.sin(x_) + 2 * (np.sin(x_) + 1))])


def test_inner_loops_with_locals_reset_in_the_middle_loop():
    """test_inner_loops_local_variable (fixed stack size 32) and its deeper variant."""
    ti.init(ad_stack_size=32)
    x = ti.field(ti.f32, shape=(), needs_grad=True)
    arr = ti.field(ti.f32, shape=2, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    loss2 = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def local_in_middle():
        for i in arr:
            for j in range(3):
                s = 0.0
                t = 0.0
                for k in range(3):
                    s += ti.sin(x[None]) + 1.0
                    t += ti.sin(x[None]) * s
                loss[None] += s + t

    @ti.kernel
    def more_inner():
        for i in arr:
            for j in range(2):
                s = 0.0
                for k in range(3):
                    u = 0.0
                    s += ti.sin(x[None]) + 1.0
                    for l in range(2):
                        u += ti.sin(x[None]) * (u + 1.0)
                    loss2[None] += u
                loss2[None] += s * s

    def p1(x_):
        total = 0.0
        for _ in range(2 * 3):
            s = t = 0.0
            for _ in range(3):
                s += np.sin(x_) + 1
                t += np.sin(x_) * s
            total += s + t
        return [total]

    def p2(x_):
        total = 0.0
        for _ in range(2 * 2):
            s = 0.0
            for _ in range(3):
                u = 0.0
                s += np.sin(x_) + 1
                for _ in range(2):
                    u += np.sin(x_) * (u + 1)
                total += u
            total += s * s
        return [total]
    check_program(local_in_middle, [(x, np.array(0.3))], [loss], p1)
    x.grad[None] = 0.0
    check_program(more_inner, [(x, np.array(0.3))], [loss2], p2)


def test_stacked_inner_loops_with_locals():
    """test_stacked_(mixed_ib_and_non_ib_)inner_loops_local_variable."""
    x = ti.field(ti.f32, shape=(), needs_grad=True)
    arr = ti.field(ti.f32, shape=2)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def stacked():
        for i in arr:
            loss[None] += ti.sin(x[None])
            for j in range(3):
                for k in range(3):
                    loss[None] += ti.sin(x[None]) + 1.0
            for j in range(3):
                s = 0.0
                for k in range(3):
                    s += ti.sin(x[None]) * s + 1.0
                loss[None] += s
            for j in range(3):
                s = 0.0
                for k in range(3):
                    s += ti.cos(x[None]) + s
                loss[None] += s

    def program(x_):
        total = 0.0
        for _ in range(2):
            total += np.sin(x_) + 9 * (np.sin(x_) + 1)
            for _ in range(3):
                s = 0.0
                for _ in range(3):
                    s += np.sin(x_) * s + 1
                total += s
            for _ in range(3):
                s = 0.0
                for _ in range(3):
                    s += np.cos(x_) + s
                total += s
        return [total]
    check_program(stacked, [(x, np.array(0.6))], [loss], program)


def test_large_static_loop_nest_with_stack_size_one():
    """test_large_for_loops_fixed_stack_size, scaled down: static trip counts need no stack limit."""
    ti.init(ad_stack_size=1)
    x = ti.field(ti.f32, shape=(), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def large_loop():
        for i in range(5):
            for j in range(20):
                for k in range(10):
                    loss[None] += ti.sin(x[None]) + 1.0

    check_program(large_loop, [(x, np.array(0.2))], [loss], lambda x_: [1000 * (np.sin(x_) + 1)])


def test_multiple_inner_loops_count_every_addition():
    """The test_multiple_ib* family: sibling and nested serial loops adding x into y."""
    x = ti.field(ti.f32, shape=(), needs_grad=True)
    y = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def multiple_ib():
        for j in range(2):
            for i in range(3):
                y[None] += x[None]
            for i in range(3):
                y[None] += x[None]

    @ti.kernel
    def outermost_mixed():
        for j in range(2):
            for i in range(3):
                y[None] += x[None]
            for i in range(3):
                y[None] += x[None]
        for j in range(2):
            for i in range(3):
                y[None] += x[None]
            for i in range(3):
                y[None] += x[None]
                for ii in range(3):
                    y[None] += x[None]

    @ti.kernel
    def inner_mixed():
        for j in range(2):
            for i in range(3):
                y[None] += x[None]
            for i in range(3):
                for ii in range(2):
                    y[None] += x[None]
                for iii in range(2):
                    y[None] += x[None]
                    for iiii in range(2):
                        y[None] += x[None]
            for i in range(3):
                for ii in range(2):
                    for iii in range(2):
                        y[None] += x[None] * x[None]

    # counts of the additions, from the loop bounds: (linear, quadratic)
    for k, lin, quad in [(multiple_ib, 12, 0), (outermost_mixed, 42, 0), (inner_mixed, 2 * (3 + 6 + 6 + 12), 24)]:
        y[None] = 0.0
        x.grad[None] = 0.0
        check_program(k, [(x, np.array(1.3))], [y], lambda x_, lin=lin, quad=quad: [lin * x_ + quad * x_ * x_])


def test_triangular_inner_loops_per_element():
    """test_multiple_ib_deeper_non_scalar: trip counts are the parallel index."""
    n = 10
    x, y = grad_field(n), grad_field(n)

    @ti.kernel
    def compute_y():
        for j in range(n):
            for i in range(j):
                y[j] += x[j]
            for i in range(3):
                for ii in range(j):
                    y[j] += x[j] * ti.cast(ii, ti.f32)
            for i in range(3):
                for ii in range(2):
                    for iii in range(j):
                        y[j] += ti.sin(x[j])

    jj = np.arange(n)
    check_program(compute_y, [(x, np.random.default_rng(11).uniform(-1, 1, n))], [y],
                  lambda x_: [jj * x_ + 3 * x_ * jj * (jj - 1) / 2 + 6 * jj * np.sin(x_)])


# ---- loop forms Taichi refuses: while, break, continue -----------------------------------------
def test_while_loop_with_counter_from_field():
    n = 6
    x, y = grad_field(n), grad_field(n)
    c = ti.field(ti.i32, shape=n)

    @ti.kernel
    def halve():
        for i in x:
            s = x[i]
            k = 0
            while k < c[i]:
                s = s * 0.5 + ti.sin(s) * x[i]
                k += 1
            y[i] = s

    cv = np.arange(n)
    c.from_numpy(cv.astype(np.int32))

    def program(x_):
        out = x_.copy()
        for i in range(n):
            s = x_[i]
            for _ in range(cv[i]):
                s = s * 0.5 + np.sin(s) * x_[i]
            out[i] = s
        return [out]
    check_program(halve, [(x, np.random.default_rng(12).uniform(0.2, 1.0, n))], [y], program)


def test_while_loop_with_data_dependent_exit():
    """The trip count depends on x (locally constant, so the gradient is defined)."""
    n = 6
    x, y = grad_field(n), grad_field(n)

    @ti.kernel
    def grow():
        for i in x:
            s = x[i]
            while s < 3.0:
                s = s * 1.5 + x[i] * x[i]
            y[i] = s

    def program(x_):
        out = np.zeros(n)
        for i in range(n):
            s = x_[i]
            while s < 3.0:
                s = s * 1.5 + x_[i] ** 2
            out[i] = s
        return [out]
    xv = f32([0.1, 0.3, 0.5, 0.9, 1.4, 2.5])
    check_program(grow, [(x, xv)], [y], program)


def test_break_and_continue_in_a_for_loop():
    n = 8
    x, y = grad_field(n), grad_field(n)
    c = ti.field(ti.i32, shape=n)

    @ti.kernel
    def brk():
        for i in x:
            s = x[i]
            for j in range(10):
                if j >= c[i]:
                    break
                if j % 3 == 1:
                    continue
                s = s * x[i] + 0.1 * j
                if s > 4.0:
                    break
                s = ti.sin(s) + s
            y[i] = s

    cv = np.array([0, 1, 2, 4, 7, 10, 10, 10])
    c.from_numpy(cv.astype(np.int32))

    def program(x_):
        out = np.zeros(n)
        for i in range(n):
            s = x_[i]
            for j in range(10):
                if j >= cv[i]:
                    break
                if j % 3 == 1:
                    continue
                s = s * x_[i] + 0.1 * j
                if s > 4.0:
                    break
                s = np.sin(s) + s
            out[i] = s
        return [out]
    xv = f32([0.5, 0.9, 1.1, 0.7, 0.8, 1.05, 0.6, 1.3])
    check_program(brk, [(x, xv)], [y], program)


def test_break_and_continue_in_a_while_loop():
    n = 6
    x, y = grad_field(n), grad_field(n)

    @ti.kernel
    def w():
        for i in x:
            s = 0.0
            k = 0
            while True:
                k += 1
                if k > 12:
                    break
                if k % 2 == 0:
                    continue
                s += ti.cos(x[i] * k) * s + x[i]
                if s > 2.5:
                    break
            y[i] = s

    def program(x_):
        out = np.zeros(n)
        for i in range(n):
            s, k = 0.0, 0
            while True:
                k += 1
                if k > 12:
                    break
                if k % 2 == 0:
                    continue
                s += np.cos(x_[i] * k) * s + x_[i]
                if s > 2.5:
                    break
            out[i] = s
        return [out]
    xv = f32([0.05, 0.2, 0.35, 0.5, 0.8, 1.2])
    check_program(w, [(x, xv)], [y], program)


def test_continue_in_the_parallel_loop():
    n = 8
    x, y = grad_field(n), grad_field(n)

    @ti.kernel
    def skip():
        for i in x:
            y[i] = x[i]
            if x[i] < 0.0:
                continue
            y[i] = x[i] * x[i]

    xv = np.random.default_rng(13).uniform(-1, 1, n)
    check_program(skip, [(x, xv)], [y], lambda x_: [np.where(x_ < 0, x_, x_ * x_)])


# ---- loop shapes --------------------------------------------------------------------------------
def test_three_serial_loops_deep_with_locals_at_every_level():
    n = 4
    a, b, y = grad_field(n), grad_field(n), grad_field(n)

    @ti.kernel
    def deep():
        for i in a:
            s = a[i]
            for j in range(3):
                t = s * b[i]
                for k in range(2):
                    u = t + 0.1 * k
                    for l in range(j + 1):
                        u = ti.sin(u) * a[i] + 0.2
                    t += u * 0.5
                s = s * 0.7 + t * 0.3
            y[i] = s

    def program(a_, b_):
        out = np.zeros(n)
        for i in range(n):
            s = a_[i]
            for j in range(3):
                t = s * b_[i]
                for k in range(2):
                    u = t + 0.1 * k
                    for _ in range(j + 1):
                        u = np.sin(u) * a_[i] + 0.2
                    t += u * 0.5
                s = s * 0.7 + t * 0.3
            out[i] = s
        return [out]
    r = np.random.default_rng(14)
    check_program(deep, [(a, r.uniform(-1, 1, n)), (b, r.uniform(-1, 1, n))], [y], program)


def test_local_updated_in_inner_and_outer_loops():
    n = 5
    a, b, y = grad_field(n), grad_field(n), grad_field(n)

    @ti.kernel
    def k():
        for i in a:
            s = 1.0
            for j in range(4):
                s = s * a[i]
                for m in range(j):
                    s += b[i] * m
                s = ti.sin(s)
            y[i] = s

    def program(a_, b_):
        out = np.zeros(n)
        for i in range(n):
            s = 1.0
            for j in range(4):
                s = s * a_[i]
                for m in range(j):
                    s += b_[i] * m
                s = np.sin(s)
            out[i] = s
        return [out]
    r = np.random.default_rng(15)
    check_program(k, [(a, r.uniform(-1.5, 1.5, n)), (b, r.uniform(-1, 1, n))], [y], program)


def test_trip_count_from_kernel_argument_including_zero():
    n = 5
    x, y = grad_field(n), grad_field(n)

    @ti.kernel
    def k(m: ti.i32, lo: ti.i32):
        for i in x:
            s = x[i]
            for j in range(lo, m):
                s = s * 0.8 + ti.sin(x[i] * j)
            y[i] = s

    def program(m, lo):
        def p(x_):
            s = x_.copy()
            for j in range(lo, m):
                s = s * 0.8 + np.sin(x_ * j)
            return [s]
        return p
    xv = np.random.default_rng(16).uniform(-1, 1, n)
    for m, lo in [(6, 0), (7, 3), (0, 0), (2, 5)]:   # the last two run no iteration
        x.grad.fill(0.0)
        check_program(k, [(x, xv)], [y], program(m, lo), args=(m, lo))


def test_long_static_loop():
    n = 4
    x, y = grad_field(n), grad_field(n)

    @ti.kernel
    def relax():
        for i in x:
            s = 0.0
            for j in range(500):
                s = s * 0.99 + 0.01 * ti.sin(s + x[i])
            y[i] = s

    def program(x_):
        s = np.zeros(n)
        for _ in range(500):
            s = s * 0.99 + 0.01 * np.sin(s + x_)
        return [s]
    check_program(relax, [(x, np.random.default_rng(17).uniform(-1, 1, n))], [y], program)


def test_loop_in_a_func():
    n = 6
    x, c, y = grad_field(n), grad_field(4), grad_field(n)

    @ti.func
    def horner(t, deg):
        r = 0.0
        for k in range(deg):
            r = r * t + c[k]
        return r

    @ti.kernel
    def poly(deg: ti.i32):
        for i in x:
            y[i] = horner(x[i], deg) + horner(ti.sin(x[i]), 2)

    def program(x_, c_):
        def h(t, deg):
            r = 0.0
            for k in range(deg):
                r = r * t + c_[k]
            return r
        return [h(x_, 4) + h(np.sin(x_), 2)]
    r = np.random.default_rng(18)
    check_program(poly, [(x, r.uniform(-1, 1, n)), (c, r.uniform(-1, 1, 4))], [y], program, args=(4,))


def test_trip_count_from_a_field_over_the_stack_size_raises():
    """A trip count read from a field is unknown when the launch is prepared: the stack holds
    ti.init(ad_stack_size=N) entries, and a longer loop is an error, not a wrong gradient."""
    ti.init(ad_stack_size=8)
    n = 4
    x, y = grad_field(n), grad_field(n)
    c = ti.field(ti.i32, shape=n)

    @ti.kernel
    def k():
        for i in x:
            s = x[i]
            for j in range(c[i]):
                s = s * 0.9 + x[i]
            y[i] = s

    x.from_numpy(f32(np.linspace(0.1, 0.4, n)))
    y.grad.fill(1.0)
    c.from_numpy(np.array([0, 3, 8, 5], np.int32))
    k()
    k.grad()  # 8 iterations: exactly the capacity
    assert_grad(x.grad.to_numpy(), [sum(0.9 ** j for j in range(t + 1)) for t in (0, 3, 8, 5)])
    c.from_numpy(np.array([0, 3, 9, 5], np.int32))
    k()
    with pytest.raises(ti.KernelRuntimeError) as e:
        k.grad()
    msg = str(e.value)
    assert "ad_stack_size" in msg and "more than 8 iterations" in msg, msg


def test_trip_count_from_an_argument_may_exceed_the_stack_size():
    """An argument-bound loop's stack is sized from the launch's arguments."""
    ti.init(ad_stack_size=4)
    n = 3
    x, y = grad_field(n), grad_field(n)

    @ti.kernel
    def k(m: ti.i32):
        for i in x:
            s = x[i]
            for j in range(m):
                s = s * 0.9 + x[i]
            y[i] = s

    x.from_numpy(f32([0.2, -0.3, 0.5]))
    for m in (3, 13):
        x.grad.fill(0.0)
        check_program(k, [(x, [0.2, -0.3, 0.5])], [y], lambda x_, m=m: [x_ * sum(0.9 ** j for j in range(m + 1))],
                      args=(m,))


# ---- kernel scope, branches, serial tasks --------------------------------------------------------
def test_kernel_scope_values_used_inside_the_parallel_loop():
    n = 6
    x, y = grad_field(n), grad_field(n)
    c = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def scale():
        s = ti.sin(c[None]) * 2.0
        t = c[None] * c[None]
        for i in x:
            y[i] = x[i] * s + t

    r = np.random.default_rng(19)
    check_program(scale, [(x, r.uniform(-1, 1, n)), (c, np.array(0.7))], [y],
                  lambda x_, c_: [x_ * np.sin(c_) * 2 + c_ * c_])


@pytest.mark.parametrize("in_loop", [False, True])
def test_if_elif_else_with_differently_active_branches(in_loop):
    n = 8
    x, b, y = grad_field(n), grad_field(n), grad_field(n)

    @ti.kernel
    def branches():
        for i in x:
            v = 0.0
            if x[i] > 1.0:
                v = x[i] * x[i] * 3.0
            elif x[i] > 0.0:
                v = ti.sin(x[i]) + b[i]
            elif x[i] > -1.0:
                v = 2.5
            else:
                t = b[i] * x[i]
                v = t * t
            y[i] = v

    @ti.kernel
    def branches_in_loop():
        for i in x:
            v = x[i]
            for j in range(3):
                if v > 1.0:
                    v = v * 0.5 + b[i]
                elif v > 0.0:
                    v = ti.exp(v) * 0.8
                else:
                    v = v - 0.3 * j
            y[i] = v

    def p_flat(x_, b_):
        return [np.where(x_ > 1, 3 * x_ * x_, np.where(x_ > 0, np.sin(x_) + b_,
                                                       np.where(x_ > -1, 2.5, (b_ * x_) ** 2)))]

    def p_loop(x_, b_):
        out = np.zeros(n)
        for i in range(n):
            v = x_[i]
            for j in range(3):
                if v > 1.0:
                    v = v * 0.5 + b_[i]
                elif v > 0.0:
                    v = np.exp(v) * 0.8
                else:
                    v = v - 0.3 * j
            out[i] = v
        return [out]
    xv = [-1.7, -1.2, -0.6, -0.2, 0.3, 0.8, 1.3, 2.1]
    bv = np.random.default_rng(20).uniform(-1, 1, n)
    check_program(branches_in_loop if in_loop else branches, [(x, xv), (b, bv)], [y],
                  p_loop if in_loop else p_flat)


def test_serial_task_without_a_loop():
    x = grad_field(3)
    y = ti.field(ti.f32, shape=(), needs_grad=True)
    z = grad_field(2)

    @ti.kernel
    def serial():
        a = x[0] * x[1]
        if a > 0.0:
            a = ti.sqrt(a) + x[2]
        y[None] = ti.sin(a) * x[2]
        z[0] = a * a
        z[1] = ti.exp(x[1]) - a

    def program(x_):
        a = x_[0] * x_[1]
        if a > 0:
            a = np.sqrt(a) + x_[2]
        return [np.sin(a) * x_[2], np.array([a * a, np.exp(x_[1]) - a])]
    check_program(serial, [(x, [0.6, 0.9, -0.4])], [y, z], program)
    x.grad.fill(0.0)
    check_program(serial, [(x, [0.6, -0.9, 0.4])], [y, z], program)


def test_serial_loop_result_passed_through_a_field_to_the_parallel_loop():
    """A serialized top-level loop (its own serial task) feeds the parallel loop through a
    field: the gradient flows back across the two dispatches."""
    n = 5
    x, y = grad_field(n), grad_field(n)
    c = ti.field(ti.f32, shape=(), needs_grad=True)
    hist = grad_field(n)

    @ti.kernel
    def k():
        s = 0.0
        ti.loop_config(serialize=True)
        for j in range(n):
            s = s * c[None] + ti.sin(x[j])
            hist[j] = s
        for i in x:
            y[i] = x[i] * hist[n - 1]

    def program(x_, c_):
        s = 0.0
        for j in range(n):
            s = s * c_ + np.sin(x_[j])
        return [x_ * s]
    r = np.random.default_rng(21)
    check_program(k, [(x, r.uniform(-1, 1, n)), (c, np.array(0.8))], [y], program)


def test_loops_inside_branches_and_nested_early_exits():
    """A loop inside an if, a while inside a for, and a break that leaves only the inner loop."""
    n = 8
    x, y = grad_field(n), grad_field(n)
    c = ti.field(ti.i32, shape=n)

    @ti.kernel
    def mixed():
        for i in x:
            s = x[i]
            if x[i] > 0.0:
                for j in range(c[i]):
                    s = s * x[i] + 0.3
            else:
                k = 0
                while k < c[i]:
                    s = ti.sin(s) - x[i]
                    k += 1
            for j in range(4):
                t = s
                for m in range(5):
                    if m > j:
                        break
                    t = t * 0.9 + x[i] * m
                if j == 2:
                    continue
                s = s * 0.5 + t * 0.25
            y[i] = s

    cv = np.array([0, 1, 2, 3, 3, 2, 1, 4])
    c.from_numpy(cv.astype(np.int32))

    def program(x_):
        out = np.zeros(n)
        for i in range(n):
            s = x_[i]
            if x_[i] > 0:
                for _ in range(cv[i]):
                    s = s * x_[i] + 0.3
            else:
                for _ in range(cv[i]):
                    s = np.sin(s) - x_[i]
            for j in range(4):
                t = s
                for m in range(5):
                    if m > j:
                        break
                    t = t * 0.9 + x_[i] * m
                if j == 2:
                    continue
                s = s * 0.5 + t * 0.25
            out[i] = s
        return [out]
    xv = [-1.1, -0.6, -0.2, 0.3, 0.7, 1.2, -0.9, 0.5]
    check_program(mixed, [(x, xv)], [y], program)


def test_vector_carried_through_a_loop_reading_fields_by_the_loop_index():
    """A vector local updated by a matrix each step; the steps' weights are read at the serial
    loop index (which the reverse loop must reproduce, including a nonzero start)."""
    n, steps = 3, 7
    v0 = ti.Vector.field(2, ti.f32, shape=n, needs_grad=True)
    m = ti.Matrix.field(2, 2, ti.f32, shape=(), needs_grad=True)
    w = grad_field(steps)
    out = ti.Vector.field(2, ti.f32, shape=n, needs_grad=True)

    @ti.kernel
    def rollout(lo: ti.i32):
        for i in v0:
            v = v0[i]
            for j in range(lo, steps):
                v = m[None] @ v * w[j] + ti.Vector([ti.sin(v[1]), 0.1 * j])
            out[i] = v

    def program(lo):
        def p(v0_, m_, w_):
            res = np.zeros((n, 2))
            for i in range(n):
                v = v0_[i]
                for j in range(lo, steps):
                    v = m_ @ v * w_[j] + np.array([np.sin(v[1]), 0.1 * j])
                res[i] = v
            return [res]
        return p
    r = np.random.default_rng(22)
    data = [r.uniform(-1, 1, (n, 2)), 0.6 * np.eye(2) + r.uniform(-0.3, 0.3, (2, 2)), r.uniform(0.5, 1.2, steps)]
    for lo in (0, 4):
        for f in (v0, m, w):
            f.grad.fill(0.0)
        check_program(rollout, list(zip((v0, m, w), data)), [out], program(lo), args=(lo,))


def test_trajectory_stored_at_every_step_of_a_serial_loop():
    """Each thread records its state at every step (hist[i, j]); every recorded value gets a
    seed, so the gradient of x sums the contributions of all steps."""
    n, steps = 4, 6
    x = grad_field(n)
    hist = ti.field(ti.f32, shape=(n, steps), needs_grad=True)
    g = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def record():
        t = ti.cos(g[None])
        for i in x:
            s = x[i]
            if x[i] > 0.0:
                u = ti.sin(x[i]) * 2.0
                for j in range(3):
                    s = s * u * 0.5 + t
            for j in range(steps):
                s = ti.sin(s) * t + x[i] * 0.5
                hist[i, j] = s * s

    def program(x_, g_):
        t = np.cos(g_)
        out = np.zeros((n, steps))
        for i in range(n):
            s = x_[i]
            if x_[i] > 0:
                u = np.sin(x_[i]) * 2
                for _ in range(3):
                    s = s * u * 0.5 + t
            for j in range(steps):
                s = np.sin(s) * t + x_[i] * 0.5
                out[i, j] = s * s
        return [out]
    check_program(record, [(x, [-0.8, -0.2, 0.4, 1.1]), (g, np.array(0.4))], [hist], program)


def test_loop_in_a_func_called_twice_with_a_return_value():
    n = 5
    x, y = grad_field(n), grad_field(n)

    @ti.func
    def iterate(s0, k, rate):
        s = s0
        for j in range(k):
            s = s - rate * (s * s * s - x[j % n])
        return s

    @ti.kernel
    def newton():
        for i in range(n):
            y[i] = iterate(x[i], i + 1, 0.1) * iterate(0.5 * x[i], 3, 0.2)

    def program(x_):
        def it(s, k, rate):
            for j in range(k):
                s = s - rate * (s ** 3 - x_[j % n])
            return s
        return [np.array([it(x_[i], i + 1, 0.1) * it(0.5 * x_[i], 3, 0.2) for i in range(n)])]
    check_program(newton, [(x, np.random.default_rng(23).uniform(-1, 1, n))], [y], program)
