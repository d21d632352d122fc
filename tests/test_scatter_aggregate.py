"""Scatters (float atomic adds into a grid from many threads) on both atomic paths, native
atomic<f32> and compare-exchange (`force_emulated_atomics=True`), with particles in random order
and sorted by cell: forward values against float64 NumPy, gradients against float64 central
differences, and where codegen/aggregate.py sends an add through the subgroup helper (emulated
float adds whose old value is unused) and where not."""
from __future__ import annotations

import numpy as np
import pytest

import wgpu_ad as ti
from ad_util import assert_grad, central_diff, f32

pytestmark = pytest.mark.gpu

ATOMICS = [pytest.param(False, id="native"), pytest.param(True, id="cas")]
G = 12  # grid side


def init(emulated: bool) -> None:
    ti.init(force_emulated_atomics=emulated)
    if not emulated and not ti.get_runtime().has_float_atomics:
        pytest.skip("adapter lacks shader-float32-atomic")


def particles(n: int, order: str, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.2, 0.8, (n, 2))
    v = rng.normal(0.0, 1.0, (n, 2))
    if order == "sorted":
        base = np.floor(x * G - 0.5).astype(np.int64)
        k = np.argsort(base[:, 0] * G + base[:, 1], kind="stable")
        x, v = x[k], v[k]
    return f32(x), f32(v)


def p2g_reference(x: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """grid_m += w, grid_mv -= w v over the 3x3 quadratic B-spline stencil, in float64."""
    X = np.asarray(x, np.float64) * G
    base = np.floor(X - 0.5).astype(np.int64)
    fx = X - base
    w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1.0) ** 2, 0.5 * (fx - 0.5) ** 2]
    m, mv = np.zeros(G * G), np.zeros((G * G, 2))
    for i in range(3):
        for j in range(3):
            node = (base[:, 0] + i) * G + base[:, 1] + j
            wt = w[i][:, 0] * w[j][:, 1]
            m += np.bincount(node, wt, G * G)
            for c in range(2):
                mv[:, c] -= np.bincount(node, wt * np.asarray(v[:, c], np.float64), G * G)
    return m.reshape(G, G), mv.reshape(G, G, 2)


def build_p2g(n: int):
    x = ti.Vector.field(2, ti.f32, shape=n, needs_grad=True)
    v = ti.Vector.field(2, ti.f32, shape=n)
    grid_m = ti.field(ti.f32, shape=(G, G), needs_grad=True)
    grid_mv = ti.Vector.field(2, ti.f32, shape=(G, G), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def p2g():
        for q in x:
            X = x[q] * G
            base = ti.cast(X - 0.5, ti.i32)
            fx = X - ti.cast(base, ti.f32)
            w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1.0) ** 2, 0.5 * (fx - 0.5) ** 2]
            for i, j in ti.static(ti.ndrange(3, 3)):
                weight = w[i][0] * w[j][1]
                grid_m[base[0] + i, base[1] + j] += weight
                grid_mv[base[0] + i, base[1] + j] -= weight * v[q]

    @ti.kernel
    def energy():
        for i, j in grid_m:
            loss[None] += grid_m[i, j] ** 2 + grid_mv[i, j].dot(grid_mv[i, j])

    return x, v, grid_m, grid_mv, loss, p2g, energy


@pytest.mark.parametrize("order", ["random", "sorted"])
@pytest.mark.parametrize("emulated", ATOMICS)
def test_p2g_values_and_gradient(emulated, order):
    """Mass (+=) and vector momentum (-=) splatted onto 9 nodes per particle; n is no multiple of a
    workgroup, so the last one is partial. The gradient of sum(grid^2) with respect to some
    particles' positions goes back through the weights."""
    init(emulated)
    n = 1000
    xs, vs = particles(n, order)
    x, v, grid_m, grid_mv, loss, p2g, energy = build_p2g(n)
    x.from_numpy(xs)
    v.from_numpy(vs)
    with ti.ad.Tape(loss=loss):
        p2g()
        energy()
    m_ref, mv_ref = p2g_reference(xs, vs)
    np.testing.assert_allclose(grid_m.to_numpy(), m_ref, rtol=1e-5, atol=1e-5 * np.abs(m_ref).max())
    np.testing.assert_allclose(grid_mv.to_numpy(), mv_ref, rtol=1e-5, atol=1e-5 * np.abs(mv_ref).max())

    picked = np.array([0, 1, 137, 500, n - 1])
    x64 = xs.astype(np.float64)

    def f(sub: np.ndarray) -> float:
        xx = x64.copy()
        xx[picked] = sub
        m, mv = p2g_reference(xx, vs)
        return float((m ** 2).sum() + (mv ** 2).sum())
    assert loss[None] == pytest.approx(f(x64[picked]), rel=1e-5)
    assert_grad(x.grad.to_numpy()[picked], central_diff(f, x64[picked]), what=f"dloss/dx ({order})")


@pytest.mark.parametrize("emulated", ATOMICS)
def test_g2p_adjoint_scatters_into_the_grid_gradient(emulated):
    """A gather from the grid (G2P) has a scatter as its adjoint: grid.grad[node] += w * out.grad,
    many particles per node, sorted so the lanes of a subgroup share nodes. The loss is linear in
    the grid, so central differences are exact up to rounding."""
    init(emulated)
    n = 700
    xs, _ = particles(n, "sorted", seed=8)
    cs = f32(np.random.default_rng(9).normal(size=n))
    gv = f32(np.random.default_rng(10).normal(size=(G, G)))
    x = ti.Vector.field(2, ti.f32, shape=n)
    c = ti.field(ti.f32, shape=n)
    grid = ti.field(ti.f32, shape=(G, G), needs_grad=True)
    out = ti.field(ti.f32, shape=n, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def g2p():
        for q in x:
            X = x[q] * G
            base = ti.cast(X - 0.5, ti.i32)
            fx = X - ti.cast(base, ti.f32)
            w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1.0) ** 2, 0.5 * (fx - 0.5) ** 2]
            s = 0.0
            for i, j in ti.static(ti.ndrange(3, 3)):
                s += w[i][0] * w[j][1] * grid[base[0] + i, base[1] + j]
            out[q] = s

    @ti.kernel
    def total():
        for q in out:
            loss[None] += c[q] * out[q]

    x.from_numpy(xs)
    c.from_numpy(cs)
    grid.from_numpy(gv)
    with ti.ad.Tape(loss=loss):
        g2p()
        total()
    X = xs.astype(np.float64) * G
    base = np.floor(X - 0.5).astype(np.int64)
    fx = X - base
    w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1.0) ** 2, 0.5 * (fx - 0.5) ** 2]

    def f(g: np.ndarray) -> float:
        s = sum(w[i][:, 0] * w[j][:, 1] * g[base[:, 0] + i, base[:, 1] + j] for i in range(3) for j in range(3))
        return float((cs.astype(np.float64) * s).sum())
    assert loss[None] == pytest.approx(f(gv.astype(np.float64)), rel=1e-4, abs=1e-4)
    assert_grad(grid.grad.to_numpy(), central_diff(f, gv.astype(np.float64)), what="dloss/dgrid")


@pytest.mark.parametrize("emulated", ATOMICS)
def test_many_threads_on_one_element_mixed_subgroups_and_early_exits(emulated):
    """Exact sums (small integers in f32): every thread on one element; elements shared by runs
    of 3 threads (subgroups that agree and subgroups that do not); a different element per thread;
    and threads that skip their adds (`continue`), so subgroups are partly active."""
    init(emulated)
    n = 2003
    key = ti.field(ti.i32, shape=n)
    one = ti.field(ti.f32, shape=4)
    runs = ti.field(ti.f32, shape=n // 3 + 1)
    each = ti.field(ti.f32, shape=n)
    counts = ti.field(ti.i32, shape=7)

    @ti.kernel
    def scatter():
        for i in key:
            k = key[i]
            if i % 5 == 4:
                continue
            one[k] += 1.0                 # k is 2 in every thread, not known to the compiler
            one[k + 1] -= 2.0
            runs[i // 3 + k - 2] += ti.cast(i % 3 + 1, ti.f32)
            each[i + k - 2] -= 3.0
            counts[(i * k) % 7] += 1       # an int add: a native atomic on every adapter

    key.from_numpy(np.full(n, 2, np.int32))
    scatter()
    i = np.arange(n)
    live = i % 5 != 4
    np.testing.assert_array_equal(one.to_numpy(), [0, 0, live.sum(), -2 * live.sum()])
    np.testing.assert_array_equal(runs.to_numpy(), np.bincount(i[live] // 3, (i[live] % 3 + 1), n // 3 + 1))
    np.testing.assert_array_equal(each.to_numpy(), np.where(live, -3.0, 0.0))
    np.testing.assert_array_equal(counts.to_numpy(), np.bincount((i[live] * 2) % 7, minlength=7))


def test_where_the_subgroup_helper_is_used():
    """codegen/aggregate.py: emulated float adds and subs whose old value is unused go through the
    subgroup helper unless their element is provably different in every thread (q, 2q + 1,
    [i + 1, j - 1], [j, i]);
    native float adds into thread-dependent elements, int adds, and adds whose old value is read
    keep the plain atomic."""
    init(True)
    if not ti.get_runtime().has_subgroups:
        pytest.skip("adapter lacks subgroup operations")
    n = 64
    x, v, grid_m, grid_mv, loss, p2g, energy = build_p2g(n)
    cnt = ti.field(ti.i32, shape=G)
    old = ti.field(ti.f32, shape=n)
    own = ti.field(ti.f32, shape=2 * n + 1)

    @ti.kernel
    def mixed():
        for q in x:
            c = ti.cast(x[q][0] * G, ti.i32)
            cnt[c] += 1
            old[q] = ti.atomic_add(grid_m[c, 0], 1.0)
            own[q] += 1.0
            own[2 * q + 1] -= 2.0

    wgsl = p2g.get_wgsl()
    assert wgsl.count("subgroup_add_grid_m(") == 1 + 9       # the helper and 9 nodes
    assert wgsl.count("subgroup_sub_grid_mv(") == 1 + 18     # 9 nodes x 2 components
    assert "atomicCompareExchangeWeak" in wgsl
    text = mixed.get_wgsl()
    assert "subgroup" not in text
    assert text.count("atomic_add_own(") == 2 and text.count("atomic_sub_own(") == 2  # helper and call
    mixed()
    q = np.arange(n)
    np.testing.assert_array_equal(own.to_numpy(), np.bincount(q, minlength=2 * n + 1)
                                  - 2 * np.bincount(2 * q + 1, minlength=2 * n + 1))
    np.testing.assert_array_equal(np.sort(old.to_numpy()), np.arange(n))   # x = 0: all on grid_m[0, 0]

    @ti.kernel
    def stencil():
        for i, j in ti.ndrange((1, G - 1), (1, G - 1)):
            grid_m[i + 1, j - 1] += 1.0       # one element per thread: i and j each alone
            grid_m[j, i] -= 2.0
            grid_m[i, 0] += 4.0               # shared along j: the subgroup helper
    grid_m.fill(0.0)
    stencil()
    text = stencil.get_wgsl()
    assert text.count("subgroup_add_grid_m(") == 2 and text.count("atomic_sub_grid_m(") == 2
    ref = np.zeros((G, G))
    for i in range(1, G - 1):
        for j in range(1, G - 1):
            ref[i + 1, j - 1] += 1.0
            ref[j, i] -= 2.0
            ref[i, 0] += 4.0
    np.testing.assert_array_equal(grid_m.to_numpy(), ref)

    ti.init(force_emulated_atomics=False)
    if not ti.get_runtime().has_float_atomics:
        return
    x, v, grid_m, grid_mv, loss, p2g, energy = build_p2g(n)
    wgsl = p2g.get_wgsl()
    assert "subgroup" not in wgsl and wgsl.count("atomicAdd(&grid_m[") == 9
