"""Launch overhead: a trivial kernel launched many times with one sync at the end; the time is
reported per launch (amortised). Each launch carries its own argument."""

from . import Program

MODES = ("launches",)
UNIT = "us/launch"
LOSS, GRAD = "a[0]", None


def inputs(p: dict) -> dict:
    return {}


def build(ti, p: dict, inp: dict) -> Program:
    count = p["launches"]
    a = ti.field(dtype=ti.f32, shape=1)

    @ti.kernel
    def tiny(s: ti.f32):
        for i in range(1):
            a[i] += s

    def run():
        for _ in range(count):
            tiny(1.0)
        ti.sync()

    def result():
        a[0] = 0.0
        run()
        return float(a[0]), None

    return Program({"launches": run}, result)


def build_wgsl(gpu, p: dict, inp: dict) -> Program:
    import numpy as np
    count = p["launches"]
    k = gpu.kernels("launch", {"main": ("uniform", "storage")})["main"]
    a = gpu.storage(nbytes=4)
    args = gpu.uniforms([[1.0]] * count)    # one argument block per launch, written once
    bg = gpu.bind(k, args, a)   # one bind group; each launch its own dynamic offset
    dispatches = [(k, bg, 1, r) for r in range(count)]

    def run():
        gpu.run(dispatches)
        gpu.sync()

    def result():
        gpu.device.queue.write_buffer(a, 0, np.zeros(1, np.float32))
        run()
        return float(gpu.read(a, count=1)[0]), None

    return Program({"launches": run}, result)


def reference(p: dict, inp: dict) -> tuple[float, None]:
    return float(p["launches"]), None


def build_warp(wp, p: dict, inp: dict) -> Program:
    count = p["launches"]

    @wp.kernel
    def tiny(a: wp.array(dtype=wp.float32), s: wp.float32):
        i = wp.tid()
        a[i] = a[i] + s

    a = wp.zeros(1, dtype=wp.float32)

    def run():
        for _ in range(count):
            wp.launch(tiny, dim=1, inputs=[a, 1.0])
        wp.synchronize()

    def result():
        a.zero_()
        run()
        return float(a.numpy()[0]), None

    return Program({"launches": run}, result)
