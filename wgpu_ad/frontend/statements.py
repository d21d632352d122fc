"""Python statements -> IR, for lower.FuncLowerer: assignments (a name bound once stays an SSA
value, one assigned again gets a mutable slot; `x[i] += v` on a field is atomic, as in Taichi),
if / while / for, break / continue, return (from a kernel, or inlined from a ti.func with a flag
that leaves its loops) and assert (debug mode only).
"""
from __future__ import annotations

import ast

from ..errors import UnsupportedError
from ..ir.nodes import Block, Stmt
from ..ir.ops import AtomicKind, Op
from ..types import DType, MatrixType, VectorType, u1
from .context import LoopCtx, construct_name, contains_return
from .expressions import BINOPS
from .loops import lower_serial_for
from .refs import GlobalRef, LocalRef
from .values import Mat, dtype_of_entries, is_static

# augmented assignment on a field element is atomic, as in Taichi
_ATOMIC_AUG = {ast.Add: AtomicKind.ADD, ast.Sub: AtomicKind.SUB, ast.BitAnd: AtomicKind.AND,
               ast.BitOr: AtomicKind.OR, ast.BitXor: AtomicKind.XOR}


class StatementLowering:
    """Mixed into lower.FuncLowerer (its __init__ sets b, o, k, pf, scopes, ret, loops)."""

    def lower_body(self, stmts: list[ast.stmt]) -> None:
        for k, st in enumerate(stmts):
            self.visit(st)
            if isinstance(st, (ast.Return, ast.Break, ast.Continue)):
                return  # the rest of the block is unreachable
            if self.ret.kind == "flag" and contains_return(st) and k + 1 < len(stmts):
                cond = self.b.emit(Op.NOT, [self.b.load(self.ret.flag)])
                s = self.b.if_(cond)
                with self.b.at(s.blocks[0]):
                    self.lower_body(stmts[k + 1:])
                return

    def visit_Expr(self, node: ast.Expr):
        if isinstance(node.value, ast.Constant):
            return  # docstring
        self.visit(node.value)

    def visit_Pass(self, node):
        pass

    def visit_Assign(self, node: ast.Assign):
        value = self.visit(node.value)
        for t in node.targets:
            self.assign(t, value, node)

    def visit_AnnAssign(self, node: ast.AnnAssign):
        if node.value is None:
            raise self.error(node, "a declaration without a value is not supported; write x: ti.f32 = 0")
        if not isinstance(node.target, ast.Name):
            raise self.error(node, "annotated assignment needs a plain variable name")
        ann = self.visit(node.annotation)
        value = self.visit(node.value)
        if isinstance(ann, DType):
            value = self.o.cast(value, ann)
            self.bind_new(node.target.id, value, node, dtype=ann)
        elif isinstance(ann, (VectorType, MatrixType)):
            self.bind_new(node.target.id, self.o.cast(value, ann.dtype), node, dtype=ann.dtype)
        else:
            raise self.error(node.annotation, f"unsupported type annotation {ann!r}")

    def assign(self, target: ast.expr, value, node: ast.AST):
        if isinstance(target, ast.Name):
            cur = None
            for depth in range(len(self.scopes) - 1, -1, -1):
                if target.id in self.scopes[depth]:
                    cur = self.scopes[depth][target.id]
                    break
            if isinstance(cur, LocalRef):
                self._check_kernel_scope_write(target.id, depth, target)
                cur.store(self.o, value)
            elif _is_loop_var(cur):
                raise self.error(target, f"loop variable '{target.id}' cannot be assigned inside its loop")
            else:
                self.bind_new(target.id, value, node)
            return
        if isinstance(target, (ast.Tuple, ast.List)):
            vals = self._unpack(value, len(target.elts), node)
            for t, v in zip(target.elts, vals):
                self.assign(t, v, node)
            return
        if isinstance(target, (ast.Subscript, ast.Attribute)):
            ref = self.ref(target)
            ref.store(self.o, value)
            return
        raise self.error(target, f"cannot assign to {construct_name(target)}")

    def _unpack(self, value, n: int, node) -> list:
        if isinstance(value, Mat):
            if value.is_vector and value.n == n:
                return list(value.entries)
            if not value.is_vector and value.n == n:
                return [Mat(r, (value.m,)) for r in value.rows()]
        elif isinstance(value, (list, tuple)) and len(value) == n:
            return list(value)
        raise self.error(node, f"cannot unpack {type(value).__name__} into {n} targets")

    def visit_AugAssign(self, node: ast.AugAssign):
        opcls = type(node.op)
        if opcls not in BINOPS:
            raise self.error(node, f"operator {opcls.__name__} is not supported")
        rhs = self.visit(node.value)
        if isinstance(node.target, ast.Name):
            cur = self.lookup(node.target.id, node.target)
            depth = max((d for d in range(len(self.scopes)) if node.target.id in self.scopes[d]), default=0)
            self._check_kernel_scope_write(node.target.id, depth, node)
            if not isinstance(cur, LocalRef):
                raise self.error(node, f"'{node.target.id}' is not a mutable variable here")
            cur.store(self.o, self.o.binary(BINOPS[opcls], cur.load(self.o), rhs))
            return
        ref = self.ref(node.target)
        if isinstance(ref, GlobalRef) and opcls in _ATOMIC_AUG:
            ref.atomic(self.o, _ATOMIC_AUG[opcls], rhs)
        else:
            ref.store(self.o, self.o.binary(BINOPS[opcls], ref.load(self.o), rhs))

    def visit_If(self, node: ast.If):
        cond = self.o.truth(self.visit(node.test))
        if is_static(cond):
            self.scopes.append({})
            self.lower_body(node.body if cond else node.orelse)
            self.scopes.pop()
            return
        s = self.b.if_(cond)
        for blk, body in zip(s.blocks, (node.body, node.orelse)):
            with self.b.at(blk):
                self.scopes.append({})
                self.lower_body(body)
                self.scopes.pop()

    def visit_While(self, node: ast.While):
        if node.orelse:
            raise self.error(node, "while/else is not supported in kernels", UnsupportedError)
        loop = self.b.emit(Op.WHILE, blocks=[Block()])
        with self.b.at(loop.blocks[0]):
            cond = self.o.truth(self.visit(node.test))
            if is_static(cond):
                if not cond:
                    self.b.emit(Op.BREAK)
            else:
                s = self.b.if_(self.b.emit(Op.NOT, [cond]))
                with self.b.at(s.blocks[0]):
                    self.b.emit(Op.BREAK)
            self._loop_body(LoopCtx("serial", loop), node.body)
        self._after_loop(node)

    def _loop_body(self, ctx: LoopCtx, body: list[ast.stmt], bindings: dict | None = None):
        self.loops.append(ctx)
        if ctx.kind == "serial":
            self.ret.loop_depth += 1
        self.scopes.append(dict(bindings or {}))
        try:
            self.lower_body(body)
        finally:
            self.scopes.pop()
            self.loops.pop()
            if ctx.kind == "serial":
                self.ret.loop_depth -= 1

    def _after_loop(self, node):
        # a `return` inside the loop broke out of it; keep leaving enclosing loops of the function
        if self.ret.kind == "flag" and contains_return(node) and self.ret.loop_depth > 0:
            s = self.b.if_(self.b.load(self.ret.flag))
            with self.b.at(s.blocks[0]):
                self.b.emit(Op.BREAK)

    def visit_Break(self, node):
        if not self.loops:
            raise self.error(node, "'break' outside a loop")
        kind = self.loops[-1].kind
        if kind == "parallel":
            raise self.error(node, "'break' is not allowed in the parallel (outermost) loop of a kernel; "
                                   "its iterations run at the same time. Use a serial loop or ti.loop_config(serialize=True)")
        if kind == "static":
            raise self.error(node, "'break' in a ti.static loop is not supported; use a condition with ti.static")
        if kind == "multi":
            raise self.error(node, "'break' in a multi-dimensional serial ndrange loop is not supported; nest range() loops")
        self.b.emit(Op.BREAK)

    def visit_Continue(self, node):
        if not self.loops:
            raise self.error(node, "'continue' outside a loop")
        if self.loops[-1].kind == "static":
            raise self.error(node, "'continue' in a ti.static loop is not supported; use a condition with ti.static")
        self.b.emit(Op.CONTINUE)

    def visit_Return(self, node: ast.Return):
        value = self.visit(node.value) if node.value is not None else None
        r = self.ret
        if r.kind == "kernel":
            self.k.kernel_return(self, node, value)
        elif r.kind == "tail":
            r.value = value
        else:  # flag: store into the function's result slots, set the flag, leave loops
            if any(l.kind == "multi" for l in self.loops):
                raise self.error(node, "'return' inside a multi-dimensional ndrange loop of a ti.func is not "
                                       "supported; nest range() loops")
            if value is not None:
                if r.slots is None:
                    shape = value.shape if isinstance(value, Mat) else ()
                    entries = value.entries if isinstance(value, Mat) else [value]
                    dt = dtype_of_entries(entries)
                    slots = [Stmt(Op.ALLOCA, dt, [], "ret", name="ret") for _ in entries]
                    r.entry.stmts[0:0] = slots  # at function entry so every path sees them
                    r.slots = LocalRef(slots, shape, "return value")
                r.slots.store(self.o, value)
            self.b.store(r.flag, self.b.const(True, u1))
            if r.loop_depth > 0:
                self.b.emit(Op.BREAK)

    def visit_Assert(self, node: ast.Assert):
        if not self.k.debug:
            return
        cond = self.o.truth(self.visit(node.test))
        msg = node.msg.value if isinstance(node.msg, ast.Constant) else "assertion failed"
        loc = self.pf.loc(node)
        if is_static(cond):
            if not cond:
                raise self.error(node, f"assertion is always false: {msg}")
            return
        self.b.emit(Op.ASSERT, [cond], None, f"{msg} ({loc.file}:{loc.line})".replace("{", "{{").replace("}", "}}"))

    def visit_For(self, node: ast.For):
        if node.orelse:
            raise self.error(node, "for/else is not supported in kernels", UnsupportedError)
        lower_serial_for(self, node)


def _is_loop_var(v) -> bool:
    return isinstance(v, Stmt) and v.op is Op.LOOP_INDEX
