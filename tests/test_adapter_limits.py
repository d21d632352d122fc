"""The adapter's limits, met with a way around them or a clear error: a kernel binding more storage
buffers than the adapter allows per shader (lavapipe: 32, a browser 8 to 10) reads and writes some
of them through packed bindings and runs (gradients against analytic derivatives); a tape's fused
launch that would bind too many runs apart; where nothing fits, the error names the kernel, the
count, the limit and the fix."""
import numpy as np
import pytest

import wgpu_ad as ti

pytestmark = pytest.mark.gpu


def _storage_limit() -> int:
    limit = ti.get_runtime().limits["max-storage-buffers-per-shader-stage"]
    if limit > 64:
        pytest.skip(f"this adapter binds {limit} storage buffers per shader: too many fields to make for the test")
    return limit


def test_a_kernel_binding_more_storage_buffers_than_the_adapter_allows_runs_packed():
    """One field more than the adapter binds per shader (lavapipe: 32): the kernel reads some of
    them through one packed binding and runs; so does the adjoint of one whose forward fits but
    whose backward pass binds the fields and their gradients (more than the limit)."""
    limit = _storage_limit()
    fs = [ti.field(ti.f32, shape=4, needs_grad=True) for _ in range(limit)]
    out = ti.field(ti.f32, shape=4, needs_grad=True)
    vals = [np.linspace(-1.0, 1.0, 4) * (k + 1) for k in range(limit)]
    for f, v in zip(fs, vals):
        f.from_numpy(v.astype(np.float32))

    @ti.kernel
    def gather():
        for i in out:
            s = 0.0
            for f in ti.static(fs):
                s += f[i]
            out[i] = s

    gather()
    np.testing.assert_allclose(out.to_numpy(), np.sum(vals, axis=0), rtol=1e-6, atol=1e-6)
    assert "packed_read" in gather.get_wgsl()

    # the forward fits (half the fields and loss), the adjoint does not (their values and gradients)
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
    assert "packed" not in squares.get_wgsl()
    loss.grad[None] = 1.0
    squares.grad()
    assert "packed" in squares.get_wgsl(grad=True)
    for f, v in zip(half, vals):
        np.testing.assert_allclose(f.grad.to_numpy(), 2 * v, rtol=1e-6)


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


N = 8


def _weighted_squares(n: int):
    """`y[i] = x0[i]*w0 + x0[i]**2 + x1[i]*w1 + x1[i]**2 + ...` over n fields with gradients and
    duals, loss = sum(y**2): checks its values, every field's gradient under ti.ad.Tape and by
    kernel.grad(), and a forward-mode tangent, against the analytic derivatives in float64."""
    xs = [ti.field(ti.f32, shape=N, needs_grad=True, needs_dual=True) for _ in range(n)]
    y = ti.field(ti.f32, shape=N, needs_grad=True, needs_dual=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    x0 = [np.linspace(-1.0, 1.0, N) + 0.1 * k for k in range(n)]
    w = [0.5 + 0.25 * k for k in range(n)]
    for x, v in zip(xs, x0):
        x.from_numpy(v.astype(np.float32))

    @ti.kernel
    def f():
        for i in range(N):
            s = 0.0
            for k in ti.static(range(n)):
                s += xs[k][i] * w[k] + xs[k][i] ** 2
            y[i] = s

    @ti.kernel
    def total():
        for i in range(N):
            loss[None] += y[i] * y[i]

    x64 = [v.astype(np.float32).astype(np.float64) for v in x0]
    want = sum(w[k] * v + v * v for k, v in enumerate(x64))
    with ti.ad.Tape(loss=loss):
        f()
        total()
    np.testing.assert_allclose(y.to_numpy(), want, rtol=1e-5, atol=1e-5)
    assert loss[None] == pytest.approx(float((want * want).sum()), rel=1e-5)
    for k, x in enumerate(xs):
        np.testing.assert_allclose(x.grad.to_numpy(), 2 * want * (w[k] + 2 * x64[k]), rtol=1e-5, atol=1e-4)

    for x in xs:  # kernel.grad() by hand, seeded with dy = 1
        x.grad.fill(0.0)
    f()
    y.grad.fill(1.0)
    f.grad()
    for k, x in enumerate(xs):
        np.testing.assert_allclose(x.grad.to_numpy(), w[k] + 2 * x64[k], rtol=1e-5, atol=1e-5)

    p = n // 2  # forward mode: dy/dx_p in the direction of ones
    with ti.ad.FwdMode(loss=y, param=xs[p], seed=[1.0] * N):
        f()
    np.testing.assert_allclose(y.dual.to_numpy(), w[p] + 2 * x64[p], rtol=1e-5, atol=1e-5)
    return f


@pytest.mark.parametrize("forced", [True, False], ids=["limit32", "adapter"])
@pytest.mark.parametrize("n", [14, 31, 40])
def test_fields_with_gradients_at_a_limit_of_32_storage_buffers(n, forced):
    """Lavapipe's limit, forced on every adapter (and the adapter's own): 14 fields fit (forward 15
    buffers, adjoint 29; fused, 44, they run apart); 31 fit the forward but not the adjoint (63)
    nor the forward-mode kernel (64); 40 not even the forward (41). What does not fit reads and
    writes some fields through packed bindings, and the values, the gradients (tape and
    kernel.grad()) and the tangents are right."""
    ti.init(offline_cache=False, **({"max_storage_buffers_per_shader_stage": 32} if forced else {}))
    limit = ti.get_runtime().limits["max-storage-buffers-per-shader-stage"]
    f = _weighted_squares(n)
    assert ("packed" in f.get_wgsl(grad=True)) == (2 * n + 1 > limit)
    assert ("packed" in f.get_wgsl()) == (n + 1 > limit)
    got, want = _squares_on_a_tape(n)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_a_browser_limit_of_10_storage_buffers_forced_through_init():
    """ti.init(max_storage_buffers_per_shader_stage=10): the device enforces a browser's limit.
    12 fields with gradients run (forward 13 buffers, adjoint 25: both packed), and a kernel that
    writes 14 fields through an index field (its checked launch binds their access records too:
    packed atomics) gives the values and gradients NumPy gives."""
    rt = ti.init(max_storage_buffers_per_shader_stage=10, offline_cache=False)
    assert rt.device.limits["max-storage-buffers-per-shader-stage"] == 10
    f = _weighted_squares(12)
    assert "packed_read" in f.get_wgsl() and "packed_written" in f.get_wgsl(grad=True)

    n = 14
    xs = [ti.field(ti.f32, shape=N, needs_grad=True) for _ in range(n)]
    ys = [ti.field(ti.f32, shape=N, needs_grad=True) for _ in range(n)]
    perm = ti.field(ti.i32, shape=N)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    pv = np.roll(np.arange(N), 3).astype(np.int32)
    perm.from_numpy(pv)
    x0 = [np.linspace(-1.0, 1.0, N).astype(np.float32) + np.float32(0.1 * k) for k in range(n)]
    for x, v in zip(xs, x0):
        x.from_numpy(v)

    @ti.kernel
    def scatter():
        for i in range(N):
            for k in ti.static(range(n)):
                ys[k][perm[i]] = xs[k][i] * xs[k][i] + (k + 1.0) * xs[k][i]

    @ti.kernel
    def total():
        for i in range(N):
            for k in ti.static(range(n)):
                loss[None] += ys[k][i] * (k + 2.0)

    with ti.ad.Tape(loss=loss):
        scatter()
        total()
    assert "packed_written" in scatter.get_wgsl()
    for k in range(n):
        v = x0[k].astype(np.float64)
        want = np.zeros(N)
        want[pv] = v * v + (k + 1) * v
        np.testing.assert_allclose(ys[k].to_numpy(), want, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(xs[k].grad.to_numpy(), (k + 2) * (2 * v + k + 1), rtol=1e-5, atol=1e-5)

    with pytest.raises(ti.WgpuAdError) as e:
        ti.init(max_storage_buffers_per_shader_stage=2)
    assert str(e.value) == ("ti.init(max_storage_buffers_per_shader_stage=2): expected an integer of at least 4 "
                            "(a browser's WebGPU allows 8 to 10)")


@pytest.mark.parametrize("emulated", [False, True], ids=["atomics", "emulated_atomics"])
def test_packed_atomics_vectors_and_ndarrays_at_a_limit_of_10(emulated):
    """What else a pack holds: the gradients of 0-d parameters, which the adjoint adds to with
    atomics (WGSL's, or compare-exchange loops on the f32 bits, through the subgroup helper where
    the device has one); vector fields; ndarrays from NumPy (the written ones copied back to the
    host) and on the device, one of them passed as two written arguments."""
    ti.init(max_storage_buffers_per_shader_stage=10, offline_cache=False, force_emulated_atomics=emulated)
    n = 12
    a = [ti.field(ti.f32, shape=(), needs_grad=True) for _ in range(n)]
    x = ti.field(ti.f32, shape=N)
    y = ti.field(ti.f32, shape=N, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    xv = np.linspace(-1.0, 1.0, N).astype(np.float32)
    x.from_numpy(xv)
    for k, f in enumerate(a):
        f[None] = 0.1 * k + 0.3

    @ti.kernel
    def poly():
        for i in range(N):
            s = 0.0
            for k in ti.static(range(n)):
                s += a[k][None] * x[i] ** k
            y[i] = s

    @ti.kernel
    def total():
        for i in range(N):
            loss[None] += y[i]

    with ti.ad.Tape(loss=loss):
        poly()
        total()
    assert "packed_written" in poly.get_wgsl(grad=True)
    x64 = xv.astype(np.float64)
    for k, f in enumerate(a):
        assert f.grad[None] == pytest.approx((x64 ** k).sum(), rel=1e-5, abs=1e-5)

    vs = [ti.Vector.field(3, ti.f32, shape=N, needs_grad=True) for _ in range(n)]
    out = ti.field(ti.f32, shape=N, needs_grad=True)
    vals = [np.random.default_rng(k).uniform(-1, 1, (N, 3)).astype(np.float32) for k in range(n)]
    for f, v in zip(vs, vals):
        f.from_numpy(v)

    @ti.kernel
    def norms():
        for i in range(N):
            s = 0.0
            for k in ti.static(range(n)):
                s += vs[k][i].dot(vs[k][i]) * (k + 1.0)
            out[i] = s

    norms()
    assert "packed_read" in norms.get_wgsl()
    np.testing.assert_allclose(out.to_numpy(), sum((k + 1) * (v.astype(np.float64) ** 2).sum(1)
                                                   for k, v in enumerate(vals)), rtol=1e-5)
    out.grad.fill(1.0)
    norms.grad()
    for k, f in enumerate(vs):
        np.testing.assert_allclose(f.grad.to_numpy(), 2 * (k + 1) * vals[k].astype(np.float64), rtol=1e-5, atol=1e-6)

    nd = ti.types.ndarray()

    @ti.kernel
    def spread(a0: nd, a1: nd, a2: nd, a3: nd, a4: nd, a5: nd, a6: nd, a7: nd, o0: nd, o1: nd, o2: nd, o3: nd):
        for i in range(a0.shape[0]):
            s = a0[i] + 2 * a1[i] + 3 * a2[i] + 4 * a3[i] + 5 * a4[i] + 6 * a5[i] + 7 * a6[i] + 8 * a7[i]
            o0[i] = s
            o1[i] = s * 2
            o2[i] = s * 3
            o3[i] = s * 4

    ins = [np.arange(5, dtype=np.float32) + k for k in range(8)]
    outs = [np.zeros(5, np.float32) for _ in range(4)]
    spread(*ins, *outs)
    want = sum((k + 1) * v.astype(np.float64) for k, v in enumerate(ins))
    for j, o in enumerate(outs):
        np.testing.assert_allclose(o, want * (j + 1), rtol=1e-6)
    dins = [ti.ndarray(ti.f32, 7) for _ in range(8)]
    for k, d in enumerate(dins):
        d.from_numpy(np.arange(7, dtype=np.float32) * k)
    douts = [ti.ndarray(ti.f32, 7) for _ in range(4)]
    spread(*dins, *douts)
    assert "packed_read" in spread.get_wgsl(*dins, *douts)
    want = sum((k + 1) * np.arange(7.0) * k for k in range(8))
    for j, o in enumerate(douts):
        np.testing.assert_allclose(o.to_numpy(), want * (j + 1), rtol=1e-6)


def test_an_ndarray_passed_as_two_packed_outputs():
    """An ndarray passed as two outputs that are both packed has one place in the pack (the later
    store in each thread stays, as without packing); one packed and one bound on its own cannot
    be copied back right: a clear error with the fix."""
    ti.init(max_storage_buffers_per_shader_stage=10, offline_cache=False)
    nd = ti.types.ndarray()

    @ti.kernel
    def fan(a: nd, o0: nd, o1: nd, o2: nd, o3: nd, o4: nd, o5: nd, o6: nd, o7: nd, o8: nd, o9: nd, o10: nd):
        for i in range(a.shape[0]):
            o0[i] = a[i]
            o1[i] = a[i] * 2
            o2[i] = a[i] * 3
            o3[i] = a[i] * 4
            o4[i] = a[i] * 5
            o5[i] = a[i] * 6
            o6[i] = a[i] * 7
            o7[i] = a[i] * 8
            o8[i] = a[i] * 9
            o9[i] = a[i] * 10
            o10[i] = a[i] * 11

    a = ti.ndarray(ti.f32, 6)
    av = np.linspace(-1.0, 1.0, 6).astype(np.float32)
    a.from_numpy(av)
    outs = [ti.ndarray(ti.f32, 6) for _ in range(11)]
    fan(a, *outs)
    wgsl = fan.get_wgsl(a, *outs)
    assert "packed_written: array<f32>;  // o0, o1, o2," in wgsl and "o10: array<f32>" in wgsl
    for j, o in enumerate(outs):
        np.testing.assert_allclose(o.to_numpy(), av * (j + 1.0), rtol=1e-6)
    both = ti.ndarray(ti.f32, 6)
    fan(a, both, both, *outs[2:])
    np.testing.assert_allclose(both.to_numpy(), av * 2.0, rtol=1e-6)
    with pytest.raises(ti.GpuError) as e:
        fan(a, both, *outs[1:10], both)
    assert str(e.value) == (
        "kernel 'fan' binds more storage buffers than this adapter allows, so some of them are packed into one "
        "binding, but one storage it writes is passed to it twice (an ndarray as two arguments, or a gradient as "
        "a field): pass a copy as one of them, or split the kernel into kernels that each read and write fewer "
        "fields")


def test_two_packed_loops_of_one_kernel_share_the_pack_buffers():
    """Two parallel loops of one kernel, each over 11 fields at a limit of 10: each task copies
    into the runtime's pack buffers and out again in turn; the second reads what the first
    wrote through its pack. Values and gradients against the analytic ones."""
    ti.init(max_storage_buffers_per_shader_stage=10, offline_cache=False)
    n = 11
    xs = [ti.field(ti.f32, shape=N, needs_grad=True) for _ in range(n)]
    zs = [ti.field(ti.f32, shape=N, needs_grad=True) for _ in range(n)]
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    x0 = [np.linspace(0.0, 1.0, N).astype(np.float32) + np.float32(k) for k in range(n)]
    for x, v in zip(xs, x0):
        x.from_numpy(v)

    @ti.kernel
    def two():
        for i in range(N):
            for k in ti.static(range(n)):
                zs[k][i] = xs[k][i] * xs[k][i]
        for i in range(N):
            for k in ti.static(range(n)):
                loss[None] += zs[k][i] * (k + 1.0) + xs[k][i]

    with ti.ad.Tape(loss=loss):
        two()
    wgsl = two.get_wgsl()
    assert wgsl.count("var<storage, read_write> packed_written") == 1 and wgsl.count("var<storage, read> packed_read") == 2
    x64 = [v.astype(np.float64) for v in x0]
    assert loss[None] == pytest.approx(sum(((k + 1) * v * v + v).sum() for k, v in enumerate(x64)), rel=1e-5)
    for k, v in enumerate(x64):
        np.testing.assert_allclose(zs[k].to_numpy(), v * v, rtol=1e-6)
        np.testing.assert_allclose(xs[k].grad.to_numpy(), 2 * v * (k + 1) + 1, rtol=1e-5)


def test_where_packing_cannot_fit_the_error_names_the_kernel_the_count_and_the_limit():
    """With a limit of 4, a kernel reading an f32, an i32 and a u32 field and writing an f32 and
    an i32 one binds 5 buffers of 5 kinds: no two share a pack, so it gets the clear error, never
    WebGPU's validation text."""
    ti.init(max_storage_buffers_per_shader_stage=4, offline_cache=False)
    a, d = ti.field(ti.f32, shape=4), ti.field(ti.f32, shape=4)
    b, e_ = ti.field(ti.i32, shape=4), ti.field(ti.i32, shape=4)
    c = ti.field(ti.u32, shape=4)

    @ti.kernel
    def kinds():
        for i in range(4):
            d[i] = a[i] * 2.0
            e_[i] = b[i] + ti.cast(c[i], ti.i32)

    with pytest.raises(ti.GpuError) as e:
        kinds()
    msg = str(e.value)
    assert msg.splitlines()[0].startswith(
        "kernel 'kinds' binds 5 storage buffers in one parallel loop (5 for its fields and ndarrays), but this "
        "adapter (")
    assert ") allows 4 per shader (its max-storage-buffers-per-shader-stage;" in msg
    assert "Split the loop into kernels that each read and write fewer fields" in msg
    assert "WebGPU" not in msg and "wgpuDevice" not in msg


def test_the_compile_option_packs_without_changing_the_device(tmp_path):
    """ti.set_compile_options(max_storage_buffers=10) packs for a browser's limit on any device;
    the limit is part of the offline cache's key (a kernel cached at 32 would bind 13 buffers
    where the device allows 10); export never packs, so there the page's limit is an ExportError."""
    ti.init(offline_cache_file_path=str(tmp_path), max_storage_buffers_per_shader_stage=32)
    _weighted_squares(12)
    ti.reset()
    ti.init(offline_cache_file_path=str(tmp_path), max_storage_buffers_per_shader_stage=10)
    f = _weighted_squares(12)  # (the same source: a cache hit here would be the unpacked kernel)
    assert "packed_read" in f.get_wgsl()

    ti.reset()
    ti.init(offline_cache=False)
    if ti.get_runtime().limits["max-storage-buffers-per-shader-stage"] < 13:
        pytest.skip("this adapter binds fewer than 13 storage buffers per shader")
    ti.set_compile_options(max_storage_buffers=10)
    f = _weighted_squares(12)
    assert "packed_read" in f.get_wgsl()
    with pytest.raises(ti.ExportError) as e:
        ti.export(tmp_path / "web", [f])
    assert "the number of storage buffers it binds in one shader is 13, over WebGPU's " \
           "maxStorageBuffersPerShaderStage (8)" in str(e.value)
    with pytest.raises(ti.WgpuAdError) as e:
        ti.set_compile_options(max_storage_buffers=3)
    assert str(e.value) == ("max_storage_buffers=3: expected an integer of at least 4 (a browser's WebGPU allows "
                            "8 to 10), or None (no packing)")


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
