"""Index ranges: two accesses whose indices, in some dimension, take values in disjoint intervals
never touch the same element (for the access rules, access.py).

`for i in range(4): a[i + 4] = h(a[i])` stores a[4..7] and reads a[0..3]; `x[t + 1, i] = g(x[t, i])`
inside `for t in range(T)` with a read of `x[0, i]` stores rows 1..T and never row 0. The indices
differ by a varying amount, so comparing the two affine forms cannot tell them apart; their ranges
can.

The bounds. While a loop's body runs, its index lies in the loop's range: a serial loop
`range(b, e)` (a RANGE_FOR counts up by one from b and stops before e) has b <= j <= e - 1, a
parallel loop's index those of its task (begin <= i <= end - 1), a decoded ndrange dimension
0 <= q <= extent - 1. Each bound is an affine form over kernel arguments, or unknown (a value read
from a field, a variable, a bound that is itself unknown). An index form c0 + sum_k c_k v_k
(access.affine) is then bounded by

    lo = c0 + sum_{c_k > 0} c_k lo(v_k) + sum_{c_k < 0} c_k hi(v_k)     (hi alike, lo and hi swapped)

with an argument's bounds the argument itself, and a loop index's bounds its loop's, evaluated
in turn the same way (a loop `range(i)` inside `for i in range(n)`: 0 <= j <= n - 2).

The proof. Let A and B be the index forms, in one dimension, of two accesses to one field. In one
launch every argument has one value. Whichever threads and iterations run the two accesses, each
value A takes lies in [lo(A), hi(A)] and each value B takes in [lo(B), hi(B)], by the bounds above
(every loop index is bounded on its own, so this holds for any two iterations, not only one: the
same loop may appear in both forms). If lo(B) - hi(A), as an affine form, is a constant c > 0, it
is c whatever the arguments, so every value of B exceeds every value of A; so when hi(B) - lo(A)
is a constant < 0. Then no execution of B meets an execution of A in that dimension, and the two
never touch the same element: not in one iteration, nor in two, nor in two threads. Nothing else
is claimed; the rules then treat the pair as apart.

One index, many loops (separated). A dimension c0 + sum_k c_k v_k whose varying terms are all
loop indices (arguments aside) separates them when, ordered by |c_k|, each |c_k| exceeds
sum_{j before k} |c_j| (hi_j - lo_j) with constant widths hi_j - lo_j (the last one's width is not
needed): a linearised index `y[2 * i + j]` with j in range(2). Proof: two points that differ in
some v_k; let k be the last in the order where they differ; its term changes by at least |c_k|,
and the terms before it by at most sum_{j before k} |c_j| (hi_j - lo_j) < |c_k| together, and no
later term changes, so the two values differ (mixed radix). A store whose dimensions separate every
loop around it stores each element in one iteration of one thread (access.py _injective).

Assumed, as by every access rule: index arithmetic does not wrap around its 32 bits (constant
bounds beyond +-2**30 are treated as unknown), and indices are within the field's shape (an index
past the end of one dimension would alias an element of the next).
"""
from __future__ import annotations

from ...ir.nodes import Kernel, Stmt, walk
from ...ir.ops import Op
from .access_pairs import canonical

Form = dict  # access.affine: key -> coefficient, None the constant term
_LIMIT = 1 << 30


class IndexRanges:
    """The loop indices of one kernel with their bounds (module docstring); affine(v): access.affine
    with the kernel's loop dimensions."""

    def __init__(self, kernel: Kernel, affine):
        self._affine = affine
        self._serial = {id(s): s for t in kernel.tasks for s in walk(t.body) if s.op is Op.RANGE_FOR}
        self._tasks = {id(t): t for t in kernel.tasks}
        self._dims = {("pdim", id(task), d): (q, task) for q, (task, d) in kernel.loop_dims.items()}
        self._memo: dict = {}

    def disjoint(self, a: Stmt, b: Stmt) -> bool:
        """In some dimension of their multi-indices, the values of a's index and b's index lie in
        disjoint intervals: the two accesses never touch the same element (module docstring)."""
        if a.index is None or b.index is None or len(a.index) != len(b.index):
            return False
        for x, y in zip(a.index, b.index):
            lo_a, hi_a = self.bounds(self._affine(x))
            lo_b, hi_b = self.bounds(self._affine(y))
            if _positive(lo_b, hi_a) or _positive(lo_a, hi_b):
                return True
        return False

    def by_arguments(self, a: Stmt, b: Stmt) -> bool:
        """Whether the kernel's arguments decide if a and b may meet: in some dimension a gap
        between their ranges (lo(b) - hi(a) or lo(a) - hi(b)) is known and names an argument
        (a[i + 4] and a[i] with i in range(n): 5 - n, apart for n <= 4). Such a pair is checked at
        run time rather than refused (access.py)."""
        if a.index is None or b.index is None or len(a.index) != len(b.index):
            return False
        for x, y in zip(a.index, b.index):
            lo_a, hi_a = self.bounds(self._affine(x))
            lo_b, hi_b = self.bounds(self._affine(y))
            for lo, hi in ((lo_b, hi_a), (lo_a, hi_b)):
                if lo is not None and hi is not None and canonical(_add(lo, hi, -1))[0]:
                    return True
        return False

    def separated(self, form: Form) -> set:
        """The loop keys an index dimension separates (module docstring: mixed radix), or none."""
        terms = sorted(((k, c) for k, c in form.items() if k is not None and c != 0 and k[0] != "arg"),
                       key=lambda kc: abs(kc[1]))
        if any(k[0] not in ("sloop", "pdim", "ploop") for k, _c in terms):
            return set()
        spread = 0
        for n, (k, c) in enumerate(terms):
            if abs(c) <= spread:
                return set()
            if n < len(terms) - 1:
                lo, hi = self._key_bounds(k)
                width = None if lo is None or hi is None else canonical(_add(hi, lo, -1))
                if width is None or width[0] or abs(width[1]) >= _LIMIT:
                    return set()
                spread += abs(c) * max(width[1], 0)
        return {k for k, _c in terms}

    def bounds(self, form: Form) -> tuple[Form | None, Form | None]:
        """(lo, hi) of an affine form as affine forms over arguments; None where unknown."""
        lo, hi = {None: form.get(None, 0)}, {None: form.get(None, 0)}
        for key, c in form.items():
            if key is None or c == 0:
                continue
            if key[0] == "arg":
                k_lo = k_hi = {key: 1}
            else:
                k_lo, k_hi = self._key_bounds(key)
            low, high = (k_lo, k_hi) if c > 0 else (k_hi, k_lo)
            lo = None if lo is None or low is None else _add(lo, low, c)
            hi = None if hi is None or high is None else _add(hi, high, c)
        return _bounded(lo), _bounded(hi)

    def _key_bounds(self, key) -> tuple[Form | None, Form | None]:
        if key in self._memo:
            return self._memo[key]
        self._memo[key] = (None, None)  # (a bound that names its own loop is unknown)
        out: tuple = (None, None)
        if key[0] == "sloop" and key[1] in self._serial:
            out = self._range(*self._serial[key[1]].args)
        elif key[0] == "ploop" and key[1] in self._tasks:
            task = self._tasks[key[1]]
            out = self._range(task.begin, task.end)
        elif key[0] == "pdim" and key in self._dims:
            out = self._dim(*self._dims[key])
        self._memo[key] = out
        return out

    def _range(self, begin: Stmt | None, end: Stmt | None) -> tuple:
        """begin <= j <= end - 1 for the index j of a loop over range(begin, end)."""
        if begin is None or end is None:
            return None, None
        lo = self.bounds(self._affine(begin))[0]
        hi = self.bounds(self._affine(end))[1]
        return lo, None if hi is None else _add(hi, {None: -1}, 1)

    def _dim(self, q: Stmt, task) -> tuple:
        """A parallel dimension's index q (frontend/parallel.py): the task's index itself, or,
        decoded from it (the task counts from 0), `rest - (rest / e) * e` in [0, e - 1] and the
        quotient `rest / e` in [0, hi(rest) / e], for a constant extent e > 0."""
        if q.op is Op.LOOP_INDEX:
            return self._range(task.begin, task.end)
        if task.begin is None or not (task.begin.op is Op.CONST and int(task.begin.attr) == 0):
            return None, None
        const = _const_extent
        if (q.op is Op.SUB and q.args[1].op is Op.MUL and (e := const(q.args[1].args[1]))
                and q.args[1].args[0].op is Op.DIV and q.args[1].args[0].args[0] is q.args[0]
                and const(q.args[1].args[0].args[1]) == e):
            return {None: 0}, {None: e - 1}
        if q.op is Op.MOD and (e := const(q.args[1])):
            return {None: 0}, {None: e - 1}
        if q.op is Op.DIV and (e := const(q.args[1])):
            top = self._quotient_top(q.args[0], task)
            return {None: 0}, None if top is None else {None: top // e}
        return None, None

    def _quotient_top(self, r: Stmt, task) -> int | None:
        """The largest value of r, a task index or a quotient of one (non-negative), when constant."""
        if r.op is Op.LOOP_INDEX and r.attr is task:
            hi = self._range(task.begin, task.end)[1]
            return hi[None] if hi is not None and set(hi) == {None} else None
        if r.op is Op.DIV and (e := _const_extent(r.args[1])):
            top = self._quotient_top(r.args[0], task)
            return None if top is None else top // e
        return None


def _const_extent(s: Stmt) -> int | None:
    """A positive integer constant (an ndrange extent), else None."""
    if s.op is Op.CONST and s.dtype is not None and not s.dtype.is_float and 0 < int(s.attr) < _LIMIT:
        return int(s.attr)
    return None


def _add(a: Form, b: Form, c: int) -> Form:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + c * v
    return {k: v for k, v in out.items() if v != 0 or k is None}


def _bounded(f: Form | None) -> Form | None:
    """f, or None (unknown) when a constant part is beyond what 32-bit index arithmetic holds."""
    if f is None or any(abs(v) >= _LIMIT for v in f.values()):
        return None
    return f


def _positive(lo: Form | None, hi: Form | None) -> bool:
    """lo - hi is a constant > 0 (the arguments cancel): every value above lo exceeds every value
    below hi."""
    if lo is None or hi is None:
        return False
    terms, const = canonical(_add(lo, hi, -1))
    return not terms and const > 0
