"""Device memory copy bandwidth: the physical limit of the reduction (a sum reads every byte once,
as a copy reads it; a copy also writes it).

Each measurement copies nbytes from one buffer to another `copies` times in one batch with one wait
at the end (the wait's fixed cost spread over the copies), median of `reps` batches; the bandwidth
counts the bytes read and written: 2 * nbytes * copies / time. The driver asks the wgsl worker
(wgpu's copy_buffer_to_buffer on the adapter wgpu_ad uses) and the torch worker (Tensor.copy_ on
torch's device, CUDA when torch sees a GPU) after the reduction case; report.py prints each
system's reduction against the fastest copy measured.
"""
from __future__ import annotations

import statistics
import time


def _copies(nbytes: int) -> int:
    return max(4, min(64, (256 << 20) // max(nbytes, 1)))   # about 256 MB moved per batch


def _result(how: str, nbytes: int, copies: int, times: list[float]) -> dict:
    t = statistics.median(times)
    return {"how": how, "bytes": nbytes, "copies": copies, "s": t, "gb_s": 2.0 * nbytes * copies / t / 1e9}


def wgpu_copy(gpu, nbytes: int, reps: int) -> dict:
    """copy_buffer_to_buffer between two storage buffers of RawGpu `gpu`, read-back wait at the end."""
    a, b = gpu.storage(nbytes=nbytes), gpu.storage(nbytes=nbytes)
    copies, times = _copies(nbytes), []
    for r in range(reps + 1):
        t0 = time.perf_counter()
        enc = gpu.device.create_command_encoder()
        for k in range(copies):
            src, dst = (a, b) if k % 2 == 0 else (b, a)
            enc.copy_buffer_to_buffer(src, 0, dst, 0, nbytes)
        gpu.device.queue.submit([enc.finish()])
        gpu.sync()
        if r:  # the first batch is a warm-up
            times.append(time.perf_counter() - t0)
    a.destroy()
    b.destroy()
    info = gpu.adapter.info
    return _result(f"wgpu copy_buffer_to_buffer on {info.get('device', '?')}", nbytes, copies, times)


def torch_copy(tt, nbytes: int, reps: int) -> dict:
    """Tensor.copy_ between two float32 tensors on torch's device, synchronised at the end."""
    torch = tt.torch
    a = torch.ones(nbytes // 4, device=tt.device)
    b = torch.empty_like(a)
    copies, times = _copies(nbytes), []
    for r in range(reps + 1):
        t0 = time.perf_counter()
        for k in range(copies):
            (b.copy_(a) if k % 2 == 0 else a.copy_(b))
        tt.sync()
        if r:
            times.append(time.perf_counter() - t0)
    where = torch.cuda.get_device_name() if tt.device == "cuda" else "the CPU"
    return _result(f"torch Tensor.copy_ on {where}", nbytes, copies, times)
