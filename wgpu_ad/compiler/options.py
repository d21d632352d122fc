"""CompileOptions: every knob that changes what the compiler emits, in one frozen record.

The options are part of every cache key (a kernel's in-memory specialisations and the offline
cache), so changing one recompiles instead of running code made for other settings. Defaults come
from the device (Runtime facts: float atomics, subgroups, a CPU adapter) and from ti.init's
arguments; the session (session.py) holds them, and ti.set_compile_options() changes them for
the kernels compiled from then on.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from ..errors import WgpuAdError

DEFAULT_STACK_SIZE = 256  # loops bounded by constants or arguments are sized exactly or per launch
# workgroups of a pre-reduced task on a GPU (WebGPU does not tell the number of multiprocessors):
# 2048 of 128 threads fill a 132-SM GPU at 2048 resident threads per SM
REDUCE_GPU_GROUPS = 2048
REDUCE_GROUPS_PER_CORE = 16


@dataclass(frozen=True)
class CompileOptions:
    """Every knob that changes the generated code, part of every cache key: read them with
    ti.compile_options(), change them with ti.set_compile_options(name=value, ...)."""

    debug: bool = False                 # keep asserts (index checks), verify the IR between passes
    float_atomics: bool = False         # WGSL atomic<f32> add (the 'shader-float32-atomic' feature)
    subgroups: bool = False             # WGSL subgroup operations (aggregated atomic adds)
    # on a CPU adapter a few thousand threads fill every core: multi-dimensional parallel loops
    # keep just enough leading dimensions parallel and loop over the rest in each thread
    # (frontend/parallel.py parallel_prefix); GPUs want every iteration as a thread (None)
    min_parallel: int | None = None
    # the most workgroups a range launch uses (the grid-stride loop does the rest): on a CPU
    # adapter every workgroup costs setup and barrier rounds, and a few hundred keep all cores
    # busy (benchmarks/RESULTS.md: 4-13x faster there); GPUs get the full grid
    grid_cap: int = 65535
    # the most workgroups of a range task that pre-reduces `x[None] += ...` (passes/prereduce.py):
    # its threads sum many iterations each in a register, and every workgroup adds a tree sum and
    # an atomic, so it gets just enough workgroups to fill the device: 16 per core of a CPU adapter
    # (lavapipe runs one workgroup per core at a time), REDUCE_GPU_GROUPS on a GPU
    reduce_grid_cap: int = REDUCE_GPU_GROUPS
    ad_stack_size: int = DEFAULT_STACK_SIZE  # stack depth of loops whose trip count is unknown
    # every loop checks that it ran to its end: older Mesa llvmpipe (lavapipe) silently stops the loops
    # of an invocation after 65,535 iterations in total; the error is raised at the next read-back. On
    # by default where the device's probe found the limit (Runtime.loops_limited)
    loop_check: bool = False
    # adjoints check every gradient they write: a NaN or inf raises GradientNaNError naming the
    # element and the operation whose derivative made it (nan_check.py); on with debug
    check_nan: bool = False
    fuse_adjoint: bool = True           # a tape's last launch may run fused with its adjoint
    # results that do not depend on thread timing: tasks that add floats with atomics (gradient
    # accumulation, `x[None] += ...`) run their iterations in order in one invocation, so sums are
    # bitwise the same run to run on one adapter (ti.init(deterministic=True); docs/performance.md)
    deterministic: bool = False
    # the adjoints of stencils gather instead of scattering with atomics (passes/autodiff/stencil.py):
    # None = on GPUs only; on lavapipe the replays cost more than the atomics they remove
    stencil_gather: bool | None = None
    # the most storage buffers a shader may bind (the device's max-storage-buffers-per-shader-stage,
    # which ti.init(max_storage_buffers_per_shader_stage=...) may lower): a task that would bind
    # more reads and writes some of its buffers through one packed binding (codegen/packing.py)
    max_storage_buffers: int | None = None
    print_ir: bool = False              # print the IR after every pass (or WGPU_AD_PRINT_IR=1)
    print_wgsl: bool = False            # print the generated WGSL (or WGPU_AD_PRINT_WGSL=1)
    offline_cache: bool = True          # compiled kernels on disk (compiler/cache.py)
    offline_cache_file_path: str | None = None

    @property
    def show_wgsl(self) -> bool:
        return self.print_wgsl or _env("WGPU_AD_PRINT_WGSL")

    @property
    def printing(self) -> bool:
        return self.print_ir or self.show_wgsl or _env("WGPU_AD_PRINT_IR")

    def key(self) -> tuple:
        """What decides the compiler's output (printing and the cache folder do not)."""
        return (self.debug, self.float_atomics, self.subgroups, self.min_parallel, self.grid_cap,
                self.reduce_grid_cap, self.ad_stack_size, self.loop_check, self.check_nan, self.stencil_gather,
                self.deterministic, self.max_storage_buffers)


def _env(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


def for_device(rt, **user) -> CompileOptions:
    """The defaults for a runtime's device, with the user's settings on top."""
    base = CompileOptions(debug=rt.debug, check_nan=rt.debug, float_atomics=rt.has_float_atomics, subgroups=rt.has_subgroups,
                          min_parallel=max(1024, 256 * (os.cpu_count() or 1)) if rt.is_cpu else None,
                          grid_cap=256 if rt.is_cpu else rt.max_workgroups,
                          reduce_grid_cap=(REDUCE_GROUPS_PER_CORE * (os.cpu_count() or 1) if rt.is_cpu
                                           else min(REDUCE_GPU_GROUPS, rt.max_workgroups)),
                          loop_check=rt.loops_limited,
                          max_storage_buffers=rt.limits.get("max-storage-buffers-per-shader-stage"))
    return dataclasses.replace(base, **user)


def check_changes(changes: dict) -> None:
    """Refuse unknown options and bad values, naming them (ti.set_compile_options)."""
    fields = {f.name for f in dataclasses.fields(CompileOptions)}
    for name, value in changes.items():
        if name not in fields:
            raise WgpuAdError(f"set_options: unknown compile option {name!r}; the options are "
                              f"{', '.join(sorted(fields))}")
    stack = changes.get("ad_stack_size", 1)
    if not (isinstance(stack, int) and not isinstance(stack, bool) and stack >= 1):
        raise WgpuAdError(f"ad_stack_size={stack!r}: expected a positive integer")
    for knob in ("grid_cap", "reduce_grid_cap"):
        cap = changes.get(knob, 1)
        if not (isinstance(cap, int) and not isinstance(cap, bool) and cap >= 1):
            raise WgpuAdError(f"{knob}={cap!r}: expected a positive integer")
    most = changes.get("max_storage_buffers")
    if most is not None and not (isinstance(most, int) and not isinstance(most, bool) and most >= 4):
        raise WgpuAdError(f"max_storage_buffers={most!r}: expected an integer of at least 4 (a browser's WebGPU "
                          f"allows 8 to 10), or None (no packing)")
    if changes.get("stencil_gather") not in (None, True, False):
        raise WgpuAdError(f"stencil_gather={changes['stencil_gather']!r}: expected True, False or None (automatic)")
