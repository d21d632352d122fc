"""Work across processes (examples/distributed/). DDP: two gloo ranks, each with its own wgpu_ad
device, end with identical parameters, equal to a one-process run of the same script on the full
batch (the reference for what the all-reduce does); the gradient and the whole descent agree with
float64 NumPy (an answer independent of the kernel's adjoint and of torch). Ray: a sweep on two
actors gives what the same sweep gives serially, bit for bit, and float64 NumPy's answer. Each run
is a subprocess with a timeout: a hang is a failure, not a stuck test run."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="torch is not installed (pip install torch==2.13.0)")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "distributed" / "ddp_fit.py"
TIMEOUT = 180
STEPS = 40


def _run(tmp_path: Path, world: int) -> dict:
    out = tmp_path / f"world{world}.json"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        p = subprocess.run([sys.executable, str(EXAMPLE), "--world-size", str(world), "--steps", str(STEPS),
                            "--out", str(out)], capture_output=True, text=True, timeout=TIMEOUT, env=env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the {world}-rank run hung (no end after {TIMEOUT} s):\n{e.stdout}\n{e.stderr}")
    assert p.returncode == 0, f"the {world}-rank run failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    # (the ranks print at the same time: their lines may run together, so no line structure is assumed)
    ranks = sorted(re.findall(r"rank (\d+) of (\d+) \(adapter", p.stdout))
    assert ranks == [(str(r), str(world)) for r in range(world)], p.stdout
    return json.loads(out.read_text())


def _example():
    spec = importlib.util.spec_from_file_location("ddp_fit_example", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _numpy_gradient(p, t, x) -> np.ndarray:
    """d/dp of mean((a exp(-c t) cos(w t) - x)^2), float64, by the chain rule."""
    a, c, w = p
    e, cs, sn = np.exp(-c * t), np.cos(w * t), np.sin(w * t)
    r = 2.0 * (a * e * cs - x) / len(t)
    return np.array([np.sum(r * e * cs), np.sum(r * -t * a * e * cs), np.sum(r * -t * a * e * sn)])


@needs_torch
def test_two_ddp_ranks_match_each_other_and_a_one_process_run_on_the_full_batch(tmp_path):
    two, one = _run(tmp_path, 2), _run(tmp_path, 1)
    p0, p1 = (np.array(p) for p in two["params"])
    assert np.array_equal(p0, p1), f"the ranks ended apart: {p0} vs {p1}"
    ref = np.array(one["params"][0])
    np.testing.assert_allclose(p0, ref, rtol=0, atol=1e-6, err_msg="2 ranks vs 1 process on the full batch")
    # the all-reduce averaged the shards' gradients into the full batch's (float32 rounding apart)
    np.testing.assert_allclose(two["first_grad"], one["first_grad"], rtol=1e-6, atol=1e-7)
    assert two["loss"] < 0.05 * two["first_loss"], f"the fit did not fit: {two['first_loss']} -> {two['loss']}"

    # independent references: float64 NumPy's gradient at the start, and its whole descent
    mod = _example()
    t, x = mod.data()
    np.testing.assert_allclose(one["first_grad"], _numpy_gradient(mod.START, t, x), rtol=1e-5, atol=3e-7)
    p = np.array(mod.START, np.float64)
    for _ in range(STEPS):
        p = p - mod.LR * _numpy_gradient(p, t, x)
    np.testing.assert_allclose(ref, p, rtol=0, atol=2e-6, err_msg="1 process vs float64 NumPy descent")
    assert np.abs(p - np.array(mod.START)).min() > 0.05  # the parameters moved: the comparison is not vacuous


RAY_SWEEP = EXAMPLE.parent / "ray_sweep.py"


def _numpy_chain(k: float, n: int, steps: int, dt: float, g: float, c: float) -> np.ndarray:
    """The hanging chain, semi-implicit Euler in float64: forces from the positions, then moves."""
    x, v = np.zeros(n), np.zeros(n)
    for _ in range(steps):
        up = np.concatenate([[0.0], x[:-1]])
        down = np.concatenate([x[1:], [x[-1]]])   # the lowest mass has no spring below
        v = v + dt * (-k * (x - up) - k * (x - down) - g - c * v)
        x = x + dt * v
    return x


@pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                    reason='Ray is not installed (pip install "wgpu_ad[ray]"); the Ray sweep is optional')
def test_a_ray_sweep_on_two_actors_equals_the_serial_run_bit_for_bit(tmp_path):
    out = tmp_path / "sweep.json"
    try:
        p = subprocess.run([sys.executable, str(RAY_SWEEP), "--actors", "2", "--out", str(out)],
                           capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the Ray sweep hung (no end after {TIMEOUT} s):\n{e.stdout}\n{e.stderr}")
    assert p.returncode == 0, f"the Ray sweep failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    res = json.loads(out.read_text())
    par, ser = res["parallel"], res["serial"]
    assert len({r["pid"] for r in par}) == 2 and all(r["pid"] != ser[0]["pid"] for r in par), \
        "the trials did not run in two actor processes"
    assert [r["k"] for r in par] == [r["k"] for r in ser]
    for a, b in zip(par, ser):
        assert a["x"] == b["x"], f"k = {a['k']}: the actor's result differs from the serial run's"
    spec = importlib.util.spec_from_file_location("ray_sweep_example", RAY_SWEEP)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    tips = []
    for r in ser:
        ref = _numpy_chain(r["k"], mod.N_MASSES, mod.STEPS, mod.DT, mod.GRAVITY, mod.DAMPING)
        np.testing.assert_allclose(r["x"], ref, rtol=0, atol=5e-5, err_msg=f"k = {r['k']} vs float64 NumPy")
        tips.append(r["x"][-1])
    assert len(set(tips)) == len(tips)  # the stiffness matters: the sweep compares different runs


RAY_TUNE = EXAMPLE.parent / "ray_tune_fit.py"


def _numpy_fit_loss(k: float, m) -> float:
    """The tune example's loss in float64: the chain after m.STEPS steps, from rest at 0."""
    n = m.N_MASSES
    x, v = np.zeros(n), np.zeros(n)
    for _ in range(m.STEPS):
        up = np.concatenate([[0.0], x[:-1]])
        below = np.concatenate([x[1:], [x[-1]]])   # the lowest mass has no spring below
        v = v + m.DT * (-k * (x - up) - k * (x - below) - m.GRAVITY - m.DAMPING * v)
        x = x + m.DT * v
    return float((x[-1] - m.TARGET) ** 2)


def _ray_tune_installed() -> bool:
    try:
        return importlib.util.find_spec("ray") is not None and importlib.util.find_spec("ray.tune") is not None \
            and importlib.util.find_spec("pyarrow") is not None
    except ModuleNotFoundError:
        return False


@pytest.mark.skipif(not _ray_tune_installed(),
                    reason='Ray Tune is not installed (pip install "wgpu_ad[ray]"); the Tune example is optional')
def test_ray_tune_with_asha_stops_the_bad_trials_and_each_trial_equals_its_serial_run(tmp_path):
    out = tmp_path / "tune.json"
    try:
        p = subprocess.run([sys.executable, str(RAY_TUNE), "--out", str(out)],
                           capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the Ray Tune search hung (no end after {TIMEOUT} s):\n{e.stdout}\n{e.stderr}")
    assert p.returncode == 0, f"the Ray Tune search failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    res = json.loads(out.read_text())
    spec = importlib.util.spec_from_file_location("ray_tune_example", RAY_TUNE)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    trials, serial = res["trials"], res["serial"]
    assert sorted(float(k) for k in trials) == sorted(m.LEARNING_RATES)
    assert len({r["pid"] for t in trials.values() for r in t}) >= 2, "the trials did not run in worker processes"
    for lr, reports in trials.items():
        # ti.init(deterministic=True): a trial in its worker is the same trial run here, bit for bit
        assert [r["loss"] for r in reports] == [r["loss"] for r in serial[lr]], f"lr = {lr}"
        assert [r["k"] for r in reports] == [r["k"] for r in serial[lr]], f"lr = {lr}"
    # ASHA: the two slow learning rates barely move the loss by its first rung, where the fast ones
    # are already lower: they are stopped there; the best trial runs to the end and fits
    for lr in (m.LEARNING_RATES[2], m.LEARNING_RATES[3]):
        assert len(trials[str(float(lr))]) == m.GRACE, f"lr = {lr} was not stopped at ASHA's first rung"
    best = trials[str(float(m.LEARNING_RATES[0]))]
    assert len(best) == m.ITERATIONS and best[-1]["loss"] < 1e-2 * best[0]["loss"]
    # the gradient each step took is dloss/dk: against float64 central differences of a NumPy port
    k = m.K_START
    for r in best[:3]:
        h = 1e-4 * k
        fd = (_numpy_fit_loss(k + h, m) - _numpy_fit_loss(k - h, m)) / (2 * h)
        assert r["grad"] == pytest.approx(fd, rel=2e-3), f"k = {k}"
        assert r["loss"] == pytest.approx(_numpy_fit_loss(k, m), rel=1e-4)
        k -= m.LEARNING_RATES[0] * r["grad"]
