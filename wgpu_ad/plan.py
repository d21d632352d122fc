"""The contract between the compiler and the runtime, as plain typed records: what a compiled
kernel is (CompiledKernel, its CompiledTasks and their BindingSpecs: what the runtime binds and
dispatches) and its launch plan (LaunchPlan: what the launcher packs and sizes). The compiler
(codegen/, compiler/) writes them and the runtime and the launcher (runtime/, lang/launch.py)
read them; both import this module and neither imports the other for it.

Bindings are all in group 0. The runtime binds, for each BindingSpec:
  kind 'args'   : the launch's uniform block (4-byte words, CompiledKernel.arg_words of them),
                  bound with a dynamic offset so many launches share one uniform buffer;
  kind 'args_storage': the same words in a read-only storage binding of that buffer, for
                  kernels with more than UNIFORM_ARG_WORDS of them;
  kind 'buffer' : the storage buffer of the launch's buffer list at position key (the launcher
                  resolves plan.buffers[key]);
  kind 'error'  : the runtime's error buffer (array<atomic<u32>>, ERROR_WORDS words);
  kind 'ret'    : the kernel's return-value buffer (one 4-byte word);
  kind 'stack'  : the runtime's scratch buffer for autodiff stacks: the launch says how many
                  u32 words per thread (thread = global invocation index; serial tasks use one);
  kind 'print'  : the runtime's print buffer (array<atomic<u32>>, runtime/printing.py);
  kind 'pack'   : pack `key` of the task (TaskPlan.packs): a scratch buffer of the runtime into
                  which the launcher copies several of the launch's buffers before the dispatch
                  (and from which it copies the written ones back after it), for a task that
                  would otherwise bind more storage buffers than the device allows.

The launch plan: the compiler (codegen/plan.py) writes one LaunchPlan per compiled kernel; the
launcher (lang/launch.py) reads it and nothing else: per word of the uniform block what value it
carries, per buffer where the storage comes from, per task how many threads it needs. Nothing here
names the IR, a live object or a generated identifier, so a plan pickles into the offline cache as
it is and the launcher never parses a name or evaluates a statement.

Expressions (grid sizes, stack depths) are small trees over the words of the uniform block:
`("const", v)`, `("word", w)` or `(op, dtype, *operands)` with `op` one of EXPR_OPS, all on 32-bit
integers with the IR's semantics (ir/semantics.py; a test checks they agree). The compiler only
writes expressions it can translate exactly; anything else (bounds read from fields, float math)
is None, and the launcher falls back to a fixed grid and the shader's grid-stride loop.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np


# ---- the compiled kernel -------------------------------------------------------------------------

# error buffer layout: [0] = 1 + index of the failed assert (0 = no error), [1..] = its values' bits;
# then one more word, LOOP_LIMIT_WORD, set by kernels whose loops the driver stopped early
# (CompiledKernel.loop_check; checked at the next read-back, runtime/transfers.py)
ERROR_WORDS = 16
# the most argument words a uniform binding holds on every WebGPU device (64 KiB, WebGPU's default
# max-uniform-buffer-binding-size); a kernel with more reads them from a storage binding instead
UNIFORM_ARG_WORDS = 16384
LOOP_LIMIT_WORD = ERROR_WORDS


@dataclass(frozen=True)
class BindingSpec:
    binding: int
    kind: str            # 'args' | 'args_storage' | 'buffer' | 'error' | 'ret' | 'stack' | 'print' | 'pack'
    key: int = -1        # for 'buffer': index into the launch's buffers (plan.buffers); 'pack': into TaskPlan.packs
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
        own = sum(b.kind not in ("args", "buffer", "pack") for b in self.bindings)
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


def bound_buffers(ck: CompiledKernel) -> list[tuple[int, int, bool]]:
    """(task, position in plan.buffers, read_only) for every buffer a task binds, on its own or
    as a member of a pack (TaskPlan.packs)."""
    out = []
    for n, t in enumerate(ck.tasks):
        packs = ck.plan.tasks[n].packs
        for b in t.bindings:
            if b.kind == "buffer":
                out.append((n, b.key, b.read_only))
            elif b.kind == "pack":
                out += [(n, key, b.read_only) for key in packs[b.key].members]
    return out


# ---- uniform words -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Scalar:
    """The value of the scalar kernel argument at position `arg` of the call."""
    arg: int
    dtype: str


@dataclass(frozen=True)
class Component:
    """Component `index` (row-major) of the vector / matrix argument at position `arg`, which
    has `count` components."""
    arg: int
    index: int
    count: int
    dtype: str


@dataclass(frozen=True)
class Extent:
    """Extent `dim` of the ndarray argument at position `arg` (its shape[dim])."""
    arg: int
    dim: int


@dataclass(frozen=True)
class Seed:
    """A fresh random seed per launch (Runtime.next_seed)."""


@dataclass(frozen=True)
class StackCapacity:
    """The depth of an autodiff stack: the trip count max(0, end - begin) of a loop whose bounds
    (Exprs) depend on arguments, at least 1."""
    begin: "Expr"
    end: "Expr"


@dataclass(frozen=True)
class PrintTag:
    """Which launch the print() records of a kernel belong to (Runtime.print_tag; MUTED: this
    launch prints nothing, as when a checkpointed step runs again in the backward pass)."""


@dataclass(frozen=True)
class PackOffset:
    """Where member `member` of pack `pack` of task `task` starts in the pack (in elements): the
    launcher sets it from the sizes of the pack's buffers in this launch (TaskPlan.packs)."""
    task: int
    pack: int
    member: int


Word = Union[Scalar, Component, Extent, Seed, StackCapacity, PrintTag, PackOffset]


def word_dtype(w: Word) -> str:
    """The WGSL scalar type of a word: 'f32', 'i32' or 'u32'."""
    if isinstance(w, (Scalar, Component)):
        return {"u1": "u32", "f16": "f32"}.get(w.dtype, w.dtype)
    return "u32" if isinstance(w, (Seed, PrintTag, PackOffset)) else "i32"


# ---- buffer sources ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Field:
    """Entry `index` of the kernel's storage table (the fields its source names)."""
    index: int


@dataclass(frozen=True)
class FieldGrad:
    """The gradient of entry `index` of the kernel's storage table."""
    index: int


@dataclass(frozen=True)
class Arg:
    """The ndarray argument at position `arg` of the call."""
    arg: int


@dataclass(frozen=True)
class ArgGrad:
    """The gradient of the ndarray argument at position `arg`."""
    arg: int


@dataclass(frozen=True)
class FieldDual:
    """The dual (forward-mode tangent) of entry `index` of the kernel's storage table."""
    index: int


@dataclass(frozen=True)
class ArgDual:
    """The dual of the ndarray argument at position `arg`."""
    arg: int


@dataclass(frozen=True)
class Snapshot:
    """Entry `index` of the snapshots a launch of an adjoint gets after the call's arguments: a
    copy, taken before the forward launch, of a field the kernel updates in place
    (passes/autodiff/promote.py); LaunchPlan.snapshots of the forward says which."""
    index: int


@dataclass(frozen=True)
class Scratch:
    """Hidden storage of the kernel itself: entry `index` of the scratch buffers (`count`
    scalars of `dtype` each) that a launch gets last, after the call's arguments and any
    snapshots: the sum of a kernel-scope variable reduced across a parallel loop
    (frontend/kernel_context.py Scratch). One per forward launch, which its adjoint reads again."""
    index: int
    dtype: str
    count: int


@dataclass(frozen=True)
class ScratchGrad:
    """The gradient of scratch buffer `index` (zero when its adjoint launch starts)."""
    index: int


@dataclass(frozen=True)
class Shadow:
    """The access-check words of a checked forward launch (passes/autodiff/shadow.py): entry
    `index` of the shadow buffers a launch gets last of all, one u32 per scalar of the storage
    `of` (a Source) names, zeroed before the launch."""
    index: int
    of: "Source"


@dataclass(frozen=True)
class ScratchDual:
    """The dual (forward mode) of scratch buffer `index`."""
    index: int


Source = Union[Field, FieldGrad, FieldDual, Arg, ArgGrad, ArgDual, Snapshot, Scratch, ScratchGrad, ScratchDual,
               Shadow]


# ---- print() in kernels -------------------------------------------------------------------------

@dataclass(frozen=True)
class PrintValue:
    """A value of a print() line, formatted on the host: dtype 'f32', 'f16', 'i32', 'u32' or 'u1'
    (the bits of its record word), with a Python format spec and conversion ('', 'r', 's', 'a')
    from an f-string or str.format()."""
    dtype: str
    spec: str = ""
    conversion: str = ""

    def format(self, v) -> str:
        if self.dtype in ("f32", "f16"):
            # floats print as the shortest decimal that reads back as the same float32 (f16),
            # in Python's repr style (0.1, not 0.10000000149011612); a format spec formats the
            # exact value, as Python formats a NumPy float32
            x = float(v)
            short = float(str(np.float16(x) if self.dtype == "f16" else np.float32(x)))
            if self.conversion:
                return format(_CONVERSIONS[self.conversion](short), self.spec)
            return format(x, self.spec) if self.spec else repr(short)
        py = bool(v) if self.dtype == "u1" else int(v)
        if self.conversion:
            return format(_CONVERSIONS[self.conversion](py), self.spec)
        return format(py, self.spec)


_CONVERSIONS = {"r": repr, "s": str, "a": ascii}


@dataclass(frozen=True)
class Print:
    """One print() of a kernel: its line as text pieces (str) and PrintValues in order (the
    end= text included); `where`: its file:line, for messages."""
    parts: tuple
    where: str = ""

    @property
    def values(self) -> tuple:
        return tuple(p for p in self.parts if isinstance(p, PrintValue))

    @property
    def template(self) -> str:
        """The line as a Python format string ("x = {:.3f}\n"), for the IR printer."""
        return "".join(p.replace("{", "{{").replace("}", "}}") if isinstance(p, str) else
                       "{" + (f"!{p.conversion}" if p.conversion else "") + (f":{p.spec}" if p.spec else "") + "}"
                       for p in self.parts)

    def format(self, values) -> str:
        """The text of the line for these values (one per PrintValue, in order)."""
        it = iter(values)
        return "".join(p if isinstance(p, str) else p.format(next(it)) for p in self.parts)


# ---- the plan ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pack:
    """Buffers of a task read and written through one binding (a 'pack' BindingSpec), because
    the task would otherwise bind more storage buffers than the device allows
    (codegen/packing.py): element k of member m is element offset_m + k of the pack, offset_m
    being the uniform word words[m] (a PackOffset). members: positions in LaunchPlan.buffers;
    written: the task writes the pack, so the launcher copies its members back after the
    dispatch. All members hold 4-byte scalars."""
    members: tuple
    words: tuple
    written: bool


@dataclass(frozen=True)
class TaskPlan:
    """How to dispatch one task. serial: one workgroup. range: (begin, end) Exprs over the words,
    the task's iterations being max(0, end - begin); None when the bounds depend on fields (then
    the launch uses a fixed grid and the shader grid-strides). stack: autodiff stack words per
    thread, as (constant, positions of the words whose values add to it). one_pass: the shader
    runs one iteration per thread, so the launch must cover the range with threads (codegen only
    sets it where grid_cap workgroups always do). grid_cap: the most workgroups of this task when
    fewer than the plan's (a task that pre-reduces into one address), else None. packs: its Packs
    (usually none), by the key of their bindings."""
    serial: bool
    range: "tuple | None" = None
    workgroup_size: int = 1
    stack: tuple = (0, ())
    one_pass: bool = False
    grid_cap: "int | None" = None
    packs: tuple = ()


@dataclass(frozen=True)
class Access:
    """One kind of global access of a kernel: to `source`, kind 'load' / 'store' / 'add'
    (atomic add or sub) / 'atomic', and per dimension of the index an affine form
    ((word, coefficient), ..., (None, constant)) when every thread uses the same index, else None."""
    source: Source
    kind: str
    dims: tuple


@dataclass(frozen=True)
class LaunchPlan:
    words: tuple                    # Word per 4-byte word of the uniform block, in order
    buffers: tuple                  # Source per buffer of CompiledKernel (BindingSpec.key)
    tasks: tuple                    # TaskPlan per CompiledTask
    grid_cap: int                   # the most workgroups a range task gets
    accesses: tuple = ()            # Access per distinct global access (the tape's checks)
    zero_stores: tuple = ()         # adjoints: buffer positions of zero-store candidates
    fused: tuple | None = None      # fused adjoints: buffer positions by kind (fuse.py)
    snapshots: tuple = ()           # forward kernels: sources to copy before a launch (promote.py)
    scratch: tuple = ()             # the kernel's Scratch sources, by index (forward and adjoint)
    prints: tuple = ()              # Print per print() of the kernel: record k of a launch is prints[k]
    # forward kernels: sources whose accesses a checked launch tracks; None until the access checks
    # ran (on first need: compiler/driver.py Compiled.shadowed)
    shadowed: tuple | None = ()
    shadows: tuple = ()             # a checked forward variant: its Shadow sources, by index

    @property
    def uses_random(self) -> bool:
        return any(isinstance(w, Seed) for w in self.words)


# ---- expressions -------------------------------------------------------------------------------

Expr = tuple
_BITS = {"i32": (-(1 << 31), 1 << 32), "u32": (0, 1 << 32)}


def _wrap(dtype: str, v):
    if dtype == "u1":
        return bool(v)
    lo, span = _BITS[dtype]
    return (int(v) - lo) % span + lo


def _div(a: int, b: int, dt: str) -> int:
    if b == 0:
        return a
    if dt == "i32" and a == -(1 << 31) and b == -1:
        return a
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _floordiv(a: int, b: int, dt: str) -> int:
    return a if b == 0 else a // b


def _mod(a: int, b: int, dt: str) -> int:
    return 0 if b == 0 else a % b


# op name -> fn(result dtype, *int operands); ints wrap to the result dtype afterwards
EXPR_OPS = {
    "add": lambda dt, a, b: a + b,
    "sub": lambda dt, a, b: a - b,
    "mul": lambda dt, a, b: a * b,
    "div": lambda dt, a, b: _div(a, b, dt),
    "floordiv": lambda dt, a, b: _floordiv(a, b, dt),
    "mod": lambda dt, a, b: _mod(a, b, dt),
    "min": lambda dt, a, b: min(a, b),
    "max": lambda dt, a, b: max(a, b),
    "neg": lambda dt, a: -a,
    "abs": lambda dt, a: abs(a),
    "cast": lambda dt, a: a,
    "select": lambda dt, c, a, b: a if c else b,
    "lt": lambda dt, a, b: a < b,
    "le": lambda dt, a, b: a <= b,
    "gt": lambda dt, a, b: a > b,
    "ge": lambda dt, a, b: a >= b,
    "eq": lambda dt, a, b: a == b,
    "ne": lambda dt, a, b: a != b,
}
INT_DTYPES = ("i32", "u32", "u1")


def evaluate(expr: Expr, words) -> int:
    """The value of an expression, given the values of the uniform words."""
    head = expr[0]
    if head == "const":
        return expr[1]
    if head == "word":
        return int(words[expr[1]])
    dt = expr[1]
    return _wrap(dt, EXPR_OPS[head](dt, *(evaluate(e, words) for e in expr[2:])))


def uses_words(expr: Expr | None) -> bool:
    """Whether an expression reads any word (else it is the same for every launch)."""
    if expr is None or expr[0] == "const":
        return False
    if expr[0] == "word":
        return True
    return any(uses_words(e) for e in expr[2:])
