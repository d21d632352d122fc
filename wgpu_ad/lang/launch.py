"""The per-launch path of a compiled kernel: pack arguments, size dispatches, record launches.

Everything comes from the kernel's launch plan (wgpu_ad/plan.py): what each uniform word holds,
where each buffer comes from, how many threads each task needs. Launcher() turns a plan into
closures once per compiled kernel, so a launch is a few list operations and one struct.pack.
"""
from __future__ import annotations

import dataclasses
import weakref

import struct
from typing import Callable

import numpy as np

from .. import plan
from ..errors import GpuError, KernelArgError
from ..runtime.adapter import describe as describe_adapter
from ..types import to_dtype
from .packs import Packing

_FMT = {"f32": "f", "i32": "i", "u32": "I"}
DYNAMIC_WORKGROUPS = 1024  # range bounds read from fields: grid-stride over this many workgroups


def storage_getter(src: plan.Source, storages: list, n_args: int = 0, n_scratch: int = 0,
                   n_shadow: int = 0) -> Callable:
    """call args -> the field / ndarray (or its gradient or dual) a buffer source names; a snapshot
    is passed after the call's `n_args` arguments, then the launch's `n_scratch` scratch buffers,
    and a checked launch's `n_shadow` shadow buffers last of all."""
    if isinstance(src, plan.Field):
        obj = storages[src.index]
        return lambda args: obj
    if isinstance(src, plan.FieldGrad):
        obj = storages[src.index]
        return lambda args: obj.grad
    if isinstance(src, plan.FieldDual):
        obj = storages[src.index]
        return lambda args: obj.dual
    if isinstance(src, plan.Arg):
        k = src.arg
        return lambda args: args[k]
    if isinstance(src, plan.ArgGrad):
        k = src.arg
        return lambda args: args[k].grad
    if isinstance(src, plan.ArgDual):
        k = src.arg
        return lambda args: args[k].dual
    if isinstance(src, plan.Snapshot):
        k = n_args + src.index
        return lambda args: args[k]
    if isinstance(src, plan.Scratch):
        k = src.index - n_scratch - n_shadow
        return lambda args: args[k]
    if isinstance(src, plan.ScratchGrad):
        k = src.index - n_scratch - n_shadow
        return lambda args: args[k].grad
    if isinstance(src, plan.ScratchDual):
        k = src.index - n_scratch
        return lambda args: args[k].dual
    if isinstance(src, plan.Shadow):
        k = src.index - n_shadow
        return lambda args: args[k]
    raise AssertionError(f"unknown buffer source {src!r} (compiler bug)")


def overlap(a: tuple, b: tuple) -> bool:
    """Two footprint indices (Launcher.footprint) may name a common element."""
    if len(a) != len(b):
        return True
    return all(x is None or y is None or x == y for x, y in zip(a, b))


class Launcher:
    """A compiled kernel made ready to launch: its plan turned into closures."""

    def __init__(self, compiled, specs: list):
        self.compiled = compiled
        self.ck = ck = compiled.ck
        self.plan = p = ck.plan
        self.specs = specs
        # (the packer reads names and dtypes: without template values, the write logs that keep
        # it through footprint_plan keep no template object alive)
        self.pack = _packer(ck.name, p.words, [dataclasses.replace(s, value=None) if s.kind == "template" else s
                                               for s in specs], p.prints)
        self.footprint_plan = Footprint(p, self.pack, compiled.storages)
        self.grads: dict = {}  # the adjoints of this forward (Kernel._get_grad), by what they differ in
        self.duals: dict = {}  # its dual kernels (Kernel._get_dual), by where the duals come from
        self.bounds = [_bounds(t) for t in p.tasks]
        self.storage = [storage_getter(src, compiled.storages, len(specs), len(p.scratch), len(p.shadows))
                        for src in p.buffers]
        self.snapshots = [storage_getter(src, compiled.storages) for src in p.snapshots]
        bound = {key for _, key, _ in plan.bound_buffers(ck)}
        # a buffer no task binds (an ndarray's gradient in a forward kernel) is neither allocated
        # nor marked as written
        self.resolvers = [(lambda args, get=get: get(args).gpu_buffer()) if n in bound else (lambda args: None)
                          for n, get in enumerate(self.storage)]
        # tasks binding more storage buffers than the device allows read some through packs (packs.py)
        self.packing = Packing(ck) if any(tp.packs for tp in p.tasks) else None
        self.has_asserts = bool(ck.asserts)
        self.alias_check = _alias_check(ck, specs)
        self.zero_check = _zero_check(p, self.storage) if p.zero_stores else None
        self.fuse_check = _fuse_check(p, self.storage) if p.fused is not None else None
        # what a forward launch reads and writes, by storage (versions: lang/kernel.py)
        srcs = compiled.storages
        self.loads = [storage_getter(s, srcs) for s in dict.fromkeys(a.source for a in p.accesses if a.kind == "load")]
        self.writes = [storage_getter(s, srcs) for s in dict.fromkeys(a.source for a in p.accesses
                                                                      if a.kind not in ("load", "load_before"))]
        # what its adjoint replays from the fields as they are: the loads, and the targets of atomic
        # min / max (the adjoint compares with the value that won); kernel.grad() checks them
        self.replays = [storage_getter(s, srcs) for s in dict.fromkeys(a.source for a in p.accesses
                                                                       if a.kind in ("load", "atomic"))]

    @property
    def ir(self):
        return self.compiled.ir

    @property
    def may_fuse(self) -> bool:
        """Whether a tape may defer this launch to fuse it with its adjoint: no return value, no
        asserts to report, no random numbers (the fused replay would draw others)."""
        return (self.ck.ret_dtype is None and not self.has_asserts and not self.plan.uses_random
                and not self.plan.snapshots and not self.plan.scratch
                and not self.plan.prints)  # the fused replay does not print

    def prepare(self, args) -> list:
        """The buffers of a launch with these arguments (allocating them, and marking them as
        written: Storage.all_zero), after the argument checks that need them."""
        buffers = [r(args) for r in self.resolvers]
        if self.alias_check is not None:
            self.alias_check(buffers)
        return buffers

    def word_values(self, args) -> tuple:
        """The values of the uniform words for these arguments (a seed word reads as 0)."""
        return self.pack.unpack(self.pack(args, _NoSeed()))

    def accessed(self, args) -> tuple[list, list]:
        """(storages read, storages written) by a launch with these arguments."""
        reads, writes = {}, {}
        for acc in self.plan.accesses:
            obj = storage_getter(acc.source, self.compiled.storages)(args)
            (reads if acc.kind in ("load", "load_before") else writes)[id(obj)] = obj
        return list(reads.values()), list(writes.values())

    def footprint(self, args) -> list[tuple]:
        """(storage, kind, index) per access; index: per dimension an int where every thread
        uses the same index (computed from these arguments), else None."""
        return self.footprint_plan.of(args)


class Footprint:
    """What Launcher.footprint needs, holding the kernel's storage table weakly: the write logs of
    long-lived storages keep it (ad/launches.py _Wrote) without keeping the Launcher and the
    fields it names alive (issue 25). A field that is gone is left out of of() (no live storage is
    it); of() is None when the gradient or dual of one is named (they may outlive it)."""

    __slots__ = ("accesses", "pack", "storages")

    def __init__(self, p: plan.LaunchPlan, pack, storages: list):
        self.accesses, self.pack = p.accesses, pack
        self.storages = [_weak(st) for st in storages]

    def of(self, args) -> list[tuple] | None:
        storages = [r() for r in self.storages]
        vals = self.pack.unpack(self.pack(args, _NoSeed()))
        out = []
        for acc in self.accesses:
            src = acc.source
            if isinstance(src, (plan.Field, plan.FieldGrad, plan.FieldDual)) and storages[src.index] is None:
                if isinstance(src, plan.Field):
                    continue  # a field that is gone: not the live storage a caller asks about
                return None  # the gradient or dual of one (which may live on): not known
            obj = storage_getter(src, storages)(args)
            idx = tuple(None if d is None else int(sum(c * (1 if w is None else vals[w]) for w, c in d))
                        for d in acc.dims)
            out.append((obj, acc.kind, idx))
        return out


def _weak(obj) -> Callable:
    try:
        return weakref.ref(obj)
    except TypeError:  # (not a storage: held as it is)
        return lambda: obj


class _NoSeed:
    def next_seed(self) -> int:
        return 0

    def print_tag(self, kernel: str, prints: tuple, record_words: int) -> int:
        return 0


# ---- the adapter's binding limit ---------------------------------------------------------------------

# per kind of compiled kernel: what it is, what its buffers hold, the fix (kernel: the user's name)
_ROLES = {
    "forward": ("kernel '{k}'", "fields and ndarrays",
                "Split the loop into kernels that each read and write fewer fields"),
    "adjoint": ("the adjoint of kernel '{k}' (its backward pass, run by ti.ad.Tape or {k}.grad())",
                "fields, ndarrays and their gradients",
                "Split the kernel into kernels that each read fewer fields with gradients"),
    "dual": ("the forward-mode kernel of '{k}' (its values and their tangents, run by ti.ad.FwdMode)",
             "fields, ndarrays and their duals", "Split the kernel into kernels that each read fewer fields"),
    "checked": ("the checked launch of kernel '{k}' (the run that verifies its accesses for reverse mode)",
                "fields, ndarrays and their shadow copies", "Split the kernel into kernels that each read fewer fields"),
}


def binding_limit_error(ck, kernel: str, role: str, rt) -> GpuError | None:
    """The error for a compiled kernel (role: a key of _ROLES) one of whose tasks binds more storage
    buffers than the device allows, or whose arguments are more than a launch can pass, which WebGPU
    would refuse with its raw validation text; None when it fits."""
    words, most = ck.arg_words, rt.max_arg_bytes // 4
    if words > most:
        what = _ROLES[role][0].format(k=kernel)
        return GpuError(f"{what} takes {words} words of arguments ({4 * words} bytes), more than one launch can "
                        f"pass ({most} words: wgpu_ad's argument buffer, and this adapter's "
                        f"max-storage-buffer-binding-size). Pass large arrays as a ti.ndarray or a field rather than "
                        f"as ti.types.vector / matrix arguments")
    limit = rt.limits.get("max-storage-buffers-per-shader-stage")
    task = max(ck.tasks, key=lambda t: t.storage_buffers()[0], default=None)
    if limit is None or task is None or task.storage_buffers()[0] <= limit:
        return None
    n, own = task.storage_buffers()
    what, held, fix = (x.format(k=kernel) for x in _ROLES[role])
    where = f"\n{task.loc.excerpt()}" if task.loc is not None else ""
    parts = f"{n - own} for its {held}" + (f", {own} of wgpu_ad's own" if own else "")
    return GpuError(f"{what} binds {n} storage buffers in one parallel loop ({parts}), but this adapter ({describe_adapter(rt.adapter)}) allows {limit} per shader (its "
                    f"max-storage-buffers-per-shader-stage; `python -m wgpu_ad` lists its limits). {fix}, or keep "
                    f"values that go together in one field (ti.Vector.field(n, ...) is one buffer for n "
                    f"components){where}")


def check_binding_limit(lc: Launcher, kernel: str, role: str, rt) -> None:
    err = binding_limit_error(lc.ck, kernel, role, rt)
    if err is not None:
        raise err


# ---- uniform words -------------------------------------------------------------------------------

def _packer(kname: str, words: tuple, specs: list, prints: tuple = ()) -> Callable:
    """(call args, runtime) -> the uniform block's bytes; .unpack(bytes) -> the word values."""
    st = struct.Struct("<" + "".join(_FMT[plan.word_dtype(w)] for w in words))
    getters = [_word_getter(kname, w, specs, prints) for w in words]
    derived = [(n, w) for n, w in enumerate(words) if isinstance(w, plan.StackCapacity)]

    def pack(args, rt):
        vals = [g(args, rt) for g in getters]
        for n, w in derived:
            vals[n] = max(1, plan.evaluate(w.end, vals) - plan.evaluate(w.begin, vals))
        try:
            return st.pack(*vals)
        except struct.error as e:
            raise KernelArgError(_explain(kname, specs, args, e)) from None
    pack.unpack, pack.struct = st.unpack, st
    return pack


def _word_getter(kname: str, w, specs, prints: tuple = ()) -> Callable:
    if isinstance(w, plan.Seed):
        return lambda args, rt: rt.next_seed()
    if isinstance(w, plan.PrintTag):  # which launch the kernel's print() records belong to
        record_words = 2 + max(len(p.values) for p in prints)
        return lambda args, rt: rt.print_tag(kname, prints, record_words)
    if isinstance(w, (plan.StackCapacity, plan.PackOffset)):
        return lambda args, rt: 0  # derived from the other words (_packer), set by the launch (packs.py)
    k = w.arg
    name = specs[k].name
    if isinstance(w, plan.Extent):
        d = w.dim
        return lambda args, rt: args[k].shape[d]
    dt = to_dtype(w.dtype)
    if isinstance(w, plan.Component):
        c, n = w.index, w.count
        conv = float if dt.is_float else int
        return lambda args, rt: conv(_flat(args[k], n, name, kname, dt)[c])

    def scalar(args, rt):
        v = args[k]
        if type(v) is int or type(v) is float and dt.is_float:
            return v
        if isinstance(v, (list, tuple)) or getattr(v, "shape", ()) != ():
            raise KernelArgError(f"kernel '{kname}': argument '{name}' must be a scalar {dt}, got {type(v).__name__}")
        if not _is_number(v):
            raise KernelArgError(f"kernel '{kname}': argument '{name}' must be a {dt} number, got "
                                 f"{type(v).__name__} {_short(v)}")
        if dt.is_float:
            return float(v)
        if not float(v).is_integer():
            raise KernelArgError(f"kernel '{kname}': argument '{name}' must be an integer ({dt}), got {v!r}")
        return int(v)
    return scalar


def _flat(v, n: int, name: str, kname: str, dtype: str):
    try:
        arr = np.asarray(v, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise KernelArgError(f"kernel '{kname}': argument '{name}' must be {n} {dtype} numbers, got "
                             f"{type(v).__name__} {_short(v)}") from None
    if arr.size != n:
        raise KernelArgError(f"kernel '{kname}': argument '{name}' must have {n} components, got {arr.size}")
    return arr


def _is_number(v) -> bool:
    """int, float, bool, NumPy and torch scalars: what float() and int() take as a number (a str
    such as "4" is not one: float("four") would fail far from the call)."""
    return not isinstance(v, (str, bytes)) and (hasattr(v, "__float__") or hasattr(v, "__index__"))


def _short(v) -> str:
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


def _explain(kname, specs, args, e) -> str:
    for s, v in zip(specs, args):
        if s.kind == "scalar":
            if not isinstance(v, (int, float, bool)) and not hasattr(v, "__float__"):
                return f"kernel '{kname}': argument '{s.name}' must be a {s.dtype} number, got {type(v).__name__}"
            if s.dtype.is_int and not float(v).is_integer():
                return f"kernel '{kname}': argument '{s.name}' must be an integer ({s.dtype}), got {v!r}"
            if s.dtype.name == "u32" and int(v) < 0:
                return f"kernel '{kname}': argument '{s.name}' is u32 and cannot be negative, got {v!r}"
            lim = 2 ** 31 if s.dtype.name == "i32" else 2 ** 32
            if s.dtype.is_int and not -lim <= int(v) < lim:
                return f"kernel '{kname}': argument '{s.name}' = {v} does not fit in {s.dtype}"
    return f"kernel '{kname}': bad arguments: {e}"


# ---- grids -----------------------------------------------------------------------------------------

def _bounds(t: plan.TaskPlan):
    """word values -> the task's iterations, or None when they depend on fields (a fixed grid)."""
    if t.serial:
        return lambda vals: 1
    if t.range is None:
        return None
    begin, end = t.range
    if not plan.uses_words(begin) and not plan.uses_words(end):
        n = max(0, plan.evaluate(end, ()) - plan.evaluate(begin, ()))
        return lambda vals: n
    return lambda vals: max(0, plan.evaluate(end, vals) - plan.evaluate(begin, vals))


# ---- launch-time checks ------------------------------------------------------------------------------

def _alias_check(ck, specs) -> Callable | None:
    """(buffers of a launch) -> raise KernelArgError when one ndarray (or its gradient) passed as
    two arguments is read through one and written through the other in one task: WebGPU refuses
    a buffer bound both ways in one dispatch. None when no task binds two argument buffers so."""
    srcs = ck.plan.buffers
    pairs = []
    for n in range(len(ck.tasks)):
        binds = [(key, ro) for t, key, ro in plan.bound_buffers(ck)
                 if t == n and isinstance(srcs[key], (plan.Arg, plan.ArgGrad, plan.ArgDual))]
        pairs += [(a, b) for k, (a, ra) in enumerate(binds) for b, rb in binds[k + 1:] if ra != rb]
    if not pairs:
        return None

    def check(buffers) -> None:
        for a, b in pairs:
            if buffers[a] is buffers[b] and buffers[a] is not None:
                sa, sb = srcs[a], srcs[b]
                what = ("the same ndarray" if isinstance(sa, plan.Arg) and isinstance(sb, plan.Arg)
                        else "ndarrays sharing a gradient or dual")
                raise KernelArgError(
                    f"kernel '{ck.name}': arguments '{specs[sa.arg].name}' and '{specs[sb.arg].name}' are {what}, "
                    f"read through one and written through the other in one parallel loop, which WebGPU cannot "
                    f"bind in one dispatch (and whose result would depend on the order of the threads); pass a "
                    f"copy as one of them")
    return check


def _zero_check(p: plan.LaunchPlan, storage: list) -> Callable:
    """For an adjoint with zero-store candidates (passes/autodiff/demote.py): call args -> the
    positions of those whose gradient is all zeros now (Storage.all_zero) and bound to no other
    buffer of the launch (an ndarray passed twice). Called before the launch asks for its
    buffers, which marks them as written."""
    candidates = [(pos, storage[pos]) for pos in p.zero_stores]
    bound = [get for get, src in zip(storage, p.buffers) if not isinstance(src, (plan.Snapshot, plan.Scratch,
                                                                                  plan.ScratchGrad, plan.Shadow))]

    def check(args) -> tuple:
        zero = [(pos, st) for pos, st in ((pos, get(args)) for pos, get in candidates) if st.all_zero]
        if not zero:
            return ()
        storages = [get(args) for get in bound]
        return tuple(pos for pos, st in zero if sum(b is st for b in storages) == 1)
    return check


def _fuse_check(p: plan.LaunchPlan, storage: list) -> Callable:
    """For a fused forward + adjoint kernel (passes/autodiff/fuse.py): call args -> whether its two
    parts may share one pass: the forward's writes are neither read nor written by anything else
    in the task, and the adjoint writes none of the primal storages the task reads."""
    kinds = [[storage[pos] for pos in positions] for positions in p.fused]

    def check(args) -> bool:
        pr, gr, fw, aw = ({id(get(args)) for get in gets} for gets in kinds)
        return not (fw & (pr | gr | aw) or pr & aw)
    return check


# ---- the launch ------------------------------------------------------------------------------------

def _geometry(lc: Launcher, args, src) -> tuple | None:
    """(name, shape, element shape) of the field or ndarray whose gradient (or itself) a plan
    source names in a launch with these arguments, or None: for the message of a failed
    gradient check (nan_check.py)."""
    try:
        st = lc.storage[lc.plan.buffers.index(src)](args)
    except (ValueError, IndexError, AttributeError):
        return None
    if getattr(st, "is_grad", False) and getattr(st, "primal", None) is not None:
        st = st.primal
    # an argument goes by its parameter's name (None here: the caller's label), as the kernel's source says
    name = None if isinstance(src, (plan.Arg, plan.ArgGrad, plan.ArgDual)) else st.name
    return name, tuple(st.shape), tuple(st.element_shape)


def launch(lc: Launcher, args, rt):
    ck, p = lc.ck, lc.plan
    packed = lc.pack(args, rt)
    buffers = lc.prepare(args)
    vals = None
    packing = None
    if lc.packing is not None:  # the packed buffers' offsets, from their sizes in this launch
        vals = list(lc.pack.unpack(packed))
        packing = lc.packing.place(buffers, vals)
        packed = lc.pack.struct.pack(*vals)
    for ti, (task, tp) in enumerate(zip(ck.tasks, p.tasks)):
        const, words = tp.stack
        if words:
            if vals is None:
                vals = lc.pack.unpack(packed)
            const += sum(vals[w] for w in words)
        if tp.serial:
            wg = 1
        else:
            bound = lc.bounds[ti]
            cap = p.grid_cap if tp.grid_cap is None else min(p.grid_cap, tp.grid_cap)
            if bound is None:
                wg = min(DYNAMIC_WORKGROUPS, cap)
            else:
                if vals is None:
                    vals = lc.pack.unpack(packed)
                n = bound(vals)
                if n <= 0:
                    continue
                wg = min(-(-n // tp.workgroup_size), cap)
            if const:  # every thread needs its own stack slice: bound the grid
                per_wg = const * 4 * tp.workgroup_size
                wg = max(1, min(wg, rt.max_scratch_bytes // per_wg))
            if tp.one_pass and (bound is None or wg * tp.workgroup_size < n):
                raise GpuError(f"kernel '{ck.name}': task {ti} runs one iteration per thread but its launch "
                               f"does not cover its range (compiler bug)")
        if packing is None or packing[ti] is None:
            rt.launch(ck, ti, buffers, packed, wg, const)
        else:  # (the runtime's pack buffers: no other thread's launch comes between)
            with rt._lock:
                rt.run_deferred()  # (a deferred launch may use them too: it runs first)
                packs = packing[ti].copy_in(rt, ck.name)
                rt.launch(ck, ti, buffers, packed, wg, const, packs=packs)
                packing[ti].copy_out(rt, packs)
    if lc.has_asserts:  # debug-mode asserts, autodiff stack overflow checks, gradient checks
        rt.check_errors(ck, lambda src: _geometry(lc, args, src))
    if ck.ret_dtype is not None:
        return rt.read_ret(ck.ret_dtype)
    return None
