"""conftest.py for Taichi's test files run against wgpu_ad: a test made by test_utils.test gets
ti.init(**its options) before it and ti.reset() after it; other tests get neither (as in Taichi).

A float64 variant run under ti.init(f64="f32") (the runner's --f64-as-f32) computes in float32,
where torch.autograd.gradcheck's finite-difference step (eps=1e-6) is below the resolution of the
outputs; there gradcheck runs with a step and tolerances for float32 (eps=1e-3, atol=rtol=1e-3),
so it still compares the gradient with central differences instead of with rounding noise."""
import pytest

import taichi as ti

F32_GRADCHECK = dict(eps=1e-3, atol=1e-3, rtol=1e-3)


@pytest.fixture(autouse=True)
def wanted_arch(req_arch, req_options, monkeypatch):
    if req_arch is not None:
        ti.init(**req_options)
        if req_options.get("f64") == "f32":
            _gradcheck_for_float32(monkeypatch)
    yield
    if req_arch is not None:
        ti.reset()


def _gradcheck_for_float32(monkeypatch):
    try:
        import torch
    except ImportError:
        return
    original = torch.autograd.gradcheck

    def gradcheck(func, inputs, **kwargs):
        return original(func, inputs, **{**kwargs, **F32_GRADCHECK})

    monkeypatch.setattr(torch.autograd, "gradcheck", gradcheck)


def pytest_generate_tests(metafunc):
    if not getattr(metafunc.function, "__ti_test__", False):
        metafunc.parametrize("req_arch,req_options", [(None, None)], ids=["none"])
