"""In-place updates differentiated exactly (passes/autodiff/promote.py): the seed's recursive moving
average as written, x[i] = f(x[i]), and a simulation whose state is updated in place over many
launches on a tape. Gradients against float64 central differences or analytic derivatives."""
from __future__ import annotations

import numpy as np
import pytest

import wgpu_ad as ti
from ad_util import central_diff

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("form", ["assign", "scale_then_add"])
def test_the_recursive_ewma_of_the_seed_issue_as_written(form):
    """ewma[row] = 0.5 data[row, col] + 0.5 ewma[row] in a serial loop over col (Taichi and Warp
    give a silently wrong gradient): loss = sum ewma^2, against central differences of the same
    recursion in float64, for data and for ewma's initial values."""
    R, C = 4, 6
    data = ti.field(ti.f32, shape=(R, C), needs_grad=True)
    ewma = ti.field(ti.f32, shape=R, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    if form == "assign":
        @ti.kernel
        def smooth():
            for row in range(R):
                for col in range(C):
                    ewma[row] = 0.5 * data[row, col] + 0.5 * ewma[row]
    else:
        @ti.kernel
        def smooth():
            for row in range(R):
                for col in range(C):
                    ewma[row] *= 0.5
                    ewma[row] += 0.5 * data[row, col]

    @ti.kernel
    def total():
        for row in range(R):
            loss[None] += ewma[row] ** 2

    rng = np.random.default_rng(1)
    d0, e0 = rng.random((R, C)), rng.random(R)
    data.from_numpy(d0.astype(np.float32))
    ewma.from_numpy(e0.astype(np.float32))
    with ti.ad.Tape(loss):
        smooth()
        total()

    def f(d, e):
        for c in range(C):
            e = 0.5 * d[:, c] + 0.5 * e
        return (e ** 2).sum()
    assert loss[None] == pytest.approx(f(d0, e0), rel=1e-5)
    np.testing.assert_allclose(data.grad.to_numpy(), central_diff(lambda d: f(d, e0), d0), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(ewma.grad.to_numpy(), central_diff(lambda e: f(d0, e), e0), rtol=1e-4, atol=1e-6)


def test_an_element_updated_from_its_own_value():
    """x[i] = x[i]^2 + y[i], loss = sum x: dloss/dx (before) = 2 x, dloss/dy = 1; by hand with
    kernel.grad(), which uses the copy of x taken before the forward launch."""
    x = ti.field(ti.f32, shape=5, needs_grad=True)
    y = ti.field(ti.f32, shape=5, needs_grad=True)

    @ti.kernel
    def square_add():
        for i in x:
            x[i] = x[i] * x[i] + y[i]

    x0 = np.linspace(-1.0, 1.0, 5)
    x.from_numpy(x0.astype(np.float32))
    y.fill(0.5)
    square_add()
    np.testing.assert_allclose(x.to_numpy(), x0 ** 2 + 0.5, rtol=1e-6)
    x.grad.fill(1.0)
    square_add.grad()
    np.testing.assert_allclose(x.grad.to_numpy(), 2 * x0, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(y.grad.to_numpy(), np.ones(5))
    with pytest.raises(ti.WgpuAdError, match=r"square_add.grad\(\): kernel 'square_add' updates field 'x' in "
                                             r"place, so its gradient needs the values from before its forward "
                                             r"launch, and none were kept"):
        square_add.grad()  # the copy was used up by the first .grad()


def test_a_simulation_updated_in_place_over_many_launches():
    """A damped oscillator per particle, state (x, v) updated in place by one kernel launched 50
    times on a tape (one copy per launch is kept); loss = sum x_T^2 against float64 central
    differences of the same integrator in the initial velocities and the stiffness."""
    n, steps, dt = 6, 50, 0.05
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    v = ti.field(ti.f32, shape=n, needs_grad=True)
    k = ti.field(ti.f32, shape=(), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def step():
        for i in x:
            v[i] = v[i] * 0.99 - dt * k[None] * x[i]
            x[i] = x[i] + dt * v[i]

    @ti.kernel
    def total():
        for i in x:
            loss[None] += x[i] ** 2

    x0 = np.linspace(0.1, 1.0, n)
    v0 = np.linspace(-0.5, 0.5, n)
    k0 = 3.0

    def simulate(vv, kk):
        xx, vv = x0.copy(), vv.copy()
        for _ in range(steps):
            vv = vv * 0.99 - dt * kk * xx
            xx = xx + dt * vv
        return (xx ** 2).sum()

    x.from_numpy(x0.astype(np.float32))
    v.from_numpy(v0.astype(np.float32))
    k[None] = k0
    with ti.ad.Tape(loss):
        for _ in range(steps):
            step()
        total()
    assert loss[None] == pytest.approx(simulate(v0, k0), rel=1e-4)
    np.testing.assert_allclose(v.grad.to_numpy(), central_diff(lambda vv: simulate(vv, k0), v0), rtol=1e-3, atol=1e-5)
    dk = (simulate(v0, k0 + 1e-6) - simulate(v0, k0 - 1e-6)) / 2e-6
    assert k.grad[None] == pytest.approx(dk, rel=1e-3)


def test_the_copies_are_reused_after_the_backward_pass():
    """The copy an adjoint read goes back to the kernel's pool: the next launch copies into it
    (no allocation per launch in a loop of forward + backward)."""
    x = ti.field(ti.f32, shape=8, needs_grad=True)

    @ti.kernel
    def cube():
        for i in x:
            x[i] = x[i] * x[i] * x[i]

    seen = set()
    for it in range(3):
        x.from_numpy(np.full(8, 0.5 + it, np.float32))
        cube()
        _refs, (copies,) = next(iter(cube._keep.snaps.values()))
        seen.add(id(copies[0]))
        x.grad.fill(1.0)
        cube.grad()
        np.testing.assert_allclose(x.grad.to_numpy(), np.full(8, 3 * (0.5 + it) ** 2), rtol=1e-6)
    assert len(seen) == 1


def test_a_thread_adds_to_its_own_element_from_its_value():
    """v[i] += 0.5 * v[i]: an add to the thread's own element after reading it (no other thread
    touches it, so it is a plain read-modify-write): loss = sum v^2 after it, dloss/dv0 = 2 * 1.5^2 v0."""
    n = 8
    v = ti.field(ti.f32, shape=n, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def grow():
        for i in v:
            v[i] += 0.5 * v[i]

    @ti.kernel
    def total():
        for i in v:
            loss[None] += v[i] * v[i]

    v0 = np.arange(n, dtype=np.float32)
    v.from_numpy(v0)
    with ti.ad.Tape(loss):
        grow()
        total()
    np.testing.assert_allclose(v.to_numpy(), 1.5 * v0)
    np.testing.assert_allclose(v.grad.to_numpy(), 2 * 1.5 ** 2 * v0, rtol=1e-6)


@pytest.mark.parametrize("form", ["augmented", "component", "matrix"])
def test_a_vector_element_updated_in_place_with_augmented_assignment(form):
    """x[i] += 0.1 * sin(x[i]) on a vector (or matrix) field, as G2P writes `x[p] += dt * v`: the
    components are stored one after the other, so x[i][1] is read after x[i][0] was stored; that
    read is of another element and must read the value from before the launch (it was refused as
    'reads field x and then overwrites what it read'). loss = sum |x|^2 after it:
    d/dx0 = 2 (x0 + 0.1 sin x0) (1 + 0.1 cos x0), componentwise."""
    n = 4
    shape = (2, 2) if form == "matrix" else (2,)
    x = (ti.Matrix.field(2, 2, ti.f32, shape=n, needs_grad=True) if form == "matrix"
         else ti.Vector.field(2, ti.f32, shape=n, needs_grad=True))
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    if form == "component":
        @ti.kernel
        def step():
            for i in x:
                x[i][0] += 0.1 * ti.sin(x[i][0])
                x[i][1] += 0.1 * ti.sin(x[i][1])
    else:
        @ti.kernel
        def step():
            for i in x:
                x[i] += 0.1 * ti.sin(x[i])

    @ti.kernel
    def total():
        for i in x:
            loss[None] += x[i].norm_sqr()

    x0 = np.random.default_rng(3).uniform(-2, 2, (n,) + shape)
    x.from_numpy(x0.astype(np.float32))
    with ti.ad.Tape(loss):
        step()
        total()
    x1 = x0 + 0.1 * np.sin(x0)
    np.testing.assert_allclose(x.to_numpy(), x1, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(x.grad.to_numpy(), 2 * x1 * (1 + 0.1 * np.cos(x0)), rtol=1e-5, atol=1e-6)


def test_an_integer_counter_updated_in_the_serial_loop():
    """The seed's control-flow counter: sample[row] += 1 in the serial loop, its value read each
    iteration (here as a running-mean weight): the replay needs the counter's value from before
    the launch. Against central differences of the same recursion in float64."""
    R, C = 4, 6
    data = ti.field(ti.f32, shape=(R, C), needs_grad=True)
    sample = ti.field(ti.i32, shape=R)
    mean = ti.field(ti.f32, shape=R, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def running_mean():
        for row in range(R):
            for col in range(C):
                w = 1.0 / (sample[row] + 1.0)
                mean[row] = w * data[row, col] + (1 - w) * mean[row]
                sample[row] += 1

    @ti.kernel
    def total():
        for r in mean:
            loss[None] += mean[r] ** 2

    def ref(d):
        m = np.zeros(R)
        for c in range(C):
            w = 1 / (c + 1)
            m = w * d[:, c] + (1 - w) * m
        return (m ** 2).sum()

    d0 = np.random.default_rng(3).random((R, C)).astype(np.float32)
    data.from_numpy(d0)
    with ti.ad.Tape(loss):
        running_mean()
        total()
    np.testing.assert_array_equal(sample.to_numpy(), np.full(R, C))
    np.testing.assert_allclose(data.grad.to_numpy(), central_diff(ref, d0), rtol=1e-4, atol=1e-6)


def test_the_seed_counter_indexed_ewma_as_written():
    """Seed 003's calc_ewma_err, which Taichi flags as a data-access violation: the column comes
    from a counter `sample[row] += 1` stepped once per iteration of the serial loop. The counter
    is an induction variable (its value is affine in the loop index), so each element of ewma is
    written once and read in a later iteration: the gradient is exact. Against central
    differences of the EWMA in float64."""
    R, C = 3, 5
    data = ti.field(ti.f32, shape=(R, C), needs_grad=True)
    ewma = ti.field(ti.f32, shape=(R, C), needs_grad=True)
    sample = ti.field(ti.i32, shape=R)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def calc_ewma_err():
        for row in range(R):
            for col in range(C):
                col_idx = sample[row]
                if col_idx == 0:
                    ewma[row, col_idx] = data[row, col_idx]
                else:
                    ewma[row, col_idx] = ewma[row, col_idx - 1] * 0.5 + data[row, col_idx] * 0.5
                sample[row] += 1

    @ti.kernel
    def last_squared():
        for r in range(R):
            loss[None] += ewma[r, C - 1] ** 2

    def ref(d):
        e = d[:, 0].copy()
        for c in range(1, C):
            e = 0.5 * e + 0.5 * d[:, c]
        return (e ** 2).sum()

    d0 = np.random.default_rng(4).random((R, C)).astype(np.float32)
    data.from_numpy(d0)
    with ti.ad.Tape(loss):
        calc_ewma_err()
        last_squared()
    assert loss[None] == pytest.approx(ref(d0.astype(np.float64)), rel=1e-5)
    np.testing.assert_array_equal(sample.to_numpy(), np.full(R, C))
    np.testing.assert_allclose(data.grad.to_numpy(), central_diff(ref, d0), rtol=1e-4, atol=1e-6)
