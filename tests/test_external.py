"""NumPy arrays as ndarray arguments (lang/external.py): copied in, launched, written back.

Values are checked against the same computation in NumPy."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import wgpu_ad as ti
from wgpu_ad.lang.external import EXTERNALS

pytestmark = pytest.mark.gpu


def test_numpy_arrays_in_and_out():
    """A vec3 ndarray argument takes an (n, 3) array; the output array is written in place; the
    input, which the kernel only reads, is left as it was (a read-only array is fine)."""
    @ti.kernel
    def norms(p: ti.types.ndarray(dtype=ti.math.vec3), w: ti.f32, out: ti.types.ndarray()):
        for i in p:
            out[i] = w * p[i].norm()

    rng = np.random.default_rng(1)
    p = rng.standard_normal((50, 3)).astype(np.float32)
    p.flags.writeable = False
    out = np.full(50, -1.0, dtype=np.float32)
    norms(p, 2.0, out)
    np.testing.assert_allclose(out, 2.0 * np.linalg.norm(p.astype(np.float64), axis=1), rtol=1e-5)


def test_integer_arrays_and_two_dimensional_loops():
    @ti.kernel
    def histogram(keys: ti.types.ndarray(), counts: ti.types.ndarray()):
        for i, j in keys:
            ti.atomic_add(counts[keys[i, j]], 1)

    keys = np.random.default_rng(2).integers(0, 7, size=(20, 30)).astype(np.int32)
    counts = np.zeros(7, dtype=np.int32)
    histogram(keys, counts)
    np.testing.assert_array_equal(counts, np.bincount(keys.ravel(), minlength=7))
    histogram(keys, counts)  # the written-back counts are read again: they double
    np.testing.assert_array_equal(counts, 2 * np.bincount(keys.ravel(), minlength=7))


def test_bad_arrays_are_named():
    @ti.kernel
    def k(p: ti.types.ndarray(dtype=ti.math.vec3), out: ti.types.ndarray()):
        for i in p:
            out[i] = p[i][0]

    out = np.zeros(4, dtype=np.float32)
    with pytest.raises(ti.KernelArgError, match=r"kernel 'k': argument 'p' is a float64 array; wgpu_ad kernels "
                                                r"take float32, int32 or uint32 arrays; convert it first "
                                                r"\(e.g. .astype\(np.float32\)"):
        k(np.zeros((4, 3)), out)
    with pytest.raises(ti.KernelArgError, match=r"kernel 'k': argument 'p' must end in the element shape \(3,\) "
                                                r"of its dtype, got an array of shape \(4, 2\)"):
        k(np.zeros((4, 2), dtype=np.float32), out)
    with pytest.raises(ti.KernelArgError, match=r"argument 'p' must be a ti.ndarray, a NumPy array or a torch "
                                                r"tensor, got list"):
        k([[0.0, 0.0, 0.0]], out)


def test_device_copies_are_kept_per_array_and_reused():
    """One device copy per live host array (so every kernel sees one storage for it); a later
    array of the same dtype and shape reuses the copy of one that was freed."""
    @ti.kernel
    def double(a: ti.types.ndarray(), b: ti.types.ndarray()):
        for i in a:
            b[i] = 2 * a[i]

    a = np.arange(8, dtype=np.float32)
    b = np.zeros(8, dtype=np.float32)
    double(a, b)
    first = EXTERNALS.live[id(b)][1]
    double(b, a)  # b is read now, a written: the same copies
    assert EXTERNALS.live[id(b)][1] is first
    np.testing.assert_array_equal(a, 4 * np.arange(8))
    del b
    gc.collect()
    c = np.ones(8, dtype=np.float32)
    double(a, c)
    assert EXTERNALS.live[id(c)][1] is first
    np.testing.assert_array_equal(c, 8 * np.arange(8))


def test_get_wgsl_and_get_ir_take_the_host_arrays_a_launch_takes():
    # they refused them: "must be a ti.ndarray, a NumPy array or a torch tensor, got ndarray"
    @ti.kernel
    def scale(x: ti.types.ndarray(), y: ti.types.ndarray(), s: ti.f32):
        for i in x:
            y[i] = s * x[i]

    a, b = np.ones(4, np.float32), np.zeros(4, np.float32)
    assert "fn main" in scale.get_wgsl(a, b, 2.0) and "y" in scale.get_ir(a, b, 2.0)
    with pytest.raises(ti.KernelArgError) as e:
        scale(a, 3, 2.0)
    assert str(e.value) == ("kernel 'scale': argument 'y' must be a ti.ndarray, a NumPy array or a torch tensor, "
                            "got int")
    scale(a, b, 2.0)
    np.testing.assert_array_equal(b, 2.0)
