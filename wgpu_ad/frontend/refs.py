"""Things that can be assigned to: local variables and global (field / ndarray) elements.

A Ref is a list of scalar slots with a shape; `load` gives a value, `store` writes one,
`atomic` applies an atomic op and returns the old value. Global refs compute the linear index
(row-major over the field's shape, components innermost) and, in debug mode, check bounds.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from ..errors import CompileError
from ..ir.nodes import Buffer, Stmt
from ..ir.ops import AtomicKind, Op
from ..types import DType, i32, u1
from .values import Mat, Ops, dtype_of, entry_names, is_static

_ATOMIC_BINOP = {AtomicKind.ADD: Op.ADD, AtomicKind.SUB: Op.SUB, AtomicKind.MIN: Op.MIN,
                 AtomicKind.MAX: Op.MAX, AtomicKind.AND: Op.BIT_AND, AtomicKind.OR: Op.BIT_OR,
                 AtomicKind.XOR: Op.BIT_XOR}


class Ref(ABC):

    @abstractmethod
    def scalar_refs(self) -> list["Ref"]:
        """One ref per scalar component, in row-major order."""

    def _assemble(self, vals: list):
        return vals[0] if self.shape == () else Mat(vals, self.shape)

    def _split(self, o: Ops, value) -> list:
        n = len(self.scalar_refs())
        if isinstance(value, Mat):
            if value.shape != self.shape and not (len(value.entries) == n and len(self.shape) == 1):
                raise CompileError(f"cannot assign a value of shape {value.shape} to {self.describe()} of shape {self.shape}", o.b.loc)
            return list(value.entries)
        if isinstance(value, (list, tuple)):
            if len(self.shape) == 2 and value and all(isinstance(r, (list, tuple, Mat)) for r in value):
                rows = [list(r.entries) if isinstance(r, Mat) else list(r) for r in value]  # [[a, b], [c, d]]
                if [len(r) for r in rows] != [self.shape[1]] * self.shape[0]:
                    raise CompileError(f"cannot assign rows of lengths {[len(r) for r in rows]} to "
                                       f"{self.describe()} of shape {self.shape}", o.b.loc)
                value = [e for r in rows for e in r]
            if len(value) != n:
                raise CompileError(f"cannot assign {len(value)} values to {self.describe()} with {n} components", o.b.loc)
            return list(value)
        return [value] * n  # a scalar broadcasts, like Taichi's fill

    def describe(self) -> str:
        return "a variable"


@dataclass
class LocalRef(Ref):
    """One or more ALLOCA slots (a scalar local, or a vector/matrix local)."""

    slots: list
    shape: tuple
    name: str

    def scalar_refs(self):
        return [LocalRef([s], (), self.name) for s in self.slots]

    def dtype(self) -> DType:
        return self.slots[0].dtype

    def load(self, o: Ops):
        return self._assemble([o.b.load(s) for s in self.slots])

    def store(self, o: Ops, value):
        for s, v in zip(self.slots, self._split(o, value)):
            o.b.store(s, o.to_stmt(o.cast(v, s.dtype), s.dtype))

    def atomic(self, o: Ops, kind: AtomicKind, value):
        old = self.load(o)
        self.store(o, o.binary(_ATOMIC_BINOP[kind], old, value))
        return old

    def describe(self) -> str:
        return f"variable '{self.name}'"


@dataclass
class GlobalRef(Ref):
    """Elements of a field/ndarray at one multi-index: linear indices into its buffer."""

    buffer: Buffer
    indices: list          # one i32 Stmt per scalar component
    shape: tuple
    label: str             # "x[i, j]" for messages
    access: list = None    # per scalar: (multi-index..., component), for the autodiff access analysis

    def scalar_refs(self):
        acc = self.access or [None] * len(self.indices)
        return [GlobalRef(self.buffer, [ix], (), self.label, [a]) for ix, a in zip(self.indices, acc)]

    def _tag(self, stmts: list) -> None:
        for st, a in zip(stmts, self.access or []):
            st.index = a

    def dtype(self) -> DType:
        return self.buffer.dtype

    def load(self, o: Ops):
        names = entry_names(self.buffer.name.replace(".", "_"), self.shape)
        vals = [o.b.emit(Op.GLOBAL_LOAD, [ix], self.buffer.dtype, self.buffer, name=n)
                for ix, n in zip(self.indices, names)]
        self._tag(vals)
        return self._assemble(vals)

    def store(self, o: Ops, value):
        dt = self.buffer.dtype
        self._tag([o.b.emit(Op.GLOBAL_STORE, [ix, o.to_stmt(o.cast(v, dt), dt)], None, self.buffer)
                   for ix, v in zip(self.indices, self._split(o, value))])

    def atomic(self, o: Ops, kind: AtomicKind, value):
        dt = self.buffer.dtype
        if dt.is_float and kind in (AtomicKind.AND, AtomicKind.OR, AtomicKind.XOR):
            raise CompileError(f"atomic {kind.value} needs an integer field; {self.label} is {dt}", o.b.loc)
        olds = [o.b.emit(Op.ATOMIC, [ix, o.to_stmt(o.cast(v, dt), dt)], dt, (kind, self.buffer))
                for ix, v in zip(self.indices, self._split(o, value))]
        self._tag(olds)
        return self._assemble(olds)

    def describe(self) -> str:
        return self.label


def component_ref(o: Ops, ref: Ref, key) -> Ref:
    """ref[key] for a vector/matrix-valued ref with a static key (int or (i, j))."""
    subs = ref.scalar_refs()
    shape = ref.shape
    if not isinstance(key, tuple):
        key = (key,)
    if not all(isinstance(k, int) for k in key):
        raise CompileError("assigning through a GPU-computed component index is not supported; use ti.static indices", o.b.loc)
    if len(shape) == 1 and len(key) == 1:
        return subs[_check(o, key[0], shape[0], ref)]
    if len(shape) == 2 and len(key) == 2:
        return subs[_check(o, key[0], shape[0], ref) * shape[1] + _check(o, key[1], shape[1], ref)]
    if len(shape) == 2 and len(key) == 1:  # a row of a matrix
        i = _check(o, key[0], shape[0], ref)
        return _rebuild(ref, subs[i * shape[1]:(i + 1) * shape[1]], (shape[1],))
    raise CompileError(f"cannot index {ref.describe()} of shape {shape} with {len(key)} indices", o.b.loc)


def _check(o: Ops, k: int, n: int, ref: Ref) -> int:
    if not -n <= k < n:
        raise CompileError(f"component index {k} out of range for {ref.describe()} with {n} components", o.b.loc)
    return k % n


def _rebuild(ref: Ref, subs: list[Ref], shape: tuple) -> Ref:
    if isinstance(ref, LocalRef):
        return LocalRef([s.slots[0] for s in subs], shape, ref.name)
    return GlobalRef(ref.buffer, [s.indices[0] for s in subs], shape, ref.label, [s.access[0] for s in subs])


def swizzle_ref(o: Ops, ref: Ref, attr: str) -> Ref | None:
    """v.x / v.xy on a vector ref; None when attr is not a swizzle."""
    idx = swizzle_indices(attr)
    if idx is None or len(ref.shape) != 1:
        return None
    subs = ref.scalar_refs()
    for k in idx:
        _check(o, k, ref.shape[0], ref)
    if len(idx) == 1:
        return subs[idx[0]]
    return _rebuild(ref, [subs[k] for k in idx], (len(idx),))


def swizzle_indices(attr: str) -> list[int] | None:
    for alphabet in ("xyzw", "rgba", "uvw"):
        if attr and all(c in alphabet for c in attr) and len(attr) <= 4:
            return [alphabet.index(c) for c in attr]
    return None


def linear_index(o: Ops, multi: list, shape: list, elem_size: int) -> Stmt:
    """Row-major flat index * elem_size; `shape` entries are ints or i32 Stmts (ndarrays)."""
    flat = 0
    for k, ix in enumerate(multi):
        flat = ix if k == 0 else o.binary(Op.ADD, o.binary(Op.MUL, flat, shape[k]), ix)
    if elem_size != 1:
        flat = o.binary(Op.MUL, flat, elem_size)
    return o.to_stmt(flat, i32)


def bounds_assert(o: Ops, multi: list, shape: list, label: str, what: str) -> None:
    """Debug mode: one ASSERT that every index is within [0, extent)."""
    cond = True
    for ix, n in zip(multi, shape):
        ok = o.binary(Op.AND, o.binary(Op.GE, ix, 0), o.binary(Op.LT, ix, n))
        cond = ok if cond is True else o.binary(Op.AND, cond, ok)
    if is_static(cond):
        return
    shp = ", ".join(str(n) if isinstance(n, int) else "{}" for n in shape)
    dyn = [n for n in shape if not isinstance(n, int)]
    idx = ", ".join("{}" for _ in multi)
    loc = o.b.loc
    where = f" at {loc.file}:{loc.line}" if loc else ""
    msg = f"index ({idx}) is out of range for {what} of shape ({shp}{',' if len(shape) == 1 else ''}) in {label}{where}"
    vals = [o.to_stmt(v, i32) for v in multi] + [o.to_stmt(v, i32) for v in dyn]
    o.b.emit(Op.ASSERT, [o.to_stmt(cond, u1)] + vals, None, msg)


@dataclass
class DynamicComponentRef(Ref):
    """m[i][j, k] / v[j] with component indices computed on the GPU: one scalar component of a
    vector / matrix ref, chosen at run time. A load selects among the components; a store or an
    atomic writes the component whose index matches, under an `if` per component, so every access
    keeps a static component (for the autodiff access analysis) and the adjoint needs no rule of
    its own. An index out of range writes nothing (and reads the last component)."""

    subs: list            # the scalar refs of the vector / matrix, in row-major order
    flat: Stmt            # the i32 row-major component index
    base: Ref
    shape: tuple = ()

    def scalar_refs(self):
        return [self]

    def dtype(self) -> DType:
        return self.subs[0].dtype()

    def _hits(self, o: Ops):
        return [(c, o.binary(Op.EQ, self.flat, c)) for c in range(len(self.subs))]

    def load(self, o: Ops):
        v = self.subs[-1].load(o)
        for c in range(len(self.subs) - 2, -1, -1):
            v = o.select(o.binary(Op.EQ, self.flat, c), self.subs[c].load(o), v)
        return v

    def store(self, o: Ops, value):
        (v,) = self._split(o, value)
        for c, hit in self._hits(o):
            s = o.b.if_(o.to_stmt(hit, u1))
            with o.b.at(s.blocks[0]):
                self.subs[c].store(o, v)

    def atomic(self, o: Ops, kind: AtomicKind, value):
        (v,) = self._split(o, value)
        old = self.load(o)  # the value before, as an atomic returns it
        for c, hit in self._hits(o):
            s = o.b.if_(o.to_stmt(hit, u1))
            with o.b.at(s.blocks[0]):
                self.subs[c].atomic(o, kind, v)
        return old

    def describe(self) -> str:
        return f"a component of {self.base.describe()}"


def dynamic_component_ref(o: Ops, ref: Ref, key) -> Ref:
    """ref[key] for a vector/matrix-valued ref whose key has GPU-computed indices (all of them given:
    a scalar component)."""
    key = key if isinstance(key, tuple) else (key,)
    shape = ref.shape
    if len(key) != len(shape):
        raise CompileError(f"assigning through a GPU-computed index needs one index per dimension of "
                           f"{ref.describe()} (shape {shape}), got {len(key)}", o.b.loc)
    for k in key:
        if not is_static(k) and dtype_of(k).is_float:
            raise CompileError("a component index must be an integer", o.b.loc)
    flat = key[0] if len(key) == 1 else o.binary(Op.ADD, o.binary(Op.MUL, key[0], shape[1]), key[1])
    return DynamicComponentRef(ref.scalar_refs(), o.to_stmt(flat, i32), ref)
