"""Packed bindings: how a task that would bind more storage buffers than the device allows
(CompileOptions.max_storage_buffers; lavapipe 32, a browser 8 to 10) still runs.

Some of its buffers are read and written through one binding, a pack: element k of member m is
element `offset_m + k` of the pack, offset_m a uniform word (plan.PackOffset) that the launcher
sets from the sizes of the members in each launch (lang/packs.py), copying the members into the
runtime's pack buffer before the dispatch and the written ones back after it, in the same batch.
Members of a pack share the WGSL element type and access (read-only, read-write, atomic<u32> of
emulated float atomics ...), so the code indexes them as the one array they were before. Packed
buffers are never read through vec2 / vec4 views (vectors.py): their offsets are not aligned.

Only what is needed is packed: the fewest, smallest buffers (each launch copies them), read-only
groups first (they are not copied back). Where no packing fits, the task stays as it was and the
launcher's clear error names the kernel, the count, the limit and the fix (lang/launch.py
binding_limit_error).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .. import plan
from ..ir.nodes import ArgSlot, Buffer, Kernel, Task
from ..types import f32, i32, u32
from .common import BufferUse, Options, buffer_uses

_SCALARS = (f32, i32, u32)  # 4-byte scalars: copies of them are whole words


@dataclass
class Pack:
    """Buffers of one task bound as one array: `elem` its WGSL element type, `written` whether the
    task writes it (read_write access), `words` the ArgSlot of each member's offset."""
    members: list[Buffer]
    elem: str
    written: bool
    words: list[ArgSlot] = field(default_factory=list)


def _elem(buf: Buffer, use: BufferUse, opts: Options) -> str | None:
    """The WGSL element type a buffer is bound as, or None when it cannot be packed."""
    if buf.dtype not in _SCALARS:
        return None
    mode = use.mode(buf, opts)
    return {"plain": buf.dtype.wgsl, "atomic": f"atomic<{buf.dtype.wgsl}>", "cas": "atomic<u32>"}[mode]


def choose_packs(kernel: Kernel, task: Task, index: int, opts: Options, bindings: list) -> list[Pack]:
    """The packs that bring the task's storage bindings (`bindings`, its BindingSpecs without
    packs: its buffers and the runtime's, error, stack ...) within opts.max_storage_buffers; none
    when it fits or when no packing can make it fit. Each member's offset gets a uniform word."""
    limit = opts.max_storage_buffers
    over = sum(b.kind not in ("args", "pack") for b in bindings) - (limit or 0)
    if limit is None or over <= 0:
        return []
    uses = buffer_uses(task)
    bound = [b for b in kernel.buffers if id(b) in uses]
    groups: dict[tuple[str, bool], list[Buffer]] = {}
    for b in bound:
        elem = _elem(b, uses[id(b)], opts)
        if elem is not None:
            written = uses[id(b)].stores > 0 or bool(uses[id(b)].atomics)
            groups.setdefault((elem, written), []).append(b)
    # read-only groups first, then the largest: each pack of n buffers saves n - 1 bindings
    order = sorted(groups.items(), key=lambda kv: (kv[0][1], -len(kv[1])))
    packs = []
    for (elem, written), members in order:
        if over <= 0:
            break
        if len(members) < 2:
            continue
        members = sorted(members, key=_size_hint)[:over + 1]  # the smallest: they are copied each launch
        packs.append(Pack(members, elem, written))
        over -= len(members) - 1
    if over > 0:
        return []  # nothing fits: the launcher's binding-limit error says so
    for j, p in enumerate(packs):
        for m, b in enumerate(p.members):
            slot = ArgSlot(f"{b.name}_at", u32, len(kernel.args), plan.PackOffset(index, j, m))
            kernel.args.append(slot)
            p.words.append(slot)
    return packs


def _size_hint(b: Buffer) -> int:
    """Scalars of a buffer when its shape is known at compile time (fields); ndarrays and
    gradients (shape unknown here) after them."""
    if b.shape is None:
        return 1 << 62
    n = b.vector
    for e in b.shape:
        n *= e
    return n


def plan_packs(kernel: Kernel, packs: list[Pack]) -> tuple:
    """The plan.Pack records of a task's packs (TaskPlan.packs)."""
    pos = {id(b): k for k, b in enumerate(kernel.buffers)}
    return tuple(plan.Pack(members=tuple(pos[id(b)] for b in p.members), words=tuple(a.index for a in p.words),
                           written=p.written) for p in packs)
