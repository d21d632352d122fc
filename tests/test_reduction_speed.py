"""Range tasks that pre-reduce into one address (passes/prereduce.py) get their own grid cap
(compile option reduce_grid_cap) and, past it, run four iterations per step reading and writing
their loop index's elements as vec4 (codegen/vectors.py quad_views). Values against float64
NumPy and gradients against analytic derivatives, for sizes around the workgroup, the tail of
range_count % 4, sizes past the cap, offset ranges, several reductions in one task, vector and
integer targets, stores beside the sum, and the fused tape tail as well as kernel.grad()."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

import wgpu_ad as ti
from ad_util import assert_grad

pytestmark = pytest.mark.gpu

WG = 128  # the default workgroup size


def _x(n, seed=0, lo=-1.0, hi=1.0):
    return np.random.default_rng(seed).uniform(lo, hi, n).astype(np.float32)


def _f64(a):
    return np.asarray(a, dtype=np.float64)


def _quads(wgsl: str, name: str) -> bool:
    """Whether the task's WGSL reads or writes buffer `name` as vec4."""
    return f"> {name}: array<vec4<" in wgsl


@pytest.mark.parametrize("n", [1, 63, 64, 65, 256, 257, 1001, 3000, 4099])
@pytest.mark.parametrize("emulated", [False, True])
def test_sum_of_cubes_values_and_gradients(n, emulated):
    """reduce_grid_cap=2: up to 256 elements run one iteration per thread, more run four per
    step (the last n % 4 one per thread). The tape runs the forward fused with its adjoint
    (the gradient written, not accumulated); kernel.grad() then accumulates into it."""
    ti.init(force_emulated_atomics=emulated)
    ti.set_compile_options(reduce_grid_cap=2)
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def cubes():
        for i in x:
            loss[None] += x[i] ** 3

    x0 = _x(n, seed=n)
    x.from_numpy(x0)
    with ti.ad.Tape(loss=loss):
        cubes()
    ref = float((_f64(x0) ** 3).sum())
    assert loss[None] == pytest.approx(ref, rel=1e-5, abs=1e-5 * math.sqrt(n))
    assert_grad(x.grad.to_numpy(), 3 * _f64(x0) ** 2, rtol=1e-5)
    cubes.grad()  # the unfused adjoint, accumulating into x.grad
    assert_grad(x.grad.to_numpy(), 6 * _f64(x0) ** 2, rtol=1e-5)
    assert _quads(cubes.get_wgsl(), "x") == (n > 2 * WG)
    assert cubes._get(())[0].plan.tasks[0].grid_cap == 2


def test_the_grid_is_capped_from_the_device(monkeypatch):
    """The default reduce_grid_cap comes from the device (16 workgroups per core on a CPU
    adapter, 2048 on a GPU); a pre-reduced task gets at most that many workgroups, a task that
    does not pre-reduce keeps grid_cap; both cover a range longer than cap x workgroup size."""
    ti.init()
    opts = ti.compile_options()
    rt = ti.get_runtime()
    expected = 16 * (os.cpu_count() or 1) if rt.is_cpu else min(2048, rt.max_workgroups)
    assert opts.reduce_grid_cap == expected
    cap = min(opts.reduce_grid_cap, opts.grid_cap)
    n = cap * WG * 2 + 7
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    y = ti.field(ti.f32, shape=n)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def total():
        for i in x:
            loss[None] += x[i]

    @ti.kernel
    def double():
        for i in x:
            y[i] = 2.0 * x[i]

    grids = []
    launch = rt.launch

    def spy(ck, task_index, buffers, args, workgroups, *rest, **kw):
        grids.append((ck.name, workgroups))
        return launch(ck, task_index, buffers, args, workgroups, *rest, **kw)

    monkeypatch.setattr(rt, "launch", spy)
    x0 = _x(n, seed=3)
    x.from_numpy(x0)
    total()
    double()
    assert loss[None] == pytest.approx(float(_f64(x0).sum()), rel=1e-4, abs=1e-4 * math.sqrt(n))
    np.testing.assert_array_equal(y.to_numpy(), 2 * x0)
    assert ("total", cap) in grids
    assert ("double", min(-(-n // WG), opts.grid_cap)) in grids
    assert total._get(())[0].plan.tasks[0].grid_cap == cap
    assert double._get(())[0].plan.tasks[0].grid_cap is None


@pytest.mark.parametrize("begin", [0, 3, 8])
def test_ranges_that_start_elsewhere(begin):
    """A begin that is a multiple of 4 keeps the vec4 steps (offset by begin / 4); any other
    begin runs one iteration per step."""
    ti.init()
    ti.set_compile_options(reduce_grid_cap=1)
    n = 1003
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def part():
        for i in range(begin, n):
            loss[None] += ti.sin(x[i]) * x[i]

    x0 = _x(n, seed=5)
    x.from_numpy(x0)
    with ti.ad.Tape(loss=loss):
        part()
    xs = _f64(x0)[begin:]
    assert loss[None] == pytest.approx(float((np.sin(xs) * xs).sum()), rel=1e-5, abs=1e-5)
    ref = np.zeros(n)
    ref[begin:] = np.cos(xs) * xs + np.sin(xs)
    assert_grad(x.grad.to_numpy(), ref, rtol=1e-5)
    assert _quads(part.get_wgsl(), "x") == (begin % 4 == 0)


def test_several_sums_vector_and_integer_targets_and_a_store():
    """One task adds into a vector, an integer count and a float, reads an i32 field at the loop
    index and stores a second field: every value against NumPy. (The user's `quad` must not hide
    the step's counter of the same name.)"""
    ti.init()
    ti.set_compile_options(reduce_grid_cap=1)
    n = 2051
    x = ti.field(ti.f32, shape=n)
    k = ti.field(ti.i32, shape=n)
    y = ti.field(ti.f32, shape=n)
    moments = ti.Vector.field(2, ti.f32, shape=())
    positives = ti.field(ti.i32, shape=())
    weighted = ti.field(ti.f32, shape=())

    @ti.kernel
    def stats():
        for i in x:
            quad = x[i]
            moments[None] += ti.Vector([quad, quad * quad])
            if quad > 0:
                positives[None] += 1
            weighted[None] += quad * k[i]
            y[i] = 2.0 * quad + k[i]

    x0 = _x(n, seed=7)
    k0 = np.random.default_rng(8).integers(-5, 6, n).astype(np.int32)
    x.from_numpy(x0)
    k.from_numpy(k0)
    stats()
    xs = _f64(x0)
    np.testing.assert_allclose(np.asarray(moments[None]), [xs.sum(), (xs * xs).sum()], rtol=1e-5, atol=1e-4)
    assert positives[None] == int((x0 > 0).sum())
    assert weighted[None] == pytest.approx(float((xs * k0).sum()), rel=1e-5, abs=1e-4)
    np.testing.assert_allclose(y.to_numpy(), 2 * xs + k0, rtol=1e-6)
    wgsl = stats.get_wgsl()
    assert _quads(wgsl, "x") and _quads(wgsl, "k") and _quads(wgsl, "y")


def test_gradients_of_two_inputs_with_a_side_store_and_an_inner_loop():
    """Two gradients written by one adjoint (so neither is written as vec4: two bindings could
    be one storage), a field stored beside the sum, an inner loop and a branch."""
    ti.init()
    ti.set_compile_options(reduce_grid_cap=1)
    n = 1030
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    w = ti.field(ti.f32, shape=n, needs_grad=True)
    y = ti.field(ti.f32, shape=n)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def model():
        for i in x:
            y[i] = ti.sin(x[i])
            acc = 0.0
            for j in range(3):
                acc += x[i] * (j + 1)
            if x[i] > 0:
                loss[None] += acc * w[i]
            else:
                loss[None] += x[i] * x[i]

    x0, w0 = _x(n, seed=9), _x(n, seed=10, lo=0.5, hi=1.5)
    x.from_numpy(x0)
    w.from_numpy(w0)
    with ti.ad.Tape(loss=loss):
        model()
    xs, ws = _f64(x0), _f64(w0)
    pos = xs > 0
    assert loss[None] == pytest.approx(float(np.where(pos, 6 * xs * ws, xs * xs).sum()), rel=1e-5, abs=1e-4)
    assert_grad(x.grad.to_numpy(), np.where(pos, 6 * ws, 2 * xs), rtol=1e-5)
    assert_grad(w.grad.to_numpy(), np.where(pos, 6 * xs, 0.0), rtol=1e-5)
    np.testing.assert_allclose(y.to_numpy(), np.sin(xs), rtol=1e-5, atol=1e-6)


def test_an_ndarray_passed_twice_past_the_cap():
    """The adjoint of a(i)^2 + 3 b(i) with a and b one ndarray stores its gradient through two
    bindings: each store must land (no vec4 write of one binding undoes the other's)."""
    ti.init()
    ti.set_compile_options(reduce_grid_cap=1)
    n = 1001
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def compute(a: ti.types.ndarray(), b: ti.types.ndarray()):
        for i in a:
            loss[None] += a[i] * a[i] + 3.0 * b[i]

    x0 = _x(n, seed=11)
    a = ti.ndarray(ti.f32, shape=n, needs_grad=True)
    a.from_numpy(x0)
    with ti.ad.Tape(loss=loss):
        compute(a, a)
    assert loss[None] == pytest.approx(float((_f64(x0) ** 2 + 3 * _f64(x0)).sum()), rel=1e-5, abs=1e-4)
    assert_grad(a.grad.to_numpy(), 2 * _f64(x0) + 3.0, rtol=1e-5)


def test_reduce_grid_cap_must_be_a_positive_integer():
    ti.init()
    with pytest.raises(ti.WgpuAdError, match=r"reduce_grid_cap=0: expected a positive integer"):
        ti.set_compile_options(reduce_grid_cap=0)


def test_a_two_dimensional_sum_reads_its_field_as_vec4():
    """`for i, j in g` runs over the flattened index k, and g[i, j]'s address (k // n) * n +
    (k - (k // n) * n) simplifies to k (passes/simplify.py), so the sum reads g as vec4; the
    vector field beside it keeps its vec2 view. 37 x 29 = 1073 elements: a tail of one."""
    ti.init()
    ti.set_compile_options(reduce_grid_cap=1)
    g = ti.field(ti.f32, shape=(37, 29), needs_grad=True)
    m = ti.Vector.field(2, ti.f32, shape=(37, 29), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def energy():
        for i, j in g:
            loss[None] += g[i, j] ** 2 * (i + 1) + m[i, j].dot(m[i, j])

    g0 = _x(37 * 29, seed=12).reshape(37, 29)
    m0 = _x(37 * 29 * 2, seed=13).reshape(37, 29, 2)
    g.from_numpy(g0)
    m.from_numpy(m0)
    with ti.ad.Tape(loss=loss):
        energy()
    gs, ms = _f64(g0), _f64(m0)
    rows = np.arange(1, 38, dtype=np.float64)[:, None]
    assert loss[None] == pytest.approx(float((gs ** 2 * rows).sum() + (ms ** 2).sum()), rel=1e-5)
    assert_grad(g.grad.to_numpy(), 2 * gs * rows, rtol=1e-5)
    assert_grad(m.grad.to_numpy(), 2 * ms, rtol=1e-5)
    wgsl = energy.get_wgsl()
    assert _quads(wgsl, "g") and "> m: array<vec2<f32>>" in wgsl
