"""What goes wrong on the device, raised as Python exceptions at the call that caused it, for
device.Runtime: device loss (wgpu-py only logs it: a log handler sets a flag), a batch WebGPU
rejected (naming its kernels), the asserts and checks kernels report through the error buffer
(debug mode, check_nan, access checks, autodiff stack overflows), and loops the driver stopped
early (Mesa 22's llvmpipe ends a shader invocation's loops after 65,535 iterations: probed once).
"""
from __future__ import annotations

import functools
import logging
import weakref
from typing import Callable

import numpy as np

from ..types import to_dtype
from ..errors import GpuError, KernelAssertionError, KernelRuntimeError
from ..plan import ERROR_WORDS, LOOP_LIMIT_WORD, CompiledKernel

LOOP_PROBE = 70_000                # iterations of the loop that tells whether the driver limits loops


class ErrorChecks:
    """Mixed into device.Runtime (its __init__ makes the error buffer and sets `lost`)."""

    @functools.cached_property
    def loops_limited(self) -> bool:
        """Whether the driver ends the loops of a shader invocation early, silently: Mesa's llvmpipe
        did after 65,535 iterations in total (Debian 12's Mesa 22.3 does; Mesa 25.0 no longer
        does). Found once per device by running a loop of LOOP_PROBE iterations, on llvmpipe only."""
        if "llvmpipe" not in str(self.adapter.info.get("device", "")).lower():
            return False
        dev = self.device
        code = ("@group(0) @binding(0) var<storage, read_write> io: array<u32>;\n"
                "@compute @workgroup_size(1) fn main() {\n"
                "    let n = io[0];\n    var s = 0u;\n"
                "    loop { if s >= n { break; } s += 1u; }\n"
                "    io[1] = s;\n}\n")
        pipeline = dev.create_compute_pipeline(
            label="wgpu_ad.loop_probe", layout="auto",
            compute={"module": dev.create_shader_module(label="wgpu_ad.loop_probe", code=code), "entry_point": "main"})
        buf = self.create_storage(16, "wgpu_ad.loop_probe")
        self.queue.write_buffer(buf, 0, np.array([LOOP_PROBE, 0], np.uint32))
        group = dev.create_bind_group(layout=pipeline.get_bind_group_layout(0),
                                      entries=[{"binding": 0, "resource": {"buffer": buf, "offset": 0, "size": 16}}])
        enc = dev.create_command_encoder()
        cpass = enc.begin_compute_pass()
        cpass.set_pipeline(pipeline)
        cpass.set_bind_group(0, group)
        cpass.dispatch_workgroups(1)
        cpass.end()
        self.queue.submit([enc.finish()])
        done = int(np.frombuffer(self.queue.read_buffer(buf, 0, 8), np.uint32)[1])
        buf.destroy()
        return done != LOOP_PROBE

    def _check_loops(self, stopped: int, names: list) -> None:
        """Raise when a loop-checked kernel's loop was stopped by the driver (see plan.py);
        names: the loop-checked kernels launched since the last read-back."""
        if not stopped:
            return
        self.clear(self.error_buffer, 4, LOOP_LIMIT_WORD * 4)
        who = f"kernel '{names[0]}'" if len(names) == 1 else \
            f"one of the kernels {', '.join(repr(n) for n in names)}"
        raise KernelRuntimeError(
            f"{who}: a loop stopped before its end: this adapter's driver (Mesa llvmpipe / lavapipe) ends "
            f"the loops of a shader invocation after 65,535 iterations in total, so the results since the "
            f"last read-back are incomplete (this error is raised instead of returning them). wgpu_ad already "
            f"runs up to 128 iterations of a long loop per iteration the driver counts (about 8 million for "
            f"a small loop body, fewer for a large one). Give each thread fewer loop iterations: a longer "
            f"parallel loop (more threads), fewer serial iterations per thread, or the loop split across "
            f"several launches; or use Mesa 25 or newer, which has no such limit (Debian 12 has it in "
            f"bookworm-backports: docs/performance.md#lavapipes-loop-limit)")

    def _batch_error(self, e: Exception) -> GpuError:
        names = list(dict.fromkeys(n for n in self._batch_kernels if not n.startswith("<")))
        who = (f"kernel '{names[0]}'" if len(names) == 1 else
               f"one of the kernels {', '.join(repr(n) for n in names)} (ti.init(debug=True) submits "
               f"each launch alone and names the one)" if names else "a buffer copy")
        return GpuError(f"WebGPU rejected work from {who}:\n{e}")

    def _raise_if_lost(self) -> None:
        if self.lost is not None:
            raise GpuError(f"the GPU device was lost ({self.lost}); call ti.reset() or ti.init() to start "
                           f"over (fields and ndarrays made before are gone)")

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
        if kind in ("nan", "access", "zerodiv"):  # GradientNaNError, DataAccessError, KernelZeroDivisionError
            raise template.error(values, storage)
        cls = KernelAssertionError if kind == "assert" else KernelRuntimeError
        raise cls(f"kernel '{ck.name}': " + template.format(*values))


# ---- device loss ----------------------------------------------------------------------------

class _LostWatcher(logging.Handler):
    """wgpu-py only logs device loss; turn it into a flag the runtimes raise on."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.runtimes: weakref.WeakSet = weakref.WeakSet()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
        except Exception:
            return
        if "device was lost" in msg and "Destroyed" not in msg:
            for rt in list(self.runtimes):
                rt.lost = msg.strip().splitlines()[0]


lost_watcher = _LostWatcher()
logging.getLogger("wgpu").addHandler(lost_watcher)
