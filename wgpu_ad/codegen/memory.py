"""Where a task's values live outside registers, for wgsl.TaskEmitter: buffer elements (read and
written plainly, with WGSL atomics, or as f32 bits with compare-exchange atomics; read through a
vec2 / vec4 view or a quad step's vec4, vectors.py; at an offset in a pack, packing.py) and the
autodiff stacks, one slice per thread of the runtime's scratch buffer.
"""
from __future__ import annotations

from ..ir.nodes import ArgSlot, Buffer, Stmt
from ..types import DType, i32, u32
from .common import ATOMIC_FN, CAS_COMBINE, STACK_VAR, _fail
from .ops_table import convert
from .vectors import element_component, vector_hint


class MemoryAccess:
    """Mixed into wgsl.TaskEmitter, whose __init__ sets the state used here (buf_name, buf_mode,
    buf_view, quads, stacks, cas_helpers ...)."""

    def declare_stacks(self) -> None:
        """Autodiff stacks live in the runtime's scratch buffer, one slice of stack_words words per
        thread (private arrays would make some drivers' shader compile time grow with their size)."""
        if not self.stacks:
            return
        const, dynamic = 0, []  # the offset of the next stack in a thread's slice

        def total() -> str:
            return " + ".join(([f"{const}u"] if const or not dynamic else []) + dynamic)
        for stk in self.stacks:
            name = self.names.fresh(stk.name or "stack")
            self.value[id(stk)] = name
            self.stack_offset[id(stk)] = total()
            if isinstance(stk.attr, ArgSlot):  # sized per launch (a word of the uniform block)
                dynamic.append(f"u32({self.arg_expr(stk.attr)})")
                self.uses_args = True
            else:
                const += int(stk.attr)
            self.line(1, f"var {name}_top: i32 = 0i;")
        self.stack_caps = [stk.attr for stk in self.stacks]
        slot = "0u" if self.serial else "thread_id"
        self.line(1, f"let stack_base = {slot} * ({total()});" if len(dynamic) + bool(const) > 1
                  else f"let stack_base = {slot} * {total()};")

    def stack_capacity(self, stk: Stmt) -> str:
        cap = stk.attr
        return self.arg_expr(cap) if isinstance(cap, ArgSlot) else f"{int(cap)}i"

    def stack_slot(self, stk: Stmt) -> str:
        name = self.value[id(stk)]
        off = self.stack_offset[id(stk)]
        return f"{STACK_VAR}[stack_base + {'' if off == '0u' else off + ' + '}u32({name}_top)]"

    def element(self, buf: Buffer, s: Stmt, d: int) -> tuple[str, DType]:
        """The index of element s of buf in its binding, and its dtype: in a pack (packing.py),
        the member's offset (a uniform word) plus s."""
        idx = self.index(s, d)
        slot = self.pack_offset.get(id(buf))
        if slot is None:
            return idx, s.dtype
        return f"{self.arg_expr(slot)} + {convert(idx, s.dtype, u32)}", u32

    def load_at(self, s: Stmt, d: int) -> str:
        """The expression of global load s."""
        buf = s.attr
        if id(buf) in self.quads:
            return self.quad_element(s)
        c = self.buf_view.get(id(buf))
        if c is None:
            return self.load_expr(buf, self.element(buf, s.args[0], d)[0])
        e, k = element_component(s.args[0], c)
        key = (id(buf), e if isinstance(e, int) else id(e))
        name = next((scope[key] for scope in reversed(self.vector_lets) if key in scope), None)
        if name is None:  # the whole element, once: its other components reuse it
            name = self.names.fresh(vector_hint(s, buf), "vec")
            self.line(d, f"let {name} = {self.buf_name[id(buf)]}[{e if isinstance(e, int) else self.ref(e)}];")
            self.vector_lets[-1][key] = name
        return f"{name}.{'xyzw'[k]}"

    def quad_element(self, s: Stmt) -> str:
        """The element a load or store of a vec4-viewed buffer names (its loop index's): a component
        of the step's vec4, or, in the last iterations, of the buffer's vec4 (quad_loop)."""
        if self.quad_lane is not None:
            return f"{self.quads[id(s.attr)]}.{'xyzw'[self.quad_lane]}"
        at = f"u32({self.ref(s.args[0])})"
        return f"{self.buf_name[id(s.attr)]}[{at} / 4u][{at} % 4u]"

    def load_expr(self, buf: Buffer, idx: str) -> str:
        b, mode = self.buf_name[id(buf)], self.buf_mode[id(buf)]
        if mode == "plain":
            return f"{b}[{idx}]"
        if mode == "atomic":
            return f"atomicLoad(&{b}[{idx}])"
        return f"bitcast<f32>(atomicLoad(&{b}[{idx}]))"

    def store_stmt(self, buf: Buffer, idx: str, value: str) -> str:
        b, mode = self.buf_name[id(buf)], self.buf_mode[id(buf)]
        if mode == "plain":
            return f"{b}[{idx}] = {value};"
        if mode == "atomic":
            return f"atomicStore(&{b}[{idx}], {value});"
        return f"atomicStore(&{b}[{idx}], bitcast<u32>({value}));"

    def atomic_expr(self, s: Stmt, d: int) -> str:
        kind, buf = s.attr
        b, mode = self.buf_name[id(buf)], self.buf_mode[id(buf)]
        (idx, dtype), value = self.element(buf, s.args[0], d), self.ref(s.args[1])
        if mode == "atomic":
            return f"{ATOMIC_FN[kind]}(&{b}[{idx}], {value})"
        if kind not in CAS_COMBINE:
            _fail(s, f"atomic {kind.value} needs an integer buffer, {buf.name!r} holds {buf.dtype}")
        idx = convert(idx, dtype, i32)
        return f"{self.cas_helpers[(id(buf), kind)]}({idx}, {value})"
