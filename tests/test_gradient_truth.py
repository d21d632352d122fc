"""Silent wrong gradients that are gone (issue #16): each case against an analytic derivative.

- ti.stop_grad(field) stops the gradient flowing into the field (it used to be ignored);
- ti.types.ndarray(needs_grad=False) gives the argument no gradient (it used to be ignored);
- a store consumes the element's adjoint: after the backward pass the gradient of a field a
  kernel overwrote refers to its value before, which nothing read: zero (as in Taichi).
"""
from __future__ import annotations

import numpy as np
import pytest

import wgpu_ad as ti

pytestmark = pytest.mark.gpu


def test_stop_grad_of_a_field():
    """loss = sum x * y with ti.stop_grad(x): dloss/dy = x, and x.grad stays 0 (not y)."""
    x = ti.field(ti.f32, shape=8, needs_grad=True)
    y = ti.field(ti.f32, shape=8, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def dot():
        ti.stop_grad(x)
        for i in x:
            loss[None] += x[i] * y[i]

    x0 = np.arange(8, dtype=np.float32)
    x.from_numpy(x0)
    y.fill(2.0)
    with ti.ad.Tape(loss):
        dot()
    assert loss[None] == pytest.approx(2.0 * x0.sum())
    np.testing.assert_array_equal(x.grad.to_numpy(), np.zeros(8))
    np.testing.assert_array_equal(y.grad.to_numpy(), x0)


def test_stop_grad_of_an_ndarray_argument_and_needs_grad_false():
    """Two ways to keep an ndarray argument's gradient out: ti.stop_grad(a) in the kernel, and the
    annotation ti.types.ndarray(needs_grad=False); the other argument gets its gradient."""
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def stopped(a: ti.types.ndarray(), b: ti.types.ndarray()):
        ti.stop_grad(a)
        for i in a:
            loss[None] += a[i] * b[i] * b[i]

    @ti.kernel
    def annotated(a: ti.types.ndarray(needs_grad=False), b: ti.types.ndarray()):
        for i in a:
            loss[None] += a[i] * b[i] * b[i]

    a0 = np.linspace(0.5, 2.0, 10).astype(np.float32)
    b0 = np.linspace(-1.0, 1.0, 10).astype(np.float32)
    for kernel in (stopped, annotated):
        a = ti.ndarray(ti.f32, shape=10, needs_grad=True)
        b = ti.ndarray(ti.f32, shape=10, needs_grad=True)
        a.from_numpy(a0)
        b.from_numpy(b0)
        with ti.ad.Tape(loss):
            kernel(a, b)
        np.testing.assert_array_equal(a.grad.to_numpy(), np.zeros(10), err_msg=kernel.__name__)
        np.testing.assert_allclose(b.grad.to_numpy(), 2 * a0 * b0, rtol=1e-6, err_msg=kernel.__name__)


def test_a_store_consumes_the_adjoint_of_the_element():
    """x -> a = 2x -> b = 3a -> loss = sum b: dloss/dx = 6, and a.grad, b.grad are the gradients
    with respect to a and b before they were written: 0."""
    x = ti.field(ti.f32, shape=5, needs_grad=True)
    a = ti.field(ti.f32, shape=5, needs_grad=True)
    b = ti.field(ti.f32, shape=5, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def make_a():
        for i in x:
            a[i] = 2 * x[i]

    @ti.kernel
    def make_b():
        for i in x:
            b[i] = 3 * a[i]

    @ti.kernel
    def total():
        for i in x:
            loss[None] += b[i]

    x.from_numpy(np.arange(5, dtype=np.float32))
    with ti.ad.Tape(loss):
        make_a()
        make_b()
        total()
    assert loss[None] == pytest.approx(6 * 10)
    np.testing.assert_array_equal(x.grad.to_numpy(), np.full(5, 6.0))
    np.testing.assert_array_equal(a.grad.to_numpy(), np.zeros(5))
    np.testing.assert_array_equal(b.grad.to_numpy(), np.zeros(5))



def test_normalized_with_eps_is_taichis_formula():
    """v.normalized(eps) = v / (|v| + eps) (Taichi's definition), and its gradient: for
    L = sum_k w_k u_k with u = v / (|v| + eps), dL/dv = w / s - (w . v) v / (|v| s^2), s = |v| + eps."""
    v = ti.Vector.field(3, ti.f32, shape=4, needs_grad=True)
    w = ti.Vector.field(3, ti.f32, shape=4)
    out = ti.Vector.field(3, ti.f32, shape=4)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def unit(eps: ti.f32):
        for i in v:
            u = v[i].normalized(eps)
            out[i] = u
            loss[None] += u.dot(w[i])

    rng = np.random.default_rng(5)
    v0 = rng.standard_normal((4, 3))
    w0 = rng.standard_normal((4, 3))
    v.from_numpy(v0.astype(np.float32))
    w.from_numpy(w0.astype(np.float32))
    for eps in (0.0, 0.5):
        with ti.ad.Tape(loss):
            unit(eps)
        n = np.linalg.norm(v0, axis=1, keepdims=True)
        s = n + eps
        np.testing.assert_allclose(out.to_numpy(), v0 / s, rtol=1e-5)
        want = w0 / s - (w0 * v0).sum(1, keepdims=True) * v0 / (n * s * s)
        np.testing.assert_allclose(v.grad.to_numpy(), want, rtol=1e-4, atol=1e-6)


def test_initialising_a_field_inside_the_tape_warns():
    """Seed 000: v set to constants inside the tape, then read: v.grad is (rightly) zero, and a
    GradientWarning names the kernel, the field and the fix. Clearing a grid that is accumulated
    into before it is read (a scatter) does not warn."""
    x = ti.field(ti.f32, shape=3, needs_grad=True)
    v = ti.field(ti.f32, shape=3, needs_grad=True)
    grid = ti.field(ti.f32, shape=3, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def ini_v():
        for p in v:
            v[p] = 0.1 * (p + 1)

    @ti.kernel
    def advance():
        for p in x:
            loss[None] += (x[p] + v[p]) ** 2

    @ti.kernel
    def clear():
        for p in grid:
            grid[p] = 0.0

    @ti.kernel
    def splat():
        for p in x:
            grid[p] += 2 * x[p]

    @ti.kernel
    def grid_loss():
        for p in grid:
            loss[None] += grid[p] ** 2

    x.fill(1.0)
    with pytest.warns(ti.ad.GradientWarning, match=r"kernel 'ini_v' overwrites field 'v' inside the tape with values "
                                                  r"that carry no gradient, and kernel 'advance' reads them: after the "
                                                  r"backward pass 'v'.grad is the gradient with respect to its value "
                                                  r"before 'ini_v' ran, which nothing read, so zero. .* run 'ini_v' "
                                                  r"before the tape"):
        with ti.ad.Tape(loss):
            ini_v()
            advance()
    np.testing.assert_array_equal(v.grad.to_numpy(), np.zeros(3))
    np.testing.assert_allclose(x.grad.to_numpy(), 2 * (1.0 + 0.1 * np.arange(1, 4)), rtol=1e-6)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", ti.ad.GradientWarning)
        with ti.ad.Tape(loss):
            clear()
            splat()
            grid_loss()
    np.testing.assert_allclose(x.grad.to_numpy(), np.full(3, 8.0), rtol=1e-6)  # d/dx (2x)^2 = 8x


def test_kernel_grad_by_hand_refuses_inputs_overwritten_since():
    """k0 reads a, k1 overwrites a, then k1.grad(); k0.grad(): k0's adjoint would replay the new a
    and give a silently wrong x.grad; it is refused, naming the kernel, the field and the writer.
    The same program without the overwrite gives the analytic gradient."""
    x = ti.field(ti.f32, shape=4, needs_grad=True)
    a = ti.field(ti.f32, shape=4, needs_grad=True)
    y = ti.field(ti.f32, shape=4, needs_grad=True)

    @ti.kernel
    def k0():
        for i in a:
            y[i] = a[i] * x[i]

    @ti.kernel
    def k1():
        for i in a:
            a[i] = 10.0

    x.fill(3.0)
    a.fill(2.0)
    k0()
    y.grad.fill(1.0)
    k0.grad()
    np.testing.assert_array_equal(x.grad.to_numpy(), np.full(4, 2.0))  # dy/dx = a = 2
    k0()
    k1()
    k1.grad()
    with pytest.raises(ti.WgpuAdError, match=r"k0.grad\(\): kernel 'k0' read field 'a' when it ran, and kernel 'k1' "
                                             r"wrote it since, so the gradient would be computed from the new "
                                             r"values and be silently wrong. Call k0.grad\(\) before a is "
                                             r"overwritten"):
        k0.grad()
    k0()
    a.from_numpy(np.full(4, 2.0, np.float32))  # the same values: still a write
    with pytest.raises(ti.WgpuAdError, match=r"and from_numpy wrote it since"):
        k0.grad()


def test_kernel_grad_by_hand_checks_the_launch_with_the_same_arguments():
    """k(0) reads x[0]; x is overwritten; k(1) runs; k.grad(0) must compare with what k(0) read,
    not with k(1)'s launch: it was silently d/dx x^2 at the new x (6, not 2)."""
    x = ti.field(ti.f32, shape=(2, 4), needs_grad=True)
    y = ti.field(ti.f32, shape=(2, 4), needs_grad=True)

    @ti.kernel
    def k(t: ti.i32):
        for i in range(4):
            y[t, i] = x[t, i] ** 2

    x.fill(1.0)
    k(0)
    x.fill(3.0)
    k(1)
    y.grad.fill(1.0)
    k.grad(1)
    np.testing.assert_array_equal(x.grad.to_numpy()[1], np.full(4, 6.0))
    with pytest.raises(ti.WgpuAdError, match=r"k.grad\(\): kernel 'k' read field 'x' when it ran, and fill wrote "
                                             r"it since, .* launch k again right before its .grad\(\) once x holds "
                                             r"what it read \(recomputed\)"):
        k.grad(0)


def test_kernel_grad_by_hand_accepts_writes_to_other_steps():
    """diffmpm's manual backward pass: a(t) reads s[t] and writes m[t]; b(t) reads m[t] and writes
    s[t + 1]. After the forward pass, b.grad(t) then a.grad(t) for t = T-1 .. 0: every write since
    a(t) read s[t] went to s[t + 1 ..] (it used to be refused as 'b wrote s since'). A write to the
    step a(t) read is still refused. y = s[T] = prod (1 + c) s[0] with m = s * c per step."""
    T, n = 40, 3
    s = ti.field(ti.f32, shape=(T + 1, n), needs_grad=True)
    m = ti.field(ti.f32, shape=(T, n), needs_grad=True)
    c = ti.field(ti.f32, shape=n, needs_grad=True)

    @ti.kernel
    def a(t: ti.i32):
        for i in range(n):
            m[t, i] = s[t, i] * c[i]

    @ti.kernel
    def b(t: ti.i32):
        for i in range(n):
            s[t + 1, i] = s[t, i] + m[t, i]

    c0 = np.array([0.01, -0.02, 0.03])
    s0 = np.array([1.0, 2.0, 0.5])
    c.from_numpy(c0.astype(np.float32))
    s.from_numpy(np.concatenate([s0[None], np.zeros((T, n))]).astype(np.float32))
    for t in range(T):
        a(t)
        b(t)
    s.grad.fill(0)
    s.grad.from_numpy(np.concatenate([np.zeros((T, n)), np.ones((1, n))]).astype(np.float32))
    for t in reversed(range(T)):
        b.grad(t)
        a.grad(t)
    np.testing.assert_allclose(s.grad.to_numpy()[0], (1 + c0) ** T, rtol=1e-5)
    np.testing.assert_allclose(c.grad.to_numpy(), T * s0 * (1 + c0) ** (T - 1), rtol=1e-5)
    a(3)
    s[3, 0] = 7.0
    with pytest.raises(ti.WgpuAdError, match=r"a.grad\(\): kernel 'a' read field 's' when it ran, and a "
                                             r"Python-scope assignment wrote it since"):
        a.grad(3)


def test_kernel_grad_by_hand_refuses_an_atomic_max_target_overwritten_since():
    """m = max x by ti.atomic_max: the adjoint finds the winner by comparing with m's value, so m
    counts as read. Overwritten before k.grad(), the gradient went to whichever x equalled the new m
    (silently [0, 0, 0, 1] here instead of [0, 1, 0, 0]); now refused. Untouched, it is exact."""
    x = ti.field(ti.f32, shape=4, needs_grad=True)
    m = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def k():
        for i in x:
            ti.atomic_max(m[None], x[i])

    x.from_numpy(np.array([1, 5, 3, 2], np.float32))
    m[None] = -100.0
    k()
    m.grad[None] = 1.0
    k.grad()
    np.testing.assert_array_equal(x.grad.to_numpy(), [0, 1, 0, 0])
    m[None] = -100.0
    k()
    m.fill(2.0)
    with pytest.raises(ti.WgpuAdError, match=r"k.grad\(\): kernel 'k' read field 'm' when it ran, and fill wrote it"):
        k.grad()


def test_a_store_in_a_loop_that_runs_once_is_differentiated():
    """`for level in range(1)` around the loop that stores: one iteration cannot store twice (it
    used to be refused as 'may be stored by more than one iteration or thread'); y = 3 x."""
    x = ti.field(ti.f32, shape=6, needs_grad=True)
    y = ti.field(ti.f32, shape=6, needs_grad=True)

    @ti.kernel
    def levels():
        for level in range(1):
            for i in x:
                y[i] = 3 * x[i] + level

    x.from_numpy(np.arange(6, dtype=np.float32))
    levels()
    np.testing.assert_array_equal(y.to_numpy(), 3 * np.arange(6))
    y.grad.from_numpy(np.arange(1, 7, dtype=np.float32))
    levels.grad()
    np.testing.assert_array_equal(x.grad.to_numpy(), 3 * np.arange(1, 7))


def test_a_loss_that_depends_on_nothing_with_a_gradient_gives_zero_gradients():
    x = ti.field(ti.f32, shape=4, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def constant_loss():
        loss[None] = 1.0

    x.fill(5.0)
    with pytest.warns(ti.ad.GradientWarning, match=r"none of the fields read by the kernels on the tape has a "
                                                  r"gradient \(they read no float fields\), so every gradient "
                                                  r"stays zero"):
        with ti.ad.Tape(loss):
            constant_loss()
    assert loss[None] == 1.0
    np.testing.assert_array_equal(x.grad.to_numpy(), np.zeros(4))


def test_the_explicit_ewma_of_the_seed_issue_in_one_kernel():
    """ewma[row, 0] = data[row, 0], then ewma[row, col] = a data[row, col] + (1 - a) ewma[row, col - 1]
    for col in range(1, C): the first store comes before every read of the thread's row and the
    loop's stores never touch column 0, so it is differentiated (it used to be refused).
    d ewma[row, C-1] / d data[row, 0] = (1 - a)^(C-1), / d data[row, c] = a (1 - a)^(C-1-c)."""
    R, C, a = 4, 7, 0.3
    data = ti.field(ti.f32, shape=(R, C), needs_grad=True)
    ewma = ti.field(ti.f32, shape=(R, C), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def smooth():
        for row in range(R):
            ewma[row, 0] = data[row, 0]
            for col in range(1, C):
                ewma[row, col] = a * data[row, col] + (1 - a) * ewma[row, col - 1]

    @ti.kernel
    def last_column():
        for row in range(R):
            loss[None] += ewma[row, C - 1] * (row + 1)

    d0 = np.random.default_rng(4).random((R, C))
    data.from_numpy(d0.astype(np.float32))
    with ti.ad.Tape(loss):
        smooth()
        last_column()
    ref = np.zeros((R, C))
    ref[:, 0] = d0[:, 0]
    for c in range(1, C):
        ref[:, c] = a * d0[:, c] + (1 - a) * ref[:, c - 1]
    np.testing.assert_allclose(ewma.to_numpy(), ref, rtol=1e-5)
    w = np.array([(1 - a) ** (C - 1)] + [a * (1 - a) ** (C - 1 - c) for c in range(1, C)])
    np.testing.assert_allclose(data.grad.to_numpy(), np.outer(np.arange(1, R + 1), w), rtol=1e-5)


def test_a_shared_element_written_before_the_loop_is_still_refused():
    """The same shape, but every thread writes row 0 first: another thread may overwrite an element
    after this one read it, so the kernel is refused as before."""
    data = ti.field(ti.f32, shape=(4, 5), needs_grad=True)
    ewma = ti.field(ti.f32, shape=(4, 5), needs_grad=True)

    @ti.kernel
    def shared():
        for row in range(4):
            ewma[0, 0] = data[row, 0]
            for col in range(1, 5):
                ewma[row, col] = 0.5 * ewma[0, col - 1] + data[row, col]

    shared()
    with pytest.raises(ti.CompileError, match=r"cannot differentiate kernel 'shared': it reads field 'ewma'"):
        shared.grad()


def test_a_kernel_scope_value_from_a_pure_func_reaches_the_loop():
    """s2 = h(p[None]) with a @ti.func that only computes (a + 0.5) is a kernel-scope value like
    any expression, visible in the parallel loop (it used to be refused as 'runs as its own GPU
    pass'): loss = sum (p + 0.5) x, dloss/dp = sum x, dloss/dx = p + 0.5."""
    p = ti.field(ti.f32, shape=(), needs_grad=True)
    x = ti.field(ti.f32, shape=4, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.func
    def h(a):
        return a + 0.5

    @ti.kernel
    def k():
        s2 = h(p[None])
        for i in x:
            loss[None] += s2 * x[i]

    p[None] = 1.0
    x.from_numpy(np.arange(1, 5, dtype=np.float32))
    with ti.ad.Tape(loss):
        k()
    assert loss[None] == pytest.approx(1.5 * 10)
    assert p.grad[None] == pytest.approx(10.0)
    np.testing.assert_allclose(x.grad.to_numpy(), np.full(4, 1.5))


def test_a_loss_overwritten_by_later_kernels():
    """loss = x, then loss = 2x, then loss = 4x, nothing reading the earlier values: dloss/dx = 4
    (Taichi's test of the shape; it used to be refused as a second store)."""
    x = ti.field(ti.f32, shape=(), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def c1():
        loss[None] = x[None]

    @ti.kernel
    def c2():
        loss[None] = 2 * x[None]

    @ti.kernel
    def c4():
        loss[None] = 4 * x[None]

    x[None] = 1.5
    with ti.ad.Tape(loss):
        c1()
        c2()
        c4()
    assert loss[None] == 6.0 and x.grad[None] == 4.0


def test_the_explicit_ewma_with_its_first_column_in_a_kernel_of_its_own():
    """The seed's explicit form split in two kernels: the first stores column 0, the second the
    other columns from the previous ones (it used to be refused as a second store)."""
    R, C, a = 3, 5, 0.4
    data = ti.field(ti.f32, shape=(R, C), needs_grad=True)
    ewma = ti.field(ti.f32, shape=(R, C), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def first_column():
        for row in range(R):
            ewma[row, 0] = data[row, 0]

    @ti.kernel
    def the_rest():
        for row in range(R):
            for col in range(1, C):
                ewma[row, col] = a * data[row, col] + (1 - a) * ewma[row, col - 1]

    @ti.kernel
    def last_column():
        for row in range(R):
            loss[None] += ewma[row, C - 1]

    data.from_numpy(np.random.default_rng(6).random((R, C)).astype(np.float32))
    with ti.ad.Tape(loss):
        first_column()
        the_rest()
        last_column()
    w = np.array([(1 - a) ** (C - 1)] + [a * (1 - a) ** (C - 1 - c) for c in range(1, C)])
    np.testing.assert_allclose(data.grad.to_numpy(), np.tile(w, (R, 1)), rtol=1e-5)


def test_vector_methods_and_math_functions_follow_taichis_formulas():
    """Each method and ti.math function against NumPy, written from Taichi's definitions:
    norm(eps) = sqrt(|v|^2 + eps), norm_inv(eps) = 1 / sqrt(|v|^2 + eps), normalized(eps) =
    v / (|v| + eps), clamp = min(max(x, lo), hi), mix = x (1 - a) + y a, step = 0 if x < e else 1,
    smoothstep(e0, e1, x) = t^2 (3 - 2t) with t = clamp((x - e0) / (e1 - e0), 0, 1),
    fract = x - floor(x), exp2 = e^(x ln 2), log2 = ln x / ln 2, length / distance = norms."""
    out = ti.field(ti.f32, shape=24)

    @ti.kernel
    def probe(vx: ti.f32, vy: ti.f32, vz: ti.f32, x: ti.f32):
        v = ti.Vector([vx, vy, vz])
        w = ti.Vector([0.5, -1.0, 2.0])
        out[0] = v.norm(0.25)
        out[1] = v.norm_inv(0.25)
        u = v.normalized(0.5)
        out[2], out[3], out[4] = u[0], u[1], u[2]
        out[5] = v.norm_sqr()
        c = v.cross(w)
        out[6], out[7], out[8] = c[0], c[1], c[2]
        out[9] = ti.math.clamp(x, -0.5, 0.25)
        out[10] = ti.math.mix(1.0, 3.0, x)
        out[11] = ti.math.step(0.1, x)
        out[12] = ti.math.smoothstep(-1.0, 1.0, x)
        out[13] = ti.math.fract(x * 3.0)
        out[14] = ti.math.exp2(x)
        out[15] = ti.math.log2(x + 2.0)
        out[16] = ti.math.length(v)
        out[17] = ti.math.distance(v, w)
        out[18] = v.sum()
        out[19] = v.max()
        out[20] = v.min()
        m = v.outer_product(w)
        out[21] = m.trace()
        out[22] = m.determinant()
        out[23] = ti.math.sign(x - 0.3)

    v = np.array([0.3, -1.2, 0.8])
    w = np.array([0.5, -1.0, 2.0])
    for x in (-0.7, 0.2, 0.9):
        probe(*v, x)
        n = np.linalg.norm(v)
        t = np.clip((x + 1.0) / 2.0, 0.0, 1.0)
        want = [np.sqrt(n * n + 0.25), 1 / np.sqrt(n * n + 0.25), *(v / (n + 0.5)), n * n, *np.cross(v, w),
                min(max(x, -0.5), 0.25), 1.0 * (1 - x) + 3.0 * x, 0.0 if x < 0.1 else 1.0, t * t * (3 - 2 * t),
                x * 3.0 - np.floor(x * 3.0), np.exp(x * np.log(2.0)), np.log(x + 2.0) / np.log(2.0), n,
                np.linalg.norm(v - w), v.sum(), v.max(), v.min(), np.trace(np.outer(v, w)),
                np.linalg.det(np.outer(v, w)), np.sign(x - 0.3)]
        np.testing.assert_allclose(out.to_numpy(), want, rtol=2e-5, atol=2e-6, err_msg=f"x = {x}")
