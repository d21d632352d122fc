"""2-D draw commands (circles, segments, arrows, triangles, images, text) from resolved inputs.

ti.GUI and the GGUI canvas turn user arguments into Srcs (sources.py) with their own
conventions (pixel or normalised radii, begin/end arrays or vertex pairs) and call these.
Positions are in [0, 1]^2 from the bottom left; radii here are in pixels.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wgpu_ad.errors import WgpuAdError

from . import font as _font
from .colormap import colormap_stops
from .renderer import DrawCmd, Frame
from .sources import K_F32, K_I32, K_U32, Src, is_storage, words


@dataclass
class Input:
    """A Src and how item i picks its element: i * mul + add, through `index` when given."""

    src: Src
    mul: int = 1
    add: int = 0
    index: Src | None = None

    def add_to(self, cmd: DrawCmd, palette: Src | None = None) -> None:
        cmd.attr(self.src, self.mul, self.add, self.index, palette)


def _inp(x) -> Input:
    return x if isinstance(x, Input) else Input(x)


def circles(frame: Frame, pos, radius, color, count: int, palette: Src | None = None) -> None:
    cmd = DrawCmd("circles", 6, count)
    _inp(pos).add_to(cmd)
    _inp(radius).add_to(cmd)
    _inp(color).add_to(cmd, palette)
    frame.add(cmd)


def segments(frame: Frame, a, b, radius, color, count: int) -> None:
    cmd = DrawCmd("lines", 6, count)
    for x in (a, b, radius, color):
        _inp(x).add_to(cmd)
    frame.add(cmd)


def arrows(frame: Frame, orig, direction, radius, color, count: int) -> None:
    cmd = DrawCmd("arrows", 9, count)
    for x in (orig, direction, radius, color):
        _inp(x).add_to(cmd)
    frame.add(cmd)


def triangles(frame: Frame, a, b, c, color, count: int, per_vertex_color: bool = False) -> None:
    cmd = DrawCmd("triangles", 3, count)
    for x in (a, b, c, color):
        _inp(x).add_to(cmd)
    cmd.flags = 1 if per_vertex_color else 0
    frame.add(cmd)


def check_count(what: str, **counts: int) -> int:
    """The common element count of several per-element inputs (constants count as any)."""
    sizes = {k: v for k, v in counts.items() if v is not None}
    values = set(sizes.values())
    if len(values) > 1:
        listed = ", ".join(f"{k}: {v}" for k, v in sizes.items())
        raise WgpuAdError(f"{what}: the per-element inputs have different lengths ({listed})")
    return values.pop() if values else 1


def fill_rect(frame: Frame, x0: float, y0: float, x1: float, y1: float, color) -> None:
    """A filled rectangle between two corners in [0, 1]^2 (widgets and panels)."""
    quad = np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y0], [x1, y1], [x0, y1]], dtype=np.float32)
    src = words(quad.view(np.uint32), frame.up, 2, K_F32)
    triangles(frame, Input(src, 3, 0), Input(src, 3, 1), Input(src, 3, 2), color, 2)


# ---- images -----------------------------------------------------------------------------------

def image(frame: Frame, img, cmap="viewer-default", vmin: float = 0.0, vmax: float = 1.0) -> None:
    """Cover the target with img[x, y] (x right, y up): scalars through a colormap, or RGB(A)."""
    if is_storage(img):
        es = img.element_shape
        if len(img.shape) != 2 or len(es) > 1 or (es and es[0] not in (3, 4)):
            raise WgpuAdError(f"set_image: expected a 2-D field of scalars or of 3-vectors, got {img._label()} "
                              f"with shape {img.shape} and element shape {es}")
        kinds = {"f32": K_F32, "i32": K_I32, "u32": K_U32}
        if img.dtype.name not in kinds:
            raise WgpuAdError(f"set_image: cannot draw {img._label()} of dtype {img.dtype}")
        ncomp = es[0] if es else 1
        src = Src(img.gpu_buffer(), 0, ncomp, min(ncomp, 3), kinds[img.dtype.name], img.shape[0] * img.shape[1])
        w, h = img.shape
        scale = 1.0 if img.dtype.is_float else 1.0 / 255.0
    else:
        arr = np.asarray(img)
        if arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[2] not in (1, 3, 4)):
            raise WgpuAdError(f"set_image: expected an array of shape (w, h) or (w, h, 3), got {arr.shape}")
        if arr.dtype.kind not in "fiub":
            raise WgpuAdError(f"set_image: expected numbers, got an array of {arr.dtype}")
        if arr.ndim == 3 and arr.shape[2] == 1:
            arr = arr[:, :, 0]
        ncomp = 1 if arr.ndim == 2 else min(arr.shape[2], 3)
        data = arr.astype(np.float32) / (255.0 if arr.dtype.kind in "iub" else 1.0)
        if arr.ndim == 3:
            data = data[:, :, :ncomp]
        w, h = arr.shape[:2]
        src = words(np.ascontiguousarray(data).view(np.uint32), frame.up, ncomp, K_F32)
        scale = 1.0
    scalar = ncomp == 1
    stops = colormap_stops("viridis" if cmap == "viewer-default" else cmap)
    stop_src = words(stops.view(np.uint32), frame.up, 4, K_F32)
    cmd = DrawCmd("image", 6, 1)
    cmd.attr(src)
    cmd.attr(stop_src)
    cmd.flags = 0 if scalar else 1
    cmd.misc = (float(w), float(h), float(vmin), float(vmax))
    cmd.misc2 = (scale, float(len(stops)), 0.0, 0.0)
    frame.add(cmd)


# ---- text -------------------------------------------------------------------------------------

def text(frame: Frame, content: str, x_px: float, top_px: float, font_size: float, color: Src) -> tuple[int, int]:
    """Draw text with its top-left corner at (x_px, top_px) (pixels from the bottom left).

    Returns the text's (width, height) in pixels.
    """
    scale = _font.scale_for(font_size)
    chars, size = _font.layout(str(content), scale)
    if len(chars):
        cmd = DrawCmd("text", 6, len(chars))
        cmd.attr(words(chars, frame.up, 3, K_U32))
        cmd.attr(Src(frame.renderer.shared.font, 0, 1, 1, K_U32, 0))
        cmd.attr(color)
        cmd.misc = (float(round(x_px)), float(round(top_px)), float(scale), 0.0)
        frame.add(cmd)
    return size
