"""Fixed costs: a trivial kernel launched many times with one sync at the end, reported per launch
(amortised; each launch carries its own argument); and "sync": as many waits with nothing
pending (after one that waits for the launches), reported per wait."""

from . import NotWritten, Program

MODES = ("launches", "sync")
UNIT = "us/call"
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

    def syncs():
        for _ in range(count):
            ti.sync()

    def result():
        a[0] = 0.0
        run()
        return float(a[0]), None

    return Program({"launches": run, "sync": syncs}, result)


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

    def syncs():  # RawGpu.sync reads 4 bytes back each time, pending work or not
        for _ in range(count):
            gpu.sync()

    def result():
        gpu.device.queue.write_buffer(a, 0, np.zeros(1, np.float32))
        run()
        return float(gpu.read(a, count=1)[0]), None

    return Program({"launches": run, "sync": syncs}, result)


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

    def syncs():
        for _ in range(count):
            wp.synchronize()

    def result():
        a.zero_()
        run()
        return float(a.numpy()[0]), None

    return Program({"launches": run, "sync": syncs}, result)


def build_torch(tt, p: dict, inp: dict) -> Program:
    """One in-place add per launch (a kernel launch on a GPU); "sync" is torch.cuda.synchronize()
    there, and nothing on the CPU (eager CPU ops finish before they return)."""
    if tt.compiled:
        raise NotWritten("a torch.compile'd single add is the eager launch plus guards; see torch")
    count = p["launches"]
    a = tt.tensor([0.0])

    def run():
        for _ in range(count):
            a.add_(1.0)
        tt.sync()

    def syncs():
        for _ in range(count):
            tt.sync()

    def result():
        a.zero_()
        run()
        return float(a[0]), None

    return Program({"launches": run, "sync": syncs}, result)


def build_jax(jax, p: dict, inp: dict) -> Program:
    """A jitted add per launch (dispatched asynchronously); "sync" is block_until_ready()."""
    count = p["launches"]
    add = jax.jit(lambda a, s: a + s)
    state = {"a": jax.numpy.zeros(1, jax.numpy.float32)}

    def run():
        a = state["a"]
        for _ in range(count):
            a = add(a, 1.0)
        state["a"] = a.block_until_ready()

    def syncs():
        for _ in range(count):
            state["a"].block_until_ready()

    def result():
        state["a"] = jax.numpy.zeros(1, jax.numpy.float32)
        run()
        return float(state["a"][0]), None

    return Program({"launches": run, "sync": syncs}, result)
