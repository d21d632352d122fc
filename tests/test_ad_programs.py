"""Reverse mode on whole programs from the seeds and Taichi's guide, with kernel.grad, against
analytic derivatives and float64 NumPy central differences."""
import numpy as np
import pytest

import wgpu_ad as ti
from ad_util import central_diff

pytestmark = pytest.mark.gpu


def test_guide_sin():
    x = ti.field(dtype=ti.f32, shape=(), needs_grad=True)
    y = ti.field(dtype=ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def compute_y():
        y[None] = ti.sin(x[None])

    for v in (0.0, 0.7, -2.3):
        x[None] = v
        x.grad[None] = 0
        compute_y()
        y.grad[None] = 1.0
        compute_y.grad()
        assert x.grad[None] == pytest.approx(np.cos(v), abs=1e-6)


def test_gravity_forces_are_minus_dU_dx():
    N = 16
    x = ti.Vector.field(2, dtype=ti.f32, shape=N, needs_grad=True)
    U = ti.field(dtype=ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def compute_U():
        for i, j in ti.ndrange(N, N):
            r = x[i] - x[j]
            U[None] += -1 / r.norm(1e-3)

    pos = np.random.default_rng(0).random((N, 2)).astype(np.float32)
    x.from_numpy(pos)
    compute_U()
    U.grad[None] = 1.0
    compute_U.grad()
    p = pos.astype(np.float64)
    d = p[:, None, :] - p[None, :, :]
    r2 = (d ** 2).sum(-1) + 1e-3
    ref = 2 * (d / r2[..., None] ** 1.5).sum(1)   # dU/dx_k: the (k, j) and (j, k) terms
    np.testing.assert_allclose(x.grad.to_numpy(), ref, rtol=1e-4, atol=1e-3 * np.abs(ref).max())


def test_kernel_grad_with_two_losses_and_user_seeds():
    n = 8
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    a = ti.field(ti.f32, shape=(), needs_grad=True)
    b = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def two():
        for i in x:
            a[None] += x[i] ** 2
            b[None] += ti.sin(x[i])

    xv = np.linspace(-1, 1, n).astype(np.float32)
    x.from_numpy(xv)
    two()
    a.grad[None] = 2.0
    b.grad[None] = -3.0
    two.grad()
    np.testing.assert_allclose(x.grad.to_numpy(), 2.0 * 2 * xv - 3.0 * np.cos(xv), rtol=1e-5, atol=1e-6)


def test_ewma_with_explicit_per_step_storage():
    rows, cols = 3, 6
    data = ti.field(ti.f32, shape=(rows, cols), needs_grad=True)
    ewma = ti.field(ti.f32, shape=(rows, cols), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def calc_ewma():
        for row in range(rows):
            for col in range(cols):
                if col == 0:
                    ewma[row, col] = data[row, col]
                else:
                    ewma[row, col] = 0.5 * data[row, col] + 0.5 * ewma[row, col - 1]

    @ti.kernel
    def calc_loss():
        for row in range(rows):
            loss[None] += ewma[row, cols - 1] ** 2

    d0 = np.random.default_rng(1).random((rows, cols)).astype(np.float32)
    data.from_numpy(d0)
    calc_ewma()
    calc_loss()
    loss.grad[None] = 1.0
    calc_loss.grad()
    calc_ewma.grad()

    def f(d):
        e = d[:, 0]
        for c in range(1, cols):
            e = 0.5 * d[:, c] + 0.5 * e
        return (e ** 2).sum()
    np.testing.assert_allclose(data.grad.to_numpy(), central_diff(f, d0), rtol=1e-4, atol=1e-6)


def test_recursive_ewma_is_differentiated_exactly():
    """The seed's recursive form with its first column in a branch: the element is promoted to a
    loop-carried local and the read of its initial value replays a copy taken before the launch
    (passes/autodiff/promote.py; it used to be refused). ewma = 0.5 d1 + 0.5 d0 (d0 overwrites the
    initial value): d ewma / d d = (0.5, 0.5), d ewma / d ewma_initial = 0."""
    data = ti.field(ti.f32, shape=(1, 2), needs_grad=True)
    ewma = ti.field(ti.f32, shape=1, needs_grad=True)

    @ti.kernel
    def calc_ewma():
        for row in range(1):
            for col in range(2):
                if col == 0:
                    ewma[row] = data[row, col]
                else:
                    ewma[row] = 0.5 * data[row, col] + 0.5 * ewma[row]

    data.from_numpy(np.array([[2.0, 4.0]], np.float32))
    ewma[0] = 7.0
    calc_ewma()
    assert ewma[0] == 3.0
    ewma.grad.fill(1.0)
    calc_ewma.grad()
    np.testing.assert_array_equal(data.grad.to_numpy(), [[0.5, 0.5]])
    assert ewma.grad[0] == 0.0


def test_guide_rule_1_read_then_mutate_at_top_level():
    """Taichi's guide breaks rule 1 at the kernel's top level (one thread, run once): the read of
    b replays the copy taken before the launch, so the gradient is exact (issue 26 item 6; it
    used to be refused). loss = x1 b: d/dx1 = b = 5, d/db = x1 = 2."""
    x = ti.field(dtype=ti.f32, shape=16, needs_grad=True)
    loss = ti.field(dtype=ti.f32, shape=(), needs_grad=True)
    b = ti.field(dtype=ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def func_broke_rule_1():
        loss[None] = x[1] * b[None]
        b[None] += 100

    x[1], b[None] = 2.0, 5.0
    func_broke_rule_1()
    assert (loss[None], b[None]) == (10.0, 105.0)
    loss.grad[None] = 1.0
    func_broke_rule_1.grad()
    assert (x.grad[1], b.grad[None]) == (5.0, 2.0)


def test_guide_rule_2_second_write_at_top_level():
    """loss += x1^2, then loss *= x2 at the top level: loss = (loss0 + x1^2) x2; d/dx1 = 2 x1 x2 =
    12, d/dx2 = loss0 + x1^2 = 4, d/dloss0 = x2 = 3 (it used to be refused)."""
    x = ti.field(dtype=ti.f32, shape=16, needs_grad=True)
    loss = ti.field(dtype=ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def func_break_rule_2():
        loss[None] += x[1] ** 2
        loss[None] *= x[2]

    x[1], x[2] = 2.0, 3.0
    func_break_rule_2()
    assert loss[None] == 12.0
    loss.grad[None] = 1.0
    func_break_rule_2.grad()
    assert (x.grad[1], x.grad[2], loss.grad[None]) == (12.0, 4.0, 3.0)


def test_mass_spring_backprop_through_60_steps():
    n, steps, dt = 6, 60, 0.01
    k_spring, rest, damping = 40.0, 0.2, 0.995
    x = ti.Vector.field(2, ti.f32, shape=(steps + 1, n), needs_grad=True)
    v = ti.Vector.field(2, ti.f32, shape=(steps + 1, n), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def step(t: ti.i32):
        for i in range(n):
            f = ti.Vector([0.0, -9.8])
            for k in ti.static([-1, 1]):
                j = i + k
                if 0 <= j < n:
                    d = x[t, j] - x[t, i]
                    length = d.norm(1e-6)
                    f += k_spring * (length - rest) * d / length
            v[t + 1, i] = v[t, i] * damping + dt * f
            x[t + 1, i] = x[t, i] + dt * v[t + 1, i]

    @ti.kernel
    def compute_loss():
        d = x[steps, n - 1] - ti.Vector([0.9, 0.1])
        loss[None] = d.dot(d)

    x0 = np.stack([np.linspace(0, 1, n), np.zeros(n)], 1).astype(np.float32)
    v0 = np.random.default_rng(2).normal(0, 0.5, (n, 2)).astype(np.float32)

    def run():
        xs = np.zeros((steps + 1, n, 2), np.float32)
        vs = np.zeros((steps + 1, n, 2), np.float32)
        xs[0], vs[0] = x0, v0
        x.from_numpy(xs)
        v.from_numpy(vs)
        for t in range(steps):
            step(t)
        compute_loss()

    run()
    loss.grad[None] = 1.0
    compute_loss.grad()
    for t in reversed(range(steps)):
        step.grad(t)
    got = v.grad.to_numpy()[0]

    def f(v0_):
        xs, vs = x0.astype(np.float64), v0_
        for _ in range(steps):
            fs = np.tile([0.0, -9.8], (n, 1))
            for i in range(n):
                for kk in (-1, 1):
                    j = i + kk
                    if 0 <= j < n:
                        d = xs[j] - xs[i]
                        ln = np.sqrt((d ** 2).sum() + 1e-6)
                        fs[i] += k_spring * (ln - rest) * d / ln
            vs = vs * damping + dt * fs
            xs = xs + dt * vs
        d = xs[n - 1] - np.array([0.9, 0.1])
        return (d ** 2).sum()
    ref = central_diff(f, v0.astype(np.float64))
    assert loss[None] == pytest.approx(f(v0.astype(np.float64)), rel=1e-3)
    np.testing.assert_allclose(got, ref, rtol=2e-3, atol=2e-3 * np.abs(ref).max())


def test_plain_store_of_one_element_from_every_thread_is_refused():
    x = ti.field(ti.f32, shape=8, needs_grad=True)
    y = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def last_one_wins():
        for i in x:
            y[None] = x[i] * 2

    last_one_wins()
    with pytest.raises(ti.CompileError) as e:
        last_one_wins.grad()
    assert str(e.value).splitlines()[0] == (
        "cannot differentiate kernel 'last_one_wins': it stores to field 'y' (line "
        f"{e.value.loc.line}) inside a loop, and the same element may be stored by more than one iteration "
        "or thread; only the last value survives, so the gradient would be silently wrong. Index the field "
        "by every loop variable, or accumulate with += (atomic add)")


def test_adding_an_amount_read_from_the_same_field_at_a_shared_index_is_refused_by_name():
    """`s[i + j] += x[i, j] * s[i + j]` over an ndrange: i + j is the same element for several
    threads, and each reads s while the others add to it (a race in the values themselves). The
    error says so and names the fix; the same loop adding an amount that does not read s is
    exact (gradient 1 per element of x, analytic)."""
    x = ti.field(ti.f32, shape=(4, 4), needs_grad=True)
    s = ti.field(ti.f32, shape=8, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def racy():
        for i, j in ti.ndrange(4, 4):
            s[i + j] += x[i, j] * s[i + j]

    @ti.kernel
    def fine():
        for i, j in ti.ndrange(4, 4):
            s[i + j] += x[i, j]

    @ti.kernel
    def total():
        for k in s:
            loss[None] += s[k]

    with pytest.raises(ti.CompileError) as e:
        racy.grad()
    assert str(e.value).splitlines()[0] == (
        f"cannot differentiate kernel 'racy': it adds to field 's' (line {e.value.loc.line}) inside a loop an "
        "amount computed from 's' itself, and the same element may be updated by more than one iteration or "
        "thread at once, so what each reads depends on the others' timing: the values and the gradient would "
        "be silently wrong. Compute the amount from values the loop does not change (copy 's' into another "
        "field in an earlier kernel and read the copy here), then add it with += (atomic add)")
    x.fill(2.0)
    with ti.ad.Tape(loss=loss):
        fine()
        total()
    assert loss[None] == 32.0
    np.testing.assert_array_equal(x.grad.to_numpy(), np.ones((4, 4), np.float32))

def test_ndrange_store_per_element_is_accepted():
    n = 5
    x = ti.field(ti.f32, shape=(n, n), needs_grad=True)
    y = ti.field(ti.f32, shape=(n, n), needs_grad=True)

    @ti.kernel
    def square():
        for i, j in ti.ndrange(n, n):
            y[i, j] = x[i, j] * x[j, i]

    xv = np.random.default_rng(3).random((n, n)).astype(np.float32)
    x.from_numpy(xv)
    square()
    y.grad.fill(1.0)
    square.grad()
    np.testing.assert_allclose(x.grad.to_numpy(), 2 * xv.T, rtol=1e-6)


def test_random_in_differentiated_kernel_is_refused():
    x = ti.field(ti.f32, shape=4, needs_grad=True)
    y = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def noisy():
        for i in x:
            y[None] += x[i] * ti.random()

    noisy()
    with pytest.raises(ti.CompileError, match="it calls ti.random\\(\\); the gradient kernel replays"):
        noisy.grad()


def test_a_kernel_with_nothing_to_differentiate_is_not_refused():
    """On a tape, kernels that store only integers or fields without gradients have an empty
    adjoint: binning particles with the slot returned by ti.atomic_add (a neighbour list), and
    noise from ti.random() into a field without gradient, are not refused as 'uses the value
    returned by an atomic operation' / 'calls ti.random()'. loss = sum_i x_i * noise_i * (the
    number of particles in x_i's cell): d/dx_i = noise_i * count."""
    n = 6
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    noise = ti.field(ti.f32, shape=n)
    count = ti.field(ti.i32, shape=2)
    members = ti.field(ti.i32, shape=(2, n))
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def bin_particles():
        for i in x:
            c = ti.cast(x[i] > 0.5, ti.i32)
            k = ti.atomic_add(count[c], 1)
            members[c, k] = i

    @ti.kernel
    def draw():
        for i in noise:
            noise[i] = 1.0 + ti.random()

    @ti.kernel
    def total():
        for c in range(2):
            for k in range(count[c]):
                i = members[c, k]
                loss[None] += x[i] * noise[i] * count[c]

    x0 = np.array([0.1, 0.7, 0.2, 0.9, 0.3, 0.4])
    x.from_numpy(x0.astype(np.float32))
    with ti.ad.Tape(loss):
        bin_particles()
        draw()
        total()
    cnt = np.where(x0 > 0.5, (x0 > 0.5).sum(), (x0 <= 0.5).sum())
    np.testing.assert_array_equal(count.to_numpy(), [4, 2])
    np.testing.assert_allclose(x.grad.to_numpy(), noise.to_numpy() * cnt, rtol=1e-6)


@pytest.mark.parametrize("validation", [False, True])
def test_tape_refuses_a_kernel_overwriting_what_an_earlier_one_read(validation):
    """From footprints, or (validation=True) from the values; a TaichiAssertionError either way, as
    Taichi code that catches that expects."""
    x = ti.field(ti.f32, shape=4, needs_grad=True)
    y = ti.field(ti.f32, shape=4, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def use_x():
        for i in x:
            y[i] = x[i] * 3

    @ti.kernel
    def scale_x():
        for i in x:
            x[i] = 0.0

    @ti.kernel
    def total():
        for i in y:
            loss[None] += y[i]

    x.fill(1.0)  # (validation=True compares values: scale_x must change what use_x read)
    with pytest.raises(ti.TaichiAssertionError) as e:
        with ti.ad.Tape(loss, validation=validation):
            use_x()
            scale_x()
            total()
    assert str(e.value).startswith(
        "ti.ad.Tape(validation=True): kernel 'use_x' read field 'x', which kernel 'scale_x' overwrote later"
        if validation else
        "ti.ad.Tape: kernel 'scale_x' (launch 2 on the tape) writes elements of field 'x' that kernel "
        "'use_x' (launch 1) read before")


def test_tape_accepts_a_second_store_into_the_same_elements():
    """k2 stores over k1's value, which nothing read: the gradient flows through k2 only
    (loss = 5z: dloss/dx = 0, dloss/dz = 5; it used to be refused)."""
    x = ti.field(ti.f32, shape=(), needs_grad=True)
    z = ti.field(ti.f32, shape=(), needs_grad=True)
    y = ti.field(ti.f32, shape=(), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def k1():
        y[None] = 3 * x[None]

    @ti.kernel
    def k2():
        y[None] = 5 * z[None]

    @ti.kernel
    def k3():
        loss[None] += y[None]

    x[None], z[None] = 2.0, 3.0
    with ti.ad.Tape(loss):
        k1()
        k2()
        k3()
    assert (loss[None], x.grad[None], z.grad[None]) == (15.0, 0.0, 5.0)


def test_tape_accepts_step_indexed_state_and_matches_central_differences():
    steps = 20
    x = ti.field(ti.f32, shape=steps + 1, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def advance(t: ti.i32):
        x[t + 1] = x[t] + 0.1 * ti.sin(x[t])

    @ti.kernel
    def final():
        loss[None] = x[steps] ** 2

    for x0 in (0.3, 2.0):
        x[0] = x0
        with ti.ad.Tape(loss):
            for t in range(steps):
                advance(t)
            final()

        def f(v):
            v = v[0]
            for _ in range(steps):
                v = v + 0.1 * np.sin(v)
            return v ** 2
        assert x.grad[0] == pytest.approx(central_diff(f, np.array([x0]))[0], rel=1e-4)


def test_ndarray_arguments_are_differentiable():
    """Seed 002: a kernel with ndarray arguments, its gradient through kernel.grad."""
    n = 16

    @ti.kernel
    def energy(x: ti.types.ndarray(), w: ti.types.ndarray(), out: ti.types.ndarray()):
        for i in range(x.shape[0]):
            out[i] = w[i] * ti.sin(x[i]) ** 2

    x = ti.ndarray(ti.f32, shape=n, needs_grad=True)
    w = ti.ndarray(ti.f32, shape=n, needs_grad=True)
    out = ti.ndarray(ti.f32, shape=n, needs_grad=True)
    rng = np.random.default_rng(7)
    xv, wv = rng.uniform(-2, 2, n).astype(np.float32), rng.uniform(0.5, 1.5, n).astype(np.float32)
    seed = rng.uniform(-1, 1, n).astype(np.float32)
    x.from_numpy(xv)
    w.from_numpy(wv)
    energy(x, w, out)
    out.grad.from_numpy(seed)
    energy.grad(x, w, out)
    x64, w64 = xv.astype(np.float64), wv.astype(np.float64)
    np.testing.assert_allclose(out.to_numpy(), w64 * np.sin(x64) ** 2, rtol=1e-5)
    np.testing.assert_allclose(x.grad.to_numpy(), seed * w64 * 2 * np.sin(x64) * np.cos(x64), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(w.grad.to_numpy(), seed * np.sin(x64) ** 2, rtol=1e-4, atol=1e-6)


def test_no_grad_kernel_has_no_gradient():
    x = ti.field(ti.f32, shape=4, needs_grad=True)
    y = ti.field(ti.f32, shape=4, needs_grad=True)

    @ti.ad.no_grad
    @ti.kernel
    def copy():
        for i in x:
            y[i] = x[i]

    copy()
    y.grad.fill(1.0)
    copy.grad()
    assert x.grad.to_numpy().tolist() == [0.0] * 4
