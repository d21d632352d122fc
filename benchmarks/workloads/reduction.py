"""Reduction: loss = sum x^2 over n floats into a 0-d field; backward gives dloss/dx = 2x."""

import numpy as np

from . import Program, jax_program, torch_program, warp_program

MODES = ("fwd", "fwd+bwd")
UNIT = "ms"
LOSS, GRAD = "loss", "dloss/dx[7]"
WGSL_GROUPS = 256   # workgroups of the hand-written reduction (grid-stride over the rest; tuned on lavapipe)


def inputs(p: dict) -> dict:
    return {"x": np.random.default_rng(2).uniform(-1.0, 1.0, p["n"]).astype(np.float32)}


def build(ti, p: dict, inp: dict) -> Program:
    x = ti.field(dtype=ti.f32, shape=p["n"], needs_grad=True)
    loss = ti.field(dtype=ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def clear():
        loss[None] = 0.0

    @ti.kernel
    def sum_sq():
        for i in x:
            loss[None] += x[i] ** 2

    x.from_numpy(inp["x"])

    def fwd():
        clear()
        sum_sq()
        ti.sync()

    def fwd_bwd():
        clear()
        with ti.ad.Tape(loss=loss):
            sum_sq()
        ti.sync()

    def result():
        fwd_bwd()
        return float(loss[None]), float(x.grad[7])

    return Program({"fwd": fwd, "fwd+bwd": fwd_bwd}, result)


def build_wgsl(gpu, p: dict, inp: dict) -> Program:
    n, wg = p["n"], 64
    groups = max(1, min(WGSL_GROUPS, -(-n // wg)))
    k = gpu.kernels("reduction", {"sum_sq": ("read", "storage"), "sum_sq_grad": ("read", "storage", "storage")}, N=n, WG=wg, GROUPS=groups)
    fin = gpu.kernels("sum_partials", {"main": ("read", "storage")}, COUNT=groups)["main"]
    x = gpu.storage(inp["x"])
    partials, out, grad = gpu.storage(nbytes=4 * groups), gpu.storage(nbytes=4), gpu.storage(nbytes=4 * n)
    last = (fin, gpu.bind(fin, partials, out), 1)
    fwd_list = [(k["sum_sq"], gpu.bind(k["sum_sq"], x, partials), groups), last]
    both_list = [(k["sum_sq_grad"], gpu.bind(k["sum_sq_grad"], x, partials, grad), groups), last]

    def fwd():
        gpu.run(fwd_list)
        gpu.sync()

    def fwd_bwd():
        gpu.run(both_list)
        gpu.sync()

    def result():
        fwd_bwd()
        return float(gpu.read(out, count=1)[0]), float(gpu.read(grad, count=8)[7])

    return Program({"fwd": fwd, "fwd+bwd": fwd_bwd}, result)


def reference(p: dict, inp: dict) -> tuple[float, float]:
    x = inp["x"].astype(np.float64)
    return float((x ** 2).sum()), float(2.0 * x[7])


def build_warp(wp, p: dict, inp: dict) -> Program:
    """The same program in NVIDIA Warp (the way its docs differentiate a sum: atomic adds under a Tape)."""
    n = p["n"]

    @wp.kernel
    def sum_sq(x: wp.array(dtype=wp.float32), loss: wp.array(dtype=wp.float32)):
        i = wp.tid()
        wp.atomic_add(loss, 0, x[i] * x[i])

    x = wp.array(inp["x"], dtype=wp.float32, requires_grad=True)
    loss = wp.zeros(1, dtype=wp.float32, requires_grad=True)

    def forward():
        loss.zero_()
        wp.launch(sum_sq, dim=n, inputs=[x, loss])

    return warp_program(wp, forward, loss, (x,), lambda: float(x.grad.numpy()[7]))


def build_torch(tt, p: dict, inp: dict) -> Program:
    x = tt.tensor(inp["x"], requires_grad=True)
    return torch_program(tt, tt.compile(lambda x: (x * x).sum()), (x,), (x,), lambda: float(x.grad[7]))


def build_jax(jax, p: dict, inp: dict) -> Program:
    return jax_program(jax, lambda x: (x * x).sum(), (jax.numpy.asarray(inp["x"]),), 0, lambda g: float(g[7]))
