"""Stencil adjoints as gathers (passes/autodiff/stencil.py).

A parallel loop that reads its neighbours at constant offsets gets an adjoint in two tasks: a
gather task, in which each thread sums the contributions to its own element with no atomics,
and the usual adjoint for the rest. Every gradient is compared with float64 central differences
of a NumPy twin, the borders included; the adjoint's IR shows whether the gather was made (a
task named *_gather_adj) and its WGSL whether the gradient is still accumulated atomically. The
shapes the proof must refuse are checked to keep the atomic adjoint, with right gradients too."""
import math
import re

import numpy as np
import pytest

import wgpu_ad as ti
from ad_util import assert_grad, central_diffs

pytestmark = pytest.mark.gpu


def _init(**options):
    """A runtime whose stencil adjoints gather (on lavapipe they do not by default)."""
    ti.init()
    ti.set_compile_options(stencil_gather=True, **options)


def _gathered(kernel, *args) -> bool:
    return "_gather_adj" in kernel.get_grad_ir(*args)


def _atomic_grad(kernel, name, *args) -> bool:
    """Whether the adjoint's WGSL accumulates into `name`'s gradient with atomics."""
    wgsl = kernel.get_wgsl(*args, grad=True)
    return bool(re.search(rf"\b{name}_grad: array<atomic", wgsl)) or f"atomic_add_{name}_grad" in wgsl


OFFSETS = [(-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 1), (1, -1), (1, 0), (1, 1)]


def test_cloth_step_gathers_and_matches_central_differences_at_the_borders():
    """The benchmark's cloth step (8 neighbours at static offsets, bounds checks, a Vector field
    with a time axis indexed by the argument t), two steps and a loss: every element of
    dloss/dx0 and dloss/dv0, corners and edges included, against float64 central differences."""
    _init()
    n, steps, dt, ks, damping = 5, 2, 2e-2, 30.0, 0.99
    dx = 1.0 / n
    rest = [dx * math.sqrt(a * a + b * b) for a, b in OFFSETS]
    x = ti.Vector.field(3, ti.f32, shape=(steps + 1, n, n), needs_grad=True)
    v = ti.Vector.field(3, ti.f32, shape=(steps + 1, n, n), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def step(t: ti.i32):
        for i, j in ti.ndrange(n, n):
            xi = x[t, i, j]
            f = ti.Vector([0.0, -9.8, 0.0])
            for k in ti.static(range(8)):
                i2 = i + ti.static(OFFSETS[k][0])
                j2 = j + ti.static(OFFSETS[k][1])
                if 0 <= i2 < n and 0 <= j2 < n:
                    d = x[t, i2, j2] - xi
                    length = d.norm()
                    f += ks * (length - ti.static(rest[k])) / length * d
            vn = v[t, i, j] * damping + dt * f
            v[t + 1, i, j] = vn
            x[t + 1, i, j] = xi + dt * vn

    @ti.kernel
    def compute_loss():
        for i, j in ti.ndrange(n, n):
            d = x[steps, i, j] - ti.Vector([0.5, -0.3, 0.5])
            loss[None] += d.dot(d)

    rng = np.random.default_rng(3)
    g = (np.arange(n) + 0.5) * dx
    gi, gj = np.meshgrid(g, g, indexing="ij")
    x0 = np.stack([gj, np.zeros((n, n)), gi], -1) + rng.normal(0, 0.02, (n, n, 3))
    v0 = rng.normal(0, 0.3, (n, n, 3))
    xs, vs = np.zeros((steps + 1, n, n, 3), np.float32), np.zeros((steps + 1, n, n, 3), np.float32)
    xs[0], vs[0] = x0, v0
    x.from_numpy(xs)
    v.from_numpy(vs)
    with ti.ad.Tape(loss=loss):
        for t in range(steps):
            step(t)
        compute_loss()

    def ref(x_, v_):
        for _ in range(steps):
            f = np.zeros_like(x_)
            f[..., 1] = -9.8
            for (a, b), r in zip(OFFSETS, rest):
                i0, i1, j0, j1 = max(0, -a), n - max(0, a), max(0, -b), n - max(0, b)
                d = x_[i0 + a:i1 + a, j0 + b:j1 + b] - x_[i0:i1, j0:j1]
                length = np.sqrt((d ** 2).sum(-1, keepdims=True))
                f[i0:i1, j0:j1] += ks * (length - r) / length * d
            v_ = v_ * damping + dt * f
            x_ = x_ + dt * v_
        return float(((x_ - np.array([0.5, -0.3, 0.5])) ** 2).sum())

    x032, v032 = xs[0].astype(np.float64), vs[0].astype(np.float64)
    assert loss[None] == pytest.approx(ref(x032, v032), rel=1e-5)
    gx, gv = central_diffs(ref, [x032, v032])
    assert_grad(x.grad.to_numpy()[0], gx, what="dloss/dx0")
    assert_grad(v.grad.to_numpy()[0], gv, what="dloss/dv0")
    assert _gathered(step, 0)
    assert not _atomic_grad(step, "x", 0)


def _run_1d(kernel, fields, loss, values, args=()):
    for f, val in zip(fields, values):
        f.from_numpy(val)
    with ti.ad.Tape(loss=loss):
        kernel(*args)
    return [f.grad.to_numpy() for f in fields]


def test_1d_three_point_stencil_with_bounds_checks():
    """loss = sum_i sin(x[i-1] x[i]) + x[i+1]^2 w[i], the neighbours under bounds checks; both
    fields' gradients at every element, the two ends included."""
    _init()
    n = 9
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    w = ti.field(ti.f32, shape=n, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def stencil():
        for i in range(n):
            s = 0.0
            if i - 1 >= 0:
                s += ti.sin(x[i - 1] * x[i])
            if i + 1 < n:
                s += x[i + 1] * x[i + 1] * w[i]
            loss[None] += s

    def ref(x_, w_):
        return float(np.sin(x_[:-1] * x_[1:]).sum() + (x_[1:] ** 2 * w_[:-1]).sum())

    rng = np.random.default_rng(0)
    xv, wv = rng.uniform(-1.5, 1.5, n).astype(np.float32), rng.uniform(-1, 1, n).astype(np.float32)
    got = _run_1d(stencil, [x, w], loss, [xv, wv])
    for g, want, name in zip(got, central_diffs(ref, [xv, wv]), "xw"):
        assert_grad(g, want, what=f"{name}.grad")
    assert _gathered(stencil)
    assert not _atomic_grad(stencil, "x")


def test_2d_five_point_stencil_on_a_vector_field_stored_into_another_field():
    """out[i, j] = a nonlinear 5-point stencil of the Vector field u (bounds checks), then a loss
    kernel: u.grad everywhere, against central differences."""
    _init()
    n, m = 4, 5
    u = ti.Vector.field(2, ti.f32, shape=(n, m), needs_grad=True)
    out = ti.field(ti.f32, shape=(n, m), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def lap():
        for i, j in ti.ndrange(n, m):
            c = u[i, j]
            acc = -4.0 * c[0] * c[1]
            for k in ti.static(range(4)):
                i2 = i + ti.static([1, -1, 0, 0][k])
                j2 = j + ti.static([0, 0, 1, -1][k])
                if 0 <= i2 < n and 0 <= j2 < m:
                    acc += u[i2, j2][0] * ti.cos(u[i2, j2][1] - c[0])
            out[i, j] = acc

    @ti.kernel
    def total():
        for i, j in ti.ndrange(n, m):
            loss[None] += out[i, j] * out[i, j] * (1.0 + 0.1 * i - 0.05 * j)

    def ref(u_):
        acc = -4.0 * u_[..., 0] * u_[..., 1]
        for a, b in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            for i in range(n):
                for j in range(m):
                    if 0 <= i + a < n and 0 <= j + b < m:
                        nb = u_[i + a, j + b]
                        acc[i, j] += nb[0] * np.cos(nb[1] - u_[i, j, 0])
        wts = 1.0 + 0.1 * np.arange(n)[:, None] - 0.05 * np.arange(m)[None, :]
        return float((acc * acc * wts).sum())

    uv = np.random.default_rng(1).uniform(-1, 1, (n, m, 2)).astype(np.float32)
    u.from_numpy(uv)
    with ti.ad.Tape(loss=loss):
        lap()
        total()
    (want,) = central_diffs(ref, [uv])
    assert_grad(u.grad.to_numpy(), want, what="u.grad")
    assert _gathered(lap)
    assert not _atomic_grad(lap, "u")


def test_3d_seven_point_stencil_and_asymmetric_offsets():
    """A 3-D stencil reading (+1, 0, 0), (0, -2, 0), (0, 0, +1) and (-1, +1, 0) under bounds
    checks (asymmetric, one offset of 2, a diagonal)."""
    _init()
    n0, n1, n2 = 3, 4, 3
    offs = [(1, 0, 0), (0, -2, 0), (0, 0, 1), (-1, 1, 0)]
    x = ti.field(ti.f32, shape=(n0, n1, n2), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def st():
        for i, j, k in ti.ndrange(n0, n1, n2):
            c = x[i, j, k]
            for q in ti.static(range(4)):
                a, b, e = i + ti.static(offs[q][0]), j + ti.static(offs[q][1]), k + ti.static(offs[q][2])
                if 0 <= a < n0 and 0 <= b < n1 and 0 <= e < n2:
                    loss[None] += ti.tanh(x[a, b, e] - ti.static(q + 1) * c) * x[a, b, e]

    def ref(x_):
        out = 0.0
        for i, j, k in np.ndindex(n0, n1, n2):
            for q, (a, b, e) in enumerate(offs):
                if 0 <= i + a < n0 and 0 <= j + b < n1 and 0 <= k + e < n2:
                    nb = x_[i + a, j + b, k + e]
                    out += np.tanh(nb - (q + 1) * x_[i, j, k]) * nb
        return float(out)

    xv = np.random.default_rng(2).uniform(-1, 1, (n0, n1, n2)).astype(np.float32)
    (g,) = _run_1d(st, [x], loss, [xv])
    (want,) = central_diffs(ref, [xv])
    assert_grad(g, want, what="x.grad")
    assert _gathered(st)
    assert not _atomic_grad(st, "x")


def test_a_mask_guard_over_an_interior_loop_domain():
    """ndrange((1, n - 1), (1, m - 1)): the neighbours stay in the field by the loop's domain, and
    the guard is a mask field, not a bounds check. The border elements get gradient only from
    the interior threads that read them."""
    _init()
    n, m = 5, 6
    x = ti.field(ti.f32, shape=(n, m), needs_grad=True)
    mask = ti.field(ti.f32, shape=(n, m))
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def interior():
        for i, j in ti.ndrange((1, n - 1), (1, m - 1)):
            if mask[i, j] > 0.5:
                loss[None] += (x[i + 1, j] - x[i, j]) ** 2 * x[i, j - 1] + ti.exp(x[i - 1, j + 1] * 0.5)

    mv = (np.random.default_rng(4).uniform(0, 1, (n, m)) > 0.3).astype(np.float32)

    def ref(x_):
        out = 0.0
        for i in range(1, n - 1):
            for j in range(1, m - 1):
                if mv[i, j] > 0.5:
                    out += (x_[i + 1, j] - x_[i, j]) ** 2 * x_[i, j - 1] + np.exp(x_[i - 1, j + 1] * 0.5)
        return float(out)

    mask.from_numpy(mv)
    xv = np.random.default_rng(5).uniform(-1, 1, (n, m)).astype(np.float32)
    (g,) = _run_1d(interior, [x], loss, [xv])
    (want,) = central_diffs(ref, [xv])
    assert_grad(g, want, what="x.grad")
    assert _gathered(interior)
    assert not _atomic_grad(interior, "x")


def test_grouped_loop():
    """`for I in ti.grouped(...)` with neighbours x[I + offset]."""
    _init()
    n = 6
    x = ti.field(ti.f32, shape=(n, n), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def grouped():
        for I in ti.grouped(ti.ndrange(n, n)):
            for k in ti.static(range(2)):
                J = I + ti.Vector([ti.static([1, 0][k]), ti.static([0, -1][k])])
                if 0 <= J[0] < n and 0 <= J[1] < n:
                    loss[None] += x[J] * x[J] * x[I]

    def ref(x_):
        return float((x_[1:, :] ** 2 * x_[:-1, :]).sum() + (x_[:, :-1] ** 2 * x_[:, 1:]).sum())

    xv = np.random.default_rng(6).uniform(-1, 1, (n, n)).astype(np.float32)
    (g,) = _run_1d(grouped, [x], loss, [xv])
    (want,) = central_diffs(ref, [xv])
    assert_grad(g, want, what="x.grad")
    assert _gathered(grouped)
    assert not _atomic_grad(grouped, "x")


def test_fused_tape_tail():
    """The last kernel of a tape runs fused with its adjoint (fuse.py); its stencil is gathered
    in the fused kernel too."""
    _init()
    n = 7
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def smooth():
        for i in range(n):
            if i + 2 < n:
                loss[None] += ti.sin(x[i + 2] - x[i]) ** 2

    def ref(x_):
        return float((np.sin(x_[2:] - x_[:-2]) ** 2).sum())

    xv = np.random.default_rng(7).uniform(-2, 2, n).astype(np.float32)
    for _ in range(2):  # the second tape launches the fused kernel compiled by the first
        x.grad.fill(0.0)
        (g,) = _run_1d(smooth, [x], loss, [xv])
        (want,) = central_diffs(ref, [xv])
        assert_grad(g, want, what="x.grad")
    assert _gathered(smooth)


# ---- what the proof refuses: the atomic adjoint, and still the right gradients ---------------

def _fallback_kernels():
    """Kernels over x (n = 8) whose shapes the proof refuses, with their float64 twins."""
    n = 8
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    y = ti.field(ti.f32, shape=(n, n), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def argument_bound(m: ti.i32):  # the guard bounds i + 1 by an argument: in-shape is unproven
        for i in range(n):
            if i + 1 < m:
                loss[None] += ti.sin(x[i + 1] * x[i])

    @ti.kernel
    def non_unit_coefficient(m: ti.i32):
        for i in range(n):
            if 2 * i + 1 < n:
                loss[None] += x[2 * i + 1] ** 2 * x[i]

    @ti.kernel
    def serial_loop(m: ti.i32):
        for i in range(n):
            for q in range(2):
                if i + 1 < n:
                    loss[None] += x[i + 1] * x[i] * (q + 1)

    @ti.kernel
    def index_used_twice(m: ti.i32):  # y[i + 1, i]: not one parallel index per dimension
        for i in range(n):
            if i + 1 < n:
                loss[None] += y[i + 1, i] * y[i + 1, i] * y[i, i]

    refs = {
        argument_bound: (x, lambda x_, m: float(np.sin(x_[1:m] * x_[:m - 1]).sum())),
        non_unit_coefficient: (x, lambda x_, m: float(sum(x_[2 * i + 1] ** 2 * x_[i] for i in range(n)
                                                          if 2 * i + 1 < n))),
        serial_loop: (x, lambda x_, m: 3.0 * float((x_[1:] * x_[:-1]).sum())),
        index_used_twice: (y, lambda y_, m: float(sum(y_[i + 1, i] ** 2 * y_[i, i] for i in range(n - 1)))),
    }
    return loss, refs


@pytest.mark.parametrize("case", ["argument_bound", "non_unit_coefficient", "serial_loop", "index_used_twice"])
def test_refused_shapes_keep_the_atomic_adjoint(case):
    _init()
    loss, refs = _fallback_kernels()
    k, (f, ref) = next((k, r) for k, r in refs.items() if k.__name__ == case)
    m = 6
    xv = np.random.default_rng(8).uniform(-1, 1, f.shape).astype(np.float32)
    (g,) = _run_1d(k, [f], loss, [xv], (m,))
    (want,) = central_diffs(lambda x_: ref(x_, m), [xv])
    assert_grad(g, want, what=f"{f.name}.grad ({case})")
    assert not _gathered(k, m)
    assert _atomic_grad(k, f.name, m)


def test_transposed_placements_of_one_field_are_not_gathered():
    """y[i, j + 1] and y[j, i] in one task would make two gather threads write one element."""
    _init()
    n = 5
    y = ti.field(ti.f32, shape=(n, n), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def tr():
        for i, j in ti.ndrange(n, n):
            if j + 1 < n:
                loss[None] += y[i, j + 1] * y[j, i] * y[i, j]

    def ref(y_):
        return float(sum(y_[i, j + 1] * y_[j, i] * y_[i, j] for i in range(n) for j in range(n - 1)))

    yv = np.random.default_rng(9).uniform(-1, 1, (n, n)).astype(np.float32)
    (g,) = _run_1d(tr, [y], loss, [yv])
    (want,) = central_diffs(ref, [yv])
    assert_grad(g, want, what="y.grad")
    assert not _gathered(tr)


def test_cpu_serial_trailing_dimension_is_not_gathered():
    """With the CPU adapters' split of a 2-D loop into a parallel i and a serial j
    (min_parallel, frontend/kernel.py), the body has a serial loop: the atomic adjoint."""
    _init(min_parallel=1)
    n = 5
    x = ti.field(ti.f32, shape=(n, n), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def k():
        for i, j in ti.ndrange(n, n):
            if i + 1 < n:
                loss[None] += x[i + 1, j] * x[i, j] * x[i, j]

    def ref(x_):
        return float((x_[1:] * x_[:-1] ** 2).sum())

    xv = np.random.default_rng(12).uniform(-1, 1, (n, n)).astype(np.float32)
    (g,) = _run_1d(k, [x], loss, [xv])
    (want,) = central_diffs(ref, [xv])
    assert_grad(g, want, what="x.grad")
    assert not _gathered(k)


def _blur():
    n = 8
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def blur():
        for i in range(n):
            if 0 < i < n - 1:
                loss[None] += ti.sin(x[i - 1] + 2.0 * x[i] * x[i + 1])

    def ref(x_):
        return float(np.sin(x_[:-2] + 2.0 * x_[1:-1] * x_[2:]).sum())
    return x, loss, blur, ref


def test_when_it_gathers_and_the_option():
    """By default the gather is made on GPUs only (on lavapipe its replays cost more than the
    atomics they remove, benchmarks/RESULTS.md); ti.set_compile_options(stencil_gather=...)
    forces it either way, and a bad value is refused with a clear message."""
    ti.init()
    x, loss, blur, _ = _blur()
    assert _gathered(blur) == (ti.compile_options().min_parallel is None)
    ti.set_compile_options(stencil_gather=False)
    assert not _gathered(blur)
    ti.set_compile_options(stencil_gather=True)
    assert _gathered(blur)
    with pytest.raises(ti.WgpuAdError, match=r"stencil_gather='yes': expected True, False or None \(automatic\)"):
        ti.set_compile_options(stencil_gather="yes")


def test_gather_in_debug_mode_with_nan_checks():
    """debug=True keeps index asserts in the replays and checks every gradient contribution for
    NaN (the gather task's too): the same right gradients."""
    ti.init(debug=True)
    ti.set_compile_options(stencil_gather=True)
    x, loss, blur, ref = _blur()
    xv = np.random.default_rng(13).uniform(-1, 1, 8).astype(np.float32)
    (g,) = _run_1d(blur, [x], loss, [xv])
    (want,) = central_diffs(ref, [xv])
    assert_grad(g, want, what="x.grad")
    assert _gathered(blur)
    assert not _atomic_grad(blur, "x")


def test_an_output_stored_twice_keeps_the_scatter():
    """A stencil whose body stores its output element twice (an update in place, then again):
    the first store's adjoint must see zero, the gradient the second consumed, which a gather
    (reading the outputs' gradients without consuming them) cannot give, so the atomic adjoint
    stays; the gradient against float64 central differences (tests/test_fuzz.py seed 249)."""
    _init()
    n = 5
    a = ti.field(ti.f32, shape=n, needs_grad=True)
    y = ti.field(ti.f32, shape=n, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def step():
        for i in y:
            r = 0.45 * a[i]
            if i + 1 < n:
                r = r * 0.5 + ti.sin(a[i + 1])
            if i - 1 >= 0:
                r = r * 0.5 + ti.sin(a[i - 1])
            y[i] = 0.5 * y[i] + r
            y[i] = ti.sin(y[i]) + r

    @ti.kernel
    def total():
        for i in range(n):
            loss[None] += y[i] * y[i] * (i + 1.0)

    def ref(a_, y_):
        r = 0.45 * a_
        r[:-1] = r[:-1] * 0.5 + np.sin(a_[1:])
        r[1:] = r[1:] * 0.5 + np.sin(a_[:-1])
        y1 = np.sin(0.5 * y_ + r) + r
        return float((y1 * y1 * (np.arange(n) + 1.0)).sum())

    rng = np.random.default_rng(5)
    av, yv = rng.uniform(-1, 1, n).astype(np.float32), rng.uniform(-1, 1, n).astype(np.float32)
    a.from_numpy(av)
    y.from_numpy(yv)
    with ti.ad.Tape(loss=loss):
        step()
        total()
    want_a, want_y = central_diffs(ref, [av, yv])
    assert_grad(a.grad.to_numpy(), want_a, what="a.grad")
    assert_grad(y.grad.to_numpy(), want_y, what="y.grad")
    assert not _gathered(step)
