"""The entry point `main` of a task's module, for wgsl.TaskEmitter: a serial task's one thread, or
a range task's bounds and its iterations spread over the threads: one per thread when the launch
covers the range, else a grid-stride loop, or four iterations per step when buffers are read and
written as vec4 (vectors.py quad_views); loop_check's checked loops report a stop by the driver.
"""
from __future__ import annotations

from .. import plan
from ..errors import CompileError
from ..ir.nodes import Block, walk
from ..ir.ops import Op
from ..ir.utils import jumps_to_loop
from ..plan import LOOP_LIMIT_WORD
from ..types import i32
from .common import ARGS_VAR, ERR_VAR, INDENT
from .ops_table import convert
from .statements import UNROLL_MAX
from .vectors import quad_views


class TaskEntry:
    """Mixed into wgsl.TaskEmitter, whose __init__ sets the state used here (task, wg, serial,
    grid_cap, names, quads, quad_lane ...)."""

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
            (b, w) for b, w in quad_views(t, self.kernel.buffers, self.buf_mode, wg)
            if id(b) not in self.buf_view and id(b) not in self.pack_offset]
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
        elif self.opts.loop_check and (self.in_order or self.task_cap):
            # a thread that runs many iterations (in order, or pre-reducing in few workgroups) runs
            # several per iteration of its WGSL loop: the driver limits loop iterations (UNROLL_MAX)
            self.line(1, f"// {part}")
            self.line(1, "var iter = thread_id;")
            self.line(1, "loop {  // unrolled: the driver limits the iterations of loops, not their length")
            self.loop_trips.append(None)

            jumps = jumps_to_loop(self.task.body, Op.CONTINUE)  # (a copy's `continue` ends the copy)

            def copy() -> None:
                self.line(2, "if iter >= range_count { break; }")
                self.line(2, "switch 0i { default {" if jumps else "{")
                self.continue_as.append("break;" if jumps else "continue;")
                self.iteration("iter", 3)
                self.continue_as.pop()
                self.line(2, "} }" if jumps else "}")
                self.line(2, f"{stride};")
            self.unrolled(copy, UNROLL_MAX)
            self.loop_trips.pop()
            self.line(1, "}")
            self.line(1, f"if iter < range_count {{ atomicMax(&{ERR_VAR}[{LOOP_LIMIT_WORD}], 1u); }}  "
                         f"// stopped by the driver")
            self.checks_loops = True
            return
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
