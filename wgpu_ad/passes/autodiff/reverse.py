"""Reverse mode on the IR: every task of a kernel gets an adjoint task.

An adjoint task replays its forward task (values only, no global writes), then walks the
statements backwards, mirroring control flow, and accumulates adjoints: into local accumulators
for values and variables, into `.grad` buffers for global loads (atomic add).

Serial loops with mutable locals: when a loop runs forward in the replay, each iteration first
pushes the loop-carried variables (those the body stores to) on a per-variable stack. The reverse
loop runs the iterations backwards; each one pops the variables back to their values at the start
of that iteration, replays the iteration forward (recording the loops nested in it the same way)
and then walks its statements backwards. Memory is one snapshot per iteration along one path of
the loop nest; time is one extra forward pass per nesting level. `break` and `continue` were
turned into flags beforehand (normalize.py), so a replayed iteration runs exactly what the
forward ran; loops that can exit early count their iterations.
"""
from __future__ import annotations


from ...ir.builder import Builder
from ...ir.nodes import Block, Buffer, Kernel, LaunchCapacity, Stmt, Task, walk
from ...ir.ops import AtomicKind, Op
from ...types import f32, i32, u1
from ...ir.utils import jumps_to_loop
from .nancheck import NanChecks
from .rules import DIFFERENTIABLE, PASS_THROUGH, Lazy, RuleBuilder, active_values, adjoint


class AdjointEmitter(RuleBuilder):
    """Builds one adjoint task. `d.mul(...)` etc. emit at the current position."""

    def __init__(self, kernel: Kernel, grads: dict[int, Buffer], stack_size: int, flags: set = frozenset(),
                 skip: set = frozenset(), double: set = frozenset(), effects: bool = False,
                 nan: NanChecks | None = None, consume: bool = True, stopped: dict | None = None):
        self.kernel = kernel
        # id(primal buffer) -> its gradient, for buffers a ti.stop_grad names: a store to one still
        # consumes the element's gradient (its old value is gone), nothing flows from it
        self.stopped = stopped or {}
        self.nan = nan                  # the NaN / Inf checks (check_nan), or None
        self.skip = skip                # ids of global loads left out of the differentiation
        self.double = double            # ids of global loads whose gradient counts twice (symmetry.py)
        # a store's reverse sets the stored element's gradient to zero (consumes it); a gather task
        # (stencil.py), which runs before the task's own adjoint, reads it and leaves that to it
        self.consume = consume
        # the replay also does the forward's global writes (fuse.py: forward and adjoint in one
        # task), once per forward execution: in the first replay, or, for a serial loop whose
        # iterations share no state, in the replay of each iteration by its reverse loop (the
        # first replay of such a loop would be a whole extra pass). self.kept: the writes made
        self.effects = effects
        self.keep_effects = False
        self.effects_in_reverse: set[int] = set()  # ids of the loops that do them in reverse
        self.kept: set[int] = set()
        self.flags = flags              # break/continue flag variables (normalize.py)
        self.grads = grads              # id(primal Buffer) -> gradient Buffer
        self.stack_size = stack_size
        self.b = Builder()
        self.pm: dict[int, Stmt] = {}   # primal stmt -> its replayed value
        self.adj: dict[int, Stmt] = {}  # primal stmt -> ALLOCA of its adjoint
        # accumulator ALLOCA -> the block where it holds +0.0 (declared or reset there, nothing
        # accumulated since): the first contribution there initialises it (accumulate)
        self.unset: dict[int, Block] = {}
        self.replayed: set[Stmt] = set()  # the adjoint task's `replay` (ir/nodes.py Task)
        self.stacks: dict[int, list] = {}   # loop -> [(primal alloca, STACK_ALLOC)]
        self.counters: dict[int, Stmt] = {}  # loop -> ALLOCA counting its iterations
        self.index_of: dict[int, Stmt] = {}  # loop -> iteration index while reversing it
        self.loop_kinds: list[str] = []      # 'clone' | 'reverse', innermost last
        self.stack_allocs: list[Stmt] = []
        self.carried: dict[int, list] = {}
        self.loop_flags: dict[int, list] = {}
        self.active: set[int] = set()
        # values replayed inside an `if` are out of scope in the reverse `if`: they are copied
        # into variables declared at the replay root (the task body, or a reverse loop's body)
        self.root: Block | None = None
        self.in_branch = 0
        self.backup: dict[int, Stmt] = {}

    # ---- arithmetic helpers used by the rules ---------------------------------------------
    def add(self, a, b): return self.b.emit(Op.ADD, [a, b])
    def sub(self, a, b): return self.b.emit(Op.SUB, [a, b])
    def mul(self, a, b): return self.b.emit(Op.MUL, [a, b])
    def div(self, a, b): return self.b.emit(Op.DIV, [a, b])
    def neg(self, a): return self.b.emit(Op.NEG, [a])
    def select(self, c, a, b): return self.b.emit(Op.SELECT, [c, a, b])

    # ---- analysis ------------------------------------------------------------------------
    def analyze(self, task: Task) -> None:
        """Activity: f32 values that depend on a load from a buffer with a gradient."""
        stmts = list(walk(task.bounds)) + list(walk(task.body))
        active_values(stmts, lambda s: s.op is Op.GLOBAL_LOAD and id(s.attr) in self.grads
                      and id(s) not in self.skip, self.active)
        for s in stmts:
            if s.op in (Op.RANGE_FOR, Op.WHILE):
                self.carried[id(s)] = _carried(s, self.flags)
                self.loop_flags[id(s)] = [a for a in _carried(s, frozenset()) if a in self.flags]

    # ---- forward replay ------------------------------------------------------------------
    def at_root(self, op: Op, dtype, name: str) -> Stmt:
        """An ALLOCA declared at the start of the replay root, visible to the reverse code."""
        a = Stmt(op, dtype, [], name, name=name, loc=self.b.loc)
        self.root.stmts.insert(0, a)
        return a

    def fwd(self, block: Block, record: bool) -> None:
        b = self.b
        for s in block.stmts:
            b.loc = s.loc
            op = s.op
            if self.in_branch and op is Op.ALLOCA:
                a = self.at_root(Op.ALLOCA, s.dtype, s.name or s.attr)
                b.store(a, b.const(0, s.dtype) if s.dtype != u1 else b.const(False, u1))
                self.pm[id(s)] = a
                continue
            if op in (Op.GLOBAL_STORE, Op.ATOMIC) and self.keep_effects:
                n = self.pm[id(s)] = b.emit(op, [self.pm[id(a)] for a in s.args], s.dtype, s.attr, name=s.name)
                n.index = s.index
                self.kept.add(id(n))
                continue
            if op is Op.RANGE_FOR and self.keep_effects and not self.carried[id(s)] and not _breaks(s):
                self.stacks[id(s)] = []  # nothing to record: its reverse loop does its writes
                self.effects_in_reverse.add(id(s))
                continue
            if op in (Op.GLOBAL_STORE, Op.ATOMIC, Op.RETURN, Op.ASSERT, Op.PRINT):
                continue  # the replay only recomputes values (the forward launch printed the lines)
            if op is Op.BREAK and self.loop_kinds and self.loop_kinds[-1] == "reverse":
                continue  # a replayed iteration must not leave the reverse loop
            if op is Op.IF:
                n = b.if_(self.pm[id(s.args[0])])
                self.in_branch += 1
                for src, dst in zip(s.blocks, n.blocks):
                    with b.at(dst):
                        self.fwd(src, record)
                self.in_branch -= 1
                continue
            if op in (Op.RANGE_FOR, Op.WHILE):
                self.clone_loop(s, record)
                continue
            if op is Op.LOOP_INDEX:
                loop = s.attr
                if id(loop) in self.index_of:
                    self.pm[id(s)] = self.index_of[id(loop)]
                    continue
                attr = self.task if isinstance(loop, Task) else self.pm[id(loop)]
                self.pm[id(s)] = b.emit(Op.LOOP_INDEX, (), s.dtype, attr, name=s.name)
                continue
            v = self.pm[id(s)] = b.emit(op, [self.pm[id(a)] for a in s.args], s.dtype, s.attr, name=s.name)
            if self.in_branch and s.dtype is not None and op not in (Op.STACK_POP,):
                keep = self.at_root(Op.ALLOCA, s.dtype, f"{s.name or 'v'}_kept")
                b.store(keep, v)
                self.backup[id(s)] = keep

    def clone_loop(self, s: Stmt, record: bool) -> None:
        b = self.b
        counts = record and (s.op is Op.WHILE or _breaks(s))
        if counts:
            cnt = self.at_root(Op.ALLOCA, i32, "trips") if self.in_branch else b.alloca(i32, "trips")
            b.store(cnt, b.const(0, i32))
            self.counters[id(s)] = cnt
        if s.op is Op.RANGE_FOR:
            n = b.range_for(self.pm[id(s.args[0])], self.pm[id(s.args[1])], name=s.name)
        else:
            n = b.emit(Op.WHILE, blocks=[Block()])
        self.pm[id(s)] = n
        with b.at(n.blocks[0]):
            if record:
                pairs = []
                for a in self.carried[id(s)]:
                    stk = Stmt(Op.STACK_ALLOC, a.dtype, [], _capacity(s, self.stack_size), name=f"{a.name or 'v'}_stack",
                               loc=s.loc)
                    self.stack_allocs.append(stk)
                    pairs.append((a, stk))
                    b.emit(Op.STACK_PUSH, [stk, b.load(self.pm[id(a)])])
                self.stacks[id(s)] = pairs
                if counts:
                    b.store(cnt, b.add(b.load(cnt), b.const(1, i32)))
            self.loop_kinds.append("clone")
            saved, self.in_branch = self.in_branch, 0  # the loop's reverse replays its body itself
            self.fwd(s.blocks[0], record=False)
            self.in_branch = saved
            self.loop_kinds.pop()

    # ---- reverse -------------------------------------------------------------------------
    def declare_accumulators(self, block: Block) -> None:
        """Adjoint accumulators for what `block` defines, fresh each time the block runs (an
        ALLOCA starts at +0.0; see accumulate)."""
        for s in block.stmts:
            if id(s) in self.active:
                self.b.loc = s.loc
                # named after the primal (`r` -> `r_adj`); unnamed temporaries stay unnamed
                acc = self.b.emit(Op.ALLOCA, (), f32, f"{s.name or 'v'}_adj",
                                  name=f"{s.name}_adj" if s.name else None)
                self.adj[id(s)] = acc
                self.unset[id(acc)] = self.b.block

    def rev(self, block: Block, declare: bool = True) -> None:
        b = self.b
        if declare:
            self.declare_accumulators(block)
        for s in reversed(block.stmts):
            b.loc = s.loc
            op = s.op
            if op is Op.IF:
                n = b.if_(self.pm[id(s.args[0])])
                for src, dst in zip(s.blocks, n.blocks):
                    with b.at(dst):
                        for x in src.stmts:  # the branch's replayed values, from their copies
                            if id(x) in self.backup:
                                self.pm[id(x)] = b.load(self.backup[id(x)])
                        self.rev(src)
            elif op in (Op.RANGE_FOR, Op.WHILE):
                self.rev_loop(s)
            elif op is Op.LOCAL_STORE:
                var, val = s.args
                if id(var) in self.active:
                    g = b.load(self.adj[id(var)])
                    self.accumulate(val, g)
                    b.store(self.adj[id(var)], b.const(0.0, f32))
                    self.unset[id(self.adj[id(var)])] = b.block
            elif op is Op.LOCAL_LOAD:
                if id(s) in self.active:
                    self.accumulate(s.args[0], b.load(self.adj[id(s)]))
            elif op is Op.GLOBAL_LOAD:
                if id(s) in self.active:
                    gbuf = self.grads[id(s.attr)]
                    g = b.load(self.adj[id(s)])
                    if id(s) in self.double:
                        g = b.mul(g, b.const(2.0, f32))
                    if self.nan is not None:
                        self.nan.write(b, g, self.pm[id(s.args[0])], s.attr, gbuf, s.loc)
                    acc = b.emit(Op.ATOMIC, [self.pm[id(s.args[0])], g], f32, (AtomicKind.ADD, gbuf))
                    acc.index = s.index  # lets demote.py prove one writer per element
            elif op is Op.GLOBAL_STORE:
                val = s.args[1]
                if id(s.attr) in self.grads:
                    gbuf, idx = self.grads[id(s.attr)], self.pm[id(s.args[0])]
                    if id(val) in self.active:
                        gv = b.emit(Op.GLOBAL_LOAD, [idx], f32, gbuf)
                        if self.nan is not None:
                            self.nan.read(b, gv, idx, s.attr, gbuf, s.loc)
                        self.accumulate(val, gv)
                    # the store consumes the element's adjoint: the value before it was
                    # overwritten, so its gradient is zero (what an earlier write of the element,
                    # in this kernel or an earlier one, must see in the backward pass; Taichi's rule)
                    if self.consume:
                        b.emit(Op.GLOBAL_STORE, [idx, b.const(0.0, f32)], None, gbuf)
                elif id(s.attr) in self.stopped and self.consume:
                    gbuf, idx = self.stopped[id(s.attr)], self.pm[id(s.args[0])]
                    b.emit(Op.GLOBAL_STORE, [idx, b.const(0.0, f32)], None, gbuf)
            elif op is Op.ATOMIC:
                self.rev_atomic(s)
            elif op in DIFFERENTIABLE and id(s) in self.active:
                g = b.load(self.adj[id(s)])
                ops = [self.pm[id(a)] for a in s.args]
                contribs = adjoint(self, op, ops, self.pm[id(s)], g)
                for k, (a, c) in enumerate(zip(s.args, contribs)):
                    if c is not None and id(a) in self.active:
                        c = c.fn() if isinstance(c, Lazy) else c
                        if self.nan is not None and op not in PASS_THROUGH:
                            self.nan.derivative(b, c, s, k, ops, self.pm[id(s)], g)
                        self.accumulate(a, c)

    def rev_atomic(self, s: Stmt) -> None:
        b = self.b
        kind, buf = s.attr
        val = s.args[1]
        minmax = kind not in (AtomicKind.ADD, AtomicKind.SUB)
        if id(buf) not in self.grads or (id(val) not in self.active and not (minmax and self.consume)):
            return
        idx = self.pm[id(s.args[0])]
        gbuf = self.grads[id(buf)]
        if not minmax:
            g = b.emit(Op.GLOBAL_LOAD, [idx], f32, gbuf)
            if self.nan is not None:
                self.nan.read(b, g, idx, buf, gbuf, s.loc)
            self.accumulate(val, g if kind is AtomicKind.ADD else b.emit(Op.NEG, [g]))
            return
        # min/max: the adjoint goes to the value equal to the final result, which takes the
        # element's gradient: the value it beat (the field's, or an earlier iteration's) gets none.
        # Only a winner reads and clears it (no race but between tied values: no derivative there)
        final = b.emit(Op.GLOBAL_LOAD, [idx], f32, buf)
        # equal up to a few ulps: the replay recomputes the value in another shader, whose
        # compiler may round it differently (a contracted multiply-add; fuzz seed 340)
        gap = b.emit(Op.ABS, [b.sub(final, self.pm[id(val)])])
        won = b.emit(Op.LE, [gap, b.mul(b.emit(Op.ABS, [final]), b.const(5e-7, f32))])
        iff = b.if_(won)
        with b.at(iff.blocks[0]):
            if id(val) in self.active:
                g = b.emit(Op.GLOBAL_LOAD, [idx], f32, gbuf)
                if self.nan is not None:
                    self.nan.read(b, g, idx, buf, gbuf, s.loc)
                self.accumulate(val, g)
            if self.consume:
                b.emit(Op.GLOBAL_STORE, [idx, b.const(0.0, f32)], None, gbuf)

    def rev_loop(self, s: Stmt) -> None:
        b = self.b
        if id(s) in self.counters:
            n = b.load(self.counters[id(s)])
        else:
            lo, hi = self.pm[id(s.args[0])], self.pm[id(s.args[1])]
            n = b.emit(Op.MAX, [b.sub(hi, lo), b.const(0, i32)])
        r = b.range_for(b.const(0, i32), n, name=f"{s.name or 'it'}_rev")
        with b.at(r.blocks[0]):
            k = b.loop_index(r)
            if s.op is Op.RANGE_FOR:
                j = b.add(self.pm[id(s.args[0])], b.sub(b.sub(n, b.const(1, i32)), k))
                j.name = s.name
                self.index_of[id(s)] = j
            for a, stk in reversed(self.stacks[id(s)]):
                b.store(self.pm[id(a)], b.emit(Op.STACK_POP, [stk], a.dtype))
            for f in self.loop_flags[id(s)]:  # every iteration that ran started with them false
                b.store(self.pm[id(f)], b.const(False, u1))
            self.loop_kinds.append("reverse")
            saved = self.root, self.in_branch
            self.root, self.in_branch = r.blocks[0], 0
            self.keep_effects = id(s) in self.effects_in_reverse
            self.fwd(s.blocks[0], record=True)
            self.replayed.update(r.blocks[0].stmts)
            self.keep_effects = False
            self.rev(s.blocks[0])
            self.root, self.in_branch = saved
            self.loop_kinds.pop()
        self.index_of.pop(id(s), None)

    def accumulate(self, target: Stmt, contribution: Stmt) -> None:
        """acc += contribution; the first contribution in the accumulator's own block, where it
        still holds its initial +0.0 on every path, is stored as is: `0.0 + c` is not c for
        c = -0.0, so simplify.py keeps it, and every adjoint would start with a chain of them."""
        acc = self.adj.get(id(target))
        if acc is None:  # an operand defined in an outer block that has no accumulator yet
            return
        if self.unset.pop(id(acc), None) is self.b.block:
            self.b.store(acc, contribution)
        else:
            self.b.store(acc, self.b.add(self.b.load(acc), contribution))

    # ---- a whole task --------------------------------------------------------------------
    def task(self, t: Task) -> Task:
        nt = Task(t.kind, Block(), Block(), block_dim=t.block_dim, name=t.name + "_adj")
        self.task = nt
        self.analyze(t)
        b = self.b
        with b.at(nt.bounds):
            self.fwd(t.bounds, record=False)
        nt.begin = self.pm.get(id(t.begin)) if t.begin is not None else None
        nt.end = self.pm.get(id(t.end)) if t.end is not None else None
        self.root = nt.body
        with b.at(nt.body):
            if self.nan is not None:
                self.nan.declare(b)
            # kernel-scope values (the bounds block) get accumulators per iteration; their
            # adjoints flow back through the bounds statements at the end of the iteration
            self.declare_accumulators(t.bounds)
            self.keep_effects = self.effects
            before = set(map(id, nt.body.stmts))
            self.fwd(t.body, record=True)
            self.replayed.update(s for s in nt.body.stmts if id(s) not in before)
            self.keep_effects = False
            self.rev(t.body)
            self.rev(t.bounds, declare=False)
        nt.body.stmts[0:0] = self.stack_allocs
        nt.replay = self.replayed
        return nt


def _carried(loop: Stmt, flags: set) -> list[Stmt]:
    """Variables defined outside `loop` and stored inside it (its loop-carried state), less the
    break/continue flags, which are false at the start of every iteration."""
    inside = {id(s) for s in walk(loop.blocks[0])}
    out, seen = [], {id(f) for f in flags}
    for s in walk(loop.blocks[0]):
        if s.op is Op.LOCAL_STORE:
            a = s.args[0]
            if id(a) not in inside and id(a) not in seen:
                seen.add(id(a))
                out.append(a)
    return out


def _breaks(loop: Stmt) -> bool:
    return jumps_to_loop(loop.blocks[0], Op.BREAK)


def _capacity(loop: Stmt, default: int):
    if loop.op is Op.RANGE_FOR and all(a.op is Op.CONST for a in loop.args):
        return max(1, loop.args[1].attr - loop.args[0].attr)
    if loop.op is Op.RANGE_FOR:
        return LaunchCapacity(loop.args[0], loop.args[1], default)
    return default
