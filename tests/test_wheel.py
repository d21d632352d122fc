"""The package users get: the wheel built from this repository holds every module and shader of the
source, and installed on its own (not the editable checkout) it imports and runs from another
folder (tests/installed_smoke.py). `.ci/run` does the same in a fresh virtual environment that
pip fills from the wheel's declared dependencies.
"""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# where each installed package's files come from (pyproject.toml's package-dir)
SOURCES = {"wgpu_ad": ROOT / "wgpu_ad", "wgpu_ad/shaders": ROOT / "shaders", "wgpu_ad/viewer": ROOT / "viewer"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"pip wheel failed:\n{r.stdout}\n{r.stderr}"
    assert "is absent from the `packages` configuration" not in r.stderr, r.stderr
    (whl,) = out.glob("wgpu_ad-*.whl")
    return whl


def expected_files() -> set[str]:
    out = set()
    for dest, folder in SOURCES.items():
        for path in folder.rglob("*"):
            rel = path.relative_to(folder)
            if path.suffix not in (".py", ".wgsl", ".js") or "__pycache__" in rel.parts:  # .js: wgpu_ad.js
                continue
            if dest == "wgpu_ad" and rel.parts[0] in ("shaders", "viewer"):
                continue  # a copy laid out inside the checkout (benchmarks/gpu_check.sh): not a source
            out.add(f"{dest}/{rel.as_posix()}")
    return out


def test_the_wheel_holds_every_module_and_shader(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(expected_files() - names)
    assert not missing, f"the wheel lacks {len(missing)} file(s) of the source: {missing[:10]}"
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "Requires-Dist: wgpu" in meta and "Requires-Dist: numpy" in meta
    # the viewer's extra brings what the viewer imports
    assert 'Requires-Dist: glfw>=2.5; extra == "viewer"' in meta
    assert 'Requires-Dist: rendercanvas>=2.0; extra == "viewer"' in meta


@pytest.mark.gpu
def test_the_installed_wheel_runs_from_another_folder(wheel, tmp_path):
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"pip install failed:\n{r.stdout}\n{r.stderr}"
    elsewhere = tmp_path / "user"
    elsewhere.mkdir()
    # the dependencies come from this interpreter's site-packages; wgpu_ad only from the wheel
    env = {**os.environ, "PYTHONPATH": str(site), "WGPU_AD_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "installed_smoke.py"), str(ROOT / "README.md")],
                       cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"the installed wheel failed:\n{r.stdout}\n{r.stderr}"
    assert f"wgpu_ad from {site.resolve() / 'wgpu_ad'}" in r.stdout, r.stdout
    assert "README's examples: ok" in r.stdout
