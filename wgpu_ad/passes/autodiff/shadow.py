"""The checked variant of a forward kernel: the accesses whose data access rule the compiler could
not prove (access.py RuntimeChecks) track their elements in shadow buffers, and a write that breaks
the rule reports itself (records and messages: wgpu_ad/access_check.py).

Per field with checked accesses, a shadow buffer of one u32 per scalar (plan.Shadow), zeroed by the
launcher before each checked launch:

    load    x[e]:  atomicOr(&x_accesses[e], READ)
    store   x[e]:  old = atomicOr(&x_accesses[e], STORED(task));  assert old & (READ | STORED(task)) == 0
    atomic  x[e]:  old = atomicOr(&x_accesses[e], UPDATED);       assert old & READ == 0

A load after the (single) store of its element sees what the adjoint's replay will see, so it
passes; a store after a load, or a second store, fails. Everything else is left as it is.
"""
from __future__ import annotations

from ... import plan
from ...access_check import READ, UPDATED, AccessCheck, stored
from ...ir.nodes import Buffer, Kernel, Stmt, walk_task
from ...ir.ops import AtomicKind, Op
from ...types import i32, u1, u32
from .access import RuntimeChecks, _buf
from .promote import _insert_before


def instrument(kernel: Kernel, checks: RuntimeChecks, mapping: dict) -> tuple:
    """Add the checks to `kernel`, a clone of the kernel `checks` was found in (mapping: id of an
    original statement -> its copy, ir/clone.py); returns the Shadow sources in order."""
    shadows: dict[int, Buffer] = {}
    sources = []
    for b in checks.buffers():
        src = plan.Shadow(len(sources), b.source)
        sources.append(src)
        shadows[id(b)] = Buffer(b.name + "_accesses", u32, src)
        kernel.buffers.append(shadows[id(b)])
    task_of = {id(s): k for k, t in enumerate(kernel.tasks) for s in walk_task(t)}
    for load in checks.loads.values():
        s = mapping[id(load)]
        _before(kernel, s, _or(s, shadows[id(_buf(load))], READ))
    for w in list(checks.stores.values()) + list(checks.updates.values()):
        s = mapping[id(w)]
        update = w.op is Op.ATOMIC
        bit = UPDATED if update else stored(task_of[id(s)])
        made = _or(s, shadows[id(_buf(w))], bit)
        old = made[-1]
        mask = _const(READ if update else READ | bit, s)
        hit = Stmt(Op.BIT_AND, u32, [old, mask], loc=s.loc)
        zero = _const(0, s)
        ok = Stmt(Op.EQ, u1, [hit, zero], loc=s.loc)
        idx = s.args[0]
        at = idx if idx.dtype == i32 else Stmt(Op.CAST, i32, [idx], loc=s.loc)
        loads = tuple(x.loc for x in checks.partners.get(id(w), ()) if x.loc is not None)
        check = AccessCheck(kernel.name, _buf(w).name, _buf(w).source, w.loc, loads, update)
        assert_ = Stmt(Op.ASSERT, None, [ok, old, at], check, loc=s.loc)
        _before(kernel, s, made + [mask, hit, zero, ok] + ([at] if at is not idx else []) + [assert_])
    return tuple(sources)


def _or(s: Stmt, shadow: Buffer, bit: int) -> list:
    """[the bit, atomicOr(&shadow[index of s], bit)]."""
    c = _const(bit, s)
    return [c, Stmt(Op.ATOMIC, u32, [s.args[0], c], (AtomicKind.OR, shadow), name=shadow.name, loc=s.loc,
                    index=s.index)]


def _const(v: int, s: Stmt) -> Stmt:
    return Stmt(Op.CONST, u32, [], v, loc=s.loc)


def _before(kernel: Kernel, target: Stmt, stmts: list) -> None:
    for t in kernel.tasks:
        for block in (t.bounds, t.body, t.epilogue):
            if _insert_before(block, target, stmts):
                return
    raise AssertionError(f"{target!r} is in no task (compiler bug)")
