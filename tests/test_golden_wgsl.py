"""Golden WGSL: the generated forward and adjoint code of three small kernels, compared exactly
with tests/golden/*.wgsl, and what a reader of generated code relies on (the user's names, no
`0.0f +` chains, replay / reverse banners).

The output must not depend on the machine, so these tests call the compiler directly with fixed
options instead of going through a launch (which takes them from the adapter): no native float
atomics (float atomic adds are compare-exchange loops), no subgroup operations, grid_cap=None
(range tasks keep their grid-stride loop), workgroup size 128, debug off, and min_parallel /
transpose None (no pair-loop splitting, which only CPU adapters get). No GPU is needed.

After an intended change of the generated code, rewrite the files with
    WGPU_AD_REGEN_GOLDEN=1 python -m pytest tests/test_golden_wgsl.py
and review the diff of tests/golden/ before committing it.
"""
from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

import pytest

import wgpu_ad as ti
from wgpu_ad.codegen import format_wgsl, generate
from wgpu_ad.frontend.kernel import lower_kernel
from wgpu_ad import plan
from wgpu_ad.passes.autodiff import FORWARD, AdjointRequest, adjoint_kernel, derive
from wgpu_ad.passes.pipeline import lower_for_codegen, optimize

GOLDEN = Path(__file__).parent / "golden"
REGEN = os.environ.get("WGPU_AD_REGEN_GOLDEN", "") not in ("", "0")
OPTIONS = dict(float_atomics=False, debug=False, workgroup_size=128, subgroups=False, grid_cap=None)
N = 8


def _kernels():
    """(name, Python function) of the golden kernels; their fields are made here, per test."""
    x = ti.field(ti.f32, shape=N, needs_grad=True)
    y = ti.field(ti.f32, shape=N, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    pos = ti.Vector.field(2, dtype=ti.f32, shape=N, needs_grad=True)
    energy = ti.field(ti.f32, shape=(), needs_grad=True)

    def scalar_map():
        for i in x:
            s = ti.sin(x[i])
            y[i] = s * x[i] + 2.0

    def reduction():
        for i in x:
            sq = x[i] * x[i]
            loss[None] += sq

    def pair_loop():
        for i in range(N):
            for j in range(N):
                r = pos[i] - pos[j]
                energy[None] += -1 / r.norm(1e-3)

    return [(fn.__name__, fn) for fn in (scalar_map, reduction, pair_loop)]


def compile_both(name: str, fn) -> list:
    """The forward and the adjoint CompiledKernel of a kernel without arguments, with OPTIONS."""
    ir, storages = lower_kernel(fn, name, [], None, debug=False, min_parallel=None)
    ir = optimize(ir)

    def grad_source(buf):  # every field here has its gradient (none is named by the kernels)
        return plan.FieldGrad(buf.source.index) if storages[buf.source.index].needs_grad else None
    adj, _plan = adjoint_kernel(ir, AdjointRequest(grad_source, transpose=None))
    adj = optimize(adj)
    fwd = derive(ir, FORWARD).ir  # what a launch runs (compiler/driver.py compile_kernel)
    return [generate(lower_for_codegen(k), **OPTIONS) for k in (fwd, adj)]


def wgsl_of(name: str, fn) -> str:
    fwd, adj = (format_wgsl(ck) for ck in compile_both(name, fn))
    return f"// ==== {name}: forward\n\n{fwd}\n// ==== {name}: adjoint\n\n{adj}"


@pytest.mark.parametrize("index", range(3), ids=["scalar_map", "reduction", "pair_loop"])
def test_golden_wgsl(index):
    name, fn = _kernels()[index]
    got = wgsl_of(name, fn)
    path = GOLDEN / f"{name}.wgsl"
    if REGEN:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(got)
        return
    want = path.read_text() if path.exists() else ""
    if got != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True),
                                            f"{path} (expected)", f"{name} (generated)"))
        pytest.fail(f"the generated WGSL of {name} differs from {path}:\n{diff}\n"
                    f"If the change is intended, regenerate the golden files with\n"
                    f"    WGPU_AD_REGEN_GOLDEN=1 python -m pytest tests/{Path(__file__).name}\n"
                    f"and review their diff.", pytrace=False)


def test_generated_wgsl_reads_like_the_source():
    """The user's names (s, i, r_x) and adjoints named after them (s_adj), replay / reverse
    banners in the adjoint, no `0.0f + ` from accumulators that start at zero, and no `let` that
    nothing reads (the address arithmetic of vector loads)."""
    texts = {name: wgsl_of(name, fn) for name, fn in _kernels()}
    smap = texts["scalar_map"]
    assert "let s = sin_f32(" in smap and "let i = " in smap and "let s_adj = " in smap
    pairs = texts["pair_loop"]
    assert "let r_x = " in pairs and "let r_y = " in pairs and "for (var j: i32" in pairs
    adjoint = pairs.split(": adjoint")[1]
    assert "// replay" in adjoint and "// reverse" in adjoint and "// forward" not in adjoint
    for name, text in texts.items():
        assert "0.0f + " not in text, name
        code = re.sub(r"//[^\n]*", "", text)
        tokens = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", code)
        defined = re.findall(r"\blet ([A-Za-z_][A-Za-z0-9_]*)", code)
        assert [v for v in defined if tokens.count(v) < 2] == [], f"{name}: lets that nothing reads"


@pytest.mark.gpu
def test_golden_kernels_compile():
    """The WGSL of the golden kernels is valid: the adapter (lavapipe here) builds a pipeline."""
    import _wgsl_harness as H
    dev = H.device()
    for name, fn in _kernels():
        for ck in compile_both(name, fn):
            for task in ck.tasks:
                module = dev.create_shader_module(code=task.wgsl)
                dev.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": task.entry_point})
