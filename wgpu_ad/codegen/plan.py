"""The launch plan of a kernel (wgpu_ad/plan.py), from its IR: what the launcher reads instead of IR.

Uniform words come from the ArgSlots' roles, buffer sources from the Buffers, and each range
task's bounds become plain expressions over the words where they can be translated exactly
(integer arithmetic on constants and arguments); otherwise the launcher uses a fixed grid.
"""
from __future__ import annotations

from .. import plan
from ..ir.nodes import ArgSlot, Kernel, LaunchCapacity, Stmt, walk_task
from ..ir.ops import Op
from ..types import i32

_INT = frozenset(plan.INT_DTYPES)


def to_expr(s: Stmt | None):
    """The plan.Expr of an integer IR value, or None when it is not a function of constants and
    integer words alone (a field read, float math, an op the plan does not evaluate)."""
    if s is None or s.dtype is None or s.dtype.name not in _INT:
        return None
    if s.op is Op.CONST:
        return ("const", int(s.attr))
    if s.op is Op.ARG:
        return ("word", s.attr.index) if plan.word_dtype(s.attr.role) in ("i32", "u32") else None
    name = s.op.name.lower()
    if name not in plan.EXPR_OPS:
        return None
    args = s.args[1:] if s.op is Op.SELECT else s.args  # the condition of a select is a u1
    if any(a.dtype is None or a.dtype.name not in _INT for a in args):
        return None
    subs = [to_expr(a) for a in s.args]
    if any(e is None for e in subs):
        return None
    return (name, s.dtype.name, *subs)


def _fold(e):
    """A constant expression as ("const", value): the launcher then evaluates nothing."""
    if e is None or plan.uses_words(e) or e[0] == "const":
        return e
    return ("const", plan.evaluate(e, ()))


def stack_words(kernel: Kernel) -> None:
    """Give every stack whose capacity is known only at launch (LaunchCapacity) a word of the
    uniform block holding it (plan.StackCapacity); its STACK_ALLOC then names that ArgSlot."""
    for t in kernel.tasks:
        for s in walk_task(t):
            if s.op is Op.STACK_ALLOC and isinstance(s.attr, LaunchCapacity):
                cap = s.attr
                begin, end = _fold(to_expr(cap.begin)), _fold(to_expr(cap.end))
                if begin is None or end is None:
                    s.attr = cap.default
                    continue
                if not plan.uses_words(begin) and not plan.uses_words(end):
                    s.attr = max(1, end[1] - begin[1])
                    continue
                role = plan.StackCapacity(begin, end)
                slot = ArgSlot(f"{s.name or 'stack'}_depth", i32, len(kernel.args), role)
                kernel.args.append(slot)
                s.attr = slot


def task_plan(task, serial: bool, workgroup_size: int, stack: list, one_pass: bool,
              grid_cap: int | None = None, packs: tuple = ()) -> plan.TaskPlan:
    """One task's plan; stack: the capacities of its stacks (ints, or ArgSlots read at launch);
    grid_cap: the task's own cap on workgroups, if below the kernel's."""
    const = sum(c for c in stack if isinstance(c, int))
    words = tuple(c.index for c in stack if isinstance(c, ArgSlot))
    rng = None
    if not serial:
        begin, end = _fold(to_expr(task.begin)), _fold(to_expr(task.end))
        rng = None if begin is None or end is None else (begin, end)
    return plan.TaskPlan(serial=serial, range=rng, workgroup_size=workgroup_size, stack=(const, words),
                         one_pass=one_pass, grid_cap=grid_cap, packs=packs)


def words_of(kernel: Kernel) -> tuple:
    """The role of every word of the uniform block, in order (every word has one ArgSlot)."""
    by_index = {a.index: a for a in kernel.args}
    if sorted(by_index) != list(range(len(kernel.args))) or any(a.role is None for a in kernel.args):
        raise AssertionError(f"kernel {kernel.name!r}: uniform words without a role or with gaps "
                             f"({[(a.index, a.name, a.role) for a in kernel.args]}): compiler bug")
    return tuple(by_index[w].role for w in range(len(kernel.args)))
