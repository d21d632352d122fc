"""ti.ad.checkpoint (wgpu_ad/ad/checkpoint.py): in-place simulations differentiated through
recomputation. Every schedule's gradients against float64 central differences of the same
integrator in NumPy (a mass-spring chain; a 6 x 6 cloth over 1000 steps); the copies each schedule
keeps (revolve and bisect: about log2 T, up to T = 10000; store_all: T + 2); what would make a step
run differently the second time (random numbers, hidden state, read-backs, Python-scope writes),
with the refusals' messages asserted."""
from __future__ import annotations

import math

import numpy as np
import pytest

import wgpu_ad as ti
from ad_util import central_diff

pytestmark = pytest.mark.gpu

N, DT, DAMP = 5, 0.02, 0.995


def _chain(steps: int, schedule: str):
    """A chain of N masses with springs to their neighbours, state (x, v) updated in place by one
    kernel per step; parameters k (stiffness) and v0 (the initial velocities, the state's start)."""
    x = ti.field(ti.f32, shape=N, needs_grad=True)
    v = ti.field(ti.f32, shape=N, needs_grad=True)
    k = ti.field(ti.f32, shape=(), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    rest = ti.field(ti.f32, shape=N)

    @ti.kernel
    def kick():
        for i in v:
            f = -k[None] * (x[i] - rest[i])
            if i > 0:
                f += 0.5 * k[None] * (x[i - 1] - rest[i - 1] - x[i] + rest[i])
            v[i] = v[i] * DAMP + DT * f

    @ti.kernel
    def drift():
        for i in x:
            x[i] = x[i] + DT * v[i]

    @ti.kernel
    def total():
        for i in x:
            loss[None] += x[i] * x[i] * (i + 1)

    def step(t):
        kick()
        drift()

    rest.from_numpy(np.linspace(0, 1, N).astype(np.float32))
    return x, v, k, loss, step, total


def _simulate(v0, kk, x0, rest, steps):
    x, v = x0.copy(), v0.copy()
    for _ in range(steps):
        f = -kk * (x - rest)
        f[1:] += 0.5 * kk * (x[:-1] - rest[:-1] - x[1:] + rest[1:])
        v = v * DAMP + DT * f
        x = x + DT * v
    return float((x * x * np.arange(1, N + 1)).sum())


@pytest.mark.parametrize("schedule", ["revolve", "bisect", "sqrt", "store_all"])
def test_gradients_through_a_checkpointed_in_place_simulation(schedule):
    steps = 40
    x, v, k, loss, step, total = _chain(steps, schedule)
    rest0 = np.linspace(0, 1, N)
    x0 = rest0 + np.linspace(0.1, -0.1, N)
    v0 = np.linspace(-0.3, 0.3, N)
    x.from_numpy(x0.astype(np.float32))
    v.from_numpy(v0.astype(np.float32))
    k[None] = 20.0
    with ti.ad.Tape(loss):
        stats = ti.ad.checkpoint(step, steps=steps, state=[x, v], schedule=schedule)
        total()
    assert loss[None] == pytest.approx(_simulate(v0, 20.0, x0, rest0, steps), rel=1e-4)
    want_v = central_diff(lambda vv: _simulate(vv, 20.0, x0, rest0, steps), v0)
    np.testing.assert_allclose(v.grad.to_numpy(), want_v, rtol=1e-3, atol=1e-5)
    want_x = central_diff(lambda xx: _simulate(v0, 20.0, xx, rest0, steps), x0)
    np.testing.assert_allclose(x.grad.to_numpy(), want_x, rtol=1e-3, atol=1e-5)
    dk = (_simulate(v0, 20.0 + 1e-5, x0, rest0, steps) - _simulate(v0, 20.0 - 1e-5, x0, rest0, steps)) / 2e-5
    assert k.grad[None] == pytest.approx(dk, rel=1e-3)
    # the fields hold the final state again
    np.testing.assert_allclose(loss[None], float((x.to_numpy() ** 2 * np.arange(1, N + 1)).sum()), rtol=1e-5)
    if schedule in ("revolve", "bisect"):
        assert stats.snapshots <= math.ceil(math.log2(steps)) + 3  # + the first, the last, a step's
    elif schedule == "store_all":
        assert stats.snapshots >= steps
    assert stats.recomputed_steps >= steps


@pytest.mark.parametrize("schedule", ["bisect"])
@pytest.mark.parametrize("steps", [1000])
def test_copies_grow_like_log_steps(steps, schedule):
    """The copies held at once grow like log2(steps) for bisect (revolve: test_revolve_keeps_log_t_copies)."""
    x, v, k, loss, step, total = _chain(steps, schedule)
    x.from_numpy(np.linspace(0.1, 1.1, N).astype(np.float32))
    k[None] = 5.0
    with ti.ad.Tape(loss):
        stats = ti.ad.checkpoint(step, steps=steps, state=[x, v], schedule=schedule)
        total()
    assert stats.snapshots <= math.ceil(math.log2(steps)) + 3
    assert stats.bytes == stats.snapshots * 2 * N * 4
    # bisect runs every step about log2(steps) times again; revolve's binomial split fewer
    limit = steps * (math.ceil(math.log2(steps)) + 2)
    assert steps <= stats.recomputed_steps <= limit


def test_revolve_with_few_snapshots_is_still_exact():
    """One free checkpoint for 12 steps: more recomputation, the same gradient as storing all."""
    grads = {}
    for schedule, snaps in (("store_all", None), ("revolve", 1)):
        x, v, k, loss, step, total = _chain(12, schedule)
        x.from_numpy(np.linspace(0.1, 1.1, N).astype(np.float32))
        k[None] = 7.0
        with ti.ad.Tape(loss):
            stats = ti.ad.checkpoint(step, steps=12, state=[x, v], snapshots=snaps, schedule=schedule)
            total()
        grads[schedule] = (x.grad.to_numpy(), v.grad.to_numpy(), k.grad[None], stats)
    np.testing.assert_allclose(grads["revolve"][0], grads["store_all"][0], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grads["revolve"][1], grads["store_all"][1], rtol=1e-5, atol=1e-7)
    assert grads["revolve"][2] == pytest.approx(grads["store_all"][2], rel=1e-5)
    assert grads["revolve"][3].snapshots <= 1 + 3 < grads["store_all"][3].snapshots


def test_bad_arguments_are_named():
    with pytest.raises(ti.WgpuAdError, match=r"unknown schedule 'binomial'; use one of revolve, bisect, sqrt, "
                                             r"store_all"):
        ti.ad.checkpoint(lambda t: None, steps=3, state=[ti.field(ti.f32, shape=2)], schedule="binomial")
    with pytest.raises(ti.WgpuAdError, match=r"snapshots must be a positive integer"):
        ti.ad.checkpoint(lambda t: None, steps=3, state=[ti.field(ti.f32, shape=2)], snapshots=0)
    with pytest.raises(ti.WgpuAdError, match=r"state must be a list of the fields"):
        ti.ad.checkpoint(lambda t: None, steps=3, state=[1.0])


def test_outside_a_tape_it_just_runs_the_steps():
    x = ti.field(ti.f32, shape=3)

    @ti.kernel
    def inc():
        for i in x:
            x[i] = x[i] + 1.0

    stats = ti.ad.checkpoint(lambda t: inc(), steps=7, state=[x])
    np.testing.assert_array_equal(x.to_numpy(), np.full(3, 7.0))
    assert stats.snapshots == 0 and stats.recomputed_steps == 0


# ---- what would make a step run differently the second time ----------------------------------------

def test_random_numbers_are_drawn_again_the_same():
    """A step draws noise with ti.random() (in a no_grad kernel, into a field the step writes before
    reading it): the backward pass reruns each step from its own position in the random stream, so
    the adjoints see the trajectory of the forward pass. The reference replays the logged noise."""
    steps = 30
    x, v, k, loss, step, total = _chain(steps, "revolve")
    noise = ti.field(ti.f32, shape=N)
    log = ti.field(ti.f32, shape=(steps, N))

    @ti.ad.no_grad
    @ti.kernel
    def draw(t: ti.i32):
        for i in noise:
            r = ti.random() - 0.5
            noise[i] = r
            log[t, i] = r

    @ti.kernel
    def shake():
        for i in x:
            x[i] = x[i] + 0.01 * noise[i]

    def noisy_step(t):
        draw(t)
        step(t)
        shake()

    rest0 = np.linspace(0, 1, N)
    x0 = rest0 + np.linspace(0.1, -0.1, N)
    v0 = np.linspace(-0.3, 0.3, N)
    x.from_numpy(x0.astype(np.float32))
    v.from_numpy(v0.astype(np.float32))
    k[None] = 20.0
    with ti.ad.Tape(loss):
        ti.ad.checkpoint(noisy_step, steps=steps, state=[x, v], snapshots=2)
        total()
    shakes = log.to_numpy().astype(np.float64)
    assert np.std(shakes) > 0.1  # really random

    def sim(xx):
        xs, vs = xx.copy(), v0.copy()
        for t in range(steps):
            f = -20.0 * (xs - rest0)
            f[1:] += 0.5 * 20.0 * (xs[:-1] - rest0[:-1] - xs[1:] + rest0[1:])
            vs = vs * DAMP + DT * f
            xs = xs + DT * vs + 0.01 * shakes[t]
        return float((xs * xs * np.arange(1, N + 1)).sum())

    assert loss[None] == pytest.approx(sim(x0), rel=1e-4)
    np.testing.assert_allclose(x.grad.to_numpy(), central_diff(sim, x0), rtol=1e-3, atol=1e-5)


def _two_kernel_step():
    x = ti.field(ti.f32, shape=4, needs_grad=True)
    f = ti.field(ti.f32, shape=4, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def push():
        for i in x:
            x[i] = x[i] + 0.1 * f[i]

    @ti.kernel
    def remember():
        for i in x:
            f[i] = 0.5 * x[i]

    @ti.kernel
    def total():
        for i in x:
            loss[None] += x[i]

    x.from_numpy(np.arange(4, dtype=np.float32))
    return x, f, loss, push, remember, total


def test_a_hidden_state_is_refused_with_its_name():
    """f is written by a step and read by the next one before being written again: it is state."""
    x, f, loss, push, remember, total = _two_kernel_step()

    def step(t):
        push()
        remember()

    with pytest.raises(ti.WgpuAdError, match=r"ti.ad.checkpoint: field 'f' carries values from one step to the next "
                                             r"but is not in state=: kernel 'push' reads it in step 0 before the step "
                                             r"writes it, and kernel 'remember' writes it in step 0\. .*add it to "
                                             r"state= \(state=\[x, f\]\)"):
        with ti.ad.Tape(loss):
            ti.ad.checkpoint(step, steps=5, state=[x])
            total()
    # with f in the state, the same steps are differentiated: x_{t+1} = x_t + 0.1 f_t, f_{t+1} = 0.5 x_{t+1}
    x, f, loss, push, remember, total = _two_kernel_step()
    with ti.ad.Tape(loss):
        ti.ad.checkpoint(step, steps=5, state=[x, f])
        total()

    def sim(x0, f0):
        xs, fs = x0.copy(), f0.copy()
        for _ in range(5):
            xs = xs + 0.1 * fs
            fs = 0.5 * xs
        return float(xs.sum())

    x0, f0 = np.arange(4.0), np.zeros(4)
    np.testing.assert_allclose(x.grad.to_numpy(), central_diff(lambda a: sim(a, f0), x0), rtol=1e-4)
    np.testing.assert_allclose(f.grad.to_numpy(), central_diff(lambda a: sim(x0, a), f0), rtol=1e-4)


def test_a_field_read_in_a_later_step_is_named():
    x, f, loss, push, remember, total = _two_kernel_step()

    def step(t):  # writes f after the step's reads, so the next step's push reads it
        if t == 0:
            remember()
        push()

    with pytest.raises(ti.WgpuAdError, match=r"field 'f' carries values from one step to the next but is not in "
                                             r"state=: kernel 'remember' writes it in step 0 and kernel 'push' reads "
                                             r"it in step 1 before the step writes it"):
        with ti.ad.Tape(loss):
            ti.ad.checkpoint(step, steps=3, state=[x])
            total()


@pytest.mark.parametrize("how", ["to_numpy", "item", "return"])
def test_reading_back_inside_a_step_is_refused(how):
    x, f, loss, push, remember, total = _two_kernel_step()

    @ti.kernel
    def peek() -> ti.f32:
        return x[0]

    def step(t):
        push()
        if how == "to_numpy":
            print(x.to_numpy())
        elif how == "item":
            print(x[1])
        else:
            print(peek())

    what = {"to_numpy": r"field 'x' \(to_numpy\(\)\)", "item": r"field 'x' \(x\[1\] in Python scope\)",
            "return": r"the return value of kernel 'peek'"}[how]
    with pytest.raises(ti.WgpuAdError, match=rf"ti.ad.checkpoint: step 0 reads {what} back to Python while it runs\. "
                                             r"The backward pass runs every step again .* log a value per step"):
        with ti.ad.Tape(loss):
            ti.ad.checkpoint(step, steps=3, state=[x])
            total()


def test_python_scope_writes_in_a_step_are_undone():
    """A force field cleared with fill() in Python scope, accumulated by one kernel and applied by the
    next: the backward pass undoes each launch (and the fill) to give every adjoint its inputs."""
    x = ti.field(ti.f32, shape=N, needs_grad=True)
    force = ti.field(ti.f32, shape=N, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def springs():
        for i in x:
            if i > 0:
                d = x[i] - x[i - 1] - 0.25
                force[i] -= 3.0 * d * d
                force[i - 1] += 3.0 * d * d

    @ti.kernel
    def move():
        for i in x:
            x[i] = x[i] + 0.05 * force[i]

    @ti.kernel
    def total():
        for i in x:
            loss[None] += x[i] * x[i] * (i + 1)

    def step(t):
        force.fill(0)
        springs()
        move()

    x0 = np.linspace(0, 1.2, N) + np.array([0.0, 0.05, -0.02, 0.03, 0.0])
    x.from_numpy(x0.astype(np.float32))
    with ti.ad.Tape(loss):
        ti.ad.checkpoint(step, steps=20, state=[x], snapshots=2)
        total()

    def sim(xx):
        xs = xx.copy()
        for _ in range(20):
            d = xs[1:] - xs[:-1] - 0.25
            fc = np.zeros(N)
            fc[1:] -= 3.0 * d * d
            fc[:-1] += 3.0 * d * d
            xs = xs + 0.05 * fc
        return float((xs * xs * np.arange(1, N + 1)).sum())

    assert loss[None] == pytest.approx(sim(x0), rel=1e-5)
    np.testing.assert_allclose(x.grad.to_numpy(), central_diff(sim, x0), rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("validation", [False, True])
def test_kernels_before_the_checkpoint_see_the_initial_state(validation):
    """A kernel launched on the tape before the checkpoint reads the state: its gradient runs after
    the checkpoint's backward pass and needs the state from before step 0 (the fields hold the final
    state again once the tape is done)."""
    x, v, k, loss, step, total = _chain(10, "revolve")

    @ti.kernel
    def start_cost():
        for i in x:
            loss[None] += 0.5 * x[i] * x[i] * x[i]

    rest0 = np.linspace(0, 1, N)
    x0 = rest0 + np.linspace(0.1, -0.1, N)
    v0 = np.linspace(-0.3, 0.3, N)
    x.from_numpy(x0.astype(np.float32))
    v.from_numpy(v0.astype(np.float32))
    k[None] = 20.0
    with ti.ad.Tape(loss, validation=validation):
        start_cost()
        ti.ad.checkpoint(step, steps=10, state=[x, v])
        total()

    def f(xx):
        return 0.5 * float((xx ** 3).sum()) + _simulate(v0, 20.0, xx, rest0, 10)

    np.testing.assert_allclose(x.grad.to_numpy(), central_diff(f, x0), rtol=1e-3, atol=1e-5)
    np.testing.assert_allclose(loss[None], f(x0), rtol=1e-5)
    np.testing.assert_allclose(loss[None] - 0.5 * float((x0 ** 3).sum()),
                               float((x.to_numpy() ** 2 * np.arange(1, N + 1)).sum()), rtol=1e-4)


def test_manual_use_with_a_tape_without_loss_and_kernel_grad():
    """Documented manual use: record the checkpoint on a ti.ad.Tape() without a loss, launch the loss
    kernel outside, seed its gradient, call total.grad() and then tape.grad()."""
    x, v, k, loss, step, total = _chain(12, "revolve")
    rest0 = np.linspace(0, 1, N)
    x0 = rest0 + np.linspace(0.1, -0.1, N)
    v0 = np.linspace(-0.3, 0.3, N)
    x.from_numpy(x0.astype(np.float32))
    v.from_numpy(v0.astype(np.float32))
    k[None] = 20.0
    with ti.ad.Tape() as tape:
        ti.ad.checkpoint(step, steps=12, state=[x, v])
    loss.fill(0)
    total()
    loss.grad[None] = 1.0
    total.grad()
    tape.grad()
    want = central_diff(lambda vv: _simulate(vv, 20.0, x0, rest0, 12), v0)
    np.testing.assert_allclose(v.grad.to_numpy(), want, rtol=1e-3, atol=1e-5)


def test_nested_checkpoints_are_refused():
    x, v, k, loss, step, total = _chain(4, "revolve")

    def outer(t):
        ti.ad.checkpoint(step, steps=2, state=[x, v])

    with pytest.raises(ti.WgpuAdError, match=r"ti.ad.checkpoint cannot be nested"):
        with ti.ad.Tape(loss):
            ti.ad.checkpoint(outer, steps=2, state=[x, v])
            total()


# ---- the cloth, written in place, over 1000 steps ---------------------------------------------------

CN, CT, CDT, CKS, CDAMP, CG = 6, 1000, 1e-3, 800.0, 0.999, 9.8
COFFS = [(-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 1), (1, -1), (1, 0), (1, 1)]
CTARGET = np.array([0.3, -0.4, 0.6])


def _cloth_reference(x0, v0, ks):
    """The loss of the in-place cloth in float64 NumPy, batched over leading axes of x0 / v0 / ks
    (each a perturbed copy), so that all the central differences run as one simulation."""
    dx = 1.0 / CN
    x, v = x0.astype(np.float64), v0.astype(np.float64)
    ks = np.asarray(ks, np.float64)[..., None, None, None]
    for _ in range(CT):
        f = np.zeros(np.broadcast_shapes(x.shape, v.shape))
        f[..., 1] = -CG
        for di, dj in COFFS:
            rest = dx * np.hypot(di, dj)
            i0, i1, j0, j1 = max(0, -di), CN - max(0, di), max(0, -dj), CN - max(0, dj)
            d = x[..., i0 + di:i1 + di, j0 + dj:j1 + dj, :] - x[..., i0:i1, j0:j1, :]
            length = np.sqrt((d ** 2).sum(-1, keepdims=True))
            f[..., i0:i1, j0:j1, :] += ks[..., :1, :1, :] * (length - rest) / length * d
        v = v * CDAMP + CDT * f
        x = x + CDT * v
    return ((x - CTARGET) ** 2).sum((-3, -2, -1)) / (CN * CN)


def _directional_diffs(x0, v0, ks, dirs, h=1e-6):
    """Float64 central differences of the loss along each direction (dx0, dv0, dks) in `dirs`,
    all in one batched simulation."""
    dxs = np.stack([d[0] for d in dirs])
    dvs = np.stack([d[1] for d in dirs])
    dks = np.array([d[2] for d in dirs], np.float64)
    both = np.concatenate([np.ones(len(dirs)), -np.ones(len(dirs))])[:, None, None, None]
    out = _cloth_reference(x0 + h * both * np.concatenate([dxs, dxs]), v0 + h * both * np.concatenate([dvs, dvs]),
                           ks + h * both[:, 0, 0, 0] * np.concatenate([dks, dks]))
    return (out[:len(dirs)] - out[len(dirs):]) / (2 * h)


def _cloth_inputs():
    rng = np.random.default_rng(3)
    g = (np.arange(CN) + 0.5) / CN
    a, b = np.meshgrid(g, g, indexing="ij")
    x0 = np.stack([b, np.zeros_like(a), a], -1) + rng.normal(0, 0.01, (CN, CN, 3))
    v0 = rng.normal(0, 0.2, (CN, CN, 3))
    return x0, v0


def _cloth_in_place(schedule, x0, v0):
    x = ti.Vector.field(3, ti.f32, shape=(CN, CN), needs_grad=True)
    v = ti.Vector.field(3, ti.f32, shape=(CN, CN), needs_grad=True)
    f = ti.Vector.field(3, ti.f32, shape=(CN, CN), needs_grad=True)
    ks = ti.field(ti.f32, shape=(), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    rest = [math.hypot(di, dj) / CN for di, dj in COFFS]
    tx, ty, tz = CTARGET

    @ti.kernel
    def forces():
        for i, j in ti.ndrange(CN, CN):
            acc = ti.Vector([0.0, -CG, 0.0])
            for k in ti.static(range(8)):
                i2, j2 = i + ti.static(COFFS[k][0]), j + ti.static(COFFS[k][1])
                if 0 <= i2 < CN and 0 <= j2 < CN:
                    d = x[i2, j2] - x[i, j]
                    length = d.norm()
                    acc += ks[None] * (length - ti.static(rest[k])) / length * d
            f[i, j] = acc

    @ti.kernel
    def integrate():
        for i, j in ti.ndrange(CN, CN):
            v[i, j] = v[i, j] * CDAMP + CDT * f[i, j]
            x[i, j] = x[i, j] + CDT * v[i, j]

    @ti.kernel
    def compute_loss():
        for i, j in ti.ndrange(CN, CN):
            d = x[i, j] - ti.Vector([tx, ty, tz])
            loss[None] += d.dot(d) / (CN * CN)

    def step(t):
        forces()
        integrate()

    x.from_numpy(x0.astype(np.float32))
    v.from_numpy(v0.astype(np.float32))
    ks[None] = CKS
    with ti.ad.Tape(loss):
        stats = ti.ad.checkpoint(step, steps=CT, state=[x, v], schedule=schedule)
        compute_loss()
    return loss[None], x.grad.to_numpy(), v.grad.to_numpy(), ks.grad[None], stats


def test_cloth_over_1000_steps_against_float64_central_differences():
    """A 6 x 6 cloth (springs to the 8 neighbours, gravity, damping) updated in place for 1000 steps:
    the gradients of the loss with respect to the initial positions, velocities and the stiffness
    (a parameter read by every step) from revolve, sqrt and store_all, each against float64 central
    differences of a NumPy simulation, and against each other to float32 noise."""
    x0, v0 = _cloth_inputs()
    want_loss = float(_cloth_reference(x0, v0, CKS))
    # directions: three random ones and two single entries for x0 and v0 each, and the stiffness
    rng = np.random.default_rng(4)
    zero = np.zeros((CN, CN, 3))
    dirs = []
    for which in (0, 1):
        picks = [rng.normal(size=(CN, CN, 3)) for _ in range(3)] + [np.eye(CN * CN * 3)[k].reshape(CN, CN, 3)
                                                                    for k in (7, 80)]
        dirs += [(p, zero, 0.0) if which == 0 else (zero, p, 0.0) for p in picks]
    dirs.append((zero, zero, 1.0))
    want = _directional_diffs(x0, v0, CKS, dirs)
    got = {}
    for schedule in ("revolve", "sqrt", "store_all"):
        loss, gx, gv, gk, stats = _cloth_in_place(schedule, x0, v0)
        assert loss == pytest.approx(want_loss, rel=1e-4)
        have = np.array([(gx * dx).sum() + (gv * dv).sum() + gk * dk for dx, dv, dk in dirs])
        np.testing.assert_allclose(have, want, rtol=2e-3, atol=1e-3 * np.abs(want).max(), err_msg=schedule)
        got[schedule] = (gx, gv, gk, stats)
    for schedule in ("sqrt", "store_all"):  # the same numbers, up to float32 rounding
        for k in (0, 1):
            scale = np.abs(got["revolve"][k]).max()
            np.testing.assert_allclose(got[schedule][k], got["revolve"][k], rtol=1e-4, atol=1e-5 * scale)
        assert got[schedule][2] == pytest.approx(got["revolve"][2], rel=1e-4)
    assert got["revolve"][3].snapshots <= math.ceil(math.log2(CT)) + 3 < got["sqrt"][3].snapshots
    assert got["store_all"][3].snapshots >= CT


# ---- memory: O(log T) copies for revolve, O(T) for store_all ---------------------------------------

def _oscillator(steps: int, schedule: str):
    """One mass on a spring, one in-place kernel per step (the smallest state: two floats), the
    loss x_T^2; returns (stats, dloss/dx0, dloss/dv0, dloss/dw)."""
    x = ti.field(ti.f32, shape=1, needs_grad=True)
    v = ti.field(ti.f32, shape=1, needs_grad=True)
    w = ti.field(ti.f32, shape=(), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def step():
        for i in x:
            vn = v[i] * 0.9995 - 1e-3 * w[None] * x[i]
            v[i] = vn
            x[i] = x[i] + 1e-3 * vn

    @ti.kernel
    def total():
        loss[None] = x[0] * x[0]

    x[0], v[0], w[None] = 1.0, 0.5, 4.0
    with ti.ad.Tape(loss):
        stats = ti.ad.checkpoint(lambda t: step(), steps=steps, state=[x, v], schedule=schedule)
        total()
    return stats, x.grad[0], v.grad[0], w.grad[None]


def _oscillator_reference(steps: int):
    """dloss/d(x0, v0, w) in float64: the step is linear in (x, v), so its Jacobian power is exact."""
    def loss(x0, v0, w):
        m = np.array([[1 - 1e-6 * w, 1e-3 * 0.9995], [-1e-3 * w, 0.9995]])
        xt = (np.linalg.matrix_power(m, steps) @ np.array([x0, v0]))[0]
        return xt * xt
    h = 1e-6
    return [(loss(*(p + h * (k == i) for k, p in enumerate((1.0, 0.5, 4.0)))) -
             loss(*(p - h * (k == i) for k, p in enumerate((1.0, 0.5, 4.0))))) / (2 * h) for i in range(3)]


@pytest.mark.parametrize("steps", [100, 1000, 10000])
def test_revolve_keeps_log_t_copies(steps):
    stats, gx, gv, gw = _oscillator(steps, "revolve")
    # the ceil(log2 T) free checkpoints, the first and the final state, the start of a step
    assert stats.snapshots <= math.ceil(math.log2(steps)) + 3
    assert stats.bytes == stats.snapshots * 2 * 4  # two f32 fields of one element per copy
    assert stats.step_bytes <= 2 * 4  # one step's pre-launch copies: at most the state
    # binomial: with s free checkpoints each step runs again at most r times (the fewest r with
    # C(s + r, s) >= T: 3, 4, 5 here), and once more to be differentiated
    s = math.ceil(math.log2(steps))
    r = next(r for r in range(1, 99) if math.comb(s + r, s) >= steps)
    assert steps < stats.recomputed_steps <= (r + 1) * steps
    want = _oscillator_reference(steps)
    np.testing.assert_allclose([gx, gv, gw], want, rtol=2e-3, atol=1e-4 * max(map(abs, want)))


@pytest.mark.parametrize("steps", [100, 1000])
def test_store_all_keeps_t_copies(steps):
    stats, gx, gv, gw = _oscillator(steps, "store_all")
    assert stats.snapshots == steps + 2  # every step's start, and the state after the last
    assert stats.bytes == (steps + 2) * 2 * 4
    assert stats.recomputed_steps == steps
    want = _oscillator_reference(steps)
    np.testing.assert_allclose([gx, gv, gw], want, rtol=2e-3, atol=1e-4 * max(map(abs, want)))


def test_an_accumulation_read_by_a_later_step_is_hidden_state():
    """f[i] += ... without clearing f: its value carries every earlier step's terms."""
    x, f, loss, push, remember, total = _two_kernel_step()

    @ti.kernel
    def gather():
        for i in x:
            f[i] += 0.5 * x[i]

    def step(t):
        gather()
        push()

    with pytest.raises(ti.WgpuAdError, match=r"field 'f' carries values from one step to the next but is not in "
                                             r"state=: kernel 'gather' adds to it in step 0 and no kernel stores to it "
                                             r"first \(clears it\), so what kernel 'push' reads in step 0 includes "
                                             r"what was there before the step\. .* or have each step write it before "
                                             r"reading it"):
        with ti.ad.Tape(loss):
            ti.ad.checkpoint(step, steps=3, state=[x])
            total()


def test_a_sum_over_the_steps_that_no_step_reads_is_fine():
    """energy[None] += ... in every step, read only by the loss after the checkpoint: its gradient
    reaches every step, and it holds the forward pass's sum after the tape."""
    x, f, loss, push, remember, total = _two_kernel_step()
    energy = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def decay():
        for i in x:
            x[i] = x[i] * 0.9

    @ti.kernel
    def measure():
        for i in x:
            energy[None] += x[i] * x[i]

    @ti.kernel
    def energy_loss():
        loss[None] = energy[None]

    def step(t):
        decay()
        measure()

    x0 = np.array([0.5, -1.0, 2.0, 0.25])
    x.from_numpy(x0.astype(np.float32))
    with ti.ad.Tape(loss):
        ti.ad.checkpoint(step, steps=6, state=[x], snapshots=1)
        energy_loss()

    def sim(xx):
        return float(sum(((xx * 0.9 ** (t + 1)) ** 2).sum() for t in range(6)))

    assert energy[None] == pytest.approx(sim(x0), rel=1e-5)
    np.testing.assert_allclose(x.grad.to_numpy(), central_diff(sim, x0), rtol=1e-4)
