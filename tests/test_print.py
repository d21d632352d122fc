"""print() in kernels and ti.funcs (frontend/printing.py -> Op.PRINT -> the runtime's print buffer,
runtime/printing.py): the lines reach sys.stdout at the next read-back, all of them, in program
order within a thread, formatted as Python formats the values (floats as the shortest decimal of
their float32); too many lines give a note; gradients are unchanged and the backward pass prints
nothing. Expected text is written out by hand; gradients are analytic."""
from __future__ import annotations

import numpy as np
import pytest

import wgpu_ad as ti
from wgpu_ad.errors import CompileError, UnsupportedError
from wgpu_ad.ir.interpreter import run_kernel
from wgpu_ad.ir.nodes import walk_task
from wgpu_ad.ir.ops import Op
from reference import run_on_reference

pytestmark = pytest.mark.gpu


def lines_of(capsys) -> list[str]:
    return capsys.readouterr().out.splitlines()


# ---- delivery ------------------------------------------------------------------------------------

def test_every_line_of_a_parallel_loop_arrives_at_the_next_read_back(capsys):
    n = 300
    x = ti.field(ti.f32, shape=n)

    @ti.kernel
    def fill():
        for i in x:
            x[i] = i * 0.5
            print("x[", i, "] =", x[i])

    fill()
    assert capsys.readouterr().out == ""  # launched, not waited for: nothing read back yet
    ti.sync()
    got = lines_of(capsys)
    assert len(got) == n
    assert set(got) == {f"x[ {i} ] = {i * 0.5}" for i in range(n)}
    x.to_numpy()
    assert capsys.readouterr().out == ""  # each line once


def test_a_thread_prints_its_lines_in_program_order(capsys):
    @ti.kernel
    def count():
        for i in range(40):
            for j in range(6):
                print(i, j)
            print(i, "done")

    count()
    ti.sync()
    got = lines_of(capsys)
    assert len(got) == 40 * 7
    per_thread: dict[str, list[str]] = {}
    for line in got:
        i, what = line.split(" ")
        per_thread.setdefault(i, []).append(what)
    assert per_thread == {str(i): ["0", "1", "2", "3", "4", "5", "done"] for i in range(40)}


def test_launches_print_in_launch_order_and_reads_back_once(capsys):
    @ti.kernel
    def first():
        print("first")

    @ti.kernel
    def second(k: ti.i32):
        print("second", k)

    first()
    second(1)
    first()
    second(2)
    ti.sync()
    assert lines_of(capsys) == ["first", "second 1", "first", "second 2"]


def test_kernel_scope_print_runs_once_not_once_per_later_task(capsys):
    x = ti.field(ti.i32, shape=8)

    @ti.kernel
    def k(n: ti.i32):
        print("start", n)
        if n > 2:
            print("n is big")
        for i in x:
            x[i] = n
        for i in x:
            x[i] += 1

    k(5)
    assert (x.to_numpy() == 6).all()
    assert lines_of(capsys) == ["start 5", "n is big"]


def test_print_a_kernel_scope_sum_after_its_loop(capsys):
    x = ti.field(ti.f32, shape=8)
    x.from_numpy(np.arange(8, dtype=np.float32))

    @ti.kernel
    def total() -> ti.f32:
        s = 0.0
        for i in x:
            s += x[i]
        print("sum =", s)
        return s

    assert total() == 28.0
    assert lines_of(capsys) == ["sum = 28.0"]


def test_reset_prints_what_was_not_read_back(capsys):
    @ti.kernel
    def hello():
        print("hello")

    hello()
    ti.reset()
    assert lines_of(capsys) == ["hello"]


# ---- formatting ----------------------------------------------------------------------------------

def test_values_are_formatted_like_python(capsys):
    special = ti.field(ti.f32, shape=3)
    special.from_numpy(np.array([np.inf, -np.inf, np.nan], np.float32))

    @ti.kernel
    def show(a: ti.f32, n: ti.i32, u: ti.u32):
        print(a, n, u, a / 3.0, a > 1.0, n < 0, -n)
        print(1e10 * a, 1e-7 * a, special[0], special[1], special[2])
        print(0.1, 1 / 3, 7, True, None, "text")

    show(0.1, -12, 3_000_000_000)
    ti.sync()
    assert lines_of(capsys) == [
        "0.1 -12 3000000000 0.033333335 False True 12",
        "1000000000.0 1e-08 inf -inf nan",
        "0.1 0.33333334 7 True None text",
    ]


def test_strings_sep_and_end(capsys):
    @ti.kernel
    def k(v: ti.i32):
        print("100% {not a field}", "tab\there")
        print("a", v, "b", sep="")
        print("no newline", v, end="")
        print(" joined", end="!\n")
        print("x", v, sep=", ", end=";\n")
        print()

    k(42)
    ti.sync()
    assert capsys.readouterr().out == ("100% {not a field} tab\there\na42b\nno newline 42 joined!\n"
                                       "x, 42;\n\n")


def test_f_strings_with_format_specs(capsys):
    P = 2

    @ti.kernel
    def k(v: ti.f32, i: ti.i32):
        print(f"{i}: {v:.3f}|{v!r}|{i:>4}|{i:04d}|{v:.{P}e}|{v > 0}|{i:x}|{v:8.2f}|")
        print(f"{{literal}} {-v:+.1f} {i * 10}%")

    k(2.0 / 3.0, 26)
    ti.sync()
    assert lines_of(capsys) == ["26: 0.667|0.6666667|  26|0026|6.67e-01|True|1a|    0.67|",
                                "{literal} -0.7 260%"]


def test_str_format(capsys):
    @ti.kernel
    def k(a: ti.f32, n: ti.i32):
        print("{} and {name} then {0:.2f}".format(a, name=n))
        print("{1}-{0}".format(n, a), "tail")

    k(1.5, 7)
    ti.sync()
    assert lines_of(capsys) == ["1.5 and 7 then 1.50", "1.5-7 tail"]


def test_vectors_matrices_and_lists(capsys):
    v = ti.Vector.field(3, ti.f32, shape=2)
    m = ti.Matrix.field(2, 2, ti.f32, shape=())
    v[1] = [1.0, 0.1, -2.5]
    m[None] = [[1.0, 2.0], [3.0, 4.5]]

    @ti.kernel
    def k(s: ti.f32):
        print(v[1], m[None] * s)
        print(f"{v[1]:.2f}", ti.Vector([1, 2]), ti.math.ivec2(3, 4))
        print([1, s, "a"], (s,))

    k(2.0)
    ti.sync()
    assert lines_of(capsys) == ["[1.0, 0.1, -2.5] [[2.0, 4.0], [6.0, 9.0]]",
                                "[1.00, 0.10, -2.50] [1, 2] [3, 4]",
                                "[1, 2.0, 'a'] (2.0,)"]


def test_print_in_a_func(capsys):
    x = ti.field(ti.f32, shape=4)

    @ti.func
    def report(i, value):
        print(f"item {i}: {value:.1f}")
        return value * 2

    @ti.kernel
    def k():
        for i in x:
            x[i] = report(i, i + 0.5)

    k()
    assert np.allclose(x.to_numpy(), [1.0, 3.0, 5.0, 7.0])
    assert sorted(lines_of(capsys)) == ["item 0: 0.5", "item 1: 1.5", "item 2: 2.5", "item 3: 3.5"]


# ---- capacity ----------------------------------------------------------------------------------

def test_too_many_lines_print_what_fits_and_a_note(capsys):
    ti.init(print_buffer_lines=10)

    @ti.kernel
    def spam():
        for i in range(25):
            print("line", i)

    spam()
    ti.sync()
    got = lines_of(capsys)
    assert len(got) == 11
    assert all(line.startswith("line ") for line in got[:10]) and len(set(got[:10])) == 10
    assert got[10] == ("... 15 more lines printed by kernel 'spam' were dropped (the print buffer holds 10 "
                       "lines between read-backs); raise it with ti.init(print_buffer_lines=...), or read back "
                       "(ti.sync()) more often")
    spam()  # the buffer is empty again after a read-back
    ti.sync()
    assert len(lines_of(capsys)) == 11


def test_a_longer_record_grows_the_buffer_without_losing_lines(capsys):
    m = ti.Matrix.field(4, 4, ti.f32, shape=())
    m[None] = np.arange(16, dtype=np.float32).reshape(4, 4)

    @ti.kernel
    def short():
        print("short")

    @ti.kernel
    def long():
        print(m[None])

    short()
    long()
    ti.sync()
    assert lines_of(capsys) == ["short", "[[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0], [8.0, 9.0, 10.0, 11.0], "
                                         "[12.0, 13.0, 14.0, 15.0]]"]


def test_print_buffer_lines_is_checked():
    with pytest.raises(ti.WgpuAdError, match=r"ti.init\(print_buffer_lines=0\): expected a positive integer"):
        ti.init(print_buffer_lines=0)


# ---- no cost without print --------------------------------------------------------------------------

def test_a_kernel_without_print_has_no_print_buffer():
    x = ti.field(ti.f32, shape=8)

    @ti.kernel
    def k(a: ti.f32):
        for i in x:
            x[i] = a

    k(1.0)
    lc = k._get((1.0,))[0]
    assert not lc.plan.prints and not lc.plan.words[1:]
    assert all(b.kind != "print" for t in lc.ck.tasks for b in t.bindings)
    assert "print" not in k.get_wgsl(1.0)
    x.to_numpy()
    assert ti.get_runtime().prints.buffer is None


# ---- through the compiler --------------------------------------------------------------------------

def test_print_survives_optimisation_and_the_interpreter_prints_the_same(capsys):
    x = ti.field(ti.f32, shape=6)
    x.from_numpy(np.arange(6, dtype=np.float32) * 0.25)

    @ti.kernel
    def k(s: ti.f32):
        for i in x:
            unused = x[i] * s  # only printed: must not be removed as dead code
            print(i, unused)

    ir = k._get((2.0,))[0].ir
    assert sum(s.op is Op.PRINT for t in ir.tasks for s in walk_task(t)) == 1
    run_on_reference(k, 2.0)
    reference = sorted(lines_of(capsys))
    assert reference == sorted(f"{i} {i * 0.5}" for i in range(6))
    k(2.0)
    ti.sync()
    assert sorted(lines_of(capsys)) == reference
    out: list[str] = []
    run_kernel(ir, [x.to_numpy().copy()], [3.0], out=out.append)
    assert out == [f"{i} {i * 0.75}\n" for i in range(6)]


def test_print_errors_name_the_problem():
    x = ti.field(ti.f32, shape=4)

    @ti.kernel
    def whole_field():
        print(x)

    with pytest.raises(UnsupportedError, match="print\\(\\) in a kernel cannot show a field or ndarray; print "
                                               "its elements \\(e.g. x\\[i\\]\\), or print it outside the kernel"):
        whole_field()

    @ti.kernel
    def bad_spec(a: ti.f32):
        print(f"{a:d}")

    with pytest.raises(CompileError, match="bad format spec 'd' for a f32 value: Unknown format code 'd'"):
        bad_spec(1.0)

    @ti.kernel
    def gpu_fstring(a: ti.f32):
        s = f"{a}"
        x[0] = a

    with pytest.raises(UnsupportedError, match="f-strings with values computed on the GPU can only be used as "
                                               "arguments of print\\(\\) in kernels"):
        gpu_fstring(1.0)

    @ti.kernel
    def to_file(a: ti.f32):
        print(a, file=None)

    with pytest.raises(UnsupportedError, match="print\\(..., file=...\\) is not supported in kernels"):
        to_file(1.0)


# ---- autodiff ------------------------------------------------------------------------------------------

def test_print_under_a_tape_prints_once_and_keeps_gradients(capsys):
    n = 16
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    xs = np.linspace(-1.0, 1.5, n).astype(np.float32)
    x.from_numpy(xs)

    @ti.kernel
    def power():
        for i in x:
            y = x[i]
            for k in range(3):
                y = y * x[i]
                print("i", i, "k", k, f"{y:.4f}")  # the value of this iteration (not moved by a pass)
            print(f"x[{i}] ** 4 = {y:.4f}")
            loss[None] += y

    with ti.ad.Tape(loss=loss):
        power()
    grad = x.grad.to_numpy()
    x64 = xs.astype(np.float64)
    assert np.allclose(grad, 4 * x64 ** 3, rtol=1e-5, atol=1e-6)
    assert loss[None] == pytest.approx(float(np.sum(x64 ** 4)), rel=1e-5)
    got = lines_of(capsys)
    assert len(got) == 4 * n  # the forward's lines, once: the adjoint does not print
    assert sorted(line for line in got if "**" in line) == sorted(f"x[{i}] ** 4 = {xs[i] ** 4:.4f}"
                                                                  for i in range(n))
    for i in range(n):
        y = xs[i]
        for k in range(3):
            y = np.float32(y * xs[i])  # the kernel's float32 products, in its order
            assert got.count(f"i {i} k {k} {y:.4f}") == 1


def test_kernel_grad_by_hand_does_not_print(capsys):
    x = ti.field(ti.f32, shape=3, needs_grad=True)
    y = ti.field(ti.f32, shape=3, needs_grad=True)
    x.from_numpy(np.array([0.5, 1.0, 2.0], np.float32))

    @ti.kernel
    def sine():
        for i in x:
            y[i] = ti.sin(x[i])
            print("y", i)

    sine()
    y.grad.fill(1.0)
    sine.grad()
    assert np.allclose(x.grad.to_numpy(), np.cos([0.5, 1.0, 2.0]), rtol=1e-5)
    assert sorted(lines_of(capsys)) == ["y 0", "y 1", "y 2"]


def test_checkpointed_steps_print_in_the_forward_pass_only(capsys):
    n, steps = 3, 4
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    x.from_numpy(np.array([1.0, 2.0, 3.0], np.float32))

    @ti.kernel
    def grow(t: ti.i32):
        for i in x:
            x[i] = x[i] * 1.5
            print("step", t, "i", i)

    @ti.kernel
    def total():
        for i in x:
            loss[None] += x[i]

    with ti.ad.Tape(loss=loss):
        ti.ad.checkpoint(grow, steps=steps, state=[x])
        total()
    assert np.allclose(x.grad.to_numpy(), 1.5 ** steps, rtol=1e-5)
    got = lines_of(capsys)
    assert sorted(got) == sorted(f"step {t} i {i}" for t in range(steps) for i in range(n))


def test_gradient_checks_run_the_forward_again_silently(capsys):
    x = ti.field(ti.f32, shape=3, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    x.from_numpy(np.array([0.5, -1.0, 2.0], np.float32))

    @ti.kernel
    def square():
        for i in x:
            print("x", i)
            loss[None] += x[i] * x[i]

    report = ti.ad.check_grad(square, loss, [x])
    assert report.ok
    assert np.allclose(x.grad.to_numpy(), [1.0, -2.0, 4.0], rtol=1e-5)
    assert sorted(lines_of(capsys)) == ["x 0", "x 1", "x 2"]


# ---- other paths -----------------------------------------------------------------------------------------

def test_lines_printed_before_a_failed_assert_come_out_first(capsys):
    ti.init(debug=True)

    @ti.kernel
    def k(n: ti.i32):
        print("checking", n)
        assert n < 0, "n must be negative"

    with pytest.raises(ti.KernelAssertionError, match="n must be negative"):
        k(3)
    assert lines_of(capsys) == ["checking 3"]


def test_a_kernel_loaded_from_the_offline_cache_prints(capsys):
    from wgpu_ad.compiler import cache

    @ti.kernel
    def k(a: ti.f32, n: ti.i32):
        print(f"a = {a:.2f}, n = {n}")

    k(0.25, 3)
    ti.sync()
    ti.reset()  # forgets the compiled kernel: the next call loads it from the disk
    hits = cache.record.stats["hits"]
    k(1.5, -4)
    ti.sync()
    assert cache.record.stats["hits"] == hits + 1
    assert lines_of(capsys) == ["a = 0.25, n = 3", "a = 1.50, n = -4"]


def test_a_print_buffer_larger_than_the_adapter_allows_is_refused():
    ti.init(print_buffer_lines=1 << 30)
    limit = ti.get_runtime().max_scratch_bytes

    @ti.kernel
    def k():
        print("hello")

    with pytest.raises(ti.WgpuAdError, match=r"ti.init\(print_buffer_lines=1073741824\): a print buffer of 1073741824 "
                                             rf"lines of up to 8 words needs 34359738380 bytes, more than this "
                                             rf"adapter's largest storage binding \({limit} bytes\); ask for fewer lines"):
        k()
