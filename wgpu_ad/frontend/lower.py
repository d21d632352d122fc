"""Python AST -> IR for the statements and expressions of kernels and ti.funcs.

One visit_<Node> per supported construct; anything else is refused with the file, line and a
caret. Kernel-level structure (which loop is parallel, tasks, arguments) is in kernel.py.
"""
from __future__ import annotations

import ast
import builtins as _pybuiltins

import numpy as np

from ..errors import CompileError, UnsupportedError, WgpuAdError
from ..ir.builder import Builder
from ..ir.nodes import Block, Stmt
from ..ir.ops import AtomicKind, Op
from ..ir.utils import adopt_name
from ..types import DType, MatrixType, VectorType, i32, u1
from .context import LoopCtx, ParsedFunc, ReturnCtx, contains_return, static_globals
from .loops import lower_serial_for
from .methods import MatMethod, eval_ref_or_value, lower_call, make_ref
from .printing import fstring_value
from .refs import GlobalRef, LocalRef, Ref, swizzle_indices
from .values import Mat, Ops, dtype_of_entries, entry_names, is_static

_BINOPS = {ast.Add: Op.ADD, ast.Sub: Op.SUB, ast.Mult: Op.MUL, ast.Div: Op.DIV,
           ast.FloorDiv: Op.FLOORDIV, ast.Mod: Op.MOD, ast.Pow: Op.POW, ast.LShift: Op.SHL,
           ast.RShift: Op.SHR, ast.BitAnd: Op.BIT_AND, ast.BitOr: Op.BIT_OR, ast.BitXor: Op.BIT_XOR}
_CMPOPS = {ast.Lt: Op.LT, ast.LtE: Op.LE, ast.Gt: Op.GT, ast.GtE: Op.GE, ast.Eq: Op.EQ, ast.NotEq: Op.NE}
# augmented assignment on a field element is atomic, as in Taichi
_ATOMIC_AUG = {ast.Add: AtomicKind.ADD, ast.Sub: AtomicKind.SUB, ast.BitAnd: AtomicKind.AND,
               ast.BitOr: AtomicKind.OR, ast.BitXor: AtomicKind.XOR}


class FuncLowerer(ast.NodeVisitor):
    """Lowers one function body (the kernel's, or an inlined ti.func's) into the current block."""

    def __init__(self, kctx, pf: ParsedFunc, scopes: list[dict], ret: ReturnCtx):
        self.k = kctx                  # kernel_context.KernelContext: builder, buffers, args, config
        self.b: Builder = kctx.builder
        self.o: Ops = kctx.ops
        self.pf = pf
        self.globals = static_globals(pf.fn)
        self.scopes = scopes
        self.ret = ret
        self.loops: list[LoopCtx] = []

    def for_callee(self, pf: ParsedFunc, scope: dict, ret: ReturnCtx) -> "FuncLowerer":
        """A lowerer for an inlined ti.func's body (inline.py), emitting into the same kernel."""
        return FuncLowerer(self.k, pf, [scope], ret)

    # ---- errors and locations -------------------------------------------------------------
    def error(self, node: ast.AST, msg: str, cls=CompileError) -> CompileError:
        return cls(msg, self.pf.loc(node))

    def visit(self, node):
        return self.run_at(node, super().visit, node)

    def run_at(self, node: ast.AST, fn, *args):
        """fn(*args) with node as the IR's source location; an error without a location gets node's."""
        saved = self.b.loc
        if hasattr(node, "lineno"):
            self.b.loc = self.pf.loc(node)
        try:
            return fn(*args)
        except WgpuAdError as e:
            if isinstance(e, CompileError) and e.loc is not None:
                raise
            raise self.error(node, str(e)) from None
        finally:
            self.b.loc = saved

    def generic_visit(self, node):
        raise self.error(node, f"{_construct_name(node)} is not supported in kernels", UnsupportedError)

    # ---- names ----------------------------------------------------------------------------
    def lookup(self, name: str, node: ast.AST):
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        if name in self.globals:
            v = self.globals[name]
            if hasattr(v, "gpu_buffer") and hasattr(v, "name_after"):
                v.name_after(name)  # name fields after the user's variable, for messages and WGSL
            return _constant(v)
        if hasattr(_pybuiltins, name):
            return getattr(_pybuiltins, name)
        hint = self.k.moved_names.get(name)
        if hint:
            raise self.error(node, hint)
        raise self.error(node, f"name '{name}' is not defined")

    def value(self, v):
        """A name's binding as a value (loads locals)."""
        if isinstance(v, Ref):
            return v.load(self.o)
        return v

    def bind_new(self, name: str, value, node: ast.AST, dtype: DType | None = None):
        """Define a local. Names assigned once stay SSA values (and compile-time values stay
        compile-time); names assigned more than once get mutable slots (ALLOCA)."""
        numeric = isinstance(value, (Stmt, Mat, int, float, bool))
        shape = value.shape if isinstance(value, Mat) else ()
        entries = value.entries if isinstance(value, Mat) else [value]
        if dtype is None and (self.pf.assign_counts.get(name, 0) <= 1 or not numeric):
            for s, n in zip(entries, entry_names(name, shape)):
                if isinstance(s, Stmt):
                    adopt_name(s, n)
            self.scopes[-1][name] = value
            return
        if not numeric:
            raise self.error(node, f"cannot give '{name}' a type annotation: its value is a {type(value).__name__}")
        dt = dtype or dtype_of_entries(entries)
        if dt == u1:
            dt = i32
        slots = [self.b.alloca(dt, n) for n in entry_names(name, shape)]
        ref = LocalRef(slots, shape, name)
        ref.store(self.o, value)
        self.scopes[-1][name] = ref

    def _check_kernel_scope_write(self, name: str, depth: int, node):
        if self.k.in_parallel and self.ret.kind == "kernel" and depth < getattr(self, "parallel_scope", 0):
            raise self.error(node, f"kernel-scope variable '{name}' is assigned inside the parallel loop; its "
                                   f"iterations run at the same time, so its value would be undefined. Accumulate "
                                   f"with '{name} += ...' (an atomic reduction over the iterations, as in Taichi) "
                                   f"or into a field, or define '{name}' inside the loop")

    def loops_inside_func(self) -> bool:
        return any(l.kind == "serial" for l in self.loops)

    # ---- statements -----------------------------------------------------------------------
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
        raise self.error(target, f"cannot assign to {_construct_name(target)}")

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
        if opcls not in _BINOPS:
            raise self.error(node, f"operator {opcls.__name__} is not supported")
        rhs = self.visit(node.value)
        if isinstance(node.target, ast.Name):
            cur = self.lookup(node.target.id, node.target)
            depth = max((d for d in range(len(self.scopes)) if node.target.id in self.scopes[d]), default=0)
            self._check_kernel_scope_write(node.target.id, depth, node)
            if not isinstance(cur, LocalRef):
                raise self.error(node, f"'{node.target.id}' is not a mutable variable here")
            cur.store(self.o, self.o.binary(_BINOPS[opcls], cur.load(self.o), rhs))
            return
        ref = self.ref(node.target)
        if isinstance(ref, GlobalRef) and opcls in _ATOMIC_AUG:
            ref.atomic(self.o, _ATOMIC_AUG[opcls], rhs)
        else:
            ref.store(self.o, self.o.binary(_BINOPS[opcls], ref.load(self.o), rhs))

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

    # ---- expressions ----------------------------------------------------------------------
    def visit_Constant(self, node: ast.Constant):
        if isinstance(node.value, (int, float, bool, str)) or node.value is None:
            return node.value
        raise self.error(node, f"constant {node.value!r} is not supported")

    def visit_Name(self, node: ast.Name):
        return self.value(self.lookup(node.id, node))

    def visit_Tuple(self, node):
        return tuple(self._elts(node.elts))

    def visit_List(self, node):
        return list(self._elts(node.elts))

    def _elts(self, elts):
        out = []
        for e in elts:
            if isinstance(e, ast.Starred):
                out.extend(self.visit(e.value))
            else:
                out.append(self.visit(e))
        return out

    def visit_BinOp(self, node: ast.BinOp):
        # a + b + c + ... nests to the left, one level per operator: walk that spine in a loop, so
        # a long (generated) expression does not reach Python's recursion limit (327 terms did)
        spine = [node]
        while isinstance(spine[-1].left, ast.BinOp):
            spine.append(spine[-1].left)
        acc = self.visit(spine[-1].left)
        for n in reversed(spine):
            acc = self.run_at(n, self._binop, n, acc)
        return acc

    def _binop(self, node: ast.BinOp, a):
        b = self.visit(node.right)
        if isinstance(node.op, ast.MatMult):
            return self.o.matmul(a, b)
        op = _BINOPS.get(type(node.op))
        if op is None:
            raise self.error(node, f"operator {type(node.op).__name__} is not supported")
        if is_static(a) and is_static(b) and not all(isinstance(x, (int, float, bool)) for x in (a, b)):
            try:
                return {Op.ADD: lambda: a + b, Op.MUL: lambda: a * b, Op.SUB: lambda: a - b}.get(op, lambda: None)() \
                    if op in (Op.ADD, Op.MUL, Op.SUB) else self.o.binary(op, a, b)
            except TypeError as e:
                raise self.error(node, str(e)) from None
        return self.o.binary(op, a, b)

    def visit_UnaryOp(self, node: ast.UnaryOp):
        x = self.visit(node.operand)
        if isinstance(node.op, ast.UAdd):
            return x
        op = {ast.USub: Op.NEG, ast.Not: Op.NOT, ast.Invert: Op.BIT_NOT}[type(node.op)]
        return self.o.unary(op, x)

    def visit_BoolOp(self, node: ast.BoolOp):
        op = Op.AND if isinstance(node.op, ast.And) else Op.OR
        acc = self.o.truth(self.visit(node.values[0]))
        for v in node.values[1:]:
            if is_static(acc):  # Python short-circuit on compile-time values
                if (op is Op.AND and not acc) or (op is Op.OR and acc):
                    return acc
                acc = self.o.truth(self.visit(v))
                continue
            acc = self.o.binary(op, acc, self.o.truth(self.visit(v)))
        return acc

    def visit_Compare(self, node: ast.Compare):
        left = self.visit(node.left)
        acc = None
        for opn, right_node in zip(node.ops, node.comparators):
            right = self.visit(right_node)
            if type(opn) in (ast.Is, ast.IsNot, ast.In, ast.NotIn):
                if not (is_static(left) and is_static(right)):
                    raise self.error(node, f"'{type(opn).__name__}' works only on compile-time values in kernels")
                r = {ast.Is: lambda: left is right, ast.IsNot: lambda: left is not right,
                     ast.In: lambda: left in right, ast.NotIn: lambda: left not in right}[type(opn)]()
            else:
                r = self.o.binary(_CMPOPS[type(opn)], left, right)
            acc = r if acc is None else self.o.binary(Op.AND, acc, r)
            left = right
        return acc

    def visit_IfExp(self, node: ast.IfExp):
        c = self.o.truth(self.visit(node.test))
        if is_static(c):
            return self.visit(node.body if c else node.orelse)
        return self.o.select(c, self.visit(node.body), self.visit(node.orelse))

    def visit_ListComp(self, node: ast.ListComp):
        if len(node.generators) != 1 or node.generators[0].ifs or node.generators[0].is_async:
            raise self.error(node, "only simple list comprehensions [e for x in <compile-time sequence>] are supported")
        g = node.generators[0]
        it = self.visit(g.iter)
        if isinstance(it, Mat):
            it = it.entries
        if not is_static(it) or isinstance(it, (int, float)):
            raise self.error(g.iter, "a list comprehension needs a compile-time sequence (e.g. range(3) or ti.static(...))")
        out = []
        for v in it:
            self.scopes.append({})
            self._bind_static_target(g.target, v)
            out.append(self.visit(node.elt))
            self.scopes.pop()
        return out

    def _bind_static_target(self, target, v):
        if isinstance(target, ast.Name):
            self.scopes[-1][target.id] = v
        elif isinstance(target, (ast.Tuple, ast.List)):
            for t, x in zip(target.elts, self._unpack(v, len(target.elts), target)):
                self._bind_static_target(t, x)
        else:
            raise self.error(target, "unsupported loop target")

    def visit_Attribute(self, node: ast.Attribute):
        return self.value(eval_ref_or_value(self, node))

    def _attr_value(self, base, node: ast.Attribute):
        if isinstance(base, Mat):
            return self._mat_attr(base, node)
        if isinstance(base, Stmt):
            raise self.error(node, f"a scalar has no attribute '{node.attr}'")
        try:
            v = getattr(base, node.attr)
            if hasattr(v, "name_after") and hasattr(v, "gpu_buffer") and not getattr(v, "is_grad", False):
                v.name_after(node.attr)  # a field held by an object (self.x): named after the attribute
            return v
        except WgpuAdError:
            raise
        except AttributeError:
            raise self.error(node, f"{type(base).__name__} has no attribute '{node.attr}'") from None

    def _mat_attr(self, m: Mat, node: ast.Attribute):
        idx = swizzle_indices(node.attr)
        if idx is not None and m.is_vector:
            for k in idx:
                if k >= m.n:
                    raise self.error(node, f"swizzle '.{node.attr}' out of range for a {m.n}-vector")
            return m.entries[idx[0]] if len(idx) == 1 else Mat([m.entries[k] for k in idx], (len(idx),))
        if node.attr == "T":
            return self.o.transpose(m)
        if node.attr in ("n", "m"):
            return getattr(m, node.attr)
        if node.attr == "shape":
            return m.shape
        return MatMethod(m, node.attr, node)

    def visit_Subscript(self, node: ast.Subscript):
        return self.value(eval_ref_or_value(self, node))

    def _index_static(self, base, key, node):
        if is_static(base) and is_static(key):
            try:
                return base[key]
            except Exception as e:
                raise self.error(node, f"cannot index {type(base).__name__}: {e}") from None
        if isinstance(base, (list, tuple)):
            raise self.error(node, "indexing a Python list with a GPU value is not supported; use ti.Vector")
        raise self.error(node, f"cannot index a {type(base).__name__}")

    def _mat_index(self, m: Mat, key, node):
        keys = list(key) if isinstance(key, tuple) else [key]
        if isinstance(key, Mat):
            keys = list(key.entries)
        if all(isinstance(k, int) for k in keys):
            if m.is_vector and len(keys) == 1:
                return m.entries[_norm_index(self, keys[0], m.n, node)]
            if not m.is_vector and len(keys) == 2:
                return m.at(_norm_index(self, keys[0], m.n, node), _norm_index(self, keys[1], m.m, node))
            if not m.is_vector and len(keys) == 1:
                return Mat(m.rows()[_norm_index(self, keys[0], m.n, node)], (m.m,))
            raise self.error(node, f"cannot index a matrix of shape {m.shape} with {len(keys)} indices")
        # a GPU-computed index into a local vector/matrix: select among the entries
        if m.is_vector and len(keys) == 1:
            cands = m.entries
            flat = keys[0]
        elif not m.is_vector and len(keys) == 2:
            cands = m.entries
            flat = self.o.binary(Op.ADD, self.o.binary(Op.MUL, keys[0], m.m), keys[1])
        else:
            raise self.error(node, f"cannot index a matrix of shape {m.shape} with {len(keys)} indices")
        acc = cands[-1]
        for k in range(len(cands) - 2, -1, -1):
            acc = self.o.select(self.o.binary(Op.EQ, flat, k), cands[k], acc)
        return acc

    def visit_Slice(self, node: ast.Slice):
        parts = [self.visit(p) if p is not None else None for p in (node.lower, node.upper, node.step)]
        if not all(is_static(p) for p in parts):
            raise self.error(node, "slices must have compile-time bounds")
        return slice(*parts)

    def visit_Index(self, node):  # Python < 3.9
        return self.visit(node.value)

    def visit_JoinedStr(self, node):
        return fstring_value(self, node)

    def ref(self, node: ast.expr) -> Ref:
        return make_ref(self, node)

    def visit_Call(self, node: ast.Call):
        return lower_call(self, node)


def _constant(v):
    """Python-scope NumPy values (ti.Vector([...]) outside kernels, np.float32(...)) become
    compile-time constants: a small array is a constant vector/matrix."""
    if isinstance(v, np.generic) and v.dtype.kind in "fiub":
        return v.item()
    if isinstance(v, np.ndarray) and v.dtype.kind in "fiub" and v.ndim in (1, 2) and 0 < v.size <= 64:
        return Mat([x.item() for x in v.ravel()], tuple(v.shape))
    return v


def _norm_index(fl: FuncLowerer, k: int, n: int, node) -> int:
    if not -n <= k < n:
        raise fl.error(node, f"index {k} out of range for a vector/matrix dimension of size {n}")
    return k % n


def _is_loop_var(v) -> bool:
    return isinstance(v, Stmt) and v.op is Op.LOOP_INDEX


def _construct_name(node: ast.AST) -> str:
    names = {"Lambda": "lambda", "ListComp": "list comprehension", "DictComp": "dict comprehension",
             "SetComp": "set comprehension", "GeneratorExp": "generator expression", "Try": "try/except",
             "With": "with", "FunctionDef": "a nested function definition", "ClassDef": "a class definition",
             "Global": "global", "Nonlocal": "nonlocal", "Delete": "del", "Raise": "raise",
             "Import": "import", "ImportFrom": "import", "Yield": "yield", "Await": "await",
             "Dict": "a dict literal", "Set": "a set literal", "NamedExpr": "the walrus operator :=",
             "Match": "match", "AsyncFor": "async for", "Lambda_": "lambda", "Starred": "star unpacking"}
    n = type(node).__name__
    return names.get(n, f"'{n}'")
