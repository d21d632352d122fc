"""The adapter's limits, met with a clear error or a way around them: a kernel binding more storage
buffers than the adapter allows per shader (lavapipe: 32) names the kernel (or its adjoint), the
count, the limit and the fix; a tape's fused launch that would bind too many runs apart."""
import numpy as np
import pytest

import wgpu_ad as ti

pytestmark = pytest.mark.gpu


def _storage_limit() -> int:
    limit = ti.get_runtime().limits["max-storage-buffers-per-shader-stage"]
    if limit > 64:
        pytest.skip(f"this adapter binds {limit} storage buffers per shader: too many fields to make for the test")
    return limit


def test_kernel_binding_more_storage_buffers_than_the_adapter_allows():
    """One field more than the adapter binds per shader (lavapipe: 32): a clear error naming the
    kernel, the count, the limit and the fix, before WebGPU's validation text; the adjoint's count
    is checked too, and names the backward pass."""
    import re

    limit = _storage_limit()
    fs = [ti.field(ti.f32, shape=4, needs_grad=True) for _ in range(limit)]
    out = ti.field(ti.f32, shape=4, needs_grad=True)

    @ti.kernel
    def gather():
        for i in out:
            s = 0.0
            for f in ti.static(fs):
                s += f[i]
            out[i] = s

    with pytest.raises(ti.GpuError) as e:
        gather()
    msg = str(e.value)
    adapter = re.search(r"this adapter \((.*)\) allows", msg).group(1)
    assert msg.splitlines()[0] == (
        f"kernel 'gather' binds {limit + 1} storage buffers in one parallel loop ({limit + 1} for its fields and "
        f"ndarrays), but this adapter ({adapter}) allows {limit} per shader (its max-storage-buffers-per-shader-stage; "
        f"`python -m wgpu_ad` lists its limits). Split the loop into kernels that each read and write fewer fields, "
        f"or keep values that go together in one field (ti.Vector.field(n, ...) is one buffer for n components)")
    assert ", in gather" in msg and msg.splitlines()[-2].strip() == "for i in out:"

    # the forward fits (half the fields and out), the adjoint does not (their values and gradients)
    half = fs[:limit // 2 + 1]
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def squares():
        for i in range(4):
            s = 0.0
            for f in ti.static(half):
                s += f[i] * f[i]
            loss[None] += s

    squares()
    with pytest.raises(ti.GpuError) as e:
        squares.grad()
    assert str(e.value).splitlines()[0].startswith(
        f"the adjoint of kernel 'squares' (its backward pass, run by ti.ad.Tape or squares.grad()) binds "
        f"{2 * len(half) + 1} storage buffers in one parallel loop ({2 * len(half) + 1} for its fields, ndarrays and "
        f"their gradients), but this adapter")
    assert "Split the kernel into kernels that each read fewer fields with gradients" in str(e.value)


def test_a_tape_runs_the_adjoint_apart_when_fused_it_binds_too_many_buffers():
    """A tape fuses its last launch with its adjoint, which binds both their buffers; when that is
    more than the adapter allows, the two run apart (each fits) and the gradient is right."""
    limit = _storage_limit()
    n = limit // 3 + 1  # forward and adjoint bind 2n + 1 buffers each, the fused kernel 3n + 2
    xs = [ti.field(ti.f32, shape=4, needs_grad=True) for _ in range(n)]
    ys = [ti.field(ti.f32, shape=4) for _ in range(n)]
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    x0 = np.linspace(-1.0, 2.0, 4, dtype=np.float32)
    for k, x in enumerate(xs):
        x.from_numpy(x0 + k)

    @ti.kernel
    def f():
        for i in range(4):
            for k in ti.static(range(n)):
                ys[k][i] = xs[k][i] * 2.0
                loss[None] += xs[k][i] * xs[k][i]

    with ti.ad.Tape(loss=loss):
        f()
    for k, x in enumerate(xs):
        np.testing.assert_allclose(x.grad.to_numpy(), 2 * (x0.astype(np.float64) + k), rtol=1e-6)


def _squares_on_a_tape(n: int):
    """n fields with gradients, each read by one kernel on a tape: (their gradients, analytic)."""
    xs = [ti.field(ti.f32, shape=4, needs_grad=True) for _ in range(n)]
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    x0 = np.linspace(-1.0, 2.0, 4, dtype=np.float32)
    for k, x in enumerate(xs):
        x.from_numpy(x0 + k)

    @ti.kernel
    def squares():
        for i in range(4):
            for k in ti.static(range(n)):
                loss[None] += xs[k][i] * xs[k][i]

    with ti.ad.Tape(loss=loss):
        squares()
    return [x.grad.to_numpy() for x in xs], [2 * (x0.astype(np.float64) + k) for k in range(n)]


@pytest.mark.parametrize("n", [14, 31, 40])
def test_fields_with_gradients_under_a_tape_at_a_limit_of_32_storage_buffers(n):
    """Lavapipe's limit, forced on every adapter: 14 fields run (forward 15 buffers, adjoint 29;
    fused, 44, they run apart); 31 fit the forward but not the adjoint (63); 40 not even the
    forward (41). Where nothing fits, the error names the kernel, the count, the limit and the fix,
    never WebGPU's validation text."""
    ti.init(max_storage_buffers_per_shader_stage=32, offline_cache=False)
    if n == 14:
        got, want = _squares_on_a_tape(n)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-6)
        return
    with pytest.raises(ti.GpuError) as e:
        _squares_on_a_tape(n)
    msg = str(e.value).splitlines()[0]
    what = ("the adjoint of kernel 'squares' (its backward pass, run by ti.ad.Tape or squares.grad()) binds 63 "
            "storage buffers in one parallel loop (63 for its fields, ndarrays and their gradients)" if n == 31 else
            "kernel 'squares' binds 41 storage buffers in one parallel loop (41 for its fields and ndarrays)")
    assert msg.startswith(what + ", but this adapter (")
    assert ") allows 32 per shader (its max-storage-buffers-per-shader-stage;" in msg
    assert "WebGPU" not in str(e.value) and "wgpuDevice" not in str(e.value)


def test_a_browser_limit_of_10_storage_buffers_forced_through_init():
    """ti.init(max_storage_buffers_per_shader_stage=10): the device enforces a browser's limit.
    4 fields with gradients run on a tape (the fused launch would bind 14: the forward and the
    adjoint run apart, 5 and 9); 5 fields need 11 in the adjoint: a clear error."""
    rt = ti.init(max_storage_buffers_per_shader_stage=10, offline_cache=False)
    assert rt.device.limits["max-storage-buffers-per-shader-stage"] == 10
    got, want = _squares_on_a_tape(4)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)
    with pytest.raises(ti.GpuError) as e:
        _squares_on_a_tape(5)
    assert "binds 11 storage buffers in one parallel loop" in str(e.value)
    assert "allows 10 per shader" in str(e.value)
    with pytest.raises(ti.WgpuAdError) as e:
        ti.init(max_storage_buffers_per_shader_stage=2)
    assert str(e.value) == ("ti.init(max_storage_buffers_per_shader_stage=2): expected an integer of at least 4 "
                            "(a browser's WebGPU allows 8 to 10)")


def test_more_argument_words_than_a_uniform_binding_holds():
    """WebGPU guarantees 64 KiB (16,384 words) of uniform arguments: a kernel with more reads them
    from a storage binding and runs; one with more than a launch can pass gets a clear error."""
    out = ti.field(ti.f32, shape=())

    def make(m: int):
        @ti.kernel
        def ends(v: ti.types.vector(m, ti.f32)):
            out[None] = v[0] + 2.0 * v[m - 1]
        return ends

    v = np.arange(17_000, dtype=np.float32)
    make(17_000)(v)
    assert out[None] == pytest.approx(2.0 * 16_999)
    with pytest.raises(ti.GpuError) as e:
        make(70_000)(np.zeros(70_000, np.float32))
    limit = ti.get_runtime().max_arg_bytes // 4
    assert str(e.value) == (
        f"kernel 'ends' takes 70000 words of arguments (280000 bytes), more than one launch can pass ({limit} words: "
        f"wgpu_ad's argument buffer, and this adapter's max-storage-buffer-binding-size). Pass large arrays as a "
        f"ti.ndarray or a field rather than as ti.types.vector / matrix arguments")
