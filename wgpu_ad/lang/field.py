"""ti.field, ti.Vector.field, ti.Matrix.field: global arrays that kernels read and write by name.

A field made without shape= is unplaced until ti.root.dense(...).place(x) (or root.place(x) for
0-d) gives it one. Gradients are fields too (x.grad, is_grad=True, primal=x), and so are the
duals of forward mode (x.dual, is_dual=True, primal=x).
"""
from __future__ import annotations

import operator

from ..types import DType
from ..errors import GradientDTypeError, WgpuAdError
from ..user_code import assigned_name
from . import snode as _snode
from .storage import Storage, check_dtype, normalize_shape


class Field(Storage):
    _kind = "field"
    is_field = True

    def __init__(self, dtype: DType, shape: tuple | None, element_shape: tuple = (), name: str | None = None):
        super().__init__(dtype, shape, element_shape, name)
        # a float field's gradient field exists from the start (as in Taichi), to be placed by hand
        # (ti.root.dense(...).place(x.grad)); it holds data once placed that way, by needs_grad=True
        # or by ti.root.lazy_grad() (then x._grad is it)
        self._grad_handle: Field | None = None
        self._placed_by_hand = False  # a gradient (dual) placed with place(x.grad) (place(x.dual))
        self._dual_handle: Field | None = None  # x.dual taken before it had storage, as x.grad

    @property
    def grad(self) -> "Field":
        if self._grad is None and not self.is_grad and self.dtype.is_float:
            if self._grad_handle is None:
                g = self._grad_handle = Field(self.dtype, None, self.element_shape)
                g.is_grad, g.primal = True, self
            return self._grad_handle
        return super().grad

    @property
    def dual(self) -> "Field":
        # before placement only: ti.root.dense(...).place(x, x.dual); a placed field without a dual
        # gets the error naming needs_dual / lazy_dual
        if self._dual is None and not self.is_grad and not self.is_dual and self.dtype.is_float and (
                self._shape is None or self._dual_handle is not None):
            if self._dual_handle is None:
                d = self._dual_handle = Field(self.dtype, None, self.element_shape)
                d.is_dual, d.primal = True, self
            return self._dual_handle
        return super().dual

    @property
    def shape(self) -> tuple[int, ...]:
        if self.is_grad and self.primal._grad is not self:
            raise WgpuAdError(self.primal._no_grad_message())
        if self.is_dual and self.primal._dual is not self:
            raise WgpuAdError(self.primal._no_dual_message())
        if self._shape is None:
            n = (self.primal.name if self.primal is not None else self.name) or "x"
            raise WgpuAdError(f"{self._label()} has no shape yet: give it shape= when creating it, or place "
                              f"it with ti.root.dense(ti.i, n).place({n}) (ti.root.place({n}) for a 0-d field)")
        return self._shape

    @property
    def is_placed(self) -> bool:
        return self._shape is not None

    def _place(self, shape: tuple) -> None:
        if self.is_grad or self.is_dual:
            return self._place_grad(shape)
        if self._shape is not None:
            raise WgpuAdError(f"{self._label()} already has shape {self._shape}; a field is placed once "
                              f"(create it without shape= to place it with ti.root)")
        self._check_alive()
        g = self._grad
        if g is not None and g._shape is not None and g._shape != shape:
            raise WgpuAdError(f"{self._label()} is placed with shape {shape}, but its gradient was placed with "
                              f"shape {g._shape}; a gradient has its field's shape")
        d = self._dual
        if d is not None and d._shape is not None and d._shape != shape:
            raise WgpuAdError(f"{self._label()} is placed with shape {shape}, but its dual was placed with "
                              f"shape {d._shape}; a dual has its field's shape")
        self._shape = shape
        if g is not None:
            g._shape = shape
        if self._dual is not None:
            self._dual._shape = shape

    def _place_grad(self, shape: tuple) -> None:
        """place(x.grad): the gradient gets storage of x's shape, and x has a gradient from now on
        (place(x.dual): the same for the dual)."""
        p = self.primal
        p._check_alive()
        n = p.name or "x"
        what = "dual" if self.is_dual else "grad"
        if self._placed_by_hand:
            raise WgpuAdError(f"{self._label()} is already placed; a field is placed once")
        want = p._shape if p._shape is not None else self._shape
        if want is not None and want != shape:
            raise WgpuAdError(f"{n}.{what} is placed with shape {shape}, but {p._label()} has shape {want}; "
                              f"place the {'dual' if self.is_dual else 'gradient'} with its field's shape")
        self._shape = shape
        self._placed_by_hand = True
        if self.is_dual:
            p._attach_dual()
        else:
            p._attach_grad()

    def _new_grad(self) -> "Field":
        g = self._grad_handle  # x.grad was taken before it had storage: that object becomes it
        if g is None:
            return Field(self.dtype, self._shape, self.element_shape)
        if g._shape is None:
            g._shape = self._shape
        return g

    def _no_grad_message(self) -> str:
        if self.is_grad:
            return super()._no_grad_message()
        n = self.name or "x"
        if not self.dtype.is_float:
            return f"{self._label()} has dtype {self.dtype}: only float fields have gradients"
        return (f"{self._label()} has no gradient: create it with needs_grad=True, call ti.root.lazy_grad(), "
                f"or place {n}.grad with ti.root (ti.root.dense(ti.i, n).place({n}, {n}.grad)) before using it")

    def _new_dual(self) -> "Field":
        d = self._dual_handle  # x.dual was taken before it had storage: that object becomes it
        if d is None:
            return Field(self.dtype, self._shape, self.element_shape)
        if d._shape is None:
            d._shape = self._shape
        return d

    def _no_dual_message(self) -> str:
        if self.is_grad or self.is_dual:
            return super()._no_dual_message()
        n = self.name or "x"
        return (f"{self._label()} has no dual: create it with needs_dual=True or call "
                f"ti.root.lazy_dual() before using {n}.dual")


def _make(dtype, shape, element_shape: tuple, name, needs_grad: bool, offset, what: str,
          needs_dual: bool = False) -> Field:
    if offset is not None:
        raise WgpuAdError(f"{what}(offset={offset!r}) is not supported: wgpu_ad fields start at index 0; "
                          f"shift the index in the kernel instead")
    dt = check_dtype(dtype, what)
    if needs_grad and not dt.is_float:
        raise GradientDTypeError(f"{what}: needs_grad=True needs a float dtype, got {dt}")
    if needs_dual and not dt.is_float:
        raise GradientDTypeError(f"{what}: needs_dual=True needs a float dtype, got {dt}")
    f = Field(dt, None, element_shape, name)
    f.assigned_name = assigned_name()
    if needs_grad:
        f._attach_grad()
    if needs_dual:
        f._attach_dual()
    if shape is not None:
        f._place(normalize_shape(shape, what))
        _snode.root._adopt(f)  # shape= places under root, as in Taichi (lazy_grad / lazy_dual apply)
    return f


def _component_count(n, what: str, arg: str) -> int:
    try:
        n = operator.index(n)
    except TypeError:
        raise WgpuAdError(f"{what}: {arg} must be an int, got {n!r}") from None
    if n < 1:
        raise WgpuAdError(f"{what}: {arg} must be >= 1, got {n}")
    return n


def field(dtype, shape=None, name: str | None = None, needs_grad: bool = False, offset=None,
          layout=None, needs_dual: bool = False) -> Field:
    """ti.field(ti.f32, shape=(n, m)): a scalar field. layout is accepted and ignored (always AOS)."""
    return _make(dtype, shape, (), name, needs_grad, offset, "ti.field", needs_dual)


def vector_field(n: int, dtype, shape=None, name: str | None = None, needs_grad: bool = False,
                 offset=None, layout=None, needs_dual: bool = False) -> Field:
    """ti.Vector.field(3, ti.f32, shape=n): n components per element."""
    n = _component_count(n, "ti.Vector.field", "n")
    return _make(dtype, shape, (n,), name, needs_grad, offset, "ti.Vector.field", needs_dual)


def matrix_field(n: int, m: int, dtype, shape=None, name: str | None = None, needs_grad: bool = False,
                 offset=None, layout=None, needs_dual: bool = False) -> Field:
    """ti.Matrix.field(2, 3, ti.f32, shape=n): n x m components per element, row-major."""
    n = _component_count(n, "ti.Matrix.field", "n")
    m = _component_count(m, "ti.Matrix.field", "m")
    return _make(dtype, shape, (n, m), name, needs_grad, offset, "ti.Matrix.field", needs_dual)
