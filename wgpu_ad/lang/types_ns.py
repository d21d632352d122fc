"""ti.types: annotations for kernel arguments and element types."""
from __future__ import annotations

from ..types import f16, f32, i32, u32
from .kernel import NdarrayType, template
from .matrix import matrix_type as matrix
from .matrix import vector_type as vector

ndarray = NdarrayType()
float32, int32, uint32, float16 = f32, i32, u32, f16



def __getattr__(name: str):
    """ti.types.f64: as ti.f64 (ti.f32 under ti.init(f64="f32"))."""
    if name in ("f64", "float64"):
        from ..session import f64_dtype
        return f64_dtype()
    raise AttributeError(f"module 'wgpu_ad.types' has no attribute {name!r}")


__all__ = ["ndarray", "template", "vector", "matrix", "f16", "f32", "i32", "u32"]
