"""ti.export on the Python side: what manifest.json says, the portable WGSL (each task a module
WebGPU accepts, no float atomics, no subgroups, no constant NaN), and the errors, word for word.
The exported kernels running in node and Chromium: tests/test_export_browser.py."""
from __future__ import annotations

import json
import math

import pytest
import wgpu

import wgpu_ad as ti
from wgpu_ad.export import BROWSER_LIMITS, FORMAT_VERSION

pytestmark = pytest.mark.gpu


def _two_kernels():
    x = ti.field(ti.f32, shape=(3, 5), needs_grad=True, name="x")
    v = ti.Vector.field(3, ti.f32, shape=4, name="v")
    L = ti.field(ti.f32, shape=(), needs_grad=True, name="L")

    @ti.kernel
    def loss(s: ti.f32, k: ti.i32):
        for i, j in x:
            L[None] += s * x[i, j] * x[i, j] + k

    @ti.kernel
    def cubes(a: ti.types.ndarray(), s: ti.f32) -> ti.f32:
        for i in range(a.shape[0]):
            L[None] += s * a[i] ** 3
        for i in range(4):
            v[i] = ti.Vector([1.0, 2.0, s])
        return s

    return x, v, L, loss, cubes


def test_manifest_lists_buffers_words_tasks_and_sequences(tmp_path):
    x, v, L, loss, cubes = _two_kernels()
    arr = ti.ndarray(ti.f32, 7, needs_grad=True)
    m = ti.export(tmp_path, [loss, (cubes, (arr, 1.0))])
    assert json.loads((tmp_path / "manifest.json").read_text()) == m
    assert (tmp_path / "wgpu_ad.js").read_text().startswith("/**\n * wgpu_ad.js")
    assert m["format"] == "wgpu_ad-export" and m["version"] == FORMAT_VERSION
    assert m["limits"] == BROWSER_LIMITS and m["required_limits"] == {} and m["features"] == []
    assert [step["op"] for step in m["tape"]] == ["zero", "zero", "record", "fill", "grad"]
    assert m["buffers"]["x"] == {
        "dtype": "f32", "shape": [3, 5], "element_shape": [], "scalars": 15, "bytes": 60, "padded_bytes": 64,
        "layout": "row-major over shape, element components innermost (matrices row-major), no gaps",
        "role": "field", "primal": None, "grad": "x.grad", "dual": None}
    assert m["buffers"]["x.grad"]["role"] == "grad" and m["buffers"]["x.grad"]["primal"] == "x"
    assert m["buffers"]["v"]["element_shape"] == [3] and m["buffers"]["v"]["scalars"] == 12
    assert m["buffers"]["v"]["grad"] is None and "v.grad" not in m["buffers"]
    assert m["buffers"]["L"]["padded_bytes"] == 16  # a 0-d field: one word, buffers are 16-byte multiples

    k = m["kernels"]["loss"]
    assert k["params"] == [{"name": "s", "kind": "scalar", "dtype": "f32"}, {"name": "k", "kind": "scalar", "dtype": "i32"}]
    assert [w["source"] for w in k["forward"]["uniform"]["words"]] == [
        {"kind": "scalar", "arg": 0, "name": "s"}, {"kind": "scalar", "arg": 1, "name": "k"}]
    assert [w["type"] for w in k["forward"]["uniform"]["words"]] == ["f32", "i32"]
    assert k["forward"]["uniform"]["bytes"] == 16
    assert {b["name"] for b in k["grad"]["buffers"]} == {"x", "L", "x.grad", "L.grad"}
    task = k["forward"]["tasks"][0]
    assert task["file"] == "loss.forward.0.wgsl" and task["range"] == [["const", 0], ["const", 15]]
    assert task["bindings"][0] == {"binding": 0, "kind": "args", "type": "uniform"}
    assert k["call"] == {"forward": [{"op": "dispatch", "program": "forward", "task": 0}],
                         "grad": [{"op": "dispatch", "program": "grad", "task": 0}]}

    c = m["kernels"]["cubes"]
    assert c["params"][0] == {"name": "a", "kind": "ndarray", "dtype": "f32", "element_shape": [], "ndim": 1,
                              "needs_grad": True, "needs_dual": False}
    assert c["forward"]["uniform"]["words"][0]["source"] == {"kind": "extent", "arg": 0, "name": "a", "dim": 0}
    assert len(c["forward"]["tasks"]) == 3 and c["forward"]["returns"] == "f32"  # two loops and the return
    assert c["forward"]["tasks"][2]["serial"] is True
    assert c["call"]["forward"][-1] == {"op": "read_return", "dtype": "f32"}
    assert {"kind": "arg_grad", "arg": 0, "name": "a"} in c["grad"]["buffers"]


def test_each_task_is_a_portable_module_webgpu_accepts(tmp_path):
    """One WGSL module per task (a multi-task kernel's get_wgsl() is not one module), compiled
    without float atomics or subgroups, each accepted by wgpu-py's create_shader_module."""
    x, v, L, loss, cubes = _two_kernels()
    arr = ti.ndarray(ti.f32, 7, needs_grad=True)
    m = ti.export(tmp_path, [loss, (cubes, (arr, 1.0))])
    device = ti.get_runtime().device
    files = [t["file"] for k in m["kernels"].values() for p in (k["forward"], k["grad"]) for t in p["tasks"]]
    assert len(files) == 2 + len(m["kernels"]["cubes"]["forward"]["tasks"]) + len(m["kernels"]["cubes"]["grad"]["tasks"])
    assert len(files) >= 6 and len(set(files)) == len(files)
    for f in files:
        code = (tmp_path / f).read_text()
        assert "atomic<f32>" not in code and "subgroup" not in code and "bitcast<f32>(0x" not in code, f
        device.create_shader_module(code=code)  # raises on a module WebGPU refuses


def test_constant_nan_and_inf_are_not_constant_expressions():
    """Chrome refuses bitcast<f32>(0x7fc00000u) (a non-finite constant expression): generated code
    spells NaN and inf through bits_f32(), the hand-written helpers through a let."""
    from wgpu_ad import shaders
    out = ti.field(ti.f32, shape=3, name="out")

    @ti.kernel
    def specials():
        out[0] = math.inf
        out[1] = math.nan
        out[2] = ti.acosh(out[2])

    code = specials.get_wgsl()
    assert "bits_f32(0x7f800000u)" in code and "bits_f32(0x7fc00000u)" in code
    assert "bitcast<f32>(0x" not in code
    for name, body in shaders.snippets("math").items():
        assert "bitcast<f32>(0x" not in body, name
    specials()
    got = out.to_numpy()
    assert got[0] == math.inf and math.isnan(got[1]) and math.isnan(got[2])


def test_over_the_storage_buffer_limit_names_kernel_task_limit_and_count(tmp_path):
    fs = [ti.field(ti.f32, shape=2, name=f"f{k}") for k in range(8)]
    out = ti.field(ti.f32, shape=2, name="out")

    @ti.kernel
    def eight_fields():
        for i in range(2):
            out[i] = fs[0][i] + fs[1][i] + fs[2][i] + fs[3][i] + fs[4][i] + fs[5][i] + fs[6][i] + fs[7][i]

    with pytest.raises(ti.ExportError) as e:
        ti.export(tmp_path, [eight_fields])
    line = eight_fields.fn.__code__.co_firstlineno + 2
    assert str(e.value) == (
        f"ti.export: kernel 'eight_fields', task 0 ('eight_fields_t0') at {__file__}:{line}: the number of "
        f"storage buffers it binds in one shader is 9, over WebGPU's maxStorageBuffersPerShaderStage (8), so a "
        f"browser would refuse it; split the loop into kernels that each touch fewer fields (or keep values "
        f"that go together in one ti.Vector.field), or pass ti.export(..., limits={{...}}) with the limits of "
        f"the devices you target (the page must then request them in requestDevice's requiredLimits)")
    m = ti.export(tmp_path, [eight_fields], limits={"maxStorageBuffersPerShaderStage": 10})
    assert m["required_limits"] == {"maxStorageBuffersPerShaderStage": 10}


def test_export_errors_say_what_to_do(tmp_path):
    fs = [ti.field(ti.f32, shape=2)]  # no name= (a field a kernel names by a variable takes its name)
    y = ti.field(ti.f32, shape=2, name="x")
    z = ti.field(ti.f32, shape=2, name="x")

    @ti.kernel
    def unnamed():
        for i in range(2):
            fs[0][i] = 1.0

    @ti.kernel
    def clash():
        for i in range(2):
            y[i] = z[i]

    @ti.kernel
    def takes_array(a: ti.types.ndarray()):
        for i in range(2):
            a[i] = 1.0

    @ti.kernel
    def prints():
        print("hello")

    def message(*args, **kw):
        with pytest.raises(ti.ExportError) as e:
            ti.export(tmp_path, *args, **kw)
        return str(e.value)

    assert message([unnamed]) == ("ti.export: a field of shape (2,) (f32) used by kernel 'unnamed' has no name: "
                                  "create it with name=..., or pass ti.export(..., names={'x': x})")
    assert "xs" in ti.export(tmp_path, [unnamed], names={"xs": fs[0]})["buffers"]  # named here instead
    assert message([clash]) == ("ti.export: two different fields are named 'x'; give them distinct names "
                                "(name= at creation, or ti.export(..., names={...}))")
    assert message([takes_array]) == ("ti.export: kernel 'takes_array' has ndarray or template parameters; "
                                      "pass it as (kernel, example_args)")
    assert message([prints]) == ("ti.export: kernel 'prints' calls print(), which exported kernels do not "
                                 "support; remove the print() calls before exporting it")
    assert message([unnamed, unnamed], names={"xs": fs[0]}) == (
        "ti.export: two entries are named 'unnamed'; pass a dict {name: entry} to export a kernel more than once")
    assert message([unnamed], limits={"maxStorageBuffers": 9}).startswith(
        "ti.export: unknown limit(s) maxStorageBuffers; the limits checked are maxStorageBuffersPerShaderStage, ")


def test_export_leaves_the_session_options_as_they_were(tmp_path):
    ti.set_compile_options(ad_stack_size=77)
    before = ti.compile_options()
    out = ti.field(ti.f32, shape=2, name="out")

    @ti.kernel
    def k():
        for i in range(2):
            out[i] = 1.0

    ti.export(tmp_path, [k])
    assert ti.compile_options() == before


def test_exported_shaders_are_the_ones_python_runs_with_the_same_options(tmp_path):
    """The export serialises the compiler's output, it does not generate its own: with the portable
    options set in the session, every task file is the WGSL a launch in Python uses."""
    from wgpu_ad.export import PORTABLE
    x, v, L, loss, cubes = _two_kernels()
    arr = ti.ndarray(ti.f32, 7, needs_grad=True)
    m = ti.export(tmp_path, [loss, (cubes, (arr, 1.0))])
    ti.set_compile_options(**PORTABLE)
    for name, args in (("loss", (1.0, 2)), ("cubes", (arr, 1.0))):
        kernel = {"loss": loss, "cubes": cubes}[name]
        for program, grad in (("forward", False), ("grad", True)):
            files = [(tmp_path / t["file"]).read_text() for t in m["kernels"][name][program]["tasks"]]
            assert "\n".join(files) == kernel.get_wgsl(*args, grad=grad), (name, program)


def test_a_kernel_that_uses_gradients_is_exported_without_one(tmp_path):
    """Forces from the adjoint (gravity's advance reads x.grad): such a kernel can have no gradient
    of its own, so grad=True exports it forward-only instead of refusing the export; the kernel the
    tape differentiates keeps its gradient."""
    x = ti.field(ti.f32, shape=4, needs_grad=True, name="x")
    v = ti.field(ti.f32, shape=4, name="v")
    U = ti.field(ti.f32, shape=(), needs_grad=True, name="U")

    @ti.kernel
    def energy():
        for i in x:
            U[None] += x[i] ** 2

    @ti.kernel
    def advance():
        for i in x:
            v[i] -= 0.1 * x.grad[i]
            x[i] += 0.1 * v[i]

    m = ti.export(tmp_path, [energy, advance])
    assert m["kernels"]["advance"]["grad"] is None and m["kernels"]["advance"]["call"]["grad"] is None
    assert m["kernels"]["energy"]["grad"] is not None


def test_get_wgsl_of_one_task_is_a_module_webgpu_compiles():
    """A kernel of two top-level loops is two WGSL modules: get_wgsl(task=k) gives one, which
    wgpu-py compiles as it is; a task out of range is an IndexError naming the count."""
    a = ti.field(ti.f32, shape=8)
    s = ti.field(ti.f32, shape=())

    @ti.kernel
    def two_loops():
        for i in a:
            a[i] = i * 2.0
        for i in a:
            s[None] += a[i]

    both = two_loops.get_wgsl()
    parts = [two_loops.get_wgsl(task=k) for k in range(2)]
    assert both == "\n".join(parts) and parts[0] != parts[1]
    device = ti.get_runtime().device
    for code in parts:
        device.create_shader_module(code=code)
    with pytest.raises(IndexError, match=r"two_loops.get_wgsl\(task=2\): the kernel has 2 tasks \(0 to 1\)"):
        two_loops.get_wgsl(task=2)

