"""The benchmark workloads and the cases (sizes) the harness runs.

Each workload module provides, for its parameters `p` (a dict):
  MODES                      what is timed, e.g. ("fwd", "fwd+bwd")
  UNIT                       "ms" (time per run) or "us/launch"
  LOSS, GRAD                 what result() reports, for the printed checks
  inputs(p)                  deterministic NumPy inputs (the same for every system)
  build(ti, p, inp)          the program written once in the Taichi-shaped API: it runs unchanged
                             with `import wgpu_ad as ti` and `import taichi as ti`
  build_wgsl(gpu, p, inp)    the hand-written WGSL version on raw wgpu-py (benchmarks/rawgpu.py)
  reference(p, inp)          (loss, gradient entry) in float64 NumPy
and optionally build_warp(wp, p, inp), build_torch(tt, p, inp) and build_jax(jax, p, inp): the
same program as Warp's, PyTorch's and JAX's users write it (for the array libraries: vectorised
array code, no hand-written kernels); every build returns a Program.

No `from __future__ import annotations` in the workload modules: kernel argument annotations
(`t: ti.i32`) must be evaluated where `ti` is the function parameter, not a module global.
"""

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType


@dataclass
class Program:
    """ops: mode -> a callable doing one timed run (it ends with a sync, so the timer is honest);
    result(): one full run from a clean state, returning (loss, gradient entry or None)."""

    ops: dict[str, Callable[[], None]]
    result: Callable[[], tuple[float, float | None]]


def warp_program(wp, forward: Callable[[], None], loss, grads: tuple, grad_entry: Callable[[], float]) -> Program:
    """The Program of a workload's Warp version (build_warp): "fwd" runs `forward`; "fwd+bwd"
    clears the arrays' gradients `grads` (as ti.ad.Tape clears those it will write), records
    `forward` on a wp.Tape and runs its backward from `loss` (a one-element array); result()
    returns (loss, grad_entry()) after a full run."""

    def fwd():
        forward()
        wp.synchronize()

    def fwd_bwd():
        for a in grads:
            a.grad.zero_()
        tape = wp.Tape()
        with tape:
            forward()
        tape.backward(loss=loss)
        wp.synchronize()

    def result():
        fwd_bwd()
        return float(loss.numpy()[0]), grad_entry()

    return Program({"fwd": fwd, "fwd+bwd": fwd_bwd}, result)


class NotWritten(Exception):
    """The workload has no version for this system (e.g. no Warp program): the case skips it."""


@dataclass
class TorchEnv:
    """What a build_torch gets: torch, the device its tensors live on ("cuda" when torch sees a GPU,
    else "cpu"), and whether this is the torch-compile system (compile() is torch.compile there,
    the identity for eager)."""

    torch: object
    device: str
    compiled: bool

    def compile(self, fn: Callable) -> Callable:
        return self.torch.compile(fn) if self.compiled else fn

    def tensor(self, a, requires_grad: bool = False):
        return self.torch.tensor(a, device=self.device, requires_grad=requires_grad)

    def sync(self) -> None:
        if self.device != "cpu":
            self.torch.cuda.synchronize()


def torch_program(tt: TorchEnv, loss_fn: Callable, args: tuple, leaves: tuple, grad_entry: Callable) -> Program:
    """The Program of a workload's PyTorch version: "fwd" runs loss_fn(*args) under no_grad;
    "fwd+bwd" clears the leaves' gradients and runs loss_fn(*args).backward(); both end with a
    sync on a GPU. result() returns (loss, grad_entry()) after a full run."""
    torch = tt.torch

    def fwd():
        with torch.no_grad():
            loss_fn(*args)
        tt.sync()

    def run():
        for a in leaves:
            a.grad = None
        loss = loss_fn(*args)
        loss.backward()
        tt.sync()
        return loss

    def result():
        return float(run()), grad_entry()

    return Program({"fwd": fwd, "fwd+bwd": run}, result)


def jax_program(jax, loss_fn: Callable, args: tuple, argnums, grad_entry: Callable) -> Program:
    """The Program of a workload's JAX version: "fwd" runs jax.jit(loss_fn), "fwd+bwd"
    jax.jit(jax.value_and_grad(loss_fn, argnums)), each waited for with block_until_ready();
    result() returns (loss, grad_entry(gradients))."""
    f = jax.jit(loss_fn)
    vg = jax.jit(jax.value_and_grad(loss_fn, argnums))

    def fwd():
        f(*args).block_until_ready()

    def fwd_bwd():
        jax.block_until_ready(vg(*args))

    def result():
        loss, grads = vg(*args)
        return float(loss), grad_entry(grads)

    return Program({"fwd": fwd, "fwd+bwd": fwd_bwd}, result)


@dataclass(frozen=True)
class Case:
    workload: str
    params: dict = field(default_factory=dict)
    reps: int = 5
    tol: float = 1e-3          # relative tolerance of loss and gradient entry vs the float64 reference

    @property
    def label(self) -> str:
        shown = {k: v for k, v in self.params.items() if not k.startswith("_")}
        return self.workload + " " + " ".join(f"{k}={v}" for k, v in shown.items())

    def module(self) -> ModuleType:
        return importlib.import_module(f"{__name__}.{self.workload}")


def full_cases() -> list[Case]:
    return [
        Case("gravity", {"N": 1024}, reps=11),
        Case("gravity", {"N": 4096}, reps=7),
        Case("cloth", {"n": 32, "steps": 200}, reps=9),
        Case("cloth", {"n": 64, "steps": 200}, reps=7),
        Case("reduction", {"n": 4_194_304}, reps=11),
        Case("scatter", {"particles": 262_144, "grid": 128}, reps=11),
        Case("scatter", {"particles": 262_144, "grid": 128, "order": "sorted"}, reps=11),
        Case("launch", {"launches": 5000}, reps=11),
    ]


def quick_cases() -> list[Case]:
    """Tiny sizes, one repetition: a smoke test of every workload on every system."""
    return [
        Case("gravity", {"N": 256}, reps=1),
        Case("cloth", {"n": 8, "steps": 20}, reps=1),
        Case("reduction", {"n": 65_536}, reps=1),
        Case("scatter", {"particles": 4096, "grid": 32}, reps=1),
        Case("launch", {"launches": 200}, reps=1),
    ]
