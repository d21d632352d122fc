"""The NumPy reference interpreter: the living definition of what an IR kernel computes.

It runs one thread at a time: a range task runs its body for i = begin, begin+1, ..., end-1 in
order, which is one valid schedule of the parallel loop (kernels whose result depends on the
schedule, other than through atomics, are racy anyway). Values are NumPy scalars of each
statement's dtype; ALU ops use the table in semantics.py, so the interpreter, constant folding
and the GPU agree on every op.

Each task is first compiled into Python closures, one per statement, that read and write a flat
list of slots (one per statement value); a block runs its closures in order and stops at the first
that returns a control signal (break / continue). RETURN unwinds with an exception.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Sequence

import numpy as np

from .. import plan
from ..errors import KernelArgError, KernelRuntimeError
from .nodes import ArgSlot, Block, Kernel, Stmt, Task
from .ops import AtomicKind, GroupOp, Op
from .semantics import SEMANTICS, to_scalar

_BREAK = "break"
_CONTINUE = "continue"

ATOMIC_OPS: dict[AtomicKind, Op] = {
    AtomicKind.ADD: Op.ADD, AtomicKind.SUB: Op.SUB, AtomicKind.MIN: Op.MIN,
    AtomicKind.MAX: Op.MAX, AtomicKind.AND: Op.BIT_AND, AtomicKind.OR: Op.BIT_OR,
    AtomicKind.XOR: Op.BIT_XOR,
}



class _Return(Exception):
    def __init__(self, value):
        self.value = value


def run_kernel(kernel: Kernel, buffers: Sequence[np.ndarray], args: Sequence[Any] = (),
               seed: int = 0, out: Callable[[str], Any] | None = None) -> Any:
    """Run `kernel` on the CPU and return its RETURN value (a NumPy scalar) or None.

    `buffers` is aligned with kernel.buffers: flat 1-D arrays of each buffer's dtype, mutated in
    place like GPU storage. `args` is aligned with kernel.args (Python numbers, converted to each
    slot's dtype); the seed slot (role plan.Seed) of a kernel using RANDOM may be left out, it then gets `seed`.
    RANDOM draws from a NumPy generator seeded with `seed` (not the GPU's stream).
    Tasks run in order; a RETURN ends its task and sets the result (later tasks still run).
    PRINT writes its line (end= included) with `out`, sys.stdout.write by default.
    """
    _check_buffers(kernel, buffers)
    argvals = _convert_args(kernel, args, seed)
    rng = np.random.default_rng(seed)
    result = None
    with np.errstate(all="ignore"):
        for task in kernel.tasks:
            prog = _TaskCompiler(kernel, buffers, argvals, rng, out or sys.stdout.write).compile(task)
            try:
                prog()
            except _Return as r:
                result = r.value
    return result


def _check_buffers(kernel: Kernel, buffers: Sequence[np.ndarray]) -> None:
    if len(buffers) != len(kernel.buffers):
        names = ", ".join(b.name for b in kernel.buffers)
        raise KernelArgError(f"kernel {kernel.name} has {len(kernel.buffers)} buffers ({names}), "
                             f"got {len(buffers)} arrays")
    for spec, arr in zip(kernel.buffers, buffers):
        if not isinstance(arr, np.ndarray) or arr.ndim != 1 or arr.dtype != spec.dtype.np:
            got = (f"{arr.dtype} array of shape {arr.shape}" if isinstance(arr, np.ndarray)
                   else type(arr).__name__)
            raise KernelArgError(f"buffer {spec.name} of kernel {kernel.name} needs a flat 1-D "
                                 f"{spec.dtype.np} array, got {got}")


def _convert_args(kernel: Kernel, args: Sequence[Any], seed: int) -> dict[int, Any]:
    slots, args = list(kernel.args), list(args)
    if len(args) != len(slots):
        has_seed = any(isinstance(s.role, plan.Seed) for s in slots)
        if not (has_seed and len(args) == len(slots) - 1):
            names = ", ".join(s.name for s in slots)
            raise KernelArgError(f"kernel {kernel.name} takes {len(slots)} arguments ({names}), "
                                 f"got {len(args)}")
        given = iter(args)
        args = [seed & 0xFFFFFFFF if isinstance(s.role, plan.Seed) else next(given) for s in slots]
    return {id(slot): _convert_arg(kernel, slot, value) for slot, value in zip(slots, args)}


def _convert_arg(kernel: Kernel, slot: ArgSlot, value) -> Any:
    dt = slot.dtype
    ok = isinstance(value, (int, float, bool, np.integer, np.floating, np.bool_))
    if ok and not dt.is_float and dt.name != "u1":
        ok = float(value).is_integer() and -2**31 <= value < 2**32
    if not ok:
        raise KernelArgError(f"argument {slot.name} of kernel {kernel.name} needs a {dt} value, "
                             f"got {value!r}")
    return to_scalar(value, dt)


class _TaskCompiler:
    """Turns one task into closures over a flat list of value slots."""

    def __init__(self, kernel: Kernel, buffers, argvals: dict[int, Any], rng, out: Callable[[str], Any]):
        self.kernel = kernel
        self.out = out
        self.buffers = {id(spec): (arr, spec.name) for spec, arr in zip(kernel.buffers, buffers)}
        self.argvals = argvals
        self.rng = rng
        self.v: list[Any] = []                  # the value slots
        self.slot: dict[int, int] = {}          # id(stmt) -> slot
        self.loop_slot: dict[int, int] = {}     # id(task or RANGE_FOR stmt) -> loop index slot

    # ---- slots -------------------------------------------------------------------------------
    def new_slot(self, value=None) -> int:
        self.v.append(value)
        return len(self.v) - 1

    def define(self, s: Stmt, value=None) -> int:
        k = self.slot[id(s)] = self.new_slot(value)
        return k

    def use(self, s: Stmt, user: Stmt) -> int:
        try:
            return self.slot[id(s)]
        except KeyError:
            raise KernelRuntimeError(f"interpreter: {user!r} uses {s!r} before it is defined "
                                     f"(run ir.verifier.verify on the kernel)") from None

    def index_slot(self, loop) -> int:
        k = self.loop_slot.get(id(loop))
        if k is None:
            k = self.loop_slot[id(loop)] = self.new_slot()
        return k

    # ---- tasks and blocks --------------------------------------------------------------------
    def compile(self, task: Task) -> Callable[[], None]:
        bounds = self.block(task.bounds)
        if task.kind == "serial":
            body = self.block(task.body)

            def run_serial():
                _run(bounds)
                _run(body)
            return run_serial
        if task.kind != "range":
            raise KernelRuntimeError(f"task {task.name}: unknown kind {task.kind!r}")
        v = self.v
        lo, hi = self.use(task.begin, task.begin), self.use(task.end, task.end)
        ix = self.index_slot(task)
        body = self.block(task.body)
        epilogue = self.block(task.epilogue)

        def run_range():
            _run(bounds)
            for i in range(int(v[lo]), int(v[hi])):
                v[ix] = np.int32(i)
                _run(body)  # break is not allowed here; continue ends the iteration
            _run(epilogue)  # one thread ran every iteration: it is the whole "workgroup"
        return run_range

    def block(self, block: Block) -> tuple:
        out = []
        for s in block.stmts:
            f = self.stmt(s)
            if f is not None:
                out.append(f)
        return tuple(out)

    # ---- statements --------------------------------------------------------------------------
    def stmt(self, s: Stmt) -> Callable | None:
        op = s.op
        if op in GroupOp.ALU:
            return self.alu(s)
        handler = _HANDLERS.get(op)
        if handler is None:
            raise KernelRuntimeError(f"interpreter: no rule for {op.name}; add one to _HANDLERS "
                                     f"in wgpu_ad/ir/interpreter.py")
        return handler(self, s)

    def alu(self, s: Stmt) -> Callable:
        fn, dt, v = SEMANTICS[s.op], s.dtype, self.v
        ins = [self.use(a, s) for a in s.args]
        o = self.define(s)
        if len(ins) == 1:
            a, = ins

            def run1():
                v[o] = fn(dt, v[a])
            return run1
        if len(ins) == 2:
            a, b = ins

            def run2():
                v[o] = fn(dt, v[a], v[b])
            return run2
        a, b, c = ins

        def run3():
            v[o] = fn(dt, v[a], v[b], v[c])
        return run3

    def const(self, s: Stmt):
        self.define(s, to_scalar(s.attr, s.dtype))

    def arg(self, s: Stmt):
        try:
            self.define(s, self.argvals[id(s.attr)])
        except KeyError:
            raise KernelRuntimeError(f"interpreter: argument {s.attr!r} is not in kernel.args") from None

    def loop_index(self, s: Stmt):
        # every LOOP_INDEX of a loop shares the loop's index slot, written by the loop
        self.slot[id(s)] = self.index_slot(s.attr)

    def random(self, s: Stmt):
        v, o, rng, dt = self.v, self.define(s), self.rng, s.dtype
        if dt.is_float:
            conv = dt.np.type

            def run():
                v[o] = conv(rng.random(dtype=np.float32))
        else:
            view = dt.np

            def run():
                v[o] = np.array(rng.integers(0, 2**32, dtype=np.uint64), np.uint32).view(view)[()]
        return run

    def alloca(self, s: Stmt):
        v, o, zero = self.v, self.define(s), to_scalar(0, s.dtype)

        def run():
            v[o] = zero  # WGSL zero-initialises a `var`
        return run

    def local_load(self, s: Stmt):
        v, a = self.v, self.use(s.args[0], s)
        o = self.define(s)

        def run():
            v[o] = v[a]
        return run

    def local_store(self, s: Stmt):
        v, a, x = self.v, self.use(s.args[0], s), self.use(s.args[1], s)

        def run():
            v[a] = v[x]
        return run

    def buffer(self, s: Stmt, spec):
        try:
            return self.buffers[id(spec)]
        except KeyError:
            raise KernelRuntimeError(f"interpreter: buffer {spec!r} is not in kernel.buffers") from None

    def global_load(self, s: Stmt):
        (arr, name), v, ix = self.buffer(s, s.attr), self.v, self.use(s.args[0], s)
        o, n = self.define(s), len(arr)

        def run():
            i = int(v[ix])
            if not 0 <= i < n:
                raise IndexError(f"index {i} is out of range for buffer {name} of size {n}")
            v[o] = arr[i]
        return run

    def global_store(self, s: Stmt):
        (arr, name), v = self.buffer(s, s.attr), self.v
        ix, x, n = self.use(s.args[0], s), self.use(s.args[1], s), len(arr)

        def run():
            i = int(v[ix])
            if not 0 <= i < n:
                raise IndexError(f"index {i} is out of range for buffer {name} of size {n}")
            arr[i] = v[x]
        return run

    def atomic(self, s: Stmt):
        kind, spec = s.attr
        (arr, name), v = self.buffer(s, spec), self.v
        ix, x, n = self.use(s.args[0], s), self.use(s.args[1], s), len(arr)
        fn, dt = SEMANTICS[ATOMIC_OPS[kind]], spec.dtype
        o = self.define(s)

        def run():
            i = int(v[ix])
            if not 0 <= i < n:
                raise IndexError(f"index {i} is out of range for buffer {name} of size {n}")
            old = arr[i]
            arr[i] = fn(dt, old, v[x])
            v[o] = old
        return run

    # autodiff's thread-local stacks: a Python list per execution of STACK_ALLOC
    def stack_alloc(self, s: Stmt):
        v, o = self.v, self.define(s)

        def run():
            v[o] = []
        return run

    def stack_push(self, s: Stmt):
        v, st, x = self.v, self.use(s.args[0], s), self.use(s.args[1], s)
        cap = s.args[0].attr

        def run():
            stack = v[st]
            if cap is not None and len(stack) >= cap:
                raise KernelRuntimeError(f"stack overflow: {s.args[0]!r} holds at most {cap} values; "
                                         f"raise the autodiff stack capacity")
            stack.append(v[x])
        return run

    def stack_pop(self, s: Stmt):
        v, st, o = self.v, self.use(s.args[0], s), self.define(s)

        def run():
            stack = v[st]
            if not stack:
                raise KernelRuntimeError(f"interpreter: pop from the empty stack {s.args[0]!r}")
            v[o] = stack.pop()
        return run

    def wg_sum(self, s: Stmt):
        # the interpreter is one thread, so the workgroup sum is its own value
        return self.local_load(s)

    def wg_leader(self, s: Stmt):
        v, o = self.v, self.define(s)

        def run():
            v[o] = np.bool_(True)
        return run

    def if_(self, s: Stmt):
        v, c = self.v, self.use(s.args[0], s)
        then, other = self.block(s.blocks[0]), self.block(s.blocks[1]) if len(s.blocks) > 1 else ()

        def run():
            return _run(then if v[c] else other)
        return run

    def range_for(self, s: Stmt):
        v, lo, hi = self.v, self.use(s.args[0], s), self.use(s.args[1], s)
        ix = self.index_slot(s)
        body = self.block(s.blocks[0])

        def run():
            for i in range(int(v[lo]), int(v[hi])):
                v[ix] = np.int32(i)
                if _run(body) is _BREAK:
                    break
        return run

    def while_(self, s: Stmt):
        body = self.block(s.blocks[0])

        def run():
            while _run(body) is not _BREAK:
                pass
        return run

    def break_(self, s: Stmt):
        return lambda: _BREAK

    def continue_(self, s: Stmt):
        return lambda: _CONTINUE

    def return_(self, s: Stmt):
        v, x = self.v, self.use(s.args[0], s)

        def run():
            raise _Return(v[x])
        return run

    def assert_(self, s: Stmt):
        v, c = self.v, self.use(s.args[0], s)
        vals, template = [self.use(a, s) for a in s.args[1:]], s.attr

        def run():
            if not v[c]:
                raise KernelRuntimeError(template.format(*(_pretty(v[k]) for k in vals)))
        return run


    def print_(self, s: Stmt):
        vals, rec, out = [self.use(a, s) for a in s.args], s.attr, self.out
        v = self.v

        def run():
            out(rec.format([v[k].item() for k in vals]))
        return run


def _pretty(x):
    """A value for an assert message: floats print with the shortest float32 repr."""
    if isinstance(x, np.floating):
        return float(str(x))
    if isinstance(x, np.bool_):
        return bool(x)
    return int(x)


def _run(instrs: tuple):
    for f in instrs:
        sig = f()
        if sig is not None:
            return sig
    return None


_HANDLERS: dict[Op, Callable] = {
    Op.CONST: _TaskCompiler.const, Op.ARG: _TaskCompiler.arg,
    Op.LOOP_INDEX: _TaskCompiler.loop_index, Op.RANDOM: _TaskCompiler.random,
    Op.ALLOCA: _TaskCompiler.alloca, Op.LOCAL_LOAD: _TaskCompiler.local_load,
    Op.LOCAL_STORE: _TaskCompiler.local_store, Op.GLOBAL_LOAD: _TaskCompiler.global_load,
    Op.GLOBAL_STORE: _TaskCompiler.global_store, Op.ATOMIC: _TaskCompiler.atomic,
    Op.IF: _TaskCompiler.if_, Op.RANGE_FOR: _TaskCompiler.range_for,
    Op.WHILE: _TaskCompiler.while_, Op.BREAK: _TaskCompiler.break_,
    Op.CONTINUE: _TaskCompiler.continue_, Op.RETURN: _TaskCompiler.return_,
    Op.ASSERT: _TaskCompiler.assert_, Op.PRINT: _TaskCompiler.print_,
    Op.WG_SUM: _TaskCompiler.wg_sum, Op.WG_LEADER: _TaskCompiler.wg_leader,
}
# ops added to the IR after this table (autodiff stacks) are handled when ops.py defines them
for _name, _fn in (("STACK_ALLOC", _TaskCompiler.stack_alloc), ("STACK_PUSH", _TaskCompiler.stack_push),
                   ("STACK_POP", _TaskCompiler.stack_pop)):
    if hasattr(Op, _name):
        _HANDLERS[Op[_name]] = _fn
