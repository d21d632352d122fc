"""What lowering one kernel carries around (KernelContext: its builder, the buffers and argument
slots it names, its loop and return state), and the Scratch sums it allocates for kernel-scope
reductions (reductions.py). Shared by kernel.py, kernel_scope.py, reductions.py and parallel.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .. import plan
from ..errors import CompileError
from ..ir.builder import Builder
from ..ir.nodes import ArgSlot, Buffer, Kernel
from ..ir.ops import Op
from ..types import DType
from .captured import Captured
from .context import ParsedFunc
from .lower import FuncLowerer
from .values import Mat, Ops


@dataclass(eq=False)
class Scratch:
    """A kernel-scope variable accumulated with += / -= across the iterations of a parallel loop
    (`s = 0.0; for i in x: s += x[i]; return s`, an atomic reduction as in Taichi): a hidden 0-d
    buffer of the launch (plan.Scratch), zeroed before the loop, added to atomically in it, and
    added to the variable's value before the loop wherever the variable is used after it. The
    launcher allocates it per launch (lang/kernel.py), so an adjoint reads its own launch's sum."""

    index: int
    dtype: DType
    element_shape: tuple
    name: str
    shape: tuple = ()
    is_grad: bool = False
    gpu_buffer = None  # (looks like a field to the lowering: frontend/methods.py field_like)

    @property
    def element_size(self) -> int:
        return math.prod(self.element_shape)


class KernelContext:
    """One kernel being lowered (one per lower_kernel call)."""

    def __init__(self, name: str, pf: ParsedFunc, debug: bool):
        self.name = name
        self.pf = pf
        self.debug = debug
        self.builder = Builder()
        self.ops = Ops(self.builder, check_divisors=debug, kernel=name)
        self.buffers: dict[int, Buffer] = {}
        self.storages: list = []   # the live fields the kernel names: plan.Field(k) is storages[k]
        self.kernel = Kernel(name, [], loc=pf.loc(pf.tree))
        self.call_stack: list = []
        self.uses_random = False
        self.moved_names: dict[str, str] = {}
        self.pending_config: dict = {}
        self.ret_dtype: DType | None = None
        self.in_parallel = False
        self.min_parallel: int | None = None
        self.scratch: list[Scratch] = []
        self.captured = Captured()  # the Python numbers it read (compile-time constants)

    def buffer_for(self, obj) -> Buffer:
        buf = self.buffers.get(id(obj))
        if buf is None:
            name = obj.name or f"field{len(self.buffers)}"
            if isinstance(obj, Scratch):
                source = plan.Scratch(obj.index, obj.dtype.name, obj.element_size)
            else:
                self.storages.append(obj)
                source = plan.Field(len(self.storages) - 1)
            shape = None if isinstance(obj, Scratch) else tuple(obj.shape)
            buf = Buffer(name, obj.dtype, source, grad=bool(getattr(obj, "is_grad", False)),
                         vector=int(getattr(obj, "element_size", 1)),
                         shape=shape if shape is not None and all(isinstance(e, int) for e in shape) else None)
            self.buffers[id(obj)] = buf
            self.kernel.buffers.append(buf)
        return buf

    def arg_slot(self, name: str, dtype: DType, role) -> ArgSlot:
        a = ArgSlot(name, dtype, len(self.kernel.args), role)
        self.kernel.args.append(a)
        return a

    def set_loop_config(self, node, block_dim=None, serialize=False, parallelize=None, block_dim_adaptive=None):
        if block_dim is not None and not (isinstance(block_dim, int) and 1 <= block_dim <= 1024):
            raise CompileError(f"ti.loop_config(block_dim={block_dim!r}): block_dim must be an integer in [1, 1024]")
        self.pending_config = {"block_dim": block_dim, "serialize": bool(serialize)}

    def kernel_return(self, fl: FuncLowerer, node, value):
        if self.in_parallel:
            raise fl.error(node, "'return' inside a parallel loop is not supported: return from the serial part of the kernel")
        if any(l.kind in ("serial", "multi") for l in fl.loops) is False and fl.loops and fl.loops[-1].kind == "static":
            pass
        if self.ret_dtype is None:
            if value is None:
                return
            raise fl.error(node, f"kernel '{self.name}' returns a value but has no return type annotation; "
                                 f"add one, e.g. 'def {self.name}(...) -> ti.f32:'")
        if isinstance(value, Mat) or value is None:
            raise fl.error(node, f"kernel '{self.name}' must return one {self.ret_dtype} scalar")
        fl.b.emit(Op.RETURN, [fl.o.to_stmt(fl.o.cast(value, self.ret_dtype), self.ret_dtype)])
