"""benchmarks/taichi_suite.py (Taichi's autodiff test files run against wgpu_ad through a stand-in
`taichi` package) on a small git repository made here in Taichi's layout: its test() decorator
runs a test once on wgpu_ad, skips the float64-only and CUDA-only variants with the reason, and the
report counts a wrong gradient as a failure, with its line."""
from __future__ import annotations

import shutil
import subprocess
import textwrap

import pytest

from benchmarks import taichi_suite

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(shutil.which("git") is None, reason="needs git")]

FAKE = '''
import pytest
import taichi as ti
from taichi.lang.util import has_pytorch
from tests import test_utils


@test_utils.test()
def test_square_grad():
    x = ti.field(ti.f32, shape=3, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def f():
        for i in x:
            loss[None] += x[i] ** 2

    for i in range(3):
        x[i] = i + 0.5
    with ti.ad.Tape(loss=loss):
        f()
    for i in range(3):
        assert x.grad[i] == test_utils.approx(2 * (i + 0.5))
    assert ti.lang.impl.current_cfg().default_fp == ti.f32


@test_utils.test(debug=True)
def test_wrong_expectation():
    x = ti.field(ti.f32, shape=(), needs_grad=True)
    y = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def f():
        y[None] = 3 * x[None]

    with ti.ad.Tape(loss=y):
        f()
    assert x.grad[None] == 4.0, "dy/dx"


@test_utils.test(default_fp=ti.f64)
def test_in_f64():
    assert False


@test_utils.test(arch=ti.cuda)
def test_cuda_only():
    assert False


@test_utils.test()
def test_f64_in_body():
    x = ti.field(ti.f64, shape=())


def test_plain():
    assert has_pytorch() in (True, False)
'''


def _fake_taichi(tmp_path):
    repo = tmp_path / "taichi"
    (repo / "tests" / "python").mkdir(parents=True)
    (repo / "tests" / "python" / "test_ad_fake.py").write_text(textwrap.dedent(FAKE))
    (repo / "tests" / "python" / "test_other.py").write_text("def test_x():\n    pass\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "fake"], check=True)
    return str(repo / ".git")


def test_runner_counts_passes_failures_and_skips_with_reasons(tmp_path, capsys):
    git_dir = _fake_taichi(tmp_path)
    assert taichi_suite.autodiff_files(git_dir, "HEAD") == ["test_ad_fake.py"]
    assert taichi_suite.main([git_dir, "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    by_name = {c["name"]: c for c in __import__("json").loads((tmp_path / "r.json").read_text())
               ["results"]["test_ad_fake.py"]}
    assert by_name["test_square_grad[wgpu_ad]"]["outcome"] == "passed"
    assert by_name["test_plain[none]"]["outcome"] == "passed"
    wrong = by_name["test_wrong_expectation[wgpu_ad]"]
    assert wrong["outcome"] == "failed" and "dy/dx" in wrong["message"] and "3.0" in wrong["message"]
    assert by_name["test_in_f64"]["message"].startswith("f64-only: Taichi runs this variant in float64")
    assert by_name["test_f64_in_body"]["message"] == "f64-only: the test's body uses ti.f64"
    assert by_name["test_cuda_only"]["message"] == "CUDA-only: arch=ti.cuda only"
    assert "skipped: 2 f64-only, 1 CUDA-only" in out
    assert "PASSED 2 of 3 runnable in f32" in out
    assert "test_ad_fake.py::test_wrong_expectation[wgpu_ad] [failed] AssertionError: dy/dx | assert 3.0 == 4.0" in out


def test_runner_runs_f64_variants_in_float32_apart(tmp_path, capsys):
    """--f64-as-f32: the f64-only variants run under ti.init(f64="f32") and are counted apart; the
    float32 count is unchanged."""
    git_dir = _fake_taichi(tmp_path)
    assert taichi_suite.main([git_dir, "--f64-as-f32"]) == 0
    out = capsys.readouterr().out
    assert "PASSED 2 of 3 runnable in f32" in out
    assert 'f64-only variants under ti.init(f64="f32"): 1 passed of 2' in out
    assert "test_ad_fake.py::test_in_f64[wgpu_ad-f64-as-f32] [failed] assert False" in out
