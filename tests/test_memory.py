"""GPU memory follows Python's lifetimes (issue 25 item 3): a field, ndarray or kernel that Python
drops releases its GPU buffers, counted exactly with ti.runtime_stats() (wgpu's live objects)
over many create / use / drop cycles; and the write logs, which now hold the launches that wrote
a storage without keeping their kernels and fields alive, still refuse a kernel.grad() whose
inputs may have been overwritten (never a silent wrong gradient).
"""
from __future__ import annotations

import gc

import numpy as np
import pytest

import wgpu_ad as ti
from wgpu_ad.errors import WgpuAdError


def _live() -> tuple[int, int]:
    """(GPU buffers alive, their bytes), after the collector and the device are done."""
    ti.sync()
    gc.collect()
    st = ti.runtime_stats()
    return st["buffers"], st["buffer_bytes"]


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


@pytest.fixture
def fresh():
    ti.init(offline_cache=False)
    yield
    ti.reset()


@ti.kernel
def add_nd(acc: ti.template(), a: ti.types.ndarray()):
    for i in range(4):
        acc[i] += a[i]


def test_dropped_ndarrays_release_their_buffers_over_1000_cycles_and_10000_launches(fresh):
    acc = ti.field(ti.f32, shape=4, needs_grad=True)  # long-lived, written by every launch
    a = ti.ndarray(ti.f32, shape=1 << 18)               # 1 MiB each
    a.fill(1.0)
    add_nd(acc, a)
    del a
    before, nbytes = _live()
    rss = _rss_mib()
    for cycle in range(1000):
        a = ti.ndarray(ti.f32, shape=1 << 18)
        a.fill(1.0)
        for _ in range(10):
            add_nd(acc, a)
        del a
        if cycle % 250 == 249:
            assert _live() == (before, nbytes), f"after {cycle + 1} cycles"
    assert _live() == (before, nbytes)
    # the bind-group cache held up to 256 dropped ndarrays (1 GiB here) before; the driver's
    # allocator keeps some pages, so RSS is bounded generously
    assert _rss_mib() - rss < 300
    np.testing.assert_allclose(acc.to_numpy(), 1 + 10 * 1000)
    assert ti.runtime_stats()["cached"]["bind_groups"] <= 4


def test_a_dropped_kernel_and_the_field_it_used_are_released(fresh):
    # a kernel reading a new field writes a long-lived one: its write log kept the kernel's
    # launcher, and with it the field (4 MiB per cycle)
    acc = ti.field(ti.f32, shape=4, needs_grad=True)

    def cycle():
        f = ti.field(ti.f32, shape=1 << 20)
        f.fill(2.0)

        @ti.kernel
        def k():
            for i in range(4):
                acc[i] += f[i]
        k()
    cycle()
    before = _live()
    kernels = ti.runtime_stats()["cached"]["kernels"]
    for _ in range(40):
        cycle()
    assert _live() == before
    assert ti.runtime_stats()["cached"]["kernels"] <= kernels
    np.testing.assert_allclose(acc.to_numpy(), 2.0 * 41)


def test_a_write_whose_kernel_is_gone_still_guards_kernel_grad(fresh):
    x = ti.field(ti.f32, shape=2, needs_grad=True)
    y = ti.field(ti.f32, shape=(), needs_grad=True)
    x.from_numpy(np.array([3.0, 5.0], np.float32))

    @ti.kernel
    def square():
        y[None] = x[0] * x[0]

    def write_other_element():  # a kernel used once and dropped: x[1] only
        @ti.kernel
        def w():
            x[1] = 7.0
        w()

    square()
    write_other_element()
    gc.collect()
    y.grad[None] = 1.0
    square.grad()  # its launcher is gone, but the footprint says x[0] was not written
    assert x.grad.to_numpy()[0] == pytest.approx(2 * 3.0)

    def write_through_a_dropped_field(i):  # a kernel that named a field that is gone
        tmp = ti.field(ti.f32, shape=1)

        @ti.kernel
        def w2():
            x[i] = tmp[0]
        w2()

    square()
    write_through_a_dropped_field(1)
    gc.collect()
    x.grad.fill(0)
    y.grad[None] = 1.0  # (the adjoint of a store consumed the seed)
    square.grad()  # x[1] only: accepted
    assert x.grad.to_numpy()[0] == pytest.approx(2 * 3.0)
    square()
    write_through_a_dropped_field(0)
    gc.collect()
    with pytest.raises(WgpuAdError) as e:  # x[0], which square read: refused
        square.grad()
    assert "square.grad(): kernel 'square' read field 'x' when it ran, and kernel 'w2' wrote it since" \
        in str(e.value)


@ti.kernel
def weighted_sum(w: ti.template(), x: ti.template(), loss: ti.template()):
    for i in range(4):
        loss[None] += w[i] * x[i]


def test_fields_passed_as_templates_are_released_and_never_mistaken_for_another(fresh):
    # every object passed as a ti.template() argument was pinned: 4 MiB per dropped field here.
    # The specialisations now live on the field; a new field (perhaps at a freed one's address)
    # gets its own, and the gradient of each cycle must be that of its own weights
    x = ti.field(ti.f32, shape=4, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    x.from_numpy(np.arange(4, dtype=np.float32))

    def cycle(c: float):
        w = ti.field(ti.f32, shape=1 << 20)
        w.fill(c)
        loss[None] = 0.0
        with ti.ad.Tape(loss=loss):
            weighted_sum(w, x, loss)
        np.testing.assert_allclose(x.grad.to_numpy(), c)               # d loss / d x_i = w_i
        assert loss[None] == pytest.approx(c * (0 + 1 + 2 + 3))
    cycle(1.0)
    before = _live()
    for c in range(2, 30):
        cycle(float(c))
    assert _live() == before


@ti.data_oriented
class Body:
    def __init__(self, n: int, c: float):
        self.w = ti.field(ti.f32, shape=n)
        self.w.fill(c)

    @ti.kernel
    def weigh(self, x: ti.template(), loss: ti.template()):
        for i in range(4):
            loss[None] += self.w[i] * x[i]


def test_data_oriented_objects_are_released_and_copies_get_their_own_kernels(fresh):
    import copy

    x = ti.field(ti.f32, shape=4, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    x.from_numpy(np.arange(4, dtype=np.float32))

    def cycle(c: float):
        body = Body(1 << 20, c)
        loss[None] = 0.0
        with ti.ad.Tape(loss=loss):
            body.weigh(x, loss)
        np.testing.assert_allclose(x.grad.to_numpy(), c)
        return body
    cycle(1.0)
    before = _live()
    for c in range(2, 20):
        cycle(float(c))
    assert _live() == before
    body = cycle(3.0)
    twin = copy.copy(body)  # (shares body's field; gets no kernels from it)
    assert "_wgpu_ad_specialised" in vars(body) and "_wgpu_ad_specialised" not in vars(twin)
    loss[None] = 0.0
    twin.weigh(x, loss)
    assert loss[None] == pytest.approx(3.0 * 6)


@ti.kernel
def square_in_place(f: ti.template()):
    for i in f:
        f[i] = f[i] * f[i]


def test_copies_kept_for_fields_updated_in_place_go_with_the_fields(fresh):
    # an in-place update keeps a copy of the field from before the launch for its adjoint; the
    # copies of dropped fields stayed (4 MiB each), and must never be found for a later field
    def cycle(c: float, grad: bool):
        f = ti.field(ti.f32, shape=1 << 20, needs_grad=True)
        f.fill(c)
        square_in_place(f)
        if grad:
            f.grad.fill(1.0)
            square_in_place.grad(f)
            assert f.grad[7] == pytest.approx(2 * c)  # d(f*f)/df at the value before the launch
    cycle(1.0, True)
    before = _live()
    for c in range(2, 12):
        cycle(float(c), c % 2 == 0)
    now = _live()  # (one spare copy less when the last launch's went with its field)
    assert now[0] <= before[0] and now[1] <= before[1], (now, before)
    f = ti.field(ti.f32, shape=1 << 20, needs_grad=True)
    with pytest.raises(WgpuAdError) as e:  # never launched: no copies of the fields before it
        square_in_place.grad(f)
    assert "and none were kept: launch it right before its .grad()" in str(e.value)


def test_a_kernel_keeps_no_specialisation_of_a_closed_session():
    x = ti.field(ti.f32, shape=4)

    @ti.kernel
    def bump(v: ti.f32):
        for i in range(4):
            x[i] += v

    for run in range(3):  # a program that re-initialises, as tests and notebooks do
        ti.init(offline_cache=False)
        x = ti.field(ti.f32, shape=4)  # (bump reads this session's x)
        bump(1.0)
        assert x[2] == 1.0 and len(bump._cache) == 1


@ti.kernel
def weighted_sums(ws: ti.template(), x: ti.template(), loss: ti.template()):
    for i in range(4):
        for w in ti.static(ws):
            loss[None] += w[i] * x[i]


def test_a_fresh_tuple_of_fields_each_call_is_one_specialisation_and_is_released(fresh):
    # a tuple passed as a template was keyed by its id and pinned: every call with a fresh tuple
    # compiled the kernel again and kept the tuple and its fields until ti.reset()
    x = ti.field(ti.f32, shape=4, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    x.from_numpy(np.arange(4, dtype=np.float32))

    def cycle(c: float):
        w = ti.field(ti.f32, shape=1 << 20)
        w.fill(c)
        v = ti.field(ti.f32, shape=4)
        v.fill(1.0)
        loss[None] = 0.0
        with ti.ad.Tape(loss=loss):
            weighted_sums((w, v), x, loss)
        np.testing.assert_allclose(x.grad.to_numpy(), c + 1.0)         # d loss / d x_i = w_i + v_i
        assert loss[None] == pytest.approx((c + 1.0) * (0 + 1 + 2 + 3))
    cycle(1.0)
    before = _live()
    for c in range(2, 30):
        cycle(float(c))
    assert _live() == before
    assert not weighted_sums._pinned and not weighted_sums._cache

    a, b = ti.field(ti.f32, shape=4), ti.field(ti.f32, shape=4)
    a.fill(2.0)
    b.fill(3.0)
    loss[None] = 0.0
    for _ in range(3):  # three fresh tuples, one compile
        weighted_sums((a, b), x, loss)
    assert len(vars(a)["_wgpu_ad_specialised"][weighted_sums]) == 1
    assert loss[None] == pytest.approx(3 * 5.0 * (0 + 1 + 2 + 3))
    ws = [a]
    weighted_sums(ws, x, loss)
    ws.append(b)  # a list changed between calls is another specialisation, not the old one
    loss[None] = 0.0
    weighted_sums(ws, x, loss)
    assert loss[None] == pytest.approx(5.0 * (0 + 1 + 2 + 3))


@ti.kernel
def scaled(cfg: ti.template(), out: ti.template()):
    for i in range(4):
        out[i] = cfg["w"][i] * ti.static(cfg["s"])


def test_a_dict_changed_between_calls_is_another_specialisation(fresh):
    # a dict passed as a template was keyed by its id: changing a value in it between calls
    # reused the kernel compiled for the old value (silently: 6 where 10 is right)
    w, out = ti.field(ti.f32, shape=4), ti.field(ti.f32, shape=4)
    w.fill(2.0)
    cfg = {"w": w, "s": 3.0}
    scaled(cfg, out)
    np.testing.assert_array_equal(out.to_numpy(), 6.0)
    cfg["s"] = 5.0
    scaled(cfg, out)
    np.testing.assert_array_equal(out.to_numpy(), 10.0)
    assert not scaled._pinned
