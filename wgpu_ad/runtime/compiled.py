"""What the compiler hands the runtime: plain data, no IR.

One CompiledTask is one WGSL compute shader with a single entry point. Bindings are all in
group 0. The runtime binds, for each BindingSpec:
  kind 'args'   : the launch's uniform block (4-byte words, CompiledKernel.arg_words of them),
                  bound with a dynamic offset so many launches share one uniform buffer;
  kind 'buffer' : the storage buffer of the launch's buffer list at position key (the launcher
                  resolves plan.buffers[key]);
  kind 'error'  : the runtime's error buffer (array<atomic<u32>>, ERROR_WORDS words);
  kind 'ret'    : the kernel's return-value buffer (one 4-byte word);
  kind 'stack'  : the runtime's scratch buffer for autodiff stacks: the launch says how many
                  u32 words per thread (thread = global invocation index; serial tasks use one);
  kind 'print'  : the runtime's print buffer (array<atomic<u32>>, runtime/printing.py).

CompiledKernel.plan (wgpu_ad/plan.py) is the launcher's part: what each uniform word and buffer
is, and how to size each task's grid.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# error buffer layout: [0] = 1 + index of the failed assert (0 = no error), [1..] = its values' bits;
# then one more word, LOOP_LIMIT_WORD, set by kernels whose loops the driver stopped early
# (CompiledKernel.loop_check; checked at the next read-back, runtime/transfers.py)
ERROR_WORDS = 16
LOOP_LIMIT_WORD = ERROR_WORDS


@dataclass(frozen=True)
class BindingSpec:
    binding: int
    kind: str            # 'args' | 'buffer' | 'error' | 'ret' | 'stack' | 'print'
    key: int = -1        # for 'buffer': index into the launch's buffers (plan.buffers)
    read_only: bool = False


@dataclass
class CompiledTask:
    name: str
    wgsl: str
    entry_point: str
    workgroup_size: int
    bindings: list[BindingSpec]
    serial: bool         # True: dispatch exactly one workgroup (the shader runs on thread 0 only)
    loc: Any = None      # errors.SourceLoc of the user's loop it runs (its first statement), for messages

    def storage_buffers(self) -> tuple[int, int]:
        """(storage buffers it binds, how many of them are the runtime's own: error, stack ...)"""
        own = sum(b.kind not in ("args", "buffer") for b in self.bindings)
        return sum(b.kind != "args" for b in self.bindings), own


@dataclass
class CompiledKernel:
    name: str
    tasks: list[CompiledTask]
    arg_words: int                                           # uniform block size in 4-byte words
    plan: Any = None                                         # plan.LaunchPlan
    ret_dtype: Any = None                                    # types.DType or None
    # ASSERT i failed -> message template (with {} per value) and the dtypes of its values
    asserts: list[tuple[str, list[Any]]] = field(default_factory=list)
    loop_check: bool = False  # its loops report an early stop (by the driver) in LOOP_LIMIT_WORD
    # per entry of asserts: 'assert' (the user's assert statement) or 'stack' (autodiff stack overflow)
    assert_kinds: list[str] = field(default_factory=list)
