"""Taichi idioms that programs written for Taichi use unchanged: ti.ndrange with run-time
bounds, gradients placed by hand, plain Python functions in kernels, @ti.data_oriented classes,
ti.svd / ti.polar_decompose, assignment to a matrix field element's component, tapes with nothing
to differentiate, Taichi's gradient check (Tape(grad_check=...)). Every gradient is checked against an analytic derivative or
float64 NumPy central differences."""
from __future__ import annotations

import numpy as np
import pytest

import wgpu_ad as ti
from ad_util import assert_grad, central_diff, f32

pytestmark = pytest.mark.gpu


# ---- ti.ndrange with run-time bounds ----------------------------------------------------------
def test_ndrange_of_scalar_arguments_as_the_parallel_loop():
    x = ti.field(ti.f32, shape=(5, 6), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def energy(n: ti.i32, m: ti.i32):
        for i, j in ti.ndrange(n, m):
            loss[None] += ti.sin(x[i, j]) * (i + 2 * j + 1)

    x0 = np.random.default_rng(0).uniform(-1, 1, (5, 6))
    x.from_numpy(f32(x0))
    w = np.add.outer(np.arange(5), 2 * np.arange(6)) + 1.0

    def ref(v, n, m):
        return float(np.sum(np.sin(v[:n, :m]) * w[:n, :m]))

    for n, m in [(3, 4), (5, 6)]:  # the same compiled kernel, other bounds
        with ti.ad.Tape(loss):
            energy(n, m)
        xr = f32(x0).astype(np.float64)
        np.testing.assert_allclose(loss[None], ref(xr, n, m), rtol=1e-5)
        assert_grad(x.grad.to_numpy(), central_diff(lambda v: ref(v, n, m), xr))


def test_ndrange_of_ndarray_shapes_and_pairs_of_arguments():
    """x.shape[0] of ndarray arguments, and (lo, hi) pairs of scalar arguments."""
    rng = np.random.default_rng(1)
    a = ti.ndarray(ti.f32, (4, 7), needs_grad=True)
    out = ti.ndarray(ti.f32, (4, 7), needs_grad=True)
    a0 = rng.uniform(0.5, 1.5, (4, 7))
    a.from_numpy(f32(a0))

    @ti.kernel
    def square(x: ti.types.ndarray(), y: ti.types.ndarray(), lo: ti.i32, hi: ti.i32):
        for i, j in ti.ndrange(x.shape[0], (lo, hi)):
            y[i, j] = x[i, j] * x[i, j] * (j + 1)

    square(a, out, 2, 6)
    want = np.zeros((4, 7))
    want[:, 2:6] = (a0 ** 2 * (np.arange(7) + 1))[:, 2:6]
    np.testing.assert_allclose(out.to_numpy(), want, rtol=1e-5)
    seed = rng.uniform(-1, 1, (4, 7))
    out.grad.from_numpy(f32(seed))
    square.grad(a, out, 2, 6)
    g = np.zeros((4, 7))
    g[:, 2:6] = (2 * a0 * (np.arange(7) + 1) * seed)[:, 2:6]  # d/dx of x^2 (j+1), seeded
    assert_grad(a.grad.to_numpy(), g)


def test_ndrange_of_arguments_as_a_serial_inner_loop():
    n_rows = 3
    x = ti.field(ti.f32, shape=(4, 5), needs_grad=True)
    y = ti.field(ti.f32, shape=n_rows, needs_grad=True)

    @ti.kernel
    def rows(n: ti.i32, lo: ti.i32, hi: ti.i32):
        for r in y:
            acc = 0.0
            for a, b in ti.ndrange(n, (lo, hi)):
                acc = acc * 0.5 + x[a, b] * (r + 1)   # a mutable local carried through the loop
            for I in ti.grouped(ti.ndrange(n, 2)):
                acc += x[I] * x[I]
            y[r] = acc

    rng = np.random.default_rng(2)
    x0 = f32(rng.uniform(-1, 1, (4, 5))).astype(np.float64)
    x.from_numpy(f32(x0))

    def ref(v, n=3, lo=1, hi=4):
        out = []
        for r in range(n_rows):
            acc = 0.0
            for a in range(n):
                for b in range(lo, hi):
                    acc = acc * 0.5 + v[a, b] * (r + 1)
            acc += float(np.sum(v[:n, :2] ** 2))
            out.append(acc)
        return np.array(out)

    rows(3, 1, 4)
    np.testing.assert_allclose(y.to_numpy(), ref(x0), rtol=1e-5)
    seed = np.array([1.0, -0.5, 2.0])
    y.grad.from_numpy(f32(seed))
    rows.grad(3, 1, 4)
    assert_grad(x.grad.to_numpy(), central_diff(lambda v: float(seed @ ref(v)), x0))


def test_ndrange_with_float_bounds_is_refused():
    x = ti.field(ti.f32, shape=4)

    @ti.kernel
    def k(n: ti.f32):
        for i in ti.ndrange(n):
            x[i] = 1.0

    with pytest.raises(ti.TaichiCompilationError, match=r"ti.ndrange\(\) bounds must be integers; convert with int"):
        k(2.0)


# ---- plain Python functions and lambdas in kernels --------------------------------------------
def _unary_grad(tifunc, x0):
    """Taichi's grad_test shape: a kernel built around a function passed in (a lambda here);
    returns (y, dy/dx) from a tape."""
    n = len(x0)
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    y = ti.field(ti.f32, shape=n, needs_grad=True)

    @ti.kernel
    def run():
        for i in x:
            y[i] = tifunc(x[i])
            loss[None] += y[i]

    x.from_numpy(f32(x0))
    with ti.ad.Tape(loss):
        run()
    return y.to_numpy(), x.grad.to_numpy()


@pytest.mark.parametrize("tifunc, value, deriv", [
    (lambda x: ti.sin(x), np.sin, np.cos),
    (lambda x: x * x * 3 - x, lambda x: 3 * x * x - x, lambda x: 6 * x - 1),
    (lambda x: ti.exp(x) / (1 + x * x), lambda x: np.exp(x) / (1 + x * x),
     lambda x: np.exp(x) * (1 + x * x - 2 * x) / (1 + x * x) ** 2),
    (lambda x: x * x if x > 0.0 else -x, lambda x: np.where(x > 0, x * x, -x), lambda x: np.where(x > 0, 2 * x, -1.0)),
], ids=["sin", "polynomial", "exp_over", "conditional_expression"])
def test_lambda_passed_to_a_kernel_builder(tifunc, value, deriv):
    x0 = f32(np.array([-0.7, -0.1, 0.4, 0.9, 1.3])).astype(np.float64)
    y, g = _unary_grad(tifunc, x0)
    np.testing.assert_allclose(y, value(x0), rtol=1e-5, atol=1e-6)
    assert_grad(g, deriv(x0))


def test_two_lambdas_on_one_line_are_told_apart():
    double, triple = (lambda v: v * 2.0), (lambda v: v * 3.0)
    x = ti.field(ti.f32, shape=3)

    @ti.kernel
    def k():
        for i in x:
            x[i] = double(ti.cast(i, ti.f32)) + triple(1.0 + i)

    k()
    np.testing.assert_array_equal(x.to_numpy(), 2.0 * np.arange(3) + 3.0 * (1 + np.arange(3)))


def test_plain_python_functions_are_inlined_like_ti_func():
    """A def (early returns, calling another plain function, a default argument), a method of an
    object, a callable object, and a function without arguments reading a field: it reads it when
    the kernel runs, not when it is compiled."""
    w = ti.field(ti.f32, shape=(), needs_grad=True)
    x = ti.field(ti.f32, shape=4, needs_grad=True)
    y = ti.field(ti.f32, shape=4, needs_grad=True)

    def weight():
        return w[None]

    def softplus_like(v, k=2.0):
        if v > 0:
            return v + ti.log(1.0 + ti.exp(-k * v)) / k
        return ti.log(1.0 + ti.exp(k * v)) / k

    class Scale:
        def __init__(self, s):
            self.s = s

        def apply(self, v):
            return v * self.s

        def __call__(self, v):
            return self.apply(v) + 1.0

    half = Scale(0.5)

    @ti.kernel
    def k():
        for i in x:
            y[i] = half(softplus_like(x[i]) * weight()) + half.apply(x[i])

    x0 = f32(np.array([-1.0, -0.2, 0.3, 1.5])).astype(np.float64)
    x.from_numpy(f32(x0))

    def ref(v, wv):
        sp = np.log1p(np.exp(2 * v)) / 2
        return 0.5 * sp * wv + 1.0 + 0.5 * v

    for wv in (1.5, -2.0):  # the field is read at run time
        w[None] = wv
        k()
        np.testing.assert_allclose(y.to_numpy(), ref(x0, wv), rtol=1e-5)
    seed = np.array([1.0, 0.5, -1.0, 2.0])
    y.grad.from_numpy(f32(seed))
    k.grad()
    assert_grad(x.grad.to_numpy(), central_diff(lambda v: float(seed @ ref(v, -2.0)), x0))
    np.testing.assert_allclose(w.grad[None], central_diff(lambda wv: float(seed @ ref(x0, wv[0])), np.array([-2.0]))[0],
                               rtol=1e-4)


@pytest.mark.parametrize("call, message", [
    ("np.sin(x[i])", "'np.sin' is a NumPy function and cannot run on GPU values in a kernel; use ti.sin"),
    ("np.arctan2(x[i], 1.0)", "'np.arctan2' is a NumPy function and cannot run on GPU values in a kernel; use ti.atan2"),
    ("math.fabs(x[i])", "'math.fabs' is a math module function and cannot run on GPU values in a kernel; use ti.abs"),
    ("np.clip(x[i], 0.0, 1.0)", "'np.clip' is a NumPy function and cannot run on GPU values in a kernel; use ti.math.clamp"),
])
def test_numpy_and_math_functions_get_the_ti_spelling(call, message, tmp_path):
    """The error names the line and says which ti. function to use (NumPy on compile-time
    values, like np.sqrt(2.0), still works)."""
    src = ("import math\nimport numpy as np\nimport wgpu_ad as ti\n\n"
           "x = ti.field(ti.f32, shape=4)\n\n\n"
           "@ti.kernel\ndef k():\n    for i in x:\n"
           f"        x[i] = {call} + np.sqrt(2.0)\n")
    path = tmp_path / "np_in_kernel.py"
    path.write_text(src)
    scope = {"__name__": "np_in_kernel"}
    exec(compile(src, str(path), "exec"), scope)
    with pytest.raises(ti.TaichiCompilationError) as e:
        scope["k"]()
    lines = str(e.value).splitlines()
    assert lines[0] == message
    assert lines[1] == f'  File "{path}", line 11, in k'
    assert lines[2].strip() == f"x[i] = {call} + np.sqrt(2.0)"


# ---- gradients placed by hand, in every combination ------------------------------------------
def _declare(how: str, needs_grad: bool):
    """x by one of the three ways of declaring a field: shape=, root.dense().place(), root.place()
    (0-d); returns x and the dense level's shape ((), for the 0-d field)."""
    if how == "shape":
        return ti.field(ti.f32, shape=4, name="x", needs_grad=needs_grad), (4,)
    x = ti.field(ti.f32, name="x", needs_grad=needs_grad)
    if how == "dense":
        ti.root.dense(ti.i, 4).place(x)
        return x, (4,)
    ti.root.place(x)
    return x, ()


def _place_grad(x, shape):
    (ti.root.dense(ti.i, shape[0]) if shape else ti.root).place(x.grad)


@pytest.mark.parametrize("declare", ["shape", "dense", "root"])
@pytest.mark.parametrize("ask, when", [
    ("needs_grad", "at_creation"),
    ("place_grad", "before_assignment"), ("place_grad", "after_assignment"), ("place_grad", "after_launch"),
    ("place_grad", "with_the_field"),
    ("lazy_grad", "before_declaring"), ("lazy_grad", "after_assignment"), ("lazy_grad", "after_launch"),
])
def test_every_way_to_declare_a_field_with_every_way_to_ask_for_its_gradient(declare, ask, when):
    """3 declarations x 3 ways to ask for gradients (needs_grad=True, place(x.grad), lazy_grad()),
    at every point relative to the first assignment and the first launch. d/dx sum(x^3) = 3 x^2."""
    if when == "before_declaring":
        ti.root.lazy_grad()
    if when == "with_the_field":  # one place() call: place(x, x.grad), or shape= and then x.grad
        x = ti.field(ti.f32, name="x", shape=4) if declare == "shape" else ti.field(ti.f32, name="x")
        shape = () if declare == "root" else (4,)
        if declare == "shape":
            _place_grad(x, shape)
        else:
            (ti.root.dense(ti.i, 4) if shape else ti.root).place(x, x.grad)
    else:
        x, shape = _declare(declare, ask == "needs_grad")
    loss = ti.field(ti.f32, shape=(), name="loss", needs_grad=True)

    def ask_for_gradient():
        if ask == "place_grad":
            _place_grad(x, shape)
        elif ask == "lazy_grad":
            ti.root.lazy_grad()

    @ti.kernel
    def cube_sum():
        for I in ti.grouped(x):
            loss[None] += x[I] ** 3

    if when == "before_assignment":
        ask_for_gradient()
    x0 = np.array([0.5, -1.25, 2.0, 0.75])[:4 if shape else 1].reshape(shape)
    x.from_numpy(f32(x0))
    if when == "after_assignment":
        ask_for_gradient()
    if when == "after_launch":
        cube_sum()
        np.testing.assert_allclose(loss[None], np.sum(x0 ** 3), rtol=1e-6)
        ask_for_gradient()
    assert x.needs_grad and x.grad.shape == x.shape
    with ti.ad.Tape(loss):
        cube_sum()
    np.testing.assert_allclose(loss[None], np.sum(x0 ** 3), rtol=1e-6)
    assert_grad(x.grad.to_numpy(), 3 * x0 ** 2)


def test_gradient_placed_in_another_snode_and_vector_fields():
    """place(v.grad) under its own dense level, before v is placed; the gradient takes part in
    kernels (gradient descent reading v.grad) and Python scope like any field."""
    v = ti.Vector.field(2, ti.f32, name="v")
    loss = ti.field(ti.f32, name="loss")
    ti.root.dense(ti.i, 3).place(v.grad)
    ti.root.dense(ti.i, 3).place(v)
    ti.root.place(loss, loss.grad)

    @ti.kernel
    def energy():
        for i in v:
            loss[None] += v[i].dot(v[i]) * (i + 1)

    @ti.kernel
    def descend(lr: ti.f32):
        for i in v:
            v[i] -= lr * v.grad[i]

    v0 = np.array([[1.0, -2.0], [0.5, 0.25], [-1.5, 3.0]])
    v.from_numpy(f32(v0))
    with ti.ad.Tape(loss):
        energy()
    g = 2 * v0 * (np.arange(3) + 1)[:, None]
    assert_grad(v.grad.to_numpy(), g)
    descend(0.1)
    np.testing.assert_allclose(v.to_numpy(), v0 - 0.1 * g, rtol=1e-6)


def test_gradients_placed_wrongly_are_refused():
    x = ti.field(ti.f32, name="x")
    ti.root.dense(ti.i, 4).place(x)
    with pytest.raises(ti.WgpuAdError, match=r"x.grad is placed with shape \(5,\), but field 'x' has shape "
                                             r"\(4,\); place the gradient with its field's shape"):
        ti.root.dense(ti.i, 5).place(x.grad)
    ti.root.dense(ti.i, 4).place(x.grad)
    with pytest.raises(ti.WgpuAdError, match="field 'x.grad' is already placed; a field is placed once"):
        ti.root.dense(ti.i, 4).place(x.grad)
    y = ti.field(ti.f32, name="y")
    ti.root.dense(ti.i, 2).place(y.grad)
    with pytest.raises(ti.WgpuAdError, match=r"field 'y' is placed with shape \(3,\), but its gradient was "
                                             r"placed with shape \(2,\)"):
        ti.root.dense(ti.i, 3).place(y)

    z = ti.field(ti.f32, shape=4, name="z")

    @ti.kernel
    def read_grad():
        for i in z:
            z[i] = z.grad[i]

    with pytest.raises(ti.WgpuAdError, match=r"field 'z' has no gradient: create it with needs_grad=True, call "
                                             r"ti.root.lazy_grad\(\), or place z.grad with ti.root"):
        read_grad()


# ---- tapes with nothing to differentiate: zero gradients, as in Taichi -------------------------
def _fields_with_stale_gradients():
    x = ti.field(ti.f32, shape=4, name="x", needs_grad=True)
    y = ti.field(ti.f32, shape=4, name="y", needs_grad=True)
    loss = ti.field(ti.f32, shape=(), name="loss", needs_grad=True)
    x.fill(2.0)
    x.grad.fill(5.0)  # a tape clears gradients on entry: these must not survive
    y.grad.fill(5.0)
    return x, y, loss


def test_an_empty_tape_gives_zero_gradients():
    x, y, loss = _fields_with_stale_gradients()
    with ti.ad.Tape(loss):
        pass
    np.testing.assert_array_equal(x.grad.to_numpy(), np.zeros(4))
    np.testing.assert_array_equal(y.grad.to_numpy(), np.zeros(4))
    assert loss[None] == 0.0


def test_a_loss_no_kernel_writes_gives_zero_gradients_with_a_warning():
    x, y, loss = _fields_with_stale_gradients()

    @ti.kernel
    def double():
        for i in x:
            y[i] = 2 * x[i]

    with pytest.warns(ti.ad.GradientWarning, match="no kernel launched inside the tape writes the loss field "
                                                   "'loss', so every gradient is zero"):
        with ti.ad.Tape(loss):
            double()
    np.testing.assert_array_equal(y.to_numpy(), np.full(4, 4.0))
    np.testing.assert_array_equal(x.grad.to_numpy(), np.zeros(4))


def test_a_loss_that_depends_on_nothing_with_a_gradient_gives_zero_gradients():
    x, y, loss = _fields_with_stale_gradients()
    c = ti.field(ti.f32, shape=4, name="c")
    c.fill(3.0)

    @ti.kernel
    def constant_loss():
        for i in c:
            loss[None] += c[i] * c[i]

    with pytest.warns(ti.ad.GradientWarning, match="none of the fields read by the kernels on the tape has a "
                                                   "gradient"):
        with ti.ad.Tape(loss):
            constant_loss()
    assert loss[None] == 36.0
    np.testing.assert_array_equal(x.grad.to_numpy(), np.zeros(4))


# ---- gradient checks under Taichi's name: ti.ad.Tape(grad_check=[...]) -------------------------
def test_taichi_grad_check_on_scalar_and_vector_fields():
    """Taichi checks gradients with ti.ad.Tape(loss, grad_check=[fields]) (it has no separate
    function; ours, ti.ad.check_grad, is the same check as a call); a failed check is an
    AssertionError, as in Taichi."""
    x1 = ti.field(ti.f32, shape=(2, 2), needs_grad=True)
    y1 = ti.field(ti.f32, shape=(), needs_grad=True)
    x2 = ti.Vector.field(3, ti.f32, shape=(2, 2), needs_grad=True)
    y2 = ti.field(ti.f32, shape=(), needs_grad=True)
    rng = np.random.default_rng(3)
    x1.from_numpy(f32(rng.uniform(0.5, 1.5, (2, 2))))
    x2.from_numpy(f32(rng.uniform(0.5, 1.5, (2, 2, 3))))

    @ti.kernel
    def compute_y1():
        for i, j in ti.ndrange(2, 2):
            y1[None] += ti.cos(x1[i, j])

    @ti.kernel
    def compute_y2():
        for I in ti.grouped(x2):
            y2[None] += x2[I].norm_sqr() * ti.sin(x2[I][0])

    with ti.ad.Tape(loss=y1, grad_check=[x1]) as t1:
        compute_y1()
    assert t1.grad_check_report.ok
    assert_grad(x1.grad.to_numpy(), -np.sin(x1.to_numpy().astype(np.float64)))
    with ti.ad.Tape(loss=y2, grad_check=[x2]) as t2:
        compute_y2()
    assert t2.grad_check_report.ok

    @ti.ad.grad_replaced
    def wrong_y1():
        compute_y1()

    @ti.ad.grad_for(wrong_y1)
    def doubled():
        compute_y1.grad()
        compute_y1.grad()

    with pytest.raises(AssertionError, match="gradient check failed for field 'x1'"):
        with ti.ad.Tape(loss=y1, grad_check=[x1]):
            wrong_y1()


# ---- assignment to a component of a matrix / vector field element ------------------------------
def test_assignment_to_components_of_field_elements_with_gradients():
    """m[i][j, k] = ..., m[i][j, k] += ..., v[i][j] = ..., v[i][j] += ... in a kernel; the loss
    weights every component, so d loss / d x and the gradients of the initial m and v are known
    in closed form (a stored component's gradient is consumed by the store: zero)."""
    n = 3
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    m = ti.Matrix.field(2, 2, ti.f32, shape=n, needs_grad=True)
    v = ti.Vector.field(3, ti.f32, shape=n, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    W = np.array([[1.0, -2.0], [0.5, 3.0]])
    U = np.array([0.25, -1.5, 2.0])

    @ti.kernel
    def build():
        for i in x:
            m[i][0, 1] = x[i] * 2.0
            m[i][1, 0] = x[i] * x[i]
            m[i][1, 1] += ti.sin(x[i])
            v[i][2] = 3.0 * x[i]
            v[i][0] += x[i] * x[i] * x[i]

    @ti.kernel
    def weigh():
        for i in x:
            for a, b in ti.static(ti.ndrange(2, 2)):
                loss[None] += m[i][a, b] * W[a, b]
            for a in ti.static(range(3)):
                loss[None] += v[i][a] * U[a]

    rng = np.random.default_rng(4)
    x0 = f32(rng.uniform(-1, 1, n)).astype(np.float64)
    m0 = f32(rng.uniform(-1, 1, (n, 2, 2))).astype(np.float64)
    v0 = f32(rng.uniform(-1, 1, (n, 3))).astype(np.float64)
    x.from_numpy(f32(x0))
    m.from_numpy(f32(m0))
    v.from_numpy(f32(v0))
    with ti.ad.Tape(loss):
        build()
        weigh()
    m1, v1 = m0.copy(), v0.copy()
    m1[:, 0, 1], m1[:, 1, 0], m1[:, 1, 1] = 2 * x0, x0 ** 2, m0[:, 1, 1] + np.sin(x0)
    v1[:, 2], v1[:, 0] = 3 * x0, v0[:, 0] + x0 ** 3
    np.testing.assert_allclose(m.to_numpy(), m1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(v.to_numpy(), v1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(loss[None], np.sum(m1 * W) + np.sum(v1 * U), rtol=1e-5)
    dx = 2 * W[0, 1] + 2 * x0 * W[1, 0] + np.cos(x0) * W[1, 1] + 3 * U[2] + 3 * x0 ** 2 * U[0]
    assert_grad(x.grad.to_numpy(), dx)
    dm = np.broadcast_to(W, (n, 2, 2)).copy()
    dm[:, 0, 1] = dm[:, 1, 0] = 0.0  # overwritten: the initial values do not reach the loss
    assert_grad(m.grad.to_numpy(), dm)
    dv = np.broadcast_to(U, (n, 3)).copy()
    dv[:, 2] = 0.0
    assert_grad(v.grad.to_numpy(), dv)


# ---- @ti.data_oriented classes --------------------------------------------------------------------
@ti.data_oriented
class SpringChain:
    """Fields as members, @ti.func and @ti.kernel methods (Taichi's data-oriented style)."""

    def __init__(self, n: int, rest: float):
        self.n, self.rest = n, rest
        self.x = ti.field(ti.f32, shape=n, needs_grad=True)
        self.k = ti.field(ti.f32, shape=(), needs_grad=True)
        self.energy = ti.field(ti.f32, shape=(), needs_grad=True)
        self.scaled = ti.field(ti.f32, shape=n)

    @ti.func
    def stretch(self, i):
        return self.x[i + 1] - self.x[i] - self.rest

    @ti.func
    def spring(self, i):
        d = self.stretch(i)
        return 0.5 * self.k[None] * d * d

    @ti.kernel
    def compute_energy(self):
        for i in range(self.n - 1):
            self.energy[None] += self.spring(i)

    @ti.kernel
    def ends(self: ti.template()) -> ti.f32:  # self annotated: bound all the same
        return self.x[self.n - 1] - self.x[0]

    @ti.kernel
    def scale(self, s: ti.f32, out: ti.template()):
        for i in self.x:
            out[i] = self.x[i] * s


def _chain_energy(x, k, rest):
    d = np.diff(x) - rest
    return 0.5 * k * float(np.sum(d * d))


def test_data_oriented_kernels_and_funcs_with_gradients_through_a_tape():
    rng = np.random.default_rng(5)
    a, b = SpringChain(5, 1.0), SpringChain(3, 0.5)  # two objects: their own fields and kernels
    xa = f32(np.arange(5) * 1.1 + rng.uniform(-0.1, 0.1, 5)).astype(np.float64)
    xb = f32(np.array([0.0, 0.7, 1.1])).astype(np.float64)
    a.x.from_numpy(f32(xa))
    b.x.from_numpy(f32(xb))
    a.k[None], b.k[None] = 2.0, 3.0
    for chain, x0, k in ((a, xa, 2.0), (b, xb, 3.0), (a, xa, 2.0)):
        with ti.ad.Tape(chain.energy):
            chain.compute_energy()
        np.testing.assert_allclose(chain.energy[None], _chain_energy(x0, k, chain.rest), rtol=1e-5)
        assert_grad(chain.x.grad.to_numpy(), central_diff(lambda v: _chain_energy(v, k, chain.rest), x0))
        np.testing.assert_allclose(chain.k.grad[None], _chain_energy(x0, 1.0, chain.rest), rtol=1e-4)
    a.scale(2.0, a.scaled)
    a.scale(s=3.0, out=b.x)
    np.testing.assert_allclose(a.scaled.to_numpy(), 2 * xa, rtol=1e-6)
    np.testing.assert_allclose(b.x.to_numpy()[:3], 3 * xa[:3], rtol=1e-6)


def test_data_oriented_kernel_grad_by_hand_and_as_a_template_argument():
    c = SpringChain(4, 1.0)
    x0 = np.array([0.0, 1.2, 1.9, 3.3])
    c.x.from_numpy(f32(x0))
    c.k[None] = 1.5
    c.compute_energy()
    c.energy.grad[None] = 1.0
    c.compute_energy.grad()
    assert_grad(c.x.grad.to_numpy(), central_diff(lambda v: _chain_energy(v, 1.5, 1.0), x0))

    @ti.kernel
    def first_stretch(chain: ti.template()) -> ti.f32:
        return chain.stretch(0)

    np.testing.assert_allclose(first_stretch(c), 0.2, rtol=1e-5)
    np.testing.assert_allclose(c.ends(), 3.3, rtol=1e-6)
    assert SpringChain.ends(c) == c.ends()  # through the class, self passed by hand


# ---- ti.svd and ti.polar_decompose, differentiable ---------------------------------------------
def _svd_ref(a):
    """float64 SVD in Taichi's convention: U, V rotations, S sorted, its last entry signed."""
    u, s, vt = np.linalg.svd(a)
    v, s = vt.T.copy(), s.copy()
    if np.linalg.det(u) < 0:
        u[:, -1] *= -1
        s[-1] *= -1
    if np.linalg.det(v) < 0:
        v[:, -1] *= -1
        s[-1] *= -1
    return u, s, v


def _polar_ref(a):
    u, s, v = _svd_ref(a)
    return u @ v.T, v @ np.diag(s) @ v.T


def _well_conditioned(rng, n, count, det_sign):
    """Random n x n matrices with singular values >= 0.3 at least 0.15 apart, det of the sign."""
    out = []
    while len(out) < count:
        a = rng.uniform(-1.2, 1.2, (n, n))
        s = np.linalg.svd(a, compute_uv=False)
        if s[-1] >= 0.3 and np.min(-np.diff(s)) >= 0.15 and np.sign(np.linalg.det(a)) == det_sign:
            out.append(a)
    return np.array(out)


@pytest.mark.parametrize("n", [2, 3])
def test_svd_and_polar_decompose_values_and_gradients(n):
    """Values against NumPy in Taichi's conventions; the gradient of a loss touching every output
    (sign-invariant: a column pair of U and V may flip together) against float64 central
    differences, on matrices with positive and negative determinants. Two more matrices, I and
    1.5 I (every simulation's first step), have coinciding singular values: U and V have no
    derivative there, but R and P do (dR = skew(dF) / 1.5 and dP = sym(dF) at 1.5 I), so only the
    polar terms count for them, against that closed form. Three degenerate matrices (zero, rank
    one, a reflection with equal singular values) must give finite values and gradients (each of
    them also passes Tape(check_nan=True), which is too slow to compile for the test suite)."""
    rng = np.random.default_rng(10 + n)
    general = np.concatenate([_well_conditioned(rng, n, 3, 1.0), _well_conditioned(rng, n, 2, -1.0)])
    degenerate = [np.zeros((n, n)), np.diag([1.0] + [0.0] * (n - 1)), np.diag([1.0] * (n - 1) + [-1.0])]
    a0 = f32(np.concatenate([general, [np.eye(n), 1.5 * np.eye(n)], degenerate])).astype(np.float64)
    m, n_general, n_unique = len(a0), len(general), len(general) + 2
    w, c = rng.uniform(-1, 1, n), rng.uniform(-1, 1, n)
    W, M, N, Q, T = (rng.uniform(-1, 1, (n, n)) for _ in range(5))
    A = ti.Matrix.field(n, n, ti.f32, shape=m, needs_grad=True)
    out = {k: ti.Matrix.field(n, n, ti.f32, shape=m) for k in "USVRP"}
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    wv, cv = ti.Vector(w), ti.Vector(c)
    Wm, Mm, Nm, Qm, Tm = (ti.Matrix(x) for x in (W, M, N, Q, T))

    @ti.kernel
    def run():
        for i in A:
            U, S, V = ti.svd(A[i])
            R, P = ti.polar_decompose(A[i])
            out["U"][i], out["S"][i], out["V"][i], out["R"][i], out["P"][i] = U, S, V, R, P
            if i >= n_unique:
                loss[None] += S.sum() + R.sum() + P.sum()
            else:
                for j, k in ti.static(ti.ndrange(n, n)):
                    loss[None] += R[j, k] * Qm[j, k] + P[j, k] * Tm[j, k]
            if i < n_general:
                C = ti.Matrix.zero(ti.f32, n, n)
                for k in ti.static(range(n)):
                    C[k, k] = cv[k]
                    loss[None] += wv[k] * S[k, k]
                UCV = U @ C @ V.transpose()
                for j, k in ti.static(ti.ndrange(n, n)):
                    loss[None] += UCV[j, k] * Wm[j, k] + U[j, k] ** 2 * Mm[j, k] + V[j, k] ** 2 * Nm[j, k]

    def ref_loss(a):
        u, s, v = _svd_ref(a)
        r, p = _polar_ref(a)
        return (w @ s + np.sum(W * (u @ np.diag(c) @ v.T)) + np.sum(M * u * u) + np.sum(N * v * v)
                + np.sum(Q * r) + np.sum(T * p))

    A.from_numpy(f32(a0))
    with ti.ad.Tape(loss):
        run()
    U, S, V, R, P = (out[k].to_numpy().astype(np.float64) for k in "USVRP")
    for i in range(m):
        u, s, v = _svd_ref(a0[i])
        np.testing.assert_allclose(np.diag(S[i]), s, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(S[i] - np.diag(np.diag(S[i])), 0, atol=0)
        if i < n_general:
            np.testing.assert_allclose(np.abs(np.sum(U[i] * u, 0)), 1, atol=1e-5)  # columns up to sign
        np.testing.assert_allclose(U[i] @ S[i] @ V[i].T, a0[i], atol=2e-6)
        assert abs(np.linalg.det(U[i]) - 1) < 1e-5 and abs(np.linalg.det(V[i]) - 1) < 1e-5
        if i < n_unique:
            r, p = _polar_ref(a0[i])
            np.testing.assert_allclose(R[i], r, atol=2e-6)
            np.testing.assert_allclose(P[i], p, atol=2e-6)
        else:  # R is not unique: a rotation, P symmetric, R P = A
            np.testing.assert_allclose(R[i] @ R[i].T, np.eye(n), atol=2e-6)
            assert abs(np.linalg.det(R[i]) - 1) < 1e-5
            np.testing.assert_allclose(P[i], P[i].T, atol=2e-6)
            np.testing.assert_allclose(R[i] @ P[i], a0[i], atol=2e-6)
    want = sum(ref_loss(a) for a in general) + sum(np.sum(Q * np.eye(n)) + np.sum(T * k * np.eye(n)) for k in (1, 1.5))
    want += sum(np.sum(S[i]) + np.sum(R[i]) + np.sum(P[i]) for i in range(n_unique, m))  # (checked above)
    np.testing.assert_allclose(loss[None], want, rtol=1e-5)
    g = A.grad.to_numpy()
    assert_grad(g[:n_general], np.array([central_diff(ref_loss, a) for a in general]), rtol=2e-4)
    skew, sym = (Q - Q.T) / 2, (T + T.T) / 2
    assert_grad(g[n_general], skew + sym)
    assert_grad(g[n_general + 1], skew / 1.5 + sym)
    assert np.isfinite(g[n_unique:]).all()


def test_static_grouped_ndrange_yields_index_vectors():
    """diffmpm3d's stencil: `for offset in ti.static(ti.grouped(ti.ndrange(3, 3, 3)))` binds a
    ti.Vector per offset (offset.cast(float), base + offset, offset[d]), as in Taichi (it bound a
    tuple: "tuple has no attribute 'cast'"); gradient through a weight built from it."""
    x = ti.Vector.field(3, ti.f32, shape=2, needs_grad=True)
    g = ti.field(ti.f32, shape=(4, 4, 4), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def splat():
        for p in x:
            base = ti.cast(x[p], ti.i32)
            fx = x[p] - base.cast(float)
            for offset in ti.static(ti.grouped(ti.ndrange(2, 2, 2))):
                weight = 1.0
                for d in ti.static(range(3)):
                    weight *= fx[d] if offset[d] == 1 else 1 - fx[d]
                g[base + offset] += weight * (offset.cast(float) + 1).sum()

    @ti.kernel
    def total():
        for I in ti.grouped(g):
            loss[None] += g[I] * (I[0] - 2 * I[1] + 3 * I[2])

    x0 = np.array([[0.3, 1.6, 2.2], [1.7, 0.4, 0.9]])
    x.from_numpy(x0.astype(np.float32))
    with ti.ad.Tape(loss):
        splat()
        total()

    def f(xx):
        out = 0.0
        for p in range(2):
            base = np.floor(xx[p]).astype(int)
            fx = xx[p] - base
            for o in np.ndindex(2, 2, 2):
                w = np.prod([fx[d] if o[d] == 1 else 1 - fx[d] for d in range(3)])
                node = base + o
                out += w * (np.array(o) + 1).sum() * (node[0] - 2 * node[1] + 3 * node[2])
        return out
    assert loss[None] == pytest.approx(f(x0), rel=1e-5)
    np.testing.assert_allclose(x.grad.to_numpy(), central_diff(f, x0), rtol=1e-4, atol=1e-4)


def test_svd_of_an_unsupported_shape_is_refused():
    m = ti.Matrix.field(4, 4, ti.f32, shape=1)

    @ti.kernel
    def k():
        for i in m:
            U, S, V = ti.svd(m[i])
            m[i] = S

    with pytest.raises(ti.TaichiCompilationError) as e:
        k()
    lines = str(e.value).splitlines()
    assert lines[0] == "ti.svd() takes a 2x2 or 3x3 matrix, got 4x4"
    assert lines[1].startswith(f'  File "{__file__}"') and lines[2].strip() == "U, S, V = ti.svd(m[i])"


def test_a_gradient_taken_before_it_has_storage_is_the_one_that_gets_it():
    """x.grad held in a variable before lazy_grad() / placement is the field the gradient lives in."""
    x = ti.field(ti.f32, shape=3, name="x")
    gx = x.grad
    ti.root.lazy_grad()
    y = ti.field(ti.f32, name="y")
    gy = y.grad
    ti.root.dense(ti.i, 2).place(y)  # lazy_grad() is on: y gets its gradient at placement
    loss = ti.field(ti.f32, shape=(), name="loss")

    @ti.kernel
    def k():
        for i in x:
            loss[None] += x[i] * x[i]
        for j in y:
            loss[None] += 3.0 * y[j]

    x.from_numpy(np.array([1.0, -2.0, 0.5], np.float32))
    with ti.ad.Tape(loss):
        k()
    assert x.grad is gx and y.grad is gy
    np.testing.assert_allclose(gx.to_numpy(), [2.0, -4.0, 1.0])
    np.testing.assert_allclose(gy.to_numpy(), [3.0, 3.0])


def test_python_only_helpers_on_compile_time_values_run_in_python():
    """A helper using what kernels lack (a comprehension, a dict) called on compile-time values
    runs in Python, as in Taichi (ti.static(offsets(2))); a helper kernels can run is inlined
    even without arguments, so a field it reads is read when the kernel runs."""
    x = ti.field(ti.f32, shape=4)
    w = ti.field(ti.f32, shape=())

    def offsets(k):
        return tuple(i * k for i in range(3))

    def lookup(name):
        return {"half": 0.5, "twice": 2.0}[name]

    def weight():
        return w[None]

    @ti.kernel
    def k():
        for i in x:
            acc = 0.0
            for o in ti.static(offsets(2)):
                acc += o
            x[i] = acc * lookup("half") + weight()

    w[None] = 1.0
    k()
    np.testing.assert_array_equal(x.to_numpy(), np.full(4, 4.0))
    w[None] = 3.0
    k()
    np.testing.assert_array_equal(x.to_numpy(), np.full(4, 6.0))


# ---- a size for every axis, NumPy 0-d arrays as constants ------------------------------------------
BEGIN = np.array(3, dtype=np.int32)     # module-level NumPy values a kernel reads as constants
END = np.int64(7)
SCALE = np.array(0.5, dtype=np.float32)


def test_dense_with_one_size_for_two_axes_and_numpy_0d_constants():
    """Taichi's dense(ti.ij, (n,)) is n x n (its test_oop_inherit_ok); a 0-d NumPy array and a
    NumPy integer as range bounds and a 0-d float array as a factor are constants (its
    test_numpy_loops). loss = sum over i in [3, 7), j of SCALE * val[i, j]**2: d/dval = 2 SCALE val
    there and 0 elsewhere."""
    n = 8
    val = ti.field(ti.f32)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    ti.root.dense(ti.ij, (n,)).place(val)
    ti.root.lazy_grad()
    assert val.shape == (n, n)

    @ti.kernel
    def energy():
        for i in range(BEGIN, END):
            for j in range(n):
                loss[None] += SCALE * val[i, j] ** 2

    v = np.random.default_rng(5).uniform(-1, 1, (n, n)).astype(np.float32)
    val.from_numpy(v)
    with ti.ad.Tape(loss=loss):
        energy()
    want = np.zeros((n, n))
    want[3:7] = 2 * 0.5 * v[3:7].astype(np.float64)
    assert_grad(val.grad.to_numpy(), want, what="val")
    np.testing.assert_allclose(loss[None], 0.5 * (v[3:7].astype(np.float64) ** 2).sum(), rtol=1e-5)
