"""The viewer's WGSL modules and pipelines, created once per device and only when first used.

Every draw pipeline shares one explicit bind group layout (viewer_common.wgsl): binding 0 the
command's uniform block and 5 the scene's (both at dynamic offsets in one buffer), 1-4 read-only
storage buffers. The normals compute pipelines add two read-write buffers (6, 7).
"""
from __future__ import annotations

import functools

import wgpu

from wgpu_ad import shaders
from wgpu_ad.errors import GpuError
from wgpu_ad import session as _rt

from .font import font_table

COLOR_FORMAT = "rgba8unorm"
DEPTH_FORMAT = "depth32float"
WGPU_ERRORS = (wgpu.GPUError, wgpu.GPUPipelineError, wgpu.GPUValidationError)

_ALPHA_BLEND = {
    "color": {"src_factor": "src-alpha", "dst_factor": "one-minus-src-alpha", "operation": "add"},
    "alpha": {"src_factor": "one", "dst_factor": "one-minus-src-alpha", "operation": "add"},
}

# name: (module, vertex entry, fragment entry, 3-D (depth test and write) or 2-D (drawn over))
RENDER_PIPELINES = {
    "circles": ("2d", "vs_circles", "fs_shape", False),
    "lines": ("2d", "vs_lines", "fs_shape", False),
    "arrows": ("2d", "vs_arrows", "fs_shape", False),
    "triangles": ("2d", "vs_triangles", "fs_shape", False),
    "image": ("2d", "vs_image", "fs_image", False),
    "text": ("2d", "vs_text", "fs_text", False),
    "particles": ("3d", "vs_particles", "fs_particles", True),
    "mesh": ("3d", "vs_mesh", "fs_mesh", True),
    "lines3d": ("3d", "vs_lines3d", "fs_flat3d", True),
}

_MODULES = {"2d": "viewer_2d", "3d": "viewer_3d", "normals": "viewer_normals"}


def _layout_entries(compute: bool) -> list[dict]:
    vis = wgpu.ShaderStage.COMPUTE if compute else wgpu.ShaderStage.VERTEX | wgpu.ShaderStage.FRAGMENT
    uniform = {"type": wgpu.BufferBindingType.uniform, "has_dynamic_offset": True}
    read = {"type": wgpu.BufferBindingType.read_only_storage}
    entries = [{"binding": 0, "visibility": vis, "buffer": uniform}]
    entries += [{"binding": 1 + k, "visibility": vis, "buffer": read} for k in range(4)]
    entries.append({"binding": 5, "visibility": vis, "buffer": uniform})
    if compute:
        rw = {"type": wgpu.BufferBindingType.storage}
        entries += [{"binding": 6, "visibility": vis, "buffer": rw}, {"binding": 7, "visibility": vis, "buffer": rw}]
    return entries


class Shared:
    """Device-wide viewer resources: layouts, modules, pipelines, the font, a dummy buffer."""

    def __init__(self):
        rt = _rt.runtime()
        self.device = dev = rt.device
        self.layout = dev.create_bind_group_layout(entries=_layout_entries(False))
        self.compute_layout = dev.create_bind_group_layout(entries=_layout_entries(True))
        self.pipeline_layout = dev.create_pipeline_layout(bind_group_layouts=[self.layout])
        self.compute_pipeline_layout = dev.create_pipeline_layout(bind_group_layouts=[self.compute_layout])
        self.modules: dict = {}
        self.pipelines: dict = {}
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST
        self.dummy = dev.create_buffer(label="wgpu_ad.viewer.dummy", size=16, usage=usage)
        table = font_table()
        self.font = dev.create_buffer(label="wgpu_ad.viewer.font", size=table.nbytes, usage=usage)
        dev.queue.write_buffer(self.font, 0, table.tobytes())
        self.sampler = dev.create_sampler(mag_filter="linear", min_filter="linear")

    def module(self, key: str):
        mod = self.modules.get(key)
        if mod is None:
            name = _MODULES.get(key, key)
            code = shaders.load("viewer_common") + "\n" + shaders.load(name) if key in _MODULES else shaders.load(name)
            try:
                mod = self.device.create_shader_module(label=f"wgpu_ad.{name}", code=code)
            except WGPU_ERRORS as e:
                raise GpuError(f"shaders/{name}.wgsl was rejected by WebGPU:\n{e}") from None
            self.modules[key] = mod
        return mod

    def render_pipeline(self, name: str):
        pipe = self.pipelines.get(name)
        if pipe is not None:
            return pipe
        mod_key, vs, fs, is_3d = RENDER_PIPELINES[name]
        mod = self.module(mod_key)
        try:
            pipe = self.device.create_render_pipeline(
                label=f"wgpu_ad.viewer.{name}", layout=self.pipeline_layout,
                vertex={"module": mod, "entry_point": vs, "buffers": []},
                primitive={"topology": "triangle-list", "cull_mode": "none"},
                depth_stencil={"format": DEPTH_FORMAT, "depth_write_enabled": is_3d,
                               "depth_compare": "less" if is_3d else "always"},
                multisample=None,
                fragment={"module": mod, "entry_point": fs,
                          "targets": [{"format": COLOR_FORMAT, "blend": None if is_3d else _ALPHA_BLEND}]})
        except WGPU_ERRORS as e:
            raise GpuError(f"the viewer's '{name}' pipeline was rejected by WebGPU:\n{e}") from None
        self.pipelines[name] = pipe
        return pipe

    def compute_pipeline(self, entry: str):
        key = ("normals", entry)
        pipe = self.pipelines.get(key)
        if pipe is None:
            try:
                pipe = self.device.create_compute_pipeline(
                    label=f"wgpu_ad.viewer.normals.{entry}", layout=self.compute_pipeline_layout,
                    compute={"module": self.module("normals"), "entry_point": entry})
            except WGPU_ERRORS as e:
                raise GpuError(f"the viewer's normals pipeline ({entry}) was rejected by WebGPU:\n{e}") from None
            self.pipelines[key] = pipe
        return pipe

    def blit_pipeline(self, fmt: str):
        key = ("blit", fmt)
        pipe = self.pipelines.get(key)
        if pipe is None:
            mod = self.module("viewer_blit")
            pipe = self.device.create_render_pipeline(
                label="wgpu_ad.viewer.blit", layout="auto",
                vertex={"module": mod, "entry_point": "vs_blit", "buffers": []},
                primitive={"topology": "triangle-list"}, depth_stencil=None, multisample=None,
                fragment={"module": mod, "entry_point": "fs_blit_srgb" if fmt.endswith("srgb") else "fs_blit",
                          "targets": [{"format": fmt}]})
            self.pipelines[key] = pipe
        return pipe


@functools.lru_cache(maxsize=1)
def _shared_of(generation: int) -> Shared:
    """The viewer resources of one session generation: only the latest is kept."""
    return Shared()


_rt.on_close(_shared_of.cache_clear)


def shared() -> Shared:
    """The viewer resources of the current runtime's device (made again after ti.reset())."""
    return _shared_of(_rt.generation())
