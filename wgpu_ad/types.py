"""Scalar dtypes and the Vector / Matrix type descriptors users write in annotations."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import Float64Error


@dataclass(frozen=True)
class DType:
    """A scalar type. `wgsl` is its WGSL spelling, `np` its NumPy dtype."""

    name: str
    wgsl: str
    np: np.dtype
    is_float: bool
    is_signed: bool
    nbytes: int = 4

    @property
    def is_int(self) -> bool:
        return not self.is_float and self.name != "u1"

    def __repr__(self) -> str:
        return self.name

    def __call__(self, value):  # ti.f32(1) in Python scope, like Taichi's dtype call
        return self.np.type(value)

    def __reduce__(self):  # unpickles as the one instance of its name (the offline cache)
        return _scalar_type, (self.name,)


f32 = DType("f32", "f32", np.dtype(np.float32), True, True)
f16 = DType("f16", "f16", np.dtype(np.float16), True, True, nbytes=2)
i32 = DType("i32", "i32", np.dtype(np.int32), False, True)
u32 = DType("u32", "u32", np.dtype(np.uint32), False, False)
u1 = DType("u1", "bool", np.dtype(np.bool_), False, False)  # comparison results; never stored in buffers

float32, int32, uint32, float16 = f32, i32, u32, f16
SCALAR_TYPES = (f32, f16, i32, u32, u1)


F64_REFUSED = ("WebGPU shaders have no 64-bit floats. Use ti.f32, or run the program's f64 in float32 "
               "with ti.init(..., f64=\"f32\") (then read ti.f64 after that call: a `real = ti.f64` kept from "
               "before it stays refused)")
F64_AS_F32 = ("ti.init(f64=\"f32\"): WebGPU shaders have no 64-bit floats, so in this session ti.f64 is ti.f32: "
              "f64 fields, ndarrays, casts, annotations, default_fp=ti.f64 and float64 NumPy arrays or torch tensors "
              "passed to kernels compute and store float32 (about 7 significant digits instead of 16; gradients "
              "too), and to_numpy() of an f64 field returns a float32 array")


@dataclass(frozen=True)
class Float64:
    """`ti.f64` where the session did not opt in to running it as f32 (ti.init(f64="f32")): using it
    as a dtype raises Float64Error (to_dtype)."""

    name: str = "f64"

    def __repr__(self) -> str:
        return "f64"

    def __call__(self, value):
        raise Float64Error(f"ti.f64({value!r}): {F64_REFUSED}")


F64 = Float64()


def _scalar_type(name: str) -> DType:
    return next(t for t in SCALAR_TYPES if t.name == name)


def to_dtype(t) -> DType:
    """Map what users write (ti.f32, float, int, np.float32, 'f32') to a DType."""
    if isinstance(t, DType):
        return t
    if isinstance(t, Float64):
        raise Float64Error(f"ti.f64: {F64_REFUSED}")
    table = {float: f32, int: i32, bool: i32, "f32": f32, "i32": i32, "u32": u32, "f16": f16}
    if t in table:
        return table[t]
    try:
        npd = np.dtype(t)
    except TypeError:
        npd = None
    for d in (f32, f16, i32, u32):
        if npd == d.np:
            return d
    raise TypeError(f"unsupported dtype {t!r}: wgpu_ad supports ti.f32, ti.i32, ti.u32 (and ti.f16 where the adapter has it)")


def promote(a: DType, b: DType) -> DType:
    """Binary-op result type, following Taichi: float beats int, signed i32 beats u32."""
    if a == b:
        return a
    if a.is_float or b.is_float:
        if a == f16 and b == f16:
            return f16
        return f32
    if u1 in (a, b):
        return b if a == u1 else a
    return i32


@dataclass(frozen=True)
class VectorType:
    """ti.types.vector(n, dtype) / ti.math.vec3: a compile-time element type."""

    n: int
    dtype: DType

    @property
    def shape(self) -> tuple:
        return (self.n,)

    def __call__(self, *values):  # Python scope: a NumPy vector
        flat = np.concatenate([np.ravel(np.asarray(v, dtype=self.dtype.np)) for v in values])
        return np.resize(flat, self.n) if flat.size == 1 else flat.reshape(self.n)


@dataclass(frozen=True)
class MatrixType:
    """ti.types.matrix(n, m, dtype) / ti.math.mat3."""

    n: int
    m: int
    dtype: DType

    @property
    def shape(self) -> tuple:
        return (self.n, self.m)

    def __call__(self, *values):  # Python scope: a NumPy matrix
        flat = np.concatenate([np.ravel(np.asarray(v, dtype=self.dtype.np)) for v in values])
        return (np.resize(flat, self.n * self.m) if flat.size == 1 else flat).reshape(self.n, self.m)
