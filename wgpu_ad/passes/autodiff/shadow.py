"""The checked variant of a forward kernel: the accesses whose data access rule the compiler could
not prove (access.py RuntimeChecks) track their elements in shadow buffers, and an access that
breaks the rule reports itself (records, encoding and messages: wgpu_ad/access_check.py).

Per field and task with checked accesses, a shadow buffer of one u32 per scalar (plan.Shadow),
zeroed by the launcher before each checked launch; `me` is the owner code of the parallel
iteration, (1 + its position in the range) << OWNER_SHIFT:

    load   x[e]:  old = atomicOr(&shadow[e], READ)
                  assert old & UPDATED == 0 and (old >> OWNER_SHIFT == 0 or old & ~3 == me)
    store  x[e]:  old = atomicOr(&shadow[e], me);       assert old == 0
    atomic x[e]:  old = atomicOr(&shadow[e], UPDATED);  assert old & READ == 0

and a write also finds no READ in the shadows of the field's checked loads in earlier tasks
(those dispatches have finished: a plain read sees them). So an element is stored at most once,
never after a read, and read only by the iteration that stored it or before any store: what the
adjoint's replay reads is what the forward read, and the gradient that flows through a stored
value stays in one iteration. Each check is one atomic on one word, so no interleaving of the
threads escapes it. Accesses proven safe are left as they are.
"""
from __future__ import annotations

from ... import plan
from ...access_check import OWNER_SHIFT, READ, UPDATED, AccessCheck
from ...ir.nodes import Buffer, Kernel, Stmt, Task, walk, walk_task
from ...ir.ops import AtomicKind, Op
from ...types import i32, u1, u32
from .access import RuntimeChecks, _buf
from .promote import _insert_before


def instrument(kernel: Kernel, checks: RuntimeChecks, mapping: dict) -> tuple:
    """Add the checks to `kernel`, a clone of the kernel `checks` was found in (mapping: id of an
    original statement -> its copy, ir/clone.py); returns the Shadow sources in order."""
    task_of = {id(s): k for k, t in enumerate(kernel.tasks) for s in walk_task(t)}
    shadows: dict[tuple, Buffer] = {}
    sources: list = []

    def shadow(b: Buffer, task: int) -> Buffer:
        key = (id(b), task)
        if key not in shadows:
            src = plan.Shadow(len(sources), b.source)
            sources.append(src)
            shadows[key] = Buffer(f"{b.name}_accesses", u32, src)
            kernel.buffers.append(shadows[key])
        return shadows[key]
    read_in = {}  # id(buffer) -> the tasks with checked loads of it
    for load in checks.loads.values():
        read_in.setdefault(id(_buf(load)), set()).add(task_of[id(mapping[id(load)])])
    codes: dict[int, Stmt] = {}
    in_body = {id(s) for t in kernel.tasks for s in walk(t.body)}
    for kind, found in (("load", checks.loads), ("store", checks.stores), ("update", checks.updates)):
        for orig in found.values():
            s = mapping[id(orig)]
            k = task_of[id(s)]
            if k not in codes:
                codes[k] = _owner_code(kernel.tasks[k])
            me = codes[k]
            if id(s) not in in_body:  # the range's bounds (every thread computes them): one owner
                me = Stmt(Op.CONST, u32, [], 1 << OWNER_SHIFT)
            buf = _buf(orig)
            others = checks.writers.get(id(orig), ()) if kind == "load" else checks.partners.get(id(orig), ())
            check = AccessCheck(kernel.name, buf.name, buf.source, orig.loc, kind,
                                tuple(x.loc for x in others if x.loc is not None),
                                "data" if id(orig) in checks.by_data else "arguments")
            earlier = sorted(a for a in read_in.get(id(buf), ()) if a < k) if kind != "load" else []
            made = _check(s, kind, shadow(buf, k), [shadow(buf, a) for a in earlier], me, check)
            _before(kernel, s, ([me] if me is not codes[k] else []) + made)
    return tuple(sources)


def _check(s: Stmt, kind: str, sh: Buffer, earlier: list, me: Stmt, check: AccessCheck) -> list:
    """The statements that check access s (of `kind`) against its shadow `sh` (and the shadows of
    the earlier tasks' checked loads of the field, for a write)."""
    out: list = []

    def emit(op, dtype, args, attr=None, index=None) -> Stmt:
        x = Stmt(op, dtype, args, attr, loc=s.loc, index=index)
        out.append(x)
        return x

    def const(v: int) -> Stmt:
        return emit(Op.CONST, u32, [], v)
    idx = s.args[0]
    bit = me if kind == "store" else const(READ if kind == "load" else UPDATED)
    old = emit(Op.ATOMIC, u32, [idx, bit], (AtomicKind.OR, sh), index=s.index)
    zero = const(0)
    if kind == "load":
        updated = emit(Op.NE, u1, [emit(Op.BIT_AND, u32, [old, const(UPDATED)]), zero])
        owner = emit(Op.BIT_AND, u32, [old, const(0xFFFFFFFF & ~(READ | UPDATED))])
        other = emit(Op.AND, u1, [emit(Op.NE, u1, [owner, zero]), emit(Op.NE, u1, [owner, me])])
        ok = emit(Op.NOT, u1, [emit(Op.OR, u1, [updated, other])])
        found = old
    else:
        found = old if kind == "store" else emit(Op.BIT_AND, u32, [old, const(READ)])
        for e in earlier:  # the loads of finished dispatches
            seen = emit(Op.GLOBAL_LOAD, u32, [idx], e, index=s.index)
            found = emit(Op.BIT_OR, u32, [found, emit(Op.BIT_AND, u32, [seen, const(READ)])])
        ok = emit(Op.EQ, u1, [found, zero])
    at = idx if idx.dtype == i32 else emit(Op.CAST, i32, [idx])
    emit(Op.ASSERT, None, [ok, found, at, me], check)
    return out


def _owner_code(t: Task) -> Stmt:
    """(1 + the iteration's position in the task's range) << OWNER_SHIFT, computed at the start of
    the task's body (1 << OWNER_SHIFT in a serial task: one thread)."""
    if t.kind != "range":
        code = Stmt(Op.CONST, u32, [], 1 << OWNER_SHIFT)
        t.body.stmts.insert(0, code)
        return code
    j = Stmt(Op.LOOP_INDEX, i32, [], t, name=None)
    made = [j]
    if t.begin is not None:
        j = Stmt(Op.SUB, i32, [j, t.begin if t.begin.dtype == i32 else _cast(t.begin, made)])
        made.append(j)
    u = Stmt(Op.CAST, u32, [j])
    one = Stmt(Op.CONST, u32, [], 1)
    shift = Stmt(Op.CONST, u32, [], OWNER_SHIFT)
    n = Stmt(Op.ADD, u32, [u, one])
    code = Stmt(Op.SHL, u32, [n, shift], name="access_owner")
    made += [u, one, n, shift, code]
    t.body.stmts[0:0] = made
    return code


def _cast(x: Stmt, made: list) -> Stmt:
    c = Stmt(Op.CAST, i32, [x])
    made.append(c)
    return c


def _before(kernel: Kernel, target: Stmt, stmts: list) -> None:
    for t in kernel.tasks:
        for block in (t.bounds, t.body, t.epilogue):
            if _insert_before(block, target, stmts):
                return
    raise AssertionError(f"{target!r} is in no task (compiler bug)")
