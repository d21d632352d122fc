"""Kernel-scope variables accumulated across a parallel loop (issue #16, refusal 5):
`s = 0.0; for i in x: s += x[i]; return s` is an atomic reduction, as in Taichi. Values against
NumPy, gradients against float64 central differences."""
from __future__ import annotations

import numpy as np
import pytest

import wgpu_ad as ti
from ad_util import assert_grad, central_diff

pytestmark = pytest.mark.gpu

N = 64


def _x(seed=0, n=N):
    return np.random.default_rng(seed).uniform(0.5, 1.5, n).astype(np.float32)


def test_sum_returned():
    x = ti.field(ti.f32, shape=N)

    @ti.kernel
    def total() -> ti.f32:
        s = 0.0
        for i in x:
            s += x[i] * x[i]
        return s

    x0 = _x()
    x.from_numpy(x0)
    assert total() == pytest.approx(float((x0.astype(np.float64) ** 2).sum()), rel=1e-5)
    x.from_numpy(2 * x0)  # a second launch starts from zero again
    assert total() == pytest.approx(float((4 * x0.astype(np.float64) ** 2).sum()), rel=1e-5)


def test_integer_count_initial_value_and_subtraction():
    x = ti.field(ti.f32, shape=N)

    @ti.kernel
    def count(t: ti.f32) -> ti.i32:
        c = 100          # the value before the loop is kept: 100 + hits - misses
        for i in x:
            if x[i] > t:
                c += 1
            else:
                c -= 2
        return c

    x0 = _x(1)
    x.from_numpy(x0)
    hits = int((x0 > 1.0).sum())
    assert count(1.0) == 100 + hits - 2 * (N - hits)


def test_vector_sum_used_by_a_later_loop():
    p = ti.Vector.field(2, ti.f32, shape=N)
    centred = ti.Vector.field(2, ti.f32, shape=N)

    @ti.kernel
    def centre():
        c = ti.Vector([0.0, 0.0])
        for i in p:
            c += p[i]
        c /= N
        for i in p:
            centred[i] = p[i] - c

    p0 = np.random.default_rng(2).normal(size=(N, 2)).astype(np.float32)
    p.from_numpy(p0)
    centre()
    np.testing.assert_allclose(centred.to_numpy(), p0 - p0.astype(np.float64).mean(0), atol=1e-5)


def test_two_loops_add_to_one_variable():
    x = ti.field(ti.f32, shape=N)
    y = ti.field(ti.f32, shape=2 * N)

    @ti.kernel
    def both() -> ti.f32:
        s = 1.0
        for i in x:
            s += x[i]
        s *= 2.0
        for j in y:
            s += y[j]
        return s

    x0, y0 = _x(3), _x(4, 2 * N)
    x.from_numpy(x0)
    y.from_numpy(y0)
    ref = 2 * (1 + x0.astype(np.float64).sum()) + y0.astype(np.float64).sum()
    assert both() == pytest.approx(float(ref), rel=1e-5)


def _normalise_setup():
    x = ti.field(ti.f32, shape=N, needs_grad=True)
    y = ti.field(ti.f32, shape=(2, N), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def normalise(p: ti.f32, row: ti.i32):
        s = 0.0
        for i in x:
            s += x[i] ** p
        for i in x:
            y[row, i] = x[i] / s

    @ti.kernel
    def weigh():
        for r, i in y:
            loss[None] += y[r, i] * (i + 1) * (r + 1)

    def ref(xv):
        w = np.arange(1, N + 1)
        return sum((r + 1) * ((xv / (xv ** p).sum()) * w).sum() for r, p in enumerate((1.0, 2.0)))
    return x, loss, normalise, weigh, ref


def test_gradient_through_the_sum_one_launch_per_exponent():
    """The same compiled kernel launched twice on a tape: each adjoint reads its own launch's sum."""
    x, loss, normalise, weigh, ref = _normalise_setup()
    x0 = _x(5)
    x.from_numpy(x0)
    with ti.ad.Tape(loss):
        normalise(1.0, 0)
        normalise(2.0, 1)
        weigh()
    assert loss[None] == pytest.approx(ref(x0.astype(np.float64)), rel=1e-5)
    assert_grad(x.grad.to_numpy(), central_diff(ref, x0))


def test_gradient_by_hand_with_kernel_grad():
    x, loss, normalise, weigh, ref = _normalise_setup()
    x0 = _x(6)
    x.from_numpy(x0)
    normalise(1.0, 0)
    normalise(2.0, 1)
    weigh()
    loss.grad[None] = 1.0
    weigh.grad()
    normalise.grad(2.0, 1)  # the latest launch's sum is the one for p = 2
    g2 = x.grad.to_numpy()

    def ref2(xv):
        return 2 * ((xv / (xv ** 2).sum()) * np.arange(1, N + 1)).sum()
    assert_grad(g2, central_diff(ref2, x0))


def test_reading_the_sum_inside_its_loop_is_refused():
    x = ti.field(ti.f32, shape=N)
    y = ti.field(ti.f32, shape=N)

    @ti.kernel
    def racy():
        s = 0.0
        for i in x:
            s += x[i]
            y[i] = s

    with pytest.raises(ti.CompileError) as e:
        racy()
    assert str(e.value).splitlines()[0] == (
        "kernel-scope variable 's' is accumulated with += in this parallel loop (an atomic reduction over its "
        "iterations) and also read in it; its value there would depend on the order the iterations run. Read "
        "'s' after the loop, or sum into a variable defined inside the loop")


def test_a_local_of_the_loop_body_is_not_a_reduction():
    """`acc` is defined inside the parallel loop: each thread's own serial sum, as before."""
    a = ti.field(ti.f32, shape=(8, 16))
    rows = ti.field(ti.f32, shape=8)

    @ti.kernel
    def row_sums():
        for i in range(8):
            acc = 0.0
            for j in range(16):
                acc += a[i, j]
            rows[i] = acc

    a0 = np.random.default_rng(7).normal(size=(8, 16)).astype(np.float32)
    a.from_numpy(a0)
    row_sums()
    np.testing.assert_allclose(rows.to_numpy(), a0.astype(np.float64).sum(1), atol=1e-5)


def test_a_field_zeroed_then_accumulated_by_a_later_loop_differentiates():
    """The same program with fields the user owns: a store, then atomic adds in a later dispatch,
    then reads; and a store that a later dispatch stores over (both used to be refused as 'writes
    the same elements again'): a store's adjoint consumes the gradient, so the first value gets
    only what reached it."""
    x = ti.field(ti.f32, shape=N, needs_grad=True)
    s = ti.field(ti.f32, shape=(), needs_grad=True)
    y = ti.field(ti.f32, shape=N, needs_grad=True)
    a = ti.field(ti.f32, shape=N, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def k():
        for i in x:
            a[i] = x[i] * x[i]
        s[None] = x[0]          # overwritten by the adds of the next loop only through +=
        for i in x:
            s[None] += x[i] * x[i]
        for i in x:
            y[i] = x[i] * s[None]
        a[1] = 5.0 * x[2]       # over the value the first loop stored
    @ti.kernel
    def total():
        for i in y:
            loss[None] += y[i] * (i % 3) + s[None] / N + a[i] * (i + 1)

    def ref(xv):
        sv = xv[0] + (xv ** 2).sum()
        av = xv ** 2
        av[1] = 5.0 * xv[2]
        return (xv * sv * (np.arange(N) % 3)).sum() + sv + (av * np.arange(1, N + 1)).sum()
    x0 = _x(8)
    x.from_numpy(x0)
    with ti.ad.Tape(loss):
        k()
        total()
    assert loss[None] == pytest.approx(ref(x0.astype(np.float64)), rel=1e-5)
    assert_grad(x.grad.to_numpy(), central_diff(ref, x0))


def test_reduction_in_a_kernel_called_as_a_torch_function():
    """x / |x| with |x|^2 summed over the parallel loop, through wgpu_ad.torch: the gradient
    matches torch's own float64 autograd of the same formula."""
    torch = pytest.importorskip("torch", reason="the PyTorch bridge needs torch (pip install torch==2.13.0)")
    import wgpu_ad.torch as wt

    @ti.kernel
    def normalize(x: ti.types.ndarray(), y: ti.types.ndarray()):
        s = 0.0
        for i in x:
            s += x[i] * x[i]
        for i in x:
            y[i] = x[i] / ti.sqrt(s)

    f = wt.function(normalize, outputs={"y": "x"})
    x = torch.tensor(_x(9, 16), requires_grad=True)
    w = torch.arange(16, dtype=torch.float32)
    (f(x) * w).sum().backward()
    xd = x.detach().double().requires_grad_()
    ((xd / xd.norm()) * w.double()).sum().backward()
    assert_grad(x.grad.numpy(), xd.grad.numpy())
