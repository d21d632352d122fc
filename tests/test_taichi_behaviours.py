"""Behaviours that Taichi's own autodiff test files exercise (tests/python/test_ad_*.py,
test_stop_grad.py, test_no_grad.py, test_customized_grad.py in taichi-dev/taichi), checked here in
our own words and float32: forward-mode layouts placed by hand, ti.stop_grad scoped to one loop,
ti.block_local, atomics on a 0-d field named without [None], assignment through component indices
computed on the GPU, grad_replaced methods of data-oriented classes, the exception classes Taichi
programs catch, and Python-scope writes inside a tape. Every gradient is compared with an analytic
derivative or float64 NumPy central differences."""
from __future__ import annotations

import numpy as np
import pytest

import wgpu_ad as ti
from ad_util import assert_grad, central_diff, f32

pytestmark = pytest.mark.gpu


# ---- x.dual placed by hand, as x.grad ------------------------------------------------------------
def test_dual_placed_with_its_field_matches_reverse_mode():
    """ti.root.dense(...).place(x, x.dual, y, y.dual): forward mode's tangent of y = atan2(x, 0.4)
    * x**0.4 equals the analytic derivative, as does reverse mode with place(x.grad, ...)."""
    def f(v):
        return np.arctan2(v, 0.4) * v ** 0.4

    def df(v):
        return 0.4 / (v * v + 0.16) * v ** 0.4 + np.arctan2(v, 0.4) * 0.4 * v ** -0.6

    v0 = f32(np.array([0.234, 0.8, 1.7]))
    x, y = ti.field(ti.f32), ti.field(ti.f32)
    ti.root.dense(ti.i, 3).place(x, x.dual, y, y.dual)
    xg, yg = ti.field(ti.f32), ti.field(ti.f32)
    ti.root.dense(ti.i, 3).place(xg, xg.grad, yg, yg.grad)

    @ti.kernel
    def fwd(a: ti.template(), b: ti.template()):
        for i in a:
            b[i] = ti.atan2(a[i], 0.4) * a[i] ** 0.4

    x.from_numpy(v0)
    with ti.ad.FwdMode(loss=y, param=x, seed=[1.0, 1.0, 1.0]):
        fwd(x, y)
    xg.from_numpy(v0)
    yg.grad.fill(1.0)
    fwd(xg, yg)
    fwd.grad(xg, yg)
    v = v0.astype(np.float64)
    np.testing.assert_allclose(y.to_numpy(), f(v), rtol=1e-5)
    assert_grad(y.dual.to_numpy(), df(v), what="x.dual placed by hand")
    assert_grad(xg.grad.to_numpy(), df(v), what="x.grad placed by hand")


def test_dual_of_a_placed_field_without_one_names_the_fix():
    x = ti.field(ti.f32, shape=3, name="x")
    with pytest.raises(ti.WgpuAdError, match=r"field 'x' has no dual: create it with needs_dual=True"):
        x.dual
    a = ti.field(ti.f32, name="a")
    ti.root.dense(ti.i, 4).place(a.dual)
    with pytest.raises(ti.WgpuAdError, match=r"field 'a' is placed with shape \(3,\), but its dual was placed "
                                             r"with shape \(4,\)"):
        ti.root.dense(ti.i, 3).place(a)


# ---- ti.stop_grad(field) inside a loop: that loop only -------------------------------------------
def test_stop_grad_inside_a_loop_stops_that_loop_only_in_both_modes():
    """loss = sum x**2 (first loop, stopped) + sum x**3 (second loop): d loss / d x = 3 x**2 only;
    forward mode gives the same directional derivative."""
    n = 6
    x = ti.field(ti.f32, shape=n, needs_grad=True, needs_dual=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True, needs_dual=True)

    @ti.kernel
    def two_loops():
        for i in range(n):
            ti.stop_grad(x)
            loss[None] += x[i] ** 2
        for i in range(n):
            loss[None] += x[i] ** 3

    x0 = np.linspace(-1.0, 1.5, n)
    x.from_numpy(f32(x0))
    with ti.ad.Tape(loss):
        two_loops()
    xr = f32(x0).astype(np.float64)
    np.testing.assert_allclose(loss[None], np.sum(xr ** 2 + xr ** 3), rtol=1e-5)
    assert_grad(x.grad.to_numpy(), 3 * xr ** 2, what="gradient with the first loop stopped")
    seed = np.linspace(0.5, 1.0, n)
    with ti.ad.FwdMode(loss=loss, param=x, seed=list(seed)):
        two_loops()
    np.testing.assert_allclose(loss.dual[None], np.dot(3 * xr ** 2, seed), rtol=1e-4)


def test_stop_grad_at_the_top_of_a_kernel_holds_for_forward_mode_too():
    x = ti.field(ti.f32, shape=4, needs_dual=True)
    y = ti.field(ti.f32, shape=4, needs_dual=True)
    loss = ti.field(ti.f32, shape=(), needs_dual=True)

    @ti.kernel
    def dot():
        ti.stop_grad(x)
        for i in x:
            loss[None] += x[i] * y[i]

    x.from_numpy(f32([1, 2, 3, 4]))
    y.fill(2.0)
    with ti.ad.FwdMode(loss=loss, param=x, seed=[1.0] * 4):
        dot()
    assert loss.dual[None] == 0.0  # x carries no tangent
    with ti.ad.FwdMode(loss=loss, param=y, seed=[1.0] * 4):
        dot()
    assert loss.dual[None] == pytest.approx(10.0)


# ---- small syntax Taichi programs use ------------------------------------------------------------
def test_block_local_is_accepted_as_a_hint_and_atomic_on_a_0d_field_by_name():
    n = 5
    a = ti.field(ti.f32, shape=n, needs_grad=True)
    loss = ti.field(ti.f32)
    ti.root.place(loss, loss.grad)

    @ti.kernel
    def energy():
        ti.block_local(a)
        for i in range(n):
            ti.atomic_add(loss, ti.sin(a[i]) * a[i])

    a0 = np.linspace(0.1, 1.2, n)
    a.from_numpy(f32(a0))
    with ti.ad.Tape(loss):
        energy()
    ar = f32(a0).astype(np.float64)
    np.testing.assert_allclose(loss[None], np.sum(np.sin(ar) * ar), rtol=1e-5)
    assert_grad(a.grad.to_numpy(), np.cos(ar) * ar + np.sin(ar))

    @ti.kernel
    def bad():
        ti.block_local(3)
        for i in range(n):
            loss[None] += a[i]

    with pytest.raises(ti.CompileError, match=r"ti.block_local\(\) takes fields"):
        bad()


def test_assignment_through_gpu_computed_component_indices():
    """m[i][j, k] = ... and v[j] = ... / += ... with j, k loop variables (not ti.static)."""
    n = 3
    a = ti.Matrix.field(2, 2, ti.f32, shape=n, needs_grad=True)
    m = ti.Matrix.field(2, 2, ti.f32, shape=n, needs_grad=True)
    x = ti.Vector.field(3, ti.f32, shape=n, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def run():
        for i in range(n):
            for j, k in ti.ndrange(2, 2):
                m[i][j, k] = (j + 2 * k + 1) * ti.sin(a[i][j, k])
                loss[None] += m[i][j, k] * m[i][j, k]
            v = ti.Vector([0.0, 0.0, 0.0])
            for j in range(3):
                v[j] = x[i][j] * x[i][j]
                v[j] += (j + 1) * x[i][j]
            loss[None] += v[0] + 2 * v[1] + 3 * v[2]

    rng = np.random.default_rng(1)
    a0, x0 = rng.uniform(-1, 1, (n, 2, 2)), rng.uniform(-1, 1, (n, 3))
    a.from_numpy(f32(a0))
    x.from_numpy(f32(x0))
    w = np.array([[1.0, 3.0], [2.0, 4.0]])
    c = np.array([1.0, 2.0, 3.0])

    def ref(av, xv):
        return float(np.sum((w * np.sin(av)) ** 2) + np.sum(c * (xv * xv + c * xv)))

    with ti.ad.Tape(loss):
        run()
    ar, xr = f32(a0).astype(np.float64), f32(x0).astype(np.float64)
    np.testing.assert_allclose(loss[None], ref(ar, xr), rtol=1e-5)
    np.testing.assert_allclose(m.to_numpy(), w * np.sin(ar), rtol=1e-5, atol=1e-6)
    assert_grad(a.grad.to_numpy(), central_diff(lambda v: ref(v, xr), ar))
    assert_grad(x.grad.to_numpy(), central_diff(lambda v: ref(ar, v), xr))


def test_gpu_computed_component_index_needs_every_dimension():
    m = ti.Matrix.field(2, 2, ti.f32, shape=2)

    @ti.kernel
    def rows():
        for i in range(2):
            for j in range(2):
                m[i][j] = ti.Vector([1.0, 2.0])

    with pytest.raises(ti.CompileError, match=r"needs one index per dimension"):
        rows()


# ---- custom gradients on methods, Taichi's exception classes ---------------------------------
def test_grad_replaced_methods_of_a_data_oriented_class():
    @ti.data_oriented
    class Scaled:
        def __init__(self):
            self.x = ti.field(ti.f32, shape=8, needs_grad=True)
            self.total = ti.field(ti.f32, shape=(), needs_grad=True)

        @ti.kernel
        def accumulate(self, mul: ti.f32):
            for i in self.x:
                self.total[None] += self.x[i] * self.x[i] * mul

        @ti.ad.grad_replaced
        def forward(self, mul):
            self.accumulate(mul)
            self.accumulate(mul)

        @ti.ad.grad_for(forward)
        def backward(self, mul):
            self.accumulate.grad(mul)  # deliberately once: the replacement is what runs

    s = Scaled()
    x0 = np.linspace(-1, 1, 8)
    s.x.from_numpy(f32(x0))
    with ti.ad.Tape(loss=s.total):
        s.forward(1.5)
    assert_grad(s.x.grad.to_numpy(), 1.5 * 2 * f32(x0), what="the replaced gradient")
    s.x.grad.fill(0)
    s.total.grad[None] = 1.0
    s.forward.grad(0.5)
    assert_grad(s.x.grad.to_numpy(), 0.5 * 2 * f32(x0), what="obj.forward.grad()")


def test_errors_taichi_programs_catch_as_runtime_errors():
    x = ti.field(ti.f32, shape=4, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def k(mul: ti.f32):
        for i in x:
            loss[None] += x[i] * mul

    with pytest.raises(RuntimeError, match=r"'k' is a kernel; its gradient is generated"):
        ti.ad.grad_for(k)

    def plain(mul):
        k(mul)

    with pytest.raises(RuntimeError, match=r"'plain' must be decorated with @ti.ad.grad_replaced first"):
        ti.ad.grad_for(plain)

    @ti.kernel
    def noisy():
        for i in x:
            loss[None] += x[i] * ti.random()

    with pytest.raises(RuntimeError, match=r"cannot differentiate kernel 'noisy': it calls ti.random\(\)"):
        with ti.ad.Tape(loss):
            noisy()

    wide = ti.ndarray(ti.f32, shape=2, needs_grad=True)
    with pytest.raises(RuntimeError, match=r"loss ndarray 'wide' has shape \(2,\): ti.ad.Tape\(loss=...\) needs a 0-d "
                                           r"ndarray holding one number"):
        with ti.ad.Tape(loss=wide):
            pass


# ---- Python-scope writes inside a tape ---------------------------------------------------------
def test_a_python_write_after_a_kernel_read_it_inside_a_tape_is_refused():
    a = ti.field(ti.f32, shape=4, needs_grad=True, name="a")
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def sq():
        for i in a:
            loss[None] += a[i] * a[i]

    a.fill(1.0)
    with pytest.raises(ti.AutodiffUsageError, match=r"field 'a' is written by from_numpy inside the tape after "
                                                    r"kernel 'sq' read it"):
        with ti.ad.Tape(loss):
            sq()
            a.from_numpy(f32(np.full(4, 5.0)))
    with pytest.raises(RuntimeError, match=r"written by a Python-scope assignment inside the tape"):
        with ti.ad.Tape(loss):
            sq()
            a[0] = 2.0

    a.fill(1.0)  # before any kernel read it, a write is fine
    with ti.ad.Tape(loss):
        a.from_numpy(f32([1.0, 2.0, 3.0, 4.0]))
        sq()
    assert_grad(a.grad.to_numpy(), 2 * np.array([1.0, 2.0, 3.0, 4.0]))


# ---- test_ad_basics' float64 cases, under ti.init(f64="f32") (issue 26 item 12) ------------------
def _init_f64_as_f32():
    with pytest.warns(ti.Float64Warning):
        ti.init(default_fp=ti.f64, f64="f32")


@pytest.mark.parametrize("fn,npfn,dnp", [
    (lambda v: ti.atan2(0.4, v), lambda v: np.arctan2(0.4, v), lambda v: -0.4 / (v * v + 0.16)),
    (lambda v: ti.atan2(v, 0.4), lambda v: np.arctan2(v, 0.4), lambda v: 0.4 / (v * v + 0.16)),
    (lambda v: 0.4 ** v, lambda v: 0.4 ** v, lambda v: np.log(0.4) * 0.4 ** v),
    (lambda v: v ** 0.4, lambda v: v ** 0.4, lambda v: 0.4 * v ** -0.6),
], ids=["atan2(0.4,x)", "atan2(x,0.4)", "0.4**x", "x**0.4"])
def test_f64_fields_of_the_default_fp_get_both_modes_derivatives(fn, npfn, dnp):
    """test_atan2_f64 / test_pow_f64: x, y placed with x.grad, y.grad (and duals) in default_fp=ti.f64,
    at x = 0.234: value and both modes' derivatives against the float64 analytic ones."""
    _init_f64_as_f32()
    x, y = ti.field(ti.f64), ti.field(ti.f64)
    ti.root.dense(ti.i, 1).place(x, x.grad, y, y.grad)
    ti.root.lazy_dual()

    @ti.kernel
    def func():
        for i in x:
            y[i] = fn(x[i])

    v = float(np.float32(0.234))
    x[0] = v
    y.grad[0] = 1.0
    func()
    func.grad()
    assert y[0] == pytest.approx(npfn(v), rel=1e-5)
    assert x.grad[0] == pytest.approx(dnp(v), rel=1e-4)
    with ti.ad.FwdMode(loss=y, param=x, seed=[1.0]):
        func()
    assert y.dual[0] == pytest.approx(dnp(v), rel=1e-4)


def test_casts_through_f64_print_the_value(capsys):
    """test_cast: print(cast(cast(cast(1.0, f64), f32), f64)) prints 1.0."""
    _init_f64_as_f32()

    @ti.kernel
    def func():
        print(ti.cast(ti.cast(ti.cast(1.0, ti.f64), ti.f32), ti.f64))

    func()
    ti.sync()
    assert capsys.readouterr().out == "1.0\n"


@pytest.mark.parametrize("loss_dtype,x_dtype", [("f32", "f64"), ("f64", "f32")])
def test_f64_and_f32_fields_mixed_in_one_gradient(loss_dtype, x_dtype):
    """test_ad_precision_1 / _2: loss = x across an f64 and an f32 field, by kernel.grad and by a tape:
    d loss / d x = 1."""
    _init_f64_as_f32()
    loss = ti.field(getattr(ti, loss_dtype), shape=())
    x = ti.field(getattr(ti, x_dtype), shape=())
    ti.root.lazy_grad()

    @ti.kernel
    def func():
        loss[None] = x[None]

    x[None] = 0.5
    loss.grad[None] = 1
    func()
    func.grad()
    assert x.grad[None] == 1.0
    with ti.ad.Tape(loss):
        func()
    assert loss[None] == 0.5 and x.grad[None] == 1.0


@pytest.mark.parametrize("reciprocal", [False, True], ids=["t or 2t", "1/x where x > 0"])
def test_f64_branches_in_a_parallel_loop(reciprocal):
    """test_ad_if's f64 cases: y = x if x > 0 else 2 x (d/dx: 2 at x = 0, 1 at x = 1); and
    t = 1 / x where x > 0 else 0 (d/dx: 0 at x = 0, -1/x^2 = -0.25 at x = 2), in ti.f64 fields."""
    _init_f64_as_f32()
    x = ti.field(ti.f64, shape=2)
    y = ti.field(ti.f64, shape=2)
    ti.root.lazy_grad()

    @ti.kernel
    def branches():
        for i in range(2):
            t = x[i]
            if t > 0:
                y[i] = t
            else:
                y[i] = 2 * t

    @ti.kernel
    def reciprocals():
        for i in range(2):
            t = 0.0
            if x[i] > 0:
                t = 1 / x[i]
            y[i] = t

    func = reciprocals if reciprocal else branches
    x.from_numpy(np.array([0.0, 2.0 if reciprocal else 1.0]))
    y.grad.fill(1.0)
    func()
    func.grad()
    np.testing.assert_array_equal(x.grad.to_numpy(), [0.0, -0.25] if reciprocal else [2.0, 1.0])


# ---- kernel.grad() of a kernel whose fields have no gradient ----------------------------------------
def test_grad_of_an_integer_kernel_is_a_no_op_not_a_refusal():
    """Taichi's test_mod: i32 fields get no gradient from ti.root.lazy_grad(), so launches run
    unobserved, and func.grad() of y = x % 3 (and of an atomic add of it) does nothing instead of
    refusing. A float field given its gradient only after an unobserved launch is still refused."""
    x, y = ti.field(ti.i32), ti.field(ti.i32)
    ti.root.dense(ti.i, 1).place(x, y)
    ti.root.lazy_grad()
    assert not x.needs_grad and not y.needs_grad

    @ti.kernel
    def func():
        y[0] = x[0] % 3

    @ti.kernel
    def func2():
        ti.atomic_add(y[0], x[0] % 3)

    x[0] = 7
    func()
    func.grad()
    func2()
    func2.grad()
    assert y[0] == 2 * (7 % 3)


def test_grad_with_no_gradient_anywhere_is_a_no_op_and_a_late_gradient_still_refused():
    """float fields and no gradient in the program: square.grad() after an unobserved launch does
    nothing (nothing could hold its result); once ti.root.lazy_grad() gives them gradients, that
    launch's gradient is refused (its reads were not recorded), and a new launch's is 2 a."""
    a = ti.field(ti.f32, shape=2, name="a")
    b = ti.field(ti.f32, shape=2, name="b")

    @ti.kernel
    def square():
        for i in a:
            b[i] = a[i] * a[i]

    a.from_numpy(np.array([1.5, -2.0], np.float32))
    square()
    square.grad()  # no gradients anywhere: nothing to do
    ti.root.lazy_grad()
    with pytest.raises(ti.WgpuAdError, match=r"square\.grad\(\): kernel 'square' \(or another kernel\) ran while "
                                             r"nothing in the program had a gradient"):
        square.grad()
    square()
    b.grad.fill(1.0)
    square.grad()
    np.testing.assert_allclose(a.grad.to_numpy(), 2 * np.array([1.5, -2.0]), rtol=1e-6)
