"""Forward mode (ti.ad.FwdMode, needs_dual, x.dual): every op of the tangent rules table, vectors
and matrices, atomics, serial loops with mutable locals, while / break / continue, a simulation,
the error messages. References are float64 NumPy directional central differences of NumPy
reimplementations (or analytic derivatives); forward and reverse mode are also checked against
each other, <J v, w> = <v, J^T w>, on hand-written and randomly generated kernels."""
from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

import wgpu_ad as ti
from ad_util import assert_grad, f32
from test_ad_ops import BINARY, MAT_CASES, UNARY, ZERO_CASES, N, _mod_safe, mat_case_program
from test_math_functions import FUNCS
from wgpu_ad.ir.ops import GroupOp, Op
from wgpu_ad.passes.autodiff.rules import DIFFERENTIABLE, ZERO

pytestmark = pytest.mark.gpu

H = 1e-6


def jvp_fd(f, xs, vs, h: float = H):
    """d/dt f(x + t v) at t = 0 (float64 central differences); xs, vs: lists of arrays."""
    xs = [np.asarray(x, np.float64) for x in xs]
    vs = [np.asarray(v, np.float64) for v in vs]
    fp = np.asarray(f(*(x + h * v for x, v in zip(xs, vs))), np.float64)
    fm = np.asarray(f(*(x - h * v for x, v in zip(xs, vs))), np.float64)
    return (fp - fm) / (2 * h)


def direction(seed: int, shape) -> np.ndarray:
    r = np.random.default_rng(200 + seed)
    return f32(r.uniform(0.5, 1.5, shape) * r.choice([-1.0, 1.0], shape))


# ---- one op at a time -------------------------------------------------------------------------
def run_unary_fwd(fn, xv, v):
    x = ti.field(ti.f32, shape=len(xv), needs_dual=True)
    y = ti.field(ti.f32, shape=len(xv), needs_dual=True)

    @ti.kernel
    def unary():
        for i in x:
            y[i] = fn(x[i])

    x.from_numpy(xv)
    with ti.ad.FwdMode(loss=y, param=x, seed=list(v)):
        unary()
    return y.to_numpy(), y.dual.to_numpy()


@pytest.mark.parametrize("case", UNARY, ids=lambda c: c.name)
def test_unary_op_tangent(case):
    rng = np.random.default_rng(len(case.name))
    xv = f32(case.xs) if case.xs else f32(rng.uniform(case.lo, case.hi, N))
    v = direction(len(case.name), len(xv))
    y, dy = run_unary_fwd(case.fn, xv, v)
    np.testing.assert_allclose(y, case.ref(xv.astype(np.float64)), rtol=2e-5, atol=2e-6, err_msg="primal value")
    assert_grad(dy, jvp_fd(case.ref, [xv], [v]), what=f"tangent of {case.name}")


@pytest.mark.parametrize("name,op,fn,ref", ZERO_CASES, ids=[c[0] for c in ZERO_CASES])
def test_zero_derivative_op_tangent(name, op, fn, ref):
    xv = f32((-1.3, -0.63, -0.1, 0.37, 0.88, 1.41))
    v = direction(5, N)
    _, dy = run_unary_fwd(fn, xv, v)
    assert_grad(dy, jvp_fd(ref, [xv], [v]), what=f"tangent through {name}")


@pytest.mark.parametrize("param", ["a", "b", "const_a", "const_b"])
@pytest.mark.parametrize("case", BINARY, ids=lambda c: c.name)
def test_binary_op_tangent(case, param):
    av, bv = f32(case.a), f32(case.b)
    ca, cb = float(np.float32(case.ca)), float(np.float32(case.cb))
    a64, b64 = av.astype(np.float64), bv.astype(np.float64)
    if case.op is Op.MOD:
        assert _mod_safe(a64, b64) and _mod_safe(ca, b64) and _mod_safe(a64, cb), "inputs on a jump of %"
    a = ti.field(ti.f32, shape=N, needs_dual=True)
    b = ti.field(ti.f32, shape=N, needs_dual=True)
    y = ti.field(ti.f32, shape=N, needs_dual=True)
    fn = case.fn

    @ti.kernel
    def both():
        for i in a:
            y[i] = fn(a[i], b[i])

    @ti.kernel
    def const_a():
        for i in a:
            y[i] = fn(ca, b[i])

    @ti.kernel
    def const_b():
        for i in a:
            y[i] = fn(a[i], cb)

    a.from_numpy(av)
    b.from_numpy(bv)
    v = direction(len(case.name), N)
    seeded = b if param in ("b", "const_a") else a
    k = {"a": both, "b": both, "const_a": const_a, "const_b": const_b}[param]
    with ti.ad.FwdMode(loss=y, param=seeded, seed=v):
        k()
    if param == "a":
        ref = jvp_fd(lambda a_: case.ref(a_, b64), [a64], [v])
    elif param == "b":
        ref = jvp_fd(lambda b_: case.ref(a64, b_), [b64], [v])
    elif param == "const_a":
        ref = jvp_fd(lambda b_: case.ref(ca, b_), [b64], [v])
    else:
        ref = jvp_fd(lambda a_: case.ref(a_, cb), [a64], [v])
    assert_grad(y.dual.to_numpy(), ref, what=f"tangent of {case.name} seeding {param}")
    assert seeded.dual.to_numpy().tolist() == [0.0] * N, "the seed is cleared on exit"


def test_select_takes_the_tangent_of_the_chosen_operand():
    c = ti.field(ti.i32, shape=N)
    a = ti.field(ti.f32, shape=N, needs_dual=True)
    y = ti.field(ti.f32, shape=N, needs_dual=True)

    @ti.kernel
    def sel():
        for i in a:
            y[i] = ti.select(c[i] > 0, a[i] * a[i], ti.sin(a[i])) + ti.select(a[i] > 0.0, 2.0, a[i])

    cv = np.array([1, 0, 0, 1, 1, 0], np.int32)
    av = f32((-1.7, -0.8, -0.3, 0.4, 1.1, 1.9))
    c.from_numpy(cv)
    a.from_numpy(av)
    v = direction(1, N)
    with ti.ad.FwdMode(loss=y, param=a, seed=v):
        sel()
    ref = jvp_fd(lambda x: np.where(cv > 0, x * x, np.sin(x)) + np.where(x > 0, 2.0, x), [av], [v])
    assert_grad(y.dual.to_numpy(), ref, what="tangent through select")


def test_every_alu_op_has_a_tangent_rule_or_a_zero_derivative():
    alu = set(GroupOp.ALU)
    missing = sorted(op.name for op in alu if op not in DIFFERENTIABLE and op not in ZERO)
    assert not missing, f"ALU ops with no derivative and not listed in ZERO: {missing}"
    assert DIFFERENTIABLE <= alu, sorted(o.name for o in DIFFERENTIABLE - alu)
    covered = {c.op for c in UNARY} | {c.op for c in BINARY} | {c.op for c in FUNCS} | {Op.SELECT, Op.CAST}
    assert not sorted(op.name for op in DIFFERENTIABLE if op not in covered), "a tangent rule without a test here"


@pytest.mark.parametrize("name,fn,ref", MAT_CASES, ids=[c[0] for c in MAT_CASES])
def test_vector_matrix_tangent(name, fn, ref):
    """Each vector / matrix field seeded in turn (a vector or matrix param: one seed number per
    component)."""
    n = 3
    fields, data, loss, compute = mat_case_program(fn, n, needs_dual=True)
    d64 = [d.astype(np.float64) for d in data]

    def total(*xs):
        return sum(ref(*(x[i] for x in xs)) for i in range(n))
    for k, f in enumerate(fields):
        seed = direction(k, data[k].shape)
        loss[None] = 0.0
        with ti.ad.FwdMode(loss=loss, param=f, seed=seed.ravel().tolist()):
            compute()
        want = jvp_fd(lambda x: total(*(x if j == k else d64[j] for j in range(5))), [d64[k]], [seed])
        assert_grad(loss.dual[None], want, rtol=2e-4, what=f"d loss / d field {k} . seed ({name})")


# ---- atomics ----------------------------------------------------------------------------------
def test_atomic_add_and_sub_accumulate_tangents():
    x = ti.field(ti.f32, shape=8, needs_dual=True)
    loss = ti.field(ti.f32, shape=(), needs_dual=True)
    hist = ti.field(ti.f32, shape=3, needs_dual=True)

    @ti.kernel
    def reduce():
        for i in x:
            loss[None] += x[i] ** 2
            ti.atomic_sub(loss[None], ti.sin(x[i]))
            hist[i % 3] += x[i] * x[(i + 1) % 8]

    xv = f32(np.linspace(-1, 1.5, 8))
    x.from_numpy(xv)
    v = direction(3, 8)
    with ti.ad.FwdMode(loss=[loss, hist], param=x, seed=v):
        reduce()

    def f(x_):
        return np.sum(x_ ** 2 - np.sin(x_))

    def fh(x_):
        p = x_ * np.roll(x_, -1)
        return np.array([p[0::3].sum(), p[1::3].sum(), p[2::3].sum()])
    assert_grad(loss.dual[None], jvp_fd(f, [xv], [v]), what="loss.dual")
    assert_grad(hist.dual.to_numpy(), jvp_fd(fh, [xv], [v]), what="hist.dual")
    assert loss[None] == pytest.approx(f(xv.astype(np.float64)), rel=1e-5)


def test_atomic_min_max_in_a_serial_loop_keep_the_tangent_of_the_winner():
    x = ti.field(ti.f32, shape=6, needs_dual=True)
    hi = ti.field(ti.f32, shape=(), needs_dual=True)
    lo = ti.field(ti.f32, shape=(), needs_dual=True)

    @ti.kernel
    def extremes():
        hi[None] = -100.0
        lo[None] = 100.0
        for i in range(6):
            ti.atomic_max(hi[None], x[i] * x[i])
            ti.atomic_min(lo[None], ti.sin(x[i]))

    xv = f32((0.3, -1.4, 0.9, 1.2, -0.2, 0.5))
    x.from_numpy(xv)
    v = direction(4, 6)
    with ti.ad.FwdMode(loss=[hi, lo], param=x, seed=v):
        with pytest.raises(ti.CompileError, match=r"ti.atomic_max into 'hi', which has a dual, in a parallel loop "
                                                  r"whose threads may share an element"):
            extremes()

    @ti.kernel
    def extremes_serial():
        hi[None] = -100.0
        lo[None] = 100.0
        ti.loop_config(serialize=True)
        for i in range(6):
            ti.atomic_max(hi[None], x[i] * x[i])
            ti.atomic_min(lo[None], ti.sin(x[i]))

    with ti.ad.FwdMode(loss=[hi, lo], param=x, seed=v):
        extremes_serial()
    assert hi.dual[None] == pytest.approx(2 * xv[1] * v[1], rel=1e-5)
    assert lo.dual[None] == pytest.approx(np.cos(xv[1]) * v[1], rel=1e-5)

    # in a parallel loop where each element belongs to one thread, the same is exact
    m = ti.field(ti.f32, shape=3, needs_dual=True)

    @ti.kernel
    def row_max():
        for i in m:
            m[i] = -100.0
            for j in range(2):
                ti.atomic_max(m[i], ti.sin(x[2 * i + j]))

    with ti.ad.FwdMode(loss=m, param=x, seed=v):
        row_max()
    pairs = np.sin(xv.astype(np.float64)).reshape(3, 2)
    win = pairs.argmax(1)
    want = [np.cos(xv[2 * i + win[i]]) * v[2 * i + win[i]] for i in range(3)]
    np.testing.assert_allclose(m.dual.to_numpy(), want, rtol=1e-5)


# ---- loops and branches ------------------------------------------------------------------------
def test_serial_loops_with_mutable_locals():
    n = 6
    a = ti.field(ti.f32, shape=n, needs_dual=True)
    c = ti.field(ti.i32, shape=n)
    s = ti.field(ti.f32, shape=n, needs_dual=True)
    p = ti.field(ti.f32, shape=n, needs_dual=True)
    fib = ti.field(ti.f32, shape=n, needs_dual=True)

    @ti.kernel
    def loops():
        for i in a:
            acc = 1.0
            prod = 1.0
            u = a[i]
            w = 1.0
            for j in range(c[i]):
                acc += a[i]
                prod = prod * a[i]
                u, w = w, u + w
            s[i] = acc
            p[i] = prod
            fib[i] = w

    av = f32((1.5, 0.7, -1.2, 2.0, 0.9, 1.1))
    cv = np.arange(n, dtype=np.int32)
    a.from_numpy(av)
    c.from_numpy(cv)
    v = direction(6, n)
    with ti.ad.FwdMode(loss=[s, p, fib], param=a, seed=v):
        loops()

    def ref(x):
        s_, p_, f_ = [], [], []
        for i in range(n):
            acc, prod, u, w = 1.0, 1.0, x[i], 1.0
            for _ in range(cv[i]):
                acc += x[i]
                prod *= x[i]
                u, w = w, u + w
            s_.append(acc), p_.append(prod), f_.append(w)
        return np.array([s_, p_, f_])
    want = jvp_fd(ref, [av], [v])
    assert_grad(s.dual.to_numpy(), want[0], what="sum")
    assert_grad(p.dual.to_numpy(), want[1], what="power")
    assert_grad(fib.dual.to_numpy(), want[2], what="fibonacci")
    assert np.all(a.dual.to_numpy() == 0), "the seed is cleared on exit"


def test_while_break_continue_and_branches():
    n = 5
    x = ti.field(ti.f32, shape=n, needs_dual=True)
    y = ti.field(ti.f32, shape=n, needs_dual=True)

    @ti.kernel
    def newton():
        for i in x:
            # sqrt(x) by Newton's method until converged, with a continue and a branch
            r = x[i]
            k = 0
            total = 0.0
            while True:
                k += 1
                r = 0.5 * (r + x[i] / r)
                if k % 2 == 0:
                    continue
                if ti.abs(r * r - x[i]) < 1e-6 or k > 40:
                    break
                total += 0.01 * r
            if r > 1.5:
                y[i] = r * r * r + total
            else:
                y[i] = ti.sin(r) + total

    xv = f32((0.5, 1.7, 2.9, 4.1, 0.9))
    x.from_numpy(xv)
    v = direction(7, n)
    with ti.ad.FwdMode(loss=y, param=x, seed=v):
        newton()

    def ref(x_):
        out = []
        for xi in x_:
            r, k, total = xi, 0, 0.0
            while True:
                k += 1
                r = 0.5 * (r + xi / r)
                if k % 2 == 0:
                    continue
                if abs(r * r - xi) < 1e-6 or k > 40:
                    break
                total += 0.01 * r
            out.append(r ** 3 + total if r > 1.5 else np.sin(r) + total)
        return np.array(out)
    # the float32 iterations may stop at another k than the float64 ones: the tangent of the
    # converged root is the same, the small `total` term is what the looser tolerance allows for
    assert_grad(y.dual.to_numpy(), jvp_fd(ref, [xv], [v], h=1e-7), rtol=1e-3, what="while / break / continue")


def test_in_place_updates_in_a_serial_loop():
    """The recursive moving average of a Taichi bug report, updated in place in a serial loop
    (reverse mode keeps the element in a local; forward mode just follows the stores)."""
    rows, cols = 3, 5
    data = ti.field(ti.f32, shape=(rows, cols), needs_dual=True)
    ewma = ti.field(ti.f32, shape=rows, needs_dual=True)
    m = ti.field(ti.f32, shape=rows)  # atomic max into a field without a dual: no tangent to pick

    @ti.kernel
    def smooth():
        for row in range(rows):
            ewma[row] = data[row, 0]
            for col in range(1, cols):
                ewma[row] = 0.5 * data[row, col] * data[row, col] + 0.5 * ewma[row]
                ti.atomic_max(m[row], data[row, col])

    dv = f32(np.random.default_rng(9).uniform(-1, 1, (rows, cols)))
    data.from_numpy(dv)
    seed = direction(9, (rows, cols))
    with ti.ad.FwdMode(loss=ewma, param=data, seed=seed.ravel()):
        smooth()

    def ref(d):
        e = d[:, 0].copy()
        for col in range(1, cols):
            e = 0.5 * d[:, col] ** 2 + 0.5 * e
        return e
    assert_grad(ewma.dual.to_numpy(), jvp_fd(ref, [dv], [seed]), what="ewma.dual")
    np.testing.assert_allclose(m.to_numpy(), np.maximum(dv[:, 1:].max(1), 0.0), rtol=1e-6)


def test_indices_read_from_fields():
    """A gather and a scatter through indices read from a field (which reverse mode checks at run
    time): forward mode follows them as written."""
    n = 5
    x = ti.field(ti.f32, shape=n, needs_dual=True, needs_grad=True)
    idx = ti.field(ti.i32, shape=n)
    y = ti.field(ti.f32, shape=n, needs_dual=True, needs_grad=True)
    z = ti.field(ti.f32, shape=n, needs_dual=True, needs_grad=True)

    @ti.kernel
    def gather_scatter():
        for i in x:
            y[i] = x[idx[i]] ** 2
            z[idx[i]] += ti.sin(x[i])

    perm = np.array([3, 0, 4, 1, 2], np.int32)
    xv = f32((0.3, -0.8, 1.1, 0.5, -1.4))
    idx.from_numpy(perm)
    x.from_numpy(xv)
    v = direction(11, n)
    with ti.ad.FwdMode(loss=[y, z], param=x, seed=v):
        gather_scatter()

    def ref(a):
        zz = np.zeros(n)
        zz[perm] += np.sin(a)
        return np.append(a[perm] ** 2, zz)
    want = jvp_fd(ref, [xv], [v])
    assert_grad(y.dual.to_numpy(), want[:n], what="y.dual")
    assert_grad(z.dual.to_numpy(), want[n:], what="z.dual")


def test_kernel_scope_variable_summed_over_a_parallel_loop():
    """`s += x[i]` into a kernel-scope variable (a hidden per-launch sum, plan.Scratch): its
    tangent is summed alongside."""
    n = 6
    x = ti.field(ti.f32, shape=n, needs_dual=True)
    y = ti.field(ti.f32, shape=n, needs_dual=True)

    @ti.kernel
    def normalise(p: ti.f32) -> ti.f32:
        s = 0.0
        for i in x:
            s += x[i] ** p
        for i in x:
            y[i] = x[i] / s
        return s

    xv = f32((0.5, 1.2, 0.8, 2.0, 1.5, 0.3))
    x.from_numpy(xv)
    v = direction(10, n)
    with ti.ad.FwdMode(loss=y, param=x, seed=v):
        s = normalise(2.0)
    assert s == pytest.approx(float((xv.astype(np.float64) ** 2).sum()), rel=1e-5)
    assert_grad(y.dual.to_numpy(), jvp_fd(lambda a: a / (a ** 2).sum(), [xv], [v]), what="y.dual")


# ---- forward against reverse: <J v, w> = <v, J^T w> -----------------------------------------
def _both_modes(kernel, args, inputs, outputs, v, w):
    """(<J v, w>, <v, J^T w>) of `kernel(*args)` from its inputs (fields with needs_dual and
    needs_grad) to its outputs, v and w one array per field."""
    for x, vx in zip(inputs, v):
        x.dual.from_numpy(vx)
    with ti.ad.FwdMode(loss=outputs, param=inputs[0], seed=v[0].ravel(), clear_gradients=False):
        for x, vx in zip(inputs[1:], v[1:]):
            x.dual.from_numpy(vx)  # the other inputs' directions too
        for y in outputs:
            y.fill(0)
            y.dual.fill(0)
        kernel(*args)
    jv = sum(float(np.sum(y.dual.to_numpy().astype(np.float64) * wy)) for y, wy in zip(outputs, w))
    for y in outputs:
        y.fill(0)
    kernel(*args)
    ti.ad.clear_all_gradients()
    for y, wy in zip(outputs, w):
        y.grad.from_numpy(wy)
    kernel.grad(*args)
    jtw = sum(float(np.sum(x.grad.to_numpy().astype(np.float64) * vx)) for x, vx in zip(inputs, v))
    return jv, jtw


def test_forward_and_reverse_agree_on_a_physics_kernel():
    n = 8
    pos = ti.Vector.field(2, ti.f32, shape=n, needs_grad=True, needs_dual=True)
    k_s = ti.field(ti.f32, shape=(), needs_grad=True, needs_dual=True)
    force = ti.Vector.field(2, ti.f32, shape=n, needs_grad=True, needs_dual=True)
    energy = ti.field(ti.f32, shape=(), needs_grad=True, needs_dual=True)

    @ti.kernel
    def springs(rest: ti.f32):
        for i in range(n):
            j = (i + 1) % n
            d = pos[j] - pos[i]
            ln = d.norm()
            f = k_s[None] * (ln - rest) * d / ln
            force[i] = f - k_s[None] * (pos[(i + n - 1) % n] - pos[i]).normalized() * 0.1
            energy[None] += 0.5 * k_s[None] * (ln - rest) ** 2

    r = np.random.default_rng(3)
    ang = np.linspace(0, 2 * np.pi, n, endpoint=False)
    pos.from_numpy(f32(np.stack([np.cos(ang), np.sin(ang)], 1) + r.uniform(-0.1, 0.1, (n, 2))))
    k_s[None] = 3.0
    v = [f32(r.uniform(-1, 1, (n, 2))), f32(r.uniform(-1, 1, ()))]
    w = [f32(r.uniform(-1, 1, (n, 2))), f32(r.uniform(-1, 1, ()))]
    p0, k0 = pos.to_numpy(), k_s.to_numpy()
    jv, jtw = _both_modes(springs, (0.6,), [pos, k_s], [force, energy], v, w)
    assert jv == pytest.approx(jtw, rel=2e-4, abs=1e-5)

    def twin(p, k):  # the kernel in float64 NumPy (normalized() without eps: q / |q|)
        d = np.roll(p, -1, axis=0) - p
        ln = np.linalg.norm(d, axis=1, keepdims=True)
        q = np.roll(p, 1, axis=0) - p
        f = k * (ln - 0.6) * d / ln - k * q / np.linalg.norm(q, axis=1, keepdims=True) * 0.1
        return np.append(f.ravel(), np.sum(0.5 * k * (ln - 0.6) ** 2))
    ref = float(np.dot(jvp_fd(twin, [p0, k0], v), np.append(w[0].ravel(), w[1])))
    assert jv == pytest.approx(ref, rel=2e-4, abs=1e-5)  # and both against an independent reference
    assert jtw == pytest.approx(ref, rel=2e-4, abs=1e-5)


_UNARY_GEN = [("ti.sin({})", "np.sin({})"), ("ti.cos({})", "np.cos({})"), ("ti.tanh({})", "np.tanh({})"),
              ("ti.exp(ti.tanh({}))", "np.exp(np.tanh({}))"), ("ti.log(1.5 + ti.tanh({}))", "np.log(1.5 + np.tanh({}))"),
              ("ti.sqrt(1.2 + ti.sin({}))", "np.sqrt(1.2 + np.sin({}))"), ("ti.atan({})", "np.arctan({})"),
              ("ti.asin(0.8 * ti.tanh({}))", "np.arcsin(0.8 * np.tanh({}))"),
              ("ti.acos(0.8 * ti.tanh({}))", "np.arccos(0.8 * np.tanh({}))"),
              ("ti.rsqrt(1.1 + ti.cos({}))", "1 / np.sqrt(1.1 + np.cos({}))"), ("({}) ** 2", "({}) ** 2"),
              ("-({})", "-({})"), ("ti.tan(0.5 * ti.tanh({}))", "np.tan(0.5 * np.tanh({}))")]
_BINARY_GEN = [("({}) + ({})", "({}) + ({})"), ("({}) - ({})", "({}) - ({})"), ("({}) * ({})", "({}) * ({})"),
               ("({}) / (1.5 + ti.sin({}))", "({}) / (1.5 + np.sin({}))"),
               ("ti.atan2({}, 1.3 + ti.cos({}))", "np.arctan2({}, 1.3 + np.cos({}))"),
               ("ti.min({}, {})", "np.minimum({}, {})"), ("ti.max({}, {})", "np.maximum({}, {})"),
               ("ti.pow(1.5 + ti.sin({}), ti.tanh({}))", "np.power(1.5 + np.sin({}), np.tanh({}))")]


def _expr(rng, depth: int, leaves):
    if depth == 0 or rng.random() < 0.2:
        k = rng.integers(len(leaves) + 1)
        if k == len(leaves):
            c = f"{rng.uniform(-1, 1):.3f}"
            return c, c
        return leaves[k]
    if rng.random() < 0.5:
        t, n = _UNARY_GEN[rng.integers(len(_UNARY_GEN))]
        a = _expr(rng, depth - 1, leaves)
        return t.format(a[0]), n.format(a[1])
    t, n = _BINARY_GEN[rng.integers(len(_BINARY_GEN))]
    a, b = _expr(rng, depth - 1, leaves), _expr(rng, depth - 1, leaves)
    return t.format(a[0], b[0]), n.format(a[1], b[1])


def _random_program(seed: int) -> tuple[str, str]:
    """A kernel (and its NumPy twin) from random expressions in one of a few shapes of control
    flow: a plain store, a serial loop with a mutable local, a branch, a while loop with break,
    an accumulation into a 0-d field."""
    rng = np.random.default_rng(seed)
    leaves = [("a", "a"), ("b", "b"), ("acc", "acc")]
    e1, e2, e3 = (_expr(rng, 3, leaves) for _ in range(3))
    shape = seed % 5
    if shape == 0:
        body_ti = ["acc = a * b", f"y[i] = {e1[0]}", f"loss[None] += {e2[0]}"]
        body_np = ["acc = a * b", f"y = {e1[1]}", f"loss = np.sum({e2[1]})"]
    elif shape == 1:
        body_ti = ["acc = a", "for j in range(3):", f"    acc = 0.5 * acc + 0.3 * ({e1[0]})",
                   "y[i] = acc", f"loss[None] += {e2[0]}"]
        body_np = ["acc = a", "for j in range(3):", f"    acc = 0.5 * acc + 0.3 * ({e1[1]})",
                   "y = acc", f"loss = np.sum({e2[1]})"]
    elif shape == 2:
        body_ti = ["acc = b", f"if {e1[0]} > 0.1:", f"    y[i] = {e2[0]}", "else:", f"    y[i] = {e3[0]}",
                   "loss[None] += acc * a"]
        body_np = ["acc = b", f"y = np.where(({e1[1]}) > 0.1, {e2[1]}, {e3[1]})", "loss = np.sum(acc * a)"]
    elif shape == 3:
        body_ti = ["acc = a", "k = 0", "while True:", f"    acc = 0.6 * acc + 0.2 * ({e1[0]})", "    k += 1",
                   "    if k >= 3:", "        break", "y[i] = acc", f"loss[None] += {e2[0]}"]
        body_np = ["acc = a", "for k in range(3):", f"    acc = 0.6 * acc + 0.2 * ({e1[1]})", "y = acc",
                   f"loss = np.sum({e2[1]})"]
    else:
        body_ti = ["acc = a + b", f"y[i] = {e1[0]} * {e3[0]}", f"loss[None] += ti.sin({e2[0]})"]
        body_np = ["acc = a + b", f"y = ({e1[1]}) * ({e3[1]})", f"loss = np.sum(np.sin({e2[1]}))"]
    ti_src = "\n".join(["@ti.kernel", "def k(x: ti.template(), y: ti.template(), loss: ti.template()):",
                        "    for i in x:", "        a = x[i]", "        b = x[(i + 1) % x.shape[0]]"]
                       + ["        " + line for line in body_ti])
    np_src = "\n".join(["def ref(x):", "    a = x", "    b = np.roll(x, -1)"] + ["    " + line for line in body_np]
                       + ["    return y, loss"])
    return ti_src, np_src


@pytest.mark.parametrize("seed", range(10))
def test_forward_and_reverse_agree_on_random_kernels(seed, tmp_path):
    ti_src, np_src = _random_program(seed)
    path = tmp_path / f"fwd_random_{seed}.py"
    path.write_text("import numpy as np\nimport wgpu_ad as ti\n\n" + ti_src + "\n\n" + np_src + "\n")
    spec = importlib.util.spec_from_file_location(f"fwd_random_{seed}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.modules.pop(spec.name, None)
    n = 7
    x = ti.field(ti.f32, shape=n, needs_grad=True, needs_dual=True)
    y = ti.field(ti.f32, shape=n, needs_grad=True, needs_dual=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True, needs_dual=True)
    r = np.random.default_rng(seed)
    xv = f32(r.uniform(-1, 1, n))
    x.from_numpy(xv)
    v = [f32(r.uniform(-1, 1, n))]
    w = [f32(r.uniform(-1, 1, n)), f32(r.uniform(-1, 1, ()))]
    jv, jtw = _both_modes(mod.k, (x, y, loss), [x], [y, loss], v, w)
    scale = abs(jv) + float(np.sum(np.abs(v[0])))
    assert jv == pytest.approx(jtw, abs=2e-4 * scale), f"<Jv, w> != <v, J^T w> for\n{ti_src}"
    # and the tangents against float64 central differences of the NumPy twin
    ref_all = jvp_fd(lambda x_: np.append(mod.ref(x_)[0], mod.ref(x_)[1]), [xv], v)
    with ti.ad.FwdMode(loss=[y, loss], param=x, seed=v[0]):
        loss.fill(0)
        mod.k(x, y, loss)
    assert_grad(y.dual.to_numpy(), ref_all[:n], rtol=5e-4, what=f"y.dual of\n{ti_src}")
    assert_grad(loss.dual[None], ref_all[n], rtol=5e-4, what=f"loss.dual of\n{ti_src}")


# ---- a simulation against central differences ---------------------------------------------------
def test_mass_spring_simulation_against_central_differences():
    """A chain of 6 masses, 30 explicit steps stepping the state in place; the tangent of the
    final kinetic + potential energy and positions with respect to the initial velocities."""
    n, steps, dt, k_s, rest = 6, 30, 0.01, 40.0, 0.2
    x = ti.Vector.field(2, ti.f32, shape=n, needs_dual=True)
    v = ti.Vector.field(2, ti.f32, shape=n, needs_dual=True)
    f = ti.Vector.field(2, ti.f32, shape=n, needs_dual=True)
    energy = ti.field(ti.f32, shape=(), needs_dual=True)

    @ti.kernel
    def forces():
        for i in range(n):
            acc = ti.Vector([0.0, -9.8])
            if i > 0:
                d = x[i - 1] - x[i]
                acc += k_s * (d.norm() - rest) * d.normalized()
            if i < n - 1:
                d = x[i + 1] - x[i]
                acc += k_s * (d.norm() - rest) * d.normalized()
            f[i] = acc

    @ti.kernel
    def step():
        for i in range(n):
            v[i] += dt * f[i]
            x[i] += dt * v[i]

    @ti.kernel
    def measure():
        for i in range(n):
            energy[None] += 0.5 * v[i].norm_sqr() + 9.8 * x[i][1]

    x0 = f32(np.stack([np.arange(n) * 0.25, np.zeros(n)], 1))
    r = np.random.default_rng(5)
    v0 = f32(r.uniform(-0.5, 0.5, (n, 2)))
    dv = f32(r.uniform(-1, 1, (n, 2)))

    def simulate():
        x.from_numpy(x0)
        energy[None] = 0.0
        for _ in range(steps):
            forces()
            step()
        measure()

    v.from_numpy(v0)
    with ti.ad.FwdMode(loss=[energy, x], param=v, seed=dv.ravel()):
        simulate()

    def ref(vel):
        pos, vel = x0.astype(np.float64).copy(), vel.copy()
        for _ in range(steps):
            acc = np.tile([0.0, -9.8], (n, 1))
            for i in range(n):
                for j in (i - 1, i + 1):
                    if 0 <= j < n:
                        d = pos[j] - pos[i]
                        ln = np.linalg.norm(d)
                        acc[i] += k_s * (ln - rest) * d / ln
            vel = vel + dt * acc
            pos = pos + dt * vel
        e = np.sum(0.5 * np.sum(vel ** 2, 1) + 9.8 * pos[:, 1])
        return np.append(pos.ravel(), e)
    want = jvp_fd(ref, [v0], [dv])
    assert_grad(x.dual.to_numpy().ravel(), want[:-1], rtol=1e-3, what="d x_T / d v_0 . dv")
    assert_grad(energy.dual[None], want[-1], rtol=1e-3, what="d E / d v_0 . dv")


# ---- the API ------------------------------------------------------------------------------------
def test_dual_storage_api_and_lazy_dual_in_any_order():
    a = ti.field(ti.f32)                      # placed after lazy_dual
    b = ti.Vector.field(3, ti.f32, shape=4)    # placed before it
    g = ti.field(ti.f32, shape=2, needs_grad=True)
    h = ti.field(ti.f32, shape=2)
    h_grad = h.grad                            # a gradient handle taken before anything has storage
    ti.root.lazy_dual()
    ti.root.dense(ti.i, 5).place(a)
    c = ti.Matrix.field(2, 2, ti.f32, shape=())  # created after it
    i = ti.field(ti.i32, shape=3)
    assert a.needs_dual and b.needs_dual and c.needs_dual and not i.needs_dual
    assert g.dual is not g.grad and h.dual is not h_grad and h.dual.is_dual and not h.dual.is_grad
    g.dual.fill(3.0)
    assert g.grad.to_numpy().tolist() == [0.0, 0.0] and g.dual.to_numpy().tolist() == [3.0, 3.0]
    assert a.dual.shape == (5,) and b.dual.shape == (4,) and c.dual.shape == ()
    b.dual.fill(2.0)
    b.dual[1] = [1.0, 2.0, 3.0]
    assert b.dual.to_numpy()[1].tolist() == [1.0, 2.0, 3.0] and b.dual[0].tolist() == [2.0] * 3
    c.dual.from_numpy(np.eye(2, dtype=np.float32))
    assert c.dual[None].tolist() == [[1.0, 0.0], [0.0, 1.0]]
    assert "needs_dual=True" in repr(a)

    @ti.kernel
    def read_dual():
        for k in a:
            a[k] = b.dual[k % 4][2] + c.dual[None][0, 0]

    read_dual()
    assert a.to_numpy().tolist() == [3.0, 4.0, 3.0, 3.0, 3.0]


def test_ndarray_duals():
    x = ti.ndarray(ti.f32, shape=5, needs_dual=True)
    y = ti.ndarray(ti.f32, shape=5, needs_dual=True)
    s = ti.field(ti.f32, shape=(), needs_dual=True)

    @ti.kernel
    def square(x: ti.types.ndarray(), y: ti.types.ndarray()):
        for i in x:
            y[i] = x[i] * x[i] + s[None] * x[i]

    xv = f32((0.5, -1.0, 2.0, 0.25, 1.5))
    x.from_numpy(xv)
    s[None] = 2.0
    with ti.ad.FwdMode(loss=y, param=x, seed=[1.0] * 5):
        square(x, y)
    np.testing.assert_allclose(y.dual.to_numpy(), 2 * xv + 2.0, rtol=1e-6)
    with ti.ad.FwdMode(loss=y, param=s):      # a 0-d param: the seed defaults to [1.0]
        square(x, y)
    np.testing.assert_allclose(y.dual.to_numpy(), xv, rtol=1e-6)

    out = ti.field(ti.f32, shape=5, needs_dual=True)

    @ti.kernel
    def scale(a: ti.types.ndarray()):
        for i in a:
            out[i] = a[i] * s[None] * s[None]

    with ti.ad.FwdMode(loss=out, param=s, seed=[0.5]):
        scale(xv * 3)                          # a NumPy array: no dual of its own, the field has one
    np.testing.assert_allclose(out.dual.to_numpy(), xv * 3 * 2 * 2.0 * 0.5, rtol=1e-6)


def test_fwd_mode_semantics_as_in_taichi():
    x = ti.field(ti.f32, shape=3, needs_dual=True)
    loss = ti.field(ti.f32, shape=(), needs_dual=True)
    other = ti.field(ti.f32, shape=3, needs_dual=True)

    @ti.kernel
    def f() -> ti.f32:
        for i in x:
            loss[None] += 3.0 * x[i] * x[i]
        return loss[None]

    @ti.ad.no_grad
    @ti.kernel
    def no_tangent():
        for i in x:
            other[i] = 5.0 * x[i]

    x.from_numpy(f32((1.0, 2.0, 3.0)))
    other.dual.fill(7.0)
    with ti.ad.FwdMode(loss=loss, parameters=x, seed=[0.0, 1.0, 0.0]) as fm:
        assert x.dual.to_numpy().tolist() == [0.0, 1.0, 0.0]
        assert other.dual.to_numpy().tolist() == [0.0] * 3, "clear_gradients zeroes every dual on entry"
        other.dual.fill(7.0)
        ret = f()
        no_tangent()
    assert isinstance(fm, ti.ad.FwdMode)
    assert ret == pytest.approx(42.0), "the kernel returns its primal value"
    assert loss[None] == pytest.approx(42.0) and loss.dual[None] == pytest.approx(12.0)
    assert x.dual.to_numpy().tolist() == [0.0] * 3, "the seed is cleared on exit"
    # a @ti.ad.no_grad kernel computes no tangent: what it overwrites has none (Taichi leaves the 7s,
    # the tangents of the values it replaced; tests/test_no_grad_overwrites.py)
    assert other.dual.to_numpy().tolist() == [0.0] * 3
    with ti.ad.FwdMode(loss=loss, param=x, seed=[1.0, 0.0, 0.0], clear_gradients=False):
        f()
    assert loss.dual[None] == pytest.approx(12.0 + 6.0), "clear_gradients=False accumulates"


def test_print_in_a_dual_kernel_prints_the_primal_values(capsys):
    x = ti.field(ti.f32, shape=(), needs_dual=True)
    y = ti.field(ti.f32, shape=(), needs_dual=True)

    @ti.kernel
    def square():
        y[None] = x[None] * x[None]
        print("y =", y[None])

    x[None] = 1.5
    with ti.ad.FwdMode(loss=y, param=x):
        square()
    assert y.dual[None] == pytest.approx(3.0)
    assert capsys.readouterr().out.splitlines() == ["y = 2.25"]


def test_dual_kernels_are_cached_offline():
    from wgpu_ad.compiler import cache
    x = ti.field(ti.f32, shape=4, needs_dual=True)
    y = ti.field(ti.f32, shape=4, needs_dual=True)

    @ti.kernel
    def k():
        for i in x:
            y[i] = ti.exp(x[i]) * 0.123456

    x.fill(0.5)
    k()  # the forward kernel alone
    def clear_kernel_caches():  # compiled kernels in memory only: the fields and the device stay
        k._cache.clear()  # (the adjoints and dual kernels live on the forward's Launchers)
        k._last = None

    clear_kernel_caches()
    with ti.ad.FwdMode(loss=y, param=x, seed=[1.0] * 4):
        k()  # the forward kernel from disk, its dual kernel from the IR made again
    np.testing.assert_allclose(y.dual.to_numpy(), np.exp(0.5) * 0.123456, rtol=1e-6)
    clear_kernel_caches()  # a new process, as far as compiled kernels go
    hits = cache.record.stats["hits"]
    with ti.ad.FwdMode(loss=y, param=x, seed=[1.0] * 4):
        k()
    assert cache.record.stats["hits"] >= hits + 2, "the forward kernel and its dual kernel both come from disk"
    np.testing.assert_allclose(y.dual.to_numpy(), np.exp(0.5) * 0.123456, rtol=1e-6)
    assert "x_dual" in k.get_wgsl(dual=True) and "x.dual" in k.get_dual_ir()


# ---- errors --------------------------------------------------------------------------------------
def test_error_messages():
    x = ti.field(ti.f32, shape=3, needs_dual=True, needs_grad=True)
    plain = ti.field(ti.f32, shape=3, name="plain")
    loss = ti.field(ti.f32, shape=(), needs_dual=True, needs_grad=True)

    with pytest.raises(ti.WgpuAdError, match=r"field 'plain' has no dual: create it with needs_dual=True or "
                                             r"call ti.root.lazy_dual\(\) before using plain.dual"):
        plain.dual
    with pytest.raises(ti.WgpuAdError, match=r"ti.ad.FwdMode\(loss=...\): field 'plain' has no dual: create it "
                                             r"with needs_dual=True \(or call ti.root.lazy_dual\(\)\)"):
        ti.ad.FwdMode(loss=plain, param=x, seed=[1, 0, 0])
    with pytest.raises(ti.WgpuAdError, match=r"ti.ad.FwdMode\(param=...\): field 'plain' has no dual"):
        ti.ad.FwdMode(loss=loss, param=plain, seed=[1, 0, 0])
    with pytest.raises(ti.WgpuAdError, match=r"the seed has 2 number\(s\), but field 'x' holds 3 \(shape \(3,\)\)"):
        with ti.ad.FwdMode(loss=loss, param=x, seed=[1, 0]):
            pass
    with pytest.raises(ti.WgpuAdError, match=r"field 'x' holds 3 numbers \(shape \(3,\)\), so the seed, the "
                                             r"direction of the derivative, must be given"):
        with ti.ad.FwdMode(loss=loss, param=x):
            pass
    with pytest.raises(ti.WgpuAdError, match=r"needs_dual=True needs a float dtype, got i32"):
        ti.field(ti.i32, shape=3, needs_dual=True)

    @ti.kernel
    def k():
        for i in x:
            loss[None] += x[i] * x[i] + plain.dual[i]

    with pytest.raises(ti.CompileError, match=r"field 'plain' has no dual") as e:
        k()
    assert "plain.dual[i]" in str(e.value)  # the source line, with its caret

    @ti.kernel
    def sq():
        for i in x:
            loss[None] += x[i] * x[i]

    with ti.ad.FwdMode(loss=loss, param=x, seed=[1, 0, 0]):
        with pytest.raises(ti.WgpuAdError, match=r"sq.grad\(\) inside ti.ad.FwdMode .*reverse mode on top of "
                                                 r"forward mode is not supported"):
            sq.grad()
        with pytest.raises(ti.WgpuAdError, match=r"ti.ad.Tape cannot be used inside ti.ad.FwdMode"):
            with ti.ad.Tape(loss=loss):
                sq()
        with pytest.raises(ti.WgpuAdError, match=r"another FwdMode is active .*they cannot be nested"):
            with ti.ad.FwdMode(loss=loss, param=x, seed=[0, 1, 0]):
                pass
    with ti.ad.Tape(loss=loss):
        with pytest.raises(ti.WgpuAdError, match=r"ti.ad.FwdMode cannot be used inside ti.ad.Tape"):
            with ti.ad.FwdMode(loss=loss, param=x, seed=[1, 0, 0]):
                pass
        sq()
    assert x.grad.to_numpy() == pytest.approx(2 * x.to_numpy())


def test_a_tangent_stopped_by_a_field_without_a_dual_is_refused():
    """y = 2 x computed inside FwdMode into a field without a dual, then loss = sum y: the tangent
    would stop at y and loss.dual stay 0 (Taichi's result). Refused, naming both kernels and the
    fixes; each fix then gives its own right answer."""
    def program(y_dual: bool):
        x = ti.field(ti.f32, shape=3, needs_dual=True, name="x")
        y = ti.field(ti.f32, shape=3, needs_dual=y_dual, name="y")
        loss = ti.field(ti.f32, shape=(), needs_dual=True, name="loss")

        @ti.kernel
        def double():
            for i in x:
                y[i] = x[i] * x[i] * 2.0

        @ti.kernel
        def total():
            for i in y:
                loss[None] += y[i]
        x.from_numpy(f32((1.0, 2.0, 3.0)))
        return x, loss, double, total

    x, loss, double, total = program(False)
    with pytest.raises(ti.WgpuAdError, match=r"ti.ad.FwdMode: kernel 'total' reads field 'y', which 'double' computed "
                                             r"inside the FwdMode block from values with tangents, but 'y' has no dual: "
                                             r"the tangent stops there .* Create 'y' with needs_dual=True .*mark "
                                             r"'double' with @ti.ad.no_grad"):
        with ti.ad.FwdMode(loss=loss, param=x, seed=[1.0, 0.0, 1.0]):
            double()
            total()

    x, loss, double, total = program(True)
    with ti.ad.FwdMode(loss=loss, param=x, seed=[1.0, 0.0, 1.0]):
        double()
        total()
    assert loss.dual[None] == pytest.approx(4.0 * 1.0 + 4.0 * 3.0)   # d/dx sum 2 x^2 . seed

    x, loss, double, total = program(False)
    with ti.ad.FwdMode(loss=loss, param=x, seed=[1.0, 0.0, 1.0]):
        ti.ad.no_grad(double)()                                      # y as a constant, as meant
        total()
    assert loss.dual[None] == 0.0
    assert loss[None] == pytest.approx(2.0 * (1 + 4 + 9))
