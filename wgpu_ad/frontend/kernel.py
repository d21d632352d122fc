"""Kernel structure: arguments, global buffers, and the split of a kernel body into tasks.

As in Taichi, each outermost `for` of a kernel is a parallel loop (one task, one dispatch);
other top-level statements run in serial tasks. Kernel-scope variables computed without side
effects are recomputed at the start of every later task that may use them.

lower_kernel walks the kernel's top-level statements and decides what runs where; the parts it
calls are: kernel_context.py (what the lowering carries), kernel_scope.py (which statements are
pure, and their recomputation), reductions.py (kernel-scope `s += ...` in a parallel loop) and
parallel.py (a parallel loop's range task).
"""
from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from typing import Any

from .. import plan
from ..errors import CompileError
from ..ir.nodes import Block, Buffer, Kernel, Task, walk
from ..ir.ops import Op
from ..types import DType, i32, u32
from . import builtins as B
from .context import ParsedFunc, ReturnCtx, static_globals
from .kernel_context import KernelContext
from .kernel_scope import forget_moved, is_pure, loop_is_static, replay, resolve, with_env
from .loops import analyze_iter
from .lower import FuncLowerer
from .methods import loop_config as _loop_config_marker
from .parallel import range_task
from .reductions import atomic_reductions
from .values import Mat


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


def lower_kernel(fn, name: str, specs: list[ArgSpec], ret_dtype, *, debug: bool,
                 min_parallel: int | None = None) -> tuple[Kernel, list]:
    """Python kernel -> (IR, storage table: the fields it names, plan.Field(k) being the k-th).
    `min_parallel`: when set, a multi-dimensional parallel loop with
    constant extents runs its leading dimensions in parallel (as few as give at least this many
    threads) and the rest as serial loops inside each thread (see parallel_prefix)."""
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
    # data-oriented self), for telling calls with effects from pure ones (is_pure)
    names = {**static_globals(pf.fn), **{s.name: s.value for s in specs if s.kind == "template"}}

    def new_lowerer(env: dict) -> FuncLowerer:
        return FuncLowerer(k, pf, [env, {}], ReturnCtx("kernel"))

    task_stops: dict[int, list] = {}  # id(task) -> what ti.stop_grad named inside it

    def flush_serial():
        if not serial:
            return
        if all(is_pure(names, st) for st, _ in serial):
            serial.clear()  # only defines kernel-scope variables: recomputed where used
            return
        task = Task("serial", Block(), name=f"{name}_t{len(tasks)}")
        with k.builder.at(task.body):
            fl = new_lowerer(task_env({}))
            n_pre = len(prelude) - sum(1 for st, _ in serial if is_pure(names, st))
            for entry in prelude[:max(n_pre, 0)]:
                replay(fl, entry, tasks)
            forget_moved(fl, k)
            n_stopped = len(k.builder.no_grad)
            for st, env in serial:
                with_env(fl, env, lambda: fl.lower_body([st]))
            task_stops[id(task)] = k.builder.no_grad[n_stopped:]
            del k.builder.no_grad[n_stopped:]
        tasks.append(task)
        for st, _ in serial:
            for n in ast.walk(st):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and not is_pure(names, st):
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
                    resolve(probe.globals, st.value.func) is B.stop_grad:
                fl = new_lowerer(task_env(env))  # ti.stop_grad(field): a fact of the kernel, no code
                with k.builder.at(Block()):
                    fl.visit(st)
                continue
            if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and \
                    resolve(probe.globals, st.value.func) is B.block_local:
                fl = new_lowerer(task_env(env))  # a hint, no code (its arguments are checked)
                with k.builder.at(Block()):
                    fl.visit(st)
                continue
            if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and \
                    resolve(probe.globals, st.value.func) is _loop_config_marker:
                k.pending_config = {}
                fl = new_lowerer(task_env(env))
                with k.builder.at(Block()):
                    fl.visit(st)
                continue
            if isinstance(st, ast.For) and loop_is_static(probe, st):
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
                st, env, after = atomic_reductions(k, new_lowerer, task_env, prelude, tasks, st, env)
                if after:  # zero the sums in a serial task of their own
                    serial.extend(after[0])
                    flush_serial()
                n_stopped = len(k.builder.no_grad)
                task = range_task(k, new_lowerer, task_env, prelude, tasks, st, env, cfg)
                task_stops[id(task)] = k.builder.no_grad[n_stopped:]  # ti.stop_grad(x) in the loop: this task's
                del k.builder.no_grad[n_stopped:]
                tasks.append(task)
                if after:
                    process(after[1], env)
                continue
            if is_pure(names, st):
                prelude.append((st, env, len(tasks)))
            serial.append((st, env))
        return

    process(pf.tree.body, {})
    # trailing pure statements with no effects need no task of their own
    if serial and all(is_pure(names, st) for st, _ in serial):
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
    kern.captured = k.captured
    for t in tasks:
        t.no_grad = stopped(task_stops.get(id(t), ()))
    return kern, k.storages

