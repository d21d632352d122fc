"""Data-parallel training across processes (examples/distributed/ddp_fit.py): two gloo ranks
under DistributedDataParallel, each with its own wgpu_ad device, end with identical parameters,
equal to a one-process run of the same script on the full batch (the reference for what the
all-reduce does); the gradient and the whole descent agree with float64 NumPy (an answer
independent of the kernel's adjoint and of torch). Each run is a subprocess with a timeout: a hang
is a failure, not a stuck test run."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="torch is not installed (pip install torch==2.13.0)")]

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
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("rank ")]
    assert sorted(ln.split(" (")[0] for ln in lines) == [f"rank {r} of {world}" for r in range(world)], p.stdout
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
