"""What a drawing call's inputs are on the GPU: a field's own buffer, or NumPy data uploaded.

A Src says where element e of an input lives: words base + e * stride (+ component) of a buffer,
read as `kind` (see shaders/viewer_common.wgsl). Fields and ndarrays are used in place (their
gpu_buffer(), row-major with components innermost): nothing is read back. NumPy arrays, lists
and numbers are appended to the frame's upload arena (one write_buffer per frame).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from wgpu_ad.errors import WgpuAdError
from wgpu_ad.lang.storage import Storage

from .colormap import to_rgba

# attribute kinds (the K_* constants of viewer_common.wgsl)
K_CONST, K_F32, K_I32, K_RGB, K_PALETTE, K_U32 = 0, 1, 2, 3, 4, 5
_FIELD_KINDS = {"f32": K_F32, "i32": K_I32, "u32": K_U32}


class _Arena:
    """Marks the frame's upload buffer, whose GPU buffer exists only when the frame is submitted."""

    def __repr__(self) -> str:
        return "ARENA"


ARENA = _Arena()


@dataclass
class Src:
    buffer: Any        # a wgpu buffer, or ARENA
    base: int          # first word
    stride: int        # words per element
    ncomp: int         # components read per element
    kind: int
    count: int         # elements
    shape: tuple = ()  # element grid (an image's (W, H)), when it matters
    value: tuple = (0.0, 0.0, 0.0, 1.0)  # K_CONST: the value; else the components the data lacks


class Uploads:
    """The NumPy data of one frame, packed into one byte string (word-aligned)."""

    def __init__(self):
        self.data = bytearray()

    def push(self, arr: np.ndarray) -> int:
        """Append arr (a 4-byte dtype) and return its first word."""
        word = len(self.data) // 4
        self.data += np.ascontiguousarray(arr).tobytes()
        return word

    def clear(self) -> None:
        self.data = bytearray()


def is_storage(x) -> bool:
    return isinstance(x, Storage)


def _storage_kind(x: Storage, what: str) -> int:
    kind = _FIELD_KINDS.get(x.dtype.name)
    if kind is None:
        raise WgpuAdError(f"{what}: cannot draw {x._label()} of dtype {x.dtype}; use a ti.f32, ti.i32 or "
                          f"ti.u32 field")
    return kind


def _storage_elements(x: Storage, n: int, what: str) -> tuple[int, int, tuple]:
    """(count, stride) of a field read as elements of n components, and its element grid."""
    es = x.element_shape
    if len(es) == 2:
        raise WgpuAdError(f"{what}: {x._label()} holds matrices; pass a vector field (ti.Vector.field({n}, ...))")
    if es:
        if es[0] < n:
            raise WgpuAdError(f"{what}: {x._label()} holds {es[0]}-vectors; expected {n} components")
        return math.prod(x.shape), es[0], x.shape
    if n == 1:
        return math.prod(x.shape), 1, x.shape
    if len(x.shape) >= 2 and x.shape[-1] >= n:  # a scalar field of shape (N, n)
        return math.prod(x.shape[:-1]), x.shape[-1], x.shape[:-1]
    raise WgpuAdError(f"{what}: {x._label()} holds scalars of shape {x.shape}; expected {n}-vectors "
                      f"(a ti.Vector.field({n}, ...) or shape (N, {n}))")


def vectors(x, n: int, what: str, up: Uploads) -> Src:
    """Positions / directions: n-vectors per element from a field, ndarray, NumPy array or one vector."""
    if is_storage(x):
        count, stride, grid = _storage_elements(x, n, what)
        return Src(x.gpu_buffer(), 0, stride, n, _storage_kind(x, what), count, grid)
    try:
        arr = np.asarray(x, dtype=np.float32)
    except (TypeError, ValueError):
        raise WgpuAdError(f"{what}: expected a field, ndarray or array of {n}-vectors, got {type(x).__name__}") from None
    if arr.ndim == 0 or arr.shape[-1] < n or (arr.ndim == 1 and arr.shape[0] != n):
        raise WgpuAdError(f"{what}: expected an array of shape (N, {n}), got shape {arr.shape}")
    grid = arr.shape[:-1]
    flat = arr.reshape(-1, arr.shape[-1])[:, :n]
    return Src(ARENA, up.push(flat), n, n, K_F32, len(flat), grid)


def scalars(x, what: str, up: Uploads) -> Src:
    """Per-element numbers (radii): a field / array, or one number (a constant)."""
    if isinstance(x, numbers.Real) and not isinstance(x, bool):
        return const(float(x))
    if is_storage(x):
        count, stride, grid = _storage_elements(x, 1, what)
        return Src(x.gpu_buffer(), 0, stride, 1, _storage_kind(x, what), count, grid)
    arr = np.asarray(x, dtype=np.float32)
    if arr.ndim == 0:
        return const(float(arr))
    return Src(ARENA, up.push(arr.ravel()), 1, 1, K_F32, arr.size, arr.shape)


def const(*value) -> Src:
    v = [float(c) for c in value] + [0.0, 0.0, 0.0, 1.0][len(value):]
    return Src(None, 0, 0, 4, K_CONST, 1, (), tuple(v))


def gui_colors(x, what: str, up: Uploads) -> Src:
    """ti.GUI colours: 0xRRGGBB, (r, g, b) floats, or per element: ints 0xRRGGBB or float RGB rows."""
    if isinstance(x, (numbers.Integral, np.integer)) and not isinstance(x, bool):
        return const(*to_rgba(x, what))
    if isinstance(x, tuple) and len(x) in (3, 4) and any(isinstance(v, float) for v in x):
        return const(*to_rgba(x, what))
    if is_storage(x):
        if x.dtype.is_int:
            count, stride, grid = _storage_elements(x, 1, what)
            return Src(x.gpu_buffer(), 0, stride, 1, K_RGB, count, grid)
        count, stride, grid = _storage_elements(x, 3, what)
        return Src(x.gpu_buffer(), 0, stride, min(stride, 4), _storage_kind(x, what), count, grid)
    arr = np.asarray(x)
    if arr.dtype.kind in "iub":
        if arr.ndim == 0:
            return const(*to_rgba(int(arr), what))
        return Src(ARENA, up.push(arr.astype(np.uint32).ravel()), 1, 1, K_RGB, arr.size, arr.shape)
    if arr.dtype.kind == "f" and arr.ndim >= 1 and arr.shape[-1] in (3, 4):
        if arr.ndim == 1:
            return const(*to_rgba(arr.tolist(), what))
        rows = arr.reshape(-1, arr.shape[-1]).astype(np.float32)
        return Src(ARENA, up.push(rows), rows.shape[1], rows.shape[1], K_F32, len(rows), arr.shape[:-1])
    raise WgpuAdError(f"{what}: expected 0xRRGGBB, (r, g, b), or per-element colours (ints 0xRRGGBB or rows "
                      f"of (r, g, b) floats); got {type(x).__name__} {getattr(arr, 'shape', '')}")


def rgb_colors(x, what: str, up: Uploads) -> Src:
    """GGUI per-vertex colours: a vec3 / vec4 field or an (N, 3|4) float array."""
    if is_storage(x):
        count, stride, grid = _storage_elements(x, 3, what)
        return Src(x.gpu_buffer(), 0, stride, min(stride, 4), _storage_kind(x, what), count, grid)
    arr = np.asarray(x, dtype=np.float32)
    if arr.ndim < 2 or arr.shape[-1] not in (3, 4):
        raise WgpuAdError(f"{what}: expected per-vertex colours of shape (N, 3), got shape {arr.shape}")
    rows = arr.reshape(-1, arr.shape[-1])
    return Src(ARENA, up.push(rows), rows.shape[1], rows.shape[1], K_F32, len(rows), arr.shape[:-1])


def indices(x, what: str, up: Uploads) -> Src:
    """An index array (ints, any shape, read flat): a field / ndarray of i32 or u32, or NumPy ints."""
    if is_storage(x):
        if not x.dtype.is_int:
            raise WgpuAdError(f"{what}: indices must be integers, got {x._label()} of dtype {x.dtype}")
        return Src(x.gpu_buffer(), 0, 1, 1, K_U32, x.n_scalars)
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu":
        raise WgpuAdError(f"{what}: indices must be integers, got an array of {arr.dtype}")
    if arr.size and (arr.min() < 0):
        raise WgpuAdError(f"{what}: indices must be >= 0 (smallest is {arr.min()})")
    flat = arr.astype(np.uint32).ravel()
    return Src(ARENA, up.push(flat), 1, 1, K_U32, flat.size)


def words(arr: np.ndarray, up: Uploads, ncomp: int, kind: int) -> Src:
    """Viewer-made data (text, widgets, colormaps): rows of ncomp 4-byte words."""
    a = np.ascontiguousarray(arr).reshape(-1, ncomp)
    return Src(ARENA, up.push(a), ncomp, ncomp, kind, len(a))
