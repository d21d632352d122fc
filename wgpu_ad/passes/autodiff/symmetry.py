"""Pair loops whose terms are symmetric: one gather instead of two in the adjoint.

A pair task (transpose.py: i in parallel, j in a serial loop over the same range) accumulates
L = sum_ij F(i, j). When every term is symmetric, F(i, j) = F(j, i) as functions of what they
load, the gradient of a load x[g(j)] summed over all pairs equals that of its mirror x[g(i)]:
dL/dx_k = sum_j d1 F(k, j) + sum_i d2 F(i, k) = 2 sum_j d1 F(k, j). The gravity energy
-1/|x_i - x_j| is the classic case (the hand-written WGSL of the benchmarks relies on it). So
the adjoint leaves the loads that depend on j alone out and counts the loads that depend on i
alone twice: one task and no transposed replay (transpose.py's second task).

Symmetry is proved, not sampled: the value every atomic add of the loop body accumulates is put
in a canonical form, a polynomial with exact rational coefficients over atoms (the loop indices,
arguments, loads named by their buffer and the canonical form of their index, and functions of
canonical forms: sqrt, sin, exp, 1/x ...), summed per target element, and compared with the same
form with i and j swapped. Equal forms are equal functions. A function's arguments stay in their
order, never sorted as if it commuted: the gradient rules of a load and of its mirror then see the
same values in the same places, so even a rule that picks one side at a tie would agree (whereas
max(a, b) taken for max(b, a) would count its tie at i = j twice: 2 d1 = 2 instead of
d1 + d2 = 1). Only smooth functions are modelled; anything else (abs, min, max, select, integer
division, ...), or a form past MAX_TERMS terms, is "not proven" and the task keeps the two-gather
adjoint.
"""
from __future__ import annotations

from fractions import Fraction

from ...ir.nodes import Stmt, Task, walk
from ...ir.ops import AtomicKind, GroupOp, Op

MAX_TERMS = 512
# Every ALU op is decided (a test checks it): a smooth function kept as an atom of the form ...
_SMOOTH = frozenset({Op.SQRT, Op.RSQRT, Op.SIN, Op.COS, Op.TAN, Op.EXP, Op.LOG, Op.TANH, Op.POW})
# ... or arithmetic of the forms themselves, each with its rule in _Forms._form (CAST: int -> float)
_OWN_RULE = frozenset({Op.ADD, Op.SUB, Op.NEG, Op.MUL, Op.DIV, Op.CAST})
# ... or "not proven": kinks and steps (a tie rule may pick a side), integer and boolean ops
_NOT_SMOOTH = frozenset({Op.ABS, Op.SIGN, Op.FLOOR, Op.CEIL, Op.ROUND, Op.MIN, Op.MAX, Op.SELECT,
                         Op.FLOORDIV, Op.MOD, Op.NOT, Op.BIT_NOT, Op.BIT_AND, Op.BIT_OR, Op.BIT_XOR,
                         Op.SHL, Op.SHR, Op.AND, Op.OR, Op.LT, Op.LE, Op.GT, Op.GE, Op.EQ, Op.NE})
# ... or "not proven" for now: the other transcendentals (ASIN, ATAN2 ...), smooth where defined,
# but no pair kernel has needed them yet, and BITCAST (ti.stop_grad), whose zero derivative a
# form cannot carry
_NOT_MODELLED = (GroupOp.Transcendental - _SMOOTH) | frozenset({Op.BITCAST})
_I, _J = ("i",), ("j",)


class _NotProven(Exception):
    pass


# A polynomial is a dict {monomial: Fraction}; a monomial a sorted tuple of (atom, power); an atom
# a tuple ("i",), ("j",), ("arg", slot), ("load", buffer id, form), ("fn", op name, form...),
# ("inv", form) or ("cast", dtype name, form), where a form is a frozen polynomial (sorted tuple).

def _freeze(p: dict) -> tuple:
    return tuple(sorted(p.items(), key=repr))


def _const(c) -> dict:
    c = Fraction(c)
    return {(): c} if c else {}


def _atom(a: tuple) -> dict:
    return {((a, 1),): Fraction(1)}


def _add(p: dict, q: dict, sign: int = 1) -> dict:
    out = dict(p)
    for m, c in q.items():
        v = out.get(m, 0) + sign * c
        if v:
            out[m] = v
        else:
            out.pop(m, None)
    return out


def _mono_mul(a: tuple, b: tuple) -> tuple:
    powers = dict(a)
    for atom, k in b:
        powers[atom] = powers.get(atom, 0) + k
    return tuple(sorted(powers.items(), key=repr))


def _mul(p: dict, q: dict) -> dict:
    if len(p) * len(q) > MAX_TERMS * 8:
        raise _NotProven("too many terms")
    out: dict = {}
    for m1, c1 in p.items():
        for m2, c2 in q.items():
            m = _mono_mul(m1, m2)
            v = out.get(m, 0) + c1 * c2
            if v:
                out[m] = v
            else:
                out.pop(m, None)
    if len(out) > MAX_TERMS:
        raise _NotProven("too many terms")
    return out


def _swap_atom(a: tuple) -> tuple:
    if a == _I:
        return _J
    if a == _J:
        return _I
    return tuple(_swap_form(x) if isinstance(x, tuple) else x for x in a)  # an atom's tuples are forms


def _swap_form(form: tuple) -> tuple:
    return _freeze(swap(dict(form)))


def swap(p: dict) -> dict:
    """p with the indices i and j exchanged (inside loads and functions too)."""
    out: dict = {}
    for m, c in p.items():
        mono = tuple(sorted(((_swap_atom(a), k) for a, k in m), key=repr))
        out[mono] = out.get(mono, 0) + c
    return {m: c for m, c in out.items() if c}


class _Forms:
    """Canonical forms of the statements of one pair task (memoised)."""

    def __init__(self, task: Task, loop: Stmt):
        self.task, self.loop = task, loop
        self.memo: dict[int, dict] = {}

    def of(self, s: Stmt) -> dict:
        got = self.memo.get(id(s))
        if got is None:
            got = self.memo[id(s)] = self._form(s)
        return got

    def _form(self, s: Stmt) -> dict:
        op = s.op
        if op is Op.CONST:
            if not isinstance(s.attr, (int, float)) or isinstance(s.attr, bool):
                raise _NotProven("a non-numeric constant")
            return _const(s.attr)
        if op is Op.ARG:
            return _atom(("arg", s.attr.index))
        if op is Op.LOOP_INDEX:
            if s.attr is self.task:
                return _atom(_I)
            if s.attr is self.loop:
                return _atom(_J)
            raise _NotProven("another loop's index")
        if op is Op.GLOBAL_LOAD:
            return _atom(("load", id(s.attr), _freeze(self.of(s.args[0]))))
        args = [self.of(a) for a in s.args]
        if op is Op.ADD:
            return _add(args[0], args[1])
        if op is Op.SUB:
            return _add(args[0], args[1], -1)
        if op is Op.NEG:
            return _add({}, args[0], -1)
        if op is Op.MUL:
            return _mul(args[0], args[1])
        if s.dtype is None or not s.dtype.is_float:
            raise _NotProven(f"integer {op.name}")  # integer division, shifts, ...: not modelled
        if op is Op.DIV:
            den = args[1]
            if set(den) <= {()}:  # a constant
                if not den:
                    raise _NotProven("division by zero")
                return _mul(args[0], _const(1 / den[()]))
            return _mul(args[0], _atom(("inv", _freeze(den))))
        if op in _SMOOTH:
            return _atom(("fn", op.name, *(_freeze(a) for a in args)))
        if op is Op.CAST and s.args[0].dtype is not None and not s.args[0].dtype.is_float:
            return _atom(("cast", s.dtype.name, _freeze(args[0])))
        raise _NotProven(f"{op.name} is not smooth")


def symmetric_terms(task: Task, loop: Stmt) -> bool:
    """Whether the pair task's terms are symmetric in (i, j): the task and the loop `loop` (the
    last statement of its body) run over the same constant range, and the sum each iteration
    adds to every target element is the same with i and j swapped. transpose.py has checked the
    shape: straight-line statements, atomic adds and subs as the only writes."""
    lo, hi = loop.args
    if task.begin is None or task.end is None or not all(x.op is Op.CONST for x in (task.begin, task.end, lo, hi)):
        return False
    if (task.begin.attr, task.end.attr) != (lo.attr, hi.attr):
        return False
    forms = _Forms(task, loop)
    totals: dict[tuple, dict] = {}
    try:
        for s in walk(loop.blocks[0]):
            if s.op is Op.IF or s.op is Op.GLOBAL_STORE:
                return False
            if s.op is not Op.ATOMIC:
                continue
            kind, buf = s.attr
            if kind not in (AtomicKind.ADD, AtomicKind.SUB) or not buf.dtype.is_float:
                return False
            target = forms.of(s.args[0])
            if any(a in (_I, _J) or _mentions_index(a) for m in target for a, _ in m):
                return False  # a target that moves with i or j: not a sum over the pairs
            key = (id(buf), _freeze(target))
            totals[key] = _add(totals.get(key, {}), forms.of(s.args[1]), 1 if kind is AtomicKind.ADD else -1)
        return bool(totals) and all(swap(p) == p for p in totals.values())
    except _NotProven:
        return False


def _mentions_index(atom: tuple) -> bool:
    """Whether i or j occurs in the atom (in the forms it holds)."""
    return any(isinstance(x, tuple) and any(a in (_I, _J) or _mentions_index(a) for m, _ in x for a, _ in m)
               for x in atom)
