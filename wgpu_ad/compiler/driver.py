"""The compiler driver: one path from a kernel's source to a CompiledKernel, for the forward
kernel and every kernel derived from it (the adjoint, its zero-store variants, the fused tape
tail, the checked variant, the dual kernel of forward mode).

    source --frontend--> IR --PASSES (optimize)--> IR --FORWARD--> IR --LOWERING, codegen--> CompiledKernel
                                                     --CHECKED / DUAL / ADJOINT, PASSES--> IR --LOWERING, codegen--> ...

Every derived kernel is a named list of steps (passes/autodiff/derive.py, adjoint.py) run from
the optimised forward IR, which none of them changes; WGPU_AD_PRINT_IR and the verifier see each
step, as they see PASSES.

Every step is decided by the CompileOptions, which are part of the cache keys. The result is a
`Compiled`: the CompiledKernel (WGSL, bindings and the launch plan, all plain data) and the
kernel's storage table (the live fields its plan names by position). The optimised IR is made
again on demand (printing, deriving an adjoint after an offline-cache hit): nothing downstream
of this module reads IR.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from .. import plan
from ..codegen import generate
from ..errors import CompileError, debug_enabled
from ..frontend.kernel import lower_kernel
from ..ir.nodes import Kernel
from ..ir.ops import Op
from ..ir.utils import walk_kernel
from ..passes.autodiff import CHECKED, CHECKS, DUAL, FORWARD, AdjointRequest, Derivation, NotFusable, adjoint_steps, derive
from ..passes.autodiff.access import footprint
from ..passes.autodiff.overwritten import needs_unknown, replayed, without_unknown, zeroing_kernel
from ..passes.pipeline import lower_for_codegen, optimize
from ..plan import CompiledKernel
from . import cache
from .options import CompileOptions


class Compiled:
    """A compiled kernel: `ck` (what the runtime and the launcher need) and `storages`, the live
    fields that plan.Field(k) names. `ir` is the optimised IR, made on first use."""

    def __init__(self, ck: CompiledKernel, storages: list, make_ir: Callable[[], Kernel],
                 slot: cache.Slot | None, analyse: Callable[[], tuple] | None = None, captured=None):
        self.ck, self.storages, self.slot = ck, storages, slot
        self.captured = captured  # frontend/captured.py: the Python numbers it compiled in
        self._make_ir, self._ir = make_ir, None
        self._analyse, self._shadowed = analyse, ck.plan.shadowed

    @property
    def shadowed_known(self) -> bool:
        """Whether `shadowed` is known without running the access checks."""
        return self._shadowed is not None

    @property
    def shadowed(self) -> tuple:
        """A forward kernel's sources whose accesses a checked launch tracks (the access checks,
        passes/autodiff/access.py, run on first use: only kernels that a gradient may be asked
        for pay for them)."""
        if self._shadowed is None:
            self._shadowed = self._analyse()
        return self._shadowed

    @property
    def plan(self) -> plan.LaunchPlan:
        return self.ck.plan

    @property
    def ir(self) -> Kernel:
        if self._ir is None:
            self._ir = self._make_ir()
        return self._ir


def user_errors(fn: Callable):
    """fn(), with compile errors showing the user's source, not the compiler's frames (unless
    WGPU_AD_DEBUG_COMPILER=1)."""
    try:
        return fn()
    except CompileError as e:
        if debug_enabled():
            raise
        raise e.with_traceback(None) from None


def _optimize(ir: Kernel, opts: CompileOptions) -> Kernel:
    return optimize(ir, print_ir=opts.print_ir, verify=opts.debug or debug_enabled())


def _derive(ir: Kernel, steps: list, opts: CompileOptions, request=None) -> Derivation:
    """The named steps of a derived kernel from the optimised forward IR (left as it is)."""
    return derive(ir, steps, request, print_ir=opts.print_ir, verify=opts.debug or debug_enabled())


def _codegen(ir: Kernel, opts: CompileOptions, **plan_facts) -> CompiledKernel:
    """Optimised IR -> CompiledKernel: the lowering passes (on a copy, so the optimised IR stays
    what autodiff reads), WGSL, the launch plan."""
    low = lower_for_codegen(ir, print_ir=opts.print_ir, verify=opts.debug or debug_enabled())
    ck = generate(low, float_atomics=opts.float_atomics, debug=opts.debug, subgroups=opts.subgroups,
                  grid_cap=opts.grid_cap, loop_check=opts.loop_check, reduce_grid_cap=opts.reduce_grid_cap,
                  deterministic=opts.deterministic, max_storage_buffers=opts.max_storage_buffers)
    if plan_facts:
        ck = dataclasses.replace(ck, plan=dataclasses.replace(ck.plan, **plan_facts))
    if opts.show_wgsl:
        for t in ck.tasks:
            print(t.wgsl)
    return ck


def _accesses(ir: Kernel, snapshot_loads: frozenset) -> tuple:
    """The plan's Access records: footprint() with the affine forms over argument words."""
    out = []
    for buf, kind, dims in footprint(ir, snapshot_loads):
        if isinstance(buf.source, (plan.Scratch, plan.ScratchDual)):
            continue  # the launch's own storage: no other launch sees it
        forms = tuple(None if d is None else tuple((None if k is None else k[1], c) for k, c in d) for d in dims)
        out.append(plan.Access(buf.source, kind, forms))
    return tuple(out)


def compile_kernel(fn, name: str, specs: list, ret_dtype, opts: CompileOptions) -> Compiled:
    """A @ti.kernel specialised for its argument specs (frontend/kernel.py ArgSpec)."""
    ir0, storages = user_errors(lambda: lower_kernel(fn, name, specs, ret_dtype, debug=opts.debug,
                                                     min_parallel=opts.min_parallel))
    slot = cache.forward_slot(ir0, opts)
    made: list = []

    def make_ir() -> Kernel:
        if not made:
            made.append(user_errors(lambda: _optimize(ir0, opts)))
        return made[0]
    ck = slot.load() if slot is not None else None
    if ck is None:
        # the code a launch runs: the loop-carried elements in registers (promote.py), on a copy;
        # with what a launch that a gradient may be asked for needs (the fields its adjoint reads
        # copies of, its footprint for the tape's rules); the accesses it checks at run time are
        # analysed on first need (Compiled.shadowed: a kernel no gradient is asked of never is)
        d = user_errors(lambda: _derive(make_ir(), FORWARD, opts))
        p = d.plan
        scratch = tuple(sorted((b.source for b in ir0.buffers if isinstance(b.source, plan.Scratch)),
                               key=lambda src: src.index))
        ck = user_errors(lambda: _codegen(d.ir, opts, accesses=_accesses(d.ir, p.redirected),
                                          snapshots=p.snapshot_sources, scratch=scratch, shadowed=None))
        if slot is not None:
            slot.store(ck)
    stored = ck

    def analyse() -> tuple:
        """The access checks of the kernel (CHECKS); their result joins its offline-cache entry."""
        checks = user_errors(lambda: _derive(make_ir(), CHECKS, opts)).plan.checks
        found = tuple(b.source for b in checks.buffers()) if checks else ()
        if slot is not None:
            slot.store(dataclasses.replace(stored, plan=dataclasses.replace(stored.plan, shadowed=found)), update=True)
        return found
    return Compiled(ck, storages, make_ir, slot, analyse, captured=ir0.captured or None)


def compile_checked(fwd: Compiled, opts: CompileOptions) -> Compiled:
    """The checked variant of a forward kernel whose plan has `shadowed` sources: its accesses that
    the compiler could not prove safe for reverse mode track their elements in shadow buffers
    (plan.Shadow) and report a broken rule (passes/autodiff/shadow.py). The launcher runs it where
    a gradient may be asked for; the adjoint is right after a launch of it that passed."""
    slot = fwd.slot.checked() if fwd.slot is not None else None
    made: list = []

    def make_ir() -> tuple:
        if not made:
            d = _derive(fwd.ir, CHECKED, opts)
            made.append((d.ir, d.plan.shadows))
        return made[0]
    ck = slot.load() if slot is not None else None
    if ck is None:
        ir, shadows = user_errors(make_ir)
        p = fwd.plan
        ck = user_errors(lambda: _codegen(ir, opts, accesses=p.accesses, snapshots=p.snapshots, scratch=p.scratch,
                                          shadowed=fwd.shadowed, shadows=shadows))
        if slot is not None:
            slot.store(ck)
    return Compiled(ck, fwd.storages, lambda: make_ir()[0], slot)


def grad_sources(fwd: Compiled, specs: list) -> tuple:
    """Per buffer of the forward kernel, where its gradient lives (a plan.Source), or None: a
    field's gradient is its own entry of the storage table when the kernel names it too."""
    pos = {id(o): k for k, o in enumerate(fwd.storages)}
    out = []
    for src in fwd.plan.buffers:
        g = None
        if isinstance(src, plan.Field):
            obj = fwd.storages[src.index]
            if getattr(obj, "needs_grad", False) and not obj.is_grad:
                k = pos.get(id(getattr(obj, "_grad", None)))
                g = plan.Field(k) if k is not None else plan.FieldGrad(src.index)
        elif isinstance(src, plan.Arg) and specs[src.arg].needs_grad:
            g = plan.ArgGrad(src.arg)
        elif isinstance(src, plan.Scratch) and src.dtype in ("f32", "f16"):
            g = plan.ScratchGrad(src.index)
        out.append(g)
    return tuple(out)


def compile_adjoint(fwd: Compiled, grads: tuple, opts: CompileOptions, zero: tuple = (),
                    fused: bool = False) -> Compiled | None:
    """The adjoint of a compiled kernel; grads: grad_sources(). zero: positions of gradients
    known to be all zeros at launch (a zero-store variant, demote.py). fused: the forward and
    the adjoint in one kernel (fuse.py), or None when the kernel cannot be fused. opts may differ
    from the forward's in check_nan only (a tape's check_nan=True)."""
    slot = fwd.slot.adjoint(grads, zero, fused, opts.check_nan) if fwd.slot is not None else None
    by_source = dict(zip(fwd.plan.buffers, grads))
    made: list = []

    request = AdjointRequest(lambda b: by_source.get(b.source), opts.ad_stack_size, zero,
                             transpose=opts.min_parallel, fuse=fused, check_nan=opts.check_nan,
                             stencils=opts.stencil_gather if opts.stencil_gather is not None
                             else opts.min_parallel is None)

    def make_ir() -> tuple:
        if not made:
            d = _derive(fwd.ir, adjoint_steps(fwd.ir, request), opts, request)
            made.append((_optimize(d.ir, opts), d.plan))
        return made[0]
    ck = slot.load() if slot is not None else None
    if ck is None:
        try:
            ir, p = user_errors(make_ir)
            ck = user_errors(lambda: _codegen(ir, opts, zero_stores=p.zero_stores, fused=p.fused,
                                              scratch=fwd.plan.scratch))
        except (NotFusable, CompileError):
            if not fused:
                raise
            return None  # the tape launches the forward and the adjoint apart (and reports errors then)
        if slot is not None:
            slot.store(ck)
    return Compiled(ck, fwd.storages, lambda: make_ir()[0], slot)


def compile_zeroing(fwd: Compiled, grads: tuple, opts: CompileOptions) -> Compiled | str | None:
    """The backward pass of a @ti.ad.no_grad kernel (passes/autodiff/overwritten.py): it sets to 0
    the gradients of the elements the kernel overwrites. None when it overwrites nothing with a
    gradient; a reason (str) when the elements it overwrites depend on values it cannot recompute."""
    by_source = dict(zip(fwd.plan.buffers, grads))
    stored = (plan.Field, plan.Arg)

    def zeroing(replay: tuple = ()) -> Kernel | None:
        # (fields and ndarrays: a kernel-scope sum's scratch buffer is the launch's own)
        ir, _ = zeroing_kernel(fwd.ir, lambda b: by_source.get(b.source) if isinstance(b.source, stored) else None,
                               replay, plan.Snapshot)
        return None if ir is None else user_errors(lambda: _optimize(ir, opts))
    ir = zeroing()
    if ir is None:
        return None
    # what it writes that its indices or control flow read (and what those stores read in turn):
    # replayed on copies from before the launch
    replay: tuple = ()
    while more := replayed(fwd.ir, ir, lambda src: isinstance(src, stored)):
        replay += more
        ir = zeroing(replay)
    if needs_unknown(ir):
        return "which elements it overwrites depends on a random number or on the value an atomic returned"
    if any(isinstance(b.source, plan.Scratch) for b in ir.buffers
           if any(s.attr is b for s in walk_kernel(ir) if s.op is Op.GLOBAL_LOAD)):
        return "which elements it overwrites depends on a kernel-scope sum"
    ir = without_unknown(ir)
    ck = user_errors(lambda: _codegen(ir, opts, snapshots=replay))
    return Compiled(ck, fwd.storages, lambda: ir, None)


def dual_sources(fwd: Compiled, specs: list) -> tuple:
    """Per buffer of the forward kernel, where its dual (forward mode) lives (a plan.Source), or
    None: like grad_sources, a field's dual is its own entry of the storage table when the kernel
    names it too."""
    pos = {id(o): k for k, o in enumerate(fwd.storages)}
    out = []
    for src in fwd.plan.buffers:
        d = None
        if isinstance(src, plan.Field):
            obj = fwd.storages[src.index]
            if getattr(obj, "needs_dual", False):
                k = pos.get(id(obj.dual))
                d = plan.Field(k) if k is not None else plan.FieldDual(src.index)
        elif isinstance(src, plan.Arg) and specs[src.arg].needs_dual:
            d = plan.ArgDual(src.arg)
        elif isinstance(src, plan.Scratch) and src.dtype == "f32":
            d = plan.ScratchDual(src.index)
        out.append(d)
    return tuple(out)


def compile_dual(fwd: Compiled, duals: tuple, opts: CompileOptions) -> Compiled:
    """The dual kernel of a compiled kernel (forward mode: its primal values and their tangents,
    passes/autodiff/forward.py); duals: dual_sources()."""
    slot = fwd.slot.dual(duals) if fwd.slot is not None else None
    by_source = dict(zip(fwd.plan.buffers, duals))
    made: list = []

    def make_ir() -> Kernel:
        if not made:
            d = _derive(fwd.ir, DUAL, opts, lambda b: by_source.get(b.source))
            made.append(_optimize(d.ir, opts))
        return made[0]
    ck = slot.load() if slot is not None else None
    if ck is None:
        ir = user_errors(make_ir)
        ck = user_errors(lambda: _codegen(ir, opts, accesses=_accesses(ir, frozenset()), scratch=fwd.plan.scratch))
        if slot is not None:
            slot.store(ck)
    return Compiled(ck, fwd.storages, make_ir, slot)
