"""Shared helpers of the reverse-mode tests: independent float64 references and a float32-aware
comparison. Nothing here calls wgpu_ad, so a reference can never come from the code under test."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

H = 1e-6  # float64 central-difference step: truncation ~h^2, rounding ~1e-16/h, both << float32 noise


def central_diff(f: Callable[[np.ndarray], float], x0: np.ndarray, h: float = H) -> np.ndarray:
    """d f / d x0 of a scalar NumPy function, by float64 central differences, one element at a time."""
    x0 = np.asarray(x0, dtype=np.float64)
    g = np.zeros_like(x0)
    for k in np.ndindex(x0.shape):
        xp, xm = x0.copy(), x0.copy()
        xp[k] += h
        xm[k] -= h
        g[k] = (f(xp) - f(xm)) / (2 * h)
    return g


def central_diffs(f: Callable[..., float], inputs: Sequence[np.ndarray], h: float = H) -> list[np.ndarray]:
    """The gradient of scalar f(*inputs) with respect to each input (float64 central differences)."""
    xs = [np.asarray(x, dtype=np.float64) for x in inputs]
    out = []
    for k in range(len(xs)):
        def fk(v, k=k):
            return f(*(v if j == k else xs[j] for j in range(len(xs))))
        out.append(central_diff(fk, xs[k], h))
    return out


def assert_grad(got, ref, rtol: float = 1e-4, what: str = "gradient") -> None:
    """Elementwise |got - ref| <= rtol * (|ref| + max|ref|): float32 relative error at the
    gradient's scale (an element near zero is judged against the largest one)."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, expected {ref.shape}"
    scale = float(np.abs(ref).max()) if ref.size else 0.0
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol * max(scale, 1e-6), err_msg=what)


def f32(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32)
