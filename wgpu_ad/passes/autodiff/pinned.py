"""Stores that run in at most one iteration of a serial loop, for the access rules (access.py).

A store inside `for j in range(3)` whose index does not name j is stored again by every iteration
(only the last value survives), unless it runs in one of them only: `if j == 1:
x[t + 1, i] = 2.0 * x[t, i]` stores once per step t. Proven when the store is under a condition
`j == e` (or the else of `j != e`, or a conjunct of either) where j's coefficient is +-1 (one
solution, wrapping arithmetic included) and e does not change while loop j runs. Such a loop is
left out of the injectivity proof of the store (access.py _injective).
"""
from __future__ import annotations

from ...ir.nodes import Kernel, Stmt
from ...ir.ops import Op
from .access import _combine, _enclosing_loops, _invariant, affine


def pinned_loops(kernel: Kernel) -> dict[int, set]:
    """stmt -> the serial loops in which it runs in at most one iteration: it is under a condition
    `j == e` (or the else of `j != e`, or a conjunct of either) where j is the loop's index, with
    coefficient +-1 (one solution, wrapping arithmetic included), and e does not change while the
    loop runs (arguments, the thread's indices, outer loops' indices, values computed before the
    loop). `if j == 1: x[t + 1, i] = ...` inside `for j in range(3)` stores once per t."""
    loops = _enclosing_loops(kernel)
    ld = kernel.loop_dims
    out: dict[int, set] = {}

    def conjuncts(c: Stmt, taken: bool) -> list:
        if c.op is Op.NOT:
            return conjuncts(c.args[0], not taken)
        if c.op is (Op.AND if taken else Op.OR):
            return conjuncts(c.args[0], taken) + conjuncts(c.args[1], taken)
        return [c] if c.op is (Op.EQ if taken else Op.NE) else []

    def pins(c: Stmt, taken: bool, at: Stmt) -> set:
        found = set()
        for eq in conjuncts(c, taken):
            a, b = eq.args
            if a.dtype is None or a.dtype.is_float:
                continue
            diff = _combine(affine(a, ld), affine(b, ld), -1)
            for key, coef in diff.items():
                if key is None or key[0] != "sloop" or abs(coef) != 1:
                    continue
                outer = {k for g in loops[id(at)] for k in g}
                inner = _inner_of(key, loops, at)
                if all(k is None or k == key or k[0] in ("arg", "pdim", "ploop") or (k in outer and k not in inner)
                       or _invariant(k, key, loops) for k in diff):
                    found.add(key)
        return found

    def visit(block, pinned: frozenset):
        for s in block.stmts:
            if pinned:
                out[id(s)] = pinned
            for n, b in enumerate(s.blocks):
                extra = pins(s.args[0], n == 0, s) if s.op is Op.IF else set()
                visit(b, pinned | extra)
    for t in kernel.tasks:
        visit(t.body, frozenset())
    return out


def _inner_of(key, loops: dict, at: Stmt) -> set:
    """The loop keys around `at` nested inside the loop `key` (their indices vary while it runs)."""
    keys = [k for g in loops[id(at)] for k in g]
    return set(keys[keys.index(key) + 1:]) if key in keys else set()
