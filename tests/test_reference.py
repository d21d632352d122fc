"""The same kernels on the GPU and on the NumPy reference interpreter of the IR must agree:
exactly for integers, to float32 rounding for floats."""
import numpy as np
import pytest

import wgpu_ad as ti
from reference import run_on_reference

pytestmark = pytest.mark.gpu


def test_gpu_matches_interpreter_on_control_flow_and_funcs():
    n = 64
    a = ti.field(ti.f32, shape=n)
    out = ti.field(ti.f32, shape=n)
    cnt = ti.field(ti.i32, shape=n)

    @ti.func
    def smooth(v, k: ti.template()):
        r = v
        for _ in range(k):
            r = r * 0.5 + ti.sin(r)
            if r > 1.5:
                break
        return r

    @ti.kernel
    def k(scale: ti.f32):
        for i in a:
            v = a[i] * scale
            s = 0.0
            j = 0
            while j < i % 9:
                s += smooth(v + j, 3)
                j += 1
            out[i] = s if i % 2 == 0 else -s
            cnt[i] = j * 3 + (i // 5) % 4

    a.from_numpy(np.linspace(-2, 2, n).astype(np.float32))
    ref, _ = run_on_reference(k, 1.25)
    k(1.25)
    np.testing.assert_array_equal(cnt.to_numpy(), ref[id(cnt)])
    np.testing.assert_allclose(out.to_numpy(), ref[id(out)], rtol=1e-5, atol=1e-5)


def test_ir_and_wgsl_are_printable():
    x = ti.field(ti.f32, shape=8)

    @ti.kernel
    def double(s: ti.f32):
        for i in x:
            x[i] = x[i] * s

    ir = double.get_ir(2.0)
    assert ir.startswith("kernel double($s:f32)")
    assert "global_load @x" in ir and "global_store @x" in ir
    wgsl = double.get_wgsl(2.0)
    assert "@compute" in wgsl and "fn main" in wgsl and "x[" in wgsl


def test_template_arguments_and_u32():
    a = ti.field(ti.u32, shape=16)
    b = ti.field(ti.u32, shape=16)

    @ti.kernel
    def hash_into(dst: ti.template(), salt: ti.u32):
        for i in dst:
            h = ti.cast(i, ti.u32) * 2654435761 + salt
            h ^= h >> 13
            dst[i] = h

    hash_into(a, 7)
    hash_into(b, 9)

    def ref(salt):
        h = (np.arange(16, dtype=np.uint64) * 2654435761 + salt) % 2 ** 32
        return h ^ (h >> 13)
    np.testing.assert_array_equal(a.to_numpy(), ref(7))
    np.testing.assert_array_equal(b.to_numpy(), ref(9))


@pytest.mark.parametrize("emulated", [False, True])
def test_float_atomics_both_paths_million_way(emulated):
    ti.init(arch=ti.cpu, force_emulated_atomics=emulated)
    if not emulated and "shader-float32-atomic" not in ti.get_runtime().device.features:
        pytest.skip("this adapter has no native float atomics (shader-float32-atomic): only the emulated path")
    assert ti.get_runtime().has_float_atomics is (not emulated)
    n = 1_000_000
    s = ti.field(ti.f32, shape=())
    h = ti.field(ti.f32, shape=4)

    @ti.kernel
    def k():
        for i in range(n):
            s[None] += 1.0
            h[i % 4] -= 0.5

    k()
    assert s[None] == float(n)
    np.testing.assert_array_equal(h.to_numpy(), [-n / 8] * 4)
    assert ("atomicCompareExchangeWeak" in k.get_wgsl()) is emulated


@pytest.mark.parametrize("emulated", [False, True])
def test_accumulation_into_one_element_is_prereduced_and_accurate(emulated):
    ti.init(arch=ti.cpu, force_emulated_atomics=emulated)
    n = 1 << 20
    x = ti.field(ti.f32, shape=n)
    total = ti.field(ti.f32, shape=())
    count = ti.field(ti.i32, shape=())

    @ti.kernel
    def reduce(scale: ti.f32):
        for i in x:
            total[None] += x[i] * x[i] * scale
            if x[i] > 0.5:
                count[None] += 1

    xv = np.random.default_rng(0).random(n).astype(np.float32)
    x.from_numpy(xv)
    reduce(2.0)
    ref = 2.0 * (xv.astype(np.float64) ** 2).sum()
    # a workgroup tree sum then one atomic per workgroup: float32 error stays near rounding
    assert abs(total[None] - ref) <= 2e-6 * ref
    assert count[None] == int((xv > 0.5).sum())
    assert "workgroupBarrier" in reduce.get_wgsl(2.0)
