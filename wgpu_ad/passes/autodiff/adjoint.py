"""Reverse mode as a named list of steps (derive.py says how they run):

    promote     the forward's loop-carried elements become locals, on a copy (promote.py)
    snapshot    the reads an update overwrites, which read a copy taken before the launch
    redirect    a copy of the promoted forward whose such reads read snapshot buffers
    check       what cannot be differentiated is refused; what cannot be proven is checked at run
                time by the forward launch instead (checks.py, shadow.py)
    fuse        whether the last task's adjoint also does the forward's writes (fuse.py)
    gradients   the gradient buffers of the primal buffers
    normalize   break / continue become flags (normalize.py)
    symmetry    pair loops symmetric in (i, j): the gradients of i count twice (symmetry.py)
    transpose   other pair loops on CPU adapters: a second, transposed adjoint task (transpose.py)
    stencil     stencils gather their neighbours' gradients (stencil.py)
    nan-check   whether every contribution to a gradient is checked to be finite (nancheck.py)
    reverse     the adjoint kernel: the tasks reversed, each replaced by its adjoint (reverse.py),
                as the plan says
    demote      accumulations one thread owns become plain read-modify-writes (demote.py)

Each analysis returns its part of the AdjointPlan; the reverse step reads only the plan.
"""
from __future__ import annotations

import dataclasses

from ...ir.nodes import Buffer, Kernel, walk
from ...ir.ops import Op
from .checks import check_differentiable
from .access import RuntimeChecks
from .demote import demote_atomics, task_buffers
from .derive import Derivation, promote, redirect_snapshots, snapshot
from .fuse import Fused, NotFusable, check_fusable, fused_access
from .nancheck import NanChecks
from .normalize import normalize_task
from .reverse import AdjointEmitter
from .stencil import gather_split, merge_groups
from .transpose import pair_shape, symmetric_split, transposed_split


def redirect(s: Derivation) -> Derivation:
    k, bases = redirect_snapshots(s.primal, s.plan.snapshot)
    return dataclasses.replace(s, ir=k).with_plan(snapshots=bases)


def check(s: Derivation) -> Derivation:
    """Refuses (a CompileError naming the line and the fix) what cannot be differentiated; the
    accesses it cannot prove safe for every input go to plan.checks."""
    checks = RuntimeChecks()
    check_differentiable(s.primal, s.plan.redirected, checks)
    return s.with_plan(checks=checks)


def fuse(s: Derivation) -> Derivation:
    if not s.request.fuse:
        return s
    if not s.ir.tasks:
        raise NotFusable("it has no tasks")
    if s.plan.checks:
        raise NotFusable("its forward launch checks its accesses at run time")
    if s.plan.redirected:
        raise NotFusable("it updates fields in place (its adjoint reads copies taken before the launch, or no value)")
    check_fusable(s.ir.tasks[-1])
    return s.with_plan(fuse=True)


def gradients(s: Derivation) -> Derivation:
    """Declares the gradient buffers (one per gradient source) in the IR; plan.grads maps each
    primal buffer (and snapshot: its field's) to its gradient."""
    k, primal = s.ir, s.primal
    grads: dict[int, Buffer] = {}
    stopped: dict[int, Buffer] = {}
    buffers = list(k.buffers)
    by_source = {b.source: b for b in buffers}
    stored = {id(x.attr) for t in k.tasks for x in walk(t.body) if x.op is Op.GLOBAL_STORE}
    for b in k.buffers:
        if b.grad or not b.dtype.is_float:
            continue
        if b.source in primal.no_grad and id(b) not in stored:  # ti.stop_grad(field), only read
            continue
        src = s.request.grad_source(b)
        if src is None:
            continue
        g = by_source.get(src)
        if g is None:
            g = Buffer(b.name + ".grad", b.dtype, src, grad=True, vector=b.vector)
            buffers.append(g)
        (stopped if b.source in primal.no_grad else grads)[id(b)] = g
    for base, snap in s.plan.snapshots:  # a snapshot's gradient is its field's
        if id(base) in grads:
            grads[id(snap)] = grads[id(base)]
    k.buffers = buffers
    return s.with_plan(grads=grads, stopped=stopped)


def normalize(s: Derivation) -> Derivation:
    return s.with_plan(flags=tuple(normalize_task(t) for t in s.ir.tasks))


def _task_grads(s: Derivation, orig) -> dict:
    """The gradients, without the fields a ti.stop_grad in this task's loop names."""
    grads = s.plan.grads
    if not orig.no_grad:
        return grads
    base_of = {id(snap): base for base, snap in s.plan.snapshots}
    by_id = {id(b): b for b in s.ir.buffers}
    return {i: g for i, g in grads.items() if base_of.get(i, by_id[i]).source not in orig.no_grad}


def _task_stopped(s: Derivation, orig) -> dict:
    """The gradients of the buffers a ti.stop_grad names (the kernel's or this task's loop's) that
    a store in the task consumes all the same (AdjointEmitter.stopped)."""
    out = dict(s.plan.stopped)
    if orig.no_grad:
        by_id = {id(b): b for b in s.ir.buffers}
        out.update((i, g) for i, g in s.plan.grads.items() if by_id[i].source in orig.no_grad)
    return out


def _pairs(s: Derivation):
    """(position, task, primal task, its flags, its gradients) of the tasks without a split yet."""
    splits = s.plan.splits or (None,) * len(s.ir.tasks)
    for n, (t, orig) in enumerate(zip(s.ir.tasks, s.primal.tasks)):
        if splits[n] is None:
            yield n, t, orig, s.plan.flags[n], _task_grads(s, orig)


def symmetry(s: Derivation) -> Derivation:
    splits = list(s.plan.splits or (None,) * len(s.ir.tasks))
    if s.request.transpose is not None:
        for n, t, orig, flags, tg in _pairs(s):
            shape = pair_shape(t, orig, flags, tg, s.request.transpose)
            splits[n] = symmetric_split(t, shape, tg) if shape is not None else None
    return s.with_plan(splits=tuple(splits))


def transpose(s: Derivation) -> Derivation:
    splits = list(s.plan.splits)
    if s.request.transpose is not None:
        for n, t, orig, flags, tg in _pairs(s):
            shape = pair_shape(t, orig, flags, tg, s.request.transpose)
            splits[n] = transposed_split(t, shape) if shape is not None else None
    return s.with_plan(splits=tuple(splits))


def stencil(s: Derivation) -> Derivation:
    gathers = [None] * len(s.ir.tasks)
    if s.request.stencils:
        for n, t, orig, flags, tg in _pairs(s):
            gathers[n] = gather_split(t, orig, s.primal.loop_dims, flags, tg)
    return s.with_plan(gathers=tuple(gathers))


def nan_check(s: Derivation) -> Derivation:
    """The reverse step emits a check of every contribution to a gradient (the kernel's checks
    share one list of sites) when the caller asks (a tape's check_nan, or debug)."""
    return s.with_plan(check_nan=s.request.check_nan)


def reverse(s: Derivation) -> Derivation:
    """The adjoint kernel, as the plan says: per task, last first, its gather task (stencil) and
    its adjoint, and the adjoint of its transposed task (transpose); before them, in a fused
    kernel, the forward's tasks but the last."""
    k, primal, p, stack = s.ir, s.primal, s.plan, s.request.stack_size
    check_nan = p.check_nan
    origins: list = []  # the sites of the NaN checks, shared by the kernel's tasks

    def nan():
        return NanChecks(primal.name, origins) if check_nan else None
    emitted = []  # (adjoint task, the primal task it comes from, that task's loop_dims for demote.py)
    fused = None
    for n in reversed(range(len(k.tasks))):
        t, orig, flags = k.tasks[n], primal.tasks[n], p.flags[n]
        split, gather, tg = p.splits[n], p.gathers[n], _task_grads(s, orig)
        effects = p.fuse and not emitted  # the last task: its adjoint does the forward's writes too
        skip = split.skip if split is not None else gather.skip if gather is not None else frozenset()
        em = AdjointEmitter(k, tg, stack, flags if split is None else frozenset(), skip=skip,
                            double=split.double if split is not None else frozenset(), effects=effects, nan=nan(),
                            stopped=_task_stopped(s, orig))
        main = em.task(t)
        if gather is not None:  # runs first: it reads the outputs' gradients the main adjoint consumes
            gt = merge_groups([AdjointEmitter(k, tg, stack, skip=skip_g, nan=nan(), consume=False).task(g)
                               for g, skip_g in zip(gather.tasks, gather.skip_gather)], gather)
            emitted.append((gt, gather.marker, {}))
        emitted.append((main, orig, primal.loop_dims))
        if effects:
            fused = fused_access(main, em.kept)
            if gather is not None:
                fused = _merged(fused, fused_access(gt, set()))
        if split is not None and split.transposed is not None:
            emitted.append((AdjointEmitter(k, tg, stack, skip=split.skip_transposed, nan=nan()).task(split.transposed),
                            split.marker, split.loop_dims))
    before = k.tasks[:-1] if p.fuse else []  # the forward tasks a fused kernel runs first
    out = Kernel(k.name + ("_fused_grad" if p.fuse else "_grad"), before + [nt for nt, _, _ in emitted],
                 list(k.args), k.buffers, None, False, k.debug, k.loc)
    pos = {id(b): q for q, b in enumerate(k.buffers)}
    positions = None if fused is None else tuple(
        tuple(pos[id(b)] for b in kind)
        for kind in (fused.primal_reads, fused.grad_reads, fused.fwd_writes, fused.adj_writes))
    return dataclasses.replace(s, ir=out, emitted=emitted).with_plan(fused=positions)


def demote(s: Derivation) -> Derivation:
    """Accumulations one thread owns become plain read-modify-writes; the zero-store candidates
    (plain stores while the gradient is all zeros at launch) go to plan.zero_stores."""
    out, emitted = s.ir, s.emitted
    before = out.tasks[:len(out.tasks) - len(emitted)]
    used = [task_buffers(nt) for nt, _, _ in emitted]
    forward_used = set().union(*(task_buffers(t) for t in before))
    zero_ids = {id(out.buffers[q]) for q in s.request.zero}
    candidates = set()
    for n, (nt, orig, loop_dims) in enumerate(emitted):
        shared = forward_used.union(*(u for m, u in enumerate(used) if m != n))
        candidates |= demote_atomics(loop_dims, nt, orig, shared, zero_ids)
    return s.with_plan(zero_stores=tuple(q for q, b in enumerate(out.buffers) if id(b) in candidates))


ADJOINT = [("promote", promote), ("snapshot", snapshot), ("redirect", redirect), ("check", check),
           ("fuse", fuse), ("gradients", gradients), ("normalize", normalize), ("symmetry", symmetry),
           ("transpose", transpose), ("stencil", stencil), ("nan-check", nan_check), ("reverse", reverse),
           ("demote", demote)]


def nothing_flows_back(s: Derivation) -> Derivation:
    """The adjoint of a kernel that writes no float buffer with a gradient (only integers, or
    fields without gradients: a neighbour list binned with atomic counters): no tasks, nothing to
    replay or to refuse."""
    k = s.ir
    return dataclasses.replace(s, ir=Kernel(k.name + "_grad", [], list(k.args), list(k.buffers), None, False,
                                            k.debug, k.loc))


NOTHING = [("nothing-flows-back", nothing_flows_back)]


def adjoint_steps(kernel: Kernel, request) -> list:
    """ADJOINT, or NOTHING when no gradient can flow back through `kernel` (an AdjointRequest:
    a fused kernel always takes ADJOINT)."""
    if request.fuse:
        return ADJOINT
    grad_source = request.grad_source
    for t in kernel.tasks:
        for x in walk(t.body):
            if x.op is Op.GLOBAL_STORE or x.op is Op.ATOMIC:
                b = x.attr[1] if x.op is Op.ATOMIC else x.attr
                stopped = b.source in kernel.no_grad and x.op is Op.ATOMIC  # (a store consumes the gradient)
                if b.dtype.is_float and not b.grad and not stopped and grad_source(b) is not None:
                    return ADJOINT
    return NOTHING


def _merged(a: Fused, b: Fused) -> Fused:
    """The buffers of two tasks of a fused kernel, by kind (the launcher checks them together)."""
    def union(x, y):
        return list({id(buf): buf for buf in x + y}.values())
    return Fused(*(union(getattr(a, f), getattr(b, f))
                   for f in ("primal_reads", "grad_reads", "fwd_writes", "adj_writes")))
