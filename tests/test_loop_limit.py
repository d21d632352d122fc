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


@pytest.mark.parametrize("case,args,want", [
    ("one_loop", (60_000,), 60_000), ("one_loop", (70_000,), 70_000),
    ("nested", (240, 250), 60_000), ("nested", (300, 300), 90_000),
    ("while_loop", (50_000,), 50_000), ("while_loop", (100_000,), 100_000),
    ("with_break", (1_000_000, 20), 20), ("with_break", (100_000, 80_000), 80_000),
])
def test_loops_run_to_their_end_or_raise(case, args, want):
    out = ti.field(ti.i32, shape=4)
    kernel = dict(zip(("one_loop", "nested", "while_loop", "with_break"), _kernels(out)))[case]
    kernel(*args)
    slot = ("one_loop", "nested", "while_loop", "with_break").index(case)
    # iterations of the invocation: loop bodies entered (an outer loop's own iterations count too)
    total = {"one_loop": args[0], "nested": args[0] * (args[1] + 1) if case == "nested" else 0,
             "while_loop": args[0], "with_break": min(args)}[case]
    limited = ti.compile_options().loop_check
    if limited and total > 65_000:
        with pytest.raises(ti.KernelRuntimeError, match=rf"kernel '{case}': a loop stopped before its end: this "
                                                         r"adapter's driver \(Mesa llvmpipe / lavapipe\) ends the "
                                                         r"loops of a shader invocation after 65,535 iterations"):
            out.to_numpy()
        out.fill(0)  # the flag was cleared with the error: the next read-back is clean
        assert out.to_numpy().sum() == 0
    else:
        assert out.to_numpy()[slot] == want


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
