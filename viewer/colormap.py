"""Colours as users give them (0xRRGGBB ints, (r, g, b) floats) and the colormaps for scalar images.

A colormap is a short table of RGBA stops, interpolated linearly on the GPU; the table is
uploaded with the frame, so any list of colours works as a colormap.
"""
from __future__ import annotations

import numbers

import numpy as np

from wgpu_ad.errors import WgpuAdError

# viridis sampled at 9 evenly spaced points (the palette viridisLite's viridis(9) lists)
_VIRIDIS = (0x440154, 0x472D7B, 0x3B528B, 0x2C728E, 0x21908C, 0x27AD81, 0x5DC863, 0xAADC32, 0xFDE725)
_MAGMA = (0x000004, 0x1D1147, 0x51127C, 0x822681, 0xB63679, 0xE65164, 0xFB8861, 0xFEC287, 0xFCFDBF)
_COOLWARM = (0x3B4CC0, 0x6F92F3, 0xAAC7FD, 0xDDDDDD, 0xF7B89C, 0xE7745B, 0xB40426)

COLORMAPS: dict[str, tuple[int, ...]] = {
    "viridis": _VIRIDIS,
    "magma": _MAGMA,
    "coolwarm": _COOLWARM,
    "gray": (0x000000, 0xFFFFFF),
}


def hex_to_rgb(c: int) -> tuple[float, float, float]:
    """0xRRGGBB -> (r, g, b) in [0, 1]."""
    c = int(c)
    return ((c >> 16) & 0xFF) / 255.0, ((c >> 8) & 0xFF) / 255.0, (c & 0xFF) / 255.0


def rgb_to_hex(rgb) -> int:
    """(r, g, b) in [0, 1] -> 0xRRGGBB (Taichi's ti.rgb_to_hex)."""
    r, g, b = (int(round(min(max(float(v), 0.0), 1.0) * 255)) for v in rgb[:3])
    return (r << 16) | (g << 8) | b


def to_rgba(color, what: str = "color") -> tuple[float, float, float, float]:
    """One colour: an int 0xRRGGBB, or 3 / 4 floats in [0, 1]."""
    if isinstance(color, (numbers.Integral, np.integer)) and not isinstance(color, bool):
        return (*hex_to_rgb(color), 1.0)
    try:
        vals = [float(v) for v in color]
    except TypeError:
        vals = []
    if len(vals) in (3, 4):
        return (vals[0], vals[1], vals[2], vals[3] if len(vals) == 4 else 1.0)
    raise WgpuAdError(f"{what}: expected a colour 0xRRGGBB or (r, g, b) with values in [0, 1], got {color!r}")


def colormap_stops(cmap) -> np.ndarray:
    """A colormap name (see COLORMAPS) or a list of colours -> (n, 4) float32 stops, n >= 2."""
    if isinstance(cmap, str):
        try:
            colors = COLORMAPS[cmap]
        except KeyError:
            raise WgpuAdError(f"unknown colormap {cmap!r}; use one of {', '.join(COLORMAPS)} or a list of "
                              f"colours") from None
    else:
        colors = list(cmap)
    stops = np.array([to_rgba(c, "colormap entry") for c in colors], dtype=np.float32)
    if len(stops) < 2:
        raise WgpuAdError(f"a colormap needs at least 2 colours, got {len(stops)}")
    return stops


def apply_colormap(values: np.ndarray, cmap="viridis", vmin: float = 0.0, vmax: float = 1.0) -> np.ndarray:
    """The CPU twin of the shader's colormap lookup (tests compare against it): values -> RGBA."""
    stops = colormap_stops(cmap)
    span = vmax - vmin if vmax != vmin else 1.0
    t = np.clip((np.asarray(values, dtype=np.float32) - vmin) / span, 0.0, 1.0) * (len(stops) - 1)
    k = np.minimum(np.floor(t).astype(int), len(stops) - 2)
    f = (t - k)[..., None]
    return stops[k] * (1 - f) + stops[k + 1] * f
