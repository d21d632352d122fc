"""A kernel's WGSL: every task's module (wgsl.py TaskEmitter), the error-code table and the
launch plan (plan.py), as the CompiledKernel the runtime and the launcher take."""
from __future__ import annotations

from .. import plan
from ..ir.nodes import ArgSlot, Kernel, walk_task
from ..ir.ops import Op
from ..plan import CompiledKernel, CompiledTask
from ..types import f16, u32
from .ops_table import word_dtype
from .plan import stack_words, task_plan, words_of
from ..access_check import AccessCheck
from ..errors import ZeroDivisionCheck
from ..nan_check import GradCheck
from .common import DEFAULT_GRID_CAP, Options, arg_words, kept_assert
from .packing import choose_packs, plan_packs
from .wgsl import TaskEmitter


def _assert_codes(kernel: Kernel, debug: bool) -> tuple[dict[int, int], list[tuple[str, list]], list[str]]:
    """Error codes: ASSERTs (debug mode only; the gradient checks of check_nan always) and autodiff
    stack overflows (always), with their kinds."""
    codes, table, kinds = {}, [], []
    for t in kernel.tasks:
        for s in walk_task(t):
            if s.op is Op.ASSERT and kept_assert(s, debug):
                table.append((s.attr, [word_dtype(v.dtype) if v.dtype == f16 else v.dtype for v in s.args[1:]]))
                kinds.append("nan" if isinstance(s.attr, GradCheck) else
                             "access" if isinstance(s.attr, AccessCheck) else
                             "zerodiv" if isinstance(s.attr, ZeroDivisionCheck) else "assert")
                codes[id(s)] = len(table)   # 1 + position; 0 means "no error"
            elif s.op is Op.STACK_PUSH:
                cap = s.args[0].attr
                where = f" at {s.loc.file}:{s.loc.line}" if s.loc else ""
                if isinstance(cap, ArgSlot):  # sized at launch from the loop's bounds
                    table.append((f"the serial loop{where} ran more iterations in one thread than its bounds "
                                  f"gave at launch, more than its autodiff stack holds (compiler bug)", []))
                else:
                    table.append((f"the serial loop{where} ran more than {cap} iterations in one thread, more "
                                  f"than its autodiff stack holds; raise the limit with "
                                  f"ti.init(ad_stack_size=...) (it is {cap})", []))
                codes[id(s)] = len(table)
                kinds.append("stack")
    return codes, table, kinds


def _print_codes(kernel: Kernel) -> tuple[dict[int, int], tuple]:
    """Every PRINT's index (its records carry it) and the plan.Print records in that order; a
    kernel that prints gets the uniform word of its launch's print tag (plan.PrintTag)."""
    codes, table = {}, []
    for t in kernel.tasks:
        for s in walk_task(t):
            if s.op is Op.PRINT:
                codes[id(s)] = len(table)
                table.append(s.attr)
    if table and not any(isinstance(a.role, plan.PrintTag) for a in kernel.args):
        kernel.args.append(ArgSlot("print_tag", u32, len(kernel.args), plan.PrintTag()))
    return codes, tuple(table)


def generate(kernel: Kernel, *, float_atomics: bool, debug: bool, workgroup_size: int = 128,
             subgroups: bool = False, grid_cap: int | None = None, loop_check: bool = False,
             reduce_grid_cap: int | None = None, deterministic: bool = False,
             max_storage_buffers: int | None = None) -> CompiledKernel:
    """Compile every task of an IR kernel to a WGSL module; returns the runtime's plain data.

    float_atomics: use WGSL atomic<f32> add/sub (the device must have 'shader-float32-atomic');
    otherwise float atomics are compare-exchange loops on u32 bits.
    debug: keep ASSERTs (they report through the error buffer); without it they are dropped.
    subgroups: the device has WGSL subgroup operations ('subgroup' feature): the atomic adds
    that aggregate.py picks go through shaders/atomics.wgsl subgroup_add (one atomic per
    subgroup when its invocations add to one element).
    grid_cap: the most workgroups the launcher gives a range task (Runtime.grid_cap): constant
    ranges it always covers get one iteration per thread instead of a grid-stride loop.
    loop_check: every loop checks that it ran to its end (Mesa llvmpipe stops loops early).
    reduce_grid_cap: the most workgroups of a range task that pre-reduces into one address
    (passes/prereduce.py), below grid_cap: each thread then sums many iterations in a register.
    deterministic: a range task with float atomic adds runs in one invocation (results that do
    not depend on thread timing).
    max_storage_buffers: the most storage buffers a task may bind (the device's limit): a task
    that would bind more reads and writes some of them through one binding (packing.py).
    """
    opts = Options(float_atomics, debug, workgroup_size, subgroups, grid_cap, loop_check, reduce_grid_cap,
                   deterministic, max_storage_buffers)
    stack_words(kernel)  # stacks sized at launch read their capacity from the uniform block
    codes, table, kinds = _assert_codes(kernel, debug)
    print_codes, prints = _print_codes(kernel)
    packs = [[] for _ in kernel.tasks]
    emitted = [TaskEmitter(kernel, task, k, opts, codes, print_codes) for k, task in enumerate(kernel.tasks)]
    modules = [em.module() for em in emitted]
    for k, (task, (_, bindings)) in enumerate(zip(kernel.tasks, modules)):
        packs[k] = choose_packs(kernel, task, k, opts, bindings)  # (their offsets are new uniform words)
    if any(packs):  # every task again: one struct of uniform words for all
        emitted = [TaskEmitter(kernel, task, k, opts, codes, print_codes, packs[k])
                   for k, task in enumerate(kernel.tasks)]
        modules = [em.module() for em in emitted]
    tasks, plans, checked = [], [], False
    for k, (task, em, (wgsl, bindings)) in enumerate(zip(kernel.tasks, emitted, modules)):
        checked |= em.checks_loops
        tasks.append(CompiledTask(name=task.name or f"{kernel.name}_t{k}", wgsl=wgsl, entry_point="main",
                                  workgroup_size=em.wg, bindings=bindings, serial=em.serial,
                                  loc=next((s.loc for s in walk_task(task) if s.loc is not None), None)))
        plans.append(task_plan(task, em.serial, em.wg, em.stack_caps, em.one_pass, em.task_cap,
                               plan_packs(kernel, packs[k])))
    launch_plan = plan.LaunchPlan(words=words_of(kernel), buffers=tuple(b.source for b in kernel.buffers),
                                  tasks=tuple(plans), grid_cap=grid_cap or DEFAULT_GRID_CAP, prints=prints)
    return CompiledKernel(name=kernel.name, tasks=tasks, arg_words=arg_words(kernel), plan=launch_plan,
                          ret_dtype=kernel.ret, asserts=table, loop_check=checked, assert_kinds=kinds)


def format_wgsl(kernel: Kernel | CompiledKernel, *, float_atomics: bool = False, debug: bool = False,
                workgroup_size: int = 128) -> str:
    """All tasks' WGSL as one readable text, for printing (an IR kernel is compiled first)."""
    ck = kernel if isinstance(kernel, CompiledKernel) else generate(
        kernel, float_atomics=float_atomics, debug=debug, workgroup_size=workgroup_size)
    sep = "\n// " + "-" * 76 + "\n\n"
    return sep.join(t.wgsl for t in ck.tasks)

