"""The seed programs (../shared/seeds: what Taichi users ran into) on Taichi and on wgpu_ad.

    python -m benchmarks.seeds                          # wgpu_ad
    python -m benchmarks.seeds --system taichi          # Taichi (pip install taichi==1.7.4), arch=ti.cpu
    python -m benchmarks.seeds --system wgpu_ad,taichi  # one column each

Each program is written once against Taichi's API, with `ti` the module under test, and run in a
process of its own (--in-process runs them in this one, with ti.reset() between them), so one crash
does not stop the rest. Every gradient it returns is compared with a float64 NumPy reference
(central differences of the same math written in NumPy: independent of both systems) and the
outcome is one of:

- "correct gradient": every gradient within 1e-3 of the reference, relative to its largest entry;
- "wrong gradient (rel err E)", "NaN gradient", "zero gradient": the program ran silently, or with
  a warning (then "; warns: <its first line>" follows);
- "error: <type>: <first line of the message>";
- "not supported": the system has no such API (Taichi has no ti.ad.checkpoint).

One markdown table row per program. tests/test_seeds.py runs the wgpu_ad column in CI; the Taichi
column of benchmarks/RESULTS.md comes from a run of this script.
"""
import argparse
import importlib
import importlib.metadata
import io
import json
import os
import subprocess
import sys
import traceback
import warnings
from contextlib import redirect_stdout
from dataclasses import dataclass
from typing import Callable

import numpy as np

TOLERANCE = 1e-3  # float32 against float64, relative to the largest reference entry


class NotSupported(Exception):
    """The system has no API for what the program does."""


# ---- float64 references --------------------------------------------------------------------------

def central_diff(f: Callable[[np.ndarray], float], x0, h: float = 1e-6) -> np.ndarray:
    """d f / d x at x0, by float64 central differences, one entry at a time."""
    x0 = np.asarray(x0, dtype=np.float64)
    g = np.zeros_like(x0)
    for idx in np.ndindex(x0.shape):
        e = np.zeros_like(x0)
        e[idx] = h
        g[idx] = (f(x0 + e) - f(x0 - e)) / (2 * h)
    return g


# ---- the programs --------------------------------------------------------------------------------
# Each takes the module (taichi or wgpu_ad, initialised) and returns {name: gradient array}.

TARGET = np.array([0.5, 0.5, 0.5])


def lazy_grad_after_assignment(ti):
    """Seed 000, first program: v[None] assigned before ti.root.lazy_grad()."""
    real = ti.f32
    n = 2
    x, v, x_avg = ti.Vector.field(3, dtype=real), ti.Vector.field(3, dtype=real), ti.Vector.field(3, dtype=real)
    loss = ti.field(dtype=real)
    target = ti.Vector([0.5, 0.5, 0.5])
    ti.root.place(v, loss, x_avg)
    ti.root.dense(ti.i, n).place(x)
    v[None] = [2.0, 1.0, 3.0]            # before lazy_grad: "Gradients of loss are not allocated"
    ti.root.lazy_grad()

    @ti.kernel
    def compute_x_avg():
        for p in x:
            x_avg[None] += 1 / n * x[p]

    @ti.kernel
    def compute_loss():
        dist = x_avg[None] - target
        loss[None] = (dist[0] ** 2 + dist[1] ** 2 + dist[2] ** 2) ** 0.5

    @ti.kernel
    def substep():
        for p in x:
            x[p] += v[None]

    with ti.ad.Tape(loss):
        substep()
        compute_x_avg()
        compute_loss()
    return {"v": v.grad.to_numpy()}


def lazy_grad_after_assignment_ref():
    # x starts at 0, one substep: x[p] = v, x_avg = v, loss = |v - target|
    return {"v": central_diff(lambda v: np.linalg.norm(v - TARGET), [2.0, 1.0, 3.0])}


def assignment_inside_tape(ti):
    """Seed 000, second program: ini_v() with a plain `=` inside the tape. The reference is what the
    user asked for: the gradient with respect to the values ini_v writes, which substep reads."""
    real = ti.f32
    n = 2
    x, v, x_avg = ti.Vector.field(3, dtype=real), ti.Vector.field(3, dtype=real), ti.Vector.field(3, dtype=real)
    loss = ti.field(dtype=real)
    target = ti.Vector([0.5, 0.5, 0.5])
    ti.root.place(loss, x_avg)
    ti.root.dense(ti.i, n).place(x, v)
    ti.root.lazy_grad()

    @ti.kernel
    def ini_v():
        for p in v:
            v[p] = [0.1, 0.2, 0.3]

    @ti.kernel
    def compute_x_avg():
        for p in x:
            x_avg[None] += 1 / n * x[p]

    @ti.kernel
    def compute_loss():
        dist = x_avg[None] - target
        loss[None] = (dist[0] ** 2 + dist[1] ** 2 + dist[2] ** 2) ** 0.5

    @ti.kernel
    def substep():
        for p in x:
            x[p] += v[p]

    with ti.ad.Tape(loss):
        ini_v()                          # "v.grad will become 0!"
        substep()
        compute_x_avg()
        compute_loss()
    return {"v": v.grad.to_numpy()}


def assignment_inside_tape_ref():
    v0 = np.array([[0.1, 0.2, 0.3]] * 2)
    return {"v": central_diff(lambda v: np.linalg.norm(v.mean(axis=0) - TARGET), v0)}


M_VALUES = np.array([1.0, 2.0, 0.0, 4.0])
V_VALUES = np.array([1.0, -3.0, 2.0, 0.5])


def select_division_by_zero(ti):
    """Seed 000, NaN gradients: ti.select(m > 0, v / m, 0.0) with an element m = 0."""
    n = 4
    v = ti.field(ti.f32, shape=n, needs_grad=True)
    m = ti.field(ti.f32, shape=n, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def safe_ratio():
        for i in v:
            loss[None] += ti.select(m[i] > 0, v[i] / m[i], 0.0)

    v.from_numpy(V_VALUES.astype(np.float32))
    m.from_numpy(M_VALUES.astype(np.float32))
    with ti.ad.Tape(loss):
        safe_ratio()
    return {"v": v.grad.to_numpy(), "m": m.grad.to_numpy()}


def select_division_by_zero_ref():
    # analytic: the branch taken is differentiated (at m = 0 the loss does not depend on v or m
    # from the side m > 0, and central differences across the jump would be meaningless)
    pos = M_VALUES > 0
    safe = np.where(pos, M_VALUES, 1.0)
    return {"v": np.where(pos, 1.0 / safe, 0.0), "m": np.where(pos, -V_VALUES / safe ** 2, 0.0)}


EWMA_ROWS, EWMA_COLS = 2, 8
EWMA_DATA = np.random.default_rng(1).random((EWMA_ROWS, EWMA_COLS))


def _ewma_ref_loss(d):
    total = 0.0
    for row in range(d.shape[0]):
        e = d[row, 0]
        for col in range(1, d.shape[1]):
            e = 0.5 * d[row, col] + 0.5 * e
        total += e ** 2
    return total


def ewma_ref():
    return {"data": central_diff(_ewma_ref_loss, EWMA_DATA)}


def _ewma_fields(ti, ewma_shape):
    data = ti.field(ti.f32, shape=(EWMA_ROWS, EWMA_COLS), needs_grad=True)
    ewma = ti.field(ti.f32, shape=ewma_shape, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    data.from_numpy(EWMA_DATA.astype(np.float32))
    return data, ewma, loss


def ewma_assign(ti):
    """Seed 001, form #2: ewma[row] = 0.5 * data[row, col] + 0.5 * ewma[row] in a serial loop."""
    row_num, column_num = EWMA_ROWS, EWMA_COLS
    data, ewma, loss = _ewma_fields(ti, row_num)

    @ti.kernel
    def calc_ewma():
        for row in range(row_num):
            for col in range(column_num):
                if col == 0:
                    ewma[row] = data[row, col]
                else:
                    ewma[row] = 0.5 * data[row, col] + 0.5 * ewma[row]

    @ti.kernel
    def calc_loss():
        for row in range(row_num):
            loss[None] += ewma[row] ** 2

    with ti.ad.Tape(loss):
        calc_ewma()
        calc_loss()
    return {"data": data.grad.to_numpy()}


def ewma_mul_add(ti):
    """Seed 001, form #1: ewma[row] *= 0.5; ewma[row] += 0.5 * data[row, col]."""
    row_num, column_num = EWMA_ROWS, EWMA_COLS
    data, ewma, loss = _ewma_fields(ti, row_num)

    @ti.kernel
    def calc_ewma():
        for row in range(row_num):
            for col in range(column_num):
                if col == 0:
                    ewma[row] = data[row, col]
                else:
                    ewma[row] *= 0.5
                    ewma[row] += 0.5 * data[row, col]

    @ti.kernel
    def calc_loss():
        for row in range(row_num):
            loss[None] += ewma[row] ** 2

    with ti.ad.Tape(loss):
        calc_ewma()
        calc_loss()
    return {"data": data.grad.to_numpy()}


def ewma_explicit_tape(ti):
    """Seed 001, the workaround: every version in its own element, ewma[row, col]."""
    row_num, column_num = EWMA_ROWS, EWMA_COLS
    data, ewma, loss = _ewma_fields(ti, (row_num, column_num))

    @ti.kernel
    def calc_ewma():
        for row in range(row_num):
            for col in range(column_num):
                if col == 0:
                    ewma[row, col] = data[row, col]
                else:
                    ewma[row, col] = 0.5 * data[row, col] + 0.5 * ewma[row, col - 1]

    @ti.kernel
    def calc_loss():
        for row in range(row_num):
            loss[None] += ewma[row, column_num - 1] ** 2

    with ti.ad.Tape(loss):
        calc_ewma()
        calc_loss()
    return {"data": data.grad.to_numpy()}


def ewma_counter(ti):
    """Seed 003: the column chosen by an integer field that the loop increments (calc_ewma_err).
    The seed's calc_loss reads ewma_tape[row_num, ...], one past the end; here the last row."""
    row_num, column_num = EWMA_ROWS, EWMA_COLS
    data_field, ewma_tape, loss = _ewma_fields(ti, (row_num, column_num))
    sample = ti.field(ti.i32, shape=row_num)

    @ti.kernel
    def calc_ewma_err():
        for row in range(row_num):
            for col in range(column_num):
                col_idx = sample[row]
                if col_idx == 0:
                    ewma_tape[row, col_idx] = data_field[row, col_idx]
                else:
                    ewma_tape[row, col_idx] = ewma_tape[row, col_idx - 1] * 0.5 + data_field[row, col_idx] * 0.5
                sample[row] += 1

    @ti.kernel
    def calc_loss():
        for i in range(row_num):
            loss[None] += ewma_tape[i, column_num - 1] ** 2

    with ti.ad.Tape(loss):
        calc_ewma_err()
        calc_loss()
    return {"data": data_field.grad.to_numpy()}


# A damped chain of oscillators stepped in place (docs/checkpointing.md), T launches of each kernel.
SIM_N, SIM_T, SIM_DT = 3, 64, 0.05
SIM_X0 = np.array([0.3, -0.2, 0.5])
SIM_K = 2.0


def _simulation(ti):
    n, dt = SIM_N, SIM_DT
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    v = ti.field(ti.f32, shape=n, needs_grad=True)
    k = ti.field(ti.f32, shape=(), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def update_v():
        for i in v:
            left = 0.0
            if i > 0:
                left = x[i - 1]
            v[i] = v[i] + dt * (k[None] * (left - x[i]) - 0.1 * v[i])

    @ti.kernel
    def update_x():
        for i in x:
            x[i] += dt * v[i]

    @ti.kernel
    def compute_loss():
        for i in x:
            loss[None] += x[i] ** 2

    def step(t):
        update_v()
        update_x()

    x.from_numpy(SIM_X0.astype(np.float32))
    v.fill(0.0)
    k[None] = SIM_K
    return x, v, k, loss, step, compute_loss


def oscillators_in_place(ti):
    """Seeds 000/001: independent damped oscillators, one kernel a step updating each thread's own
    x[i], v[i] in place, 64 launches on one tape."""
    n, dt = SIM_N, SIM_DT
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    v = ti.field(ti.f32, shape=n, needs_grad=True)
    k = ti.field(ti.f32, shape=(), needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def step():
        for i in x:
            v[i] = v[i] + dt * (-k[None] * x[i] - 0.1 * v[i])
            x[i] = x[i] + dt * v[i]

    @ti.kernel
    def compute_loss():
        for i in x:
            loss[None] += x[i] ** 2

    x.from_numpy(SIM_X0.astype(np.float32))
    v.fill(0.0)
    k[None] = SIM_K
    with ti.ad.Tape(loss):
        for _ in range(SIM_T):
            step()
        compute_loss()
    return {"x": x.grad.to_numpy(), "k": np.array([k.grad[None]])}


def _oscillators_ref(x0, kk):
    xs, vs = np.array(x0, dtype=np.float64), np.zeros(SIM_N)
    for _ in range(SIM_T):
        vs = vs + SIM_DT * (-kk * xs - 0.1 * vs)
        xs = xs + SIM_DT * vs
    return (xs ** 2).sum()


def oscillators_ref():
    return {"x": central_diff(lambda x0: _oscillators_ref(x0, SIM_K), SIM_X0),
            "k": central_diff(lambda k: _oscillators_ref(SIM_X0, k[0]), [SIM_K])}


def simulation_in_place(ti):
    """Seeds 000/001: the simulation updating its state in place, two kernels a step, 64 steps on one
    tape (update_x overwrites x, which update_v read)."""
    x, v, k, loss, step, compute_loss = _simulation(ti)
    with ti.ad.Tape(loss):
        for t in range(SIM_T):
            step(t)
        compute_loss()
    return {"x": x.grad.to_numpy(), "k": np.array([k.grad[None]])}


def simulation_checkpointed(ti):
    """Seeds 000/001: the same simulation with segment-wise recomputation (ti.ad.checkpoint)."""
    if not hasattr(ti.ad, "checkpoint"):
        raise NotSupported("ti.ad.checkpoint")
    x, v, k, loss, step, compute_loss = _simulation(ti)
    with ti.ad.Tape(loss):
        ti.ad.checkpoint(step, steps=SIM_T, state=[x, v])
        compute_loss()
    return {"x": x.grad.to_numpy(), "k": np.array([k.grad[None]])}


def _simulate_ref(x0, kk):
    xs, vs = np.array(x0, dtype=np.float64), np.zeros(SIM_N)
    for _ in range(SIM_T):
        left = np.concatenate([[0.0], xs[:-1]])
        vs = vs + SIM_DT * (kk * (left - xs) - 0.1 * vs)
        xs = xs + SIM_DT * vs
    return (xs ** 2).sum()


def simulation_ref():
    return {"x": central_diff(lambda x0: _simulate_ref(x0, SIM_K), SIM_X0),
            "k": central_diff(lambda k: _simulate_ref(SIM_X0, k[0]), [SIM_K])}


def torch_ndarray_function(ti):
    """Seed 002: a kernel with ndarray arguments inside a torch.autograd.Function, as posted (on the
    CPU: x is a leaf's clone instead of .cuda())."""
    try:
        import torch
        import torch.nn as nn
    except ImportError as e:
        raise NotSupported("torch is not installed") from e

    @ti.kernel
    def test_grad(x: ti.types.ndarray(), y: ti.types.ndarray()):
        for i in range(x.shape[0]):
            for j in range(x.shape[1]):
                y[i, j] = 3 * x[i, j]

    class GradTest(nn.Module):
        def __init__(self):
            super().__init__()
            self._test_grad = test_grad

            class _module_function(torch.autograd.Function):
                @staticmethod
                def forward(ctx, x):
                    y = torch.zeros_like(x, requires_grad=True)
                    self._test_grad(x, y)
                    ctx.save_for_backward(x, y)
                    return y

                @staticmethod
                def backward(ctx, dy):
                    x, y = ctx.saved_tensors
                    y.grad = dy
                    self._test_grad.grad(x, y)
                    return x.grad

            self._module_function = _module_function.apply

        def forward(self, x):
            return self._module_function(x.contiguous())

    leaf = torch.ones((20, 30), dtype=torch.float32, requires_grad=True)
    x = leaf.clone()
    y = GradTest()(x)
    loss = nn.L1Loss()(x, y)
    loss.backward()
    return {"x": leaf.grad.numpy()}


def torch_ndarray_function_ref():
    # loss = mean |x - 3 x|, through both paths (x itself and the kernel's y = 3 x)
    return {"x": central_diff(lambda x: np.abs(x - 3 * x).mean(), np.ones((20, 30)))}


@dataclass(frozen=True)
class Seed:
    key: str
    seed: str         # which file of ../shared/seeds
    title: str        # the table's first column
    run: Callable
    reference: Callable


SEEDS = [
    Seed("lazy_grad", "000", "`v[None] = ...` before `ti.root.lazy_grad()`",
         lazy_grad_after_assignment, lazy_grad_after_assignment_ref),
    Seed("assign_in_tape", "000", "plain `=` initialising `v` inside the tape",
         assignment_inside_tape, assignment_inside_tape_ref),
    Seed("select_div0", "000", "`ti.select(m > 0, v / m, 0.0)` at `m = 0`",
         select_division_by_zero, select_division_by_zero_ref),
    Seed("ewma_assign", "001", "recursive EWMA, `ewma[row] = 0.5 * data + 0.5 * ewma[row]`",
         ewma_assign, ewma_ref),
    Seed("ewma_mul_add", "001", "recursive EWMA, `ewma[row] *= 0.5; ewma[row] += ...`",
         ewma_mul_add, ewma_ref),
    Seed("ewma_tape", "001", "EWMA with an explicit tape `ewma[row, col]`",
         ewma_explicit_tape, ewma_ref),
    Seed("ewma_counter", "003", "EWMA indexed by a counter field stepped in the loop",
         ewma_counter, ewma_ref),
    Seed("sim_one_kernel", "000/001", "state updated in place by one kernel, 64 launches on a tape",
         oscillators_in_place, oscillators_ref),
    Seed("sim_in_place", "000/001", "a chain updated in place by two kernels a step, 64 steps on a tape",
         simulation_in_place, simulation_ref),
    Seed("sim_checkpoint", "000/001", "the chain with checkpointing (`ti.ad.checkpoint`)",
         simulation_checkpointed, simulation_ref),
    Seed("torch_function", "002", "ndarray kernel inside a `torch.autograd.Function`",
         torch_ndarray_function, torch_ndarray_function_ref),
]
BY_KEY = {s.key: s for s in SEEDS}
SYSTEMS = ("wgpu_ad", "taichi")


# ---- running and judging -------------------------------------------------------------------------

def init_system(system: str):
    """Import and initialise `system`; Taichi in float32 on its CPU backend, or the one named by
    $SEEDS_TAICHI_ARCH (vulkan)."""
    ti = importlib.import_module(system)
    if system == "taichi":
        arch = getattr(ti, os.environ.get("SEEDS_TAICHI_ARCH", "cpu"))
        ti.init(arch=arch, default_fp=ti.f32, log_level=ti.WARN)
    else:
        ti.init()
    return ti


def first_line(text: str) -> str:
    text = str(text).strip()
    return text.splitlines()[0] if text else ""


def judge(got: dict, ref: dict) -> str:
    worst = 0.0
    for name, r in ref.items():
        g = np.asarray(got[name], dtype=np.float64).reshape(r.shape)
        if not np.all(np.isfinite(g)):
            return "NaN gradient" if np.any(np.isnan(g)) else "infinite gradient"
        scale = max(np.abs(r).max(), 1e-12)
        if np.all(g == 0) and np.abs(r).max() > 0:
            return "zero gradient"
        worst = max(worst, float(np.abs(g - r).max() / scale))
    return "correct gradient" if worst <= TOLERANCE else f"wrong gradient (rel err {worst:.2g})"


def run_one(system: str, key: str, ti=None) -> str:
    """Run one program on `system` (initialised here unless `ti` is given) and judge it."""
    seed = BY_KEY[key]
    try:
        ref = seed.reference()
        if ti is None:
            ti = init_system(system)
        with warnings.catch_warnings(record=True) as caught, redirect_stdout(io.StringIO()):
            warnings.simplefilter("always")
            got = seed.run(ti)
    except NotSupported:
        return "not supported"
    except Exception as e:  # noqa: BLE001 (the outcome being measured)
        return f"error: {type(e).__name__}: {first_line(e)}"
    outcome = judge(got, ref)
    mine = [w for w in caught if w.category.__module__.split(".")[0] == system]
    if mine:
        outcome += f"; warns: {mine[0].category.__name__}: {first_line(mine[0].message)}"
    return outcome


def run_isolated(system: str, key: str, timeout: float = 600) -> str:
    """run_one in a fresh process: a crash or a hang is an outcome too."""
    cmd = [sys.executable, "-m", "benchmarks.seeds", "--system", system, "--one", key]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=root)
    except subprocess.TimeoutExpired:
        return f"error: no result after {timeout:.0f} s"
    for line in reversed(r.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)["outcome"]
    tail = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
    return f"error: the process died ({first_line(tail)})"


def run_in_process(system: str, keys: list[str]) -> dict[str, str]:
    """Every program in this process, the runtime reset between them."""
    out = {}
    for key in keys:
        ti = None
        try:
            ti = init_system(system)
        except Exception as e:  # noqa: BLE001
            out[key] = f"error: {type(e).__name__}: {first_line(e)}"
            continue
        out[key] = run_one(system, key, ti)
        ti.reset()
    return out


def label(system: str) -> str:
    """The column heading: the system, its version, and Taichi's backend."""
    try:
        version = importlib.metadata.version(system)
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    if system == "taichi":
        return f"Taichi {version} ({os.environ.get('SEEDS_TAICHI_ARCH', 'cpu')})"
    return f"{system} {version}"


def table(results: dict[str, dict[str, str]]) -> str:
    systems = list(results)
    lines = ["| seed | program | " + " | ".join(label(s) for s in systems) + " |",
             "|---|---|" + "---|" * len(systems)]
    for seed in SEEDS:
        if all(seed.key in results[s] for s in systems):
            lines.append(f"| {seed.seed} | {seed.title} | " +
                         " | ".join(results[s][seed.key] for s in systems) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--system", default="wgpu_ad",
                   help="wgpu_ad, taichi, or both separated by a comma (default wgpu_ad)")
    p.add_argument("--only", default="", help="comma-separated program keys: " + ", ".join(BY_KEY))
    p.add_argument("--in-process", action="store_true", help="run every program in this process")
    p.add_argument("--taichi-arch", default="cpu", choices=["cpu", "vulkan"],
                   help="Taichi's backend (default cpu)")
    p.add_argument("--one", default="", help=argparse.SUPPRESS)  # a child of run_isolated
    args = p.parse_args(argv)
    systems = [s.strip() for s in args.system.split(",") if s.strip()]
    for s in systems:
        if s not in SYSTEMS:
            p.error(f"--system: {s!r} is not one of {', '.join(SYSTEMS)}")
    if args.one:
        print(json.dumps({"outcome": run_one(systems[0], args.one)}))
        return 0
    os.environ["SEEDS_TAICHI_ARCH"] = args.taichi_arch  # read by init_system, here and in the children
    keys = [k.strip() for k in args.only.split(",") if k.strip()] or list(BY_KEY)
    for k in keys:
        if k not in BY_KEY:
            p.error(f"--only: {k!r} is not one of {', '.join(BY_KEY)}")
    results = {}
    for s in systems:
        if args.in_process:
            results[s] = run_in_process(s, keys)
        else:
            results[s] = {k: run_isolated(s, k) for k in keys}
    print(table(results))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        sys.exit(1)
