"""The gradient NaN / Inf check (check_nan: ti.init(debug=True), ti.ad.Tape(check_nan=True),
ti.set_compile_options(check_nan=True)): the backward pass raises ti.ad.GradientNaNError at the
first non-finite gradient, naming the kernel, the field, the element and the line and operation
whose derivative made it (seed 000: "NaN gradients from a division by zero in the backward
pass"). Without the check the same programs run silently. Expected gradients come from analytic
derivatives; error text is asserted word for word."""
from __future__ import annotations

import inspect
import math
import re

import numpy as np
import pytest

import wgpu_ad as ti
from wgpu_ad.ad import GradientNaNError

gpu = pytest.mark.gpu  # the tests that need an adapter (lavapipe counts); the others run anywhere


def line_of(kernel, text: str) -> int:
    """The source line of `kernel` holding `text`."""
    lines, start = inspect.getsourcelines(kernel.fn)
    return start + next(k for k, line in enumerate(lines) if text in line)


def f32(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32)


def raises_nan(run) -> GradientNaNError:
    with pytest.raises(GradientNaNError) as info:
        run()
    return info.value


# ---- the operations whose derivative is not finite -----------------------------------------------

@gpu
def test_sqrt_at_zero_names_kernel_field_element_line_and_op():
    ti.init(debug=True)
    x = ti.field(ti.f32, shape=4, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def root_sum():
        for i in x:
            loss[None] += ti.sqrt(x[i])

    x.from_numpy(f32([1, 0, 4, 9]))

    def run():
        with ti.ad.Tape(loss):
            root_sum()
    e = raises_nan(run)
    line = line_of(root_sum, "ti.sqrt(x[i])")
    msg = str(e)
    assert msg.startswith("the gradient of x[1] is inf: the backward pass of kernel 'root_sum' adds inf to its "
                          "gradient (checked because of ti.init(debug=True) or ti.ad.Tape(check_nan=True); the "
                          "other gradients are incomplete).\n")
    assert (f"It starts at the derivative of sqrt at line {line} of root_sum: d/dx sqrt(x) = 1 / (2 sqrt(x)) is "
            f"infinite at x = 0 (here the argument is 0; incoming adjoint 1, so the gradient passed to its argument is "
            f"inf).\n"
            f"Fix: keep the argument above 0: ti.sqrt(ti.max(x, 1e-12)), or for a vector length v.norm(eps) "
            f"(or v.norm_sqr(), which has no square root).") in msg
    assert f'File "{__file__}", line {line}, in root_sum\n    loss[None] += ti.sqrt(x[i])\n' in msg
    assert (e.kernel, e.field, e.index, e.op, e.line) == ("root_sum", "x", (1,), "sqrt", line)
    assert math.isinf(e.value)
    assert isinstance(e, ti.KernelRuntimeError)


@gpu
def test_division_by_zero_with_tape_check_nan_and_a_2d_field():
    """Tape(check_nan=True) without debug mode (the tape's last launch runs fused with its adjoint)."""
    ti.init()
    x = ti.field(ti.f32, shape=(2, 3), needs_grad=True)
    y = ti.field(ti.f32, shape=(2, 3), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def ratio():
        for i, j in x:
            loss[None] += x[i, j] / y[i, j]

    ys = np.ones((2, 3), np.float32)
    ys[1, 2] = 0
    x.from_numpy(np.full((2, 3), 2, np.float32))
    y.from_numpy(ys)

    def run():
        with ti.ad.Tape(loss, check_nan=True):
            ratio()
    e = raises_nan(run)
    line = line_of(ratio, "x[i, j] / y[i, j]")
    assert e.kernel == "ratio" and e.op == "div" and e.line == line
    assert e.field in ("x", "y") and e.index == (1, 2)
    assert (f"It starts at the derivative of / at line {line} of ratio: d/dx (x / y) = 1 / y and d/dy (x / y) = "
            f"-x / y^2 are infinite at y = 0 (a division by zero) (here the operands are 2 and 0; incoming adjoint 1, "
            f"so the gradient passed to the ") in str(e)
    assert "Fix: add a small epsilon to the divisor (x / (y + 1e-10))" in str(e)
    assert f"the gradient of {e.field}[1, 2] is " in str(e)


@gpu
def test_log_at_zero():
    ti.init(debug=True)
    x = ti.field(ti.f32, shape=3, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def log_sum():
        for i in x:
            loss[None] += ti.log(x[i])

    x.from_numpy(f32([1, 0.5, 0]))

    def run():
        with ti.ad.Tape(loss):
            log_sum()
    e = raises_nan(run)
    line = line_of(log_sum, "ti.log(x[i])")
    assert (e.kernel, e.field, e.index, e.op, e.line) == ("log_sum", "x", (2,), "log", line)
    assert (f"It starts at the derivative of log at line {line} of log_sum: d/dx log(x) = 1 / x is infinite at "
            f"x = 0 (and log(0) = -inf) (here the argument is 0; incoming adjoint 1, so the gradient passed to its "
            f"argument is inf).\n"
            f"Fix: keep the argument of log above 0: ti.log(ti.max(x, 1e-12)), or log(x + eps).") in str(e)


@gpu
def test_nan_in_an_input_field_is_traced_to_the_forward_values():
    ti.init(debug=True)
    x = ti.field(ti.f32, shape=3, needs_grad=True)
    w = ti.field(ti.f32, shape=3)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def weighted():
        for i in x:
            loss[None] += w[i] * x[i]

    x.from_numpy(f32([0.5, 1, 2]))
    w.from_numpy(f32([1, np.nan, 3]))

    def run():
        with ti.ad.Tape(loss):
            weighted()
    e = raises_nan(run)
    line = line_of(weighted, "w[i] * x[i]")
    assert (e.kernel, e.field, e.index, e.op, e.line) == ("weighted", "x", (1,), "mul", line)
    assert str(e).startswith("the gradient of x[1] is NaN: the backward pass of kernel 'weighted' adds NaN")
    assert (f"It starts at the derivative of * at line {line} of weighted, whose first operand is already NaN in "
            f"the forward pass (the operands are NaN and 1): the NaN is in the forward values the adjoint recomputes (an input "
            f"holding NaN, or an operation of the forward before this one: log(0), x / 0, sqrt of a negative "
            f"number, an overflow), not made by a derivative.") in str(e)


@gpu
def test_nan_arising_in_a_serial_loop_with_a_stack():
    """v goes 4 -> 1 -> 0 -> -1: the third step's sqrt(0) has an infinite derivative; the loop's
    values come back from the autodiff stack in reverse."""
    ti.init(debug=True)
    x = ti.field(ti.f32, shape=2, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def iterate(steps: ti.i32):
        for i in x:
            v = x[i]
            for t in range(steps):
                v = ti.sqrt(v) - 1.0
            loss[None] += v

    x.from_numpy(f32([16, 4]))

    def run():
        with ti.ad.Tape(loss):
            iterate(3)
    e = raises_nan(run)
    line = line_of(iterate, "ti.sqrt(v)")
    read = line_of(iterate, "v = x[i]")
    assert (e.kernel, e.field, e.index, e.op, e.line) == ("iterate", "x", (1,), "sqrt", line)
    assert (f"It starts at the derivative of sqrt at line {line} of iterate: d/dx sqrt(x) = 1 / (2 sqrt(x)) is "
            f"infinite at x = 0") in str(e)
    assert str(e).endswith(f"(x is read at line {read} of iterate: v = x[i])")
    # x = 16 goes 16 -> 3 -> 0.732 -> -0.144: finite; the check passes for it alone
    x.from_numpy(f32([16, 16]))
    with ti.ad.Tape(loss):
        iterate(3)
    v, d = 16.0, 1.0
    for _ in range(3):
        d *= 0.5 / math.sqrt(v)
        v = math.sqrt(v) - 1
    np.testing.assert_allclose(x.grad.to_numpy(), [d, d], rtol=1e-5)


@gpu
def test_vector_norm_at_the_zero_vector():
    """|p| at p = 0 has no derivative; wgpu_ad takes the smallest subgradient, 0, as for abs at 0
    (Taichi's chain rule through sqrt gives 0 * inf = NaN there), so no NaN is raised; elsewhere
    the gradient is p / |p|."""
    ti.init(debug=True)
    p = ti.Vector.field(3, ti.f32, shape=4, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def lengths():
        for i in p:
            loss[None] += p[i].norm() + p[i].norm() ** 2

    a = np.ones((4, 3), np.float32)
    a[2] = 0
    p.from_numpy(a)
    with ti.ad.Tape(loss):
        lengths()
    want = a / np.sqrt(3.0) + 2 * a
    want[2] = 0.0
    np.testing.assert_allclose(p.grad.to_numpy(), want, rtol=1e-6)


def _weighted_chain(fn, xs, ws):
    """loss = sum_i w[i] * fn(x[i]) in debug mode, w without a gradient: (x, w, run), run()
    launching it on a tape."""
    ti.init(debug=True)
    x = ti.field(ti.f32, shape=len(xs), needs_grad=True)
    w = ti.field(ti.f32, shape=len(xs))
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def chain():
        for i in x:
            loss[None] += w[i] * fn(x[i])

    x.from_numpy(f32(xs))
    w.from_numpy(f32(ws))

    def run():
        with ti.ad.Tape(loss):
            chain()
    return x, w, run


@gpu
def test_an_infinite_derivative_times_a_zero_adjoint_is_zero():
    """w * sqrt(x) at w = 0, x = 0 is 0 for every x near 0: its derivative in x is 0, not the
    0 * inf = NaN of the chain rule (sqrt's derivative term is left out where its incoming adjoint
    is exactly 0). Where the adjoint is not 0, sqrt's infinite slope at 0 is still an inf."""
    x, w, run = _weighted_chain(ti.sqrt, [1, 0], [1, 0])
    run()
    np.testing.assert_array_equal(x.grad.to_numpy(), [0.5, 0.0])
    w.from_numpy(f32([1, 1]))
    e = raises_nan(run)
    assert (e.field, e.index, e.op) == ("x", (1,), "sqrt") and "is inf" in str(e)


@gpu
def test_zero_times_inf_in_a_chain():
    """asin, like sqrt, leaves its infinite slope at 1 out where its adjoint is exactly 0: w * asin(x)
    at w = 0 is 0 for every x, so d/dx is 0. With w = 1 the slope is a real inf: the check names it."""
    x, w, run = _weighted_chain(ti.asin, [0.5, 1], [1, 0])
    run()
    np.testing.assert_allclose(x.grad.to_numpy(), [1 / np.sqrt(0.75), 0.0], rtol=1e-6)
    w.from_numpy(f32([1, 1]))
    e = raises_nan(run)
    assert (e.field, e.index, e.op) == ("x", (1,), "asin") and "incoming adjoint 1" in str(e), str(e)


@gpu
def test_pow_with_a_negative_base_and_a_differentiated_exponent():
    ti.init(debug=True)
    x = ti.field(ti.f32, shape=2, needs_grad=True)
    y = ti.field(ti.f32, shape=2, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def power():
        for i in x:
            loss[None] += x[i] ** y[i]

    x.from_numpy(f32([2, -2]))
    y.from_numpy(f32([2, 2]))

    def run():
        with ti.ad.Tape(loss):
            power()
    e = raises_nan(run)
    assert (e.field, e.index, e.op, e.line) == ("y", (1,), "pow", line_of(power, "x[i] ** y[i]"))
    assert ("d/dy x**y = x**y log(x) needs log(x), which is not finite for the base x = -2 <= 0 (a negative or zero "
            "base has no derivative with respect to the exponent) (here the operands are -2 and 2; incoming adjoint 1, "
            "so the gradient passed to the exponent is NaN).") in str(e)


@gpu
def test_an_ndarray_argument_is_named_by_its_parameter():
    ti.init(debug=True)
    a = ti.ndarray(ti.f32, shape=(2, 2), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def log_sum(arr: ti.types.ndarray()):
        for i, j in arr:
            loss[None] += ti.log(arr[i, j])

    a.from_numpy(f32([[1, 2], [0, 3]]))

    def run():
        with ti.ad.Tape(loss):
            log_sum(a)
    e = raises_nan(run)
    assert (e.kernel, e.field, e.index, e.op) == ("log_sum", "arr", (1, 0), "log")
    assert str(e).startswith("the gradient of arr[1, 0] is inf: the backward pass of kernel 'log_sum' adds inf")


@gpu
def test_a_nan_gradient_seeded_by_hand_is_named_where_it_is_read():
    ti.set_compile_options(check_nan=True)
    x = ti.field(ti.f32, shape=3, needs_grad=True)
    y = ti.field(ti.f32, shape=3, needs_grad=True)

    @ti.kernel
    def double():
        for i in x:
            y[i] = 2.0 * x[i]

    double()
    y.grad.from_numpy(f32([1, np.nan, 1]))
    e = raises_nan(lambda: double.grad())
    assert (e.kernel, e.field, e.index, e.op) == ("double", "x", (1,), None)
    assert (f"It was already NaN in y[1].grad when the backward pass read it (read at line "
            f"{line_of(double, 'y[i] = 2.0 * x[i]')} of double)") in str(e)


@gpu
def test_overflow_of_the_adjoints_is_named_as_such():
    """Finite values everywhere, but a seed of 1e38: 3e38 + 3e38 is inf in float32 (a sum of
    adjoints), and 1e38 * 10 is too (one derivative times the incoming adjoint)."""
    ti.set_compile_options(check_nan=True)
    x = ti.field(ti.f32, shape=2, needs_grad=True)
    w = ti.field(ti.f32, shape=3)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def twice():
        for i in range(1):
            loss[None] += w[0] * x[0] + w[1] * x[0]

    @ti.kernel
    def scaled():
        for i in range(1):
            loss[None] += w[2] * x[1]

    x.from_numpy(f32([1, 1]))
    w.from_numpy(f32([3, 3, 10]))
    twice()
    loss.grad.from_numpy(f32(1e38))
    e = raises_nan(lambda: twice.grad())
    assert (e.field, e.index, e.op, e.line) == ("x", (0,), None, None)
    assert ("No derivative was infinite: finite adjoints summed to more than float32 holds (an overflow; scale the "
            "loss down).") in str(e)
    scaled()
    e = raises_nan(lambda: scaled.grad())
    assert (e.field, e.index, e.op) == ("x", (1,), "mul")
    assert (f"It starts at the derivative of * at line {line_of(scaled, 'w[2] * x[1]')} of scaled: the incoming "
            f"adjoint 1e+38 times the local derivative overflows float32 (the operands are 10 and 1): scale the "
            f"loss down.") in str(e)


# ---- without the check, and programs whose gradients are finite ---------------------------------

def _mixed_program(check: bool):
    """sqrt, log, division and pow at points where all are differentiable."""
    x = ti.field(ti.f32, shape=5, needs_grad=True)
    y = ti.field(ti.f32, shape=5, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def mixed():
        for i in x:
            loss[None] += ti.sqrt(x[i]) * ti.log(y[i]) + x[i] / y[i] + y[i] ** 1.5

    xs = f32([0.5, 1, 2, 3, 4])
    ys = f32([1.5, 2, 2.5, 3, 0.25])
    x.from_numpy(xs)
    y.from_numpy(ys)
    with ti.ad.Tape(loss, check_nan=check):
        mixed()
    X, Y = xs.astype(np.float64), ys.astype(np.float64)
    dx = 0.5 / np.sqrt(X) * np.log(Y) + 1 / Y
    dy = np.sqrt(X) / Y - X / Y ** 2 + 1.5 * np.sqrt(Y)
    return x.grad.to_numpy(), y.grad.to_numpy(), dx, dy


@gpu
def test_finite_gradients_pass_the_check_unchanged():
    ti.init()
    gx0, gy0, dx, dy = _mixed_program(check=False)
    gx1, gy1, _, _ = _mixed_program(check=True)
    for got in (gx0, gx1):
        np.testing.assert_allclose(got, dx, rtol=2e-5, atol=1e-6)
    for got in (gy0, gy1):
        np.testing.assert_allclose(got, dy, rtol=2e-5, atol=1e-6)
    # the check only reads the values: bit for bit the same gradients
    assert np.array_equal(gx0, gx1) and np.array_equal(gy0, gy1)


@gpu
def test_without_the_check_the_backward_pass_runs_silently():
    """Documented behaviour: without debug mode or check_nan, non-finite gradients are written
    like any others (1 / 0 = inf, as IEEE arithmetic says), and nothing is raised."""
    ti.init()
    x = ti.field(ti.f32, shape=3, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def root_sum():
        for i in x:
            loss[None] += ti.sqrt(x[i])

    x.from_numpy(f32([4, 0, 1]))
    with ti.ad.Tape(loss):
        root_sum()
    g = x.grad.to_numpy()
    assert math.isinf(g[1]) and g[1] > 0
    np.testing.assert_allclose(g[[0, 2]], [0.25, 0.5], rtol=1e-6)


@gpu
def test_the_check_is_part_of_the_cache_key():
    """A kernel compiled with the check and without it: each launch gets its own adjoint, and an
    offline-cache hit (after ti.reset) reports the same error."""
    from wgpu_ad.compiler import cache

    def program():
        x = ti.field(ti.f32, shape=2, needs_grad=True)
        loss = ti.field(ti.f32, shape=(), needs_grad=True)

        @ti.kernel
        def recip():
            for i in x:
                loss[None] += 1.0 / x[i]

        x.from_numpy(f32([0, 2]))
        return x, loss, recip

    ti.init()
    x, loss, recip = program()
    with ti.ad.Tape(loss):
        recip()
    assert math.isinf(x.grad.to_numpy()[0])
    with pytest.raises(GradientNaNError) as first:
        with ti.ad.Tape(loss, check_nan=True):
            recip()
    ti.reset()
    ti.init()
    x, loss, recip = program()
    hits = cache.record.stats["hits"]
    with pytest.raises(GradientNaNError) as again:
        with ti.ad.Tape(loss, check_nan=True):
            recip()
    assert cache.record.stats["hits"] > hits
    assert str(again.value) == str(first.value)
    assert "It starts at the derivative of / at line" in str(first.value)


# ---- check_grad -------------------------------------------------------------------------------

@gpu
def test_check_grad_names_a_nan_analytic_gradient():
    ti.init()
    x = ti.field(ti.f32, shape=3, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def length():
        for i in x:
            loss[None] += ti.sqrt(x[i] * x[i])

    x.from_numpy(f32([1, 0, 2]))
    with pytest.raises(ti.ad.GradCheckError) as info:
        ti.ad.check_grad(length, loss, [x])
    assert str(info.value) == (
        "gradient check failed for field 'x': the analytic gradient of x[1] is NaN (x.grad; central differences "
        "give 0); 1 of the 3 checks found a NaN or infinite gradient. A derivative in the backward pass is not "
        "finite there (sqrt or log at 0, a division by zero, pow with a negative base, 0 * inf) or the forward "
        "values already are: run the backward pass with ti.ad.Tape(loss, check_nan=True) (or ti.init(debug=True)) "
        "to be told the kernel, the element and the operation")


# ---- the compiler alone (no GPU) -----------------------------------------------------------------

def _adjoint_ir(check_nan: bool):
    """The optimised adjoint IR of a sqrt-sum kernel (compiled like tests/test_golden_wgsl.py)."""
    from wgpu_ad import plan
    from wgpu_ad.frontend.kernel import lower_kernel
    from wgpu_ad.passes.autodiff import AdjointRequest, adjoint_kernel
    from wgpu_ad.passes.pipeline import optimize

    x = ti.field(ti.f32, shape=4, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    def root_sum():
        for i in x:
            loss[None] += ti.sqrt(x[i])

    ir, storages = lower_kernel(root_sum, "root_sum", [], None, debug=False, min_parallel=None)
    ir = optimize(ir)
    adj, _ = adjoint_kernel(ir, AdjointRequest(lambda b: plan.FieldGrad(b.source.index), check_nan=check_nan))
    return optimize(adj), root_sum


@pytest.mark.parametrize("check_nan", [False, True])
def test_checked_adjoint_ir_runs_in_the_reference_interpreter(check_nan):
    """The checks are IR like any other (bit tests, an ASSERT per gradient write): the NumPy
    interpreter runs them and raises the same message; without them the IR has no ASSERT and the
    interpreter writes the inf silently. The WGSL has the checks only when asked for."""
    from wgpu_ad.codegen import generate
    from wgpu_ad.errors import KernelRuntimeError
    from wgpu_ad.ir.interpreter import run_kernel
    from wgpu_ad.ir.nodes import walk_task
    from wgpu_ad.ir.ops import Op
    from wgpu_ad.passes.pipeline import lower_for_codegen

    adj, fn = _adjoint_ir(check_nan)
    asserts = [s for t in adj.tasks for s in walk_task(t) if s.op is Op.ASSERT]
    assert len(asserts) == (1 if check_nan else 0)
    data = {"x": f32([1, 0, 4, 9]), "loss": f32([0]), "x.grad": f32([0] * 4), "loss.grad": f32([1])}
    buffers = [data[b.name] for b in adj.buffers]
    wgsl = "\n".join(t.wgsl for t in generate(lower_for_codegen(adj), float_atomics=False, debug=False,
                                              workgroup_size=128).tasks)
    assert ("report_error" in wgsl and "bitcast<u32>" in wgsl) == check_nan
    if not check_nan:
        run_kernel(adj, buffers)
        np.testing.assert_allclose(data["x.grad"], [0.5, np.inf, 0.25, 1 / 6], rtol=1e-6)
        return
    with pytest.raises(KernelRuntimeError) as info:
        run_kernel(adj, buffers)
    line = inspect.getsourcelines(fn)[1] + 2
    assert str(info.value).startswith(
        "the gradient of x[scalar #1] is inf: the backward pass of kernel 'root_sum' adds inf to its gradient")
    assert f"It starts at the derivative of sqrt at line {line} of root_sum: d/dx sqrt(x)" in str(info.value)


@gpu
def test_a_select_over_a_division_by_zero_has_the_right_gradient():
    """Seed 000: ti.select(m > 0, v / m, 0) at m = 0. The select sends the division an adjoint of
    exactly 0, and its derivative terms 1 / m, -v / m^2 are infinite there: the chain rule gives
    0 * inf = NaN (Taichi's result); wgpu_ad leaves the zero term out. Analytic gradients, with and
    without the NaN check."""
    for debug in (True, False):
        ti.init(debug=debug)
        v = ti.field(ti.f32, shape=4, needs_grad=True)
        m = ti.field(ti.f32, shape=4, needs_grad=True)
        loss = ti.field(ti.f32, shape=(), needs_grad=True)

        @ti.kernel
        def safe_ratio():
            for i in v:
                loss[None] += ti.select(m[i] > 0, v[i] / m[i], 0.0)

        vv, mv = f32([1.0, -2.0, 3.0, 0.5]), f32([1.0, 2.0, 0.0, 4.0])
        v.from_numpy(vv)
        m.from_numpy(mv)
        with ti.ad.Tape(loss):
            safe_ratio()
        on = mv > 0
        np.testing.assert_allclose(v.grad.to_numpy(), np.where(on, 1 / np.where(on, mv, 1), 0.0), rtol=1e-6)
        np.testing.assert_allclose(m.grad.to_numpy(), np.where(on, -vv / np.where(on, mv, 1) ** 2, 0.0), rtol=1e-6)



# the ops whose derivative is not finite at a finite operand, each behind a select that does not take
# it there: (name, the guarded expression of v, its singular point, where the select takes f (Python),
# f' there)
SINGULAR_CASES = [
    ("log", lambda v: ti.select(v > 0, ti.log(v), 0.0), 0.0, lambda v: v > 0, lambda v: 1 / v),
    ("log1p", lambda v: ti.select(v > -1, ti.log(1.0 + v), 0.0), -1.0, lambda v: v > -1, lambda v: 1 / (1 + v)),
    ("sqrt", lambda v: ti.select(v > 0, ti.sqrt(v), 0.0), 0.0, lambda v: v > 0, lambda v: 0.5 / np.sqrt(v)),
    ("rsqrt", lambda v: ti.select(v > 0, ti.rsqrt(v), 0.0), 0.0, lambda v: v > 0, lambda v: -0.5 * v ** -1.5),
    ("pow", lambda v: ti.select(v > 0, ti.pow(v, 0.5), 0.0), 0.0, lambda v: v > 0, lambda v: 0.5 * v ** -0.5),
    ("pow exponent", lambda v: ti.select(v > 0, ti.pow(v, v), 0.0), 0.0, lambda v: v > 0,
     lambda v: v ** v * (np.log(v) + 1)),
    ("asin", lambda v: ti.select(abs(v) < 1, ti.asin(v), 0.0), 1.0, lambda v: abs(v) < 1,
     lambda v: 1 / np.sqrt(1 - v * v)),
    ("acos", lambda v: ti.select(abs(v) < 1, ti.acos(v), 0.0), -1.0, lambda v: abs(v) < 1,
     lambda v: -1 / np.sqrt(1 - v * v)),
    ("atan2", lambda v: ti.select(v != 0, ti.atan2(v, 2.0 * v), 0.0), 0.0, lambda v: v != 0, lambda v: 0.0),
]


@gpu
@pytest.mark.parametrize("case", SINGULAR_CASES, ids=[c[0] for c in SINGULAR_CASES])
def test_a_select_that_avoids_a_singular_derivative_has_the_right_gradient(case):
    """ti.select(ok, f(v), 0) at a point where f' is infinite: the select sends f an adjoint (and a
    tangent) of exactly 0 there, and 0 * inf would be NaN; the term is left out, as for / and sqrt.
    Reverse mode with and without the NaN check, and forward mode, against the analytic derivative."""
    name, expr, singular, ok, deriv = case
    vv = f32([singular, 0.25, 0.5, singular, -0.5, 0.75])
    ref = np.array([deriv(float(x)) if ok(float(x)) else 0.0 for x in vv])
    for check in (True, False):
        ti.init(debug=check)
        ti.root.lazy_dual()
        v = ti.field(ti.f32, shape=len(vv), needs_grad=True, needs_dual=True)
        loss = ti.field(ti.f32, shape=(), needs_grad=True, needs_dual=True)

        @ti.kernel
        def guarded():
            for i in v:
                loss[None] += expr(v[i])

        v.from_numpy(vv)
        with ti.ad.Tape(loss):
            guarded()
        np.testing.assert_allclose(v.grad.to_numpy(), ref, rtol=2e-6, atol=1e-7, err_msg=f"{name}, check_nan={check}")
        with ti.ad.FwdMode(loss=loss, param=v, seed=[1.0] * len(vv)):
            guarded()
        assert loss.dual[None] == pytest.approx(ref.sum(), rel=2e-6), name


# ---- found from the operands, where the shader compiler folds the NaN away (issue 26 item 5) -----
def _one_term(term):
    """loss = term(x[0], z[0]), both with gradients, in a kernel of its own."""
    x = ti.field(ti.f32, shape=1, needs_grad=True)
    z = ti.field(ti.f32, shape=1, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def one_term():
        for i in x:
            loss[None] += term(x[i], z[i])

    def run(xv, zv):
        x[0], z[0] = xv, zv
        with ti.ad.Tape(loss, check_nan=True):
            one_term()
        return x.grad[0], z.grad[0]
    return one_term, run


FOLDED = [  # (term, op, what the message says, the operand's name, the derivative in z at z = 2)
    (lambda x, z: 0.0 / z, "div", "/", "d/dx (x / y) = 1 / y and d/dy (x / y) = -x / y^2 are infinite at y = 0 "
     "(a division by zero) (here the operands are 0 and 0; incoming adjoint 1", "the divisor", 0.0),
    (lambda x, z: ti.log(z) * 3.0, "log", "log", "d/dx log(x) = 1 / x is infinite at x = 0 (and log(0) = -inf) "
     "(here the argument is 0; incoming adjoint 3", "its argument", 1.5),
    (lambda x, z: z ** 0.5, "pow", "** (pow)", "d/dx x**y = y x**(y - 1) is infinite at x = 0 for y = 0.5 < 1 "
     "(here the operands are 0 and 0.5; incoming adjoint 1", "the base", 0.5 * 2 ** -0.5),
    (lambda x, z: x * (0.0 / ti.sqrt(z)), "div", "/", "d/dx (x / y) = 1 / y and d/dy (x / y) = -x / y^2 are "
     "infinite at y = 0 (a division by zero) (here the operands are 0 and 0; incoming adjoint 2", "the divisor", 0.0),
]


@gpu
@pytest.mark.parametrize("term,op,shown,why,role,dz", FOLDED, ids=["0.0/z", "log(z)*3.0", "z**0.5", "x*(0.0/sqrt(z))"])
def test_a_derivative_folded_to_a_finite_number_is_found_from_its_operands(term, op, shown, why, role, dz):
    """On lavapipe the shader compiler folds `0.0 / z`, `v * 0.0` and pow(0, -0.5) to 0 where IEEE
    gives NaN or inf, so the gradient it writes looks finite; the check tests the operands (a zero
    divisor, log's or pow's base at 0) and still names the op and the line. At z = 2 the same
    kernels raise nothing and give the analytic derivative."""
    ti.init()
    _kernel, run = _one_term(term)
    e = raises_nan(lambda: run(2.0, 0.0))
    line = term.__code__.co_firstlineno  # the op's line: the term's, inlined into the kernel
    msg = str(e)
    assert (e.kernel, e.field, e.index, e.op, e.line) == ("one_term", "z", (0,), op, line)
    if math.isfinite(e.value):  # folded (lavapipe): the head says what the GPU computed
        assert msg.startswith(
            f"a derivative in the backward pass of kernel 'one_term' is not finite (checked because of "
            f"ti.init(debug=True) or ti.ad.Tape(check_nan=True); the backward pass stopped before adding "
            f"{e.value:.6g} to the gradient of z[0]; the gradients are incomplete).\n"), msg
        assert re.search(f"so the gradient passed to {role} is not finite in IEEE arithmetic, though the GPU "
                         r"computed -?[0-9.e+-]+: a shader compiler may fold a NaN or inf away, and WGSL leaves "
                         r"some of these results undefined; the check found it from the operands\)\.\nFix: ", msg), msg
    else:  # a driver that keeps IEEE's NaN / inf
        assert msg.startswith(f"the gradient of z[0] is "), msg
    assert f"It starts at the derivative of {shown} at line {line} of <lambda>: {why}" in msg, msg
    gx, gz = run(2.0, 2.0)  # nothing out of the domain: no error, the analytic derivative
    assert gz == pytest.approx(dz, rel=1e-6)


@gpu
def test_an_op_outside_its_domain_with_a_zero_adjoint_raises_nothing():
    """ti.select(z > 0, ti.log(z), 0.0) at z = -1 and ti.select(z > 0, x / z, 0.0) at z = 0: the
    op is evaluated outside its domain, but the branch is not taken, its adjoint is 0 and the
    gradient is exactly 0 (rules.py): the operand check leaves them alone. (log at exactly 0 is
    another matter: its rule makes 0 / 0 = NaN there, which the check reports.)"""
    ti.init()
    _k, run = _one_term(lambda x, z: ti.select(z > 0, ti.log(z), 0.0) + ti.select(z > 0, x / z, 0.0))
    assert run(3.0, -1.0) == (0.0, 0.0)
    _k, run_div = _one_term(lambda x, z: ti.select(z > 0, x / z, 0.0))
    assert run_div(3.0, 0.0) == (0.0, 0.0)
    gx, gz = run(3.0, 2.0)
    assert (gx, gz) == (pytest.approx(0.5, rel=1e-6), pytest.approx(0.5 - 3.0 / 4.0, rel=1e-6))


@gpu
def test_the_operand_checks_are_only_in_the_checked_adjoint():
    ti.init()
    x = ti.field(ti.f32, shape=4, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def logs():
        for i in x:
            loss[None] += ti.log(x[i])

    x.fill(1.0)
    plain = logs.get_wgsl(grad=True)
    ti.set_compile_options(check_nan=True)
    checked = logs.get_wgsl(grad=True)
    assert "nan_dom" not in plain and "nan_" not in plain
    assert "nan_dom" in checked


def test_every_op_with_an_operand_check_has_a_message_for_its_singular_point():
    """nancheck.DOMAIN and nan_check._singular agree: each op the operand check covers has a
    'why' and a 'fix' at a point where its derivative is not finite (no adapter needed)."""
    from wgpu_ad.ir.ops import Op
    from wgpu_ad.nan_check import Origin, _singular
    from wgpu_ad.passes.autodiff.nancheck import DOMAIN
    points = {Op.SQRT: [(0, 0.0, 0.0)], Op.RSQRT: [(0, -1.0, 0.0)], Op.LOG: [(0, 0.0, 0.0)],
              Op.LOG1P: [(0, -1.0, 0.0)], Op.ASIN: [(0, 1.0, 0.0)], Op.ACOS: [(0, -1.0, 0.0)],
              Op.ACOSH: [(0, 0.5, 0.0)], Op.ATANH: [(0, 1.0, 0.0)], Op.DIV: [(0, 1.0, 0.0), (1, 1.0, 0.0)],
              Op.MOD: [(1, 1.0, 0.0)], Op.ATAN2: [(0, 0.0, 0.0)], Op.POW: [(0, 0.0, 0.5), (1, -1.0, 2.0)]}
    assert set(points) == set(DOMAIN)
    for op, cases in points.items():
        for k, x, y in cases:
            got = _singular(Origin(None, op.name.lower(), k, 2), x, y)
            assert got is not None and all(got), (op, k, x, y)
