"""ti.ndarray: a global array passed to kernels as an argument (its shape is a runtime value).

Same storage and Python-scope access as fields; its dtype may be a scalar or an element type
(ti.types.vector(3, ti.f32), ti.math.mat2 ...). Not part of ti.root, so lazy_grad() leaves it alone.
"""
from __future__ import annotations

from ..types import DType, MatrixType, VectorType
from ..errors import GradientDTypeError, WgpuAdError
from ..user_code import assigned_name
from .storage import Storage, check_dtype, normalize_shape


class Ndarray(Storage):
    _kind = "ndarray"
    is_field = False

    def __init__(self, dtype: DType, shape: tuple, element_shape: tuple = (), name: str | None = None):
        super().__init__(dtype, shape, element_shape, name)

    @property
    def element_type(self):
        """The dtype argument as given back: a DType, VectorType or MatrixType."""
        es = self.element_shape
        if not es:
            return self.dtype
        return VectorType(es[0], self.dtype) if len(es) == 1 else MatrixType(es[0], es[1], self.dtype)

    def _new_grad(self) -> "Ndarray":
        return Ndarray(self.dtype, self._shape, self.element_shape)

    def _new_dual(self) -> "Ndarray":
        return Ndarray(self.dtype, self._shape, self.element_shape)


def ndarray(dtype, shape, needs_grad: bool = False, name: str | None = None, needs_dual: bool = False) -> Ndarray:
    """ti.ndarray(ti.f32, shape=(n, m)) or ti.ndarray(ti.math.vec3, shape=n)."""
    if isinstance(dtype, VectorType):
        element_shape, scalar = (dtype.n,), dtype.dtype
    elif isinstance(dtype, MatrixType):
        element_shape, scalar = (dtype.n, dtype.m), dtype.dtype
    else:
        element_shape, scalar = (), dtype
    dt = check_dtype(scalar, "ti.ndarray")
    if shape is None:
        raise WgpuAdError("ti.ndarray: shape= is required (an int or a tuple of ints)")
    if needs_grad and not dt.is_float:
        raise GradientDTypeError(f"ti.ndarray: needs_grad=True needs a float dtype, got {dt}")
    if needs_dual and not dt.is_float:
        raise GradientDTypeError(f"ti.ndarray: needs_dual=True needs a float dtype, got {dt}")
    arr = Ndarray(dt, normalize_shape(shape, "ti.ndarray"), element_shape, name)
    arr.assigned_name = assigned_name()
    if needs_grad:
        arr._attach_grad()
    if needs_dual:
        arr._attach_dual()
    return arr
