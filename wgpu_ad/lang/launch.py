"""The per-launch path of a compiled kernel: pack arguments, size dispatches, record launches.

Everything that can be decided at compile time is decided in the make_* functions, so a launch
is a few list operations and one struct.pack.
"""
from __future__ import annotations

import struct
from typing import Callable

from ..errors import GpuError, KernelArgError
from ..ir.nodes import Kernel, Stmt, Task
from ..ir.ops import GroupOp, Op
from ..ir.semantics import evaluate, to_python, to_scalar

_FMT = {"f32": "f", "i32": "i", "u32": "I"}
DYNAMIC_WORKGROUPS = 1024  # range bounds read from fields: grid-stride over this many workgroups


def make_packer(kern: Kernel, specs) -> Callable:
    """(call args, runtime) -> uniform bytes, in the order of kern.args."""
    fmt = "<" + "".join(_FMT[a.dtype.name] for a in kern.args)
    st = struct.Struct(fmt)
    getters = []
    by_name = {s.name: (k, s) for k, s in enumerate(specs)}
    for a in kern.args:
        getters.append(_getter(a, by_name))
    if not kern.args:
        empty = lambda args, rt: b""
        empty.unpack = lambda data: ()
        return empty

    def pack(args, rt):
        try:
            return st.pack(*[g(args, rt) for g in getters])
        except struct.error as e:
            raise KernelArgError(_explain(kern, specs, args, e)) from None
    pack.unpack = st.unpack
    return pack


def _getter(a, by_name):
    if a.name == "_seed":
        return lambda args, rt: rt.next_seed()
    if a.name in by_name:
        k, s = by_name[a.name]
        name, dt = a.name, a.dtype

        def scalar(args, rt, k=k):
            v = args[k]
            if type(v) is int or type(v) is float and dt.is_float:
                return v
            if isinstance(v, (list, tuple)) or getattr(v, "shape", ()) != ():
                raise KernelArgError(f"argument '{name}' must be a scalar {dt}, got {type(v).__name__}")
            if dt.is_float:
                return float(v)
            if not float(v).is_integer():
                raise KernelArgError(f"argument '{name}' must be an integer ({dt}), got {v!r}")
            return int(v)
        return scalar
    base, _, tail = a.name.rpartition("_")
    if tail.startswith("shape") and base in by_name:
        k, _s = by_name[base]
        d = int(tail[5:])
        return lambda args, rt: args[k].shape[d]
    if base in by_name:  # a component of a vector argument
        k, s = by_name[base]
        c = int(tail)
        conv = float if a.dtype.is_float else int
        return lambda args, rt: conv(_flat(args[k], s)[c])
    raise AssertionError(f"no value for uniform slot {a.name}")


def _flat(v, spec):
    import numpy as np
    arr = np.asarray(v, dtype=np.float64).reshape(-1)
    n = int(np.prod(spec.shape))
    if arr.size != n:
        raise KernelArgError(f"argument '{spec.name}' must have {n} components, got {arr.size}")
    return arr


def _explain(kern, specs, args, e) -> str:
    for s, v in zip(specs, args):
        if s.kind == "scalar":
            if not isinstance(v, (int, float, bool)) and not hasattr(v, "__float__"):
                return f"kernel '{kern.name}': argument '{s.name}' must be a {s.dtype} number, got {type(v).__name__}"
            if s.dtype.is_int and not float(v).is_integer():
                return f"kernel '{kern.name}': argument '{s.name}' must be an integer ({s.dtype}), got {v!r}"
            if s.dtype.name == "u32" and int(v) < 0:
                return f"kernel '{kern.name}': argument '{s.name}' is u32 and cannot be negative, got {v!r}"
            lim = 2 ** 31 if s.dtype.name == "i32" else 2 ** 32
            if s.dtype.is_int and not -lim <= int(v) < lim:
                return f"kernel '{kern.name}': argument '{s.name}' = {v} does not fit in {s.dtype}"
    return f"kernel '{kern.name}': bad arguments: {e}"


def make_bounds(task: Task):
    """A host-side function argvals -> number of threads for a range task, or None when the
    bounds read fields (then the launch uses a fixed grid and the shader's grid-stride loop)."""
    if task.kind != "range":
        return lambda vals: 1
    return make_count(task.begin, task.end)


def make_count(begin: Stmt, end: Stmt):
    """argvals -> max(0, end - begin) evaluated on the host, or None when the bounds depend on
    anything but constants and kernel arguments."""
    stmts = {}
    ok = True

    def collect(s: Stmt):
        nonlocal ok
        if s.id in stmts:
            return
        if s.op not in GroupOp.ALU and s.op not in (Op.CONST, Op.ARG):
            ok = False
            return
        for a in s.args:
            collect(a)
        stmts[s.id] = s
    collect(begin)
    collect(end)
    if not ok:
        return None
    order = sorted(stmts.values(), key=lambda s: s.id)

    def count(vals):
        env = {}
        for s in order:
            if s.op is Op.CONST:
                env[s.id] = to_scalar(s.attr, s.dtype)
            elif s.op is Op.ARG:
                env[s.id] = to_scalar(vals[s.attr.index], s.dtype)
            else:
                env[s.id] = evaluate(s.op, s.dtype, *[env[a.id] for a in s.args])
        return max(0, to_python(env[end.id]) - to_python(env[begin.id]))
    if all(s.op is not Op.ARG for s in order):
        n = count(None)
        return lambda vals: n
    return count


def storage_getter(src, specs) -> Callable:
    """call args -> the field / ndarray (or its gradient) that a buffer source names: the object
    itself, or ("arg", name) / ("arg_grad", name) for an ndarray argument (or its gradient)."""
    if not isinstance(src, tuple):
        return lambda args: src
    k = [s.name for s in specs].index(src[1])
    if src[0] == "arg_grad":
        return lambda args: args[k].grad
    return lambda args: args[k]


def make_resolvers(ck, specs) -> list[Callable]:
    """Per kernel buffer: call args -> the wgpu buffer to bind (None for a buffer no task binds,
    such as an ndarray argument's gradient in a forward kernel: it is neither allocated nor
    marked as written)."""
    bound = {b.key for t in ck.tasks for b in t.bindings if b.kind == "buffer"}
    out = []
    for n, src in enumerate(ck.buffer_sources):
        if n not in bound:
            out.append(lambda args: None)
        else:
            get = storage_getter(src, specs)
            out.append(lambda args, get=get: get(args).gpu_buffer())
    return out


def make_zero_check(kern: Kernel, ck, specs) -> Callable | None:
    """For an adjoint with zero-store candidates (passes/autodiff/demote.py): call args -> the
    positions of those whose gradient is all zeros now (Storage.all_zero) and bound to no other
    buffer of the launch (an ndarray passed twice); None when it has none. Called before the
    launch asks for its buffers, which marks them as written."""
    if not kern.zero_stores:
        return None
    candidates = [(pos, storage_getter(buf.source, specs)) for pos, buf in kern.zero_stores]
    bound = [storage_getter(src, specs) for src in ck.buffer_sources]

    def check(args) -> tuple:
        zero = [(pos, st) for pos, st in ((pos, get(args)) for pos, get in candidates) if st.all_zero]
        if not zero:
            return ()
        storages = [get(args) for get in bound]
        return tuple(pos for pos, st in zero if sum(b is st for b in storages) == 1)
    return check


def make_alias_check(ck) -> Callable | None:
    """(buffers of a launch) -> raise KernelArgError when one ndarray (or its gradient) passed as
    two arguments is read through one and written through the other in one task: WebGPU refuses
    a buffer bound both ways in one dispatch. None when no task binds two argument buffers so."""
    pairs = []
    for t in ck.tasks:
        binds = [b for b in t.bindings if b.kind == "buffer" and isinstance(ck.buffer_sources[b.key], tuple)]
        pairs += [(a.key, b.key) for n, a in enumerate(binds) for b in binds[n + 1:] if a.read_only != b.read_only]
    if not pairs:
        return None

    def check(buffers) -> None:
        for a, b in pairs:
            if buffers[a] is buffers[b] and buffers[a] is not None:
                (ka, na), (kb, nb) = ck.buffer_sources[a], ck.buffer_sources[b]
                what = "the same ndarray" if ka == kb == "arg" else "ndarrays sharing a gradient"
                raise KernelArgError(
                    f"kernel '{ck.name}': arguments '{na}' and '{nb}' are {what}, read through one and written "
                    f"through the other in one parallel loop, which WebGPU cannot bind in one dispatch (and "
                    f"whose result would depend on the order of the threads); pass a copy as one of them")
    return check


def make_fuse_check(kern: Kernel, specs) -> Callable | None:
    """For a fused forward + adjoint kernel (passes/autodiff/fuse.py): call args -> whether its two
    parts may share one pass: the forward's writes are neither read nor written by anything else
    in the task, and the adjoint writes none of the primal storages the task reads. None for
    other kernels."""
    f = kern.fused
    if f is None:
        return None
    kinds = [[storage_getter(b.source, specs) for b in bufs]
             for bufs in (f.primal_reads, f.grad_reads, f.fwd_writes, f.adj_writes)]

    def check(args) -> bool:
        pr, gr, fw, aw = ({id(get(args)) for get in gets} for gets in kinds)
        return not (fw & (pr | gr | aw) or pr & aw)
    return check


def launch(kobj, c, specs, args, rt):
    ck = c.ck
    packed = c.pack(args, rt)
    buffers = [r(args) for r in c.resolvers]
    if c.alias_check is not None:
        c.alias_check(buffers)
    vals = None
    for ti, task in enumerate(ck.tasks):
        if task.serial:
            wg = 1
        else:
            bound = c.bounds[ti]
            if bound is None:
                wg = min(DYNAMIC_WORKGROUPS, rt.grid_cap)
            else:
                if vals is None:
                    vals = c.pack.unpack(packed)
                n = bound(vals)
                if n <= 0:
                    continue
                wg = min(-(-n // task.workgroup_size), rt.grid_cap)
            if task.stack_words:  # every thread needs its own stack slice: bound the grid
                per_wg = task.stack_words * 4 * task.workgroup_size
                wg = max(1, min(wg, rt.max_scratch_bytes // per_wg))
            if task.one_pass and (bound is None or wg * task.workgroup_size < n):
                raise GpuError(f"kernel '{ck.name}': task {ti} runs one iteration per thread but its "
                               f"launch does not cover its range: Runtime.grid_cap was lowered after "
                               f"the kernel was compiled (set it before the first launch, or call "
                               f"ti.reset()); otherwise a compiler bug")
        rt.launch(ck, ti, buffers, packed, wg)
    if c.has_asserts:  # debug-mode asserts, or autodiff stack overflow checks
        rt.check_errors(ck)
    if ck.ret_dtype is not None:
        return rt.read_ret(ck.ret_dtype)
    return None
