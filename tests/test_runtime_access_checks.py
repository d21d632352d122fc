"""Reverse mode's data access rules checked at run time (passes/autodiff/shadow.py): kernels whose
indices depend on the data are not refused; their forward launch checks on the GPU, where a
gradient may be asked for, that no element is stored twice, read and then overwritten, or stored
by one iteration and read by another. Gradients against float64 NumPy central differences and
analytic derivatives; failures name the kernel, the field, the element and the line."""
import weakref

import numpy as np
import pytest

import wgpu_ad as ti
from wgpu_ad.ad import launches
from wgpu_ad import plan
from ad_util import assert_grad, central_diffs

pytestmark = pytest.mark.gpu

N = 8


def _scatter_fields():
    x = ti.field(ti.f32, shape=N, needs_grad=True, name="x")
    y = ti.field(ti.f32, shape=N, needs_grad=True, name="y")
    perm = ti.field(ti.i32, shape=N, name="perm")
    loss = ti.field(ti.f32, shape=(), needs_grad=True, name="loss")
    return x, y, perm, loss


def test_permutation_scatter_is_differentiated():
    x, y, perm, loss = _scatter_fields()
    w = ti.field(ti.f32, shape=N, name="w")

    @ti.kernel
    def scatter():
        for i in range(N):
            y[perm[i]] = ti.sin(x[i]) * (i + 1)

    @ti.kernel
    def weighted():
        for i in range(N):
            loss[None] += w[i] * y[i] * y[i]

    rng = np.random.default_rng(5)
    xv = rng.uniform(-1, 1, N).astype(np.float32)
    wv = rng.uniform(0.5, 2, N).astype(np.float32)
    pv = rng.permutation(N).astype(np.int32)
    x.from_numpy(xv)
    w.from_numpy(wv)
    perm.from_numpy(pv)
    with ti.ad.Tape(loss):
        scatter()
        weighted()

    def f(xs):
        ys = np.zeros(N)
        ys[pv] = np.sin(xs) * (np.arange(N) + 1)
        return float((wv * ys * ys).sum())
    assert loss[None] == pytest.approx(f(xv.astype(np.float64)), rel=1e-5)
    (ref,) = central_diffs(f, [xv])
    assert_grad(x.grad.to_numpy(), ref)


def test_repeated_scatter_index_is_a_run_time_error():
    x, y, perm, loss = _scatter_fields()

    @ti.kernel
    def scatter():
        for i in range(N):
            y[perm[i]] = x[i] * 2.0

    perm.from_numpy(np.array([3, 0, 5, 1, 4, 3, 2, 6], np.int32))  # 3 twice, 7 never
    with pytest.raises(ti.ad.DataAccessError) as e:
        with ti.ad.Tape(loss):
            scatter()
    line = e.value.line
    assert str(e.value).splitlines()[0] == (
        f"kernel 'scatter': y[3] was stored twice by the same launch (line {line}): only the last value "
        f"survives, so the gradient would be silently wrong. The index depends on the data, so this is "
        f"checked at run time (the compiler cannot prove that it never repeats). Store each "
        f"element once (e.g. index by a permutation), or accumulate with += (atomic add)")
    assert "y[perm[i]] = x[i] * 2.0" in str(e.value)
    assert (e.value.kernel, e.value.field, e.value.index) == ("scatter", "y", (3,))
    assert isinstance(e.value, ti.KernelRuntimeError)


def test_forward_only_launches_are_not_checked():
    """Nothing the kernel reads has a gradient and no tape records it: the plain kernel runs (no
    shadow buffer bound), and a repeated index is not an error (no gradient can be asked for)."""
    x = ti.field(ti.f32, shape=N, name="x")
    y = ti.field(ti.f32, shape=N, name="y")
    perm = ti.field(ti.i32, shape=N, name="perm")

    @ti.kernel
    def scatter():
        for i in range(N):
            y[perm[i]] = x[i] * 2.0

    x.from_numpy(np.arange(N, dtype=np.float32))
    perm.from_numpy(np.array([1, 1, 1, 1, 1, 1, 1, 0], np.int32))
    scatter()
    assert y.to_numpy()[0] == 14.0
    assert "y_accesses" not in scatter.get_wgsl()
    assert "y_accesses" in scatter.get_wgsl(checked=True)  # the variant a gradient would need
    (lc,) = scatter._cache.values()
    assert not any(isinstance(src, plan.Shadow) for src in lc.plan.buffers)
    assert lc.compiled.shadowed == (plan.Field(_field_index(lc, y)),)
    # nothing it reads or writes has a gradient: its adjoint would change nothing, and does nothing
    # (it refused before, as for a launch whose indices were not checked; Taichi's test_mod)
    assert scatter.grad() is None
    assert y.to_numpy()[0] == 14.0


def _field_index(lc, field) -> int:
    return next(k for k, st in enumerate(lc.compiled.storages) if st is field)


def test_grad_by_hand_after_a_checked_launch():
    """kernel.grad() by hand: the forward launch was checked because x has a gradient."""
    x, y, perm, _ = _scatter_fields()

    @ti.kernel
    def scatter():
        for i in range(N):
            y[perm[i]] = x[i] * x[i]

    xv = np.linspace(-1, 1, N).astype(np.float32)
    pv = np.roll(np.arange(N), 3).astype(np.int32)
    x.from_numpy(xv)
    perm.from_numpy(pv)
    scatter()
    y.grad.from_numpy(np.arange(1, N + 1, dtype=np.float32))
    scatter.grad()
    np.testing.assert_allclose(x.grad.to_numpy(), 2 * xv * (pv + 1), rtol=1e-6)


def _shuffle_fields():
    x = ti.field(ti.f32, shape=3, needs_grad=True, name="x")
    y = ti.field(ti.f32, shape=6, needs_grad=True, name="y")
    p = ti.field(ti.i32, shape=3, name="p")
    q = ti.field(ti.i32, shape=3, name="q")
    c = ti.field(ti.f32, shape=6, name="c")
    loss = ti.field(ti.f32, shape=(), needs_grad=True, name="loss")

    @ti.kernel
    def shuffle():
        for i in range(3):
            y[p[i]] = y[q[i]] * x[i]

    @ti.kernel
    def total():
        for i in range(6):
            loss[None] += c[i] * y[i]
    return x, y, p, q, c, loss, shuffle, total


def test_read_then_write_through_disjoint_index_fields():
    x, y, p, q, c, loss, shuffle, total = _shuffle_fields()
    pv, qv = np.array([0, 1, 2], np.int32), np.array([5, 3, 4], np.int32)
    xv = np.array([0.5, -1.5, 2.0], np.float32)
    yv = np.array([1.0, 2.0, 3.0, -1.0, 0.25, 4.0], np.float32)
    cv = np.array([1.0, -2.0, 3.0, 0.5, 1.5, -1.0], np.float32)
    for f_, v in ((x, xv), (y, yv), (p, pv), (q, qv), (c, cv)):
        f_.from_numpy(v)
    with ti.ad.Tape(loss):
        shuffle()
        total()

    def f(xs, ys):
        out = ys.copy()
        out[pv] = ys[qv] * xs
        return float((cv * out).sum())
    gx, gy = central_diffs(f, [xv, yv])
    assert loss[None] == pytest.approx(f(xv.astype(np.float64), yv.astype(np.float64)), rel=1e-5)
    assert_grad(x.grad.to_numpy(), gx)
    assert_grad(y.grad.to_numpy(), gy)


def test_read_then_write_through_colliding_index_fields_is_a_run_time_error():
    x, y, p, q, c, loss, shuffle, total = _shuffle_fields()
    p.from_numpy(np.array([0, 1, 2], np.int32))
    q.from_numpy(np.array([5, 3, 0], np.int32))  # iteration 2 reads y[0], which iteration 0 stores
    with pytest.raises(ti.ad.DataAccessError) as e:
        with ti.ad.Tape(loss):
            shuffle()
            total()
    text = str(e.value)
    assert (e.value.kernel, e.value.field, e.value.index) == ("shuffle", "y", (0,))
    line = e.value.line
    # which of the two came first on the GPU decides which one reports
    assert text.startswith((f"kernel 'shuffle': y[0] was read (line {line}) and then stored (line {line}) by the "
                            f"same launch: the gradient kernel replays the forward computation with the values "
                            f"after the launch",
                            f"kernel 'shuffle': y[0] was stored (line {line}) by one iteration of the parallel "
                            f"loop and read (line {line}) by another in the same launch")), text
    assert "The indices depend on the data, so this is checked at run time (the compiler cannot prove that " \
           "they never meet). Write the result to another field" in text


def test_a_value_read_back_by_the_iteration_that_stored_it():
    """y[p[i]] stored, then read through q[i] == p[i] by the same iteration: right (its adjoint
    runs in one thread, in reverse); q[i] pointing at another iteration's store is an error."""
    x = ti.field(ti.f32, shape=4, needs_grad=True, name="x")
    y = ti.field(ti.f32, shape=4, needs_grad=True, name="y")
    z = ti.field(ti.f32, shape=4, needs_grad=True, name="z")
    p = ti.field(ti.i32, shape=4, name="p")
    q = ti.field(ti.i32, shape=4, name="q")
    loss = ti.field(ti.f32, shape=(), needs_grad=True, name="loss")

    @ti.kernel
    def own():
        for i in range(4):
            y[p[i]] = x[i] * 3.0
            z[i] = y[q[i]] * y[q[i]]

    @ti.kernel
    def total():
        for i in range(4):
            loss[None] += z[i]

    xv = np.array([0.5, -1.0, 2.0, 1.5], np.float32)
    x.from_numpy(xv)
    p.from_numpy(np.array([2, 0, 3, 1], np.int32))
    q.from_numpy(np.array([2, 0, 3, 1], np.int32))
    with ti.ad.Tape(loss):
        own()
        total()
    np.testing.assert_allclose(x.grad.to_numpy(), 18 * xv, rtol=1e-6)  # d/dx (3x)^2

    q.from_numpy(np.array([0, 0, 3, 1], np.int32))  # iteration 0 reads what iteration 1 stores
    with pytest.raises(ti.ad.DataAccessError) as e:
        with ti.ad.Tape(loss):
            own()
            total()
    assert (e.value.field, e.value.index) == ("y", (0,))


def test_a_read_in_one_task_and_a_write_in_a_later_one():
    """Two parallel loops (two dispatches): the first reads y through q, the second stores
    through p; an element read by the first and stored by the second is an error."""
    x = ti.field(ti.f32, shape=3, needs_grad=True, name="x")
    y = ti.field(ti.f32, shape=6, needs_grad=True, name="y")
    z = ti.field(ti.f32, shape=3, needs_grad=True, name="z")
    p = ti.field(ti.i32, shape=3, name="p")
    q = ti.field(ti.i32, shape=3, name="q")
    loss = ti.field(ti.f32, shape=(), needs_grad=True, name="loss")

    @ti.kernel
    def two_loops():
        for i in range(3):
            z[i] = y[q[i]] * 2.0
        for i in range(3):
            y[p[i]] = x[i] * x[i]

    @ti.kernel
    def total():
        for i in range(6):
            loss[None] += y[i]
        for i in range(3):
            loss[None] += z[i] * z[i]

    xv = np.array([0.5, -1.0, 2.0], np.float32)
    yv = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], np.float32)
    pv, qv = np.array([0, 1, 2], np.int32), np.array([3, 4, 5], np.int32)
    x.from_numpy(xv)
    y.from_numpy(yv)
    p.from_numpy(pv)
    q.from_numpy(qv)
    with ti.ad.Tape(loss):
        two_loops()
        total()

    def f(xs, ys):
        zs = ys[qv] * 2
        out = ys.copy()
        out[pv] = xs * xs
        return float(out.sum() + (zs * zs).sum())
    gx, gy = central_diffs(f, [xv, yv])
    assert_grad(x.grad.to_numpy(), gx)
    assert_grad(y.grad.to_numpy(), gy)

    y.from_numpy(yv)
    q.from_numpy(np.array([3, 1, 5], np.int32))  # the first loop reads y[1], the second stores it
    with pytest.raises(ti.ad.DataAccessError) as e:
        with ti.ad.Tape(loss):
            two_loops()
            total()
    assert str(e.value).startswith("kernel 'two_loops': y[1] was read (line ")
    assert e.value.index == (1,)


def test_conditional_counter_runs_when_no_column_repeats():
    """docs/rules.md's calc_ewma_skipping: a counter stepped only when the data is positive picks
    the column; the gradient is exact where it never repeats, and a repeat is a run-time error."""
    rows, cols = 2, 4
    data = ti.field(ti.f32, shape=(rows, cols), needs_grad=True, name="data")
    ewma = ti.field(ti.f32, shape=(rows, cols), needs_grad=True, name="ewma")
    sample = ti.field(ti.i32, shape=rows, name="sample")
    w = ti.field(ti.f32, shape=(rows, cols), name="w")
    loss = ti.field(ti.f32, shape=(), needs_grad=True, name="loss")

    @ti.kernel
    def calc_ewma_skipping():
        for row in range(rows):
            for col in range(cols):
                col_idx = sample[row]
                ewma[row, col_idx] = data[row, col] * 0.5
                if data[row, col] > 0:
                    sample[row] += 1

    @ti.kernel
    def weighted():
        for r, c in ewma:
            loss[None] += w[r, c] * ewma[r, c]

    wv = np.arange(1, rows * cols + 1, dtype=np.float32).reshape(rows, cols)
    w.from_numpy(wv)
    data.from_numpy(np.array([[0.3, 0.7, 1.1, 0.2], [2.0, 0.1, 0.4, 0.9]], np.float32))
    sample.fill(0)
    with ti.ad.Tape(loss):
        calc_ewma_skipping()
        weighted()
    np.testing.assert_allclose(data.grad.to_numpy(), 0.5 * wv, rtol=1e-6)  # ewma = data / 2

    data.from_numpy(np.array([[0.3, 0.7, 1.1, 0.2], [2.0, -0.1, 0.4, 0.9]], np.float32))
    sample.fill(0)
    with pytest.raises(ti.ad.DataAccessError) as e:
        with ti.ad.Tape(loss):
            calc_ewma_skipping()
            weighted()
    assert str(e.value).startswith("kernel 'calc_ewma_skipping': ewma[1, 1] was stored twice by the same launch")
    assert e.value.index == (1, 1)


def test_certainly_repeated_stores_stay_compile_errors():
    """An affine index that leaves out the loop variable is wrong for every input: refused when
    the adjoint is compiled, as before, not checked at run time."""
    x = ti.field(ti.f32, shape=N, needs_grad=True, name="x")
    y = ti.field(ti.f32, shape=N, needs_grad=True, name="y")

    @ti.kernel
    def same_element():
        for i in range(N):
            y[2] = x[i]

    same_element()
    assert not same_element._cache or not next(iter(same_element._cache.values())).compiled.shadowed
    with pytest.raises(ti.CompileError, match="may be stored by more than one iteration or thread"):
        same_element.grad()


def test_a_read_after_an_atomic_update_of_another_iteration():
    """y[p[i]] += x[i] and a read of y[q[i]] in the same loop: right where no element both is
    updated and read (gradient as analytic), an error where one is."""
    n = 4
    x = ti.field(ti.f32, shape=n, needs_grad=True, name="x")
    y = ti.field(ti.f32, shape=n, needs_grad=True, name="y")
    z = ti.field(ti.f32, shape=n, needs_grad=True, name="z")
    p = ti.field(ti.i32, shape=n, name="p")
    q = ti.field(ti.i32, shape=n, name="q")
    loss = ti.field(ti.f32, shape=(), needs_grad=True, name="loss")

    @ti.kernel
    def gather_scatter():
        for i in range(n):
            y[p[i]] += x[i]
            z[i] = y[q[i]] * 2.0

    @ti.kernel
    def total():
        for i in range(n):
            loss[None] += z[i] * z[i] + y[i]

    yv = np.array([1.0, -2.0, 0.5, 3.0], np.float32)
    x.from_numpy(np.arange(1, n + 1, dtype=np.float32))
    y.from_numpy(yv)
    p.from_numpy(np.array([0, 0, 1, 1], np.int32))
    q.from_numpy(np.array([2, 3, 2, 3], np.int32))
    with ti.ad.Tape(loss):
        gather_scatter()
        total()
    np.testing.assert_allclose(x.grad.to_numpy(), np.ones(n))  # x reaches the loss only through sum(y)
    # d/dy[j] of sum(y) + sum over i with q[i] = j of (2 y[j])^2: 1 + 2 * 8 y[j] for j = 2, 3
    np.testing.assert_allclose(y.grad.to_numpy(), [1.0, 1.0, 1 + 16 * yv[2], 1 + 16 * yv[3]], rtol=1e-6)

    q.from_numpy(np.array([2, 3, 0, 3], np.int32))  # iteration 2 reads y[0], which 0 and 1 update
    with pytest.raises(ti.ad.DataAccessError) as e:
        with ti.ad.Tape(loss):
            gather_scatter()
            total()
    assert (e.value.field, e.value.index) == ("y", (0,))
    assert str(e.value).startswith(("kernel 'gather_scatter': y[0] was read (line ",))


def test_a_field_with_reads_of_its_pre_launch_copy_stays_refused():
    """x[i] = 2 x[i] reads a copy taken before the launch (promote.py); a data-dependent store to
    x in the same loop could change the element before that read, which the run-time check does
    not track: the kernel is refused when its adjoint is compiled, as before."""
    x = ti.field(ti.f32, shape=N, needs_grad=True, name="x")
    p = ti.field(ti.i32, shape=N, name="p")

    @ti.kernel
    def doubled_then_marked():
        for i in range(N):
            x[i] = x[i] * 2.0
            x[p[i]] = 1.0

    with pytest.raises(ti.CompileError, match="cannot differentiate kernel 'doubled_then_marked'"):
        doubled_then_marked.grad()


def test_ndarray_scatter_with_grad_by_hand():
    """ndarray arguments (plan.Arg sources): checked because x has a gradient; y = x^2 scattered."""
    n = 5

    @ti.kernel
    def scat(x: ti.types.ndarray(), p: ti.types.ndarray(), y: ti.types.ndarray()):
        for i in range(n):
            y[p[i]] = x[i] * x[i]

    x = ti.ndarray(ti.f32, n, needs_grad=True)
    y = ti.ndarray(ti.f32, n, needs_grad=True)
    p = ti.ndarray(ti.i32, n)
    xv = np.array([0.5, -1.0, 2.0, 1.5, -0.25], np.float32)
    gv = np.array([1.0, 2.0, -1.0, 0.5, 3.0], np.float32)
    x.from_numpy(xv)
    p.from_numpy(np.array([4, 2, 0, 1, 3], np.int32))
    scat(x, p, y)
    y.grad.from_numpy(gv)
    scat.grad(x, p, y)
    np.testing.assert_allclose(x.grad.to_numpy(), 2 * xv * gv[[4, 2, 0, 1, 3]], rtol=1e-6)

    p.from_numpy(np.array([4, 2, 0, 2, 3], np.int32))
    with pytest.raises(ti.ad.DataAccessError, match=r"^kernel 'scat': y\[2\] was stored twice by the same launch"):
        scat(x, p, y)


def test_the_checked_launch_record_names_the_storages_not_their_addresses():
    """kernel.grad() trusts a forward launch's check only for the very storages it ran with: the
    record keeps weak references beside the ids, so a storage allocated later at a freed one's
    address (CPython reuses addresses) is not taken for it."""
    import gc
    n = 5

    @ti.kernel
    def scat(x: ti.types.ndarray(), p: ti.types.ndarray(), y: ti.types.ndarray()):
        for i in range(n):
            y[p[i]] = x[i] * x[i]

    x = ti.ndarray(ti.f32, n, needs_grad=True)
    y = ti.ndarray(ti.f32, n, needs_grad=True)
    p = ti.ndarray(ti.i32, n)
    p.from_numpy(np.array([4, 2, 0, 1, 3], np.int32))
    scat(x, p, y)
    (lc,) = scat._cache.values()
    key = launches._run_key(lc, (x, p, y))
    assert launches._was_checked(scat, key)
    impostor = ti.ndarray(ti.i32, n)   # stands for a new array at p's address: same ids, other referent
    fake = (key[0], tuple(weakref.ref(impostor) if r() is p else r for r in key[1]))
    assert not launches._was_checked(scat, fake)
    del p
    gc.collect()
    assert not launches._was_checked(scat, key)   # the record's p is gone: no storage can match it


def test_a_launch_in_fwd_mode_is_not_taken_for_a_checked_one():
    """A launch inside ti.ad.FwdMode runs the dual kernel, which checks nothing: kernel.grad() by
    hand afterwards must not trust the check of the launch before it (here the forward mode's
    index repeats an element, which that check never saw), and says so."""
    x = ti.field(ti.f32, shape=N, needs_grad=True, needs_dual=True, name="x")
    y = ti.field(ti.f32, shape=N, needs_grad=True, needs_dual=True, name="y")
    perm = ti.field(ti.i32, shape=N, name="perm")

    @ti.kernel
    def scatter():
        for i in range(N):
            y[perm[i]] = x[i] * x[i]

    xv = np.linspace(-1, 1, N).astype(np.float32)
    x.from_numpy(xv)
    perm.from_numpy(np.roll(np.arange(N), 3).astype(np.int32))
    scatter()                          # checked: x has a gradient
    perm.from_numpy(np.array([1, 1, 1, 1, 1, 1, 1, 0], np.int32))
    with ti.ad.FwdMode(loss=y, param=x, seed=[1.0] * N):
        scatter()
    assert y.dual.to_numpy()[0] == pytest.approx(2 * xv[7], rel=1e-6)   # the dual ran
    y.grad.from_numpy(np.arange(1, N + 1, dtype=np.float32))
    with pytest.raises(ti.WgpuAdError, match=r"scatter.grad\(\): .*latest launch with these arguments was not "
                                             r"checked \(it ran inside ti.ad.FwdMode"):
        scatter.grad()
    with pytest.raises(ti.ad.DataAccessError, match=r"kernel 'scatter': y\[1\] was stored twice"):
        scatter()                      # a checked launch again: now the repeated index is found
        ti.sync()


def test_a_launch_in_fwd_mode_with_host_arrays_is_not_taken_for_a_checked_one():
    """The same with the index array passed as a NumPy array (copied in per launch, lang/external.py)."""
    x = ti.field(ti.f32, shape=N, needs_grad=True, needs_dual=True, name="x")
    y = ti.field(ti.f32, shape=N, needs_grad=True, needs_dual=True, name="y")

    @ti.kernel
    def scatter(perm: ti.types.ndarray()):
        for i in range(N):
            y[perm[i]] = x[i] * x[i]

    xv = np.linspace(-1, 1, N).astype(np.float32)
    x.from_numpy(xv)
    good = np.roll(np.arange(N), 3).astype(np.int32)
    scatter(good)                      # checked: x has a gradient
    y.grad.from_numpy(np.arange(1, N + 1, dtype=np.float32))
    scatter.grad(good)
    np.testing.assert_allclose(x.grad.to_numpy(), 2 * xv * (good + 1), rtol=1e-6)
    with ti.ad.FwdMode(loss=y, param=x, seed=[1.0] * N):
        scatter(np.array([1, 1, 1, 1, 1, 1, 1, 0], np.int32))
    with pytest.raises(ti.WgpuAdError, match=r"scatter.grad\(\): .*latest launch with these arguments was not "
                                             r"checked \(it ran inside ti.ad.FwdMode"):
        scatter.grad(good)
