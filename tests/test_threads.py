"""Several Python threads on one session: their launches, read-backs and writes are recorded one
at a time (the runtime's lock), and each thread's ti.ad.Tape records its own thread's launches."""
import threading

import numpy as np
import pytest

import wgpu_ad as ti

pytestmark = pytest.mark.gpu


def _run_threads(target, n=2, timeout=300):
    errors = []

    def guarded(k):
        try:
            target(k)
        except BaseException as e:  # reported by the test, not lost in the thread
            errors.append(e)
    ts = [threading.Thread(target=guarded, args=(k,)) for k in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout)
    assert not any(t.is_alive() for t in ts), "a thread hung"
    if errors:
        raise errors[0]


def test_two_threads_launching_on_a_shared_field_lose_no_launch():
    c = ti.field(ti.i32, shape=())

    @ti.kernel
    def bump():
        c[None] += 1

    def work(_k):
        for _ in range(1500):
            bump()
    _run_threads(work)
    assert c[None] == 3000  # (without the lock: 3226, 3236, 3490 in three runs on lavapipe)


def test_each_thread_s_tape_differentiates_its_own_launches():
    n = 64
    xs = [ti.field(ti.f32, shape=n, needs_grad=True) for _ in range(2)]
    losses = [ti.field(ti.f32, shape=(), needs_grad=True) for _ in range(2)]

    @ti.kernel
    def energy(x: ti.template(), loss: ti.template(), w: ti.f32):
        for i in x:
            loss[None] += w * x[i] * x[i]

    values = [np.linspace(-1, 1, n, dtype=np.float32), np.linspace(0, 2, n, dtype=np.float32)]
    for x, v in zip(xs, values):
        x.from_numpy(v)
    energy(xs[0], losses[0], 1.0)  # compiled before the threads start
    energy(xs[1], losses[1], 1.0)

    def work(k):
        for rep in range(20):
            # clear_gradients=True would zero every gradient of the program (Taichi's meaning),
            # the other thread's too: each thread zeroes its own
            xs[k].grad.fill(0)
            with ti.ad.Tape(loss=losses[k], clear_gradients=False):
                energy(xs[k], losses[k], float(k + 1))
            g = xs[k].grad.to_numpy()
            np.testing.assert_allclose(g, 2.0 * (k + 1) * values[k].astype(np.float64), rtol=1e-6, atol=1e-6,
                                       err_msg=f"thread {k}, repetition {rep}")
    _run_threads(work)


def test_clearing_every_gradient_while_another_thread_s_tape_is_open_is_refused():
    x = ti.field(ti.f32, shape=4, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    entered, release, seen = threading.Event(), threading.Event(), []

    @ti.kernel
    def total():
        for i in x:
            loss[None] += x[i]

    def other(_k):
        with ti.ad.Tape(loss=loss, clear_gradients=False):
            total()
            entered.set()
            release.wait(60)
    t = threading.Thread(target=other, args=(0,))
    t.start()
    try:
        assert entered.wait(60)
        y = ti.field(ti.f32, shape=(), needs_grad=True)
        with pytest.raises(ti.AutodiffUsageError, match=r"another thread's tape \(entered at .*test_threads.py:\d+\) "
                                                        r"is open, and clear_gradients=True zeroes every gradient"):
            with ti.ad.Tape(loss=y):
                pass
        seen.append("refused")
    finally:
        release.set()
        t.join(60)
    assert seen == ["refused"] and not t.is_alive()
    np.testing.assert_array_equal(x.grad.to_numpy(), [1.0] * 4)  # the other tape's gradient, intact
