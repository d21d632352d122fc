"""The random programs of fuzz_gen.py really contain what its docstring claims (counted over the
seeds CI runs, so that a change to the generator cannot silently stop generating a feature), and
the float64 reference of fuzz_shim.py gives gradients stopped on purpose (ti.stop_grad,
@ti.ad.no_grad) and checkpointed steps their meaning: checked on small programs against
derivatives worked out by hand. No GPU: nothing here runs wgpu_ad."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

from fuzz_gen import Program, generate

CI_SEEDS = range(100)   # tests/test_fuzz.py's default WGPU_AD_FUZZ_EXAMPLES

_NO_GRAD_HEAD = r"^ {4}@ti\.ad\.no_grad\n {4}@ti\.kernel\n {4}def .*\n"
_NO_GRAD_BODY = _NO_GRAD_HEAD + r"(?: {8}.*\n)*?"   # up to a line of its body
_STORE = r"(?:[abvmwMq]|n[av]|[TGRP]\d+)\[[^\n=]*\](?:\[[^\]\n]*\])? (?:=|\*=) "   # x[..] = or x[..][r, c] = (a field)

# feature -> a pattern of the program's source
FEATURES = {
    "ti.stop_grad(value)": r"ti\.stop_grad\((?![A-Za-z]\w*\)$)",
    "ti.stop_grad(field) in a loop": r"^ {12}ti\.stop_grad\([A-Za-z]\w*\)$",
    "@ti.ad.no_grad kernel": r"^ {4}@ti\.ad\.no_grad$",
    # a store (not an accumulation) to a field in a no_grad kernel; and one under an `if`
    "@ti.ad.no_grad kernel that overwrites": _NO_GRAD_BODY + r" {8,}" + _STORE,
    "@ti.ad.no_grad kernel that overwrites some elements": _NO_GRAD_BODY + r" {12}if [^\n]*:\n {16}" + _STORE,
    # ... and reads a field it stores (the first one) in a condition
    "@ti.ad.no_grad kernel with a condition on what it overwrites":
        _NO_GRAD_HEAD + r"(?=(?: {8}.*\n)*? {8,}(\w+)\[[^\n=]*\](?:\[[^\]\n]*\])? = )"
        r"(?: {8}.*\n)*? {8,}(?:if|elif|while) [^\n]*\b\1\[",
    "ti.ad.checkpoint": r"\(ti\.ad\.checkpoint, \(step\d+, [23], \[",
    "while loop": r"^\s+while \w+ < ",
    "while loop with a condition on data": r"^\s+while \w+ < \S+ and ",
    "ndarray argument": r"\w+: ti\.types\.ndarray\(\)",
    "kernel returning a value": r"-> ti\.f32:$",
    "float scalar argument": r"\bc0: ti\.f32\b",
    "template argument": r"\w+: ti\.template\(\)",
}
# how many of the 100 programs must have each (about half of what the generator gives today)
AT_LEAST = {"ti.stop_grad(value)": 15, "ti.stop_grad(field) in a loop": 15, "@ti.ad.no_grad kernel": 10,
            "@ti.ad.no_grad kernel that overwrites": 6, "@ti.ad.no_grad kernel that overwrites some elements": 4,
            "@ti.ad.no_grad kernel with a condition on what it overwrites": 1,
            "ti.ad.checkpoint": 8, "while loop": 8, "while loop with a condition on data": 5,
            "ndarray argument": 20, "kernel returning a value": 4, "float scalar argument": 20,
            "template argument": 25}


def test_every_feature_is_generated_in_ci_seeds():
    sources = [generate(s).source for s in CI_SEEDS]
    counts = {name: sum(bool(re.search(p, src, re.M)) for src in sources) for name, p in FEATURES.items()}
    low = {name: (c, AT_LEAST[name]) for name, c in counts.items() if c < AT_LEAST[name]}
    assert not low, f"features generated too rarely in seeds 0-99 (count, needed): {low}"


def test_generation_is_deterministic():
    assert generate(7).source == generate(7).source


# ---- the reference's meaning of what stops a gradient --------------------------------------------

def _shim_grads(source: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from test_fuzz import Shim   # test_fuzz's float64 central differences (imports wgpu_ad, runs no GPU)
    prog = Program.from_source(source)
    full = {k: np.asarray(v, np.float64) for k, v in inputs.items()}
    full.setdefault("loss", np.zeros(()))
    return Shim(prog).grads(full)


X0 = np.array([0.3, -0.5, 0.8])

STOP_VALUE = """
def build(ti):
    x = ti.field(dtype=ti.f32, shape=3, needs_grad=True)
    loss = ti.field(dtype=ti.f32, shape=(), needs_grad=True)
    @ti.kernel
    def k1():
        for i in range(3):
            acc = x[i]
            for k in range(2):
                acc = ti.stop_grad(acc) * acc   # d acc_k / d acc_(k-1) = acc_(k-1), not 2 acc_(k-1)
            loss[None] += ti.sin(acc) + ti.stop_grad(x[i] * x[i]) * x[i]
    return {'x': x, 'loss': loss}, [(k1, ())]
"""


def test_shim_holds_a_stopped_value_fixed():
    g = _shim_grads(STOP_VALUE, {"x": X0})["x"]
    a1 = X0 * X0
    a2 = a1 * a1
    # d a2 / d x = a1 * d a1 / d x = a1 * x
    want = np.cos(a2) * a1 * X0 + X0 * X0
    np.testing.assert_allclose(g, want, rtol=1e-6, atol=1e-8)


STOP_FIELD = """
def build(ti):
    x = ti.field(dtype=ti.f32, shape=3, needs_grad=True)
    y = ti.field(dtype=ti.f32, shape=3, needs_grad=True)
    loss = ti.field(dtype=ti.f32, shape=(), needs_grad=True)
    @ti.kernel
    def k1():
        for i in range(3):
            y[i] = ti.sin(x[i])
    @ti.kernel
    def k2():
        for i in range(3):
            ti.stop_grad(y)
            loss[None] += x[i] * y[i] + y[(i + 1) % 3] ** 2
    return {'x': x, 'y': y, 'loss': loss}, [(k1, ()), (k2, ())]
"""


def test_shim_reads_a_stopped_field_as_it_was_at_the_launch():
    grads = _shim_grads(STOP_FIELD, {"x": X0, "y": np.zeros(3)})
    np.testing.assert_allclose(grads["x"], np.sin(X0), rtol=1e-6, atol=1e-8)   # through x only
    np.testing.assert_allclose(grads["y"], np.zeros(3), atol=1e-8)             # k1 overwrites y


NO_GRAD = """
def build(ti):
    x = ti.field(dtype=ti.f32, shape=3, needs_grad=True)
    y = ti.field(dtype=ti.f32, shape=3, needs_grad=True)
    loss = ti.field(dtype=ti.f32, shape=(), needs_grad=True)
    @ti.ad.no_grad
    @ti.kernel
    def k1():
        for i in range(3):
            y[i] += x[i] ** 2
    @ti.kernel
    def k2():
        for i in range(3):
            loss[None] += 2.0 * y[i] + x[i] * y[i]
    return {'x': x, 'y': y, 'loss': loss}, [(k1, ()), (k2, ())]
"""


def test_shim_gives_a_no_grad_kernel_no_backward():
    y0 = np.array([0.1, 0.2, -0.4])
    grads = _shim_grads(NO_GRAD, {"x": X0, "y": y0})
    y1 = y0 + X0 ** 2
    # k1 adds a constant offset: x only through k2's x[i]; y's gradient passes k1 unchanged
    np.testing.assert_allclose(grads["x"], y1, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(grads["y"], 2.0 + X0, rtol=1e-6, atol=1e-8)


NO_GRAD_OVERWRITES = """
def build(ti):
    x = ti.field(dtype=ti.f32, shape=3, needs_grad=True)
    y = ti.field(dtype=ti.f32, shape=3, needs_grad=True)
    u = ti.Vector.field(2, dtype=ti.f32, shape=3, needs_grad=True)
    g = ti.field(dtype=ti.f32, shape=(), needs_grad=True)
    loss = ti.field(dtype=ti.f32, shape=(), needs_grad=True)
    @ti.kernel
    def k1():
        for i in range(3):
            u[i] = ti.Vector([x[i], 2.0 * x[i]]) + u[i]
    @ti.ad.no_grad
    @ti.kernel
    def k2():
        g[None] = 3.0 * g[None]
        g[None] += x[0]
        for i in range(3):
            if i != 1:
                y[i] = 0.5 * y[i] + x[i]
            else:
                y[i] = y[i] + x[i] * x[i]
            u[i][1] = u[i][0] * x[i]
    @ti.kernel
    def k3():
        for i in range(3):
            loss[None] += y[i] * x[i] + u[i][0] * u[i][1] + g[None] * x[i]
    return {'x': x, 'y': y, 'u': u, 'g': g, 'loss': loss}, [(k1, ()), (k2, ()), (k3, ())]
"""


def test_shim_holds_what_a_no_grad_kernel_overwrites_and_passes_what_it_adds_to():
    """k2 overwrites g (then adds to it: the final value is held all the same), y[0] and y[2],
    and entry 1 of each u[i]; it adds to y[1] (`y[1] = y[1] + c`) and keeps entry 0 of u[i]."""
    y0, g0 = np.array([0.1, 0.2, -0.4]), np.array(0.7)
    u0 = np.array([[0.2, -0.1], [0.5, 0.3], [-0.6, 0.4]])
    grads = _shim_grads(NO_GRAD_OVERWRITES, {"x": X0, "y": y0, "u": u0, "g": g0})
    # the values after k2, which k3 reads
    gA = 3.0 * g0 + X0[0]
    yA = np.array([0.5 * y0[0] + X0[0], y0[1] + X0[1] ** 2, 0.5 * y0[2] + X0[2]])
    uA0 = X0 + u0[:, 0]
    uA1 = uA0 * X0
    # loss = sum_i yA_i x_i + uA0_i uA1_i + gA x_i, with gA, yA_0, yA_2, uA1 held and
    # yA_1 = y0_1 + c, uA0 = x + u0_0
    np.testing.assert_allclose(grads["x"], yA + uA1 + gA, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(grads["y"], [0.0, X0[1], 0.0], rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(grads["u"], np.stack([uA1, np.zeros(3)], axis=1), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(grads["g"], 0.0, atol=1e-8)


CHECKPOINT = """
def build(ti):
    x = ti.field(dtype=ti.f32, shape=3, needs_grad=True)
    loss = ti.field(dtype=ti.f32, shape=(), needs_grad=True)
    @ti.kernel
    def k1():
        for i in range(3):
            x[i] = ti.sin(x[i])
            loss[None] += ti.stop_grad(x[i]) * x[i]
    def step1(t):
        k1(*())
    return {'x': x, 'loss': loss}, [(ti.ad.checkpoint, (step1, 2, [x], None, 'bisect'))]
"""


def test_shim_runs_a_checkpoint_step_by_step():
    g = _shim_grads(CHECKPOINT, {"x": X0})["x"]
    s1, s2 = np.sin(X0), np.sin(np.sin(X0))
    # loss = c1 * s1 + c2 * s2 with c1, c2 held: c1 = s1, c2 = s2
    want = s1 * np.cos(X0) + s2 * np.cos(s1) * np.cos(X0)
    np.testing.assert_allclose(g, want, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("source", [STOP_VALUE, NO_GRAD])
def test_the_unperturbed_shim_runs_stopped_code_as_plain_code(source):
    """Outside central differences ti.stop_grad is the identity and a no_grad kernel runs."""
    import fuzz_shim
    assert fuzz_shim.stops.mode == "off"
    fields, launches = fuzz_shim.run_module(source)["build"](fuzz_shim)
    fields["x"].from_numpy(X0)
    for k, args in launches:
        k(*args)
    if source is NO_GRAD:
        np.testing.assert_allclose(fields["y"].to_numpy(), X0 ** 2)  # y starts at 0
    else:
        a2 = (X0 * X0) ** 2
        assert math.isclose(fields["loss"][None], float(np.sum(np.sin(a2) + X0 ** 3)), rel_tol=1e-12)


@pytest.mark.parametrize("stopped", [True, False])
def test_a_stopped_value_tied_with_itself_is_a_kink(stopped):
    """ti.max(ti.stop_grad(x), x): central differences hold one side and move the other, so they
    see the kink from both sides (half the slope; fuzz seed 1873): the shim reports a margin of 0,
    and the test redraws the inputs. ti.max(x, x) stays a tie when x moves: no kink."""
    import fuzz_shim
    left = "ti.stop_grad(x[i])" if stopped else "x[i]"
    source = f"""
def build(ti):
    x = ti.field(dtype=ti.f32, shape=3, needs_grad=True)
    loss = ti.field(dtype=ti.f32, shape=(), needs_grad=True)
    @ti.kernel
    def k1():
        for i in range(3):
            loss[None] += ti.max({left}, x[i])
    return {{'x': x, 'loss': loss}}, [(k1, ())]
"""
    fields, launches = fuzz_shim.run_module(source)["build"](fuzz_shim)
    fields["x"].from_numpy(X0)
    fuzz_shim.reset_margin()
    for k, args in launches:
        k(*args)
    assert fuzz_shim.margin() == (0.0 if stopped else math.inf)
