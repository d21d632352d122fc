"""The wgpu device: one Runtime per session (session.py), created on the adapter the arch picks,
with the features and limits the compiler reads, the seeds of kernels' random numbers and the
print buffer.

Runtime is put together from three files besides this one: transfers.py (buffers, host writes
and read-back), batch.py (launches recorded into one pending encoder and submitted together,
deferred work; its docstring has the ordering model) and device_errors.py (device loss, failed
asserts and checks, loops the driver stopped).
"""
from __future__ import annotations

import threading

import wgpu

from ..types import f32, to_dtype
from ..errors import GpuError, WgpuAdError
from . import adapter as _adapter
from .batch import MAX_PENDING, UNIFORM_CAPACITY, Batching, Deferred
from ..plan import ERROR_WORDS
from .device_errors import ErrorChecks, lost_watcher
from .pipelines import PipelineCache
from .printing import DEFAULT_LINES as DEFAULT_PRINT_LINES, PrintBuffer
from .transfers import STAGED_CAPACITY, Transfers

__all__ = ["Runtime", "Deferred"]


class Runtime(Transfers, Batching, ErrorChecks):
    """One wgpu device and everything created on it; a session (session.py) owns one."""

    def __init__(self, arch=None, debug: bool = False, force_emulated_atomics: bool = False,
                 default_fp=None, random_seed: int = 0, print_buffer_lines: int = DEFAULT_PRINT_LINES,
                 device: int | str | None = None, max_storage_buffers_per_shader_stage: int | None = None):
        if default_fp is not None and to_dtype(default_fp) != f32:
            raise WgpuAdError(f"default_fp={default_fp!r} is not supported: wgpu_ad computes in ti.f32")
        self.arch = _adapter.normalize_arch(arch)
        self.adapter = _adapter.select_adapter(self.arch, device)
        wanted = [f for f in _adapter.WANTED_FEATURES if f in self.adapter.features]
        limits = dict(self.adapter.limits)
        if max_storage_buffers_per_shader_stage is not None:  # e.g. 10, a browser's: the device enforces it
            n = max_storage_buffers_per_shader_stage
            if not (isinstance(n, int) and not isinstance(n, bool) and n >= 4):
                raise WgpuAdError(f"ti.init(max_storage_buffers_per_shader_stage={n!r}): expected an integer of at "
                                  f"least 4 (a browser's WebGPU allows 8 to 10)")
            key = "max-storage-buffers-per-shader-stage"
            limits[key] = min(n, limits[key])
        try:
            self.device = self.adapter.request_device_sync(
                label="wgpu_ad", required_features=wanted, required_limits=limits)
        except Exception as e:
            raise GpuError(f"could not create a device on {_adapter.describe(self.adapter)}: {e}") from e
        self.queue = self.device.queue
        lost_watcher.runtimes.add(self)
        self.features: frozenset[str] = frozenset(self.device.features)
        self.limits: dict[str, int] = dict(self.device.limits)
        self.debug = bool(debug)
        self.readback_count = 0  # buffer read-backs to the CPU (read / read_view)
        self.dispatch_count = 0  # compute dispatches recorded (tests tell a fused tape launch by it)
        self._stack_buf = None    # scratch for autodiff stacks (see _scratch)
        self._pack_bufs: list = []  # scratch for packed bindings (see pack_buffer)
        # the most bytes of arguments a launch passes: the argument buffer's, less the alignment of
        # its offsets (plan.UNIFORM_ARG_WORDS: more than a uniform binding holds go in a storage one)
        self.max_arg_bytes = min(UNIFORM_CAPACITY, self.limits.get("max-storage-buffer-binding-size", 1 << 27))
        self.max_scratch_bytes = min(self.limits.get("max-storage-buffer-binding-size", 1 << 27),
                                     self.limits.get("max-buffer-size", 1 << 28), 1 << 28)
        self.force_emulated_atomics = bool(force_emulated_atomics)
        self.has_float_atomics = "shader-float32-atomic" in self.features and not force_emulated_atomics
        self.has_f16 = "shader-f16" in self.features
        self.has_subgroups = "subgroup" in self.features
        self.default_fp = f32
        self.random_seed = int(random_seed)
        self._seed_counter = 0
        self.max_workgroups: int = self.limits["max-compute-workgroups-per-dimension"]
        # a CPU adapter (lavapipe, WARP): the compiler's defaults differ there (compiler/options.py)
        self.is_cpu: bool = str(self.adapter.info.get("adapter_type", "")).upper() == "CPU"
        self.max_pending = MAX_PENDING
        self._deferred: list[Deferred] = []  # see defer()
        self.lost: str | None = None  # set by the wgpu log watcher when the device is lost

        # (the args' offsets suit a uniform binding and a storage one: plan.UNIFORM_ARG_WORDS)
        self._pipelines = PipelineCache(self.device, max(self.limits["min-uniform-buffer-offset-alignment"],
                                                         self.limits.get("min-storage-buffer-offset-alignment", 256)))
        self._encoder = None
        self._pass = None
        self._last_pipeline = None
        self._pending = 0
        self._batch_kernels: list[str] = []
        self._ubuf = self.device.create_buffer(
            label="wgpu_ad.args", size=UNIFORM_CAPACITY,
            usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST)
        self._ubytes = bytearray(UNIFORM_CAPACITY)
        self._uoff = 0
        self._sbuf = self.device.create_buffer(
            label="wgpu_ad.staged_writes", size=STAGED_CAPACITY,
            usage=wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST)
        self._sbytes = bytearray(STAGED_CAPACITY)
        self._soff = 0
        self._staging = None
        self._lock = threading.RLock()  # Batching and Transfers hold it: threads share the device
        self._in_flight = False  # submitted since the last completed wait (sync() returns at once if not)
        # the map mode of read-backs: wgpu-py's map_sync(READ) submits an empty command buffer first,
        # every time (lavapipe: ~0.3 ms of the README's gravity forward); READ_NOSYNC, the mode of
        # wgpu-py's own queue.read_buffer, does not; plain READ where wgpu-py lacks that name
        self._map_mode = "READ_NOSYNC"
        self.error_buffer = self.create_storage((ERROR_WORDS + 1) * 4, "wgpu_ad.errors")
        self._loop_watch: dict[str, None] = {}  # loop-checked kernels launched since the last read-back
        self.ret_buffer = self.create_storage(16, "wgpu_ad.ret")
        self.prints = PrintBuffer(self, print_buffer_lines)  # print() in kernels (printing.py)

    def __repr__(self) -> str:
        return f"<wgpu_ad Runtime on {_adapter.describe(self.adapter)}{' debug' if self.debug else ''}>"

    @property
    def adapter_info(self) -> dict:
        return _adapter.adapter_report(self.adapter)

    def print_tag(self, kernel: str, prints: tuple, record_words: int) -> int:
        """The print tag word of a launch of a kernel that prints (runtime/printing.py)."""
        return self.prints.tag(kernel, prints, record_words)

    def mute_prints(self):
        """A context: kernels launched inside print nothing (ad/checkpoint.py's recomputation)."""
        return self.prints.mute()

    def next_seed(self) -> int:
        """A fresh u32 seed for a kernel's RANDOM ops, reproducible from random_seed (splitmix32)."""
        self._seed_counter += 1
        z = (self.random_seed * 0x9E3779B9 + self._seed_counter * 0x6D2B79F5) & 0xFFFFFFFF
        z = ((z ^ (z >> 16)) * 0x85EBCA6B) & 0xFFFFFFFF
        z = ((z ^ (z >> 13)) * 0xC2B2AE35) & 0xFFFFFFFF
        return z ^ (z >> 16)

    @property
    def random_position(self) -> int:
        """How many seeds next_seed() has handed out; assigning it replays the stream from there
        (ti.ad.checkpoint runs a step again with the random numbers of its first run)."""
        return self._seed_counter

    @random_position.setter
    def random_position(self, n: int) -> None:
        self._seed_counter = int(n)

    def stats(self) -> dict:
        """What holds memory now (ti.runtime_stats()): the wgpu buffers, bind groups and compute
        pipelines alive in this process (wgpu-py's counts, every device), the bytes of those
        buffers, and what this runtime's pipeline cache holds. Read after gc.collect() for exact
        counts: objects in reference cycles wait for the collector."""
        counts = wgpu.diagnostics.object_counts.get_dict()
        return {"buffers": counts["Buffer"]["count"], "buffer_bytes": counts["Buffer"].get("resource_mem", 0),
                "bind_groups": counts["BindGroup"]["count"], "pipelines": counts["ComputePipeline"]["count"],
                "cached": self._pipelines.counts()}
