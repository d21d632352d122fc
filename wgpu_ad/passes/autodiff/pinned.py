"""Stores that run in at most one iteration of a loop, for the access rules (access.py).

A serial loop. A store inside `for j in range(3)` whose index does not name j is stored again by
every iteration (only the last value survives), unless it runs in one of them only: `if j == 1:
x[t + 1, i] = 2.0 * x[t, i]` stores once per step t. Proven when the store is under a condition
`j == e` (or the else of `j != e`, or a conjunct of either) where j's coefficient is +-1 (one
solution, wrapping arithmetic included) and e does not change while loop j runs. Such a loop is
left out of the injectivity proof of the store (access.py _injective).

The parallel loop. Under `i == e` with i a parallel index (or an ndrange dimension of one) and e
uniform (kernel arguments, constants, and elements at such indices of fields that only earlier
tasks of the kernel write, `if i == target[None]`: one value in every thread), a statement runs in one
thread at most, the one whose index is e: `for i in range(n): if i == 0: s[None] = f(s[None])`
is one thread's read and update, like the kernel's top-level code. Two accesses pinned to the
same solution e (the same affine form) run in the same thread, so pairs of them are judged as
one thread's (access.py _private_dims); pinned to different solutions, or one not pinned, they
may be two threads' and are judged as such.
"""
from __future__ import annotations

from ...ir.nodes import Kernel, Stmt, walk
from ...ir.ops import Op
from .access import _combine, _enclosing_loops, _invariant, affine
from .access_pairs import PARALLEL as _PARALLEL, canonical


def pinned_loops(kernel: Kernel) -> dict[int, dict]:
    """id(stmt) -> {loop key: the value e its index is pinned to, as a canonical affine form} for
    the loops in which the statement runs in at most one iteration: it is under a condition
    `j == e` (or the else of `j != e`, or a conjunct of either) where j is the loop's index, with
    coefficient +-1 (one solution, wrapping arithmetic included), and e does not change while the
    loop runs (for a serial loop: arguments, the thread's indices, outer loops' indices, values
    computed before the loop; for the parallel loop: arguments, constants and reads of fields that
    only earlier tasks write, at such indices). `if j == 1:
    x[t + 1, i] = ...` inside `for j in range(3)` stores once per t."""
    loops = _enclosing_loops(kernel)
    ld = kernel.loop_dims
    out: dict[int, dict] = {}
    fixed_reads = _fixed_reads(kernel)

    def conjuncts(c: Stmt, taken: bool) -> list:
        if c.op is Op.NOT:
            return conjuncts(c.args[0], not taken)
        if c.op is (Op.AND if taken else Op.OR):
            return conjuncts(c.args[0], taken) + conjuncts(c.args[1], taken)
        return [c] if c.op is (Op.EQ if taken else Op.NE) else []

    def pins(c: Stmt, taken: bool, at: Stmt) -> dict:
        found = {}
        for eq in conjuncts(c, taken):
            a, b = eq.args
            if a.dtype is None or a.dtype.is_float:
                continue
            diff = _combine(affine(a, ld), affine(b, ld), -1)
            outer = {k for g in loops[id(at)] for k in g}
            for key, coef in diff.items():
                if key is None or key[0] not in ("sloop",) + _PARALLEL or abs(coef) != 1 or key not in outer:
                    continue
                inner = _inner_of(key, loops, at)
                if key[0] in _PARALLEL:  # one value in every thread
                    fixed = all(k is None or k == key or k[0] == "arg" or k in fixed_reads for k in diff)
                else:
                    fixed = all(k is None or k == key or k[0] in ("arg",) + _PARALLEL
                                or (k in outer and k not in inner) or _invariant(k, key, loops) for k in diff)
                if fixed:  # key = e: coef * key + rest = 0, coef = +-1
                    found[key] = canonical({k: -c * coef for k, c in diff.items() if k != key})
        return found

    def visit(block, pinned: dict):
        for s in block.stmts:
            if pinned:
                out[id(s)] = pinned
            for n, b in enumerate(s.blocks):
                extra = pins(s.args[0], n == 0, s) if s.op is Op.IF else {}
                visit(b, {**pinned, **extra} if extra else pinned)
    for t in kernel.tasks:
        visit(t.body, {})
    return out


def _fixed_reads(kernel: Kernel) -> set:
    """The affine keys of the kernel's loads that read the same value in every thread: of a field
    no task of the kernel writes but earlier ones (finished dispatches), at an index of arguments
    and constants."""
    written: dict = {}  # id(buffer) -> the last task that writes it
    reads = []
    for k, t in enumerate(kernel.tasks):
        for s in (s for blk in (t.bounds, t.body) for s in walk(blk)):
            if s.op in (Op.GLOBAL_STORE, Op.ATOMIC):
                written[id(s.attr[1] if s.op is Op.ATOMIC else s.attr)] = k
            elif s.op is Op.GLOBAL_LOAD and s.index is not None:
                reads.append((k, s))
    return {("value", id(s)) for k, s in reads if written.get(id(s.attr), -1) < k
            and all(key is None or key[0] == "arg" for x in s.index for key in affine(x, kernel.loop_dims))}


def _inner_of(key, loops: dict, at: Stmt) -> set:
    """The loop keys around `at` nested inside the loop `key` (their indices vary while it runs)."""
    keys = [k for g in loops[id(at)] for k in g]
    return set(keys[keys.index(key) + 1:]) if key in keys else set()
