"""Gravity N-body energy U = sum_ij -1/sqrt(|xi - xj|^2 + 1e-3) (all ordered pairs, i = j included)
and its gradient dU/dx through the tape: an all-pairs reduction into one 0-d field."""

from types import SimpleNamespace

import numpy as np

from . import Program, jax_program, torch_program

MODES = ("fwd", "fwd+bwd")
UNIT = "ms"
LOSS, GRAD = "U", "dU/dx[1].x"
EPS = 1e-3


def inputs(p: dict) -> dict:
    return {"pos": np.random.default_rng(0).random((p["N"], 2)).astype(np.float32)}


def kernels(ti, p: dict) -> SimpleNamespace:
    """The fields and kernels, in the Taichi-shaped API (also used by the forward-mode benchmark)."""
    N = p["N"]
    x = ti.Vector.field(2, dtype=ti.f32, shape=N, needs_grad=True)
    U = ti.field(dtype=ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def clear():
        U[None] = 0.0

    @ti.kernel
    def compute_U():
        for i, j in ti.ndrange(N, N):
            r = x[i] - x[j]
            U[None] += -1 / r.norm(1e-3)

    return SimpleNamespace(x=x, U=U, clear=clear, compute_U=compute_U)


def build(ti, p: dict, inp: dict) -> Program:
    k = kernels(ti, p)
    x, U, clear, compute_U = k.x, k.U, k.clear, k.compute_U
    x.from_numpy(inp["pos"])

    def fwd():
        clear()
        compute_U()
        ti.sync()

    def fwd_bwd():
        clear()
        with ti.ad.Tape(loss=U):
            compute_U()
        ti.sync()

    def result():
        fwd_bwd()
        return float(U[None]), float(x.grad[1][0])

    return Program({"fwd": fwd, "fwd+bwd": fwd_bwd}, result)


def build_wgsl(gpu, p: dict, inp: dict) -> Program:
    from ..rawgpu import f32_literal
    N, wg = p["N"], 64
    groups = -(-N // wg)
    k = gpu.kernels("gravity", {"energy": ("read", "storage"), "energy_grad": ("read", "storage", "storage")}, N=N, WG=wg, EPS=f32_literal(EPS))
    fin = gpu.kernels("sum_partials", {"main": ("read", "storage")}, COUNT=groups)["main"]
    pos = gpu.storage(inp["pos"])
    partials = gpu.storage(nbytes=4 * groups)
    grad = gpu.storage(nbytes=8 * N)
    out = gpu.storage(nbytes=4)
    fwd_steps = [(k["energy"], gpu.bind(k["energy"], pos, partials), groups),
                 (fin, gpu.bind(fin, partials, out), 1)]
    both_steps = [(k["energy_grad"], gpu.bind(k["energy_grad"], pos, partials, grad), groups), fwd_steps[1]]

    def fwd():
        gpu.run(fwd_steps)
        gpu.sync()

    def fwd_bwd():
        gpu.run(both_steps)
        gpu.sync()

    def result():
        fwd_bwd()
        return float(gpu.read(out, count=1)[0]), float(gpu.read(grad, count=2 * N)[2])

    return Program({"fwd": fwd, "fwd+bwd": fwd_bwd}, result)


def reference(p: dict, inp: dict) -> tuple[float, float]:
    x = inp["pos"].astype(np.float64)
    U = 0.0
    for a in range(0, len(x), 512):  # row blocks keep the pair matrix small
        d = x[a:a + 512, None, :] - x[None, :, :]
        U -= (1.0 / np.sqrt((d ** 2).sum(-1) + EPS)).sum()
    d = x[1] - x
    g = 2.0 * (d[:, 0] / ((d ** 2).sum(-1) + EPS) ** 1.5).sum()
    return float(U), float(g)


def _energy(xp, x):
    """U for the array libraries (xp: torch or jax.numpy): the pair-distance matrix, as their users
    write it; at N = 4096 its N x N x 2 differences take 128 MB, kept for the backward pass."""
    d = x[:, None, :] - x[None, :, :]
    return -(1.0 / xp.sqrt((d * d).sum(-1) + EPS)).sum()


def build_torch(tt, p: dict, inp: dict) -> Program:
    x = tt.tensor(inp["pos"], requires_grad=True)
    energy = tt.compile(lambda x: _energy(tt.torch, x))
    return torch_program(tt, energy, (x,), (x,), lambda: float(x.grad[1, 0]))


def build_jax(jax, p: dict, inp: dict) -> Program:
    return jax_program(jax, lambda x: _energy(jax.numpy, x), (jax.numpy.asarray(inp["pos"]),), 0,
                       lambda g: float(g[1, 0]))
