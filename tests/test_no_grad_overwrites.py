"""@ti.ad.no_grad: nothing flows back through what the kernel writes (docs/autodiff.md). Its
backward pass was skipped, so the gradient of an element it overwrote, which later kernels gave,
stayed and went to whatever wrote that element before (Taichi does the same): a silently wrong
gradient. It now sets those gradients to 0 (passes/autodiff/overwritten.py); an accumulation
keeps the old value, whose gradient passes through. References are analytic.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import wgpu_ad as ti

N = 4


@pytest.fixture(autouse=True)
def fresh():
    ti.init(offline_cache=False)
    yield
    ti.reset()


def _fields():
    x = ti.field(ti.f32, shape=N, needs_grad=True)
    y = ti.field(ti.f32, shape=N, needs_grad=True)
    L = ti.field(ti.f32, shape=(), needs_grad=True)
    x.from_numpy(np.array([1.0, -2.0, 0.5, 3.0], np.float32))
    return x, y, L


def _program(x, y, L):
    @ti.kernel
    def double():
        for i in x:
            y[i] = 2.0 * x[i]

    @ti.kernel
    def squares():
        for i in y:
            L[None] += y[i] * y[i]
    return double, squares


def test_an_overwrite_by_a_no_grad_kernel_stops_the_gradient_of_the_old_value():
    x, y, L = _fields()
    double, squares = _program(x, y, L)

    @ti.ad.no_grad
    @ti.kernel
    def pin_first():
        y[0] = 5.0            # overwrites y[0]: what double wrote there is gone

    with ti.ad.Tape(loss=L):
        double()
        pin_first()
        squares()
    xs = x.to_numpy().astype(np.float64)
    # L = 25 + sum_{i >= 1} (2 x_i)^2: dL/dx_0 = 0 (it was 2 * 2 * 5 * ... through y[0]: 40), dL/dx_i = 8 x_i
    want = 8 * xs
    want[0] = 0.0
    np.testing.assert_allclose(x.grad.to_numpy(), want, rtol=1e-6)
    assert L[None] == pytest.approx(25 + (4 * xs[1:] ** 2).sum(), rel=1e-6)


def test_an_accumulation_by_a_no_grad_kernel_passes_the_gradient_through():
    x, y, L = _fields()
    double, squares = _program(x, y, L)

    @ti.ad.no_grad
    @ti.kernel
    def nudge():
        for i in y:
            y[i] += 0.25 * x[i]  # no gradient flows into x from here; y's old value keeps its own

    with ti.ad.Tape(loss=L):
        double()
        nudge()
        squares()
    xs = x.to_numpy().astype(np.float64)
    # y = 2x + c (c constant): dL/dx = 2 y 2 = 4 (2.25 x)
    np.testing.assert_allclose(x.grad.to_numpy(), 4 * 2.25 * xs, rtol=1e-6)


def test_a_no_grad_function_and_kernel_grad_by_hand_zero_what_they_overwrite():
    x, y, L = _fields()
    double, squares = _program(x, y, L)

    @ti.kernel
    def reset_tail(v: ti.f32):
        for i in range(2, N):
            y[i] = v

    @ti.ad.no_grad
    def reset(v):
        reset_tail(v)

    with ti.ad.Tape(loss=L):
        double()
        reset(1.0)
        squares()
    xs = x.to_numpy().astype(np.float64)
    np.testing.assert_allclose(x.grad.to_numpy(), [8 * xs[0], 8 * xs[1], 0.0, 0.0], rtol=1e-6)

    @ti.ad.no_grad
    @ti.kernel
    def clear():
        for i in y:
            y[i] = 0.0

    y.grad.fill(3.0)
    clear()
    clear.grad()
    np.testing.assert_array_equal(y.grad.to_numpy(), 0.0)


def test_in_a_checkpointed_step_too():
    x = ti.field(ti.f32, shape=N, needs_grad=True)
    s = ti.field(ti.f32, shape=N, needs_grad=True)
    L = ti.field(ti.f32, shape=(), needs_grad=True)
    x.from_numpy(np.array([1.0, -2.0, 0.5, 3.0], np.float32))

    @ti.kernel
    def grow():
        for i in s:
            s[i] = s[i] * 1.5 + x[i]

    @ti.ad.no_grad
    @ti.kernel
    def cap_last():
        s[N - 1] = 1.0

    @ti.kernel
    def total():
        for i in s:
            L[None] += s[i]

    def step(t):
        grow()
        cap_last()

    with ti.ad.Tape(loss=L):
        ti.ad.checkpoint(step, 3, state=[s])
        total()
    # s_i after 3 steps (i < N - 1) = x_i (1 + 1.5 + 1.5^2): dL/dx_i = 4.75; the last element is
    # overwritten by cap_last at every step: 0
    np.testing.assert_allclose(x.grad.to_numpy(), [4.75, 4.75, 4.75, 0.0], rtol=1e-6)


def test_indices_it_cannot_recompute_are_said_not_guessed():
    x, y, L = _fields()
    double, squares = _program(x, y, L)

    @ti.ad.no_grad
    @ti.kernel
    def scramble():
        y[int(ti.random() * N) % N] = 0.0

    with pytest.warns(ti.ad.GradientWarning) as w:
        with ti.ad.Tape(loss=L):
            double()
            scramble()
            squares()
    said = [str(m.message) for m in w if "no_grad" in str(m.message)]
    assert said == ["@ti.ad.no_grad kernel 'scramble' overwrites elements of fields with gradients, and which "
                    "elements it overwrites depends on a random number or on the value an atomic returned: their "
                    "gradients are left as the later kernels made them (whatever wrote those elements before gets "
                    "them). Write those fields in a kernel without @ti.ad.no_grad, or compute the indices from "
                    "fields"]


def test_in_forward_mode_what_it_overwrites_has_no_tangent():
    x = ti.field(ti.f32, shape=N, needs_dual=True)
    y = ti.field(ti.f32, shape=N, needs_dual=True)
    L = ti.field(ti.f32, shape=(), needs_dual=True)
    x.from_numpy(np.array([1.0, -2.0, 0.5, 3.0], np.float32))

    @ti.kernel
    def double():
        for i in x:
            y[i] = 2.0 * x[i]

    @ti.ad.no_grad
    @ti.kernel
    def pin_first():
        y[0] = 5.0

    @ti.kernel
    def squares():
        for i in y:
            L[None] += y[i] * y[i]

    seed = [1.0, 1.0, 1.0, 1.0]
    with ti.ad.FwdMode(loss=L, param=x, seed=seed):
        double()
        pin_first()
        squares()
    xs = x.to_numpy().astype(np.float64)
    # dL = sum_{i >= 1} 8 x_i dx_i (y[0] = 5 is a constant): it was 2 y_0 * 2 = 20 more
    assert L.dual[None] == pytest.approx((8 * xs[1:]).sum(), rel=1e-6)


def test_stop_grad_of_a_field_the_kernel_overwrites_stops_the_old_values_gradient_too():
    """ti.stop_grad(y) in a kernel that stores to y: nothing flows from the new values, and the
    old ones are gone: their gradient is 0 (it was passed on to what wrote them: 2 instead of 0),
    in reverse and in forward mode."""
    x = ti.field(ti.f32, shape=(), needs_grad=True, needs_dual=True)
    y = ti.field(ti.f32, shape=(), needs_grad=True, needs_dual=True)
    L = ti.field(ti.f32, shape=(), needs_grad=True, needs_dual=True)

    @ti.kernel
    def double():
        y[None] = 2.0 * x[None]

    @ti.kernel
    def replace():
        ti.stop_grad(y)
        y[None] = 3.0 * x[None]

    @ti.kernel
    def copy():
        L[None] = y[None]

    x[None] = 1.0
    with ti.ad.Tape(loss=L):
        double()
        replace()
        copy()
    assert L[None] == 3.0 and x.grad[None] == 0.0  # L = 3x with the 3x stopped: dL/dx = 0
    with ti.ad.FwdMode(loss=L, param=x):
        double()
        replace()
        copy()
    assert L.dual[None] == 0.0


def test_accumulations_in_serial_code_and_with_a_template_and_a_kernel_scope_sum_pass_through():
    """`y[0] = y[0] + c` is an accumulation too, as `y[0] += c` is. A kernel-scope sum's scratch gradient is the launch's own: the zeroing kernel
    named it by position and zeroed the template argument's gradient instead (the fuzzer's seed 32)."""
    x, y, L = _fields()
    double, squares = _program(x, y, L)
    w = ti.field(ti.f32, shape=(), needs_grad=True)
    w[None] = 0.5

    @ti.ad.no_grad
    @ti.kernel
    def bump(t: ti.template()):
        s = 0.0
        for i in x:
            s += w[None]
            t[i] += 0.5
        t[0] = t[0] + 2.0  # (the same as t[0] += 2.0)
        L[None] += s

    with ti.ad.Tape(loss=L):
        double()
        bump(y)
        squares()
    xs = x.to_numpy().astype(np.float64)
    ys = 2 * xs + 0.5
    ys[0] += 2.0
    np.testing.assert_allclose(x.grad.to_numpy(), 4 * ys, rtol=1e-6)  # dL/dx = 2 y * 2
    assert w.grad[None] == 0.0


def _flip_program():
    x = ti.field(ti.f32, shape=2, needs_grad=True, needs_dual=True)
    y = ti.field(ti.f32, shape=2, needs_grad=True, needs_dual=True)
    z = ti.field(ti.f32, shape=2, needs_grad=True, needs_dual=True)
    L = ti.field(ti.f32, shape=(), needs_grad=True, needs_dual=True)
    x.from_numpy(np.array([0.5, -0.3], np.float32))

    @ti.kernel
    def double():
        for i in x:
            y[i] = 2.0 * x[i]
            z[i] = 3.0 * x[i]

    @ti.ad.no_grad
    @ti.kernel
    def flip():
        for i in y:
            if y[i] > 0:          # reads what it overwrites: after the launch y[0] is -1, not 1
                y[i] = -y[i]

    @ti.ad.no_grad
    @ti.kernel
    def negate_then_clear():
        for i in y:
            y[i] = -y[i]
            if y[i] > 0:          # reads what it wrote itself
                z[i] = 0.0

    @ti.kernel
    def total():
        for i in y:
            L[None] += 3.0 * y[i] + z[i]
    return x, L, double, flip, negate_then_clear, total


@pytest.mark.parametrize("mode", ["reverse", "forward"])
def test_which_elements_it_overwrote_is_decided_by_the_values_it_read_not_by_what_it_left(mode):
    """The backward pass finds the elements a no_grad launch overwrote by running its control flow
    again, from copies of what it overwrites taken before the launch: from the fields as the
    launch left them, `if y[i] > 0: y[i] = -y[i]` found no element overwritten (y[0] was 1, is -1)
    and the gradient of y[0] went on to x[0]; and `y[i] = -y[i]; if y[i] > 0: z[i] = 0` cleared
    the other element's. flip runs twice: only its first launch overwrites y[0]."""
    x, L, double, flip, negate_then_clear, total = _flip_program()
    runs = [(double, flip, flip, total), (double, negate_then_clear, total)]
    # L = 3 y + z with y = 2x, z = 3x, except what the no_grad kernels overwrote (a constant):
    # y[0] (flip): dL/dx = [3, 3 * 2 + 3]; all of y, and z[1] (y[1] becomes 0.6): dL/dx = [3, 0]
    want = [np.array([3.0, 9.0]), np.array([3.0, 0.0])]
    for launches, w in zip(runs, want):
        if mode == "reverse":
            with ti.ad.Tape(loss=L):
                for k in launches:
                    k()
            np.testing.assert_allclose(x.grad.to_numpy(), w, rtol=1e-6)
        else:
            with ti.ad.FwdMode(loss=L, param=x, seed=[1.0, 1.0]):
                for k in launches:
                    k()
            assert L.dual[None] == pytest.approx(w.sum(), rel=1e-6)


@pytest.mark.parametrize("checkpointed", [False, True])
def test_which_elements_it_overwrote_in_each_of_several_steps(checkpointed):
    """flip overwrites s[0] in the second of three steps only, from a value it reads and
    overwrites; in a checkpointed step the copies are kept while the step is recorded again."""
    x = ti.field(ti.f32, shape=2, needs_grad=True)
    s = ti.field(ti.f32, shape=2, needs_grad=True)
    L = ti.field(ti.f32, shape=(), needs_grad=True)
    x.from_numpy(np.array([0.5, -0.3], np.float32))

    @ti.kernel
    def grow():
        for i in s:
            s[i] = s[i] * 1.5 + x[i]

    @ti.ad.no_grad
    @ti.kernel
    def flip():
        for i in s:
            if s[i] > 0.6:
                s[i] = -s[i]

    @ti.kernel
    def total():
        for i in s:
            L[None] += s[i]

    def step(t):
        grow()
        flip()

    with ti.ad.Tape(loss=L):
        if checkpointed:
            ti.ad.checkpoint(step, 3, state=[s])
        else:
            for t in range(3):
                step(t)
        total()
    # s[0]: 0.5, 1.25 -> -1.25 (a constant), -1.375: dL/dx_0 = 1 (the last step's x_0);
    # s[1] = x_1 (1 + 1.5 + 1.5^2) never flips: 4.75
    np.testing.assert_allclose(s.to_numpy(), [-1.375, -0.3 * 4.75], rtol=1e-6)
    np.testing.assert_allclose(x.grad.to_numpy(), [1.0, 4.75], rtol=1e-6)


@pytest.mark.parametrize("mode", ["reverse", "forward"])
def test_a_no_grad_kernel_returning_a_kernel_scope_sum_still_zeroes_what_it_overwrites(mode):
    """Its zeroing kernel kept the return statement, which reads the sum's scratch buffer: it was
    refused ('depends on a kernel-scope sum', a GradientWarning) and T's old gradient passed on to
    whatever wrote T before (the fuzzer's seed 86)."""
    a = ti.field(ti.f32, shape=3, needs_grad=True, needs_dual=True)
    T = ti.field(ti.f32, shape=3, needs_grad=True, needs_dual=True)
    L = ti.field(ti.f32, shape=(), needs_grad=True, needs_dual=True)
    a.from_numpy(np.array([0.5, -0.3, 0.2], np.float32))

    @ti.kernel
    def fill():
        for i in a:
            T[i] = 2.0 * a[i]

    @ti.ad.no_grad
    @ti.kernel
    def shrink() -> ti.f32:
        s = 0.0
        for i in a:
            s += a[i]
            T[i] = T[i] * 0.75 + a[i]
        return s

    @ti.kernel
    def total():
        for i in T:
            L[None] += T[i] + a[i] * a[i]

    with warnings.catch_warnings():
        warnings.simplefilter("error", ti.ad.GradientWarning)
        if mode == "reverse":
            with ti.ad.Tape(loss=L):
                fill()
                assert shrink() == pytest.approx(0.4, rel=1e-6)
                total()
            got = a.grad.to_numpy()
        else:
            with ti.ad.FwdMode(loss=L, param=a, seed=[1.0, 0.0, 0.0]):
                fill()
                shrink()
                total()
            got = L.dual[None]
    # T is a constant after shrink: dL/da = 2a only
    want = 2 * a.to_numpy().astype(np.float64)
    np.testing.assert_allclose(got, want if mode == "reverse" else want[0], rtol=1e-6)


def test_a_condition_on_what_it_stored_just_before_needs_no_copy():
    """`mask[i] = ti.random(); if mask[i] < p: y[i] = 0`: the condition reads what the launch
    leaves in mask, so the zeroing reads mask as it is (a replay would need the random numbers:
    it warned and zeroed nothing)."""
    x = ti.field(ti.f32, shape=64, needs_grad=True)
    y = ti.field(ti.f32, shape=64, needs_grad=True)
    mask = ti.field(ti.f32, shape=64, needs_grad=True)
    L = ti.field(ti.f32, shape=(), needs_grad=True)
    x.fill(1.0)

    @ti.kernel
    def double():
        for i in x:
            y[i] = 2.0 * x[i]

    @ti.ad.no_grad
    @ti.kernel
    def drop():
        for i in y:
            mask[i] = ti.random()
            if mask[i] < 0.5:
                y[i] = 0.0

    @ti.kernel
    def total():
        for i in y:
            L[None] += y[i]

    with warnings.catch_warnings():
        warnings.simplefilter("error", ti.ad.GradientWarning)
        with ti.ad.Tape(loss=L):
            double()
            drop()
            total()
    m = mask.to_numpy()
    assert 0 < (m < 0.5).sum() < 64
    np.testing.assert_array_equal(x.grad.to_numpy(), np.where(m < 0.5, 0.0, 2.0))
