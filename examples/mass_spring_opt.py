"""Differentiable mass-spring chain: learn the initial velocities that bring the chain's last
mass to a target, by gradient descent through the whole simulation (ti.ad.Tape).

Every step's state is stored (x[t], v[t]), so the gradient kernel of each step reads exactly the
values its forward read. Runs headless:
    python examples/mass_spring_opt.py [iterations]
"""
import sys

import numpy as np

import wgpu_ad as ti

ITERS = int(sys.argv[1]) if len(sys.argv) > 1 else 40
N, STEPS, DT = 8, 100, 0.01
K_SPRING, REST, DAMPING = 60.0, 0.12, 0.99
TARGET = (0.9, 0.6)

ti.init()
x = ti.Vector.field(2, ti.f32, shape=(STEPS + 1, N), needs_grad=True)
v = ti.Vector.field(2, ti.f32, shape=(STEPS + 1, N), needs_grad=True)
loss = ti.field(ti.f32, shape=(), needs_grad=True)


@ti.kernel
def step(t: ti.i32):
    for i in range(N):
        f = ti.Vector([0.0, -9.8])
        for k in ti.static([-1, 1]):
            j = i + k
            if 0 <= j < N:
                d = x[t, j] - x[t, i]
                length = d.norm(1e-6)
                f += K_SPRING * (length - REST) * d / length
        v[t + 1, i] = v[t, i] * DAMPING + DT * f
        x[t + 1, i] = x[t, i] + DT * v[t + 1, i]


@ti.kernel
def compute_loss():
    d = x[STEPS, N - 1] - ti.Vector(TARGET)
    loss[None] = d.dot(d)


def main():
    x0 = np.stack([np.linspace(0.1, 0.1 + REST * (N - 1), N), np.full(N, 0.3)], 1).astype(np.float32)
    x.from_numpy(np.broadcast_to(x0, (STEPS + 1, N, 2)).copy())
    v0 = np.zeros((N, 2), np.float32)
    lr = 0.4
    first = None
    for it in range(ITERS):
        vs = np.zeros((STEPS + 1, N, 2), np.float32)
        vs[0] = v0
        v.from_numpy(vs)
        with ti.ad.Tape(loss):
            for t in range(STEPS):
                step(t)
            compute_loss()
        g = v.grad.to_numpy()[0]
        first = loss[None] if first is None else first
        if it % 5 == 0 or it == ITERS - 1:
            print(f"iter {it:3d}  loss {loss[None]:.6f}  |grad| {np.linalg.norm(g):.4f}")
        v0 = v0 - lr * g
    print(f"loss {first:.6f} -> {loss[None]:.6f} ({first / max(loss[None], 1e-12):.1f}x lower)")


if __name__ == "__main__":
    main()
