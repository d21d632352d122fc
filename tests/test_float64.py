"""ti.f64 (issue 26 item 12): refused by default, naming the opt-in; with ti.init(f64="f32") it is
ti.f32, with exactly one Float64Warning per session saying so. Gradients of programs written in f64
are compared with float64 analytic derivatives at float32 tolerance."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import wgpu_ad as ti
from ad_util import assert_grad

pytestmark = pytest.mark.gpu

REFUSED = (r"WebGPU shaders have no 64-bit floats. Use ti.f32, or run the program's f64 in float32 with "
           r"ti.init\(..., f64=\"f32\"\) \(then read ti.f64 after that call: a `real = ti.f64` kept from before "
           r"it stays refused\)$")


def test_f64_is_refused_by_default_naming_the_opt_in():
    with pytest.raises(ti.Float64Error, match=r"^ti.init\(default_fp=ti.f64\): " + REFUSED):
        ti.init(default_fp=ti.f64)
    ti.init()
    assert repr(ti.f64) == "f64" and ti.f64 is not ti.f32 and ti.types.f64 is ti.f64
    with pytest.raises(ti.Float64Error, match=r"^ti.field: ti.f64: " + REFUSED):
        ti.field(ti.f64, shape=3)
    with pytest.raises(ti.Float64Error, match=r"^ti.f64\(1.5\): " + REFUSED):
        ti.f64(1.5)

    @ti.kernel
    def scalar_arg(a: ti.f64) -> ti.f32:
        return a

    with pytest.raises(ti.Float64Error, match=r"^kernel 'scalar_arg', argument 'a': ti.f64: " + REFUSED):
        scalar_arg(1.0)

    @ti.kernel
    def cast() -> ti.f32:
        return ti.cast(1, ti.f64)

    with pytest.raises(ti.CompileError, match=r"^ti.f64: WebGPU shaders have no 64-bit floats") as e:
        cast()
    assert "return ti.cast(1, ti.f64)" in str(e.value)
    with pytest.raises(ti.WgpuAdError, match=r"^ti.init\(f64='f64'\): expected \"f32\" \(run the program's ti.f64 "
                                             r"in float32\) or \"error\""):
        ti.init(f64="f64")


def test_the_opt_in_warns_once_per_session_and_makes_f64_f32():
    with pytest.warns(ti.Float64Warning) as got:
        ti.init(default_fp=ti.f64, f64="f32")
    assert len(got) == 1
    assert str(got[0].message) == (
        "ti.init(f64=\"f32\"): WebGPU shaders have no 64-bit floats, so in this session ti.f64 is ti.f32: f64 "
        "fields, ndarrays, casts, annotations, default_fp=ti.f64 and float64 NumPy arrays or torch tensors passed to "
        "kernels compute and store float32 (about 7 significant digits instead of 16; gradients too), and "
        "to_numpy() of an f64 field returns a float32 array")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning in the same session
        assert ti.f64 is ti.f32 and ti.float64 is ti.f32 and ti.types.f64 is ti.f32
        x = ti.field(ti.f64, shape=2)
        assert x.dtype == ti.f32 and x.to_numpy().dtype == np.float32
    ti.init()  # a new session without the opt-in: refused again
    with pytest.raises(ti.Float64Error):
        ti.field(ti.f64, shape=2)


def test_a_kept_f64_from_before_the_opt_in_stays_refused():
    real = ti.f64  # read before ti.init(f64="f32"): the refusing dtype
    with pytest.warns(ti.Float64Warning):
        ti.init(default_fp=real, f64="f32")
    with pytest.raises(ti.Float64Error, match=r"^ti.field: ti.f64: " + REFUSED):
        ti.field(real, shape=2)


def test_an_f64_program_runs_in_f32_with_the_analytic_gradient():
    """Fields, casts, literals and annotations in f64: loss = sum (x^3 + 2 x) -> d/dx = 3 x^2 + 2, and
    y = atan2(x, 0.4) * x^0.4 in forward mode against its float64 derivative."""
    with pytest.warns(ti.Float64Warning):
        ti.init(default_fp=ti.f64, f64="f32")
    x = ti.field(ti.f64, shape=5, needs_grad=True, needs_dual=True)
    y = ti.field(ti.types.f64, shape=5, needs_dual=True)
    loss = ti.field(ti.f64, shape=(), needs_grad=True)

    @ti.func
    def poly(v: ti.f64) -> ti.f64:
        return ti.cast(v, ti.f64) ** 3 + ti.f64(2.0) * v

    @ti.kernel
    def total():
        for i in x:
            loss[None] += poly(x[i])

    @ti.kernel
    def curve():
        for i in x:
            y[i] = ti.atan2(x[i], 0.4) * x[i] ** 0.4

    x0 = np.array([0.1, 0.234, 0.5, 1.0, 2.0])
    x.from_numpy(x0)
    with ti.ad.Tape(loss=loss):
        total()
    xr = x0.astype(np.float32).astype(np.float64)
    assert loss[None] == pytest.approx(float((xr ** 3 + 2 * xr).sum()), rel=1e-6)
    assert_grad(x.grad.to_numpy(), 3 * xr ** 2 + 2, rtol=1e-5)
    with ti.ad.FwdMode(loss=y, param=x, seed=[1.0] * 5):
        curve()
    d = 0.4 / (xr * xr + 0.16) * xr ** 0.4 + np.arctan2(xr, 0.4) * 0.4 * xr ** -0.6
    assert_grad(y.dual.to_numpy(), d, what="forward-mode derivative")


def test_float64_arrays_are_refused_by_default_and_computed_in_f32_under_the_opt_in():
    """A float64 NumPy array for an ndarray argument: refused (naming the conversion) by default;
    under ti.init(f64="f32") copied in as float32 and written back as float64: y = x^2 + 1."""
    def run():
        @ti.kernel
        def square_plus_one(x: ti.types.ndarray(), y: ti.types.ndarray()):
            for i in x:
                y[i] = x[i] * x[i] + 1.0

        x = np.array([0.5, -1.25, 3.0])
        y = np.zeros(3)
        square_plus_one(x, y)
        return x, y

    ti.init()
    with pytest.raises(ti.KernelArgError, match=r"argument 'x' is a float64 array; wgpu_ad kernels take float32, "
                                                r"int32 or uint32 arrays; convert it first"):
        run()
    with pytest.warns(ti.Float64Warning):
        ti.init(f64="f32")
    x, y = run()
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, x.astype(np.float32).astype(np.float64) ** 2 + 1.0, rtol=1e-6)
