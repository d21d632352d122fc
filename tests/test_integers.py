"""Integers at their edges (issue 26 item 4): data that does not fit a field's integer type is
refused with the field, index and value, not wrapped; an integer literal out of its type's range
is a compile error with a caret; with ti.init(debug=True) integer division and modulo by zero raise,
naming the kernel and line. Messages are asserted word for word."""
from __future__ import annotations

import numpy as np
import pytest

import wgpu_ad as ti
from wgpu_ad.errors import WgpuAdError

pytestmark = pytest.mark.gpu


# ---- from_numpy ---------------------------------------------------------------------------------

def test_from_numpy_refuses_integers_that_would_wrap():
    n = ti.field(ti.i32, shape=4, name="n")
    with pytest.raises(WgpuAdError) as e:
        n.from_numpy(np.array([1, 2, 3_000_000_000, -2**40], dtype=np.int64))
    assert str(e.value) == ("field 'n'.from_numpy: the int64 value 3000000000 at index (2,) does not fit in i32 "
                            "(-2147483648 to 2147483647); it would wrap to -1294967296")
    n.from_numpy(np.array([1, -2, 2**31 - 1, -2**31], dtype=np.int64))  # in range: stored exactly
    np.testing.assert_array_equal(n.to_numpy(), [1, -2, 2**31 - 1, -2**31])

    u = ti.field(ti.u32, shape=(2, 2), name="u")
    with pytest.raises(WgpuAdError) as e:
        u.from_numpy(np.array([[1, 2], [3, 2**33 + 5]], dtype=np.uint64))
    assert str(e.value) == ("field 'u'.from_numpy: the uint64 value 8589934597 at index (1, 1) does not fit in u32 "
                            "(0 to 4294967295); it would wrap to 5")
    m = ti.ndarray(ti.i32, shape=3)
    with pytest.raises(WgpuAdError, match=r"from_numpy: the uint32 value 4294967295 at index \(1,\) does not fit "
                                          r"in i32 \(-2147483648 to 2147483647\); it would wrap to -1"):
        m.from_numpy(np.array([0, 2**32 - 1, 7], dtype=np.uint32))
    np.testing.assert_array_equal(m.to_numpy(), [0, 0, 0])  # nothing was written


def test_from_numpy_refuses_floats_that_would_become_inf():
    if "shader-f16" not in ti.get_runtime().device.features:
        pytest.skip("this adapter lacks the shader-f16 feature (f16 fields are refused, with their own error)")
    h = ti.field(ti.f16, shape=3, name="h")
    with pytest.raises(WgpuAdError) as e:
        h.from_numpy(np.array([1.0, 7e4, 3.0]))
    assert str(e.value) == ("field 'h'.from_numpy: the float64 value 70000.0 at index (1,) is beyond f16's largest "
                            "finite value 65504 and would become inf")
    h.from_numpy(np.array([1.0, np.inf, -65504.0]))  # inf itself is kept
    np.testing.assert_array_equal(h.to_numpy(), np.array([1.0, np.inf, -65504.0], np.float16))
    x = ti.field(ti.f32, shape=2, name="x")
    with pytest.raises(WgpuAdError, match=r"the float64 value -1e\+39 at index \(0,\) is beyond f32's largest "
                                          r"finite value 3.40282e\+38 and would become inf"):
        x.from_numpy(np.array([-1e39, 0.0]))


# ---- literals -----------------------------------------------------------------------------------

def test_an_integer_literal_out_of_range_is_a_compile_error_at_the_literal():
    y = ti.field(ti.i32, shape=2)

    @ti.kernel
    def big():
        y[0] = 1
        y[1] = y[0] + 3000000000

    with pytest.raises(ti.CompileError) as e:
        big()
    lines = str(e.value).split("\n")
    assert lines[0] == ("the integer 3000000000 does not fit in i32 (-2147483648 to 2147483647); it would wrap to "
                        "-1294967296. Write it as a float (3000000000.0) if that is what it is, or keep the value "
                        "in range")
    assert lines[2:] == ["    y[1] = y[0] + 3000000000", "                  ^"]

    u = ti.field(ti.u32, shape=4)
    z = ti.field(ti.i32, shape=2)

    @ti.kernel
    def edges():
        u[0] = 3000000000                 # fits u32
        u[1] = 0xFFFFFFFF
        u[2] = ti.cast(-1, ti.u32)        # explicit conversions wrap, as Taichi's
        z[0] = -2147483648
        z[1] = ti.cast(3000000000, ti.i32)

    edges()
    np.testing.assert_array_equal(u.to_numpy()[:3], [3000000000, 2**32 - 1, 2**32 - 1])
    np.testing.assert_array_equal(z.to_numpy(), [-2**31, 3000000000 - 2**32])

    @ti.kernel
    def folded():
        z[0] = 2**31        # folded in Python to 2147483648, then stored: refused too

    with pytest.raises(ti.CompileError, match=r"^the integer 2147483648 does not fit in i32 \(-2147483648 to "
                                              r"2147483647\); it would wrap to -2147483648\."):
        folded()

    @ti.kernel
    def minus_one():
        u[3] = -1           # into u32: two's complement, as Taichi and Python-scope u[3] = -1

    minus_one()
    assert u[3] == 2**32 - 1


# ---- division by zero ---------------------------------------------------------------------------

def _divide():
    y = ti.field(ti.i32, shape=2)
    w = ti.field(ti.u32, shape=2)

    @ti.kernel
    def divide(a: ti.i32, b: ti.i32):
        y[0] = a // b
        y[1] = a % b

    @ti.kernel
    def divide_u(a: ti.u32, b: ti.u32):
        w[0] = a // b
        w[1] = a % b

    return y, w, divide, divide_u


def test_integer_division_by_zero_raises_in_debug_mode():
    ti.init(debug=True)
    y, w, divide, divide_u = _divide()
    divide(-7, 2)
    np.testing.assert_array_equal(y.to_numpy(), [-7 // 2, -7 % 2])  # Python's floor semantics
    with pytest.raises(ti.KernelZeroDivisionError) as e:
        divide(7, 0)
    assert str(e.value).startswith("kernel 'divide': integer division by zero: 7 // 0 at ")
    assert str(e.value).endswith(f"test_integers.py:{e.value.line}")
    assert isinstance(e.value, ZeroDivisionError) and e.value.kernel == "divide"
    src = open(__file__).read().split("\n")[e.value.line - 1]
    assert src.strip() == "y[0] = a // b"
    with pytest.raises(ti.KernelZeroDivisionError, match=r"^kernel 'divide_u': integer division by zero: 9 // 0 at "):
        divide_u(9, 0)


def test_integer_division_by_zero_without_debug_mode_gives_wgsl_values():
    """What docs/language.md says: x // 0 = x and x % 0 = 0 (WGSL's), no error."""
    y, w, divide, divide_u = _divide()
    divide(7, 0)
    np.testing.assert_array_equal(y.to_numpy(), [7, 0])
    divide_u(9, 0)
    np.testing.assert_array_equal(w.to_numpy(), [9, 0])


def test_a_constant_zero_divisor_is_a_compile_error():
    y = ti.field(ti.i32, shape=1)

    @ti.kernel
    def mod0(a: ti.i32):
        y[0] = a % 0

    with pytest.raises(ti.CompileError, match=r"^integer division by zero: x % 0 \(Python raises ZeroDivisionError\)"):
        mod0(3)
