"""The print() buffer: what kernels print, written to sys.stdout after their launches.

A kernel that prints binds the runtime's print buffer (shaders/print.wgsl): three header words
([0] record words written, [1] lines asked for, [2] the most lines it holds) and the records, one
per line: the launch's tag, the index of the print() in the kernel (its plan.Print), the bits of
the values. A thread reserves its record with an atomic add, so its lines are in the buffer in
the order it printed them; lines of different threads are in the order they reached the buffer.

Launches are not waited for (batch.py), so the records are read at the next read-back: the
header comes back in the same copy as the data read (no extra wait), and only when something was
printed are the records read too. Each launch that prints gets a tag: its position in the list
of such launches since the last read-back, which names its kernel and its print() records.
Lines beyond the capacity are dropped on the GPU and counted; a note says how many, from which
kernel, and how to raise the capacity.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager

import numpy as np

from ..errors import WgpuAdError

HEADER = 3
MUTED = 0xFFFFFFFF   # the tag of a launch whose lines are not wanted (shaders/print.wgsl skips them)
DEFAULT_LINES = 16384
_MIN_RECORD_WORDS = 8  # the buffer holds `lines` records of at least this many words


class PrintBuffer:
    """The runtime's print buffer and the launches whose records it may hold."""

    def __init__(self, rt, lines: int = DEFAULT_LINES):
        if not (isinstance(lines, int) and not isinstance(lines, bool) and lines >= 1):
            raise WgpuAdError(f"ti.init(print_buffer_lines={lines!r}): expected a positive integer")
        self.rt = rt
        self.lines = lines
        self.buffer = None
        self.record_words = 0      # the longest record (in words) the buffer is sized for
        self.launches: list[tuple[str, tuple]] = []  # per tag: (kernel name, its plan.Print records)
        self.muted = 0             # > 0: launches print nothing (mute())

    def tag(self, kernel: str, prints: tuple, record_words: int) -> int:
        """The tag of a launch of `kernel` about to be recorded (its records' first word)."""
        if self.muted:
            return MUTED
        if self.buffer is None or record_words > self.record_words:
            self._allocate(record_words)
        self.launches.append((kernel, prints))
        return len(self.launches) - 1

    @contextmanager
    def mute(self):
        """Launches inside print nothing: kernels run again for a gradient (ad/checkpoint.py)."""
        self.muted += 1
        try:
            yield
        finally:
            self.muted -= 1

    def _allocate(self, record_words: int) -> None:
        if self.launches:
            self.rt.sync()  # the records in the old buffer are read first
        words = max(_MIN_RECORD_WORDS, record_words)
        nbytes = (HEADER + self.lines * words) * 4
        if nbytes > self.rt.max_scratch_bytes:
            raise WgpuAdError(f"ti.init(print_buffer_lines={self.lines}): a print buffer of {self.lines} lines of up to "
                              f"{words} words needs {nbytes} bytes, more than this adapter's largest storage binding "
                              f"({self.rt.max_scratch_bytes} bytes); ask for fewer lines")
        self.record_words = words
        self.buffer = self.rt.create_storage(nbytes, "wgpu_ad.print")
        self.rt.write(self.buffer, np.array([0, 0, self.lines], dtype=np.uint32))

    def collect(self, header: bytes) -> None:
        """After a read-back: `header` is the buffer's header as the launches left it. Reads the
        records, writes their lines to sys.stdout and resets the buffer for the next launches."""
        launches, self.launches = self.launches, []
        used, asked, capacity = (int(x) for x in np.frombuffer(header, dtype=np.uint32)[:HEADER])
        if not asked:
            return
        n = min(used, self.buffer.size // 4 - HEADER)
        words = np.frombuffer(self.rt.read(self.buffer, n * 4, HEADER * 4), dtype=np.uint32) if n else \
            np.zeros(0, np.uint32)
        self.rt.clear(self.buffer, 8)  # the counters; the capacity word stays
        out, last = decode(words, launches)
        dropped = asked - len(out)
        text = "".join(out)
        if dropped > 0:
            names = list(dict.fromkeys(name for name, _ in launches[last:]))
            who = f"kernel '{names[0]}'" if len(names) == 1 else \
                f"the kernels {', '.join(repr(n) for n in names)}"
            if text and not text.endswith("\n"):
                text += "\n"
            text += (f"... {dropped} more line{'s' if dropped != 1 else ''} printed by {who} "
                     f"{'were' if dropped != 1 else 'was'} dropped (the print buffer holds {capacity} lines "
                     f"between read-backs); raise it with ti.init(print_buffer_lines=...), or read back "
                     f"(ti.sync()) more often\n")
        if text:
            sys.stdout.write(text)


_VIEW = {"f32": np.float32, "f16": np.float32, "i32": np.int32, "u32": np.uint32}


def decode(words: np.ndarray, launches: list) -> tuple[list[str], int]:
    """The lines of the records in `words` (launches: per tag, the kernel name and its Print
    records), and the tag of the last record (0 if none)."""
    out, pos, last, n = [], 0, 0, len(words)
    while pos + 2 <= n:
        tag, k = int(words[pos]), int(words[pos + 1])
        if tag >= len(launches) or k >= len(launches[tag][1]):
            break  # cannot happen unless a record was torn: stop rather than print garbage
        rec = launches[tag][1][k]
        kinds = rec.values
        if pos + 2 + len(kinds) > n:
            break
        bits = words[pos + 2: pos + 2 + len(kinds)]
        vals = [bool(b) if v.dtype == "u1" else bits[j: j + 1].view(_VIEW[v.dtype])[0].item()
                for j, (b, v) in enumerate(zip(bits, kinds))]
        out.append(rec.format(vals))
        pos += 2 + len(kinds)
        last = tag
    return out, last
