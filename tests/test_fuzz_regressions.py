"""Bugs the random programs of test_fuzz.py found, as minimal named programs. Gradients against
float64 central differences (ad_util), values against float64 NumPy."""
from __future__ import annotations

import numpy as np
import pytest

import wgpu_ad as ti
from ad_util import assert_grad, central_diff

pytestmark = pytest.mark.gpu

N = 4


@pytest.mark.parametrize("first_store", ["before_the_branch", "in_the_branch"])
def test_an_element_stored_in_a_branch_then_updated_in_place(first_store):
    """fuzz seeds 36, 53, 110 (reduced): an element the thread stores, stores again in a branch,
    then updates from its own value. The adjoint used to replay the read after the branch from the
    copy of t taken before the launch (the in-place snapshot): d loss / d b came out as
    t_before + 1, silently wrong. promote.py now makes such an element a local of the iteration."""
    b = ti.field(ti.f32, shape=N, needs_grad=True)
    x = ti.field(ti.f32, shape=N, needs_grad=True)
    t = ti.field(ti.f32, shape=N, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    if first_store == "before_the_branch":
        @ti.kernel
        def k1():
            for i in t:
                t[i] = x[i]
                if b[i] > 0.0:
                    t[i] = 2.0 * x[i]
                t[i] = t[i] + 1.0
                loss[None] += b[i] * t[i]

        def f(bv, xv, tv):
            return float((bv * (np.where(bv > 0, 2 * xv, xv) + 1)).sum())
    else:
        @ti.kernel
        def k1():
            for i in t:
                if b[i] > 0.0:
                    t[i] = 2.0 * x[i]
                t[i] = t[i] + 1.0
                loss[None] += b[i] * t[i]

        def f(bv, xv, tv):
            return float((bv * (np.where(bv > 0, 2 * xv, tv) + 1)).sum())

    rng = np.random.default_rng(0)
    b0, x0, t0 = (rng.uniform(-1, 1, N) for _ in range(3))
    for fld, v in ((b, b0), (x, x0), (t, t0)):
        fld.from_numpy(v.astype(np.float32))
    with ti.ad.Tape(loss):
        k1()
    assert loss[None] == pytest.approx(f(b0, x0, t0), rel=1e-5)
    unstored = x0 if first_store == "before_the_branch" else t0
    np.testing.assert_allclose(t.to_numpy(), np.where(b0 > 0, 2 * x0, unstored) + 1, rtol=1e-6, atol=1e-6)
    assert_grad(b.grad.to_numpy(), central_diff(lambda bv: f(bv, x0, t0), b0))
    assert_grad(x.grad.to_numpy(), central_diff(lambda xv: f(b0, xv, t0), x0))
    # the initial t reaches the loss only where the branch is not taken and nothing stored before it
    assert_grad(t.grad.to_numpy(), central_diff(lambda tv: f(b0, x0, tv), t0) if first_store == "in_the_branch"
                else np.zeros(N))


def test_a_vector_element_updated_in_a_serial_loop():
    """fuzz seed 88 (reduced): v[i] = v[i] * 0.5 + ... in a serial loop, v a Vector field. Its two
    components were one group of accesses with two indices, so the loop was not made exact and the
    kernel was refused ('reads field v and then overwrites what it read')."""
    x = ti.field(ti.f32, shape=N, needs_grad=True)
    v = ti.Vector.field(2, ti.f32, shape=N, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def k():
        for i in v:
            for _ in range(3):
                v[i] = v[i] * 0.5 + ti.Vector([x[i], v[i][0]])

    @ti.kernel
    def total():
        for i in range(N):
            loss[None] += v[i].dot(ti.Vector([1.0, 2.0])) * (i + 1.0)

    rng = np.random.default_rng(3)
    x0, v0 = rng.uniform(-1, 1, N), rng.uniform(-1, 1, (N, 2))
    x.from_numpy(x0.astype(np.float32))
    v.from_numpy(v0.astype(np.float32))

    def f(xv, vv):
        vv = vv.copy()
        for _ in range(3):
            vv = np.stack([vv[:, 0] * 0.5 + xv, vv[:, 1] * 0.5 + vv[:, 0]], axis=1)
        return float(((vv[:, 0] + 2 * vv[:, 1]) * np.arange(1, N + 1)).sum())
    with ti.ad.Tape(loss):
        k()
        total()
    assert loss[None] == pytest.approx(f(x0, v0), rel=1e-5)
    assert_grad(x.grad.to_numpy(), central_diff(lambda xv: f(xv, v0), x0))
    assert_grad(v.grad.to_numpy(), central_diff(lambda vv: f(x0, vv), v0))


def test_an_element_a_serial_loop_updates_then_read_after_the_loop():
    """The element a serial loop keeps in a local is stored after the loop; a read after it sees
    that value (the promoted loop's store is forwarded to it), and its gradient is exact."""
    a = ti.field(ti.f32, shape=N, needs_grad=True)
    v = ti.field(ti.f32, shape=N, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def k():
        for i in a:
            for _ in range(3):
                v[i] = v[i] * 0.5 + a[i]
            v[i] = v[i] * 0.25 + v[i] * v[i]

    @ti.kernel
    def total():
        for i in range(N):
            loss[None] += v[i] * (i + 1.0)

    rng = np.random.default_rng(1)
    a0, v0 = rng.uniform(-1, 1, N), rng.uniform(-1, 1, N)
    a.from_numpy(a0.astype(np.float32))
    v.from_numpy(v0.astype(np.float32))

    def f(av, vv):
        for _ in range(3):
            vv = vv * 0.5 + av
        vv = vv * 0.25 + vv * vv
        return float((vv * np.arange(1, N + 1)).sum())
    with ti.ad.Tape(loss):
        k()
        total()
    assert loss[None] == pytest.approx(f(a0, v0), rel=1e-5)
    assert_grad(a.grad.to_numpy(), central_diff(lambda av: f(av, v0), a0))
    assert_grad(v.grad.to_numpy(), central_diff(lambda vv: f(a0, vv), v0))


def test_adds_in_a_serial_loop_and_after_it_to_one_field():
    """fuzz seed 19, reduced: `+=` into m in a serial loop and after it. On CPU adapters the pair
    loop's j runs serially in each thread, so promote.py made m[j, i] a local of the k loop, stored
    after it, and that store then conflicted with other threads' m[3 - j, j] += ...: refused as
    'writes the same elements again' (saying 'accumulate with +=', which it did)."""
    x = ti.field(ti.f32, shape=N, needs_grad=True)
    m = ti.field(ti.f32, shape=(N, N), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def k():
        for i, j in ti.ndrange(N, N):
            for _ in range(2):
                m[j, i] += x[i] * x[j]
            m[N - 1 - j, j] += x[j]

    @ti.kernel
    def total():
        for i, j in m:
            loss[None] += ti.sin(m[i, j]) * (i + 2.0 * j)

    x0 = np.random.default_rng(2).uniform(-1, 1, N)
    x.from_numpy(x0.astype(np.float32))

    def f(xv):
        mv = 2 * np.outer(xv, xv).T
        for j in range(N):
            mv[N - 1 - j, j] += N * xv[j]  # once per i
        return float((np.sin(mv) * (np.arange(N)[:, None] + 2.0 * np.arange(N)[None, :])).sum())
    with ti.ad.Tape(loss):
        k()
        total()
    assert loss[None] == pytest.approx(f(x0), rel=1e-5)
    assert_grad(x.grad.to_numpy(), central_diff(f, x0))


def test_an_element_only_stored_in_serial_loops():
    """fuzz seed 43 (reduced): t[i] stored (never read) in a serial loop nested in one that reads
    it: each store overwrites the last, and the kernel was refused ('the same element may be
    stored by more than one iteration'). The element is now a local of the loop, stored once."""
    x = ti.field(ti.f32, shape=N, needs_grad=True)
    v = ti.Vector.field(2, ti.f32, shape=N, needs_grad=True)
    t = ti.Vector.field(2, ti.f32, shape=N, needs_grad=True)
    cnt = ti.field(ti.i32, shape=N)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def k():
        for i in t:
            acc = 0.0
            for j in range(cnt[i]):
                acc = acc * 0.5 + t[i][1] * x[i]
                for _ in range(2):
                    t[i] = v[j] * x[i]
            loss[None] += acc

    @ti.kernel
    def total():
        for i in range(N):
            loss[None] += t[i].dot(ti.Vector([1.0, 2.0])) * (i + 1.0)

    rng = np.random.default_rng(4)
    x0, v0, t0 = rng.uniform(-1, 1, N), rng.uniform(-1, 1, (N, 2)), rng.uniform(-1, 1, (N, 2))
    c0 = np.array([0, 1, 2, 3])
    for fld, val in ((x, x0), (v, v0), (t, t0)):
        fld.from_numpy(val.astype(np.float32))
    cnt.from_numpy(c0.astype(np.int32))

    def f(xv, vv, tv):
        total_ = 0.0
        for i in range(N):
            ti_, acc = tv[i].copy(), 0.0
            for j in range(c0[i]):
                acc = acc * 0.5 + ti_[1] * xv[i]
                ti_ = vv[j] * xv[i]
            total_ += acc + (ti_[0] + 2 * ti_[1]) * (i + 1)
        return total_
    with ti.ad.Tape(loss):
        k()
        total()
    assert loss[None] == pytest.approx(f(x0, v0, t0), rel=1e-5)
    assert_grad(x.grad.to_numpy(), central_diff(lambda xv: f(xv, v0, t0), x0))
    assert_grad(v.grad.to_numpy(), central_diff(lambda vv: f(x0, vv, t0), v0))
    assert_grad(t.grad.to_numpy(), central_diff(lambda tv: f(x0, v0, tv), t0))


def test_an_element_a_loop_in_a_branch_updates_then_updated_after_the_branch():
    """fuzz seed 109 (reduced): a serial loop inside a branch updates t[i] (a Vector element), and
    after the branch t[i] is computed from its own first component. Refused before ('reads field
    t and then overwrites what it read'); the element's index, computed only after the branch,
    is recomputed where the iteration's local starts."""
    b = ti.field(ti.f32, shape=N, needs_grad=True)
    x = ti.field(ti.f32, shape=N, needs_grad=True)
    t = ti.Vector.field(2, ti.f32, shape=N, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def k():
        for i in t:
            if b[i] > 0.0:
                for _ in range(2):
                    t[i] = t[i] * 0.5 + ti.Vector([x[i], b[i]])
            t[i] = ti.Vector([1.0, b[i]]) * t[i][0]

    @ti.kernel
    def total():
        for i in range(N):
            loss[None] += t[i].dot(ti.Vector([1.0, 2.0])) * (i + 1.0)

    rng = np.random.default_rng(5)
    b0, x0, t0 = rng.uniform(-1, 1, N), rng.uniform(-1, 1, N), rng.uniform(-1, 1, (N, 2))
    for fld, val in ((b, b0), (x, x0), (t, t0)):
        fld.from_numpy(val.astype(np.float32))

    def f(bv, xv, tv):
        out = 0.0
        for i in range(N):
            e = tv[i].copy()
            if bv[i] > 0:
                for _ in range(2):
                    e = e * 0.5 + np.array([xv[i], bv[i]])
            e = np.array([1.0, bv[i]]) * e[0]
            out += (e[0] + 2 * e[1]) * (i + 1)
        return out
    with ti.ad.Tape(loss):
        k()
        total()
    assert loss[None] == pytest.approx(f(b0, x0, t0), rel=1e-5)
    assert_grad(b.grad.to_numpy(), central_diff(lambda bv: f(bv, x0, t0), b0))
    assert_grad(x.grad.to_numpy(), central_diff(lambda xv: f(b0, xv, t0), x0))
    assert_grad(t.grad.to_numpy(), central_diff(lambda tv: f(b0, x0, tv), t0))


def test_an_element_stored_read_in_a_loop_then_stored_again():
    """fuzz seeds 240, 552 (reduced): t[i] stored, read in a serial loop, stored again. On main the
    gradient was silently wrong (the loop's read replayed from the snapshot); as an iteration's
    local, the loop's read must be of the value before the loop, not the variable's final value
    (which the adjoint's replay of the loop would otherwise see)."""
    a = ti.field(ti.f32, shape=N, needs_grad=True)
    x = ti.field(ti.f32, shape=N, needs_grad=True)
    t = ti.field(ti.f32, shape=N, needs_grad=True)
    cnt = ti.field(ti.i32, shape=N)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def k():
        for i in t:
            t[i] = ti.exp(ti.tanh(x[N - 1 - i]))
            acc = 0.0
            for _ in range(cnt[i]):
                acc = acc * 0.5 + t[i] / (2.0 + ti.sin(x[(i + 1) % N]))
            t[i] = 0.56
            a[i] += acc * acc

    @ti.kernel
    def total():
        for i in range(N):
            loss[None] += ti.sin(a[i] + 0.3) + t[i]

    rng = np.random.default_rng(6)
    x0, a0 = rng.uniform(-1, 1, N), rng.uniform(-1, 1, N)
    c0 = np.array([3, 0, 1, 2])
    x.from_numpy(x0.astype(np.float32))
    a.from_numpy(a0.astype(np.float32))
    cnt.from_numpy(c0.astype(np.int32))

    def f(xv, av):
        out = 0.0
        for i in range(N):
            ti_, acc = np.exp(np.tanh(xv[N - 1 - i])), 0.0
            for _ in range(c0[i]):
                acc = acc * 0.5 + ti_ / (2.0 + np.sin(xv[(i + 1) % N]))
            out += np.sin(av[i] + acc * acc + 0.3) + 0.56
        return out
    with ti.ad.Tape(loss):
        k()
        total()
    assert loss[None] == pytest.approx(f(x0, a0), rel=1e-5)
    assert_grad(x.grad.to_numpy(), central_diff(lambda xv: f(xv, a0), x0))
    assert_grad(a.grad.to_numpy(), central_diff(lambda av: f(x0, av), a0))
    np.testing.assert_array_equal(t.grad.to_numpy(), np.zeros(N))  # overwritten: its gradient is consumed


@pytest.mark.parametrize("then", ["the_other_component", "the_whole_element", "a_matrix_entry"])
def test_one_component_stored_then_the_element_read(then):
    """fuzz seed 21 of the matrix/ndarray generator (reduced): `t[i][0] = f(t[i][0])`, then a read
    of t[i][1] (alone or as part of t[i]) before it is overwritten. Refused ('reads field t and
    then overwrites what it read'): the read of t[i][1] was not given the snapshot because an
    earlier store wrote to t, although to another component. Only a store that may touch the
    element read keeps a read from its snapshot now."""
    x = ti.field(ti.f32, shape=N, needs_grad=True)
    t = ti.Vector.field(2, ti.f32, shape=N, needs_grad=True)
    M = ti.Matrix.field(2, 2, ti.f32, shape=N, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    if then == "the_other_component":
        @ti.kernel
        def k():
            for i in t:
                t[i][0] = 0.5 * t[i][0] + x[i] * x[i]
                t[i][1] = t[i][1] * ti.sin(t[i][0]) + x[i]

        def step(xi, ti_, mi):
            e0 = 0.5 * ti_[0] + xi * xi
            return np.array([e0, ti_[1] * np.sin(e0) + xi]), mi
    elif then == "the_whole_element":
        @ti.kernel
        def k():
            for i in t:
                t[i][0] = 0.5 * t[i][0] + x[i] * x[i]
                t[i] = t[i] * t[i][1] + ti.Vector([x[i], 1.0])

        def step(xi, ti_, mi):
            e = np.array([0.5 * ti_[0] + xi * xi, ti_[1]])
            return e * e[1] + np.array([xi, 1.0]), mi
    else:
        @ti.kernel
        def k():
            for i in M:
                M[i][0, 1] = M[i][0, 1] * x[i] + 0.5
                M[i] = M[i] @ M[i] * 0.5
                t[i] = M[i] @ t[i]

        def step(xi, ti_, mi):
            e = mi.copy()
            e[0, 1] = e[0, 1] * xi + 0.5
            e = e @ e * 0.5
            return e @ ti_, e

    @ti.kernel
    def total():
        for i in range(N):
            loss[None] += t[i].dot(ti.Vector([1.0, 2.0])) * (i + 1.0) + M[i].norm_sqr()

    rng = np.random.default_rng(7)
    x0, t0, m0 = rng.uniform(-1, 1, N), rng.uniform(-1, 1, (N, 2)), rng.uniform(-1, 1, (N, 2, 2))
    for fld, val in ((x, x0), (t, t0), (M, m0)):
        fld.from_numpy(val.astype(np.float32))

    def run(xv, tv, mv):
        outs = [step(xv[i], tv[i], mv[i]) for i in range(N)]
        return np.array([o[0] for o in outs]), np.array([o[1] for o in outs])

    def f(xv, tv, mv):
        tt, mm = run(xv, tv, mv)
        return float(((tt[:, 0] + 2 * tt[:, 1]) * np.arange(1, N + 1)).sum() + (mm * mm).sum())
    with ti.ad.Tape(loss):
        k()
        total()
    want_t, want_m = run(x0, t0, m0)
    np.testing.assert_allclose(t.to_numpy(), want_t, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(M.to_numpy(), want_m, rtol=1e-5, atol=1e-6)
    assert loss[None] == pytest.approx(f(x0, t0, m0), rel=1e-5)
    assert_grad(x.grad.to_numpy(), central_diff(lambda xv: f(xv, t0, m0), x0))
    assert_grad(t.grad.to_numpy(), central_diff(lambda tv: f(x0, tv, m0), t0))
    assert_grad(M.grad.to_numpy(), central_diff(lambda mv: f(x0, t0, mv), m0))


@pytest.mark.parametrize("kind", ["max", "min"])
def test_atomic_max_gives_no_gradient_to_the_value_it_beat(kind):
    """Found writing the fuzzer's atomic min / max (issue 26): y = max(y0, 2 x_0, ..., 2 x_3) by
    ti.atomic_max, loss = 3 y. The adjoint sent 3 to the winning x and also left y.grad = 3 for
    y0, which lost: d loss / d y0 must be 0 (and 3 where y0 wins)."""
    x = ti.field(ti.f32, shape=N, needs_grad=True)
    y = ti.field(ti.f32, shape=(), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    sign = 1.0 if kind == "max" else -1.0

    atomic = ti.atomic_max if kind == "max" else ti.atomic_min

    @ti.kernel
    def extreme():
        for i in range(N):
            atomic(y[None], 2.0 * x[i])

    @ti.kernel
    def total():
        loss[None] += 3.0 * y[None]

    x0 = np.array([0.1, 0.7, -0.3, 0.4]) * sign
    for y0 in (0.2 * sign, 2.0 * sign):   # beaten by 2 x_1, then winning
        x.from_numpy(x0.astype(np.float32))
        y[None] = y0

        def f(v, y0=y0):
            return 3.0 * (max(y0, *(2 * v)) if kind == "max" else min(y0, *(2 * v)))
        with ti.ad.Tape(loss):
            extreme()
            total()
        assert loss[None] == pytest.approx(f(x0), rel=1e-6)
        assert_grad(x.grad.to_numpy(), central_diff(f, x0))
        assert y.grad[None] == (0.0 if abs(y0) < 1 else 3.0)


def test_atomic_min_of_a_constant_takes_the_gradient_from_the_value_it_beat():
    """fuzz seed 0 (reduced): ti.atomic_min(x[i], k * 0.28) in a serial loop, of constants (no
    gradient to give): where a constant wins, x's initial value lost and gets none (it kept
    d loss / d x = 1 before)."""
    x = ti.field(ti.f32, shape=N, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def clamp():
        for i in range(N):
            for k in range(2):
                ti.atomic_min(x[i], k * 0.28)

    @ti.kernel
    def total():
        for i in range(N):
            loss[None] += ti.sin(x[i] + 0.3)

    x0 = np.array([-0.5, 0.1, 0.6, -0.2])
    x.from_numpy(x0.astype(np.float32))
    with ti.ad.Tape(loss):
        clamp()
        total()
    x32 = x0.astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(x.to_numpy(), np.minimum(x32, 0.0), atol=1e-7)
    np.testing.assert_allclose(x.grad.to_numpy(), np.where(x32 < 0, np.cos(x32 + 0.3), 0.0), rtol=1e-6)


def test_atomic_max_winner_found_when_the_replay_rounds_differently():
    """fuzz seed 340 (reduced): ti.atomic_max(X[i], |h(c)|), h a helper with a serial loop of
    sin / atan2 / cos. The adjoint recomputes |h(c)| in its own shader, whose compiler may round
    it differently (in 12 of these 41 values of c on lavapipe), and compared it with X's final
    value for equality: no winner found, X's initial value kept the gradient 2 * 0.73 * X.
    The winner is now the value equal to the final one up to a few ulps."""
    X = ti.field(ti.f32, shape=3, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.func
    def h(p):
        r = p
        for _ in range(2):
            r = ti.sin(r) * 0.5 + (ti.atan2(p, 1.5 + ti.cos(p)) - (r + r))
        return r

    @ti.kernel
    def raise_to(c: ti.f32):
        for i in range(3):
            ti.atomic_max(X[i], ti.abs(h(c)))

    @ti.kernel
    def total():
        for i in range(3):
            loss[None] += 0.73 * X[i] * X[i]

    for c in np.linspace(-0.9, 0.9, 41):
        X.from_numpy(np.array([-0.5, -0.6, -0.7], np.float32))
        with ti.ad.Tape(loss):
            raise_to(float(c))
            total()
        np.testing.assert_array_equal(X.grad.to_numpy(), 0.0, err_msg=f"c = {c}")


def test_a_matrix_element_updated_under_an_if_in_serial_loops():
    """fuzz seed 570 (reduced): T[i] = 0.5 T[i] + B under `if k == 0` in a serial loop, T a
    matrix field. Its components' indices (4 i + c) are computed under the `if`, where nothing
    hoists them, so the element was not made a loop-carried local and the kernel was refused
    (a scalar field worked); they are computed again before the loop now."""
    T = ti.Matrix.field(2, 2, ti.f32, shape=N, needs_grad=True)
    s = ti.field(ti.f32, shape=N, needs_grad=True)
    cnt = ti.field(ti.i32, shape=N)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    W = np.array([[1.0, -2.0], [0.5, 3.0]])

    @ti.kernel
    def update():
        for i in range(N):
            for k9 in range(cnt[i]):
                B = ti.Matrix([[1.0, 0.0], [0.0, 1.0]])
                for k in range(cnt[i]):
                    B = B * 0.5 + ti.Matrix([[k9 * 0.25, k * 0.5], [1.0, s[i]]]) * s[i]
                    if k == 0:
                        T[i] = T[i] * 0.5 + B

    @ti.kernel
    def total():
        for i in range(N):
            loss[None] += (T[i] * ti.Matrix([[1.0, -2.0], [0.5, 3.0]])).sum()

    def f(t0, sv, cv):
        out = 0.0
        for i in range(N):
            t = t0[i].copy()
            for k9 in range(cv[i]):
                b = np.eye(2)
                for k in range(cv[i]):
                    b = b * 0.5 + np.array([[k9 * 0.25, k * 0.5], [1.0, sv[i]]]) * sv[i]
                    if k == 0:
                        t = t * 0.5 + b
            out += float((t * W).sum())
        return out

    rng = np.random.default_rng(3)
    t0 = rng.uniform(-1, 1, (N, 2, 2)).astype(np.float32).astype(np.float64)
    s0 = rng.uniform(-1, 1, N).astype(np.float32).astype(np.float64)
    c0 = np.array([0, 1, 2, 3])
    T.from_numpy(t0.astype(np.float32))
    s.from_numpy(s0.astype(np.float32))
    cnt.from_numpy(c0.astype(np.int32))
    with ti.ad.Tape(loss):
        update()
        total()
    assert loss[None] == pytest.approx(f(t0, s0, c0), rel=1e-5)
    assert_grad(T.grad.to_numpy(), central_diff(lambda v: f(v, s0, c0), t0))
    assert_grad(s.grad.to_numpy(), central_diff(lambda v: f(t0, v, c0), s0))
