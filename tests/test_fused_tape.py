"""The last launch of a tape runs fused with its adjoint (ad/tape.py Tape.hold,
passes/autodiff/fuse.py): one kernel does the forward's writes and the adjoint.

Every loss and gradient is compared with a float64 reference (analytic, or central differences);
Runtime.dispatch_count tells whether the tape fused (one dispatch less than the forward launch
and the adjoint apart). The cases the fusion must refuse (the forward reading what it writes, an
adjoint reading the forward's result, storages aliased at launch, anything reaching the device
between the launch and the end of the tape) must still give the right values, unfused."""
import numpy as np
import pytest

import wgpu_ad as ti
from ad_util import assert_grad, central_diffs

pytestmark = pytest.mark.gpu


def _rng_x(n, seed=5, lo=-1.0, hi=1.0):
    return np.random.default_rng(seed).uniform(lo, hi, n).astype(np.float32)


def _dispatches(fn) -> int:
    rt = ti.get_runtime()
    before = rt.dispatch_count
    fn()
    ti.sync()
    return rt.dispatch_count - before


def _taped(loss, kernel, *args) -> int:
    """Run kernel(*args) in a tape with this loss; the number of dispatches it took."""
    def tape():
        with ti.ad.Tape(loss=loss):
            kernel(*args)
    return _dispatches(tape)


def _reduction(n=5000):
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def energy():
        for i in x:
            loss[None] += x[i] * x[i] + ti.sin(x[i])

    x0 = _rng_x(n)
    x.from_numpy(x0)
    return x, loss, energy, x0.astype(np.float64)


@pytest.mark.parametrize("fuse", [True, False])
def test_reduction_fused_and_apart_give_the_reference(fuse):
    ti.init()
    ti.set_compile_options(fuse_adjoint=fuse)
    x, loss, energy, x0 = _reduction()
    assert _taped(loss, energy) == (1 if fuse else 2)
    assert loss[None] == pytest.approx(float((x0 * x0 + np.sin(x0)).sum()), rel=1e-5)
    assert_grad(x.grad.to_numpy(), 2 * x0 + np.cos(x0))
    # a second tape: the gradients were cleared, the loss recomputed, not accumulated
    _taped(loss, energy)
    assert loss[None] == pytest.approx(float((x0 * x0 + np.sin(x0)).sum()), rel=1e-5)
    assert_grad(x.grad.to_numpy(), 2 * x0 + np.cos(x0))


@pytest.mark.parametrize("min_parallel", [None, 1])
@pytest.mark.parametrize("weighted", [False, True])
def test_pair_loop_fused(min_parallel, weighted):
    """The gravity energy, plain (symmetric in the pair: one gather, symmetry.py) and weighted by
    w[i] (with min_parallel=1 its adjoint is two gathers, transpose.py): the first adjoint task
    does the forward's accumulation; the serial j loop's writes happen in its reverse loop (its
    iterations share no state)."""
    ti.init()
    ti.set_compile_options(min_parallel=min_parallel)
    n = 48
    p = ti.Vector.field(2, ti.f32, shape=n, needs_grad=True)
    w = ti.field(ti.f32, shape=n, needs_grad=True)
    U = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def compute_U(weighted: ti.template()):
        for i, j in ti.ndrange(n, n):
            r = p[i] - p[j]
            e = -1.0 / r.norm(1e-3)
            if ti.static(weighted):
                e *= w[i]
            U[None] += e

    p0 = np.random.default_rng(7).random((n, 2)).astype(np.float32)
    w0 = _rng_x(n, lo=0.5, hi=1.5)
    p.from_numpy(p0)
    w.from_numpy(w0)

    def energy(q, wv):
        d = q[:, None, :] - q[None, :, :]
        e = -1.0 / np.sqrt((d * d).sum(-1) + 1e-3)
        return float(((wv[:, None] if weighted else 1.0) * e).sum())

    tasks = 2 if min_parallel and weighted else 1  # the adjoint's; the forward's fused into the first
    assert _taped(U, compute_U, weighted) == tasks
    assert U[None] == pytest.approx(energy(p0.astype(np.float64), w0.astype(np.float64)), rel=1e-5)
    gp, gw = central_diffs(energy, [p0, w0])
    assert_grad(p.grad.to_numpy(), gp)
    if weighted:
        assert_grad(w.grad.to_numpy(), gw)


def test_two_loops_and_a_serial_part_in_the_last_kernel():
    """The forward's first loop runs as a dispatch of the fused kernel, then the last loop fused
    with its adjoint, then the first loop's adjoint; the tape's earlier kernel runs apart."""
    ti.init()
    n = 300
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    y = ti.field(ti.f32, shape=n, needs_grad=True)
    z = ti.field(ti.f32, shape=n, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def scale(c: ti.f32):
        for i in x:
            z[i] = c * x[i]

    @ti.kernel
    def square_then_sum(c: ti.f32):
        for i in z:
            y[i] = ti.exp(z[i] * c)
        for i in y:
            loss[None] += y[i] * y[i]

    x0 = _rng_x(n, lo=-0.5, hi=0.5)
    x.from_numpy(x0)

    def tape():
        with ti.ad.Tape(loss=loss):
            scale(1.5)
            square_then_sum(0.7)
    # scale: 1 + 1; square_then_sum: its first loop, the fused last loop, the first loop's adjoint
    assert _dispatches(tape) == 2 + 3
    xd = x0.astype(np.float64)
    loss_ref = float(np.exp(2 * 0.7 * 1.5 * xd).sum())
    assert loss[None] == pytest.approx(loss_ref, rel=1e-5)
    assert_grad(x.grad.to_numpy(), 2 * 0.7 * 1.5 * np.exp(2 * 0.7 * 1.5 * xd))


def test_serial_kernel_fused():
    ti.init()
    a = ti.field(ti.f32, shape=3, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def norm():
        loss[None] = ti.sqrt(a[0] ** 2 + a[1] ** 2 + a[2] ** 2)

    a0 = np.array([0.3, -1.2, 2.0], np.float32)
    a.from_numpy(a0)

    assert _taped(loss, norm) == 1
    r = float(np.linalg.norm(a0.astype(np.float64)))
    assert loss[None] == pytest.approx(r, rel=1e-6)
    assert_grad(a.grad.to_numpy(), a0.astype(np.float64) / r)


def test_serial_loops_in_the_fused_task():
    """Writes inside serial loops happen once per forward iteration: in the reverse loop of a
    loop whose iterations share no state (nested too, with an `if` and `continue`), in the first
    replay of a loop that can `break` (its trip count is recorded there)."""
    ti.init()
    n, m = 40, 6
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    w = ti.field(ti.f32, shape=m, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def pairs():
        for i in x:
            for j in range(m):
                if (i + j) % 3 == 0:
                    continue
                loss[None] += ti.sin(x[i] * w[j])
                for k in range(2):
                    loss[None] += 0.25 * (k + 1) * x[i] * w[j] * w[k]
            for j in range(m):
                if w[j] > 0.6:
                    break
                loss[None] += x[i] * x[i] * w[j]

    x0, w0 = _rng_x(n, seed=1), np.array([0.3, -0.2, 0.5, 0.9, 0.1, -0.4], np.float32)
    x.from_numpy(x0)
    w.from_numpy(w0)

    def f(xv, wv):
        out = 0.0
        for i in range(n):
            for j in range(m):
                if (i + j) % 3 == 0:
                    continue
                out += np.sin(xv[i] * wv[j])
                for k in range(2):
                    out += 0.25 * (k + 1) * xv[i] * wv[j] * wv[k]
            for j in range(m):
                if wv[j] > 0.6:
                    break
                out += xv[i] * xv[i] * wv[j]
        return out

    assert _taped(loss, pairs) == 1
    assert loss[None] == pytest.approx(f(x0.astype(np.float64), w0.astype(np.float64)), rel=1e-5)
    gx, gw = central_diffs(f, [x0, w0])
    assert_grad(x.grad.to_numpy(), gx)
    assert_grad(w.grad.to_numpy(), gw)


def test_loop_with_carried_state_is_not_fused():
    """Its adjoint keeps stacks (an overflow check may stop a thread early, which the
    forward's workgroup sum cannot have): the tape launches the two apart."""
    ti.init()
    n = 64
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def iterate():
        for i in x:
            acc = x[i]
            for _ in range(5):
                acc = acc + 0.1 * ti.sin(acc)
            loss[None] += acc * acc

    x0 = _rng_x(n, seed=4)
    x.from_numpy(x0)

    def f(xv):
        acc = xv.copy()
        for _ in range(5):
            acc = acc + 0.1 * np.sin(acc)
        return float((acc * acc).sum())

    assert _taped(loss, iterate) == 2
    assert loss[None] == pytest.approx(f(x0.astype(np.float64)), rel=1e-5)
    (gx,) = central_diffs(f, [x0])
    assert_grad(x.grad.to_numpy(), gx)


def test_ndarray_arguments_fused():
    """Gradients of ndarray arguments are resolved from the arguments at each launch: two
    ndarrays in turn through the same compiled kernel."""
    ti.init()
    n = 500
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def cubes(a: ti.types.ndarray(), c: ti.f32):
        for i in a:
            loss[None] += c * a[i] ** 3

    for seed in (1, 2):
        a = ti.ndarray(ti.f32, shape=n, needs_grad=True)
        a0 = _rng_x(n, seed=seed)
        a.from_numpy(a0)
        assert _taped(loss, cubes, a, 0.5) == 1
        ad = a0.astype(np.float64)
        assert loss[None] == pytest.approx(float((0.5 * ad ** 3).sum()), rel=1e-5, abs=1e-4)
        assert_grad(a.grad.to_numpy(), 1.5 * ad ** 2)


def test_forward_reading_its_own_writes_fuses_after_store_forwarding():
    """y[i] is stored then read by the same thread: the read is the stored value (promote.py
    forwards it), so nothing in the task reads the forward's writes and the tail fuses."""
    ti.init()
    n = 400
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    y = ti.field(ti.f32, shape=n, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def compute():
        for i in x:
            y[i] = ti.cos(x[i])
            loss[None] += y[i] * x[i]

    x0 = _rng_x(n)
    x.from_numpy(x0)

    assert _taped(loss, compute) == 1
    xd = x0.astype(np.float64)
    assert loss[None] == pytest.approx(float((np.cos(xd) * xd).sum()), rel=1e-5)
    assert_grad(x.grad.to_numpy(), np.cos(xd) - xd * np.sin(xd))
    np.testing.assert_allclose(y.to_numpy(), np.cos(xd), rtol=1e-6, atol=1e-7)


def test_adjoint_reading_the_forward_result_is_not_fused():
    """The adjoint of an atomic max reads the final maximum: in one pass with the forward it
    would read a partial one, so the tape launches the two apart."""
    ti.init()
    n = 20000
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def biggest():
        for i in x:
            ti.atomic_max(loss[None], x[i] * 3.0)

    x0 = np.random.default_rng(9).permutation(n).astype(np.float32) / n  # distinct values
    x.from_numpy(x0)

    assert _taped(loss, biggest) == 2
    assert loss[None] == pytest.approx(3.0 * float(x0.max()), rel=1e-6)
    ref = np.zeros(n)
    ref[int(np.argmax(x0))] = 3.0
    np.testing.assert_array_equal(x.grad.to_numpy(), ref)


def test_storage_rule_at_launch():
    """The fuse check on the storages one launch binds (here ndarray arguments, which the
    compiler cannot tell apart): the forward's writes must be touched by nothing else, and the
    adjoint must write none of the primal storages read."""
    from wgpu_ad import plan
    from wgpu_ad.lang.launch import _fuse_check, storage_getter

    storage = [storage_getter(plan.Arg(k), []) for k in range(4)]
    lp = plan.LaunchPlan(words=(), buffers=tuple(plan.Arg(k) for k in range(4)), tasks=(), grid_cap=1,
                         fused=((0,), (1,), (2,), (3,)))
    check = _fuse_check(lp, storage)
    p, g, w, a = object(), object(), object(), object()
    assert check((p, g, w, a))
    assert not check((w, g, w, a))   # the forward's write read as a primal
    assert not check((p, w, w, a))   # ... read as a gradient
    assert not check((p, g, w, w))   # ... written by the adjoint
    assert not check((a, g, w, a))   # the adjoint writes a primal the task reads
    assert check((p, a, w, a))       # the adjoint reads what it writes: as in any adjoint


def test_anything_reaching_the_device_runs_the_held_launch_first():
    """A read of the loss, a later kernel, a host write: the held launch runs before each, so the
    program sees the forward's results where it expects them (and the tape does not fuse)."""
    ti.init()
    x, loss, energy, x0 = _reduction(n=700)
    value = float((x0 * x0 + np.sin(x0)).sum())
    other = ti.field(ti.f32, shape=())

    @ti.kernel
    def copy_loss():
        other[None] = loss[None] * 2.0

    for between in ("read", "kernel", "write", "sync"):
        with ti.ad.Tape(loss=loss):
            energy()
            if between == "read":
                assert loss[None] == pytest.approx(value, rel=1e-5)
            elif between == "kernel":
                copy_loss()
            elif between == "write":
                other[None] = 1.0
            else:
                ti.sync()
        assert loss[None] == pytest.approx(value, rel=1e-5), between
        assert_grad(x.grad.to_numpy(), 2 * x0 + np.cos(x0), what=between)
        if between == "kernel":
            assert other[None] == pytest.approx(2 * value, rel=1e-5)


def test_exception_in_the_tape_still_runs_the_forward():
    ti.init()
    x, loss, energy, x0 = _reduction(n=500)
    with pytest.raises(KeyError):
        with ti.ad.Tape(loss=loss):
            energy()
            raise KeyError("user code failed")
    assert loss[None] == pytest.approx(float((x0 * x0 + np.sin(x0)).sum()), rel=1e-5)
    assert not x.grad.to_numpy().any()  # no backward pass


def test_refused_adjoint_reports_its_error_after_the_forward_ran():
    """A kernel whose adjoint is refused: the forward still runs, then the tape raises the
    adjoint's error, as without fusion."""
    ti.init()
    n = 32
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def noisy():
        for i in x:
            loss[None] += x[i] * ti.random()

    x.from_numpy(_rng_x(n))
    with pytest.raises(ti.CompileError, match="ti.random"):
        with ti.ad.Tape(loss=loss):
            noisy()
    assert loss[None] != 0.0


def test_custom_gradient_after_the_last_kernel():
    """A grad_replaced function recorded after the kernel (launching nothing in its forward):
    the kernel is then not the tape's last entry and runs before the backward pass."""
    ti.init()
    x, loss, energy, x0 = _reduction(n=300)
    calls = []

    @ti.ad.grad_replaced
    def observe():
        pass

    @ti.ad.grad_for(observe)
    def observe_grad():
        calls.append(loss[None])

    with ti.ad.Tape(loss=loss):
        energy()
        observe()
    value = float((x0 * x0 + np.sin(x0)).sum())
    assert calls == [pytest.approx(value, rel=1e-5)]
    assert_grad(x.grad.to_numpy(), 2 * x0 + np.cos(x0))


def test_fused_kernel_comes_from_the_offline_cache(tmp_path, monkeypatch):
    """After ti.reset() the fused kernel (its own cache entry) is loaded, not compiled, and gives
    the same, right values."""
    from wgpu_ad.compiler import cache

    monkeypatch.delenv("WGPU_AD_OFFLINE_CACHE", raising=False)

    for run in ("cold", "warm"):
        ti.reset()
        ti.init(offline_cache_file_path=str(tmp_path))
        before = dict(cache.record.stats)
        x, loss, energy, x0 = _reduction(n=900)
        assert _taped(loss, energy) == 1
        got = {k: cache.record.stats[k] - before[k] for k in ("hits", "misses", "writes")}
        # the forward kernel, the fused kernel and its variant that stores into the all-zero x.grad
        assert got == ({"hits": 0, "misses": 3, "writes": 3} if run == "cold" else
                       {"hits": 3, "misses": 0, "writes": 0}), run
        assert loss[None] == pytest.approx(float((x0 * x0 + np.sin(x0)).sum()), rel=1e-5)
        assert_grad(x.grad.to_numpy(), 2 * x0 + np.cos(x0))
