"""In-place updates made differentiable: loop-carried field elements become locals, and the reads
that an update overwrites read a snapshot taken before the launch.

The seed's moving average, written the natural way,

    for row in range(R):                  # parallel
        for col in range(C):              # serial
            ewma[row] = 0.5 * data[row, col] + 0.5 * ewma[row]

reads and overwrites one element in every iteration: an adjoint that replays the reads sees only
the last value (Taichi and Warp give a silently wrong gradient). Two steps make it exact:

1. promote_elements: an element a serial loop reads and writes, with one index value computed
   before the loop, that holds every parallel index (no other thread touches it), becomes a local:
   loaded before the loop, stored after it. Reverse mode keeps the local's versions on its loop
   stack like any mutable local.
   An element the thread stores and then reads again past a branch or loop (where forwarding
   stops) becomes a local of the whole iteration the same way (_promote_task).
2. snapshot_loads: what is left is `x[i] = f(x[i])`, a read of an element that the same thread
   overwrites later in the kernel. Such a read gets its value from a snapshot of the field taken
   before the launch (plan.Snapshot): the launcher copies the field, and the adjoint's replay reads
   the copy, so it sees what the forward saw. Its gradient goes to the field's gradient as usual.

Everything else keeps the access rules' checks and their clear errors (access.py).
"""
from __future__ import annotations

from ...ir.nodes import Block, Kernel, Stmt, Task, walk
from ...ir.ops import AtomicKind, Op
from ...ir.utils import is_pure, substitute
from .access import _at_most_once, _combine, _enclosing_loops, _private_dims, _same_element, affine
from .access_pairs import parallel_pins
from .pinned import pinned_loops


def promote_elements(kernel: Kernel) -> Kernel:
    """Rewrite, in place, every qualifying element of every serial loop of the tasks; and
    forward stores to later loads of the same element in the same block (the thread's own element:
    the load reads what the thread just stored), so that no load sees a value stored in the launch."""
    for t in kernel.tasks:
        par = _parallel_keys(kernel, t)
        # (statements an equality pins to one thread, pinned.py, are that thread's as a whole; the
        # lookups are of stores and loops, which these rewrites keep)
        pins = pinned_loops(kernel) if par else {}
        if par is not None:
            _demote_private_atomics(t, kernel, par)
            mapping: dict = {}
            _forward(t.body, kernel, par, mapping, pins)
            substitute(kernel, mapping)
        _block(t.body, kernel, par, pins)
        if par is not None:
            _promote_task(t, kernel, par)
        _inductions(t.body, kernel)
    return kernel


def _inductions(block: Block, kernel: Kernel) -> None:
    """Integer locals that a serial loop steps by a constant once per iteration (the seed's
    counter `sample[row] += 1`, a local once promoted) read as what they are, affine in the loop
    index: `base + c * (j - lo)` before the step, `+ c` after it, base being the value before the
    loop. Their reads then index fields as provably as `j` does (`ewma[row, sample[row]]`)."""
    for k, loop in enumerate(list(block.stmts)):
        for b in loop.blocks:
            _inductions(b, kernel)
        if loop.op is not Op.RANGE_FOR:
            continue
        body = loop.blocks[0]
        inner = list(walk(body))
        if any(x.op in (Op.BREAK, Op.CONTINUE, Op.RETURN, Op.WHILE) for x in inner):
            continue
        stores: dict[int, list] = {}
        for x in inner:
            if x.op is Op.LOCAL_STORE:
                stores.setdefault(id(x.args[0]), []).append(x)
        for group in stores.values():
            step = group[0]
            var, new = step.args
            if (len(group) != 1 or step not in body.stmts or var.dtype is None or var.dtype.is_float
                    or new.op not in (Op.ADD, Op.SUB) or new.args[0].op is not Op.LOCAL_LOAD
                    or new.args[0].args[0] is not var or new.args[1].op is not Op.CONST):
                continue
            reads = [x for x in inner if x.op is Op.LOCAL_LOAD and x.args[0] is var and x is not new.args[0]]
            if not reads:
                continue
            j = next((x for x in body.stmts if x.op is Op.LOOP_INDEX and x.attr is loop), None)
            if j is None:
                j = Stmt(Op.LOOP_INDEX, loop.args[0].dtype, [], loop, name=loop.name, loc=loop.loc)
                body.stmts.insert(0, j)
            c = int(new.args[1].attr) * (1 if new.op is Op.ADD else -1)
            dt = var.dtype
            base = Stmt(Op.LOCAL_LOAD, dt, [var], name=var.name, loc=loop.loc)
            block.stmts.insert(block.stmts.index(loop), base)
            lo = loop.args[0]
            if lo.dtype is not dt:
                lo = Stmt(Op.CAST, dt, [lo], loc=loop.loc)
                body.stmts.insert(body.stmts.index(j) + 1, lo)
            jj = j if j.dtype is dt else Stmt(Op.CAST, dt, [j], loc=loop.loc)
            steps = Stmt(Op.SUB, dt, [jj, lo], loc=loop.loc)
            scale = Stmt(Op.CONST, dt, [], c, loc=loop.loc)
            before = Stmt(Op.ADD, dt, [base, Stmt(Op.MUL, dt, [scale, steps], loc=loop.loc)], name=var.name,
                          loc=loop.loc)
            after = Stmt(Op.ADD, dt, [before, scale], name=var.name, loc=loop.loc)
            made = ([jj] if jj is not j else []) + [steps, scale, before.args[1], before, after]
            pos = body.stmts.index(j) + 1 + (lo is not loop.args[0])
            body.stmts[pos:pos] = made
            mapping, ids = {}, set(map(id, reads))
            for top, x0 in enumerate(body.stmts):
                for x in walk(Block([x0])):
                    if id(x) in ids:
                        mapping[x] = after if top > body.stmts.index(step) else before
            substitute(kernel, mapping)
            _drop(body, ids)
    return None


def _demote_private_atomics(t: Task, kernel: Kernel, par: set) -> None:
    """`v[i] += e` where no other thread touches v's elements in this task (every access of v
    holds the parallel indices the same way) and nobody uses the old value: a plain load, add and
    store (the same result, no atomic), so that the in-place rules below see an update of the
    thread's own element (`v[i] += 0.5 * v[i]` reads the element it then overwrites). Only where
    the task also reads v: elsewhere an add stays an accumulation, as the tape's rules expect."""
    loops = _enclosing_loops(kernel)
    ld = kernel.loop_dims
    stmts = list(walk(t.body))
    used = {id(a) for s in stmts for a in s.args}
    by_buf: dict[int, list] = {}
    for s in stmts:
        if s.op in (Op.GLOBAL_LOAD, Op.GLOBAL_STORE):
            by_buf.setdefault(id(s.attr), []).append(s)
        elif s.op is Op.ATOMIC:
            by_buf.setdefault(id(s.attr[1]), []).append(s)
    for x in stmts:
        if (x.op is not Op.ATOMIC or x.attr[0] not in (AtomicKind.ADD, AtomicKind.SUB) or id(x) in used
                or x.attr[1].grad or not _private(x, kernel, par)):
            continue
        group = by_buf[id(x.attr[1])]
        if not any(y.op is Op.GLOBAL_LOAD for y in group) or \
                not all(_private_dims(x, y, loops, ld) is not None for y in group):
            continue  # (an add to what nobody reads here stays an accumulation for the tape's rules)
        buf = x.attr[1]
        old = Stmt(Op.GLOBAL_LOAD, buf.dtype, [x.args[0]], buf, name=buf.name, loc=x.loc, index=x.index)
        new = Stmt(Op.ADD if x.attr[0] is AtomicKind.ADD else Op.SUB, buf.dtype, [old, x.args[1]], loc=x.loc)
        _insert_before(t.body, x, [old, new])
        x.op, x.dtype, x.args, x.attr = Op.GLOBAL_STORE, None, [x.args[0], new], buf


def _promote_task(t: Task, kernel: Kernel, par: set) -> None:
    """An element the thread stores and then reads again past a branch (`x[i] = a; if c: x[i] = b;
    x[i] = x[i] + 1`): _forward cannot follow the stores into the branch, and neither the snapshot
    nor the field after the launch holds the value read. Such an element becomes a local of the
    whole iteration, as a serial loop's does: loaded where first touched (not at all when that is a
    store), stored at the end of the body."""
    if _jumps_out(t.body):
        return  # a `continue` of the parallel loop would skip the store at the end
    accesses = [x for x in walk(t.body) if x.op in (Op.GLOBAL_LOAD, Op.GLOBAL_STORE, Op.ATOMIC)]
    used = {id(a) for x in walk(t.body) for a in x.args}
    ld = kernel.loop_dims
    buf_of = lambda x: x.attr[1] if x.op is Op.ATOMIC else x.attr  # noqa: E731
    done: set = set()
    for n, load in enumerate(accesses):
        if load.op is not Op.GLOBAL_LOAD or id(load) in done:
            continue
        buf = load.attr
        if not any(w.op is Op.GLOBAL_STORE and buf_of(w) is buf and _same_element(w, load, ld)
                   for w in accesses[:n]):
            continue  # reads what was there before the launch, or what the thread just stored
        group = [x for x in accesses if buf_of(x) is buf]
        elem = [x for x in group if _same_element(x, load, ld)]
        first = elem[0]
        if (any(not _different_element(x, load, ld) for x in group if x not in elem)
                or not all(_private(x, kernel, par) for x in elem)
                or any(x.op is Op.ATOMIC and (x.attr[0] not in (AtomicKind.ADD, AtomicKind.SUB) or id(x) in used)
                       for x in elem)
                or first.op is Op.ATOMIC):
            continue
        # where the local starts: before the top-level statement that holds the first access,
        # with an index computed before it (or outside the body)
        top = next(k for k, s in enumerate(t.body.stmts)
                   if s is first or any(x is first for b in s.blocks for x in walk(b)))
        inside = {id(x) for x in walk(t.body)} - {id(x) for x in t.body.stmts[:top]}
        head: list = []
        idx = _recompute(first.args[0], inside, head)
        if idx is None:
            continue
        done |= {id(x) for x in elem}
        var = Stmt(Op.ALLOCA, buf.dtype, [], buf.name, name=buf.name.replace(".", "_"), loc=first.loc)
        index = first.index
        head.append(var)
        if not (first.op is Op.GLOBAL_STORE and t.body.stmts[top] is first):  # else its value is stored first
            init = Stmt(Op.GLOBAL_LOAD, buf.dtype, [idx], buf, name=buf.name, loc=first.loc, index=index)
            head += [init, Stmt(Op.LOCAL_STORE, None, [var, init], loc=first.loc)]
        t.body.stmts[top:top] = head
        _to_local(elem, var, buf, t.body)
        final = Stmt(Op.LOCAL_LOAD, buf.dtype, [var], name=var.name, loc=first.loc)
        t.body.stmts += [final, Stmt(Op.GLOBAL_STORE, None, [idx, final], buf, loc=first.loc, index=index)]
        mapping: dict = {}
        _hoist_loads(t.body, var, mapping)
        substitute(kernel, mapping)


def _hoist_loads(block: Block, var: Stmt, mapping: dict) -> None:
    """Reads of `var` in a serial loop that does not store it read it once, before the loop (as
    LICM does for the user's variables): the adjoint replays the loop's iterations after the rest
    of the body, when `var` may hold a later value."""
    for k in range(len(block.stmts) - 1, -1, -1):
        s = block.stmts[k]
        if s.op in (Op.RANGE_FOR, Op.WHILE) and not any(
                x.op is Op.LOCAL_STORE and x.args[0] is var for x in walk(s.blocks[0])):
            loads = [x for x in walk(s.blocks[0]) if x.op is Op.LOCAL_LOAD and x.args[0] is var]
            if loads:
                h = Stmt(Op.LOCAL_LOAD, var.dtype, [var], name=var.name, loc=s.loc)
                block.stmts.insert(k, h)
                mapping.update({x: h for x in loads})
                _drop(s.blocks[0], {id(x) for x in loads})
        else:
            for b in s.blocks:
                _hoist_loads(b, var, mapping)


def _drop(block: Block, ids: set) -> None:
    block.stmts = [s for s in block.stmts if id(s) not in ids]
    for s in block.stmts:
        for b in s.blocks:
            _drop(b, ids)


def _recompute(v: Stmt, inside: set, out: list) -> Stmt | None:
    """`v` where it is available (not in `inside`), else a copy of its pure computation appended
    to `out`; None when it depends on anything else (a load, a local)."""
    if id(v) not in inside:
        return v
    if not is_pure(v) or v.blocks or v.op in (Op.LOCAL_LOAD, Op.LOOP_INDEX):
        return None
    args = []
    for a in v.args:
        c = _recompute(a, inside, out)
        if c is None:
            return None
        args.append(c)
    copy = Stmt(v.op, v.dtype, args, v.attr, [], v.name, v.loc, index=v.index)
    out.append(copy)
    return copy


def _recomputable(idx: Stmt, inside: set, kernel: Kernel) -> bool:
    """An index computed in a loop that can be computed before it: from the thread's indices and
    constants only (a matrix component's `4 * i + c`). One that names an outer serial loop's index
    (`x[t + 1, i]` in `for j` in `for t`) stays where it is: the element changes with t, and
    promoting it in the inner loop would read it before the loop of t overwrites it."""
    if _recompute(idx, inside, []) is None:
        return False
    return not any(k is not None and k[0] == "sloop" for k in affine(idx, kernel.loop_dims))


def _elements(accesses: list, ld: dict) -> list[list] | None:
    """The accesses of one buffer grouped by element, or None when two of them may or may not
    touch the same element (then none is promoted)."""
    elements: list[list] = []
    for x in accesses:
        for e in elements:
            if _same_element(e[0], x, ld):
                e.append(x)
                break
        else:
            if not all(_different_element(e[0], x, ld) for e in elements):
                return None
            elements.append([x])
    return elements


def _jumps_out(block: Block) -> bool:
    """A CONTINUE, BREAK or RETURN outside every serial loop of the block."""
    for s in block.stmts:
        if s.op in (Op.CONTINUE, Op.BREAK, Op.RETURN):
            return True
        if s.op not in (Op.RANGE_FOR, Op.WHILE) and any(_jumps_out(b) for b in s.blocks):
            return True
    return False


def _different_element(a: Stmt, b: Stmt, ld: dict) -> bool:
    """The two accesses provably touch different elements: a constant offset in some dimension."""
    if a.index is None or b.index is None or len(a.index) != len(b.index):
        return False
    for x, y in zip(a.index, b.index):
        diff = _combine(affine(y, ld), affine(x, ld), -1)
        if all(k is None for k in diff) and diff.get(None, 0) != 0:
            return True
    return False


def _to_local(accesses: list, var: Stmt, buf, block: Block) -> None:
    """Turn loads, stores and unused-result adds of one element into ops on the local `var`."""
    for x in accesses:
        if x.op is Op.GLOBAL_LOAD:
            x.op, x.args, x.attr, x.index = Op.LOCAL_LOAD, [var], None, None
        elif x.op is Op.GLOBAL_STORE:
            x.op, x.args, x.attr, x.index = Op.LOCAL_STORE, [var, x.args[1]], None, None
        else:
            old = Stmt(Op.LOCAL_LOAD, buf.dtype, [var], name=var.name, loc=x.loc)
            op = Op.ADD if x.attr[0] is AtomicKind.ADD else Op.SUB
            new = Stmt(op, buf.dtype, [old, x.args[1]], name=var.name, loc=x.loc)
            _insert_before(block, x, [old, new])
            x.op, x.dtype, x.args, x.attr, x.index = Op.LOCAL_STORE, None, [var, new], None, None


def _forward(block: Block, kernel: Kernel, par: set, mapping: dict, pins: dict) -> None:
    last: dict = {}   # id(buffer) -> (index value, stored value) of the block's last store
    keep = []
    for s in block.stmts:
        if s.op is Op.GLOBAL_LOAD:
            hit = last.get(id(s.attr))
            if hit is not None and s.args[0] is hit[0]:
                mapping[s] = hit[1]
                continue  # the load is gone: its users read the stored value
        elif s.op is Op.GLOBAL_STORE:
            own = _private(s, kernel, par, set(parallel_pins(s, pins)))
            last[id(s.attr)] = (s.args[0], s.args[1]) if own else None
        elif s.op is Op.ATOMIC:
            last.pop(id(s.attr[1]), None)
        if s.blocks:
            for b in s.blocks:
                _forward(b, kernel, par, mapping, pins)
            last.clear()  # what nested blocks store is not known here
        keep.append(s)
    block.stmts = keep


def snapshot_loads(kernel: Kernel) -> dict[int, list]:
    """id(buffer) -> the loads of it whose element the same thread overwrites later in the task,
    in no serial loop with the load, touching only the thread's own elements (or both run in one
    thread: pinned.py, `if i == 0: s[None] = f(s[None])`): they must read the value from before the
    launch."""
    loops = _enclosing_loops(kernel)
    ld = kernel.loop_dims
    pins = pinned_loops(kernel)
    out: dict[int, list] = {}
    for t in kernel.tasks:
        order = [s for s in walk(t.body) if s.op in (Op.GLOBAL_LOAD, Op.GLOBAL_STORE)]
        stored: dict[int, list] = {}  # id(buffer) -> the stores earlier in the task
        for n, load in enumerate(order):
            if load.op is Op.GLOBAL_STORE:
                stored.setdefault(id(load.attr), []).append(load)
            if load.op is not Op.GLOBAL_LOAD or load.attr.grad:
                continue
            if any(not _different_element(w, load, ld) for w in stored.get(id(load.attr), ())):
                # it may read what the thread stored in this launch (`x[i] = a; if c: x[i] = b;
                # x[i] = x[i] + 1`, the store not forwarded past the branch): neither the snapshot
                # nor the field after the launch holds that value. _promote_task makes such an
                # element a local where it can; the access checks refuse the rest. A store to
                # another component of the element (`x[i] += d` on a vector: x[i][0] is stored
                # before x[i][1] is read) or to another constant offset does not count
                continue
            for w in order[n + 1:]:
                if w.op is not Op.GLOBAL_STORE or w.attr is not load.attr:
                    continue
                diffs = _private_dims(load, w, loops, ld, pins)
                shared = _serial(loops, load) & _serial(loops, w)
                if diffs is not None and not shared and all(all(c == 0 for c in d.values()) for d in diffs):
                    out.setdefault(id(load.attr), []).append(load)
                    break
    return out


def _serial(loops: dict, s: Stmt) -> set:
    return {k for group in loops[id(s)] for k in group if k[0] in ("sloop", "while")}


def _parallel_keys(kernel: Kernel, t: Task) -> set | None:
    """The keys of the task's parallel indices (none for a loop of at most one iteration, or for
    the kernel's top-level code, a serial task: one thread runs it once, the single iteration of
    a loop), or None when the analyses cannot name them."""
    if t.kind != "range" or _at_most_once(t.begin, t.end):
        return set()
    dims = {d for (task, d) in kernel.loop_dims.values() if task is t}
    return {("pdim", id(t), d) for d in dims} if dims else None


def _block(block: Block, kernel: Kernel, par: set, pins: dict) -> None:
    k = 0
    while k < len(block.stmts):
        s = block.stmts[k]
        for b in s.blocks:
            _block(b, kernel, par, pins)  # inner loops first: an outer loop then sees their locals
        if s.op in (Op.RANGE_FOR, Op.WHILE) and par is not None:
            before, after = _promote_loop(s, kernel, par, set(parallel_pins(s, pins)))
            block.stmts[k:k + 1] = before + [s] + after
            k += len(before) + len(after)
        k += 1


def _promote_loop(loop: Stmt, kernel: Kernel, par: set, one_thread: set) -> tuple[list, list]:
    """The elements of the thread the serial `loop` reads and writes, as locals (module docstring);
    one_thread: the parallel keys an equality around the loop pins (pinned.py `if i == 0`): the
    loop runs in one thread of those, so their indices need not be in the element's index."""
    inside = list(walk(loop.blocks[0]))
    ids = {id(x) for x in inside}
    by_buf: dict[int, list] = {}
    for x in inside:
        if x.op in (Op.GLOBAL_LOAD, Op.GLOBAL_STORE):
            by_buf.setdefault(id(x.attr), []).append(x)
        elif x.op is Op.ATOMIC:
            by_buf.setdefault(id(x.attr[1]), []).append(x)
    used = {id(a) for x in inside for a in x.args}
    before, after = [], []
    # stores alone: each iteration's value overwrites the last, which the access checks refuse
    # unless the loop runs at most once; as a local, the last value is stored once, after it
    once = loop.op is Op.RANGE_FOR and _at_most_once(*loop.args)
    # one local per element (the components of a vector element are elements of their own)
    elements = [e for group in by_buf.values() for e in (_elements(group, kernel.loop_dims) or [])]
    for accesses in elements:
        first = accesses[0]
        idx = first.args[0]
        # `e[i] += v` is an atomic add whose old value nobody uses: on a local it is e = e + v
        adds = [x for x in accesses if x.op is Op.ATOMIC]
        # adds alone need no replay: as a local they would become a store that other threads'
        # adds to the element (the thread's own only within this loop) would conflict with
        if (len(adds) == len(accesses)
                or any(x.attr[0] not in (AtomicKind.ADD, AtomicKind.SUB) or id(x) in used for x in adds)
                or (id(idx) in ids and not _recomputable(idx, ids, kernel))
                or not any(x.op is not Op.GLOBAL_LOAD for x in accesses)
                or (once and not any(x.op is not Op.GLOBAL_STORE for x in accesses))
                or not _private(first, kernel, par, one_thread)):
            continue
        buf = first.attr[1] if first.op is Op.ATOMIC else first.attr
        index = first.index
        var = Stmt(Op.ALLOCA, buf.dtype, [], buf.name, name=buf.name.replace(".", "_"), loc=loop.loc)
        # an index computed inside the loop from values outside it (a component's `4 * i + c`
        # under an `if`, where LICM does not hoist it) is computed again before the loop
        head: list = []
        idx = _recompute(idx, ids, head)
        init = Stmt(Op.GLOBAL_LOAD, buf.dtype, [idx], buf, name=buf.name, loc=loop.loc, index=index)
        before += head + [var, init, Stmt(Op.LOCAL_STORE, None, [var, init], loc=loop.loc)]
        _to_local(accesses, var, buf, loop.blocks[0])
        final = Stmt(Op.LOCAL_LOAD, buf.dtype, [var], name=var.name, loc=loop.loc)
        after += [final, Stmt(Op.GLOBAL_STORE, None, [idx, final], buf, loc=loop.loc, index=index)]
    return before, after


def _insert_before(block: Block, target: Stmt, stmts: list) -> bool:
    """Insert `stmts` right before `target` in whichever nested block holds it."""
    for k, s in enumerate(block.stmts):
        if s is target:
            block.stmts[k:k] = stmts
            return True
        if any(_insert_before(b, target, stmts) for b in s.blocks):
            return True
    return False


def _private(access: Stmt, kernel: Kernel, par: set, one_thread: set = frozenset()) -> bool:
    """The access's multi-index holds every parallel index of the task (but those in one_thread,
    pinned to one value where it runs): the element is the thread's."""
    if access.index is None:
        return False
    seen = set(one_thread) & par
    for x in access.index:
        seen |= {k for k in affine(x, kernel.loop_dims) if k is not None and k in par}
    return seen == par
