"""Fields, ti.root layouts, lazy_grad and ndarrays from Python scope, against NumPy references."""
from __future__ import annotations

import numpy as np
import pytest

import wgpu_ad as ti
from wgpu_ad.errors import WgpuAdError
from wgpu_ad.lang import field as F
from wgpu_ad.lang import ndarray as N
from wgpu_ad.types import MatrixType, VectorType, f16, f32, i32, u1, u32

pytestmark = pytest.mark.gpu
rng = np.random.default_rng(1)


def random_values(shape, dtype) -> np.ndarray:
    if dtype == f32:
        return rng.standard_normal(shape).astype(np.float32)
    if dtype == i32:
        return rng.integers(-2**31, 2**31 - 1, size=shape, dtype=np.int64).astype(np.int32)
    return rng.integers(0, 2**32 - 1, size=shape, dtype=np.uint64).astype(np.uint32)


def raw(storage) -> np.ndarray:
    """The buffer's bytes as the storage's dtype (checks the memory layout)."""
    rt = ti.get_runtime()
    return np.frombuffer(rt.read(storage.gpu_buffer(), storage.nbytes), dtype=storage.dtype.np)


# ---- every kind and dimension ---------------------------------------------------------------------

SHAPES = [(), (5,), (3, 4), (2, 3, 2), (2, 1, 2, 3)]
KINDS = [(), (3,), (2, 3)]


@pytest.mark.parametrize("dtype", [f32, i32, u32])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("element_shape", KINDS)
def test_numpy_roundtrip_and_layout(dtype, shape, element_shape):
    if element_shape == ():
        x = ti.field(dtype, shape=shape)
    elif len(element_shape) == 1:
        x = ti.Vector.field(element_shape[0], dtype, shape=shape)
    else:
        x = ti.Matrix.field(*element_shape, dtype, shape=shape)
    assert x.shape == shape and x.element_shape == element_shape and x.dtype == dtype
    assert x.n_scalars == int(np.prod(shape + element_shape))
    np.testing.assert_array_equal(x.to_numpy(), np.zeros(shape + element_shape))  # zero-initialised
    ref = random_values(shape + element_shape, dtype)
    x.from_numpy(ref)
    out = x.to_numpy()
    assert out.dtype == dtype.np and out.shape == shape + element_shape
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(raw(x), ref.ravel())  # row-major, components innermost


@pytest.mark.parametrize("shape", SHAPES)
def test_scalar_getitem_setitem_every_dimension(shape):
    x = ti.field(ti.f32, shape=shape)
    ref = np.zeros(shape, np.float32)
    for flat in range(0, int(np.prod(shape)), 3):
        idx = np.unravel_index(flat, shape) if shape else ()
        key = tuple(int(v) for v in idx) if shape else None
        x[key] = flat + 0.25
        ref[idx] = flat + 0.25
    np.testing.assert_array_equal(x.to_numpy(), ref)
    key = tuple(s - 1 for s in shape) if shape else None
    assert x[key] == ref[tuple(s - 1 for s in shape)]
    assert isinstance(x[key], float)


def test_vector_and_matrix_elements():
    v = ti.Vector.field(3, ti.f32, shape=(2, 2))
    v[1, 0] = [1.5, 2.5, 3.5]
    v[0, 1] = ti.Vector([4, 5, 6])
    v[1, 1] = 7  # a scalar fills the element
    ref = np.zeros((2, 2, 3), np.float32)
    ref[1, 0], ref[0, 1], ref[1, 1] = [1.5, 2.5, 3.5], [4, 5, 6], 7
    np.testing.assert_array_equal(v.to_numpy(), ref)
    got = v[1, 0]
    assert isinstance(got, np.ndarray) and got.shape == (3,)
    np.testing.assert_array_equal(got, [1.5, 2.5, 3.5])
    got[0] = 100  # a copy: the field does not change
    assert v[1, 0][0] == 1.5
    m = ti.Matrix.field(2, 3, ti.i32, shape=())
    m[None] = [[1, 2, 3], [4, 5, 6]]
    np.testing.assert_array_equal(m[None], [[1, 2, 3], [4, 5, 6]])
    np.testing.assert_array_equal(raw(m), [1, 2, 3, 4, 5, 6])
    assert (v.n, v.m, m.n, m.m) == (3, 1, 2, 3)


def test_setitem_casts_like_taichi():
    a = ti.field(ti.i32, shape=3)
    a[0] = 2.9
    a[1] = np.float64(-2.9)
    a[2] = True
    assert [a[0], a[1], a[2]] == [2, -2, 1]
    u = ti.field(ti.u32, shape=1)
    u[0] = -1
    assert u[0] == 2**32 - 1


def test_index_errors_name_field_index_and_shape():
    x = ti.field(ti.f32, shape=(4, 8), name="x")
    with pytest.raises(IndexError, match=r"field 'x': index \(4, 0\) is out of bounds for shape \(4, 8\)"):
        x[4, 0]
    with pytest.raises(IndexError, match=r"field 'x': index \(0, -1\) is out of bounds"):
        x[0, -1] = 1.0
    with pytest.raises(WgpuAdError, match=r"field 'x' has shape \(4, 8\) and needs 2 index\(es\); got \[3\]"):
        x[3]
    with pytest.raises(WgpuAdError, match=r"field 'x' has shape \(4, 8\): index it with 2 integer\(s\), not \[None\]"):
        x[None]
    with pytest.raises(WgpuAdError, match="field 'x': index .* must be integers, got float"):
        x[1.0, 2]
    s = ti.field(ti.f32, shape=(), name="s")
    with pytest.raises(WgpuAdError, match=r"field 's' has shape \(\) and needs \[None\]; got \[0\]"):
        s[0]
    v = ti.Vector.field(3, ti.f32, shape=2, name="v")
    with pytest.raises(WgpuAdError, match=r"field 'v'\[1\] = ...: expected a scalar or shape \(3,\), got shape \(2,\)"):
        v[1] = [1, 2]
    with pytest.raises(WgpuAdError, match="expected numbers"):
        v[1] = "abc"


# ---- numpy I/O errors, fill, copy_from -------------------------------------------------------------

def test_from_numpy_checks_shape_and_dtype():
    v = ti.Vector.field(3, ti.f32, shape=4, name="v")
    with pytest.raises(WgpuAdError) as e:
        v.from_numpy(np.zeros((3, 4), np.float32))
    assert str(e.value) == ("field 'v'.from_numpy: expected an array of shape (4, 3) (shape (4,) + element "
                            "shape (3,)), got shape (3, 4)")
    n = ti.field(ti.i32, shape=3, name="n")
    with pytest.raises(WgpuAdError) as e:
        n.from_numpy(np.array([1.5, 2, 3]))
    assert str(e.value) == ("field 'n'.from_numpy: cannot store float64 data in a i32 field without losing "
                            "its kind; convert it first, e.g. arr.astype(np.int32)")
    n.from_numpy(np.array([1, -2, 3], dtype=np.int64))  # same kind: cast like NumPy
    np.testing.assert_array_equal(n.to_numpy(), [1, -2, 3])
    ref = rng.standard_normal((4, 3))  # float64 -> float32
    v.from_numpy(ref)
    np.testing.assert_array_equal(v.to_numpy(), ref.astype(np.float32))
    v.from_numpy([[1, 2, 3]] * 4)  # lists and ints are fine for a float field
    assert v.to_numpy(dtype=np.float64).dtype == np.float64


def test_fill_and_copy_from():
    x = ti.field(ti.f32, shape=(3, 5), name="x")
    x.fill(2.5)
    np.testing.assert_array_equal(x.to_numpy(), np.full((3, 5), 2.5))
    x.fill(0)
    np.testing.assert_array_equal(x.to_numpy(), np.zeros((3, 5)))
    v = ti.Vector.field(2, ti.i32, shape=3)
    v.fill([7, -1])
    np.testing.assert_array_equal(v.to_numpy(), [[7, -1]] * 3)
    v.fill(4)
    np.testing.assert_array_equal(v.to_numpy(), np.full((3, 2), 4))
    y = ti.field(ti.f32, shape=(3, 5), name="y")
    ref = rng.standard_normal((3, 5)).astype(np.float32)
    x.from_numpy(ref)
    y.copy_from(x)
    x.fill(1)  # ordered after the copy
    np.testing.assert_array_equal(y.to_numpy(), ref)
    z = ti.field(ti.f32, shape=(5, 3), name="z")
    with pytest.raises(WgpuAdError, match=r"field 'z'.copy_from\(field 'x'\): shape, element shape and dtype must match"):
        z.copy_from(x)
    with pytest.raises(WgpuAdError, match="expected a field or ndarray, got ndarray"):
        z.copy_from(np.zeros((5, 3)))


def test_repr_and_str():
    x = ti.field(ti.f32, shape=2, name="x", needs_grad=True)
    assert repr(x) == "<wgpu_ad field x: f32, shape=(2,), needs_grad=True>"
    assert repr(ti.Vector.field(3, ti.i32)) == "<wgpu_ad field (unnamed): i32, shape=unplaced, element_shape=(3,)>"
    x[1] = 3
    assert str(x) == str(np.array([0, 3], np.float32))


def test_dtypes_refused_or_checked():
    with pytest.raises(WgpuAdError, match=r"ti.field: u1 \(bool\) cannot be stored; use ti.i32"):
        ti.field(u1, shape=2)
    with pytest.raises(WgpuAdError, match="ti.field: unsupported dtype"):
        ti.field("f64", shape=2)
    with pytest.raises(WgpuAdError, match="needs_grad=True needs a float dtype, got i32"):
        ti.field(ti.i32, shape=2, needs_grad=True)
    with pytest.raises(WgpuAdError, match="offset=.* is not supported"):
        ti.field(ti.f32, shape=2, offset=(1,))
    with pytest.raises(WgpuAdError, match="every dimension of shape must be >= 1"):
        ti.field(ti.f32, shape=(2, 0))
    assert ti.field(float, shape=1).dtype == f32 and ti.field(int, shape=1).dtype == i32


def test_f16_field_roundtrip_or_clear_error():
    h = ti.field(f16, shape=5, name="h")
    if not ti.get_runtime().has_f16:
        with pytest.raises(WgpuAdError, match="lacks the 'shader-f16' feature"):
            h.gpu_buffer()
        return
    ref = np.array([0.5, -1.25, 3, 65504, 1e-3], np.float16)
    h.from_numpy(ref)
    h[3] = 2.0  # an odd 2-byte element in the middle of a word
    ref[3] = 2.0
    np.testing.assert_array_equal(h.to_numpy(), ref)
    assert h[1] == -1.25


def test_too_large_field_names_size_and_limit(monkeypatch):
    rt = ti.get_runtime()
    monkeypatch.setitem(rt.limits, "max-storage-buffer-binding-size", 1024)
    ok = ti.field(ti.f32, shape=256, name="ok")
    ok.gpu_buffer()
    big = ti.Vector.field(3, ti.f32, shape=100, name="big")
    with pytest.raises(WgpuAdError) as e:
        big.from_numpy(np.zeros((100, 3)))
    assert str(e.value).startswith("field 'big' of shape (100,) (f32) needs 1200 bytes, more than this "
                                   "adapter's max-storage-buffer-binding-size (1024 bytes)")


# ---- ti.root layouts ------------------------------------------------------------------------------

def test_dense_shapes():
    cases = [
        (lambda: ti.root.dense(ti.i, 4), (4,)),
        (lambda: ti.root.dense(ti.i, 4).dense(ti.j, 8), (4, 8)),
        (lambda: ti.root.dense(ti.i, 4).dense(ti.i, 8), (32,)),
        (lambda: ti.root.dense(ti.ij, (2, 3)), (2, 3)),
        (lambda: ti.root.dense(ti.ij, 4), (4, 4)),
        (lambda: ti.root.dense(ti.ij, (2, 2)).dense(ti.ij, (3, 5)), (6, 10)),
        (lambda: ti.root.dense(ti.ijk, (2, 3, 4)).dense(ti.k, 2), (2, 3, 8)),
        (lambda: ti.root.dense(ti.ijkl, 2), (2, 2, 2, 2)),
        (lambda: ti.root.dense([ti.i, ti.j], (3, 2)), (3, 2)),
    ]
    for make, shape in cases:
        x, v = ti.field(ti.f32), ti.Vector.field(2, ti.i32)
        make().place(x, v)
        assert x.shape == shape and v.shape == shape, (make, shape)
    a, b, c = ti.field(ti.f32), ti.field(ti.f32), ti.field(ti.f32)
    ti.root.dense(ti.i, 3).place(a).place(b)  # place chains
    ti.root.place(c)
    assert (a.shape, b.shape, c.shape) == ((3,), (3,), ())


def test_nested_dense_indexing_is_row_major():
    x = ti.field(ti.i32)
    ti.root.dense(ti.i, 2).dense(ti.j, 3).place(x)
    for i in range(2):
        for j in range(3):
            x[i, j] = 10 * i + j
    np.testing.assert_array_equal(x.to_numpy(), [[0, 1, 2], [10, 11, 12]])


def test_layout_errors():
    x = ti.field(ti.f32, name="x")
    for use in (lambda: x.shape, x.gpu_buffer, x.to_numpy, lambda: x[0], lambda: x.fill(1)):
        with pytest.raises(WgpuAdError) as e:
            use()
        assert str(e.value) == ("field 'x' has no shape yet: give it shape= when creating it, or place it with "
                                "ti.root.dense(ti.i, n).place(x) (ti.root.place(x) for a 0-d field)")
    ti.root.dense(ti.i, 2).place(x)
    with pytest.raises(WgpuAdError, match=r"field 'x' already has shape \(2,\); a field is placed once"):
        ti.root.dense(ti.i, 3).place(x)
    y = ti.field(ti.f32, shape=4, name="y")
    with pytest.raises(WgpuAdError, match=r"field 'y' already has shape \(4,\)"):
        ti.root.place(y)
    not_placeable = (np.zeros(2), ti.ndarray(ti.f32, shape=2))
    for bad in not_placeable:  # a NumPy array, an ndarray (a storage, not a field)
        with pytest.raises(WgpuAdError, match="place\\(\\) takes fields"):
            ti.root.dense(ti.i, 2).place(bad)
    with pytest.raises(WgpuAdError, match="axes must be ti.i, ti.j"):
        ti.root.dense(0, 4)
    with pytest.raises(WgpuAdError, match="2 axes need 2 sizes"):
        ti.root.dense(ti.ij, (2, 3, 4))
    with pytest.raises(WgpuAdError, match=r"ti.root.pointer\(\) \(sparse layout\) is not supported"):
        ti.root.pointer(ti.i, 4)
    with pytest.raises(WgpuAdError, match="offset"):
        ti.root.dense(ti.i, 2).place(ti.field(ti.f32), offset=(1,))


# ---- gradients and lazy_grad in every order -------------------------------------------------------

def test_no_grad_message():
    """x.grad exists for every float field (so it can be placed by hand, as in Taichi); using it
    before it has storage says how to give it some."""
    x = ti.field(ti.f32, shape=3, name="x")
    assert x.grad.is_grad and x.grad.primal is x and not x.needs_grad
    for use in (lambda: x.grad.to_numpy(), lambda: x.grad.fill(0), lambda: x.grad[0]):
        with pytest.raises(WgpuAdError) as e:
            use()
        assert str(e.value) == ("field 'x' has no gradient: create it with needs_grad=True, call "
                                "ti.root.lazy_grad(), or place x.grad with ti.root "
                                "(ti.root.dense(ti.i, n).place(x, x.grad)) before using it")
    with pytest.raises(WgpuAdError, match="field 'k' has dtype i32: only float fields have gradients"):
        ti.field(ti.i32, shape=3, name="k").grad
    a = ti.ndarray(ti.f32, shape=3, name="a")
    with pytest.raises(WgpuAdError, match="ndarray 'a' has no gradient: create it with needs_grad=True"):
        a.grad


def test_needs_grad_gives_a_marked_gradient_field():
    x = ti.Vector.field(2, ti.f32, shape=(3, 2), needs_grad=True)
    g = x.grad
    assert isinstance(g, F.Field) and g.is_grad and g.primal is x and not g.needs_grad
    assert (g.shape, g.element_shape, g.dtype) == (x.shape, x.element_shape, x.dtype)
    assert g.gpu_buffer() is not x.gpu_buffer()
    x.name = "pos"  # the frontend names fields late; the gradient follows
    assert g.name == "pos.grad"
    with pytest.raises(WgpuAdError, match="field 'pos.grad' is a gradient and has no gradient of its own"):
        g.grad
    g[1, 1] = [1, 2]
    np.testing.assert_array_equal(x.to_numpy(), np.zeros((3, 2, 2)))
    assert g.to_numpy()[1, 1].tolist() == [1, 2]
    y = ti.field(ti.f32, needs_grad=True)  # unplaced: the gradient gets the shape at placement
    ti.root.dense(ti.i, 5).place(y)
    assert y.grad.shape == (5,)


@pytest.mark.parametrize("order", ["lazy_first", "place_first", "after_assign", "after_from_numpy"])
def test_lazy_grad_in_any_order(order):
    x, n = ti.field(ti.f32, name="x"), ti.field(ti.i32, name="n")
    v = ti.Vector.field(3, ti.f32, name="v")
    s = ti.field(ti.f32, shape=4, name="s")  # shape= places under root too
    if order == "lazy_first":
        ti.root.lazy_grad()
    ti.root.dense(ti.i, 4).place(x, n)
    ti.root.place(v)
    if order == "after_assign":
        v[None] = [2.0, 1.0, 3.0]
        x[2] = 5.0
    if order == "after_from_numpy":
        x.from_numpy(np.arange(4.0))
    if order != "lazy_first":
        ti.root.lazy_grad()
    late = ti.Matrix.field(2, 2, ti.f32, shape=3, name="late")  # made after lazy_grad: still gets one
    for f in (x, v, s, late):
        assert f.needs_grad and f.grad.is_grad and f.grad.shape == f.shape
        np.testing.assert_array_equal(f.grad.to_numpy(), np.zeros(f.shape + f.element_shape))
    assert not n.needs_grad  # integer fields have no gradient
    if order == "after_assign":
        np.testing.assert_array_equal(v[None], [2, 1, 3])
        assert x[2] == 5.0
    if order == "after_from_numpy":
        np.testing.assert_array_equal(x.to_numpy(), np.arange(4.0))
    a = ti.ndarray(ti.f32, shape=2)
    assert not a.needs_grad  # ndarrays are not under root


def test_seed_example_assignment_before_lazy_grad():
    """The Taichi failure in the seed: v assigned before lazy_grad; here the gradient still exists."""
    vec = lambda: ti.Vector.field(3, dtype=ti.f32)
    x, v, x_avg = vec(), vec(), vec()
    loss = ti.field(dtype=ti.f32)
    ti.root.place(v, loss, x_avg)
    ti.root.dense(ti.i, 2).place(x)
    v[None] = [2.0, 1.0, 3.0]
    ti.root.lazy_grad()
    for f in (x, v, x_avg, loss):
        assert f.needs_grad
    v.grad[None] = [0.5, 0.5, 0.5]
    np.testing.assert_array_equal(v[None], [2, 1, 3])
    np.testing.assert_array_equal(v.grad[None], [0.5, 0.5, 0.5])


def test_lazy_grad_after_a_kernel_launch():
    x = ti.field(ti.f32)
    ti.root.dense(ti.i, 8).place(x)

    @ti.kernel
    def init_x():
        for i in range(8):
            x[i] = i * 0.5

    init_x()
    ti.root.lazy_grad()

    @ti.kernel
    def seed_grad():
        for i in range(8):
            x.grad[i] = x[i] + 1.0

    seed_grad()
    np.testing.assert_array_equal(x.to_numpy(), np.arange(8) * 0.5)
    np.testing.assert_array_equal(x.grad.to_numpy(), np.arange(8) * 0.5 + 1)


def test_python_writes_between_kernel_launches_are_ordered():
    x = ti.field(ti.i32, shape=16)

    @ti.kernel
    def inc():
        for i in range(16):
            x[i] += 1

    ref = np.zeros(16, np.int32)
    for k in range(20):
        inc()
        x[k % 16] = 100 * k
        ref += 1
        ref[k % 16] = 100 * k
    inc()
    np.testing.assert_array_equal(x.to_numpy(), ref + 1)


# ---- reset ----------------------------------------------------------------------------------------

def test_reset_invalidates_old_fields():
    x = ti.field(ti.f32, shape=3, name="x")
    x[0] = 1.0
    unused = ti.field(ti.f32, shape=3, name="unused")
    ti.reset()
    assert x._buffer is None  # the GPU memory went with the device
    for f in (x, unused):
        with pytest.raises(WgpuAdError, match=r"field '\w+' was created before ti.reset\(\) / ti.init\(\) and is gone"):
            f.to_numpy()
    with pytest.raises(WgpuAdError, match="was created before"):
        x[0] = 2.0
    y = ti.field(ti.f32, shape=3)
    y[1] = 4.0
    assert y.to_numpy().tolist() == [0, 4, 0]


def test_reset_clears_root():
    ti.root.lazy_grad()
    ti.reset()
    x = ti.field(ti.f32, shape=2)
    assert not x.needs_grad


# ---- ndarrays -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, element_shape", [
    (ti.f32, ()), (ti.i32, ()), (VectorType(3, f32), (3,)), (ti.types.vector(2, ti.i32), (2,)),
    (MatrixType(2, 2, f32), (2, 2)), (ti.math.mat3, (3, 3)), (ti.types.matrix(2, 3, ti.u32), (2, 3)),
])
@pytest.mark.parametrize("shape", [(), (4,), (2, 3)])
def test_ndarray_roundtrip_access(dtype, element_shape, shape):
    a = ti.ndarray(dtype, shape=shape)
    assert isinstance(a, N.Ndarray) and not a.is_field
    assert a.shape == shape and a.element_shape == element_shape
    assert a.element_type == dtype
    ref = random_values(shape + element_shape, a.dtype)
    a.from_numpy(ref)
    np.testing.assert_array_equal(a.to_numpy(), ref)
    np.testing.assert_array_equal(raw(a), ref.ravel())
    key = tuple(s - 1 for s in shape) if shape else None
    np.testing.assert_array_equal(a[key], ref[tuple(s - 1 for s in shape)])
    a[key] = 1
    ref[tuple(s - 1 for s in shape)] = 1
    np.testing.assert_array_equal(a.to_numpy(), ref)
    b = ti.ndarray(dtype, shape=shape)
    b.copy_from(a)
    a.fill(0)
    np.testing.assert_array_equal(b.to_numpy(), ref)
    np.testing.assert_array_equal(a.to_numpy(), np.zeros_like(ref))


def test_ndarray_grad_and_errors():
    a = ti.ndarray(ti.math.vec3, shape=4, needs_grad=True, name="a")
    assert isinstance(a.grad, N.Ndarray) and a.grad.is_grad and a.grad.primal is a and a.grad.name == "a.grad"
    assert a.grad.shape == (4,) and a.grad.element_shape == (3,)
    with pytest.raises(WgpuAdError, match="shape= is required"):
        ti.ndarray(ti.f32, shape=None)
    with pytest.raises(WgpuAdError, match="needs_grad=True needs a float dtype, got i32"):
        ti.ndarray(ti.i32, shape=2, needs_grad=True)
    with pytest.raises(WgpuAdError, match=r"ndarray 'a'.from_numpy: expected an array of shape \(4, 3\)"):
        a.from_numpy(np.zeros(4))
    with pytest.raises(IndexError, match=r"ndarray 'a': index 4 is out of bounds for shape \(4,\)"):
        a[4]
    f = ti.Vector.field(3, ti.f32, shape=4)
    f.fill(2)
    a.copy_from(f)  # fields and ndarrays of the same shape copy into each other
    np.testing.assert_array_equal(a.to_numpy(), np.full((4, 3), 2))
