"""The ordered, named lists of passes and the functions that run them.

PASSES optimise: `optimize` runs them until the IR stops changing (at most MAX_ROUNDS times).
LOWERING rewrites the optimised IR for the GPU, once, on a copy just before code generation
(`lower_for_codegen`): what autodiff reads and get_ir() shows stays the optimised IR. With
print_ir=True, or WGPU_AD_PRINT_IR=1 in the environment, it prints the IR after each pass under
a banner naming it; with verify=True it checks the IR after each pass and names the pass that
broke it.
"""
from __future__ import annotations

import os
from typing import Callable

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


def _run(kernel: Kernel, name: str, fn: Pass, *, verify: bool, show: bool, when: str = "") -> Kernel:
    """One pass, then the verifier (naming the pass that broke the IR) and the printout."""
    kernel = fn(kernel)
    if verify:
        try:
            verify_ir(kernel)
        except VerifyError as e:
            raise VerifyError(f"after pass {name}{when}: {e}") from e
    if show:
        print(f"{_banner(f'{kernel.name}: after {name}{when}')}\n{format_kernel(kernel)}")
    return kernel


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
    kernel = clone_kernel(kernel)
    show = print_ir or print_ir_enabled()
    for name, fn in LOWERING:
        kernel = _run(kernel, name, fn, verify=verify, show=show)
    return kernel
