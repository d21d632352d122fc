"""wgpu_ad: a differentiable GPU language embedded in Python, on WebGPU.

`import wgpu_ad as ti` runs Taichi programs of the supported subset unchanged.
"""
import sys as _sys

from . import ad
from .ad import Tape, clear_all_gradients, grad_for, grad_replaced, no_grad
from .compiler import CompileOptions
from .export import ExportError, export
from .errors import (AutodiffUsageError, CompileError, DataAccessRuleError, GpuError, GradientDTypeError,
                     KernelArgError, KernelAssertionError, KernelRuntimeError, KernelZeroDivisionError,
                     NotDifferentiableError, TorchGradWarning, ConstantChangedWarning, Float64Error, Float64Warning, UnsupportedError, WgpuAdError)

# Taichi's exception names, for programs and tests written for Taichi (`pytest.raises(ti.TaichiX)`)
TaichiCompilationError = CompileError
TaichiSyntaxError = UnsupportedError
TaichiTypeError = KernelArgError
TaichiRuntimeError = KernelRuntimeError
TaichiAssertionError = KernelAssertionError
from .frontend.builtins import (atomic_add, atomic_and, atomic_max, atomic_min, atomic_or, atomic_sub, atomic_xor,
                                block_local, cast, op_functions, random, rsqrt, select, stop_grad)
globals().update(op_functions())  # ti.sin, ti.exp, ti.asinh, ... (abs, max, min, pow, round: Taichi's, in kernels)
from .frontend.loops import grouped, ndrange
from .frontend.methods import loop_config, static
from .lang import mathlib as math
from .lang import types_ns as types
from .lang.field import Field, field
from .lang.kernel import Kernel, data_oriented, func, kernel, real_func, template
from .lang.linalg import polar_decompose, svd
from .lang.matrix import Matrix, Vector
from .lang.ndarray import Ndarray, ndarray
from .lang.snode import i, ij, ijk, ijkl, j, k, l, root
from .runtime import amdgpu, cpu, cuda, dx12, gpu, metal, opengl, vulkan
from .runtime.adapter import AdapterEntry, list_adapters, worker_device
from .session import compile_options, runtime_stats, set_compile_options, sync
from .session import runtime as get_runtime
from .types import f16, f32, float16, float32, i32, int32, u32, uint32


def init(arch=None, debug: bool = False, device=None, **kwargs):
    """Choose the adapter and create the device (Taichi's ti.init). Calling it again resets.

    Args:
        arch: `ti.vulkan`, `ti.metal`, `ti.dx12`, `ti.cpu` or `ti.gpu` (`ti.cuda` and `ti.amdgpu`
            mean the best adapter, like `ti.gpu`); None: the best adapter. The environment
            variable `WGPU_AD_ARCH` overrides it.
        device: one adapter among several: an index into `ti.list_adapters()` or a part of its
            name (`ti.worker_device()` picks one per worker of a multi-GPU job); the environment
            variable `WGPU_AD_DEVICE` overrides it.
        debug: check every field index and `assert` in kernels (errors are raised at the next
            read-back), and verify the IR between compiler passes.
        **kwargs: `random_seed=0`, `force_emulated_atomics=False`, `offline_cache=True`,
            `offline_cache_file_path=None`, `ad_stack_size=256` (0: let wgpu_ad choose),
            `print_ir=False`, `print_wgsl=False`, `deterministic=False` (True: float sums made
            with atomics, gradients among them, are bitwise the same run to run on one adapter,
            at a cost: docs/performance.md), `f64="f32"` (run `ti.f64` in float32, with one
            `Float64Warning`; without it `ti.f64` is refused), `max_storage_buffers_per_shader_stage=None`
            (a lower limit than the adapter's, enforced by the device: 10 behaves as a browser;
            kernels that bind more read some fields through packed bindings: docs/performance.md).
    """
    from . import session
    compile_opts = {"print_ir": bool(kwargs.pop("print_ir", False)),
                    "print_wgsl": bool(kwargs.pop("print_wgsl", False)),
                    "offline_cache": bool(kwargs.pop("offline_cache", True)),
                    "offline_cache_file_path": kwargs.pop("offline_cache_file_path", None)}
    if kwargs.pop("deterministic", False):
        compile_opts["deterministic"] = True
    ad_stack_size = kwargs.pop("ad_stack_size", None)
    if ad_stack_size is not None:  # 0: "size it for me" (Taichi's adaptive stack): the default
        if not (isinstance(ad_stack_size, int) and ad_stack_size >= 0):
            raise WgpuAdError(f"ti.init(ad_stack_size={ad_stack_size!r}): expected a positive integer, or 0 to "
                              f"let wgpu_ad choose")
        if ad_stack_size:
            compile_opts["ad_stack_size"] = ad_stack_size
    f64_as_f32 = _f64_option(kwargs)
    _warn_unknown_options(kwargs)
    # the Runtime's own arguments; Taichi-only options (device_memory_GB, kernel_profiler, ...) are ignored
    runtime_kwargs = {k: kwargs[k] for k in _RUNTIME_ARGS if k in kwargs}
    runtime_kwargs["device"] = device
    s = session.open_session(dict(arch=arch, debug=debug, **runtime_kwargs), compile_opts)
    if f64_as_f32:
        from .errors import Float64Warning
        from .types import F64_AS_F32
        from .user_code import warn
        s.f64_as_f32 = True
        warn(F64_AS_F32, Float64Warning)  # once per session: each ti.init opens one
    return s.runtime


def _f64_option(kwargs: dict) -> bool:
    """ti.init's f64= ("error", the default, or "f32"): whether ti.f64 runs as ti.f32; default_fp=ti.f64
    becomes ti.f32 with it and is refused, naming it, without it."""
    from .errors import Float64Error
    from .types import F64_REFUSED, Float64
    f64 = kwargs.pop("f64", "error")
    if f64 not in ("error", "f32"):
        raise WgpuAdError(f"ti.init(f64={f64!r}): expected \"f32\" (run the program's ti.f64 in float32) or "
                          f"\"error\" (the default: ti.f64 is refused)")
    fp = kwargs.get("default_fp")
    if isinstance(fp, Float64) or (isinstance(fp, str) and fp in ("f64", "float64")) or _np_float64(fp):
        if f64 != "f32":
            raise Float64Error(f"ti.init(default_fp=ti.f64): {F64_REFUSED}")
        kwargs["default_fp"] = f32
    return f64 == "f32"


def _np_float64(t) -> bool:
    import numpy as np
    return t is np.float64 or (isinstance(t, np.dtype) and t == np.float64)


# Taichi's ti.init options that mean nothing on WebGPU: accepted and ignored without a word (the
# commonly used ones of its CompileConfig and its init; any other unknown name gets a warning)
_TAICHI_ONLY = frozenset(
    "default_ip default_up enable_fallback require_version kernel_profiler device_memory_GB "
    "device_memory_fraction fast_math advanced_optimization cpu_max_num_threads verbose log_level "
    "check_out_of_bound opt_level cfg_optimization flatten_if make_thread_local make_block_local "
    "detect_read_only real_matrix_scalarize force_scalarize_matrix half2_vectorization dynamic_index "
    "demote_dense_struct_fors default_cpu_block_dim cpu_block_dim_adaptive default_gpu_block_dim "
    "saturating_grid_dim max_block_dim timeline verbose_kernel_launches use_unified_memory packed "
    "offline_cache_max_size_of_files offline_cache_cleaning_policy offline_cache_cleaning_factor "
    "num_compile_threads vk_api_version print_kernel_llvm_ir print_kernel_nvptx print_kernel_asm "
    "print_preprocessed print_preprocessed_ir print_accessor_ir print_struct_llvm_ir gdb_trigger "
    "excepthook short_circuit_operators experimental_real_function ndarray_use_torch debug_info "
    "cuda_stack_limit use_mesh experimental_auto_mesh_local quant_opt_store_fusion "
    "quant_opt_atomic_demotion make_cpu_multithreading_loop allow_nv_shader_extension".split())
_OWN_OPTIONS = ("print_ir", "print_wgsl", "offline_cache", "offline_cache_file_path", "deterministic",
                "ad_stack_size", "f64")


def _warn_unknown_options(kwargs: dict) -> None:
    """A ti.init keyword that is neither wgpu_ad's nor a Taichi option that means nothing here (a
    typo, another library's name) would do nothing silently: a warning names it."""
    import difflib
    from .user_code import warn
    ours = _OWN_OPTIONS + _RUNTIME_ARGS + ("arch", "debug", "device")
    for name in kwargs:
        if name in _RUNTIME_ARGS or name in _TAICHI_ONLY:
            continue
        near = difflib.get_close_matches(name, ours, n=1, cutoff=0.5)
        warn(f"ti.init({name}=...): wgpu_ad has no option {name!r}, so it does nothing"
             + (f"; did you mean {near[0]}=?" if near else "") + f" (wgpu_ad's options: {', '.join(ours)})",
             UserWarning)


_RUNTIME_ARGS = ("force_emulated_atomics", "default_fp", "random_seed", "print_buffer_lines",
                 "max_storage_buffers_per_shader_stage")


def reset():
    """Drop the device, all fields and compiled kernels (Taichi's ti.reset)."""
    from . import session
    session.close()


__version__ = "0.1.0"


def __getattr__(name: str):
    """ti.GUI and ti.ui import the viewer (and so glfw) on first use only (PEP 562)."""
    if name in ("GUI", "ui"):
        from . import viewer
        return getattr(viewer, name)
    if name in ("f64", "float64"):  # ti.f32 under ti.init(f64="f32"); else a dtype that is refused when used
        from .session import f64_dtype
        return f64_dtype()
    if name in ("i64", "int64", "u64", "uint64"):  # `ti.i64` in Taichi programs
        raise AttributeError(f"ti.{name}: WebGPU shaders have no 64-bit numbers, so wgpu_ad computes in 32 bits; "
                             f"use ti.{'f32' if name[0] == 'f' else name[0] + '32'}")
    hint = _did_you_mean(name)
    # obj= set: Python adds no suggestion of its own (its edit distance offers ti.ceil for ti.feild)
    raise AttributeError(f"module 'wgpu_ad' has no attribute {name!r}" + (f"; did you mean {hint}?" if hint else ""),
                         obj=_sys.modules[__name__])


def _did_you_mean(name: str) -> str | None:
    """'ti.field' for 'feild', 'ti.math.vec3' for 'vec3': the closest public name, one with the same
    letters first (a swap of two letters is the commonest typo)."""
    import difflib
    import types as _types
    own = [n for n, v in globals().items() if not n.startswith("_") and n != "annotations"
           and (not isinstance(v, _types.ModuleType) or n in ("ad", "math", "types"))] + ["GUI", "ui"]
    pool = {n: f"ti.{n}" for n in own}
    for n in dir(math):
        if not n.startswith("_") and n != "annotations":
            pool.setdefault(n, f"ti.math.{n}")
    if name in pool:
        return pool[name]
    close = difflib.get_close_matches(name, list(pool), n=5, cutoff=0.7)
    same = [c for c in close if sorted(c) == sorted(name)]
    if same or not close:
        return pool[same[0]] if same else None
    ratio = lambda c: difflib.SequenceMatcher(None, name, c).ratio()  # noqa: E731
    ties = [c for c in close if ratio(c) == ratio(close[0]) and (c == close[0] or c.lower() != close[0].lower())]
    return " or ".join(pool[c] for c in ties[:2])
