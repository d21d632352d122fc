"""Random in-place simulations differentiated by ti.ad.checkpoint, against float64 NumPy.

Each seeded program is a simulator as a user writes one: a state (s, u) of n elements updated in
place for T steps, a parameter field p, and per step
  * `forces(t)`: f[i] from s[i], u[i], neighbours s[i + o0] and u[i + o1] behind bounds checks,
    p[i] and the step number;
  * `update(t)`: s[i] and u[i] overwritten from their old values, f[i] and p[i] (contracting maps,
    so the values stay O(1) over the steps), sometimes through a serial loop with a mutable local,
    sometimes storing s into a history h[t, i] that the loss reads;
  * sometimes `measure()`: acc[None] += ... of the state, a sum over the steps that no step reads;
then a loss over the final state (and acc, h). The state is two fields, or two ndarrays passed to
the kernels as arguments. Each expression is a random tree of +, -, *, sin, cos,
tanh, x / (1 + x^2), sqrt(1 + x^2) and exp(tanh(x)) over the kernel's locals and constants: smooth
everywhere, so no branch or kink can flip between float32 and float64. The schedule (revolve,
bisect, sqrt, store_all), the number of snapshots, T (1-24), n and the offsets are drawn too.

The same expression text runs as the kernels' bodies and, vectorised, in float64 NumPy (a port
that shares no code with wgpu_ad): the loss is compared with it, and the gradients with respect to
s0, u0 and p with its complex-step derivatives, exact to float64 rounding (after 20 contracting
steps a gradient of 1e-7 on a loss of 1 is below what central differences resolve). CI runs WGPU_AD_FUZZ_CHECKPOINT programs (default 12);
WGPU_AD_FUZZ_CHECKPOINT_SEED=S runs seed S alone, and `python tests/test_fuzz_checkpoint.py S`
prints its program.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest

import wgpu_ad as ti
from ad_util import assert_grad

pytestmark = pytest.mark.gpu

EXAMPLES = int(os.environ.get("WGPU_AD_FUZZ_CHECKPOINT", "12"))
ONLY = os.environ.get("WGPU_AD_FUZZ_CHECKPOINT_SEED")
SCHEDULES = ("revolve", "bisect", "sqrt", "store_all")
UNARY = ("ti.sin({0})", "ti.cos({0})", "ti.tanh({0})", "({0}) / (1.0 + ({0}) * ({0}))",
         "ti.sqrt(1.0 + ({0}) * ({0}))", "ti.exp(ti.tanh({0}))")
BINARY = ("({0}) + ({1})", "({0}) - ({1})", "({0}) * ({1})")


def _expr(rng: np.random.Generator, leaves: list[str], depth: int) -> str:
    if depth == 0 or rng.random() < 0.2:
        if rng.random() < 0.8:
            return str(rng.choice(leaves))
        return f"{rng.uniform(-0.9, 0.9):.3f}"
    if rng.random() < 0.45:
        return str(rng.choice(UNARY)).format(_expr(rng, leaves, depth - 1))
    # a product of two sums can grow: keep one side of every product small (a unary in [-1, 1.5])
    op = str(rng.choice(BINARY))
    left = _expr(rng, leaves, depth - 1)
    right = _expr(rng, leaves, depth - 1)
    if op.startswith("({0}) *"):
        right = f"ti.tanh({right})"
    return op.format(left, right)


def generate(seed: int) -> SimpleNamespace:
    """The program of `seed`: its module source (defining build(ti)) and how to run it."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 8))
    steps = int(rng.integers(1, 25))
    o0, o1 = (int(rng.choice([-2, -1, 1, 2])) for _ in range(2))
    with_acc = bool(rng.random() < 0.5)
    nd = bool(rng.random() < 0.3)        # the state as ndarray arguments instead of fields
    loop = int(rng.choice([0, 0, 2, 3]))  # a serial loop with a mutable local in update
    hist = bool(rng.random() < 0.3)      # every step stores s into hist[t, i], which the loss reads
    e_f = _expr(rng, ["a", "b", "nb0", "nb1", "pi", "tf"], 3)
    e_s = _expr(rng, ["sa", "fi", "pi", "q"], 3)
    e_u = _expr(rng, ["ua", "sa", "fi"], 3)
    e_m = _expr(rng, ["sa", "ua"], 2)
    e_q = _expr(rng, ["q", "sa", "fi"], 2)
    w0, w1, wh = (round(float(rng.uniform(0.2, 1.0)), 3) for _ in range(3))
    # terms every program has, so that the neighbours and the coupling always matter
    c0, c1, c2 = (round(float(rng.uniform(-0.9, 0.9)), 3) for _ in range(3))
    e_f = f"{e_f} + {c0} * ti.tanh(nb0 - a) + {c1} * nb1 * ti.tanh(b)"
    e_s = f"fi + {e_s}"
    e_u = f"{c2} * fi + {e_u}"
    sig, pass_su = ("t: ti.i32, s: ti.types.ndarray(), u: ti.types.ndarray()", "t, s, u") if nd else ("t: ti.i32", "t")
    sig0, pass0 = ("s: ti.types.ndarray(), u: ti.types.ndarray()", "s, u") if nd else ("", "")
    state = ('s = ti.ndarray(ti.f32, N, needs_grad=True)\n    u = ti.ndarray(ti.f32, N, needs_grad=True)' if nd else
             's = ti.field(ti.f32, shape=N, needs_grad=True, name="s")\n    u = ti.field(ti.f32, shape=N, needs_grad=True, '
             'name="u")')
    source = textwrap.dedent(f"""\
        N, STEPS, O0, O1, WITH_ACC, LOOP, HIST = {n}, {steps}, {o0}, {o1}, {with_acc}, {loop}, {hist}


        def build(ti):
            {{state}}
            p = ti.field(ti.f32, shape=N, needs_grad=True, name="p")
            f = ti.field(ti.f32, shape=N, needs_grad=True, name="f")
            h = ti.field(ti.f32, shape=(STEPS, N), needs_grad=True, name="h")
            acc = ti.field(ti.f32, shape=(), needs_grad=True, name="acc")
            loss = ti.field(ti.f32, shape=(), needs_grad=True, name="loss")

            @ti.kernel
            def forces({sig}):
                for i in range(N):
                    a = s[i]
                    b = u[i]
                    pi = p[i]
                    tf = t * 0.05
                    nb0 = 0.0
                    if 0 <= i + O0 < N:
                        nb0 = s[i + O0]
                    nb1 = 0.0
                    if 0 <= i + O1 < N:
                        nb1 = u[i + O1]
                    f[i] = {e_f}

            @ti.kernel
            def update({sig}):
                for i in range(N):
                    sa = s[i]
                    ua = u[i]
                    fi = f[i]
                    pi = p[i]
                    q = fi
                    for _k in range(LOOP):
                        q = 0.5 * q + 0.3 * ti.tanh({e_q})
                    s[i] = 0.5 * sa + 0.25 * ti.tanh({e_s})
                    u[i] = 0.6 * ua + 0.2 * ti.sin({e_u})
                    if ti.static(HIST):
                        h[t, i] = {wh} * s[i]

            @ti.kernel
            def measure({sig0}):
                for i in range(N):
                    sa = s[i]
                    ua = u[i]
                    acc[None] += 0.1 * ({e_m})

            @ti.kernel
            def total({sig0}):
                for i in range(N):
                    loss[None] += {w0} * s[i] + {w1} * u[i] * u[i]
                    if i == 0:
                        loss[None] += acc[None]
                    if ti.static(HIST):
                        for t in range(STEPS):
                            loss[None] += h[t, i] * h[t, i]

            def step(t):
                forces({pass_su})
                update({pass_su})
                if WITH_ACC:
                    measure({pass0})

            return SimpleNamespace(s=s, u=u, p=p, acc=acc, loss=loss, step=step, total=lambda: total({pass0}))


        def reference(np, s, u, p, steps):
            \"\"\"The same program in float64 NumPy, vectorised over i; returns the loss (complex
            for complex inputs: the complex-step derivative of the test).\"\"\"
            ti = SimpleNamespace(sin=np.sin, cos=np.cos, tanh=np.tanh, sqrt=np.sqrt, exp=np.exp)
            idx = np.arange(N)
            acc = 0.0
            hsum = 0.0
            for t in range(steps):
                a, b, pi, tf = s, u, p, t * 0.05
                ok0, ok1 = (idx + O0 >= 0) & (idx + O0 < N), (idx + O1 >= 0) & (idx + O1 < N)
                nb0 = np.where(ok0, s[np.clip(idx + O0, 0, N - 1)], 0.0)
                nb1 = np.where(ok1, u[np.clip(idx + O1, 0, N - 1)], 0.0)
                fi = {e_f} + 0.0 * a
                sa, ua = s, u
                q = fi
                for _k in range(LOOP):
                    q = 0.5 * q + 0.3 * ti.tanh({e_q})
                s = 0.5 * sa + 0.25 * ti.tanh({e_s})
                u = 0.6 * ua + 0.2 * ti.sin({e_u})
                if HIST:
                    hsum = hsum + np.sum(({wh} * s) ** 2)
                if WITH_ACC:
                    sa, ua = s, u
                    acc = acc + np.sum(0.1 * ({e_m}) + 0.0 * sa)
            return np.sum({w0} * s + {w1} * u * u) + acc + hsum
        """).replace("{state}", state)
    source = "from types import SimpleNamespace\n\n" + source
    schedule = str(rng.choice(SCHEDULES))
    snapshots = None if schedule == "store_all" or rng.random() < 0.5 else int(rng.integers(1, 5))
    return SimpleNamespace(seed=seed, n=n, source=source, steps=steps, schedule=schedule, snapshots=snapshots)


def _load(prog: SimpleNamespace, folder: str):
    """The program as a module from a file (the frontend reads kernels' source through inspect)."""
    path = os.path.join(folder, f"checkpoint_program_{prog.seed}.py")
    with open(path, "w") as fh:
        fh.write(prog.source)
    spec = importlib.util.spec_from_file_location(f"checkpoint_program_{prog.seed}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _describe(prog) -> str:
    return (f"seed {prog.seed}: T={prog.steps}, schedule={prog.schedule}, snapshots={prog.snapshots} "
            f"(python tests/test_fuzz_checkpoint.py {prog.seed} prints the program)\n{prog.source}")


def complex_step_grads(f, inputs: list[np.ndarray], h: float = 1e-30) -> list[np.ndarray]:
    """The gradient of real-analytic f(*inputs) with respect to each input by the complex step,
    Im f(x + i h e_k) / h: no subtraction, so exact to float64 rounding for any h (central
    differences lose ~1e-16 |f| / h, which is 1e-4 of a gradient of 1e-7 after 23 contracting
    steps: too coarse a reference here)."""
    out = []
    for k, x in enumerate(inputs):
        g = np.zeros_like(x)
        for j in range(x.size):
            xs = [v.astype(np.complex128) for v in inputs]
            xs[k].flat[j] += 1j * h
            g.flat[j] = np.imag(f(*xs)) / h
        out.append(g)
    return out


def check_program(seed: int, folder: str) -> None:
    prog = generate(seed)
    mod = _load(prog, folder)
    rng = np.random.default_rng(10_000 + seed)
    s0, u0, p0 = (rng.uniform(-1.0, 1.0, prog.n).astype(np.float32) for _ in range(3))
    k = mod.build(ti)
    k.s.from_numpy(s0)
    k.u.from_numpy(u0)
    k.p.from_numpy(p0)
    with ti.ad.Tape(k.loss):
        stats = ti.ad.checkpoint(k.step, steps=prog.steps, state=[k.s, k.u], schedule=prog.schedule,
                                 snapshots=prog.snapshots)
        k.total()
    assert stats.recomputed_steps >= prog.steps or prog.schedule == "store_all", _describe(prog)

    def f(s, u, p):
        return mod.reference(np, s, u, p, prog.steps)
    ins = [s0.astype(np.float64), u0.astype(np.float64), p0.astype(np.float64)]
    want = float(f(*ins))
    assert k.loss[None] == pytest.approx(want, rel=1e-4, abs=1e-5), f"loss {k.loss[None]} != {want}: {_describe(prog)}"
    refs = complex_step_grads(f, ins)
    for field, ref, name in zip((k.s, k.u, k.p), refs, ("s0", "u0", "p")):
        assert_grad(field.grad.to_numpy(), ref, rtol=2e-4, what=f"d loss / d {name}, {_describe(prog)}")


SEEDS = [int(ONLY)] if ONLY else list(range(EXAMPLES))


@pytest.mark.parametrize("seed", SEEDS)
def test_random_checkpointed_simulations_against_float64(seed, tmp_path):
    check_program(seed, str(tmp_path))


if __name__ == "__main__":
    p = generate(int(sys.argv[1]))
    print(f"# T={p.steps}, schedule={p.schedule}, snapshots={p.snapshots}\n{p.source}")
