"""Older Mesa llvmpipe (lavapipe; Debian 12's Mesa 22.3, not Mesa 25.0) ends the loops of a
shader invocation after 65,535 iterations in total, silently. Where the driver does (found once per
device by a probe, Runtime.loops_limited) every loop checks that it ran to its end, and the next
read-back raises instead of returning the truncated results; elsewhere the loops simply run. Either
way a program never sees a silently wrong count: the expected counts are computed in Python."""
from __future__ import annotations

import numpy as np
import pytest

import wgpu_ad as ti

pytestmark = pytest.mark.gpu


def _kernels(out):
    @ti.kernel
    def one_loop(n: ti.i32):
        for _ in range(1):
            s = 0
            for i in range(n):
                s += 1
            out[0] = s

    @ti.kernel
    def nested(n: ti.i32, m: ti.i32):
        for _ in range(1):
            s = 0
            for i in range(n):
                for j in range(m):
                    s += 1
            out[1] = s

    @ti.kernel
    def while_loop(n: ti.i32):
        for _ in range(1):
            s = 0
            while s < n:
                s += 1
            out[2] = s

    @ti.kernel
    def with_break(n: ti.i32, stop: ti.i32):
        for _ in range(1):
            s = 0
            for i in range(n):
                if i == stop:
                    break
                s += 1
            out[3] = s

    return one_loop, nested, while_loop, with_break


# (case, arguments, the count it makes, whether it passes the limited driver's budget). Where the
# driver limits loops, a loop that runs often runs up to UNROLL_MAX (128) copies of its body per
# iteration of its WGSL loop (codegen/statements.py), so a thread gets about 65,535 x 128 (8.4
# million) iterations of one loop; the cases keep a wide margin on either side of that
CASES = [
    ("one_loop", (60_000,), 60_000, True), ("one_loop", (5_000_000,), 5_000_000, True),
    ("one_loop", (20_000_000,), 20_000_000, False),
    ("nested", (240, 250), 60_000, True), ("nested", (1000, 1000), 1_000_000, True),   # 1000 x (8 + 1)
    ("nested", (5000, 5000), 25_000_000, False),                                       # 5000 x (40 + 1)
    ("while_loop", (50_000,), 50_000, True), ("while_loop", (5_000_000,), 5_000_000, True),
    ("while_loop", (20_000_000,), 20_000_000, False),
    ("with_break", (1_000_000, 20), 20, True), ("with_break", (100_000_000, 5_000_000), 5_000_000, True),
    ("with_break", (100_000_000, 20_000_000), 20_000_000, False),
]


@pytest.mark.parametrize("case,args,want,fits", CASES)
def test_loops_run_to_their_end_or_raise(case, args, want, fits):
    out = ti.field(ti.i32, shape=4)
    kernel = dict(zip(("one_loop", "nested", "while_loop", "with_break"), _kernels(out)))[case]
    kernel(*args)
    slot = ("one_loop", "nested", "while_loop", "with_break").index(case)
    limited = ti.compile_options().loop_check
    if limited and not fits:
        with pytest.raises(ti.KernelRuntimeError, match=rf"kernel '{case}': a loop stopped before its end: this "
                                                         r"adapter's driver \(Mesa llvmpipe / lavapipe\) ends the "
                                                         r"loops of a shader invocation after 65,535 iterations"):
            out.to_numpy()
        out.fill(0)  # the flag was cleared with the error: the next read-back is clean
        assert out.to_numpy().sum() == 0
    else:
        assert out.to_numpy()[slot] == want


def test_ten_million_iterations_with_their_gradient():
    """Taichi's test_large_for_loops: 5 threads of 2,000 x 1,000 iterations each, 10^7 in all, on
    the tape (forward and adjoint fused in one shader). The sum of 10^7 ones is exact in float32
    (below 2^24), and so is its derivative, 10^7 cos(0)."""
    x = ti.field(ti.f32, shape=(), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def large_loop():
        for i in range(5):
            for j in range(2000):
                for k in range(1000):
                    loss[None] += ti.sin(x[None]) + 1.0

    with ti.ad.Tape(loss=loss):
        large_loop()
    assert loss[None] == 1e7
    assert x.grad[None] == 1e7


def test_a_long_deterministic_sum():
    """ti.init(deterministic=True) adds floats in one invocation, in iteration order: 200,000
    iterations there are three times the driver's 65,535, and all run (exact integer sums)."""
    ti.init(deterministic=True)
    n = 200_000
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    total = ti.field(ti.f32, shape=(), needs_grad=True)
    x.from_numpy((np.arange(n) % 4).astype(np.float32))

    @ti.kernel
    def add():
        for i in x:
            if i % 5 == 0:
                continue  # (in an unrolled copy: on to the next copy)
            total[None] += 2.0 * x[i]

    with ti.ad.Tape(loss=total):
        add()
    kept = np.arange(n) % 5 != 0
    assert total[None] == 2.0 * float((np.arange(n) % 4)[kept].sum())
    np.testing.assert_array_equal(x.grad.to_numpy(), np.where(kept, 2.0, 0.0).astype(np.float32))


def test_the_check_is_on_where_the_driver_limits_loops():
    """The probe's verdict against a kernel compiled without the check: 70,000 iterations in one
    thread come back short exactly where the probe says the driver limits loops."""
    rt = ti.get_runtime()
    assert ti.compile_options().loop_check == rt.loops_limited
    if "llvmpipe" not in str(rt.adapter.info.get("device", "")).lower():
        assert not rt.loops_limited
    ti.set_compile_options(loop_check=False)
    out = ti.field(ti.i32, shape=4)
    one_loop = _kernels(out)[0]
    one_loop(70_000)
    got = int(out.to_numpy()[0])
    assert got == 70_000 or rt.loops_limited, "the loop was cut short but the probe said loops are not limited"
    assert got < 70_000 or not rt.loops_limited, "the probe said loops are limited but the loop ran to its end"


def test_long_parallel_loops_are_not_limited():
    """Each thread's share of a parallel loop is small: 2 million iterations are all done."""
    n = 2_000_000
    x = ti.field(ti.i32, shape=n)

    @ti.kernel
    def fill():
        for i in x:
            x[i] = i % 7

    fill()
    np.testing.assert_array_equal(x.to_numpy()[-5:], np.arange(n - 5, n) % 7)


def test_unrolled_bodies_keep_continue_break_and_their_gradient():
    """Loops long enough to be unrolled where the driver limits loops (and plain loops elsewhere):
    `continue` in a range loop (each copy steps the index first), `continue` and `break` in a while
    loop (a copy is a whole iteration), and the adjoint of a long loop (d/dw and d/dx exact: small
    integers). The counts are computed in Python."""
    n = 300_000
    out = ti.field(ti.i32, shape=3)
    x = ti.field(ti.f32, shape=4, needs_grad=True)
    w = ti.field(ti.f32, shape=(), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    x.from_numpy(np.array([1, 2, 0, 3], np.float32))
    w[None] = 1.0

    @ti.kernel
    def counts(n: ti.i32):
        for _ in range(1):
            s = 0
            for i in range(n):
                if i % 3 == 0:
                    continue
                s += 1
            out[0] = s
            k = 0
            t = 0
            while True:
                k += 1
                if k % 5 == 0:
                    continue
                if k > n:
                    break
                t += 1
            out[1] = t

    @ti.kernel
    def weighted(n: ti.i32):
        for _ in range(1):
            for i in range(n):
                loss[None] += x[i % 4] * w[None]

    counts(n)
    assert out.to_numpy()[0] == sum(1 for i in range(n) if i % 3)
    assert out.to_numpy()[1] == sum(1 for k in range(1, n + 1) if k % 5)
    with ti.ad.Tape(loss=loss):
        weighted(n)
    per = n // 4  # each x[k] is read n / 4 times
    assert loss[None] == per * 6.0
    assert w.grad[None] == per * 6.0
    np.testing.assert_array_equal(x.grad.to_numpy(), np.full(4, per, np.float32))
