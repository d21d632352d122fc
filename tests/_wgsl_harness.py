"""Runs a CompiledKernel with raw wgpu-py, independent of wgpu_ad.runtime (codegen tests only).

Follows the binding contract of wgpu_ad/plan.py: group 0, the uniform argument block
bound with a dynamic offset, storage buffers by key, the error and return buffers.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pytest

from wgpu_ad import plan
from wgpu_ad.codegen import generate
from wgpu_ad.ir.builder import Builder
from wgpu_ad.ir.nodes import ArgSlot, Block, Buffer, Kernel, Task
from wgpu_ad.ir.ops import Op
from wgpu_ad.ir.verifier import verify
from wgpu_ad.plan import ERROR_WORDS, CompiledKernel
from wgpu_ad.types import i32, u32

ARGS_OFFSET = 256   # the argument block sits at a non-zero dynamic offset, as in the runtime


@lru_cache(maxsize=None)
def _device():
    import wgpu
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    if adapter is None:
        return None
    wanted = [f for f in ("shader-float32-atomic", "shader-f16", "subgroup") if f in adapter.features]
    limits = {k: adapter.limits[k] for k in ("max-storage-buffer-binding-size", "max-buffer-size",
                                              "max-compute-invocations-per-workgroup",
                                              "max-compute-workgroup-size-x")}
    return adapter.request_device_sync(required_features=wanted, required_limits=limits)


def device():
    dev = _device()
    if dev is None:
        pytest.skip("no WebGPU adapter found (wgpu.gpu.request_adapter_sync returned None)")
    return dev


def has_feature(name: str) -> bool:
    return name in device().features


@dataclass
class Result:
    buffers: list[np.ndarray]
    ret: np.ndarray | None      # the 4-byte return word as uint32
    error: np.ndarray | None    # the ERROR_WORDS error words, when a task binds them


def pack_args(values) -> np.ndarray:
    """One 4-byte word per argument: numpy scalars keep their type, int -> i32, float -> f32."""
    words = []
    for v in values:
        if isinstance(v, (bool, int)) and not isinstance(v, np.generic):
            v = np.int32(v)
        elif isinstance(v, float):
            v = np.float32(v)
        words.append(np.array([v]).view(np.uint32)[0])
    return np.array(words, dtype=np.uint32)


def run(ck: CompiledKernel, buffers=(), args=(), groups: int = 64) -> Result:
    """Dispatch every task of ck in order; `groups` workgroups for range tasks (any count works:
    the shader's loop is grid-stride). Returns the buffers read back."""
    import wgpu
    dev = device()
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
    arrays = [np.ascontiguousarray(a) for a in buffers]
    assert len(arrays) == len(ck.plan.buffers), "one array per kernel buffer"

    def storage(data: bytes):
        size = max(4, (len(data) + 3) // 4 * 4)
        buf = dev.create_buffer(size=size, usage=usage)
        if data:
            dev.queue.write_buffer(buf, 0, data + b"\0" * (size - len(data)))
        return buf

    gpu_bufs = [storage(a.tobytes()) for a in arrays]
    ret_buf = storage(b"\0" * 4)
    err_buf = storage(b"\0" * 4 * ERROR_WORDS)
    words = pack_args(args)
    assert len(words) == ck.arg_words, f"kernel takes {ck.arg_words} argument words, got {len(words)}"
    arg_size = max(16, len(words) * 4)
    uni = dev.create_buffer(size=ARGS_OFFSET + arg_size, usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
    if len(words):
        dev.queue.write_buffer(uni, ARGS_OFFSET, words.tobytes())

    enc = dev.create_command_encoder()
    used_err = False
    for task in ck.tasks:
        module = dev.create_shader_module(code=task.wgsl)
        entries, layout_entries, dyn = [], [], []
        for b in task.bindings:
            if b.kind == "args":
                kind = {"type": wgpu.BufferBindingType.uniform, "has_dynamic_offset": True}
                res = {"buffer": uni, "offset": 0, "size": arg_size}
                dyn.append(ARGS_OFFSET)
            else:
                ro = b.kind == "buffer" and b.read_only
                kind = {"type": wgpu.BufferBindingType.read_only_storage if ro else wgpu.BufferBindingType.storage}
                buf = {"buffer": gpu_bufs[b.key] if b.kind == "buffer" else None,
                       "ret": ret_buf, "error": err_buf}[b.kind]
                used_err |= b.kind == "error"
                res = {"buffer": buf, "offset": 0, "size": buf.size}
            layout_entries.append({"binding": b.binding, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": kind})
            entries.append({"binding": b.binding, "resource": res})
        bgl = dev.create_bind_group_layout(entries=layout_entries)
        pipeline = dev.create_compute_pipeline(
            layout=dev.create_pipeline_layout(bind_group_layouts=[bgl]),
            compute={"module": module, "entry_point": task.entry_point})
        bg = dev.create_bind_group(layout=bgl, entries=entries)
        cp = enc.begin_compute_pass()
        cp.set_pipeline(pipeline)
        cp.set_bind_group(0, bg, dyn)
        cp.dispatch_workgroups(1 if task.serial else groups)
        cp.end()
    dev.queue.submit([enc.finish()])

    out = [np.frombuffer(dev.queue.read_buffer(g)[: a.nbytes], dtype=a.dtype).reshape(a.shape).copy()
           for g, a in zip(gpu_bufs, arrays)]
    ret = np.frombuffer(dev.queue.read_buffer(ret_buf), dtype=np.uint32).copy() if ck.ret_dtype else None
    err = np.frombuffer(dev.queue.read_buffer(err_buf), dtype=np.uint32).copy() if used_err else None
    return Result(out, ret, err)


# ---------------------------------------------------------------- building kernels by hand

class KB:
    """A kernel under construction: buffers and argument slots, then tasks."""

    def __init__(self, name="k"):
        self.name, self.bufs, self.args, self.tasks = name, [], [], []

    def buf(self, name, dtype):
        b = Buffer(name, dtype, plan.Arg(len(self.bufs)))
        self.bufs.append(b)
        return b

    def seed(self):
        """The random seed's word (what the frontend adds to kernels that draw random numbers)."""
        a = ArgSlot("_seed", u32, len(self.args), plan.Seed())
        self.args.append(a)
        return a

    def arg(self, name, dtype):
        a = ArgSlot(name, dtype, len(self.args), plan.Scalar(len(self.args), dtype.name))
        self.args.append(a)
        return a

    def range(self, begin, end, block_dim=None):
        """A range task over [begin, end) (ints or ArgSlots); returns (body builder, i)."""
        t = Task("range", Block(), block_dim=block_dim, name=f"{self.name}_t{len(self.tasks)}")
        bb = Builder(t.bounds)
        t.begin, t.end = (bb.emit(Op.ARG, (), v.dtype, v) if isinstance(v, ArgSlot) else bb.const(v, i32)
                          for v in (begin, end))
        self.tasks.append(t)
        b = Builder(t.body)
        return b, b.loop_index(t, "i")

    def serial(self):
        t = Task("serial", Block())
        self.tasks.append(t)
        return Builder(t.body)

    def kernel(self, ret=None, check=True) -> Kernel:
        k = Kernel(self.name, self.tasks, self.args, self.bufs, ret=ret)
        if check:
            verify(k)
        return k


def load(b, buf, idx, name=None):
    return b.emit(Op.GLOBAL_LOAD, [idx], buf.dtype, buf, name=name)


def store(b, buf, idx, v):
    return b.emit(Op.GLOBAL_STORE, [idx, v], None, buf)


def atomic(b, kind, buf, idx, v, name=None):
    return b.emit(Op.ATOMIC, [idx, v], buf.dtype, (kind, buf), name=name)


def arg(b, slot):
    return b.emit(Op.ARG, (), slot.dtype, slot)


def compile_run(k, buffers, args=(), float_atomics=False, debug=False, groups=64, **kw):
    ck = generate(k, float_atomics=float_atomics, debug=debug, **kw)
    return ck, run(ck, buffers, args, groups)
