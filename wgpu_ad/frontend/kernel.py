"""Kernel structure: arguments, global buffers, and the split of a kernel body into tasks.

As in Taichi, each outermost `for` of a kernel is a parallel loop (one task, one dispatch);
other top-level statements run in serial tasks. Kernel-scope variables computed without side
effects are recomputed at the start of every later task that may use them.
"""
from __future__ import annotations

import ast
import builtins
import copy
import math
import types
from dataclasses import dataclass
from typing import Any

from .. import plan
from ..errors import CompileError
from ..ir.builder import Builder
from ..ir.nodes import ArgSlot, Block, Buffer, Kernel, Stmt, Task, walk
from ..ir.ops import Op
from ..types import DType, f32, i32, u32
from . import builtins as B
from .loops import analyze_iter, bind_targets, loop_var_name, trip_count
from .context import LoopCtx, ParsedFunc, ReturnCtx, static_globals
from .inline import inlinable
from .lower import FuncLowerer
from .methods import loop_config as _loop_config_marker, static
from .values import Mat, Ops, is_static


@dataclass
class ArgSpec:
    """How one kernel parameter is passed, decided from its annotation and the call's value."""

    name: str
    kind: str                  # 'scalar' | 'vector' | 'template' | 'ndarray'
    dtype: DType | None = None
    shape: tuple = ()          # vector/matrix arg shape, or the ndarray's element shape
    ndim: int = 0              # ndarray dimensions
    value: Any = None          # template: the compile-time value
    needs_grad: bool = False
    needs_dual: bool = False   # ndarray: it has a dual (forward mode)


@dataclass(eq=False)
class ArrayArg:
    """An ndarray kernel argument inside the kernel: its buffer and its (runtime) shape."""

    name: str
    dtype: DType
    element_shape: tuple
    shape: list
    buffer: Buffer
    grad_buffer: Buffer | None
    dual_buffer: Buffer | None = None
    is_array_arg: bool = True

    @property
    def grad(self) -> "ArrayArg":
        if self.grad_buffer is None:
            raise CompileError(f"ndarray argument '{self.name}' has no gradient: create it with needs_grad=True")
        return ArrayArg(self.name + ".grad", self.dtype, self.element_shape, self.shape, self.grad_buffer, None)

    @property
    def dual(self) -> "ArrayArg":
        if self.dual_buffer is None:
            raise CompileError(f"ndarray argument '{self.name}' has no dual: create it with needs_dual=True")
        return ArrayArg(self.name + ".dual", self.dtype, self.element_shape, self.shape, self.dual_buffer, None)


@dataclass(eq=False)
class Scratch:
    """A kernel-scope variable accumulated with += / -= across the iterations of a parallel loop
    (`s = 0.0; for i in x: s += x[i]; return s`, an atomic reduction as in Taichi): a hidden 0-d
    buffer of the launch (plan.Scratch), zeroed before the loop, added to atomically in it, and
    added to the variable's value before the loop wherever the variable is used after it. The
    launcher allocates it per launch (lang/kernel.py), so an adjoint reads its own launch's sum."""

    index: int
    dtype: DType
    element_shape: tuple
    name: str
    shape: tuple = ()
    is_grad: bool = False
    gpu_buffer = None  # (looks like a field to the lowering: frontend/methods.py field_like)

    @property
    def element_size(self) -> int:
        return math.prod(self.element_shape)


class KernelContext:
    def __init__(self, name: str, pf: ParsedFunc, debug: bool):
        self.name = name
        self.pf = pf
        self.debug = debug
        self.builder = Builder()
        self.ops = Ops(self.builder, check_divisors=debug, kernel=name)
        self.buffers: dict[int, Buffer] = {}
        self.storages: list = []   # the live fields the kernel names: plan.Field(k) is storages[k]
        self.kernel = Kernel(name, [], loc=pf.loc(pf.tree))
        self.call_stack: list = []
        self.uses_random = False
        self.moved_names: dict[str, str] = {}
        self.pending_config: dict = {}
        self.ret_dtype: DType | None = None
        self.in_parallel = False
        self.min_parallel: int | None = None
        self.scratch: list[Scratch] = []

    def buffer_for(self, obj) -> Buffer:
        buf = self.buffers.get(id(obj))
        if buf is None:
            name = obj.name or f"field{len(self.buffers)}"
            if isinstance(obj, Scratch):
                source = plan.Scratch(obj.index, obj.dtype.name, obj.element_size)
            else:
                self.storages.append(obj)
                source = plan.Field(len(self.storages) - 1)
            shape = None if isinstance(obj, Scratch) else tuple(obj.shape)
            buf = Buffer(name, obj.dtype, source, grad=bool(getattr(obj, "is_grad", False)),
                         vector=int(getattr(obj, "element_size", 1)),
                         shape=shape if shape is not None and all(isinstance(e, int) for e in shape) else None)
            self.buffers[id(obj)] = buf
            self.kernel.buffers.append(buf)
        return buf

    def arg_slot(self, name: str, dtype: DType, role) -> ArgSlot:
        a = ArgSlot(name, dtype, len(self.kernel.args), role)
        self.kernel.args.append(a)
        return a

    def set_loop_config(self, node, block_dim=None, serialize=False, parallelize=None, block_dim_adaptive=None):
        if block_dim is not None and not (isinstance(block_dim, int) and 1 <= block_dim <= 1024):
            raise CompileError(f"ti.loop_config(block_dim={block_dim!r}): block_dim must be an integer in [1, 1024]")
        self.pending_config = {"block_dim": block_dim, "serialize": bool(serialize)}

    def kernel_return(self, fl: FuncLowerer, node, value):
        if self.in_parallel:
            raise fl.error(node, "'return' inside a parallel loop is not supported: return from the serial part of the kernel")
        if any(l.kind in ("serial", "multi") for l in fl.loops) is False and fl.loops and fl.loops[-1].kind == "static":
            pass
        if self.ret_dtype is None:
            if value is None:
                return
            raise fl.error(node, f"kernel '{self.name}' returns a value but has no return type annotation; "
                                 f"add one, e.g. 'def {self.name}(...) -> ti.f32:'")
        if isinstance(value, Mat) or value is None:
            raise fl.error(node, f"kernel '{self.name}' must return one {self.ret_dtype} scalar")
        fl.b.emit(Op.RETURN, [fl.o.to_stmt(fl.o.cast(value, self.ret_dtype), self.ret_dtype)])


def _is_pure(fl_globals: dict, st: ast.stmt) -> bool:
    """A top-level statement that only defines locals: safe to recompute in every task."""
    if not isinstance(st, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.If, ast.Expr)):
        return False
    if isinstance(st, ast.Expr):
        return False
    for n in ast.walk(st):
        if isinstance(n, (ast.Subscript, ast.Attribute)) and isinstance(n.ctx, ast.Store):
            return False
        if isinstance(n, (ast.Return, ast.For, ast.While)):
            return False
        if isinstance(n, ast.Call):
            f = _resolve(fl_globals, n.func)
            if _is_print(f, n.func):
                return False
            if f is B.random or (isinstance(f, B.Builtin) and f.ref_first_arg) or \
                    _callee(f) is not None and not _func_is_pure(_callee(f), set()):
                return False
    return True


def _func_is_pure(f, seen: set) -> bool:
    """A @ti.func that computes a value only: it writes no field or ndarray element (nor any
    subscript or attribute: a local vector's component counts, conservatively), draws no random
    number, makes no atomic, and calls only such functions. Its value can be recomputed in every
    task like any kernel-scope expression."""
    if id(f) in seen:
        return False  # recursion: not inlinable anyway
    seen.add(id(f))
    try:
        tree = f.parsed().tree
    except Exception:
        return False
    g = static_globals(f.fn)
    for n in ast.walk(tree):
        if isinstance(n, (ast.Subscript, ast.Attribute)) and isinstance(n.ctx, ast.Store):
            return False
        if isinstance(n, ast.Call):
            c = _resolve(g, n.func)
            if _is_print(c, n.func):
                return False  # printing is an effect: not recomputed in every task
            if c is B.random or (isinstance(c, B.Builtin) and c.ref_first_arg):
                return False
            if _callee(c) is not None and not _func_is_pure(_callee(c), seen):
                return False
    return True


def _callee(f):
    """The function a kernel-scope call inlines, if any (a method's function, for obj.f(...))."""
    return inlinable(f.__func__ if isinstance(f, types.MethodType) else f)


def _is_print(resolved, func: ast.expr) -> bool:
    return resolved is builtins.print or (resolved is None and isinstance(func, ast.Name) and func.id == "print")


def _resolve(g: dict, node):
    if isinstance(node, ast.Name):
        return g.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _resolve(g, node.value)
        return getattr(base, node.attr, None) if base is not None else None
    return None


def _loop_is_static(fl: FuncLowerer, node: ast.For) -> bool:
    it = node.iter
    return isinstance(it, ast.Call) and _resolve(fl.globals, it.func) is static


def lower_kernel(fn, name: str, specs: list[ArgSpec], ret_dtype, *, debug: bool,
                 min_parallel: int | None = None) -> tuple[Kernel, list]:
    """Python kernel -> (IR, storage table: the fields it names, plan.Field(k) being the k-th).
    `min_parallel`: when set, a multi-dimensional parallel loop with
    constant extents runs its leading dimensions in parallel (as few as give at least this many
    threads) and the rest as serial loops inside each thread (see _parallel_prefix)."""
    pf = ParsedFunc.parse(fn)
    k = KernelContext(name, pf, debug)
    k.min_parallel = min_parallel
    k.ret_dtype = ret_dtype
    k.kernel.ret = ret_dtype
    # argument slots and buffers, shared by all tasks
    slots: dict[str, Any] = {}
    for pos, s in enumerate(specs):
        if s.kind == "scalar":
            slots[s.name] = k.arg_slot(s.name, s.dtype, plan.Scalar(pos, s.dtype.name))
        elif s.kind == "vector":
            n = math.prod(s.shape)
            slots[s.name] = [k.arg_slot(f"{s.name}_{c}", s.dtype, plan.Component(pos, c, n, s.dtype.name))
                             for c in range(n)]
        elif s.kind == "ndarray":
            per = math.prod(s.shape)  # scalars per element
            buf = Buffer(s.name, s.dtype, plan.Arg(pos), vector=per)
            gbuf = Buffer(s.name + ".grad", s.dtype, plan.ArgGrad(pos), grad=True, vector=per) if s.needs_grad else None
            dbuf = Buffer(s.name + ".dual", s.dtype, plan.ArgDual(pos), vector=per) if s.needs_dual else None
            k.kernel.buffers.append(buf)
            for extra in (gbuf, dbuf):
                if extra is not None:
                    k.kernel.buffers.append(extra)
            dims = [k.arg_slot(f"{s.name}_shape{d}", i32, plan.Extent(pos, d)) for d in range(s.ndim)]
            slots[s.name] = (buf, gbuf, dbuf, dims)

    def task_env(extra: dict) -> dict:
        env = {}
        b = k.builder
        for s in specs:
            if s.kind == "template":
                env[s.name] = s.value
            elif s.kind == "scalar":
                env[s.name] = b.emit(Op.ARG, (), s.dtype, slots[s.name], name=s.name)
            elif s.kind == "vector":
                env[s.name] = Mat([b.emit(Op.ARG, (), s.dtype, a, name=a.name) for a in slots[s.name]], s.shape)
            else:
                buf, gbuf, dbuf, dims = slots[s.name]
                shape = [b.emit(Op.ARG, (), i32, a, name=a.name) for a in dims]
                env[s.name] = ArrayArg(s.name, s.dtype, s.shape, shape, buf, gbuf, dbuf)
        env.update(extra)
        return env

    prelude: list[tuple[ast.stmt, dict, int]] = []  # (statement, static env, tasks before it)
    serial: list[tuple[ast.stmt, dict]] = []
    tasks: list[Task] = []

    # what kernel-scope statements name: the globals, closure and template arguments (a
    # data-oriented self), for telling calls with effects from pure ones (_is_pure)
    names = {**static_globals(pf.fn), **{s.name: s.value for s in specs if s.kind == "template"}}

    def new_lowerer(env: dict) -> FuncLowerer:
        return FuncLowerer(k, pf, [env, {}], ReturnCtx("kernel"))

    task_stops: dict[int, list] = {}  # id(task) -> what ti.stop_grad named inside it

    def flush_serial():
        if not serial:
            return
        if all(_is_pure(names, st) for st, _ in serial):
            serial.clear()  # only defines kernel-scope variables: recomputed where used
            return
        task = Task("serial", Block(), name=f"{name}_t{len(tasks)}")
        with k.builder.at(task.body):
            fl = new_lowerer(task_env({}))
            n_pre = len(prelude) - sum(1 for st, _ in serial if _is_pure(names, st))
            for entry in prelude[:max(n_pre, 0)]:
                _replay(fl, entry, tasks)
            _forget_moved(fl, k)
            n_stopped = len(k.builder.no_grad)
            for st, env in serial:
                _with_env(fl, env, lambda: fl.lower_body([st]))
            task_stops[id(task)] = k.builder.no_grad[n_stopped:]
            del k.builder.no_grad[n_stopped:]
        tasks.append(task)
        for st, _ in serial:
            for n in ast.walk(st):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and not _is_pure(names, st):
                    k.moved_names.setdefault(n.id, (
                        f"'{n.id}' was assigned at line {st.lineno + pf.line_offset} in a part of the kernel that "
                        f"runs as its own GPU pass (it writes fields or calls functions with effects), so later "
                        f"loops cannot see it. Compute '{n.id}' without side effects, or store it in a 0-d field"))
        serial.clear()

    def process(stmts: list[ast.stmt], env: dict):
        probe = new_lowerer(dict(env))
        for st in stmts:
            if isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant):
                continue
            if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and \
                    _resolve(probe.globals, st.value.func) is B.stop_grad:
                fl = new_lowerer(task_env(env))  # ti.stop_grad(field): a fact of the kernel, no code
                with k.builder.at(Block()):
                    fl.visit(st)
                continue
            if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and \
                    _resolve(probe.globals, st.value.func) is B.block_local:
                fl = new_lowerer(task_env(env))  # a hint, no code (its arguments are checked)
                with k.builder.at(Block()):
                    fl.visit(st)
                continue
            if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and \
                    _resolve(probe.globals, st.value.func) is _loop_config_marker:
                k.pending_config = {}
                fl = new_lowerer(task_env(env))
                with k.builder.at(Block()):
                    fl.visit(st)
                continue
            if isinstance(st, ast.For) and _loop_is_static(probe, st):
                fl = new_lowerer(task_env(env))
                with k.builder.at(Block()):
                    spec = analyze_iter(fl, st)
                for item in spec.static_items:
                    inner = dict(env)
                    fl.scopes.append(inner)
                    fl._bind_static_target(st.target, item)
                    fl.scopes.pop()
                    process(st.body, inner)
                continue
            if isinstance(st, ast.For):
                cfg, k.pending_config = k.pending_config, {}
                if cfg.get("serialize"):
                    serial.append((st, env))
                    flush_serial()
                    continue
                flush_serial()
                st, env, after = _reductions(k, new_lowerer, task_env, prelude, tasks, st, env)
                if after:  # zero the sums in a serial task of their own
                    serial.extend(after[0])
                    flush_serial()
                n_stopped = len(k.builder.no_grad)
                task = _range_task(k, new_lowerer, task_env, prelude, tasks, st, env, cfg)
                task_stops[id(task)] = k.builder.no_grad[n_stopped:]  # ti.stop_grad(x) in the loop: this task's
                del k.builder.no_grad[n_stopped:]
                tasks.append(task)
                if after:
                    process(after[1], env)
                continue
            if _is_pure(names, st):
                prelude.append((st, env, len(tasks)))
            serial.append((st, env))
        return

    process(pf.tree.body, {})
    # trailing pure statements with no effects need no task of their own
    if serial and all(_is_pure(names, st) for st, _ in serial):
        serial.clear()
    flush_serial()
    kern = k.kernel
    kern.tasks = tasks
    if any(s.op is Op.RANDOM for t in tasks for s in walk(t.body)) or any(
            s.op is Op.RANDOM for t in tasks for s in walk(t.bounds)):
        k.arg_slot("_seed", u32, plan.Seed())
        kern.uses_random = True
    kern.debug = debug
    def stopped(xs) -> frozenset:
        return frozenset(x.buffer.source if getattr(x, "is_array_arg", False) else k.buffers[id(x)].source
                         for x in xs if getattr(x, "is_array_arg", False) or id(x) in k.buffers)
    kern.no_grad = stopped(k.builder.no_grad)
    for t in tasks:
        t.no_grad = stopped(task_stops.get(id(t), ()))
    return kern, k.storages


_REDUCE_OPS = (ast.Add, ast.Sub)


def _reductions(k: KernelContext, new_lowerer, task_env, prelude, tasks, st: ast.For, env: dict):
    """Kernel-scope variables that the parallel loop `st` only accumulates into with += or -=
    become atomic reductions (Taichi's meaning): returns the loop with `s += e` turned into
    `s_sum[None] += e` on a Scratch, its env (binding the scratches), and ([the statements that
    zero them], [the statements `s = s + s_sum[None]` that follow the loop]), or () when the loop
    reduces nothing."""
    aug, other, reads = {}, set(), {}
    targets = set()
    for n in ast.walk(ast.Module(body=st.body, type_ignores=[])):
        if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name):
            targets.add(id(n.target))
            if isinstance(n.op, _REDUCE_OPS):
                aug.setdefault(n.target.id, []).append(n)
            else:
                other.add(n.target.id)
    for n in ast.walk(ast.Module(body=st.body, type_ignores=[])):
        if isinstance(n, ast.Name) and id(n) not in targets:
            if isinstance(n.ctx, ast.Store):
                other.add(n.id)
            else:
                reads.setdefault(n.id, n)
    for n in ast.walk(st.target):
        if isinstance(n, ast.Name):
            other.add(n.id)
    names = [name for name in aug if name not in other]
    if not names:
        return st, env, ()
    # what the names are before the loop: replay the kernel-scope definitions in a throwaway block
    found = {}
    with k.builder.at(Block()):
        fl = new_lowerer(task_env(env))
        for entry in prelude:
            _replay(fl, entry, tasks)
        _forget_moved(fl, k)
        fl.scopes[0].update(env)
        for name in names:
            v = next((scope[name] for scope in reversed(fl.scopes) if name in scope), None)
            kind = _numeric_kind(v)
            if kind is not None:
                found[name] = kind
    if not found:
        return st, env, ()
    for name in found:
        if name in reads:
            raise fl.error(reads[name], f"kernel-scope variable '{name}' is accumulated with += in this parallel "
                                        f"loop (an atomic reduction over its iterations) and also read in it; "
                                        f"its value there would depend on the order the iterations run. Read "
                                        f"'{name}' after the loop, or sum into a variable defined inside the loop")
    env = dict(env)
    zero, post, slots = [], [], {}
    for name, (dtype, shape) in found.items():
        sc = Scratch(len(k.scratch), dtype, shape, f"{name}_sum")
        k.scratch.append(sc)
        slot, zname = f"__{name}_sum{sc.index}", f"__{name}_zero{sc.index}"
        env[slot] = sc
        env[zname] = Mat([0] * math.prod(shape), shape) if shape else 0
        slots[name] = slot
        here = dict(lineno=st.lineno, col_offset=st.col_offset, end_lineno=st.end_lineno,
                    end_col_offset=st.end_col_offset)
        ref = lambda ctx: ast.Subscript(ast.Name(slot, ast.Load(), **here), ast.Constant(None, **here), ctx, **here)  # noqa: E731
        zero.append((ast.Assign([ref(ast.Store())], ast.Name(zname, ast.Load(), **here), **here), env))
        post.append(ast.Assign([ast.Name(name, ast.Store(), **here)],
                               ast.BinOp(ast.Name(name, ast.Load(), **here), ast.Add(), ref(ast.Load()), **here),
                               **here))
    loop = copy.deepcopy(st)
    for n in ast.walk(loop):
        if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name) and n.target.id in slots:
            t = n.target
            n.target = ast.copy_location(ast.Subscript(ast.copy_location(ast.Name(slots[t.id], ast.Load()), t),
                                                       ast.copy_location(ast.Constant(None), t), ast.Store()), t)
    return loop, env, (zero, post)


def _numeric_kind(v):
    """(dtype, element shape) of a kernel-scope numeric value (a local, a vector, a constant), or
    None for anything else."""
    from .refs import LocalRef
    if isinstance(v, LocalRef):
        return v.dtype(), tuple(v.shape)
    if isinstance(v, Stmt):
        return v.dtype, ()
    if isinstance(v, Mat):
        dts = {e.dtype if isinstance(e, Stmt) else (f32 if isinstance(e, float) else i32) for e in v.entries}
        return (f32 if f32 in dts else next(iter(dts))), tuple(v.shape)
    if isinstance(v, bool):
        return None
    if isinstance(v, float):
        return f32, ()
    if isinstance(v, int):
        return i32, ()
    return None


def _with_env(fl: FuncLowerer, env: dict, f):
    fl.scopes[0].update(env)
    return f()


def _written(task: Task) -> set:
    out = set()
    for blk in (task.bounds, task.body):
        for s in walk(blk):
            if s.op is Op.GLOBAL_STORE:
                out.add(s.attr)
            elif s.op is Op.ATOMIC:
                out.add(s.attr[1])
    return out


def _forget_moved(fl: FuncLowerer, k: KernelContext) -> None:
    """Variables an earlier serial part assigned cannot reach this task: looking them up gives
    the error that says why, instead of their stale recomputed value."""
    for scope in fl.scopes:
        for name in k.moved_names:
            scope.pop(name, None)


def _replay(fl: FuncLowerer, entry, tasks: list[Task]) -> None:
    """Recompute a kernel-scope variable definition in a later task; refuse when a task in
    between wrote a field it reads (the recomputed value would differ from Python's order)."""
    st, env, before = entry
    block = fl.b.block
    start = len(block.stmts)
    _with_env(fl, env, lambda: fl.visit(st))
    reads = {s.attr for s in walk(Block(block.stmts[start:])) if s.op is Op.GLOBAL_LOAD}
    for t in tasks[before:]:
        clash = reads & _written(t)
        if clash:
            names = ", ".join(sorted(f"'{b.name}'" for b in clash))
            raise fl.error(st, f"this kernel-scope variable reads field {names}, which a later loop of the kernel "
                               f"writes before the variable is used again; wgpu_ad recomputes kernel-scope variables "
                               f"in every GPU pass, so the value would change. Read the field inside the loop that "
                               f"uses it, or split the kernel in two")


def _range_task(k: KernelContext, new_lowerer, task_env, prelude, tasks, st: ast.For, env: dict, cfg: dict) -> Task:
    n = len(tasks)
    task = Task("range", Block(), Block(), block_dim=cfg.get("block_dim"), name=f"{k.name}_t{n}")
    o = k.ops
    with k.builder.at(task.bounds):
        fl = new_lowerer(task_env(env))
        for entry in prelude:
            _replay(fl, entry, tasks)
        _forget_moved(fl, k)
        fl.scopes[0].update(env)
        k.builder.loc = fl.pf.loc(st)
        spec = analyze_iter(fl, st)
        if spec.static_items is not None:
            raise fl.error(st, "internal: static loop reached the parallel loop builder")
        if len(spec.dims) == 1:
            lo, hi = trip_count(fl, *spec.dims[0], spec.step)
            begin, end = o.to_stmt(lo, i32), o.to_stmt(hi, i32)
            extents = None
        else:
            extents = [o.binary(Op.SUB, hi, lo) if not (is_static(hi) and is_static(lo)) else hi - lo
                       for lo, hi in spec.dims]
            npar = _parallel_prefix(extents, k.min_parallel)
            total = 1
            for e in extents[:npar]:
                total = o.binary(Op.MUL, total, e)
            begin, end = o.to_stmt(0, i32), o.to_stmt(total, i32)
        task.begin, task.end = begin, end
    with k.builder.at(task.body):
        k.builder.loc = fl.pf.loc(st)
        b = k.builder
        idx = b.loop_index(task, name="i" if isinstance(st.target, ast.Name) else "idx")
        if extents is None:
            # dimension 0 of the task: the analyses name it the same way in the IR and its clones
            k.kernel.loop_dims[idx] = (task, 0)
            indices = [idx if spec.step == 1 else o.binary(Op.ADD, spec.dims[0][0], o.binary(Op.MUL, idx, spec.step))]
        else:
            indices, rest = [None] * len(extents), idx
            for d in range(npar - 1, -1, -1):
                if d == 0:
                    q = rest
                else:
                    div = o.idiv(rest, extents[d])
                    q = o.binary(Op.SUB, rest, o.binary(Op.MUL, div, extents[d]))
                lo = spec.dims[d][0]
                k.kernel.loop_dims[q] = (task, d)
                indices[d] = q if is_static(lo) and lo == 0 else o.binary(Op.ADD, q, lo)
                if d:
                    rest = div
            for d in range(npar, len(extents)):  # the trailing dimensions: serial loops in each thread
                loop = b.range_for(o.to_stmt(0, i32), o.to_stmt(extents[d], i32),
                                   name=loop_var_name(st.target, d, spec.grouped))
                b.block = loop.blocks[0]
                q = b.loop_index(loop, name=loop.name)
                lo = spec.dims[d][0]
                indices[d] = q if is_static(lo) and lo == 0 else o.binary(Op.ADD, q, lo)
        bindings = bind_targets(fl, st, spec, indices)
        k.in_parallel = True
        fl.parallel_scope = len(fl.scopes)
        try:
            fl._loop_body(LoopCtx("parallel", task), st.body, bindings)
        finally:
            k.in_parallel = False
    return task


def _parallel_prefix(extents: list, min_parallel: int | None) -> int:
    """How many leading dimensions of a parallel ndrange run in parallel.

    All of them by default. With min_parallel (set on CPU adapters, where a few thousand threads
    fill every core), the fewest leading dimensions whose extents give at least that many threads:
    each thread then loops over the trailing dimensions itself, so what depends only on the
    leading indices (x[i] in a pair sum, an accumulation into y[i]) is loaded or accumulated once
    per thread instead of once per iteration (passes/licm.py hoists it out of the inner loops).
    Iterations of a parallel loop may run in any order, so this changes no result."""
    n = len(extents)
    if min_parallel is None or not all(isinstance(e, int) for e in extents):
        return n
    threads = 1
    for d, e in enumerate(extents):
        threads *= e
        if threads >= min_parallel:
            return d + 1
    return n
