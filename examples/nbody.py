"""N-body gravity, forward only (the autodiff version with forces = -dU/dx comes with ti.ad.Tape).

Runs headless: prints the potential energy every few steps and checks it against NumPy.
    python examples/nbody.py [N] [steps]
"""
import sys

import numpy as np

import wgpu_ad as ti

N = int(sys.argv[1]) if len(sys.argv) > 1 else 256
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 50
dt = 1e-5

ti.init()
x = ti.Vector.field(2, dtype=ti.f32, shape=N)
v = ti.Vector.field(2, dtype=ti.f32, shape=N)
f = ti.Vector.field(2, dtype=ti.f32, shape=N)
U = ti.field(dtype=ti.f32, shape=())


@ti.kernel
def init():
    for i in x:
        x[i] = [ti.random(), ti.random()]
        v[i] = [0.0, 0.0]


@ti.kernel
def compute_U():
    for i, j in ti.ndrange(N, N):
        r = x[i] - x[j]
        U[None] += -1 / r.norm(1e-3)


@ti.kernel
def compute_forces():
    for i in range(N):
        acc = ti.Vector([0.0, 0.0])
        for j in range(N):
            r = x[i] - x[j]
            d = r.norm(1e-3)
            acc += -r / (d * d * d)  # -dU/dx_i of U = sum -1/|r|, both (i, j) and (j, i) terms
        f[i] = 2 * acc


@ti.kernel
def advance():
    for i in x:
        v[i] += dt * f[i]
        x[i] += dt * v[i]


def numpy_energy(p: np.ndarray) -> float:
    d = p[:, None, :].astype(np.float64) - p[None, :, :]
    return float(np.sum(-1 / np.sqrt((d ** 2).sum(-1) + 1e-3)))


def main():
    print(ti.get_runtime())
    init()
    for step in range(STEPS):
        compute_forces()
        advance()
        if step % 10 == 0 or step == STEPS - 1:
            U[None] = 0
            compute_U()
            ref = numpy_energy(x.to_numpy())
            print(f"step {step:4d}  U = {U[None]: .6e}   (NumPy float64: {ref: .6e})")
            assert abs(U[None] - ref) <= 1e-3 * abs(ref), "energy disagrees with NumPy"
    print("ok")


if __name__ == "__main__":
    main()
