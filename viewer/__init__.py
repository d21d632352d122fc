"""wgpu_ad.viewer: a live visualizer that draws fields straight from their GPU buffers.

`ti.GUI` (Taichi's 2-D GUI) and `ti.ui` (Taichi GGUI's Window / Canvas / Scene / Camera) draw
on the kernels' own wgpu device: particle positions, springs and images are read by the render
shaders from the buffers the kernels wrote, with no copy to the CPU. A glfw window opens when
there is a display; otherwise rendering is headless (offscreen) by itself and frames are saved
as PNG files (and GIF / MP4 with imageio).
"""
from . import ui
from .colormap import COLORMAPS, apply_colormap, hex_to_rgb, rgb_to_hex
from .gui import GUI
from .png import read_png, write_png
from .record import Recorder, record

__all__ = ["GUI", "ui", "record", "Recorder", "write_png", "read_png", "COLORMAPS", "apply_colormap",
           "hex_to_rgb", "rgb_to_hex"]
