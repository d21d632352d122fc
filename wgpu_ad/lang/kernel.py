"""@ti.kernel and @ti.func: argument specialization; compiling is compiler/driver.py's, launching
lang/launch.py's."""
from __future__ import annotations

import collections
import dataclasses
import inspect
import types
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .. import plan
from .. import session as _session
from ..errors import CompileError, KernelArgError, WgpuAdError
from ..types import MatrixType, VectorType, to_dtype
from .external import EXTERNALS, Externals, describe, is_external
from .launch import Launcher, binding_limit_error, check_binding_limit, launch, overlap, storage_getter
from . import storage as _storage
from .keep import LaunchKeep
from .ndarray import Ndarray

_PLAIN = (int, float, bool)  # argument types that name themselves in keys
READ_LOG = 4096  # argument sets per kernel whose reads kernel.grad() can check (as WRITE_LOG in storage.py)


def _versions_key(reads: list, args: tuple) -> tuple:
    """Names the launch kernel.grad(*args) differentiates: the storages it read and its arguments
    (k(t) and k(t + 1) read different elements, and k.grad(t) must compare with k(t)'s reads)."""
    ids = tuple(map(id, reads))
    if all(type(a) in _PLAIN for a in args):
        return ids, args

    def value(a):
        if isinstance(a, (int, float, str, np.generic)) or a is None:
            return a
        if isinstance(a, (list, tuple, np.ndarray)):  # a vector argument
            return tuple(np.asarray(a).ravel().tolist())
        return id(a)  # a field, ndarray or template object
    return ids, tuple(value(a) for a in args)


class _Wrote:
    """A launch in the write logs of the storages it wrote (Storage.writes): the footprint indices
    it wrote in one of them, computed only when kernel.grad() asks (a launch pays for an append).
    Storages are held weakly (the log lives on them); None once one is gone."""

    __slots__ = ("lc", "held")

    def __init__(self, lc: Launcher, args: tuple):
        self.lc = lc
        self.held = args if all(type(a) in _PLAIN for a in args) else tuple(
            weakref.ref(a) if isinstance(a, _storage.Storage) else a for a in args)

    def indices(self, st) -> list | None:
        live = tuple(a() if isinstance(a, weakref.ref) else a for a in self.held)
        if any(v is None for v in live):
            return None
        return [idx for obj, kind, idx in self.lc.footprint(live) if obj is st and kind not in ("load", "load_before")]


class Template:
    """ti.template(): the argument is bound at compile time (fields, Python values)."""

    def __repr__(self):
        return "ti.template()"


def template() -> Template:
    """`ti.template()`: a kernel argument compiled in (a field, or a Python value); the kernel is
    compiled again for each new value."""
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

    def __get__(self, obj, objtype=None):
        """A @ti.func method of a @ti.data_oriented class: obj.f(...) in a kernel passes obj as self."""
        return self if obj is None else types.MethodType(self, obj)


def func(fn: Callable) -> Func:
    """`@ti.func`: a function callable from kernels and other funcs, inlined where it is called
    (arguments by value, `return` anywhere); differentiated as part of the calling kernel."""
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
        # defined in a class body (a @ti.data_oriented class): obj.kernel(...) passes obj as the
        # first argument, a template unless annotated otherwise
        self._method = _in_class_body(fn) and bool(self.params)
        if self._method and self.anns[0] is inspect.Parameter.empty:
            self.anns[0] = Template()
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
        self._dual_cache: dict = {}
        # _versions_key of a launch -> [(weakref, version)] of what it read, for the latest READ_LOG
        # argument sets; _forgot: older ones were dropped (a kernel.grad() for one of those is refused)
        self._read_versions: collections.OrderedDict = collections.OrderedDict()
        self._forgot = False
        self._unlogged = False  # launched while nothing had a gradient: no record of that launch
        self._keep = LaunchKeep(fn.__name__)  # copies and scratch kept for adjoints (keep.py)
        # checked forward variants (passes/autodiff/shadow.py) per forward Launcher id, spare shadow
        # buffers by size, and per launch key (_run_key) whether its latest launch was checked
        self._checked_lc: dict = {}
        self._checked_runs: dict = {}
        self._last = None  # (epoch, compiled, specs) when every argument is a plain scalar
        self._scalar_only = all(not isinstance(a, (Template, NdarrayType, VectorType, MatrixType))
                                and a not in (Template, NdarrayType) for a in self.anns)
        self._ndarrays = [k for k, a in enumerate(self.anns) if isinstance(a, NdarrayType) or a is NdarrayType]
        self._no_grad = False
        # objects passed for template arguments (a data-oriented `self`), kept alive: compiled
        # kernels are found by the object's id, which must not be reused by a later object
        self._pinned: dict[int, Any] = {}

    def __get__(self, obj, objtype=None):
        """obj.kernel(...) on a @ti.data_oriented object: the kernel with obj as self."""
        return self if obj is None or not self._method else BoundKernel(self, obj)

    def _has_external(self, args) -> bool:
        """Whether a NumPy array or a torch tensor is passed for an ndarray argument."""
        return any(k < len(args) and is_external(args[k]) for k in self._ndarrays)

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
                if isinstance(v, (int, float, bool, str)):
                    key.append(("t", (type(v), v)))
                else:
                    key.append(("t", id(v)))
                    self._pinned.setdefault(id(v), v)
            elif isinstance(ann, NdarrayType) or ann is NdarrayType:
                specs.append(self._ndarray_spec(p.name, ann, v))
                s = specs[-1]
                key.append(("n", s.dtype.name, s.shape, s.ndim, s.needs_grad, s.needs_dual))
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
            raise KernelArgError(f"kernel '{self.__name__}': argument '{name}' must be a ti.ndarray, a NumPy array or "
                                 f"a torch tensor, got {type(v).__name__}")
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
        # ti.types.ndarray(needs_grad=False): the argument gets no gradient in this kernel's adjoint
        # even when the array has one (Taichi's meaning); None or True: as the array says
        return ArgSpec(name, "ndarray", v.dtype, tuple(v.element_shape), len(v.shape),
                       needs_grad=bool(getattr(v, "needs_grad", False)) and ann.needs_grad is not False,
                       needs_dual=bool(getattr(v, "needs_dual", False)))

    # ---- compilation ------------------------------------------------------------------
    def _get(self, args, s=None):
        """(Launcher, specs, runtime) of the kernel specialised for these arguments and the
        current compile options (of session s: the open one when not given)."""
        if s is None:
            s = _session.current()
        rt, opts = s._runtime or s.runtime, s._options or s.options  # (properties only when unset)
        if self._scalar_only:  # the hot path: nothing to specialise on
            hit = self._last
            if hit is not None and hit[0] == s.generation and hit[1] is opts and len(args) == len(self.params):
                return hit[2], hit[3], rt
        specs, key = self._specs(args)
        full = (key, s.generation, opts)
        lc = self._cache.get(full)
        if lc is None:
            from ..compiler.driver import compile_kernel
            lc = Launcher(compile_kernel(self.fn, self.__name__, specs, self.ret_dtype, opts), specs)
            check_binding_limit(lc, self.__name__, "forward", rt)
            self._cache[full] = lc
        if self._scalar_only:
            self._last = (s.generation, opts, lc, specs)
        return lc, specs, rt

    def __call__(self, *args, **kwargs):
        if kwargs:
            args = self._bind_kwargs(args, kwargs)
        if self._ndarrays and self._has_external(args):
            return self._call_external(args)
        s = _session._state["session"] or _session.current()
        try:
            ad = s._ad.ctx  # (the property s.ad, without its call, once the thread has one)
        except AttributeError:
            ad = s.ad
        if not s.companions and ad.tape is None and ad.fwd is None and ad.host_guard is None:
            # nothing in the program has a gradient or a dual and no tape is open: nothing can ask
            # for a derivative of this launch, so it keeps no records (kernel.grad() of it refuses)
            lc, specs, rt = self._get(args, s)
            s.unlogged_launches += 1
            self._unlogged = True
            if lc.plan.shadowed:  # (remembers that its latest launch was not checked)
                return self._launch(lc, lc, args, self._keep.scratch(lc, False), rt, self._run_key(lc, args))
            return launch(lc, args + self._keep.scratch(lc, False) if lc.plan.scratch else args, rt)
        if ad.fwd is not None and not self._no_grad and not ad.no_grad_depth:
            return self._launch_dual(args)
        lc, specs, rt = self._get(args, s)
        tape = ad.tape
        run = self._checked(lc) if lc.plan.shadowed and self._may_want_grad(lc, args, tape, ad) else lc
        if tape is not None:
            tape.record(self, args)
            if tape.defer(self, run, args, rt):
                self._note_versions(lc, args, s)
                return None  # launched before anything else reaches the device, or fused with its adjoint
        taped = tape is not None and tape.recording and not ad.in_backward and tape.keep_copies
        if lc.snapshots and ad.keep_copies and not self._no_grad:  # no_grad: no adjoint reads them
            self._keep.keep_snapshots(lc, args, taped)
        if lc.ck.ret_dtype is not None and ad.host_guard is not None:
            ad.host_guard(self, f"the return value of kernel '{self.__name__}'")
        if lc.plan.shadowed:
            ret = self._launch(lc, run, args, self._keep.scratch(lc, taped), rt, self._run_key(lc, args))
        else:
            ret = launch(lc, args + self._keep.scratch(lc, taped), rt)
        self._note_versions(lc, args, s)
        return ret

    def _launch_dual(self, args):
        """Inside ti.ad.FwdMode: the dual kernel (primal values and tangents) instead."""
        lc = self._get(args)[0]
        d, _specs, rt = self._get_dual(args)
        self._before_dual(lc, args)
        guard = _session.current().ad.host_guard
        if lc.ck.ret_dtype is not None and guard is not None:
            guard(self, f"the return value of kernel '{self.__name__}'")
        ret = launch(d, args + self._keep.scratch(lc, False), rt)
        self._note_versions(lc, args)
        return ret

    def _before_dual(self, lc, args, external: bool = False) -> None:
        """A launch of the dual kernel of forward Launcher lc inside ti.ad.FwdMode: the FwdMode
        checks where tangents stop (fwd.py note_launch); and as the dual kernel checks nothing,
        kernel.grad() must not trust the check of an older launch with these arguments."""
        _session.current().ad.fwd.note_launch(self.__name__, [get(args) for get in lc.loads],
                                                     [get(args) for get in lc.writes])
        if lc.plan.shadowed:
            self._set_checked(self._run_key(lc, args, external), False, in_fwd_mode=True)

    # ---- run-time access checks (passes/autodiff/shadow.py) -------------------------------------
    def _may_want_grad(self, lc, args, tape, ad) -> bool:
        """Whether a gradient may be asked for a forward launch: a tape records it, or something it
        reads has a gradient (as for _keep_snapshots)."""
        if tape is not None and tape.recording and not ad.in_backward:
            return True
        return any(get(args).needs_grad for get in lc.loads + lc.snapshots)

    def _checked(self, lc) -> Launcher:
        """The checked variant of a forward Launcher whose accesses are not all proven safe for
        reverse mode, compiled on first use."""
        run = self._checked_lc.get(id(lc))
        if run is None:
            from ..compiler.driver import compile_checked
            run = Launcher(compile_checked(lc.compiled, _session.current().options), lc.specs)
            check_binding_limit(run, self.__name__, "checked", _session.runtime())
            self._checked_lc[id(lc)] = run
            run.shadow_of = [storage_getter(src.of, run.compiled.storages) for src in run.plan.shadows]
        return run

    def _run_key(self, lc, args, external: bool = False) -> tuple:
        """What names a launch for kernel.grad(): the forward Launcher and the storages it reads and
        writes (host arrays get fresh device copies per launch: only the Launcher for them), as
        ids with weak references beside them: a storage made later at a freed one's address is
        another key (_was_checked compares the referents)."""
        if external:
            return (id(lc),), ()
        sts = [get(args) for get in lc.loads + lc.writes]
        return (id(lc), *map(id, sts)), tuple(weakref.ref(st) for st in sts)

    def _set_checked(self, key: tuple, checked: bool, in_fwd_mode: bool = False) -> None:
        self._checked_runs[key[0]] = (checked, key[1], in_fwd_mode)

    def _was_checked(self, key: tuple) -> bool:
        seen = self._checked_runs.get(key[0])
        return bool(seen and seen[0] and all(a() is not None and a() is b() for a, b in zip(seen[1], key[1])))

    def _ran_in_fwd_mode(self, key: tuple) -> bool:
        seen = self._checked_runs.get(key[0])
        return bool(seen and seen[2])

    def _launch(self, lc, run, args, scratch: tuple, rt, key: tuple):
        """Launch `run` (lc, whose plan has shadowed sources, or its checked variant) with fresh
        zeroed shadow buffers when checked; remember whether a launch with this key was checked
        (_require_checked)."""
        if run is lc:
            self._set_checked(key, False)
            return launch(lc, args + scratch, rt)
        self._keep.drop_dead()
        shadows = []
        for get in run.shadow_of:
            n = get(args).n_scalars
            spare = self._keep.shadow_spare.get(n)
            arr = spare.pop() if spare else Ndarray(to_dtype("u32"), (n,), name=f"{get(args).name or 'field'}_accesses")
            arr.fill(0)
            shadows.append(arr)
        self._set_checked(key, False)
        try:
            ret = launch(run, args + scratch + tuple(shadows), rt)
        finally:  # a later clear is recorded after the launch: the buffers may serve the next one
            for arr in shadows:
                self._keep.shadow_spare.setdefault(arr.n_scalars, []).append(arr)
        self._set_checked(key, True)
        return ret

    def _require_checked(self, lc, args, external: bool = False) -> None:
        """kernel.grad(): refuse unless the latest forward launch with these storages was checked."""
        key = self._run_key(lc, args, external)
        if lc.plan.shadowed and not self._was_checked(key):
            why = ("it ran inside ti.ad.FwdMode, whose dual kernel checks nothing" if self._ran_in_fwd_mode(key)
                   else "nothing it reads needed a gradient")
            raise WgpuAdError(
                f"{self.__name__}.grad(): kernel '{self.__name__}' indexes a field by values the compiler "
                f"cannot prove safe for reverse mode (read from a field, or a counter stepped conditionally), "
                f"so its gradient is right only after a forward launch that checked them on the GPU, and its "
                f"latest launch with these arguments was not checked ({why}). "
                f"Launch it inside ti.ad.Tape, or while something it reads has needs_grad=True, right before "
                f"its .grad()")

    def _note_versions(self, lc, args, s=None) -> None:
        """A forward launch: bump the versions of what it wrote, remember those of what it read
        (with the session's count of unlogged launches then: see _check_versions)."""
        if lc.writes:
            who, wrote = f"kernel '{self.__name__}'", _Wrote(lc, args)
            for get in lc.writes:
                st = get(args)
                st.version += 1
                st.writer = who
                st.writes.append((st.version, who, wrote))
        if lc.replays:
            reads = [get(args) for get in lc.replays]
            key = _versions_key(reads, args)
            versions = self._read_versions
            if key in versions:
                versions.move_to_end(key)
            unlogged = (s or _session.current()).unlogged_launches
            versions[key] = (unlogged, [(weakref.ref(st), st.version) for st in reads])
            if len(versions) > READ_LOG:
                versions.popitem(last=False)
                self._forgot = True

    def _check_versions(self, lc, args) -> None:
        """kernel.grad() by hand: refuse when elements that the forward launch with these arguments
        read (or combined into with an atomic min / max) were written since: its adjoint would replay
        the new values. Writes since are compared by footprint (Storage.writes); one the log no
        longer holds, or a Python-scope write, counts as touching every element."""
        reads = [get(args) for get in lc.replays]
        footprint = None
        record = self._read_versions.get(_versions_key(reads, args))
        unlogged = _session.current().unlogged_launches
        if reads and (record is None and self._unlogged or record is not None and record[0] != unlogged):
            raise WgpuAdError(
                f"{self.__name__}.grad(): kernel '{self.__name__}' (or another kernel) ran while nothing in the "
                f"program had a gradient or a dual, and such launches keep no record of what they read or "
                f"wrote, so whether what this launch read is unchanged is not known and its gradient cannot be "
                f"trusted. Give the fields their gradients first (needs_grad=True, or ti.root.lazy_grad() "
                f"before the launches), launch {self.__name__} again right before its .grad(), or record the "
                f"launches in ti.ad.Tape")
        if record is None and self._forgot and reads:
            raise WgpuAdError(
                f"{self.__name__}.grad(): kernel '{self.__name__}' ran with more than {READ_LOG} other argument "
                f"sets since its launch with these arguments (if there was one), and what that launch read is "
                f"no longer known, so its gradient cannot be trusted. Launch {self.__name__} with these "
                f"arguments again right before its .grad(), or record the launches in ti.ad.Tape")
        for ref, version in (record[1] if record is not None else ()):
            st = ref()
            if st is None or st.version == version:
                continue
            since = [w for w in st.writes if w[0] > version]
            if len(since) != st.version - version:  # older than the log: assume the worst
                since = [(None, st.writer, None)]
            if footprint is None:
                footprint = lc.footprint(args)
            read = [idx for obj, kind, idx in footprint if obj is st and kind in ("load", "atomic")]
            for _version, who, wrote in since:
                idx = wrote.indices(st) if wrote is not None else None
                if idx is not None and not any(overlap(r, w) for r in read for w in idx):
                    continue  # other elements (x[t + 1] written, x[t] read): the replay sees the same values
                name = st.name or "the field"
                raise WgpuAdError(
                    f"{self.__name__}.grad(): kernel '{self.__name__}' read {st._label()} when it ran, and "
                    f"{who} wrote it since, so the gradient would be computed from the new values and be "
                    f"silently wrong. Call {self.__name__}.grad() before {name} is overwritten (gradients go in "
                    f"the reverse order of the launches), launch {self.__name__} again right before its .grad() "
                    f"once {name} holds what it read (recomputed), keep one copy per step "
                    f"({name}[t + 1] = f({name}[t])), or record the launches in ti.ad.Tape, which orders them "
                    f"for you")

    def _call_external(self, args):
        """A launch with host arrays (lang/external.py): copied in, launched, written back."""
        ad = _session.current().ad
        tape = ad.tape
        if ad.host_guard is not None:
            ad.host_guard(self, f"the NumPy arrays or torch tensors passed to kernel '{self.__name__}' "
                                f"(copied back after the launch)")
        if tape is not None:
            tape.record(self, args)  # the host arrays: the backward pass copies them in again
        dev, bound = EXTERNALS.to_device(self, args, self._ndarrays, with_grads=False)
        taped = tape is not None and tape.recording and not ad.in_backward and tape.keep_copies
        fwd, _specs, rt = self._get(dev)
        lc = fwd
        if ad.fwd is not None and not self._no_grad and not ad.no_grad_depth:
            lc = self._get_dual(dev)[0]  # host arrays have no duals; fields may
            self._before_dual(fwd, dev, external=True)
        if lc.snapshots and ad.keep_copies and not self._no_grad:  # no_grad: no adjoint reads them
            self._keep.keep_snapshots(lc, dev, taped)
        if lc.plan.shadowed and lc is fwd:
            run = self._checked(lc) if self._may_want_grad(lc, dev, tape, ad) else lc
            ret = self._launch(lc, run, dev, self._keep.scratch(lc, taped), rt, self._run_key(lc, dev, external=True))
        else:
            ret = launch(lc, dev + self._keep.scratch(fwd, taped), rt)
        Externals.to_host(bound, lc.ck, grads=False)
        return ret

    # ---- reverse mode ---------------------------------------------------------------------
    @property
    def grad(self) -> "_GradLauncher":
        """kernel.grad(*args): run the adjoint of this kernel for these arguments."""
        return _GradLauncher(self)

    def _get_grad(self, args, launching: bool = False, fused: bool = False):
        """The adjoint's Launcher for these arguments. When `launching`, the variant that stores
        into the zero-store candidates whose gradients are all zeros now, if any (see
        passes/autodiff/demote.py): each variant is compiled once. fused: the forward and the
        adjoint in one kernel (passes/autodiff/fuse.py), or None as the first item when this
        kernel cannot be fused."""
        from ..compiler.driver import compile_adjoint, grad_sources
        lc, specs, rt = self._get(args)
        s = _session.current()
        opts = s.options
        grads = grad_sources(lc.compiled, specs)
        # a ti.ad.Tape(check_nan=True) running its backward pass: the adjoint checks its gradients
        check = opts.check_nan or s.ad.check_nan
        # the forward's Launcher stands for the argument specs, the options and the epoch
        # (self._cache keeps it alive, so its id is never reused)
        key = (id(lc), grads, fused, check)
        zero = ()
        while True:
            g = self._grad_cache.get((*key, zero), False)
            if g is False:
                o = opts if check == opts.check_nan else dataclasses.replace(opts, check_nan=check)
                c = compile_adjoint(lc.compiled, grads, o, zero, fused)
                g = None if c is None else Launcher(c, specs)
                if g is not None and fused and binding_limit_error(c.ck, self.__name__, "adjoint", rt):
                    g = None  # too many buffers fused: the forward and the adjoint run apart, each with fewer
                elif g is not None:
                    check_binding_limit(g, self.__name__, "adjoint", rt)
                self._grad_cache[(*key, zero)] = g
            if g is None or zero or not launching or g.zero_check is None:
                return g, specs, rt
            zero = g.zero_check(args)
            if not zero:
                return g, specs, rt

    # ---- forward mode ---------------------------------------------------------------------
    def _get_dual(self, args):
        """The Launcher of the dual kernel for these arguments (forward mode: the primal values and
        their tangents, compiler/driver.py compile_dual); the forward's own when nothing it
        touches has a dual."""
        from ..compiler.driver import compile_dual, dual_sources
        lc, specs, rt = self._get(args)
        duals = dual_sources(lc.compiled, specs)
        if not any(d is not None for d in duals):
            return lc, specs, rt
        key = (id(lc), duals)  # the forward's Launcher stands for specs, options, epoch (see _get_grad)
        d = self._dual_cache.get(key)
        if d is None:
            d = Launcher(compile_dual(lc.compiled, duals, _session.current().options), specs)
            check_binding_limit(d, self.__name__, "dual", rt)
            self._dual_cache[key] = d
        return d, specs, rt

    def launch_fused(self, args) -> bool:
        """Launch the forward and the adjoint as one fused kernel (passes/autodiff/fuse.py), for the
        last launch of a tape; False (nothing launched) when they cannot be fused for these args."""
        g, _specs, rt = self._get_grad(args, launching=True, fused=True)
        if g is None or not g.fuse_check(args):
            return False
        launch(g, args, rt)
        return True

    def _device_args(self, args) -> tuple:
        """args with host arrays replaced by their device copies (values not uploaded)."""
        if not (self._ndarrays and self._has_external(args)):
            return args
        out = list(args)
        for k in self._ndarrays:
            v = args[k]
            if is_external(v):
                name = self.params[k].name
                out[k] = EXTERNALS.device_copy(v, *describe(self.__name__, name, v, self.anns[k]), name)
        return tuple(out)

    def footprint(self, *args) -> list[tuple]:
        """What this launch touches: (storage, kind, index) with kind 'load', 'store', 'add' (atomic
        add/sub) or 'atomic', and index a tuple with an int where the index is the same for every
        thread and iteration (computed from constants and these arguments) and None elsewhere."""
        args = self._device_args(args)
        return self._get(args)[0].footprint(args)

    def accessed(self, *args) -> tuple[list, list]:
        """(storages read, storages written) by this kernel for these arguments (primal ones)."""
        args = self._device_args(args)
        return self._get(args)[0].accessed(args)

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

    def get_wgsl(self, *args, grad: bool = False, checked: bool = False, dual: bool = False) -> str:
        """The generated WGSL of every task of the kernel (or of its adjoint, with checked=True of its
        checked forward variant when it has one, with dual=True of its dual kernel) for these
        arguments."""
        lc = (self._get_grad(args) if grad else self._get_dual(args) if dual else self._get(args))[0]
        if checked and lc.plan.shadowed:
            lc = self._checked(lc)
        return "\n".join(t.wgsl for t in lc.ck.tasks)

    def get_grad_ir(self, *args) -> str:
        """The optimised IR of the kernel's adjoint for these arguments."""
        from ..ir.printer import format_kernel
        return format_kernel(self._get_grad(args)[0].ir)

    def get_dual_ir(self, *args) -> str:
        """The optimised IR of the kernel's dual kernel (forward mode) for these arguments."""
        from ..ir.printer import format_kernel
        return format_kernel(self._get_dual(args)[0].ir)

    def print_ir(self, *args) -> None:
        """Print get_ir(*args)."""
        print(self.get_ir(*args))

    def print_wgsl(self, *args) -> None:
        """Print get_wgsl(*args)."""
        print(self.get_wgsl(*args))


class _GradLauncher:
    def __init__(self, k: Kernel):
        self.k = k

    def __call__(self, *args, **kwargs):
        k = self.k
        if k._no_grad:
            return None  # @ti.ad.no_grad: the kernel has no gradient (Taichi's behaviour)
        if kwargs:
            args = k._bind_kwargs(args, kwargs)
        ad = _session.current().ad
        fwd = ad.fwd
        if fwd is not None:
            raise WgpuAdError(
                f"{k.__name__}.grad() inside ti.ad.FwdMode (entered at {fwd._where}): reverse mode on top of "
                f"forward mode is not supported; call {k.__name__}.grad() outside the FwdMode `with` block")
        if k._ndarrays and k._has_external(args):
            dev, bound = EXTERNALS.to_device(k, args, k._ndarrays, with_grads=True)
            fwd = k._get(dev)[0]
            k._require_checked(fwd, dev, external=True)
            g, _specs, rt = k._get_grad(dev, launching=True)
            snaps = k._keep.pop_snapshots(fwd, dev)
            scratch = k._keep.scratch_for_grad(fwd, ad.in_backward)
            ret = launch(g, dev + snaps + scratch, rt)
            k._keep.recycle(snaps)
            k._keep.recycle_scratch(fwd, scratch)
            read = {a.source.arg for a in k._get(dev)[0].plan.accesses
                    if a.kind == "load" and isinstance(a.source, plan.Arg)}
            Externals.to_host(bound, g.ck, grads=True, inputs=read)
            return ret
        fwd, _specs, rt = k._get(args)
        k._require_checked(fwd, args)
        if not ad.in_backward:  # a tape checks its launches itself
            k._check_versions(fwd, args)
        g, _specs, rt = k._get_grad(args, launching=True)
        snaps = k._keep.pop_snapshots(fwd, args)
        scratch = k._keep.scratch_for_grad(fwd, ad.in_backward)
        ret = launch(g, args + snaps + scratch, rt)
        k._keep.recycle(snaps)
        k._keep.recycle_scratch(fwd, scratch)
        return ret


class BoundKernel:
    """A kernel of a @ti.data_oriented object: calls, .grad and inspection pass the object as
    self. The tape records the kernel itself with the object as its first argument."""

    _wgpu_ad_kernel = True

    def __init__(self, k: Kernel, obj):
        self.kernel, self.obj = k, obj
        self.__name__ = k.__name__
        self.__doc__ = k.__doc__

    def __call__(self, *args, **kwargs):
        return self.kernel(self.obj, *args, **kwargs)

    def grad(self, *args, **kwargs):
        return self.kernel.grad(self.obj, *args, **kwargs)

    def footprint(self, *args):
        return self.kernel.footprint(self.obj, *args)

    def accessed(self, *args):
        return self.kernel.accessed(self.obj, *args)

    def get_ir(self, *args) -> str:
        return self.kernel.get_ir(self.obj, *args)

    def get_wgsl(self, *args, grad: bool = False) -> str:
        return self.kernel.get_wgsl(self.obj, *args, grad=grad)

    def get_grad_ir(self, *args) -> str:
        return self.kernel.get_grad_ir(self.obj, *args)

    def print_ir(self, *args) -> None:
        self.kernel.print_ir(self.obj, *args)

    def print_wgsl(self, *args) -> None:
        self.kernel.print_wgsl(self.obj, *args)

    def __repr__(self) -> str:
        return f"<bound wgpu_ad kernel {self.__name__} of {self.obj!r}>"


def _in_class_body(fn: Callable) -> bool:
    parts = fn.__qualname__.split(".")
    return len(parts) >= 2 and parts[-2] != "<locals>"


def data_oriented(cls):
    """@ti.data_oriented (Taichi's): a class whose methods may be @ti.kernel (self is passed as a
    compile-time template, so kernels read the fields the object holds: self.x) and @ti.func."""
    if not isinstance(cls, type):
        raise WgpuAdError(f"@ti.data_oriented decorates a class, got {type(cls).__name__}")
    cls._data_oriented = True
    return cls


def kernel(fn: Callable) -> Kernel:
    """`@ti.kernel`: compile `fn` to WGSL compute shaders on its first call. The outermost `for`
    loop runs in parallel; arguments are annotated (`ti.f32`, `ti.i32`, `ti.template()`,
    `ti.types.ndarray()`, `ti.types.vector(n, dtype)`), and so is a scalar return value. The
    result is a `Kernel`, whose `.grad` is the generated adjoint."""
    return Kernel(fn)

