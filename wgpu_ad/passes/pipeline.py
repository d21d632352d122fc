"""The ordered, named lists of passes and the functions that run them.

PASSES optimise: `optimize` runs them until the IR stops changing (at most MAX_ROUNDS times).
LOWERING rewrites the optimised IR for the GPU, once, on a copy just before code generation
(`lower_for_codegen`): what autodiff reads and get_ir() shows stays the optimised IR. The derived
kernels' lists (passes/autodiff/derive.py FORWARD, CHECKED, DUAL; adjoint.py ADJOINT) run once,
in order, through `run_steps`, over a record that holds the IR being built. With
print_ir=True, or WGPU_AD_PRINT_IR=1 in the environment, it prints the IR after each pass under
a banner naming it; with verify=True it checks the IR after each pass and names the pass that
broke it.
"""
from __future__ import annotations

import os
from typing import Any, Callable

from ..ir.clone import clone_kernel
from ..ir.nodes import Kernel
from ..ir.printer import format_kernel
from ..ir.verifier import VerifyError, verify as verify_ir
from .cse import cse
from .dce import dce
from .licm import licm
from .mem2reg import mem2reg
from .prereduce import prereduce
from .simplify import constant_fold

Pass = Callable[[Kernel], Kernel]
Step = Callable[[Any], Any]  # a step of a derived kernel: a record holding `.ir` -> the next one

PASSES: list[tuple[str, Pass]] = [
    ("mem2reg", mem2reg),
    ("constant_fold", constant_fold),
    ("cse", cse),
    ("licm", licm),
    ("dce", dce),
]

LOWERING: list[tuple[str, Pass]] = [
    ("prereduce", prereduce),
]

MAX_ROUNDS = 4


def print_ir_enabled() -> bool:
    return os.environ.get("WGPU_AD_PRINT_IR", "") not in ("", "0")


def _banner(title: str) -> str:
    return f"// ---- {title} " + "-" * max(0, 72 - len(title))


def _run(kernel, name: str, fn: Pass | Step, *, verify: bool, show: bool, when: str = "",
         ir_of: Callable[[Any], Kernel] = lambda k: k):
    """One pass (or step: ir_of gives the IR its record holds), then the verifier (naming the pass
    that broke the IR) and the printout."""
    out = fn(kernel)
    kernel = ir_of(out)
    if verify:
        try:
            verify_ir(kernel)
        except VerifyError as e:
            raise VerifyError(f"after pass {name}{when}: {e}") from e
    if show:
        print(f"{_banner(f'{kernel.name}: after {name}{when}')}\n{format_kernel(kernel)}")
    return out


def optimize(kernel: Kernel, *, print_ir: bool = False, verify: bool = False,
             passes: list[tuple[str, Pass]] | None = None) -> Kernel:
    """Run the passes (PASSES by default) over `kernel` until a fixpoint; returns the kernel."""
    passes = PASSES if passes is None else passes
    show = print_ir or print_ir_enabled()
    text = format_kernel(kernel)
    if show:
        print(f"{_banner(f'{kernel.name}: input')}\n{text}")
    for round_ in range(1, MAX_ROUNDS + 1):
        before = text
        for name, fn in passes:
            kernel = _run(kernel, name, fn, verify=verify, show=show, when=f" (round {round_})")
        text = format_kernel(kernel)
        if text == before:
            break
    return kernel


def lower_for_codegen(kernel: Kernel, *, print_ir: bool = False, verify: bool = False) -> Kernel:
    """Run the LOWERING passes once over a copy of the optimised `kernel`; returns the copy."""
    return run_steps(clone_kernel(kernel), LOWERING, print_ir=print_ir, verify=verify)


def run_steps(state, steps: list[tuple[str, Step]], *, print_ir: bool = False, verify: bool = False,
              ir_of: Callable[[Any], Kernel] = lambda k: k):
    """Run the named steps once, in order, over `state` (a Kernel, or a record whose IR ir_of
    gives), printing and verifying that IR after each as optimize() does; returns the last state."""
    show = print_ir or print_ir_enabled()
    for name, fn in steps:
        state = _run(state, name, fn, verify=verify, show=show, ir_of=ir_of)
    return state
