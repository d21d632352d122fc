"""Buffers on the device and the host's access to them, for device.Runtime: zeroed storage buffers
(sized for vec4 reads), writes (small ones after recorded work staged into the batch instead of a
submit), copies and clears in order with launches, and read-back through a reused staging buffer,
which brings back in the same copy the loop-limit word and the print buffer's header.
"""
from __future__ import annotations

import numpy as np
import wgpu

from ..types import DType
from ..errors import GpuError
from ..plan import LOOP_LIMIT_WORD
from .pipelines import WGPU_ERRORS
from .printing import HEADER as PRINT_HEADER

_STORAGE_USAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
_STAGING_KEEP = 16 * 1024 * 1024  # read-back staging buffers up to this size are reused
STAGED_CAPACITY = 64 * 1024       # small host writes of one batch (see write())
_STAGE_LIMIT = 4 * 1024           # host writes up to this many bytes are staged in the batch


class Transfers:
    """Mixed into device.Runtime (its __init__ makes the staged-write buffer, the error, return and
    print buffers used here)."""

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
        with self._lock:  # one thread at a time records, submits or reads (issue 25)
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
                if n <= _STAGE_LIMIT and self._soff + n <= STAGED_CAPACITY:
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
        with self._lock:  # one thread at a time records, submits or reads (issue 25)
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
            done = False
            try:
                self._map_for_read(staging, total)
                data = staging.read_mapped(0, total)  # a copy (memoryview of a bytearray)
                staging.unmap()
                done = True
            except WGPU_ERRORS as e:
                raise GpuError(f"reading buffer '{buffer.label}' back failed: {e}") from None
            finally:
                if not done:  # (an exception, Ctrl-C among them, while mapping: never leave it mapped)
                    self._discard_staging(staging)
            self._in_flight = False  # the map waited for this submit, so for every earlier one
            self._raise_if_lost()
            watched = list(self._loop_watch)
            self._loop_watch.clear()
            if printed:  # the lines first: they may tell why a loop ran long
                self.prints.collect(bytes(data[size + watch: total]))
            if watch:
                self._check_loops(int.from_bytes(data[size: size + 4], "little"), watched)
            return data[offset - a0: offset - a0 + nbytes]

    def copy(self, src: wgpu.GPUBuffer, dst: wgpu.GPUBuffer, nbytes: int,
             src_offset: int = 0, dst_offset: int = 0) -> None:
        """Buffer-to-buffer copy, recorded in order with launches (offsets and size: multiples of 4)."""
        with self._lock:  # one thread at a time records, submits or reads (issue 25)
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
        with self._lock:  # one thread at a time records, submits or reads (issue 25)
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
        with self._lock:  # one thread at a time records, submits or reads (issue 25)
            if not dtype.np.type(value):  # zero (either sign): a GPU clear, no host array to build and scan
                self.clear(buffer, count * dtype.nbytes, offset)
            else:
                self.write(buffer, np.full(count, value, dtype=dtype.np), offset)

    def _check_range(self, buffer, offset: int, nbytes: int, what: str) -> None:
        if offset < 0 or offset + nbytes > buffer.size:
            raise GpuError(f"{what} of {nbytes} bytes at offset {offset} is outside buffer "
                           f"'{buffer.label}' ({buffer.size} bytes)")

    def _map_for_read(self, staging, nbytes: int) -> None:
        """Map `staging` for reading once the copy just submitted into it has run (see _map_mode)."""
        try:
            staging.map_sync(self._map_mode, 0, nbytes)
        except (ValueError, KeyError, TypeError, AttributeError):
            if self._map_mode == wgpu.MapMode.READ:
                raise
            self._map_mode = wgpu.MapMode.READ  # an older wgpu-py: no READ_NOSYNC
            staging.map_sync(wgpu.MapMode.READ, 0, nbytes)

    def _discard_staging(self, staging) -> None:
        """A read-back buffer an interrupted read left mapped (or mapping): unmapped if it can be,
        and never used again (a later submit would fail on a mapped buffer)."""
        if self._staging is staging:
            self._staging = None
        try:
            staging.unmap()
        except Exception:
            pass

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

    def read_ret(self, dtype: DType):
        """The kernel return value most recently written to ret_buffer, as a Python scalar."""
        return np.frombuffer(self.read(self.ret_buffer, 4), dtype=dtype.np)[0].item()
