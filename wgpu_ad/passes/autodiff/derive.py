"""The steps of the kernels derived from a forward kernel, as named lists that the driver runs
with passes/pipeline.py run_steps (WGPU_AD_PRINT_IR prints the IR after each step, the verifier
checks it in tests and debug mode):

    FORWARD   promote, snapshot                                   the code a forward launch runs
    CHECKS    FORWARD, then runtime-checks                        what a launch that a gradient may be
                                                                  asked for checks (run on first need)
    CHECKED   CHECKS, then instrument                             a forward that checks its accesses
    DUAL      promote, tangent                                    forward mode (forward.py)
    ADJOINT   promote, snapshot, redirect, check, fuse, ...       reverse mode (adjoint.py)

Each list starts from a copy of the optimised forward IR, which no step changes (what autodiff
and get_ir() read stays as the frontend and PASSES made it). The steps pass one `Derivation`
along: `ir`, the kernel being built; `primal`, the promoted copy of the forward the analyses
read; and `plan`, the frozen record of what the analyses decided (AdjointPlan), which each step
returns its part of and the code that follows (the reverse emitter, the launch plan) reads.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from ... import plan as launch_plan
from ...errors import CompileError
from ...ir.clone import clone_kernel
from ...ir.nodes import Buffer, Kernel
from ..pipeline import run_steps
from .access import RuntimeChecks
from .checks import check_differentiable
from .forward import dual_kernel
from .needed import unneeded_loads
from .promote import promote_elements, snapshot_loads
from .shadow import instrument

DEFAULT_STACK_SIZE = 256  # loops bounded by constants or arguments are sized exactly or per launch


@dataclass(frozen=True)
class AdjointRequest:
    """What the caller asks of an adjoint (the driver, from CompileOptions).

    grad_source(buffer): the source (a plan.Source) of a primal buffer's gradient, or None.
    zero: positions in the adjoint's buffer list of gradients known to be all zeros at launch
    (demote.py zero-store variants). transpose: on CPU adapters, Runtime.min_parallel (pair loops
    may become two gathers, transpose.py), else None. fuse: the forward and its adjoint in one
    kernel (fuse.py). check_nan: every contribution to a gradient checked to be finite
    (nancheck.py). stencils: stencil adjoints gather instead of scattering (stencil.py)."""

    grad_source: Callable[[Buffer], object]
    stack_size: int = DEFAULT_STACK_SIZE
    zero: tuple = ()
    transpose: int | None = None
    fuse: bool = False
    check_nan: bool = False
    stencils: bool = True


@dataclass(frozen=True)
class AdjointPlan:
    """What the analyses decided, one part per step (the step that fills each is named); the
    reverse emitter and the launch plan read it. Per-task entries follow the tasks of the kernel.

    snapshot: id(field buffer) -> the reads of it that an update overwrites (promote.py), which
    read a copy taken before the launch; `redirected`: their ids, and those of the reads an update
    overwrites whose values the adjoint does not read (needed.py), which read no copy. snapshots:
    (field buffer, its snapshot buffer) pairs in the adjoint's IR (redirect). checks: the accesses the forward launch
    checks at run time (shadow.py), None when the kernel cannot be differentiated anyway (its
    adjoint says why). shadows: the checked variant's Shadow sources (instrument)."""

    snapshot: dict = field(default_factory=dict)            # snapshot
    redirected: frozenset = frozenset()                     # snapshot
    snapshots: tuple = ()                                   # redirect
    checks: RuntimeChecks | None = None                     # check, runtime-checks
    shadows: tuple = ()                                     # instrument
    fuse: bool = False                                      # fuse: the last task's adjoint does its writes
    grads: dict = field(default_factory=dict)               # gradients: id(primal buffer) -> gradient buffer
    # gradients: those of buffers ti.stop_grad names that the kernel stores to: a store still sets
    # the stored element's gradient to 0 (the old value is gone), and nothing else flows
    stopped: dict = field(default_factory=dict)
    flags: tuple = ()                                       # normalize: per task, its break/continue flags
    splits: tuple = ()                                      # symmetry, transpose: per task, a Split or None
    gathers: tuple = ()                                     # stencil: per task, a Gather or None
    check_nan: bool = False                                 # nan-check: every contribution checked
    zero_stores: tuple = ()                                 # demote: positions of zero-store candidates
    fused: tuple | None = None                              # reverse: the fused task's buffers by kind

    @property
    def snapshot_sources(self) -> tuple:
        """The sources of the fields whose pre-launch copies the adjoint reads, in order."""
        return tuple(loads[0].attr.source for loads in self.snapshot.values())


@dataclass
class Derivation:
    """What the steps pass along (module docstring). `request`: the caller's inputs (an
    AdjointRequest, or the dual_source of a dual kernel); `emitted`: the reverse step's tasks for
    the demote step, (adjoint task, the primal task it comes from, its loop_dims)."""

    ir: Kernel
    request: Any = None
    primal: Kernel | None = None
    plan: AdjointPlan = AdjointPlan()
    emitted: list = field(default_factory=list)

    def with_plan(self, **parts) -> "Derivation":
        return dataclasses.replace(self, plan=dataclasses.replace(self.plan, **parts))


def derive(ir: Kernel, steps: list, request: Any = None, *, print_ir: bool = False,
           verify: bool = False) -> Derivation:
    """Run the named steps from the optimised forward IR `ir` (which they do not change), printing
    and verifying the IR after each (passes/pipeline.py run_steps); returns the last state."""
    return run_steps(Derivation(ir, request, primal=ir), steps, print_ir=print_ir, verify=verify,
                     ir_of=lambda s: s.ir)


# ---- the steps every derived kernel shares ------------------------------------------------------

def promote(s: Derivation) -> Derivation:
    """A copy of the forward whose loop-carried elements are locals (promote.py); the analyses
    that follow read it."""
    k = promote_elements(clone_kernel(s.ir, own_indices=True))
    return dataclasses.replace(s, ir=k, primal=k)


def snapshot(s: Derivation) -> Derivation:
    """The reads that an update overwrites, which read a copy taken before the launch (analysis);
    those whose value no derivative reads need no copy (needed.py), but are exempt all the same."""
    found = snapshot_loads(s.primal)
    free = unneeded_loads(s.primal) if found else set()
    copied = {b: kept for b, loads in found.items() if (kept := [x for x in loads if id(x) not in free])}
    return s.with_plan(snapshot=copied, redirected=frozenset(id(x) for loads in found.values() for x in loads))


def runtime_checks(s: Derivation) -> Derivation:
    """The accesses a launch that a gradient may be asked for checks at run time (analysis; the
    adjoint's check step refuses what cannot be differentiated)."""
    checks = RuntimeChecks()
    try:
        check_differentiable(s.primal, s.plan.redirected, checks)
    except CompileError:
        checks = None
    return s.with_plan(checks=checks)


def instrument_checks(s: Derivation) -> Derivation:
    """A copy of the promoted forward whose unproven accesses track their elements in shadow
    buffers (shadow.py)."""
    mapping: dict = {}
    k = clone_kernel(s.primal, mapping)
    shadows = instrument(k, s.plan.checks, mapping)
    return dataclasses.replace(s, ir=k).with_plan(shadows=shadows)


def tangent(s: Derivation) -> Derivation:
    """The dual kernel: primal values and their tangents (forward.py); request: dual_source."""
    return dataclasses.replace(s, ir=dual_kernel(s.primal, s.request))


FORWARD = [("promote", promote), ("snapshot", snapshot)]
CHECKS = FORWARD + [("runtime-checks", runtime_checks)]
CHECKED = CHECKS + [("instrument", instrument_checks)]
DUAL = [("promote", promote), ("tangent", tangent)]


def redirect_snapshots(primal: Kernel, found: dict) -> tuple[Kernel, tuple]:
    """A copy of `primal` whose reads in `found` (snapshot step) read snapshot buffers
    (plan.Snapshot(j), j in order); returns it and the (field buffer, snapshot buffer) pairs."""
    mapping: dict = {}
    k = clone_kernel(primal, mapping)
    bases = []
    for loads in found.values():
        base = loads[0].attr
        snap = Buffer(base.name + "_before", base.dtype, launch_plan.Snapshot(len(bases)), vector=base.vector,
                      shape=base.shape)
        k.buffers.append(snap)
        bases.append((mapping.get(id(base), base), snap))
        for load in loads:
            mapping[id(load)].attr = snap
    return k, tuple(bases)
