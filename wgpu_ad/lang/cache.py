"""The offline cache: compiled kernels on disk, so a second run of a script skips the compiler.

A kernel is still lowered by the frontend (that is how we learn what it is); its IR, made
canonical, is hashed with everything else that decides the compiler's output: the compiler's own
source, source locations, the device options. An entry holds the optimised IR and the
CompiledKernel, pickled with the live objects they name (fields, ndarrays, their gradients)
written as indices into the kernel's table of buffer sources, mapped back to this process's
objects on load. An adjoint's entry is keyed by its forward kernel's key, which gradients exist
and the stack size, so a hit skips reverse mode too.

Options (Taichi's names): ti.init(offline_cache=True, offline_cache_file_path=None). The folder
is offline_cache_file_path, else $WGPU_AD_CACHE_DIR, else $XDG_CACHE_HOME/wgpu_ad, else
~/.cache/wgpu_ad; WGPU_AD_OFFLINE_CACHE=0 turns the cache off. A bad entry or an unwritable
folder means a recompile (noted once in the 'wgpu_ad.cache' log), never an error.
"""
from __future__ import annotations

import copyreg
import hashlib
import io
import logging
import os
import pickle
import struct
import sys
import tempfile
import zlib
from pathlib import Path

from ..errors import debug_enabled
from ..ir.nodes import ArgSlot, Buffer, Kernel, Stmt, walk_task
from ..ir.printer import format_kernel
from ..runtime.compiled import CompiledKernel
from ..types import SCALAR_TYPES, DType

FORMAT = 1                  # bump when the entry layout changes
MAX_BYTES = 256 << 20       # the folder is pruned (oldest first) to 3/4 of this when it grows past it
_MAGIC = b"wgpu_ad kernel\n"
_HEADER = struct.Struct("<IQ")  # crc32 and length of the payload

# what happened in this process: tests and benchmarks read it
stats = {"hits": 0, "misses": 0, "writes": 0, "bad_entries": 0, "write_errors": 0}

_log = logging.getLogger("wgpu_ad.cache")
_noted: set[str] = set()
_digest: list[bytes] = []   # the compiler's own source, hashed once per process
_pruned: list[bool] = []
_DTYPES = {d.name: d for d in SCALAR_TYPES}


def _note(kind: str, msg: str) -> None:
    if kind not in _noted:
        _noted.add(kind)
        _log.warning("wgpu_ad offline cache: %s (the kernel is compiled instead)", msg)


def directory(rt) -> Path | None:
    """Where entries live, or None when the cache is off for this runtime."""
    if os.environ.get("WGPU_AD_OFFLINE_CACHE", "").strip().lower() in ("0", "false", "off", "no"):
        return None
    if not getattr(rt, "offline_cache", True):
        return None
    path = (getattr(rt, "offline_cache_file_path", None) or os.environ.get("WGPU_AD_CACHE_DIR")
            or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "wgpu_ad"))
    return Path(os.path.expanduser(str(path)))


def _printing(rt) -> bool:
    env = lambda v: os.environ.get(v, "") not in ("", "0")  # noqa: E731
    return bool(getattr(rt, "print_ir", False) or getattr(rt, "print_wgsl", False)
                or env("WGPU_AD_PRINT_IR") or env("WGPU_AD_PRINT_WGSL"))


def source_digest() -> bytes:
    """Hash of the wgpu_ad package's .py files and its .wgsl shaders: any compiler change misses."""
    if not _digest:
        pkg = Path(__file__).resolve().parent.parent
        files = sorted(pkg.rglob("*.py"))
        for shaders in (pkg.parent / "shaders", pkg / "shaders"):  # as codegen/shaders.py looks
            files += sorted(shaders.glob("*.wgsl"))
        h = hashlib.sha256()
        for f in files:
            h.update(f.relative_to(pkg.parent).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
        _digest.append(h.digest())
    return _digest[0]


def _canonical(ir: Kernel) -> str:
    """The kernel as text that does not depend on where in the process it was lowered: statement
    ids numbered in program order, and what the printer leaves out (source locations, which
    buffer / argument slot an access names, multi-indices, block_dim, loop_dims) appended."""
    stmts = [s for t in ir.tasks for s in walk_task(t)]
    saved = [s.id for s in stmts]
    canon = {}
    for k, s in enumerate(stmts):
        canon[id(s)] = -1 - k       # negative: never equal to a real id of a stray statement
    bufs = {id(b): k for k, b in enumerate(ir.buffers)}
    locs: dict = {}
    extra = []
    try:
        for s in stmts:
            s.id = canon[id(s)]
        text = format_kernel(ir)
        for s in stmts:
            a = s.attr
            ref = (bufs.get(id(a)) if isinstance(a, Buffer) else a.index if isinstance(a, ArgSlot)
                   else bufs.get(id(a[1])) if isinstance(a, tuple) and len(a) == 2 and isinstance(a[1], Buffer)
                   else None)
            loc = None if s.loc is None else locs.setdefault(s.loc, len(locs))
            index = None if s.index is None else tuple(
                ("s", canon.get(id(x))) if isinstance(x, Stmt) else x for x in s.index)
            extra.append((loc, ref, index))
    finally:
        for s, i in zip(stmts, saved):
            s.id = i
    tasks = {id(t): k for k, t in enumerate(ir.tasks)}
    dims = sorted((canon[id(k)], tasks.get(id(t), -1), d) for k, (t, d) in ir.loop_dims.items() if id(k) in canon)
    head = (ir.loc, [(b.name, b.dtype.name, b.grad, b.source if isinstance(b.source, tuple)
                      else type(b.source).__name__) for b in ir.buffers],
            [(a.name, a.dtype.name, a.index) for a in ir.args], [t.block_dim for t in ir.tasks],
            ir.debug, ir.uses_random, dims, len(ir.loop_dims) - len(dims))
    return "\n".join([text, repr(head), repr(list(locs)), repr(extra)])


class Slot:
    """Where one compiled kernel lives on disk: its key, and the live objects its entry names."""

    def __init__(self, folder: Path, key: str, sources: list):
        self.folder, self.key, self.sources = folder, key, sources

    @property
    def path(self) -> Path:
        return self.folder / f"{self.key}.wgk"

    def adjoint(self, have: tuple, stack: int, zero: tuple = (), fused: bool = False) -> "Slot":
        """The slot of this kernel's adjoint (with zero: a zero-store variant, see
        passes/autodiff/demote.py; fused: the forward and the adjoint in one kernel, see
        passes/autodiff/fuse.py): the gradients that exist now join the table."""
        table, pos = list(self.sources), {id(o): k for k, o in enumerate(self.sources)}
        for o in self.sources:
            g = getattr(o, "_grad", None)
            if g is not None and id(g) not in pos:
                pos[id(g)] = len(table)
                table.append(g)
        grads = [pos.get(id(getattr(o, "_grad", None))) for o in table]
        key = _hash(self.key, "adjoint", have, stack, grads, zero, *(("fused",) if fused else ()))
        return Slot(self.folder, key, table)

    # ---- reading --------------------------------------------------------------------------
    def load(self):
        """(optimised IR, CompiledKernel), or None on a miss or a bad entry."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except (FileNotFoundError, NotADirectoryError):
            stats["misses"] += 1
            return None
        except OSError as e:
            return self._bad(f"cannot read {self.path}: {e}")
        try:
            n = len(_MAGIC)
            crc, size = _HEADER.unpack_from(data, n)
            payload = memoryview(data)[n + _HEADER.size:]
            if data[:n] != _MAGIC or len(payload) != size or zlib.crc32(payload) != crc:
                return self._bad(f"{self.path} is truncated or corrupt")
            f = io.BytesIO(payload)
            ir = _Unpickler(f, self.sources).load()
            ck = _Unpickler(f, self.sources).load()  # a second pickle (its own memo)
            if not isinstance(ir, Kernel) or not isinstance(ck, CompiledKernel):
                return self._bad(f"{self.path} does not hold a kernel")
        except Exception as e:  # any damage an unpickler can report
            return self._bad(f"{self.path} cannot be loaded: {type(e).__name__}: {e}")
        ir.loop_dims = {s: (t, d) for s, t, d in ir.loop_dims}
        try:
            os.utime(self.path)  # pruning removes the least recently used entries
        except OSError:
            pass
        stats["hits"] += 1
        return ir, ck

    def _bad(self, msg: str):
        stats["bad_entries"] += 1
        stats["misses"] += 1
        _note("bad", msg)
        return None

    # ---- writing --------------------------------------------------------------------------
    def dump_ir(self, ir: Kernel) -> bytes | None:
        """The optimised IR as bytes (taken before launch-sized stacks are fixed in it)."""
        pos = {id(o): k for k, o in enumerate(self.sources)}
        stmts = _reachable(ir)
        saved = ir.loop_dims
        ir.loop_dims = [(s, t, d) for s, (t, d) in saved.items() if id(s) in stmts]
        try:
            return self._dumps(ir, pos)
        except Exception as e:  # RecursionError on a very deep IR, an object pickle refuses
            stats["write_errors"] += 1
            _note("pickle", f"kernel '{ir.name}' cannot be stored: {type(e).__name__}: {e}")
            return None
        finally:
            ir.loop_dims = saved

    def store(self, ir_bytes: bytes | None, ck: CompiledKernel) -> None:
        if ir_bytes is None:
            return
        try:
            payload = ir_bytes + self._dumps(ck, {id(o): k for k, o in enumerate(self.sources)})
        except Exception as e:
            stats["write_errors"] += 1
            _note("pickle", f"kernel '{ck.name}' cannot be stored: {type(e).__name__}: {e}")
            return
        data = _MAGIC + _HEADER.pack(zlib.crc32(payload), len(payload)) + payload
        tmp = None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tmp-", suffix=".wgk")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, self.path)  # atomic: readers see the old entry or the whole new one
            tmp = None
            stats["writes"] += 1
        except OSError as e:
            stats["write_errors"] += 1
            _note("write", f"cannot write to {self.folder}: {e}")
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        if not _pruned:
            _pruned.append(True)
            prune(self.folder)

    @staticmethod
    def _dumps(obj, pos: dict) -> bytes:
        """Pickle with fields / ndarrays written as _source(k) (k: index into the slot's table)
        and dtypes as _dtype(name). A dispatch table rather than persistent_id: that one is a
        Python call per object pickled, 8x slower on a large adjoint."""
        from .storage import Storage

        def source(o):
            k = pos.get(id(o))
            if k is None:
                raise pickle.PicklingError(f"{o._label()} is not among the kernel's buffers")
            return _source, (k,)
        table = dict(copyreg.dispatch_table)
        table[DType] = lambda d: (_dtype, (d.name,))
        todo = [Storage]
        while todo:
            cls = todo.pop()
            table[cls] = source
            todo.extend(cls.__subclasses__())
        buf = io.BytesIO()
        p = pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
        p.dispatch_table = table
        p.dump(obj)
        return buf.getvalue()


def _dtype(name: str) -> DType:
    return _DTYPES[name]


def _source(k: int):
    raise pickle.UnpicklingError("a kernel's buffer source is loaded by Slot.load only")


class _Unpickler(pickle.Unpickler):
    """Maps _source(k) to the k-th live object of the slot's table."""

    def __init__(self, f, sources: list):
        super().__init__(f)
        self.sources = sources

    def find_class(self, module, name):
        if module == __name__ and name == "_source":
            return self.sources.__getitem__
        return super().find_class(module, name)


def _reachable(ir: Kernel) -> dict:
    """id -> statement for every statement the IR can reach (blocks, operands, multi-indices)."""
    seen: dict = {}
    todo = [s for t in ir.tasks for s in walk_task(t)]
    todo += [x for t in ir.tasks for x in (t.begin, t.end) if x is not None]
    while todo:
        s = todo.pop()
        if id(s) in seen:
            continue
        seen[id(s)] = s
        todo.extend(s.args)
        if isinstance(s.attr, Stmt):
            todo.append(s.attr)
        if s.index is not None:
            todo.extend(x for x in s.index if isinstance(x, Stmt))
    return seen


def _hash(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else repr(p).encode())
        h.update(b"\0")
    return h.hexdigest()


def forward_slot(ir: Kernel, rt) -> Slot | None:
    """The slot of a kernel from its frontend IR, or None when the cache is off (or IR printing
    is on: a hit would print nothing)."""
    folder = directory(rt)
    if folder is None or _printing(rt):
        return None
    text = _canonical(ir)
    if " at 0x" in text:  # an attribute printed with its address: the key would never repeat
        return None
    sources, seen = [], set()
    for b in ir.buffers:
        if not isinstance(b.source, tuple) and id(b.source) not in seen:
            seen.add(id(b.source))
            sources.append(b.source)
    # what the passes and the code generator read besides the IR (min_parallel shapes the
    # frontend IR already; it is here so a key never depends on that)
    options = (bool(rt.debug), bool(rt.has_float_atomics), bool(rt.has_subgroups),
               rt.min_parallel, rt.grid_cap, debug_enabled())
    key = _hash(FORMAT, sys.version_info[:2], pickle.HIGHEST_PROTOCOL, source_digest(), options, text)
    return Slot(folder, key, sources)


def prune(folder: Path, limit: int = MAX_BYTES) -> int:
    """Remove the least recently used entries while the folder holds more than `limit` bytes
    (down to 3/4 of it); returns how many files were removed."""
    try:
        files = []
        for e in os.scandir(folder):
            if e.is_file():
                st = e.stat()
                files.append((st.st_mtime, st.st_size, e.path))
    except OSError:
        return 0
    total = sum(f[1] for f in files)
    if total <= limit:
        return 0
    removed = 0
    for _mtime, size, path in sorted(files):
        if total <= limit * 3 // 4:
            break
        try:
            os.unlink(path)
            total -= size
            removed += 1
        except OSError:
            pass
    return removed

