"""ti.ui.Scene and ti.ui.Camera: 3-D particles, meshes and lines, lit by point lights.

A Scene collects what one frame shows; canvas.scene(scene) turns it into draw commands (with
the camera and lights in one uniform block) and empties it for the next frame. Lights set in a
frame replace the previous frame's; a scene without lights gets one white light at the camera.
Mesh normals not given are computed on the GPU (shaders/viewer_normals.wgsl) every frame, so
a deforming cloth stays smoothly shaded.
"""
from __future__ import annotations

import math
import struct

import numpy as np

from wgpu_ad.errors import WgpuAdError

from . import events as ev
from .colormap import to_rgba
from .renderer import DrawCmd, Frame
from .sources import const, indices as index_src, rgb_colors, scalars, vectors

MAX_LIGHTS = 4


def _vec3(v, what: str) -> np.ndarray:
    a = np.asarray(v, dtype=np.float64).ravel()
    if a.shape != (3,):
        raise WgpuAdError(f"{what}: expected 3 numbers (x, y, z), got {v!r}")
    return a


def _normalize(v: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(v)
    return v / n if n > 0 else v


def look_at(eye, center, up) -> np.ndarray:
    """The world-to-camera matrix (right-handed, the camera looks down -z)."""
    f = _normalize(np.asarray(center, float) - eye)
    r = _normalize(np.cross(f, up))
    u = np.cross(r, f)
    m = np.eye(4)
    m[0, :3], m[1, :3], m[2, :3] = r, u, -f
    m[:3, 3] = -m[:3, :3] @ eye
    return m


def perspective(fov_deg: float, aspect: float, near: float, far: float) -> np.ndarray:
    """WebGPU's clip space: depth 0 at `near`, 1 at `far`."""
    f = 1.0 / math.tan(math.radians(fov_deg) / 2)
    return np.array([[f / aspect, 0, 0, 0], [0, f, 0, 0],
                     [0, 0, far / (near - far), near * far / (near - far)], [0, 0, -1, 0]])


class Camera:
    """A perspective camera (Taichi GGUI's names); track_user_inputs makes it an orbit camera."""

    def __init__(self):
        self.curr_position = np.array([0.0, 0.0, 3.0])
        self.curr_lookat = np.array([0.0, 0.0, 0.0])
        self.curr_up = np.array([0.0, 1.0, 0.0])
        self.curr_fov = 45.0
        self.near, self.far = 0.1, 1000.0
        self._last_cursor = None

    def position(self, x, y, z) -> None:
        self.curr_position = _vec3((x, y, z), "camera.position")

    def lookat(self, x, y, z) -> None:
        self.curr_lookat = _vec3((x, y, z), "camera.lookat")

    def up(self, x, y, z) -> None:
        self.curr_up = _vec3((x, y, z), "camera.up")

    def fov(self, degrees: float) -> None:
        if not 0 < degrees < 180:
            raise WgpuAdError(f"camera.fov: expected degrees in (0, 180), got {degrees}")
        self.curr_fov = float(degrees)

    def z_near(self, near: float) -> None:
        self.near = float(near)

    def z_far(self, far: float) -> None:
        self.far = float(far)

    def view_matrix(self) -> np.ndarray:
        return look_at(self.curr_position, self.curr_lookat, self.curr_up)

    def projection_matrix(self, aspect: float) -> np.ndarray:
        return perspective(self.curr_fov, aspect, self.near, self.far)

    def orbit(self, yaw: float, pitch: float) -> None:
        """Turn the position around the look-at point (radians; pitch stops short of the poles)."""
        up = _normalize(self.curr_up)
        off = self.curr_position - self.curr_lookat
        dist = np.linalg.norm(off)
        if dist == 0:
            return
        d = off / dist
        elev = math.asin(max(-1.0, min(1.0, float(d @ up))))
        new_elev = max(-1.5, min(1.5, elev + pitch))
        horiz = d - up * (d @ up)
        if np.linalg.norm(horiz) < 1e-9:
            horiz = _normalize(np.cross(up, [1.0, 0.0, 0.0]) if abs(up[0]) < 0.9 else np.cross(up, [0.0, 0.0, 1.0]))
        horiz = _normalize(horiz)
        side = np.cross(up, horiz)
        c, s = math.cos(yaw), math.sin(yaw)
        horiz = horiz * c + side * s
        self.curr_position = self.curr_lookat + dist * (horiz * math.cos(new_elev) + up * math.sin(new_elev))

    def zoom(self, factor: float) -> None:
        """Scale the distance to the look-at point."""
        self.curr_position = self.curr_lookat + (self.curr_position - self.curr_lookat) * float(factor)

    def track_user_inputs(self, window, movement_speed: float = 0.03, yaw_speed: float = 2.0,
                          pitch_speed: float = 2.0, hold_key=ev.RMB) -> None:
        """Orbit camera: drag with hold_key (default the right button; None: the left) to orbit
        around the look-at point, scroll to zoom."""
        queue = window._display.queue
        key = ev.LMB if hold_key is None else hold_key
        cur = queue.cursor
        if queue.is_pressed(key) and self._last_cursor is not None:
            dx, dy = cur[0] - self._last_cursor[0], cur[1] - self._last_cursor[1]
            self.orbit(-dx * yaw_speed * math.pi / 2, -dy * pitch_speed * math.pi / 2)
        self._last_cursor = cur
        steps = queue.take_wheel()
        if steps:
            self.zoom((1.0 - min(max(movement_speed, 0.001), 0.5) * 4) ** steps)


class Scene:
    """What a 3-D view shows this frame (Taichi GGUI's ti.ui.Scene)."""

    def __init__(self):
        self.camera: Camera | None = None
        self.ambient = (0.1, 0.1, 0.1)
        self.lights: list[tuple] = []
        self._last_lights: list[tuple] = []
        self.items: list = []

    def set_camera(self, camera: Camera) -> None:
        self.camera = camera

    def ambient_light(self, color) -> None:
        self.ambient = to_rgba(color, "scene.ambient_light")[:3]

    def point_light(self, pos, color) -> None:
        if len(self.lights) == MAX_LIGHTS:
            raise WgpuAdError(f"scene.point_light: at most {MAX_LIGHTS} point lights per frame")
        self.lights.append((tuple(_vec3(pos, "scene.point_light(pos)")), to_rgba(color, "scene.point_light(color)")[:3]))

    def particles(self, centers, radius: float, color=(0.5, 0.5, 0.5), per_vertex_color=None,
                  index_offset: int = 0, index_count: int | None = None, per_vertex_radius=None) -> None:
        """Spheres of `radius` (world units) at centers (N 3-vectors)."""
        self.items.append(("particles", centers, radius, color, per_vertex_color, index_offset, index_count,
                           per_vertex_radius))

    def mesh(self, vertices, indices=None, normals=None, color=(0.5, 0.5, 0.5), per_vertex_color=None,
             two_sided: bool = False, index_offset: int = 0, index_count: int | None = None,
             vertex_offset: int = 0, vertex_count: int | None = None, show_wireframe: bool = False) -> None:
        """A triangle mesh: vertices (N 3-vectors), indices (3 ints per triangle; none: consecutive
        triples); normals computed on the GPU when not given."""
        self.items.append(("mesh", vertices, indices, normals, color, per_vertex_color, two_sided,
                           index_offset, index_count, vertex_offset, vertex_count))

    def lines(self, vertices, width: float, indices=None, color=(0.5, 0.5, 0.5), per_vertex_color=None,
              vertex_offset: int = 0, vertex_count: int | None = None, index_offset: int = 0,
              index_count: int | None = None) -> None:
        """Segments between vertex pairs (2 k, 2 k + 1), or index pairs; width in pixels."""
        self.items.append(("lines", vertices, width, indices, color, per_vertex_color,
                           vertex_offset, vertex_count, index_offset, index_count))

    # ---- into draw commands ---------------------------------------------------------------------

    def _block(self, size: tuple[int, int]) -> bytes:
        cam = self.camera or Camera()
        vp = cam.projection_matrix(size[0] / size[1]) @ cam.view_matrix()
        eye = cam.curr_position
        f = _normalize(cam.curr_lookat - eye)
        right = _normalize(np.cross(f, cam.curr_up))
        up = np.cross(right, f)
        lights = self.lights or self._last_lights or [(tuple(eye), (1.0, 1.0, 1.0))]
        pos = [(*p, 1.0) for p, _ in lights] + [(0.0, 0.0, 0.0, 0.0)] * (MAX_LIGHTS - len(lights))
        col = [(*c, 1.0) for _, c in lights] + [(0.0, 0.0, 0.0, 0.0)] * (MAX_LIGHTS - len(lights))
        return (vp.T.astype(np.float32).tobytes()  # WGSL matrices are column-major
                + struct.pack("<16f", *eye, 1.0, *right, 0.0, *up, 0.0, *self.ambient, 1.0)
                + struct.pack(f"<{8 * MAX_LIGHTS}f", *(v for p in pos for v in p), *(v for c in col for v in c))
                + struct.pack("<4I", len(lights), 0, 0, 0))

    def draw_into(self, frame: Frame, size: tuple[int, int]) -> None:
        """Add this frame's items to `frame` and start the next frame's scene."""
        scene_index = frame.add_scene(self._block(size))
        for item in self.items:
            getattr(self, "_draw_" + item[0])(frame, scene_index, *item[1:])
        self.items = []
        if self.lights:
            self._last_lights = self.lights
        self.lights = []

    def _color(self, frame, color, per_vertex_color, what: str):
        if per_vertex_color is not None:
            return rgb_colors(per_vertex_color, f"{what}(per_vertex_color)", frame.up), True
        return const(*to_rgba(color, f"{what}(color)")), False

    def _draw_particles(self, frame, scene, centers, radius, color, pvc, offset, count, pvr):
        c = vectors(centers, 3, "scene.particles(centers)", frame.up)
        r = scalars(radius if pvr is None else pvr, "scene.particles(radius)", frame.up)
        col, _ = self._color(frame, color, pvc, "scene.particles")
        n = (c.count - offset) if count is None else count
        cmd = DrawCmd("particles", 6, max(n, 0))
        cmd.attr(c, add=offset)
        cmd.attr(r, add=offset)
        cmd.attr(col, add=offset)
        cmd.scene = scene
        frame.add(cmd)

    def _draw_mesh(self, frame, scene, vertices, indices, normals, color, pvc, two_sided, i_off, i_count,
                   v_off, v_count):
        v = vectors(vertices, 3, "scene.mesh(vertices)", frame.up)
        ix = None if indices is None else index_src(indices, "scene.mesh(indices)", frame.up)
        if ix is not None:
            corners = (ix.count - i_off) if i_count is None else i_count
            add = i_off
        else:
            corners = (v.count - v_off) if v_count is None else v_count
            add = v_off
        triangles = max(corners, 0) // 3
        if normals is None:
            if add:  # the normals pass reads the mesh from its first corner
                raise WgpuAdError("scene.mesh: index_offset / vertex_offset need normals= (GPU normals are "
                                  "computed for the whole mesh)")
            n = frame.computed_normals(v, ix, triangles, v.count)
        else:
            n = vectors(normals, 3, "scene.mesh(normals)", frame.up)
        col, _ = self._color(frame, color, pvc, "scene.mesh")
        cmd = DrawCmd("mesh", triangles * 3, 1)
        cmd.attr(v, add=add, index=ix)
        cmd.attr(n, add=add, index=ix)
        cmd.attr(col, add=add, index=ix)
        cmd.flags = 1 if two_sided else 0
        cmd.scene = scene
        frame.add(cmd)

    def _draw_lines(self, frame, scene, vertices, width, indices, color, pvc, v_off, v_count, i_off, i_count):
        v = vectors(vertices, 3, "scene.lines(vertices)", frame.up)
        ix = None if indices is None else index_src(indices, "scene.lines(indices)", frame.up)
        if ix is not None:
            ends, add = ((ix.count - i_off) if i_count is None else i_count), i_off
        else:
            ends, add = ((v.count - v_off) if v_count is None else v_count), v_off
        col, _ = self._color(frame, color, pvc, "scene.lines")
        cmd = DrawCmd("lines3d", 6, max(ends, 0) // 2)
        cmd.attr(v, mul=2, add=add, index=ix)
        cmd.attr(v, mul=2, add=add + 1, index=ix)
        cmd.attr(col, mul=2, add=add, index=ix)
        cmd.misc = (float(width), 0.0, 0.0, 0.0)
        cmd.scene = scene
        frame.add(cmd)
