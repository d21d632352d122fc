"""The wgpu device, buffers, batched kernel launches and read-back.

Ordering model: launches, copies and clears are recorded into one pending command encoder (and,
for launches, one open compute pass, which is much cheaper per dispatch than a pass each) and
submitted without waiting. The CPU waits only in read() and sync(). queue.write_buffer runs at
the next submit *before* commands recorded but not yet submitted, so write() submits pending
work first, unless it is small: then it is staged (its bytes join the batch's upload, a copy joins
its commands). The uniform args of all launches in a batch live in one buffer at dynamic offsets;
its bytes are written right before the submit that uses them, like the staged writes' bytes.
Work may be deferred (defer(): a tape's last launch, which may end up fused with its adjoint): it
runs before any other work reaches the device, so nothing can see the difference.
"""
from __future__ import annotations

import functools
import sys
from typing import Callable

import numpy as np
import wgpu

from ..types import DType, f32, to_dtype
from ..errors import GpuError, KernelAssertionError, KernelRuntimeError, WgpuAdError
from . import adapter as _adapter, quirks as _quirks
from .compiled import ERROR_WORDS, LOOP_LIMIT_WORD, CompiledKernel
from .pipelines import WGPU_ERRORS, PipelineCache
from .printing import DEFAULT_LINES as DEFAULT_PRINT_LINES, HEADER as PRINT_HEADER, PrintBuffer

_STORAGE_USAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
_UNIFORM_CAPACITY = 256 * 1024    # one batch's args; >= 64 KiB (max uniform binding) + alignment
_MAX_PENDING = 512                # launches per submit: bounds recorded-but-unsubmitted memory
_STAGING_KEEP = 16 * 1024 * 1024  # read-back staging buffers up to this size are reused
_STAGED_CAPACITY = 64 * 1024      # small host writes of one batch (see write())
_STAGE_LIMIT = 4 * 1024           # host writes up to this many bytes are staged in the batch


class Runtime:
    """One wgpu device and everything created on it; a session (session.py) owns one."""

    def __init__(self, arch=None, debug: bool = False, force_emulated_atomics: bool = False,
                 default_fp=None, random_seed: int = 0, print_buffer_lines: int = DEFAULT_PRINT_LINES):
        if default_fp is not None and to_dtype(default_fp) != f32:
            raise WgpuAdError(f"default_fp={default_fp!r} is not supported: wgpu_ad computes in ti.f32")
        self.arch = _adapter.normalize_arch(arch)
        self.adapter = _adapter.select_adapter(self.arch)
        wanted = [f for f in _adapter.WANTED_FEATURES if f in self.adapter.features]
        try:
            self.device = self.adapter.request_device_sync(
                label="wgpu_ad", required_features=wanted, required_limits=dict(self.adapter.limits))
        except Exception as e:
            raise GpuError(f"could not create a device on {_adapter.describe(self.adapter)}: {e}") from e
        self.queue = self.device.queue
        _quirks.watch_device_loss(self)
        self.features: frozenset[str] = frozenset(self.device.features)
        self.limits: dict[str, int] = dict(self.device.limits)
        self.debug = bool(debug)
        self.readback_count = 0  # buffer read-backs to the CPU (read / read_view)
        self.dispatch_count = 0  # compute dispatches recorded (tests tell a fused tape launch by it)
        self._stack_buf = None    # scratch for autodiff stacks (see _scratch)
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
        self.max_pending = _MAX_PENDING
        self._deferred: list[Deferred] = []  # see defer()
        self.lost: str | None = None  # set by the wgpu log watcher when the device is lost
        self._in_flight = False  # submitted since the last completed wait (sync() returns at once if not)

        self._pipelines = PipelineCache(self.device, self.limits["min-uniform-buffer-offset-alignment"])
        self._encoder = None
        self._pass = None
        self._last_pipeline = None
        self._pending = 0
        self._batch_kernels: list[str] = []
        self._ubuf = self.device.create_buffer(
            label="wgpu_ad.args", size=_UNIFORM_CAPACITY, usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
        self._ubytes = bytearray(_UNIFORM_CAPACITY)
        self._uoff = 0
        self._sbuf = self.device.create_buffer(
            label="wgpu_ad.staged_writes", size=_STAGED_CAPACITY,
            usage=wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST)
        self._sbytes = bytearray(_STAGED_CAPACITY)
        self._soff = 0
        self._staging = None
        self.error_buffer = self.create_storage((ERROR_WORDS + 1) * 4, "wgpu_ad.errors")
        self._loop_watch: dict[str, None] = {}  # loop-checked kernels launched since the last read-back
        self.ret_buffer = self.create_storage(16, "wgpu_ad.ret")
        self.prints = PrintBuffer(self, print_buffer_lines)  # print() in kernels (printing.py)

    def __repr__(self) -> str:
        return f"<wgpu_ad Runtime on {_adapter.describe(self.adapter)}{' debug' if self.debug else ''}>"

    @functools.cached_property
    def loops_limited(self) -> bool:
        """Whether the driver ends the loops of a shader invocation early, silently (quirks.py)."""
        return _quirks.loops_limited(self.adapter, self.device)

    @property
    def adapter_info(self) -> dict:
        return _adapter.adapter_report(self.adapter)

    # ---- buffers ------------------------------------------------------------------------------

    def create_storage(self, nbytes: int, label: str = "") -> wgpu.GPUBuffer:
        """A zero-initialised storage buffer, its size rounded up to 16 bytes (at least 16): a
        shader may read any buffer as an array of vec4 (codegen/vectors.py)."""
        size = max(16, (int(nbytes) + 15) // 16 * 16)
        limit = self.limits["max-buffer-size"]
        if size > limit:
            raise GpuError(f"buffer '{label}' needs {size} bytes; this adapter's max-buffer-size is {limit}")
        try:
            return self.device.create_buffer(label=label, size=size, usage=_STORAGE_USAGE)
        except WGPU_ERRORS as e:
            raise GpuError(f"could not allocate buffer '{label}' ({size} bytes): {e}") from None

    def write(self, buffer: wgpu.GPUBuffer, data, offset: int = 0) -> None:
        """Write bytes / an array into buffer at byte offset, ordered after every earlier launch."""
        if self._deferred:
            self.run_deferred()
        if isinstance(data, np.ndarray):
            mv = memoryview(np.ascontiguousarray(data)).cast("B")
        else:
            mv = memoryview(data).cast("B")
        n = len(mv)
        if n == 0:
            return
        if offset % 4 or n % 4:  # WebGPU copies whole 4-byte words: read, patch, write back
            a0, a1 = offset // 4 * 4, (offset + n + 3) // 4 * 4
            span = bytearray(self.read(buffer, a1 - a0, a0))
            span[offset - a0: offset - a0 + n] = mv
            offset, mv = a0, memoryview(span)
        self._check_range(buffer, offset, len(mv), "write")
        if self._encoder is not None:
            n = len(mv)
            if n <= _STAGE_LIMIT and self._soff + n <= _STAGED_CAPACITY:
                # a small write after recorded work (a tape's seed, x[i] = v between launches):
                # a copy in the batch from bytes uploaded before its submit, instead of a submit now
                off = self._soff
                self._sbytes[off: off + n] = mv
                self._soff = off + n
                self._end_pass()
                self._get_encoder().copy_buffer_to_buffer(self._sbuf, off, buffer, offset, n)
                self._count_pending("write")
                return
            self.flush()
        try:
            self.queue.write_buffer(buffer, offset, mv)
        except WGPU_ERRORS as e:
            raise GpuError(f"writing {n} bytes to buffer '{buffer.label}' failed: {e}") from None

    def read(self, buffer: wgpu.GPUBuffer, nbytes: int, offset: int = 0) -> bytes:
        """Bytes [offset, offset+nbytes) of buffer, after every launch recorded so far."""
        return bytes(self.read_view(buffer, nbytes, offset))

    def read_view(self, buffer: wgpu.GPUBuffer, nbytes: int, offset: int = 0) -> memoryview:
        """Like read(), as a writable memoryview (one copy less for big arrays)."""
        if self._deferred:
            self.run_deferred()
        if nbytes <= 0:
            return memoryview(bytearray())
        self.readback_count += 1  # the viewer's tests check that drawing never reads fields back
        a0, a1 = offset // 4 * 4, (offset + nbytes + 3) // 4 * 4
        size = a1 - a0
        self._check_range(buffer, a0, size, "read")
        # loop-checked kernels ran: their loop word comes back in the same copy (no extra wait);
        # so does the print buffer's header when kernels that print ran (printing.py)
        watch = 4 if self._loop_watch else 0
        printed = PRINT_HEADER * 4 if self.prints.launches else 0
        total = size + watch + printed
        staging = self._staging_buffer(total)
        self._end_pass()
        enc = self._get_encoder()
        enc.copy_buffer_to_buffer(buffer, a0, staging, 0, size)
        if watch:
            enc.copy_buffer_to_buffer(self.error_buffer, LOOP_LIMIT_WORD * 4, staging, size, 4)
        if printed:
            enc.copy_buffer_to_buffer(self.prints.buffer, 0, staging, size + watch, printed)
        self.flush()
        try:
            _quirks.map_for_read(staging, total)
            data = staging.read_mapped(0, total)  # a copy (memoryview of a bytearray)
            staging.unmap()
        except WGPU_ERRORS as e:
            raise GpuError(f"reading buffer '{buffer.label}' back failed: {e}") from None
        self._in_flight = False  # the map waited for this submit, so for every earlier one
        self._raise_if_lost()
        watched = list(self._loop_watch)
        self._loop_watch.clear()
        if printed:  # the lines first: they may tell why a loop ran long
            self.prints.collect(bytes(data[size + watch: total]))
        if watch:
            self._check_loops(int.from_bytes(data[size: size + 4], "little"), watched)
        return data[offset - a0: offset - a0 + nbytes]

    def _check_loops(self, stopped: int, names: list) -> None:
        """Raise when a loop-checked kernel's loop was stopped by the driver (see compiled.py);
        names: the loop-checked kernels launched since the last read-back."""
        if not stopped:
            return
        self.clear(self.error_buffer, 4, LOOP_LIMIT_WORD * 4)
        who = f"kernel '{names[0]}'" if len(names) == 1 else \
            f"one of the kernels {', '.join(repr(n) for n in names)}"
        raise KernelRuntimeError(
            f"{who}: a loop stopped before its end: this adapter's driver (Mesa llvmpipe / lavapipe) ends "
            f"the loops of a shader invocation after 65,535 iterations in total, so the results since the "
            f"last read-back are incomplete (this error is raised instead of returning them). Give each "
            f"thread fewer loop iterations: a longer parallel loop (more threads), fewer serial iterations per "
            f"thread, or the loop split across several launches")

    def copy(self, src: wgpu.GPUBuffer, dst: wgpu.GPUBuffer, nbytes: int,
             src_offset: int = 0, dst_offset: int = 0) -> None:
        """Buffer-to-buffer copy, recorded in order with launches (offsets and size: multiples of 4)."""
        if self._deferred:
            self.run_deferred()
        if nbytes <= 0:
            return
        if src_offset % 4 or dst_offset % 4 or nbytes % 4:
            raise GpuError(f"copy of {nbytes} bytes at offsets {src_offset}, {dst_offset}: "
                           f"WebGPU copies need offsets and sizes that are multiples of 4")
        self._check_range(src, src_offset, nbytes, "copy from")
        self._check_range(dst, dst_offset, nbytes, "copy to")
        self._end_pass()
        self._get_encoder().copy_buffer_to_buffer(src, src_offset, dst, dst_offset, nbytes)
        self._count_pending("copy")

    def clear(self, buffer: wgpu.GPUBuffer, nbytes: int | None = None, offset: int = 0) -> None:
        """Zero a range (the whole buffer by default), in order with launches."""
        if self._deferred:
            self.run_deferred()
        size = buffer.size - offset if nbytes is None else nbytes
        a0, a1 = offset // 4 * 4, (offset + size + 3) // 4 * 4
        if a0 != offset or a1 != offset + size:  # f16 odd edges: fall back to a write
            self.write(buffer, bytes(size), offset)
            return
        self._check_range(buffer, offset, size, "clear")
        self._end_pass()
        self._get_encoder().clear_buffer(buffer, offset, size)
        self._count_pending("clear")

    def fill(self, buffer: wgpu.GPUBuffer, value, dtype: DType, count: int, offset: int = 0) -> None:
        """Set `count` scalars of `dtype` starting at byte offset to value."""
        if not dtype.np.type(value):  # zero (either sign): a GPU clear, no host array to build and scan
            self.clear(buffer, count * dtype.nbytes, offset)
        else:
            self.write(buffer, np.full(count, value, dtype=dtype.np), offset)

    def _check_range(self, buffer, offset: int, nbytes: int, what: str) -> None:
        if offset < 0 or offset + nbytes > buffer.size:
            raise GpuError(f"{what} of {nbytes} bytes at offset {offset} is outside buffer "
                           f"'{buffer.label}' ({buffer.size} bytes)")

    def _staging_buffer(self, size: int):
        st = self._staging
        if st is not None and st.size >= size:
            return st
        cap = 1 << max(12, (size - 1).bit_length())
        usage = wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST
        try:
            buf = self.device.create_buffer(label="wgpu_ad.readback", size=max(cap if cap <= _STAGING_KEEP else size, 16), usage=usage)
        except WGPU_ERRORS as e:
            raise GpuError(f"could not allocate a {size}-byte read-back buffer: {e}") from None
        if buf.size <= _STAGING_KEEP:
            self._staging = buf
        return buf

    # ---- launches ------------------------------------------------------------------------------

    def launch(self, ck: CompiledKernel, task_index: int, buffers: list, args: bytes, workgroups: int,
               stack_words: int = 0, ret_buffer: wgpu.GPUBuffer | None = None) -> None:
        """Record one dispatch of ck.tasks[task_index]; buffers: one per position of the task's
        'buffer' bindings (BindingSpec.key); stack_words: autodiff stack words per thread."""
        if self._deferred:
            self.run_deferred()
        tp = self._pipelines.kernel(ck).tasks[task_index]
        ret = self.ret_buffer if ret_buffer is None else ret_buffer
        key = (*map(id, buffers), id(ret))
        if stack_words:
            threads = 1 if tp.serial else workgroups * tp.task.workgroup_size
            key = (*key, id(self._scratch(threads * stack_words * 4, ck.name)))
        if tp.prints:
            key = (*key, id(self.prints.buffer))
        hit = tp.bind_groups.get(key)
        bg = hit[0] if hit is not None else self._new_bind_group(ck, tp, key, buffers, ret)

        size = tp.args_size
        if size:
            if len(args) > size:
                raise GpuError(f"kernel '{ck.name}': {len(args)} bytes of args for a {size}-byte uniform block")
            if self._uoff + size > _UNIFORM_CAPACITY:
                self.flush()
        if tp.serial:
            workgroups = 1
        elif not 0 < workgroups <= self.max_workgroups:
            if workgroups == 0:
                return  # an empty range: nothing to run
            raise GpuError(f"kernel '{ck.name}': {workgroups} workgroups exceed this adapter's "
                           f"max-compute-workgroups-per-dimension ({self.max_workgroups})")
        cpass = self._pass
        if cpass is None:
            cpass = self._begin_pass()
        if tp.pipeline is not self._last_pipeline:
            cpass.set_pipeline(tp.pipeline)
            self._last_pipeline = tp.pipeline
        if size:
            off = self._uoff
            self._ubytes[off: off + len(args)] = args
            self._uoff = off + tp.args_step
            cpass.set_bind_group(0, bg, [off])
        else:
            cpass.set_bind_group(0, bg)
        cpass.dispatch_workgroups(workgroups)
        if ck.loop_check:
            self._loop_watch[ck.name] = None
        self.dispatch_count += 1
        self._batch_kernels.append(ck.name)
        self._pending += 1
        if self._pending >= self.max_pending or self.debug:
            self.flush()  # in debug mode each launch is submitted alone, so errors name their kernel

    def _new_bind_group(self, ck, tp, key, buffers, ret):
        def resolve(kind: str, k: int):
            if kind == "buffer":
                try:
                    return buffers[k]
                except IndexError:
                    raise GpuError(f"kernel '{ck.name}': binding wants buffer #{k} but the launch gave "
                                   f"{len(buffers)} buffers (compiler bug)") from None
            return {"args": self._ubuf, "error": self.error_buffer, "ret": ret, "stack": self._stack_buf,
                    "print": self.prints.buffer}[kind]
        return self._pipelines.bind_group(ck.name, tp, key, resolve)

    def _scratch(self, nbytes: int, kernel: str):
        """The scratch buffer for autodiff stacks, grown (to a power of two) to at least nbytes."""
        if nbytes > self.max_scratch_bytes:
            raise GpuError(f"kernel '{kernel}': its autodiff stacks need {nbytes} bytes of scratch memory, more "
                           f"than this adapter's largest storage binding ({self.max_scratch_bytes} bytes); lower "
                           f"ti.init(ad_stack_size=...) or shorten the loops")
        if self._stack_buf is None or self._stack_buf.size < nbytes:
            size = max(1 << 16, 1 << (nbytes - 1).bit_length())
            self._stack_buf = self.create_storage(min(size, self.max_scratch_bytes), "wgpu_ad.ad_stacks")
        return self._stack_buf

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

    # ---- deferred work ----------------------------------------------------------------------------

    def defer(self, run: Callable[[], None]) -> "Deferred":
        """Run `run()` before anything else reaches the device (a launch, write, read, copy, clear
        or submit), unless the returned handle is cancelled first. A tape defers its last launch
        this way, to run it fused with its adjoint when nothing came between."""
        d = Deferred(run)
        self._deferred.append(d)
        return d

    def run_deferred(self) -> None:
        """Run the deferred work now, in the order it was deferred."""
        while self._deferred:
            d = self._deferred.pop(0)
            d.run()

    # ---- submission ----------------------------------------------------------------------------

    def _get_encoder(self):
        if self._encoder is None:
            self._raise_if_lost()
            self._encoder = self.device.create_command_encoder(label="wgpu_ad.batch")
        return self._encoder

    def _begin_pass(self):
        self._pass = self._get_encoder().begin_compute_pass(label="wgpu_ad.launches")
        self._last_pipeline = None
        return self._pass

    def _end_pass(self) -> None:
        if self._pass is not None:
            cpass, self._pass = self._pass, None
            try:
                cpass.end()
            except WGPU_ERRORS as e:
                self._drop_batch()
                raise self._batch_error(e) from None

    def _count_pending(self, what: str) -> None:
        self._batch_kernels.append(f"<{what}>")
        self._pending += 1
        if self._pending >= self.max_pending:
            self.flush()

    def flush(self) -> None:
        """Submit everything recorded so far (without waiting for it)."""
        if self._deferred:
            self.run_deferred()
        if self._encoder is None:
            return
        self._end_pass()
        try:
            if self._uoff:
                self.queue.write_buffer(self._ubuf, 0, memoryview(self._ubytes)[: self._uoff])
            if self._soff:
                self.queue.write_buffer(self._sbuf, 0, memoryview(self._sbytes)[: self._soff])
            self.queue.submit([self._encoder.finish()])
        except WGPU_ERRORS as e:
            err = self._batch_error(e)
            self._drop_batch()
            raise err from None
        self._in_flight = True
        self._drop_batch()

    def submit(self, command_buffers: list) -> None:
        """Submit command buffers recorded elsewhere on this device (the viewer's frames), after the
        pending launches, so that sync() waits for them too."""
        self.flush()
        self.queue.submit(command_buffers)
        self._in_flight = True

    def _drop_batch(self) -> None:
        self._encoder = self._pass = self._last_pipeline = None
        self._pending = self._uoff = self._soff = 0
        self._batch_kernels = []

    def _batch_error(self, e: Exception) -> GpuError:
        names = list(dict.fromkeys(n for n in self._batch_kernels if not n.startswith("<")))
        who = (f"kernel '{names[0]}'" if len(names) == 1 else
               f"one of the kernels {', '.join(repr(n) for n in names)} (ti.init(debug=True) submits "
               f"each launch alone and names the one)" if names else "a buffer copy")
        return GpuError(f"WebGPU rejected work from {who}:\n{e}")

    def sync(self) -> None:
        """Submit pending work and wait until the GPU has finished it."""
        if not (self._in_flight or self._encoder is not None or self._deferred):
            # nothing submitted since the last completed wait: a read-back here cost 0.16 ms of CPU
            # and 0.26-0.4 ms on lavapipe (encoder, copy, submit, map, unmap), for nothing
            self._raise_if_lost()
            return
        # A 4-byte read-back waits for all earlier submits (queue.on_submitted_work_done_sync is
        # broken in wgpu-py 0.32).
        self.read(self.ret_buffer, 4)

    def _raise_if_lost(self) -> None:
        if self.lost is not None:
            raise GpuError(f"the GPU device was lost ({self.lost}); call ti.reset() or ti.init() to start "
                           f"over (fields and ndarrays made before are gone)")

    # ---- kernel results and debug checks -------------------------------------------------------

    def read_ret(self, dtype: DType):
        """The kernel return value most recently written to ret_buffer, as a Python scalar."""
        return np.frombuffer(self.read(self.ret_buffer, 4), dtype=dtype.np)[0].item()

    def check_errors(self, ck: CompiledKernel, storage: Callable | None = None) -> None:
        """Debug mode: raise KernelRuntimeError if a launch of ck recorded a failed assert.
        storage(source): what the launcher knows of the storage a plan source names, for the
        message of a failed gradient check (GradientNaNError; its table entry, a
        nan_check.GradCheck, makes it) and of a failed data access check (DataAccessError,
        access_check.AccessCheck)."""
        if not ck.asserts:
            return
        words = np.frombuffer(self.read(self.error_buffer, ERROR_WORDS * 4), dtype=np.uint32)
        which = int(words[0])
        if which == 0:
            return
        self.clear(self.error_buffer)
        if which > len(ck.asserts):
            raise KernelRuntimeError(f"kernel '{ck.name}': assert #{which - 1} failed (unknown assert: compiler bug)")
        template, dtypes = ck.asserts[which - 1]
        values = [words[1 + i: 2 + i].view(to_dtype(dt).np)[0].item() for i, dt in enumerate(dtypes)]
        kind = ck.assert_kinds[which - 1] if which <= len(ck.assert_kinds) else "stack"
        if kind in ("nan", "access"):  # GradientNaNError, DataAccessError
            raise template.error(values, storage)
        cls = KernelAssertionError if kind == "assert" else KernelRuntimeError
        raise cls(f"kernel '{ck.name}': " + template.format(*values))


class Deferred:
    """Work deferred with Runtime.defer; cancel() takes it back (True when it had not run yet)."""

    __slots__ = ("_run",)

    def __init__(self, run: Callable[[], None]):
        self._run = run

    def run(self) -> None:
        run, self._run = self._run, None
        if run is not None:
            run()

    def cancel(self) -> bool:
        pending, self._run = self._run is not None, None
        return pending
