"""The offline cache (wgpu_ad/compiler/cache.py): a second process loads compiled kernels instead of
compiling them, and gets the same results (checked against NumPy float64 references, never
against our own output); a change to the kernel, a field's shape or a line number misses; a
damaged entry or an unusable folder means a recompile, never an error; offline_cache=False
writes nothing."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import wgpu_ad as ti
from wgpu_ad.compiler import cache

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 240
# compute, its adjoint, and the adjoint's variant that stores into x.grad instead of accumulating
# (x.grad is all zeros when compute.grad() runs: passes/autodiff/demote.py)
ENTRIES = 3

# ---- fresh processes ----------------------------------------------------------------------------

SCRIPT = '''\
import json
import numpy as np
import wgpu_ad as ti
from wgpu_ad.compiler import cache

ti.init()
N = {n}
x = ti.field(ti.f32, shape=N, needs_grad=True)
loss = ti.field(ti.f32, shape=(), needs_grad=True)
y = ti.ndarray(ti.f32, shape=(3, 4))


@ti.kernel
def compute(n: ti.i32):
    for i in x:
        acc = x[i]
        for k in range(n):  # trip count from an argument: the adjoint's stack is sized per launch
            acc = acc + {c} * ti.sin(acc)
        loss[None] += acc * acc


@ti.kernel
def fill(a: ti.types.ndarray(), s: ti.f32):
    for i, j in ti.ndrange(3, 4):
        a[i, j] = s * i + j


out = {{}}
x.from_numpy(np.linspace(0.1, 0.8, N).astype(np.float32))
for n in (3, 20):
    loss[None] = 0.0
    x.grad.fill(0.0)
    compute(n)
    loss.grad[None] = 1.0
    compute.grad(n)
    out[n] = [float(loss[None]), x.grad.to_numpy().tolist()]
fill(y, 2.0)
out["fill"] = y.to_numpy().tolist()
out["stats"] = cache.record.stats
print("RESULT " + json.dumps(out))
'''


def run_script(path: Path, cache_dir: Path, n: int = 8, c: float = 0.1) -> dict:
    path.write_text(SCRIPT.format(n=n, c=c))
    env = dict(os.environ, WGPU_AD_CACHE_DIR=str(cache_dir))
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=TIMEOUT)
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise AssertionError(f"the script failed (exit {r.returncode}):\n{r.stdout}\n{r.stderr}")


def check_against_numpy(out: dict, n_elems: int, c: float) -> None:
    x0 = np.linspace(0.1, 0.8, n_elems).astype(np.float32).astype(np.float64)
    for n in (3, 20):
        acc, d = x0.copy(), np.ones_like(x0)
        for _ in range(n):
            d *= 1.0 + c * np.cos(acc)
            acc = acc + c * np.sin(acc)
        loss, grad = out[str(n)]
        assert loss == pytest.approx(float((acc * acc).sum()), rel=1e-5)
        np.testing.assert_allclose(grad, 2.0 * acc * d, rtol=1e-4, atol=1e-6)
    i, j = np.meshgrid(np.arange(3), np.arange(4), indexing="ij")
    np.testing.assert_allclose(out["fill"], 2.0 * i + j)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """The script run twice in fresh processes with one cache folder: cold, then warm."""
    tmp = tmp_path_factory.mktemp("offline_cache")
    script, folder = tmp / "prog.py", tmp / "cache"
    cold = run_script(script, folder)
    warm = run_script(script, folder)
    return SimpleNamespace(tmp=tmp, script=script, folder=folder, cold=cold, warm=warm)


@pytest.mark.gpu
def test_second_process_loads_every_kernel_and_gets_the_same_results(two_runs):
    cold, warm = two_runs.cold, two_runs.warm
    assert cold["stats"]["hits"] == 0 and cold["stats"]["writes"] >= 3  # compute, its adjoint, fill
    assert warm["stats"]["hits"] == cold["stats"]["writes"]
    assert warm["stats"]["misses"] == 0 and warm["stats"]["writes"] == 0
    assert len(list(two_runs.folder.glob("*.wgk"))) == cold["stats"]["writes"]
    for out in (cold, warm):
        check_against_numpy(out, 8, 0.1)


@pytest.mark.gpu
def test_a_changed_constant_or_field_shape_misses(two_runs):
    folder = two_runs.tmp / "cache_changed"
    shutil.copytree(two_runs.folder, folder)
    writes = two_runs.cold["stats"]["writes"]
    # the constant in compute's source: compute and its adjoint (in two variants, ENTRIES) are
    # compiled again, fill is not
    out = run_script(two_runs.script, folder, c=0.2)
    check_against_numpy(out, 8, 0.2)
    assert out["stats"]["misses"] == ENTRIES and out["stats"]["hits"] == writes - ENTRIES
    # the shape of the field compute reads
    out = run_script(two_runs.script, folder, n=9)
    check_against_numpy(out, 9, 0.1)
    assert out["stats"]["misses"] == ENTRIES and out["stats"]["hits"] == writes - ENTRIES


# ---- in one process (ti.reset() drops the compiled kernels; the next compile reads the disk) -------

def make_program():
    x = ti.field(ti.f32, shape=6, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def compute():
        for i in x:
            loss[None] += ti.exp(0.5 * x[i]) * x[i]

    x.from_numpy(np.arange(6, dtype=np.float32) * 0.25)
    return x, loss, compute


def run_program(x, loss, compute) -> None:
    """Forward and gradient, checked against d/dx (exp(x/2) x) = exp(x/2) (1 + x/2)."""
    compute()
    loss.grad[None] = 1.0
    compute.grad()
    x0 = np.arange(6, dtype=np.float64) * 0.25
    assert loss[None] == pytest.approx(float((np.exp(0.5 * x0) * x0).sum()), rel=1e-5)
    np.testing.assert_allclose(x.grad.to_numpy(), np.exp(0.5 * x0) * (1 + 0.5 * x0), rtol=1e-5)


def fresh(folder, **options):
    ti.reset()
    ti.init(offline_cache_file_path=str(folder), **options)
    return dict(cache.record.stats)


def delta(before: dict) -> dict:
    return {k: cache.record.stats[k] - before[k] for k in before}


@pytest.mark.gpu
def test_after_reset_kernels_come_from_disk(tmp_path):
    before = fresh(tmp_path)
    run_program(*make_program())
    assert delta(before) == {"hits": 0, "misses": ENTRIES, "writes": ENTRIES, "bad_entries": 0, "write_errors": 0}
    before = fresh(tmp_path)
    run_program(*make_program())
    assert delta(before) == {"hits": ENTRIES, "misses": 0, "writes": 0, "bad_entries": 0, "write_errors": 0}


@pytest.mark.gpu
@pytest.mark.parametrize("damage", ["truncated", "flipped byte", "not a kernel", "empty", "another key's entry",
                                    "an older version's entry"])
def test_a_damaged_entry_is_compiled_again(tmp_path, damage):
    import pickle
    import struct
    import zlib
    fresh(tmp_path)
    run_program(*make_program())
    entries = sorted(tmp_path.glob("*.wgk"))
    assert len(entries) == ENTRIES
    originals = [e.read_bytes() for e in entries]
    for k, e in enumerate(entries):
        data = e.read_bytes()
        payload_at = len(cache._MAGIC) + struct.calcsize("<IQ")
        if damage == "another key's entry":  # well-formed, for another kernel (a file renamed by hand)
            data = originals[(k + 1) % len(entries)]
        elif damage == "an older version's entry":  # a record field added since the entry was written
            key, ck = pickle.loads(data[payload_at:])
            del ck.tasks[0].__dict__["loc"]
            payload = pickle.dumps((key, ck))
            data = cache._MAGIC + struct.pack("<IQ", zlib.crc32(payload), len(payload)) + payload
        if damage == "truncated":
            data = data[:len(data) // 2]
        elif damage == "flipped byte":
            data = data[:-10] + bytes([data[-10] ^ 0x40]) + data[-9:]
        elif damage == "not a kernel":  # a well-formed entry that holds something else
            payload = pickle.dumps(1) + pickle.dumps(2)
            data = cache._MAGIC + struct.pack("<IQ", zlib.crc32(payload), len(payload)) + payload
        else:
            data = b""
        e.write_bytes(data)
    before = fresh(tmp_path)
    run_program(*make_program())
    assert delta(before) == {"hits": 0, "misses": ENTRIES, "writes": ENTRIES, "bad_entries": ENTRIES,
                             "write_errors": 0}
    before = fresh(tmp_path)  # the entries were written again
    run_program(*make_program())
    assert delta(before)["hits"] == ENTRIES


@pytest.mark.gpu
def test_offline_cache_false_writes_nothing(tmp_path, monkeypatch):
    fresh(tmp_path / "a", offline_cache=False)
    run_program(*make_program())
    assert not (tmp_path / "a").exists()
    monkeypatch.setenv("WGPU_AD_OFFLINE_CACHE", "0")
    fresh(tmp_path / "b")
    run_program(*make_program())
    assert not (tmp_path / "b").exists()


@pytest.mark.gpu
def test_an_unusable_folder_means_compiling(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    before = fresh(blocker / "cache")
    run_program(*make_program())
    d = delta(before)
    assert d["hits"] == 0 and d["writes"] == 0 and d["write_errors"] == ENTRIES


@pytest.mark.gpu
def test_printing_the_ir_bypasses_the_cache(tmp_path, capsys):
    fresh(tmp_path)
    run_program(*make_program())
    capsys.readouterr()
    before = fresh(tmp_path, print_ir=True)
    run_program(*make_program())
    assert "kernel compute(" in capsys.readouterr().out
    assert delta(before)["hits"] == 0


# ---- source locations: a kernel moved down the file reports its own lines ---------------------------

KERNELS_SRC = """\
import wgpu_ad as ti


def overflow_kernel():
    x = ti.field(ti.f32, shape=4, needs_grad=True)
    m = ti.field(ti.i32, shape=())
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def f():
        for i in x:
            acc = x[i]
            for k in range(m[None]):
                acc = ti.sin(acc) + 0.5 * acc
            loss[None] += acc * acc
    m[None] = 10
    return f, loss


def index_kernel():
    a = ti.field(ti.f32, shape=8)

    @ti.kernel
    def k(n: ti.i32):
        for i in range(n):
            a[i + 3] = 1.0
    return k
"""


def _kernel_module(tmp_path, moved: bool):
    """KERNELS_SRC as the module tmp_path/src/kernels.py, with three blank lines at the top when
    `moved`: the same file and the same frontend IR, at other line numbers."""
    import importlib.util
    path = tmp_path / "src" / "kernels.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(("\n\n\n" if moved else "") + KERNELS_SRC)
    spec = importlib.util.spec_from_file_location(f"kernels_{'moved' if moved else 'here'}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _line_in(mod, text: str) -> int:
    return 1 + next(k for k, ln in enumerate(Path(mod.__file__).read_text().splitlines()) if text in ln)


def _overflow_message(make) -> str:
    f, loss = make()
    f()
    loss.grad[None] = 1.0
    with pytest.raises(ti.KernelRuntimeError) as e:
        f.grad()
    return str(e.value)


@pytest.mark.gpu
def test_a_moved_kernel_reports_its_own_line_numbers(tmp_path):
    # the stack-overflow message names the loop's line: it comes from the IR's source locations
    # (the adjoint's code generator), not from the kernel's text
    folder = tmp_path / "cache"
    fresh(folder, ad_stack_size=4)
    here = _kernel_module(tmp_path, moved=False)
    first = _overflow_message(here.overflow_kernel)
    f_line = _line_in(here, "for k in range(m[None])")
    assert f"the serial loop at {here.__file__}:{f_line} ran more than 4 iterations" in first
    before = fresh(folder, ad_stack_size=4)
    moved = _kernel_module(tmp_path, moved=True)
    message = _overflow_message(moved.overflow_kernel)
    m_line = _line_in(moved, "for k in range(m[None])")
    assert m_line == f_line + 3 and f"the serial loop at {moved.__file__}:{m_line} ran" in message
    assert delta(before)["hits"] == 0
    before = fresh(folder, ad_stack_size=4)  # the first one again: it hits, with its own line
    here = _kernel_module(tmp_path, moved=False)
    assert _overflow_message(here.overflow_kernel) == first
    assert delta(before)["hits"] == ENTRIES  # f, its adjoint and the adjoint's zero-store variant


@pytest.mark.gpu
def test_debug_mode_index_error_names_the_moved_line(tmp_path):
    for moved in (False, True, False):
        fresh(tmp_path / "cache", debug=True)
        mod = _kernel_module(tmp_path, moved)
        k = mod.index_kernel()
        k(5)
        with pytest.raises(ti.KernelRuntimeError) as e:
            k(6)
        line = _line_in(mod, "a[i + 3] = 1.0")
        assert str(e.value).startswith("kernel 'k': index (8) is out of range for field 'a' of shape (8,) "
                                       f"in k at {mod.__file__}:{line}")


# ---- keys and the folder, without a GPU ---------------------------------------------------------------

def test_the_key_does_not_depend_on_statement_numbering(tmp_path):
    from wgpu_ad.frontend.kernel import lower_kernel
    from wgpu_ad.compiler import CompileOptions
    opts = CompileOptions(grid_cap=256, offline_cache_file_path=str(tmp_path))
    x = ti.field(ti.f32, shape=(4, 5))

    def kernel_with(c):
        def k():
            for i, j in ti.ndrange(4, 5):
                x[i, j] = ti.sin(x[i, j]) * c
        return k

    def key(fn):
        return cache.forward_slot(lower_kernel(fn, "k", [], None, debug=False)[0], opts).key

    k1 = kernel_with(2.0)
    first = key(k1)
    key(kernel_with(3.0))  # numbers statements in between
    assert key(k1) == first
    assert key(kernel_with(3.0)) != first


def test_prune_removes_the_least_recently_used(tmp_path):
    for k in range(5):  # last used in this order (fixed times: only their order matters)
        p = tmp_path / f"{k}.wgk"
        p.write_bytes(b"x" * 100)
        os.utime(p, (1_000_000 + k, 1_000_000 + k))
    assert cache.prune(tmp_path, limit=1000) == 0
    assert cache.prune(tmp_path, limit=300) == 3   # down to 3/4 of the limit
    assert sorted(p.name for p in tmp_path.iterdir()) == ["3.wgk", "4.wgk"]


def test_prune_leaves_another_process_s_half_written_entry(tmp_path):
    """A .tmp- file is an entry another process is writing (os.replace publishes it): deleting it
    would lose that write, so prune neither removes nor counts it."""
    old = tmp_path / ".tmp-abc.wgk"
    old.write_bytes(b"x" * 1000)
    os.utime(old, (1_000_000, 1_000_000))  # the oldest file in the folder
    for k in range(3):
        p = tmp_path / f"{k}.wgk"
        p.write_bytes(b"x" * 100)
        os.utime(p, (1_000_100 + k, 1_000_100 + k))
    assert cache.prune(tmp_path, limit=200) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tmp-abc.wgk", "2.wgk"]
