"""@ti.kernel and @ti.func: specialization, compilation (frontend -> passes -> WGSL) and launch."""
from __future__ import annotations

import dataclasses
import inspect
import os
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import CompileError, KernelArgError, WgpuAdError, debug_enabled
from ..types import MatrixType, VectorType, to_dtype
from .launch import launch, storage_getter

_compile_epoch = [0]  # bumped by ti.reset(): compiled kernels belong to one device
_ad_state = None      # wgpu_ad.ad.state, imported on first launch (the tape records launches)


def _get_runtime():
    from ..runtime import device
    global _get_runtime
    _get_runtime = device.get_runtime
    return device.get_runtime()


def _ad():
    global _ad_state
    if _ad_state is None:
        from ..ad import state
        _ad_state = state
    return _ad_state


class Template:
    """ti.template(): the argument is bound at compile time (fields, Python values)."""

    def __repr__(self):
        return "ti.template()"


def template() -> Template:
    return Template()


@dataclass(frozen=True)
class NdarrayType:
    """ti.types.ndarray(dtype=None, ndim=None): an ndarray argument."""

    dtype: Any = None
    ndim: int | None = None
    needs_grad: bool | None = None

    def __call__(self, *a, **k):  # allow ti.types.ndarray() and ti.types.ndarray used bare
        return NdarrayType(*a, **k)


ndarray_type = NdarrayType()


class Func:
    """@ti.func: inlined into the kernels that call it."""

    _wgpu_ad_func = True

    def __init__(self, fn: Callable):
        self.fn = fn
        self._parsed = None
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__

    def parsed(self):
        from ..frontend.lower import ParsedFunc
        if self._parsed is None:
            self._parsed = ParsedFunc.parse(self.fn)
        return self._parsed

    def __call__(self, *args, **kwargs):
        raise WgpuAdError(f"@ti.func '{self.fn.__name__}' can only be called from a kernel or another ti.func")


def func(fn: Callable) -> Func:
    return Func(fn)


def real_func(fn: Callable) -> Func:  # Taichi's ti.real_func: inlined here as well
    return Func(fn)


def _annotation(fn, p: inspect.Parameter):
    ann = p.annotation
    if isinstance(ann, str):
        try:
            ann = eval(ann, fn.__globals__)  # `from __future__ import annotations`
        except Exception as e:
            raise CompileError(f"kernel '{fn.__name__}': cannot evaluate the annotation of '{p.name}': {e}")
    return ann


@dataclass
class _Compiled:
    ck: Any                         # runtime.compiled.CompiledKernel
    ir: Any                         # the optimised ir.Kernel
    pack: Callable                  # call values -> uniform bytes
    bounds: list                    # per task: callable(argvals) -> thread count, or None (dynamic)
    resolvers: list                 # per buffer: callable(call args) -> wgpu buffer
    has_asserts: bool
    footprint: Any = None           # _static_footprint(ir), computed when a tape asks
    stacks: list = dataclasses.field(default_factory=list)    # adjoints: stacks sized per launch
    variants: dict = dataclasses.field(default_factory=dict)  # adjoints: stack sizes -> CompiledKernel
    codegen: Any = None
    slot: Any = None                # lang/cache.Slot: where this compile lives on disk, or None
    zero_check: Any = None          # adjoints: launch.make_zero_check, or None without candidates
    fuse_check: Any = None          # fused adjoints: launch.make_fuse_check
    alias_check: Any = None         # launch.make_alias_check: ndarrays bound both ways, or None


class Kernel:
    """@ti.kernel: compiled on first call for each combination of template values and ndarray types."""

    _wgpu_ad_kernel = True

    def __init__(self, fn: Callable):
        self.fn = fn
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__
        self.sig = inspect.signature(fn)
        self.params = list(self.sig.parameters.values())
        self.anns = [_annotation(fn, p) for p in self.params]
        for p, a in zip(self.params, self.anns):
            if a is inspect.Parameter.empty:
                raise CompileError(f"kernel '{fn.__name__}': argument '{p.name}' needs a type annotation "
                                   f"(e.g. ti.f32, ti.i32, ti.template() or ti.types.ndarray())")
        ret = self.sig.return_annotation
        if isinstance(ret, str):
            ret = eval(ret, fn.__globals__)
        self.ret_dtype = None if ret in (inspect.Signature.empty, None) else to_dtype(ret)
        self._cache: dict = {}
        self._grad_cache: dict = {}
        self._last = None  # (epoch, compiled, specs) when every argument is a plain scalar
        self._scalar_only = all(not isinstance(a, (Template, NdarrayType, VectorType, MatrixType))
                                and a not in (Template, NdarrayType) for a in self.anns)
        self._no_grad = False

    # ---- argument handling ------------------------------------------------------------
    def _specs(self, args: tuple):
        from ..frontend.kernel import ArgSpec
        if len(args) != len(self.params):
            raise KernelArgError(f"kernel '{self.__name__}' takes {len(self.params)} argument(s) "
                                 f"({', '.join(p.name for p in self.params)}), got {len(args)}")
        specs, key = [], []
        for p, ann, v in zip(self.params, self.anns, args):
            if isinstance(ann, Template) or ann is Template:
                specs.append(ArgSpec(p.name, "template", value=v))
                key.append(("t", id(v) if not isinstance(v, (int, float, bool, str)) else (type(v), v)))
            elif isinstance(ann, NdarrayType) or ann is NdarrayType:
                specs.append(self._ndarray_spec(p.name, ann, v))
                s = specs[-1]
                key.append(("n", s.dtype.name, s.shape, s.ndim, s.needs_grad))
            elif isinstance(ann, (VectorType, MatrixType)):
                specs.append(ArgSpec(p.name, "vector", ann.dtype, ann.shape))
                key.append(("v",))
            else:
                try:
                    dt = to_dtype(ann)
                except TypeError:
                    raise CompileError(f"kernel '{self.__name__}': unsupported annotation {ann!r} for argument '{p.name}'") from None
                specs.append(ArgSpec(p.name, "scalar", dt))
                key.append(("s",))
        return specs, tuple(key)

    def _ndarray_spec(self, name, ann, v):
        from ..frontend.kernel import ArgSpec
        if not hasattr(v, "gpu_buffer") or not hasattr(v, "element_shape") or getattr(v, "is_field", False):
            raise KernelArgError(f"kernel '{self.__name__}': argument '{name}' must be a ti.ndarray, got {type(v).__name__}")
        ann = ann if isinstance(ann, NdarrayType) else NdarrayType()
        if ann.ndim is not None and ann.ndim != len(v.shape):
            raise KernelArgError(f"kernel '{self.__name__}': argument '{name}' must have ndim={ann.ndim}, got shape {v.shape}")
        if ann.dtype is not None:
            want = ann.dtype
            if isinstance(want, (VectorType, MatrixType)):
                ok = want.dtype == v.dtype and want.shape == tuple(v.element_shape)
            else:
                ok = to_dtype(want) == v.dtype and tuple(v.element_shape) == ()
            if not ok:
                raise KernelArgError(f"kernel '{self.__name__}': argument '{name}' must have dtype {want}, got {v.dtype} with element shape {tuple(v.element_shape)}")
        return ArgSpec(name, "ndarray", v.dtype, tuple(v.element_shape), len(v.shape),
                       needs_grad=bool(getattr(v, "needs_grad", False)))

    # ---- compilation ------------------------------------------------------------------
    def _compile(self, specs, key, rt) -> _Compiled:
        from ..frontend.kernel import lower_kernel
        from .cache import forward_slot
        ir = _user_errors(lambda: lower_kernel(self.fn, self.__name__, specs, self.ret_dtype, debug=rt.debug,
                                               min_parallel=rt.min_parallel))
        return _build(lambda: ir, specs, rt, forward_slot(ir, rt))

    def _get(self, args):
        rt = _get_runtime()
        if self._scalar_only:  # the hot path: nothing to specialise on
            hit = self._last
            if hit is not None and hit[0] == _compile_epoch[0] and len(args) == len(self.params):
                return hit[1], hit[2], rt
        specs, key = self._specs(args)
        full = (key, _compile_epoch[0])
        c = self._cache.get(full)
        if c is None:
            c = self._cache[full] = self._compile(specs, key, rt)
        if self._scalar_only:
            self._last = (_compile_epoch[0], c, specs)
        return c, specs, rt

    def __call__(self, *args, **kwargs):
        if kwargs:
            args = self._bind_kwargs(args, kwargs)
        c, specs, rt = self._get(args)
        ad = _ad_state or _ad()
        tape = ad.current_tape
        if tape is not None:
            tape.record(self, args)
            if tape.hold(self, c, specs, args, rt):
                return None  # launched before anything else reaches the device, or fused with its adjoint
        return launch(self, c, specs, args, rt)

    # ---- reverse mode ---------------------------------------------------------------------
    @property
    def grad(self) -> "_GradLauncher":
        """kernel.grad(*args): run the adjoint of this kernel for these arguments."""
        return _GradLauncher(self)

    def _grad_source(self, specs):
        by_name = {s.name: s for s in specs}

        def source(buf):
            src = buf.source
            if isinstance(src, tuple):
                spec = by_name.get(src[1])
                return ("arg_grad", src[1]) if src[0] == "arg" and spec is not None and spec.needs_grad else None
            return src.grad if getattr(src, "needs_grad", False) else None
        return source

    def _get_grad(self, args, launching: bool = False, fused: bool = False):
        """The compiled adjoint for these arguments. When `launching`, the variant that stores
        into the zero-store candidates whose gradients are all zeros now, if any (see
        passes/autodiff/demote.py): each variant is compiled once. fused: the forward and the
        adjoint in one kernel (passes/autodiff/fuse.py), or None as the first item when this
        kernel cannot be fused."""
        c, specs, rt = self._get(args)
        from ..passes.autodiff import DEFAULT_STACK_SIZE
        stack = getattr(rt, "ad_stack_size", None) or DEFAULT_STACK_SIZE
        have = tuple(bool(getattr(s, "needs_grad", False)) for s in c.ck.buffer_sources if not isinstance(s, tuple))
        # the forward compile stands for the argument specs and the epoch (self._cache keeps it
        # alive, so its id is never reused): no second pass over the arguments per launch
        key = (id(c), have, stack, fused)
        zero = ()
        while True:
            g = self._grad_cache.get((*key, zero), False)
            if g is False:
                g = self._grad_cache[(*key, zero)] = self._compile_grad(c, specs, rt, stack, have, zero, fused)
            if g is None or zero or not launching or g.zero_check is None:
                return g, specs, rt
            zero = g.zero_check(args)
            if not zero:
                return g, specs, rt

    def _compile_grad(self, c, specs, rt, stack, have, zero=(), fused=False):
        from ..passes.autodiff import NotFusable, reverse_kernel

        def make_ir():
            return reverse_kernel(c.ir, self._grad_source(specs), stack, zero,
                                  transpose=rt.min_parallel, fuse=fused)
        try:
            return _build(make_ir, specs, rt, c.slot and c.slot.adjoint(have, stack, zero, fused))
        except (NotFusable, CompileError):
            if not fused:
                raise
            return None  # the tape launches the forward and the adjoint apart (and reports errors then)

    def footprint(self, *args) -> list[tuple]:
        """What this launch touches: (storage, kind, index) with kind 'load', 'store', 'add' (atomic
        add/sub) or 'atomic', and index a tuple with an int where the index is the same for every
        thread and iteration (computed from constants and these arguments) and None elsewhere."""
        c, specs, rt = self._get(args)
        fp = c.footprint
        if fp is None:
            fp = c.footprint = _static_footprint(c.ir)
        vals = dict(zip((a.name for a in c.ir.args), c.pack.unpack(c.pack(args, _NoSeed()))))
        out = []
        for src, kind, dims in fp:
            obj = storage_getter(src, specs)(args)
            idx = tuple(None if d is None else int(sum(c * (1 if k is None else vals[k[1]]) for k, c in d.items()))
                        for d in dims)
            out.append((obj, kind, idx))
        return out

    def accessed(self, *args) -> tuple[list, list]:
        """(storages read, storages written) by this kernel for these arguments (primal ones)."""
        c, specs, _ = self._get(args)
        if c.footprint is None:
            c.footprint = _static_footprint(c.ir)
        reads, writes = {}, {}
        for src, kind, _dims in c.footprint:
            obj = storage_getter(src, specs)(args)
            (reads if kind == "load" else writes)[id(obj)] = obj
        return list(reads.values()), list(writes.values())

    def _bind_kwargs(self, args, kwargs):
        try:
            ba = self.sig.bind(*args, **kwargs)
        except TypeError as e:
            raise KernelArgError(f"kernel '{self.__name__}': {e}") from None
        return tuple(ba.arguments[p.name] for p in self.params)

    # ---- inspection -------------------------------------------------------------------
    def get_ir(self, *args) -> str:
        """The optimised IR of the kernel specialised for these arguments."""
        from ..ir.printer import format_kernel
        return format_kernel(self._get(args)[0].ir)

    def get_wgsl(self, *args, grad: bool = False) -> str:
        """The generated WGSL of every task of the kernel (or of its adjoint) for these arguments."""
        c = (self._get_grad(args) if grad else self._get(args))[0]
        return "\n".join(t.wgsl for t in c.ck.tasks)

    def get_grad_ir(self, *args) -> str:
        """The optimised IR of the kernel's adjoint for these arguments."""
        from ..ir.printer import format_kernel
        return format_kernel(self._get_grad(args)[0].ir)

    def print_ir(self, *args) -> None:
        print(self.get_ir(*args))

    def print_wgsl(self, *args) -> None:
        print(self.get_wgsl(*args))


def _user_errors(fn: Callable):
    """fn(), with compile errors showing the user's source, not the compiler's frames (unless
    WGPU_AD_DEBUG_COMPILER=1)."""
    try:
        return fn()
    except CompileError as e:
        if debug_enabled():
            raise
        raise e.with_traceback(None) from None


def _build(make_ir: Callable, specs, rt, slot=None) -> _Compiled:
    """IR (from make_ir) -> optimised IR -> WGSL -> everything a launch needs. With a cache slot
    (lang/cache.py), a stored compile is loaded instead, and a new one is stored."""
    got = slot.load() if slot is not None else None
    if got is not None:
        ir, ck = got
        return _assemble(ir, ck, _launch_sized_stacks(ir), specs, rt, slot)
    ir, ck, stacks = _user_errors(lambda: _compile_ir(make_ir, rt, slot))
    if getattr(rt, "print_wgsl", False) or os.environ.get("WGPU_AD_PRINT_WGSL", "") not in ("", "0"):
        for t in ck.tasks:
            print(t.wgsl)
    return _assemble(ir, ck, stacks, specs, rt, slot)


def _compile_ir(make_ir: Callable, rt, slot):
    from ..passes.pipeline import optimize
    ir = make_ir()
    print_ir = os.environ.get("WGPU_AD_PRINT_IR", "") not in ("", "0") or getattr(rt, "print_ir", False)
    ir = optimize(ir, print_ir=print_ir, verify=rt.debug or debug_enabled())
    stored = slot.dump_ir(ir) if slot is not None else None  # before _launch_sized_stacks changes it
    stacks = _launch_sized_stacks(ir)
    ck = _codegen(ir, rt)()
    if slot is not None:
        slot.store(stored, ck)
    return ir, ck, stacks


def _codegen(ir, rt) -> Callable:
    """ir -> CompiledKernel, again for each stack-size variant of an adjoint."""
    def codegen():
        from ..codegen.wgsl import generate
        from ..ir.clone import clone_kernel
        from ..passes.prereduce import prereduce
        return generate(prereduce(clone_kernel(ir)), float_atomics=rt.has_float_atomics, debug=rt.debug,
                        subgroups=rt.has_subgroups, grid_cap=rt.grid_cap)
    return codegen


def _assemble(ir, ck, stacks, specs, rt, slot) -> _Compiled:
    """What a launch needs, from the optimised IR and its WGSL (compiled now or loaded)."""
    from .launch import make_alias_check, make_bounds, make_fuse_check, make_packer, make_resolvers, make_zero_check
    return _Compiled(ck, ir, make_packer(ir, specs), [make_bounds(t) for t in ir.tasks],
                     make_resolvers(ck, specs), bool(ck.asserts), stacks=stacks,
                     codegen=_codegen(ir, rt), slot=slot, zero_check=make_zero_check(ir, ck, specs),
                     fuse_check=make_fuse_check(ir, specs), alias_check=make_alias_check(ck))


def launch_fused(k: Kernel, args) -> bool:
    """Launch `k`'s forward and its adjoint as one fused kernel (passes/autodiff/fuse.py), for the
    last launch of a tape; False (nothing launched) when they cannot be fused for these args."""
    g, specs, rt = k._get_grad(args, launching=True, fused=True)
    if g is None or not g.fuse_check(args):
        return False
    if g.stacks:
        g = _sized_variant(g, args, rt)
    launch(k, g, specs, args, rt)
    return True


class _GradLauncher:
    def __init__(self, k: Kernel):
        self.k = k

    def __call__(self, *args, **kwargs):
        k = self.k
        if k._no_grad:
            return None  # @ti.ad.no_grad: the kernel has no gradient (Taichi's behaviour)
        if kwargs:
            args = k._bind_kwargs(args, kwargs)
        g, specs, rt = k._get_grad(args, launching=True)
        if g.stacks:
            g = _sized_variant(g, args, rt)
        return launch(k, g, specs, args, rt)


def _launch_sized_stacks(ir) -> list:
    """(STACK_ALLOC, count function or None, default) for stacks sized at each launch."""
    from ..ir.nodes import walk
    from ..ir.ops import Op
    from ..passes.autodiff.reverse import LaunchCapacity
    from .launch import make_count
    out = []
    for t in ir.tasks:
        for s in walk(t.body):
            if s.op is Op.STACK_ALLOC and isinstance(s.attr, LaunchCapacity):
                cap = s.attr
                out.append((s, make_count(cap.begin, cap.end), cap.default))
                s.attr = cap.default
    return out


def _sized_variant(g, args, rt):
    """The adjoint compiled with stacks as deep as this launch's loops need (powers of two)."""
    vals = g.pack.unpack(g.pack(args, _NoSeed()))
    caps = []
    for stk, count, default in g.stacks:
        n = count(vals) if count is not None else None
        caps.append(default if n is None else max(16, 1 << max(0, n - 1).bit_length()))
    key = tuple(caps)
    ck = g.variants.get(key)
    if ck is None:
        for (stk, _, _), cap in zip(g.stacks, caps):
            stk.attr = cap
        ck = g.variants[key] = g.codegen()
    return dataclasses.replace(g, ck=ck)


class _NoSeed:
    def next_seed(self) -> int:
        return 0


def _static_footprint(ir) -> list:
    """Per global access of the kernel: (buffer source, kind, per-dimension affine form when it
    is uniform across threads and iterations, else None)."""
    from ..ir.nodes import walk
    from ..ir.ops import AtomicKind, Op
    from ..passes.autodiff import access
    out, seen = [], set()
    access._loop_dims = ir.loop_dims
    try:
        for t in ir.tasks:
            for blk in (t.bounds, t.body):
                for s in walk(blk):
                    if s.op not in (Op.GLOBAL_LOAD, Op.GLOBAL_STORE, Op.ATOMIC):
                        continue
                    buf = s.attr[1] if s.op is Op.ATOMIC else s.attr
                    kind = {Op.GLOBAL_LOAD: "load", Op.GLOBAL_STORE: "store"}.get(s.op) or (
                        "add" if s.attr[0] in (AtomicKind.ADD, AtomicKind.SUB) else "atomic")
                    if s.index is None:
                        dims = (None,)
                    else:
                        dims = tuple(a if all(k is None or k[0] == "arg" for k in a) else None
                                     for a in (access.affine(x) for x in s.index))
                    key = (id(buf), kind, tuple(None if d is None else tuple(sorted(d.items(), key=repr)) for d in dims))
                    if key not in seen:
                        seen.add(key)
                        out.append((buf.source, kind, dims))
    finally:
        access._loop_dims = {}
    return out


def kernel(fn: Callable) -> Kernel:
    return Kernel(fn)


def clear_kernel_caches() -> None:
    _compile_epoch[0] += 1
