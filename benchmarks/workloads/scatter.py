"""Scatter (P2G-like): particles splat mass and momentum to a grid x grid grid with quadratic
B-spline weights (float atomics into random nodes); loss = sum of squared grid values;
backward gives dloss/d(particle position) through the weights (a gather).

Parameter `order`: "random" (the default: particles in the order they were drawn, so the threads
of a workgroup hit nodes all over the grid) or "sorted" (particles sorted by the cell of their
stencil's base node, as P2G codes do after a sort, and as a regular initialisation gives: the
threads of a workgroup hit a few nodes many times)."""

import numpy as np

from . import Program, jax_program, torch_program, warp_program

MODES = ("fwd", "fwd+bwd")
UNIT = "ms"
LOSS, GRAD = "loss", "dloss/dx[1].x"
P_MASS = 1.0


def inputs(p: dict) -> dict:
    rng = np.random.default_rng(3)
    n, order = p["particles"], p.get("order", "random")
    x = rng.uniform(0.2, 0.8, (n, 2)).astype(np.float32)
    v = rng.normal(0.0, 1.0, (n, 2)).astype(np.float32)
    if order == "sorted":
        g = p["grid"]
        base = np.floor(x.astype(np.float64) * g - 0.5).astype(np.int64)
        k = np.argsort(base[:, 0] * g + base[:, 1], kind="stable")
        x, v = x[k], v[k]
    elif order != "random":
        raise ValueError(f"scatter: order must be 'random' or 'sorted', got {order!r}")
    return {"x": np.ascontiguousarray(x), "v": np.ascontiguousarray(v)}


def build(ti, p: dict, inp: dict) -> Program:
    n, g = p["particles"], p["grid"]
    inv_dx = float(g)
    x = ti.Vector.field(2, dtype=ti.f32, shape=n, needs_grad=True)
    pv = ti.Vector.field(2, dtype=ti.f32, shape=n)
    grid_m = ti.field(dtype=ti.f32, shape=(g, g), needs_grad=True)
    grid_mv = ti.Vector.field(2, dtype=ti.f32, shape=(g, g), needs_grad=True)
    loss = ti.field(dtype=ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def clear():
        loss[None] = 0.0
        for i, j in grid_m:
            grid_m[i, j] = 0.0
            grid_mv[i, j] = ti.Vector([0.0, 0.0])

    @ti.kernel
    def p2g():
        for q in x:
            X = x[q] * inv_dx
            base = ti.cast(X - 0.5, ti.i32)
            fx = X - ti.cast(base, ti.f32)
            w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1.0) ** 2, 0.5 * (fx - 0.5) ** 2]
            mv = P_MASS * pv[q]
            for i, j in ti.static(ti.ndrange(3, 3)):
                weight = w[i][0] * w[j][1]
                grid_m[base[0] + i, base[1] + j] += weight * P_MASS
                grid_mv[base[0] + i, base[1] + j] += weight * mv

    @ti.kernel
    def compute_loss():
        for i, j in grid_m:
            loss[None] += grid_m[i, j] ** 2 + grid_mv[i, j].dot(grid_mv[i, j])

    x.from_numpy(inp["x"])
    pv.from_numpy(inp["v"])

    def fwd():
        clear()
        p2g()
        compute_loss()
        ti.sync()

    def fwd_bwd():
        clear()
        with ti.ad.Tape(loss=loss):
            p2g()
            compute_loss()
        ti.sync()

    def result():
        fwd_bwd()
        return float(loss[None]), float(x.grad[1][0])

    return Program({"fwd": fwd, "fwd+bwd": fwd_bwd}, result)


def build_wgsl(gpu, p: dict, inp: dict) -> Program:
    from ..rawgpu import f32_literal
    if not gpu.float_atomics:
        raise NotImplementedError("the hand-written scatter uses atomic<f32> (feature shader-float32-atomic), "
                                  "which this adapter lacks")
    n, g, wg = p["particles"], p["grid"], 64
    pgroups, ggroups = -(-n // wg), -(-g * g // wg)
    layouts = {"p2g": ("read", "read", "storage", "storage"),
               "loss_fwd": (None, None, "storage", "storage", "storage"),
               "p2g_bwd": ("read", "read", "storage", "storage", None, "storage")}
    k = gpu.kernels("scatter", layouts, P=n, G=g, WG=wg,
                    INV_DX=f32_literal(g), P_MASS=f32_literal(P_MASS))
    fin = gpu.kernels("sum_partials", {"main": ("read", "storage")}, COUNT=ggroups)["main"]
    x, pv = gpu.storage(inp["x"]), gpu.storage(inp["v"])
    grid_m, grid_mv = gpu.storage(nbytes=4 * g * g), gpu.storage(nbytes=8 * g * g)
    partials, out, gx = gpu.storage(nbytes=4 * ggroups), gpu.storage(nbytes=4), gpu.storage(nbytes=8 * n)
    fwd_list = [(k["p2g"], gpu.bind(k["p2g"], x, pv, grid_m, grid_mv), pgroups),
                (k["loss_fwd"], gpu.bind(k["loss_fwd"], None, None, grid_m, grid_mv, partials), ggroups),
                (fin, gpu.bind(fin, partials, out), 1)]
    bwd_list = [(k["p2g_bwd"], gpu.bind(k["p2g_bwd"], x, pv, grid_m, grid_mv, None, gx), pgroups)]

    def fwd():
        gpu.run(fwd_list, clears=(grid_m, grid_mv))
        gpu.sync()

    def fwd_bwd():
        gpu.run(fwd_list + bwd_list, clears=(grid_m, grid_mv))
        gpu.sync()

    def result():
        fwd_bwd()
        return float(gpu.read(out, count=1)[0]), float(gpu.read(gx, count=4)[2])

    return Program({"fwd": fwd, "fwd+bwd": fwd_bwd}, result)


def build_warp(wp, p: dict, inp: dict) -> Program:
    """The same program in NVIDIA Warp: atomic adds under a Tape, the adjoint a gather (Warp's own)."""
    n, g = p["particles"], p["grid"]
    inv_dx = float(g)

    @wp.kernel
    def p2g(x: wp.array(dtype=wp.vec2), pv: wp.array(dtype=wp.vec2), grid_m: wp.array2d(dtype=wp.float32),
            grid_mv: wp.array2d(dtype=wp.vec2)):
        q = wp.tid()
        X = x[q] * inv_dx
        bx = int(X[0] - 0.5)
        by = int(X[1] - 0.5)
        fx = X - wp.vec2(float(bx), float(by))
        w0 = 0.5 * wp.cw_mul(wp.vec2(1.5) - fx, wp.vec2(1.5) - fx)
        w1 = wp.vec2(0.75) - wp.cw_mul(fx - wp.vec2(1.0), fx - wp.vec2(1.0))
        w2 = 0.5 * wp.cw_mul(fx - wp.vec2(0.5), fx - wp.vec2(0.5))
        wx = wp.vec3(w0[0], w1[0], w2[0])
        wy = wp.vec3(w0[1], w1[1], w2[1])
        mv = P_MASS * pv[q]
        for i in range(3):
            for j in range(3):
                weight = wx[i] * wy[j]
                wp.atomic_add(grid_m, bx + i, by + j, weight * P_MASS)
                wp.atomic_add(grid_mv, bx + i, by + j, weight * mv)

    @wp.kernel
    def compute_loss(grid_m: wp.array2d(dtype=wp.float32), grid_mv: wp.array2d(dtype=wp.vec2),
                     loss: wp.array(dtype=wp.float32)):
        i, j = wp.tid()
        wp.atomic_add(loss, 0, grid_m[i, j] * grid_m[i, j] + wp.dot(grid_mv[i, j], grid_mv[i, j]))

    x = wp.array(inp["x"], dtype=wp.vec2, requires_grad=True)
    pv = wp.array(inp["v"], dtype=wp.vec2)
    grid_m = wp.zeros((g, g), dtype=wp.float32, requires_grad=True)
    grid_mv = wp.zeros((g, g), dtype=wp.vec2, requires_grad=True)
    loss = wp.zeros(1, dtype=wp.float32, requires_grad=True)

    def forward():
        loss.zero_()
        grid_m.zero_()
        grid_mv.zero_()
        wp.launch(p2g, dim=n, inputs=[x, pv, grid_m, grid_mv])
        wp.launch(compute_loss, dim=(g, g), inputs=[grid_m, grid_mv, loss])

    return warp_program(wp, forward, loss, (x, grid_m, grid_mv), lambda: float(x.grad.numpy()[1][0]))


def _weights(fx):
    w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1.0) ** 2, 0.5 * (fx - 0.5) ** 2]
    dw = [fx - 1.5, 2.0 * (1.0 - fx), fx - 0.5]
    return w, dw


def reference(p: dict, inp: dict) -> tuple[float, float]:
    g = p["grid"]
    x, v = inp["x"].astype(np.float64), inp["v"].astype(np.float64)
    X = x * g
    base = np.floor(X - 0.5).astype(np.int64)   # positions are positive: truncation = floor
    w, dw = _weights(X - base)
    m = np.zeros(g * g)
    mv = np.zeros((g * g, 2))
    for i in range(3):
        for j in range(3):
            node = (base[:, 0] + i) * g + base[:, 1] + j
            wt = w[i][:, 0] * w[j][:, 1] * P_MASS
            m += np.bincount(node, wt, g * g)
            for c in range(2):
                mv[:, c] += np.bincount(node, wt * v[:, c], g * g)
    loss = float((m ** 2).sum() + (mv ** 2).sum())
    q = 1   # dloss/dx[q].x: the weights' derivative times the loss's gradient on each node
    grad = 0.0
    for i in range(3):
        for j in range(3):
            node = (base[q, 0] + i) * g + base[q, 1] + j
            gnode = 2.0 * m[node] * P_MASS + 2.0 * P_MASS * (mv[node] @ v[q])
            grad += dw[i][q, 0] * w[j][q, 1] * g * gnode
    return loss, float(grad)


def _stencil(xp, to_int, x, v, g: int):
    """The 9 nodes and weights of each particle's stencil, for the array libraries (xp: torch or
    jax.numpy; to_int: to integer indices): node (P, 9) flat grid indices, weights (P, 9),
    momentum (P, 1, 2)."""
    X = x * float(g)
    base = xp.floor(X - 0.5)          # no gradient through the base node, as in the kernel's cast
    fx = X - base
    w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1.0) ** 2, 0.5 * (fx - 0.5) ** 2]
    weights = xp.stack([w[i][:, 0] * w[j][:, 1] for i in range(3) for j in range(3)], 1)
    bi = to_int(base)
    node = xp.stack([(bi[:, 0] + i) * g + bi[:, 1] + j for i in range(3) for j in range(3)], 1)
    return node, weights, (P_MASS * v)[:, None, :]


def build_torch(tt, p: dict, inp: dict) -> Program:
    """P2G with index_add (atomics on a GPU)."""
    torch, g = tt.torch, p["grid"]
    x, v = tt.tensor(inp["x"], requires_grad=True), tt.tensor(inp["v"])

    def loss_fn(x, v):
        node, weights, mv = _stencil(torch, lambda a: a.long(), x, v, g)
        node = node.reshape(-1)
        grid_m = torch.zeros(g * g, device=x.device).index_add(0, node, (weights * P_MASS).reshape(-1))
        grid_mv = torch.zeros(g * g, 2, device=x.device).index_add(0, node, (weights[:, :, None] * mv).reshape(-1, 2))
        return (grid_m * grid_m).sum() + (grid_mv * grid_mv).sum()

    return torch_program(tt, tt.compile(loss_fn), (x, v), (x,), lambda: float(x.grad[1, 0]))


def build_jax(jax, p: dict, inp: dict) -> Program:
    """P2G with .at[].add (a scatter-add)."""
    jnp, g = jax.numpy, p["grid"]

    def loss_fn(x, v):
        node, weights, mv = _stencil(jnp, lambda a: a.astype(jnp.int32), x, v, g)
        node = node.reshape(-1)
        grid_m = jnp.zeros(g * g, jnp.float32).at[node].add((weights * P_MASS).reshape(-1))
        grid_mv = jnp.zeros((g * g, 2), jnp.float32).at[node].add((weights[:, :, None] * mv).reshape(-1, 2))
        return (grid_m * grid_m).sum() + (grid_mv * grid_mv).sum()

    return jax_program(jax, loss_fn, (jnp.asarray(inp["x"]), jnp.asarray(inp["v"])), 0,
                       lambda grad: float(grad[1, 0]))
