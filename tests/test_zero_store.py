"""Adjoints that store into a gradient known to be all zeros instead of accumulating into it
(passes/autodiff/demote.py zero-store candidates, lang/storage.py Storage.all_zero). Every
gradient is checked against an analytic derivative in float64; the cases around the rule (a
gradient written before the adjoint, several writers of one element, an ndarray passed twice)
must still accumulate."""
import numpy as np
import pytest

import wgpu_ad as ti

pytestmark = pytest.mark.gpu

N = 1000


def _x0(n=N):
    return np.random.default_rng(3).uniform(-1.0, 1.0, n).astype(np.float32)


def _program():
    x = ti.field(ti.f32, shape=N, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def compute():
        for i in x:
            loss[None] += x[i] * x[i] + ti.sin(x[i])

    x.from_numpy(_x0())
    return x, loss, compute


def _dloss(x0):
    x0 = x0.astype(np.float64)
    return 2.0 * x0 + np.cos(x0)


def _reads_gradient(kernel, name="x_grad") -> bool:
    """Whether any compiled variant of kernel's adjoint that stores into `name` also loads it."""
    srcs = ["\n".join(t.wgsl for t in g.ck.tasks) for lc in kernel._cache.values()
            for key, g in lc.grads.items() if key[-1]]
    assert srcs, "no zero-store variant was compiled"
    return any(f"= {name}[" in s for s in srcs)


def test_storage_knows_when_it_is_all_zeros():
    ti.init()
    x = ti.field(ti.f32, shape=4, needs_grad=True)
    assert x.grad.all_zero  # never written
    x.grad.fill(0.0)
    assert x.grad.all_zero
    x.grad[2] = 1.0
    assert not x.grad.all_zero
    x.grad.fill(0)
    assert x.grad.all_zero
    x.grad.fill(2.0)
    assert not x.grad.all_zero
    x.grad.fill(0.0)
    x.grad.from_numpy(np.zeros(4, np.float32))  # a host write: no longer known
    assert not x.grad.all_zero

    @ti.kernel
    def touch():
        for i in x:
            x.grad[i] = 0.0
    x.grad.fill(0.0)
    touch()  # a kernel that binds it may write it
    assert not x.grad.all_zero


def test_tape_stores_into_the_cleared_gradient():
    ti.init()
    x, loss, compute = _program()
    for _ in range(2):
        with ti.ad.Tape(loss=loss):
            compute()
        np.testing.assert_allclose(x.grad.to_numpy(), _dloss(_x0()), rtol=1e-5, atol=1e-6)
    assert loss[None] == pytest.approx(float((_x0().astype(np.float64) ** 2 + np.sin(_x0())).sum()), rel=1e-5)
    assert not _reads_gradient(compute)


def test_gradient_written_before_the_adjoint_is_accumulated_into():
    ti.init()
    x, loss, compute = _program()
    compute()
    loss.grad[None] = 1.0
    want = _dloss(_x0())
    x.grad.fill(0.5)
    compute.grad()
    np.testing.assert_allclose(x.grad.to_numpy(), 0.5 + want, rtol=1e-5, atol=1e-6)
    compute.grad()  # the first adjoint wrote it
    np.testing.assert_allclose(x.grad.to_numpy(), 0.5 + 2 * want, rtol=1e-5, atol=1e-6)
    x.grad.fill(0.0)
    compute.grad()  # zero again: stores
    np.testing.assert_allclose(x.grad.to_numpy(), want, rtol=1e-5, atol=1e-6)
    x.grad.fill(0.0)
    x.grad[3] = 7.0  # one element written from Python
    compute.grad()
    expect = want.copy()
    expect[3] += 7.0
    np.testing.assert_allclose(x.grad.to_numpy(), expect, rtol=1e-5, atol=1e-6)


def test_a_kernel_on_the_tape_that_writes_the_gradient():
    ti.init()
    x, loss, compute = _program()

    @ti.ad.no_grad
    @ti.kernel
    def bias():
        for i in x:
            x.grad[i] = 0.25

    with ti.ad.Tape(loss=loss):
        bias()  # after the tape cleared the gradients, before the adjoint
        compute()
    np.testing.assert_allclose(x.grad.to_numpy(), 0.25 + _dloss(_x0()), rtol=1e-5, atol=1e-6)


def test_several_launches_on_one_tape_accumulate_after_the_first():
    ti.init()
    x, loss, compute = _program()
    with ti.ad.Tape(loss=loss):
        for _ in range(3):
            compute()
    np.testing.assert_allclose(x.grad.to_numpy(), 3 * _dloss(_x0()), rtol=1e-5, atol=1e-6)


def test_two_loops_of_one_kernel_both_accumulate():
    ti.init()
    x = ti.field(ti.f32, shape=N, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def compute():
        for i in x:
            loss[None] += x[i] * x[i]
        for i in x:
            loss[None] += 3.0 * x[i]

    x.from_numpy(_x0())
    with ti.ad.Tape(loss=loss):
        compute()
    np.testing.assert_allclose(x.grad.to_numpy(), 2.0 * _x0().astype(np.float64) + 3.0, rtol=1e-5, atol=1e-6)


def test_several_writers_of_one_element_accumulate():
    ti.init()
    x = ti.field(ti.f32, shape=N, needs_grad=True)
    y = ti.field(ti.f32, shape=N, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def compute(n: ti.i32):
        for i in x:
            for k in range(n):  # x.grad[i] gets a contribution from every even k
                if k % 2 == 0:
                    loss[None] += x[i] * k
            if i % 3 == 0:  # y.grad[i] from two statements
                loss[None] += y[i] * y[i]
            loss[None] += 5.0 * y[i]

    x0 = _x0()
    y0 = np.random.default_rng(4).uniform(-1.0, 1.0, N).astype(np.float32)
    x.from_numpy(x0)
    y.from_numpy(y0)
    with ti.ad.Tape(loss=loss):
        compute(5)
    np.testing.assert_allclose(x.grad.to_numpy(), np.full(N, 0.0 + 2.0 + 4.0), rtol=1e-6)
    want_y = np.where(np.arange(N) % 3 == 0, 2.0 * y0.astype(np.float64), 0.0) + 5.0
    np.testing.assert_allclose(y.grad.to_numpy(), want_y, rtol=1e-5, atol=1e-6)


def test_an_ndarray_passed_twice_accumulates():
    ti.init()
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def compute(a: ti.types.ndarray(), b: ti.types.ndarray()):
        for i in a:
            loss[None] += a[i] * a[i] + 3.0 * b[i]

    x0 = _x0(64)
    a = ti.ndarray(ti.f32, shape=64, needs_grad=True)
    b = ti.ndarray(ti.f32, shape=64, needs_grad=True)
    a.from_numpy(x0)
    b.from_numpy(x0)
    with ti.ad.Tape(loss=loss):
        compute(a, b)
    np.testing.assert_allclose(a.grad.to_numpy(), 2.0 * x0.astype(np.float64), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.grad.to_numpy(), np.full(64, 3.0), rtol=1e-6)
    with ti.ad.Tape(loss=loss):
        compute(a, a)  # one gradient, written through two bindings
    np.testing.assert_allclose(a.grad.to_numpy(), 2.0 * x0.astype(np.float64) + 3.0, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("min_parallel", [None, 1])
def test_ndrange_gradient_with_and_without_the_loop_split(min_parallel):
    ti.init()
    ti.set_compile_options(min_parallel=min_parallel)
    x = ti.field(ti.f32, shape=(12, 9), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def compute():
        for i, j in x:
            loss[None] += (i + 1) * x[i, j] * x[i, j]

    x0 = np.random.default_rng(5).uniform(-1.0, 1.0, (12, 9)).astype(np.float32)
    x.from_numpy(x0)
    for _ in range(2):
        with ti.ad.Tape(loss=loss):
            compute()
        want = 2.0 * (np.arange(12)[:, None] + 1) * x0.astype(np.float64)
        np.testing.assert_allclose(x.grad.to_numpy(), want, rtol=1e-5, atol=1e-6)


def test_vector_field_components_are_stored():
    ti.init()
    x = ti.Vector.field(3, ti.f32, shape=N, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def compute():
        for i in x:
            loss[None] += x[i].norm() + 2.0 * x[i][1]

    x0 = np.random.default_rng(6).uniform(-1.0, 1.0, (N, 3)).astype(np.float32)
    x.from_numpy(x0)
    x64 = x0.astype(np.float64)
    want = x64 / np.linalg.norm(x64, axis=1, keepdims=True)
    want[:, 1] += 2.0
    for _ in range(2):
        with ti.ad.Tape(loss=loss):
            compute()
        np.testing.assert_allclose(x.grad.to_numpy(), want, rtol=1e-5, atol=1e-6)
    assert not _reads_gradient(compute)
