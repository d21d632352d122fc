"""Correct programs the access analysis once refused (issue #26, items 6-9), each now proven by a
general rule, against analytic derivatives or float64 references; and the programs next to them
that break the rules, which must stay refused (or checked at run time).

  6. the kernel's top-level code is one thread running once: the single iteration of a loop
     (promote.py treats a serial task as a range task of one thread);
  7. a read whose value no derivative needs needs no copy of the field (needed.py): a store under
     an `if` in a serial loop no longer makes the field count as updated in place;
  8. a store under `if j == e` runs in at most one iteration of loop j (access.py _pinned_loops);
  9. `i % n` with 0 <= i < n is i (simplify.py _below, from the loop's range);
 10. under `if i == e` (e uniform) one thread of a parallel loop runs the statement: its read and
     update of s[None] are one thread's (pinned.py), in a serial loop too (promote.py);
 11. accesses whose index ranges, bounded by the loops' ranges, are disjoint never meet
     (ranges.py: a[i + 4] and a[i] with i < 4; x[t + 1, i] and x[0, i]); where the arguments
     decide, the launch checks them on the GPU;
 12. a linearised index y[2 i + j] with j < 2 stores each element once (ranges.py separated).
"""
from __future__ import annotations

import numpy as np
import pytest

import wgpu_ad as ti
from ad_util import assert_grad, central_diff, f32
from wgpu_ad.errors import DataAccessError

pytestmark = pytest.mark.gpu


# ---- 6: top-level code ----------------------------------------------------------------------------
def test_top_level_read_then_write_is_the_single_iteration_it_is():
    """Taichi's data-access rules #1 and #2 at kernel top level: loss = x[1] * b, then b += 100
    (the read of b sees the value before the update); loss += x[1]^2, then loss *= x[2]."""
    x = ti.field(ti.f32, shape=4, needs_grad=True)
    b = ti.field(ti.f32, shape=(), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def rule1():
        loss[None] = x[1] * b[None]
        b[None] += 100

    @ti.kernel
    def rule2():
        loss[None] += x[1] ** 2
        loss[None] *= x[2]

    x.from_numpy(f32([0.0, 2.0, 3.0, 0.0]))
    b[None] = 5.0
    with ti.ad.Tape(loss=loss):
        rule1()
    assert loss[None] == pytest.approx(10.0)
    assert b[None] == pytest.approx(105.0)
    np.testing.assert_allclose(x.grad.to_numpy(), [0.0, 5.0, 0.0, 0.0])   # d(x1 b)/dx1 = b before
    assert b.grad[None] == pytest.approx(2.0)                            # d(x1 b)/db = x1

    loss[None] = 0.0
    with ti.ad.Tape(loss=loss):
        rule2()
    assert loss[None] == pytest.approx(12.0)
    np.testing.assert_allclose(x.grad.to_numpy(), [0.0, 12.0, 4.0, 0.0])  # (2 x1 x2, x1^2)


def test_top_level_update_by_hand_without_a_tape():
    """The same top-level update with kernel.grad(): the read of y replays the copy of y taken
    before the launch (y = y^2 + c: d/dy = 2 y before)."""
    y = ti.field(ti.f32, shape=(), needs_grad=True)
    c = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def square():
        y[None] = y[None] * y[None] + c[None]

    y[None], c[None] = 0.75, 0.25
    square()
    y.grad[None] = 1.0
    square.grad()
    assert y.grad[None] == pytest.approx(1.5)
    assert c.grad[None] == pytest.approx(1.0)


def test_top_level_write_after_a_parallel_loop_read_stays_refused():
    """A parallel loop reads b, then the top level overwrites it: two dispatches, the replay of
    the first would read the new value. Still refused, naming the field and both lines."""
    x = ti.field(ti.f32, shape=4, needs_grad=True)
    b = ti.field(ti.f32, shape=(), needs_grad=True)
    y = ti.field(ti.f32, shape=4, needs_grad=True)

    @ti.kernel
    def clobber():
        for i in range(4):
            y[i] = x[i] * b[None]
        b[None] = b[None] * 3.0

    with pytest.raises(ti.NotDifferentiableError, match=r"kernel 'clobber': it reads field 'b' \(line \d+\) "
                                                        r"and then overwrites what it read"):
        clobber.grad()


# ---- 7: a conditional store in a serial loop --------------------------------------------------------
def test_component_store_at_run_time_indices_needs_no_forward_launch():
    """Taichi's test_ad_dynamic_index: m[i][j, k] = (j + 1)(k + 1) n[i][j, k] with j, k serial loop
    indices (a store under an `if` per component), loss += m[i][j, k]; kernel.grad() with no
    forward launch before it, as in Taichi: d loss / d n[i][j, k] = (j + 1)(k + 1)."""
    m = ti.Matrix.field(2, 2, ti.f32, 5, needs_grad=True)
    n = ti.Matrix.field(2, 2, ti.f32, 5, needs_grad=True)
    loss = ti.field(ti.f32, (), needs_grad=True)
    n.fill(0)

    @ti.kernel
    def func1():
        for i in range(5):
            for j, k in ti.ndrange(2, 2):
                m[i][j, k] = (j + 1) * (k + 1) * n[i][j, k]
                loss[None] += m[i][j, k]

    loss.grad[None] = 1.0
    func1.grad()
    want = np.array([[1.0, 2.0], [2.0, 4.0]])
    np.testing.assert_allclose(n.grad.to_numpy(), np.broadcast_to(want, (5, 2, 2)))


def test_conditional_store_in_a_serial_loop_copies_nothing_on_a_tape():
    """y[i] = 2 x[i] k under `if k == c[None]` inside `for k in range(3)` (c read at run time: the
    store may not happen, and y keeps its value): the gradients are exact for both outcomes, and
    the launch keeps no copy of y (kernel.grad() by hand needs no forward launch before it)."""
    x = ti.field(ti.f32, shape=4, needs_grad=True)
    y = ti.field(ti.f32, shape=4, needs_grad=True)
    c = ti.field(ti.i32, shape=())
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def pick():
        for i in range(4):
            for k in range(3):
                if k == c[None] + i % 2:
                    y[i] = 2.0 * x[i] * k

    @ti.kernel
    def total():
        for i in range(4):
            loss[None] += (i + 1.0) * y[i] * y[i]

    x0, y0 = np.array([0.5, -0.25, 0.75, 1.0]), np.array([0.1, 0.2, -0.3, 0.4])
    for cv in (1, 2):
        x.from_numpy(f32(x0))
        y.from_numpy(f32(y0))
        c[None] = cv
        with ti.ad.Tape(loss=loss):
            pick()
            total()
        kk = np.array([cv + i % 2 for i in range(4)])
        hit = kk < 3
        yv = np.where(hit, 2.0 * x0 * kk, y0)
        w = np.arange(1.0, 5.0)
        assert loss[None] == pytest.approx(float(np.sum(w * yv * yv)), rel=1e-5)
        assert_grad(x.grad.to_numpy(), np.where(hit, 2 * w * yv * 2.0 * kk, 0.0))
        assert_grad(y.grad.to_numpy(), np.where(hit, 0.0, 2 * w * yv))
    # no copy of y is needed: by hand, with no forward launch right before (as Taichi allows)
    x.grad.fill(0.0)
    y.grad.fill(1.0)
    pick.grad()
    np.testing.assert_allclose(x.grad.to_numpy(), np.where(hit, 2.0 * kk, 0.0))
    np.testing.assert_allclose(y.grad.to_numpy(), np.where(hit, 0.0, 1.0))


def test_value_needed_by_a_derivative_still_gets_its_copy():
    """x[i] = x[i] * x[i] needs x's value before the launch (its derivative is 2 x): kernel.grad()
    without the forward launch right before it is still refused with the fix."""
    x = ti.field(ti.f32, shape=3, needs_grad=True)

    @ti.kernel
    def square():
        for i in x:
            x[i] = x[i] * x[i]

    x.grad.fill(1.0)
    with pytest.raises(ti.WgpuAdError, match=r"square.grad\(\): kernel 'square' updates field 'x' in place"):
        square.grad()


def test_linear_in_place_update_needs_no_copy():
    """x[i] = 3 x[i] + y[i]: the derivative reads no value of x, so kernel.grad() works without a
    forward launch before it (x.grad = 3 x.grad, y.grad += x.grad)."""
    x = ti.field(ti.f32, shape=3, needs_grad=True)
    y = ti.field(ti.f32, shape=3, needs_grad=True)

    @ti.kernel
    def affine():
        for i in x:
            x[i] = 3.0 * x[i] + y[i]

    x.grad.from_numpy(f32([1.0, 2.0, -1.0]))
    affine.grad()
    np.testing.assert_allclose(x.grad.to_numpy(), [3.0, 6.0, -3.0])
    np.testing.assert_allclose(y.grad.to_numpy(), [1.0, 2.0, -1.0])


# ---- 8: a conditional store at a computed index -----------------------------------------------------
def test_store_under_an_equality_runs_once_per_step():
    """for t in range(4): for j in range(3): if j == 1: x[t + 1, i] = 2 x[t, i]: one store per
    step; x.grad[0, i] = 2^4 for loss = sum_i x[4, i]."""
    N = 3
    x = ti.field(ti.f32, shape=(5, N), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def steps():
        for i in range(N):
            for t in range(4):
                for j in range(3):
                    if j == 1:
                        x[t + 1, i] = 2.0 * x[t, i]

    @ti.kernel
    def total():
        for i in range(N):
            loss[None] += x[4, i]

    x.from_numpy(f32(np.ones((5, N))))
    with ti.ad.Tape(loss=loss):
        steps()
        total()
    np.testing.assert_allclose(x.to_numpy()[4], [16.0] * N)
    np.testing.assert_allclose(x.grad.to_numpy()[0], [16.0] * N)
    np.testing.assert_allclose(x.grad.to_numpy()[1:], 0.0)


@pytest.mark.parametrize("form", ["outer_index", "conjunct", "else_of_not_equal"])
def test_equalities_that_pin_a_loop(form):
    """`if j == t` (t an outer loop's index), `if j == 1 and gate[i] > 0`, and the else of
    `if j != 2`: each pins j to one iteration; x[4, i] = 2^4 x[0, i] (loss = sum_i x[4, i])."""
    N = 3
    x = ti.field(ti.f32, shape=(5, N), needs_grad=True)
    gate = ti.field(ti.f32, shape=N)
    gate.fill(1.0)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    if form == "outer_index":
        @ti.kernel
        def steps():
            for i in range(N):
                for t in range(4):
                    for j in range(4):
                        if j == t:
                            x[t + 1, i] = 2.0 * x[t, i]
    elif form == "conjunct":
        @ti.kernel
        def steps():
            for i in range(N):
                for t in range(4):
                    for j in range(3):
                        if j == 1 and gate[i] > 0.0:
                            x[t + 1, i] = 2.0 * x[t, i]
    else:
        @ti.kernel
        def steps():
            for i in range(N):
                for t in range(4):
                    for j in range(3):
                        if j != 2:
                            pass
                        else:
                            x[t + 1, i] = 2.0 * x[t, i]

    @ti.kernel
    def total():
        for i in range(N):
            loss[None] += x[4, i]

    x0 = np.array([0.5, -1.0, 2.0])
    x.from_numpy(f32(np.tile(x0, (5, 1))))
    with ti.ad.Tape(loss=loss):
        steps()
        total()
    np.testing.assert_allclose(x.to_numpy()[4], 16.0 * x0)
    np.testing.assert_allclose(x.grad.to_numpy()[0], [16.0] * N)


def test_store_at_an_offset_under_an_equality():
    """a[i + 4] = sin(a[i]) * a[i] under `if j == i % 2` inside `for j in range(2)`, i a serial
    loop: each a[i + 4] stored once; against float64 central differences."""
    a = ti.field(ti.f32, shape=8, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def shift():
        ti.loop_config(serialize=True)
        for i in range(4):
            for j in range(2):
                if j == i % 2:
                    a[i + 4] = ti.sin(a[i]) * a[i]

    @ti.kernel
    def total():
        for i in range(8):
            loss[None] += (i + 1.0) * a[i]

    a0 = np.linspace(-0.8, 0.9, 8)

    def ref(v):
        v = v.copy()
        v[4:] = np.sin(v[:4]) * v[:4]
        return float(np.sum(np.arange(1.0, 9.0) * v))

    a.from_numpy(f32(a0))
    with ti.ad.Tape(loss=loss):
        shift()
        total()
    assert loss[None] == pytest.approx(ref(f32(a0).astype(np.float64)), rel=1e-5)
    assert_grad(a.grad.to_numpy(), central_diff(ref, f32(a0).astype(np.float64)))


def test_store_under_an_inequality_stays_refused():
    """`if j != 1` (or j <= 1) lets two iterations store the same x[t + 1, i]: still refused."""
    x = ti.field(ti.f32, shape=(5, 3), needs_grad=True)

    @ti.kernel
    def twice():
        for i in range(3):
            for t in range(4):
                for j in range(3):
                    if j != 1:
                        x[t + 1, i] = 2.0 * x[t, i] + j

    with pytest.raises(ti.NotDifferentiableError, match=r"kernel 'twice': it stores to field 'x' \(line \d+\) "
                                                        r"inside a loop, and the same element may be stored by "
                                                        r"more than one iteration"):
        twice.grad()


def test_store_under_an_equality_with_an_inner_index_stays_refused():
    """`if j == k` with k the index of a loop inside j's: j is not pinned (each j meets a k), and
    x[t + 1, i] is stored in several iterations of j: still refused."""
    x = ti.field(ti.f32, shape=(5, 3), needs_grad=True)

    @ti.kernel
    def diagonal():
        for i in range(3):
            for t in range(4):
                for j in range(3):
                    for k in range(3):
                        if j == k:
                            x[t + 1, i] = 2.0 * x[t, i] + j

    with pytest.raises(ti.NotDifferentiableError, match=r"may be stored by more than one iteration"):
        diagonal.grad()


# ---- 9: i % n ---------------------------------------------------------------------------------------
def test_modulo_by_the_loop_extent_is_the_index():
    """x[i] = sin(x[i]) + x[i % N] * y[i] with i in range(N): i % N is i, an update of the thread's
    own element (no run-time check); loss = sum x^2 against float64 central differences."""
    N = 5
    x = ti.field(ti.f32, shape=N, needs_grad=True)
    y = ti.field(ti.f32, shape=N, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def update(n: ti.i32):
        for i in range(n):
            x[i] = ti.sin(x[i]) + x[i % n] * y[i % N]

    @ti.kernel
    def total():
        for i in range(N):
            loss[None] += x[i] * x[i]

    x0, y0 = np.linspace(-1.0, 1.0, N), np.linspace(0.5, -0.5, N)

    def ref(xv, yv):
        return float(np.sum((np.sin(xv) + xv * yv) ** 2))

    x.from_numpy(f32(x0))
    y.from_numpy(f32(y0))
    with ti.ad.Tape(loss=loss):
        update(N)
        total()
    xr, yr = f32(x0).astype(np.float64), f32(y0).astype(np.float64)
    assert loss[None] == pytest.approx(ref(xr, yr), rel=1e-5)
    assert_grad(x.grad.to_numpy(), central_diff(lambda v: ref(v, yr), xr))
    assert_grad(y.grad.to_numpy(), central_diff(lambda v: ref(xr, v), yr))


def test_modulo_by_less_than_the_extent_stays_checked():
    """x[i] = x[i % 3] * 2 with i in range(6): threads 3..5 read what threads 0..2 store, a real
    read-then-overwrite; the run-time check names it."""
    x = ti.field(ti.f32, shape=6, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def fold():
        for i in range(6):
            x[i] = x[i % 3] * 2.0

    @ti.kernel
    def total():
        for i in range(6):
            loss[None] += x[i]

    x.fill(1.0)
    with pytest.raises(DataAccessError, match=r"kernel 'fold': x\[0\] was read \(line \d+\) and then stored "
                                              r"\(line \d+\) by the same launch"):
        with ti.ad.Tape(loss=loss):
            fold()
            total()


def test_modulo_folds_only_inside_the_range():
    """(i + 1) % n is not i: the IR keeps the modulo (a read of the next element)."""
    n = 4
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    y = ti.field(ti.f32, shape=n, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def roll():
        for i in range(n):
            y[i] = x[(i + 1) % n] * x[i % n]

    @ti.kernel
    def total():
        for i in range(n):
            loss[None] += y[i]

    x0 = np.array([0.5, -1.0, 2.0, 0.25])
    x.from_numpy(f32(x0))
    with ti.ad.Tape(loss=loss):
        roll()
        total()
    np.testing.assert_allclose(y.to_numpy(), np.roll(x0, -1) * x0, rtol=1e-6)
    np.testing.assert_allclose(x.grad.to_numpy(), np.roll(x0, -1) + np.roll(x0, 1), rtol=1e-6)


# ---- 10: one thread of a parallel loop ----------------------------------------------------------
def _one_thread_kernel(form: str, s, x, y):
    """for i in range(8): under an equality that holds in one thread k, s = s^2 x[k]; y[i] = 2 x[i]."""
    if form == "i == 0":
        @ti.kernel
        def update():
            for i in range(8):
                if i == 0:
                    s[None] = s[None] * s[None] * x[i]
                y[i] = 2.0 * x[i]
        return update, (), 0
    if form == "i == 3":
        @ti.kernel
        def update():
            for i in range(8):
                y[i] = 2.0 * x[i]
                if 3 == i:
                    s[None] = s[None] * s[None] * x[i]
        return update, (), 3
    if form == "i == n - 1 (template)":
        @ti.kernel
        def update(n: ti.template()):
            for i in range(n):
                if i == n - 1:
                    s[None] = s[None] * s[None] * x[i]
                y[i] = 2.0 * x[i]
        return update, (8,), 7
    if form == "i == m - 1 (argument)":
        @ti.kernel
        def update(m: ti.i32):
            for i in range(8):
                if i == m - 1 and x[i] > -10.0:
                    s[None] = s[None] * s[None] * x[i]
                y[i] = 2.0 * x[i]
        return update, (6,), 5
    if form == "i == target[None] (set by an earlier task)":
        target = ti.field(ti.i32, shape=())

        @ti.kernel
        def update():
            target[None] = 4
            for i in range(8):
                if target[None] == i:
                    s[None] = s[None] * s[None] * x[i]
                y[i] = 2.0 * x[i]
        return update, (), 4
    assert form == "i == 2 and j == 1 (ndrange)"

    @ti.kernel
    def update():
        for i, j in ti.ndrange(4, 2):
            if i == 2 and j == 1:
                s[None] = s[None] * s[None] * x[2 * i + j]
        for i in range(8):
            y[i] = 2.0 * x[i]
    return update, (), 5


@pytest.mark.parametrize("form", ["i == 0", "i == 3", "i == n - 1 (template)", "i == m - 1 (argument)",
                                  "i == target[None] (set by an earlier task)", "i == 2 and j == 1 (ndrange)"])
def test_update_by_one_thread_of_a_parallel_loop(form):
    """`if i == e: s[None] = s[None]^2 x[i]` with e uniform (a constant, a template, an argument, a
    field element only an earlier task writes): one thread reads and overwrites s, like top-level code;
    the read replays a copy from before the launch. loss = 3 s + sum_i (i + 1) y_i: d/ds0 = 6 s0 x_k, d/dx_k = 3 s0^2 + 2 (k + 1)."""
    s = ti.field(ti.f32, shape=(), needs_grad=True)
    x = ti.field(ti.f32, shape=8, needs_grad=True)
    y = ti.field(ti.f32, shape=8, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    update, args, k = _one_thread_kernel(form, s, x, y)

    @ti.kernel
    def total():
        for i in range(8):
            loss[None] += (i + 1.0) * y[i]
        loss[None] += 3.0 * s[None]

    x0, s0 = np.linspace(-0.9, 1.3, 8), 0.7
    x.from_numpy(f32(x0))
    s[None] = s0
    with ti.ad.Tape(loss=loss):
        update(*args)
        total()
    xr, sr = f32(x0).astype(np.float64), float(np.float32(s0))
    assert s[None] == pytest.approx(sr * sr * xr[k], rel=1e-6)
    want_x = 2.0 * np.arange(1.0, 9.0)
    want_x[k] += 3.0 * sr * sr
    assert_grad(x.grad.to_numpy(), want_x)
    assert s.grad[None] == pytest.approx(6.0 * sr * xr[k], rel=1e-5)


@pytest.mark.parametrize("form, message", [
    ("i % 2 == 0", r"kernel 'update': it reads field 's' \(line \d+\) and then overwrites what it read"),
    ("x[i] > 0", r"kernel 'update': it reads field 's' \(line \d+\) and then overwrites what it read"),
    ("ndrange, i == 0 only", r"kernel 'update': it reads field 's' \(line \d+\) and then overwrites what it read"),
    ("two threads", r"kernel 'update': it writes field 's' \(line \d+\) and writes the same elements again"),
    ("target written in the task", r"kernel 'update': it reads field 'target' \(line \d+\) and then overwrites "
                                   r"what it read"),
    ("every thread reads", r"kernel 'update': it reads field 's' \(line \d+\) and then overwrites what it read"),
])
def test_update_by_several_threads_stays_refused(form, message):
    """An equality that can hold in several threads (i % 2 == 0, data, one ndrange dimension of
    two, a field element the same task writes), two threads pinned to different values (i == 0
    and i == 1), or a read of s by every thread after thread 0 updated it: races in the forward,
    refused with the field and lines."""
    s = ti.field(ti.f32, shape=(), needs_grad=True)
    x = ti.field(ti.f32, shape=8, needs_grad=True)
    y = ti.field(ti.f32, shape=8, needs_grad=True)
    if form == "i % 2 == 0":
        @ti.kernel
        def update():
            for i in range(8):
                if i % 2 == 0:
                    s[None] = s[None] * x[i]
    elif form == "x[i] > 0":
        @ti.kernel
        def update():
            for i in range(8):
                if x[i] > 0.0:
                    s[None] = s[None] * x[i]
    elif form == "ndrange, i == 0 only":
        @ti.kernel
        def update():
            for i, j in ti.ndrange(4, 2):
                if i == 0:
                    s[None] = s[None] * x[i + j]
    elif form == "target written in the task":
        target = ti.field(ti.i32, shape=8)

        @ti.kernel
        def update():
            for i in range(8):
                target[i] = 7 - i
                if i == target[0]:
                    s[None] = s[None] * x[i]
    elif form == "two threads":
        @ti.kernel
        def update():
            for i in range(8):
                if i == 0:
                    s[None] = s[None] * x[i]
                if i == 1:
                    s[None] = x[i]
    else:
        @ti.kernel
        def update():
            for i in range(8):
                if i == 0:
                    s[None] = s[None] * x[i]
                y[i] = s[None]

    with pytest.raises(ti.NotDifferentiableError, match=message):
        update.grad()


def test_two_updates_in_one_thread_of_a_parallel_loop():
    """`if i == 2: s = s x[i]; s = s^2 + x[0]`: the second read sees the first store (forwarded
    within the one thread, promote.py); s2 = (s0 x2)^2 + x0: d/ds0 = 2 s0 x2^2, d/dx2 = 2 s0^2 x2,
    d/dx0 = 1."""
    s = ti.field(ti.f32, shape=(), needs_grad=True)
    x = ti.field(ti.f32, shape=4, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def twice():
        for i in range(4):
            if i == 2:
                s[None] = s[None] * x[i]
                s[None] = s[None] * s[None] + x[0]

    @ti.kernel
    def total():
        loss[None] = s[None]

    x0, s0 = np.array([0.5, 1.0, 1.5, 2.0]), 0.3
    x.from_numpy(f32(x0))
    s[None] = s0
    with ti.ad.Tape(loss=loss):
        twice()
        total()
    xr, sr = f32(x0).astype(np.float64), float(np.float32(s0))
    assert s[None] == pytest.approx((sr * xr[2]) ** 2 + xr[0], rel=1e-6)
    assert s.grad[None] == pytest.approx(2.0 * sr * xr[2] ** 2, rel=1e-5)
    assert_grad(x.grad.to_numpy(), [1.0, 0.0, 2.0 * sr * sr * xr[2], 0.0])


def test_serial_loop_in_one_thread_of_a_parallel_loop():
    """`if i == 0: for j in range(4): s = s x[j] + 1`: the serial loop runs in one thread, so s is
    that thread's element across it (promote.py keeps it in a local); s4 = ((((s0 x0 + 1) x1 + 1)
    x2 + 1) x3 + 1): d/ds0 = x0 x1 x2 x3, d/dx_j = s_j prod_{k > j} x_k. Other threads reading s
    after the loop would race, and stay refused."""
    s = ti.field(ti.f32, shape=(), needs_grad=True)
    x = ti.field(ti.f32, shape=4, needs_grad=True)
    y = ti.field(ti.f32, shape=4, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def horner():
        for i in range(4):
            if i == 0:
                for j in range(4):
                    s[None] = s[None] * x[j] + 1.0
            y[i] = 2.0 * x[i]

    @ti.kernel
    def total():
        loss[None] = s[None]
        for i in range(4):
            loss[None] += y[i]

    x0, s0 = np.array([0.5, -1.25, 1.5, 2.0]), 0.3
    x.from_numpy(f32(x0))
    s[None] = s0
    with ti.ad.Tape(loss=loss):
        horner()
        total()
    xr, sr = f32(x0).astype(np.float64), float(np.float32(s0))
    states = [sr]
    for v in xr:
        states.append(states[-1] * v + 1.0)
    assert s[None] == pytest.approx(states[4], rel=1e-5)
    assert s.grad[None] == pytest.approx(float(np.prod(xr)), rel=1e-5)
    want = np.array([states[j] * np.prod(xr[j + 1:]) for j in range(4)]) + 2.0
    assert_grad(x.grad.to_numpy(), want)

    @ti.kernel
    def shared():
        for i in range(4):
            if i == 0:
                for j in range(4):
                    s[None] = s[None] * x[j] + 1.0
            y[i] = s[None]

    with pytest.raises(ti.NotDifferentiableError, match=r"kernel 'shared': it reads field 's' \(line \d+\) and "
                                                        r"then overwrites what it read"):
        shared.grad()


# ---- 11: index ranges -------------------------------------------------------------------------------
def _rollout_ref(x0: np.ndarray, T: int) -> float:
    """x[t + 1] = sin(x[t]) + 0.5 x[0] for t < T; loss = sum_i (i + 1) x[T, i] (float64)."""
    rows = [x0[0]]
    for t in range(T):
        rows.append(np.sin(rows[t]) + 0.5 * x0[0])
    return float(np.sum(np.arange(1.0, x0.shape[1] + 1) * rows[T]))


@pytest.mark.parametrize("layout", ["serial t in a parallel i", "serialized t, then i"])
def test_steps_after_the_first_never_store_row_zero(layout):
    """x[t + 1, i] = sin(x[t, i]) + 0.5 x[0, i] in `for t in range(T)` (T an argument): t + 1 >= 1,
    so the stores never touch row 0, which every step reads (ranges.py); against float64 central
    differences through all rows."""
    T, N = 3, 4
    x = ti.field(ti.f32, shape=(T + 1, N), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    if layout == "serial t in a parallel i":
        @ti.kernel
        def roll(steps: ti.i32):
            for i in range(N):
                for t in range(steps):
                    x[t + 1, i] = ti.sin(x[t, i]) + 0.5 * x[0, i]
    else:
        @ti.kernel
        def roll(steps: ti.i32):
            ti.loop_config(serialize=True)
            for t in range(steps):
                for i in range(N):
                    x[t + 1, i] = ti.sin(x[t, i]) + 0.5 * x[0, i]

    @ti.kernel
    def total():
        for i in range(N):
            loss[None] += (i + 1.0) * x[T, i]

    x0 = np.random.default_rng(3).uniform(-1.0, 1.0, (T + 1, N))
    x.from_numpy(f32(x0))
    with ti.ad.Tape(loss=loss):
        roll(T)
        total()
    xr = f32(x0).astype(np.float64)
    assert loss[None] == pytest.approx(_rollout_ref(xr, T), rel=1e-5)
    assert_grad(x.grad.to_numpy(), central_diff(lambda v: _rollout_ref(v, T), xr))


def test_shifted_store_past_the_range_it_reads():
    """a[i + 4] = sin(a[i]) a[i] with i in range(4) (parallel): stores a[4..7], reads a[0..3]; and
    b[i + 2, j] = b[i, j]^2 over ti.ndrange(2, 3) (rows 2..3 stored, 0..1 read, the ndrange's
    decoded dimensions bounded by their extents); against float64 central differences."""
    a = ti.field(ti.f32, shape=8, needs_grad=True)
    b = ti.field(ti.f32, shape=(4, 3), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def shift():
        for i in range(4):
            a[i + 4] = ti.sin(a[i]) * a[i]
        for i, j in ti.ndrange(2, 3):
            b[i + 2, j] = b[i, j] * b[i, j]

    @ti.kernel
    def total():
        for i in range(8):
            loss[None] += (i + 1.0) * a[i]
        for i, j in b:
            loss[None] += (i + 2.0 * j + 1.0) * b[i, j]

    def ref(av, bv):
        av, bv = av.copy(), bv.copy()
        av[4:] = np.sin(av[:4]) * av[:4]
        bv[2:] = bv[:2] ** 2
        w = np.arange(4)[:, None] + 2.0 * np.arange(3)[None, :] + 1.0
        return float(np.sum(np.arange(1.0, 9.0) * av) + np.sum(w * bv))

    a0 = np.linspace(-0.8, 0.9, 8)
    b0 = np.linspace(-1.2, 1.1, 12).reshape(4, 3)
    a.from_numpy(f32(a0))
    b.from_numpy(f32(b0))
    with ti.ad.Tape(loss=loss):
        shift()
        total()
    ar, br = f32(a0).astype(np.float64), f32(b0).astype(np.float64)
    assert loss[None] == pytest.approx(ref(ar, br), rel=1e-5)
    assert_grad(a.grad.to_numpy(), central_diff(lambda v: ref(v, br), ar))
    assert_grad(b.grad.to_numpy(), central_diff(lambda v: ref(ar, v), br))


@pytest.mark.parametrize("form", ["a[i + 3] with i < 4", "x[1, i] read", "ndrange rows overlap"])
def test_ranges_that_meet_stay_refused(form):
    """a[i + 3] = f(a[i]) with i in range(4) (a[3] is read by thread 3 and stored by thread 0);
    a read of x[1, i] that step t = 0 overwrites; b[i + 1, j] = b[i, j]^2 over ndrange(2, 3):
    the ranges meet, still refused, naming the field and the lines."""
    a = ti.field(ti.f32, shape=8, needs_grad=True)
    x = ti.field(ti.f32, shape=(5, 4), needs_grad=True)
    b = ti.field(ti.f32, shape=(4, 3), needs_grad=True)
    if form == "a[i + 3] with i < 4":
        field = "a"

        @ti.kernel
        def k():
            for i in range(4):
                a[i + 3] = ti.sin(a[i])
    elif form == "x[1, i] read":
        field = "x"

        @ti.kernel
        def k():
            for i in range(4):
                for t in range(4):
                    x[t + 1, i] = ti.sin(x[t, i]) + x[1, i]
    else:
        field = "b"

        @ti.kernel
        def k():
            for i, j in ti.ndrange(2, 3):
                b[i + 1, j] = b[i, j] * b[i, j]

    with pytest.raises(ti.NotDifferentiableError, match=rf"kernel 'k': it reads field '{field}' \(line \d+\) "
                                                        r"and then overwrites what it read"):
        k.grad()


def test_ranges_decided_by_an_argument_are_checked_at_run_time():
    """a[i + 4] = sin(a[i]) a[i] in `for i in range(n)`, n an argument: apart for n <= 4 only, so
    not refused but checked on the GPU. n = 3, 4: exact gradients (float64 central differences);
    n = 5: thread 0 stores a[4], which thread 4 reads, and the launch says so, naming the cause."""
    a = ti.field(ti.f32, shape=12, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def shift(n: ti.i32):
        for i in range(n):
            a[i + 4] = ti.sin(a[i]) * a[i]

    @ti.kernel
    def total():
        for i in range(12):
            loss[None] += (i + 1.0) * a[i]

    a0 = np.linspace(-0.8, 0.9, 12)

    def ref(v, n):
        v = v.copy()
        v[4:4 + n] = np.sin(v[:n]) * v[:n]
        return float(np.sum(np.arange(1.0, 13.0) * v))

    ar = f32(a0).astype(np.float64)
    for n in (3, 4):
        a.from_numpy(f32(a0))
        loss[None] = 0.0
        with ti.ad.Tape(loss=loss):
            shift(n)
            total()
        assert loss[None] == pytest.approx(ref(ar, n), rel=1e-5)
        assert_grad(a.grad.to_numpy(), central_diff(lambda v: ref(v, n), ar))
    a.from_numpy(f32(a0))
    with pytest.raises(DataAccessError) as e:
        with ti.ad.Tape(loss=loss):
            shift(5)
            total()
    text = str(e.value)
    assert text.startswith((f"kernel 'shift': a[4] was read (line {e.value.line}) and then stored",
                            f"kernel 'shift': a[4] was stored (line {e.value.line}) by one iteration of the "
                            f"parallel loop and read")), text
    assert "Whether the indices meet depends on the kernel's arguments (the loops' ranges), so this is " \
           "checked at run time" in text


def test_two_stores_whose_ranges_an_argument_decides():
    """a[i] = x[i] and a[i + m] = 2 x[i] in `for i in range(4)`, m an argument: each element stored
    once for m >= 4 (exact gradients, analytic), stored twice for m = 2 (a run-time error)."""
    a = ti.field(ti.f32, shape=12, needs_grad=True)
    x = ti.field(ti.f32, shape=4, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def spread(m: ti.i32):
        for i in range(4):
            a[i] = x[i]
            a[i + m] = 2.0 * x[i]

    @ti.kernel
    def total():
        for i in range(12):
            loss[None] += (i + 1.0) * a[i]

    x.from_numpy(f32([0.5, -1.0, 2.0, 0.25]))
    with ti.ad.Tape(loss=loss):
        spread(6)
        total()
    np.testing.assert_allclose(x.grad.to_numpy(), np.arange(1.0, 5.0) + 2.0 * np.arange(7.0, 11.0))
    with pytest.raises(DataAccessError, match=r"kernel 'spread': a\[\d\] was stored twice by the same launch "
                                              r"\(line \d+\): only the last value survives, so the gradient "
                                              r"would be silently wrong. Whether the indices meet depends on "
                                              r"the kernel's arguments"):
        with ti.ad.Tape(loss=loss):
            spread(2)
            total()


# ---- 12: a linearised index -------------------------------------------------------------------------
@pytest.mark.parametrize("form", ["y[2 i + j], ndrange(4, 2)", "y[i + 3 j], ndrange(3, 4)",
                                  "y[3 i + j], serial j < 3, i < n"])
def test_linearised_index_stores_each_element_once(form):
    """A store at a linearised index (mixed radix: each coefficient exceeds what the smaller terms
    span, ranges.py separated) stores each element once; y = 3 x there, loss = sum (k + 1) y_k^2:
    d/dx_k = 18 (k + 1) x_k on the stored elements, 0 elsewhere."""
    y = ti.field(ti.f32, shape=24, needs_grad=True)
    x = ti.field(ti.f32, shape=24, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    args: tuple = ()
    if form.startswith("y[2 i"):
        @ti.kernel
        def store():
            for i, j in ti.ndrange(4, 2):
                y[2 * i + j] = 3.0 * x[2 * i + j]
        stored = 8
    elif form.startswith("y[i + 3 j]"):
        @ti.kernel
        def store():
            for i, j in ti.ndrange(3, 4):
                y[i + 3 * j] = 3.0 * x[i + 3 * j]
        stored = 12
    else:
        @ti.kernel
        def store(n: ti.i32):
            for i in range(n):
                for j in range(3):
                    y[3 * i + j] = 3.0 * x[3 * i + j]
        args, stored = (7,), 21

    @ti.kernel
    def total():
        for k in range(24):
            loss[None] += (k + 1.0) * y[k] * y[k]

    x0 = np.linspace(-1.0, 1.0, 24)
    x.from_numpy(f32(x0))
    with ti.ad.Tape(loss=loss):
        store(*args)
        total()
    xr = f32(x0).astype(np.float64)
    want = np.where(np.arange(24) < stored, 18.0 * np.arange(1.0, 25.0) * xr, 0.0)
    assert_grad(x.grad.to_numpy(), want)


@pytest.mark.parametrize("form", ["y[2 i + j], j < 3", "y[i + j]"])
def test_linearised_index_that_repeats_stays_refused(form):
    """y[2 i + j] with j in range(3) (2 * 1 + 0 == 2 * 0 + 2) and y[i + j]: elements stored by
    two threads, refused with the field and the line."""
    y = ti.field(ti.f32, shape=24, needs_grad=True)
    x = ti.field(ti.f32, shape=24, needs_grad=True)
    if form == "y[i + j]":
        @ti.kernel
        def store():
            for i, j in ti.ndrange(4, 4):
                y[i + j] = 3.0 * x[i]
    else:
        @ti.kernel
        def store():
            for i, j in ti.ndrange(4, 3):
                y[2 * i + j] = 3.0 * x[i]

    with pytest.raises(ti.NotDifferentiableError, match=r"kernel 'store': it stores to field 'y' \(line \d+\) "
                                                        r"inside a loop, and the same element may be stored by "
                                                        r"more than one iteration or thread"):
        store.grad()
