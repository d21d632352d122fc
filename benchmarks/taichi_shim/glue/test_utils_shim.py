"""Our stand-in for Taichi's tests/test_utils.py (written for wgpu_ad, installed as
tests/test_utils.py next to Taichi's test files by benchmarks/taichi_suite.py).

`test(arch, exclude, require, **options)` runs the test once, on wgpu_ad's adapter, with `options`
passed to ti.init, and skips, with the reason, the variants that cannot run in float32 or on any
arch but one wgpu_ad does not stand in for:
- "f64-only": default_fp=ti.f64, require=ti.extension.data64, or a body that names ti.f64 /
  ti.float64 (an f64 field, ndarray or cast);
- "CUDA-only": arch=ti.cuda alone (tests of torch's CUDA context).
With TAICHI_SUITE_F64_AS_F32=1 (the runner's --f64-as-f32) the f64-only variants run too, under
ti.init(f64="f32"): wgpu_ad's option that runs a float64 program in float32.
Every other arch list and exclusion names Taichi's own backends' limits (ndarray autodiff only on
cpu/cuda, a bug on vulkan); wgpu_ad has one backend, so those tests run.
"""
import inspect
import os
import re

import numpy as np
import pytest

import taichi as ti

F64_ONLY = "f64-only"
CUDA_ONLY = "CUDA-only"


def _as_list(v):
    if v is None:
        return []
    return list(v) if isinstance(v, (list, tuple)) else [v]


def _names_f64(func) -> bool:
    """Whether the test's own lines (not its decorators) name ti.f64 or ti.float64."""
    try:
        lines = inspect.getsource(func).splitlines()
    except OSError:
        return False
    body = "\n".join(ln for ln in lines if not ln.lstrip().startswith("@"))
    return re.search(r"\bti\.(f64|float64)\b", body) is not None


def skip_reason(arch=None, require=None, options=None, func=None):
    """Why a test(...) variant is not run here, or None."""
    options = options or {}
    if options.get("default_fp") is ti.f64 or ti.extension.data64 in _as_list(require):
        return f"{F64_ONLY}: Taichi runs this variant in float64 (default_fp=ti.f64 / require data64)"
    if func is not None and _names_f64(func):
        return f"{F64_ONLY}: the test's body uses ti.f64"
    archs = _as_list(arch)
    if archs and all(a is ti.cuda for a in archs):
        return f"{CUDA_ONLY}: arch=ti.cuda only"
    return None


def test(arch=None, exclude=None, require=None, **options):
    def decorator(func):
        func.__ti_test__ = True
        reason = skip_reason(arch, require, options, func)
        if reason and reason.startswith(F64_ONLY) and os.environ.get("TAICHI_SUITE_F64_AS_F32") == "1":
            return pytest.mark.parametrize("req_arch,req_options", [(ti.vulkan, dict(options, f64="f32"))],
                                           ids=["wgpu_ad-f64-as-f32"])(func)
        if reason:
            return pytest.mark.skip(reason=reason)(func)
        return pytest.mark.parametrize("req_arch,req_options", [(ti.vulkan, options)], ids=["wgpu_ad"])(func)

    return decorator


def get_rel_eps():
    # Taichi's value for every arch but OpenGL and Metal (its Vulkan and CUDA backends are float32 too)
    return 1e-6


def approx(expected, **kwargs):
    """pytest.approx with the relative tolerance Taichi's tests use on Vulkan (never looser)."""
    if isinstance(expected, bool):
        class _Truth:
            def __eq__(self, other):
                return bool(other) == expected

            def __ne__(self, other):
                return bool(other) != expected
        return _Truth()
    kwargs["rel"] = max(kwargs.get("rel", 1e-6), get_rel_eps())
    return pytest.approx(expected, **kwargs)


def allclose(x, y, **kwargs):
    return x == approx(y, **kwargs)


def torch_op(*, output_shapes=((1,),)):
    """Wrap a kernel as a torch.autograd.Function: forward launches it with zero outputs appended,
    backward seeds the outputs' .grad and calls kernel.grad. Outputs are float32 (Taichi's are
    double: its test programs run in f64 where they can)."""
    import torch

    def wrap(kernel):
        class Op(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *inputs):
                outs = tuple(torch.zeros(s, dtype=torch.float32, requires_grad=True) for s in output_shapes)
                kernel(*inputs, *outs)
                ctx.save_for_backward(*inputs, *outs)
                return outs

            @staticmethod
            def backward(ctx, *grads):
                saved = ctx.saved_tensors
                inputs, outs = saved[:len(saved) - len(grads)], saved[len(saved) - len(grads):]
                for t in inputs:
                    t.grad = torch.zeros_like(t)
                for t, g in zip(outs, grads):
                    t.grad = g
                kernel.grad(*inputs, *outs)
                return tuple(t.grad for t in inputs)

        return lambda *args: Op.apply(*args)

    return wrap


__all__ = ["test", "approx", "allclose", "torch_op", "get_rel_eps", "np"]
