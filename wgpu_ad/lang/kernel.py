"""@ti.kernel and @ti.func: argument specialization; compiling is compiler/driver.py's, launching
lang/launch.py's."""
from __future__ import annotations

import dataclasses
import inspect
import types
from dataclasses import dataclass
from typing import Any, Callable

from .. import session as _session
from ..errors import CompileError, ConstantChangedWarning, Float64Error, KernelArgError, WgpuAdError
from ..user_code import warn
from ..types import MatrixType, VectorType, to_dtype
from .external import EXTERNALS, Externals, describe, is_external
from .launch import Launcher, binding_limit_error, check_binding_limit, launch
from .keep import LaunchKeep
from .kernel_text import KernelText
from .specialised import can_hold, specialisations, template_key, without_specialisations


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

    def __reduce__(self):
        return _reduce_by_name(self, "ti.func")

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


def _by_name(module: str, qualname: str):
    """The kernel or ti.func `module.qualname` (what a pickled one names), imported."""
    import importlib
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AttributeError(
                f"a pickled wgpu_ad kernel or ti.func names {module}.{qualname}, which this process cannot find: "
                f"'{module}' here has no '{part}'. Kernels travel by name: define them in a module the worker "
                f"imports (not in the script run as __main__, which a worker such as a Ray actor does not run)"
            ) from None
    return obj


def _reduce_by_name(obj, what: str):
    """Pickle a @ti.kernel / @ti.func by reference (its module and qualified name, as Python pickles
    functions), so a worker process imports it and compiles it for its own device."""
    mod, qual = obj.fn.__module__, obj.fn.__qualname__
    if "<locals>" in qual:
        raise TypeError(f"{what} '{obj.__name__}' cannot be pickled: it is defined inside a function "
                        f"({qual}), so another process cannot import it by name; define it at the top level of a "
                        f"module")
    return _by_name, (mod, qual)


class Kernel(KernelText):
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
        # specialisations by argument specs, session generation and options; those for a field,
        # ndarray or @ti.data_oriented object passed as a template live on it (specialised.py), so
        # that they and it go together; the adjoints and dual kernels live on their forward's Launcher
        self._cache: dict = {}
        self._keep = LaunchKeep(fn.__name__)  # scratch, and copies kept for adjoints (keep.py)
        self._ad = None  # autodiff's records of this kernel's launches (ad/launches.py Records)
        self._unlogged = False  # launched while nothing had a gradient: no record of that launch
        self._last = None  # (epoch, compiled, specs) when every argument is a plain scalar
        self._scalar_only = all(not isinstance(a, (Template, NdarrayType, VectorType, MatrixType))
                                and a not in (Template, NdarrayType) for a in self.anns)
        self._ndarrays = [k for k, a in enumerate(self.anns) if isinstance(a, NdarrayType) or a is NdarrayType]
        self._no_grad = False
        # other objects passed for template arguments (a data-oriented `self`), kept alive:
        # compiled kernels are found by the object's id, which must not be reused by a later object
        self._pinned: dict[int, Any] = {}

    def __reduce__(self):
        return _reduce_by_name(self, "kernel")

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
        specs, key, home = [], [], None
        for p, ann, v in zip(self.params, self.anns, args):
            if isinstance(ann, Template) or ann is Template:
                specs.append(ArgSpec(p.name, "template", value=v))
                objects: list = []
                key.append(("t", template_key(v, objects)))
                for o in objects:
                    if home is None and can_hold(o):  # (it keeps its own specialisations: _get)
                        home = o
                    elif not can_hold(o):
                        self._pinned.setdefault(id(o), o)
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
                except Float64Error as e:
                    raise Float64Error(f"kernel '{self.__name__}', argument '{p.name}': {e}") from None
                except TypeError:
                    raise CompileError(f"kernel '{self.__name__}': unsupported annotation {ann!r} for argument '{p.name}'") from None
                specs.append(ArgSpec(p.name, "scalar", dt))
                key.append(("s",))
        return specs, tuple(key), home

    def _ndarray_spec(self, name, ann, v):
        from ..frontend.kernel import ArgSpec
        if not hasattr(v, "gpu_buffer") or not hasattr(v, "element_shape") or getattr(v, "is_field", False):
            raise KernelArgError(f"kernel '{self.__name__}': argument '{name}' must be a ti.ndarray, a NumPy array or "
                                 f"a torch tensor, got {_type_name(v)}")
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
                if hit[2].compiled.captured:
                    self._constants_changed(hit[2].compiled.captured)
                return hit[2], hit[3], rt
        specs, key, home = self._specs(args)
        full = (key, s.generation, opts)
        # a storage or data-oriented object passed as a template holds the specialisations for it,
        # so that the cycle object -> Launcher -> object goes when the program drops it (issue 25); the
        # other template objects in the key are kept alive by the Launcher, so their ids stay theirs
        cache = self._cache if home is None else specialisations(home, self)
        lc = cache.get(full)
        if lc is None:
            from ..compiler.driver import compile_kernel
            for old in [k for k in cache if k[1] != s.generation]:  # (a closed session's: never used again)
                del cache[old]
            lc = Launcher(compile_kernel(self.fn, self.__name__, specs, self.ret_dtype, opts), specs)
            check_binding_limit(lc, self.__name__, "forward", rt)
            cache[full] = lc
        elif lc.compiled.captured:
            self._constants_changed(lc.compiled.captured)
        if self._scalar_only:
            self._last = (s.generation, opts, lc, specs)
        return lc, specs, rt

    def _constants_changed(self, captured) -> None:
        """Warn about Python numbers the kernel compiled in that the program changed since."""
        for what, then, now, loc, argument in captured.changed():
            where = f" ({loc.file.rsplit('/', 1)[-1]}, line {loc.line})" if loc is not None else ""
            warn(f"kernel '{self.__name__}' reads {what}{where}, which was {then} when it compiled and is {now} now: "
                 f"the kernel still computes with {then}. Python values a kernel reads are compile-time constants "
                 f"(as in Taichi); to use each launch's value, pass it as an argument ({argument}) "
                 f"or keep it in a field", ConstantChangedWarning)

    def __call__(self, *args, **kwargs):
        if kwargs:
            args = self._bind_kwargs(args, kwargs)
        s = _session._state["session"] or _session.current()
        try:
            ad = s._ad.ctx  # (the property s.ad, without its call, once the thread has one)
        except AttributeError:
            ad = s.ad
        if s.companions or ad.tape is not None or ad.fwd is not None or ad.host_guard is not None:
            # something may ask for a derivative of this launch: autodiff observes it
            if self._ndarrays and self._has_external(args):
                return _session.autodiff().launch_external(self, args, s, ad)
            return _session.autodiff().launch_observed(self, args, s, ad)
        # nothing in the program has a gradient or a dual and no tape is open: a launch is only a
        # launch, and keeps no records (a kernel.grad() of it is refused, saying why)
        s.unlogged_launches += 1
        self._unlogged, self._ad = True, None  # (records of earlier launches: older than this one)
        if self._ndarrays and self._has_external(args):
            return self._call_external(args, s)
        lc, specs, rt = self._get(args, s)
        return launch(lc, args + self._keep.scratch(lc, False) if lc.plan.scratch else args, rt)

    def _call_external(self, args, s):
        """A launch with host arrays (lang/external.py): copied in, launched, written back."""
        dev, bound = EXTERNALS.to_device(self, args, self._ndarrays, with_grads=False)
        lc, _specs, rt = self._get(dev, s)
        ret = launch(lc, dev + self._keep.scratch(lc, False), rt)
        Externals.to_host(bound, lc.ck, grads=False)
        return ret

    # ---- reverse mode ---------------------------------------------------------------------
    @property
    def grad(self) -> "_GradLauncher":
        """kernel.grad(*args): run the adjoint of this kernel for these arguments (ad/launches.py)."""
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
        # (on the forward's Launcher, which stands for the argument specs, the options and the epoch)
        key = (grads, fused, check)
        zero = ()
        while True:
            g = lc.grads.get((*key, zero), False)
            if g is False:
                o = opts if check == opts.check_nan else dataclasses.replace(opts, check_nan=check)
                c = compile_adjoint(lc.compiled, grads, o, zero, fused)
                g = None if c is None else Launcher(c, specs)
                if g is not None and fused and (g.packing is not None or
                                                binding_limit_error(c.ck, self.__name__, "adjoint", rt)):
                    g = None  # too many buffers fused: the forward and the adjoint run apart, each with fewer
                    # (cheaper than the copies of packed bindings, which each part may still use)
                elif g is not None:
                    check_binding_limit(g, self.__name__, "adjoint", rt)
                lc.grads[(*key, zero)] = g
            if g is None or zero or not launching or g.zero_check is None:
                return g, specs, rt
            zero = g.zero_check(args)
            if not zero:
                return g, specs, rt

    def _get_zeroing(self, args, duals: bool = False):
        """The backward pass of a @ti.ad.no_grad kernel for these arguments (compile_zeroing), or
        with duals=True what follows it in forward mode (the duals of what it overwrote to 0):
        (its Launcher, or None, or why it cannot be made; runtime)."""
        from ..compiler.driver import compile_zeroing, dual_sources, grad_sources
        lc, specs, rt = self._get(args)
        key = ("zeroing", (dual_sources if duals else grad_sources)(lc.compiled, specs))
        if key not in lc.grads:
            c = compile_zeroing(lc.compiled, key[1], _session.current().options)
            lc.grads[key] = c if c is None or isinstance(c, str) else Launcher(c, specs)
        return lc.grads[key], rt

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
        d = lc.duals.get(duals)  # (on the forward's Launcher: see _get_grad)
        if d is None:
            d = Launcher(compile_dual(lc.compiled, duals, _session.current().options), specs)
            check_binding_limit(d, self.__name__, "dual", rt)
            lc.duals[duals] = d
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


class _GradLauncher:
    def __init__(self, k: Kernel):
        self.k = k

    def __call__(self, *args, **kwargs):
        if kwargs:
            args = self.k._bind_kwargs(args, kwargs)
        return _session.autodiff().grad(self.k, args)


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

    def get_wgsl(self, *args, grad: bool = False, task: int | None = None) -> str:
        return self.kernel.get_wgsl(self.obj, *args, grad=grad, task=task)

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
    if "__getstate__" not in cls.__dict__:  # (pickles and copies leave out what kernels keep on it)
        cls.__getstate__ = lambda self: without_specialisations(object.__getstate__(self))
    return cls


def kernel(fn: Callable) -> Kernel:
    """`@ti.kernel`: compile `fn` to WGSL compute shaders on its first call. The outermost `for`
    loop runs in parallel; arguments are annotated (`ti.f32`, `ti.i32`, `ti.template()`,
    `ti.types.ndarray()`, `ti.types.vector(n, dtype)`), and so is a scalar return value. The
    result is a `Kernel`, whose `.grad` is the generated adjoint."""
    return Kernel(fn)


def _type_name(v) -> str:
    """numpy.ndarray, not ndarray (which reads as ti.ndarray); int, not builtins.int."""
    t = type(v)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
