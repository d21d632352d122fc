"""Stencil adjoints as gathers: each thread sums the gradient contributions to its own element.

A parallel loop that reads its neighbours at constant offsets, like a cloth step

    for i, j in ti.ndrange(n, n):
        for k in ti.static(range(8)):
            i2, j2 = i + ti.static(DI[k]), j + ti.static(DJ[k])
            if 0 <= i2 < n and 0 <= j2 < n:
                f += spring(x[t, i2, j2] - x[t, i, j])

has an adjoint that adds the gradient of every neighbour load into x.grad[t, i2, j2]: an atomic
add from every thread into elements other threads write too (a compare-exchange loop per
component where the adapter lacks atomic<f32>). Here it can be transposed instead. The loads
whose index is, in every dimension, either a loop index of the task's parallel loop plus a
constant (each parallel dimension in exactly one dimension, with coefficient one) or a value the
same in every thread (a kernel argument such as `t`, a constant) are grouped by their constant
part c (one vector per load, over the parallel dimensions). The adjoint becomes two tasks:

  - a gather task, run first: thread w (a vector over the parallel dimensions, in element
    coordinates) replays, for each group c, the forward body of the thread p = w - c when p is in
    the loop's domain, differentiates only that group's loads (whose index at p is w by
    construction), sums their gradients in registers over the groups and adds them into its own
    elements once, with plain loads and stores;
  - the usual adjoint task with those loads left out of the differentiation.

A gradient is a sum over the loads it flows into and every (p, load) pair is visited once, by
the thread its element belongs to, so the two tasks add up to the whole adjoint. After the
differentiation of one group, dead-code elimination drops the part of the replay that group's
adjoint does not need (the other springs), so a replay costs about one spring per group. One
group per gradient buffer, the most frequent, stays in the usual adjoint (its accumulations there
have one writer per element and become plain read-modify-writes too, demote.py): one replay less.

Why no two threads write the same element, and each contribution lands where the forward read:

  - every gathered load's element is in its field's shape: the loop's domain, narrowed by the
    comparisons of the `if` conditions around the load (conjunctions of `<`, `<=`, `>`, `>=`
    between a parallel index plus a constant and a constant), keeps its position in range in each
    dimension that holds a parallel index. On in-shape indices a field's layout is a bijection,
    so threads with different w write different elements. A load that may leave the shape (no
    bounds check) aliases another element of the flat buffer: it keeps its atomic.
  - for each gradient buffer, all its gathered loads place the parallel dimensions at the same
    positions of the index (x[i, j] and x[j, i] would make two threads meet).
  - the gather reads the gradients of the task's outputs (a store's reverse reads the stored
    element's gradient; an atomic's too) before the usual adjoint consumes them (sets them to
    zero), and must not write them: every store and atomic into a field whose gradient is gathered
    differs from every gathered load of it, in some dimension, by a nonzero constant between two
    thread-uniform indices (x[t + 1, i, j] written, x[t, i + 1, j] read), and the task never
    touches the gradient buffer itself.
  - the gather reads each output element's gradient once: the task stores each field in one
    statement only (`x[i] = a` then `x[i] = 0.5 * x[i] + b` in one thread would need the first
    store's adjoint to see zero, the gradient the second one consumed; found by tests/test_fuzz.py).
  - the replay of p in thread w computes what thread p computed: the body does not depend on the
    thread other than through its loop index (no random numbers, no workgroup operations), runs
    no serial loop (so it needs no stacks, and the CPU adapters' serial trailing dimensions,
    frontend/parallel.py `parallel_prefix`, are not seen here), and has no break, continue or
    return.

The gather task runs over the box of elements that can receive a contribution: per parallel
dimension the union of the groups' element ranges (the loop's domain shifted by c, narrowed by
the guards), which is inside the fields' shapes. Not the fields' extents: for a loop over the
interior, ndrange((1, n - 1), (1, n - 1)), reading its 4 neighbours, that would be threads for
the corners, which receive nothing.

When it pays. On GPUs (Runtime.min_parallel is None) the gather is made whenever it is proven:
it trades float atomics for a replay of one term per group, and the gathered contributions to an
element are summed in one thread in a fixed order (the same bits on every run). On CPU adapters
it is not made by default: it costs more than the atomics it removes. On lavapipe (2 cores,
native atomic<f32>) the cloth step's adjoint at n=64 takes 1.2-2.0 ms scattering; gathering,
1.4 ms for the usual adjoint (the center load x[t, i, j] still needs every spring) plus 3.5-3.9
ms for the gather, about 0.45 ms per group: each group reloads x[p], the gradients of p's outputs
and x[w], and memory accesses are llvmpipe's dominant cost (the scatter makes 3 loads and 3
atomics per spring, a group 12 loads besides its replay). With compare-exchange atomics the
scatter still wins (cloth n=64 fwd+bwd, 200 steps: 1.2-1.3 s scattering, 1.4-1.6 s gathering).
ti.set_compile_options(stencil_gather=True / False) forces it either way (the tests run it on
lavapipe that way).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...ir.builder import Builder
from ...ir.clone import clone_block
from ...ir.nodes import Block, Stmt, Task, walk
from ...ir.ops import AtomicKind, Op
from ...types import i32, u1
from . import access

# what makes thread w's replay of p differ from what p computed, or needs stacks
_REFUSED = frozenset({Op.RANGE_FOR, Op.WHILE, Op.BREAK, Op.CONTINUE, Op.RETURN, Op.RANDOM, Op.STACK_ALLOC,
                      Op.STACK_PUSH, Op.STACK_POP, Op.WG_SUM, Op.WG_LEADER, Op.PRINT})
_CMP = {Op.LT: (None, -1), Op.LE: (None, 0), Op.GT: (1, None), Op.GE: (0, None)}  # a - b in [lo, hi]


@dataclass
class Gather:
    """How one range task's adjoint is split (see the module docstring)."""

    tasks: list         # per group, a primal task: thread w replays the thread w - c
    skip: set           # ids of the loads of the original task its adjoint leaves out (the gathered ones)
    skip_gather: list   # per group, the ids of the loads of its task that its adjoint leaves out
    own: set            # ids of the gradient buffers the gather accumulates into, each thread its own elements
    elements: dict      # id(a gathered load's multi-index) -> its element's key: equal keys, one element
    marker: Task        # stands for the gather task in demote.py


@dataclass
class _Load:
    stmt: Stmt          # the load in the task being differentiated
    forms: list         # affine forms of its index (access.affine)
    c: tuple            # per parallel dimension, the constant added to it
    places: tuple       # per parallel dimension, its position in the index
    span: list          # per parallel dimension, [lo, hi] of its element (inclusive), or None if empty


def gather_split(t: Task, orig: Task, loop_dims: dict, flags: set, grads: dict) -> Gather | None:
    """The split of `t` (a private copy of the primal task `orig`, normalized with `flags`), or
    None when no load can be gathered. loop_dims: the primal kernel's (they name the statements of
    `orig`); grads: id(primal Buffer) -> its gradient Buffer."""
    if t.kind != "range" or orig.kind != "range" or flags or t.begin is None or t.end is None:
        return None
    mine_list, theirs = list(walk(orig.body)), list(walk(t.body))  # the same statements, in order
    if len(mine_list) != len(theirs) or any(a.op is not b.op for a, b in zip(mine_list, theirs)):
        return None
    if any(s.op in _REFUSED for s in walk(orig.body)):
        return None
    # the gather reads the outputs' gradients without consuming them: right only when each output
    # element is stored once (x[i] = a; x[i] = 0.5 * x[i] + b: the first store's adjoint must see
    # the gradient the second one consumed, zero)
    if not _stored_once(orig, loop_dims):
        return None
    dom = _domain(orig, loop_dims)
    if dom is None:
        return None
    ranges, extents, dims = dom
    mine = {id(a): b for a, b in zip(mine_list, theirs)}
    loads = _candidates(orig, loop_dims, grads, mine, ranges)
    by_grad: dict[int, list] = {}
    for ld in loads:
        by_grad.setdefault(id(grads[id(ld.stmt.attr)]), []).append(ld)
    gathered = []
    for gid, group in by_grad.items():
        if len({ld.places for ld in group}) != 1 or not _disjoint(orig, mine, loop_dims, grads, gid, group):
            continue
        counts: dict[tuple, int] = {}
        for ld in group:
            counts[ld.c] = counts.get(ld.c, 0) + 1
        if len(counts) < 2:
            continue  # one group: its accumulations have one writer per element already (demote.py)
        keep = max(counts, key=lambda c: (counts[c], -sum(abs(x) for x in c)))
        gathered += [ld for ld in group if ld.c != keep]
    if not any(ld.span is not None for ld in gathered):
        return None
    return _build(t, gathered, ranges, extents, [mine.get(id(x)) for x in dims], grads)


def _stored_once(orig: Task, loop_dims: dict) -> bool:
    """Every two stores of the task's body into one field provably write different elements of
    it in a thread: their indices differ by a nonzero constant in some position (the components
    of a vector store, x[t + 1, i] and x[t, i])."""
    stores = [s for s in walk(orig.body) if s.op is Op.GLOBAL_STORE]
    for k, a in enumerate(stores):
        for b in stores[k + 1:]:
            if a.attr is not b.attr:
                continue
            if a.index is None or b.index is None or len(a.index) != len(b.index):
                return False
            fa = [access.affine(x, loop_dims) for x in a.index]
            fb = [access.affine(x, loop_dims) for x in b.index]
            if not any(_const_apart(x, y) for x, y in zip(fa, fb)):
                return False
    return True


def _domain(orig: Task, loop_dims: dict):
    """Per parallel dimension d, the inclusive range [lo, hi] of the statement loop_dims names as
    dimension d; the extents that linearize the task's index (None for one dimension, whose index
    is that statement itself); and those statements. None when the task's index is not decoded
    the frontend's way or its range is not constant."""
    dims: dict[int, Stmt] = {}
    for s, (task, d) in loop_dims.items():
        if task is orig:
            if d in dims:
                return None
            dims[d] = s
    if sorted(dims) != list(range(len(dims))) or not dims:
        return None
    begin, end = orig.begin, orig.end
    if begin.op is not Op.CONST or end.op is not Op.CONST:
        return None
    idx = [s for s in walk(orig.body) if s.op is Op.LOOP_INDEX and s.attr is orig]
    if len(idx) != 1:
        return None
    if len(dims) == 1:
        return ([(begin.attr, end.attr - 1)], None, [dims[0]]) if dims[0] is idx[0] else None
    # the frontend's decoding (frontend/parallel.py range_task): q_d = r - (r / E_d) * E_d, r = r / E_d
    if begin.attr != 0:
        return None
    r, extents = idx[0], {}
    for d in range(len(dims) - 1, 0, -1):
        q = dims[d]
        if q.op is not Op.SUB or q.args[0] is not r or q.args[1].op is not Op.MUL:
            return None
        m = q.args[1]
        div, e = (m.args[0], m.args[1]) if m.args[1].op is Op.CONST else (m.args[1], m.args[0])
        if (e.op is not Op.CONST or div.op is not Op.DIV or div.args[0] is not r or div.args[1].op is not Op.CONST
                or div.args[1].attr != e.attr or e.attr <= 0):
            return None
        extents[d], r = e.attr, div
    if dims[0] is not r:
        return None
    inner = 1
    for e in extents.values():
        inner *= e
    if end.attr % inner:
        return None
    extents[0] = end.attr // inner
    ext = [extents[d] for d in range(len(dims))]
    return [(0, e - 1) for e in ext], ext, [dims[d] for d in range(len(dims))]


def _candidates(orig: Task, loop_dims: dict, grads: dict, mine: dict, ranges: list) -> list[_Load]:
    """The loads of `orig`'s body whose index has the gathered shape and stays in their field's
    shape, as _Loads of the statements of the task being differentiated."""
    key = [("pdim", id(orig), d) for d in range(len(ranges))]
    out = []
    for s, guards in _guarded_loads(orig.body, []):
        own = mine[id(s)]
        if id(own.attr) not in grads or s.index is None or own.attr.shape is None:
            continue
        shape = own.attr.shape
        forms = [access.affine(x, loop_dims) for x in s.index]
        places, c, ok = [None] * len(key), [0] * len(key), True
        for pos, f in enumerate(forms):
            ks = [k for k in f if k is not None]
            if all(k[0] == "arg" for k in ks):
                continue
            if len(ks) != 1 or ks[0] not in key or f[ks[0]] != 1 or pos >= len(shape):
                ok = False
                break
            d = key.index(ks[0])
            if places[d] is not None:
                ok = False
                break
            places[d], c[d] = pos, f.get(None, 0)
        if not ok or None in places:
            continue
        span = [list(r) for r in ranges]
        for g in guards:
            _narrow(g, loop_dims, key, span)
        if any(lo > hi for lo, hi in span):
            span = None  # never runs
        elif not all(0 <= lo + c[d] and hi + c[d] < shape[places[d]] for d, (lo, hi) in enumerate(span)):
            continue  # may leave the shape: it aliases another element, keeps its atomic
        out.append(_Load(own, forms, tuple(c), tuple(places), span))
    return out


def _guarded_loads(block: Block, guards: list):
    """(load, the conditions of the `if` branches it is in the then-block of) for each load."""
    for s in block.stmts:
        if s.op is Op.GLOBAL_LOAD:
            yield s, guards
        if s.op is Op.IF:
            yield from _guarded_loads(s.blocks[0], guards + [s.args[0]])
            yield from _guarded_loads(s.blocks[1], guards)
        else:
            for b in s.blocks:
                yield from _guarded_loads(b, guards)


def _narrow(cond: Stmt, loop_dims: dict, key: list, span: list) -> None:
    """Narrow the inclusive ranges `span` of the parallel indices by what `cond` being true implies
    (a conjunction of comparisons between an index plus a constant and a constant)."""
    if cond.op is Op.AND:
        _narrow(cond.args[0], loop_dims, key, span)
        _narrow(cond.args[1], loop_dims, key, span)
        return
    if cond.op not in _CMP or cond.args[0].dtype is None or cond.args[0].dtype.is_float:
        return
    diff = access._combine(access.affine(cond.args[0], loop_dims), access.affine(cond.args[1], loop_dims), -1)
    ks = [k for k in diff if k is not None]
    if len(ks) != 1 or ks[0] not in key or diff[ks[0]] not in (1, -1):
        return
    sign, k = diff[ks[0]], diff.get(None, 0)
    lo, hi = _CMP[cond.op]  # sign * z + k in [lo, hi]
    lo = None if lo is None else lo - k
    hi = None if hi is None else hi - k
    if sign < 0:
        lo, hi = (None if hi is None else -hi), (None if lo is None else -lo)
    r = span[key.index(ks[0])]
    if lo is not None:
        r[0] = max(r[0], lo)
    if hi is not None:
        r[1] = min(r[1], hi)


def _disjoint(orig: Task, mine: dict, loop_dims: dict, grads: dict, gid: int, group: list) -> bool:
    """No store or atomic of the task can touch a gathered element of the gradient `gid`, and the
    task does not access that gradient buffer itself (module docstring)."""
    for s in list(walk(orig.bounds)) + list(walk(orig.body)):
        if s.op not in (Op.GLOBAL_LOAD, Op.GLOBAL_STORE, Op.ATOMIC):
            continue
        own = mine.get(id(s))
        buf = (own or s).attr
        buf = buf[1] if s.op is Op.ATOMIC else buf
        if id(buf) == gid:
            return False
        if s.op is Op.GLOBAL_LOAD or grads.get(id(buf)) is None or id(grads[id(buf)]) != gid:
            continue
        if s.index is None:
            return False
        forms = [access.affine(x, loop_dims) for x in s.index]
        for ld in group:
            if len(forms) != len(ld.forms) or not any(
                    access._uniform(a) and access._uniform(b) and _const_apart(a, b) for a, b in zip(forms, ld.forms)):
                return False
    return True


def _const_apart(a: dict, b: dict) -> bool:
    """Two affine forms (access.affine) that differ by a nonzero constant: never equal."""
    d = access._combine(a, b, -1)
    return set(d) == {None} and d[None] != 0


def _build(t: Task, gathered: list, ranges: list, extents: list | None, dims: list, grads: dict) -> Gather:
    """The gather's primal task (module docstring) and the loads each adjoint leaves out."""
    nd = len(ranges)
    live = [ld for ld in gathered if ld.span is not None]
    box = [(min(ld.span[d][0] + ld.c[d] for ld in live), max(ld.span[d][1] + ld.c[d] for ld in live))
           for d in range(nd)]
    size = [hi - lo + 1 for lo, hi in box]
    total = 1
    for e in size:
        total *= e
    by_c: dict[tuple, list] = {}
    for ld in gathered:
        by_c.setdefault(ld.c, []).append(ld)
    tasks, skips = [], []
    for c, group in sorted(by_c.items()):
        g = Task("range", Block(), Block(), block_dim=t.block_dim, name=t.name + "_gather")
        m: dict[int, object] = {id(t): g}
        g.bounds = clone_block(t.bounds, m)
        b = Builder(g.bounds)
        g.begin, g.end = b.const(0, i32), b.const(total, i32)
        b.block = g.body
        # w, the element this thread gathers into, per parallel dimension (last dimension fastest)
        r = b.loop_index(g, name="w")
        w = [None] * nd
        for d in range(nd - 1, -1, -1):
            if d:
                div = b.div(r, b.const(size[d], i32))
                q = b.sub(r, b.mul(div, b.const(size[d], i32)))
                r = div
            else:
                q = r
            w[d] = b.add(q, b.const(box[d][0], i32)) if box[d][0] else q
            w[d].name = f"w{d}"
        # p = w - c, the thread whose loads of this group read w, when it is in the loop's domain
        p = [b.sub(w[d], b.const(c[d], i32)) if c[d] else w[d] for d in range(nd)]
        inside = None
        for d in range(nd):
            lo, hi = ranges[d]
            term = b.emit(Op.AND, [b.emit(Op.LE, [b.const(lo, i32), p[d]]), b.emit(Op.LE, [p[d], b.const(hi, i32)])])
            inside = term if inside is None else b.emit(Op.AND, [inside, term])
        lin = p[0]
        for d in range(1, nd):
            lin = b.add(b.mul(lin, b.const(extents[d], i32)), p[d])
        zero = b.const(0, i32)
        branch = b.if_(inside)
        branch.blocks[0] = clone_block(t.body, m)
        # the replayed thread's index is p's, and so are its parallel indices (no decoding)
        pdims = {id(m[id(x)]): d for d, x in enumerate(dims) if x is not None and id(x) in m}
        for s in walk(branch.blocks[0]):
            if s.op is Op.LOOP_INDEX and s.attr is g:
                s.op, s.args, s.attr = Op.ADD, [lin, zero], None
            elif id(s) in pdims:
                s.op, s.args, s.attr = Op.ADD, [p[pdims[id(s)]], zero], None
        keep = {id(m[id(ld.stmt)]) for ld in group}
        tasks.append(g)
        skips.append({id(s) for blk in (g.bounds, g.body) for s in walk(blk) if s.op is Op.GLOBAL_LOAD} - keep)
    own = {id(grads[id(ld.stmt.attr)]) for ld in gathered}
    # the element a load's gradient goes to in thread w: its gradient buffer and the forms of its
    # index's thread-uniform positions (the others hold w, at the same positions for the buffer)
    elements = {id(ld.stmt.index): (id(grads[id(ld.stmt.attr)]),) + tuple(
        tuple(sorted(f.items(), key=repr)) for pos, f in enumerate(ld.forms) if pos not in ld.places)
        for ld in gathered}
    return Gather(tasks, {id(ld.stmt) for ld in gathered}, skips, own, elements,
                  Task("range", Block(), Block(), name=t.name))


def merge_groups(parts: list[Task], gather: Gather) -> Task:
    """One task running the groups' adjoint tasks one after the other in each thread (each with
    its replay next to its reverse, so a group's replayed values are dead before the next group).
    Their accumulations into the gathered gradients go to the thread's own elements: summed in
    registers over the groups (one per element, keyed by Gather.elements), and added to the
    element once at the end with a plain read-modify-write (module docstring)."""
    out = parts[0]
    for p in parts[1:]:
        out.bounds.stmts += p.bounds.stmts
        out.body.stmts += p.body.stmts
    for s in walk(out.body):
        if s.op is Op.LOOP_INDEX and any(s.attr is p for p in parts):
            s.attr = out
    out.replay = set()  # replay and reverse alternate, group by group: no banner splits them
    sums: dict = {}  # element key -> (gradient buffer, value ALLOCA, index ALLOCA, flag ALLOCA)
    b = Builder()

    def rewrite(block: Block) -> None:
        stmts = []
        for s in block.stmts:
            for blk in s.blocks:
                rewrite(blk)
            key = gather.elements.get(id(s.index)) if s.op is Op.ATOMIC else None
            if key is None or s.attr[0] is not AtomicKind.ADD or id(s.attr[1]) not in gather.own:
                stmts.append(s)
                continue
            if key not in sums:
                with b.at(Block()):
                    sums[key] = (s.attr[1], b.alloca(s.attr[1].dtype, "gathered"), b.alloca(i32, "gathered_at"),
                                 b.alloca(u1, "gathered_any"))
            _, acc, at, hit = sums[key]
            with b.at(Block()) as blk:
                b.loc = s.loc
                b.store(acc, b.add(b.load(acc), s.args[1]))
                b.store(at, s.args[0])
                b.store(hit, b.const(True, u1))
            stmts += blk.stmts
        block.stmts = stmts
    rewrite(out.body)
    with b.at(Block()) as head:
        for buf, acc, at, hit in sums.values():
            head.stmts += [acc, at, hit]
            b.store(acc, b.const(0.0, buf.dtype))
            b.store(hit, b.const(False, u1))
    with b.at(Block()) as tail:
        for buf, acc, at, hit in sums.values():
            br = b.if_(b.load(hit))
            with b.at(br.blocks[0]):
                idx = b.load(at)
                old = b.emit(Op.GLOBAL_LOAD, [idx], buf.dtype, buf, name=buf.name.replace(".", "_"))
                b.emit(Op.GLOBAL_STORE, [idx, b.add(old, b.load(acc))], None, buf)
    out.body.stmts = head.stmts + out.body.stmts + tail.stmts
    return out
