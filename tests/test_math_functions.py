"""ti.math.asinh, acosh, atanh, log1p and expm1 (also ti.asinh ...): values over their domains
against float64 NumPy, relative accuracy near 0 (acosh: near 1), where the textbook formulas lose
most digits in float32, the edges (inf, NaN), and their derivatives in both modes against the
analytic derivative and float64 central differences.

Tolerances are float32's: 2^-23 = 1.2e-7 is one unit in the last place at 1. The values are
within a few of those (measured on lavapipe: at most 4.1 ulps); expm1 beyond |x| = 0.35 is
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
    # 8 ulps; expm1 as exp(x) - 1 (|x| >= 0.35) may also have exp's error, 3 + 2|x| ulps by WGSL
    tol = 8 * ULP + (np.where(np.abs(x64) >= 0.35, (3 + 2 * np.abs(x64)) * ULP, 0) if case.op is Op.EXPM1 else 0)
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
