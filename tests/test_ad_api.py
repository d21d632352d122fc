"""The user-facing autodiff API (ti.ad): Tape, kernel.grad with user seeds, grad_replaced /
grad_for, no_grad, clearing, the checks that name what stops a gradient, validation and
gradient checks. Expected values come from analytic derivatives (NumPy, float64), never from
our own output; error text is asserted word for word."""
from __future__ import annotations

import math

import numpy as np
import pytest

import wgpu_ad as ti
import wgpu_ad.ad  # noqa: F401  (ti.ad, until the package re-exports it)
from wgpu_ad.errors import WgpuAdError

pytestmark = pytest.mark.gpu
rng = np.random.default_rng(7)


def f64(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


# ---- the Taichi guide's examples ----------------------------------------------------------------

def test_tape_sin_gives_cos():
    x = ti.field(dtype=ti.f32, shape=(), needs_grad=True)
    y = ti.field(dtype=ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def compute_y():
        y[None] = ti.sin(x[None])

    for v in (0.3, -1.2, 2.5):
        x[None] = v
        with ti.ad.Tape(y):
            compute_y()
        x32 = float(np.float32(v))
        assert y[None] == pytest.approx(math.sin(x32), rel=1e-6, abs=1e-6)
        assert x.grad[None] == pytest.approx(math.cos(x32), rel=1e-5, abs=1e-6)


def test_tape_zeroes_loss_and_gradients_then_sums_squares():
    n = 16
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    L = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def loss():
        for i in x:
            L[None] += x[i] ** 2

    xs = rng.standard_normal(n).astype(np.float32)
    x.from_numpy(xs)
    L[None] = 123.0          # the tape zeroes the loss on entry (kernels accumulate into it)
    x.grad.fill(5.0)         # and every gradient (clear_gradients=True)
    with ti.ad.Tape(loss=L):
        loss()
    assert L[None] == pytest.approx(np.sum(f64(xs) ** 2), rel=1e-5)
    np.testing.assert_allclose(x.grad.to_numpy(), 2 * f64(xs), rtol=1e-5, atol=1e-6)
    assert L.grad[None] == 1.0  # the seed


def test_clear_gradients_false_accumulates():
    n = 8
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    L = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def loss():
        for i in x:
            L[None] += 3.0 * x[i]

    x.grad.fill(0.5)
    with ti.ad.Tape(loss=L, clear_gradients=False):
        loss()
    np.testing.assert_allclose(x.grad.to_numpy(), np.full(n, 3.5), rtol=1e-6)
    with ti.ad.Tape(loss=L):
        loss()
    np.testing.assert_allclose(x.grad.to_numpy(), np.full(n, 3.0), rtol=1e-6)


def test_kernel_grad_two_losses_with_user_seeds():
    n = 16
    x = ti.field(dtype=ti.f32, shape=n, needs_grad=True)
    loss = ti.field(dtype=ti.f32, shape=(), needs_grad=True)
    loss2 = ti.field(dtype=ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def func():
        for i in x:
            loss[None] += x[i] ** 2
            loss2[None] += x[i]

    x.from_numpy(np.arange(n, dtype=np.float32))
    loss.grad[None] = 1
    loss2.grad[None] = 1
    func()
    func.grad()
    np.testing.assert_allclose(x.grad.to_numpy(), 2 * np.arange(n) + 1, rtol=1e-6)
    # other seeds: d(2 loss + 3 loss2)/dx = 4x + 3, accumulated (+=) on top of what is there
    ti.ad.clear_all_gradients()
    loss.grad[None] = 2
    loss2.grad[None] = 3
    func.grad()
    np.testing.assert_allclose(x.grad.to_numpy(), 4 * np.arange(n) + 3, rtol=1e-6)


def test_chain_of_kernels_with_vector_field_gravity():
    n = 8
    x = ti.Vector.field(2, dtype=ti.f32, shape=n, needs_grad=True)
    U = ti.field(dtype=ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def compute_U():
        for i, j in ti.ndrange(n, n):
            r = x[i] - x[j]
            U[None] += -1 / r.norm(1e-3)

    pos = rng.random((n, 2)).astype(np.float32)
    x.from_numpy(pos)
    with ti.ad.Tape(loss=U):
        compute_U()
    p = f64(pos)
    d = p[:, None, :] - p[None, :, :]
    r = np.sqrt((d ** 2).sum(-1) + 1e-3)
    # U = -sum_ij 1/r_ij; each pair appears twice: dU/dx_i = 2 sum_j (x_i - x_j) / r_ij^3
    ref = 2 * (d / r[..., None] ** 3).sum(1)
    np.testing.assert_allclose(x.grad.to_numpy(), ref, rtol=2e-3, atol=2e-3 * np.abs(ref).max())


def test_lazy_grad_before_and_after_assignment():
    """Seed 000: lazy_grad() after placing, values assigned before or after it."""
    n = 2
    target = np.array([0.5, 0.5, 0.5])

    def run(assign_before: bool):
        x, v, x_avg = (ti.Vector.field(3, dtype=ti.f32) for _ in range(3))
        loss = ti.field(dtype=ti.f32)
        ti.root.place(v, loss, x_avg)
        ti.root.dense(ti.i, n).place(x)
        if assign_before:
            v[None] = [2.0, 1.0, 3.0]
        ti.root.lazy_grad()
        if not assign_before:
            v[None] = [2.0, 1.0, 3.0]
        x.from_numpy(np.array([[0.1, 0.2, 0.3], [0.4, -0.2, 0.0]], dtype=np.float32))

        @ti.kernel
        def compute_x_avg():
            for p in x:
                x_avg[None] += 1 / n * x[p]

        @ti.kernel
        def compute_loss():
            dist = x_avg[None] - ti.Vector([0.5, 0.5, 0.5])
            loss[None] = (dist[0] ** 2 + dist[1] ** 2 + dist[2] ** 2) ** 0.5

        @ti.kernel
        def substep():
            for p in x:
                x[p] += v[None]

        with ti.ad.Tape(loss):
            substep()
            compute_x_avg()
            compute_loss()
        return f64(v.grad.to_numpy())

    x0 = np.array([[0.1, 0.2, 0.3], [0.4, -0.2, 0.0]], dtype=np.float32).astype(np.float64)
    avg = x0.mean(0) + np.array([2.0, 1.0, 3.0])
    ref = (avg - target) / np.linalg.norm(avg - target)  # d|avg - t|/dv, avg = mean(x0) + v
    for before in (True, False):
        ti.reset()
        np.testing.assert_allclose(run(before), ref, rtol=1e-5, atol=1e-6)


def test_ndarray_argument_gradient():
    n = 12
    a = ti.ndarray(ti.f32, shape=n, needs_grad=True)
    L = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def loss(arr: ti.types.ndarray()):
        for i in range(n):
            L[None] += ti.exp(arr[i]) * 0.5

    xs = rng.standard_normal(n).astype(np.float32)
    a.from_numpy(xs)
    with ti.ad.Tape(loss=L):
        loss(a)
    np.testing.assert_allclose(a.grad.to_numpy(), 0.5 * np.exp(f64(xs)), rtol=1e-5)


# ---- recording ----------------------------------------------------------------------------------

def test_tape_records_launches_in_order_and_manual_grad():
    n = 6
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    y = ti.field(ti.f32, shape=n, needs_grad=True)
    L = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def scale(s: ti.f32):
        for i in x:
            y[i] = s * x[i]

    @ti.kernel
    def total():
        for i in y:
            L[None] += y[i] * y[i]

    xs = rng.standard_normal(n).astype(np.float32)
    x.from_numpy(xs)
    with ti.ad.Tape() as tape:   # no loss: record only, the user seeds and calls tape.grad()
        scale(2.0)
        total()
    assert [(f.__name__, args) for f, args in tape.calls] == [("scale", (2.0,)), ("total", ())]
    assert not np.any(x.grad.to_numpy())  # nothing ran backwards yet
    L.grad[None] = 0.5
    tape.grad()
    # L = sum (2x)^2 = 4 sum x^2; 0.5 * dL/dx = 4x
    np.testing.assert_allclose(x.grad.to_numpy(), 4 * f64(xs), rtol=1e-5, atol=1e-6)
    with pytest.raises(WgpuAdError) as e:
        tape.grad()
    assert str(e.value) == ("tape.grad(): the gradients of this tape were already computed; record a new "
                            "tape to compute them again")


def test_exception_inside_tape_skips_backward_and_stops_recording():
    x = ti.field(ti.f32, shape=(), needs_grad=True)
    L = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def k():
        L[None] += 2.0 * x[None]

    with pytest.raises(ZeroDivisionError):
        with ti.ad.Tape(loss=L):
            k()
            1 / 0
    assert x.grad[None] == 0.0 and L.grad[None] == 0.0
    with ti.ad.Tape(loss=L):   # not left recording: a new tape works
        k()
    assert x.grad[None] == 2.0


def test_nested_tape_is_an_error():
    L = ti.field(ti.f32, shape=(), needs_grad=True)
    outer = ti.ad.Tape()
    with outer:
        with pytest.raises(WgpuAdError) as e:
            with ti.ad.Tape(loss=L):
                pass
    assert str(e.value) == (f"ti.ad.Tape: another tape is already recording (entered at {outer._where}); "
                            f"tapes cannot be nested. Record everything in one tape, or finish the first "
                            f"`with` block before starting the next")
    assert outer._where.startswith(__file__)


def test_tape_is_used_once():
    tape = ti.ad.Tape()
    with tape:
        pass
    with pytest.raises(WgpuAdError, match="already used"):
        with tape:
            pass


# ---- errors that name what stops the gradient ----------------------------------------------------

def test_loss_without_gradient_message():
    x = ti.field(ti.f32, shape=(), needs_grad=True)
    L = ti.field(ti.f32, shape=())

    @ti.kernel
    def k():
        L[None] = x[None] * 2

    with pytest.raises(WgpuAdError) as e:
        with ti.ad.Tape(loss=L):
            k()
    assert str(e.value) == ("loss field 'L' has no gradient: create it with needs_grad=True (or call "
                            "ti.root.lazy_grad()) before the tape")
    ti.root.lazy_grad()  # now it has one, whatever the order
    with ti.ad.Tape(loss=L):
        k()
    assert x.grad[None] == 2.0


def test_loss_must_be_one_float():
    L = ti.field(ti.f32, shape=3, needs_grad=True)
    with pytest.raises(WgpuAdError) as e:
        ti.ad.Tape(loss=L).__enter__()
    assert str(e.value) == ("loss field 'L' has shape (3,): ti.ad.Tape(loss=...) needs a 0-d field holding "
                            "one number (shape=()). For several outputs, seed their .grad yourself and use "
                            "ti.ad.Tape() without a loss, then tape.grad()")
    with pytest.raises(WgpuAdError, match="expected a 0-d field"):
        ti.ad.Tape(loss=1.0)


def test_no_input_has_a_gradient():
    c = ti.field(ti.f32, shape=4)
    L = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def k():
        for i in c:
            L[None] += c[i] * c[i]

    c.fill(2.0)
    with pytest.warns(ti.ad.GradientWarning) as w:
        with ti.ad.Tape(loss=L):
            k()
    # zero gradients, as in Taichi; the warning says why and what to do if they were wanted
    assert str(w[0].message) == ("ti.ad.Tape: none of the fields read by the kernels on the tape has a gradient "
                                 "(they read 'c'), so every gradient stays zero. If gradients were wanted, create "
                                 "those fields with needs_grad=True (or call ti.root.lazy_grad() before the tape)")
    assert L[None] == 16.0


def test_intermediate_without_gradient_is_named():
    x = ti.field(ti.f32, shape=4, needs_grad=True)
    z = ti.field(ti.f32, shape=4)
    L = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def make_z():
        for i in x:
            z[i] = x[i] * 2

    @ti.kernel
    def reduce_z():
        for i in z:
            L[None] += z[i]

    with pytest.raises(WgpuAdError) as e:
        with ti.ad.Tape(loss=L):
            make_z()
            reduce_z()
    assert str(e.value) == (
        "ti.ad.Tape: kernel 'reduce_z' reads field 'z', which 'make_z' computed on the tape from fields with "
        "gradients, but 'z' has no gradient: the gradient stops there and everything before it would get "
        "zero. Create 'z' with needs_grad=True (or call ti.root.lazy_grad() before creating the fields); if "
        "stopping the gradient is intended, mark 'make_z' with @ti.ad.no_grad")


def test_loss_computed_outside_kernels_is_named():
    x = ti.field(ti.f32, shape=4, needs_grad=True)
    y = ti.field(ti.f32, shape=4, needs_grad=True)
    L = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def k():
        for i in x:
            y[i] = x[i] * 2

    x.fill(1.0)
    with pytest.warns(ti.ad.GradientWarning) as w:  # zero gradients, as in Taichi, saying why
        with ti.ad.Tape(loss=L):
            k()
            L[None] = float(y.to_numpy().sum())
    assert [str(m.message) for m in w] == [
        "ti.ad.Tape(loss=...): no kernel launched inside the tape writes the loss field 'L', so every "
        "gradient is zero. Compute the loss in a kernel called inside the `with` block (Python-scope "
        "assignments such as L[None] = ... are not recorded)"]
    np.testing.assert_array_equal(x.grad.to_numpy(), np.zeros(4))


# ---- custom gradients ---------------------------------------------------------------------------

def test_grad_replaced_uses_the_users_gradient():
    """The guide's example: forward runs func twice (true gradient 2 * mul), the user's gradient
    runs func.grad once, so x.grad == mul proves the replacement was used."""
    n = 128
    x = ti.field(ti.f32)
    total = ti.field(ti.f32)
    ti.root.dense(ti.i, n).place(x)
    ti.root.place(total)
    ti.root.lazy_grad()

    @ti.kernel
    def func(mul: ti.f32):
        for i in range(n):
            ti.atomic_add(total[None], x[i] * mul)

    @ti.ad.grad_replaced
    def forward(mul):
        func(mul)
        func(mul)

    @ti.ad.grad_for(forward)
    def backward(mul):
        func.grad(mul)

    xs = rng.random(n).astype(np.float32)
    x.from_numpy(xs)
    with ti.ad.Tape(loss=total) as tape:
        forward(4)
    assert total[None] == pytest.approx(2 * 4 * np.sum(f64(xs)), rel=1e-5)
    np.testing.assert_allclose(x.grad.to_numpy(), np.full(n, 4.0))
    assert tape.calls == [(forward, (4,))]  # one entry; the kernels inside were not recorded
    forward.grad(4)   # works without a tape, like kernel.grad
    np.testing.assert_allclose(x.grad.to_numpy(), np.full(n, 8.0))


def test_grad_replaced_without_gradient_function():
    x = ti.field(ti.f32, shape=(), needs_grad=True)
    L = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def k():
        L[None] += x[None]

    @ti.ad.grad_replaced
    def fwd():
        k()

    with pytest.raises(WgpuAdError) as e:
        with ti.ad.Tape(loss=L):
            fwd()
    assert str(e.value) == ("'fwd' is decorated with @ti.ad.grad_replaced but has no gradient function: "
                            "define one with @ti.ad.grad_for(fwd)")


def test_grad_for_needs_grad_replaced():
    @ti.kernel
    def k():
        pass

    def plain():
        pass

    with pytest.raises(WgpuAdError) as e:
        ti.ad.grad_for(plain)
    assert str(e.value) == "@ti.ad.grad_for(plain): 'plain' must be decorated with @ti.ad.grad_replaced first"
    with pytest.raises(WgpuAdError, match="'k' is a kernel; its gradient is generated"):
        ti.ad.grad_for(k)
    f = ti.ad.grad_replaced(plain)
    ti.ad.grad_for(f)(lambda: None)
    with pytest.raises(WgpuAdError, match="already has a gradient function"):
        ti.ad.grad_for(f)(lambda: None)


def test_no_grad_kernel_runs_forward_but_not_backward():
    n = 8
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    y = ti.field(ti.f32, shape=n, needs_grad=True)
    L = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.ad.no_grad
    @ti.kernel
    def make_y():
        for i in x:
            y[i] = 3.0 * x[i]

    @ti.kernel
    def loss():
        for i in x:
            L[None] += x[i] * y[i]

    xs = rng.standard_normal(n).astype(np.float32)
    x.from_numpy(xs)
    with ti.ad.Tape(loss=L) as tape:
        make_y()
        loss()
    assert [f.__name__ for f, _ in tape.calls] == ["make_y", "loss"]
    np.testing.assert_allclose(y.to_numpy(), 3 * f64(xs), rtol=1e-6)
    # y is a constant for the tape: dL/dx = y = 3x (6x if the gradient flowed through make_y)
    np.testing.assert_allclose(x.grad.to_numpy(), 3 * f64(xs), rtol=1e-5, atol=1e-6)


def test_no_grad_python_function():
    n = 8
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    y = ti.field(ti.f32, shape=n, needs_grad=True)
    L = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def make_y(s: ti.f32):
        for i in x:
            y[i] = s * x[i]

    @ti.ad.no_grad
    def setup(s):
        make_y(s)

    @ti.kernel
    def loss():
        for i in x:
            L[None] += x[i] * y[i]

    xs = rng.standard_normal(n).astype(np.float32)
    x.from_numpy(xs)
    with ti.ad.Tape(loss=L):
        setup(2.0)
        loss()
    np.testing.assert_allclose(x.grad.to_numpy(), 2 * f64(xs), rtol=1e-5, atol=1e-6)


def test_clear_all_gradients_fields_and_ndarrays():
    x = ti.field(ti.f32, shape=5, needs_grad=True)
    a = ti.ndarray(ti.f32, shape=3, needs_grad=True)
    c = ti.field(ti.f32, shape=2)
    x.grad.fill(2.0)
    a.grad.fill(3.0)
    c.fill(4.0)
    ti.ad.clear_all_gradients()
    assert not np.any(x.grad.to_numpy()) and not np.any(a.grad.to_numpy())
    np.testing.assert_array_equal(c.to_numpy(), np.full(2, 4.0))  # primal values untouched


# ---- names --------------------------------------------------------------------------------------

def test_taichi_names():
    for name in ("Tape", "grad_replaced", "grad_for", "no_grad", "clear_all_gradients", "check_grad"):
        assert callable(getattr(ti.ad, name)), name
    assert ti.Tape is ti.ad.Tape  # Taichi's old spelling (re-exported by wgpu_ad/__init__.py)
