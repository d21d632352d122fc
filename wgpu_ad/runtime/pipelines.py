"""Compute pipelines and bind groups for CompiledTasks, created once and cached.

The pipeline layout is explicit (layout 'auto' cannot declare dynamic uniform offsets): one bind
group (group 0) whose entries follow task.bindings.

The caches follow Python's lifetimes (issue 25): a kernel's pipelines live while its CompiledKernel
does (held weakly, found by id and checked to be the same object), a pipeline while a kernel uses it
or it is among the 64 latest used, and a cached bind group while every buffer it binds does. A bind
group holds its buffers on the device, so it must not outlive them; and its key is the ids of its
buffers, which a later buffer may reuse. So each buffer a cached bind group binds is watched
(weakref.finalize): its death is noted, and the bind groups that bind it are dropped before the next
lookup (purge()).
"""
from __future__ import annotations

import collections
import re
import weakref
from typing import Callable

import wgpu

from ..errors import GpuError
from ..plan import CompiledKernel, CompiledTask

WGPU_ERRORS = (wgpu.GPUError, wgpu.GPUPipelineError)
_WGSL_POS = re.compile(r"wgsl:(\d+):(\d+)")
_BIND_GROUP_CACHE_MAX = 256  # per task: bind groups of live buffers that are no longer used
_RECENT_PIPELINES = 64       # pipelines kept after their kernels are gone (PipelineCache._recent)


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
    """The TaskPipelines of one CompiledKernel (held weakly: `ck()` is None once it is gone)."""

    __slots__ = ("ck", "tasks", "built")

    def __init__(self, ck: CompiledKernel, tasks: list[TaskPipeline], built: list):
        self.ck = weakref.ref(ck)
        self.tasks = tasks
        self.built = built  # the _Built of each task: the pipelines live while a kernel uses them


class _Built:
    """A pipeline and its bind group layout, shared by the tasks with the same WGSL."""

    __slots__ = ("pipeline", "layout", "__weakref__")

    def __init__(self, pipeline, layout):
        self.pipeline, self.layout = pipeline, layout


class PipelineCache:
    def __init__(self, device, uniform_alignment: int):
        self.device = device
        self.align = uniform_alignment
        # (wgsl, entry) -> _Built, while a kernel's pipelines hold it; the latest ones built or
        # found are also held here, so that a kernel made again (a notebook cell run again, a
        # kernel defined in a loop) finds its pipelines without the driver compiling them again
        self._by_source: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._recent: collections.OrderedDict = collections.OrderedDict()
        self._kernels: dict[int, KernelPipelines] = {}
        self._users: dict[int, set] = {}  # id(buffer) -> {(TaskPipeline, key)} of the cached bind groups binding it
        # ids of watched buffers and of CompiledKernels that are gone (appended by finalizers, which
        # may run at any allocation): purge() drops what they held before the next lookup
        self.dead: list = []
        self.dead_kernels: list = []

    def kernel(self, ck: CompiledKernel) -> KernelPipelines:
        kp = self._kernels.get(id(ck))
        if kp is None or kp.ck() is not ck:
            if self.dead_kernels:
                self.purge()
            built = [self._built(ck.name, t) for t in ck.tasks]
            kp = KernelPipelines(ck, [self._task(ck, t, b) for t, b in zip(ck.tasks, built)], built)
            self._kernels[id(ck)] = kp
            weakref.finalize(ck, self.dead_kernels.append, id(ck))
        return kp

    def _built(self, kernel: str, task: CompiledTask) -> _Built:
        key = (task.wgsl, task.entry_point)
        hit = self._by_source.get(key)
        if hit is None:
            hit = _Built(*self._build(kernel, task))
            self._by_source[key] = hit
        self._recent[key] = hit
        self._recent.move_to_end(key)
        if len(self._recent) > _RECENT_PIPELINES:
            self._recent.popitem(last=False)
        return hit

    def _task(self, ck: CompiledKernel, task: CompiledTask, built: _Built) -> TaskPipeline:
        has_args = any(b.kind in ("args", "args_storage") for b in task.bindings)
        size = args_block_size(ck.arg_words) if has_args else 0
        step = (size + self.align - 1) // self.align * self.align
        return TaskPipeline(task, built.pipeline, built.layout, size, step)

    def _build(self, kernel: str, task: CompiledTask) -> tuple:
        entries = []
        for b in task.bindings:
            if b.kind == "args":
                buf = {"type": wgpu.BufferBindingType.uniform, "has_dynamic_offset": True}
            elif b.kind == "args_storage":  # (more words than a uniform binding holds)
                buf = {"type": wgpu.BufferBindingType.read_only_storage, "has_dynamic_offset": True}
            elif b.kind in ("buffer", "pack") and b.read_only:
                buf = {"type": wgpu.BufferBindingType.read_only_storage}
            elif b.kind in ("buffer", "pack", "error", "ret", "stack", "print"):
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
        entries, bufs = [], []
        for b in tp.task.bindings:
            buf = resolve(b.kind, b.key)
            bufs.append(buf)
            size = tp.args_size if b.kind in ("args", "args_storage") else buf.size
            entries.append({"binding": b.binding, "resource": {"buffer": buf, "offset": 0, "size": size}})
        try:
            bg = self.device.create_bind_group(label=tp.task.name, layout=tp.layout, entries=entries)
        except WGPU_ERRORS as e:
            raise GpuError(f"kernel '{kernel}' (task '{tp.task.name}'): WebGPU rejected its buffers\n{e}") from None
        if len(tp.bind_groups) >= _BIND_GROUP_CACHE_MAX:
            for old in list(tp.bind_groups):
                self._drop(tp, old)
        ids = []
        for buf in bufs:
            users = self._users.get(id(buf))
            if users is None:
                users = self._users[id(buf)] = set()
                weakref.finalize(buf, self.dead.append, id(buf))
            users.add((tp, key))
            ids.append(id(buf))
        tp.bind_groups[key] = (bg, ids)
        return bg

    def _drop(self, tp: TaskPipeline, key: tuple) -> None:
        hit = tp.bind_groups.pop(key, None)
        for i in hit[1] if hit is not None else ():
            users = self._users.get(i)
            if users is not None:
                users.discard((tp, key))

    def purge(self) -> None:
        """Drop the bind groups of buffers that are gone, and the pipelines of kernels that are."""
        while self.dead:
            for tp, key in self._users.pop(self.dead.pop(), ()):
                self._drop(tp, key)
        while self.dead_kernels:
            i = self.dead_kernels.pop()
            kp = self._kernels.get(i)
            if kp is not None and kp.ck() is None:
                del self._kernels[i]
                for tp in kp.tasks:
                    for key in list(tp.bind_groups):
                        self._drop(tp, key)

    def clear_bind_groups(self) -> None:
        for kp in self._kernels.values():
            for tp in kp.tasks:
                for key in list(tp.bind_groups):
                    self._drop(tp, key)

    def counts(self) -> dict:
        """What the cache holds (ti.runtime_stats())."""
        return {"kernels": len(self._kernels), "pipelines": len(self._by_source),
                "bind_groups": sum(len(tp.bind_groups) for kp in self._kernels.values() for tp in kp.tasks)}
