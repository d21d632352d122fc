"""Automatic differentiation on the IR: reverse mode (reverse.py) and forward mode (forward.py)
with their rules (rules.py), the control-flow normalisation reverse mode needs (normalize.py) and
the checks that refuse what it cannot differentiate correctly (checks.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ... import plan
from ...ir.nodes import Buffer, Kernel, walk
from ...ir.ops import Op
from .access import RuntimeChecks
from .checks import check_differentiable, runtime_checks
from ...ir.clone import clone_kernel
from .demote import demote_atomics, task_buffers
from .forward import dual_kernel
from .fuse import Fused, NotFusable, check_fusable, fused_access
from .nancheck import NanChecks
from .normalize import normalize_task
from .promote import promote_elements, snapshot_loads
from .reverse import AdjointEmitter
from .stencil import gather_split, merge_groups
from .transpose import split_pair_task

DEFAULT_STACK_SIZE = 256  # loops bounded by constants or arguments are sized exactly or per launch


@dataclass(frozen=True)
class AdjointInfo:
    """What the launcher needs to know about an adjoint beyond its code, as buffer positions.

    zero_stores: the zero-store candidates (demote.py), whose one accumulation may be a plain
    store while the gradient is all zeros. fused: for a fused kernel (fuse.py), the positions of
    the fused task's primal reads, gradient reads, forward writes and adjoint writes."""

    zero_stores: tuple = ()
    fused: tuple | None = None
    snapshots: tuple = ()  # sources of the fields whose pre-launch copies the adjoint reads


def prepare_in_place(kernel: Kernel) -> tuple[Kernel, list, frozenset]:
    """In-place updates made differentiable (promote.py): `kernel`'s loop-carried elements become
    locals (in place: the same values, and the forward compiles that way too); then a copy whose
    reads that an update overwrites read snapshot buffers (plan.Snapshot(j), j in order). Returns
    the copy, the (field buffer, snapshot buffer) pairs and the ids of those reads in `kernel`."""
    promote_elements(kernel)
    found = snapshot_loads(kernel)
    mapping: dict = {}
    k = clone_kernel(kernel, mapping)
    bases, redirected = [], set()
    for loads in found.values():
        base = loads[0].attr
        snap = Buffer(base.name + "_before", base.dtype, plan.Snapshot(len(bases)), vector=base.vector,
                      shape=base.shape)
        k.buffers.append(snap)
        bases.append((mapping.get(id(base), base), snap))
        for load in loads:
            mapping[id(load)].attr = snap
            redirected.add(id(load))
    return k, bases, frozenset(redirected)


def reverse_kernel(kernel: Kernel, grad_source: Callable[[Buffer], object],
                   stack_size: int = DEFAULT_STACK_SIZE, zero: tuple = (), transpose: int | None = None,
                   fuse: bool = False, check_nan: bool = False, stencils: bool = True) -> tuple[Kernel, AdjointInfo]:
    """The adjoint kernel of `kernel` (its tasks reversed, each replaced by its adjoint), and
    its AdjointInfo.

    grad_source(buffer) gives the gradient's source (a plan.Source) of a primal buffer, or None
    when it has none.
    zero: positions in the adjoint's buffer list of gradients known to be all zeros at launch;
    those that are zero-store candidates (the adjoint's `zero_stores`, see demote.py) are stored
    into instead of accumulated into.
    transpose: on CPU adapters, Runtime.min_parallel: the adjoints of pair loops whose inner loop
    has at least that many iterations may become two gathers (transpose.py).
    fuse: the forward kernel and its adjoint in one (fuse.py): the forward's tasks but the last,
    then the adjoint tasks, the first of which also does the last task's writes; raises
    NotFusable when that cannot be done.
    check_nan: every contribution to a gradient is checked to be finite, and the operation whose
    derivative first was not is reported (nancheck.py; the kernel's checks share one list of sites).
    stencils: the adjoints of stencils gather their neighbours' gradients instead of scattering them
    with atomics (stencil.py).
    """
    if not fuse and not _writes_a_gradient(kernel, grad_source):
        # only integers, or fields without gradients (a neighbour list binned with atomic counters):
        # nothing flows back, so there is nothing to replay or to refuse
        return Kernel(kernel.name + "_grad", [], list(kernel.args), list(kernel.buffers), None, False, kernel.debug,
                      kernel.loc), AdjointInfo()
    k, bases, redirected = prepare_in_place(kernel)
    # what cannot be proven safe for every input is checked by the forward launch instead
    # (shadow.py; the launcher runs the adjoint only after a checked launch)
    checked = RuntimeChecks()
    check_differentiable(kernel, redirected, checked)
    if fuse:
        if not k.tasks:
            raise NotFusable("it has no tasks")
        if checked:
            raise NotFusable("its forward launch checks its accesses at run time")
        if bases:
            raise NotFusable("it updates fields in place (its adjoint reads copies taken before the launch)")
        check_fusable(k.tasks[-1])
    grads: dict[int, Buffer] = {}
    buffers = list(k.buffers)
    by_source = {b.source: b for b in buffers}
    for b in k.buffers:
        if b.grad or not b.dtype.is_float or b.source in kernel.no_grad:  # ti.stop_grad(field)
            continue
        src = grad_source(b)
        if src is None:
            continue
        g = by_source.get(src)
        if g is None:
            g = Buffer(b.name + ".grad", b.dtype, src, grad=True, vector=b.vector)
            buffers.append(g)
        grads[id(b)] = g
    for base, snap in bases:  # a snapshot's gradient is its field's
        if id(base) in grads:
            grads[id(snap)] = grads[id(base)]
    flags = {id(t): normalize_task(t) for t in k.tasks}
    adjoints = []  # (adjoint task, the primal task it comes from, that task's loop_dims for demote.py)
    fused = None
    origins: list = []  # the sites of the NaN checks (check_nan), shared by the kernel's tasks

    def checks():
        return NanChecks(kernel.name, origins) if check_nan else None
    base_of = {id(snap): base for base, snap in bases}

    def task_grads(orig):  # without the fields a ti.stop_grad in this task's loop names
        if not orig.no_grad:
            return grads
        return {i: g for i, g in grads.items()
                if base_of.get(i, by_id[i]).source not in orig.no_grad}
    by_id = {id(b): b for b in buffers}
    for t, orig in zip(reversed(k.tasks), reversed(kernel.tasks)):
        tg = task_grads(orig)
        split = split_pair_task(t, orig, flags[id(t)], tg, transpose) if transpose is not None else None
        gather = gather_split(t, orig, kernel.loop_dims, flags[id(t)], tg) if stencils and split is None else None
        effects = fuse and not adjoints  # the last task: its adjoint does the forward's writes too
        skip = split.skip if split is not None else gather.skip if gather is not None else frozenset()
        em = AdjointEmitter(k, tg, stack_size, flags[id(t)] if split is None else frozenset(), skip=skip,
                            double=split.double if split is not None else frozenset(), effects=effects,
                            nan=checks())
        main = em.task(t)
        if gather is not None:  # runs first: it reads the outputs' gradients the main adjoint consumes
            gt = merge_groups([AdjointEmitter(k, tg, stack_size, skip=skip_g, nan=checks(), consume=False).task(g)
                               for g, skip_g in zip(gather.tasks, gather.skip_gather)], gather)
            adjoints.append((gt, gather.marker, {}))
        adjoints.append((main, orig, kernel.loop_dims))
        if effects:
            fused = fused_access(main, em.kept)
            if gather is not None:
                fused = _merged(fused, fused_access(gt, set()))
        if split is not None and split.transposed is not None:
            adjoints.append((AdjointEmitter(k, tg, stack_size, skip=split.skip_transposed,
                                            nan=checks()).task(split.transposed),
                             split.marker, split.loop_dims))
    before = k.tasks[:-1] if fuse else []  # the forward tasks a fused kernel runs first
    out = Kernel(k.name + ("_fused_grad" if fuse else "_grad"), before + [nt for nt, _, _ in adjoints],
                 list(k.args), buffers, None, False, k.debug, k.loc)
    used = [task_buffers(nt) for nt, _, _ in adjoints]
    forward_used = set().union(*(task_buffers(t) for t in before))
    zero_ids = {id(buffers[p]) for p in zero}
    candidates = set()
    for n, (nt, orig, loop_dims) in enumerate(adjoints):
        shared = forward_used.union(*(u for m, u in enumerate(used) if m != n))
        candidates |= demote_atomics(loop_dims, nt, orig, shared, zero_ids)
    pos = {id(b): p for p, b in enumerate(buffers)}
    info = AdjointInfo(
        snapshots=tuple(base.source for base, _ in bases),
        zero_stores=tuple(p for p, b in enumerate(buffers) if id(b) in candidates),
        fused=None if fused is None else tuple(tuple(pos[id(b)] for b in kind) for kind in
                                               (fused.primal_reads, fused.grad_reads, fused.fwd_writes,
                                                fused.adj_writes)))
    return out, info


def _writes_a_gradient(kernel: Kernel, grad_source: Callable[[Buffer], object]) -> bool:
    """Whether the kernel stores or accumulates into a float buffer that has a gradient: else its
    adjoint has nothing to do."""
    for t in kernel.tasks:
        for s in walk(t.body):
            if s.op is Op.GLOBAL_STORE or s.op is Op.ATOMIC:
                b = s.attr[1] if s.op is Op.ATOMIC else s.attr
                if b.dtype.is_float and not b.grad and b.source not in kernel.no_grad and grad_source(b) is not None:
                    return True
    return False


def _merged(a: Fused, b: Fused) -> Fused:
    """The buffers of two tasks of a fused kernel, by kind (the launcher checks them together)."""
    def union(x, y):
        return list({id(buf): buf for buf in x + y}.values())
    return Fused(*(union(getattr(a, f), getattr(b, f))
                   for f in ("primal_reads", "grad_reads", "fwd_writes", "adj_writes")))


__all__ = ["reverse_kernel", "dual_kernel", "AdjointInfo", "DEFAULT_STACK_SIZE", "clone_kernel", "NotFusable",
           "runtime_checks"]
