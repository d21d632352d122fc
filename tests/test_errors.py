"""User-facing error messages, asserted word for word where they are part of the contract."""
import pytest

import wgpu_ad as ti

pytestmark = pytest.mark.gpu


def _compile_error(k, *args) -> str:
    with pytest.raises(ti.CompileError) as e:
        k(*args)
    return str(e.value)


def test_unsupported_construct_names_file_line_caret():
    x = ti.field(ti.f32, shape=4)

    @ti.kernel
    def k():
        for i in x:
            f = lambda t: t + 1
            x[i] = f(1.0)

    msg = _compile_error(k)
    assert msg.splitlines()[0] == "lambda is not supported in kernels"
    assert "test_errors.py\", line" in msg and ", in k" in msg
    assert msg.splitlines()[-2].strip() == "f = lambda t: t + 1"
    assert msg.splitlines()[-1].strip() == "^"


def test_wrong_index_arity_names_field():
    grid = ti.field(ti.f32, shape=(4, 4))

    @ti.kernel
    def k():
        for i in range(4):
            grid[i] = 1.0

    msg = _compile_error(k)
    assert msg.splitlines()[0] == "field 'grid' has 2 dimension(s) but is indexed with 1 index(es)"


def test_float_index_is_refused():
    a = ti.field(ti.f32, shape=4)

    @ti.kernel
    def k():
        for i in range(4):
            a[i * 0.5] = 1.0

    assert _compile_error(k).splitlines()[0] == \
        "index of field 'a' must be an integer, got f32; convert it with int(...)"


def test_undefined_name():
    @ti.kernel
    def k():
        for i in range(4):
            y = undefined_thing + 1  # noqa: F821

    assert _compile_error(k).splitlines()[0] == "name 'undefined_thing' is not defined"


def test_break_in_parallel_loop():
    a = ti.field(ti.f32, shape=4)

    @ti.kernel
    def k():
        for i in range(4):
            if i > 1:
                break
            a[i] = 1.0

    assert _compile_error(k).splitlines()[0].startswith(
        "'break' is not allowed in the parallel (outermost) loop of a kernel")


def test_library_function_called_with_gpu_values():
    """Python functions of one's own code are inlined (tests/test_taichi_compat.py); a standard
    library function is not, and NumPy's get the ti. spelling."""
    import operator
    a = ti.field(ti.f32, shape=4)

    @ti.kernel
    def k():
        for i in a:
            a[i] = operator.mul(a[i], 2.0)

    assert _compile_error(k).splitlines()[0] == (
        "'mul' (from operator) cannot run on GPU values in a kernel: only @ti.func, Python functions and "
        "lambdas defined in your code, and wgpu_ad builtins can")


def test_kernel_scope_variable_written_in_parallel_loop():
    a = ti.field(ti.f32, shape=4)

    @ti.kernel
    def k():
        s = 0.0
        s = 1.0
        for i in a:
            s = s + a[i]

    assert _compile_error(k).splitlines()[0] == (
        "kernel-scope variable 's' is assigned inside the parallel loop; its iterations run at the same "
        "time, so its value would be undefined. Accumulate with 's += ...' (an atomic reduction over the "
        "iterations, as in Taichi) or into a field, or define 's' inside the loop")


def test_missing_annotation_and_bad_argument():
    with pytest.raises(ti.CompileError, match="argument 'n' needs a type annotation"):
        @ti.kernel
        def k(n):
            pass

    a = ti.field(ti.f32, shape=4)

    @ti.kernel
    def k2(n: ti.i32):
        for i in range(n):
            a[i] = 1.0

    with pytest.raises(ti.KernelArgError, match=r"kernel 'k2' takes 1 argument\(s\) \(n\), got 2"):
        k2(1, 2)
    with pytest.raises(ti.KernelArgError, match="argument 'n' must be an integer"):
        k2(1.5)


def test_return_without_annotation():
    @ti.kernel
    def k():
        return 1.0

    assert _compile_error(k).splitlines()[0] == (
        "kernel 'k' returns a value but has no return type annotation; add one, e.g. 'def k(...) -> ti.f32:'")


def test_debug_mode_out_of_range_index_names_field_and_index():
    ti.init(arch=ti.cpu, debug=True)
    a = ti.field(ti.f32, shape=8)

    @ti.kernel
    def k(n: ti.i32):
        for i in range(n):
            a[i + 3] = 1.0

    k(5)  # in range
    with pytest.raises(ti.KernelRuntimeError) as e:
        k(6)
    msg = str(e.value)
    assert msg.startswith("kernel 'k': index (8) is out of range for field 'a' of shape (8,) in k at ")
    assert "test_errors.py:" in msg


def test_kernel_scope_variable_read_after_a_loop_writes_its_field():
    a = ti.field(ti.f32, shape=4)
    b = ti.field(ti.f32, shape=4)

    @ti.kernel
    def k():
        s = a[0]
        for i in a:
            a[i] = 5.0
        for i in b:
            b[i] = s

    msg = _compile_error(k)
    assert msg.splitlines()[0].startswith(
        "this kernel-scope variable reads field 'a', which a later loop of the kernel writes before the variable is used again")
    assert msg.splitlines()[-2].strip() == "s = a[0]"


def test_kernel_scope_variable_read_before_any_write_is_fine():
    a = ti.field(ti.f32, shape=4)
    b = ti.field(ti.f32, shape=4)
    a.fill(2.0)

    @ti.kernel
    def k():
        s = a[0] * 3
        for i in b:
            b[i] = s + i

    k()
    assert b.to_numpy().tolist() == [6.0, 7.0, 8.0, 9.0]


def test_kernel_scope_variable_changed_by_a_serial_part_is_refused_in_later_loops():
    x = ti.field(ti.f32, shape=4)
    y = ti.field(ti.f32, shape=4)

    @ti.kernel
    def k():
        s = 0.0
        ti.loop_config(serialize=True)
        for j in range(4):
            s = s + x[j]
        for i in y:
            y[i] = s

    msg = _compile_error(k)
    assert msg.splitlines()[0].startswith("'s' was assigned at line ")
    assert "in a part of the kernel that runs as its own GPU pass" in msg


def test_one_ndarray_read_and_written_through_two_arguments():
    """WebGPU cannot bind one buffer read-only and read-write in one dispatch: a clear error
    naming the two arguments instead of a validation error at submit; other pairs still run."""
    import numpy as np

    a = ti.ndarray(ti.f32, shape=8)
    b = ti.ndarray(ti.f32, shape=8)
    a.from_numpy(np.arange(8, dtype=np.float32))

    @ti.kernel
    def double(src: ti.types.ndarray(), dst: ti.types.ndarray()):
        for i in range(8):
            dst[i] = src[i] * 2.0

    with pytest.raises(ti.KernelArgError) as e:
        double(a, a)
    assert str(e.value) == (
        "kernel 'double': arguments 'src' and 'dst' are the same ndarray, read through one and written "
        "through the other in one parallel loop, which WebGPU cannot bind in one dispatch (and whose "
        "result would depend on the order of the threads); pass a copy as one of them")
    double(a, b)
    np.testing.assert_array_equal(b.to_numpy(), np.arange(8) * 2.0)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    with pytest.raises(ti.KernelArgError, match="arguments 'src' and 'dst' are the same ndarray"):
        with ti.ad.Tape(loss=loss):
            double(a, a)  # raised at the call, not when the tape would launch it


def test_constant_division_by_zero_and_math_domain_errors_name_the_line():
    """Two Python values are folded when the kernel compiles: 1.0 / 0.0 or ti.log(0.0) there is a
    compile error at its line, not Python's ZeroDivisionError from inside the compiler."""
    x = ti.field(ti.f32, shape=2)

    @ti.kernel
    def div():
        for i in range(1):
            x[0] = 1.0 / 0.0

    msg = _compile_error(div)
    assert msg.splitlines()[0] == ("division by zero in a compile-time constant expression (1.0 / 0.0): both "
                                   "operands are Python values, evaluated when the kernel is compiled; a float "
                                   "infinity is float('inf') or math.inf")
    assert ", in div" in msg and msg.splitlines()[-2].strip() == "x[0] = 1.0 / 0.0"

    @ti.kernel
    def log0():
        for i in range(1):
            x[1] = ti.log(0.0)

    msg = _compile_error(log0)
    assert msg.splitlines()[0] == ("ti.log(0.0) of a compile-time constant failed in Python (math domain error): "
                                   "its argument is a Python value, evaluated when the kernel is compiled")

    @ti.kernel
    def inf():   # the spelling the message suggests works
        for i in range(1):
            x[0] = float("inf")
            x[1] = -float("inf")

    inf()
    assert list(x.to_numpy()) == [float("inf"), -float("inf")]


def test_64_bit_integers_are_refused_with_the_32_bit_name():
    """`ti.i64` names what to use instead of a bare AttributeError (ti.f64: tests/test_float64.py)."""
    with pytest.raises(AttributeError, match=r"^ti.i64: WebGPU shaders have no 64-bit numbers, so wgpu_ad computes "
                                             r"in 32 bits; use ti.i32$"):
        ti.i64
    assert not hasattr(ti, "int64")


def test_scalar_argument_that_is_not_a_number_names_kernel_and_argument():
    """A str for a ti.f32 argument: the kernel, the argument, its type and the value, not Python's
    bare "could not convert string to float"; a TypeError, as Taichi's TaichiTypeError is."""
    x = ti.field(ti.f32, shape=2)

    @ti.kernel
    def scale(a: ti.f32, v: ti.types.vector(2, ti.f32)):
        x[0] = a * v[0]

    with pytest.raises(ti.KernelArgError) as e:
        scale("four", [1.0, 2.0])
    assert str(e.value) == "kernel 'scale': argument 'a' must be a f32 number, got str 'four'"
    assert isinstance(e.value, TypeError) and isinstance(e.value, ti.TaichiTypeError)
    with pytest.raises(ti.KernelArgError) as e:
        scale(4.0, ["one", "two"])
    assert str(e.value) == "kernel 'scale': argument 'v' must be 2 f32 numbers, got list ['one', 'two']"
    scale(4, (1.5, 2.0))  # numbers still pass, ints for floats included
    assert x.to_numpy()[0] == 6.0


def test_calling_a_vector_suggests_indexing_it():
    """v(0) reads like an index to some; the message says to index with [...], not Python's
    "unhashable type: 'Mat'" from inside the compiler."""
    x = ti.field(ti.f32, shape=4)

    @ti.kernel
    def k():
        for i in x:
            v = ti.Vector([1.0, 2.0])
            m = ti.Matrix([[1.0, 0.0], [0.0, 1.0]])
            x[i] = v(0) + m(0, 1)

    msg = _compile_error(k)
    assert msg.splitlines()[0] == ("'v' is a vector, not a function: it cannot be called; to read an entry, "
                                   "index it with square brackets: v[0]")
    assert ", in k" in msg and msg.splitlines()[-2].strip() == "x[i] = v(0) + m(0, 1)"
    assert msg.splitlines()[-1].strip() == "^" and msg.splitlines()[-1].index("^") == msg.splitlines()[-2].index("v(")

    @ti.kernel
    def k2():
        for i in x:
            x[i] = x[i](1)

    assert _compile_error(k2).splitlines()[0] == "'x[i]' is a f32 value, not a function: it cannot be called"


def test_python_function_on_a_list_of_gpu_values_names_it():
    """sorted([a, b]) cannot run on the GPU: the usual message, not Python's TypeError comparing
    two IR nodes; sum() of a scalar says how to sum over a loop."""
    x = ti.field(ti.f32, shape=4)

    @ti.kernel
    def k():
        for i in x:
            x[i] = sorted([x[0], x[1]])[0]

    assert _compile_error(k).splitlines()[0] == (
        "'sorted' cannot run on GPU values in a kernel: only @ti.func, Python functions and lambdas defined "
        "in your code, and wgpu_ad builtins can")

    @ti.kernel
    def k2():
        for i in x:
            x[i] = sum(x[i])

    assert _compile_error(k2).splitlines()[0] == (
        "sum() in a kernel needs a list, tuple or vector of values, got a f32 value; a sum over a loop is "
        "written 's += ...' in a for loop")


def test_misspelt_module_attribute_suggests_the_closest_name():
    """Python's own suggestion for ti.feild was ti.ceil (edit distance counts a swap as two edits);
    the message names ti.field, and a name from ti.math by its full spelling."""
    for typo, hint in [("feild", "ti.field"), ("kernal", "ti.kernel"), ("Vectr", "ti.Vector"),
                       ("ndarry", "ti.ndarray"), ("vec3", "ti.math.vec3")]:
        with pytest.raises(AttributeError) as e:
            getattr(ti, typo)
        assert str(e.value) == f"module 'wgpu_ad' has no attribute '{typo}'; did you mean {hint}?"
        assert e.value.name is None  # so Python's traceback adds no second (other) suggestion
    with pytest.raises(AttributeError) as e:
        ti.qwerty
    assert str(e.value) == "module 'wgpu_ad' has no attribute 'qwerty'"


def test_gradient_warnings_point_at_the_users_line():
    """A GradientWarning's file and line are the user's `with ti.ad.Tape(...)` (or the kernel
    call a tape defers), not a line inside wgpu_ad, however deep the check runs."""
    import sys
    import warnings

    c = ti.field(ti.f32, shape=4)
    v = ti.field(ti.f32, shape=4, needs_grad=True)
    L = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def k():
        for i in c:
            L[None] += c[i] * c[i]

    @ti.kernel
    def ini_v():
        for i in v:
            v[i] = 1.0

    @ti.kernel
    def use_v():
        for i in v:
            L[None] += v[i] * c[i]

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with ti.ad.Tape(loss=L):
            k()
        line = sys._getframe().f_lineno - 2
        with ti.ad.Tape(loss=L):
            ini_v()
            use_v()
        line2 = sys._getframe().f_lineno - 3
    w = [x for x in w if issubclass(x.category, ti.ad.GradientWarning)]
    assert [str(x.message).split(":")[0] for x in w] == ["ti.ad.Tape", "ti.ad.Tape"]
    assert "none of the fields read" in str(w[0].message) and "overwrites field 'v'" in str(w[1].message)
    assert [(x.filename, x.lineno) for x in w] == [(__file__, line), (__file__, line2)]


class _Sim:
    def __init__(self):
        self.pos = ti.Vector.field(2, ti.f32)


def test_fields_are_named_by_the_line_that_makes_them_before_any_kernel_runs():
    """`x = ti.field(...)` names the field 'x' from the start: messages before any kernel used it
    said "unnamed field"; as do self.x = ..., tuple assignments, annotated and multi-line ones,
    fields placed later with ti.root, and ndarrays."""
    grid = ti.field(ti.f32)
    with pytest.raises(ti.WgpuAdError) as e:
        grid.to_numpy()
    assert str(e.value) == ("field 'grid' has no shape yet: give it shape= when creating it, or place it with "
                            "ti.root.dense(ti.i, n).place(grid) (ti.root.place(grid) for a 0-d field)")
    ti.root.dense(ti.i, 3).place(grid)
    with pytest.raises(ti.WgpuAdError) as e:
        grid.grad.to_numpy()
    assert str(e.value).startswith("field 'grid' has no gradient: create it with needs_grad=True")

    u, v = ti.field(ti.i32, shape=2), ti.Matrix.field(2, 2, ti.f32, shape=2)
    w: ti.Field = ti.field(
        ti.f32, shape=2)
    arr = ti.ndarray(ti.f32, shape=4)
    sim = _Sim()
    unnamed = [ti.field(ti.f32, shape=2)]  # not assigned by itself: the kernel that uses it names it
    assert [u.name, v.name, w.name, arr.name, sim.pos.name, unnamed[0].name] == ["u", "v", "w", "arr", "pos", None]
    with pytest.raises(ti.WgpuAdError, match=r"^field 'u' has dtype i32: only float fields have gradients$"):
        u.grad
    with pytest.raises(ti.WgpuAdError, match=r"^field 'pos' has no shape yet"):
        sim.pos.to_numpy()
    assert repr(w) == "<wgpu_ad field w: f32, shape=(2,)>"


def test_an_integer_gradient_is_a_taichi_runtime_error():
    """(Issue 26 item 11) Taichi code catching TaichiRuntimeError for an integer ndarray with a
    gradient catches ours (a data access rule's refusal is a TaichiAssertionError: test_ad_programs)."""
    with pytest.raises(ti.TaichiRuntimeError, match=r"ti.ndarray: needs_grad=True needs a float dtype, got i32"):
        ti.ndarray(ti.i32, 4, needs_grad=True)


def test_an_unknown_init_option_is_named_not_ignored_silently():
    """ti.init(show_wgsl=True) used to do nothing without a word: an option that is neither
    wgpu_ad's nor one of Taichi's that mean nothing on WebGPU gets a warning at the user's line,
    with the nearest option; Taichi's (kernel_profiler, device_memory_GB, ...) stay silent."""
    import warnings
    with pytest.warns(UserWarning) as rec:
        ti.init(show_wgsl=True)
    msg = str(rec[0].message)
    assert msg.startswith("ti.init(show_wgsl=...): wgpu_ad has no option 'show_wgsl', so it does nothing; "
                          "did you mean print_wgsl=? (wgpu_ad's options: print_ir, print_wgsl, "), msg
    assert rec[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ti.init(kernel_profiler=True, device_memory_GB=2, fast_math=False, deterministic=False)
    ti.init()
