"""IR kernel -> WGSL compute shaders: one module (entry point `main`) per task.

A module is: a banner, `enable f16;` when needed, the argument struct and the bindings a task
uses, helper functions copied from shaders/, then `main`. Statements become one `let` each,
named after the user's variables; constants and arguments are written inline at their uses.
The binding contract with the runtime is described in wgpu_ad/plan.py.

This file holds the assembling: TaskEmitter reads what the task uses (_scan), names the module's
buffers and helpers, and writes the header, bindings and helpers around `main`. The rest of the
emitter is mixed in, one idea per file: entry.py (`main` and how a range task's iterations are
spread over threads), statements.py (one IR statement -> WGSL lines), memory.py (buffer elements
and autodiff stacks).
"""
from __future__ import annotations

from ..errors import CompileError
from ..ir.nodes import Kernel, Stmt, Task, walk_task
from ..ir.ops import AtomicKind, Op
from ..plan import UNIFORM_ARG_WORDS, BindingSpec
from .. import shaders
from ..types import f16, f32, u1
from .aggregate import subgroup_atomics
from .common import (ARGS_STRUCT, ARGS_VAR, ATOMIC_FN, CAS_COMBINE, DEFAULT_GRID_CAP, ERR_VAR, INDENT,
                     NATIVE_F32_ATOMICS, PRINT_VAR, RET_VAR, STACK_VAR, BufferUse, Options, _arg_words, _fixed_names,
                     arg_words, buffer_uses, kept_assert)
from .entry import TaskEntry
from .memory import MemoryAccess
from .names import Namer, identifiers
from .ops_table import MATH_HELPERS, word_dtype
from .statements import StatementWriter
from .vectors import unused_addresses, vector_views


class TaskEmitter(TaskEntry, StatementWriter, MemoryAccess):
    """Writes the WGSL module of one task."""

    def __init__(self, kernel: Kernel, task: Task, index: int, opts: Options,
                 assert_codes: dict[int, int], print_codes: dict[int, int] | None = None, packs: list = ()):
        self.kernel, self.task, self.task_index, self.opts = kernel, task, index, opts
        self.packs = list(packs)  # packing.Pack: buffers bound as one array, each at an offset
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
        self.loop_trips: list = []     # per open serial loop (loop_check): its trip count, None if unknown
        self.continue_as: list = []    # per open loop: the WGSL of its `continue` (unrolled copies: a break)
        self.checks_loops = False      # some loop here is checked (binds the error buffer)
        self.wg_sums: list[Stmt] = []  # workgroup sums of the epilogue (shared memory arrays)
        self._scan()
        self.uses_args |= bool(self.packs)  # (the members' offsets are uniform words)
        # the most workgroups the launcher gives this task (None: unknown). A task that pre-reduces
        # gets fewer (task_cap): its threads then sum more iterations each in a register, and every
        # workgroup costs a tree sum, barriers and an atomic
        self.grid_cap, self.task_cap = opts.grid_cap, None
        if self.wg_sums and opts.reduce_grid_cap is not None and not self.serial:
            self.task_cap = min(opts.grid_cap or DEFAULT_GRID_CAP, opts.reduce_grid_cap)
            self.grid_cap = self.task_cap
        # deterministic: float sums whose order would follow thread timing are made by one
        # invocation, iterations in order (the grid-stride loop of a single thread)
        self.in_order = opts.deterministic and not self.serial and any(
            k in NATIVE_F32_ATOMICS for b in kernel.buffers if id(b) in self.uses and b.dtype == f32
            for k in self.uses[id(b)].atomics)
        if self.in_order:
            self.wg = 1
            self.grid_cap = self.task_cap = 1
        self.mod_names = Namer(_fixed_names())
        self.pack_offset: dict[int, object] = {}  # id(buffer) in a pack -> the ArgSlot of its offset
        self.pack_name = [self.mod_names.fresh(f"packed_{'written' if p.written else 'read'}") for p in self.packs]
        self.buf_name = {id(b): self.mod_names.fresh(b.name, "buf")
                         for b in kernel.buffers if id(b) in self.uses}
        for p, name in zip(self.packs, self.pack_name):
            for b, slot in zip(p.members, p.words):
                self.buf_name[id(b)], self.pack_offset[id(b)] = name, slot
        self.buf_mode = {id(b): self.uses[id(b)].mode(b, opts)
                         for b in kernel.buffers if id(b) in self.uses}
        self.buf_view = vector_views(kernel.buffers, {k: u.addresses for k, u in self.uses.items()
                                                      if not u.stores and k not in self.pack_offset}, self.buf_mode)
        self.unused = unused_addresses(task, self.buf_view)  # ids of ALU stmts written as no `let`
        self.vector_lets: list[dict] = []
        self.quads: dict[int, str] = {}   # id(buffer) read as vec4 four iterations at a time -> the vec4's name
        self.quad_lane: int | None = None  # which of the four iterations is being written, in a quad step
        self.arg_member = self._arg_members()
        self.helper_names: dict[str, str] = {}
        # one compare-exchange helper per (buffer, kind) of emulated float atomics
        self.cas_helpers: dict[tuple[int, AtomicKind], str] = {}
        for b in kernel.buffers:
            if self.buf_mode.get(id(b)) == "cas":
                for kind in sorted(self.uses[id(b)].atomics, key=lambda k: k.value):
                    self.cas_helpers[(id(b), kind)] = self._helper_name(f"atomic_{kind.value}_{self.buf_name[id(b)]}")
        # one subgroup-aggregating helper per (buffer, kind) of the atomic adds that aggregate.py
        # picks; sg_atomics: the ids of those statements
        self.sg_helpers: dict[tuple[int, AtomicKind], str] = {}
        self.sg_atomics: set[int] = set()
        if opts.subgroups and not self.serial and not self.in_order:
            for s in subgroup_atomics(kernel, task, self.buf_mode, self.used_ids):
                self.sg_atomics.add(id(s))
                key = (id(s.attr[1]), s.attr[0])
                if key not in self.sg_helpers:
                    self.sg_helpers[key] = self._helper_name(f"subgroup_{s.attr[0].value}_{self.buf_name[key[0]]}")
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
        self.uses = buffer_uses(t)
        if any(b.dtype == f16 for b in self.kernel.buffers if id(b) in self.uses):
            self.uses_f16 = True
        for s in (t.begin, t.end):
            if s is not None:
                self.used_ids.add(id(s))
        if self.has_return and self.kernel.ret is None:
            raise CompileError(f"kernel {self.kernel.name!r} returns a value but declares no return type")

    def _helper_name(self, hint: str) -> str:
        """The name of the helper for one (array, operation), made once: the members of a pack
        share one array, so they share its helpers."""
        if hint not in self.helper_names:
            self.helper_names[hint] = self.mod_names.fresh(hint)
        return self.helper_names[hint]

    def _arg_members(self) -> dict[int, str]:
        names = Namer()
        return {id(a): names.fresh(a.name, "arg") for a in sorted(self.kernel.args, key=lambda a: a.index)}

    # ---- the module ----
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
            if arg_words(self.kernel) > UNIFORM_ARG_WORDS:  # more than a uniform binding holds
                bind("args_storage", f"var<storage, read> {ARGS_VAR}: {ARGS_STRUCT};")
            else:
                bind("args", f"var<uniform> {ARGS_VAR}: {ARGS_STRUCT};")
        for k, buf in enumerate(self.kernel.buffers):
            if id(buf) not in self.uses or id(buf) in self.pack_offset:
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
        for j, (p, name) in enumerate(zip(self.packs, self.pack_name)):
            bind("pack", f"var<storage, {'read_write' if p.written else 'read'}> {name}: array<{p.elem}>;  // "
                         f"{', '.join(b.name for b in p.members)}, each at its offset (more buffers than a "
                         f"shader binds: wgpu_ad copies them in and out)", j, not p.written)
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
        made = set()  # (pack members share their helpers)
        for (buf_id, kind), fn_name in self.cas_helpers.items():
            if fn_name in made:
                continue
            made.add(fn_name)
            out.append(shaders.load("atomics", "cas_f32", fn_name=fn_name, buf=self.buf_name[buf_id],
                                    combine=CAS_COMBINE[kind]))
        for (buf_id, kind), fn_name in self.sg_helpers.items():
            if fn_name in made:
                continue
            made.add(fn_name)
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
