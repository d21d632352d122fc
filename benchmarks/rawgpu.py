"""Raw wgpu-py for the hand-written WGSL baselines: no wgpu_ad involved.

This is what a careful user writing WGSL by hand would do: constants baked into the shader text,
bind groups created once, all dispatches of one step recorded in one compute pass and submitted
together. The shaders live in benchmarks/wgsl/NAME.wgsl with {{VAR}} template variables.
"""
from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import wgpu

WGSL_DIR = Path(__file__).resolve().parent / "wgsl"
_VAR = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_USAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
UNIFORM_STRIDE = 256  # >= min-uniform-buffer-offset-alignment on every adapter
SUBMIT_EVERY = 256    # dispatches per submit: the device starts on a batch while the next is recorded


def load_wgsl(name: str, **values) -> str:
    """benchmarks/wgsl/NAME.wgsl with {{VAR}} replaced; a missing or unused value is an error."""
    path = WGSL_DIR / f"{name}.wgsl"
    text = path.read_text(encoding="utf-8")
    wanted = set(_VAR.findall(text))
    missing, unused = wanted - set(values), set(values) - wanted
    if missing or unused:
        raise KeyError(f"{path}: template variables missing {sorted(missing)}, unused {sorted(unused)}")
    return _VAR.sub(lambda m: str(values[m.group(1)]), text)


def f32_literal(v: float) -> str:
    """A WGSL f32 literal that round-trips (repr of the float32 value)."""
    return repr(float(np.float32(v))) + "f"


class RawGpu:
    """One wgpu device on the adapter wgpu_ad would pick (lavapipe here)."""

    def __init__(self):
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        if adapter is None:
            raise RuntimeError("no WebGPU adapter (wgpu.gpu.request_adapter_sync returned None)")
        self.adapter = adapter
        feats = [f for f in ("shader-float32-atomic",) if f in adapter.features]
        limits = {k: adapter.limits[k] for k in ("max-storage-buffer-binding-size", "max-buffer-size")}
        self.device = adapter.request_device_sync(required_features=feats, required_limits=limits)
        self.float_atomics = "shader-float32-atomic" in self.device.features
        self._fence = self.storage(nbytes=16)

    # ---- buffers ------------------------------------------------------------------------------
    def storage(self, data: np.ndarray | None = None, nbytes: int | None = None) -> wgpu.GPUBuffer:
        """A storage buffer holding `data` (or `nbytes` zero bytes)."""
        if data is not None:
            data = np.ascontiguousarray(data)
            nbytes = data.nbytes
        buf = self.device.create_buffer(size=max(16, (int(nbytes) + 3) // 4 * 4), usage=_USAGE)
        if data is not None and data.nbytes:
            self.device.queue.write_buffer(buf, 0, data)
        return buf

    def uniforms(self, rows: Sequence[Sequence]) -> wgpu.GPUBuffer:
        """One uniform block per row (4-byte words: int -> i32, float -> f32), UNIFORM_STRIDE apart."""
        raw = bytearray(UNIFORM_STRIDE * max(1, len(rows)))
        for k, row in enumerate(rows):
            fmt = "<" + "".join("i" if isinstance(v, int) else "f" for v in row)
            struct.pack_into(fmt, raw, k * UNIFORM_STRIDE, *row)
        buf = self.device.create_buffer(size=len(raw), usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
        self.device.queue.write_buffer(buf, 0, raw)
        return buf

    def read(self, buf: wgpu.GPUBuffer, dtype=np.float32, count: int | None = None) -> np.ndarray:
        nbytes = buf.size if count is None else count * np.dtype(dtype).itemsize
        return np.frombuffer(self.device.queue.read_buffer(buf, 0, nbytes), dtype=dtype).copy()

    def sync(self) -> None:
        """Wait until everything submitted has run (a 4-byte read-back waits for it)."""
        self.device.queue.read_buffer(self._fence, 0, 4)

    # ---- pipelines ----------------------------------------------------------------------------
    def kernels(self, name: str, layouts: dict[str, Sequence[str | None]], **values) -> dict[str, RawKernel]:
        """One compute pipeline per entry point of benchmarks/wgsl/NAME.wgsl. layouts[entry] gives
        the kind of each binding k it uses: 'uniform' (bound with a dynamic offset, so one bind
        group serves every row of uniforms()), 'storage' (read_write), 'read' (read-only storage),
        or None (unused by that entry point)."""
        dev = self.device
        module = dev.create_shader_module(label=name, code=load_wgsl(name, **values))
        out = {}
        for entry, kinds in layouts.items():
            entries = []
            for k, kind in enumerate(kinds):
                if kind is None:
                    continue
                buf = {"uniform": {"type": wgpu.BufferBindingType.uniform, "has_dynamic_offset": True},
                       "storage": {"type": wgpu.BufferBindingType.storage},
                       "read": {"type": wgpu.BufferBindingType.read_only_storage}}[kind]
                entries.append({"binding": k, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": buf})
            bgl = dev.create_bind_group_layout(entries=entries)
            pipeline = dev.create_compute_pipeline(layout=dev.create_pipeline_layout(bind_group_layouts=[bgl]),
                                                   compute={"module": module, "entry_point": entry})
            out[entry] = RawKernel(pipeline, bgl, tuple(kinds))
        return out

    def bind(self, kernel: RawKernel, *buffers) -> wgpu.GPUBindGroup:
        """The bind group of `kernel`: binding k gets buffers[k] (None where the kernel has none)."""
        entries = []
        for k, (kind, buf) in enumerate(zip(kernel.kinds, buffers)):
            if kind is None:
                continue
            size = 16 if kind == "uniform" else buf.size
            entries.append({"binding": k, "resource": {"buffer": buf, "offset": 0, "size": size}})
        return self.device.create_bind_group(layout=kernel.layout, entries=entries)

    def run(self, dispatches: Sequence[tuple], clears: Sequence[wgpu.GPUBuffer] = ()) -> None:
        """Clear `clears`, then record dispatches (kernel, bind group, workgroups[, uniform row])
        in compute passes of SUBMIT_EVERY dispatches, each submitted as soon as it is recorded
        (no wait), so the device runs one batch while the next is recorded."""
        for start in range(0, max(1, len(dispatches)), SUBMIT_EVERY):
            enc = self.device.create_command_encoder()
            if start == 0:
                for buf in clears:
                    enc.clear_buffer(buf)
            cpass = enc.begin_compute_pass()
            last = None
            for d in dispatches[start:start + SUBMIT_EVERY]:
                kernel, bg, groups = d[0], d[1], d[2]
                if kernel.pipeline is not last:
                    cpass.set_pipeline(kernel.pipeline)
                    last = kernel.pipeline
                if len(d) > 3:
                    cpass.set_bind_group(0, bg, [d[3] * UNIFORM_STRIDE])
                else:
                    cpass.set_bind_group(0, bg)
                cpass.dispatch_workgroups(groups)
            cpass.end()
            self.device.queue.submit([enc.finish()])


class RawKernel:
    __slots__ = ("kinds", "layout", "pipeline")

    def __init__(self, pipeline, layout, kinds: tuple):
        self.pipeline, self.layout, self.kinds = pipeline, layout, kinds
