"""ti.init(deterministic=True): float sums made with atomics (a kernel's `x[None] += ...`, the
gradients its adjoint accumulates) do not depend on thread timing. A task that adds floats with
atomics runs its iterations in order in one invocation, so its sums are exactly the float32 sums
taken in iteration order: the references here are NumPy's float32 sums in that order (and float64
for closeness), not wgpu_ad's own output."""
from __future__ import annotations

import numpy as np
import pytest

import wgpu_ad as ti

pytestmark = pytest.mark.gpu

N, BINS = 3000, 16


def _data():
    rng = np.random.default_rng(11)
    # magnitudes from 1e-3 to 1e3: the float32 sum depends on the order of its terms
    x = (rng.standard_normal(N) * 10.0 ** rng.integers(-3, 4, N)).astype(np.float32)
    idx = rng.integers(0, BINS, N).astype(np.int32)
    w = rng.standard_normal(BINS).astype(np.float32)
    return x, idx, w


def _run(deterministic: bool):
    ti.init(deterministic=deterministic)
    xv, iv, wv = _data()
    x = ti.field(ti.f32, shape=N, needs_grad=True)
    w = ti.field(ti.f32, shape=BINS, needs_grad=True)
    idx = ti.field(ti.i32, shape=N)
    total = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def weighted_sum():
        for i in x:
            total[None] += x[i] * w[idx[i]]

    x.from_numpy(xv)
    idx.from_numpy(iv)
    w.from_numpy(wv)
    with ti.ad.Tape(loss=total):
        weighted_sum()
    return total.to_numpy(), w.grad.to_numpy(), x.grad.to_numpy(), weighted_sum


def test_a_sum_is_the_float32_sum_in_iteration_order():
    total, *_ = _run(True)
    xv, iv, wv = _data()
    in_order = np.float32(0.0)
    for i in range(N):
        in_order = np.float32(in_order + np.float32(xv[i] * wv[iv[i]]))
    assert total == in_order, f"{total!r} != the float32 sum in order {in_order!r}"
    exact = float(np.sum(xv.astype(np.float64) * wv[iv].astype(np.float64)))
    assert abs(float(total) - exact) <= 1e-5 * float(np.sum(np.abs(xv.astype(np.float64) * wv[iv])))


def test_gradients_accumulate_in_iteration_order_and_repeat_bit_for_bit():
    xv, iv, wv = _data()
    runs = [_run(True) for _ in range(3)]
    w_grads = [r[1] for r in runs]
    in_order = np.zeros(BINS, np.float32)
    np.add.at(in_order, iv, xv)  # float32, one term at a time, in index order
    for g in w_grads:
        assert np.array_equal(g, in_order), np.abs(g - in_order).max()
    # and the value is the gradient: d total / d w[b] = sum of x[i] over idx[i] == b (float64)
    exact = np.bincount(iv, weights=xv.astype(np.float64), minlength=BINS)
    np.testing.assert_allclose(w_grads[0], exact, rtol=0, atol=1e-6 * np.abs(xv).sum())
    np.testing.assert_array_equal(runs[0][2], wv[iv])  # d total / d x[i] = w[idx[i]]: one term each
    assert all(np.array_equal(runs[0][2], r[2]) for r in runs)


def test_only_tasks_that_add_floats_with_atomics_run_in_order():
    ti.init(deterministic=True)
    assert ti.compile_options().deterministic
    a = ti.field(ti.f32, shape=64)
    s = ti.field(ti.f32, shape=())
    c = ti.field(ti.i32, shape=())

    @ti.kernel
    def scale():
        for i in a:
            a[i] = 2.0 * a[i]

    @ti.kernel
    def count():
        for i in a:
            c[None] += 1   # an integer sum does not depend on the order

    @ti.kernel
    def add():
        for i in a:
            s[None] += a[i]

    assert "@workgroup_size(1)" not in scale.get_wgsl()
    assert "@workgroup_size(1)" not in count.get_wgsl()
    assert "@workgroup_size(1)" in add.get_wgsl()
    a.from_numpy(np.arange(64, dtype=np.float32))
    scale()
    count()
    add()
    assert c[None] == 64 and s[None] == 2 * 63 * 64 / 2
    ti.init()
    assert not ti.compile_options().deterministic
    assert "@workgroup_size(1)" not in add.get_wgsl()  # the option is part of the cache key
