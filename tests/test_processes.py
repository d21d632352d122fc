"""wgpu_ad across processes: a fork after the GPU was used is refused clearly in the child (it
would hang), a fork before it works; kernels pickle by name and run in a spawned worker; fields
refuse to pickle naming the way (to_numpy()); a missing .grad / .dual is an AttributeError."""
import multiprocessing as mp
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import wgpu_ad as ti

pytestmark = pytest.mark.gpu
TIMEOUT = 120  # a hang is the failure these tests exist to catch


@ti.kernel
def triple(src: ti.types.ndarray(), dst: ti.types.ndarray()):
    for i in src:
        dst[i] = 3.0 * src[i]


def _in_forked_child(q):
    try:
        ti.init()
        q.put("opened a device")
    except ti.GpuError as e:
        q.put(str(e))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")
def test_a_fork_after_the_gpu_was_used_is_refused_in_the_child_not_hung():
    x = ti.field(ti.f32, shape=4)
    x.fill(2.0)
    assert x.to_numpy().tolist() == [2.0] * 4  # the parent has used the GPU
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_in_forked_child, args=(q,))
    p.start()
    p.join(TIMEOUT)
    alive = p.is_alive()
    if alive:
        p.kill()
    assert not alive, "the forked child hung"
    msg = q.get(timeout=5)
    assert msg.startswith("this process was forked (os.fork(), multiprocessing's default 'fork' start method")
    assert "Start worker processes with the 'spawn' method" in msg
    x.fill(5.0)  # the parent goes on
    assert x.to_numpy().tolist() == [5.0] * 4


def test_a_fork_before_the_gpu_is_used_works_and_parent_data_is_named(tmp_path):
    script = tmp_path / "fork_first.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        import numpy as np
        import wgpu_ad as ti
        x = ti.field(ti.f32, shape=4)
        pid = os.fork()
        if pid == 0:
            try:
                y = ti.field(ti.f32, shape=4)
                y.from_numpy(np.arange(4, dtype=np.float32))
                print("child", y.to_numpy().tolist(), flush=True)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        x.fill(1.0)
        print("parent", x.to_numpy().tolist(), flush=True)
        pid = os.fork()
        if pid == 0:
            try:
                x.to_numpy()
            except ti.WgpuAdError as e:
                print("child error:", e, flush=True)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
    """))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=TIMEOUT,
                       env={**os.environ, "WGPU_AD_CACHE_DIR": str(tmp_path / "c")})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "child [0.0, 1.0, 2.0, 3.0]"   # forked before the parent used the GPU: works
    assert lines[1] == "parent [1.0, 1.0, 1.0, 1.0]"
    # forked after the parent used the GPU: refused, saying so (a device opened here would hang)
    assert lines[2].startswith("child error: this process was forked (os.fork(), multiprocessing's default "
                               "'fork' start method")


def _run_in_spawned(k, q):
    a = np.arange(5, dtype=np.float32)
    b = np.zeros(5, np.float32)
    k(a, b)
    q.put(b.tolist())


def test_a_kernel_pickles_by_name_and_runs_in_a_spawned_worker():
    assert pickle.loads(pickle.dumps(triple)) is triple
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_run_in_spawned, args=(triple, q))
    p.start()
    p.join(TIMEOUT)
    alive = p.is_alive()
    if alive:
        p.kill()
    assert not alive, "the spawned worker hung"
    assert p.exitcode == 0
    assert q.get(timeout=5) == [0.0, 3.0, 6.0, 9.0, 12.0]


def test_a_kernel_defined_in_a_function_cannot_pickle_and_says_why():
    @ti.kernel
    def local(x: ti.types.ndarray()):
        for i in x:
            x[i] = 1.0
    with pytest.raises(TypeError, match=r"kernel 'local' cannot be pickled: it is defined inside a function .*; "
                                        r"define it at the top level of a module"):
        pickle.dumps(local)


def test_fields_and_ndarrays_refuse_to_pickle_naming_to_numpy():
    grid = ti.field(ti.f32, shape=(2, 2))
    arr = ti.ndarray(ti.f32, 3)
    with pytest.raises(TypeError, match=r"field 'grid' cannot be pickled: its data lives on this process's GPU "
                                        r"device. Send grid.to_numpy\(\) instead"):
        pickle.dumps(grid)
    with pytest.raises(TypeError, match=r"ndarray 'arr' cannot be pickled: .* Send arr.to_numpy\(\) instead"):
        pickle.dumps(arr)


def test_a_missing_gradient_or_dual_is_an_attribute_error():
    """(Ray and pickle look attributes up with getattr / hasattr; a field's .grad before placement is
    the handle ti.root...place(x.grad) takes, as in Taichi.)"""
    x = ti.field(ti.f32, shape=2)
    x.to_numpy()  # placed
    arr = ti.ndarray(ti.f32, 3)
    assert not hasattr(x, "dual") and not hasattr(arr, "grad") and not hasattr(arr, "dual")
    with pytest.raises(AttributeError, match=r"field 'x' has no dual: create it with needs_dual=True"):
        x.dual
    with pytest.raises(ti.WgpuAdError, match=r"ndarray 'arr' has no gradient: create it with needs_grad=True"):
        arr.grad


def test_a_kernel_the_worker_cannot_find_by_name_says_so():
    from wgpu_ad.lang.kernel import _by_name
    with pytest.raises(AttributeError, match=r"a pickled wgpu_ad kernel or ti.func names test_processes.no_such, which "
                                             r"this process cannot find: 'test_processes' here has no 'no_such'"):
        _by_name("test_processes", "no_such")
