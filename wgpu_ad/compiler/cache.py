"""The offline cache: compiled kernels on disk, so a second run of a script skips the compiler.

A kernel is still lowered by the frontend (that is how we learn what it is); its IR, made
canonical, is hashed with everything else that decides the compiler's output: the compiler's own
source, source locations, the compile options. An entry holds the CompiledKernel: WGSL and its
launch plan (wgpu_ad/plan.py), plain data that names fields only by their position in the
kernel's storage table, so it pickles as it is and no IR is stored. An adjoint's entry is keyed
by its forward kernel's key and where each gradient comes from, so a hit skips reverse mode too;
a dual kernel's (forward mode) likewise by where each dual comes from.

Options (Taichi's names): ti.init(offline_cache=True, offline_cache_file_path=None). The folder
is offline_cache_file_path, else $WGPU_AD_CACHE_DIR, else $XDG_CACHE_HOME/wgpu_ad, else
~/.cache/wgpu_ad; WGPU_AD_OFFLINE_CACHE=0 turns the cache off. A bad entry or an unwritable
folder means a recompile (noted once in the 'wgpu_ad.cache' log), never an error.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
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
from ..plan import CompiledKernel
from .options import CompileOptions

FORMAT = 2                  # bump when the entry layout changes
MAX_BYTES = 256 << 20       # the folder is pruned (oldest first) to 3/4 of this when it grows past it
_MAGIC = b"wgpu_ad kernel\n"
_HEADER = struct.Struct("<IQ")  # crc32 and length of the payload

_log = logging.getLogger("wgpu_ad.cache")


class Record:
    """What the offline cache did in this process: its counts (stats: tests and benchmarks read
    them), the kinds of trouble already logged (each is logged once), and whether the folder was
    pruned (once, at the first write)."""

    def __init__(self) -> None:
        self.stats = {"hits": 0, "misses": 0, "writes": 0, "bad_entries": 0, "write_errors": 0}
        self.noted: set[str] = set()
        self.pruned = False

    def note(self, kind: str, msg: str) -> None:
        if kind not in self.noted:
            self.noted.add(kind)
            _log.warning("wgpu_ad offline cache: %s (the kernel is compiled instead)", msg)


record = Record()


def directory(opts: CompileOptions) -> Path | None:
    """Where entries live, or None when the cache is off."""
    if os.environ.get("WGPU_AD_OFFLINE_CACHE", "").strip().lower() in ("0", "false", "off", "no"):
        return None
    if not opts.offline_cache:
        return None
    path = (opts.offline_cache_file_path or os.environ.get("WGPU_AD_CACHE_DIR")
            or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "wgpu_ad"))
    return Path(os.path.expanduser(str(path)))


@functools.cache
def source_digest() -> bytes:
    """Hash of the wgpu_ad package's .py files and its shaders (the .wgsl files and their loader):
    any compiler change misses. Hashed once per process."""
    pkg = Path(__file__).resolve().parent.parent
    files = sorted(pkg.rglob("*.py"))
    for shaders in (pkg.parent / "shaders", pkg / "shaders"):  # a checkout, an installed copy
        files += sorted(shaders.glob("*.wgsl")) + sorted(shaders.glob("*.py"))
    files = sorted(set(files))
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(pkg.parent).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.digest()


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
    head = (ir.loc, [(b.name, b.dtype.name, b.grad, b.source, b.vector) for b in ir.buffers],
            [(a.name, a.dtype.name, a.index, a.role) for a in ir.args], [t.block_dim for t in ir.tasks],
            ir.debug, ir.uses_random, dims, len(ir.loop_dims) - len(dims), sorted(map(repr, ir.no_grad)))
    return "\n".join([text, repr(head), repr(list(locs)), repr(extra)])


def _missing_fields(obj, where: str = "CompiledKernel", depth: int = 3) -> list[str]:
    """The dataclass fields an unpickled record (and the records it holds) lacks: pickle restores
    what was stored, and an entry of an older wgpu_ad may miss a field added since."""
    if depth == 0 or not dataclasses.is_dataclass(obj):
        return []
    out = []
    for f in dataclasses.fields(obj):
        if f.name not in obj.__dict__:
            out.append(f"{where}.{f.name}")
            continue
        value = obj.__dict__[f.name]
        items = value if isinstance(value, (list, tuple)) else [value]
        for v in items:
            out += _missing_fields(v, f"{where}.{f.name}", depth - 1)
    return sorted(set(out))


class Slot:
    """Where one compiled kernel lives on disk."""

    def __init__(self, folder: Path, key: str):
        self.folder, self.key = folder, key

    @property
    def path(self) -> Path:
        return self.folder / f"{self.key}.wgk"

    def adjoint(self, grads: tuple, zero: tuple = (), fused: bool = False, check_nan: bool = False) -> "Slot":
        """The slot of this kernel's adjoint: grads, the gradient source of each forward buffer
        (plan records or None); zero: a zero-store variant (passes/autodiff/demote.py); fused:
        the forward and the adjoint in one kernel (passes/autodiff/fuse.py); check_nan: with the
        NaN checks (the forward's options may not have them: a tape's check_nan=True)."""
        return Slot(self.folder, _hash(self.key, "adjoint", grads, zero, *(("fused",) if fused else ()),
                                       *(("check_nan",) if check_nan else ())))

    def dual(self, duals: tuple) -> "Slot":
        """The slot of this kernel's dual kernel (forward mode): duals, the dual source of each
        forward buffer (plan records or None)."""
        return Slot(self.folder, _hash(self.key, "dual", duals))

    def checked(self) -> "Slot":
        """The slot of this kernel's checked forward variant (passes/autodiff/shadow.py)."""
        return Slot(self.folder, _hash(self.key, "checked"))

    def load(self) -> CompiledKernel | None:
        """The stored CompiledKernel, or None on a miss or a bad entry."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except (FileNotFoundError, NotADirectoryError):
            record.stats["misses"] += 1
            return None
        except OSError as e:
            return self._bad(f"cannot read {self.path}: {e}")
        try:
            n = len(_MAGIC)
            crc, size = _HEADER.unpack_from(data, n)
            payload = memoryview(data)[n + _HEADER.size:]
            if data[:n] != _MAGIC or len(payload) != size or zlib.crc32(payload) != crc:
                return self._bad(f"{self.path} is truncated or corrupt")
            entry = pickle.loads(payload)
            if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], CompiledKernel)):
                return self._bad(f"{self.path} does not hold a kernel")
            key, ck = entry
            if key != self.key:  # (a file copied or renamed by hand)
                return self._bad(f"{self.path} holds the kernel of another key ({key})")
            missing = _missing_fields(ck)
            if missing:  # written by another version of wgpu_ad: recompiled, not run half-read
                return self._bad(f"{self.path} lacks {', '.join(missing)} (written by another version)")
        except Exception as e:  # any damage an unpickler can report
            return self._bad(f"{self.path} cannot be loaded: {type(e).__name__}: {e}")
        try:
            os.utime(self.path)  # pruning removes the least recently used entries
        except OSError:
            pass
        record.stats["hits"] += 1
        return ck

    def _bad(self, msg: str):
        record.stats["bad_entries"] += 1
        record.stats["misses"] += 1
        record.note("bad", msg)
        return None

    def store(self, ck: CompiledKernel, update: bool = False) -> None:
        """Write the entry; `update`: it is there already and gains what was analysed since (a
        forward kernel's access checks, compiler/driver.py), not counted as a write again."""
        try:
            payload = pickle.dumps((self.key, ck), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            record.stats["write_errors"] += 1
            record.note("pickle", f"kernel '{ck.name}' cannot be stored: {type(e).__name__}: {e}")
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
            if not update:
                record.stats["writes"] += 1
        except OSError as e:
            if not update:  # (an entry is counted once)
                record.stats["write_errors"] += 1
            record.note("write", f"cannot write to {self.folder}: {e}")
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        if not record.pruned:
            record.pruned = True
            prune(self.folder)


def _hash(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else repr(p).encode())
        h.update(b"\0")
    return h.hexdigest()


def forward_slot(ir: Kernel, opts: CompileOptions) -> Slot | None:
    """The slot of a kernel from its frontend IR, or None when the cache is off (or printing is
    on: a hit would print nothing)."""
    folder = directory(opts)
    if folder is None or opts.printing:
        return None
    text = _canonical(ir)
    if " at 0x" in text:  # an attribute printed with its address: the key would never repeat
        return None
    key = _hash(FORMAT, sys.version_info[:2], pickle.HIGHEST_PROTOCOL, source_digest(), opts.key(),
                debug_enabled(), text)
    return Slot(folder, key)


def prune(folder: Path, limit: int = MAX_BYTES) -> int:
    """Remove the least recently used entries while the folder holds more than `limit` bytes
    (down to 3/4 of it); returns how many files were removed."""
    try:
        files = []
        for e in os.scandir(folder):
            # (a .tmp- file is another process's entry being written: os.replace will publish it)
            if e.is_file() and not e.name.startswith(".tmp-"):
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

