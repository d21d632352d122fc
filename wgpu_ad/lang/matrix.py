"""ti.Vector / ti.Matrix: constructors that work in kernels (unrolled to scalars) and in Python
scope (NumPy arrays), plus their field and ndarray factories."""
from __future__ import annotations

import numpy as np

from ..frontend.builtins import Builtin
from ..frontend.values import Mat, dtype_of
from ..types import MatrixType, VectorType, f32, to_dtype


def _np_dtype(data, dtype):
    if dtype is not None:
        return to_dtype(dtype).np
    arr = np.asarray(data)
    return np.float32 if arr.dtype.kind == "f" else np.int32


def _mk(shape, entries, dtype):
    m = Mat(list(entries), shape)
    return m


class Vector:
    """ti.Vector([x, y, z]) and the ti.Vector.field / ndarray factories."""

    _wgpu_ad_construct = "Vector"

    def __new__(cls, data, dt=None, dtype=None):
        d = dt or dtype
        return np.asarray(data, dtype=_np_dtype(data, d)).reshape(-1)

    @staticmethod
    def field(n, dtype=f32, shape=None, name=None, needs_grad=False, offset=None, layout=None, needs_dual=False):
        from .field import vector_field
        return vector_field(n, dtype, shape=shape, name=name, needs_grad=needs_grad, offset=offset,
                            needs_dual=needs_dual)

    @staticmethod
    def ndarray(n, dtype=f32, shape=(), needs_grad=False, needs_dual=False):
        from .ndarray import ndarray
        return ndarray(VectorType(n, to_dtype(dtype)), shape, needs_grad=needs_grad, needs_dual=needs_dual)

    zero = Builtin("Vector.zero", lambda dtype, n: np.zeros(n, to_dtype(dtype).np),
                   lambda o, dtype, n: o.cast(_mk((n,), [0] * n, dtype), to_dtype(dtype)))
    one = Builtin("Vector.one", lambda dtype, n: np.ones(n, to_dtype(dtype).np),
                  lambda o, dtype, n: o.cast(_mk((n,), [1] * n, dtype), to_dtype(dtype)))
    unit = Builtin("Vector.unit", lambda n, i, dtype=f32: np.eye(n, dtype=to_dtype(dtype).np)[i],
                   lambda o, n, i, dtype=f32: o.cast(_mk((n,), [1 if k == i else 0 for k in range(n)], dtype), to_dtype(dtype)))


class Matrix:
    """ti.Matrix([[a, b], [c, d]]) and the ti.Matrix.field / ndarray factories."""

    _wgpu_ad_construct = "Matrix"

    def __new__(cls, data, dt=None, dtype=None):
        d = dt or dtype
        return np.asarray(data, dtype=_np_dtype(data, d))

    @staticmethod
    def field(n, m, dtype=f32, shape=None, name=None, needs_grad=False, offset=None, layout=None,
              needs_dual=False):
        from .field import matrix_field
        return matrix_field(n, m, dtype, shape=shape, name=name, needs_grad=needs_grad, offset=offset,
                            needs_dual=needs_dual)

    @staticmethod
    def ndarray(n, m, dtype=f32, shape=(), needs_grad=False, needs_dual=False):
        from .ndarray import ndarray
        return ndarray(MatrixType(n, m, to_dtype(dtype)), shape, needs_grad=needs_grad, needs_dual=needs_dual)

    identity = Builtin("Matrix.identity", lambda dtype, n: np.eye(n, dtype=to_dtype(dtype).np),
                       lambda o, dtype, n: o.cast(_mk((n, n), [1 if i == j else 0 for i in range(n) for j in range(n)], dtype), to_dtype(dtype)))
    zero = Builtin("Matrix.zero", lambda dtype, n, m=None: np.zeros((n, m or n), to_dtype(dtype).np),
                   lambda o, dtype, n, m=None: o.cast(_mk((n, m or n), [0] * (n * (m or n)), dtype), to_dtype(dtype)))
    one = Builtin("Matrix.one", lambda dtype, n, m=None: np.ones((n, m or n), to_dtype(dtype).np),
                  lambda o, dtype, n, m=None: o.cast(_mk((n, m or n), [1] * (n * (m or n)), dtype), to_dtype(dtype)))

    # ti.Matrix.diag(dim, val): val on the diagonal, zeros of val's type elsewhere
    diag = Builtin("Matrix.diag", lambda dim, val: np.diag(np.full(dim, val, dtype=_np_dtype(val, None))),
                   lambda o, dim, val: _mk((dim, dim), [val if i == j else dtype_of(val).np.type(0).item()
                                                        for i in range(dim) for j in range(dim)], None))

    @staticmethod
    def _rows_lower(o, rows):
        ents = []
        for r in rows:
            ents.extend(r.entries)
        return Mat(ents, (len(rows), rows[0].n))

    rows = Builtin("Matrix.rows", lambda rows: np.asarray(rows), lambda o, rows: Matrix._rows_lower(o, rows))
    cols = Builtin("Matrix.cols", lambda cols: np.asarray(cols).T,
                   lambda o, cols: o.transpose(Matrix._rows_lower(o, cols)))


def vector_type(n, dtype=f32) -> VectorType:
    return VectorType(n, to_dtype(dtype))


def matrix_type(n, m, dtype=f32) -> MatrixType:
    return MatrixType(n, m, to_dtype(dtype))
