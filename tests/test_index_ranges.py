"""The index-range proofs of the access rules (passes/autodiff/ranges.py) against enumeration: for
random affine indices over serial loops with constant or argument bounds, whatever `disjoint`
claims (the two indices never take a common value) and whatever `separated` claims (distinct
iterations give distinct values) must hold for every iteration, checked by listing them all in
Python. Pure IR, no GPU; the known examples make sure the claims are made at all."""
from __future__ import annotations

import itertools
import random

from wgpu_ad.ir.nodes import Block, Kernel, Stmt, Task
from wgpu_ad.ir.ops import Op
from wgpu_ad.passes.autodiff.access import affine
from wgpu_ad.passes.autodiff.ranges import IndexRanges
from wgpu_ad.types import i32


def _const(v: int) -> Stmt:
    return Stmt(Op.CONST, i32, [], v)


def _arg(k: int) -> Stmt:
    return Stmt(Op.ARG, i32, [], type("Slot", (), {"index": k})())


def _loops(bounds: list) -> tuple[Kernel, list]:
    """Nested serial loops `for v_k in range(lo_k, hi_k)` (bounds: Stmts) in one serial task; the
    loop index statements."""
    body = Block()
    block, indices = body, []
    for lo, hi in bounds:
        loop = Stmt(Op.RANGE_FOR, None, [lo, hi], blocks=[Block()])
        block.stmts.append(loop)
        block = loop.blocks[0]
        j = Stmt(Op.LOOP_INDEX, i32, [], loop)
        block.stmts.append(j)
        indices.append(j)
    return Kernel("k", [Task("serial", body)]), indices


def _index(coefs: list, const: int, indices: list) -> Stmt:
    """const + sum c_k v_k as IR."""
    out = _const(const)
    for c, j in zip(coefs, indices):
        if c:
            out = Stmt(Op.ADD, i32, [out, Stmt(Op.MUL, i32, [_const(c), j])])
    return out


def _access(*dims: Stmt) -> Stmt:
    return Stmt(Op.GLOBAL_LOAD, i32, [], None, index=tuple(dims))


def _ranges(kernel: Kernel) -> IndexRanges:
    return IndexRanges(kernel, lambda x: affine(x, kernel.loop_dims))


def test_random_disjoint_and_separated_claims_hold_for_every_iteration():
    rng = random.Random(26)
    claims = {"disjoint": 0, "separated": 0}
    for _ in range(400):
        m = rng.randint(1, 3)
        spans = [(rng.randint(-3, 3), rng.randint(0, 4)) for _ in range(m)]
        kernel, idx = _loops([(_const(lo), _const(lo + n)) for lo, n in spans])
        r = _ranges(kernel)
        values = [range(lo, lo + n) for lo, n in spans]
        ca, cb = [rng.randint(-4, 4) for _ in range(m)], [rng.randint(-4, 4) for _ in range(m)]
        ka, kb = rng.randint(-6, 6), rng.randint(-6, 6)
        a, b = _access(_index(ca, ka, idx)), _access(_index(cb, kb, idx))
        points = list(itertools.product(*values))
        if r.disjoint(a, b):
            claims["disjoint"] += 1
            va = {ka + sum(c * v for c, v in zip(ca, p)) for p in points}
            vb = {kb + sum(c * v for c, v in zip(cb, p)) for p in points}
            assert not va & vb, (ca, ka, cb, kb, spans)
        keys = r.separated(affine(a.index[0], kernel.loop_dims))
        if keys and points:
            claims["separated"] += 1
            assert {k[1] for k in keys} == {id(j.attr) for c, j in zip(ca, idx) if c}
            seen = {}
            for p in points:
                v = ka + sum(c * x for c, x in zip(ca, p))
                key = tuple(x for c, x in zip(ca, p) if c)
                assert seen.setdefault(v, key) == key, (ca, spans)
    assert claims["disjoint"] > 20 and claims["separated"] > 20, claims


def test_bounds_in_arguments_hold_for_every_argument_value():
    """for i in range(n): i + n and i never meet (the arguments cancel); i + 4 and i meet for some
    n, so no claim (the launch checks them: by_arguments), and j in range(i) inside it is bounded
    through i's bounds."""
    n = _arg(0)
    kernel, (i,) = _loops([(_const(0), n)])
    r = _ranges(kernel)
    shifted = _access(Stmt(Op.ADD, i32, [i, n]))
    assert r.disjoint(_access(i), shifted)
    for nv in range(0, 9):
        assert not set(range(nv)) & {v + nv for v in range(nv)}
    by4 = _access(Stmt(Op.ADD, i32, [i, _const(4)]))
    assert not r.disjoint(_access(i), by4) and r.by_arguments(_access(i), by4)
    kernel4, (i4,) = _loops([(_const(0), _const(4))])  # constant bounds: nothing for the arguments to decide
    assert not _ranges(kernel4).by_arguments(_access(i4), _access(Stmt(Op.ADD, i32, [i4, _const(3)])))

    # j in range(i), i in range(5): j + 5 never meets i (j <= 3 < 5 <= j + 5)
    kernel, (i, j) = _loops([(_const(0), _const(5)), (_const(0), None)])
    kernel.tasks[0].body.stmts[0].blocks[0].stmts[1].args[1] = i
    r = _ranges(kernel)
    assert r.disjoint(_access(i), _access(Stmt(Op.ADD, i32, [j, _const(5)])))
    assert not r.disjoint(_access(i), _access(Stmt(Op.ADD, i32, [j, _const(1)])))


def test_known_examples():
    """a[i + 4] vs a[i], i < 4: disjoint; a[i + 3]: not. 2 i + j, j < 2: separated; j < 3: not."""
    kernel, (i,) = _loops([(_const(0), _const(4))])
    r = _ranges(kernel)
    assert r.disjoint(_access(i), _access(Stmt(Op.ADD, i32, [i, _const(4)])))
    assert not r.disjoint(_access(i), _access(Stmt(Op.ADD, i32, [i, _const(3)])))
    for width, split in ((2, True), (3, False)):
        kernel, (i, j) = _loops([(_const(0), _const(4)), (_const(0), _const(width))])
        form = affine(_index([2, 1], 0, [i, j]), kernel.loop_dims)
        assert bool(_ranges(kernel).separated(form)) is split
