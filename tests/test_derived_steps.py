"""Every derived kernel is a named list of steps (passes/autodiff/derive.py, adjoint.py) that the
driver runs like PASSES: WGPU_AD_PRINT_IR prints the IR after each step, the verifier checks it
after each and names the step that broke it, and no step changes the forward's IR. No GPU."""
from __future__ import annotations

import re

import pytest

import wgpu_ad as ti
from wgpu_ad import plan
from wgpu_ad.compiler.driver import compile_adjoint, compile_checked, compile_dual, compile_kernel, dual_sources, \
    grad_sources
from wgpu_ad.compiler.options import CompileOptions
from wgpu_ad.ir.printer import format_kernel
from wgpu_ad.ir.verifier import VerifyError
from wgpu_ad.passes.autodiff import ADJOINT, CHECKED, CHECKS, DUAL, FORWARD, AdjointRequest, derive, derive_adjoint
from wgpu_ad.passes.pipeline import PASSES

N = 8
OPTS = CompileOptions(offline_cache=False, min_parallel=None)


def _in_place():
    """A kernel whose serial loop updates an element in place (promote.py rewrites it) and that
    reads values an update overwrites and the derivatives need (sin: two snapshots)."""
    x = ti.field(ti.f32, shape=N, needs_grad=True, needs_dual=True)
    y = ti.field(ti.f32, shape=N, needs_grad=True, needs_dual=True)

    def ewma():
        for i in x:
            for j in range(3):
                y[i] = 0.5 * ti.sin(y[i]) + 0.5 * x[i] * j
            x[i] = ti.sin(x[i])
    return ewma


def _banners(text: str) -> list[str]:
    return re.findall(r"// ---- (\S+): after ([\w-]+)", text)


def test_the_lists_name_their_steps():
    assert [n for n, _ in FORWARD] == ["promote", "snapshot"]
    assert [n for n, _ in CHECKS] == ["promote", "snapshot", "runtime-checks"]  # run on first need
    assert [n for n, _ in CHECKED] == ["promote", "snapshot", "runtime-checks", "instrument"]
    assert [n for n, _ in DUAL] == ["promote", "tangent"]
    assert [n for n, _ in ADJOINT] == ["promote", "snapshot", "redirect", "check", "fuse", "gradients", "normalize",
                                       "symmetry", "transpose", "stencil", "nan-check", "reverse", "demote"]


def test_print_ir_shows_every_step_of_the_adjoint_and_the_dual(capsys, monkeypatch):
    monkeypatch.setenv("WGPU_AD_PRINT_IR", "1")
    fwd = compile_kernel(_in_place(), "ewma", [], None, OPTS)
    printed = _banners(capsys.readouterr().out)
    assert [s for k, s in printed if k == "ewma" and s in dict(FORWARD)] == [n for n, _ in FORWARD]

    compile_adjoint(fwd, grad_sources(fwd, []), OPTS)
    printed = _banners(capsys.readouterr().out)
    steps = [s for _, s in printed if not s.startswith(tuple(n for n, _ in PASSES))]
    assert steps[:len(ADJOINT)] == [n for n, _ in ADJOINT]
    assert ("ewma_grad", "reverse") in printed and ("ewma_grad", "demote") in printed
    assert any(k == "ewma_grad" and s == "dce" for k, s in printed)  # then PASSES, as any kernel

    compile_dual(fwd, dual_sources(fwd, []), OPTS)
    printed = _banners(capsys.readouterr().out)
    assert [s for _, s in printed][:2] == ["promote", "tangent"]
    assert ("ewma_dual", "tangent") in printed


def test_the_verifier_names_the_step_that_broke_the_ir(monkeypatch):
    def broken(s):
        s.ir.tasks[0].body.stmts.pop(0)  # drops a definition that is still used
        return s
    fwd = compile_kernel(_in_place(), "ewma", [], None, OPTS)
    steps = [(n, f) for n, f in ADJOINT]
    steps.insert(steps.index(("normalize", dict(ADJOINT)["normalize"])), ("broken", broken))
    monkeypatch.setattr("wgpu_ad.passes.autodiff.adjoint.ADJOINT", steps)
    with pytest.raises(VerifyError, match="after pass broken"):
        compile_adjoint(fwd, grad_sources(fwd, []), CompileOptions(offline_cache=False, debug=True))


def test_no_step_changes_the_forward_ir():
    fwd = compile_kernel(_in_place(), "ewma", [], None, OPTS)
    before = format_kernel(fwd.ir)
    compile_checked(fwd, OPTS)
    compile_adjoint(fwd, grad_sources(fwd, []), OPTS)
    compile_dual(fwd, dual_sources(fwd, []), OPTS)
    assert format_kernel(fwd.ir) == before
    # the launch runs the promoted copy, and its plan names the fields its adjoint reads copies of
    assert set(fwd.plan.snapshots) == {plan.Field(0), plan.Field(1)}
    promoted = derive(fwd.ir, FORWARD).ir
    assert format_kernel(promoted) != before


def test_the_plan_records_what_the_analyses_decided():
    fwd = compile_kernel(_in_place(), "ewma", [], None, OPTS)
    by_source = dict(zip(fwd.plan.buffers, grad_sources(fwd, [])))
    req = AdjointRequest(lambda b: by_source.get(b.source))
    d = derive_adjoint(fwd.ir, req)
    p = d.plan
    assert sorted(s.name for _, s in p.snapshots) == ["x_before", "y_before"]
    assert p.snapshot_sources == fwd.plan.snapshots
    assert p.checks is not None and not p.checks
    assert len(p.flags) == len(p.splits) == len(p.gathers) == len(d.primal.tasks)
    assert p.fused is None and not p.fuse
    with pytest.raises(AttributeError):
        p.fuse = True  # frozen: a step returns its part, it does not change another's
