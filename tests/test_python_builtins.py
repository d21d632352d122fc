"""Python's own sum(), max() and min() over lists of kernel values, and expressions too long for
Python's recursion limit. References are analytic derivatives and float64 NumPy."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import wgpu_ad as ti
from ad_util import assert_grad, f32

pytestmark = pytest.mark.gpu


def test_sum_over_a_list_of_kernel_values_and_its_gradient():
    """sum([x, x * x, 2.0, sin(x)]) = x + x^2 + 2 + sin x, whose derivative is 1 + 2x + cos x;
    sum(..., start) adds the start first, as Python does."""
    x0 = np.array([-1.3, 0.2, 0.7, 2.5])
    x = ti.field(ti.f32, shape=4, needs_grad=True)
    y = ti.field(ti.f32, shape=4, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    x.from_numpy(f32(x0))

    @ti.kernel
    def f():
        for i in x:
            a = x[i]
            y[i] = sum([a, a * a, 2.0, ti.sin(a)]) + sum((a, a), a * 3.0)
            loss[None] += y[i]

    with ti.ad.Tape(loss=loss):
        f()
    np.testing.assert_allclose(y.to_numpy(), x0 + x0 ** 2 + 2 + np.sin(x0) + 5 * x0, rtol=1e-6)
    assert_grad(x.grad.to_numpy(), 1 + 2 * x0 + np.cos(x0) + 5, rtol=1e-5)


def test_sum_of_vectors_of_comparisons_and_of_python_values():
    v = ti.Vector.field(3, ti.f32, shape=2)
    out = ti.field(ti.f32, shape=3)
    count = ti.field(ti.i32, shape=2)
    w = ti.Vector.field(3, ti.f32, shape=())
    v.from_numpy(f32([[1.0, 2.0, 3.0], [0.5, -4.0, 8.0]]))

    @ti.kernel
    def k():
        for i in range(1):
            out[0] = sum(v[0])                     # the entries of a vector
            out[1] = sum([1.0, 2.0, 3.5])          # Python values: evaluated when compiling
            out[2] = sum([v[0][0], 2], start=v[1][2])
            w[None] = sum([v[0], v[1]])            # vectors add up to a vector
        for i in range(2):
            count[i] = sum([v[i][0] > 0.7, v[i][1] > 0.0, v[i][2] > 2.5])  # True counts 1, as in Python

    k()
    assert out.to_numpy().tolist() == [6.0, 6.5, 11.0]
    assert w.to_numpy().tolist() == [1.5, -2.0, 11.0]
    assert count.to_numpy().tolist() == [3, 1]


def test_max_and_min_over_a_list_of_kernel_values():
    x = ti.field(ti.f32, shape=3)
    out = ti.field(ti.f32, shape=2)
    x.from_numpy(f32([1.0, 5.0, -3.0]))

    @ti.kernel
    def k():
        for i in range(1):
            out[0] = max([x[0], x[1], x[2]])
            out[1] = min((x[0], x[1], x[2]))

    k()
    assert out.to_numpy().tolist() == [5.0, -3.0]


def _kernel_module(tmp_path, name: str, body: str):
    """A module of generated kernel source, as a file (kernels must be defined in a file)."""
    path = tmp_path / f"{name}.py"
    path.write_text(body)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_an_expression_of_a_thousand_terms_compiles(tmp_path):
    """x[i] = a0 + a1 * 1 + ... over 1000 terms nests 1000 deep in Python's AST: it compiles (it
    was a RecursionError at 327 terms) and its value and gradient are right."""
    n = 1000
    terms = " + ".join(f"a * {k % 7 + 1}.0" for k in range(n))
    mod = _kernel_module(tmp_path, "long_sum", f"""
import wgpu_ad as ti
x = ti.field(ti.f32, shape=2, needs_grad=True)
y = ti.field(ti.f32, shape=2, needs_grad=True)

@ti.kernel
def long_sum():
    for i in x:
        a = x[i]
        y[i] = {terms}
""")
    coef = float(sum(k % 7 + 1 for k in range(n)))  # 3997: the derivative
    mod.x.from_numpy(f32([0.25, -2.0]))
    mod.long_sum()
    np.testing.assert_allclose(mod.y.to_numpy(), coef * np.array([0.25, -2.0]), rtol=1e-5)
    mod.y.grad.fill(1.0)
    mod.long_sum.grad()
    np.testing.assert_allclose(mod.x.grad.to_numpy(), [coef, coef], rtol=1e-6)
