"""Taichi's names for what wgpu_ad raises and accepts, so programs and tests written for Taichi
work unchanged: the exception classes (with the Python built-ins Taichi's derive from) and
ti.init(ad_stack_size=0)."""
from __future__ import annotations

import numpy as np
import pytest

import wgpu_ad as ti


def test_exception_names_and_their_bases():
    assert issubclass(ti.TaichiCompilationError, ti.WgpuAdError)
    assert issubclass(ti.TaichiSyntaxError, ti.TaichiCompilationError)
    assert issubclass(ti.TaichiTypeError, TypeError)
    assert issubclass(ti.TaichiRuntimeError, RuntimeError)
    assert issubclass(ti.TaichiAssertionError, ti.TaichiRuntimeError)
    assert issubclass(ti.TaichiAssertionError, AssertionError)


@pytest.mark.gpu
def test_a_failed_assert_is_an_assertion_error():
    ti.init(debug=True)
    x = ti.field(ti.f32, shape=4)

    @ti.kernel
    def check(limit: ti.f32):
        for i in x:
            assert x[i] < limit, "x[%d] is too big"

    x.fill(1.0)
    check(2.0)
    with pytest.raises(ti.TaichiAssertionError) as e:
        check(0.5)
    assert isinstance(e.value, AssertionError) and "kernel 'check'" in str(e.value)


@pytest.mark.gpu
def test_ad_stack_size_zero_lets_wgpu_ad_choose():
    """Taichi's ti.init(ad_stack_size=0) (its adaptive stack) is accepted: loops are sized at
    launch where their bounds allow, the default elsewhere; the gradient is exact (d/dx x^n)."""
    ti.init(ad_stack_size=0)
    assert ti.compile_options().ad_stack_size == 256
    x = ti.field(ti.f32, shape=3, needs_grad=True)
    y = ti.field(ti.f32, shape=3, needs_grad=True)

    @ti.kernel
    def power(n: ti.i32):
        for i in x:
            v = 1.0
            for _ in range(n):
                v *= x[i]
            y[i] = v

    x.from_numpy(np.array([0.98, 1.0, 1.01], np.float32))
    power(300)
    y.grad.fill(1.0)
    power.grad(300)
    x0 = np.array([0.98, 1.0, 1.01])
    np.testing.assert_allclose(x.grad.to_numpy(), 300 * x0 ** 299, rtol=2e-3)
    with pytest.raises(ti.WgpuAdError, match=r"ti.init\(ad_stack_size=-2\): expected a positive integer, or 0"):
        ti.init(ad_stack_size=-2)
