"""Which pairs of accesses to one field the data access rules (access.py) must look at.

Two accesses are *apart* when, in some dimension of their multi-indices, both indices are the
same uniform affine form (kernel arguments and constants: one value in every thread and
iteration) up to a nonzero constant: x[t, 3] and x[t + 1, i], x[0] and x[1]. They never touch
the same element, so no rule can be broken by the pair, and the rules never look at it.

Looking at every pair made the checks quadratic: a kernel with N stores to x[0] ... x[N - 1]
(an unrolled ti.static loop) compiled in 79 s for N = 1,500. Here each access gets its affine
forms once, and the accesses apart from it are a bitset (a Python int: bit k is the group's
access k) made with one OR per dimension of the index, from bitsets grouped by form. Only the
pairs that are not apart are visited: for a group of N accesses, N affine forms per dimension,
N bitset operations of N bits (N²/64 machine words, in C) and the visits of the pairs that need
a look.
"""
from __future__ import annotations

from typing import Callable

from ...ir.nodes import Stmt
from ...ir.ops import Op

PARALLEL = ("pdim", "ploop")  # the loop keys of a task's parallel index


def canonical(form: dict) -> tuple[tuple, int]:
    """An affine form (access.affine: key -> coefficient, None the constant) as (its varying part: sorted (key, coefficient) pairs with a
    nonzero coefficient, its constant term)."""
    terms = tuple(sorted(((k, c) for k, c in form.items() if k is not None and c != 0), key=repr))
    return terms, form.get(None, 0)


class Pairs:
    """The accesses of one group (one field), in program order, with their canonical index forms
    (`forms[k]`: a tuple per dimension, or None when the access has no multi-index); affine(x):
    an index as an affine form (access.affine with the kernel's loop dimensions)."""

    def __init__(self, group: list, affine: Callable[[object], dict]):
        self.group = group
        self.forms = [None if s.index is None else tuple(canonical(affine(x)) for x in s.index)
                      for s in group]
        by_terms: dict = {}   # (ndim, dim, varying part) -> bitset of the accesses with it
        by_form: dict = {}    # (ndim, dim, varying part, constant) -> bitset
        for k, forms in enumerate(self.forms):
            for d, (terms, const) in enumerate(forms or ()):
                if _uniform(terms):
                    key = (len(forms), d, terms)
                    by_terms[key] = by_terms.get(key, 0) | (1 << k)
                    by_form[key + (const,)] = by_form.get(key + (const,), 0) | (1 << k)
        self._by_terms, self._by_form = by_terms, by_form
        self._apart: dict = {}

    def mask(self, pick) -> int:
        """The bitset of the group's accesses s with pick(s)."""
        out = 0
        for k, s in enumerate(self.group):
            if pick(s):
                out |= 1 << k
        return out

    def apart(self, k: int) -> int:
        """The bitset of the accesses apart from access k (module docstring)."""
        forms = self.forms[k]
        if not forms:
            return 0
        out = 0
        for d, (terms, const) in enumerate(forms):
            if _uniform(terms):
                key = (len(forms), d, terms, const)
                bits = self._apart.get(key)
                if bits is None:
                    bits = self._apart[key] = self._by_terms[key[:3]] & ~self._by_form[key]
                out |= bits
        return out

    def near(self, k: int, among: int) -> list:
        """The accesses of the bitset `among` that are not apart from access k, in program order."""
        return [self.group[j] for j in _bits(among & ~self.apart(k))]


def same_thread(a: Stmt, b: Stmt, pins: dict | None) -> set:
    """The parallel loop keys to which both a and b are pinned with the same value (pins:
    pinned.py pinned_loops): in them, the two run in the same thread (or not at all)."""
    if not pins:
        return set()
    pa, pb = pins.get(id(a), {}), pins.get(id(b), {})
    return {k for k, e in pa.items() if k[0] in PARALLEL and pb.get(k) == e}


def parallel_pins(s: Stmt, pins: dict | None) -> dict:
    """The parallel loop keys to which s is pinned, with their values."""
    return {k: e for k, e in (pins or {}).get(id(s), {}).items() if k[0] in PARALLEL}


def _uniform(terms: tuple) -> bool:
    return all(key[0] == "arg" for key, _c in terms)


def _bits(mask: int):
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def adds_what_it_reads(w: Stmt, buf, same) -> bool:
    """The store w is `x[e] = x[e] + v` (or `x[e] += v`, made a store by promote.py) where v reads
    x (buf); same(load, w): the load reads w's element."""
    v = w.args[1] if w.op is Op.GLOBAL_STORE else None
    if v is None or v.op not in (Op.ADD, Op.SUB):
        return False
    for own, other in ((v.args[0], v.args[1]), (v.args[1], v.args[0])):
        if own.op is Op.GLOBAL_LOAD and own.attr is buf and same(own, w):
            seen, todo = set(), [other]
            while todo:
                x = todo.pop()
                if id(x) not in seen:
                    seen.add(id(x))
                    if x.op is Op.GLOBAL_LOAD and x.attr is buf:
                        return True
                    todo.extend(x.args)
    return False
