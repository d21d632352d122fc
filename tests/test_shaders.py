"""The WGSL loader, wgpu_ad.shaders (shaders/__init__.py): templates, and the .wgsl files found
next to it in a checkout and in an installed copy. No GPU needed."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from wgpu_ad import shaders
from wgpu_ad.codegen import wgsl
from wgpu_ad.codegen.ops_table import MATH_HELPERS

ROOT = Path(__file__).resolve().parent.parent


def test_shader_loader_checks_template_variables():
    text = shaders.load("atomics", "cas_f32", fn_name="f", buf="b", combine="old + operand")
    assert "fn f(elem: i32, operand: f32) -> f32" in text and "{{" not in text
    with pytest.raises(shaders.ShaderTemplateError, match="needs combine"):
        shaders.load("atomics", "cas_f32", fn_name="f", buf="b")
    with pytest.raises(shaders.ShaderTemplateError, match="has no variable extra"):
        shaders.load("assert", "report_error", err="e", extra=1)
    with pytest.raises(shaders.ShaderTemplateError, match="no snippet 'nope'"):
        shaders.load("math", "nope")
    assert set(shaders.snippets("math")) == set(MATH_HELPERS)  # each helper a spelling may call


def test_the_compiler_and_the_viewer_load_from_the_shaders_folder():
    pipelines = pytest.importorskip("wgpu_ad.viewer.pipelines")
    assert wgsl.shaders is shaders and pipelines.shaders is shaders
    assert shaders.shader_dir() == ROOT / "shaders" == Path(shaders.__file__).parent


def test_shader_loader_reads_its_folder_and_fails_loudly_without_it(tmp_path, monkeypatch):
    (tmp_path / "demo.wgsl").write_text("// file comment\n//! snippet one\nfn {{name}}() {}\n")
    monkeypatch.setattr(shaders, "_DIR", tmp_path)
    shaders._read.cache_clear()
    shaders.snippets.cache_clear()
    try:
        assert shaders.load("demo", "one", name="f") == "fn f() {}\n"
        with pytest.raises(shaders.ShaderTemplateError, match="no WGSL snippet file"):
            shaders.load("math", "pow_f32")
        monkeypatch.setattr(shaders, "_DIR", tmp_path / "nowhere")
        with pytest.raises(shaders.ShaderTemplateError, match="snippets were not found in .*nowhere"):
            shaders.shader_dir()
    finally:
        shaders._read.cache_clear()
        shaders.snippets.cache_clear()


def test_an_installed_copy_finds_its_shaders(tmp_path):
    """What a non-editable install lays out (pyproject's package-dir): the checkout's shaders/ as
    wgpu_ad/shaders, its .py and .wgsl files only. Run from outside the checkout."""
    site = tmp_path / "site"
    shutil.copytree(ROOT / "wgpu_ad", site / "wgpu_ad", ignore=shutil.ignore_patterns("__pycache__"))
    (site / "wgpu_ad" / "shaders").mkdir()
    for f in [*(ROOT / "shaders").glob("*.py"), *(ROOT / "shaders").glob("*.wgsl")]:
        shutil.copy(f, site / "wgpu_ad" / "shaders" / f.name)
    code = ("import wgpu_ad.codegen.wgsl as w, wgpu_ad.shaders as s\n"
            "assert w.shaders is s\n"
            "print(s.__file__)\n"
            "print(s.load('math', 'pow_f32'), end='')\n")
    env = dict(os.environ, PYTHONPATH=str(site))
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    where, text = r.stdout.split("\n", 1)
    assert Path(where) == site / "wgpu_ad" / "shaders" / "__init__.py"
    assert text == shaders.load("math", "pow_f32")


def test_the_offline_cache_digest_covers_the_shader_loader(monkeypatch):
    """A change to the loader or to a .wgsl file invalidates the offline cache, installed or not."""
    from wgpu_ad.compiler import cache
    read = []
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: read.append(self.resolve()) or real(self))
    cache.source_digest.cache_clear()
    try:
        cache.source_digest()
    finally:
        cache.source_digest.cache_clear()  # hashed again without the spy
    assert Path(shaders.__file__).resolve() in read
    assert (ROOT / "shaders" / "math.wgsl").resolve() in read
