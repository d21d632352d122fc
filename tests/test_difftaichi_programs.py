"""Whole differentiable programs of the kinds in DiffTaichi's examples, written the way a Taichi
user writes them (`import wgpu_ad as ti`, fields, `@ti.kernel`, `@ti.func`, `ti.static`,
`ti.ad.Tape`, states stored per step as `x[t, i]` or updated in place under `ti.ad.checkpoint`):
material point method (stored, in place under a checkpoint, and diffmpm's backward pass by hand),
semi-Lagrangian smoke, billiards with impacts, charged particles, the wave equation, a
neural-network controller of a mass-spring robot, rigid boxes with friction, a volume renderer,
sphere tracing and SPH densities over a neighbour grid built on the tape.

Each program has a float64 NumPy port written alongside it, and every gradient is compared with
central differences of that port (tests/ad_util.py), never with wgpu_ad's own output. Sizes are
tiny (a few particles, an 8x8 grid, a handful of steps) so the file runs in seconds on lavapipe;
inputs with branches (contacts, boundaries) are chosen away from the switching points, where
central differences would straddle a jump."""
import numpy as np
import pytest

import wgpu_ad as ti
from ad_util import assert_grad, central_diffs

pytestmark = pytest.mark.gpu


# ---- 1. MPM (diffmpm's shape): P2G with quadratic B-splines and APIC, grid update, G2P ----------

MPM_STEPS, MPM_N, MPM_GRID = 6, 6, 8
MPM_DX, MPM_INV_DX, MPM_DT = 1.0 / MPM_GRID, float(MPM_GRID), 2e-3
MPM_P_VOL, MPM_P_MASS, MPM_GRAVITY, MPM_BOUND = (MPM_DX * 0.5) ** 2, 1.0, 9.8, 2
# diffmpm's actuation: per step, actuator a pulls along y with tanh(sum_j act_w[a, j] sin(omega t dt
# + 2 pi j / n_sin) + act_b[a]); particle p belongs to actuator MPM_ACTUATOR[p] (-1: none); the loss adds
# minus the mean height of the particles of type 1
MPM_ACTUATOR, MPM_TYPE = np.array([0, 1, -1, 0, 1, -1]), np.array([1, 1, 0, 1, 1, 0])
MPM_SIN, MPM_OMEGA, MPM_ACT_STRENGTH = 2, 40.0, 500.0


def mpm_reference(x0, v0, E, act_w=None, act_b=None):
    """The float64 port (vectorised over particles and grid nodes): returns the loss (the spread of
    the final particle velocities; with the actuation weights act_w, act_b also minus the mean
    height of the type-1 particles)."""
    n_grid, dx, inv_dx, dt = MPM_GRID, MPM_DX, MPM_INV_DX, MPM_DT
    xs, vs = np.array(x0, np.float64), np.array(v0, np.float64)
    n = len(xs)
    Cs, Fs = np.zeros((n, 2, 2)), np.tile(np.eye(2), (n, 1, 1))
    mu, la = E / 2.4, E * 0.2 / 0.48
    offsets = [(i, j) for i in range(3) for j in range(3)]
    for step in range(MPM_STEPS - 1):
        base = (xs * inv_dx - 0.5).astype(int)
        fx = xs * inv_dx - base
        w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1) ** 2, 0.5 * (fx - 0.5) ** 2]   # each (n, 2)
        F = (np.eye(2) + dt * Cs) @ Fs
        Fs = F
        J = np.linalg.det(F)
        c, s = F[:, 0, 0] + F[:, 1, 1], F[:, 1, 0] - F[:, 0, 1]
        c, s = c / np.hypot(c, s), s / np.hypot(c, s)
        R = np.stack([np.stack([c, -s], -1), np.stack([s, c], -1)], -2)
        cauchy = 2 * mu * (F - R) @ F.transpose(0, 2, 1) + (la * (J - 1) * J)[:, None, None] * np.eye(2)
        if act_w is not None:
            waves = np.sin(MPM_OMEGA * step * dt + 2 * np.pi / MPM_SIN * np.arange(MPM_SIN))
            act = np.tanh(act_w @ waves + act_b)[np.maximum(MPM_ACTUATOR, 0)] * MPM_ACT_STRENGTH
            act = np.where(MPM_ACTUATOR == -1, 0.0, act)
            cauchy = cauchy + F @ (act[:, None, None] * np.array([[0.0, 0.0], [0.0, 1.0]])) @ F.transpose(0, 2, 1)
        affine = -(dt * MPM_P_VOL * 4 * inv_dx * inv_dx) * cauchy + MPM_P_MASS * Cs
        gv, gm = np.zeros((n_grid, n_grid, 2)), np.zeros((n_grid, n_grid))
        for i, j in offsets:
            wt = w[i][:, 0] * w[j][:, 1]
            dpos = (np.array([i, j]) - fx) * dx
            mom = wt[:, None] * (MPM_P_MASS * vs + (affine @ dpos[:, :, None])[:, :, 0])
            np.add.at(gv, (base[:, 0] + i, base[:, 1] + j), mom)
            np.add.at(gm, (base[:, 0] + i, base[:, 1] + j), wt * MPM_P_MASS)
        gout = gv / (gm[..., None] + 1e-10)
        gout[..., 1] -= dt * MPM_GRAVITY
        gi, gj = np.meshgrid(np.arange(n_grid), np.arange(n_grid), indexing="ij")
        gout[..., 0] = np.where(((gi < MPM_BOUND) & (gout[..., 0] < 0)) | ((gi > n_grid - MPM_BOUND) & (gout[..., 0] > 0)),
                                0.0, gout[..., 0])
        gout[..., 1] = np.where(((gj < MPM_BOUND) & (gout[..., 1] < 0)) | ((gj > n_grid - MPM_BOUND) & (gout[..., 1] > 0)),
                                0.0, gout[..., 1])
        new_v, new_C = np.zeros((n, 2)), np.zeros((n, 2, 2))
        for i, j in offsets:
            g, wt = gout[base[:, 0] + i, base[:, 1] + j], w[i][:, 0] * w[j][:, 1]
            new_v += wt[:, None] * g
            new_C += 4 * inv_dx * wt[:, None, None] * g[:, :, None] * (np.array([i, j]) - fx)[:, None, :]
        vs, Cs = new_v, new_C
        xs = xs + dt * new_v
    spread = ((vs[:, None] - vs[None]) ** 2).sum()
    return spread if act_w is None else spread - xs[MPM_TYPE == 1, 1].mean()


def test_mpm_with_actuation_gradient_wrt_weights_initial_state_and_youngs_modulus():
    """Stored states x[t, p] ... on one tape, diffmpm's actuation network (sin waves, tanh) read
    through each particle's actuator id (a data-dependent index), and its loss term: the mean
    height of the type-1 particles, summed with ti.atomic_add under a branch on the type."""
    steps, n, n_grid = MPM_STEPS, MPM_N, MPM_GRID
    dx, inv_dx, dt, p_vol, p_mass = MPM_DX, MPM_INV_DX, MPM_DT, MPM_P_VOL, MPM_P_MASS
    gravity, bound = MPM_GRAVITY, MPM_BOUND
    x = ti.Vector.field(2, ti.f32, shape=(steps, n), needs_grad=True)
    v = ti.Vector.field(2, ti.f32, shape=(steps, n), needs_grad=True)
    C = ti.Matrix.field(2, 2, ti.f32, shape=(steps, n), needs_grad=True)
    F = ti.Matrix.field(2, 2, ti.f32, shape=(steps, n), needs_grad=True)
    grid_v_in = ti.Vector.field(2, ti.f32, shape=(steps, n_grid, n_grid), needs_grad=True)
    grid_m_in = ti.field(ti.f32, shape=(steps, n_grid, n_grid), needs_grad=True)
    grid_v_out = ti.Vector.field(2, ti.f32, shape=(steps, n_grid, n_grid), needs_grad=True)
    E = ti.field(ti.f32, shape=(), needs_grad=True)
    init_v = ti.Vector.field(2, ti.f32, shape=n, needs_grad=True)
    n_act, n_sin, omega, act_strength = 2, MPM_SIN, MPM_OMEGA, MPM_ACT_STRENGTH
    weights = ti.field(ti.f32, shape=(n_act, n_sin), needs_grad=True)
    bias = ti.field(ti.f32, shape=n_act, needs_grad=True)
    actuation = ti.field(ti.f32, shape=(steps, n_act), needs_grad=True)
    actuator_id = ti.field(ti.i32, shape=n)
    particle_type = ti.field(ti.i32, shape=n)
    x_avg = ti.Vector.field(2, ti.f32, shape=(), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def set_v():
        for p in range(n):
            v[0, p] = init_v[p]
            F[0, p] = ti.Matrix.identity(ti.f32, 2)

    @ti.kernel
    def compute_actuation(t: ti.i32):
        for i in range(n_act):
            act = 0.0
            for j in ti.static(range(n_sin)):
                act += weights[i, j] * ti.sin(omega * t * dt + 2 * np.pi / n_sin * j)
            act += bias[i]
            actuation[t, i] = ti.tanh(act)

    @ti.kernel
    def p2g(f: ti.i32):
        for p in range(n):
            base = ti.cast(x[f, p] * inv_dx - 0.5, ti.i32)
            fx = x[f, p] * inv_dx - ti.cast(base, ti.f32)
            w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1) ** 2, 0.5 * (fx - 0.5) ** 2]
            new_F = (ti.Matrix.identity(ti.f32, 2) + dt * C[f, p]) @ F[f, p]
            F[f + 1, p] = new_F
            J = new_F.determinant()
            r, s = ti.polar_decompose(new_F)
            mu, la = E[None] / 2.4, E[None] * 0.2 / 0.48
            cauchy = 2 * mu * (new_F - r) @ new_F.transpose() + ti.Matrix.diag(2, la * (J - 1) * J)
            act_id = actuator_id[p]
            act = actuation[f, ti.max(0, act_id)] * act_strength
            if act_id == -1:
                act = 0.0
            A = ti.Matrix([[0.0, 0.0], [0.0, 1.0]]) * act
            cauchy += new_F @ A @ new_F.transpose()
            stress = -(dt * p_vol * 4 * inv_dx * inv_dx) * cauchy
            affine = stress + p_mass * C[f, p]
            for i, j in ti.static(ti.ndrange(3, 3)):
                offset = ti.Vector([i, j])
                dpos = (ti.cast(offset, ti.f32) - fx) * dx
                weight = w[i][0] * w[j][1]
                grid_v_in[f, base + offset] += weight * (p_mass * v[f, p] + affine @ dpos)
                grid_m_in[f, base + offset] += weight * p_mass

    @ti.kernel
    def grid_op(f: ti.i32):
        for i, j in ti.ndrange(n_grid, n_grid):
            inv_m = 1 / (grid_m_in[f, i, j] + 1e-10)
            v_out = inv_m * grid_v_in[f, i, j]
            v_out[1] -= dt * gravity
            if i < bound and v_out[0] < 0:
                v_out[0] = 0
            if i > n_grid - bound and v_out[0] > 0:
                v_out[0] = 0
            if j < bound and v_out[1] < 0:
                v_out[1] = 0
            if j > n_grid - bound and v_out[1] > 0:
                v_out[1] = 0
            grid_v_out[f, i, j] = v_out

    @ti.kernel
    def g2p(f: ti.i32):
        for p in range(n):
            base = ti.cast(x[f, p] * inv_dx - 0.5, ti.i32)
            fx = x[f, p] * inv_dx - ti.cast(base, ti.f32)
            w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1.0) ** 2, 0.5 * (fx - 0.5) ** 2]
            new_v = ti.Vector([0.0, 0.0])
            new_C = ti.Matrix([[0.0, 0.0], [0.0, 0.0]])
            for i, j in ti.static(ti.ndrange(3, 3)):
                dpos = ti.Vector([i, j]).cast(float) - fx
                g_v = grid_v_out[f, base[0] + i, base[1] + j]
                weight = w[i][0] * w[j][1]
                new_v += weight * g_v
                new_C += 4 * inv_dx * weight * g_v.outer_product(dpos)
            v[f + 1, p] = new_v
            x[f + 1, p] = x[f, p] + dt * v[f + 1, p]
            C[f + 1, p] = new_C

    @ti.kernel
    def compute_x_avg():
        for i in range(n):
            contrib = 0.0
            if particle_type[i] == 1:
                contrib = 1.0 / n_solid
            ti.atomic_add(x_avg[None], contrib * x[steps - 1, i])

    @ti.kernel
    def compute_loss():
        for p, q in ti.ndrange(n, n):
            loss[None] += (v[steps - 1, p] - v[steps - 1, q]).norm_sqr()
        loss[None] -= x_avg[None][1]

    rng = np.random.default_rng(1)
    x0 = (0.45 + 0.1 * rng.random((n, 2))).astype(np.float32)
    v0 = rng.standard_normal((n, 2)).astype(np.float32)
    E0 = 2e4
    xs = np.zeros((steps, n, 2), np.float32)
    xs[0] = x0
    x.from_numpy(xs)
    init_v.from_numpy(v0)
    E[None] = E0
    w0, b0 = rng.standard_normal((n_act, n_sin)), 0.1 * rng.standard_normal(n_act)
    weights.from_numpy(w0.astype(np.float32))
    bias.from_numpy(b0.astype(np.float32))
    actuator_id.from_numpy(MPM_ACTUATOR.astype(np.int32))
    particle_type.from_numpy(MPM_TYPE.astype(np.int32))
    n_solid = int(MPM_TYPE.sum())
    with ti.ad.Tape(loss=loss):
        set_v()
        for s in range(steps - 1):
            compute_actuation(s)
            p2g(s)
            grid_op(s)
            g2p(s)
        x_avg[None] = [0, 0]  # as diffmpm's forward(): a Python-scope write on the tape
        compute_x_avg()
        compute_loss()

    def f(x0_, v0_, e, w, b):
        return mpm_reference(x0_, v0_, float(e), w, b)
    inputs = [x0, v0, np.float64(E0), w0, b0]
    assert loss[None] == pytest.approx(f(*inputs), rel=1e-5)
    ref_x, ref_v, ref_E, ref_w, ref_b = central_diffs(f, inputs)
    assert_grad(x.grad.to_numpy()[0], ref_x, what="d loss / d x[0]")
    assert_grad(init_v.grad.to_numpy(), ref_v, what="d loss / d init_v")
    assert_grad(E.grad[None], ref_E, what="d loss / d E")
    assert_grad(weights.grad.to_numpy(), ref_w, what="d loss / d weights")
    assert_grad(bias.grad.to_numpy(), ref_b, what="d loss / d bias")


def test_mpm_in_place_under_checkpoint():
    """The same MPM written as diffmpm's users write a long run: particle state updated in place,
    one grid cleared every step (`grid_v[i, j] = [0, 0]`, `for p in x`, `int(x[p] * inv_dx - 0.5)`,
    weights from a ti.func returning a list), G2P's `x[p] += dt * new_v` on a vector field, and the
    steps differentiated by ti.ad.checkpoint. Launched on a plain tape instead, the steps overwrite
    what earlier kernels read, and a step that forgets to clear the grid carries sums from step to
    step: both refused, the messages naming the kernels, the field and the fix."""
    steps, n, n_grid = MPM_STEPS, MPM_N, MPM_GRID
    dx, inv_dx, dt, p_vol, p_mass = MPM_DX, MPM_INV_DX, MPM_DT, MPM_P_VOL, MPM_P_MASS
    gravity, bound = MPM_GRAVITY, MPM_BOUND
    x = ti.Vector.field(2, ti.f32, shape=n, needs_grad=True)
    v = ti.Vector.field(2, ti.f32, shape=n, needs_grad=True)
    C = ti.Matrix.field(2, 2, ti.f32, shape=n, needs_grad=True)
    F = ti.Matrix.field(2, 2, ti.f32, shape=n, needs_grad=True)
    grid_v = ti.Vector.field(2, ti.f32, shape=(n_grid, n_grid), needs_grad=True)
    grid_m = ti.field(ti.f32, shape=(n_grid, n_grid), needs_grad=True)
    E = ti.field(ti.f32, shape=(), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.func
    def weights(fx):
        return [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1) ** 2, 0.5 * (fx - 0.5) ** 2]

    @ti.kernel
    def clear_grid():
        for i, j in grid_m:
            grid_v[i, j] = [0, 0]
            grid_m[i, j] = 0

    @ti.kernel
    def p2g():
        for p in x:
            base = int(x[p] * inv_dx - 0.5)
            fx = x[p] * inv_dx - base
            w = weights(fx)
            new_F = (ti.Matrix.identity(float, 2) + dt * C[p]) @ F[p]
            F[p] = new_F
            J = new_F.determinant()
            r, s = ti.polar_decompose(new_F)
            mu, la = E[None] / 2.4, E[None] * 0.2 / 0.48
            cauchy = 2 * mu * (new_F - r) @ new_F.transpose() + ti.Matrix.diag(2, la * (J - 1) * J)
            affine = -(dt * p_vol * 4 * inv_dx * inv_dx) * cauchy + p_mass * C[p]
            for i, j in ti.static(ti.ndrange(3, 3)):
                offset = ti.Vector([i, j])
                dpos = (offset - fx) * dx
                weight = w[i][0] * w[j][1]
                grid_v[base + offset] += weight * (p_mass * v[p] + affine @ dpos)
                grid_m[base + offset] += weight * p_mass

    @ti.kernel
    def grid_op():
        for i, j in grid_m:
            v_out = grid_v[i, j] / (grid_m[i, j] + 1e-10)
            v_out[1] -= dt * gravity
            if i < bound and v_out[0] < 0:
                v_out[0] = 0
            if i > n_grid - bound and v_out[0] > 0:
                v_out[0] = 0
            if j < bound and v_out[1] < 0:
                v_out[1] = 0
            if j > n_grid - bound and v_out[1] > 0:
                v_out[1] = 0
            grid_v[i, j] = v_out

    @ti.kernel
    def g2p():
        for p in x:
            base = int(x[p] * inv_dx - 0.5)
            fx = x[p] * inv_dx - float(base)
            w = weights(fx)
            new_v = ti.Vector.zero(float, 2)
            new_C = ti.Matrix.zero(float, 2, 2)
            for i, j in ti.static(ti.ndrange(3, 3)):
                dpos = ti.Vector([i, j]) - fx
                g_v = grid_v[base + ti.Vector([i, j])]
                weight = w[i][0] * w[j][1]
                new_v += weight * g_v
                new_C += 4 * inv_dx * weight * g_v.outer_product(dpos)
            v[p], C[p] = new_v, new_C
            x[p] += dt * new_v

    @ti.kernel
    def compute_loss():
        for p, q in ti.ndrange(n, n):
            loss[None] += (v[p] - v[q]).norm_sqr()

    def step(t):
        clear_grid(); p2g(); grid_op(); g2p()

    rng = np.random.default_rng(1)
    x0 = (0.45 + 0.1 * rng.random((n, 2))).astype(np.float32)
    v0 = rng.standard_normal((n, 2)).astype(np.float32)
    E0 = 2e4
    E[None] = E0

    def initial_state():
        x.from_numpy(x0)
        v.from_numpy(v0)
        C.fill(0)
        F.from_numpy(np.tile(np.eye(2, dtype=np.float32), (n, 1, 1)))
    # the steps launched on a plain tape: g2p overwrites what p2g read; refused, naming the fix
    initial_state()
    with pytest.raises(ti.WgpuAdError, match=r"ti.ad.Tape: kernel 'g2p' \(launch 4 on the tape\) writes elements of "
                                             r"field 'v' that kernel 'p2g' \(launch 2\) read before; .* run steps "
                                             r"that update their state in place under ti.ad.checkpoint"):
        with ti.ad.Tape(loss=loss):
            for t in range(steps - 1):
                step(t)
            compute_loss()
    # a step that forgets to clear the grid: the grid carries sums from step to step; named
    def step_without_clearing(t):
        p2g()
        grid_op()
        g2p()
    initial_state()
    with pytest.raises(ti.WgpuAdError, match=r"ti.ad.checkpoint: field 'grid_v' carries values from one step to the "
                                             r"next but is not in state=: kernel 'p2g' adds to it in step 0 and no "
                                             r"kernel stores to it first \(clears it\)"):
        with ti.ad.Tape(loss=loss):
            ti.ad.checkpoint(step_without_clearing, steps=steps - 1, state=[x, v, C, F])
            compute_loss()
    initial_state()
    loss.fill(0)
    with ti.ad.Tape(loss=loss):
        ti.ad.checkpoint(step, steps=steps - 1, state=[x, v, C, F], snapshots=2)
        compute_loss()

    assert loss[None] == pytest.approx(mpm_reference(x0, v0, E0), rel=1e-5)
    ref_x, ref_v, ref_E = central_diffs(lambda a, b, e: mpm_reference(a, b, float(e)), [x0, v0, np.float64(E0)])
    assert_grad(x.grad.to_numpy(), ref_x, what="d loss / d x0")
    assert_grad(v.grad.to_numpy(), ref_v, what="d loss / d v0")
    assert_grad(E.grad[None], ref_E, what="d loss / d E")


@pytest.mark.parametrize("form", ["by_hand", "grad_replaced"])
def test_mpm_with_diffmpms_manual_backward_pass(form):
    """diffmpm's own structure: fields placed with ti.root.dense(...).place() and lazy_grad(), one
    grid reused by every step (cleared with its gradients by a kernel), and each step's grid
    recomputed before g2p.grad, grid_op.grad, p2g.grad. `by_hand`: the older diffmpm's backward
    pass with kernel.grad() calls; g2p read the grid of its step, which later steps overwrote, so
    as written g2p.grad is refused with a clear fix, and launching g2p(s) again on the recomputed
    grid gives the gradients of the stored-state program. `grad_replaced`: today's diffmpm, the
    step a ti.ad.grad_replaced function whose ti.ad.grad_for recomputes the grid, on a tape."""
    steps, n, n_grid = MPM_STEPS, MPM_N, MPM_GRID
    dx, inv_dx, dt, p_vol, p_mass = MPM_DX, MPM_INV_DX, MPM_DT, MPM_P_VOL, MPM_P_MASS
    gravity, bound = MPM_GRAVITY, MPM_BOUND
    scalar = lambda: ti.field(dtype=ti.f32)  # noqa: E731 (diffmpm's shorthands)
    vec = lambda: ti.Vector.field(2, dtype=ti.f32)  # noqa: E731
    mat = lambda: ti.Matrix.field(2, 2, dtype=ti.f32)  # noqa: E731
    x, v = vec(), vec()
    grid_v_in, grid_m_in = vec(), scalar()
    grid_v_out = vec()
    C, F = mat(), mat()
    E = scalar()
    loss = scalar()
    init_v = vec()
    ti.root.dense(ti.i, steps).dense(ti.j, n).place(x, v, C, F)
    ti.root.dense(ti.ij, n_grid).place(grid_v_in, grid_m_in, grid_v_out)
    ti.root.dense(ti.i, n).place(init_v)
    ti.root.place(loss, E)
    ti.root.lazy_grad()

    @ti.kernel
    def set_v():
        for p in range(n):
            v[0, p] = init_v[p]
            F[0, p] = ti.Matrix.identity(ti.f32, 2)

    @ti.kernel
    def clear_grid():
        for i, j in grid_m_in:
            grid_v_in[i, j] = [0, 0]
            grid_m_in[i, j] = 0
            grid_v_in.grad[i, j] = [0, 0]
            grid_m_in.grad[i, j] = 0
            grid_v_out.grad[i, j] = [0, 0]

    @ti.kernel
    def p2g(f: ti.i32):
        for p in range(n):
            base = ti.cast(x[f, p] * inv_dx - 0.5, ti.i32)
            fx = x[f, p] * inv_dx - ti.cast(base, ti.i32)
            w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1) ** 2, 0.5 * (fx - 0.5) ** 2]
            new_F = (ti.Matrix.diag(dim=2, val=1) + dt * C[f, p]) @ F[f, p]
            J = (new_F).determinant()
            F[f + 1, p] = new_F
            r, s = ti.polar_decompose(new_F)
            mu, la = E[None] / 2.4, E[None] * 0.2 / 0.48
            cauchy = 2 * mu * (new_F - r) @ new_F.transpose() + ti.Matrix.diag(2, la * (J - 1) * J)
            stress = -(dt * p_vol * 4 * inv_dx * inv_dx) * cauchy
            affine = stress + p_mass * C[f, p]
            for i in ti.static(range(3)):
                for j in ti.static(range(3)):
                    offset = ti.Vector([i, j])
                    dpos = (ti.cast(ti.Vector([i, j]), ti.f32) - fx) * dx
                    weight = w[i][0] * w[j][1]
                    grid_v_in[base + offset] += weight * (p_mass * v[f, p] + affine @ dpos)
                    grid_m_in[base + offset] += weight * p_mass

    @ti.kernel
    def grid_op():
        for i, j in ti.ndrange(n_grid, n_grid):
            inv_m = 1 / (grid_m_in[i, j] + 1e-10)
            v_out = inv_m * grid_v_in[i, j]
            v_out[1] -= dt * gravity
            if i < bound and v_out[0] < 0:
                v_out[0] = 0
            if i > n_grid - bound and v_out[0] > 0:
                v_out[0] = 0
            if j < bound and v_out[1] < 0:
                v_out[1] = 0
            if j > n_grid - bound and v_out[1] > 0:
                v_out[1] = 0
            grid_v_out[i, j] = v_out

    @ti.kernel
    def g2p(f: ti.i32):
        for p in range(n):
            base = ti.cast(x[f, p] * inv_dx - 0.5, ti.i32)
            fx = x[f, p] * inv_dx - ti.cast(base, ti.f32)
            w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1.0) ** 2, 0.5 * (fx - 0.5) ** 2]
            new_v = ti.Vector([0.0, 0.0])
            new_C = ti.Matrix([[0.0, 0.0], [0.0, 0.0]])
            for i in ti.static(range(3)):
                for j in ti.static(range(3)):
                    dpos = ti.cast(ti.Vector([i, j]), ti.f32) - fx
                    g_v = grid_v_out[base[0] + i, base[1] + j]
                    weight = w[i][0] * w[j][1]
                    new_v += weight * g_v
                    new_C += 4 * weight * g_v.outer_product(dpos) * inv_dx
            v[f + 1, p] = new_v
            x[f + 1, p] = x[f, p] + dt * v[f + 1, p]
            C[f + 1, p] = new_C

    @ti.kernel
    def compute_loss():
        for p, q in ti.ndrange(n, n):
            loss[None] += (v[steps - 1, p] - v[steps - 1, q]).norm_sqr()

    def forward():
        set_v()
        for s in range(steps - 1):
            clear_grid()
            p2g(s)
            grid_op()
            g2p(s)
        loss[None] = 0
        compute_loss()
        return loss[None]

    def backward(relaunch):
        clear_particle_grad()
        init_v.grad.fill(0); E.grad[None] = 0
        loss.grad[None] = 1
        compute_loss.grad()
        for s in reversed(range(steps - 1)):
            # the grid is not stored per step: p2g and grid_op run again before their adjoints
            clear_grid()
            p2g(s)
            grid_op()
            if relaunch:  # g2p read grid_v_out, which later steps overwrote: relaunch it on the recomputed grid
                g2p(s)
            g2p.grad(s)
            grid_op.grad()
            p2g.grad(s)
        set_v.grad()

    @ti.kernel
    def clear_particle_grad():
        for f, i in x:
            x.grad[f, i] = [0, 0]
            v.grad[f, i] = [0, 0]
            C.grad[f, i] = [[0, 0], [0, 0]]
            F.grad[f, i] = [[0, 0], [0, 0]]

    rng = np.random.default_rng(1)
    x0 = (0.45 + 0.1 * rng.random((n, 2))).astype(np.float32)
    v0 = rng.standard_normal((n, 2)).astype(np.float32)
    E0 = 2e4
    for i in range(n):
        x[0, i] = x0[i]
    init_v.from_numpy(v0)
    E[None] = E0
    if form == "by_hand":
        assert forward() == pytest.approx(mpm_reference(x0, v0, E0), rel=1e-5)
        with pytest.raises(ti.WgpuAdError, match=r"g2p.grad\(\): kernel 'g2p' read field 'grid_v_out' when it "
                                                 r"ran, and kernel 'grid_op' wrote it since, .* launch g2p again "
                                                 r"right before its .grad\(\) once grid_v_out holds what it read"):
            backward(relaunch=False)
        backward(relaunch=True)
    else:
        @ti.ad.grad_replaced
        def advance(s):
            clear_grid()
            p2g(s)
            grid_op()
            g2p(s)

        @ti.ad.grad_for(advance)
        def advance_grad(s):
            clear_grid()
            p2g(s)
            grid_op()
            g2p.grad(s)
            grid_op.grad()
            p2g.grad(s)

        with ti.ad.Tape(loss=loss):
            set_v()
            for s in range(steps - 1):
                advance(s)
            compute_loss()
        assert loss[None] == pytest.approx(mpm_reference(x0, v0, E0), rel=1e-5)
    ref_x, ref_v, ref_E = central_diffs(lambda a, b, e: mpm_reference(a, b, float(e)), [x0, v0, np.float64(E0)])
    assert_grad(x.grad.to_numpy()[0], ref_x, what="d loss / d x[0]")
    assert_grad(init_v.grad.to_numpy(), ref_v, what="d loss / d init_v")
    assert_grad(E.grad[None], ref_E, what="d loss / d E")


# ---- 2. Smoke: semi-Lagrangian advection with bilinear interpolation, and a pressure projection ---

SMOKE_N, SMOKE_STEPS, SMOKE_JACOBI, SMOKE_DT = 8, 4, 3, 0.6


def smoke_reference(q0, vx0, vy0):
    """The float64 port (vectorised over the grid): returns sum((q_T - target)^2) for the target
    of smoke_target()."""
    n, dt = SMOKE_N, SMOKE_DT
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")

    def sample(f, ii, jj):
        return f[np.clip(ii, 0, n - 1), np.clip(jj, 0, n - 1)]

    def bilerp(f, px, py):
        s, t = px - 0.5, py - 0.5
        fi, fj = np.floor(s), np.floor(t)
        fs, ft = s - fi, t - fj
        ii, jj = fi.astype(int), fj.astype(int)
        a = sample(f, ii, jj) * (1 - fs) + sample(f, ii + 1, jj) * fs
        b = sample(f, ii, jj + 1) * (1 - fs) + sample(f, ii + 1, jj + 1) * fs
        return a * (1 - ft) + b * ft

    q, vx, vy = (np.array(a, np.float64) for a in (q0, vx0, vy0))
    for _ in range(SMOKE_STEPS):
        px, py = i + 0.5 - dt * vx, j + 0.5 - dt * vy
        q, vx, vy = bilerp(q, px, py), bilerp(vx, px, py), bilerp(vy, px, py)
        div = 0.5 * (sample(vx, i + 1, j) - sample(vx, i - 1, j) + sample(vy, i, j + 1) - sample(vy, i, j - 1))
        p = np.zeros_like(q)
        for _ in range(SMOKE_JACOBI):
            p = 0.25 * (sample(p, i + 1, j) + sample(p, i - 1, j) + sample(p, i, j + 1) + sample(p, i, j - 1) - div)
        vx = vx - 0.5 * (sample(p, i + 1, j) - sample(p, i - 1, j))
        vy = vy - 0.5 * (sample(p, i, j + 1) - sample(p, i, j - 1))
    return ((q - smoke_target()) ** 2).sum()


def smoke_target():
    i, j = np.meshgrid(np.arange(SMOKE_N), np.arange(SMOKE_N), indexing="ij")
    return np.exp(-((i - 5.0) ** 2 + (j - 3.0) ** 2) / 4.0)


def test_smoke_gradient_wrt_initial_density_and_velocity():
    n, steps, iters, dt = SMOKE_N, SMOKE_STEPS, SMOKE_JACOBI, SMOKE_DT
    q = ti.field(ti.f32, shape=(steps + 1, n, n), needs_grad=True)
    vx = ti.field(ti.f32, shape=(steps + 1, n, n), needs_grad=True)
    vy = ti.field(ti.f32, shape=(steps + 1, n, n), needs_grad=True)
    vx_a = ti.field(ti.f32, shape=(steps, n, n), needs_grad=True)   # advected, before projection
    vy_a = ti.field(ti.f32, shape=(steps, n, n), needs_grad=True)
    div = ti.field(ti.f32, shape=(steps, n, n), needs_grad=True)
    p = ti.field(ti.f32, shape=(steps, iters + 1, n, n), needs_grad=True)
    target = ti.field(ti.f32, shape=(n, n))
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.func
    def sample(f: ti.template(), t, i, j):
        return f[t, ti.max(0, ti.min(n - 1, i)), ti.max(0, ti.min(n - 1, j))]

    @ti.func
    def bilerp(f: ti.template(), t, px, py):
        s, u = px - 0.5, py - 0.5
        iu, iv = ti.floor(s), ti.floor(u)
        fs, fu = s - iu, u - iv
        i, j = int(iu), int(iv)
        a = sample(f, t, i, j) * (1 - fs) + sample(f, t, i + 1, j) * fs
        b = sample(f, t, i, j + 1) * (1 - fs) + sample(f, t, i + 1, j + 1) * fs
        return a * (1 - fu) + b * fu

    @ti.kernel
    def advect(t: ti.i32):
        for i, j in ti.ndrange(n, n):
            px = i + 0.5 - dt * vx[t, i, j]
            py = j + 0.5 - dt * vy[t, i, j]
            q[t + 1, i, j] = bilerp(q, t, px, py)
            vx_a[t, i, j] = bilerp(vx, t, px, py)
            vy_a[t, i, j] = bilerp(vy, t, px, py)

    @ti.kernel
    def divergence(t: ti.i32):
        for i, j in ti.ndrange(n, n):
            div[t, i, j] = 0.5 * (sample(vx_a, t, i + 1, j) - sample(vx_a, t, i - 1, j)
                                  + sample(vy_a, t, i, j + 1) - sample(vy_a, t, i, j - 1))

    @ti.kernel
    def jacobi(t: ti.i32, k: ti.i32):
        for i, j in ti.ndrange(n, n):
            s = p[t, k, ti.min(i + 1, n - 1), j] + p[t, k, ti.max(i - 1, 0), j]
            s += p[t, k, i, ti.min(j + 1, n - 1)] + p[t, k, i, ti.max(j - 1, 0)]
            p[t, k + 1, i, j] = 0.25 * (s - div[t, i, j])

    @ti.kernel
    def project(t: ti.i32):
        for i, j in ti.ndrange(n, n):
            pl, pr = p[t, iters, ti.max(i - 1, 0), j], p[t, iters, ti.min(i + 1, n - 1), j]
            pb, pt = p[t, iters, i, ti.max(j - 1, 0)], p[t, iters, i, ti.min(j + 1, n - 1)]
            vx[t + 1, i, j] = vx_a[t, i, j] - 0.5 * (pr - pl)
            vy[t + 1, i, j] = vy_a[t, i, j] - 0.5 * (pt - pb)

    @ti.kernel
    def compute_loss():
        for i, j in target:
            loss[None] += (q[steps, i, j] - target[i, j]) ** 2

    rng = np.random.default_rng(2)
    q0 = rng.random((n, n)).astype(np.float32)
    vx0 = rng.uniform(-1.5, 1.5, (n, n)).astype(np.float32)
    vy0 = rng.uniform(-1.5, 1.5, (n, n)).astype(np.float32)
    for f, a in ((q, q0), (vx, vx0), (vy, vy0)):
        full = np.zeros((steps + 1, n, n), np.float32)
        full[0] = a
        f.from_numpy(full)
    target.from_numpy(smoke_target().astype(np.float32))
    with ti.ad.Tape(loss=loss):
        for t in range(steps):
            advect(t)
            divergence(t)
            for k in range(iters):
                jacobi(t, k)
            project(t)
        compute_loss()

    assert loss[None] == pytest.approx(smoke_reference(q0, vx0, vy0), rel=1e-5)
    refs = central_diffs(smoke_reference, [q0, vx0, vy0])
    for f, ref in zip((q, vx, vy), refs):
        assert_grad(f.grad.to_numpy()[0], ref, what=f"d loss / d {f.name}[0]")


# ---- 3. Billiards: impacts with time of impact, branches on distance and approach ---------------

BALL_N, BALL_STEPS, BALL_DT, BALL_R, BALL_E = 4, 36, 0.01, 0.03, 0.8
BALL_GOAL = np.array([0.9, 0.75])
BALL_REST = np.array([[0.5, 0.52], [0.58, 0.48], [0.58, 0.57]])   # the balls the cue ball hits


def billiards_reference(x0, v0, margins=None):
    """The float64 port: the cue ball starts at x0 with velocity v0; returns the squared distance
    of ball 2 to the goal at the end. `margins` (a list) collects |dist - 2r| of every pair at
    every step and |approach speed| of every contact, to show the inputs are away from switches."""
    n, dt, r = BALL_N, BALL_DT, BALL_R
    x = np.concatenate([np.asarray(x0, np.float64)[None], BALL_REST])
    v = np.zeros((n, 2))
    v[0] = v0
    for _ in range(BALL_STEPS):
        imp, x_inc = np.zeros((n, 2)), np.zeros((n, 2))
        for i in range(n):
            for j in range(n):
                if i == j:
                    continue
                d = x[i] + dt * v[i] - (x[j] + dt * v[j])
                dn = np.sqrt((d ** 2).sum())
                if margins is not None:
                    margins.append(abs(dn - 2 * r))
                if dn < 2 * r:
                    direction = d / dn
                    proj = direction @ (v[i] - v[j])
                    if margins is not None:
                        margins.append(abs(proj))
                    if proj < 0:
                        im = -(1 + BALL_E) * 0.5 * proj * direction
                        toi = (dn - 2 * r) / min(-1e-3, proj)
                        imp[i] += im
                        x_inc[i] += min(toi - dt, 0.0) * im
        v = v + imp
        x = x + dt * v + x_inc
    return ((x[2] - BALL_GOAL) ** 2).sum()


@pytest.mark.parametrize("pairs", ["ordered", "once"])
def test_billiards_gradient_wrt_the_cue_ball(pairs):
    n, steps, dt, radius, elasticity = BALL_N, BALL_STEPS, BALL_DT, BALL_R, BALL_E
    x = ti.Vector.field(2, ti.f32, shape=(steps + 1, n), needs_grad=True)
    v = ti.Vector.field(2, ti.f32, shape=(steps + 1, n), needs_grad=True)
    impulse = ti.Vector.field(2, ti.f32, shape=(steps + 1, n), needs_grad=True)
    x_inc = ti.Vector.field(2, ti.f32, shape=(steps + 1, n), needs_grad=True)
    init_x = ti.Vector.field(2, ti.f32, shape=(), needs_grad=True)
    init_v = ti.Vector.field(2, ti.f32, shape=(), needs_grad=True)
    goal = ti.Vector([0.9, 0.75])
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def initialize():
        x[0, 0] = init_x[None]
        v[0, 0] = init_v[None]

    if pairs == "ordered":  # every ball looks at every other: each thread writes its own ball
        @ti.kernel
        def collide(t: ti.i32):
            for i in range(n):
                for j in range(n):
                    if i != j:
                        dist = (x[t, i] + dt * v[t, i]) - (x[t, j] + dt * v[t, j])
                        dist_norm = dist.norm()
                        if dist_norm < 2 * radius:
                            direction = dist / dist_norm
                            projected_v = direction.dot(v[t, i] - v[t, j])
                            if projected_v < 0:
                                imp = -(1 + elasticity) * 0.5 * projected_v * direction
                                toi = (dist_norm - 2 * radius) / ti.min(-1e-3, projected_v)
                                impulse[t + 1, i] += imp
                                x_inc[t + 1, i] += ti.min(toi - dt, 0.0) * imp
    else:  # each pair once, equal and opposite: threads add into other balls' elements (atomics)
        @ti.kernel
        def collide(t: ti.i32):
            for i in range(n):
                for j in range(i):
                    dist = (x[t, i] + dt * v[t, i]) - (x[t, j] + dt * v[t, j])
                    dist_norm = dist.norm()
                    if dist_norm < 2 * radius:
                        direction = dist / dist_norm
                        projected_v = direction.dot(v[t, i] - v[t, j])
                        if projected_v < 0:
                            imp = -(1 + elasticity) * 0.5 * projected_v * direction
                            toi = (dist_norm - 2 * radius) / ti.min(-1e-3, projected_v)
                            ti.atomic_add(impulse[t + 1, i], imp)
                            ti.atomic_sub(impulse[t + 1, j], imp)
                            x_inc[t + 1, i] += ti.min(toi - dt, 0.0) * imp
                            x_inc[t + 1, j] -= ti.min(toi - dt, 0.0) * imp

    @ti.kernel
    def advance(t: ti.i32):
        for i in range(n):
            v[t + 1, i] = v[t, i] + impulse[t + 1, i]
            x[t + 1, i] = x[t, i] + dt * v[t + 1, i] + x_inc[t + 1, i]

    @ti.kernel
    def compute_loss():
        loss[None] = (x[steps, 2] - goal).norm_sqr()

    x0, v0 = np.array([0.2, 0.5]), np.array([2.1, 0.05])
    xs = np.zeros((steps + 1, n, 2), np.float32)
    xs[0, 1:] = BALL_REST
    x.from_numpy(xs)
    init_x[None] = x0
    init_v[None] = v0
    with ti.ad.Tape(loss=loss):
        initialize()
        for t in range(steps):
            collide(t)
            advance(t)
        compute_loss()

    margins: list = []
    assert loss[None] == pytest.approx(billiards_reference(x0, v0, margins), rel=1e-5)
    assert min(margins) > 1e-3  # no contact starts or ends within central differences' reach
    assert np.abs(x_inc.to_numpy()).sum() > 0 and (impulse.to_numpy() != 0).any(axis=-1).sum() >= 4  # impacts happened
    ref_x, ref_v = central_diffs(billiards_reference, [x0, v0])
    assert_grad(init_x.grad[None], ref_x, what="d loss / d init_x")
    assert_grad(init_v.grad[None], ref_v, what="d loss / d init_v")


# ---- 4. Electric: charged particles steered by electrodes, pair forces with atomics --------------

EL_N, EL_M, EL_STEPS, EL_DT, EL_EPS = 5, 3, 6, 0.02, 0.01
EL_ELECTRODES = np.array([[0.2, 0.2], [0.8, 0.3], [0.5, 0.9]])
EL_GOALS = np.array([[0.3, 0.6], [0.6, 0.4], [0.5, 0.5], [0.4, 0.3], [0.7, 0.7]])


def electric_reference(x0, q, u):
    """The float64 port: particles at x0 with charges q, electrode strengths u[t, k]; returns
    sum |x_T - goal|^2."""
    x, v = np.array(x0, np.float64), np.zeros((EL_N, 2))
    for t in range(EL_STEPS):
        d = x[:, None] - x[None]                                      # d[i, j] = x_i - x_j
        r2 = (d ** 2).sum(-1) + EL_EPS
        pair = (q[:, None] * q[None] / r2 ** 1.5)[..., None] * d
        f = pair.sum(1) - np.diagonal(pair, axis1=0, axis2=1).T       # j != i
        e = x[:, None] - EL_ELECTRODES[None]
        re2 = (e ** 2).sum(-1) + EL_EPS
        f += ((q[:, None] * u[t][None] / re2 ** 1.5)[..., None] * e).sum(1)
        v = v + EL_DT * f
        x = x + EL_DT * v
    return ((x - EL_GOALS) ** 2).sum()


def test_electric_gradient_wrt_electrodes_charges_and_positions():
    n, m, steps, dt, eps = EL_N, EL_M, EL_STEPS, EL_DT, EL_EPS
    x = ti.Vector.field(2, ti.f32, shape=(steps + 1, n), needs_grad=True)
    v = ti.Vector.field(2, ti.f32, shape=(steps + 1, n), needs_grad=True)
    f = ti.Vector.field(2, ti.f32, shape=(steps, n), needs_grad=True)
    q = ti.field(ti.f32, shape=n, needs_grad=True)
    u = ti.field(ti.f32, shape=(steps, m), needs_grad=True)
    electrodes = ti.Vector.field(2, ti.f32, shape=m)
    goals = ti.Vector.field(2, ti.f32, shape=n)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.func
    def coulomb(qa, qb, d):
        return qa * qb * d / (d.norm_sqr() + eps) ** 1.5

    @ti.kernel
    def particle_forces(t: ti.i32):
        for i, j in ti.ndrange(n, n):
            if i < j:  # each pair once; the reaction goes to j by an atomic add
                fij = coulomb(q[i], q[j], x[t, i] - x[t, j])
                f[t, i] += fij
                ti.atomic_add(f[t, j], -fij)

    @ti.kernel
    def electrode_forces(t: ti.i32):
        for i, k in ti.ndrange(n, m):
            ti.atomic_add(f[t, i], coulomb(q[i], u[t, k], x[t, i] - electrodes[k]))

    @ti.kernel
    def advance(t: ti.i32):
        for i in range(n):
            v[t + 1, i] = v[t, i] + dt * f[t, i]
            x[t + 1, i] = x[t, i] + dt * v[t + 1, i]

    @ti.kernel
    def compute_loss():
        for i in range(n):
            loss[None] += (x[steps, i] - goals[i]).norm_sqr()

    rng = np.random.default_rng(4)
    x0 = rng.uniform(0.3, 0.7, (n, 2))
    q0 = rng.uniform(0.5, 1.5, n) * np.array([1, -1, 1, -1, 1])
    u0 = rng.uniform(-2, 2, (steps, m))
    xs = np.zeros((steps + 1, n, 2), np.float32)
    xs[0] = x0
    x.from_numpy(xs)
    q.from_numpy(q0.astype(np.float32))
    u.from_numpy(u0.astype(np.float32))
    electrodes.from_numpy(EL_ELECTRODES.astype(np.float32))
    goals.from_numpy(EL_GOALS.astype(np.float32))
    with ti.ad.Tape(loss=loss):
        for t in range(steps):
            particle_forces(t)
            electrode_forces(t)
            advance(t)
        compute_loss()

    assert loss[None] == pytest.approx(electric_reference(x0, q0, u0), rel=1e-5)
    ref_x, ref_q, ref_u = central_diffs(electric_reference, [x0, q0, u0])
    assert_grad(x.grad.to_numpy()[0], ref_x, what="d loss / d x[0]")
    assert_grad(q.grad.to_numpy(), ref_q, what="d loss / d q")
    assert_grad(u.grad.to_numpy(), ref_u, what="d loss / d u")


# ---- 5. Wave equation: a 2-D stencil from a learned initial condition ---------------------------

WAVE_N, WAVE_STEPS, WAVE_C2, WAVE_ALPHA = 10, 12, 0.2, 0.05   # WAVE_C2: (c dt / dx)^2


def wave_target():
    i, j = np.meshgrid(np.arange(WAVE_N), np.arange(WAVE_N), indexing="ij")
    return 0.3 * np.sin(0.7 * i) * np.cos(0.5 * j)


def wave_reference(init):
    """The float64 port: zero on the border, p[0] = p[1] = init inside; returns the squared
    distance of the final state to the target, inside."""
    prev, cur = np.array(init, np.float64), np.array(init, np.float64)
    for _ in range(WAVE_STEPS):
        new = np.zeros_like(cur)
        lap = cur[2:, 1:-1] + cur[:-2, 1:-1] + cur[1:-1, 2:] + cur[1:-1, :-2] - 4 * cur[1:-1, 1:-1]
        new[1:-1, 1:-1] = (2 * cur[1:-1, 1:-1] + WAVE_C2 * lap - prev[1:-1, 1:-1]
                           - WAVE_ALPHA * (cur[1:-1, 1:-1] - prev[1:-1, 1:-1]))
        prev, cur = cur, new
    return ((cur - wave_target())[1:-1, 1:-1] ** 2).sum()


@pytest.mark.parametrize("form", ["stored", "in_place"])
def test_wave_equation_gradient_wrt_the_initial_condition(form):
    """`stored`: p[t, i, j] for every step on a tape, as DiffTaichi's wave; `in_place`: the three
    time levels in fields rotated every step, differentiated by ti.ad.checkpoint."""
    n, steps, c2, alpha = WAVE_N, WAVE_STEPS, WAVE_C2, WAVE_ALPHA
    initial = ti.field(ti.f32, shape=(n, n), needs_grad=True)
    target = ti.field(ti.f32, shape=(n, n))
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.func
    def laplacian(f: ti.template(), I):
        return (f[I + ti.Vector([1, 0])] + f[I - ti.Vector([1, 0])] + f[I + ti.Vector([0, 1])]
                + f[I - ti.Vector([0, 1])] - 4 * f[I])

    if form == "stored":
        p = ti.field(ti.f32, shape=(steps + 2, n, n), needs_grad=True)

        @ti.kernel
        def init():
            for i, j in initial:
                p[0, i, j] = initial[i, j]
                p[1, i, j] = initial[i, j]

        @ti.kernel
        def fdtd(t: ti.i32):
            for i, j in ti.ndrange((1, n - 1), (1, n - 1)):
                lap = p[t - 1, i + 1, j] + p[t - 1, i - 1, j] + p[t - 1, i, j + 1] + p[t - 1, i, j - 1] \
                    - 4 * p[t - 1, i, j]
                p[t, i, j] = (2 * p[t - 1, i, j] + c2 * lap - p[t - 2, i, j]
                              - alpha * (p[t - 1, i, j] - p[t - 2, i, j]))

        @ti.kernel
        def compute_loss():
            for i, j in ti.ndrange((1, n - 1), (1, n - 1)):
                loss[None] += (p[steps + 1, i, j] - target[i, j]) ** 2

        def run():
            init()
            for t in range(2, steps + 2):
                fdtd(t)
            compute_loss()
    else:
        prev = ti.field(ti.f32, shape=(n, n), needs_grad=True)
        cur = ti.field(ti.f32, shape=(n, n), needs_grad=True)
        new = ti.field(ti.f32, shape=(n, n), needs_grad=True)

        @ti.kernel
        def init():
            for I in ti.grouped(initial):
                prev[I] = initial[I]
                cur[I] = initial[I]

        @ti.kernel
        def fdtd():
            for I in ti.grouped(ti.ndrange((1, n - 1), (1, n - 1))):
                new[I] = 2 * cur[I] + c2 * laplacian(cur, I) - prev[I] - alpha * (cur[I] - prev[I])

        @ti.kernel
        def rotate():
            for I in ti.grouped(new):
                prev[I] = cur[I]
                cur[I] = new[I]

        @ti.kernel
        def compute_loss():
            for i, j in ti.ndrange((1, n - 1), (1, n - 1)):
                loss[None] += (cur[i, j] - target[i, j]) ** 2

        def step(t):
            fdtd()
            rotate()

        def run():
            init()
            ti.ad.checkpoint(step, steps=steps, state=[prev, cur], snapshots=3)
            compute_loss()

    x0 = np.random.default_rng(5).uniform(-0.5, 0.5, (n, n))
    initial.from_numpy(x0.astype(np.float32))
    target.from_numpy(wave_target().astype(np.float32))
    with ti.ad.Tape(loss=loss):
        run()

    assert loss[None] == pytest.approx(wave_reference(x0), rel=1e-5)
    # the border's initial values are read by the first step's stencil: their gradients too
    ref = central_diffs(wave_reference, [x0])[0]
    assert_grad(initial.grad.to_numpy(), ref, what="d loss / d initial")


# ---- 6. A mass-spring robot steered by a small neural network (DiffTaichi's mass_spring shape) ----

MS_OBJECTS = np.array([[0.1, 0.105], [0.2, 0.105], [0.1, 0.2], [0.2, 0.205]])
MS_SPRINGS = np.array([[0, 1], [2, 3], [0, 2], [1, 3], [0, 3], [1, 2]])   # anchor a, anchor b
MS_STEPS, MS_DT, MS_SIN, MS_HIDDEN = 24, 0.004, 2, 4
MS_GROUND, MS_GRAVITY, MS_STIFFNESS, MS_DAMPING, MS_STRENGTH, MS_OMEGA = 0.1, -4.8, 300.0, 15.0, 0.15, 10.0


def mass_spring_reference(w1, b1, w2, b2, margins=None):
    """The float64 port (vectorised over springs and masses): returns -(x-coordinate of the centre
    at the end). `margins` collects how far each ground contact test is from switching."""
    a, b = MS_SPRINGS[:, 0], MS_SPRINGS[:, 1]
    rest = np.linalg.norm(MS_OBJECTS[a] - MS_OBJECTS[b], axis=1)
    x, v = MS_OBJECTS.astype(np.float64), np.zeros((len(MS_OBJECTS), 2))
    for t in range(1, MS_STEPS):
        waves = np.sin(MS_OMEGA * (t - 1) * MS_DT + 2 * np.pi / MS_SIN * np.arange(MS_SIN))
        inputs = np.concatenate([waves, 0.05 * np.concatenate([x - x.mean(0), v], 1).ravel()])
        act = np.tanh(w2 @ np.tanh(w1 @ inputs + b1) + b2)
        d = x[a] - x[b]
        length = np.sqrt((d ** 2).sum(1)) + 1e-4
        imp = (MS_DT * (length - rest * (1.0 + act * MS_STRENGTH)) * MS_STIFFNESS / length)[:, None] * d
        v_inc = np.zeros_like(v)
        np.add.at(v_inc, a, -imp)
        np.add.at(v_inc, b, imp)
        old_v = np.exp(-MS_DT * MS_DAMPING) * v + MS_DT * MS_GRAVITY * np.array([0.0, 1.0]) + v_inc
        new_x = x + MS_DT * old_v
        hit = (new_x[:, 1] < MS_GROUND) & (old_v[:, 1] < -1e-4)
        if margins is not None:
            margins.extend(np.where(old_v[:, 1] < -1e-4, np.abs(new_x[:, 1] - MS_GROUND), np.abs(old_v[:, 1] + 1e-4)))
        toi = np.where(hit, -(x[:, 1] - MS_GROUND) / np.where(hit, old_v[:, 1], 1.0), 0.0)
        v = np.where(hit[:, None], 0.0, old_v)
        x = x + toi[:, None] * old_v + (MS_DT - toi[:, None]) * v
    return -x.mean(0)[0]


def test_mass_spring_robot_controller_gradient_wrt_the_weights():
    n_objects, n_springs = len(MS_OBJECTS), len(MS_SPRINGS)
    steps, dt, n_sin, n_hidden = MS_STEPS, MS_DT, MS_SIN, MS_HIDDEN
    n_input = n_sin + 4 * n_objects
    ground, gravity, stiffness, damping = MS_GROUND, MS_GRAVITY, MS_STIFFNESS, MS_DAMPING
    strength, omega = MS_STRENGTH, MS_OMEGA
    vec = lambda: ti.Vector.field(2, ti.f32)  # noqa: E731
    x, v, v_inc = vec(), vec(), vec()
    center = ti.Vector.field(2, ti.f32, shape=steps, needs_grad=True)
    hidden = ti.field(ti.f32, shape=(steps, n_hidden), needs_grad=True)
    act = ti.field(ti.f32, shape=(steps, n_springs), needs_grad=True)
    weights1 = ti.field(ti.f32, shape=(n_hidden, n_input), needs_grad=True)
    bias1 = ti.field(ti.f32, shape=n_hidden, needs_grad=True)
    weights2 = ti.field(ti.f32, shape=(n_springs, n_hidden), needs_grad=True)
    bias2 = ti.field(ti.f32, shape=n_springs, needs_grad=True)
    anchor_a, anchor_b = ti.field(ti.i32), ti.field(ti.i32)
    rest_length = ti.field(ti.f32)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    ti.root.dense(ti.i, steps).dense(ti.j, n_objects).place(x, v, v_inc)
    ti.root.dense(ti.i, n_springs).place(anchor_a, anchor_b, rest_length)
    ti.root.lazy_grad()

    @ti.kernel
    def compute_center(t: ti.i32):
        for i in range(n_objects):
            center[t] += x[t, i] / n_objects

    @ti.kernel
    def nn1(t: ti.i32):
        for i in range(n_hidden):
            actuation = 0.0
            for j in ti.static(range(n_sin)):
                actuation += weights1[i, j] * ti.sin(omega * t * dt + 2 * np.pi / n_sin * j)
            for j in ti.static(range(n_objects)):
                offset = x[t, j] - center[t]
                actuation += weights1[i, j * 4 + n_sin] * offset[0] * 0.05
                actuation += weights1[i, j * 4 + n_sin + 1] * offset[1] * 0.05
                actuation += weights1[i, j * 4 + n_sin + 2] * v[t, j][0] * 0.05
                actuation += weights1[i, j * 4 + n_sin + 3] * v[t, j][1] * 0.05
            actuation += bias1[i]
            hidden[t, i] = ti.tanh(actuation)

    @ti.kernel
    def nn2(t: ti.i32):
        for i in range(n_springs):
            actuation = 0.0
            for j in ti.static(range(n_hidden)):
                actuation += weights2[i, j] * hidden[t, j]
            act[t, i] = ti.tanh(actuation + bias2[i])

    @ti.kernel
    def apply_spring_force(t: ti.i32):
        for i in range(n_springs):
            a, b = anchor_a[i], anchor_b[i]
            dist = x[t, a] - x[t, b]
            length = dist.norm() + 1e-4
            target_length = rest_length[i] * (1.0 + act[t, i] * strength)
            impulse = dt * (length - target_length) * stiffness / length * dist
            ti.atomic_add(v_inc[t + 1, a], -impulse)
            ti.atomic_add(v_inc[t + 1, b], impulse)

    @ti.kernel
    def advance_toi(t: ti.i32):
        for i in range(n_objects):
            s = ti.exp(-dt * damping)
            old_v = s * v[t - 1, i] + dt * gravity * ti.Vector([0.0, 1.0]) + v_inc[t, i]
            old_x = x[t - 1, i]
            new_x = old_x + dt * old_v
            toi = 0.0
            new_v = old_v
            if new_x[1] < ground and old_v[1] < -1e-4:
                toi = -(old_x[1] - ground) / old_v[1]
                new_v = ti.Vector([0.0, 0.0])
            new_x = old_x + toi * old_v + (dt - toi) * new_v
            v[t, i] = new_v
            x[t, i] = new_x

    @ti.kernel
    def compute_loss(t: ti.i32):
        loss[None] = -center[t][0]

    rng = np.random.default_rng(6)
    w1 = rng.standard_normal((n_hidden, n_input)) * np.sqrt(2 / (n_hidden + n_input)) * 2
    b1 = rng.standard_normal(n_hidden) * 0.1
    w2 = rng.standard_normal((n_springs, n_hidden)) * np.sqrt(2 / (n_springs + n_hidden)) * 3
    b2 = rng.standard_normal(n_springs) * 0.1
    for f, a in ((weights1, w1), (bias1, b1), (weights2, w2), (bias2, b2)):
        f.from_numpy(a.astype(np.float32))
    anchor_a.from_numpy(MS_SPRINGS[:, 0].astype(np.int32))
    anchor_b.from_numpy(MS_SPRINGS[:, 1].astype(np.int32))
    rest = np.linalg.norm(MS_OBJECTS[MS_SPRINGS[:, 0]] - MS_OBJECTS[MS_SPRINGS[:, 1]], axis=1)
    rest_length.from_numpy(rest.astype(np.float32))
    for i, p in enumerate(MS_OBJECTS):
        x[0, i] = p

    with ti.ad.Tape(loss=loss):
        for t in range(1, steps):
            compute_center(t - 1)
            nn1(t - 1)
            nn2(t - 1)
            apply_spring_force(t - 1)
            advance_toi(t)
        compute_center(steps - 1)
        compute_loss(steps - 1)

    margins: list = []
    assert loss[None] == pytest.approx(mass_spring_reference(w1, b1, w2, b2, margins), rel=1e-5)
    assert min(margins) > 1e-5, min(margins)  # every contact test is away from switching
    assert (v.to_numpy()[-1, :2] == 0).all()  # the feet landed: the contact branch runs
    refs = central_diffs(mass_spring_reference, [w1, b1, w2, b2])
    for f, ref in zip((weights1, bias1, weights2, bias2), refs):
        assert_grad(f.grad.to_numpy(), ref, what=f"d loss / d {f.name}")


# ---- 7. Rigid bodies: two boxes joined by an actuated spring, ground contact with friction -------

RB_STEPS, RB_DT, RB_HALF, RB_MASS, RB_E, RB_MU = 20, 0.01, np.array([0.05, 0.03]), 1.0, 0.3, 0.4
RB_GROUND, RB_GRAVITY, RB_K = 0.1, -9.8, 200.0
RB_ANCHOR = np.array([[0.05, 0.03], [-0.05, 0.03]])   # the spring's ends, in each box's frame
RB_CORNERS = np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]]) * RB_HALF
RB_REST = 0.06   # the spring's rest length (times 1 + act[t])


def rigid_reference(x0, r0, v0, act, margins=None, contacts=None):
    """The float64 port: returns |x_T[1] - (0.5, 0.15)|^2 + 0.1 r_T[0]^2. `margins` collects how
    far each contact and friction test is from switching, `contacts` the (step, box, sliding) of
    each contact."""
    inv_m = 1 / RB_MASS
    inv_i = 1 / (RB_MASS * ((2 * RB_HALF) ** 2).sum() / 12)
    x, r, v = np.array(x0, np.float64), np.array(r0, np.float64), np.array(v0, np.float64)
    w = np.zeros(2)

    def rot(a):
        return np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])

    def cross(a, b):
        return a[0] * b[1] - a[1] * b[0]
    rest = RB_REST
    for t in range(RB_STEPS):
        v_inc, w_inc = np.zeros((2, 2)), np.zeros(2)
        for i in range(2):
            for c in RB_CORNERS:
                off = rot(r[i]) @ c
                p = x[i] + off
                pv = v[i] + w[i] * np.array([-off[1], off[0]])
                if margins is not None:
                    margins.append(abs(p[1] - RB_GROUND) if pv[1] < 0 else abs(pv[1]))
                if p[1] < RB_GROUND and pv[1] < 0:
                    rn = cross(off, np.array([0.0, 1.0]))
                    jn = -(1 + RB_E) * pv[1] / (inv_m + inv_i * rn * rn)
                    rt = cross(off, np.array([1.0, 0.0]))
                    jt = -pv[0] / (inv_m + inv_i * rt * rt)
                    if margins is not None:
                        margins.append(abs(abs(jt) - RB_MU * jn))
                        contacts.append((t, i, abs(jt) > RB_MU * jn))
                    jt = min(max(jt, -RB_MU * jn), RB_MU * jn)
                    imp = np.array([jt, jn])
                    v_inc[i] += imp * inv_m
                    w_inc[i] += cross(off, imp) * inv_i
        a0, a1 = x[0] + rot(r[0]) @ RB_ANCHOR[0], x[1] + rot(r[1]) @ RB_ANCHOR[1]
        d = a1 - a0
        length = np.sqrt((d ** 2).sum())
        f = RB_DT * RB_K * (length - rest * (1 + act[t])) * d / length
        for i, (a, s) in enumerate(((a0, 1), (a1, -1))):
            v_inc[i] += s * f * inv_m
            w_inc[i] += cross(a - x[i], s * f) * inv_i
        v = v + v_inc + RB_DT * np.array([0.0, RB_GRAVITY])
        w = w + w_inc
        x = x + RB_DT * v
        r = r + RB_DT * w
    return ((x[1] - [0.5, 0.15]) ** 2).sum() + 0.1 * r[0] ** 2


def test_rigid_bodies_gradient_wrt_initial_state_and_actuation():
    steps, dt, e, mu, ground, gravity, k = RB_STEPS, RB_DT, RB_E, RB_MU, RB_GROUND, RB_GRAVITY, RB_K
    inv_m = 1 / RB_MASS
    inv_i = 1 / (RB_MASS * float(((2 * RB_HALF) ** 2).sum()) / 12)
    hx, hy = (float(h) for h in RB_HALF)
    x = ti.Vector.field(2, ti.f32, shape=(steps + 1, 2), needs_grad=True)
    v = ti.Vector.field(2, ti.f32, shape=(steps + 1, 2), needs_grad=True)
    rotation = ti.field(ti.f32, shape=(steps + 1, 2), needs_grad=True)
    omega = ti.field(ti.f32, shape=(steps + 1, 2), needs_grad=True)
    v_inc = ti.Vector.field(2, ti.f32, shape=(steps + 1, 2), needs_grad=True)
    omega_inc = ti.field(ti.f32, shape=(steps + 1, 2), needs_grad=True)
    act = ti.field(ti.f32, shape=steps, needs_grad=True)
    anchor = ti.Vector.field(2, ti.f32, shape=2)
    rest = ti.field(ti.f32, shape=())
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.func
    def rotation_matrix(r):
        return ti.Matrix([[ti.cos(r), -ti.sin(r)], [ti.sin(r), ti.cos(r)]])

    @ti.func
    def to_world(t, i, rela_x):
        return x[t, i] + rotation_matrix(rotation[t, i]) @ rela_x

    @ti.func
    def apply_impulse(t, i, impulse, location):
        ti.atomic_add(v_inc[t + 1, i], impulse * inv_m)
        ti.atomic_add(omega_inc[t + 1, i], (location - x[t, i]).cross(impulse) * inv_i)

    @ti.kernel
    def collide(t: ti.i32):
        for i in range(2):
            for c in ti.static(range(4)):
                corner = ti.Vector([hx * (1 if c in (1, 2) else -1), hy * (1 if c >= 2 else -1)])
                p = to_world(t, i, corner)
                off = p - x[t, i]
                pv = v[t, i] + omega[t, i] * ti.Vector([-off[1], off[0]])
                if p[1] < ground and pv[1] < 0:
                    rn = off.cross(ti.Vector([0.0, 1.0]))
                    jn = -(1 + e) * pv[1] / (inv_m + inv_i * rn * rn)
                    rt = off.cross(ti.Vector([1.0, 0.0]))
                    jt = ti.math.clamp(-pv[0] / (inv_m + inv_i * rt * rt), -mu * jn, mu * jn)
                    apply_impulse(t, i, ti.Vector([jt, jn]), p)

    @ti.kernel
    def apply_spring_force(t: ti.i32):
        a0, a1 = to_world(t, 0, anchor[0]), to_world(t, 1, anchor[1])
        d = a1 - a0
        length = d.norm()
        f = dt * k * (length - rest[None] * (1 + act[t])) * d / length
        apply_impulse(t, 0, f, a0)
        apply_impulse(t, 1, -f, a1)

    @ti.kernel
    def advance(t: ti.i32):
        for i in range(2):
            v[t + 1, i] = v[t, i] + v_inc[t + 1, i] + dt * ti.Vector([0.0, gravity])
            omega[t + 1, i] = omega[t, i] + omega_inc[t + 1, i]
            x[t + 1, i] = x[t, i] + dt * v[t + 1, i]
            rotation[t + 1, i] = rotation[t, i] + dt * omega[t + 1, i]

    @ti.kernel
    def compute_loss():
        loss[None] = (x[steps, 1] - ti.Vector([0.5, 0.15])).norm_sqr() + 0.1 * rotation[steps, 0] ** 2

    x0 = np.array([[0.3, 0.16], [0.42, 0.14]])
    r0 = np.array([0.3, -0.2])
    v0 = np.array([[0.5, -1.0], [0.2, -0.5]])
    act0 = 0.2 * np.sin(np.arange(steps) * 0.7)
    for f, a in ((x, x0), (v, v0), (rotation, r0)):
        full = np.zeros((steps + 1,) + a.shape, np.float32)
        full[0] = a
        f.from_numpy(full)
    act.from_numpy(act0.astype(np.float32))
    anchor.from_numpy(RB_ANCHOR.astype(np.float32))
    rest[None] = RB_REST
    with ti.ad.Tape(loss=loss):
        for t in range(steps):
            collide(t)
            apply_spring_force(t)
            advance(t)
        compute_loss()

    margins: list = []
    contacts: list = []
    assert loss[None] == pytest.approx(rigid_reference(x0, r0, v0, act0, margins, contacts), rel=1e-5)
    assert min(margins) > 1e-4, min(margins)  # no contact or friction cone switches within reach
    assert len(contacts) >= 4 and {c[2] for c in contacts} == {True, False}  # sticking and sliding
    refs = central_diffs(rigid_reference, [x0, r0, v0, act0])
    for got, ref, what in zip((x.grad.to_numpy()[0], rotation.grad.to_numpy()[0], v.grad.to_numpy()[0],
                               act.grad.to_numpy()), refs, ("x0", "rotation0", "v0", "act")):
        assert_grad(got, ref, what=f"d loss / d {what}")


# ---- 8. Volume rendering (DiffTaichi's tomography): rays marched through a density grid ----------

VR_N, VR_ANGLES, VR_RAYS, VR_SAMPLES = 8, 3, 8, 16


def volume_reference(density):
    """The float64 port: for each angle and ray, the density integrated along the ray with
    bilinear interpolation (zero outside), then the image's squared distance to a target."""
    n = VR_N
    d = np.asarray(density, np.float64)
    img = np.zeros((VR_ANGLES, VR_RAYS))
    for a in range(VR_ANGLES):
        ang = 0.4 + a * np.pi / VR_ANGLES
        direction, normal = np.array([np.cos(ang), np.sin(ang)]), np.array([-np.sin(ang), np.cos(ang)])
        for r in range(VR_RAYS):
            origin = np.array([n / 2, n / 2]) + normal * (r - VR_RAYS / 2 + 0.5) * 0.8 - direction * n * 0.6
            acc = 0.0
            for k in range(VR_SAMPLES):
                p = origin + direction * (k + 0.5) * (1.2 * n / VR_SAMPLES) - 0.5
                i, j = int(np.floor(p[0])), int(np.floor(p[1]))
                fx, fy = p[0] - i, p[1] - j
                for di, dj, w in ((0, 0, (1 - fx) * (1 - fy)), (1, 0, fx * (1 - fy)), (0, 1, (1 - fx) * fy),
                                  (1, 1, fx * fy)):
                    if 0 <= i + di < n and 0 <= j + dj < n:
                        acc += w * d[i + di, j + dj]
            img[a, r] = 1 - np.exp(-acc * 1.2 * n / VR_SAMPLES * 0.1)
    target = 0.3 + 0.2 * np.sin(np.arange(VR_ANGLES * VR_RAYS)).reshape(VR_ANGLES, VR_RAYS)
    return ((img - target) ** 2).sum()


def test_volume_rendering_gradient_wrt_the_density():
    n, n_angles, n_rays, n_samples = VR_N, VR_ANGLES, VR_RAYS, VR_SAMPLES
    density = ti.field(ti.f32, shape=(n, n), needs_grad=True)
    image = ti.field(ti.f32, shape=(n_angles, n_rays), needs_grad=True)
    target = ti.field(ti.f32, shape=(n_angles, n_rays))
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    ds = 1.2 * n / n_samples

    @ti.func
    def sample(i, j):
        v = 0.0
        if 0 <= i < n and 0 <= j < n:
            v = density[i, j]
        return v

    @ti.kernel
    def render():
        for a, r in image:
            ang = 0.4 + a * np.pi / n_angles
            direction = ti.Vector([ti.cos(ang), ti.sin(ang)])
            normal = ti.Vector([-ti.sin(ang), ti.cos(ang)])
            origin = ti.Vector([n / 2, n / 2]) + normal * (r - n_rays / 2 + 0.5) * 0.8 - direction * n * 0.6
            acc = 0.0
            for k in range(n_samples):
                p = origin + direction * (k + 0.5) * ds - 0.5
                ip = ti.floor(p)
                f = p - ip
                i, j = int(ip[0]), int(ip[1])
                acc += (sample(i, j) * (1 - f[0]) * (1 - f[1]) + sample(i + 1, j) * f[0] * (1 - f[1])
                        + sample(i, j + 1) * (1 - f[0]) * f[1] + sample(i + 1, j + 1) * f[0] * f[1])
            image[a, r] = 1 - ti.exp(-acc * ds * 0.1)

    @ti.kernel
    def compute_loss():
        for a, r in image:
            loss[None] += (image[a, r] - target[a, r]) ** 2

    d0 = np.random.default_rng(8).random((n, n))
    density.from_numpy(d0.astype(np.float32))
    target.from_numpy((0.3 + 0.2 * np.sin(np.arange(n_angles * n_rays))).reshape(n_angles, n_rays).astype(np.float32))
    with ti.ad.Tape(loss=loss):
        render()
        compute_loss()

    assert loss[None] == pytest.approx(volume_reference(d0), rel=1e-5)
    ref = central_diffs(volume_reference, [d0])[0]
    assert (np.abs(ref) > 1e-6).all()  # the rays cross every cell
    assert_grad(density.grad.to_numpy(), ref, what="d loss / d density")


# ---- 9. Sphere tracing: a ti.func marching a ray with `return` inside its loop ----------------------

def sphere_trace_reference(r, c, margins=None):
    """The float64 port: sum over 8 rays of (i + 1) * the distance where each meets the circle of
    radius r at c (sphere tracing, stopping within 1e-3). `margins`: each stopping test's distance
    from switching."""
    out = 0.0
    for i in range(8):
        o, t = np.array([-1.0, (i - 3.5) * 0.1]), 0.0
        for _ in range(30):
            s = np.linalg.norm(o + t * np.array([1.0, 0.0]) - c) - r
            if margins is not None:
                margins.append(abs(s - 1e-3))
            if s < 1e-3:
                break
            t += s
        out += t * (i + 1)
    return out


@pytest.mark.parametrize("loop", ["for_return", "while"])
def test_sphere_tracing_gradient_wrt_the_shape(loop):
    n = 8
    radius = ti.field(ti.f32, shape=(), needs_grad=True)
    center = ti.Vector.field(2, ti.f32, shape=(), needs_grad=True)
    depth = ti.field(ti.f32, shape=n, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.func
    def sdf(p):
        return (p - center[None]).norm() - radius[None]

    if loop == "for_return":
        @ti.func
        def march(o, d):
            t = 0.0
            for _ in range(30):
                s = sdf(o + t * d)
                if s < 1e-3:
                    return t
                t += s
            return t
    else:
        @ti.func
        def march(o, d):
            t, k = 0.0, 0
            s = sdf(o)
            while s >= 1e-3 and k < 30:
                t += s
                s = sdf(o + t * d)
                k += 1
            return t

    @ti.kernel
    def render():
        for i in depth:
            depth[i] = march(ti.Vector([-1.0, (i - n / 2 + 0.5) * 0.1]), ti.Vector([1.0, 0.0]))

    @ti.kernel
    def compute_loss():
        for i in depth:
            loss[None] += depth[i] * (i + 1)

    r0, c0 = 0.45, np.array([0.2, 0.03])
    radius[None] = r0
    center[None] = c0
    with ti.ad.Tape(loss):
        render()
        compute_loss()

    margins: list = []
    assert loss[None] == pytest.approx(sphere_trace_reference(r0, c0, margins), rel=1e-5)
    assert min(margins) > 1e-4  # no ray stops one iteration earlier or later within reach
    ref_r, ref_c = central_diffs(lambda r, c: sphere_trace_reference(float(r), c), [np.float64(r0), c0])
    assert_grad(radius.grad[None], ref_r, what="d loss / d radius")
    assert_grad(center.grad[None], ref_c, what="d loss / d center")


# ---- 10. SPH density with a neighbour grid built on the tape (atomic counters, data-dependent reads) --

SPH_N, SPH_G, SPH_CAP, SPH_H, SPH_RHO0 = 24, 4, 16, 0.3, 0.002


def sph_reference(x):
    """The float64 port: sum_i (rho_i - rho0)^2 with rho_i = sum_j max(h^2 - |x_i - x_j|^2, 0)^3
    (every pair: the neighbour grid only finds the pairs within h)."""
    d = np.asarray(x)[:, None] - np.asarray(x)[None]
    rho = (np.maximum(SPH_H ** 2 - (d ** 2).sum(-1), 0) ** 3).sum(1)
    return ((rho - SPH_RHO0) ** 2).sum()


def test_sph_density_with_a_neighbour_grid_gradient_wrt_positions():
    """The grid is built on the tape by a kernel that bins particles with the slot ti.atomic_add
    returns (integers only: nothing to differentiate); the density kernel loops over the particles
    of the 3x3 cells around each particle, reading x[j] at indices read from the grid."""
    n, G, cap, h, rho0 = SPH_N, SPH_G, SPH_CAP, SPH_H, SPH_RHO0
    x = ti.Vector.field(2, ti.f32, shape=n, needs_grad=True)
    rho = ti.field(ti.f32, shape=n, needs_grad=True)
    count = ti.field(ti.i32, shape=(G, G))
    cell_list = ti.field(ti.i32, shape=(G, G, cap))
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.func
    def kernel_w(r2):
        q = ti.max(h * h - r2, 0.0)
        return q * q * q

    @ti.kernel
    def bin_particles():
        for i in x:
            c = ti.cast(x[i] / h, ti.i32)
            k = ti.atomic_add(count[c], 1)
            cell_list[c, k] = i

    @ti.kernel
    def density():
        for i in x:
            c = ti.cast(x[i] / h, ti.i32)
            s = 0.0
            for dc in ti.static(ti.grouped(ti.ndrange((-1, 2), (-1, 2)))):
                cc = c + dc
                if 0 <= cc[0] < G and 0 <= cc[1] < G:
                    for k in range(count[cc]):
                        s += kernel_w((x[i] - x[cell_list[cc, k]]).norm_sqr())
            rho[i] = s

    @ti.kernel
    def compute_loss():
        for i in rho:
            loss[None] += (rho[i] - rho0) ** 2

    x0 = np.random.default_rng(2).uniform(0.05, G * h - 0.05, (n, 2))
    x.from_numpy(x0.astype(np.float32))
    with ti.ad.Tape(loss):
        bin_particles()
        density()
        compute_loss()

    assert count.to_numpy().sum() == n and count.to_numpy().max() <= cap
    assert loss[None] == pytest.approx(sph_reference(x0), rel=1e-5)
    assert_grad(x.grad.to_numpy(), central_diffs(sph_reference, [x0])[0], what="d loss / d x")
