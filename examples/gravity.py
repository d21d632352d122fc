"""Autodiff gravity (Taichi's ad_gravity, interactive): the forces are -dU/dx from the tape.

N particles with the softened potential U = sum_ij -1/sqrt(|xi - xj|^2 + 1e-3); every substep runs
`with ti.ad.Tape(U): compute_U()`, which leaves dU/dx in x.grad, then a symplectic Euler step.
The window draws straight from the fields on the GPU (no read-back); the energy drift is printed
every 50 frames.

    python examples/gravity.py [--n 512] [--arrows] [--substeps 10] [--dt 5e-6]
    python examples/gravity.py --headless --frames 10 --out frames      # PNG frames, no display

Keys: p pause, s step (while paused), r reset, ESC quit.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wgpu_ad as ti  # noqa: E402
from _common import add_view_args, adopt_headless, frame_file, resolve_view  # noqa: E402

EPS = 1e-3  # the softening of Taichi's ad_gravity: r.norm(1e-3) = sqrt(|r|^2 + 1e-3)


class Gravity:
    """Fields and kernels of one N-particle system (closures, so N is chosen at run time)."""

    def __init__(self, n: int, dt: float):
        self.n, self.dt = n, dt
        N = n
        x = ti.Vector.field(2, ti.f32, shape=N, needs_grad=True)  # positions, in [0, 1]^2 at start
        v = ti.Vector.field(2, ti.f32, shape=N)
        U = ti.field(ti.f32, shape=(), needs_grad=True)            # potential energy
        arrow = ti.Vector.field(2, ti.f32, shape=N)                # force arrows for drawing
        color = ti.field(ti.u32, shape=N)                          # per-particle RGB by speed
        self.x, self.v, self.U, self.arrow, self.color = x, v, U, arrow, color

        @ti.kernel
        def init():
            for i in x:
                x[i] = [0.2 + 0.6 * ti.random(), 0.2 + 0.6 * ti.random()]
                v[i] = [0.0, 0.0]

        @ti.kernel
        def compute_U():
            for i, j in ti.ndrange(N, N):
                r = x[i] - x[j]
                U[None] += -1 / r.norm(EPS)  # U += -1 / |r|, softened

        @ti.kernel
        def advance(dt: ti.f32):
            for i in x:
                v[i] += dt * -x.grad[i]  # dv/dt = -dU/dx (unit masses)
            for i in x:
                x[i] += dt * v[i]        # dx/dt = v, with the new v: symplectic Euler

        @ti.kernel
        def decorate(arrow_len: ti.f32, f_ref: ti.f32, v_ref: ti.f32):
            for i in x:
                f = -x.grad[i]
                fn = f.norm(1e-12)
                arrow[i] = f / fn * (arrow_len * fn / (fn + f_ref))  # saturating length
                s = ti.min(v[i].norm() / v_ref, 1.0)                 # speed -> blue..orange
                r = ti.cast(80 + 175 * s, ti.u32)
                g = ti.cast(170 + 10 * s, ti.u32)
                b = ti.cast(255 - 200 * s, ti.u32)
                color[i] = (r << 16) | (g << 8) | b

        self.init, self.compute_U, self.advance, self.decorate = init, compute_U, advance, decorate

    def substep(self) -> None:
        with ti.ad.Tape(loss=self.U):
            self.compute_U()  # the tape leaves dU/dx in x.grad
        self.advance(self.dt)

    def energy(self) -> tuple[float, float]:
        """(kinetic, potential) energy now; reads back v and U (only when printing)."""
        self.U.fill(0)
        self.compute_U()  # at the current positions (the tape's U is from before the last advance)
        v = self.v.to_numpy().astype(np.float64)
        return 0.5 * float((v * v).sum()), float(self.U[None])


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=512, help="number of particles (default 512)")
    p.add_argument("--dt", type=float, default=None, help="time step (default 2.5e-3 / n)")
    p.add_argument("--substeps", type=int, default=10, help="substeps per frame (default 10)")
    p.add_argument("--arrows", action="store_true", help="draw the force -dU/dx of each particle")
    p.add_argument("--res", type=int, default=640, help="window size in pixels (default 640)")
    p.add_argument("--seed", type=int, default=0)
    add_view_args(p, default_frames=8)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    headless, frames = resolve_view(args, "gravity")
    ti.init(random_seed=args.seed)
    # Forces grow with N (sum of N pairwise terms) and the orbits shrink: scale dt like 1/N.
    sim = Gravity(args.n, args.dt if args.dt is not None else 2.5e-3 / args.n)
    sim.init()
    gui = ti.GUI(f"Autodiff gravity: N = {args.n}, forces from ti.ad.Tape", res=args.res,
                 background_color=0x0B1D2A, headless=True if headless else None)
    headless, frames = adopt_headless(args, gui.headless, headless, frames)
    e0 = None
    t_last, f_last = time.perf_counter(), 0
    k = u = 0.0
    while gui.running and (frames is None or gui.frame < frames):
        for e in gui.get_events():  # keep the queue short; p / s / r are handled by the viewer
            pass
        if gui.take_reset():
            sim.init()
            e0 = None
        if gui.should_advance():
            for _ in range(args.substeps):
                sim.substep()
        if e0 is None or gui.frame % 50 == 0:
            k, u = sim.energy()
            now = time.perf_counter()
            rate = (gui.frame - f_last) / max(now - t_last, 1e-9)
            t_last, f_last = now, gui.frame
            if e0 is None:
                e0 = k + u
                print(f"frame {gui.frame:5d}  E = K + U = {k:.6e} + {u:.6e}")
            else:
                print(f"frame {gui.frame:5d}  E = K + U = {k:.6e} + {u:.6e}  drift {(k + u - e0) / abs(e0):+.2e}"
                      f"  ({rate:.1f} frames/s, {rate * args.substeps:.0f} tapes/s)")
        sim.decorate(0.03, float(args.n), 1.5 * np.sqrt(args.n))
        gui.circles(sim.x, radius=2.5, color=sim.color)
        if args.arrows:
            gui.arrows(sim.x, sim.arrow, radius=1, color=0xFF8A65)
        gui.show(frame_file(args.out, "gravity", gui.frame) if headless else None)
    if e0 is not None:
        k, u = sim.energy()
        print(f"frame {gui.frame:5d}  E = K + U = {k:.6e} + {u:.6e}  drift {(k + u - e0) / abs(e0):+.2e}")


if __name__ == "__main__":
    main()
