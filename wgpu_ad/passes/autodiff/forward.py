"""Forward mode on the IR: every task of a kernel becomes a task that computes the primal and,
beside each value that varies with a field's dual, its tangent (Taichi's dual kernel, a JVP).

The tangent of a statement is emitted right after its copy, in the same block, so it is in
scope wherever the primal is: no replay, no stack, no reversal. Serial loops with mutable
locals, `while`, `break`, `continue` and `if` are copied as they are; a mutable f32 local that
varies gets a twin variable for its tangent, stored next to every store of the local. A load
from a field with a dual also loads the dual; a store also stores the tangent (zero for a value
that does not vary: the new value no longer depends on the seed); an atomic add also adds the
tangent into the dual. The tangents are derived from rules.PARTIALS (rules.tangent), as the
adjoints of reverse mode are.
"""
from __future__ import annotations

from typing import Callable

from ...errors import CompileError
from ...ir.builder import Builder
from ...ir.nodes import Block, Buffer, Kernel, Stmt, Task, walk
from ...ir.ops import AtomicKind, Op
from ...types import f32
from .demote import index_signature, parallel_keys
from .rules import DIFFERENTIABLE, Lazy, RuleBuilder, active_values, tangent


# how each op that is not an ALU op (those are rules.DIFFERENTIABLE or rules.ZERO) is transformed
CONTROL = frozenset({Op.IF, Op.RANGE_FOR, Op.WHILE, Op.BREAK, Op.CONTINUE, Op.RETURN, Op.ASSERT,
                     Op.LOOP_INDEX, Op.PRINT})     # copied with their blocks (print: the primal values)
CONSTANT = frozenset({Op.CONST, Op.ARG, Op.RANDOM})  # copied; their tangent is zero
MEMORY = frozenset({Op.ALLOCA, Op.LOCAL_LOAD, Op.LOCAL_STORE, Op.GLOBAL_LOAD, Op.GLOBAL_STORE,
                    Op.ATOMIC})                    # copied, with a twin for the tangent
# made by reverse mode and by the lowering passes, never in the optimised IR forward mode reads
NOT_IN_INPUT = frozenset({Op.STACK_ALLOC, Op.STACK_PUSH, Op.STACK_POP, Op.WG_SUM, Op.WG_LEADER})


class TangentEmitter(RuleBuilder):
    """Builds one dual task. The arithmetic helpers take None as a zero tangent."""

    def __init__(self, kernel: Kernel, duals: dict[int, Buffer]):
        self.kernel = kernel
        self.duals = duals              # id(primal Buffer) -> its dual Buffer
        self.stopped: dict = {}         # the same, for buffers ti.stop_grad names (stores: zero tangents)
        self.b = Builder()
        self.pm: dict[int, object] = {}   # primal stmt (or task) -> its copy
        self.tm: dict[int, Stmt | None] = {}  # primal stmt -> its tangent (None: zero)
        self.twin: dict[int, Stmt] = {}   # primal ALLOCA -> the ALLOCA of its tangent
        self.active: set[int] = set()
        self.used: set[int] = set()
        self.serial = False
        self.own: set[int] = set()  # buffers whose elements each belong to one thread of the task

    # ---- arithmetic used by the rules (None is a zero tangent) ---------------------------
    def add(self, a, b):
        if a is None:
            return b
        if b is None:
            return a
        return self.b.emit(Op.ADD, [a, b])

    def sub(self, a, b):
        if b is None:
            return a
        if a is None:
            return self.neg(b)
        return self.b.emit(Op.SUB, [a, b])

    def mul(self, a, b):
        if a is None or b is None:
            return None
        a = a.fn() if isinstance(a, Lazy) else a
        b = b.fn() if isinstance(b, Lazy) else b
        return self.b.emit(Op.MUL, [a, b])

    def div(self, a, b):
        return None if a is None else self.b.emit(Op.DIV, [a, b])

    def neg(self, a):
        return None if a is None else self.b.emit(Op.NEG, [a])

    def select(self, c, a, b):
        if a is None and b is None:
            return None
        return self.b.emit(Op.SELECT, [c, self.zero if a is None else a, self.zero if b is None else b])

    def tangent(self, s: Stmt) -> Stmt:
        """The tangent of a primal value as a statement (a zero constant where it does not vary)."""
        t = self.tm.get(id(s))
        return self.zero if t is None else t

    # ---- analysis ------------------------------------------------------------------------
    def analyze(self, task: Task) -> None:
        """Activity: f32 values (and mutable locals) that vary with a dual."""
        stmts = list(walk(task.bounds)) + list(walk(task.body))
        self.used = {id(a) for s in stmts for a in s.args}
        active_values(stmts, lambda s: id(s.attr if s.op is Op.GLOBAL_LOAD else s.attr[1]) in self.duals,
                      self.active)

    # ---- statements ----------------------------------------------------------------------
    def copy(self, s: Stmt, attr=None) -> Stmt:
        n = self.b.emit(s.op, [self.pm[id(a)] for a in s.args], s.dtype, s.attr if attr is None else attr,
                        name=s.name)
        n.index = s.index
        self.pm[id(s)] = n
        return n

    def block(self, block: Block) -> None:
        for s in block.stmts:
            self.stmt(s)

    def stmt(self, s: Stmt) -> None:
        b = self.b
        b.loc = s.loc
        op = s.op
        if op is Op.IF:
            n = b.if_(self.pm[id(s.args[0])])
            self.pm[id(s)] = n
            for src, dst in zip(s.blocks, n.blocks):
                with b.at(dst):
                    self.block(src)
            return
        if op in (Op.RANGE_FOR, Op.WHILE):
            n = b.emit(op, [self.pm[id(a)] for a in s.args], s.dtype, s.attr, blocks=[Block()], name=s.name)
            self.pm[id(s)] = n
            with b.at(n.blocks[0]):
                self.block(s.blocks[0])
            return
        if op is Op.LOOP_INDEX:
            self.copy(s, attr=self.pm[id(s.attr)])
            return
        assert op not in NOT_IN_INPUT, f"forward mode got {op.name}, made only by later passes (compiler bug)"
        n = self.copy(s)
        if op is Op.ALLOCA:
            if id(s) in self.active:  # starts at zero like its primal
                self.twin[id(s)] = b.emit(Op.ALLOCA, (), f32, f"{s.name or 'v'}_dual", name=_dual_name(s))
        elif op is Op.LOCAL_STORE:
            var, val = s.args
            if id(var) in self.active:
                b.store(self.twin[id(var)], self.tangent(val))
        elif op is Op.LOCAL_LOAD:
            if id(s) in self.active:
                self.tm[id(s)] = b.emit(Op.LOCAL_LOAD, [self.twin[id(s.args[0])]], f32, name=_dual_name(s))
        elif op is Op.GLOBAL_LOAD:
            if id(s) in self.active:
                t = self.tm[id(s)] = b.emit(Op.GLOBAL_LOAD, [n.args[0]], f32, self.duals[id(s.attr)],
                                            name=_dual_name(s))
                t.index = s.index
        elif op is Op.GLOBAL_STORE:
            dual = self.duals.get(id(s.attr))
            if dual is not None:
                t = b.emit(Op.GLOBAL_STORE, [n.args[0], self.tangent(s.args[1])], None, dual)
                t.index = s.index
            elif id(s.attr) in self.stopped:  # ti.stop_grad(field): the new value has no tangent
                t = b.emit(Op.GLOBAL_STORE, [n.args[0], self.zero], None, self.stopped[id(s.attr)])
                t.index = s.index
        elif op is Op.ATOMIC:
            self.atomic(s, n)
        elif op in DIFFERENTIABLE and id(s) in self.active:
            ops = [self.pm[id(a)] for a in s.args]
            tangents = [self.tm.get(id(a)) for a in s.args]
            t = tangent(self, op, ops, n, tangents)
            if t is not None and t.name is None:
                t.name = _dual_name(s)
            self.tm[id(s)] = t

    def atomic(self, s: Stmt, n: Stmt) -> None:
        """ti.atomic_add / sub also add the tangent into the dual (the result's tangent is the
        dual's old value); atomic min / max keep the tangent of the value that wins."""
        kind, buf = s.attr
        dual = self.duals.get(id(buf))
        if dual is None or s.dtype != f32:
            return
        b = self.b
        idx, val = n.args
        dv = self.tm.get(id(s.args[1]))
        if kind in (AtomicKind.ADD, AtomicKind.SUB):
            if dv is None and id(s) not in self.used:
                return  # adds zero, and nobody reads the old value
            t = b.emit(Op.ATOMIC, [idx, self.tangent(s.args[1])], f32, (kind, dual), name=_dual_name(s))
            t.index = s.index
            self.tm[id(s)] = t
            return
        if not self.serial and id(buf) not in self.own:
            raise CompileError(
                f"forward mode cannot differentiate kernel '{self.kernel.name}': ti.atomic_{kind.value} into "
                f"'{buf.name}', which has a dual, in a parallel loop whose threads may share an element: the "
                f"tangent of the result is that of the value that wins, and which thread wins is only known "
                f"after all of them ran. Take the {kind.value} in a serial loop (ti.loop_config(serialize=True)), "
                f"into elements that each belong to one thread, or into a field without a dual",
                s.loc)
        # one thread per element: the value wins when it beats the old one (ties keep the old tangent)
        old_dual = b.emit(Op.GLOBAL_LOAD, [idx], f32, dual)
        old_dual.index = s.index
        wins = b.emit(Op.LT if kind is AtomicKind.MIN else Op.GT, [val, n])
        t = b.emit(Op.GLOBAL_STORE, [idx, b.select(wins, self.tangent(s.args[1]), old_dual)], None, dual)
        t.index = s.index
        self.tm[id(s)] = old_dual

    # ---- a whole task --------------------------------------------------------------------
    def task(self, t: Task) -> Task:
        nt = Task(t.kind, Block(), Block(), block_dim=t.block_dim, name=t.name + "_dual")
        self.pm[id(t)] = nt
        self.serial = t.kind == "serial"
        self.own = set() if self.serial else _one_thread_per_element(self.kernel, t)
        self.analyze(t)
        with self.b.at(nt.bounds):
            self.block(t.bounds)
        nt.begin = self.pm.get(id(t.begin)) if t.begin is not None else None
        nt.end = self.pm.get(id(t.end)) if t.end is not None else None
        with self.b.at(nt.body):
            self.block(t.body)
        return nt


def _one_thread_per_element(kernel: Kernel, t: Task) -> set:
    """ids of the buffers whose every access in range task `t` is at the same injective function
    of the parallel index (demote.py's proof): each element belongs to one thread."""
    keys = parallel_keys(kernel.loop_dims, t)
    sigs: dict[int, set] = {}
    for s in list(walk(t.bounds)) + list(walk(t.body)):
        if s.op in (Op.GLOBAL_LOAD, Op.GLOBAL_STORE, Op.ATOMIC):
            buf = s.attr[1] if s.op is Op.ATOMIC else s.attr
            sigs.setdefault(id(buf), set()).add(index_signature(s, keys, kernel.loop_dims))
    return {b for b, sig in sigs.items() if len(sig) == 1 and None not in sig}


def _dual_name(s: Stmt) -> str | None:
    return f"{s.name}_dual" if s.name else None


def dual_kernel(kernel: Kernel, dual_source: Callable[[Buffer], object]) -> Kernel:
    """The forward-mode kernel of `kernel`: its tasks computing their primal values and, where
    they vary with a dual, their tangents, written to the duals of the fields written.

    dual_source(buffer) gives the source (a plan.Source) of a primal buffer's dual, or None when
    it has none."""
    buffers = list(kernel.buffers)
    by_source = {b.source: b for b in buffers}
    duals: dict[int, Buffer] = {}
    by_id = {id(b): b for b in kernel.buffers}
    for b in kernel.buffers:
        if b.grad or b.dtype != f32:  # (f16 fields: their values are never active, as in reverse mode)
            continue
        src = dual_source(b)
        if src is None:
            continue
        d = by_source.get(src)
        if d is None:
            d = by_source[src] = Buffer(b.name + ".dual", b.dtype, src, vector=b.vector)
            buffers.append(d)
        duals[id(b)] = d
    em = TangentEmitter(kernel, duals)
    tasks = []
    for t in kernel.tasks:  # ti.stop_grad(x): x carries no tangent, in the kernel or in that task
        stopped = kernel.no_grad | t.no_grad
        em.duals = {i: d for i, d in duals.items() if by_id[i].source not in stopped} if stopped else duals
        # (a store to one still gives the stored element a zero tangent: its old value is gone)
        em.stopped = {i: d for i, d in duals.items() if by_id[i].source in stopped} if stopped else {}
        tasks.append(em.task(t))
    em.duals, em.stopped = duals, {}
    out = Kernel(kernel.name + "_dual", tasks, list(kernel.args), buffers, kernel.ret, kernel.uses_random,
                 kernel.debug, kernel.loc)
    # analyses read multi-indices through loop_dims, which name the primal's statements (as clones do)
    out.loop_dims = {key: (em.pm.get(id(t), t), d) for key, (t, d) in kernel.loop_dims.items()}
    out.no_grad = kernel.no_grad
    return out
