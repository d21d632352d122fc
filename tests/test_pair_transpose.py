"""Pair loops split into two gathers in the adjoint (CPU adapters: passes/autodiff/transpose.py).

With the loop split forced (Runtime.min_parallel, as test_parallel_split.py does), the adjoint of
`for i, j in ti.ndrange(N, M)` differentiates the loads that depend on j alone in a transposed
copy of the task. Every gradient is compared with float64 central differences; the adjoint's IR
shows whether the split happened (its second task is named *_T_adj), and the shapes it must
refuse are checked to keep the one-task adjoint, with right gradients too."""
import numpy as np
import pytest

import wgpu_ad as ti
from ad_util import assert_grad, central_diffs

pytestmark = pytest.mark.gpu


def _init(min_parallel):
    ti.init()
    ti.set_compile_options(min_parallel=min_parallel)


@pytest.mark.parametrize("min_parallel", [None, 1])
def test_pair_sum_with_offsets_conditions_and_every_kind_of_load(min_parallel):
    """Loads indexed by i (a), by j (the vector field b, the ndarray c), by both (the 2-D field
    m) and by neither (the 0-d field s), an `if` on i and j, offset ranges: the split (with
    min_parallel=1) and the one-task adjoint (the GPU default) give the same, right gradients."""
    _init(min_parallel)
    n, m_ = 9, 11
    a = ti.field(ti.f32, shape=n, needs_grad=True)
    b = ti.Vector.field(2, ti.f32, shape=m_, needs_grad=True)
    mm = ti.field(ti.f32, shape=(n, m_), needs_grad=True)
    s = ti.field(ti.f32, shape=(), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    c = ti.ndarray(ti.f32, shape=m_, needs_grad=True)

    @ti.kernel
    def pairs(c: ti.types.ndarray()):
        for i, j in ti.ndrange((1, n), (2, m_)):
            if i != j:
                d = a[i] - b[j][0] * c[j]
                loss[None] += s[None] * ti.sin(d) * b[j][1] + mm[i, j] * d * d

    rng = np.random.default_rng(11)
    av, bv = rng.uniform(-1, 1, n).astype(np.float32), rng.uniform(-1, 1, (m_, 2)).astype(np.float32)
    mv, cv = rng.uniform(-1, 1, (n, m_)).astype(np.float32), rng.uniform(0.5, 1.5, m_).astype(np.float32)
    sv = np.float32(0.7)
    a.from_numpy(av)
    b.from_numpy(bv)
    mm.from_numpy(mv)
    c.from_numpy(cv)
    s[None] = float(sv)
    with ti.ad.Tape(loss=loss):
        pairs(c)

    def ref(a_, b_, m__, c_, s_):
        out = 0.0
        for i in range(1, n):
            for j in range(2, m_):
                if i != j:
                    d = a_[i] - b_[j, 0] * c_[j]
                    out += float(s_) * np.sin(d) * b_[j, 1] + m__[i, j] * d * d
        return out

    inputs = [av, bv, mv, cv, np.array(sv)]
    assert loss[None] == pytest.approx(ref(*[x.astype(np.float64) for x in inputs]), rel=1e-5)
    ga, gb, gm, gc, gs = central_diffs(ref, inputs)
    assert_grad(a.grad.to_numpy(), ga, what="a.grad (indexed by i)")
    assert_grad(b.grad.to_numpy(), gb, what="b.grad (indexed by j)")
    assert_grad(c.grad.to_numpy(), gc, what="c.grad (an ndarray indexed by j)")
    assert_grad(mm.grad.to_numpy(), gm, what="mm.grad (indexed by i and j)")
    assert s.grad[None] == pytest.approx(float(gs), rel=1e-4)
    split = "_T_adj" in pairs.get_grad_ir(c)
    assert split == (min_parallel is not None)


def _pair_kernel_grads(kernel, x, loss, ref, xv):
    x.from_numpy(xv)
    with ti.ad.Tape(loss=loss):
        kernel()
    (want,) = central_diffs(ref, [xv])
    assert loss[None] == pytest.approx(ref(xv.astype(np.float64)), rel=1e-5)
    assert_grad(x.grad.to_numpy(), want)
    return kernel.get_grad_ir()


def test_an_expensive_pair_body_keeps_the_scatter():
    """Replaying exp, sin and cos several times costs more than the subgroup sums: no split."""
    _init(1)
    n = 12
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def heavy():
        for i, j in ti.ndrange(n, n):
            d = x[i] - x[j]
            loss[None] += ti.exp(ti.sin(d) * ti.cos(d)) + ti.sin(ti.exp(d * 0.5)) + ti.cos(d * d)

    def ref(v):
        d = v[:, None] - v[None, :]
        return float(np.sum(np.exp(np.sin(d) * np.cos(d)) + np.sin(np.exp(d * 0.5)) + np.cos(d * d)))

    ir = _pair_kernel_grads(heavy, x, loss, ref, np.random.default_rng(12).uniform(-1, 1, n).astype(np.float32))
    assert "_T_adj" not in ir


def test_a_short_inner_loop_keeps_the_scatter():
    """ndrange(60, 10) with min_parallel=50: 60 threads loop over 10 j each; a transposed task
    would have only 10 threads, fewer than min_parallel: no split."""
    _init(50)
    x = ti.field(ti.f32, shape=60, needs_grad=True)
    w = ti.field(ti.f32, shape=10, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def f():
        for i, j in ti.ndrange(60, 10):
            loss[None] += x[i] * w[j] * w[j]

    rng = np.random.default_rng(13)
    xv, wv = rng.uniform(-1, 1, 60).astype(np.float32), rng.uniform(-1, 1, 10).astype(np.float32)
    x.from_numpy(xv)
    w.from_numpy(wv)
    with ti.ad.Tape(loss=loss):
        f()
    assert_grad(w.grad.to_numpy(), 2 * wv.astype(np.float64) * xv.astype(np.float64).sum())
    assert_grad(x.grad.to_numpy(), np.full(60, float((wv.astype(np.float64) ** 2).sum())))
    assert "_T_adj" not in f.get_grad_ir()


def test_a_loop_carried_variable_keeps_the_scatter():
    """A user's inner loop whose iterations share a variable (a running product) cannot run in
    another order: no split, and the loop's own reverse (its stack) gives the gradient."""
    _init(1)
    n = 6
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def running():
        for i in range(n):
            p = 1.0
            for j in range(n):
                p = p * (1.0 + 0.1 * x[j] * x[i])
                loss[None] += p

    def ref(v):
        out = 0.0
        for i in range(n):
            p = 1.0
            for j in range(n):
                p = p * (1.0 + 0.1 * v[j] * v[i])
                out += p
        return out

    ir = _pair_kernel_grads(running, x, loss, ref, np.random.default_rng(14).uniform(-1, 1, n).astype(np.float32))
    assert "_T_adj" not in ir
