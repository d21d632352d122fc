"""A mass-spring cloth falling on a sphere and the ground; drag it with the mouse. With --optimize,
differentiable cloth: learn the initial velocity of every vertex so that the cloth's centre of mass
lands on a target, by gradient descent through the whole simulation: 2000 steps that update the
state in place, differentiated by ti.ad.checkpoint with about log2(2000) copies of the state.

    python examples/cloth.py [--n 32]                  # interactive: LMB drags a vertex, RMB orbits
    python examples/cloth.py --headless --frames 20    # PNG frames in ./frames (automatic without a display)
    python examples/cloth.py --optimize [--iters 30] [--steps 2000]   # loss curve in ./frames/cloth_loss.png

Keys: p pause, s step (while paused), r reset, ESC quit.

The live cloth: one kernel launch is one time step, reading state t and writing state t + 1 of a
ring of two states. The optimised cloth (InPlaceCloth) keeps one state and updates it in place (the
forces into f, then x and v), as a simulator is naturally written. Contacts are written with
ti.select on local values, so each step stays one differentiable expression per vertex.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wgpu_ad as ti  # noqa: E402
from _common import Progress, add_view_args, adopt_headless, frame_file, plot_loss, resolve_view  # noqa: E402

GRAVITY = 9.8
SPHERE_C, SPHERE_R = (0.0, 0.3, 0.0), 0.3   # the ground is the plane y = 0
HEIGHT = 0.8                                # initial height of the horizontal cloth (side 1)
TARGET = (0.6, 0.05, -0.4)                  # where --optimize wants the centre of mass to land
HEADLESS_SECONDS = 1.5                      # headless frames span the fall and the draping over the sphere
# grid offsets of the springs and their relative stiffness: structural, shear, bending
SPRINGS = [((1, 0), 1.0), ((-1, 0), 1.0), ((0, 1), 1.0), ((0, -1), 1.0),
           ((1, 1), 0.5), ((-1, -1), 0.5), ((1, -1), 0.5), ((-1, 1), 0.5),
           ((2, 0), 0.25), ((-2, 0), 0.25), ((0, 2), 0.25), ((0, -2), 0.25)]


def stable_dt(n: int, stiffness: float) -> float:
    """A safe fraction of the explicit stability limit (~ sqrt(spacing / stiffness), unit masses)."""
    return 0.35 * math.sqrt(1.0 / (n - 1) / stiffness)


def _physics(n: int, dt: float, stiffness: float, damping: float, drag: float, friction: float):
    """The physics both cloths share: the springs' grid offsets, and as @ti.func the force of
    spring k on one vertex, the time step and the contacts (the parameters as in Cloth)."""
    q = 1.0 / (n - 1)
    cx, cy, cz, R = *SPHERE_C, SPHERE_R
    decay, slide = math.exp(-drag * dt), math.exp(-friction * dt)
    offs = [o for o, _ in SPRINGS]
    ks = [stiffness * s for _, s in SPRINGS]
    rests = [q * math.hypot(*o) for o in offs]
    cs = [damping * 2.0 * math.sqrt(k / r) for k, r in zip(ks, rests)]

    @ti.func
    def spring(d, dv, k: ti.template()):
        """Spring k's force on a vertex at d = x_i - x_j from its neighbour, dv = v_i - v_j."""
        length = d.norm(1e-12)
        u = d / length
        return -ks[k] * (length / rests[k] - 1.0) * u - cs[k] * dv.dot(u) * u

    @ti.func
    def advance(xi, vi, f):
        """Symplectic Euler with air drag: the new v, then the new x."""
        vn = vi * decay + dt * f
        return xi + dt * vn, vn

    @ti.func
    def collide(xn, vn):
        """Sphere: project onto the surface, drop the inward normal velocity, slow the rest; the
        ground y = 0 the same way."""
        d = xn - ti.Vector([cx, cy, cz])
        dist = d.norm(1e-12)
        nrm = d / dist
        hit = dist < R
        vdn = vn.dot(nrm)
        xn = ti.select(hit, ti.Vector([cx, cy, cz]) + R * nrm, xn)
        vn = ti.select(hit, (vn - vdn * nrm) * slide + ti.max(vdn, 0.0) * nrm, vn)
        low = xn[1] < 0.0
        xn = ti.select(low, ti.Vector([xn[0], 0.0, xn[2]]), xn)
        vn = ti.select(low, ti.Vector([vn[0] * slide, ti.max(vn[1], 0.0), vn[2] * slide]), vn)
        return xn, vn

    return offs, spring, advance, collide


class Cloth:
    """An n x n cloth with `states` stored time steps; ring=True keeps two and alternates them.

    stiffness: force per unit strain of a structural spring; damping: dashpots along the springs
    as a fraction of critical; drag: air, per second; friction: tangential slow-down in contact.
    """

    def __init__(self, n: int, states: int = 2, ring: bool = True, stiffness: float = 2e4,
                 damping: float = 0.1, drag: float = 0.5, friction: float = 8.0, dt: float | None = None):
        if n < 3:
            raise ValueError(f"Cloth(n={n}): the cloth needs at least 3 x 3 vertices")
        self.n, self.states, self.ring = n, states, ring
        self.dt = dt_ = dt if dt is not None else stable_dt(n, stiffness)
        q = 1.0 / (n - 1)
        grad = not ring
        x = ti.Vector.field(3, ti.f32, shape=(states, n, n), needs_grad=grad)
        v = ti.Vector.field(3, ti.f32, shape=(states, n, n), needs_grad=grad)
        v0 = ti.Vector.field(3, ti.f32, shape=(n, n), needs_grad=grad)   # the initial velocity
        verts = ti.Vector.field(3, ti.f32, shape=n * n)                  # what the mesh draws
        normals = ti.Vector.field(3, ti.f32, shape=n * n)
        self.x, self.v, self.v0, self.verts, self.normals = x, v, v0, verts, normals
        self.indices, self.colors = _grid_mesh(n)
        offs, spring, advance, collide = _physics(n, dt_, stiffness, damping, drag, friction)

        @ti.kernel
        def init(t0: ti.i32):
            for a, b in ti.ndrange(n, n):
                x[t0, a, b] = [a * q - 0.5, HEIGHT, b * q - 0.5]
                v[t0, a, b] = v0[a, b]

        @ti.kernel
        def set_v0():  # recorded on the tape, so v0.grad receives the gradient of v[0]
            for a, b in ti.ndrange(n, n):
                v[0, a, b] = v0[a, b]

        @ti.kernel
        def step(t: ti.i32, picked: ti.i32, target: ti.types.vector(3, ti.f32), max_speed: ti.f32):
            for a, b in ti.ndrange(n, n):
                # assigned once: a variable assigned twice (even in a static branch) hides the
                # index from the tape's footprint check
                nxt = (t + 1) % 2 if ti.static(ring) else t + 1
                xi, vi = x[t, a, b], v[t, a, b]
                f = ti.Vector([0.0, -GRAVITY, 0.0])  # unit masses
                for k in ti.static(range(len(offs))):
                    a2, b2 = a + offs[k][0], b + offs[k][1]
                    if 0 <= a2 < n and 0 <= b2 < n:
                        f += spring(xi - x[t, a2, b2], vi - v[t, a2, b2], k)
                xn, vn = advance(xi, vi, f)
                if ti.static(ring):  # the mouse moves the picked vertex to the cursor, at most max_speed
                    dx = target - xi
                    dx *= ti.min(1.0, max_speed * dt_ / dx.norm(1e-12))
                    mine = a * n + b == picked
                    xn = ti.select(mine, xi + dx, xn)
                    vn = ti.select(mine, dx / dt_, vn)
                xn, vn = collide(xn, vn)
                x[nxt, a, b] = xn
                v[nxt, a, b] = vn

        @ti.kernel
        def to_mesh(t: ti.i32):
            for a, b in ti.ndrange(n, n):
                i = a * n + b
                verts[i] = x[t, a, b]
                du = x[t, ti.min(a + 1, n - 1), b] - x[t, ti.max(a - 1, 0), b]
                dv = x[t, a, ti.min(b + 1, n - 1)] - x[t, a, ti.max(b - 1, 0)]
                c = dv.cross(du)
                normals[i] = c / c.norm(1e-20)

        self.init, self.set_v0, self._step, self.to_mesh = init, set_v0, step, to_mesh

    def step(self, t: int, picked: int = -1, target=(0.0, 0.0, 0.0), max_speed: float = 0.0) -> None:
        """One time step from state t (into t + 1, or the other ring slot); vertex `picked`
        (a * n + b, or -1) moves towards `target` at up to max_speed (the mouse)."""
        self._step(t, picked, target, max_speed)


def _grid_mesh(n: int) -> tuple:
    """Triangle indices of the n x n grid and a checker pattern of vertex colours."""
    a, b = np.meshgrid(np.arange(n - 1), np.arange(n - 1), indexing="ij")
    i00 = (a * n + b).ravel()
    quads = np.stack([i00, i00 + n, i00 + 1, i00 + 1, i00 + n, i00 + n + 1], 1)
    indices = ti.field(ti.i32, shape=quads.size)
    indices.from_numpy(quads.ravel().astype(np.int32))
    a, b = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    blk = max(n // 6, 2)  # blocks of a few vertices: per-vertex colours blend across a triangle
    checker = ((a // blk + b // blk) % 2).ravel()[:, None]
    cols = np.where(checker, [0.95, 0.55, 0.25], [0.98, 0.85, 0.55]).astype(np.float32)
    colors = ti.Vector.field(3, ti.f32, shape=n * n)
    colors.from_numpy(cols)
    return indices, colors


def _sphere_mesh(center, radius: float, rings: int = 24, segments: int = 48) -> tuple:
    """A UV sphere (vertices, normals, indices) as fields, slightly inside the collision sphere."""
    th = np.linspace(0, np.pi, rings + 1)[:, None]
    ph = np.linspace(0, 2 * np.pi, segments + 1)[None, :]
    nrm = np.stack([np.sin(th) * np.cos(ph), np.cos(th) * np.ones_like(ph), np.sin(th) * np.sin(ph)], -1)
    nrm = nrm.reshape(-1, 3).astype(np.float32)
    pos = (np.asarray(center, np.float32) + 0.985 * radius * nrm).astype(np.float32)
    r, s = np.meshgrid(np.arange(rings), np.arange(segments), indexing="ij")
    i00 = (r * (segments + 1) + s).ravel()
    idx = np.stack([i00, i00 + 1, i00 + segments + 1, i00 + 1, i00 + segments + 2, i00 + segments + 1], 1)
    return _fields(pos, nrm, idx)


def _ground_mesh(half: float = 1.6, y: float = -0.006) -> tuple:
    """The floor, drawn a little below y = 0 so that the cloth lying on it does not z-fight."""
    pos = np.array([[-half, y, -half], [half, y, -half], [half, y, half], [-half, y, half]], np.float32)
    nrm = np.tile(np.array([[0, 1, 0]], np.float32), (4, 1))
    return _fields(pos, nrm, np.array([0, 2, 1, 0, 3, 2]))


def _fields(pos: np.ndarray, nrm: np.ndarray, idx: np.ndarray) -> tuple:
    p = ti.Vector.field(3, ti.f32, shape=len(pos))
    nm = ti.Vector.field(3, ti.f32, shape=len(nrm))
    ix = ti.field(ti.i32, shape=idx.size)
    p.from_numpy(pos)
    nm.from_numpy(nrm)
    ix.from_numpy(idx.ravel().astype(np.int32))
    return p, nm, ix


# ---- optimisation ---------------------------------------------------------------------------

class InPlaceCloth:
    """The cloth for --optimize, written the natural way: one state (x, v) updated in place by two
    kernels per step (the forces into f, then x and v), the same physics and contacts as Cloth."""

    def __init__(self, n: int, stiffness: float = 2e4, damping: float = 0.1, drag: float = 0.5,
                 friction: float = 8.0, dt: float | None = None):
        if n < 3:
            raise ValueError(f"InPlaceCloth(n={n}): the cloth needs at least 3 x 3 vertices")
        self.n = n
        self.dt = dt_ = dt if dt is not None else stable_dt(n, stiffness)
        q = 1.0 / (n - 1)
        x = ti.Vector.field(3, ti.f32, shape=(n, n), needs_grad=True)
        v = ti.Vector.field(3, ti.f32, shape=(n, n), needs_grad=True)
        f = ti.Vector.field(3, ti.f32, shape=(n, n), needs_grad=True)
        v0 = ti.Vector.field(3, ti.f32, shape=(n, n), needs_grad=True)   # the initial velocity
        verts = ti.Vector.field(3, ti.f32, shape=n * n)
        normals = ti.Vector.field(3, ti.f32, shape=n * n)
        self.x, self.v, self.f, self.v0, self.verts, self.normals = x, v, f, v0, verts, normals
        self.indices, self.colors = _grid_mesh(n)
        offs, spring, advance, collide = _physics(n, dt_, stiffness, damping, drag, friction)

        @ti.kernel
        def init_x():
            for a, b in ti.ndrange(n, n):
                x[a, b] = [a * q - 0.5, HEIGHT, b * q - 0.5]

        @ti.kernel
        def set_v0():  # on the tape, so v0.grad receives the gradient of the initial v
            for a, b in ti.ndrange(n, n):
                v[a, b] = v0[a, b]

        @ti.kernel
        def forces():
            for a, b in ti.ndrange(n, n):
                xi, vi = x[a, b], v[a, b]
                acc = ti.Vector([0.0, -GRAVITY, 0.0])  # unit masses
                for k in ti.static(range(len(offs))):
                    a2, b2 = a + offs[k][0], b + offs[k][1]
                    if 0 <= a2 < n and 0 <= b2 < n:
                        acc += spring(xi - x[a2, b2], vi - v[a2, b2], k)
                f[a, b] = acc

        @ti.kernel
        def integrate():  # x and v in place: each thread reads and overwrites its own vertex
            for a, b in ti.ndrange(n, n):
                xn, vn = collide(*advance(x[a, b], v[a, b], f[a, b]))
                x[a, b] = xn
                v[a, b] = vn

        @ti.kernel
        def to_mesh():
            for a, b in ti.ndrange(n, n):
                i = a * n + b
                verts[i] = x[a, b]
                du = x[ti.min(a + 1, n - 1), b] - x[ti.max(a - 1, 0), b]
                dv = x[a, ti.min(b + 1, n - 1)] - x[a, ti.max(b - 1, 0)]
                c = dv.cross(du)
                normals[i] = c / c.norm(1e-20)

        self.init_x, self.set_v0, self.forces, self.integrate, self._to_mesh = init_x, set_v0, forces, integrate, to_mesh

    def step(self, t: int = 0) -> None:
        """One time step, in place."""
        self.forces()
        self.integrate()

    def to_mesh(self, t: int = 0) -> None:
        self._to_mesh()


class ClothOptimizer:
    """The loss |centre of mass after `steps` steps - target|^2 as a function of the initial
    velocity of every vertex, and its gradient: the steps update (x, v) in place and
    ti.ad.checkpoint differentiates them with about log2(steps) copies of the state."""

    def __init__(self, n: int, steps: int, target=TARGET, schedule: str = "revolve", **cloth_kw):
        self.cloth = c = InPlaceCloth(n, **cloth_kw)
        self.n, self.steps, self.target, self.schedule = n, steps, tuple(float(t) for t in target), schedule
        self.stats = None  # the last forward pass's ti.ad.CheckpointStats
        x = c.x
        com = ti.Vector.field(3, ti.f32, shape=(), needs_grad=True)
        loss = ti.field(ti.f32, shape=(), needs_grad=True)
        self.com, self.loss = com, loss
        inv = 1.0 / (n * n)
        tx, ty, tz = self.target

        @ti.kernel
        def centre():
            for a, b in ti.ndrange(n, n):
                com[None] += inv * x[a, b]

        @ti.kernel
        def compute_loss():
            d = com[None] - ti.Vector([tx, ty, tz])
            loss[None] = d.dot(d)

        self.centre, self.compute_loss = centre, compute_loss

    def stored_bytes(self) -> int:
        """What storing every step would keep instead: steps + 1 copies of x and v."""
        return (self.steps + 1) * (self.cloth.x.nbytes + self.cloth.v.nbytes)

    def forward(self, v0: np.ndarray, grad: bool = True) -> tuple[float, np.ndarray | None]:
        """The loss for initial velocities v0 (n, n, 3), and its gradient dloss/dv0 when grad."""
        c = self.cloth
        c.v0.from_numpy(np.asarray(v0, np.float32))
        c.init_x()
        self.com.fill(0)
        with ti.ad.Tape(loss=self.loss) if grad else contextlib.nullcontext():
            c.set_v0()
            self.stats = ti.ad.checkpoint(c.step, steps=self.steps, state=[c.x, c.v], schedule=self.schedule)
            self.centre()
            self.compute_loss()
        return float(self.loss[None]), (c.v0.grad.to_numpy() if grad else None)


def optimize(n: int = 12, duration: float = 0.6, iters: int = 30, lr: float = 0.2, decay: float = 0.93,
             target=TARGET, steps: int = 2000, stiffness: float = 2e4, progress: bool = True,
             result: dict | None = None, **cloth_kw) -> list[float]:
    """Learn the initial velocity field by Adam (NumPy) on the gradient through `steps` steps of
    `duration` seconds in all; returns the loss of every iteration (before its update). The
    stiffness is lowered where needed to keep the steps stable. `result`, when given, receives the
    optimiser and the final parameters."""
    dt = duration / steps
    stiffness = min(stiffness, (0.35 / dt) ** 2 / (n - 1))  # stable_dt(n, stiffness) >= dt
    opt = ClothOptimizer(n, steps, target, stiffness=stiffness, dt=dt, **cloth_kw)
    p = np.zeros((n, n, 3), np.float32)
    m, s = np.zeros_like(p), np.zeros_like(p)
    b1, b2 = 0.7, 0.999  # little momentum: the loss is nearly quadratic, overshoot only hurts
    history: list[float] = []
    bar = Progress(iters, f"cloth {n}x{n}, {steps} steps in place", enabled=progress)
    for it in range(iters):
        loss, g = opt.forward(p)
        history.append(loss)
        m = b1 * m + (1 - b1) * g
        s = b2 * s + (1 - b2) * g * g
        mh, sh = m / (1 - b1 ** (it + 1)), s / (1 - b2 ** (it + 1))
        p = p - lr * decay ** it * mh / (np.sqrt(sh) + 1e-12)
        bar.update(f"loss {loss:.3e}")
        if not progress:
            print(f"iteration {it:3d}  loss {loss:.4e}", flush=True)
    bar.close()
    if result is not None:
        result.update(optimizer=opt, params=p, steps=steps)
    return history


# ---- drawing and interaction ----------------------------------------------------------------

def _cam_vectors(camera) -> tuple:
    """The camera's current position, look-at point, up vector and vertical fov (degrees)."""
    return (np.asarray(camera.curr_position, np.float64), np.asarray(camera.curr_lookat, np.float64),
            np.asarray(camera.curr_up, np.float64), float(camera.curr_fov))


def cursor_ray(pos, lookat, up, fov_deg: float, aspect: float, cursor) -> np.ndarray:
    """The unit direction from the camera through the cursor ((0, 0) = bottom left)."""
    f = lookat - pos
    f = f / np.linalg.norm(f)
    r = np.cross(f, up)
    r = r / np.linalg.norm(r)
    u = np.cross(r, f)
    th = math.tan(math.radians(fov_deg) / 2)
    d = f + (2 * cursor[0] - 1) * th * aspect * r + (2 * cursor[1] - 1) * th * u
    return d / np.linalg.norm(d)


def pick_vertex(points: np.ndarray, origin, direction, max_dist: float) -> tuple[int, float]:
    """(index, depth along the ray) of the vertex nearest to the ray, or (-1, 0) if none is close."""
    w = points.reshape(-1, 3) - origin
    depth = w @ direction
    perp = np.linalg.norm(w - depth[:, None] * direction, axis=1)
    perp[depth <= 0] = np.inf
    i = int(np.argmin(perp))
    return (i, float(depth[i])) if perp[i] < max_dist else (-1, 0.0)


class ClothView:
    """The 3-D scene of the cloth: the mesh drawn from the cloth's own fields, sphere, ground."""

    def __init__(self, title: str, res: tuple[int, int], headless: bool):
        self.window = ti.ui.Window(title, res=res, vsync=True, headless=True if headless else None)
        self.res, self.headless = res, self.window.headless  # the viewer may go headless by itself
        self.canvas = self.window.get_canvas()
        self.canvas.set_background_color((0.08, 0.10, 0.14))
        self.scene = ti.ui.Scene()
        self.camera = ti.ui.Camera()
        self.camera.position(0.0, 1.25, 2.1)
        self.camera.lookat(0.0, 0.3, 0.0)
        self.camera.up(0.0, 1.0, 0.0)
        self.camera.fov(45.0)
        self.sphere = _sphere_mesh(SPHERE_C, SPHERE_R)
        self.ground = _ground_mesh()

    def draw(self, cloth: Cloth, t: int, marker=None) -> None:
        cloth.to_mesh(t)
        s = self.scene
        s.set_camera(self.camera)
        s.ambient_light((0.35, 0.35, 0.38))
        s.point_light(pos=(1.5, 3.0, 2.0), color=(0.85, 0.85, 0.8))
        s.mesh(self.ground[0], indices=self.ground[2], normals=self.ground[1], color=(0.32, 0.36, 0.40))
        s.mesh(self.sphere[0], indices=self.sphere[2], normals=self.sphere[1], color=(0.35, 0.55, 0.85))
        s.mesh(cloth.verts, indices=cloth.indices, normals=cloth.normals, per_vertex_color=cloth.colors,
               two_sided=True)
        if marker is not None:  # a NumPy point (uploaded), not a field
            s.particles(np.asarray([marker], np.float32), radius=0.025, color=(0.9, 0.15, 0.15))
        self.canvas.scene(s)

    def present(self, out: str | None, prefix: str, i: int) -> None:
        if self.headless:
            self.window.save_image(frame_file(out, prefix, i))
        self.window.show()


class LiveCloth:
    """The interactive cloth: one call of frame() handles the input, steps and draws.

    A left click picks the vertex nearest to the cursor's ray (one read-back of the positions per
    click); while the button is held, that vertex follows the point under the cursor at the depth
    where it was picked (at most max_speed m/s, so a jump of the cursor cannot tear the cloth).
    The right button orbits the camera.
    """

    def __init__(self, n: int, res: tuple[int, int], headless: bool, substeps: int = 0, max_speed: float = 4.0):
        self.cloth = Cloth(n)
        self.substeps = substeps or max(1, round(1 / 60 / self.cloth.dt))
        self.view = ClothView(f"Cloth {n}x{n}: LMB drags, RMB orbits, p/s/r", res, headless)
        self.res, self.max_speed = res, max_speed
        self.cur, self.picked, self.depth, self.target = 0, -1, 0.0, (0.0, 0.0, 0.0)
        self.cloth.init(0)

    def _ray(self, cam) -> np.ndarray:
        return cursor_ray(*cam, self.res[0] / self.res[1], self.view.window.get_cursor_pos())

    def frame(self, advance: bool = True) -> None:
        w, cloth = self.view.window, self.cloth
        cam = _cam_vectors(self.view.camera)
        for e in w.get_events():
            if e.type == ti.ui.PRESS and e.key == ti.ui.LMB:
                xs = cloth.x.to_numpy()[self.cur]  # the only read-back: once per click
                self.picked, self.depth = pick_vertex(xs, cam[0], self._ray(cam), max_dist=0.08)
            elif e.type == ti.ui.RELEASE and e.key == ti.ui.LMB:
                self.picked = -1
        if w.take_reset():
            cloth.init(0)
            self.cur, self.picked = 0, -1
        if self.picked >= 0:
            self.target = tuple(float(c) for c in cam[0] + self.depth * self._ray(cam))
        self.view.camera.track_user_inputs(w, movement_speed=0.03, hold_key=ti.ui.RMB)
        if advance and w.should_advance():
            for _ in range(self.substeps):
                cloth.step(self.cur, self.picked, self.target, self.max_speed)
                self.cur = 1 - self.cur
        self.view.draw(cloth, self.cur, marker=self.target if self.picked >= 0 else None)


def run_live(args, headless: bool, frames: int | None) -> None:
    live = LiveCloth(args.n, (args.res, args.res * 3 // 4), headless, args.substeps)
    headless, frames = adopt_headless(args, live.view.headless, headless, frames)
    if headless and not args.substeps:  # pictures of the whole fall from the start, not 1/60 s apart
        live.substeps = max(1, round(HEADLESS_SECONDS / max(frames - 1, 1) / live.cloth.dt))
    print(f"cloth {args.n}x{args.n}, dt {live.cloth.dt:.2e}, {live.substeps} substeps per frame")
    t0, i = time.perf_counter(), 0
    while live.view.window.running and (frames is None or i < frames):
        live.frame(advance=not (headless and i == 0))  # headless: the first picture is the start
        live.view.present(args.out, "cloth", i)
        i += 1
    ti.sync()
    dt = time.perf_counter() - t0
    print(f"{i} frames in {dt:.1f}s ({i / max(dt, 1e-9):.1f} frames/s)")


def run_optimize(args, headless: bool, frames: int | None) -> list[float]:
    t0 = time.perf_counter()
    result: dict = {}
    history = optimize(args.opt_n, args.duration, args.iters, lr=args.lr, steps=args.steps, progress=False,
                       result=result)
    dt = time.perf_counter() - t0
    opt = result["optimizer"]
    print(f"loss {history[0]:.4e} -> {history[-1]:.4e} ({history[0] / max(history[-1], 1e-30):.0f}x lower) "
          f"in {args.iters} iterations, {dt:.1f}s ({opt.steps} steps of a {args.opt_n}x{args.opt_n} cloth in place)")
    st, stored = opt.stats, opt.stored_bytes()
    print(f"memory kept for the backward pass: {st.snapshots} copies of the state, {st.bytes / 1024:.1f} KiB "
          f"(+ {st.step_bytes / 1024:.1f} KiB for one step), against {stored / 2 ** 20:.2f} MiB to store every step "
          f"({stored / max(st.bytes + st.step_bytes, 1):.0f}x less); {st.recomputed_steps} steps run again")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "cloth_loss.png")
    plot_loss(history, path, "cloth")
    print(f"loss curve: {path}")
    # the learned throw, simulated again (nothing of the optimisation's runs is stored)
    c = opt.cloth
    view = ClothView("Cloth: learned initial velocity (red: the target)", (args.res, args.res * 3 // 4), headless)
    headless, frames = adopt_headless(args, view.headless, headless, frames)
    cycle = frames or 120  # headless: `frames` pictures of the throw; a window replays it in a loop
    i, t = 0, None
    while view.window.running and (frames is None or i < frames):
        want = round((i % cycle) * opt.steps / max(cycle - 1, 1))
        if t is None or want < t:  # (re)start the throw
            c.v0.from_numpy(result["params"])
            c.init_x()
            c.set_v0()
            t = 0
        while t < want:
            c.step(t)
            t += 1
        view.draw(c, t, marker=opt.target)
        view.present(args.out, "cloth_opt", i)
        i += 1
    return history


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=32, help="vertices per side of the live cloth (default 32)")
    p.add_argument("--substeps", type=int, default=0, help="time steps per frame (default: 1/60 s)")
    p.add_argument("--res", type=int, default=800, help="window width in pixels (default 800)")
    p.add_argument("--optimize", action="store_true", help="learn the initial velocity (differentiable cloth)")
    p.add_argument("--iters", type=int, default=30, help="optimisation iterations (default 30)")
    p.add_argument("--opt-n", type=int, default=12, help="vertices per side when optimising (default 12)")
    p.add_argument("--steps", type=int, default=2000, help="time steps when optimising, updated in place and "
                   "differentiated with ti.ad.checkpoint (default 2000)")
    p.add_argument("--duration", type=float, default=0.6, help="simulated seconds when optimising (default 0.6)")
    p.add_argument("--lr", type=float, default=0.2, help="Adam learning rate, m/s (default 0.2)")
    add_view_args(p, default_frames=8)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    headless, frames = resolve_view(args, "cloth")
    ti.init()
    if args.optimize:
        run_optimize(args, headless, frames)
    else:
        run_live(args, headless, frames)


if __name__ == "__main__":
    main()
