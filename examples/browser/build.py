"""Export the browser demo's kernels: autodiff gravity (examples/gravity.py) for a web page.

    python examples/browser/build.py                 # writes examples/browser/export/
    python -m http.server -d examples/browser        # then open http://localhost:8000

The page (index.html, main.js) runs these kernels with wgpu_ad.js: every substep records
`compute_U` on a tape, whose adjoint leaves dU/dx in x.grad, then `advance` moves the particles with
the forces -dU/dx. No Python runs in the browser; `ti.export` writes the WGSL and a manifest.

The fields hold CAPACITY particles; the kernels take the number in use, n, so a click adds one.
tests/test_browser_demo.py runs the same substeps here (Gravity.substep) and in the page.
"""
from __future__ import annotations

import argparse
import os
import sys

import wgpu_ad as ti

HERE = os.path.dirname(os.path.abspath(__file__))
CAPACITY = 2048  # particles the fields hold; the page starts with fewer and adds one per click
EPS = 1e-3       # the softening of Taichi's ad_gravity: r.norm(1e-3) = sqrt(|r|^2 + 1e-3)


class Gravity:
    """The fields and kernels of the demo (closures over the fields, as in examples/gravity.py)."""

    def __init__(self, capacity: int = CAPACITY):
        self.capacity = capacity
        x = ti.Vector.field(2, ti.f32, shape=capacity, needs_grad=True, name="x")  # positions
        v = ti.Vector.field(2, ti.f32, shape=capacity, name="v")                   # velocities
        U = ti.field(ti.f32, shape=(), needs_grad=True, name="U")                  # potential energy
        self.x, self.v, self.U = x, v, U

        @ti.kernel
        def compute_U(n: ti.i32):
            for i, j in ti.ndrange(n, n):
                r = x[i] - x[j]
                U[None] += -1 / r.norm(EPS)  # U += -1 / |r|, softened

        @ti.ad.no_grad  # it reads x.grad: never differentiated itself (and none is exported)
        @ti.kernel
        def advance(n: ti.i32, dt: ti.f32):
            for i in range(n):
                v[i] += dt * -x.grad[i]  # dv/dt = -dU/dx (unit masses)
            for i in range(n):
                x[i] += dt * v[i]        # dx/dt = v, with the new v: symplectic Euler

        @ti.ad.no_grad
        @ti.kernel
        def place(i: ti.i32, px: ti.f32, py: ti.f32, vx: ti.f32, vy: ti.f32):
            x[i] = [px, py]  # a particle added by a click (a drag gives it a velocity)
            v[i] = [vx, vy]

        self.compute_U, self.advance, self.place = compute_U, advance, place

    def substep(self, n: int, dt: float) -> None:
        """One step, as the page runs it: the tape leaves dU/dx in x.grad, then advance."""
        with ti.ad.Tape(loss=self.U):
            self.compute_U(n)
        self.advance(n, dt)

    def export(self, folder: str) -> dict:
        """Write the kernels, their adjoints and wgpu_ad.js into `folder` (ti.export)."""
        return ti.export(folder, [self.compute_U, self.advance, self.place])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.path.join(HERE, "export"), help="folder to write (default: export/ here)")
    p.add_argument("--capacity", type=int, default=CAPACITY, help=f"most particles (default {CAPACITY})")
    args = p.parse_args(argv)
    manifest = Gravity(args.capacity).export(args.out)
    files = sorted(os.listdir(args.out))
    print(f"wrote {len(files)} files to {args.out}: kernels {', '.join(manifest['kernels'])}")
    print(f"serve it: {sys.executable} -m http.server -d {HERE}   (then open http://localhost:8000)")


if __name__ == "__main__":
    main()
