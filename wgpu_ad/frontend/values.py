"""Frontend values and the scalar/matrix operations on them.

A kernel-scope value is one of:
  - a Python object (int, float, bool, field, function ...): known at compile time, folded in Python;
  - an IR Stmt: a scalar computed on the GPU;
  - a Mat: a vector or matrix, a row-major list of scalar entries (Stmt or Python numbers).
Vectors and matrices are unrolled here, so the IR, autodiff and codegen only see scalars.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from ..errors import CompileError, ZeroDivisionCheck
from ..ir.builder import Builder
from ..ir.nodes import Stmt
from ..ir.ops import GroupOp, Op
from ..types import DType, f32, i32, promote, u1, u32
from .fold import fold

Scalar = "Stmt | int | float | bool"


def entry_names(name: str, shape: tuple) -> list[str]:
    """Names of a variable's scalars in the WGSL: `r` for a scalar, `r_x`, `r_y` ... for a vector
    of up to 4, `r_5` for a longer one, `F_01` for a matrix entry."""
    if not shape:
        return [name]
    if len(shape) == 1:
        return [f"{name}_{'xyzw'[k] if shape[0] <= 4 else k}" for k in range(shape[0])]
    return [f"{name}_{r}{c}" for r in range(shape[0]) for c in range(shape[1])]


@dataclass
class Mat:
    entries: list      # row-major scalars
    shape: tuple       # (n,) vector or (n, m) matrix

    @property
    def n(self) -> int:
        return self.shape[0]

    @property
    def m(self) -> int:
        return self.shape[1] if len(self.shape) == 2 else 1

    @property
    def is_vector(self) -> bool:
        return len(self.shape) == 1

    def at(self, i: int, j: int | None = None):
        if j is None:
            return self.entries[i]
        return self.entries[i * self.m + j]

    def rows(self) -> list[list]:
        return [self.entries[i * self.m:(i + 1) * self.m] for i in range(self.n)]


def is_static(v) -> bool:
    return not isinstance(v, (Stmt, Mat))


# the integer constants each type takes; a negative u32 constant is its two's complement (Taichi's
# u[i] = -1 is 2**32 - 1), an explicit ti.cast wraps anything
_RANGES = {i32: (-2**31, 2**31 - 1), u32: (-2**31, 2**32 - 1)}


def _check_range(v: int, d: DType, loc) -> None:
    """An integer constant that does not fit its type would wrap on the GPU: a compile error, with
    the caret on the literal where the source line spells it."""
    lo, hi = _RANGES[d]
    if lo <= v <= hi:
        return
    lo = max(lo, 0) if d == u32 else lo
    wrapped = (v - lo) % 2**32 + lo
    if loc is not None and loc.source_line:
        for text in (str(v), hex(v), f"{v:_}"):
            m = re.search(r"(?<![\w.])" + re.escape(text) + r"(?![\w.])", loc.source_line[loc.col:], re.I)
            if m:
                loc = dataclasses.replace(loc, col=loc.col + m.start())
                break
    rng = f"{lo} to {hi}" if d == i32 else f"0 to {hi}; a negative constant down to -2147483648 is taken as its two's complement"
    raise CompileError(f"the integer {v} does not fit in {d} ({rng}); it would wrap to {wrapped}. Write it as a "
                       f"float ({v}.0) if that is what it is, or keep the value in range", loc)


def py_dtype(v) -> DType:
    if isinstance(v, bool):
        return i32
    if isinstance(v, int):
        return i32
    if isinstance(v, float):
        return f32
    raise TypeError(v)


def dtype_of(v) -> DType:
    if isinstance(v, Stmt):
        return v.dtype
    if isinstance(v, Mat):
        return dtype_of_entries(v.entries)
    return py_dtype(v)


def dtype_of_entries(entries) -> DType:
    dt = None
    for e in entries:
        d = e.dtype if isinstance(e, Stmt) else py_dtype(e)
        dt = d if dt is None else promote(dt, d)
    return dt or f32


# unary ops that take only floats: an integer or boolean argument is converted to f32 first
_FLOAT_UNARY = GroupOp.Unary & GroupOp.FloatOnly


class Ops:
    """Scalar and matrix arithmetic with Taichi's typing rules, emitting IR through a Builder."""

    def __init__(self, b: Builder, check_divisors: bool = False, kernel: str = ""):
        self.b = b
        self.check_divisors = check_divisors  # debug mode: integer // and % by 0 raise at run time
        self.kernel = kernel

    # ---- scalars -------------------------------------------------------------------------
    def to_stmt(self, v, dtype: DType | None = None) -> Stmt:
        if isinstance(v, Stmt):
            return v if dtype is None else self.b.cast(v, dtype)
        if isinstance(v, Mat):
            raise CompileError("expected a scalar, got a vector/matrix", self.b.loc)
        if not isinstance(v, (int, float, bool)):
            raise CompileError(f"expected a number, got {type(v).__name__} {v!r}", self.b.loc)
        d = dtype or py_dtype(v)
        if d == u1:
            return self.b.const(bool(v), u1)
        if d in (i32, u32) and not isinstance(v, bool) and isinstance(v, int):
            _check_range(v, d, self.b.loc)
        return self.b.const(v, d)

    def cast(self, v, dtype: DType, explicit: bool = False):
        """v converted to dtype; explicit (ti.cast, int(), m.cast): a constant integer wraps into
        range as on the GPU, else one out of range is a compile error (_check_range)."""
        if isinstance(v, Mat):
            return Mat([self.cast(e, dtype, explicit) for e in v.entries], v.shape)
        if is_static(v):
            if dtype.is_float:
                return float(v)
            if dtype in _RANGES:
                if explicit:  # ti.cast(-1, ti.u32) = 2**32 - 1, ti.cast(3000000000, ti.i32) < 0
                    lo = _RANGES[dtype][0] if dtype == i32 else 0
                    return (int(v) - lo) % 2**32 + lo
                if isinstance(v, int) and not isinstance(v, bool):
                    _check_range(v, dtype, self.b.loc)
            return int(v) if dtype != u1 else bool(v)
        if v.dtype == dtype:
            return v
        if v.op is Op.CONST:
            return self.to_stmt(self.cast(v.attr, dtype, explicit), dtype)
        return self.b.cast(v, dtype)

    def truth(self, v) -> Stmt | bool:
        """A condition as u1 (or a Python bool when static)."""
        if is_static(v):
            return bool(v)
        if isinstance(v, Mat):
            raise CompileError("a vector/matrix cannot be used as a condition; use any()/all() on a comparison", self.b.loc)
        if v.dtype == u1:
            return v
        return self.b.emit(Op.NE, [v, self.to_stmt(0, v.dtype)])

    def unary(self, op: Op, x):
        if isinstance(x, Mat):
            return Mat([self.unary(op, e) for e in x.entries], x.shape)
        if is_static(x):
            return fold(op, x, loc=self.b.loc)
        if op is Op.NOT:
            return self.b.emit(Op.NOT, [self.truth(x)])
        if op in _FLOAT_UNARY and not x.dtype.is_float:
            x = self.b.cast(x, f32)
        if x.dtype == u1 and op in (Op.NEG, Op.ABS, Op.BIT_NOT):
            x = self.b.cast(x, i32)
        return self.b.emit(op, [x])

    def binary(self, op: Op, a, b):
        if isinstance(a, Mat) or isinstance(b, Mat):
            return self._elementwise(op, a, b)
        if is_static(a) and is_static(b):
            return fold(op, a, b, loc=self.b.loc)
        da, db = dtype_of(a), dtype_of(b)
        if op in (Op.AND, Op.OR):
            return self.b.emit(op, [self.to_stmt(self.truth(a), u1), self.to_stmt(self.truth(b), u1)])
        if op in (Op.SHL, Op.SHR):
            if da.is_float or db.is_float:
                raise CompileError("shift operands must be integers", self.b.loc)
            dt = da if da != u1 else i32
            return self.b.emit(op, [self.to_stmt(a, dt), self.to_stmt(b, dt)], dt)
        da, db = self._literal_types(a, b, da, db)
        dt = promote(da, db)
        if dt == u1:
            dt = i32
        if op in (Op.DIV, Op.ATAN2) and not dt.is_float:
            dt = f32  # Taichi: '/' on integers is true division
        if op in (Op.BIT_AND, Op.BIT_OR, Op.BIT_XOR) and dt.is_float:
            raise CompileError(f"bitwise operator on floats ({da}, {db})", self.b.loc)
        if op is Op.POW:
            return self.pow(a, b, dt)
        sa, sb = self.to_stmt(a, dt), self.to_stmt(b, dt)
        if op in (Op.FLOORDIV, Op.MOD) and not dt.is_float:
            self._divisor_check(op, sa, b if is_static(b) else sb)
        return self.b.emit(op, [sa, sb])

    def _divisor_check(self, op: Op, a: Stmt, b) -> None:
        """Integer x // 0 and x % 0 raise in Python; WGSL gives x and 0. A constant 0 is a compile
        error; in debug mode an ASSERT reports a 0 found at run time (KernelZeroDivisionError)."""
        sym = "//" if op is Op.FLOORDIV else "%"
        if is_static(b):
            if b == 0:
                raise CompileError(f"integer division by zero: x {sym} 0 (Python raises ZeroDivisionError)", self.b.loc)
            return
        if self.check_divisors:
            check = ZeroDivisionCheck(self.kernel, sym, self.b.loc)
            self.b.emit(Op.ASSERT, [self.b.emit(Op.NE, [b, self.to_stmt(0, b.dtype)]), a], None, check)
        # (without debug mode: x // 0 = x and x % 0 = 0, what WGSL gives; docs/language.md)

    @staticmethod
    def _literal_types(a, b, da: DType, db: DType) -> tuple[DType, DType]:
        """A Python literal adopts the other operand's type where it fits (1 + x_f32 is f32,
        2 * n_u32 is u32, 0.5 * n_i32 is f32)."""
        if is_static(a):
            da = db if (not isinstance(a, float) or db.is_float) else f32
        if is_static(b):
            db = da if (not isinstance(b, float) or da.is_float) else f32
        return da, db

    def idiv(self, a, b):
        """Integer division truncating toward zero (for index arithmetic on non-negative values)."""
        if is_static(a) and is_static(b):
            return int(a / b)
        return self.b.emit(Op.DIV, [self.to_stmt(a, i32), self.to_stmt(b, i32)], i32)

    def pow(self, a, b, dt: DType):
        # small constant integer exponents become multiplies: exact, differentiable, any sign of a
        if is_static(b) and float(b).is_integer() and abs(b) <= 8:
            e = int(b)
            base = self.to_stmt(a, dt)
            if e == 0:
                return self.to_stmt(1, dt)
            r = base
            for _ in range(abs(e) - 1):
                r = self.b.mul(r, base)
            return r if e > 0 else self.binary(Op.DIV, 1.0, r)
        return self.b.emit(Op.POW, [self.to_stmt(a, dt), self.to_stmt(b, dt)])

    def select(self, c, a, b):
        if isinstance(a, Mat) or isinstance(b, Mat):
            a, b = self._broadcast(a, b)
            cs = c.entries if isinstance(c, Mat) else [c] * len(a.entries)
            return Mat([self.select(ci, x, y) for ci, x, y in zip(cs, a.entries, b.entries)], a.shape)
        c = self.truth(c)
        if is_static(c):
            return a if c else b
        if is_static(a) and is_static(b):
            dt = promote(py_dtype(a), py_dtype(b))
        else:
            dt = promote(*self._literal_types(a, b, dtype_of(a), dtype_of(b)))
        if dt == u1:
            dt = i32
        return self.b.select(c, self.to_stmt(a, dt), self.to_stmt(b, dt))

    # ---- matrices ------------------------------------------------------------------------
    def _broadcast(self, a, b) -> tuple[Mat, Mat]:
        if isinstance(a, Mat) and isinstance(b, Mat):
            if a.shape != b.shape:
                raise CompileError(f"shape mismatch: {a.shape} and {b.shape}", self.b.loc)
            return a, b
        if isinstance(a, Mat):
            return a, Mat([b] * len(a.entries), a.shape)
        return Mat([a] * len(b.entries), b.shape), b

    def _elementwise(self, op: Op, a, b) -> Mat:
        a, b = self._broadcast(a, b)
        return Mat([self.binary(op, x, y) for x, y in zip(a.entries, b.entries)], a.shape)

    def sum(self, xs: list):
        acc = xs[0]
        for x in xs[1:]:
            acc = self.binary(Op.ADD, acc, x)
        return acc

    def dot(self, a: Mat, b: Mat):
        a, b = self._broadcast(a, b)
        return self.sum([self.binary(Op.MUL, x, y) for x, y in zip(a.entries, b.entries)])

    def matmul(self, a: Mat, b: Mat) -> Mat | Stmt:
        if not (isinstance(a, Mat) and isinstance(b, Mat)):
            raise CompileError("@ needs two vectors/matrices", self.b.loc)
        if a.is_vector and b.is_vector:
            return self.dot(a, b)
        if b.is_vector:  # matrix @ vector
            if a.m != b.n:
                raise CompileError(f"matmul shape mismatch: {a.shape} @ {b.shape}", self.b.loc)
            return Mat([self.dot(Mat(r, (a.m,)), b) for r in a.rows()], (a.n,))
        if a.is_vector:  # vector @ matrix (row vector)
            a = Mat(a.entries, (1, a.n))
            r = self.matmul(a, b)
            return Mat(r.entries, (b.m,))
        if a.m != b.n:
            raise CompileError(f"matmul shape mismatch: {a.shape} @ {b.shape}", self.b.loc)
        out = []
        for i in range(a.n):
            for j in range(b.m):
                out.append(self.sum([self.binary(Op.MUL, a.at(i, k), b.at(k, j)) for k in range(a.m)]))
        return Mat(out, (a.n, b.m))

    def transpose(self, a: Mat) -> Mat:
        if a.is_vector:
            return Mat(list(a.entries), (1, a.n))
        return Mat([a.at(i, j) for j in range(a.m) for i in range(a.n)], (a.m, a.n))

    def norm_sqr(self, a: Mat):
        return self.dot(a, a)

    def norm(self, a: Mat, eps=0):
        """sqrt(a . a + eps). Without eps, sqrt(0) is taken out by a select: the derivative of
        |a| at a = 0 is then 0 (abs'(0) = 0 likewise, the smallest subgradient), where the chain
        rule through sqrt would multiply 0 by 1 / sqrt(0) and give NaN, also for |a|**2 and for a
        vector that is zero whatever the inputs (|t * v| at t = 0)."""
        s = self.norm_sqr(a)
        if not (is_static(eps) and eps == 0):
            s = self.binary(Op.ADD, s, eps)
        if is_static(s):
            return self.unary(Op.SQRT, self.cast(s, f32))
        r = self.unary(Op.SQRT, s)
        if not (is_static(eps) and eps == 0):
            return r
        return self.select(self.binary(Op.GT, s, 0.0), r, 0.0)

    def normalized(self, a: Mat, eps=0):
        """a / (|a| + eps): Taichi's definition (eps is added to the norm, not under the root)."""
        n = self.norm(a)
        if not (is_static(eps) and eps == 0):
            n = self.binary(Op.ADD, n, eps)
        return self._elementwise(Op.MUL, a, self.binary(Op.DIV, 1.0, n))

    def cross(self, a: Mat, b: Mat):
        if a.shape == (3,) and b.shape == (3,):
            x = lambda i, j: self.binary(Op.SUB, self.binary(Op.MUL, a.at(i), b.at(j)), self.binary(Op.MUL, a.at(j), b.at(i)))
            return Mat([x(1, 2), x(2, 0), x(0, 1)], (3,))
        if a.shape == (2,) and b.shape == (2,):
            return self.binary(Op.SUB, self.binary(Op.MUL, a.at(0), b.at(1)), self.binary(Op.MUL, a.at(1), b.at(0)))
        raise CompileError(f"cross product needs two 2-D or two 3-D vectors, got {a.shape} and {b.shape}", self.b.loc)

    def outer(self, a: Mat, b: Mat) -> Mat:
        return Mat([self.binary(Op.MUL, x, y) for x in a.entries for y in b.entries], (a.n, b.n))

    def determinant(self, a: Mat):
        if a.is_vector or a.n != a.m or a.n > 4:
            raise CompileError(f"determinant needs a square matrix up to 4x4, got {a.shape}", self.b.loc)
        return self._det([[a.at(i, j) for j in range(a.n)] for i in range(a.n)])

    def _det(self, m: list[list]):
        n = len(m)
        if n == 1:
            return m[0][0]
        if n == 2:
            return self.binary(Op.SUB, self.binary(Op.MUL, m[0][0], m[1][1]), self.binary(Op.MUL, m[0][1], m[1][0]))
        terms = []
        for j in range(n):
            minor = [row[:j] + row[j + 1:] for row in m[1:]]
            t = self.binary(Op.MUL, m[0][j], self._det(minor))
            terms.append(t if j % 2 == 0 else self.unary(Op.NEG, t))
        return self.sum(terms)

    def inverse(self, a: Mat) -> Mat:
        if a.is_vector or a.n != a.m or a.n not in (1, 2, 3):
            raise CompileError(f"inverse supports 1x1, 2x2 and 3x3 matrices, got {a.shape}", self.b.loc)
        n = a.n
        inv_det = self.binary(Op.DIV, 1.0, self.determinant(a))
        m = [[a.at(i, j) for j in range(n)] for i in range(n)]
        if n == 1:
            return Mat([inv_det], (1, 1))
        out = []
        for i in range(n):
            for j in range(n):  # adjugate: cofactor of (j, i)
                minor = [row[:i] + row[i + 1:] for k, row in enumerate(m) if k != j]
                c = self._det(minor)
                if (i + j) % 2:
                    c = self.unary(Op.NEG, c)
                out.append(self.binary(Op.MUL, c, inv_det))
        return Mat(out, (n, n))

    def reduce(self, op: Op, a: Mat):
        acc = a.entries[0]
        for e in a.entries[1:]:
            acc = self.binary(op, acc, e)
        return acc
