"""wgpu_ad: a differentiable GPU language embedded in Python, on WebGPU.

`import wgpu_ad as ti` runs Taichi programs of the supported subset unchanged.
"""
from . import ad
from .ad import Tape, clear_all_gradients, grad_for, grad_replaced, no_grad
from .compiler import CompileOptions, current_options as compile_options, set_options as set_compile_options
from .errors import (AutodiffUsageError, CompileError, GpuError, KernelArgError, KernelAssertionError,
                     KernelRuntimeError, NotDifferentiableError, UnsupportedError, WgpuAdError)

# Taichi's exception names, for programs and tests written for Taichi (`pytest.raises(ti.TaichiX)`)
TaichiCompilationError = CompileError
TaichiSyntaxError = UnsupportedError
TaichiTypeError = KernelArgError
TaichiRuntimeError = KernelRuntimeError
TaichiAssertionError = KernelAssertionError
from .frontend.builtins import (abs, acos, acosh, asin, asinh, atan, atan2, atanh, atomic_add, atomic_and,
                                atomic_max, atomic_min, atomic_or, atomic_sub, atomic_xor, block_local, cast,
                                ceil, cos, exp, expm1, floor, log, log1p, max, min, pow, random, round, rsqrt,
                                select, sin, sqrt, stop_grad, tan, tanh)
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
from .runtime import amdgpu, cpu, cuda, dx12, get_runtime, gpu, metal, opengl, sync, vulkan
from .types import f16, f32, float16, float32, i32, int32, u32, uint32


def init(arch=None, debug: bool = False, **kwargs):
    """Choose the adapter and create the device (Taichi's ti.init). Calling it again resets.

    Args:
        arch: `ti.vulkan`, `ti.metal`, `ti.dx12`, `ti.cpu` or `ti.gpu` (`ti.cuda` and `ti.amdgpu`
            mean the best adapter, like `ti.gpu`); None: the best adapter. The environment
            variable `WGPU_AD_ARCH` overrides it.
        debug: check every field index and `assert` in kernels (errors are raised at the next
            read-back), and verify the IR between compiler passes.
        **kwargs: `random_seed=0`, `force_emulated_atomics=False`, `offline_cache=True`,
            `offline_cache_file_path=None`, `ad_stack_size=256` (0: let wgpu_ad choose),
            `print_ir=False`, `print_wgsl=False`.
    """
    from . import runtime
    from .compiler import options
    from .lang.kernel import clear_kernel_caches
    clear_kernel_caches()
    compile_opts = {"print_ir": bool(kwargs.pop("print_ir", False)),
                    "print_wgsl": bool(kwargs.pop("print_wgsl", False)),
                    "offline_cache": bool(kwargs.pop("offline_cache", True)),
                    "offline_cache_file_path": kwargs.pop("offline_cache_file_path", None)}
    ad_stack_size = kwargs.pop("ad_stack_size", None)
    if ad_stack_size is not None:  # 0: "size it for me" (Taichi's adaptive stack): the default
        if not (isinstance(ad_stack_size, int) and ad_stack_size >= 0):
            raise WgpuAdError(f"ti.init(ad_stack_size={ad_stack_size!r}): expected a positive integer, or 0 to "
                              f"let wgpu_ad choose")
        if ad_stack_size:
            compile_opts["ad_stack_size"] = ad_stack_size
    rt = runtime.init(arch=arch, debug=debug, **kwargs)
    options.set_options(**compile_opts)
    return rt


def reset():
    """Drop the device, all fields and compiled kernels (Taichi's ti.reset)."""
    from . import runtime
    from .lang.kernel import clear_kernel_caches
    clear_kernel_caches()
    runtime.reset()  # forgets the compile options too (compiler/options.py)


__version__ = "0.1.0"


def __getattr__(name: str):
    """ti.GUI and ti.ui import the viewer (and so glfw) on first use only (PEP 562)."""
    if name in ("GUI", "ui"):
        from . import viewer
        return getattr(viewer, name)
    if name in ("f64", "float64", "i64", "int64", "u64", "uint64"):  # `real = ti.f64` in Taichi programs
        raise AttributeError(f"ti.{name}: WebGPU shaders have no 64-bit numbers, so wgpu_ad computes in 32 bits; "
                             f"use ti.{'f32' if name[0] == 'f' else name[0] + '32'}")
    raise AttributeError(f"module 'wgpu_ad' has no attribute {name!r}")
