"""A parameter sweep with Ray: two actors, each a process with its own wgpu_ad device.

The simulation is a hanging chain of masses joined by springs (fixed at the top, pulled down by
gravity, damped), integrated with semi-implicit Euler by two @ti.kernel launches a step; the sweep
runs it for several spring stiffnesses and reports where the lowest mass ends. Each actor calls
ti.init(device=ti.worker_device(rank)) in its constructor (under Ray with GPUs, ti.worker_device()
alone takes the GPU Ray assigned), keeps its fields for all its trials, and returns plain floats.
The driver then runs the same sweep in its own process: the results are bitwise equal.

    python examples/distributed/ray_sweep.py [--actors 2] [--out result.json]

Needs Ray (pip install "wgpu_ad[ray]" or pip install ray). The actor class is imported from this
file as a module (ray_sweep), so that Ray's workers import it, and its kernels, by name.
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np

import wgpu_ad as ti

N_MASSES = 32
STEPS = 300
DT = 0.01
GRAVITY = 9.8
DAMPING = 0.5
STIFFNESS = [float(k) for k in np.linspace(50.0, 400.0, 8)]   # the sweep


@ti.data_oriented
class Chain:
    """One worker's simulator: its device and its fields live as long as it does."""

    def __init__(self, rank: int):
        self.device = ti.worker_device(rank)
        ti.init(device=self.device)
        self.x = ti.field(ti.f32, shape=N_MASSES)   # displacement of each mass from its rest place
        self.v = ti.field(ti.f32, shape=N_MASSES)

    @ti.kernel
    def forces(self, k: ti.f32):
        for i in self.x:
            up = self.x[i - 1] if i > 0 else 0.0              # mass 0 hangs from the fixed top
            f = -k * (self.x[i] - up) - GRAVITY - DAMPING * self.v[i]
            if i < N_MASSES - 1:
                f += -k * (self.x[i] - self.x[i + 1])
            self.v[i] += DT * f

    @ti.kernel
    def move(self):
        for i in self.x:
            self.x[i] += DT * self.v[i]

    def run(self, k: float) -> dict:
        self.x.fill(0.0)
        self.v.fill(0.0)
        for _ in range(STEPS):
            self.forces(k)
            self.move()
        return {"k": k, "x": self.x.to_numpy().tolist(), "pid": os.getpid(), "device": self.device}


def sweep_with_ray(n_actors: int) -> list[dict]:
    import ray

    import ray_sweep  # this file as a module: Ray's workers import Chain from it by name

    ray.init(num_cpus=n_actors, include_dashboard=False, log_to_driver=False)
    try:
        actor = ray.remote(num_cpus=1)(ray_sweep.Chain)
        actors = [actor.remote(rank) for rank in range(n_actors)]
        # trial j on actor j mod n: each actor runs its trials one after another
        futures = [actors[j % n_actors].run.remote(k) for j, k in enumerate(STIFFNESS)]
        return ray.get(futures)
    finally:
        ray.shutdown()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--out", help="write the actors' and the serial run's results as JSON here")
    args = ap.parse_args(argv)
    parallel = sweep_with_ray(args.actors)
    chain = Chain(0)                                  # the same sweep, serially, in this process
    serial = [chain.run(k) for k in STIFFNESS]
    for p, s in zip(parallel, serial):
        print(f"k = {p['k']:6.1f}: lowest mass at {p['x'][-1]:+.5f} (actor pid {p['pid']}, adapter "
              f"{p['device']}); serial {s['x'][-1]:+.5f}")
    same = all(p["x"] == s["x"] for p, s in zip(parallel, serial))
    print(f"{len({p['pid'] for p in parallel})} actors; the same as the serial run, bit for bit: {same}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"parallel": parallel, "serial": serial}, fh)


if __name__ == "__main__":
    main()
