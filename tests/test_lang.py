"""End-to-end: Taichi-style kernels compiled to WGSL and run on the adapter, against NumPy."""
import math

import numpy as np
import pytest

import wgpu_ad as ti

pytestmark = pytest.mark.gpu


def test_gravity_energy_matches_numpy():
    N = 32
    x = ti.Vector.field(2, dtype=ti.f32, shape=N, needs_grad=True)
    U = ti.field(dtype=ti.f32, shape=())

    @ti.kernel
    def compute_U():
        for i, j in ti.ndrange(N, N):
            r = x[i] - x[j]
            U[None] += -1 / r.norm(1e-3)

    rng = np.random.default_rng(0)
    pos = rng.random((N, 2)).astype(np.float32)
    x.from_numpy(pos)
    compute_U()
    p = pos.astype(np.float64)
    d = p[:, None, :] - p[None, :, :]
    ref = np.sum(-1 / np.sqrt((d ** 2).sum(-1) + 1e-3))
    assert U[None] == pytest.approx(ref, rel=1e-4)


def test_scalar_args_return_and_serial_part():
    a = ti.field(ti.i32, shape=16)

    @ti.kernel
    def fill(base: ti.i32, scale: ti.f32) -> ti.f32:
        for i in range(16):
            a[i] = base + i * 2
        return scale * 3

    r = fill(5, 1.5)
    assert r == pytest.approx(4.5)
    np.testing.assert_array_equal(a.to_numpy(), 5 + 2 * np.arange(16))


def test_integer_ops_python_semantics():
    n = 64
    src = ti.field(ti.i32, shape=n)
    out = ti.field(ti.i32, shape=(8, n))

    @ti.kernel
    def k(d: ti.i32):
        for i in range(n):
            v = src[i]
            out[0, i] = v // d
            out[1, i] = v % d
            out[2, i] = v << 2
            out[3, i] = v >> 1
            out[4, i] = (v & 7) | (v ^ 3)
            out[5, i] = ~v
            out[6, i] = abs(v) + max(v, 3) - min(v, -2)
            out[7, i] = -v if v < 0 else v * 3

    vals = np.arange(-32, 32, dtype=np.int32)
    src.from_numpy(vals)
    for d in (3, -5):
        k(d)
        o = out.to_numpy()
        v = vals.astype(np.int64)
        np.testing.assert_array_equal(o[0], v // d)
        np.testing.assert_array_equal(o[1], v % d)
        np.testing.assert_array_equal(o[2], v << 2)
        np.testing.assert_array_equal(o[3], v >> 1)
        np.testing.assert_array_equal(o[4], (v & 7) | (v ^ 3))
        np.testing.assert_array_equal(o[5], ~v)
        np.testing.assert_array_equal(o[6], np.abs(v) + np.maximum(v, 3) - np.minimum(v, -2))
        np.testing.assert_array_equal(o[7], np.where(v < 0, -v, v * 3))


def test_float_math_functions():
    n = 50
    x = ti.field(ti.f32, shape=n)
    out = ti.field(ti.f32, shape=(20, n))

    @ti.kernel
    def k():
        for i in x:
            v = x[i]
            out[0, i] = ti.sin(v)
            out[1, i] = ti.cos(v)
            out[2, i] = ti.tan(v * 0.3)
            out[3, i] = ti.asin(v * 0.5)
            out[4, i] = ti.acos(v * 0.5)
            out[5, i] = ti.atan2(v, 0.7)
            out[6, i] = ti.exp(v)
            out[7, i] = ti.log(v + 2.5)
            out[8, i] = ti.sqrt(v + 2.5)
            out[9, i] = ti.rsqrt(v + 2.5)
            out[10, i] = v ** 3
            out[11, i] = ti.pow(v + 2.5, 1.7)
            out[12, i] = ti.tanh(v)
            out[13, i] = ti.floor(v * 3)
            out[14, i] = ti.ceil(v * 3)
            out[15, i] = ti.round(v * 3)
            out[16, i] = v // 0.3
            out[17, i] = v % 0.3
            out[18, i] = ti.math.clamp(v, -0.5, 0.5)
            out[19, i] = ti.select(v > 0, v, -2 * v) + ti.abs(v)

    xs = np.linspace(-1.9, 1.9, n).astype(np.float32)
    x.from_numpy(xs)
    k()
    o = out.to_numpy()
    v = xs.astype(np.float64)
    refs = [np.sin(v), np.cos(v), np.tan(v * 0.3), np.arcsin(v * 0.5), np.arccos(v * 0.5),
            np.arctan2(v, 0.7), np.exp(v), np.log(v + 2.5), np.sqrt(v + 2.5), 1 / np.sqrt(v + 2.5),
            v ** 3, (v + 2.5) ** 1.7, np.tanh(v), np.floor(xs * np.float32(3)), np.ceil(xs * np.float32(3)),
            np.round(xs * np.float32(3)), np.floor(v / 0.3), v - 0.3 * np.floor(v / 0.3),
            np.clip(v, -0.5, 0.5), np.where(v > 0, v, -2 * v) + np.abs(v)]
    for row, ref in enumerate(refs):
        np.testing.assert_allclose(o[row], ref, rtol=2e-5, atol=2e-5, err_msg=f"row {row}")


def test_serial_loops_while_break_continue():
    n = 40
    out = ti.field(ti.i32, shape=n)

    @ti.kernel
    def k():
        for i in range(n):
            s = 0
            for j in range(i):
                if j % 3 == 0:
                    continue
                s += j
                if s > 100:
                    break
            t = i
            steps = 0
            while t != 1 and t > 0:
                t = t // 2 if t % 2 == 0 else 3 * t + 1
                steps += 1
            out[i] = s * 1000 + steps

    k()
    ref = []
    for i in range(n):
        s = 0
        for j in range(i):
            if j % 3 == 0:
                continue
            s += j
            if s > 100:
                break
        t, steps = i, 0
        while t != 1 and t > 0:
            t = t // 2 if t % 2 == 0 else 3 * t + 1
            steps += 1
        ref.append(s * 1000 + steps)
    np.testing.assert_array_equal(out.to_numpy(), ref)


def test_ti_func_with_returns_and_static():
    out = ti.field(ti.f32, shape=10)

    @ti.func
    def piecewise(x):
        if x < 3:
            return x * 2.0
        elif x < 6:
            return 10.0
        return -x

    @ti.func
    def add_n(v, n: ti.template()):
        r = v
        for _ in ti.static(range(n)):
            r += 1.0
        return r

    @ti.kernel
    def k():
        for i in out:
            out[i] = add_n(piecewise(float(i)), 2)
            if ti.static(False):
                out[i] = 1000.0

    k()
    ref = [(i * 2.0 if i < 3 else 10.0 if i < 6 else -i) + 2 for i in range(10)]
    np.testing.assert_allclose(out.to_numpy(), ref)


def test_vectors_matrices():
    n = 8
    m = ti.Matrix.field(3, 3, ti.f32, shape=n)
    v = ti.Vector.field(3, ti.f32, shape=n)
    out_v = ti.Vector.field(3, ti.f32, shape=(6, n))
    out_s = ti.field(ti.f32, shape=(4, n))
    out_m = ti.Matrix.field(3, 3, ti.f32, shape=(3, n))

    @ti.kernel
    def k():
        for i in range(n):
            a = m[i]
            b = v[i]
            out_v[0, i] = a @ b
            out_v[1, i] = b.cross(ti.Vector([1.0, 2.0, 3.0]))
            out_v[2, i] = b.normalized()
            out_v[3, i] = ti.math.vec3(b.xy, 1.0) * 2
            out_v[4, i] = b.zyx
            c = b
            c[0] = 7.0
            c.y += 1.0
            out_v[5, i] = c
            out_s[0, i] = b.dot(b)
            out_s[1, i] = b.norm()
            out_s[2, i] = a.determinant()
            out_s[3, i] = a.trace() + b.sum() + b.max() - b.min()
            out_m[0, i] = a.inverse()
            out_m[1, i] = a.transpose() + ti.Matrix.identity(ti.f32, 3)
            out_m[2, i] = b.outer_product(b)

    rng = np.random.default_rng(1)
    M = (rng.random((n, 3, 3)) + np.eye(3) * 2).astype(np.float32)
    V = rng.random((n, 3)).astype(np.float32)
    m.from_numpy(M)
    v.from_numpy(V)
    k()
    ov, os_, om = out_v.to_numpy(), out_s.to_numpy(), out_m.to_numpy()
    M64, V64 = M.astype(np.float64), V.astype(np.float64)
    tol = dict(rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ov[0], np.einsum("nij,nj->ni", M64, V64), **tol)
    np.testing.assert_allclose(ov[1], np.cross(V64, [1, 2, 3]), **tol)
    np.testing.assert_allclose(ov[2], V64 / np.linalg.norm(V64, axis=1, keepdims=True), **tol)
    np.testing.assert_allclose(ov[3], np.stack([V64[:, 0] * 2, V64[:, 1] * 2, np.full(n, 2.0)], 1), **tol)
    np.testing.assert_allclose(ov[4], V64[:, ::-1], **tol)
    np.testing.assert_allclose(ov[5], np.stack([np.full(n, 7.0), V64[:, 1] + 1, V64[:, 2]], 1), **tol)
    np.testing.assert_allclose(os_[0], (V64 ** 2).sum(1), **tol)
    np.testing.assert_allclose(os_[1], np.linalg.norm(V64, axis=1), **tol)
    np.testing.assert_allclose(os_[2], np.linalg.det(M64), rtol=1e-4)
    np.testing.assert_allclose(os_[3], np.trace(M64, axis1=1, axis2=2) + V64.sum(1) + V64.max(1) - V64.min(1), **tol)
    np.testing.assert_allclose(om[0], np.linalg.inv(M64), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(om[1], M64.transpose(0, 2, 1) + np.eye(3), **tol)
    np.testing.assert_allclose(om[2], np.einsum("ni,nj->nij", V64, V64), **tol)


def test_matrix_diag():
    """ti.Matrix.diag(dim, val) (Taichi's; diffmpm's stress `ti.Matrix.diag(2, la * (J - 1) * J)`):
    val on the diagonal, zeros of its type elsewhere, in kernels (GPU or constant val, with its
    gradient) and in Python scope."""
    n = 3
    a = ti.field(ti.f32, shape=n, needs_grad=True)
    out = ti.Matrix.field(2, 2, ti.f32, shape=n)
    k_out = ti.Matrix.field(3, 3, ti.i32, shape=())
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def k():
        for i in a:
            m = ti.Matrix.diag(2, a[i] * a[i]) + ti.Matrix([[0.0, 1.0], [2.0, 0.0]])
            out[i] = m
            loss[None] += (m @ m).trace()
        k_out[None] = ti.Matrix.diag(3, 4)

    a0 = np.array([0.5, -1.0, 2.0])
    a.from_numpy(a0.astype(np.float32))
    with ti.ad.Tape(loss):
        k()
    d = a0 ** 2
    np.testing.assert_allclose(out.to_numpy(), [[[x, 1], [2, x]] for x in d], rtol=1e-6)
    np.testing.assert_array_equal(k_out.to_numpy(), 4 * np.eye(3))
    assert k_out.to_numpy().dtype == np.int32
    # trace(m @ m) = 2 d^2 + 4 with d = a^2: d/da = 8 a^3
    np.testing.assert_allclose(a.grad.to_numpy(), 8 * a0 ** 3, rtol=1e-6)
    np.testing.assert_array_equal(ti.Matrix.diag(2, 1.5), [[1.5, 0.0], [0.0, 1.5]])


def test_math_rotation2d_reflect_eye():
    """ti.math.rotation2d(a), ti.math.reflect(x, n), ti.math.eye(n) (Taichi's, used by rigid-body
    code), in kernels with the gradient of the angle, and in Python scope."""
    a = ti.field(ti.f32, shape=(), needs_grad=True)
    out = ti.Vector.field(2, ti.f32, shape=3)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def k():
        p = ti.math.rotation2d(a[None]) @ ti.Vector([1.0, 2.0])
        out[0] = p
        out[1] = ti.math.reflect(ti.Vector([1.0, -2.0]), ti.Vector([0.6, 0.8]))
        out[2] = ti.math.eye(2) @ ti.Vector([3.0, 4.0])
        loss[None] = p[0]

    a[None] = 0.4
    with ti.ad.Tape(loss):
        k()
    c, s = np.cos(0.4), np.sin(0.4)
    np.testing.assert_allclose(out.to_numpy(), [[c - 2 * s, s + 2 * c], [2.2, -0.4], [3, 4]], rtol=1e-6, atol=1e-6)
    assert a.grad[None] == pytest.approx(-s - 2 * c, rel=1e-6)  # d/da (cos a - 2 sin a)
    np.testing.assert_allclose(ti.math.rotation2d(0.4), [[c, -s], [s, c]], rtol=1e-6)
    np.testing.assert_allclose(ti.math.reflect([1.0, -2.0], [0.6, 0.8]), [2.2, -0.4], rtol=1e-6)
    np.testing.assert_array_equal(ti.math.eye(3), np.eye(3))


def test_matrix_element_assigned_nested_lists():
    """m[i] = [[0, 0], [0, 0]] (diffmpm's clear_particle_grad, on a gradient field too), rows of GPU
    values, rows that are vectors; a row of the wrong length names the shapes."""
    n = 3
    m = ti.Matrix.field(2, 2, ti.f32, shape=n, needs_grad=True)
    a = ti.field(ti.f32, shape=n)

    @ti.kernel
    def fill():
        for i in m:
            m.grad[i] = [[0, 0], [0, 0]]
            if i == 0:
                m[i] = [[a[i], 2 * a[i]], [3.0, 4]]
            else:
                r = ti.Vector([a[i], -a[i]])
                m[i] = [r, r * 2]

    a.from_numpy(np.array([1.0, 2.0, 3.0], np.float32))
    m.grad.fill(5.0)
    fill()
    np.testing.assert_array_equal(m.grad.to_numpy(), np.zeros((n, 2, 2)))
    np.testing.assert_array_equal(m.to_numpy(), [[[1, 2], [3, 4]], [[2, -2], [4, -4]], [[3, -3], [6, -6]]])

    @ti.kernel
    def bad():
        for i in m:
            m[i] = [[0, 0, 0], [0, 0, 0]]

    with pytest.raises(ti.TaichiCompilationError, match=r"cannot assign rows of lengths \[3, 3\] to m\[i\] of "
                                                         r"shape \(2, 2\)"):
        bad()


def test_struct_for_grouped_and_ndrange_bounds():
    f = ti.field(ti.i32, shape=(5, 7))
    g = ti.field(ti.i32, shape=(5, 7))

    @ti.kernel
    def k():
        for i, j in f:
            f[i, j] = i * 10 + j
        for I in ti.grouped(g):
            g[I] = I[0] + I[1] * 100
        for i, j in ti.ndrange((1, 3), (2, 5)):
            g[i, j] = -1

    k()
    i, j = np.meshgrid(np.arange(5), np.arange(7), indexing="ij")
    np.testing.assert_array_equal(f.to_numpy(), i * 10 + j)
    ref = i + j * 100
    ref[1:3, 2:5] = -1
    np.testing.assert_array_equal(g.to_numpy(), ref)


def test_kernel_scope_variables_reach_later_loops():
    a = ti.field(ti.f32, shape=8)
    total = ti.field(ti.f32, shape=())

    @ti.kernel
    def k(t: ti.f32):
        dt = t * 0.5
        offset = 1.0
        for i in a:
            a[i] = i * dt + offset
        total[None] = 0.0
        for i in a:
            total[None] += a[i] * dt

    k(4.0)
    av = np.arange(8) * 2.0 + 1.0
    np.testing.assert_allclose(a.to_numpy(), av)
    assert total[None] == pytest.approx((av * 2.0).sum())


def test_atomic_functions_return_old_value():
    n = 1000
    counter = ti.field(ti.i32, shape=())
    olds = ti.field(ti.i32, shape=n)
    mx = ti.field(ti.f32, shape=())
    mn = ti.field(ti.i32, shape=())
    bits = ti.field(ti.i32, shape=())

    @ti.kernel
    def k():
        mx[None] = -1e9
        mn[None] = 1 << 30
        for i in range(n):
            olds[i] = ti.atomic_add(counter[None], 1)
            ti.atomic_max(mx[None], ti.sin(float(i)))
            ti.atomic_min(mn[None], (i * 7919) % 1000)
            ti.atomic_or(bits[None], 1 << (i % 31))

    k()
    assert counter[None] == n
    assert sorted(olds.to_numpy().tolist()) == list(range(n))
    assert mx[None] == pytest.approx(max(math.sin(i) for i in range(n)), abs=1e-6)
    assert mn[None] == min((i * 7919) % 1000 for i in range(n))
    assert bits[None] == (1 << 31) - 1


def test_ndarray_arguments():
    @ti.kernel
    def saxpy(a: ti.f32, x: ti.types.ndarray(), y: ti.types.ndarray()):
        for i in range(x.shape[0]):
            y[i] = a * x[i] + y[i]

    for n in (10, 1000):
        x = ti.ndarray(ti.f32, shape=n)
        y = ti.ndarray(ti.f32, shape=n)
        xv = np.arange(n, dtype=np.float32)
        x.from_numpy(xv)
        y.from_numpy(np.ones(n, np.float32))
        saxpy(2.0, x, y)
        np.testing.assert_allclose(y.to_numpy(), 2 * xv + 1)


def test_range_beyond_dispatch_limit():
    n = 65535 * 128 + 1000  # more threads than one dispatch of 65,535 workgroups can hold
    f = ti.field(ti.i32, shape=n)

    @ti.kernel
    def k():
        for i in range(n):
            f[i] = i * 3

    k()
    np.testing.assert_array_equal(f.to_numpy(), np.arange(n, dtype=np.int64) * 3)


def test_million_way_contention_integer_exact():
    n = 1_000_000
    c = ti.field(ti.i32, shape=())
    s = ti.field(ti.f32, shape=())

    @ti.kernel
    def k():
        for i in range(n):
            c[None] += i % 7
            s[None] += 1.0

    k()
    assert c[None] == sum(i % 7 for i in range(7)) * (n // 7) + sum(i % 7 for i in range(n - n % 7, n))
    assert s[None] == float(n)


def test_random_is_uniform():
    n = 100_000
    f = ti.field(ti.f32, shape=n)

    @ti.kernel
    def k():
        for i in f:
            f[i] = ti.random()

    k()
    a = f.to_numpy()
    k()
    b = f.to_numpy()
    assert a.min() >= 0 and a.max() < 1
    assert abs(a.mean() - 0.5) < 0.01 and abs(a.var() - 1 / 12) < 0.01
    assert not np.array_equal(a, b)


def test_casts_and_loop_config():
    f = ti.field(ti.i32, shape=16)
    g = ti.field(ti.f32, shape=16)

    @ti.kernel
    def k():
        ti.loop_config(block_dim=32)
        for i in range(16):
            f[i] = int(i * 0.75) + ti.cast(-2.7, ti.i32)
        ti.loop_config(serialize=True)
        for i in range(16):
            g[i] = float(i) / 2 + (g[i - 1] if i > 0 else 0.0)

    k()
    np.testing.assert_array_equal(f.to_numpy(), [int(i * 0.75) - 2 for i in range(16)])
    np.testing.assert_allclose(g.to_numpy(), np.cumsum(np.arange(16) / 2))


def test_python_scope_vectors_are_kernel_constants():
    x = ti.Vector.field(3, ti.f32, shape=4)
    C = ti.Vector([0.0, 0.3, 0.0])
    M = ti.Matrix([[1.0, 2.0], [3.0, 4.0]])
    out = ti.Vector.field(2, ti.f32, shape=4)

    @ti.kernel
    def k():
        for i in x:
            x[i] = x[i] - C
            out[i] = M @ ti.Vector([1.0, float(i)])

    k()
    np.testing.assert_allclose(x.to_numpy(), np.tile([0.0, -0.3, 0.0], (4, 1)), rtol=1e-6)
    np.testing.assert_allclose(out.to_numpy(), [[1 + 2 * i, 3 + 4 * i] for i in range(4)])


def test_ranges_at_the_grid_cap():
    """With the grid capped at 2 workgroups of 128 threads when the kernels compile, a constant
    range of up to 256 elements runs one iteration per thread, a longer one a grid-stride loop;
    every element is written either way. The cap is a compile option: lowering it later
    recompiles the kernel for the new cap (a grid-stride loop), never runs it short."""
    ti.init()
    ti.set_compile_options(grid_cap=2)
    for n in (255, 256, 257, 1000):
        x = ti.field(ti.i32, shape=n)

        @ti.kernel
        def fill():
            for i in x:
                x[i] = i * 2 + 1

        fill()
        np.testing.assert_array_equal(x.to_numpy(), np.arange(n) * 2 + 1)
        assert fill._get(())[0].plan.tasks[0].one_pass == (n <= 256)
    y = ti.field(ti.i32, shape=200)

    @ti.kernel
    def fill_y():
        for i in y:
            y[i] = 1

    fill_y()
    assert fill_y._get(())[0].plan.tasks[0].one_pass
    ti.set_compile_options(grid_cap=1)
    y.fill(0)
    fill_y()
    assert not fill_y._get(())[0].plan.tasks[0].one_pass
    np.testing.assert_array_equal(y.to_numpy(), np.ones(200))
