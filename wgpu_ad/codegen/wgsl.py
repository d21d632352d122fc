"""IR kernel -> WGSL compute shaders: one module (entry point `main`) per task.

A module is: a banner, `enable f16;` when needed, the argument struct and the bindings a task
uses, helper functions copied from shaders/, then `main`. Statements become one `let` each,
named after the user's variables; constants and arguments are written inline at their uses.
The binding contract with the runtime is described in wgpu_ad/runtime/compiled.py.
"""
from __future__ import annotations

from .. import plan
from ..errors import CompileError
from ..ir.nodes import ArgSlot, Block, Buffer, Kernel, Stmt, Task, walk, walk_task
from ..ir.ops import AtomicKind, Op
from ..ir.utils import jumps_to_loop
from ..runtime.compiled import ERROR_WORDS, LOOP_LIMIT_WORD, BindingSpec
from .. import shaders
from ..types import DType, f16, f32, i32, u1, u32
from .aggregate import subgroup_atomics
from .common import (ARGS_STRUCT, ARGS_VAR, ATOMIC_FN, CAS_COMBINE, DEFAULT_GRID_CAP, ERR_VAR, INDENT, PRINT_VAR,
                     RET_VAR, STACK_VAR, BufferUse, Options, _arg_words, _fail, _fixed_names, kept_assert)
from .names import Namer, identifiers
from .ops_table import ALU, MATH_HELPERS, convert, from_bits, literal, spell, to_bits, word_dtype, zero
from .vectors import element_component, quad_views, unused_addresses, vector_hint, vector_views

class TaskEmitter:
    """Writes the WGSL module of one task."""

    def __init__(self, kernel: Kernel, task: Task, index: int, opts: Options,
                 assert_codes: dict[int, int], print_codes: dict[int, int] | None = None):
        self.kernel, self.task, self.task_index, self.opts = kernel, task, index, opts
        self.assert_codes = assert_codes
        self.print_codes = print_codes or {}  # id(PRINT stmt) -> its index in the plan's prints
        self.serial = task.kind == "serial"
        self.wg = 1 if self.serial else int(task.block_dim or opts.workgroup_size)
        if not 1 <= self.wg <= 1024:
            raise CompileError(f"workgroup size {self.wg} of task {index} of kernel {kernel.name!r} "
                               f"is out of range: use 1..1024 (WebGPU's default limit is 256)")
        self.lines: list[str] = []
        self.used_ids: set[int] = set()
        self.uses: dict[int, BufferUse] = {}
        self.uses_args = self.uses_random = self.has_return = self.has_assert = self.uses_f16 = False
        self.has_print = False
        self.stacks: list[Stmt] = []   # autodiff stacks, declared once at the top of main
        self.stack_offset: dict[int, str] = {}
        self.stack_caps: list = []     # per stack: its capacity (int, or the ArgSlot read at launch)
        self.one_pass = False          # a range task without a grid-stride loop (main())
        self.loop_flags: list = []     # per open loop: its exit flag's name (loop_check), or None
        self.checks_loops = False      # some loop here is checked (binds the error buffer)
        self.wg_sums: list[Stmt] = []  # workgroup sums of the epilogue (shared memory arrays)
        self._scan()
        # the most workgroups the launcher gives this task (None: unknown). A task that pre-reduces
        # gets fewer (task_cap): its threads then sum more iterations each in a register, and every
        # workgroup costs a tree sum, barriers and an atomic
        self.grid_cap, self.task_cap = opts.grid_cap, None
        if self.wg_sums and opts.reduce_grid_cap is not None and not self.serial:
            self.task_cap = min(opts.grid_cap or DEFAULT_GRID_CAP, opts.reduce_grid_cap)
            self.grid_cap = self.task_cap
        self.mod_names = Namer(_fixed_names())
        self.buf_name = {id(b): self.mod_names.fresh(b.name, "buf")
                         for b in kernel.buffers if id(b) in self.uses}
        self.buf_mode = {id(b): self.uses[id(b)].mode(b, opts)
                         for b in kernel.buffers if id(b) in self.uses}
        self.buf_view = vector_views(kernel.buffers, {k: u.addresses for k, u in self.uses.items() if not u.stores},
                                     self.buf_mode)
        self.unused = unused_addresses(task, self.buf_view)  # ids of ALU stmts written as no `let`
        self.vector_lets: list[dict] = []
        self.quads: dict[int, str] = {}   # id(buffer) read as vec4 four iterations at a time -> the vec4's name
        self.quad_lane: int | None = None  # which of the four iterations is being written, in a quad step
        self.arg_member = self._arg_members()
        # one compare-exchange helper per (buffer, kind) of emulated float atomics
        self.cas_helpers: dict[tuple[int, AtomicKind], str] = {}
        for b in kernel.buffers:
            if self.buf_mode.get(id(b)) == "cas":
                for kind in sorted(self.uses[id(b)].atomics, key=lambda k: k.value):
                    self.cas_helpers[(id(b), kind)] = self.mod_names.fresh(f"atomic_{kind.value}_{self.buf_name[id(b)]}")
        # one subgroup-aggregating helper per (buffer, kind) of the atomic adds that aggregate.py
        # picks; sg_atomics: the ids of those statements
        self.sg_helpers: dict[tuple[int, AtomicKind], str] = {}
        self.sg_atomics: set[int] = set()
        if opts.subgroups and not self.serial:
            for s in subgroup_atomics(kernel, task, self.buf_mode, self.used_ids):
                self.sg_atomics.add(id(s))
                key = (id(s.attr[1]), s.attr[0])
                if key not in self.sg_helpers:
                    self.sg_helpers[key] = self.mod_names.fresh(f"subgroup_{s.attr[0].value}_{self.buf_name[key[0]]}")
        self.wg_arrays = {id(x): self.mod_names.fresh(f"partial_sums{k}") for k, x in enumerate(self.wg_sums)}
        self.names = Namer(self.mod_names.taken)   # main's locals; module names stay visible
        self.value: dict[int, str] = {}            # stmt id -> WGSL name of its value
        self.loop_var: dict[int, str] = {}         # id(Task or RANGE_FOR stmt) -> loop variable
        self.counter = 0

    # ---- analysis ----
    def _scan(self) -> None:
        t = self.task
        for s in walk_task(t):
            self.used_ids.update(id(a) for a in s.args)
            if s.dtype == f16 or any(a.dtype == f16 for a in s.args):
                self.uses_f16 = True
            if s.op is Op.ARG:
                self.uses_args = True
            elif s.op is Op.RANDOM:
                self.uses_random = self.uses_args = True
            elif s.op is Op.RETURN:
                self.has_return = True
            elif s.op is Op.ASSERT and kept_assert(s, self.opts.debug) or s.op is Op.STACK_PUSH:
                self.has_assert = True  # stack overflow reports through the error buffer too
            elif s.op is Op.STACK_ALLOC:
                self.stacks.append(s)
            elif s.op is Op.PRINT:
                self.has_print = self.uses_args = True  # the launch's print tag is a uniform word
            elif s.op is Op.WG_SUM:
                self.wg_sums.append(s)
            elif s.op in (Op.GLOBAL_LOAD, Op.GLOBAL_STORE, Op.ATOMIC):
                buf = s.attr[1] if s.op is Op.ATOMIC else s.attr
                use = self.uses.setdefault(id(buf), BufferUse())
                if s.op is Op.GLOBAL_LOAD:
                    use.loads += 1
                    use.addresses.append(s.args[0])
                elif s.op is Op.GLOBAL_STORE:
                    use.stores += 1
                else:
                    use.atomics.add(s.attr[0])
                if buf.dtype == f16:
                    self.uses_f16 = True
        for s in (t.begin, t.end):
            if s is not None:
                self.used_ids.add(id(s))
        if self.has_return and self.kernel.ret is None:
            raise CompileError(f"kernel {self.kernel.name!r} returns a value but declares no return type")

    def _arg_members(self) -> dict[int, str]:
        names = Namer()
        return {id(a): names.fresh(a.name, "arg") for a in sorted(self.kernel.args, key=lambda a: a.index)}

    # ---- small writers ----
    def line(self, depth: int, text: str) -> None:
        self.lines.append(INDENT * depth + text)

    def ref(self, s: Stmt) -> str:
        """The WGSL expression that reads the value of s: a name, literal or argument."""
        if s.op is Op.CONST:
            return literal(s.attr, s.dtype)
        if s.op is Op.ARG:
            return self.arg_expr(s.attr)
        if s.op is Op.LOOP_INDEX:
            try:
                return self.loop_var[id(s.attr)]
            except KeyError:
                _fail(s, "loop index outside its loop")
        try:
            return self.value[id(s)]
        except KeyError:
            _fail(s, f"{s!r} has no value here (used before it is defined?)")

    def arg_expr(self, slot) -> str:
        member = f"{ARGS_VAR}.{self.arg_member[id(slot)]}"
        if slot.dtype == u1:
            return f"({member} != 0u)"
        if slot.dtype == f16:
            return f"f16({member})"
        return member

    def operands(self, s: Stmt, depth: int) -> list[str]:
        vals = [self.ref(a) for a in s.args]
        # an op on constants only would be a WGSL const-expression, where 1 / 0 or an overflowing
        # conversion is a shader-creation error; binding one operand to a `let` keeps it runtime
        if s.args and all(a.op is Op.CONST for a in s.args):
            name = self.fresh_value_name(s.args[0])
            self.line(depth, f"let {name} = {vals[0]};")
            vals[0] = name
        return vals

    def fresh_value_name(self, s: Stmt) -> str:
        if s.name:
            return self.names.fresh(s.name)
        while True:
            name = f"v{self.counter}"
            self.counter += 1
            if name not in self.names.taken:
                self.names.reserve(name)
                return name

    def let(self, s: Stmt, expr: str, depth: int) -> None:
        name = self.fresh_value_name(s)
        self.value[id(s)] = name
        self.line(depth, f"let {name} = {expr};")

    def index(self, s: Stmt, depth: int) -> str:
        """A buffer element index; a negative constant would be rejected by WGSL, so bind it."""
        x = self.ref(s)
        if s.op is Op.CONST and int(s.attr) < 0:
            name = self.fresh_value_name(s)
            self.line(depth, f"let {name} = {x};")
            return name
        return x

    # ---- statements ----
    def block(self, blk: Block, depth: int, body: bool = False) -> None:
        """A block's statements. In an adjoint, the task's body and the bodies of its reverse
        loops (body=True) are bannered `// replay` (the forward's values computed again) and
        `// reverse` (the adjoints), each where it writes code."""
        self.vector_lets.append({})  # the vectors loaded in this block (visible in nested ones)
        replay = self.task.replay if body else None
        last = max((k for k, s in enumerate(blk.stmts) if s in replay), default=-1) if replay else -1
        if replay is None or blk is not self.task.body and not 0 <= last < len(blk.stmts) - 1:
            parts = [(None, blk.stmts)]
        else:
            parts = [("replay", blk.stmts[:last + 1]), ("reverse", blk.stmts[last + 1:])]
        for banner, stmts in parts:
            mark = len(self.lines)
            for s in stmts:
                self.stmt(s, depth)
            if banner and len(self.lines) > mark:
                self.lines.insert(mark, INDENT * depth + f"// {banner}")
        self.vector_lets.pop()

    def stmt(self, s: Stmt, d: int) -> None:
        op = s.op
        if op in (Op.CONST, Op.ARG, Op.LOOP_INDEX):
            return  # written inline where used
        if op in ALU:
            if id(s) in self.unused:
                return
            expr = spell(s, self.operands(s, d))
            if expr is None:
                _fail(s, f"{op.name} has no WGSL spelling for {s.args[0].dtype} operands")
            self.let(s, expr, d)
        elif op is Op.RANDOM:
            self.let(s, self.random_expr(s), d)
        elif op is Op.ALLOCA:
            name = self.names.fresh(s.name or s.attr, "var")
            self.value[id(s)] = name
            self.line(d, f"var {name}: {s.dtype.wgsl} = {zero(s.dtype)};")
        elif op is Op.LOCAL_LOAD:
            self.let(s, self.ref(s.args[0]), d)
        elif op is Op.LOCAL_STORE:
            self.line(d, f"{self.ref(s.args[0])} = {self.ref(s.args[1])};")
        elif op is Op.GLOBAL_LOAD:
            self.let(s, self.load_at(s, d), d)
        elif op is Op.GLOBAL_STORE and id(s.attr) in self.quads:  # the loop index's element
            self.line(d, f"{self.quad_element(s)} = {self.ref(s.args[1])};")
        elif op is Op.GLOBAL_STORE:
            self.line(d, self.store_stmt(s.attr, self.index(s.args[0], d), self.ref(s.args[1])))
        elif op is Op.ATOMIC:
            helper = self.sg_helpers[(id(s.attr[1]), s.attr[0])] if id(s) in self.sg_atomics else None
            if helper is not None:
                idx = convert(self.index(s.args[0], d), s.args[0].dtype, i32)
                self.line(d, f"{helper}({idx}, {self.ref(s.args[1])}, lid);")
                return
            expr = self.atomic_expr(s, d)
            if id(s) in self.used_ids:
                self.let(s, expr, d)
            else:
                self.line(d, f"{expr};")
        elif op is Op.IF:
            self.line(d, f"if {self.ref(s.args[0])} {{")
            self.block(s.blocks[0], d + 1)
            if len(s.blocks) > 1 and s.blocks[1].stmts:
                self.line(d, "} else {")
                self.block(s.blocks[1], d + 1)
            self.line(d, "}")
        elif op is Op.RANGE_FOR:
            self.range_for(s, d)
        elif op is Op.WHILE:
            flag = self.open_loop(d, "loop")
            self.line(d, "loop {")
            self.block(s.blocks[0], d + 1)
            self.line(d, "}")
            self.close_loop(d, flag)
        elif op is Op.BREAK:
            flag = self.loop_flags[-1] if self.loop_flags else None
            self.line(d, f"{flag} = true; break;" if flag else "break;")
        elif op is Op.CONTINUE:
            self.line(d, "continue;")
        elif op is Op.RETURN:
            value = convert(self.ref(s.args[0]), s.args[0].dtype, self.ret_store_dtype)
            self.line(d, f"{RET_VAR}[0] = {value};")
            self.line(d, "return;")
        elif op is Op.ASSERT:
            if kept_assert(s, self.opts.debug):
                self.assert_(s, d)
        elif op is Op.PRINT:
            self.print_(s, d)
        elif op is Op.WG_SUM:
            self.wg_sum(s, d)
        elif op is Op.WG_LEADER:
            self.let(s, "lid == 0u", d)
        elif op is Op.STACK_ALLOC:
            self.line(d, f"{self.value[id(s)]}_top = 0i;")
        elif op is Op.STACK_PUSH:
            stk = self.value[id(s.args[0])]
            self.line(d, f"if {stk}_top >= {self.stack_capacity(s.args[0])} {{")
            self.line(d + 1, f"report_error({self.assert_codes[id(s)]}u);")
            self.line(d + 1, "return;  // this thread stops; the launcher raises the error")
            self.line(d, "}")
            self.line(d, f"{self.stack_slot(s.args[0])} = {to_bits(self.ref(s.args[1]), s.args[1].dtype)};")
            self.line(d, f"{stk}_top += 1i;")
        elif op is Op.STACK_POP:
            stk = self.value[id(s.args[0])]
            self.line(d, f"{stk}_top -= 1i;")
            self.let(s, from_bits(self.stack_slot(s.args[0]), s.dtype), d)
        else:
            _fail(s, f"no WGSL for op {op.name}")

    def print_(self, s: Stmt, d: int) -> None:
        """One record in the print buffer: the launch's tag, which print it is, the values' bits."""
        tag = next((a for a in self.kernel.args if isinstance(a.role, plan.PrintTag)), None)
        if tag is None:
            _fail(s, "a print() but no print tag word in the uniform block")
        at = self.names.fresh("print_at")
        self.line(d, f"let {at} = print_reserve({self.arg_expr(tag)}, {2 + len(s.args)}u);  "
                     f"// print() at {s.attr.where}")
        self.line(d, f"if {at} != 0xffffffffu {{")
        words = [self.arg_expr(tag), f"{self.print_codes[id(s)]}u"]
        words += [to_bits(self.ref(a), a.dtype) for a in s.args]
        for k, w in enumerate(words):
            self.line(d + 1, f"atomicStore(&{PRINT_VAR}[{at}{f' + {k}u' if k else ''}], {w});")
        self.line(d, "}")

    def wg_sum(self, s: Stmt, d: int) -> None:
        """Tree sum over the workgroup in shared memory (every thread gets the total)."""
        arr = self.wg_arrays[id(s)]
        p2 = 1 << (self.wg - 1).bit_length()
        self.line(d, f"{arr}[lid] = {self.ref(s.args[0])};")
        self.line(d, "workgroupBarrier();")
        self.line(d, f"for (var step = {p2 // 2}u; step > 0u; step = step >> 1u) {{")
        self.line(d + 1, f"if lid < step && lid + step < {self.wg}u {{")
        self.line(d + 2, f"{arr}[lid] = {arr}[lid] + {arr}[lid + step];")
        self.line(d + 1, "}")
        self.line(d + 1, "workgroupBarrier();")
        self.line(d, "}")
        self.let(s, f"{arr}[0]", d)

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

    def range_for(self, s: Stmt, d: int) -> None:
        hint = s.name or next((x.name for x in walk(s.blocks[0])
                               if x.op is Op.LOOP_INDEX and x.attr is s and x.name), None)
        var = self.names.fresh(hint or "j")
        self.loop_var[id(s)] = var
        begin, end = (convert(self.ref(a), a.dtype, i32) for a in s.args)
        flag = self.open_loop(d, var)
        if flag is None:
            self.line(d, f"for (var {var}: i32 = {begin}; {var} < {end}; {var} += 1i) {{")
            self.block(s.blocks[0], d + 1, body=True)
            self.line(d, "}")
            return
        self.line(d, f"var {var}: i32 = {begin};")
        self.line(d, "loop {")
        self.line(d + 1, f"if {var} >= {end} {{ {flag} = true; break; }}")
        self.block(s.blocks[0], d + 1, body=True)
        self.line(d + 1, f"continuing {{ {var} += 1i; }}")
        self.line(d, "}")
        self.close_loop(d, flag)

    def open_loop(self, d: int, hint: str) -> str | None:
        """Start a loop: with loop_check, declare its exit flag (set by every way out the program
        takes); returns the flag's name, or None."""
        if not self.opts.loop_check:
            self.loop_flags.append(None)
            return None
        flag = self.names.fresh(f"{hint}_done")
        self.line(d, f"var {flag} = false;")
        self.loop_flags.append(flag)
        self.checks_loops = True
        return flag

    def close_loop(self, d: int, flag: str | None) -> None:
        """End a loop: a checked loop that left without its flag was stopped by the driver."""
        self.loop_flags.pop()
        if flag is not None:
            self.line(d, f"if !{flag} {{ atomicMax(&{ERR_VAR}[{LOOP_LIMIT_WORD}], 1u); }}  // stopped by the driver")

    @property
    def ret_store_dtype(self) -> DType:
        return word_dtype(self.kernel.ret)

    def random_expr(self, s: Stmt) -> str:
        return {f32: "rand_f32()", f16: "f16(rand_f32())", u32: "rand_u32()",
                i32: "bitcast<i32>(rand_u32())"}.get(s.dtype) or _fail(s, f"random {s.dtype} is not supported")

    def assert_(self, s: Stmt, d: int) -> None:
        values = s.args[1:]
        if len(values) > ERROR_WORDS - 1:
            _fail(s, f"an assert can report at most {ERROR_WORDS - 1} values, this one has {len(values)}")
        self.line(d, f"if !{self.ref(s.args[0])} {{")
        self.line(d + 1, f"if report_error({self.assert_codes[id(s)]}u) {{")
        for k, v in enumerate(values):
            self.line(d + 2, f"atomicStore(&{ERR_VAR}[{k + 1}], {to_bits(self.ref(v), v.dtype)});")
        self.line(d + 1, "}")
        self.line(d + 1, "return;  // this thread stops; the launcher raises the error")
        self.line(d, "}")

    # ---- buffers ----
    def load_at(self, s: Stmt, d: int) -> str:
        """The expression of global load s."""
        buf = s.attr
        if id(buf) in self.quads:
            return self.quad_element(s)
        c = self.buf_view.get(id(buf))
        if c is None:
            return self.load_expr(buf, self.index(s.args[0], d))
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
        idx, value = self.index(s.args[0], d), self.ref(s.args[1])
        if mode == "atomic":
            return f"{ATOMIC_FN[kind]}(&{b}[{idx}], {value})"
        if kind not in CAS_COMBINE:
            _fail(s, f"atomic {kind.value} needs an integer buffer, {buf.name!r} holds {buf.dtype}")
        idx = convert(idx, s.args[0].dtype, i32)
        return f"{self.cas_helpers[(id(buf), kind)]}({idx}, {value})"

    # ---- the module ----
    def main(self) -> list[str]:
        t, wg = self.task, self.wg
        self.lines = []
        if self.serial:
            self.line(0, "@compute @workgroup_size(1)")
            self.line(0, "fn main() {")
            if self.uses_random:
                self.line(1, f"rng_seed({self.seed_expr()}, 0u, {2 * self.task_index + 1}u);")
            self.declare_stacks()
            if t.replay is None:
                self.line(1, "// forward")
            self.block(t.body, 1, body=True)
            self.line(0, "}")
            return self.lines
        self.line(0, f"@compute @workgroup_size({wg})")
        self.line(0, "fn main(@builtin(workgroup_id) wg_id: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,")
        self.line(0, "        @builtin(local_invocation_index) lid: u32) {")
        self.line(1, f"let thread_id = ((wg_id.z * n_wg.y + wg_id.y) * n_wg.x + wg_id.x) * {wg}u + lid;")
        self.line(1, f"let num_threads = n_wg.x * n_wg.y * n_wg.z * {wg}u;")
        if self.uses_random and any(s.op is Op.RANDOM for s in walk(t.bounds)):
            self.line(1, f"rng_seed({self.seed_expr()}, thread_id, {2 * self.task_index}u);")
        mark = len(self.lines)
        self.block(t.bounds, 1)
        if len(self.lines) > mark:
            self.lines.insert(mark, INDENT + "// bounds")
        if t.begin is None or t.end is None:
            raise CompileError(f"range task {self.task_index} of kernel {self.kernel.name!r} has no begin/end")
        self.line(1, f"let range_begin = {convert(self.ref(t.begin), t.begin.dtype, i32)};")
        self.line(1, f"let range_end = {convert(self.ref(t.end), t.end.dtype, i32)};")
        # count and offsets in u32: a range up to 2^32 - 1 long never overflows the loop variable
        self.line(1, "let range_count = select(0u, u32(range_end - range_begin), range_end > range_begin);")
        self.declare_stacks()
        # a constant range that every launch covers with threads (launch.py sizes the grid from
        # it, capped at grid_cap workgroups; stacks can shrink the grid) needs no grid-stride
        # loop: on llvmpipe that loop costs a third of a stencil kernel's time
        lo, hi = t.begin, t.end
        self.one_pass = (self.grid_cap is not None and not self.stacks and lo.op is Op.CONST
                         and hi.op is Op.CONST and int(hi.attr) - int(lo.attr) <= self.grid_cap * wg
                         and not jumps_to_loop(t.body, Op.CONTINUE))
        part = "forward" if t.replay is None else "adjoint"
        quads = [] if self.one_pass else [
            (b, w) for b, w in quad_views(t, self.kernel.buffers, self.buf_mode, wg) if id(b) not in self.buf_view]
        if quads:
            self.quad_loop(quads, part)
        else:
            self.iteration_loop(part)
        if t.epilogue.stmts:
            self.line(1, "// epilogue: one atomic per workgroup")
            self.block(t.epilogue, 1)
        self.line(0, "}")
        return self.lines

    def iteration_loop(self, part: str) -> None:
        """The task's iterations: one per thread, or a grid-stride loop."""
        stride = "iter += min(num_threads, range_count - iter)"
        if self.one_pass:
            self.line(1, f"// {part}: one iteration per thread (the launch covers the range)")
            self.line(1, "let iter = thread_id;")
            self.line(1, "if iter < range_count {")
        elif self.opts.loop_check:
            self.line(1, f"// {part}")
            self.line(1, "var iter = thread_id;")
            self.line(1, "loop {")
            self.line(2, "if iter >= range_count { break; }")
        else:
            self.line(1, f"// {part}")
            self.line(1, f"for (var iter = thread_id; iter < range_count; {stride}) {{")
        self.iteration("iter", 2)
        self.end_grid_loop("iter", "range_count", stride, checked=self.opts.loop_check and not self.one_pass)

    def end_grid_loop(self, var: str, count: str, stride: str, checked: bool) -> None:
        """Close a grid-stride loop; checked (loop_check): a `loop` whose stop by the driver's
        iteration limit before `var` reached `count` is reported."""
        if checked:
            self.line(2, f"continuing {{ {stride}; }}")
            self.line(1, "}")
            self.line(1, f"if {var} < {count} {{ atomicMax(&{ERR_VAR}[{LOOP_LIMIT_WORD}], 1u); }}  "
                         f"// stopped by the driver")
            self.checks_loops = True
        else:
            self.line(1, "}")

    def iteration(self, offset: str, d: int) -> None:
        """One iteration of the task's body: the one at range_begin + offset (a u32 expression)."""
        t = self.task
        self.loop_flags.append(None)  # no break leaves the parallel loop
        hint = next((x.name for x in walk(t.body) if x.op is Op.LOOP_INDEX and x.attr is t and x.name), None)
        value = f"range_begin + i32({offset})"
        if self.quad_lane is not None and not self._index_read(t.body):
            self.loop_var[id(t)] = f"({value})"  # only the vec4 loads read it: no `let`
        else:
            var = self.names.fresh(hint or "i")
            self.loop_var[id(t)] = var
            self.line(d, f"let {var} = {value};")
        if self.uses_random:
            self.line(d, f"rng_seed({self.seed_expr()}, u32({var}), {2 * self.task_index + 1}u);")
        self.block(t.body, d, body=True)
        self.loop_flags.pop()

    def _index_read(self, body: Block) -> bool:
        """Whether the task's loop index feeds anything but the addresses of its vec4 buffers."""
        t = self.task
        for s in walk(body):
            quad = s.op in (Op.GLOBAL_LOAD, Op.GLOBAL_STORE) and id(s.attr) in self.quads
            if any(a.op is Op.LOOP_INDEX and a.attr is t for a in (s.args[1:] if quad else s.args)):
                return True
        return False

    def quad_loop(self, quads: list[tuple], part: str) -> None:
        """Four consecutive iterations per step of the grid-stride loop, each buffer of `quads`
        read (and written) once per step as a vec4 (vectors.py quad_views), then the last
        range_count % 4 iterations, one per thread, using those buffers' scalars through the
        vec4 view."""
        t = self.task
        reads = [self.buf_name[id(b)] for b, w in quads if not w]
        writes = [self.buf_name[id(b)] for b, w in quads if w]
        what = " and ".join(x for x in (f"reading {', '.join(reads)}" if reads else "",
                                         f"writing {', '.join(writes)}" if writes else "") if x)
        self.line(1, f"// {part}: four iterations per step, {what} as vec4")
        self.line(1, "let quad_count = range_count / 4u;")
        stride = "quad += min(num_threads, quad_count - quad)"
        if self.opts.loop_check:
            self.line(1, "var quad = thread_id;")
            self.line(1, "loop {")
            self.line(2, "if quad >= quad_count { break; }")
        else:
            self.line(1, f"for (var quad = thread_id; quad < quad_count; {stride}) {{")
        at = f"quad + {int(t.begin.attr) // 4}u" if int(t.begin.attr) else "quad"
        for b, written in quads:
            name = self.names.fresh(f"{b.name.replace('.', '_')}_v")
            self.quads[id(b)] = name
            elem = f"{self.buf_name[id(b)]}[{at}]"
            if not written:
                self.line(2, f"let {name} = {elem};")
            elif self.uses[id(b)].loads:  # read before its store in each iteration
                self.line(2, f"var {name} = {elem};")
            else:
                self.line(2, f"var {name}: vec4<{b.dtype.wgsl}>;")
        for lane in range(4):
            self.quad_lane = lane
            self.line(2, "{")
            self.iteration(f"4u * quad + {lane}u" if lane else "4u * quad", 3)
            self.line(2, "}")
        self.quad_lane = None
        for b, written in quads:
            if written:
                self.line(2, f"{self.buf_name[id(b)]}[{at}] = {self.quads[id(b)]};")
        self.end_grid_loop("quad", "quad_count", stride, checked=self.opts.loop_check)
        self.line(1, "// the last range_count % 4 iterations")
        self.line(1, "let iter = quad_count * 4u + thread_id;")
        self.line(1, "if iter < range_count {")
        self.iteration("iter", 2)
        self.line(1, "}")

    def seed_expr(self) -> str:
        seed = next((a for a in self.kernel.args if isinstance(a.role, plan.Seed)), None)
        if seed is None:
            raise CompileError(f"kernel {self.kernel.name!r} uses random numbers but has no '_seed' argument slot")
        return f"{ARGS_VAR}.{self.arg_member[id(seed)]}"

    def module(self) -> tuple[str, list[BindingSpec]]:
        body = self.main()
        head = [f"// wgpu_ad kernel {self.kernel.name}, task {self.task_index} ({self.task.kind})"
                + (f": {self.task.name}" if self.task.name else "")]
        if self.uses_f16:
            head.append("enable f16;")
        head.append("")
        bindings: list[BindingSpec] = []

        def bind(kind: str, decl: str, key: int = -1, read_only: bool = False):
            n = len(bindings)
            bindings.append(BindingSpec(n, kind, key, read_only))
            head.append(f"@group(0) @binding({n}) {decl}")

        if self.uses_args:
            head.append(f"struct {ARGS_STRUCT} {{")
            for word, slot in _arg_words(self.kernel):
                if slot is None:
                    head.append(f"{INDENT}pad{word}: u32,")
                else:
                    head.append(f"{INDENT}{self.arg_member[id(slot)]}: {word_dtype(slot.dtype).wgsl},")
            head.append("}")
            bind("args", f"var<uniform> {ARGS_VAR}: {ARGS_STRUCT};")
        for k, buf in enumerate(self.kernel.buffers):
            if id(buf) not in self.uses:
                continue
            use, mode, name = self.uses[id(buf)], self.buf_mode[id(buf)], self.buf_name[id(buf)]
            if buf.dtype == u1:
                raise CompileError(f"buffer {buf.name!r} has dtype u1 (bool), which cannot be stored; use i32")
            elem = {"plain": buf.dtype.wgsl, "atomic": f"atomic<{buf.dtype.wgsl}>", "cas": "atomic<u32>"}[mode]
            if id(buf) in self.buf_view:
                elem = f"vec{self.buf_view[id(buf)]}<{elem}>"
            elif id(buf) in self.quads:
                elem = f"vec4<{elem}>"
            read_only = mode == "plain" and use.stores == 0
            access = "read" if read_only else "read_write"
            note = "  // f32 bits, atomics emulated by compare-exchange" if mode == "cas" else ""
            bind("buffer", f"var<storage, {access}> {name}: array<{elem}>;{note}", k, read_only)
        if self.has_return:
            bind("ret", f"var<storage, read_write> {RET_VAR}: array<{self.ret_store_dtype.wgsl}>;")
        if self.has_assert or self.checks_loops:
            bind("error", f"var<storage, read_write> {ERR_VAR}: array<atomic<u32>>;")
        if self.stacks:
            bind("stack", f"var<storage, read_write> {STACK_VAR}: array<u32>;  // autodiff stacks")
        if self.has_print:
            bind("print", f"var<storage, read_write> {PRINT_VAR}: array<atomic<u32>>;  // print() records")
        for s in self.wg_sums:
            head.append(f"var<workgroup> {self.wg_arrays[id(s)]}: array<{s.dtype.wgsl}, {self.wg}>;")
        helpers = self._helpers("\n".join(body))
        return "\n".join(head + [""] + helpers + body) + "\n", bindings

    def _helpers(self, body: str) -> list[str]:
        out = []
        if self.uses_random:
            out.append(shaders.load("random"))
        called = identifiers(body)
        for name in MATH_HELPERS:
            if name in called:
                out.append(shaders.load("math", name))
                called |= identifiers(out[-1])  # the helpers it calls (later in MATH_HELPERS)
        for (buf_id, kind), fn_name in self.cas_helpers.items():
            out.append(shaders.load("atomics", "cas_f32", fn_name=fn_name, buf=self.buf_name[buf_id],
                                    combine=CAS_COMBINE[kind]))
        for (buf_id, kind), fn_name in self.sg_helpers.items():
            b = self.buf_name[buf_id]
            cas = self.cas_helpers.get((buf_id, kind))
            apply = f"{cas}(slot, amount)" if cas else f"{ATOMIC_FN[kind]}(&{b}[slot], amount)"
            dtype = next(x.dtype for x in self.kernel.buffers if id(x) == buf_id)
            out.append(shaders.load("atomics", "subgroup_add", fn_name=fn_name, dtype=dtype.wgsl, apply=apply))
        if self.has_assert:
            out.append(shaders.load("assert", "report_error", err=ERR_VAR))
        if self.has_print:
            out.append(shaders.load("print", "print_reserve", buf=PRINT_VAR))
        return [h.rstrip("\n") + "\n" for h in out]
