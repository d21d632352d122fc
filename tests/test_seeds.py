"""The wgpu_ad column of the seed table (README.md, benchmarks/RESULTS.md): every seed program of
benchmarks/seeds.py gets the gradient of its float64 NumPy reference, or the clear message the table
says. The Taichi column comes from `python -m benchmarks.seeds --system taichi` (Taichi is not
installed in CI)."""
import importlib.util
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import seeds  # noqa: E402

HAVE_TORCH = importlib.util.find_spec("torch") is not None

# what the README's table says for wgpu_ad, each row asserted here
CORRECT = "correct gradient"
EXPECTED = {
    "lazy_grad": CORRECT,
    # a store consumes the gradient (as in Taichi): zero, but said, with both kernels and the fix
    "assign_in_tape": ("zero gradient; warns: GradientWarning: ti.ad.Tape: kernel 'ini_v' overwrites field 'v' "
                       "inside the tape with values that carry no gradient, and kernel 'substep' reads them"),
    "select_div0": CORRECT,
    "ewma_assign": CORRECT,
    "ewma_mul_add": CORRECT,
    "ewma_tape": CORRECT,
    "ewma_counter": CORRECT,
    "sim_one_kernel": CORRECT,
    # refused with the kernels, the field and the fix (ti.ad.checkpoint, the next row)
    "sim_in_place": ("error: DataAccessRuleError: ti.ad.Tape: kernel 'update_x' (launch 2 on the tape) writes elements "
                     "of field 'x' that kernel 'update_v' (launch 1) read before"),
    "sim_checkpoint": CORRECT,
    "torch_function": CORRECT,
}


def test_every_seed_program_has_an_expectation():
    assert set(EXPECTED) == set(seeds.BY_KEY)


@pytest.mark.gpu
@pytest.mark.parametrize("key", list(seeds.BY_KEY))
def test_wgpu_ad_row(key):
    if key == "torch_function" and not HAVE_TORCH:
        pytest.skip("torch is not installed (pip install torch==2.13.0)")
    import wgpu_ad as ti

    ti.init()
    outcome = seeds.run_one("wgpu_ad", key, ti)
    assert outcome.startswith(EXPECTED[key]), outcome
    if key == "assign_in_tape":
        assert "run 'ini_v' before the tape" in outcome
    if key == "sim_in_place":
        assert "ti.ad.checkpoint(step, steps=T, state=[...])" in outcome


def test_the_judge_tells_wrong_gradients_apart():
    """The verdicts the table is made of, on hand-made gradients."""
    ref = {"g": np.array([1.0, -2.0, 4.0])}
    assert seeds.judge({"g": [1.0, -2.0, 4.001]}, ref) == "correct gradient"
    assert seeds.judge({"g": [1.0, -2.0, 4.1]}, ref) == "wrong gradient (rel err 0.025)"
    assert seeds.judge({"g": [0.0, 0.0, 0.0]}, ref) == "zero gradient"
    assert seeds.judge({"g": [1.0, np.nan, 4.0]}, ref) == "NaN gradient"
    # several gradients: the worst one decides
    ref2 = {"a": np.array([1.0]), "b": np.array([10.0])}
    assert seeds.judge({"a": [1.0], "b": [5.0]}, ref2) == "wrong gradient (rel err 0.5)"


def test_the_references_are_independent_of_float32():
    """The references are float64 central differences; spot-check one against its closed form:
    the EWMA's last value is sum(w * data) with weights (1/2^(C-1), 1/2^(C-1), ..., 1/2)."""
    cols = seeds.EWMA_COLS
    w = np.array([0.5 ** (cols - 1)] + [0.5 ** (cols - c) for c in range(1, cols)])
    e = (seeds.EWMA_DATA * w).sum(axis=1)
    np.testing.assert_allclose(seeds.ewma_ref()["data"], 2 * e[:, None] * w[None, :], rtol=1e-7)
