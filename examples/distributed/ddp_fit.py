"""Data-parallel training with torch.distributed: a wgpu_ad kernel inside a DDP model.

The model is a damped oscillator, x(t) = a exp(-c t) cos(w t), evaluated by one @ti.kernel on a
batch of times; wgpu_ad.torch.function makes the kernel a torch autograd function, so its three
parameters (a, c, w) are an ordinary torch Parameter. Each rank is one process with its own
device (ti.init(device=ti.worker_device(rank))), fits its equal shard of the samples, and
DistributedDataParallel all-reduces (averages) the parameter's gradient after each backward pass:
the average of the shards' mean losses is the full batch's mean loss, so every rank takes the
step a one-process run on the full batch takes, and the ranks stay identical.

    python examples/distributed/ddp_fit.py [--world-size 2] [--steps 60] [--time] [--out result.json]

Ranks start with torch.multiprocessing.spawn (a process forked after wgpu_ad used the GPU is
refused) and talk over gloo on 127.0.0.1. Prints each rank's final parameters; --out writes (from
rank 0) every rank's parameters, the full batch's loss at the first and the last step and the
first step's gradient as JSON; --time times the steps after a warm-up.
Needs torch (pip install torch).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

import wgpu_ad as ti
import wgpu_ad.torch

N_SAMPLES = 256                        # the full batch; each of W ranks takes N / W of it
TRUE = (1.5, 0.4, 3.0)                 # a, c, w that made the data
START = (1.0, 0.2, 2.6)                # where the fit starts (near enough for plain descent)
LR = 0.3


@ti.kernel
def oscillator(p: ti.types.ndarray(), t: ti.types.ndarray(), x: ti.types.ndarray()):
    for i in t:
        x[i] = p[0] * ti.exp(-p[1] * t[i]) * ti.cos(p[2] * t[i])


class Oscillator(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.p = torch.nn.Parameter(torch.tensor(START, dtype=torch.float32))
        self.f = wgpu_ad.torch.function(oscillator, outputs={"x": "t"})   # x: shaped like t

    def forward(self, t):
        return self.f(self.p, t)


def data() -> tuple[np.ndarray, np.ndarray]:
    """The full batch, float64: the same on every rank (fixed seed)."""
    rng = np.random.default_rng(0)
    t = np.linspace(0.0, 4.0, N_SAMPLES)
    a, c, w = TRUE
    x = a * np.exp(-c * t) * np.cos(w * t) + 0.02 * rng.standard_normal(N_SAMPLES)
    return t, x


def shard(arr: np.ndarray, rank: int, world: int) -> torch.Tensor:
    n = len(arr) // world
    return torch.tensor(arr[rank * n:(rank + 1) * n], dtype=torch.float32)


def run(rank: int, world: int, port: int, steps: int, timing: bool, out: str | None) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    device = ti.worker_device(rank)            # this rank's own adapter (its index in ti.list_adapters())
    ti.init(device=device)
    torch.manual_seed(0)
    t_all, x_all = data()
    t, x = shard(t_all, rank, world), shard(x_all, rank, world)
    model = DDP(Oscillator())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    first_grad, times = None, []
    for step in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = ((model(t) - x) ** 2).mean()
        loss.backward()                        # DDP averages p.grad over the ranks here
        if first_grad is None:  # this rank's shard loss; the gradient is already the average
            first_grad, first_loss = model.module.p.grad.detach().clone(), loss.item()
        opt.step()
        times.append(time.perf_counter() - t0)
    p = model.module.p.detach()
    # the full batch's loss at the first and the last step: the mean of the shards' mean losses
    full = torch.tensor([first_loss, loss.item()], dtype=torch.float64)
    dist.all_reduce(full)
    full /= world
    allreduce_ms = time_allreduce() if timing else None
    gathered = [torch.zeros(3) for _ in range(world)]
    dist.all_gather(gathered, p.clone())
    print(f"rank {rank} of {world} (adapter {ti.list_adapters()[device]}): a, c, w = "
          f"{p.numpy().round(4).tolist()}", flush=True)
    if rank == 0:
        warm = times[min(5, len(times) - 1):]
        result = {"world_size": world, "steps": steps, "params": [g.tolist() for g in gathered],
                  "first_loss": full[0].item(), "loss": full[1].item(), "first_grad": first_grad.tolist(),
                  "step_ms": 1e3 * float(np.median(warm))}
        if timing:
            print(f"{world} rank(s): {result['step_ms']:.2f} ms per step (median of {len(warm)} after a warm-up); "
                  f"an all-reduce of the 3 gradients alone: {allreduce_ms:.3f} ms")
        if out:
            with open(out, "w") as fh:
                json.dump(result, fh)
    dist.barrier()                             # no rank leaves while another still talks to it
    dist.destroy_process_group()
    ti.reset()


def time_allreduce(reps: int = 200) -> float:
    """The median time of the all-reduce DDP does after each backward pass, alone (3 floats)."""
    g, times = torch.ones(3), []
    for _ in range(reps):
        t0 = time.perf_counter()
        dist.all_reduce(g)
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--time", action="store_true", help="print the median time of a training step")
    ap.add_argument("--out", help="write rank 0's result (every rank's parameters) as JSON here")
    args = ap.parse_args(argv)
    if N_SAMPLES % args.world_size:
        sys.exit(f"--world-size must divide {N_SAMPLES} (equal shards keep the mean of means the full mean)")
    torch.set_num_threads(1)                   # the ranks share the CPU; keep runs comparable
    mp.spawn(run, args=(args.world_size, free_port(), args.steps, args.time, args.out),
             nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
