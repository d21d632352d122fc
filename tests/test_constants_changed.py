"""Python numbers a kernel reads (globals, closure variables, attributes) are compile-time
constants, as in Taichi; a program that changes one after the kernel compiled got the old value
silently. It now gets a ConstantChangedWarning naming the kernel, the name, the line and both
values (frontend/captured.py), once per name."""
from __future__ import annotations

import types
import warnings

import numpy as np
import pytest

import wgpu_ad as ti

dt = 0.5
config = types.ModuleType("config")
config.g = 9.5


@pytest.fixture(autouse=True)
def fresh():
    ti.init(offline_cache=False)
    yield
    ti.reset()


def _launch_quietly(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ti.ConstantChangedWarning)
        fn(*args)


def test_a_global_changed_after_compiling_warns_once_naming_kernel_name_line_and_values():
    global dt
    x = ti.field(ti.f32, shape=4)

    @ti.kernel
    def step():
        for i in x:
            x[i] += dt

    dt = 0.5
    _launch_quietly(step)
    _launch_quietly(step)  # unchanged: no warning
    np.testing.assert_array_equal(x.to_numpy(), 1.0)
    dt = 2.0
    with pytest.warns(ti.ConstantChangedWarning) as w:
        step()
    line = step.fn.__code__.co_firstlineno + 3
    assert str(w[0].message) == (
        f"kernel 'step' reads dt (test_constants_changed.py, line {line}), which was 0.5 when it compiled and "
        f"is 2.0 now: the kernel still computes with 0.5. Python values a kernel reads are compile-time constants "
        f"(as in Taichi); to use each launch's value, pass it as an argument (dt: ti.f32) or keep it in a field")
    assert w[0].filename == __file__
    np.testing.assert_array_equal(x.to_numpy(), 1.5)  # Taichi's numbers: the compiled-in 0.5
    _launch_quietly(step)  # said once
    dt = 0.5


def test_closure_variables_attributes_and_module_attributes_are_watched_too():
    scale = 3.0
    x = ti.field(ti.f32, shape=4)

    @ti.data_oriented
    class Spring:
        def __init__(self, k: float):
            self.k = k

        @ti.kernel
        def pull(self):
            for i in x:
                x[i] += self.k * scale + config.g

    s = Spring(1.0)
    _launch_quietly(s.pull)
    np.testing.assert_array_equal(x.to_numpy(), 1.0 * 3.0 + 9.5)
    scale = 4.0  # noqa: F841 (read by the kernel through its closure)
    s.k = 2.0
    config.g = 1.0
    with pytest.warns(ti.ConstantChangedWarning) as w:
        s.pull()
    said = sorted(str(m.message).split(" (")[0] for m in w)
    assert said == ["kernel 'pull' reads Spring.k", "kernel 'pull' reads config.g", "kernel 'pull' reads scale"]
    config.g = 9.5
    x.fill(0.0)
    _launch_quietly(Spring(2.0).pull)  # another object: its own kernel, compiled with today's values
    np.testing.assert_array_equal(x.to_numpy(), 2.0 * 4.0 + 9.5)


gravity = np.array([0.0, -9.5], dtype=np.float32)


def test_a_small_array_changed_in_place_warns_with_the_vector_argument_that_would_pass_it():
    v = ti.Vector.field(2, ti.f32, shape=3)

    @ti.kernel
    def fall():
        for i in v:
            v[i] += gravity

    _launch_quietly(fall)
    gravity[1] = -1.0  # in place: the same array object
    with pytest.warns(ti.ConstantChangedWarning) as w:
        fall()
    msg = str(w[0].message)
    assert "reads gravity" in msg and "which was [ 0. , -9.5] when it compiled and is [ 0., -1.] now" in msg
    assert "pass it as an argument (gravity: ti.types.vector(2, ti.f32))" in msg
    np.testing.assert_array_equal(v.to_numpy()[:, 1], -19.0)
    gravity[1] = -9.5
