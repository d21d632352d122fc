"""Taichi idioms that programs written for Taichi use unchanged: ti.ndrange with run-time
bounds, gradients placed by hand, plain Python functions in kernels, @ti.data_oriented classes,
ti.svd / ti.polar_decompose, assignment to a matrix field element's component, tapes with nothing
to differentiate, ti.ad.grad_check. Every gradient is checked against an analytic derivative or
float64 NumPy central differences."""
from __future__ import annotations

import numpy as np
import pytest

import wgpu_ad as ti
from ad_util import assert_grad, central_diff, f32

pytestmark = pytest.mark.gpu


# ---- ti.ndrange with run-time bounds ----------------------------------------------------------
def test_ndrange_of_scalar_arguments_as_the_parallel_loop():
    x = ti.field(ti.f32, shape=(5, 6), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def energy(n: ti.i32, m: ti.i32):
        for i, j in ti.ndrange(n, m):
            loss[None] += ti.sin(x[i, j]) * (i + 2 * j + 1)

    x0 = np.random.default_rng(0).uniform(-1, 1, (5, 6))
    x.from_numpy(f32(x0))
    w = np.add.outer(np.arange(5), 2 * np.arange(6)) + 1.0

    def ref(v, n, m):
        return float(np.sum(np.sin(v[:n, :m]) * w[:n, :m]))

    for n, m in [(3, 4), (5, 6)]:  # the same compiled kernel, other bounds
        with ti.ad.Tape(loss):
            energy(n, m)
        xr = f32(x0).astype(np.float64)
        np.testing.assert_allclose(loss[None], ref(xr, n, m), rtol=1e-5)
        assert_grad(x.grad.to_numpy(), central_diff(lambda v: ref(v, n, m), xr))


def test_ndrange_of_ndarray_shapes_and_pairs_of_arguments():
    """x.shape[0] of ndarray arguments, and (lo, hi) pairs of scalar arguments."""
    rng = np.random.default_rng(1)
    a = ti.ndarray(ti.f32, (4, 7), needs_grad=True)
    out = ti.ndarray(ti.f32, (4, 7), needs_grad=True)
    a0 = rng.uniform(0.5, 1.5, (4, 7))
    a.from_numpy(f32(a0))

    @ti.kernel
    def square(x: ti.types.ndarray(), y: ti.types.ndarray(), lo: ti.i32, hi: ti.i32):
        for i, j in ti.ndrange(x.shape[0], (lo, hi)):
            y[i, j] = x[i, j] * x[i, j] * (j + 1)

    square(a, out, 2, 6)
    want = np.zeros((4, 7))
    want[:, 2:6] = (a0 ** 2 * (np.arange(7) + 1))[:, 2:6]
    np.testing.assert_allclose(out.to_numpy(), want, rtol=1e-5)
    seed = rng.uniform(-1, 1, (4, 7))
    out.grad.from_numpy(f32(seed))
    square.grad(a, out, 2, 6)
    g = np.zeros((4, 7))
    g[:, 2:6] = (2 * a0 * (np.arange(7) + 1) * seed)[:, 2:6]  # d/dx of x^2 (j+1), seeded
    assert_grad(a.grad.to_numpy(), g)


def test_ndrange_of_arguments_as_a_serial_inner_loop():
    n_rows = 3
    x = ti.field(ti.f32, shape=(4, 5), needs_grad=True)
    y = ti.field(ti.f32, shape=n_rows, needs_grad=True)

    @ti.kernel
    def rows(n: ti.i32, lo: ti.i32, hi: ti.i32):
        for r in y:
            acc = 0.0
            for a, b in ti.ndrange(n, (lo, hi)):
                acc = acc * 0.5 + x[a, b] * (r + 1)   # a mutable local carried through the loop
            for I in ti.grouped(ti.ndrange(n, 2)):
                acc += x[I] * x[I]
            y[r] = acc

    rng = np.random.default_rng(2)
    x0 = f32(rng.uniform(-1, 1, (4, 5))).astype(np.float64)
    x.from_numpy(f32(x0))

    def ref(v, n=3, lo=1, hi=4):
        out = []
        for r in range(n_rows):
            acc = 0.0
            for a in range(n):
                for b in range(lo, hi):
                    acc = acc * 0.5 + v[a, b] * (r + 1)
            acc += float(np.sum(v[:n, :2] ** 2))
            out.append(acc)
        return np.array(out)

    rows(3, 1, 4)
    np.testing.assert_allclose(y.to_numpy(), ref(x0), rtol=1e-5)
    seed = np.array([1.0, -0.5, 2.0])
    y.grad.from_numpy(f32(seed))
    rows.grad(3, 1, 4)
    assert_grad(x.grad.to_numpy(), central_diff(lambda v: float(seed @ ref(v)), x0))


def test_ndrange_with_float_bounds_is_refused():
    x = ti.field(ti.f32, shape=4)

    @ti.kernel
    def k(n: ti.f32):
        for i in ti.ndrange(n):
            x[i] = 1.0

    with pytest.raises(ti.TaichiCompilationError, match=r"ti.ndrange\(\) bounds must be integers; convert with int"):
        k(2.0)
