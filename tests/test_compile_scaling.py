"""The compiler's work grows linearly with the number of accesses (issue 25 item 5).

N stores to one field made the global data access checks (passes/autodiff/access.py) look at
every pair of them: 1,500 stores compiled in 79 s. These tests count the work (the pairs the
rules look at, the affine forms computed) for N and 4N accesses rather than timing it: on the
quadratic version the counts grow 16-fold. The timings are in benchmarks/compile_time.py
(`python -m benchmarks.compile_time --stores`).
"""
from __future__ import annotations

import linecache

import numpy as np
import pytest

import wgpu_ad as ti
from wgpu_ad.errors import NotDifferentiableError
from wgpu_ad.frontend.kernel import lower_kernel
from wgpu_ad.passes import optimize
from wgpu_ad.passes.autodiff import access
from wgpu_ad.passes.autodiff.access import check_global_access


def _kernel(body: list[str], names: dict, tag: str, threads: int = 1):
    """A Python function `k` with the given body lines inside `for i in range(threads)`, with a
    source the frontend can read."""
    src = f"def k():\n    for i in range({threads}):\n" + "".join(f"        {line}\n" for line in body)
    path = f"<generated {tag}>"
    linecache.cache[path] = (len(src), None, src.splitlines(True), path)
    ns = dict(names)
    exec(compile(src, path, "exec"), ns)
    return ns["k"]


def _counted(monkeypatch, fn) -> dict:
    """Run fn() counting the pair checks and affine forms of the access rules."""
    counts = {"pairs": 0, "affine": 0}

    def counting(name, key):
        real = getattr(access, name)

        def wrapper(*a, **kw):
            counts[key] += 1
            return real(*a, **kw)
        monkeypatch.setattr(access, name, wrapper)
    counting("_safe", "pairs")
    counting("_safe_writes", "pairs")
    counting("affine", "affine")
    fn()
    monkeypatch.undo()
    return counts


def _checked(fn) -> None:
    ir, _storages = lower_kernel(fn, "k", [], None, debug=False)
    check_global_access(optimize(ir))


PATTERNS = {
    # x[j] = y[j] * 2: stores to N distinct constant elements (an unrolled ti.static loop)
    "stores": lambda n: [f"x[{j}] = y[{j}] * 2.0" for j in range(n)],
    # x[j + 1] = x[j] * 2: a chain through one field; each store is read by the next statement
    "chain": lambda n: [f"x[{j + 1}] = x[{j}] * 2.0" for j in range(n)],
    # x[c, j] += y[j]: atomic adds, and stores to another column
    "rows": lambda n: [f"x2[0, {j}] += y[{j}]" if j % 2 else f"x2[1, {j}] = y[{j}]" for j in range(n)],
}


@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_access_checks_look_at_a_linear_number_of_pairs(monkeypatch, pattern):
    n = 150
    x = ti.field(ti.f32, shape=4 * n + 1)
    y = ti.field(ti.f32, shape=4 * n + 1)
    x2 = ti.field(ti.f32, shape=(2, 4 * n))
    names = {"x": x, "y": y, "x2": x2}
    small = _counted(monkeypatch, lambda: _checked(_kernel(PATTERNS[pattern](n), names, f"{pattern} {n}")))
    large = _counted(monkeypatch, lambda: _checked(_kernel(PATTERNS[pattern](4 * n), names, f"{pattern} {4 * n}")))
    assert small["affine"] >= n  # (the counters see the analysis)
    # linear: 4x the accesses, about 4x the work (quadratic: 16x; 150 stores were 11,175 pairs)
    assert large["affine"] <= 4.5 * small["affine"], (small, large)
    assert large["pairs"] <= 4.5 * small["pairs"] + 8, (small, large)
    assert large["pairs"] <= 4 * n + 8, (small, large)


def test_a_store_that_meets_another_among_many_is_still_refused():
    # the pairs left out are only those provably apart: the one pair that meets is still found
    n = 300
    x = ti.field(ti.f32, shape=(5, n))
    y = ti.field(ti.f32, shape=n)
    body = [f"x[i, {j}] = y[{j}] * 2.0" for j in range(n)] + ["x[i + 1, 7] = 1.0"]
    with pytest.raises(NotDifferentiableError) as e:
        _checked(_kernel(body, {"x": x, "y": y}, "meets", threads=4))
    assert "it writes field 'x' (line 10) and writes the same elements again (line 303)" in str(e.value)
    body = [f"x[i, {j}] = y[{j}] * 2.0" for j in range(n - 1)] + ["y[5] = x[i, 4] + y[150]"]
    with pytest.raises(NotDifferentiableError) as e:
        _checked(_kernel(body, {"x": x, "y": y}, "read then written"))
    assert "it reads field 'y' (line 8) and then overwrites what it read (line 302)" in str(e.value)


def test_the_access_checks_run_only_for_kernels_a_gradient_may_be_asked_of(monkeypatch):
    calls = []
    real = access.check_global_access
    monkeypatch.setattr(access, "check_global_access", lambda *a, **kw: calls.append(a[0].name) or real(*a, **kw))
    ti.init(offline_cache=False)
    x = ti.field(ti.f32, shape=8)
    y = ti.field(ti.f32, shape=8)

    @ti.kernel
    def double():
        for i in x:
            y[i] = 2.0 * x[i]

    x.fill(1.0)
    double()
    assert y.to_numpy()[3] == 2.0 and calls == []  # nothing has a gradient: never analysed

    a = ti.field(ti.f32, shape=8, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def total():
        for i in a:
            loss[None] += a[i] * a[i]

    a.fill(3.0)
    double()  # something has a gradient now, but nothing double reads does and no tape is open
    assert calls == []
    with ti.ad.Tape(loss=loss):
        total()
    assert "total" in calls and "double" not in calls
    np.testing.assert_allclose(a.grad.to_numpy(), 6.0)
