"""What the WGSL emitter (wgsl.py) and the kernel assembly (kernel.py) share: the fixed names of
generated code, the options, per-buffer use counts, and the uniform block's layout."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from .. import shaders
from ..errors import CompileError
from ..ir.nodes import Buffer, Kernel, Stmt, Task, walk_task
from ..ir.ops import AtomicKind, Op
from ..access_check import AccessCheck
from ..nan_check import GradCheck
from .names import identifiers
from ..types import f32, i32, u32
from .ops_table import ALU, MATH_HELPERS

INDENT = "    "
DEFAULT_GRID_CAP = 65535  # WebGPU's minimum of max-compute-workgroups-per-dimension
ATOMIC_FN = {AtomicKind.ADD: "atomicAdd", AtomicKind.SUB: "atomicSub", AtomicKind.MIN: "atomicMin",
             AtomicKind.MAX: "atomicMax", AtomicKind.AND: "atomicAnd", AtomicKind.OR: "atomicOr",
             AtomicKind.XOR: "atomicXor"}
# the new value of an emulated float atomic, from `old` and `operand` (see shaders/atomics.wgsl)
CAS_COMBINE = {AtomicKind.ADD: "old + operand", AtomicKind.SUB: "old - operand",
               AtomicKind.MIN: "min(old, operand)", AtomicKind.MAX: "max(old, operand)"}
NATIVE_F32_ATOMICS = frozenset({AtomicKind.ADD, AtomicKind.SUB})
SUBGROUP_KINDS = frozenset({AtomicKind.ADD, AtomicKind.SUB})  # sums of a subgroup can be added in one atomic

# module-scope names of the generated code; user names never take them
ARGS_VAR, ARGS_STRUCT, ERR_VAR, RET_VAR = "args", "Args", "error_words", "ret_value"
STACK_VAR = "ad_stacks"  # the runtime's scratch buffer for autodiff stacks
PRINT_VAR = "print_words"  # the runtime's print buffer (shaders/print.wgsl)
RNG_NAMES = ("rng_state", "rng_permute", "rng_hash", "rng_seed", "rand_u32", "rand_f32")
MAIN_LOCALS = ("wg_id", "n_wg", "lid", "thread_id", "num_threads", "range_begin", "range_end",
               "range_count", "iter", "quad", "quad_count")


@lru_cache(maxsize=1)
def _fixed_names() -> frozenset[str]:
    names = {"main", ARGS_VAR, ARGS_STRUCT, ERR_VAR, RET_VAR, STACK_VAR, PRINT_VAR, "stack_base", "report_error",
             "print_reserve", *RNG_NAMES,
             *MATH_HELPERS, *MAIN_LOCALS}
    # helpers that name a buffer variable must not have it shadowed by one of their locals
    for file in ("atomics", "assert"):  # (print_reserve names no buffer but print_words)
        for body in shaders.snippets(file).values():
            names |= identifiers(body)
    return frozenset(names)


@dataclass
class Options:
    float_atomics: bool
    debug: bool
    workgroup_size: int
    subgroups: bool = False   # the device has WGSL subgroup operations: aggregate atomic adds
    grid_cap: int | None = None  # the most workgroups a range launch gets (Runtime.grid_cap), if known
    # check that every loop ran to its end (older Mesa llvmpipe silently stops an invocation's loops after
    # 65,535 iterations in total): a loop that exits any other way sets the error buffer's loop word
    loop_check: bool = False
    # the most workgroups of a range task that pre-reduces into one address (passes/prereduce.py):
    # each thread sums many iterations in a register, each workgroup adds a tree sum and an atomic
    reduce_grid_cap: int | None = None
    # range tasks that add floats with atomics run in one invocation, in iteration order: their
    # sums do not depend on thread timing (ti.init(deterministic=True))
    deterministic: bool = False
    # the most storage buffers a task may bind: more are packed (packing.py); None: no packing
    max_storage_buffers: int | None = None


@dataclass
class BufferUse:
    loads: int = 0
    stores: int = 0
    atomics: set = field(default_factory=set)   # AtomicKinds
    addresses: list = field(default_factory=list)  # the index Stmts of its loads

    def mode(self, buf: Buffer, opts: Options) -> str:
        """'plain' | 'atomic' (array<atomic<T>>) | 'cas' (f32 bits in array<atomic<u32>>)."""
        if not self.atomics:
            return "plain"
        if buf.dtype in (i32, u32):
            return "atomic"
        if buf.dtype == f32:
            native = opts.float_atomics and self.atomics <= NATIVE_F32_ATOMICS
            return "atomic" if native else "cas"
        raise CompileError(f"atomic operations on {buf.dtype} buffer {buf.name!r} are not supported "
                           f"(only f32, i32 and u32)")


def buffer_uses(task: Task) -> dict[int, BufferUse]:
    """id(buffer) -> how the task uses it, for each buffer it loads, stores or updates atomically."""
    uses: dict[int, BufferUse] = {}
    for s in walk_task(task):
        if s.op in (Op.GLOBAL_LOAD, Op.GLOBAL_STORE, Op.ATOMIC):
            use = uses.setdefault(id(s.attr[1] if s.op is Op.ATOMIC else s.attr), BufferUse())
            if s.op is Op.GLOBAL_LOAD:
                use.loads += 1
                use.addresses.append(s.args[0])
            elif s.op is Op.GLOBAL_STORE:
                use.stores += 1
            else:
                use.atomics.add(s.attr[0])
    return uses


def kept_assert(s: Stmt, debug: bool) -> bool:
    """Whether an ASSERT is compiled: the user's and the index checks in debug mode, the gradient
    checks of check_nan (nan_check.GradCheck, only in adjoints compiled with it) and of the data
    access rules (access_check.AccessCheck, only in checked forward variants) always."""
    return debug or isinstance(s.attr, (GradCheck, AccessCheck))


def _fail(s: Stmt, why: str):
    raise CompileError(f"WGSL code generation: {why}", s.loc)


def _thread_uniform(task: Task) -> set[int]:
    """ids of the task's values that are the same in every thread at the same point of its serial
    loops: constants, arguments, indices of serial loops with such bounds, and arithmetic on them
    (the element j of a pair sum's inner loop). Only atomic adds to such elements use the subgroup helper: its
    run-time check costs more than it saves where the elements differ between threads (measured
    on lavapipe: cloth's adjoint 1.3-1.5x slower with it on every atomic)."""
    out: set[int] = set()
    for s in walk_task(task):
        if s.op in (Op.CONST, Op.ARG) or s.op in ALU and all(id(a) in out for a in s.args) or \
                s.op is Op.LOOP_INDEX and not isinstance(s.attr, Task) and all(id(a) in out for a in s.attr.args):
            out.add(id(s))
    return out


def _arg_words(kernel: Kernel) -> list[tuple[int, object]]:
    """(word, ArgSlot or None for a gap) for every word of the uniform block, in order."""
    by_word = {a.index: a for a in kernel.args}
    return [(w, by_word.get(w)) for w in range(arg_words(kernel))]


def arg_words(kernel: Kernel) -> int:
    return max([len(kernel.args)] + [a.index + 1 for a in kernel.args])
