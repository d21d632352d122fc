"""ti.ad.checkpoint (wgpu_ad/ad/checkpoint.py): an in-place simulation differentiated through
recomputation. Every schedule's gradients against float64 central differences of the same
integrator; the copies each schedule keeps (bisect: about log2 T; store_all: T + 1)."""
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


@pytest.mark.parametrize("schedule", ["revolve", "bisect"])
@pytest.mark.parametrize("steps", [100, 1000])
def test_copies_grow_like_log_steps(steps, schedule):
    """The copies held at once grow like log2(steps) for revolve (its default number of free
    checkpoints) and bisect; revolve runs fewer steps again than bisect."""
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
