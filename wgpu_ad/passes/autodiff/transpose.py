"""Pair loops on CPU adapters: gathers instead of scatters in the adjoint.

On a CPU adapter `for i, j in ti.ndrange(N, M)` runs i in parallel and j as a serial loop in each
thread (frontend/parallel.py `parallel_prefix`). In its adjoint, the gradient of a load x[i] is
summed in a register over the j loop and written once per thread, but the gradient of a load
x[j] is an atomic add from every thread into the same element in every iteration. lavapipe sums
those per subgroup before the one atomic (passes/prereduce.py), and that subgroup sum alone costs
about as much as the pair's whole arithmetic: the gravity adjoint at N=1024 takes 4.9 ms, 1.45 ms
without the x[j] gradients.

So the adjoint of such a task is split in two tasks. The first is the usual adjoint with the
loads that depend on j and not on i left out of the differentiation; the second replays the
*transposed* task (j in parallel, i in a serial loop in each thread) and differentiates only
those loads, whose gradients are then summed in registers over the i loop too. A gradient is a
sum over the loads it flows into, so the two tasks add up to the whole adjoint. The pair's
forward arithmetic is replayed twice, once per task, which is cheaper on a CPU than the subgroup
sums it removes (gravity N=1024 adjoint: 5.1 -> 2.7 ms). GPUs run every (i, j) as its own thread
and never see this shape (`min_parallel` is None there).

A task is transposed when reordering its iterations cannot change any value: its body is a
prefix of straight-line statements that depend on i or nothing (no control flow, no effects, no
local variables) and one serial loop over task-invariant bounds, with nothing after it; the loop
body has no global stores, no atomics but add/sub, no random numbers, no `while`/`break` and no
local variable that lives across iterations; and no buffer it accumulates into is read in it
(the second task would read the first one's gradient writes). Which task differentiates which
load only decides where its gradient is summed: each task visits every (i, j), so any partition
of the loads gives the whole gradient.

A task whose terms are symmetric in (i, j), like the gravity energy, needs no transposed task at
all: the gradients of the loads of i count twice instead (symmetry.py, tried first).

And when it pays. The loop's constant trip count must give the transposed task at least
`min_threads` threads (Runtime.min_parallel: what fills the cores). The replay the split adds
must cost less than the subgroup sums it removes: the loop body's arithmetic, counted with the
weights of _WEIGHT (_WEIGHT_ONE count 1, _UNWEIGHTED 0), may be at most SUM_COST per moved load.
Measured on lavapipe, the gravity energy with extra terms, 2 moved loads, adjoint time split /
unsplit: weight 21 (the plain energy) 2.7 / 5.0 ms; 85 (cheap arithmetic) 6.3 / 7.4 ms; 66 (a sin
and a cos) 4.9 / 6.5 ms; 111 7.5 / 7.8 ms; 201 12.9 / 10.4-13.8 ms; 381 24.0 / 16.5 ms.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...ir.clone import clone_block
from ...ir.nodes import Block, Kernel, Stmt, Task, walk
from ...ir.ops import AtomicKind, GroupOp, Op
from ..licm import licm
from .symmetry import symmetric_terms

_REFUSED_IN_LOOP = frozenset({Op.GLOBAL_STORE, Op.RANDOM, Op.WHILE, Op.BREAK, Op.CONTINUE, Op.RETURN,
                              Op.STACK_ALLOC, Op.STACK_PUSH, Op.STACK_POP, Op.WG_SUM, Op.WG_LEADER,
                              Op.PRINT})
_PREFIX_OPS_REFUSED = _REFUSED_IN_LOOP | frozenset({Op.ATOMIC, Op.IF, Op.RANGE_FOR, Op.ALLOCA,
                                                    Op.LOCAL_LOAD, Op.LOCAL_STORE})
SUM_COST = 48  # what one subgroup-summed atomic add per iteration saves, in _WEIGHT units
# the costly ops: transcendentals, divisions and roots, loads
_WEIGHT = {**{op: 20 for op in GroupOp.Transcendental},
           **{op: 4 for op in (Op.DIV, Op.FLOORDIV, Op.MOD, Op.SQRT, Op.RSQRT)},
           Op.GLOBAL_LOAD: 2}
# one unit each: cheap arithmetic, comparisons, selects, atomic adds
_WEIGHT_ONE = frozenset({Op.NEG, Op.ABS, Op.SIGN, Op.FLOOR, Op.CEIL, Op.ROUND, Op.NOT, Op.BIT_NOT,
                         Op.CAST, Op.BITCAST, Op.ADD, Op.SUB, Op.MUL, Op.MIN, Op.MAX, Op.BIT_AND,
                         Op.BIT_OR, Op.BIT_XOR, Op.SHL, Op.SHR, Op.AND, Op.OR, Op.LT, Op.LE, Op.GT,
                         Op.GE, Op.EQ, Op.NE, Op.SELECT, Op.ATOMIC})
# free: constants, arguments, indices, registers, structure
_UNWEIGHTED = frozenset({Op.CONST, Op.ARG, Op.LOOP_INDEX, Op.ALLOCA, Op.LOCAL_LOAD, Op.LOCAL_STORE, Op.IF,
                         Op.RANGE_FOR, Op.ASSERT})
# every op the loop body may hold (_REFUSED_IN_LOOP never reaches the weighing); a test checks it
_COST = {**dict.fromkeys(_WEIGHT_ONE, 1), **dict.fromkeys(_UNWEIGHTED, 0), **_WEIGHT}


@dataclass
class Split:
    """How one range task's adjoint is split (see the module docstring). A task whose terms are
    symmetric in the pair (symmetry.py) needs no transposed task: the loads of j alone are left
    out and those of i alone count twice (`double`); transposed is None then."""

    transposed: Task | None     # j in parallel, i serial: a primal task, differentiated too
    skip: set                   # ids of the loads the original task's adjoint leaves out
    skip_transposed: set        # ids of the loads the transposed task's adjoint leaves out
    loop_dims: dict             # for demote.py: the original j index -> (marker, 0)
    marker: Task | None         # stands for the transposed task in loop_dims
    double: set = frozenset()   # ids of the loads whose gradient the original task's adjoint doubles


@dataclass
class PairShape:
    """A range task of the shape above: `prefix`, then the serial `loop` (`loop_orig` in the
    primal task); `on_i` / `on_j`: ids of the values that depend on the task's / the loop's index;
    `moved`: ids of the loads of j alone, whose gradients the split sums elsewhere."""

    prefix: list
    loop: Stmt
    loop_orig: Stmt
    on_i: set
    on_j: set
    moved: set


def pair_shape(t: Task, orig: Task, flags: set, grads: dict, min_threads: int) -> PairShape | None:
    """Whether `t` (a private copy of the primal task `orig`) has the shape above, with at least
    `min_threads` iterations of its loop. grads: id(primal Buffer) -> its gradient."""
    if t.kind != "range" or flags or t.begin is None or t.end is None or not t.body.stmts:
        return None
    *prefix, loop = t.body.stmts
    loop_orig = orig.body.stmts[-1] if orig.body.stmts else None
    if loop.op is not Op.RANGE_FOR or loop_orig is None or loop_orig.op is not Op.RANGE_FOR:
        return None
    bounds = {id(s) for s in t.bounds.stmts}
    if not all(id(a) in bounds for a in loop.args) or not {id(t.begin), id(t.end)} <= bounds:
        return None
    lo, hi = loop.args
    if lo.op is not Op.CONST or hi.op is not Op.CONST or hi.attr - lo.attr < min_threads:
        return None
    if any(s.op in _PREFIX_OPS_REFUSED or s.blocks for s in prefix):
        return None
    inner = list(walk(loop.blocks[0]))
    declared = {id(s) for s in inner if s.op is Op.ALLOCA}
    for s in inner:
        if s.op in _REFUSED_IN_LOOP:
            return None
        if s.op is Op.ATOMIC and s.attr[0] not in (AtomicKind.ADD, AtomicKind.SUB):
            return None
        if s.op in (Op.LOCAL_LOAD, Op.LOCAL_STORE) and id(s.args[0]) not in declared:
            return None
    # which values depend on i (the task's index) and which on j (the loop's)
    on_i = _dependents(t.body, lambda s: s.op is Op.LOOP_INDEX and s.attr is t)
    on_j = _dependents(t.body, lambda s: s.op is Op.LOOP_INDEX and s.attr is loop)
    moved = {id(s) for s in inner if s.op is Op.GLOBAL_LOAD and id(s.attr) in grads
             and id(s.args[0]) in on_j and id(s.args[0]) not in on_i}
    accumulated = {id(s.attr[1]) for s in inner if s.op is Op.ATOMIC}
    if not moved or any(s.op is Op.GLOBAL_LOAD and id(s.attr) in accumulated for s in walk(t.body)):
        return None
    return PairShape(prefix, loop, loop_orig, on_i, on_j, moved)


def symmetric_split(t: Task, shape: PairShape, grads: dict) -> Split | None:
    """The split of a pair task whose terms are symmetric in (i, j) (symmetry.py): no replay to
    pay for, so always worth it; None when they are not."""
    if not symmetric_terms(t, shape.loop):
        return None
    double = {id(s) for s in walk(t.body) if s.op is Op.GLOBAL_LOAD and id(s.attr) in grads
              and id(s.args[0]) in shape.on_i and id(s.args[0]) not in shape.on_j}
    return Split(None, shape.moved, set(), {}, None, double)


def transposed_split(t: Task, shape: PairShape) -> Split | None:
    """The split of a pair task into its adjoint and the adjoint of its transposed task, or None
    when the replay it adds would cost more than the sums it saves."""
    prefix, loop, loop_orig, moved = shape.prefix, shape.loop, shape.loop_orig, shape.moved
    if sum(_COST[s.op] for s in walk(loop.blocks[0])) > SUM_COST * len(moved):
        return None
    tt, m = _transposed(t, prefix, loop)
    # the loads of x[j] are loop-invariant now: out of the loop, their gradients are summed in
    # registers over it and written once per thread
    licm(Kernel(tt.name, [tt]))
    differentiated = {id(s) for s in walk(t.body) if s.op is Op.GLOBAL_LOAD}
    skip_tt = {id(m[k]) for k in differentiated - moved}
    # demote.py reads the primal's multi-indices (Stmt.index, which name the statements of
    # `orig`): there the serial loop's index becomes the transposed task's parallel dimension
    marker = Task("range", Block(), Block(), name=tt.name)
    dims = {}
    for s in walk(t.body):
        for x in _index_stmts(s.index):
            if x.op is Op.LOOP_INDEX and x.attr is loop_orig:
                dims[x] = (marker, 0)
    return Split(tt, moved, skip_tt, dims, marker)


def split_pair_task(t: Task, orig: Task, flags: set, grads: dict, min_threads: int) -> Split | None:
    """The split of `t` (a private copy of the primal task `orig`), or None when `t` does not
    have the shape above or the split would not pay (the adjoint's symmetry and transpose steps
    in one)."""
    shape = pair_shape(t, orig, flags, grads, min_threads)
    if shape is None:
        return None
    return symmetric_split(t, shape, grads) or transposed_split(t, shape)


def _dependents(block: Block, root) -> set:
    """ids of the statements of `block` whose value depends on a statement matching `root`."""
    out: set = set()
    for s in walk(block):
        if root(s) or any(id(a) in out for a in s.args):
            out.add(id(s))
    return out


def _index_stmts(index) -> list:
    """The statements of a multi-index's expressions (Stmt.index), operands included."""
    out, todo, seen = [], [x for x in (index or ()) if isinstance(x, Stmt)], set()
    while todo:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        out.append(x)
        todo.extend(a for a in x.args if isinstance(a, Stmt))
    return out


def _transposed(t: Task, prefix: list, loop: Stmt) -> tuple[Task, dict]:
    """A copy of `t` whose parallel index runs over the loop's range and whose loop runs over the
    task's range, with the prefix moved into the loop. Returns it and the map id(stmt of t) ->
    its copy."""
    nt = Task("range", Block(), Block(), block_dim=t.block_dim, name=t.name + "_T")
    m: dict[int, object] = {}
    nt.bounds = clone_block(t.bounds, m)
    new_loop = Stmt(Op.RANGE_FOR, None, [m[id(t.begin)], m[id(t.end)]], blocks=[Block()], name=loop.name,
                    loc=loop.loc)
    m[id(t)], m[id(loop)] = new_loop, nt  # the two indices trade places
    nt.begin, nt.end = m[id(loop.args[0])], m[id(loop.args[1])]
    new_loop.blocks[0] = clone_block(Block(prefix + loop.blocks[0].stmts), m)
    m[id(loop)] = new_loop
    nt.body = Block([new_loop])
    return nt, m

