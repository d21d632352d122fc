"""Global data access rules for reverse mode, checked on one kernel.

The adjoint replays the forward computation against the field values as they are after the
forward kernel ran. That is right only if nothing the kernel reads is overwritten later in the
same kernel, and nothing it stores is stored again (the adjoint of the first store would read the
gradient of the second). These are Taichi's global data access rules; Taichi trusts the user and
gives silently wrong gradients when they are broken (seeds 001 and 004). Here a pair of accesses
to one field is accepted only when it is provably safe; everything else is refused, naming the
field, both lines and what to do.

Provably safe, per dimension of the field's multi-index (indices are affine in kernel arguments,
loop indices and other values):
  - the two indices differ by a nonzero constant and do not vary between threads or iterations
    (x[t + 1, i] vs x[t, i] with t a kernel argument): different elements;
  - they differ by a constant along one serial loop index such that every element is stored in an
    earlier iteration than it is read (x[t + 1] = f(x[t]) inside `for t in range(T)`);
  - the values they can take, bounded by the loops' ranges, lie in disjoint intervals (ranges.py:
    a[i + 4] and a[i] with i in range(4); x[t + 1, i] and x[0, i] with t in range(T));
  - the same element, stored before it is read (same thread and iteration).

Where an index is not affine (it is read from a field, or is a counter stepped conditionally) the
rule cannot be proven, and such data-dependent programs are often right for the data they run on
(a permutation read from a field is injective). With `checks` (a RuntimeChecks), those accesses
are not refused but collected: the forward launch checks them element by element on the GPU
(shadow.py) and raises a clear error when the data breaks the rule. So are affine indices whose
ranges meet or not depending on the kernel's arguments (ranges.py: a[i + 4] and a[i] with i in
range(n) are apart for n <= 4 only). What is certainly wrong (the indices are affine and meet
whatever the arguments) stays a compile-time error.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import NotDifferentiableError
from ...ir.nodes import Kernel, Stmt, Task, walk
from ...ir.ops import AtomicKind, Op
from .access_pairs import Pairs, adds_what_it_reads, canonical, parallel_pins, same_thread
from .ranges import IndexRanges

Affine = dict  # key -> coefficient; key None is the constant term


def affine(v, loop_dims: dict) -> Affine:
    """v as an affine form over arguments (("arg", word)), loop indices and opaque values;
    loop_dims: the kernel's (Kernel.loop_dims), which names its parallel dimensions."""
    if isinstance(v, bool):
        return {None: int(v)}
    if isinstance(v, int):
        return {None: v}
    if not isinstance(v, Stmt):
        return {("opaque", id(v)): 1}
    hit = loop_dims.get(v)
    if hit is not None:
        task, d = hit
        return {("pdim", id(task), d): 1}
    op = v.op
    if op is Op.CONST and not v.dtype.is_float:
        return {None: int(v.attr)}
    if op is Op.ARG:
        return {("arg", v.attr.index): 1}
    if op is Op.LOOP_INDEX:
        kind = "ploop" if isinstance(v.attr, Task) else "sloop"
        return {(kind, id(v.attr)): 1}
    if op in (Op.ADD, Op.SUB):
        a, b = affine(v.args[0], loop_dims), affine(v.args[1], loop_dims)
        return _combine(a, b, 1 if op is Op.ADD else -1)
    if op is Op.NEG:
        return {k: -c for k, c in affine(v.args[0], loop_dims).items()}
    if op is Op.MUL:
        a, b = affine(v.args[0], loop_dims), affine(v.args[1], loop_dims)
        if set(a) == {None}:
            return {k: c * a[None] for k, c in b.items()}
        if set(b) == {None}:
            return {k: c * b[None] for k, c in a.items()}
    if op is Op.CAST and not v.dtype.is_float and not v.args[0].dtype.is_float:
        return affine(v.args[0], loop_dims)
    return {("value", id(v)): 1}


def _combine(a: Affine, b: Affine, sign: int) -> Affine:
    out = dict(a)
    for k, c in b.items():
        out[k] = out.get(k, 0) + sign * c
    return {k: c for k, c in out.items() if c != 0 or k is None}


def _uniform(a: Affine) -> bool:
    return all(k is None or k[0] == "arg" for k in a)


def _invariant(key, loop_key, loops: dict | None) -> bool:
    """An opaque value computed outside the serial loop `loop_key` (an argument, or e.g. a
    counter's value before the loop): the same in each of its iterations."""
    if key[0] == "arg":
        return True
    if loops is None or key[0] != "value" or loop_key[0] != "sloop":
        return False
    around = loops.get(key[1])
    return around is not None and all(loop_key not in group for group in around)


def _safe(load: Stmt, write: Stmt, write_first: bool, ld: dict, loops: dict | None = None) -> bool:
    """Can the replay of `load` see a value that `write` changed after the forward read it?"""
    li, wi = load.index, write.index
    if li is None or wi is None or len(li) != len(wi):
        return False
    same_element = True
    for a_raw, b_raw in zip(li, wi):
        a, b = affine(a_raw, ld), affine(b_raw, ld)
        diff = _combine(b, a, -1)
        k = diff.get(None, 0)
        if any(key is not None for key in diff):
            return False  # indices that differ by a varying amount may meet
        if k == 0:
            continue
        same_element = False
        if _uniform(a):
            return True
        serial = [key for key in a if key is not None and key[0] == "sloop"]
        if len(serial) == 1 and all(key is None or key == serial[0] or _invariant(key, serial[0], loops)
                                    for key in a):
            return k * a[serial[0]] > 0  # each element is stored in an earlier iteration than it is read
        return False
    return same_element and write_first


@dataclass
class RuntimeChecks:
    """The accesses of a kernel whose rule the forward launch checks at run time, by statement id:
    `stores` (plain stores: stored once, nothing read before), `updates` (atomic writes: nothing
    read before), `loads` (reads another access may overwrite), and, for the messages, per write
    the loads it may overwrite (`partners`) and per load those writes (`writers`)."""

    stores: dict = field(default_factory=dict)
    updates: dict = field(default_factory=dict)
    loads: dict = field(default_factory=dict)
    partners: dict = field(default_factory=dict)
    writers: dict = field(default_factory=dict)
    refusals: dict = field(default_factory=dict)  # id(write) -> the refusal it replaces (a callable)
    by_data: set = field(default_factory=set)  # ids of accesses checked for data-dependent indices (the
    # others only because the kernel's arguments decide whether their ranges meet: ranges.py)

    def __bool__(self) -> bool:
        return bool(self.stores or self.updates)

    def buffers(self) -> list:
        """The buffers with checked accesses, in first-seen order."""
        out = {}
        for s in list(self.stores.values()) + list(self.updates.values()) + list(self.loads.values()):
            out.setdefault(id(_buf(s)), _buf(s))
        return list(out.values())

    def write(self, w: Stmt, load: Stmt | None, refuse, by_data: bool = True) -> None:
        self.refusals.setdefault(id(w), refuse)
        if by_data:
            self.by_data.update(id(x) for x in (w, load) if x is not None)
        (self.stores if w.op is Op.GLOBAL_STORE else self.updates)[id(w)] = w
        partners = self.partners.setdefault(id(w), [])
        if load is not None:
            self.loads[id(load)] = load
            if all(x is not load for x in partners):
                partners.append(load)
            writers = self.writers.setdefault(id(load), [])
            if all(x is not w for x in writers):
                writers.append(w)


def _data_dependent(s: Stmt, ld: dict) -> bool:
    """An index the analysis cannot see through (read from a field, a value a loop carries): the
    rule may hold for the data, so it is checked at run time rather than refused."""
    return s.index is None or any(k is not None and k[0] in ("value", "opaque")
                                  for x in s.index for k in affine(x, ld))


def check_global_access(kernel: Kernel, snapshot_loads: frozenset = frozenset(),
                        checks: RuntimeChecks | None = None, pinned: dict | None = None) -> None:
    """Refuse the accesses that break the rules (or may); with `checks`, collect there those that
    may only break them for some data (data-dependent indices) instead of refusing them. pinned:
    per statement, the loops in which it runs at most once (pinned.py)."""
    ld = kernel.loop_dims
    accesses = []
    for t in kernel.tasks:
        for s in list(walk(t.bounds)) + list(walk(t.body)):
            if s.op in (Op.GLOBAL_LOAD, Op.GLOBAL_STORE, Op.ATOMIC):
                accesses.append(s)
    pos = {id(s): k for k, s in enumerate(accesses)}
    task_of = {id(s): k for k, t in enumerate(kernel.tasks) for s in list(walk(t.bounds)) + list(walk(t.body))}
    by_buf: dict[int, list] = {}
    for s in accesses:
        buf = s.attr[1] if s.op is Op.ATOMIC else s.attr
        by_buf.setdefault(id(buf), []).append(s)
    groups = list(by_buf.values())
    loops = _enclosing_loops(kernel)
    ranges = {id(s): s for t in kernel.tasks for s in walk(t.body) if s.op is Op.RANGE_FOR}
    # only the pairs not provably apart are looked at (access_pairs.py: the checks were quadratic)
    pairs = [Pairs(group, lambda x: affine(x, ld)) for group in groups]
    ranges_ = IndexRanges(kernel, lambda x: affine(x, ld))
    pinned = pinned or {}
    for group, near in zip(groups, pairs):  # reads first: their message is the more useful one
        loads = near.mask(lambda s: s.op is Op.GLOBAL_LOAD and id(s) not in snapshot_loads)
        for k, w in enumerate(group):
            if w.op is Op.GLOBAL_LOAD:
                continue
            for load in near.near(k, loads):
                if task_of[id(w)] < task_of[id(load)]:
                    continue  # an earlier dispatch wrote it: the replay reads the same value
                write_first = pos[id(w)] < pos[id(load)]
                # (the same element stored first is the same thread's when the index names every
                # parallel index, or both are pinned to one thread: pinned.py)
                own = write_first and (parallel_pins(w, pinned) == parallel_pins(load, pinned)
                                       or _private_dims(load, w, loops, ld) is not None)
                if not _safe(load, w, own, ld, loops) and not ranges_.disjoint(load, w) and not (
                        write_first and task_of[id(w)] == task_of[id(load)]
                        and _own_earlier_write(load, w, loops, ld, pinned)):
                    data = _data_dependent(load, ld) or _data_dependent(w, ld)
                    if checks is not None and (data or ranges_.by_arguments(load, w)):
                        checks.write(w, load, lambda load=load, w=w: _refuse_read_then_write(kernel, load, w), data)
                    else:
                        _refuse_read_then_write(kernel, load, w)
    for group, near in zip(groups, pairs):
        writes = near.mask(lambda s: s.op is not Op.GLOBAL_LOAD)
        adds = near.mask(lambda s: s.op is Op.ATOMIC and s.attr[0] in (AtomicKind.ADD, AtomicKind.SUB))
        for k, w in enumerate(group):
            if w.op is Op.GLOBAL_LOAD:
                continue
            # the loops around w, but those it runs in at most once (pinned.py: `if j == e`)
            around = [g for g in loops[id(w)] if not (len(g) == 1 and g[0] in pinned.get(id(w), ()))]
            if w.op is not Op.ATOMIC and not _injective(w, around, ld, loops, ranges_):  # atomics accumulate
                if checks is not None and _data_dependent(w, ld):
                    checks.write(w, None, lambda w=w: _refuse_repeated_write(kernel, w))
                else:
                    _refuse_repeated_write(kernel, w)
            later = writes & ~((2 << k) - 1) & ~(adds if adds >> k & 1 else 0)  # (two adds accumulate)
            for w2 in near.near(k, later):
                both_add = all(x.op is Op.ATOMIC and x.attr[0] in (AtomicKind.ADD, AtomicKind.SUB) for x in (w, w2))
                if both_add or _safe_writes(w, w2, ld) or ranges_.disjoint(w, w2) or (
                        task_of[id(w)] == task_of[id(w2)] and _thread_apart(w, w2, loops, ld, ranges, pinned)):
                    continue
                if task_of[id(w)] < task_of[id(w2)] and _store_or_add(w) and _store_or_add(w2):
                    # a later dispatch writes it again (`s[None] = 0` then `s[None] += x[i]`): the
                    # adjoint runs the later one first, and a store's adjoint zeroes the gradient,
                    # so each value gets the gradient of what it became; reads of the first value
                    # in between were checked above
                    continue
                if _same_element(w, w2, ld) and task_of[id(w)] == task_of[id(w2)] and (
                        not parallel_pins(w, pinned) and not parallel_pins(w2, pinned)
                        or _private_dims(w, w2, loops, ld, pinned) is not None):
                    # the same thread and iteration writes it twice (or in two branches): the
                    # adjoint walks them in reverse and zeroes the gradient after each store (two
                    # stores pinned to threads, pinned.py, are one thread's if pinned to one)
                    continue
                data = _data_dependent(w, ld) or _data_dependent(w2, ld)
                if (checks is not None and w.op is w2.op is Op.GLOBAL_STORE and task_of[id(w)] == task_of[id(w2)]
                        and (data or ranges_.by_arguments(w, w2))):
                    # two stores of one launch that may meet: each element stored once
                    refuse = lambda w=w, w2=w2: _refuse_overwrite(kernel, w, w2)  # noqa: E731
                    checks.write(w, None, refuse, data)
                    checks.write(w2, None, refuse, data)
                    continue
                _refuse_overwrite(kernel, w, w2)
    if checks:
        for group in groups:
            _uncheckable(group, checks, task_of, ld, snapshot_loads)


def _uncheckable(group: list, checks: RuntimeChecks, task_of: dict, ld: dict, snapshot_loads: frozenset) -> None:
    """Checked writes are refused after all (as they would have been) where the run-time check
    would misjudge them: the same thread may store the element again in the same iteration
    (`y[p[i]] = a` and then, maybe, `y[p[i]] = b`: right, but the check counts stores per element);
    or the field has reads that replay a copy from before the launch (promote.py), which a store
    of another thread before the read would make wrong and which the check does not track."""
    if not any(id(w) in checks.refusals for w in group):
        return
    snapshots = any(id(s) in snapshot_loads for s in group)
    stores: dict = {}  # (task, index forms) -> how many stores of the group have them (_same_element)
    forms = {}
    for s in group:
        if s.op is Op.GLOBAL_STORE and s.index is not None:
            forms[id(s)] = (task_of[id(s)], tuple(canonical(affine(x, ld)) for x in s.index))
            stores[forms[id(s)]] = stores.get(forms[id(s)], 0) + 1
    for w in group:
        if id(w) not in checks.refusals:
            continue
        if snapshots or stores.get(forms.get(id(w)), 0) > 1:
            checks.refusals[id(w)]()


def _store_or_add(w: Stmt) -> bool:
    return w.op is Op.GLOBAL_STORE or w.attr[0] in (AtomicKind.ADD, AtomicKind.SUB)


def _enclosing_loops(kernel: Kernel) -> dict[int, list]:
    """stmt -> the loop keys of every loop around it (serial loops and the parallel loop)."""
    out: dict[int, list] = {}

    def visit(block, keys):
        for s in block.stmts:
            out[id(s)] = keys
            for b in s.blocks:
                if s.op is Op.RANGE_FOR and not _at_most_once(*s.args):
                    visit(b, keys + [[("sloop", id(s))]])
                elif s.op is Op.WHILE:
                    visit(b, keys + [[("while", id(s))]])
                else:
                    visit(b, keys)
    for t in kernel.tasks:
        visit(t.bounds, [])
        if t.kind == "range" and not _at_most_once(t.begin, t.end):
            dims = sorted({d for (task, d) in kernel.loop_dims.values() if task is t})
            top = [[("pdim", id(t), d)] for d in dims] if dims else [[("ploop", id(t))]]
            visit(t.body, top)
        else:
            visit(t.body, [])
    return out


def _at_most_once(begin, end) -> bool:
    """A loop over constant bounds with at most one iteration (`for level in range(1)`): its
    index takes one value, so it cannot make two writes meet."""
    return (begin is not None and end is not None and begin.op is Op.CONST and end.op is Op.CONST
            and int(end.attr) - int(begin.attr) <= 1)


def _injective(w: Stmt, loops: list, ld: dict, around: dict | None = None, ranges=None) -> bool:
    """Does every iteration of the loops around `w` (and every thread) write a different element?
    Proven when each loop index is alone (up to uniform terms, and for a serial loop values
    computed outside it: `around`, _enclosing_loops) in a dimension of its own, or one of the loop
    indices a dimension separates (ranges.py: `y[2 * i + j]` with j in range(2))."""
    if not loops:
        return True
    if w.index is None:
        return False
    dims = [affine(x, ld) for x in w.index]
    split = {k for a in dims for k in ranges.separated(a)} if ranges is not None else set()
    used = set()
    for group in loops:
        for key in group:
            if key in split:
                continue
            hit = next((k for k, a in enumerate(dims) if k not in used and key in a and a[key] != 0 and
                        all(x is None or x == key or _invariant(x, key, around) for x in a)), None)
            if hit is None:
                return False
            used.add(hit)
    return True


def _refuse_repeated_write(kernel: Kernel, w: Stmt):
    name = _buf(w).name
    if adds_what_it_reads(w, _buf(w), lambda x, y: _same_element(x, y, kernel.loop_dims)):
        raise NotDifferentiableError(
            f"cannot differentiate kernel '{kernel.name}': it adds to field '{name}' ({_line(w)}) inside a "
            f"loop an amount computed from '{name}' itself, and the same element may be updated by more than "
            f"one iteration or thread at once, so what each reads depends on the others' timing: the values "
            f"and the gradient would be silently wrong. Compute the amount from values the loop does not "
            f"change (copy '{name}' into another field in an earlier kernel and read the copy here), then "
            f"add it with += (atomic add)", w.loc)
    raise NotDifferentiableError(
        f"cannot differentiate kernel '{kernel.name}': it stores to field '{name}' ({_line(w)}) inside a loop, "
        f"and the same element may be stored by more than one iteration or thread; only the last value "
        f"survives, so the gradient would be silently wrong. Index the field by every loop variable, or "
        f"accumulate with += (atomic add)", w.loc)


def _same_element(a: Stmt, b: Stmt, ld: dict) -> bool:
    if a.index is None or b.index is None or len(a.index) != len(b.index):
        return False
    for x, y in zip(a.index, b.index):
        diff = _combine(affine(y, ld), affine(x, ld), -1)
        if any(k is not None for k in diff) or diff.get(None, 0) != 0:
            return False
    return True


def _safe_writes(w1: Stmt, w2: Stmt, ld: dict) -> bool:
    """Two writes are fine when they provably hit different elements."""
    if w1.index is None or w2.index is None or len(w1.index) != len(w2.index):
        return False
    for a_raw, b_raw in zip(w1.index, w2.index):
        a, b = affine(a_raw, ld), affine(b_raw, ld)
        diff = _combine(b, a, -1)
        if all(key is None for key in diff) and diff.get(None, 0) != 0 and _uniform(a):
            return True
    return False


def _private_dims(a: Stmt, b: Stmt, loops: dict, ld: dict, pins: dict | None = None) -> list | None:
    """For two accesses of one task: the per-dimension differences of their indices (b - a), when
    the dimensions in which both are the same form together hold every parallel index of the task
    but those both are pinned to by one equality (pinned.py: `if i == 0`), so they only ever touch
    elements of the thread that runs them, or run in one thread; else None."""
    if a.index is None or b.index is None or len(a.index) != len(b.index):
        return None
    # (no parallel index: a serial task, or a parallel loop of at most one iteration: one thread)
    par = {k for group in loops[id(a)] for k in group if k[0] in ("pdim", "ploop")}
    covered, diffs = same_thread(a, b, pins) & par, []
    for x, y in zip(a.index, b.index):
        fa = affine(x, ld)
        diff = _combine(affine(y, ld), fa, -1)
        if all(c == 0 for c in diff.values()):
            covered |= {k for k in fa if k is not None and k in par}
        diffs.append(diff)
    return diffs if covered == par else None


def _own_earlier_write(load: Stmt, write: Stmt, loops: dict, ld: dict, pins: dict | None = None) -> bool:
    """`write` comes before `load` in the thread's program, in no serial loop with it, and both
    touch only the thread's own elements: every element it writes is written before it can be
    read, and never after (ewma[row, 0] = ... before `for col in range(1, C)` reads ewma[row, col - 1])."""
    serial = lambda s: {k for group in loops[id(s)] for k in group if k[0] in ("sloop", "while")}  # noqa: E731
    if serial(load) & serial(write):
        return False  # a later iteration's write would come after this iteration's read
    return _private_dims(load, write, loops, ld, pins) is not None


def _thread_apart(w1: Stmt, w2: Stmt, loops: dict, ld: dict, ranges: dict, pins: dict | None = None) -> bool:
    """Two writes of one task that touch only the thread's own elements and differ, within the
    thread, in some dimension by an amount whose sign the loop bounds fix (ewma[row, 0] and
    ewma[row, col] with col in range(1, C))."""
    diffs = _private_dims(w1, w2, loops, ld, pins)
    return diffs is not None and any(_never_zero(d, ranges) for d in diffs)


def _never_zero(diff: Affine, ranges: dict) -> bool:
    """c * j + k for the index j of a serial loop with a constant start: never zero when its value
    at the start has the sign of c (it only moves away from zero); or a nonzero constant."""
    keys = [k for k in diff if k is not None]
    k0 = diff.get(None, 0)
    if not keys:
        return k0 != 0
    if len(keys) != 1 or keys[0][0] != "sloop":
        return False
    loop = ranges.get(keys[0][1])
    if loop is None or loop.args[0].op is not Op.CONST:
        return False
    c = diff[keys[0]]
    first = c * int(loop.args[0].attr) + k0
    return first * c > 0


def _line(s: Stmt) -> str:
    return f"line {s.loc.line}" if s.loc else "an unknown line"


def _buf(s: Stmt):
    return s.attr[1] if s.op is Op.ATOMIC else s.attr


def _refuse_read_then_write(kernel: Kernel, load: Stmt, write: Stmt):
    name = _buf(load).name
    raise NotDifferentiableError(
        f"cannot differentiate kernel '{kernel.name}': it reads field '{name}' ({_line(load)}) and then "
        f"overwrites what it read ({_line(write)}). The gradient kernel replays the forward computation "
        f"with the values after the kernel ran, so the gradient would be silently wrong. Write the result "
        f"to another field, or keep every version (e.g. index by the step: {name}[t + 1] = f({name}[t]))",
        write.loc)


def _refuse_overwrite(kernel: Kernel, w1: Stmt, w2: Stmt):
    name = _buf(w1).name
    raise NotDifferentiableError(
        f"cannot differentiate kernel '{kernel.name}': it writes field '{name}' ({_line(w1)}) and writes the "
        f"same elements again ({_line(w2)}); the gradient of the first value would be silently wrong. "
        f"Compute the final value in a local variable and store it once, or accumulate with +=",
        w2.loc)


def footprint(kernel: Kernel, snapshot_loads: frozenset = frozenset()) -> list[tuple]:
    """Per distinct global access of the kernel: (buffer, kind, dims) with kind 'load', 'store',
    'add' (atomic add / sub) or 'atomic', and dims per index dimension an affine form over
    argument words (("arg", word) keys and None for the constant) when it is the same for every
    thread and iteration, else None. The tape's overwrite checks read it (ad/overwrite.py).
    Loads in `snapshot_loads` (their adjoint replays a copy taken before the launch, promote.py)
    have kind 'load_before': what later launches write cannot change what they see."""
    out, seen = [], set()
    for t in kernel.tasks:
        for blk in (t.bounds, t.body):
            for s in walk(blk):
                if s.op not in (Op.GLOBAL_LOAD, Op.GLOBAL_STORE, Op.ATOMIC):
                    continue
                buf = _buf(s)
                kind = {Op.GLOBAL_LOAD: "load", Op.GLOBAL_STORE: "store"}.get(s.op) or (
                    "add" if s.attr[0] in (AtomicKind.ADD, AtomicKind.SUB) else "atomic")
                if id(s) in snapshot_loads:
                    kind = "load_before"
                if s.index is None:
                    dims = (None,)
                else:
                    forms = (affine(x, kernel.loop_dims) for x in s.index)
                    dims = tuple(tuple(sorted(a.items(), key=repr)) if _uniform(a) else None for a in forms)
                key = (id(buf), kind, dims)
                if key not in seen:
                    seen.add(key)
                    out.append((buf, kind, dims))
    return out
