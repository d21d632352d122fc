"""Draw commands on the kernels' device: the frame's buffers, pipelines, one submit per frame.

A Frame collects DrawCmds (a pipeline, its inputs as Srcs, a few numbers) and the NumPy data
they upload. Renderer.render() submits the runtime's pending kernel launches first (so drawing
sees their results), writes the uploads and the commands' uniform blocks, runs the GPU normal
computations, then draws everything into an offscreen rgba8unorm texture (with a depth buffer).
A window shows that texture (present()); save / record read the *image* back (read_image,
counted in Renderer.image_reads), never the fields.
"""
from __future__ import annotations

import struct

import numpy as np
import wgpu

from wgpu_ad.errors import GpuError, WgpuAdError
from wgpu_ad import session as _rt

from . import pipelines as _pl
from .sources import ARENA, K_CONST, K_PALETTE, Src, Uploads

BLOCK = 512              # bytes per uniform block (params or scene); >= the 256 offset alignment
N_ATTRS = 6
NONE = 0xFFFFFFFF
WORKGROUP = 64           # viewer_normals.wgsl's workgroup size


class DrawCmd:
    """One draw: `vertices` per instance, `instances` of them, inputs bound to up to 4 buffers."""

    def __init__(self, pipeline: str, vertices: int, instances: int):
        self.pipeline = pipeline
        self.vertices = int(vertices)
        self.instances = int(instances)
        self.count = int(instances)
        self.buffers: list = []
        self.attrs: list[bytes] = []
        self.flags = 0
        self.misc = (0.0, 0.0, 0.0, 0.0)
        self.misc2 = (0.0, 0.0, 0.0, 0.0)
        self.scene = 0           # index of the frame's scene block (3-D)

    def slot(self, buffer) -> int:
        for k, b in enumerate(self.buffers):
            if b is buffer:
                return k
        if len(self.buffers) == 4:
            raise WgpuAdError(f"{self.pipeline}: a draw reads at most 4 distinct buffers; pass some inputs "
                              f"as NumPy arrays or constants")
        self.buffers.append(buffer)
        return len(self.buffers) - 1

    def attr(self, src: Src, mul: int = 1, add: int = 0, index: Src | None = None,
             palette: Src | None = None) -> None:
        """Append the next attribute (attrs[k] in the shader, in call order)."""
        if len(self.attrs) == N_ATTRS:
            raise AssertionError("too many attributes for one draw")
        value = src.value
        if src.kind == K_CONST:
            s = (0, 0, 0, K_CONST)
        else:
            s = (self.slot(src.buffer), src.base, src.stride, src.kind | (src.ncomp << 8))
            if src.kind == K_PALETTE:
                value = (float(self.slot(palette.buffer)), float(palette.base), 0.0, 1.0)
        if index is not None:
            ix = (self.slot(index.buffer), index.base, mul, add)
        else:
            ix = (NONE, 0, mul, add)
        self.attrs.append(struct.pack("<4I4I4f", *s, *ix, *value))

    def pack(self, res: tuple[int, int]) -> bytes:
        head = struct.pack("<2f2I4f4f", float(res[0]), float(res[1]), self.count, self.flags, *self.misc, *self.misc2)
        body = b"".join(self.attrs) + bytes(48 * (N_ATTRS - len(self.attrs)))
        return head + body


class NormalsCmd:
    """Smooth normals of a mesh into a pooled buffer (two compute dispatches)."""

    def __init__(self, cmd: DrawCmd, triangles: int, n_vertices: int, pool_index: int):
        self.cmd, self.triangles, self.n_vertices, self.pool_index = cmd, triangles, n_vertices, pool_index


class Frame:
    """What one frame draws, in call order."""

    def __init__(self, renderer: "Renderer"):
        self.renderer = renderer
        self.up = Uploads()
        self.cmds: list[DrawCmd] = []
        self.normals: list[NormalsCmd] = []
        self.scenes: list[bytes] = []

    def add(self, cmd: DrawCmd) -> DrawCmd:
        self.cmds.append(cmd)
        return cmd

    def add_scene(self, block: bytes) -> int:
        self.scenes.append(block)
        return len(self.scenes) - 1

    def computed_normals(self, positions: Src, index: Src | None, triangles: int, n_vertices: int) -> Src:
        """A Src of GPU-computed vertex normals (3 f32 per vertex) for this frame's mesh."""
        k = len(self.normals)
        normals, _ = self.renderer.normals_buffers(k, n_vertices)
        cmd = DrawCmd("normals", 0, triangles)
        cmd.count = triangles
        cmd.flags = n_vertices
        cmd.attr(positions, index=index)
        self.normals.append(NormalsCmd(cmd, triangles, n_vertices, k))
        return Src(normals, 0, 3, 3, 1, n_vertices)


class Renderer:
    """The offscreen target of one GUI / window, on the runtime's device."""

    def __init__(self, size: tuple[int, int]):
        self.rt = _rt.runtime()
        self.generation = _rt.generation()
        self.device = self.rt.device
        self.shared = _pl.shared()
        self.size = (int(size[0]), int(size[1]))
        w, h = self.size
        limit = self.rt.limits.get("max-texture-dimension-2d", 8192)
        if not (0 < w <= limit and 0 < h <= limit):
            raise WgpuAdError(f"window size {self.size}: each side must be between 1 and {limit} pixels")
        usage = wgpu.TextureUsage.RENDER_ATTACHMENT | wgpu.TextureUsage.COPY_SRC | wgpu.TextureUsage.TEXTURE_BINDING
        self.color = self.device.create_texture(label="wgpu_ad.viewer.frame", size=(w, h, 1),
                                                format=_pl.COLOR_FORMAT, usage=usage)
        self.depth = self.device.create_texture(label="wgpu_ad.viewer.depth", size=(w, h, 1),
                                                format=_pl.DEPTH_FORMAT, usage=wgpu.TextureUsage.RENDER_ATTACHMENT)
        self.color_view = self.color.create_view()
        self.depth_view = self.depth.create_view()
        self.arena = None
        self.params = None
        self.bind_groups: dict = {}
        self.normal_pool: list = []
        self.image_reads = 0          # frames read back (saving, recording): not field read-backs
        self.frames_rendered = 0
        self._blit = None

    def new_frame(self) -> Frame:
        return Frame(self)

    def check_alive(self) -> None:
        if self.generation != _rt.generation():
            raise WgpuAdError("this GUI / window was created before ti.reset() or ti.init(), and its GPU device "
                              "is gone; create the GUI again after ti.init()")

    # ---- buffers ------------------------------------------------------------------------------

    def _grow(self, buf, nbytes: int, label: str, usage):
        if buf is not None and buf.size >= nbytes:
            return buf
        size = 1 << max(12, (max(nbytes, 16) - 1).bit_length())
        return self.device.create_buffer(label=label, size=size, usage=usage)

    def normals_buffers(self, k: int, n_vertices: int):
        """Pooled (normals, fixed-point sums) buffers for the k-th mesh of a frame."""
        while len(self.normal_pool) <= k:
            self.normal_pool.append((None, None))
        normals, sums = self.normal_pool[k]
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC  # COPY_SRC: tests read normals back
        nbytes = max(16, n_vertices * 12)
        if normals is None or normals.size < nbytes:
            normals = self._grow(None, nbytes, "wgpu_ad.viewer.normals", usage)
            sums = self._grow(None, nbytes, "wgpu_ad.viewer.normal_sums", usage)  # zeroed at creation
            self.normal_pool[k] = (normals, sums)
        return normals, sums

    def _resolve(self, b):
        if b is ARENA:
            return self.arena
        return self.shared.dummy if b is None else b

    def _bind_group(self, buffers: list, compute_extra: tuple = ()):
        bufs = [self._resolve(b) for b in buffers] + [self.shared.dummy] * (4 - len(buffers))
        key = (*map(id, bufs), id(self.params), *map(id, compute_extra))
        hit = self.bind_groups.get(key)
        if hit is not None:
            return hit[0]
        entries = [{"binding": 0, "resource": {"buffer": self.params, "offset": 0, "size": BLOCK}}]
        entries += [{"binding": 1 + k, "resource": {"buffer": b, "offset": 0, "size": b.size}} for k, b in enumerate(bufs)]
        entries.append({"binding": 5, "resource": {"buffer": self.params, "offset": 0, "size": BLOCK}})
        layout = self.shared.layout
        if compute_extra:
            layout = self.shared.compute_layout
            entries += [{"binding": 6 + k, "resource": {"buffer": b, "offset": 0, "size": b.size}}
                        for k, b in enumerate(compute_extra)]
        bg = self.device.create_bind_group(layout=layout, entries=entries)
        if len(self.bind_groups) > 256:  # cached groups keep buffers alive: bound the cache
            self.bind_groups.clear()
        self.bind_groups[key] = (bg, bufs, compute_extra)  # the refs keep the ids unique
        return bg

    # ---- a frame ------------------------------------------------------------------------------

    def render(self, frame: Frame, clear: tuple) -> None:
        """Draw the frame into the offscreen target (after every kernel launched so far)."""
        self.check_alive()
        self.rt.flush()  # kernels recorded but not submitted yet must run before we read their buffers
        if self.rt.prints.launches:
            self.rt.sync()  # kernels printed: their lines come out once a frame (a wait only then)
        dev, queue = self.device, self.device.queue
        storage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST
        data = frame.up.data
        self.arena = self._grow(self.arena, len(data), "wgpu_ad.viewer.uploads", storage)

        blocks = bytearray()
        scene_at = []
        for s in frame.scenes:
            scene_at.append(len(blocks))
            blocks += s.ljust(BLOCK, b"\0")
        if not frame.scenes:
            scene_at.append(0)
            blocks += bytes(BLOCK)
        offsets = []
        for item in [n.cmd for n in frame.normals] + frame.cmds:
            offsets.append(len(blocks))
            blocks += item.pack(self.size).ljust(BLOCK, b"\0")
        self.params = self._grow(self.params, len(blocks), "wgpu_ad.viewer.params",
                                 wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
        if data:
            queue.write_buffer(self.arena, 0, data)
        queue.write_buffer(self.params, 0, blocks)

        enc = dev.create_command_encoder(label="wgpu_ad.viewer.frame")
        k = 0
        if frame.normals:
            cpass = enc.begin_compute_pass(label="wgpu_ad.viewer.normals")
            for n in frame.normals:
                extra = self.normal_pool[n.pool_index][::-1]  # (sums, normals) = bindings 6, 7
                bg = self._bind_group(n.cmd.buffers, extra)
                cpass.set_bind_group(0, bg, [offsets[k], scene_at[0]])
                cpass.set_pipeline(self.shared.compute_pipeline("accumulate"))
                cpass.dispatch_workgroups(max(1, -(-n.triangles // WORKGROUP)))
                cpass.set_pipeline(self.shared.compute_pipeline("finish"))
                cpass.dispatch_workgroups(max(1, -(-n.n_vertices // WORKGROUP)))
                k += 1
            cpass.end()
        rpass = enc.begin_render_pass(
            color_attachments=[{"view": self.color_view, "clear_value": tuple(clear), "load_op": "clear",
                                "store_op": "store"}],
            depth_stencil_attachment={"view": self.depth_view, "depth_clear_value": 1.0,
                                      "depth_load_op": "clear", "depth_store_op": "store"})
        for cmd in frame.cmds:
            off = offsets[k]
            k += 1
            if cmd.vertices <= 0 or cmd.instances <= 0:
                continue
            rpass.set_pipeline(self.shared.render_pipeline(cmd.pipeline))
            rpass.set_bind_group(0, self._bind_group(cmd.buffers), [off, scene_at[cmd.scene]])
            rpass.draw(cmd.vertices, cmd.instances)
        rpass.end()
        try:
            self.rt.submit([enc.finish()])  # through the runtime: ti.sync() waits for the frame too
        except _pl.WGPU_ERRORS as e:
            names = ", ".join(sorted({c.pipeline for c in frame.cmds}))
            raise GpuError(f"WebGPU rejected a viewer frame (drawing {names or 'nothing'}):\n{e}") from None
        self.frames_rendered += 1

    def read_image(self) -> np.ndarray:
        """The last rendered frame as an (h, w, 4) uint8 array, top row first."""
        self.check_alive()
        w, h = self.size
        data = self.device.queue.read_texture({"texture": self.color, "origin": (0, 0, 0), "mip_level": 0},
                                              {"offset": 0, "bytes_per_row": w * 4, "rows_per_image": h}, (w, h, 1))
        self.image_reads += 1
        return np.frombuffer(data, dtype=np.uint8).reshape(h, w, 4).copy()

    def present(self, surface) -> None:
        """Show the last rendered frame in a window surface (see window.Surface)."""
        self.check_alive()
        tex = surface.current_texture()
        if self._blit is None or self._blit[0] != surface.format:
            pipe = self.shared.blit_pipeline(surface.format)
            bg = self.device.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
                {"binding": 0, "resource": self.color_view},
                {"binding": 1, "resource": self.shared.sampler}])
            self._blit = (surface.format, pipe, bg)
        _, pipe, bg = self._blit
        enc = self.device.create_command_encoder(label="wgpu_ad.viewer.present")
        rpass = enc.begin_render_pass(color_attachments=[{"view": tex.create_view(), "clear_value": (0, 0, 0, 1),
                                                          "load_op": "clear", "store_op": "store"}])
        rpass.set_pipeline(pipe)
        rpass.set_bind_group(0, bg)
        rpass.draw(3, 1)
        rpass.end()
        self.rt.submit([enc.finish()])
        surface.present()
