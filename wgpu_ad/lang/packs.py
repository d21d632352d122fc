"""The launch side of packed bindings (codegen/packing.py): a task that would bind more storage
buffers than the device allows reads and writes some of them through one pack. Per launch, the
members' offsets go into their uniform words, each member is copied into the runtime's pack
buffer before the dispatch, and the members of a written pack are copied back after it: device
copies in the same batch as the dispatch, nothing read back to the host.
"""
from __future__ import annotations

from .. import plan
from ..errors import GpuError


class TaskPacks:
    """One launch's packs of one task: where each member goes, and the pack buffers."""

    __slots__ = ("copies", "written", "sizes")

    def __init__(self):
        self.copies: list[list[tuple]] = []  # per pack: (member's buffer, byte offset in the pack, bytes)
        self.written: list[bool] = []
        self.sizes: list[int] = []          # per pack: its bytes

    def copy_in(self, rt, kernel: str) -> tuple:
        """The pack buffers, with the members copied in (recorded in the batch, before the dispatch)."""
        out = []
        for k, (copies, size) in enumerate(zip(self.copies, self.sizes)):
            pack = rt.pack_buffer(k, size, kernel)
            for buf, off, n in copies:
                rt.copy(buf, pack, n, 0, off)
            out.append(pack)
        return tuple(out)

    def copy_out(self, rt, packs: tuple) -> None:
        """The written members copied back from their packs (after the dispatch)."""
        for pack, copies, written in zip(packs, self.copies, self.written):
            if written:
                for buf, off, n in copies:
                    rt.copy(pack, buf, n, off, 0)


class Packing:
    """A compiled kernel's packs (TaskPlan.packs), made ready for its launches."""

    def __init__(self, ck: plan.CompiledKernel):
        self.name = ck.name
        self.packs = [tp.packs for tp in ck.plan.tasks]
        # per task: its own buffer bindings (position, read_only), to find a storage bound twice
        self.direct = [[(b.key, b.read_only) for b in t.bindings if b.kind == "buffer"] for t in ck.tasks]

    def place(self, buffers: list, vals: list) -> list[TaskPacks | None]:
        """Per task, its packs for a launch with these buffers (None: it has none); the members'
        offsets are written into vals (the uniform words). A storage bound twice (an ndarray
        passed as two arguments, a gradient passed as a field) has one place in a pack."""
        out = []
        for n, packs in enumerate(self.packs):
            if not packs:
                out.append(None)
                continue
            tp = TaskPacks()
            for p in packs:
                at: dict[int, int] = {}
                copies, end = [], 0
                for key, word in zip(p.members, p.words):
                    buf = buffers[key]
                    off = at.get(id(buf))
                    if off is None:
                        off = at[id(buf)] = end
                        n_bytes = buf.size // 4 * 4
                        copies.append((buf, off, n_bytes))
                        end += (n_bytes + 15) // 16 * 16
                    vals[word] = off // 4
                tp.copies.append(copies)
                tp.written.append(p.written)
                tp.sizes.append(max(16, end))
            self._check_aliases(n, buffers, tp)
            out.append(tp)
        return out

    def _check_aliases(self, n: int, buffers: list, tp: TaskPacks) -> None:
        """A storage the task writes must have one place: in one pack, or bound on its own."""
        places: dict[int, set] = {}
        written: set[int] = set()
        for k, (copies, w) in enumerate(zip(tp.copies, tp.written)):
            for buf, _, _ in copies:
                places.setdefault(id(buf), set()).add(("pack", k))
                if w:
                    written.add(id(buf))
        for key, read_only in self.direct[n]:
            buf = buffers[key]
            if buf is not None:
                places.setdefault(id(buf), set()).add(("direct", key))
                if not read_only:
                    written.add(id(buf))
        for b in written:
            where = places[b]
            if len(where) > 1 and any(kind == "pack" for kind, _ in where):
                raise GpuError(f"kernel '{self.name}' binds more storage buffers than this adapter allows, so some of "
                               f"them are packed into one binding, but one storage it writes is passed to it twice "
                               f"(an ndarray as two arguments, or a gradient as a field): pass a copy as one of "
                               f"them, or split the kernel into kernels that each read and write fewer fields")
