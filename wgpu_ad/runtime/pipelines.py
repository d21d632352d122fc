"""Compute pipelines and bind groups for CompiledTasks, created once and cached.

The pipeline layout is explicit (layout 'auto' cannot declare dynamic uniform offsets): one bind
group (group 0) whose entries follow task.bindings.
"""
from __future__ import annotations

import re
from typing import Callable

import wgpu

from ..errors import GpuError
from ..plan import CompiledKernel, CompiledTask

WGPU_ERRORS = (wgpu.GPUError, wgpu.GPUPipelineError)
_WGSL_POS = re.compile(r"wgsl:(\d+):(\d+)")
_BIND_GROUP_CACHE_MAX = 256  # per task; stale entries keep dead buffers alive, so bound them


def args_block_size(arg_words: int) -> int:
    """Bytes bound for a kernel's uniform args: WGSL uniform blocks are 16-byte multiples."""
    return max(16, (arg_words * 4 + 15) // 16 * 16)


def wgsl_error(kernel: str, task: CompiledTask, e: Exception, what: str) -> GpuError:
    """A GpuError naming the kernel and task, and the offending WGSL line when wgpu gives one."""
    msg = str(e).strip()
    where = ""
    m = _WGSL_POS.search(msg)
    if m:
        line_no = int(m.group(1))
        lines = task.wgsl.splitlines()
        text = lines[line_no - 1].strip() if 0 < line_no <= len(lines) else ""
        where = f" at WGSL line {line_no}: {text}"
    return GpuError(f"kernel '{kernel}' (task '{task.name}'): WebGPU rejected the {what}{where}\n{msg}")


class TaskPipeline:
    """Everything one launch of a task needs, resolved once."""

    __slots__ = ("task", "pipeline", "layout", "args_size", "args_step", "bind_groups", "serial", "prints")

    def __init__(self, task: CompiledTask, pipeline, layout, args_size: int, args_step: int):
        self.task = task
        self.pipeline = pipeline
        self.layout = layout
        self.args_size = args_size      # 0 when the task binds no args
        self.args_step = args_step      # args_size rounded up to the dynamic-offset alignment
        self.bind_groups: dict = {}
        self.serial = task.serial
        self.prints = any(b.kind == "print" for b in task.bindings)  # binds the runtime's print buffer


class KernelPipelines:
    """The TaskPipelines of one CompiledKernel (kept with the kernel so its id stays valid)."""

    __slots__ = ("ck", "tasks")

    def __init__(self, ck: CompiledKernel, tasks: list[TaskPipeline]):
        self.ck = ck
        self.tasks = tasks


class PipelineCache:
    def __init__(self, device, uniform_alignment: int):
        self.device = device
        self.align = uniform_alignment
        self._by_source: dict[tuple[str, str], tuple] = {}   # (wgsl, entry) -> (pipeline, layout)
        self._kernels: dict[int, KernelPipelines] = {}

    def kernel(self, ck: CompiledKernel) -> KernelPipelines:
        kp = self._kernels.get(id(ck))
        if kp is None or kp.ck is not ck:
            kp = KernelPipelines(ck, [self._task(ck, t) for t in ck.tasks])
            self._kernels[id(ck)] = kp
        return kp

    def _task(self, ck: CompiledKernel, task: CompiledTask) -> TaskPipeline:
        key = (task.wgsl, task.entry_point)
        hit = self._by_source.get(key)
        if hit is None:
            hit = self._build(ck.name, task)
            self._by_source[key] = hit
        pipeline, layout = hit
        has_args = any(b.kind == "args" for b in task.bindings)
        size = args_block_size(ck.arg_words) if has_args else 0
        step = (size + self.align - 1) // self.align * self.align
        return TaskPipeline(task, pipeline, layout, size, step)

    def _build(self, kernel: str, task: CompiledTask) -> tuple:
        entries = []
        for b in task.bindings:
            if b.kind == "args":
                buf = {"type": wgpu.BufferBindingType.uniform, "has_dynamic_offset": True}
            elif b.kind == "buffer" and b.read_only:
                buf = {"type": wgpu.BufferBindingType.read_only_storage}
            elif b.kind in ("buffer", "error", "ret", "stack", "print"):
                buf = {"type": wgpu.BufferBindingType.storage}
            else:
                raise GpuError(f"kernel '{kernel}': unknown binding kind {b.kind!r} (compiler bug)")
            entries.append({"binding": b.binding, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": buf})
        dev = self.device
        try:
            module = dev.create_shader_module(label=task.name, code=task.wgsl)
        except WGPU_ERRORS as e:
            raise wgsl_error(kernel, task, e, "WGSL shader") from None
        try:
            layout = dev.create_bind_group_layout(label=task.name, entries=entries)
            pl = dev.create_pipeline_layout(label=task.name, bind_group_layouts=[layout])
            pipeline = dev.create_compute_pipeline(
                label=task.name, layout=pl, compute={"module": module, "entry_point": task.entry_point})
        except WGPU_ERRORS as e:
            raise wgsl_error(kernel, task, e, "compute pipeline") from None
        return pipeline, layout

    def bind_group(self, kernel: str, tp: TaskPipeline, key: tuple, resolve: Callable[[str, int], object]):
        """Create (and cache under `key`) the bind group; resolve(kind, key) gives each buffer."""
        entries, keep = [], []
        for b in tp.task.bindings:
            buf = resolve(b.kind, b.key)
            keep.append(buf)
            size = tp.args_size if b.kind == "args" else buf.size
            entries.append({"binding": b.binding, "resource": {"buffer": buf, "offset": 0, "size": size}})
        try:
            bg = self.device.create_bind_group(label=tp.task.name, layout=tp.layout, entries=entries)
        except WGPU_ERRORS as e:
            raise GpuError(f"kernel '{kernel}' (task '{tp.task.name}'): WebGPU rejected its buffers\n{e}") from None
        if len(tp.bind_groups) >= _BIND_GROUP_CACHE_MAX:
            tp.bind_groups.clear()
        tp.bind_groups[key] = (bg, keep)  # keep: the buffers stay alive, so their ids stay unique
        return bg

    def clear_bind_groups(self) -> None:
        for kp in self._kernels.values():
            for tp in kp.tasks:
                tp.bind_groups.clear()
