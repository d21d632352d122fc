"""ti.math: the math module of kernels (functions, constants, vector and matrix types)."""
from __future__ import annotations

import math as _m

from ..frontend.builtins import (clamp, cross, degrees, determinant, distance, dot, exp2, eye, fract, inverse,
                                 length, log2, mix, normalize, op_functions, radians, reflect, rotation2d, rsqrt,
                                 sign, smoothstep, step)
from ..types import MatrixType, VectorType, f32, i32, u32

globals().update(op_functions())  # ti.math.sin, ti.math.asinh, ... (one per op: frontend/builtins.py)

pi = _m.pi
e = _m.e
inf = float("inf")
nan = float("nan")

vec2, vec3, vec4 = VectorType(2, f32), VectorType(3, f32), VectorType(4, f32)
ivec2, ivec3, ivec4 = VectorType(2, i32), VectorType(3, i32), VectorType(4, i32)
uvec2, uvec3, uvec4 = VectorType(2, u32), VectorType(3, u32), VectorType(4, u32)
mat2, mat3, mat4 = MatrixType(2, 2, f32), MatrixType(3, 3, f32), MatrixType(4, 4, f32)
