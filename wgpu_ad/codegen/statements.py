"""One IR statement -> WGSL lines, for wgsl.TaskEmitter: the small writers (a value's name or
literal, `let`), the dispatch on the op, and the statements with more to them than one line:
serial loops (with loop_check's exit flags), print(), asserts, workgroup sums, random numbers.

Control flow is written as in the IR: an IF is an `if`, a RANGE_FOR a `for` (a `loop` when checked),
a WHILE a `loop`; an adjoint's bodies are bannered `// replay` and `// reverse`.
"""
from __future__ import annotations

from .. import plan
from ..ir.nodes import Block, Stmt, walk
from ..ir.ops import Op
from ..ir.utils import jumps_to_loop
from ..plan import ERROR_WORDS, LOOP_LIMIT_WORD
from ..types import DType, f16, f32, i32, u1, u32
from .common import ARGS_VAR, ERR_VAR, INDENT, PRINT_VAR, RET_VAR, _fail, kept_assert
from .ops_table import ALU, convert, from_bits, literal, spell, to_bits, word_dtype, zero


# unrolling of checked loops (StatementWriter.unroll_copies): a loop whose body runs at least
# UNROLL_FROM times per invocation runs up to UNROLL_MAX copies of it per iteration, in at most
# UNROLL_LINES lines of WGSL
UNROLL_FROM = 4096
UNROLL_MAX = 128
UNROLL_LINES = 1024


class StatementWriter:
    """Mixed into wgsl.TaskEmitter, whose __init__ sets the state used here (lines, names, value,
    loop_var, loop_flags, arg_member ...)."""

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
            self.line(d, self.store_stmt(s.attr, self.element(s.attr, s.args[0], d)[0], self.ref(s.args[1])))
        elif op is Op.ATOMIC:
            helper = self.sg_helpers[(id(s.attr[1]), s.attr[0])] if id(s) in self.sg_atomics else None
            if helper is not None:
                idx = convert(*self.element(s.attr[1], s.args[0], d), i32)
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
            self.while_(s, d)
        elif op is Op.BREAK:
            flag = self.loop_flags[-1] if self.loop_flags else None
            self.line(d, f"{flag} = true; break;" if flag else "break;")
        elif op is Op.CONTINUE:
            self.line(d, self.continue_as[-1] if self.continue_as else "continue;")
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
            self.close_loop(d, flag)  # (pops its flag and continue entries; writes no check)
            return
        lo, hi = s.args
        trips = int(hi.attr) - int(lo.attr) if lo.op is Op.CONST and hi.op is Op.CONST else None
        copies = self.unroll_copies(trips)
        self.loop_trips.append(trips)
        if copies == 1:
            self.line(d, f"var {var}: i32 = {begin};")
            self.line(d, "loop {")
            self.line(d + 1, f"if {var} >= {end} {{ {flag} = true; break; }}")
            self.block(s.blocks[0], d + 1, body=True)
            self.line(d + 1, f"continuing {{ {var} += 1i; }}")
            self.line(d, "}")
        else:
            # each copy steps the index first, so a `continue` (back to the top) steps it too
            self.line(d, f"var {var}: i32 = {begin};")
            self.line(d, f"{var} -= 1i;")
            self.line(d, f"loop {{  // unrolled: the driver limits the iterations of loops, not their length")

            def copy() -> None:
                self.line(d + 1, f"{var} += 1i;")
                self.line(d + 1, f"if {var} >= {end} {{ {flag} = true; break; }}")
                self.unrolled_body(s.blocks[0], d + 1, flag, body=True)
            self.unrolled(copy, copies)
            self.line(d, "}")
        self.loop_trips.pop()
        self.close_loop(d, flag)

    def while_(self, s: Stmt, d: int) -> None:
        flag = self.open_loop(d, "loop")
        copies = self.unroll_copies(None) if flag is not None else 1
        self.loop_trips.append(None)
        if copies == 1:
            self.line(d, "loop {")
            self.block(s.blocks[0], d + 1)
            self.line(d, "}")
        else:
            # a copy is a whole iteration (its condition and break included), so `continue` may
            # go back to the first
            self.line(d, "loop {  // unrolled: the driver limits the iterations of loops, not their length")

            def copy() -> None:
                self.unrolled_body(s.blocks[0], d + 1, flag)
            self.unrolled(copy, copies)
            self.line(d, "}")
        self.loop_trips.pop()
        self.close_loop(d, flag)

    def unroll_copies(self, trips: int | None) -> int:
        """How many copies of a checked loop's body one iteration of its WGSL loop runs. Mesa 22's
        llvmpipe ends an invocation's loops after 65,535 iterations in total (loop_check), counting
        iterations of WGSL loops, so a loop that runs often (by its own trip count times those of
        the loops around it; an unknown count counts as often) runs up to UNROLL_MAX copies per
        iteration: UNROLL_MAX times more serial work before the driver's limit. Only on such drivers."""
        if not self.opts.loop_check:
            return 1
        total = 1
        for t in (*self.loop_trips, trips):
            total = None if t is None or total is None else total * max(t, 0)
        if total is not None and total < UNROLL_FROM:
            return 1
        return UNROLL_MAX if trips is None else max(1, min(UNROLL_MAX, trips))

    def unrolled_body(self, blk: Block, d: int, flag: str | None, body: bool = False) -> None:
        """One copy of an unrolled loop's body, in a block of its own. A body that continues or
        breaks its loop runs inside a one-case `switch`, whose `break` ends the copy: a `continue`
        goes on to the next copy (a jump back to the loop's top would be an iteration the driver
        counts) and a `break` sets the loop's exit flag, which ends the loop after the switch."""
        jumps = jumps_to_loop(blk, Op.CONTINUE) or jumps_to_loop(blk, Op.BREAK)
        if not jumps:
            self.line(d, "{")
            self.continue_as.append("continue;")
            self.block(blk, d + 1, body=body)
            self.continue_as.pop()
            self.line(d, "}")
            return
        self.line(d, "switch 0i { default {  // one copy of the body: its `break` ends the copy")
        self.continue_as.append("break;")
        self.block(blk, d + 1, body=body)
        self.continue_as.pop()
        self.line(d, "} }")
        if flag is not None and jumps_to_loop(blk, Op.BREAK):
            self.line(d, f"if {flag} {{ break; }}")

    def unrolled(self, copy, copies: int) -> None:
        """Write copy() `copies` times, fewer where one copy is long (UNROLL_LINES in all)."""
        mark = len(self.lines)
        copy()
        copies = min(copies, max(1, UNROLL_LINES // max(1, len(self.lines) - mark)))
        for _ in range(copies - 1):
            copy()

    def open_loop(self, d: int, hint: str) -> str | None:
        """Start a loop: with loop_check, declare its exit flag (set by every way out the program
        takes); returns the flag's name, or None."""
        self.continue_as.append("continue;")  # (an unrolled copy of its body changes it)
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
        self.continue_as.pop()
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
