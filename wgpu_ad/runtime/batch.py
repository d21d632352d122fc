"""Batched kernel launches, for device.Runtime.

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

from typing import Callable

import wgpu

from ..errors import GpuError
from ..plan import CompiledKernel
from .pipelines import WGPU_ERRORS

UNIFORM_CAPACITY = 256 * 1024  # one batch's args; >= 64 KiB (max uniform binding) + alignment
MAX_PENDING = 512              # launches per submit: bounds recorded-but-unsubmitted memory


class Batching:
    """Mixed into device.Runtime (its __init__ makes the pipeline cache, the uniform and staged-write
    buffers and the batch's state used here)."""

    def launch(self, ck: CompiledKernel, task_index: int, buffers: list, args: bytes, workgroups: int,
               stack_words: int = 0, ret_buffer: wgpu.GPUBuffer | None = None, packs: tuple = ()) -> None:
        """Record one dispatch of ck.tasks[task_index]; buffers: one per position of the task's
        'buffer' bindings (BindingSpec.key); stack_words: autodiff stack words per thread; packs:
        one buffer per 'pack' binding (pack_buffer)."""
        with self._lock:  # one thread at a time records, submits or reads (issue 25)
            if self._deferred:
                self.run_deferred()
            cache = self._pipelines
            if cache.dead or cache.dead_kernels:
                cache.purge()  # (before any lookup: a buffer gone may have left its id to another)
            tp = cache.kernel(ck).tasks[task_index]
            ret = self.ret_buffer if ret_buffer is None else ret_buffer
            key = (*map(id, buffers), id(ret))
            if stack_words:
                threads = 1 if tp.serial else workgroups * tp.task.workgroup_size
                key = (*key, id(self._scratch(threads * stack_words * 4, ck.name)))
            if tp.prints:
                key = (*key, id(self.prints.buffer))
            if packs:
                key = (*key, *map(id, packs))
            hit = tp.bind_groups.get(key)
            bg = hit[0] if hit is not None else self._new_bind_group(ck, tp, key, buffers, ret, packs)

            size = tp.args_size
            if size:
                if len(args) > size:
                    raise GpuError(f"kernel '{ck.name}': {len(args)} bytes of args for a {size}-byte uniform block")
                if self._uoff + size > UNIFORM_CAPACITY:
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

    def _new_bind_group(self, ck, tp, key, buffers, ret, packs=()):
        def resolve(kind: str, k: int):
            if kind == "pack":
                return packs[k]
            if kind == "buffer":
                try:
                    return buffers[k]
                except IndexError:
                    raise GpuError(f"kernel '{ck.name}': binding wants buffer #{k} but the launch gave "
                                   f"{len(buffers)} buffers (compiler bug)") from None
            return {"args": self._ubuf, "args_storage": self._ubuf, "error": self.error_buffer, "ret": ret, "stack": self._stack_buf,
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

    def pack_buffer(self, k: int, nbytes: int, kernel: str):
        """Scratch buffer k for a task's packed bindings (codegen/packing.py), grown (to a power of
        two) to at least nbytes. Launches share them: each copies its buffers in before its
        dispatch and out after it, in order in the batch."""
        if nbytes > self.max_scratch_bytes:
            raise GpuError(f"kernel '{kernel}' binds more storage buffers than this adapter allows and its packed "
                           f"buffers need {nbytes} bytes, more than this adapter's largest storage binding "
                           f"({self.max_scratch_bytes} bytes); split the kernel into kernels that each read and "
                           f"write fewer fields")
        packs = self._pack_bufs
        while len(packs) <= k:
            packs.append(None)
        if packs[k] is None or packs[k].size < nbytes:
            size = max(1 << 12, 1 << (nbytes - 1).bit_length())
            packs[k] = self.create_storage(min(size, self.max_scratch_bytes), f"wgpu_ad.packed_{k}")
        return packs[k]

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
        with self._lock:  # one thread at a time records, submits or reads (issue 25)
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
            except BaseException:  # Ctrl-C: the batch is lost, the runtime stays usable
                self._drop_batch()
                raise

    def _count_pending(self, what: str) -> None:
        self._batch_kernels.append(f"<{what}>")
        self._pending += 1
        if self._pending >= self.max_pending:
            self.flush()

    def flush(self) -> None:
        """Submit everything recorded so far (without waiting for it)."""
        with self._lock:  # one thread at a time records, submits or reads (issue 25)
            if self._deferred:
                self.run_deferred()
            if self._encoder is None:
                return
            self._end_pass()
            err = None
            try:
                if self._uoff:
                    self.queue.write_buffer(self._ubuf, 0, memoryview(self._ubytes)[: self._uoff])
                if self._soff:
                    self.queue.write_buffer(self._sbuf, 0, memoryview(self._sbytes)[: self._soff])
                self.queue.submit([self._encoder.finish()])
            except WGPU_ERRORS as e:
                err = self._batch_error(e)
            else:
                self._in_flight = True
            finally:  # whatever happened (Ctrl-C too), the next launch starts a fresh encoder
                self._drop_batch()
            if err is not None:
                raise err from None

    def submit(self, command_buffers: list) -> None:
        """Submit command buffers recorded elsewhere on this device (the viewer's frames), after the
        pending launches, so that sync() waits for them too."""
        with self._lock:
            self.flush()
            self.queue.submit(command_buffers)
            self._in_flight = True

    def _drop_batch(self) -> None:
        self._encoder = self._pass = self._last_pipeline = None
        self._pending = self._uoff = self._soff = 0
        self._batch_kernels = []

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
