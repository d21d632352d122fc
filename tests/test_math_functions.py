"""Every transcendental builtin and its derivative within a stated bound in ulps against float64
(ULP_TABLE, at the end; docs/language.md lists it). Then ti.math.asinh, acosh, atanh, log1p and
expm1 (also ti.asinh ...): values over their domains against float64 NumPy, relative accuracy near
0 (acosh: near 1), where the textbook formulas lose most digits in float32, the edges (inf, NaN),
and their derivatives in both modes against the analytic derivative and float64 central
differences.

Tolerances are float32's: 2^-23 = 1.2e-7 is one unit in the last place at 1. The values are
within a few of those (measured on lavapipe: at most 4.1 ulps); expm1 beyond |x| = 1 is
exp(x) - 1 and inherits exp's error, which WGSL allows to be 3 + 2|x| ulps."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

import wgpu_ad as ti
from ad_util import assert_grad, central_diff, f32
from wgpu_ad.ir.nodes import walk
from wgpu_ad.ir.ops import Op

pytestmark = pytest.mark.gpu

ULP = 2.0 ** -23


@dataclass
class M:
    name: str
    op: Op
    ref: Callable       # float64 NumPy
    d: Callable         # the analytic derivative, float64
    xs: tuple           # over the domain, edges and large values included
    grad_xs: tuple      # where central differences are well conditioned
    tiny: tuple         # near the point where the textbook formula cancels

    @property
    def fn(self):
        return getattr(ti.math, self.name)


FUNCS = [
    M("asinh", Op.ASINH, np.arcsinh, lambda x: 1 / np.sqrt(1 + x * x),
      (0.0, 1e-30, -1e-6, 1e-3, 0.1, -0.5, 1.0, 3.0, -10.0, 1e4, 1e10, -1e20, 3e38),
      (-2.5, -0.7, -0.1, 0.3, 1.2, 4.0), (1e-30, 1e-10, 1e-6, -1e-6, 3e-4)),
    M("acosh", Op.ACOSH, np.arccosh, lambda x: 1 / np.sqrt((x - 1) * (x + 1)),
      (1.0, 1 + 2 ** -23, 1 + 2 ** -20, 1.001, 1.5, 2.0, 10.0, 1e4, 1e10, 1e20, 3e38),
      (1.2, 1.5, 2.0, 3.3, 7.0, 12.0), (1 + 2 ** -23, 1 + 2 ** -20, 1 + 2 ** -16, 1.001)),
    M("atanh", Op.ATANH, np.arctanh, lambda x: 1 / (1 - x * x),
      (0.0, 1e-30, 1e-6, -1e-3, 0.3, -0.5, 0.9, 0.999, -0.9999, 1 - 2 ** -24),
      (-0.8, -0.45, -0.05, 0.2, 0.6, 0.85), (1e-30, 1e-10, 1e-6, -1e-6, 3e-4)),
    M("log1p", Op.LOG1P, np.log1p, lambda x: 1 / (1 + x),
      (0.0, 1e-30, 1e-6, -1e-6, 1e-3, -0.3, 0.4, -0.5, 1.0, -0.999, 10.0, 1e10, 3e38),
      (-0.7, -0.3, -0.05, 0.2, 0.9, 3.0), (1e-30, 1e-10, 1e-6, -1e-6, 3e-4)),
    M("expm1", Op.EXPM1, np.expm1, np.exp,
      (0.0, 1e-30, 1e-6, -1e-3, 0.2, -0.3, 0.34, 0.36, -0.36, 1.0, -5.0, 10.0, 80.0, -80.0),
      (-2.0, -0.6, -0.1, 0.25, 0.7, 1.8), (1e-30, 1e-10, 1e-6, -1e-6, 3e-4)),
]


def _uniform(case: M, n: int = 64) -> np.ndarray:
    r = np.random.default_rng(len(case.name))
    lo, hi = {"acosh": (1, 20), "atanh": (-0.999, 0.999), "log1p": (-0.99, 20)}.get(case.name, (-20, 20))
    return r.uniform(lo, hi, n)


def _run(case: M, xs) -> tuple[np.ndarray, object]:
    fn = case.fn
    xv = f32(xs)
    x = ti.field(ti.f32, shape=len(xv))
    y = ti.field(ti.f32, shape=len(xv))

    @ti.kernel
    def apply():
        for i in x:
            y[i] = fn(x[i])

    x.from_numpy(xv)
    apply()
    return y.to_numpy(), apply


def _ops_in(kernel) -> set:
    ir = kernel._get(())[0].ir
    return {s.op for t in ir.tasks for blk in (t.bounds, t.body) for s in walk(blk)}


def _max_rel(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want) / np.abs(want), initial=0.0, where=want != 0))


def test_public_names():
    for case in FUNCS:
        f = getattr(ti, case.name)
        assert f is case.fn, f"ti.{case.name} is not ti.math.{case.name}"
        assert f(0.5 if case.name != "acosh" else 1.5) == pytest.approx(case.ref(0.5 if case.name != "acosh" else 1.5))


@pytest.mark.parametrize("case", FUNCS, ids=lambda c: c.name)
def test_values_over_the_domain(case: M):
    xv = f32(np.concatenate([case.xs, _uniform(case)]))
    y, k = _run(case, xv)
    assert case.op in _ops_in(k), f"ti.math.{case.name} did not lower to Op.{case.op.name}"
    x64 = xv.astype(np.float64)
    want = case.ref(x64)
    # 8 ulps; expm1 as exp(x) - 1 (|x| >= 1) may also have exp's error, 3 + 2|x| ulps by WGSL
    tol = 8 * ULP + (np.where(np.abs(x64) >= 1, (3 + 2 * np.abs(x64)) * ULP, 0) if case.op is Op.EXPM1 else 0)
    err = np.abs(y - want) / np.maximum(np.abs(want), 1e-300)
    assert np.all(np.isfinite(y)), f"{case.name}: non-finite values at x = {xv[~np.isfinite(y)]}"
    bad = np.nonzero(err > tol)[0]
    assert not len(bad), (f"{case.name}: relative error {err[bad[:4]]} at x = {xv[bad[:4]]} "
                          f"(got {y[bad[:4]]}, float64 says {want[bad[:4]]})")


@pytest.mark.parametrize("case", FUNCS, ids=lambda c: c.name)
def test_accurate_where_the_textbook_formula_cancels(case: M):
    """log(x + sqrt(x^2 + 1)) at x = 1e-6 is off by 5% in float32 (1 + 1e-6 keeps 3 digits of
    x), log(1 + x) likewise, exp(x) - 1 by 5%: these stay within 3 ulps."""
    xv = f32(case.tiny)
    y, _ = _run(case, xv)
    want = case.ref(xv.astype(np.float64))
    assert _max_rel(y, want) <= 3 * ULP, f"{case.name}({xv}) = {y}, float64 says {want}"


def test_edges():
    inf, nan = np.inf, np.nan
    edges = {"asinh": ([inf, -inf, nan], [inf, -inf, nan]),
             "acosh": ([0.5, -2.0, inf, nan], [nan, nan, inf, nan]),
             "atanh": ([1.0, -1.0, 1.5, nan], [inf, -inf, nan, nan]),
             "log1p": ([-1.0, -2.0, inf, nan], [-inf, nan, inf, nan]),
             "expm1": ([-inf, inf, 100.0, nan], [-1.0, inf, inf, nan])}
    for case in FUNCS:
        xs, want = edges[case.name]
        y, _ = _run(case, xs)
        np.testing.assert_array_equal(y, f32(want), err_msg=f"{case.name} at {xs}")


def test_compile_time_constants_fold_in_float64():
    y = ti.field(ti.f32, shape=5)

    @ti.kernel
    def consts():
        y[0] = ti.math.log1p(1e-10)
        y[1] = ti.math.expm1(-1e-10)
        y[2] = ti.asinh(1e-20)
        y[3] = ti.atanh(0.5)
        y[4] = ti.acosh(1.0 + 1e-12)

    consts()
    want = [np.log1p(1e-10), np.expm1(-1e-10), np.arcsinh(1e-20), np.arctanh(0.5), np.arccosh(1.0 + 1e-12)]
    np.testing.assert_allclose(y.to_numpy(), want, rtol=ULP)


def _weights(n: int, seed: int) -> np.ndarray:
    r = np.random.default_rng(300 + seed)
    return f32(r.uniform(0.5, 1.5, n) * r.choice([-1.0, 1.0], n))


@pytest.mark.parametrize("case", FUNCS, ids=lambda c: c.name)
def test_gradient(case: M):
    """Reverse mode: x.grad = w f'(x), against the analytic derivative at every point (near the
    edges too) and float64 central differences where they are well conditioned."""
    fn = case.fn
    xv = f32(np.concatenate([case.grad_xs, case.tiny]))
    w = _weights(len(xv), len(case.name))
    x = ti.field(ti.f32, shape=len(xv), needs_grad=True)
    y = ti.field(ti.f32, shape=len(xv), needs_grad=True)

    @ti.kernel
    def apply():
        for i in x:
            y[i] = fn(x[i])

    x.from_numpy(xv)
    apply()
    y.grad.from_numpy(w)
    apply.grad()
    g = x.grad.to_numpy()
    x64 = xv.astype(np.float64)
    assert _max_rel(g, w * case.d(x64)) <= 1e-5, f"d/dx {case.name} at {xv}: {g / w}, analytic {case.d(x64)}"
    k = len(case.grad_xs)
    ref = central_diff(lambda a: np.sum(w[:k] * case.ref(a)), x64[:k])
    assert_grad(g[:k], ref, rtol=1e-5, what=f"d/dx {case.name} (central differences)")


@pytest.mark.parametrize("case", FUNCS, ids=lambda c: c.name)
def test_tangent(case: M):
    """Forward mode: y.dual = f'(x) v, against the analytic derivative and central differences."""
    fn = case.fn
    xv = f32(np.concatenate([case.grad_xs, case.tiny]))
    v = _weights(len(xv), 7 + len(case.name))
    x = ti.field(ti.f32, shape=len(xv), needs_dual=True)
    y = ti.field(ti.f32, shape=len(xv), needs_dual=True)

    @ti.kernel
    def apply():
        for i in x:
            y[i] = fn(x[i])

    x.from_numpy(xv)
    with ti.ad.FwdMode(loss=y, param=x, seed=list(v)):
        apply()
    dy = y.dual.to_numpy()
    x64 = xv.astype(np.float64)
    assert _max_rel(dy, v * case.d(x64)) <= 1e-5, f"tangent of {case.name} at {xv}: {dy / v}, analytic {case.d(x64)}"
    k = len(case.grad_xs)
    h = 1e-6
    ref = (case.ref(x64[:k] + h * v[:k]) - case.ref(x64[:k] - h * v[:k])) / (2 * h)
    assert_grad(dy[:k], ref, rtol=1e-5, what=f"tangent of {case.name} (central differences)")


# ---- every transcendental builtin and its derivative, in ulps against float64 --------------------
# One row per op: the float64 reference, its derivative(s), where it is sampled, and the bound in
# float32 ulps of the exact result (ulps of |f(x)| for values >= 2^-126; subnormal results are left
# out, a GPU may flush them). Bounds are functions of the sample: WGSL bounds exp as 3 + 2|x| ulps
# and pow as exp2(y log2 x), and lavapipe's built-ins use that room (61 ulps at exp(-80)); every
# other op stays within a few (sin, cos, tan and log are helpers of shaders/math.wgsl: WGSL bounds
# the built-ins only absolutely, and SwiftShader's gives sin 1e-30 = 0). docs/language.md lists
# this table.

TINY = float(np.finfo(np.float32).tiny)


def _mags(lo: float, hi: float, n: int = 600) -> np.ndarray:
    m = np.logspace(lo, hi, n)
    return np.concatenate([m, -m, [0.0]])


def _near(points, n: int = 80) -> np.ndarray:
    """float32 points and their float32 neighbours (2 ulps either side)."""
    p = f32(points)
    return np.concatenate([p] + [np.nextafter(p, s * np.inf, dtype=np.float32) for s in (1, -1)]
                          + [np.nextafter(np.nextafter(p, s * np.inf), s * np.inf) for s in (1, -1)])


_PI_K = np.arange(1, 31) * np.pi
_NEAR_ONE = np.concatenate([1 - np.logspace(-7.2, -0.1, 300), 1 + np.logspace(-7, -0.1, 300)])
_EDGE = np.concatenate([-1 + np.logspace(-7.2, -0.01, 200), 1 - np.logspace(-7.2, -0.01, 200)])
_R = np.random.default_rng(26)


@dataclass
class U:
    name: str
    ref: Callable
    d: Callable                 # the derivative(s) in float64: one array, or a tuple for two operands
    xs: tuple                   # samples: one array, or two for a binary op
    ulps: Callable | float      # bound on the value (a function of the samples where WGSL's is)
    d_ulps: Callable | float    # bound on the derivative(s)
    d_mask: Callable = None     # where the derivative is sampled (default: everywhere)

    def bound(self, b, xs):
        return b(*xs) if callable(b) else b


_exp_b = lambda x: 3 + 2 * np.abs(x)                                     # noqa: E731 WGSL's exp
_POW_X = np.concatenate([10 ** _R.uniform(-10, 10, 1500), -_R.uniform(0.5, 4, 200)])
_POW_Y = np.concatenate([_R.uniform(-4, 4, 1500), _R.integers(-3, 4, 200).astype(float)])
_A2_Y = _R.standard_normal(2000) * 10 ** _R.uniform(-15, 15, 2000)
_A2_X = _R.standard_normal(2000) * 10 ** _R.uniform(-15, 15, 2000)

ULP_TABLE = [
    U("sin", np.sin, np.cos, (np.concatenate([_mags(-30, 2.5), _near(_PI_K), _near(_PI_K + np.pi / 2)]),), 4, 4),
    U("cos", np.cos, lambda x: -np.sin(x), (np.concatenate([_mags(-30, 2.5), _near(_PI_K), _near(_PI_K - np.pi / 2)]),), 4, 4),
    U("tan", np.tan, lambda x: 1 + np.tan(x) ** 2, (np.concatenate([_mags(-30, 0.19), _near(_PI_K)]),), 4, 4),
    U("asin", np.arcsin, lambda x: 1 / np.sqrt(1 - x * x), (np.concatenate([_mags(-30, -1e-3), _EDGE, [1, -1]]),), 4, 4,
      lambda x: np.abs(x) < 1),
    U("acos", np.arccos, lambda x: -1 / np.sqrt(1 - x * x), (np.concatenate([_mags(-30, -1e-3), _EDGE, [1, -1]]),), 4, 4,
      lambda x: np.abs(x) < 1),
    U("atan", np.arctan, lambda x: 1 / (1 + x * x), (_mags(-30, 30),), 4, 4),
    U("atan2", np.arctan2, (lambda y, x: x / (x * x + y * y), lambda y, x: -y / (x * x + y * y)), (_A2_Y, _A2_X), 4, 4,
      lambda y, x: (np.abs(x) < 1e18) & (np.abs(y) < 1e18) & (np.maximum(np.abs(x), np.abs(y)) > 1e-18)),
    U("tanh", np.tanh, lambda x: 1 / np.cosh(x) ** 2, (_mags(-30, 1.6),), 4, lambda x: 6 + 4 * np.abs(x),
      lambda x: np.abs(x) < 40),
    U("exp", np.exp, np.exp, (np.concatenate([np.linspace(-87, 88, 1500), _mags(-30, 0)]),), _exp_b, _exp_b),
    U("log", np.log, lambda x: 1 / x, (np.concatenate([np.logspace(-37, 38, 1500), _NEAR_ONE]),), 4, 2),
    U("sqrt", np.sqrt, lambda x: 0.5 / np.sqrt(x), (np.logspace(-37, 38, 1500),), 2, 4),
    U("rsqrt", lambda x: 1 / np.sqrt(x), lambda x: -0.5 * x ** -1.5, (np.logspace(-37, 38, 1500),), 2, 6,
      lambda x: (x > 1e-25) & (x < 1e25)),
    U("pow", np.power, (lambda x, y: y * np.power(x, y - 1), lambda x, y: np.power(x, y) * np.log(np.abs(x))),
      (_POW_X, _POW_Y), lambda x, y: 3 + 2 * np.abs(y * np.log2(np.abs(x))),
      lambda x, y: 6 + 2 * np.abs(y * np.log2(np.abs(x))) + 2 * np.abs(np.log2(np.abs(x))),
      lambda x, y: (x > 0) & (np.abs((y - 1) * np.log10(np.abs(x))) < 30)),   # x^(y-1) normal
    U("asinh", np.arcsinh, lambda x: 1 / np.sqrt(1 + x * x), (_mags(-30, 30),), 4, 4, lambda x: np.abs(x) < 1e18),
    U("acosh", np.arccosh, lambda x: 1 / np.sqrt(x * x - 1), (np.concatenate([1 + np.logspace(-7, 30, 1000), [1]]),), 4,
      4, lambda x: (x > 1) & (x < 1e18)),
    U("atanh", np.arctanh, lambda x: 1 / (1 - x * x), (np.concatenate([_mags(-30, -0.01), _EDGE]),), 4, 4),
    U("log1p", np.log1p, lambda x: 1 / (1 + x), (np.concatenate([_mags(-30, -0.01), np.logspace(-30, 30, 600)]),), 4, 2,
      lambda x: x < 1e30),
    U("expm1", np.expm1, np.exp, (np.concatenate([_mags(-30, 1.94), np.linspace(-87, 88, 500)]),),
      lambda x: np.where(np.abs(x) < 1, 4, _exp_b(x)), _exp_b),
]


def _ulp_err(got, want) -> np.ndarray:
    """|got - want| in float32 ulps of want (NaN where want is outside the normal range)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    a = np.abs(want)
    ok = (a == 0) | ((a >= TINY) & (a <= np.finfo(np.float32).max))
    ulp = np.spacing(np.maximum(a, TINY).astype(np.float32)).astype(np.float64)
    err = np.where(got == want, 0.0, np.abs(got - want) / ulp)
    return np.where(ok, err, np.nan)


def _check_ulps(what: str, xs, got, want, bound) -> float:
    err = _ulp_err(got, want)
    bound = np.broadcast_to(bound, err.shape)
    bad = np.nonzero(~np.isnan(err) & ~(err <= bound))[0]
    assert not len(bad), (f"{what}: {err[bad[:3]]} ulps (bound {bound[bad[:3]]}) at "
                          f"{[tuple(float(x[i]) for x in xs) for i in bad[:3]]}: got {got[bad[:3]]}, "
                          f"float64 says {want[bad[:3]]}")
    return float(np.nanmax(err))


@pytest.mark.parametrize("row", ULP_TABLE, ids=lambda r: r.name)
def test_ulps_of_every_transcendental_and_its_derivative(row: U):
    """Values and reverse-mode derivatives (seed 1: x.grad = f'(x)) on lavapipe against float64 at
    the float32 inputs, within the row's bound in ulps."""
    fn = getattr(ti, row.name) if row.name != "pow" else (lambda a, b: a ** b)
    xs = [f32(x) for x in row.xs]
    with np.errstate(all="ignore"):
        want = row.ref(*(x.astype(np.float64) for x in xs))
    keep = np.isfinite(want)
    xs = [x[keep] for x in xs]
    n = len(xs[0])
    a = ti.field(ti.f32, shape=n, needs_grad=True)
    b = ti.field(ti.f32, shape=n, needs_grad=True)
    y = ti.field(ti.f32, shape=n, needs_grad=True)

    if len(xs) == 1:
        @ti.kernel
        def apply():
            for i in a:
                y[i] = fn(a[i])
    else:
        @ti.kernel
        def apply():
            for i in a:
                y[i] = fn(a[i], b[i])

    a.from_numpy(xs[0])
    if len(xs) == 2:
        b.from_numpy(xs[1])
    apply()
    x64 = [x.astype(np.float64) for x in xs]
    with np.errstate(all="ignore"):
        want = row.ref(*x64)
        worst = _check_ulps(row.name, xs, y.to_numpy(), want, row.bound(row.ulps, x64))
        y.grad.fill(1.0)
        apply.grad()
        m = row.d_mask(*x64) if row.d_mask else np.ones(n, bool)
        ds = row.d if isinstance(row.d, tuple) else (row.d,)
        for k, (d, g) in enumerate(zip(ds, (a.grad, b.grad))):
            dwant = d(*x64)
            got = g.to_numpy()
            m_k = m & np.isfinite(dwant)
            worst_d = _check_ulps(f"d/d{'xy'[k] if len(ds) == 2 else 'x'} {row.name}", [x[m_k] for x in xs], got[m_k],
                                  dwant[m_k], np.broadcast_to(row.bound(row.d_ulps, x64), (n,))[m_k])
            print(f"{row.name}: value {worst:.2f} ulps, derivative {k} {worst_d:.2f} ulps")


def test_special_values_of_the_accurate_helpers():
    """tanh, log, atan and atan2 (helpers, not the built-ins): C's special values, as NumPy's."""
    inf, nan = np.inf, np.nan
    for name, xs in [("tanh", [inf, -inf, nan, 0.0, 20.0, -20.0]), ("log", [0.0, -1.0, inf, nan, 1.0]),
                     ("atan", [inf, -inf, nan, 0.0])]:
        case = M(name, None, getattr(np, {"atan": "arctan"}.get(name, name)), None, (), (), ())
        y, _ = _run(case, xs)
        with np.errstate(all="ignore"):
            np.testing.assert_array_equal(y, f32(case.ref(np.array(xs))), err_msg=f"{name} at {xs}")
    ys = f32([0.0, -0.0, 0.0, -0.0, inf, -inf, inf, 1.0, -1.0, nan, 1.0, 0.0])
    xs = f32([0.0, 0.0, -0.0, -0.0, -inf, inf, inf, 0.0, -0.0, 1.0, nan, -3.0])
    a, b, out = (ti.field(ti.f32, shape=len(xs)) for _ in range(3))

    @ti.kernel
    def apply():
        for i in a:
            out[i] = ti.atan2(a[i], b[i])

    a.from_numpy(ys)
    b.from_numpy(xs)
    apply()
    want = f32(np.arctan2(ys.astype(np.float64), xs.astype(np.float64)))
    np.testing.assert_array_equal(out.to_numpy(), want)
    np.testing.assert_array_equal(np.signbit(out.to_numpy()), np.signbit(want))  # +-0 and +-pi


SWIFTSHADER = "/usr/lib/chromium/libvk_swiftshader.so"  # Debian's chromium (CI installs it for the browser tests)
_ON_SWIFTSHADER = """
import sys, pytest, wgpu_ad
dev = str(wgpu_ad.get_runtime().adapter.info.get("device", ""))
assert "SwiftShader" in dev, f"the subprocess runs on {dev!r}, not SwiftShader"
wgpu_ad.reset()
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-k", "not swiftshader", sys.argv[1]]))
"""


def test_the_bounds_hold_on_swiftshaders_vulkan_driver_too(tmp_path):
    """This file's tests again on a second driver, SwiftShader's Vulkan (a CPU driver too, but one
    whose built-ins use WGSL's room: sin(1e-30) = 0, cos 17 ulps off near 0, log(0) = -88): the
    helpers of shaders/math.wgsl make the table hold there as well."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path
    if not Path(SWIFTSHADER).exists():
        pytest.skip(f"SwiftShader's Vulkan driver is not installed ({SWIFTSHADER}: Debian's chromium package)")
    icd = tmp_path / "swiftshader_icd.json"
    icd.write_text(json.dumps({"file_format_version": "1.0.0",
                               "ICD": {"library_path": SWIFTSHADER, "api_version": "1.0.5"}}))
    env = dict(os.environ, VK_ICD_FILENAMES=str(icd), WGPU_AD_OFFLINE_CACHE="0")
    r = subprocess.run([sys.executable, "-c", _ON_SWIFTSHADER, __file__], env=env, capture_output=True,
                       text=True, timeout=600, cwd=Path(__file__).parent)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert " passed" in r.stdout and " failed" not in r.stdout
