"""Automatic differentiation on the IR: reverse mode (adjoint.py's steps, reverse.py's emitter)
and forward mode (forward.py) with their rules (rules.py), and the steps of every kernel derived
from a forward kernel as named lists (derive.py: FORWARD, CHECKS, CHECKED, DUAL; adjoint.py: ADJOINT)."""
from __future__ import annotations

from ...ir.nodes import Kernel
from .adjoint import ADJOINT, NOTHING, adjoint_steps
from .derive import (CHECKED, CHECKS, DEFAULT_STACK_SIZE, DUAL, FORWARD, AdjointPlan, AdjointRequest, Derivation,
                     derive)
from .fuse import NotFusable


def derive_adjoint(kernel: Kernel, request: AdjointRequest, *, print_ir: bool = False,
                   verify: bool = False) -> Derivation:
    """The steps of the adjoint of the optimised `kernel` (ADJOINT, or NOTHING): the last state."""
    return derive(kernel, adjoint_steps(kernel, request), request, print_ir=print_ir, verify=verify)


def adjoint_kernel(kernel: Kernel, request: AdjointRequest, **switches) -> tuple[Kernel, AdjointPlan]:
    """The adjoint of the optimised `kernel` (not yet optimised itself) and its plan."""
    d = derive_adjoint(kernel, request, **switches)
    return d.ir, d.plan


__all__ = ["ADJOINT", "NOTHING", "CHECKED", "CHECKS", "DUAL", "FORWARD", "AdjointPlan", "AdjointRequest", "Derivation",
           "DEFAULT_STACK_SIZE", "NotFusable", "adjoint_kernel", "adjoint_steps", "derive",
           "derive_adjoint"]
