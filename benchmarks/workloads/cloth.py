"""Cloth: an n x n mass-spring sheet (structural and shear springs to the 8 neighbours, gravity,
damping, symplectic Euler) for `steps` steps, every step stored (x, v have a time axis), and a
loss at the end (mean squared distance to a target point); backward through all steps. Written as
a DiffTaichi user writes it: stored states, `ti.static` offsets, one `@ti.func` per spring with its
bounds check, one launch per step."""

import math
from types import SimpleNamespace

import numpy as np

from . import Program, jax_program, torch_program, warp_program

MODES = ("fwd", "fwd+bwd")
UNIT = "ms"
LOSS, GRAD = "loss", "dloss/dv0[n/2,n/2].x"
OFFSETS = [(-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 1), (1, -1), (1, 0), (1, 1)]
DT, KS, MASS, DAMPING, GRAVITY = 1e-3, 1000.0, 1.0, 0.999, 9.8
TARGET = (0.5, -0.3, 0.5)


def spacing(n: int) -> float:
    return 1.0 / n


def inputs(p: dict) -> dict:
    n = p["n"]
    rng = np.random.default_rng(1)
    g = (np.arange(n) + 0.5) * spacing(n)
    x0 = np.stack(np.meshgrid(g, g, indexing="ij"), -1)           # (i, j) -> (x, z) on a sheet
    x0 = np.stack([x0[..., 1], np.zeros((n, n)), x0[..., 0]], -1)  # y = 0: the sheet is horizontal
    v0 = rng.normal(0.0, 0.1, (n, n, 3))
    return {"x0": x0.astype(np.float32), "v0": v0.astype(np.float32)}


def kernels(ti, p: dict) -> SimpleNamespace:
    """The fields and kernels, in the Taichi-shaped API (also used by the compile-time benchmark)."""
    n, steps = p["n"], p["steps"]
    dx = spacing(n)
    rest = [dx * math.sqrt(di * di + dj * dj) for di, dj in OFFSETS]
    tx, ty, tz = TARGET
    inv_nn = 1.0 / (n * n)
    x = ti.Vector.field(3, dtype=ti.f32, shape=(steps + 1, n, n), needs_grad=True)
    v = ti.Vector.field(3, dtype=ti.f32, shape=(steps + 1, n, n), needs_grad=True)
    loss = ti.field(dtype=ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def clear():
        loss[None] = 0.0

    @ti.func
    def spring(t, i2, j2, xi, rest_length):
        f = ti.Vector([0.0, 0.0, 0.0])
        if 0 <= i2 < n and 0 <= j2 < n:
            d = x[t, i2, j2] - xi
            length = d.norm()
            f = KS * (length - rest_length) / length * d
        return f

    @ti.kernel
    def step(t: ti.i32):
        for i, j in ti.ndrange(n, n):
            xi = x[t, i, j]
            f = ti.Vector([0.0, -GRAVITY * MASS, 0.0])
            for k in ti.static(range(8)):
                f += spring(t, i + ti.static(OFFSETS[k][0]), j + ti.static(OFFSETS[k][1]), xi, ti.static(rest[k]))
            vn = v[t, i, j] * DAMPING + (DT / MASS) * f
            v[t + 1, i, j] = vn
            x[t + 1, i, j] = xi + DT * vn

    @ti.kernel
    def compute_loss():
        for i, j in ti.ndrange(n, n):
            d = x[steps, i, j] - ti.Vector([tx, ty, tz])
            loss[None] += d.dot(d) * inv_nn

    return SimpleNamespace(x=x, v=v, loss=loss, clear=clear, step=step, compute_loss=compute_loss)


def set_initial_state(k: SimpleNamespace, p: dict, inp: dict) -> None:
    n, steps = p["n"], p["steps"]
    xs = np.zeros((steps + 1, n, n, 3), np.float32)
    vs = np.zeros((steps + 1, n, n, 3), np.float32)
    xs[0], vs[0] = inp["x0"], inp["v0"]
    k.x.from_numpy(xs)
    k.v.from_numpy(vs)


def build(ti, p: dict, inp: dict) -> Program:
    steps, c = p["steps"], p["n"] // 2
    k = kernels(ti, p)
    set_initial_state(k, p, inp)

    def forward():
        for t in range(steps):
            k.step(t)
        k.compute_loss()

    def fwd():
        k.clear()
        forward()
        ti.sync()

    def fwd_bwd():
        k.clear()
        with ti.ad.Tape(loss=k.loss):
            forward()
        ti.sync()

    def result():
        fwd_bwd()
        return float(k.loss[None]), float(k.v.grad[0, c, c][0])

    return Program({"fwd": fwd, "fwd+bwd": fwd_bwd}, result)


LAYOUTS = {"step_fwd": ("uniform", "storage", "storage"),
           "step_bwd": ("uniform", "storage", None, "storage", "storage"),
           "loss_fwd": (None, "storage", None, None, None, "storage"),
           "loss_bwd": (None, "storage", None, "storage", "storage")}


def wgsl_kernels(gpu, p: dict, entries=tuple(LAYOUTS), finish=True) -> tuple:
    from ..rawgpu import f32_literal
    n, steps, wg = p["n"], p["steps"], 64
    groups = -(-n * n // wg)
    f = f32_literal
    k = gpu.kernels("cloth", {e: LAYOUTS[e] for e in entries}, N=n, STEPS=steps, WG=wg, DT=f(DT), KS=f(KS), MASS=f(MASS),
                    DAMPING=f(DAMPING), GRAVITY=f(GRAVITY), REST1=f(spacing(n)),
                    REST2=f(spacing(n) * math.sqrt(2.0)), TX=f(TARGET[0]), TY=f(TARGET[1]),
                    TZ=f(TARGET[2]), INV_NN=f(1.0 / (n * n)))
    fin = gpu.kernels("sum_partials", {"main": ("read", "storage")}, COUNT=groups)["main"] if finish else None
    return k, fin, groups


def build_wgsl(gpu, p: dict, inp: dict) -> Program:
    n, steps, c = p["n"], p["steps"], p["n"] // 2
    k, fin, groups = wgsl_kernels(gpu, p)
    xs = np.zeros((steps + 1, n, n, 3), np.float32)
    vs = np.zeros((steps + 1, n, n, 3), np.float32)
    xs[0], vs[0] = inp["x0"], inp["v0"]
    x, v = gpu.storage(xs), gpu.storage(vs)
    gx, gv = gpu.storage(nbytes=xs.nbytes), gpu.storage(nbytes=vs.nbytes)
    partials, out = gpu.storage(nbytes=4 * groups), gpu.storage(nbytes=4)
    ts = gpu.uniforms([[t] for t in range(steps)])
    step_f = gpu.bind(k["step_fwd"], ts, x, v)
    step_b = gpu.bind(k["step_bwd"], ts, x, None, gx, gv)
    fwd_list = [(k["step_fwd"], step_f, groups, t) for t in range(steps)]
    fwd_list += [(k["loss_fwd"], gpu.bind(k["loss_fwd"], None, x, None, None, None, partials), groups),
                 (fin, gpu.bind(fin, partials, out), 1)]
    bwd_list = [(k["loss_bwd"], gpu.bind(k["loss_bwd"], None, x, None, gx, gv), groups)]
    bwd_list += [(k["step_bwd"], step_b, groups, t) for t in reversed(range(steps))]

    def fwd():
        gpu.run(fwd_list)
        gpu.sync()

    def fwd_bwd():
        gpu.run(fwd_list + bwd_list)
        gpu.sync()

    def result():
        fwd_bwd()
        g = gpu.read(gv, count=n * n * 3).reshape(n, n, 3)
        return float(gpu.read(out, count=1)[0]), float(g[c, c, 0])

    return Program({"fwd": fwd, "fwd+bwd": fwd_bwd}, result)


def build_warp(wp, p: dict, inp: dict) -> Program:
    """The same program in NVIDIA Warp as its users write it: states stored per step, one
    `@wp.func` per spring with its bounds check, one launch per step under a Tape."""
    n, steps, c = p["n"], p["steps"], p["n"] // 2
    dx = spacing(n)
    inv_nn = 1.0 / (n * n)
    target = wp.vec3(*TARGET)

    @wp.func
    def spring(x: wp.array3d(dtype=wp.vec3), t: int, i: int, j: int, xi: wp.vec3, rest: float):
        f = wp.vec3(0.0)
        if i >= 0 and i < n and j >= 0 and j < n:
            d = x[t, i, j] - xi
            length = wp.length(d)
            f = KS * (length - rest) / length * d
        return f

    r1, r2 = dx, dx * math.sqrt(2.0)

    @wp.kernel
    def step(x: wp.array3d(dtype=wp.vec3), v: wp.array3d(dtype=wp.vec3), t: int):
        i, j = wp.tid()
        xi = x[t, i, j]
        f = wp.vec3(0.0, -GRAVITY * MASS, 0.0)
        f += spring(x, t, i - 1, j - 1, xi, r2)
        f += spring(x, t, i - 1, j, xi, r1)
        f += spring(x, t, i - 1, j + 1, xi, r2)
        f += spring(x, t, i, j - 1, xi, r1)
        f += spring(x, t, i, j + 1, xi, r1)
        f += spring(x, t, i + 1, j - 1, xi, r2)
        f += spring(x, t, i + 1, j, xi, r1)
        f += spring(x, t, i + 1, j + 1, xi, r2)
        vn = v[t, i, j] * DAMPING + (DT / MASS) * f
        v[t + 1, i, j] = vn
        x[t + 1, i, j] = xi + DT * vn

    @wp.kernel
    def compute_loss(x: wp.array3d(dtype=wp.vec3), loss: wp.array(dtype=wp.float32)):
        i, j = wp.tid()
        d = x[steps, i, j] - target
        wp.atomic_add(loss, 0, wp.dot(d, d) * inv_nn)

    xs = np.zeros((steps + 1, n, n, 3), np.float32)
    vs = np.zeros((steps + 1, n, n, 3), np.float32)
    xs[0], vs[0] = inp["x0"], inp["v0"]
    x = wp.array(xs, dtype=wp.vec3, requires_grad=True)
    v = wp.array(vs, dtype=wp.vec3, requires_grad=True)
    loss = wp.zeros(1, dtype=wp.float32, requires_grad=True)

    def forward():
        loss.zero_()
        for t in range(steps):
            wp.launch(step, dim=(n, n), inputs=[x, v, t])
        wp.launch(compute_loss, dim=(n, n), inputs=[x, loss])

    return warp_program(wp, forward, loss, (x, v), lambda: float(v.grad.numpy()[0, c, c, 0]))


def _simulate(p: dict, x0: np.ndarray, v0: np.ndarray) -> float:
    n, steps = p["n"], p["steps"]
    dx = spacing(n)
    x, v = x0.astype(np.float64), v0.astype(np.float64)
    for _ in range(steps):
        f = np.zeros_like(x)
        f[..., 1] = -GRAVITY * MASS
        for di, dj in OFFSETS:
            rest = dx * math.sqrt(di * di + dj * dj)
            i0, i1, j0, j1 = max(0, -di), n - max(0, di), max(0, -dj), n - max(0, dj)
            d = x[i0 + di:i1 + di, j0 + dj:j1 + dj] - x[i0:i1, j0:j1]
            length = np.sqrt((d ** 2).sum(-1, keepdims=True))
            f[i0:i1, j0:j1] += KS * (length - rest) / length * d
        v = v * DAMPING + DT / MASS * f
        x = x + DT * v
    return float(((x - np.array(TARGET)) ** 2).sum() / (n * n))


def reference(p: dict, inp: dict) -> tuple[float, float]:
    """The loss in float64, and the gradient entry by central differences on that simulation."""
    c, h = p["n"] // 2, 1e-6
    loss = _simulate(p, inp["x0"], inp["v0"])
    vp, vm = inp["v0"].astype(np.float64), inp["v0"].astype(np.float64)
    vp[c, c, 0] += h
    vm[c, c, 0] -= h
    return loss, (_simulate(p, inp["x0"], vp) - _simulate(p, inp["x0"], vm)) / (2 * h)


def _array_step(xp, pad, n: int, weight):
    """One step for the array libraries (xp: torch or jax.numpy; pad(a, i0, i1, j0, j1) pads an
    (i, j, 3) array with zeros to n x n; weight: the gravity force (0, -g m, 0) as an array on the
    device): each spring direction as a difference of shifted slices."""
    dx = spacing(n)
    springs = []
    for di, dj in OFFSETS:
        i0, i1, j0, j1 = max(0, -di), n - max(0, di), max(0, -dj), n - max(0, dj)
        springs.append((di, dj, i0, i1, j0, j1, dx * math.sqrt(di * di + dj * dj)))

    def step(x, v):
        f = xp.zeros_like(x) + weight
        for di, dj, i0, i1, j0, j1, rest in springs:
            d = x[i0 + di:i1 + di, j0 + dj:j1 + dj] - x[i0:i1, j0:j1]
            length = xp.sqrt((d * d).sum(-1, keepdims=True))
            f = f + pad(KS * (length - rest) / length * d, i0, n - i1, j0, n - j1)
        v = v * DAMPING + (DT / MASS) * f
        return x + DT * v, v
    return step


def _array_loss(x, target, n: int):
    d = x - target
    return (d * d).sum() / (n * n)


def build_torch(tt, p: dict, inp: dict) -> Program:
    """x and v carried from step to step (autograd keeps what the backward pass needs); under
    torch-compile each step is one compiled call."""
    torch, n, steps, c = tt.torch, p["n"], p["steps"], p["n"] // 2
    F = torch.nn.functional
    x0, v0 = tt.tensor(inp["x0"], requires_grad=True), tt.tensor(inp["v0"], requires_grad=True)
    weight, target = tt.tensor([0.0, -GRAVITY * MASS, 0.0]), tt.tensor(TARGET)
    step = tt.compile(_array_step(torch, lambda a, i0, i1, j0, j1: F.pad(a, (0, 0, j0, j1, i0, i1)), n, weight))

    def simulate(x, v):
        for _ in range(steps):
            x, v = step(x, v)
        return _array_loss(x, target, n)

    return torch_program(tt, simulate, (x0, v0), (x0, v0), lambda: float(v0.grad[c, c, 0]))


def build_jax(jax, p: dict, inp: dict) -> Program:
    """The steps in a lax.scan under jit, differentiated with value_and_grad."""
    jnp, n, steps, c = jax.numpy, p["n"], p["steps"], p["n"] // 2
    weight, target = jnp.asarray([0.0, -GRAVITY * MASS, 0.0], jnp.float32), jnp.asarray(TARGET, jnp.float32)
    step = _array_step(jnp, lambda a, i0, i1, j0, j1: jnp.pad(a, ((i0, i1), (j0, j1), (0, 0))), n, weight)

    def simulate(x, v):
        (x, v), _ = jax.lax.scan(lambda xv, _: (step(*xv), None), (x, v), None, length=steps)
        return _array_loss(x, target, n)

    return jax_program(jax, simulate, (jnp.asarray(inp["x0"]), jnp.asarray(inp["v0"])), (0, 1),
                       lambda g: float(g[1][c, c, 0]))
