"""The launch plan (wgpu_ad/plan.py): argument values reach the kernel by what they are, never by
their names; the plan's expressions mean what the IR's ops mean; the layers keep to their side.

Values are checked against NumPy computations of the same expressions."""
from __future__ import annotations

import ast
import importlib.util
import itertools
import pickle
from pathlib import Path

import numpy as np
import pytest

import wgpu_ad as ti
from wgpu_ad import plan
from wgpu_ad.ir.ops import Op
from wgpu_ad.ir.semantics import evaluate as ir_evaluate, to_python, to_scalar
from wgpu_ad.types import i32, u1, u32

PKG = Path(ti.__file__).resolve().parent
gpu = pytest.mark.gpu


# ---- names users may choose -----------------------------------------------------------------------

@gpu
def test_vector_argument_beside_a_scalar_named_like_its_component():
    """v: vector(2) and a scalar v_1: each word carries its own value (v_1 used to read as v[1])."""
    out = ti.field(ti.f32, shape=3)

    @ti.kernel
    def k(v: ti.types.vector(2, ti.f32), v_1: ti.f32):
        out[0] = v[0]
        out[1] = v[1]
        out[2] = v_1

    k([10.0, 20.0], 99.0)
    np.testing.assert_array_equal(out.to_numpy(), [10.0, 20.0, 99.0])


@gpu
def test_ndarray_beside_a_scalar_named_like_its_extent():
    """a: ndarray and a scalar a_shape0: the extent word and the scalar stay apart."""
    a = ti.ndarray(ti.f32, shape=(5,))
    a.from_numpy(np.arange(5, dtype=np.float32))
    out = ti.field(ti.f32, shape=2)

    @ti.kernel
    def k(a: ti.types.ndarray(), a_shape0: ti.i32):
        for _ in range(1):
            s = 0.0
            for i in range(a.shape[0]):
                s += a[i]
            out[0] = s
            out[1] = a_shape0

    k(a, 1000)
    np.testing.assert_array_equal(out.to_numpy(), [10.0, 1000.0])


@gpu
@pytest.mark.parametrize("names", [("args", "Args", "seed"), ("_seed", "main", "thread_id"),
                                   ("x_0", "x", "iter"), ("num_threads", "range_end", "ad_stacks")])
def test_argument_names_that_shadow_generated_ones(names, tmp_path):
    """Whatever the user calls the arguments (the generated code's own names included), each
    reaches the kernel with its own value; the kernel also draws random numbers (a seed word)."""
    out = ti.field(ti.f32, shape=4)
    a, b, c = names
    src = (f"def k({a}: ti.f32, {b}: ti.types.vector(2, ti.i32), {c}: ti.i32):\n"
           f"    for i in range(4):\n"
           f"        r = ti.random()\n"
           f"        out[i] = {a} * (i + 1) + {b}[0] * 100 + {b}[1] * 10000 + {c} * 1000000 + r * 0.0\n")
    path = tmp_path / f"kernel_{'_'.join(n.strip('_') for n in names)}.py"
    path.write_text("import wgpu_ad as ti\n\n" + src)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.out = out
    k = ti.kernel(mod.k)
    k(0.5, [3, 7], 2)
    want = 0.5 * np.arange(1, 5) + 300 + 70000 + 2000000
    np.testing.assert_allclose(out.to_numpy(), want, rtol=1e-6)


def test_words_are_typed_records():
    """The plan says what each word is: scalars, components, extents and the seed by position."""
    out = ti.field(ti.f32, shape=())

    @ti.kernel
    def k(s: ti.f32, v: ti.types.vector(2, ti.f32), a: ti.types.ndarray(), n: ti.i32):
        for i in range(n):
            out[None] += s + v[1] + a[i] + ti.random()

    arr = ti.ndarray(ti.f32, shape=(3,))
    words = k._get((1.0, [1.0, 2.0], arr, 3))[0].plan.words
    assert words == (plan.Scalar(0, "f32"), plan.Component(1, 0, 2, "f32"), plan.Component(1, 1, 2, "f32"),
                     plan.Extent(2, 0), plan.Scalar(3, "i32"), plan.Seed())


# ---- expressions ---------------------------------------------------------------------------------

_SAMPLES = {"i32": [0, 1, -1, 2, -7, 13, 100, -2147483648, 2147483647],
            "u32": [0, 1, 2, 7, 13, 100, 2147483648, 4294967295],
            "u1": [False, True]}
_DT = {"i32": i32, "u32": u32, "u1": u1}
_COMPARE = {"lt", "le", "gt", "ge", "eq", "ne"}


@pytest.mark.parametrize("name", sorted(plan.EXPR_OPS))
def test_expression_ops_agree_with_the_ir_semantics(name):
    """Every op the launcher evaluates gives what ir/semantics.py gives (the GPU's rules) for
    every pair of sample operands of each integer type, wrap-around and division by zero included."""
    op = Op[name.upper()]
    checked = 0
    for dt in ("i32", "u32"):
        operand = _DT[dt]
        result = u1 if name in _COMPARE else operand
        samples = _SAMPLES[dt]
        if name == "select":
            combos = [((c,), (a, b)) for c in (False, True) for a, b in itertools.product(samples, repeat=2)]
        elif name in ("neg", "abs", "cast"):
            combos = [((), (a,)) for a in samples]
        else:
            combos = [((), ab) for ab in itertools.product(samples, repeat=2)]
        for cond, vals in combos:
            if name == "abs" and dt == "u32":
                continue  # no abs of u32 in the IR
            if name in ("div", "floordiv", "mod") and vals[1] == 0:
                pass  # x / 0 == x, x % 0 == 0 on both sides
            exprs = [("const", v) for v in cond + vals]
            got = plan.evaluate((name, result.name, *exprs), ())
            want = to_python(ir_evaluate(op, result, *[to_scalar(c, u1) for c in cond],
                                         *[to_scalar(v, operand) for v in vals]))
            assert got == want, (name, dt, cond, vals, got, want)
            checked += 1
    assert checked > 0


def test_expressions_read_words():
    e = ("add", "i32", ("mul", "i32", ("word", 0), ("const", 3)), ("word", 2))
    assert plan.evaluate(e, (5, 99, -4)) == 11
    assert plan.uses_words(e) and not plan.uses_words(("const", 4))


# ---- the layers --------------------------------------------------------------------------------------

def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    pkg = path.relative_to(PKG.parent).with_suffix("").parts[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = list(pkg[: len(pkg) - node.level + 1]) if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_the_launcher_reads_no_ir():
    bad = {m for m in _imports(PKG / "lang" / "launch.py") if m.startswith(("wgpu_ad.ir", "wgpu_ad.passes",
                                                                            "wgpu_ad.codegen", "wgpu_ad.frontend"))}
    assert not bad, f"lang/launch.py imports {sorted(bad)}: the launcher reads the launch plan only"
    assert not {m for m in _imports(PKG / "plan.py") if m.startswith("wgpu_ad") and m != "wgpu_ad"}


def test_the_runtime_holds_no_compiler_options():
    src = "\n".join(p.read_text() for p in PKG.rglob("*.py"))
    for knob in ("min_parallel", "grid_cap", "fuse_adjoint", "ad_stack_size", "print_ir", "offline_cache"):
        assert f"getattr(rt, \"{knob}\"" not in src and f"rt.{knob}" not in src, knob


def test_no_module_assigns_another_packages_global():
    """`module.name = value` on a module of another package is how hidden contracts start (a
    pass reading a global that the launcher set): none in wgpu_ad. A package may keep its own
    state module (ad/state.py)."""
    found = []
    for path in PKG.rglob("*.py"):
        here = path.relative_to(PKG.parent).with_suffix("").parts[:-1]  # the file's package
        tree = ast.parse(path.read_text())
        foreign = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = here[: len(here) - node.level + 1] + tuple((node.module or "").split(".") if node.module else ())
                for a in node.names:
                    if base != here:  # `from ..x import y` / `from ..x.y import z`: another package
                        foreign.add(a.asname or a.name)
            elif isinstance(node, ast.Import):
                foreign.update((a.asname or a.name).split(".")[0] for a in node.names)
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AugAssign, ast.AnnAssign)) else []
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in foreign:
                    found.append(f"{path.relative_to(PKG)}:{node.lineno}: {t.value.id}.{t.attr} = ...")
    assert not found, "\n".join(found)


@gpu
def test_cache_entries_hold_plain_data(tmp_path, monkeypatch):
    """An offline-cache entry is the WGSL and the launch plan: no IR, no field objects."""
    monkeypatch.delenv("WGPU_AD_OFFLINE_CACHE", raising=False)
    ti.init(offline_cache_file_path=str(tmp_path))
    x = ti.field(ti.f32, shape=16, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def energy(w: ti.f32):
        for i in x:
            loss[None] += w * x[i] * x[i]

    x.from_numpy(np.arange(16, dtype=np.float32))
    with ti.ad.Tape(loss, clear_gradients=True):
        energy(0.5)
    np.testing.assert_allclose(x.grad.to_numpy(), np.arange(16), rtol=1e-6)
    entries = list(tmp_path.glob("*.wgk"))
    assert entries
    for e in entries:
        data = e.read_bytes()
        assert b"wgpu_ad.ir" not in data and b"wgpu_ad.lang" not in data, e
        payload = data[data.index(b"\n") + 1 + 12:]
        key, ck = pickle.loads(payload)  # (an entry holds its key beside the kernel)
        assert key == e.stem
        assert isinstance(ck.plan, plan.LaunchPlan)


# ---- deferred work -----------------------------------------------------------------------------

@gpu
def test_deferred_work_runs_before_anything_reaches_the_device():
    rt = ti.get_runtime()
    x = ti.field(ti.f32, shape=4)
    order = []
    rt.defer(lambda: order.append("first"))
    x.fill(1.0)  # a write: the deferred work runs first
    assert order == ["first"]
    handle = rt.defer(lambda: order.append("never"))
    assert handle.cancel() and not handle.cancel()
    x.to_numpy()
    assert order == ["first"]


# ---- stacks sized at launch ------------------------------------------------------------------------

@gpu
@pytest.mark.parametrize("steps", [3, 700])
def test_stack_depth_is_a_word_of_the_launch(steps):
    """A loop whose trip count is an argument keeps its adjoint stack as deep as that count, read
    from the uniform block at each launch (no recompile per depth): 700 steps is past the default
    ad_stack_size (256). y = x * c**steps by repeated in-place multiplication of a local, so
    dy/dx = c**steps and dy/dc = steps * x * c**(steps - 1)."""
    n = 64
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    c = ti.field(ti.f32, shape=(), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def power(steps: ti.i32):
        for i in x:
            v = x[i]
            for _ in range(steps):
                v = v * c[None]
            loss[None] += v

    x0 = np.linspace(0.5, 1.5, n)
    c0 = 1.0 + 0.3 / steps
    x.from_numpy(x0.astype(np.float32))
    c[None] = c0
    with ti.ad.Tape(loss):
        power(steps)
    np.testing.assert_allclose(x.grad.to_numpy(), np.full(n, c0 ** steps), rtol=2e-4)
    np.testing.assert_allclose(c.grad[None], steps * x0.sum() * c0 ** (steps - 1), rtol=2e-3)
    words = power._get_grad((steps,))[0].plan.words
    assert any(isinstance(w, plan.StackCapacity) for w in words), words


def test_compile_options_refuse_bad_input():
    with pytest.raises(ti.WgpuAdError, match=r"set_options: unknown compile option 'gird_cap'; the options are "):
        ti.set_compile_options(gird_cap=4)
    with pytest.raises(ti.WgpuAdError, match=r"grid_cap=0: expected a positive integer"):
        ti.set_compile_options(grid_cap=0)
    with pytest.raises(ti.WgpuAdError, match=r"ad_stack_size=-1: expected a positive integer"):
        ti.set_compile_options(ad_stack_size=-1)
    opts = ti.set_compile_options(fuse_adjoint=False)
    assert ti.compile_options() is opts and not opts.fuse_adjoint
    ti.reset()
    assert ti.compile_options().fuse_adjoint  # a reset forgets what was set
