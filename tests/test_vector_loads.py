"""Read-only vector buffers read as arrays of vec2 / vec4 (codegen/wgsl.py `_vector_view`): the
WGSL declares the view only where it is safe, and the values are NumPy's in every case."""
import re

import numpy as np
import pytest

import wgpu_ad as ti

pytestmark = pytest.mark.gpu


def _decl(wgsl: str, name: str) -> str:
    m = re.search(rf"var<storage, (?:read|read_write)> {re.escape(name)}: (array<[^;]*>);", wgsl)
    assert m, f"no declaration of {name!r} in\n{wgsl}"
    return m.group(1)


def test_pair_loads_constant_elements_and_int_vectors():
    ti.init()
    n = 37
    x = ti.Vector.field(2, ti.f32, shape=n)
    ids = ti.Vector.field(2, ti.i32, shape=n)
    out = ti.field(ti.f32, shape=n)

    @ti.kernel
    def k():
        for i in range(n):
            s = 0.0
            for j in range(n):
                d = x[i] - x[j]
                s += d.dot(d)
            out[i] = s + x[3][1] * (ids[i][0] - ids[i][1])

    rng = np.random.default_rng(0)
    xv = rng.random((n, 2)).astype(np.float32)
    iv = rng.integers(-50, 50, (n, 2)).astype(np.int32)
    x.from_numpy(xv)
    ids.from_numpy(iv)
    k()
    x64 = xv.astype(np.float64)
    d = x64[:, None, :] - x64[None, :, :]
    want = (d ** 2).sum((1, 2)) + x64[3, 1] * (iv[:, 0] - iv[:, 1])
    # float32 sums of terms up to ~40: judged at the scale of the largest result
    np.testing.assert_allclose(out.to_numpy(), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    wgsl = k.get_wgsl()
    assert _decl(wgsl, "x") == "array<vec2<f32>>" and _decl(wgsl, "ids") == "array<vec2<i32>>"
    assert _decl(wgsl, "out") == "array<f32>"


def test_vec4_matrix_and_vec3_fields():
    """vec4 and 2x2 matrices (4 scalars) get vec4 views; vec3 (12-byte elements, but a WGSL
    array of vec3 has a 16-byte stride) keeps the scalar array."""
    ti.init()
    n = 21
    a = ti.Vector.field(4, ti.f32, shape=n)
    m = ti.Matrix.field(2, 2, ti.f32, shape=n)
    c = ti.Vector.field(3, ti.f32, shape=n)
    out = ti.field(ti.f32, shape=n)

    @ti.kernel
    def k():
        for i in range(n):
            v = ti.Vector([a[i][0], a[i][1]])
            w = m[i] @ v
            out[i] = w[0] * a[i][2] + w[1] * a[i][3] + c[i].norm()

    rng = np.random.default_rng(1)
    av, mv, cv = (rng.random(s).astype(np.float32) for s in ((n, 4), (n, 2, 2), (n, 3)))
    a.from_numpy(av)
    m.from_numpy(mv)
    c.from_numpy(cv)
    k()
    a64, m64, c64 = av.astype(np.float64), mv.astype(np.float64), cv.astype(np.float64)
    w = np.einsum("nij,nj->ni", m64, a64[:, :2])
    want = w[:, 0] * a64[:, 2] + w[:, 1] * a64[:, 3] + np.linalg.norm(c64, axis=1)
    np.testing.assert_allclose(out.to_numpy(), want, rtol=1e-5)
    wgsl = k.get_wgsl()
    assert _decl(wgsl, "a") == "array<vec4<f32>>" and _decl(wgsl, "m") == "array<vec4<f32>>"
    assert _decl(wgsl, "c") == "array<f32>"


def test_a_buffer_the_task_writes_keeps_the_scalar_array():
    ti.init()
    n = 16
    x = ti.Vector.field(2, ti.f32, shape=n)

    @ti.kernel
    def k():
        for i in range(n):
            x[i] = ti.Vector([x[i][1], x[i][0] * 2.0])

    xv = np.random.default_rng(2).random((n, 2)).astype(np.float32)
    x.from_numpy(xv)
    k()
    np.testing.assert_allclose(x.to_numpy(), np.stack([xv[:, 1], xv[:, 0] * 2], 1), rtol=1e-6)
    assert _decl(k.get_wgsl(), "x") == "array<f32>"


def test_ndarray_of_vectors_and_its_gradient():
    """An ndarray argument of vec2 elements is read through the view, in the forward kernel and
    in its adjoint; the gradient is the analytic one."""
    ti.init()
    n = 33
    x = ti.ndarray(ti.math.vec2, shape=n, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def f(x: ti.types.ndarray()):
        for i in range(x.shape[0]):
            loss[None] += x[i][0] * x[i][1] ** 2

    xv = np.random.default_rng(3).random((n, 2)).astype(np.float32)
    x.from_numpy(xv)
    with ti.ad.Tape(loss=loss):
        f(x)
    x64 = xv.astype(np.float64)
    assert loss[None] == pytest.approx(float((x64[:, 0] * x64[:, 1] ** 2).sum()), rel=1e-5)
    want = np.stack([x64[:, 1] ** 2, 2 * x64[:, 0] * x64[:, 1]], 1)
    np.testing.assert_allclose(x.grad.to_numpy(), want, rtol=1e-5, atol=1e-7)
    assert _decl(f.get_wgsl(x), "x") == "array<vec2<f32>>"
    assert _decl(f.get_wgsl(x, grad=True), "x") == "array<vec2<f32>>"
