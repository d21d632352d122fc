"""Hyperparameter search with Ray Tune and ASHA: each trial fits a simulator by gradient descent.

The simulator is the hanging chain of ray_sweep.py (masses joined by springs, fixed at the top,
pulled down by gravity, damped). A trial learns the spring stiffness k that brings the lowest
mass to a target depth after STEPS steps: each of its iterations runs the steps under
ti.ad.Tape, takes dloss/dk from the tape (the adjoint of all 2 x STEPS launches) and steps k.
The search is over the learning rate; ASHA (asynchronous successive halving) stops the trials
whose loss lags at its rungs, so the bad learning rates cost a few iterations, not all of them.

Every trial is a Ray worker process with its own wgpu_ad device (ti.init(device=
ti.worker_device()) in the trainable: under Ray with GPUs it takes the GPU Ray assigned), and
ti.init(deterministic=True) makes the gradient bitwise reproducible, so a trial's losses are those
of the same trial run serially in this process, bit for bit.

    python examples/distributed/ray_tune_fit.py [--out result.json]

Needs Ray Tune (pip install "wgpu_ad[ray]", which asks for ray[tune]). The trainable is imported
from this file as a module (ray_tune_fit), so that Ray's workers import it, and its kernels, by name.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile

import wgpu_ad as ti

N_MASSES = 16
STEPS = 120
DT = 0.01
GRAVITY = 9.8
DAMPING = 0.5
TARGET = -0.5          # where the lowest mass should end (it starts at 0, at rest)
K_START = 150.0
ITERATIONS = 12
# the search, best first: trials start in this order, and ASHA judges the later ones against the
# earlier ones' losses at its rungs (with a different order it may keep a bad trial a rung longer)
LEARNING_RATES = [4e4, 1e4, 1e3, 1e2]
GRACE, REDUCTION = 2, 2        # ASHA's rungs: iterations 2, 4, 8


@ti.data_oriented
class ChainFit:
    """One trial's simulator and parameter; its fields live as long as the trial."""

    def __init__(self):
        self.x = ti.field(ti.f32, shape=(STEPS + 1, N_MASSES), needs_grad=True)  # every step's positions:
        self.v = ti.field(ti.f32, shape=(STEPS + 1, N_MASSES), needs_grad=True)  # the tape needs them
        self.k = ti.field(ti.f32, shape=(), needs_grad=True)
        self.loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def step(self, t: ti.i32):
        for i in range(N_MASSES):
            up = self.x[t, i - 1] if i > 0 else 0.0              # mass 0 hangs from the fixed top
            f = -self.k[None] * (self.x[t, i] - up) - GRAVITY - DAMPING * self.v[t, i]
            if i < N_MASSES - 1:
                f += -self.k[None] * (self.x[t, i] - self.x[t, i + 1])
            self.v[t + 1, i] = self.v[t, i] + DT * f
            self.x[t + 1, i] = self.x[t, i] + DT * self.v[t + 1, i]

    @ti.kernel
    def compute_loss(self):
        d = self.x[STEPS, N_MASSES - 1] - TARGET
        self.loss[None] = d * d

    def loss_and_grad(self, k: float) -> tuple[float, float]:
        self.k[None] = k
        with ti.ad.Tape(loss=self.loss):
            for t in range(STEPS):
                self.step(t)
            self.compute_loss()
        return float(self.loss[None]), float(self.k.grad[None])


def fit(lr: float, iterations: int, report) -> None:
    """Gradient descent on k; report(dict) after every iteration (Ray Tune's report, or a list's append)."""
    sim = ChainFit()
    k = K_START
    for _ in range(iterations):
        loss, g = sim.loss_and_grad(k)
        k -= lr * g
        report({"loss": loss, "k": k, "grad": g})


def trainable(config: dict) -> None:
    """A Ray Tune trial: its own process and device."""
    from ray import tune

    ti.init(device=ti.worker_device(), deterministic=True)
    fit(config["lr"], ITERATIONS, lambda metrics: tune.report(dict(metrics, pid=os.getpid())))


def tune_search(storage: str) -> dict[float, list[dict]]:
    """Runs the search with ASHA, two trials at a time; returns each learning rate's reports."""
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    import ray_tune_fit  # this file as a module: Ray's workers import the trainable from it by name

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        scheduler = ASHAScheduler(max_t=ITERATIONS, grace_period=GRACE, reduction_factor=REDUCTION)
        tuner = tune.Tuner(
            ray_tune_fit.trainable,
            param_space={"lr": tune.grid_search(LEARNING_RATES)},
            tune_config=tune.TuneConfig(metric="loss", mode="min", scheduler=scheduler, max_concurrent_trials=2),
            run_config=tune.RunConfig(storage_path=storage, name="chain_fit", verbose=0))
        results = tuner.fit()
        out = {}
        for r in results:
            history = r.metrics_dataframe
            out[r.config["lr"]] = [{"loss": float(a), "k": float(b), "grad": float(c), "pid": int(d)}
                                   for a, b, c, d in zip(history["loss"], history["k"], history["grad"],
                                                         history["pid"])]
        return out
    finally:
        ray.shutdown()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="write the trials' and the serial runs' reports as JSON here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as storage:
        trials = tune_search(storage)
    ti.init(deterministic=True)
    serial = {}
    for lr in LEARNING_RATES:        # each trial again, in this process, for as long as Tune ran it
        serial[lr] = []
        fit(lr, len(trials[lr]), serial[lr].append)
    for lr in LEARNING_RATES:
        t = trials[lr]
        same = [a["loss"] for a in t] == [b["loss"] for b in serial[lr]]
        print(f"lr = {lr:8.0f}: {len(t):2d} of {ITERATIONS} iterations, loss {t[0]['loss']:.3e} -> "
              f"{t[-1]['loss']:.3e}, k = {t[-1]['k']:.2f}; the same as the serial run, bit for bit: {same}")
    best = min(LEARNING_RATES, key=lambda lr: trials[lr][-1]["loss"])
    print(f"best learning rate: {best:g}; ASHA stopped {sum(len(trials[lr]) < ITERATIONS for lr in trials)} "
          f"of {len(trials)} trials early")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"trials": {str(k): v for k, v in trials.items()},
                       "serial": {str(k): v for k, v in serial.items()}}, fh)


if __name__ == "__main__":
    main()
