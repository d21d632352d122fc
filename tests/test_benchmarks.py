"""The benchmark harness as a smoke test: `python -m benchmarks --quick` runs every workload on
wgpu_ad, wgpu_ad with emulated float atomics and the hand-written WGSL (and on Taichi, PyTorch
eager and torch.compile'd, and JAX when they are installed: on the CPU here), prints the table,
and every system's losses and gradient entries match the float64 NumPy references. No timing
assertions."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK_WORKLOADS = ("gravity", "cloth", "reduction", "scatter", "launch")
OPTIONAL = {"taichi-vulkan": "taichi", "taichi-cpu": "taichi", "taichi-cuda": "taichi", "torch": "torch",
            "torch-compile": "torch", "jax": "jax"}


def _installed(system: str) -> bool:
    return importlib.util.find_spec(OPTIONAL[system]) is not None


def _cuda() -> bool:
    if not _installed("torch"):
        return False
    import torch
    return torch.cuda.is_available()


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "quick.json"
    systems = ["wgpu_ad", "wgsl", "wgpu_ad-cas"]  # -cas: float atomics by compare-exchange
    systems += [s for s in OPTIONAL if _installed(s)]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--json", str(out),
                        "--systems", ",".join(systems)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, f"benchmark harness failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    with open(out, encoding="utf-8") as f:
        return r.stdout, json.load(f), systems


def test_quick_run_prints_the_table(quick_run):
    stdout, data, systems = quick_run
    assert "| case | mode | " + " | ".join(systems) + " |" in stdout
    for w in QUICK_WORKLOADS:
        assert f"| {w} " in stdout, f"no table row for {w}"
    assert "| compile cloth n=8 | first run |" in stdout
    assert [c["workload"] for c in data["cases"]] == list(QUICK_WORKLOADS)


@pytest.mark.parametrize("system", ["wgpu_ad", "wgsl", "wgpu_ad-cas", "taichi-vulkan", "taichi-cpu", "torch",
                                    "torch-compile", "jax"])
def test_results_match_the_float64_reference(quick_run, system):
    """Taichi's float atomics may round beyond the tolerance (the table flags it): its results are
    only required to be checked. torch-compile skips the launch case, and any case where
    torch.compile fails here, saying why."""
    _, data, systems = quick_run
    if system not in systems:
        pytest.skip(f"{system}: {OPTIONAL[system]} is not installed in this Python")
    for case in data["cases"]:
        assert system not in case["errors"], f"{system} failed on {case['case']}: {case['errors'].get(system)}"
        if system == "torch-compile" and system in case["skipped"]:
            reason = case["skipped"][system]
            assert "torch.compile" in reason, reason
            continue
        if system.startswith("taichi"):
            assert system in case["checks"], case["case"]
            continue
        check = case["checks"][system]
        ref = case["reference"]
        assert check["loss"] == pytest.approx(ref["loss"], rel=case["tol"]), case["case"]
        if ref["grad"] is not None:
            assert check["grad"] == pytest.approx(ref["grad"], rel=case["tol"]), case["case"]
        assert check["ok"]
        for mode in case["modes"]:
            assert case["median"][system][mode] > 0


def test_new_systems_say_where_they_ran(quick_run):
    """torch and JAX name their device (the CPU here, a GPU when they see one); taichi-cuda runs
    on a CUDA GPU or every case says why it did not."""
    stdout, data, systems = quick_run
    for s in ("torch", "torch-compile"):
        if s in systems:
            dev = data["devices"][s]
            assert " on the CPU (1 thread" in dev if not _cuda() else "cpu" not in dev.lower(), dev
    if "jax" in systems:
        assert data["devices"]["jax"].startswith("jax ") and " jit on " in data["devices"]["jax"]
    if "taichi-cuda" in systems and not _cuda():
        for case in data["cases"]:
            assert "no CUDA GPU" in case["skipped"]["taichi-cuda"], case["case"]
        assert "taichi-cuda    not run: Taichi could not start arch=cuda" in stdout


def test_copy_bandwidth_beside_the_reduction(quick_run):
    """The reduction's case measures the device copy bandwidth (wgpu; torch where installed) and
    prints each system's reduction as a fraction of the fastest copy."""
    stdout, data, systems = quick_run
    rec = next(c for c in data["cases"] if c["workload"] == "reduction")
    assert not rec["copy_errors"], rec["copy_errors"]
    assert rec["copy"]["wgsl"]["gb_s"] > 0 and "copy_buffer_to_buffer" in rec["copy"]["wgsl"]["how"]
    if "torch" in systems:
        assert rec["copy"]["torch"]["gb_s"] > 0
    assert "  copy bandwidth (0.25 MiB): wgsl " in stdout
    assert "reduction at a fraction of the fastest copy" in stdout


def test_a_wrong_answer_is_flagged():
    """run_case checks every system's loss and gradient entry against the float64 reference: a
    system off by 1 % is flagged in the JSON and the printed block (a fast wrong answer shows)."""
    from benchmarks import report, run
    from benchmarks.workloads import Case
    case = Case("reduction", {"n": 64}, reps=2)
    mod = case.module()
    ref_loss, ref_grad = mod.reference(case.params, mod.inputs(case.params))

    class FakeWorker:
        def __init__(self, scale):
            self.scale = scale

        def call(self, *msg):
            return {"setup": "fake device", "time": 1e-3, "copy": {"how": "fake", "gb_s": 1.0},
                    "result": (ref_loss * self.scale, ref_grad)}[msg[0]]

    rec = run.run_case(case, {"wgpu_ad": FakeWorker(1.0), "jax": FakeWorker(1.01)}, reps=2)
    assert rec["checks"]["wgpu_ad"]["ok"] and not rec["checks"]["jax"]["ok"]
    block = report.case_block(rec, ["wgpu_ad", "jax"])
    assert "OUTSIDE TOLERANCE" in [ln for ln in block.splitlines() if ln.strip().startswith("jax ")][0]


def test_compile_times_are_measured(quick_run):
    _, data, _ = quick_run
    c = data["compile"]
    for s in ("wgpu_ad", "wgsl"):
        assert s not in c["errors"], c["errors"][s]
        r = c["systems"][s]
        assert r["first_ms"] > 0 and r["cached_ms"] > 0
        assert set(r["first_parts_ms"]) == {"step", "loss", "loss.grad", "step.grad"}


def test_torch_bridge_row(quick_run):
    """The bridge and the bare kernels give the same gradient, and both are timed (when torch is
    installed; the row says why it is missing otherwise)."""
    stdout, data, _ = quick_run
    t = data["torch"]
    assert "== torch bridge: splat renderer" in stdout
    if importlib.util.find_spec("torch") is None:
        assert "error" in t and "torch" in t["error"], t
        return
    assert "error" not in t, t
    assert t["same_gradient"] and t["ms"]["bridge"] > 0 and t["ms"]["bare"] > 0
    assert t["upload_mb_s"] > 0 and t["download_mb_s"] > 0


def test_checkpoint_rows(quick_run):
    """The checkpoint benchmark: every schedule and the stored program give the float64 reference's
    loss and gradient entry; revolve keeps fewer bytes than storing every step."""
    stdout, data, _ = quick_run
    assert "== checkpoint: cloth n=8 T=40" in stdout
    w = data["checkpoint"]["wgpu_ad"]
    assert "error" not in w, w
    ref_loss, ref_grad = data["checkpoint"]["reference"]
    for variant, (loss, grad) in w["checks"].items():
        assert loss == pytest.approx(ref_loss, rel=1e-4), variant
        assert grad == pytest.approx(ref_grad, rel=1e-3), variant
    assert set(w["ms"]) == {"stored", "revolve", "bisect", "sqrt", "store_all", "revolve r=2"}
    assert w["stats"]["revolve"]["bytes"] < w["stored_bytes"] <= w["stats"]["store_all"]["bytes"]


def test_forward_mode_row(quick_run):
    """Forward mode's JVP on gravity and cloth is timed against the forward pass, and agrees with
    the float64 references."""
    stdout, data, _ = quick_run
    assert "== forward mode (ti.ad.FwdMode)" in stdout
    fm = data["fwdmode"]
    assert "error" not in fm, fm
    assert [c["workload"] for c in fm["cases"]] == ["gravity", "cloth"]
    for c in fm["cases"]:
        assert c["rel_err"] <= 1e-3, c
        assert c["ms"]["fwd"] > 0 and c["ms"]["dual"] > 0 and c["ms"]["fwdmode"] > 0


def test_determinism_row(quick_run):
    """ti.init(deterministic=True) is timed against the default on gravity, cloth and scatter: both
    settings agree with the float64 references, and two deterministic runs agree bit for bit."""
    stdout, data, _ = quick_run
    assert "== ti.init(deterministic=True)" in stdout
    d = data["determinism"]
    assert "error" not in d, d
    assert [c["workload"] for c in d["cases"]] == ["gravity", "cloth", "scatter"]
    for c in d["cases"]:
        assert "error" not in c, c
        assert max(c["checks"].values()) <= 1e-3 and c["bitwise"], c
        assert all(t["default"] > 0 and t["deterministic"] > 0 for t in c["ms"].values())


def test_best_anchor_is_the_fastest_system_with_a_correct_result():
    """Issue #18's target compares wgpu_ad with the fastest other system whose loss and gradient
    passed the float64 check (a fast wrong answer is no anchor; wgpu_ad-cas is wgpu_ad itself)."""
    from benchmarks import report
    def check(ok):
        return {"ok": ok, "loss": 1.0, "loss_rel_err": 0.0, "grad": None, "grad_rel_err": None}
    rec = {"case": "scatter particles=8 grid=4", "workload": "scatter", "modes": ["fwd"], "unit": "ms",
           "loss_name": "loss", "grad_name": None, "reference": {"loss": 1.0}, "tol": 1e-3,
           "median": {"wgpu_ad": {"fwd": 10.0}, "wgsl": {"fwd": 8.0}, "taichi-cpu": {"fwd": 2.0},
                      "warp-cpu": {"fwd": 5.0}, "wgpu_ad-cas": {"fwd": 1.0}},
           "checks": {"wgpu_ad": check(True), "wgsl": check(True), "taichi-cpu": check(False),
                      "warp-cpu": check(True), "wgpu_ad-cas": check(True)},
           "errors": {}, "skipped": {"taichi-vulkan": "taichi-vulkan: no version"}}
    assert report._best_anchor(rec, "fwd") == "warp-cpu"
    row = [r for r in report.targets({"cases": [rec]}) if "best anchor" in r["target"]][0]
    assert "(warp-cpu)" in row["target"] and row["value"] == pytest.approx(2.0) and row["met"] is False
    rec["checks"]["warp-cpu"] = check(False)
    assert report._best_anchor(rec, "fwd") == "wgsl"
    assert "taichi-vulkan  not run: no version" in report.case_block(rec, ["wgpu_ad", "wgsl", "taichi-vulkan"])


@pytest.mark.parametrize("system, says", [("warp-cpu", "NVIDIA Warp in this Python: pip install warp-lang"),
                                          ("jax", "JAX in this Python: pip install jax jaxlib"),
                                          ("torch-compile", "PyTorch in this Python: pip install torch"),
                                          ("taichi-cuda", "Taichi in this Python: pip install taichi==1.7.4")])
def test_naming_a_system_that_is_not_installed_is_a_clear_error(monkeypatch, capsys, system, says):
    from benchmarks import run
    monkeypatch.setattr(run, "installed", lambda s: s != system)
    with pytest.raises(SystemExit):
        run.parse_args(["--systems", f"wgpu_ad,{system}"])
    assert f"--systems: {system} needs {says}" in capsys.readouterr().err


def test_packing_benchmark_checks_both_settings():
    """benchmarks/packing.py (run alone): the packed and the unpacked program agree with the
    float64 reference before they are timed."""
    from benchmarks import packing
    data = packing.measure(quick=True, reps=1)
    if "skipped" in data:
        pytest.skip(data["skipped"])
    (case,) = data["by_size"].values()
    for setting in ("packed", "unpacked"):
        assert max(case["relative_errors"][setting].values()) <= 1e-5, case
    assert set(case["ms"]) == {"forward packed", "forward unpacked", "tape packed", "tape unpacked"}
