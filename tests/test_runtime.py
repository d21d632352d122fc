"""The wgpu runtime on its own: adapter choice, errors, launch ordering and batching, debug checks.

Kernels here are hand-written WGSL wrapped in CompiledKernels, so the runtime is tested without
the compiler; every result is checked against a NumPy / Python reference.
"""
from __future__ import annotations

import logging
import struct

import numpy as np
import pytest

from wgpu_ad.errors import GpuError, KernelRuntimeError, WgpuAdError
from wgpu_ad.runtime import BindingSpec, CompiledKernel, CompiledTask
from wgpu_ad.runtime import adapter as A
import wgpu_ad as ti
from wgpu_ad import session as S
from wgpu_ad.runtime import device as D
from wgpu_ad.runtime import batch
from wgpu_ad.types import f32, i32, u32

ARGS = "struct Args { w: array<vec4<u32>, 1> }\n@group(0) @binding(0) var<uniform> args: Args;\n"

# a[i] += args word 0, for every i
ADD_WGSL = ARGS + """@group(0) @binding(1) var<storage, read_write> a: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    if (g.x < arrayLength(&a)) { a[g.x] += args.w[0].x; }
}
"""
# a[args word 0] = args word 1
STORE_WGSL = ARGS + """@group(0) @binding(1) var<storage, read_write> a: array<u32>;
@compute @workgroup_size(1)
fn main() { a[args.w[0].x] = args.w[0].y; }
"""


def add_kernel() -> CompiledKernel:
    task = CompiledTask("add_one", ADD_WGSL, "main", 64, [BindingSpec(0, "args"), BindingSpec(1, "buffer", 0)], False)
    return CompiledKernel("add_one", [task], 1, ["a"])


def store_kernel() -> CompiledKernel:
    task = CompiledTask("store", STORE_WGSL, "main", 1, [BindingSpec(0, "args"), BindingSpec(1, "buffer", 0)], True)
    return CompiledKernel("store", [task], 2, ["a"])


def u32s(*v) -> bytes:
    return struct.pack(f"<{len(v)}I", *v)


def read_u32(rt, buf, n) -> np.ndarray:
    return np.frombuffer(rt.read(buf, 4 * n), dtype=np.uint32)


# ---- adapter choice (pure Python: fake adapters) --------------------------------------------------

class FakeAdapter:
    def __init__(self, backend, kind, name="fake"):
        self.info = {"device": name, "backend_type": backend, "adapter_type": kind, "description": ""}
        self.features = set()
        self.limits = {k: 1 for k in A.KEY_LIMITS}


@pytest.fixture
def fake_adapters(monkeypatch):
    def install(*adapters):
        monkeypatch.setattr(A, "enumerate_adapters", lambda: list(adapters))
        monkeypatch.delenv(A.ARCH_ENV_VAR, raising=False)
        return adapters
    return install


def test_adapter_preference_discrete_integrated_cpu(fake_adapters):
    gl, cpu, igpu, dgpu = fake_adapters(FakeAdapter("OpenGL", "DiscreteGPU", "gl"), FakeAdapter("Vulkan", "CPU", "lvp"),
                                        FakeAdapter("Vulkan", "IntegratedGPU", "igpu"),
                                        FakeAdapter("Vulkan", "DiscreteGPU", "dgpu"))
    assert A.select_adapter(None) is dgpu
    assert A.select_adapter(A.gpu) is dgpu
    assert A.select_adapter(A.cpu) is cpu
    assert A.select_adapter(A.opengl) is gl
    assert A.select_adapter(A.vulkan) is dgpu
    fake_adapters(cpu, igpu)
    assert A.select_adapter(None) is igpu


def test_adapter_prefers_vulkan_over_opengl_of_same_kind(fake_adapters):
    gl, vk = fake_adapters(FakeAdapter("OpenGL", "CPU"), FakeAdapter("Vulkan", "CPU"))
    assert A.select_adapter(None) is vk


def test_missing_backend_lists_adapters(fake_adapters):
    fake_adapters(FakeAdapter("Vulkan", "CPU", "llvmpipe"))
    with pytest.raises(GpuError) as e:
        A.select_adapter(A.metal)
    assert "no adapter for arch 'metal'" in str(e.value)
    assert "llvmpipe (Vulkan, CPU)" in str(e.value)


def test_no_adapter_says_what_to_install(fake_adapters):
    fake_adapters()
    with pytest.raises(GpuError) as e:
        ti.init()
    msg = str(e.value)
    assert "apt-get install mesa-vulkan-drivers libvulkan1" in msg
    assert "macOS: Metal is built in" in msg
    assert "Windows: update the GPU driver" in msg


def test_main_without_adapter_exits_1(fake_adapters, capsys):
    from wgpu_ad.__main__ import main
    fake_adapters()
    assert main([]) == 1
    assert "apt-get install mesa-vulkan-drivers libvulkan1" in capsys.readouterr().err


def test_bad_arch_is_an_error(monkeypatch):
    monkeypatch.delenv(A.ARCH_ENV_VAR, raising=False)
    with pytest.raises(GpuError, match=r"unknown arch 'tpu': wgpu_ad supports ti.vulkan, .* ti.gpu \(best "
                                       r"hardware adapter; ti.cuda and ti.amdgpu mean the same\)"):
        ti.init(arch="tpu")
    assert A.normalize_arch("cuda") == A.normalize_arch("amdgpu") == A.gpu  # Taichi programs' GPU archs
    monkeypatch.setenv(A.ARCH_ENV_VAR, "tpu")
    with pytest.raises(GpuError, match="WGPU_AD_ARCH='tpu' is not an arch"):
        ti.init()


def test_env_var_overrides_arch(fake_adapters, monkeypatch):
    cpu, dgpu = fake_adapters(FakeAdapter("Vulkan", "CPU"), FakeAdapter("Vulkan", "DiscreteGPU"))
    monkeypatch.setenv(A.ARCH_ENV_VAR, "cpu")
    assert A.normalize_arch(A.gpu) == "cpu"
    assert A.select_adapter(A.normalize_arch(A.gpu)) is cpu


def test_default_fp_other_than_f32_is_refused():
    with pytest.raises(WgpuAdError, match="default_fp=i32 is not supported"):
        D.Runtime(default_fp=i32)


# ---- the real device ------------------------------------------------------------------------------

@pytest.mark.gpu
def test_adapter_info_features_limits():
    rt = ti.init()
    info = rt.adapter_info
    assert info["backend_type"] in ("Vulkan", "Metal", "D3D12", "OpenGL")
    assert set(info["features"]) == set(A.WANTED_FEATURES)
    for f, present in info["features"].items():
        assert (f in rt.features) == present  # every wanted feature the adapter has was requested
    assert rt.limits["max-storage-buffer-binding-size"] == rt.adapter.limits["max-storage-buffer-binding-size"]
    assert rt.max_workgroups == rt.limits["max-compute-workgroups-per-dimension"]
    assert rt.has_float_atomics == ("shader-float32-atomic" in rt.features)
    assert ti.init(force_emulated_atomics=True).has_float_atomics is False


@pytest.mark.gpu
def test_main_prints_adapter(capsys):
    from wgpu_ad.__main__ import main
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "backend:" in out and "shader-float32-atomic" in out and "max-storage-buffer-binding-size" in out
    import os
    assert f"offline cache: {os.environ['WGPU_AD_CACHE_DIR']}" in out  # the suite's own folder (conftest)
    cpu = ti.init().adapter.info.get("adapter_type", "").upper() == "CPU"
    assert ("parallel loops: multi-dimensional ones keep" in out) == cpu


@pytest.mark.gpu
def test_init_twice_resets_and_get_runtime_is_lazy():
    assert S._state["session"] is None  # the conftest reset
    rt0 = ti.get_runtime()
    assert ti.get_runtime() is rt0
    rt1 = ti.init(debug=True)
    assert rt1 is not rt0 and ti.get_runtime() is rt1 and rt1.debug
    gen = S.generation()
    ti.reset()
    assert S.generation() == gen + 1 and S._state["session"] is None


@pytest.mark.gpu
def test_broken_wgsl_names_kernel_and_line():
    rt = ti.init()
    wgsl = "@compute @workgroup_size(1)\nfn main() {\n    let x: i32 = 1.5;\n}\n"
    ck = CompiledKernel("broken", [CompiledTask("broken_t0", wgsl, "main", 1, [], True)], 0, [])
    with pytest.raises(GpuError) as e:
        rt.launch(ck, 0, [], b"", 1)
    msg = str(e.value)
    assert msg.startswith("kernel 'broken' (task 'broken_t0'): WebGPU rejected the WGSL shader at WGSL line 3: let x: i32 = 1.5;")
    assert "wgsl:3:" in msg


@pytest.mark.gpu
def test_bad_entry_point_and_too_small_buffer_are_gpu_errors():
    rt = ti.init()
    ck = CompiledKernel("nope", [CompiledTask("t", "@compute @workgroup_size(1) fn main() {}", "missing", 1, [], True)], 0, [])
    with pytest.raises(GpuError, match="kernel 'nope' .*compute pipeline"):
        rt.launch(ck, 0, [], b"", 1)
    fixed = "@group(0) @binding(0) var<storage, read_write> a: array<u32, 64>;\n" \
            "@compute @workgroup_size(1) fn main() { a[3] = 7u; }"
    ck = CompiledKernel("small", [CompiledTask("t", fixed, "main", 1, [BindingSpec(0, "buffer", 0)], True)], 0, ["a"])
    with pytest.raises(GpuError, match=r"WebGPU rejected work from kernel 'small'(.|\n)*expects 256"):
        rt.launch(ck, 0, [rt.create_storage(16, "a")], b"", 1)
        rt.flush()
    # the device stays usable after a rejected batch
    buf = rt.create_storage(64 * 4, "b")
    rt.launch(ck, 0, [buf], b"", 1)
    assert read_u32(rt, buf, 4).tolist() == [0, 0, 0, 7]


@pytest.mark.gpu
def test_write_launch_write_launch_read_order():
    rt = ti.init()
    ck = add_kernel()
    n = 200
    buf = rt.create_storage(4 * n, "a")
    ref = np.arange(n, dtype=np.uint32)
    rt.write(buf, ref)
    for _ in range(37):
        rt.launch(ck, 0, [buf], u32s(1), (n + 63) // 64)
    ref += 37
    rt.write(buf, np.full(10, 1000, np.uint32), offset=40)  # after the launches above, before those below
    ref[10:20] = 1000
    snap = rt.create_storage(4 * n, "snapshot")
    rt.copy(buf, snap, 4 * n)
    for _ in range(5):
        rt.launch(ck, 0, [buf], u32s(3), (n + 63) // 64)
    np.testing.assert_array_equal(read_u32(rt, snap, n), ref)
    ref += 15
    np.testing.assert_array_equal(read_u32(rt, buf, n), ref)
    rt.clear(buf, 8, offset=4)
    rt.launch(ck, 0, [buf], u32s(1), (n + 63) // 64)
    ref[1:3] = 0
    ref += 1
    np.testing.assert_array_equal(read_u32(rt, buf, n), ref)


@pytest.mark.gpu
@pytest.mark.parametrize("max_pending, capacity", [(512, None), (7, None), (512, 5 * 32)])
def test_each_launch_sees_its_own_args(monkeypatch, max_pending, capacity):
    rt = ti.init()
    rt.max_pending = max_pending
    if capacity is not None:  # force flushes when the uniform batch is full
        monkeypatch.setattr(batch, "UNIFORM_CAPACITY", capacity)
    n = 300
    buf = rt.create_storage(4 * n, "a")
    ck = store_kernel()
    for k in range(n):
        rt.launch(ck, 0, [buf], u32s(k, 3 * k + 11), 1)
    np.testing.assert_array_equal(read_u32(rt, buf, n), 3 * np.arange(n) + 11)


@pytest.mark.gpu
def test_many_accumulating_launches_exact():
    rt = ti.init()
    ck = add_kernel()
    buf = rt.create_storage(4 * 100, "a")
    for k in range(1200):  # spans several automatic flushes
        rt.launch(ck, 0, [buf], u32s(k), 2)
    np.testing.assert_array_equal(read_u32(rt, buf, 100), np.full(100, sum(range(1200))))


@pytest.mark.gpu
def test_serial_task_runs_one_workgroup_and_zero_workgroups_run_nothing():
    rt = ti.init()
    wgsl = "@group(0) @binding(0) var<storage, read_write> a: array<atomic<u32>>;\n" \
           "@compute @workgroup_size(8) fn main() { atomicAdd(&a[0], 1u); }"
    mk = lambda serial: CompiledKernel("count", [CompiledTask("t", wgsl, "main", 8, [BindingSpec(0, "buffer", 0)], serial)], 0, ["a"])
    buf = rt.create_storage(16, "a")
    rt.launch(mk(True), 0, [buf], b"", 100)
    assert read_u32(rt, buf, 1)[0] == 8
    rt.launch(mk(False), 0, [buf], b"", 3)
    rt.launch(mk(False), 0, [buf], b"", 0)
    assert read_u32(rt, buf, 1)[0] == 8 + 24
    with pytest.raises(GpuError, match="max-compute-workgroups-per-dimension"):
        rt.launch(mk(False), 0, [buf], b"", rt.max_workgroups + 1)


@pytest.mark.gpu
def test_unaligned_write_and_read():
    rt = ti.init()
    buf = rt.create_storage(16, "h")
    rt.write(buf, bytes(range(1, 17)))
    rt.write(buf, b"\xaa\xbb\xcc", offset=5)
    assert rt.read(buf, 7, offset=3) == bytes([4, 5, 0xAA, 0xBB, 0xCC, 9, 10])
    with pytest.raises(GpuError, match="outside buffer 'h' \\(16 bytes\\)"):
        rt.read(buf, 8, offset=12)


@pytest.mark.gpu
@pytest.mark.parametrize("nbytes", [4, 4096, 4100])
def test_writes_between_launches_keep_their_order(nbytes):
    """Small writes after recorded launches are staged in the batch (uploaded before its submit,
    copied in order); larger ones submit the batch first. Either way each launch sees the
    writes before it and not those after it, in one batch too, past the staging capacity."""
    rt = ti.init()
    wgsl = "@group(0) @binding(0) var<storage, read_write> a: array<u32>;\n" \
           "@compute @workgroup_size(1) fn main() { a[0] = a[0] * 3u + a[1]; a[1] = a[1] + 1u; }"
    ck = CompiledKernel("mix", [CompiledTask("t", wgsl, "main", 1, [BindingSpec(0, "buffer", 0)], True)], 0, ["a"])
    buf = rt.create_storage(max(nbytes, 8), "a")
    want = np.zeros(max(nbytes, 8) // 4, np.uint64)
    rt.launch(ck, 0, [buf], b"", 1)  # the batch is open from here on
    want[0], want[1] = 0, 1
    submits = []
    queue = rt.queue

    class CountingQueue:
        def __getattr__(self, name):
            return getattr(queue, name)

        def submit(self, command_buffers):
            submits.append(len(command_buffers))
            return queue.submit(command_buffers)
    rt.queue = CountingQueue()
    for k in range(1, 40):  # 39 writes of up to 4100 bytes: past the 64 KiB of staging
        rt.write(buf, np.full(nbytes // 4, k, np.uint32))
        want[: nbytes // 4] = k
        rt.launch(ck, 0, [buf], b"", 1)
        want[0] = want[0] * 3 + want[1]
        want[1] += 1
    during = len(submits)
    got = read_u32(rt, buf, len(want))
    np.testing.assert_array_equal(got, (want % 2**32).astype(np.uint32))
    # staged: no submit (4 bytes), one each time 64 KiB of staging fill up (4096); not staged: one per write
    assert during == {4: 0, 4096: 39 * 4096 // (64 * 1024), 4100: 39}[nbytes]


@pytest.mark.gpu
def test_return_value_buffer():
    rt = ti.init()
    wgsl = "@group(0) @binding(0) var<storage, read_write> ret: array<u32>;\n" \
           "@compute @workgroup_size(1) fn main() { ret[0] = bitcast<u32>(-2.75f); }"
    ck = CompiledKernel("r", [CompiledTask("t", wgsl, "main", 1, [BindingSpec(0, "ret")], True)], 0, [], ret_dtype=f32)
    rt.launch(ck, 0, [], b"", 1)
    assert rt.read_ret(f32) == -2.75
    other = rt.create_storage(16, "ret2")
    rt.launch(ck, 0, [], b"", 1, ret_buffer=other)
    assert np.frombuffer(rt.read(other, 4), np.float32)[0] == -2.75


ERR_WGSL = ARGS + """@group(0) @binding(1) var<storage, read_write> err: array<atomic<u32>>;
@compute @workgroup_size(4)
fn main(@builtin(local_invocation_index) t: u32) {
    // assert #1 fails when args word 0 is 1: record once, with its values
    if (args.w[0].x == 1u && t == 2u) {
        if (atomicCompareExchangeWeak(&err[0], 0u, 2u).exchanged) {
            atomicStore(&err[1], bitcast<u32>(-7));
            atomicStore(&err[2], bitcast<u32>(0.5f));
            atomicStore(&err[3], 4000000000u);
        }
    }
}
"""


@pytest.mark.gpu
def test_debug_error_buffer_formats_assert():
    rt = ti.init(debug=True)
    task = CompiledTask("t", ERR_WGSL, "main", 4, [BindingSpec(0, "args"), BindingSpec(1, "error")], False)
    ck = CompiledKernel("checked", [task], 1, [],
                        asserts=[("never", []), ("index {} out of range at x={} (n={})", [i32, f32, u32])])
    rt.launch(ck, 0, [], u32s(0), 1)
    assert rt._pending == 0  # debug mode submits each launch alone
    rt.check_errors(ck)  # nothing failed
    rt.launch(ck, 0, [], u32s(1), 1)
    with pytest.raises(KernelRuntimeError) as e:
        rt.check_errors(ck)
    assert str(e.value) == "kernel 'checked': index -7 out of range at x=0.5 (n=4000000000)"
    assert read_u32(rt, rt.error_buffer, 4).tolist() == [0, 0, 0, 0]  # zeroed after reporting
    rt.check_errors(ck)


@pytest.mark.gpu
def test_device_loss_becomes_gpu_error():
    rt = ti.init()
    logging.getLogger("wgpu").error("The WGPU device was lost (Unknown):\nsimulated")
    with pytest.raises(GpuError, match="device was lost"):
        rt.read(rt.ret_buffer, 4)


@pytest.mark.gpu
def test_bind_groups_and_pipelines_are_cached():
    rt = ti.init()
    ck = add_kernel()
    a, b = rt.create_storage(64, "a"), rt.create_storage(64, "b")
    for buf in (a, b, a, b):
        rt.launch(ck, 0, [buf], u32s(1), 1)
    tp = rt._pipelines.kernel(ck).tasks[0]
    assert len(tp.bind_groups) == 2
    ck2 = add_kernel()  # same WGSL: same pipeline object
    rt.launch(ck2, 0, [a], u32s(1), 1)
    assert rt._pipelines.kernel(ck2).tasks[0].pipeline is tp.pipeline
    assert read_u32(rt, a, 16).tolist() == [3] * 16


@pytest.mark.gpu
def test_no_driver_noise_when_xdg_runtime_dir_is_unset(tmp_path):
    """Mesa's drivers print `error: XDG_RUNTIME_DIR is invalid or not set` four times when it is
    unset (CI, containers); wgpu_ad points it at a private folder first, only then."""
    import os
    import subprocess
    import sys

    script = tmp_path / "k.py"
    script.write_text("import os\nimport wgpu_ad as ti\nti.init()\nx = ti.field(ti.f32, shape=4)\n\n"
                      "@ti.kernel\ndef k():\n    for i in x:\n        x[i] = i * 2.0\n\n"
                      "k()\nprint(x.to_numpy().tolist(), oct(os.stat(os.environ['XDG_RUNTIME_DIR']).st_mode & 0o777))\n")
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "XDG_RUNTIME_DIR" not in r.stderr, r.stderr
    assert r.stdout.strip() == "[0.0, 2.0, 4.0, 6.0] 0o700"


def _interrupt_once(monkeypatch, cls, name, after: bool = False):
    """cls.name raises KeyboardInterrupt on its next call only (as Ctrl-C landing there would),
    before it does anything or, with after=True, once it has done its work (a mapped buffer)."""
    orig = getattr(cls, name)
    state = {"armed": True}

    def wrapper(self, *a, **k):
        if state["armed"]:
            state["armed"] = False
            if after:
                orig(self, *a, **k)
            raise KeyboardInterrupt
        return orig(self, *a, **k)
    monkeypatch.setattr(cls, name, wrapper)
    return state


@pytest.mark.gpu
@pytest.mark.parametrize("where", ["map_sync", "submit", "end"])
def test_ctrl_c_inside_a_read_back_or_a_submit_leaves_the_runtime_usable(monkeypatch, where):
    """A KeyboardInterrupt that lands while a read-back maps its buffer, while the batch is
    submitted or while the compute pass ends comes out as itself, and the next launches and reads
    work (it left the buffer mapped or the encoder finished: every later call failed)."""
    x = ti.field(ti.f32, shape=16)

    @ti.kernel
    def add(v: ti.f32):
        for i in x:
            x[i] += v

    add(1.0)
    assert x.to_numpy().tolist() == [1.0] * 16
    rt = ti.get_runtime()
    add(2.0)  # recorded, not yet submitted
    owner = {"map_sync": type(rt._staging), "submit": type(rt.queue),
             "end": type(rt._pass)}[where]
    state = _interrupt_once(monkeypatch, owner, where, after=where == "map_sync")
    with pytest.raises(KeyboardInterrupt):
        x.to_numpy()
    assert not state["armed"]
    add(4.0)
    got = x.to_numpy()
    # the interrupted batch was either submitted (map_sync: it ran) or dropped with the interrupt
    expected = 7.0 if where == "map_sync" else 5.0
    assert got.tolist() == [expected] * 16, (where, got)
    add(1.0)
    assert x.to_numpy().tolist() == [expected + 1.0] * 16


@pytest.mark.gpu
def test_sync_waits_only_for_work_submitted_since_the_last_wait():
    """sync() reads back (and so waits) only when something was launched or submitted since the last
    completed wait; the read-backs of read() count as waits. Results stay in order throughout."""
    rt = ti.init()
    buf = rt.create_storage(64, "a")
    ck = add_kernel()
    rt.sync()
    before = rt.readback_count
    rt.sync()
    rt.sync()
    assert rt.readback_count == before, "a sync with nothing pending read back"
    rt.launch(ck, 0, [buf], u32s(5), 1)
    rt.sync()
    assert rt.readback_count == before + 1
    rt.sync()
    assert rt.readback_count == before + 1
    rt.launch(ck, 0, [buf], u32s(2), 1)
    assert read_u32(rt, buf, 16).tolist() == [7] * 16  # the read waited: no sync needed after it
    rt.sync()
    assert rt.readback_count == before + 2
    enc = rt.device.create_command_encoder()
    enc.clear_buffer(buf)
    rt.submit([enc.finish()])  # work submitted by others on the device (the viewer's frames)
    rt.sync()
    assert rt.readback_count == before + 3
    assert read_u32(rt, buf, 16).tolist() == [0] * 16
