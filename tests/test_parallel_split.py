"""Multi-dimensional parallel loops split into parallel leading dimensions and serial trailing
ones (what CPU adapters get: frontend/parallel.py parallel_prefix), against NumPy: every loop
shape, `continue`, struct-for, accumulations, and gradients through the split loop. Each test
runs with the split forced at every possible point and with it off (the GPU default)."""
import numpy as np
import pytest

import wgpu_ad as ti
from ad_util import assert_grad, central_diff

pytestmark = pytest.mark.gpu

# min_parallel values: None = no split (every iteration a thread); 1 = only the first dimension
# parallel; 30 = the first two dimensions when the first has fewer than 30 iterations
SPLITS = [None, 1, 30]


def _init(min_parallel):
    ti.init()
    ti.set_compile_options(min_parallel=min_parallel)


@pytest.mark.parametrize("min_parallel", SPLITS)
def test_elementwise_ndrange_with_offsets_and_continue(min_parallel):
    _init(min_parallel)
    x = ti.field(ti.f32, shape=(6, 7, 5))
    y = ti.field(ti.f32, shape=(6, 7, 5))

    @ti.kernel
    def k(scale: ti.f32):
        for i, j, l in ti.ndrange((1, 6), 7, (2, 5)):
            if (i + j) % 3 == 0:
                continue
            y[i, j, l] = scale * x[i, j, l] + i * 100 + j * 10 + l

    xs = np.random.default_rng(0).random((6, 7, 5)).astype(np.float32)
    x.from_numpy(xs)
    k(2.0)
    want = np.zeros((6, 7, 5))
    for i in range(1, 6):
        for j in range(7):
            for l_ in range(2, 5):
                if (i + j) % 3:
                    want[i, j, l_] = 2 * xs[i, j, l_] + i * 100 + j * 10 + l_
    np.testing.assert_allclose(y.to_numpy(), want, rtol=1e-6)


@pytest.mark.parametrize("min_parallel", SPLITS)
def test_struct_for_grouped_and_row_sums(min_parallel):
    _init(min_parallel)
    a = ti.field(ti.f32, shape=(8, 40))
    rows = ti.field(ti.f32, shape=8)
    total = ti.field(ti.f32, shape=())
    g = ti.field(ti.i32, shape=(8, 40))

    @ti.kernel
    def k():
        for i, j in a:
            rows[i] += a[i, j]
            total[None] += a[i, j] * a[i, j]
        for I in ti.grouped(g):
            g[I] = I[0] * 1000 + I[1]

    av = np.random.default_rng(1).random((8, 40)).astype(np.float32)
    a.from_numpy(av)
    k()
    np.testing.assert_allclose(rows.to_numpy(), av.astype(np.float64).sum(1), rtol=1e-5)
    assert total[None] == pytest.approx(float((av.astype(np.float64) ** 2).sum()), rel=1e-5)
    ii, jj = np.meshgrid(np.arange(8), np.arange(40), indexing="ij")
    np.testing.assert_array_equal(g.to_numpy(), ii * 1000 + jj)


@pytest.mark.parametrize("min_parallel", SPLITS)
def test_split_loop_shape_in_the_ir(min_parallel):
    _init(min_parallel)
    x = ti.field(ti.f32, shape=(20, 50))

    @ti.kernel
    def k():
        for i, j in ti.ndrange(20, 50):
            x[i, j] = i + j

    ir = k.get_ir()
    if min_parallel is None:
        assert "const 1000()" in ir and "range_for" not in ir
    elif min_parallel == 1:
        assert "const 20()" in ir and "range_for" in ir   # 20 threads, each loops over j
    else:
        assert "const 1000()" in ir and "range_for" not in ir  # 20 < 30: both dimensions stay parallel
    k()
    np.testing.assert_array_equal(x.to_numpy(), np.add.outer(np.arange(20), np.arange(50)))


@pytest.mark.parametrize("debug", [False, True])
@pytest.mark.parametrize("min_parallel", SPLITS)
def test_pair_energy_gradient_through_a_split_loop(min_parallel, debug):
    """The gravity energy (an all-pairs sum into a 0-d field) and dU/dx, against float64
    central differences. With the split, the adjoint is one gather: the energy is symmetric in
    the pair (passes/autodiff/symmetry.py), so the gradients of x[i] count twice and those of
    x[j] are left out; each thread writes its own elements of x.grad once, with no atomic. Debug
    mode verifies the IR after every pass and checks every index."""
    ti.init(debug=debug)
    ti.set_compile_options(min_parallel=min_parallel)
    N = 24
    x = ti.Vector.field(2, ti.f32, shape=N, needs_grad=True)
    U = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def energy():
        for i, j in ti.ndrange(N, N):
            r = x[i] - x[j]
            U[None] += -1 / r.norm(1e-3)

    pos = np.random.default_rng(2).random((N, 2)).astype(np.float32)
    x.from_numpy(pos)
    with ti.ad.Tape(loss=U):
        energy()

    def ref(p):
        p = p.reshape(N, 2)
        d = p[:, None, :] - p[None, :, :]
        return float(np.sum(-1 / np.sqrt((d ** 2).sum(-1) + 1e-3)))
    assert U[None] == pytest.approx(ref(pos.astype(np.float64)), rel=1e-5)
    assert_grad(x.grad.to_numpy().reshape(-1), central_diff(ref, pos.reshape(-1)))
    ir = energy.get_grad_ir()
    assert "_T_adj" not in ir and ir.count("\n  task ") == 1
    if min_parallel == 1:
        assert "atomic" not in ir


@pytest.mark.parametrize("min_parallel", SPLITS)
def test_elementwise_gradient_through_a_split_loop(min_parallel):
    """y[i, j] = x[i, j] * w[j] + sin(x[i, j]): x.grad from one writer per element (the demoted
    read-modify-write) and w.grad accumulated over i (atomics)."""
    _init(min_parallel)
    n, m = 9, 35
    x = ti.field(ti.f32, shape=(n, m), needs_grad=True)
    w = ti.field(ti.f32, shape=m, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def f():
        for i, j in ti.ndrange(n, m):
            y = x[i, j] * w[j] + ti.sin(x[i, j])
            loss[None] += y * y

    rng = np.random.default_rng(3)
    xv, wv = rng.random((n, m)).astype(np.float32), rng.random(m).astype(np.float32)
    x.from_numpy(xv)
    w.from_numpy(wv)
    with ti.ad.Tape(loss=loss):
        f()
    x64, w64 = xv.astype(np.float64), wv.astype(np.float64)
    y = x64 * w64 + np.sin(x64)
    assert loss[None] == pytest.approx(float((y ** 2).sum()), rel=1e-5)
    assert_grad(x.grad.to_numpy(), 2 * y * (w64 + np.cos(x64)))
    assert_grad(w.grad.to_numpy(), (2 * y * x64).sum(0))
