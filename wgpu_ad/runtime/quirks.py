"""What drivers and wgpu-py do that the runtime works around, each with how it was found: the
loop limit of Mesa's llvmpipe, the extra submit of wgpu-py's map for reading, device loss that
wgpu-py only logs."""
from __future__ import annotations

import logging
import weakref

import numpy as np
import wgpu

LOOP_PROBE = 70_000  # iterations of the loop that tells whether the driver limits loops


def loops_limited(adapter, device) -> bool:
    """Whether the driver ends the loops of a shader invocation early, silently: Mesa's llvmpipe
    did after 65,535 iterations in total (Debian 12's Mesa 22.3 does; Mesa 25.0 no longer
    does). Found once per device by running a loop of LOOP_PROBE iterations, on llvmpipe only."""
    if "llvmpipe" not in str(adapter.info.get("device", "")).lower():
        return False
    code = ("@group(0) @binding(0) var<storage, read_write> io: array<u32>;\n"
            "@compute @workgroup_size(1) fn main() {\n"
            "    let n = io[0];\n    var s = 0u;\n"
            "    loop { if s >= n { break; } s += 1u; }\n"
            "    io[1] = s;\n}\n")
    pipeline = device.create_compute_pipeline(
        label="wgpu_ad.loop_probe", layout="auto",
        compute={"module": device.create_shader_module(label="wgpu_ad.loop_probe", code=code), "entry_point": "main"})
    buf = device.create_buffer(label="wgpu_ad.loop_probe", size=16,
                               usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST)
    device.queue.write_buffer(buf, 0, np.array([LOOP_PROBE, 0], np.uint32))
    group = device.create_bind_group(layout=pipeline.get_bind_group_layout(0),
                                     entries=[{"binding": 0, "resource": {"buffer": buf, "offset": 0, "size": 16}}])
    enc = device.create_command_encoder()
    cpass = enc.begin_compute_pass()
    cpass.set_pipeline(pipeline)
    cpass.set_bind_group(0, group)
    cpass.dispatch_workgroups(1)
    cpass.end()
    device.queue.submit([enc.finish()])
    done = int(np.frombuffer(device.queue.read_buffer(buf, 0, 8), np.uint32)[1])
    buf.destroy()
    return done != LOOP_PROBE


_MAP_READ = ["READ_NOSYNC"]  # the map mode of read-backs; plain READ where wgpu-py lacks this one


def map_for_read(staging: wgpu.GPUBuffer, nbytes: int) -> None:
    """Map `staging` for reading once the copy just submitted into it has run. wgpu-py's
    map_sync(READ) first submits an empty command buffer (a workaround for buffers mapped before
    any submit used them, wgpu-native #305), every time, since unmap() forgets the last mode; our
    copy was submitted right before, so that second submit only costs a trip through the queue
    (lavapipe: ~0.3 ms of the README's gravity forward). "READ_NOSYNC" is the mode wgpu-py's own
    queue.read_buffer maps with; older wgpu-py versions reject the name, and then READ is used."""
    try:
        staging.map_sync(_MAP_READ[0], 0, nbytes)
    except (ValueError, KeyError, TypeError, AttributeError):
        if _MAP_READ[0] == wgpu.MapMode.READ:
            raise
        _MAP_READ[0] = wgpu.MapMode.READ
        staging.map_sync(wgpu.MapMode.READ, 0, nbytes)


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


_watcher = _LostWatcher()
logging.getLogger("wgpu").addHandler(_watcher)


def watch_device_loss(runtime) -> None:
    """Set runtime.lost to wgpu's message when its device is lost."""
    _watcher.runtimes.add(runtime)
