"""Python expressions -> IR values, for lower.FuncLowerer: constants, names, operators (with
Python's short-circuit and folding on compile-time values), comparisons, conditional expressions,
list comprehensions over compile-time sequences, attributes (swizzles, .T, .n), subscripts of
fields and local vectors / matrices, slices, f-strings and calls.
"""
from __future__ import annotations

import ast

from ..errors import WgpuAdError
from ..ir.nodes import Stmt
from ..ir.ops import Op
from .captured import is_number
from .methods import MatMethod, eval_ref_or_value, lower_call, make_ref
from .printing import fstring_value
from .refs import Ref, swizzle_indices
from .values import Mat, is_static

BINOPS = {ast.Add: Op.ADD, ast.Sub: Op.SUB, ast.Mult: Op.MUL, ast.Div: Op.DIV,
           ast.FloorDiv: Op.FLOORDIV, ast.Mod: Op.MOD, ast.Pow: Op.POW, ast.LShift: Op.SHL,
           ast.RShift: Op.SHR, ast.BitAnd: Op.BIT_AND, ast.BitOr: Op.BIT_OR, ast.BitXor: Op.BIT_XOR}
CMPOPS = {ast.Lt: Op.LT, ast.LtE: Op.LE, ast.Gt: Op.GT, ast.GtE: Op.GE, ast.Eq: Op.EQ, ast.NotEq: Op.NE}


class ExpressionLowering:
    """Mixed into lower.FuncLowerer (its __init__ sets b, o, pf, scopes)."""

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
        op = BINOPS.get(type(node.op))
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
                r = self.o.binary(CMPOPS[type(opn)], left, right)
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
            elif is_number(v):
                self.k.captured.note_attr(base, node.attr, v, self.pf.loc(node))
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


def _norm_index(fl: ExpressionLowering, k: int, n: int, node) -> int:
    if not -n <= k < n:
        raise fl.error(node, f"index {k} out of range for a vector/matrix dimension of size {n}")
    return k % n
