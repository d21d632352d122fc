"""ti.ad.check_grad, ti.ad.Tape(grad_check=...) and ti.ad.Tape(validation=True). Expected values
come from analytic derivatives (NumPy, float64), never from our own output; error text is
asserted word for word."""
from __future__ import annotations

import math

import numpy as np
import pytest

import wgpu_ad as ti
import wgpu_ad.ad  # noqa: F401  (ti.ad, until the package re-exports it)
from wgpu_ad.errors import WgpuAdError

pytestmark = pytest.mark.gpu
rng = np.random.default_rng(11)


def f64(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


# ---- gradient checks ----------------------------------------------------------------------------

def _sin_setup(n=10):
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    w = ti.Vector.field(2, ti.f32, shape=n, needs_grad=True)
    L = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def loss():
        for i in x:
            L[None] += ti.sin(x[i]) * w[i][0] + w[i][1] ** 2

    xs = rng.uniform(-2, 2, n).astype(np.float32)
    ws = rng.standard_normal((n, 2)).astype(np.float32)
    x.from_numpy(xs)
    w.from_numpy(ws)
    return x, w, L, loss, f64(xs), f64(ws)


def test_check_grad_passes_on_a_correct_kernel():
    x, w, L, loss, xs, ws = _sin_setup()
    report = ti.ad.check_grad(loss, L, [x, w])
    assert report.ok and [f.field for f in report.fields] == ["x", "w"]
    assert report.max_abs_err < 2e-3
    # the analytic gradients it left in .grad are the true ones
    np.testing.assert_allclose(x.grad.to_numpy(), np.cos(xs) * ws[:, 0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w.grad.to_numpy(), np.stack([np.sin(xs), 2 * ws[:, 1]], 1), rtol=1e-5, atol=1e-6)
    # its numeric derivatives agree with the analytic ones independently of our gradients
    for e in report.fields[0].elements:
        assert e.numeric == pytest.approx(math.cos(xs[e.index]) * ws[e.index][0], rel=1e-2, abs=1e-3)
    # the loss is left as one forward run leaves it
    ref = np.sum(np.sin(xs) * ws[:, 0] + ws[:, 1] ** 2)
    assert L[None] == pytest.approx(ref, rel=1e-5, abs=1e-5)


def test_check_grad_samples_large_fields():
    n = 300
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    L = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def loss():
        for i in x:
            L[None] += ti.tanh(x[i])

    xs = rng.uniform(-1, 1, n).astype(np.float32)
    x.from_numpy(xs)
    report = ti.ad.check_grad(loss, L, x, max_elements=8)
    elements = report.fields[0].elements
    assert sum(e.index is not None for e in elements) == 8 and elements[-1].index is None  # + one direction
    assert report.ok
    np.testing.assert_allclose(x.to_numpy(), xs)  # inputs restored


def test_check_grad_fails_on_a_wrong_custom_gradient_naming_the_field():
    x, w, L, loss, xs, ws = _sin_setup()

    @ti.ad.grad_replaced
    def fwd():
        loss()

    @ti.ad.grad_for(fwd)
    def wrong():
        loss.grad()
        loss.grad()  # twice: every gradient doubled

    report = ti.ad.check_grad(fwd, L, [x, w], raise_on_fail=False)
    assert not report.ok
    worst = report.worst
    assert worst.field in ("x", "w")
    true = np.cos(xs) * ws[:, 0] if worst.field == "x" else np.stack([np.sin(xs), 2 * ws[:, 1]], 1)
    assert worst.analytic == pytest.approx(2 * true[worst.index], rel=1e-4, abs=1e-5)
    assert worst.numeric == pytest.approx(true[worst.index], rel=1e-2, abs=1e-3)
    with pytest.raises(ti.ad.GradCheckError) as e:
        ti.ad.check_grad(fwd, L, [x])
    msg = str(e.value)
    assert msg.startswith("gradient check failed for field 'x': worst element x[")
    assert "of the 10 elements checked disagree" in msg


def test_tape_grad_check_argument():
    x, w, L, loss, xs, ws = _sin_setup()
    with ti.ad.Tape(loss=L, grad_check=[x, w]) as tape:
        loss()
    assert tape.grad_check_report.ok
    np.testing.assert_allclose(x.grad.to_numpy(), np.cos(xs) * ws[:, 0], rtol=1e-5, atol=1e-6)

    @ti.ad.grad_replaced
    def fwd():
        loss()

    @ti.ad.grad_for(fwd)
    def wrong():
        pass  # no gradient at all

    with pytest.raises(ti.ad.GradCheckError, match="gradient check failed for field 'x'"):
        with ti.ad.Tape(loss=L, grad_check=[x]):
            fwd()


# ---- validation ---------------------------------------------------------------------------------

def test_validation_names_a_field_overwritten_after_it_was_read():
    n = 4
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    y = ti.field(ti.f32, shape=n, needs_grad=True)
    L = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def square():
        for i in x:
            y[i] = x[i] * x[i]

    @ti.kernel
    def overwrite():
        for i in x:
            x[i] = 5.0

    @ti.kernel
    def total():
        for i in y:
            L[None] += y[i]

    x.from_numpy(np.arange(n, dtype=np.float32))
    with pytest.raises(WgpuAdError) as e:
        with ti.ad.Tape(loss=L, validation=True):
            square()
            overwrite()
            total()
    assert str(e.value) == (
        "ti.ad.Tape(validation=True): kernel 'square' read field 'x', which kernel 'overwrite' overwrote later "
        "on the tape (x[0] was 0.0 when 'square' ran and is 5.0 now). The gradient of 'square' would be "
        "computed from the new values and be silently wrong (global data access rule #1: once read, an "
        "element must not be overwritten). Write the new values to another field, or keep one copy per step "
        "(x[t + 1] = f(x[t]))")


def test_validation_names_the_field_whose_overwrite_matters_not_the_first_that_changed():
    """Taichi's test_gdar_mpm shape: 'scatter' reads x[f] and v[f]; 'advance' writes x[f + 1] (a
    time axis: fine) and overwrites v[f] (rule #1 broken). Both x and v changed after scatter(0)
    ran, but only v's new values change what it computes: the refusal names v (it used to name x,
    the first field that changed, with an element scatter never read)."""
    T, n = 3, 4
    x = ti.field(ti.f32, shape=(T, n), needs_grad=True)
    v = ti.field(ti.f32, shape=(T, n), needs_grad=True)
    out = ti.field(ti.f32, shape=(T, n), needs_grad=True)
    L = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def scatter(f: ti.i32):
        for p in range(n):
            out[f, p] = x[f, p] * v[f, p]

    @ti.kernel
    def advance(f: ti.i32):
        for p in range(n):
            v[f, p] = 2.0 * v[f, p]
            x[f + 1, p] = x[f, p] + v[f, p]

    @ti.kernel
    def total():
        for f, p in out:
            L[None] += out[f, p]

    x.from_numpy(np.arange(T * n, dtype=np.float32).reshape(T, n) + 1.0)
    v.fill(1.0)
    with pytest.raises(WgpuAdError) as e:
        with ti.ad.Tape(loss=L, validation=True):
            for f in range(T - 1):
                scatter(f)
                advance(f)
            total()
    assert str(e.value).startswith(
        "ti.ad.Tape(validation=True): kernel 'scatter' read field 'v', which kernel 'advance' overwrote later on "
        "the tape (v[0, 0] was 1.0 when 'scatter' ran and is 2.0 now).")


def test_validation_accepts_a_second_store_to_an_element():
    """A store over an element an earlier kernel stored, with no read between: the later store's
    adjoint consumes the gradient, so y = 5z gives dL/dx = 0 and dL/dz = 5 (it used to be refused
    as rule #2); accumulating gives L = 3x + 5z."""
    x = ti.field(ti.f32, shape=(), needs_grad=True)
    z = ti.field(ti.f32, shape=(), needs_grad=True)
    y = ti.field(ti.f32, shape=(), needs_grad=True)
    L = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def from_x():
        y[None] = 3 * x[None]

    @ti.kernel
    def from_z():
        y[None] = 5 * z[None]

    @ti.kernel
    def add_z():
        y[None] += 5 * z[None]

    @ti.kernel
    def loss():
        L[None] = y[None]

    x[None], z[None] = 1.0, 1.0
    for validation in (True, False):
        with ti.ad.Tape(loss=L, validation=validation):
            from_x()
            from_z()
            loss()
        assert (L[None], x.grad[None], z.grad[None]) == (5.0, 0.0, 5.0)
    with ti.ad.Tape(loss=L, validation=True):   # accumulating: L = 3x + 5z
        from_x()
        add_z()
        loss()
    assert (x.grad[None], z.grad[None]) == (3.0, 5.0)


def test_validation_accepts_a_time_axis():
    n, T = 5, 4
    s = ti.field(ti.f32, shape=(T + 1, n), needs_grad=True)
    L = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def step(t: ti.i32):
        for i in range(n):
            s[t + 1, i] = ti.sin(s[t, i]) + 0.5

    @ti.kernel
    def total():
        for i in range(n):
            L[None] += s[T, i]

    s0 = rng.uniform(-1, 1, n).astype(np.float32)
    s.from_numpy(np.concatenate([s0[None], np.zeros((T, n), np.float32)]))
    with ti.ad.Tape(loss=L, validation=True):
        for t in range(T):
            step(t)
        total()
    v, d = f64(s0), np.ones(n)
    for _ in range(T):   # chain rule, float64
        d *= np.cos(v)
        v = np.sin(v) + 0.5
    np.testing.assert_allclose(s.grad.to_numpy()[0], d, rtol=1e-4, atol=1e-6)


def test_check_grad_skips_elements_the_forward_overwrites():
    """s[t + 1] = f(s[t]): only s[0] is an input; the .grad of s[1:] belongs to stored values."""
    n, T = 4, 3
    s = ti.field(ti.f32, shape=(T + 1, n), needs_grad=True)
    L = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def step(t: ti.i32):
        for i in range(n):
            s[t + 1, i] = s[t, i] + 0.1 * ti.sin(s[t, i])   # translation-like: shifts pass through

    @ti.kernel
    def total():
        for i in range(n):
            L[None] += s[T, i] ** 2

    def forward():
        for t in range(T):
            step(t)
        total()

    s0 = rng.uniform(-1, 1, n)
    s.from_numpy(np.concatenate([s0[None], np.zeros((T, n))]).astype(np.float32))
    for _ in range(2):   # the second time, s[1:] already holds the values the forward stores
        report = ti.ad.check_grad(forward, L, s, max_elements=n)
        f = report.fields[0]
        assert report.ok and sorted(e.index for e in f.elements) == [(0, i) for i in range(n)]
    v, d = f64(s.to_numpy()[0]), np.ones(n)
    for _ in range(T):
        d *= 1 + 0.1 * np.cos(v)
        v = v + 0.1 * np.sin(v)
    np.testing.assert_allclose(s.grad.to_numpy()[0], 2 * v * d, rtol=1e-4, atol=1e-6)
    report = ti.ad.check_grad(forward, L, s, max_elements=2 * n)  # more than the inputs: probes the rest
    assert report.ok and report.fields[0].overwritten > 0
    assert all(e.index is None or e.index[0] == 0 for e in report.fields[0].elements)
