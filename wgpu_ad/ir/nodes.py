"""One small node shape for the IR: a statement is (op, dtype, args, attr, blocks).

A kernel is a list of tasks. A task is one compute dispatch: either a parallel range loop over
[begin, end) (the outermost for of a Taichi kernel) or a serial block run by one thread.
Statement values are SSA; mutable locals are ALLOCA slots read and written by LOCAL_LOAD/STORE.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Iterator

from ..errors import SourceLoc
from ..types import DType
from .ops import Op

_ids = itertools.count()


@dataclass(eq=False)
class Stmt:
    op: Op
    dtype: DType | None
    args: list["Stmt"] = field(default_factory=list)
    attr: Any = None
    blocks: list["Block"] = field(default_factory=list)
    name: str | None = None          # the user's variable name, for readable IR and WGSL
    loc: SourceLoc | None = None     # where in the user's source it came from
    id: int = field(default_factory=lambda: next(_ids))
    index: tuple | None = None       # global accesses: the multi-index (Stmts / ints), for analyses

    def __repr__(self) -> str:
        return f"%{self.id}<{self.op.name}>"


@dataclass(eq=False)
class Block:
    stmts: list[Stmt] = field(default_factory=list)

    def __iter__(self) -> Iterator[Stmt]:
        return iter(self.stmts)

    def __len__(self) -> int:
        return len(self.stmts)


@dataclass(eq=False)
class Buffer:
    """A global array a kernel reads or writes: a field's storage, its gradient or dual, or an ndarray.

    `source` is what the launcher binds, a plan.Source record: plan.Field(k) (entry k of the
    kernel's storage table, which the frontend returns beside the IR), plan.FieldGrad(k) /
    plan.FieldDual(k), plan.Arg(i) / plan.ArgGrad(i) / plan.ArgDual(i) (the i-th argument, an
    ndarray, or its gradient or dual). The IR holds no live objects. `grad` marks gradient storage.
    `vector`: scalars per element (a vector or matrix field's, an ndarray's): the buffer holds a
    whole number of them, so the code generator may read it as an array of vectors.
    `shape`: a field's shape when it is known at compile time (element positions per dimension,
    for analyses such as passes/autodiff/stencil.py), else None (ndarrays).
    """

    name: str
    dtype: DType
    source: Any
    grad: bool = False
    vector: int = 1
    shape: tuple | None = None

    def __repr__(self) -> str:
        return f"@{self.name}"


@dataclass(eq=False)
class ArgSlot:
    """A 4-byte scalar of the launch's uniform block: a kernel argument, a component of one, an
    ndarray extent, the random seed. `role` (a plan.Word) says which; `name` is only a hint for
    readable WGSL and IR."""

    name: str
    dtype: DType
    index: int  # position in the uniform block
    role: Any = None

    def __repr__(self) -> str:
        return f"${self.name}"


@dataclass
class LaunchCapacity:
    """A STACK_ALLOC's capacity known only at launch: the trip count of the loop [begin, end)
    when it depends on nothing but constants and arguments, else `default`
    (ti.init(ad_stack_size=...)). Code generation makes it a word of the uniform block."""

    begin: Stmt | None
    end: Stmt | None
    default: int


@dataclass(eq=False)
class Task:
    """One dispatch. kind 'range': threads run `body` for each i in [begin, end) (grid-stride);
    kind 'serial': one thread runs `body` once. `begin`/`end` are computed by `bounds`, a block
    every thread runs first; they may read arguments and fields."""

    kind: str                      # 'range' | 'serial'
    body: Block
    bounds: Block = field(default_factory=Block)
    begin: Stmt | None = None
    end: Stmt | None = None
    block_dim: int | None = None   # workgroup size; None = chosen by the backend
    name: str = ""
    # runs after the parallel loop in every thread, in uniform control flow (range tasks; made by
    # passes/prereduce.py just before code generation)
    epilogue: Block = field(default_factory=Block)
    # adjoint tasks (passes/autodiff/reverse.py): the statements at the top level of `body` and
    # of its reverse loops' bodies that replay the forward. The code generator banners such a
    # block `// replay` up to the last of them and `// reverse` after it (passes remove and
    # hoist statements but never move one past another)
    replay: set | None = None
    # sources of the buffers a ti.stop_grad(field) inside this task's loop names: as in Taichi,
    # the gradient stops in this task only (Kernel.no_grad: a ti.stop_grad at the kernel's top level)
    no_grad: frozenset = frozenset()


@dataclass(eq=False)
class Kernel:
    name: str
    tasks: list[Task]
    args: list[ArgSlot] = field(default_factory=list)
    buffers: list[Buffer] = field(default_factory=list)
    ret: DType | None = None       # dtype of the scalar return value, if any
    uses_random: bool = False
    debug: bool = False            # ASSERTs present (index checks)
    loc: SourceLoc | None = None
    # stmt -> (task, d): stmts the frontend computed as dimension d of a task's parallel index. Keyed
    # by the statements themselves (identity hash), which keeps them alive: an id() key could be
    # reused by a later statement once the tagged one is dropped by a pass. Clones keep the keys
    # (their multi-indices name the original statements too, see ir/clone.py)
    loop_dims: dict = field(default_factory=dict)
    # sources (plan records) of the buffers ti.stop_grad named: the adjoint gives them no gradient
    no_grad: frozenset = frozenset()
    # the Python numbers the frontend read as compile-time constants (frontend/captured.py), which
    # the launcher compares at each launch; nothing downstream of the frontend reads it
    captured: Any = None


def walk(block: Block) -> Iterator[Stmt]:
    """Every statement of a block, nested blocks included, in program order."""
    for s in block.stmts:
        yield s
        for b in s.blocks:
            yield from walk(b)


def walk_task(task: Task) -> Iterator[Stmt]:
    yield from walk(task.bounds)
    yield from walk(task.body)
    yield from walk(task.epilogue)
