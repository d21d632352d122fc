"""The viewer: 2-D and 3-D drawing headless (against stored reference images and independent
pixel checks), no field read-backs while drawing, events from glfw callbacks, widgets, and a
real glfw window under Xvfb whose screenshot (xwd) matches the headless image and a reference.

Reference images live in tests/viewer_ref/; after an intended change of the drawing, write them
again with WGPU_AD_UPDATE_REFS=1 pytest tests/test_viewer.py (and look at them). A mismatch writes
the actual image and a diff image to a temporary folder named in the assertion message.
"""
from __future__ import annotations

import math
import os
import shutil
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

import wgpu_ad as ti
from wgpu_ad.errors import WgpuAdError
from wgpu_ad.viewer import events as ev
from wgpu_ad.viewer import font
from wgpu_ad.viewer.colormap import apply_colormap
from wgpu_ad.viewer.png import decode_png, encode_png, read_png, write_png
from wgpu_ad.viewer.scene import Camera

pytestmark = pytest.mark.gpu

REF = Path(__file__).resolve().parent / "viewer_ref"
UPDATE = os.environ.get("WGPU_AD_UPDATE_REFS") == "1"
BG = 0x102030
BG_RGB = (0x10, 0x20, 0x30)


# ---- image comparison ---------------------------------------------------------------------------

def compare(actual: np.ndarray, name: str, tmp_path: Path, mean_tol: float = 1.5, frac_tol: float = 0.005,
            level: int = 24) -> None:
    """actual (h, w, 3) uint8 vs tests/viewer_ref/<name>.png: mean |diff| <= mean_tol and at most
    frac_tol of the pixels off by more than `level` in some channel."""
    actual = np.ascontiguousarray(actual[:, :, :3])
    ref_path = REF / f"{name}.png"
    if UPDATE:
        write_png(ref_path, actual)
    if not ref_path.exists():
        pytest.fail(f"no reference image {ref_path}; create it with WGPU_AD_UPDATE_REFS=1 pytest {__file__}")
    ref = read_png(ref_path)[:, :, :3]
    assert ref.shape == actual.shape, f"{name}: image shape {actual.shape} != reference {ref.shape}"
    diff = np.abs(actual.astype(np.int16) - ref.astype(np.int16))
    mean, frac = float(diff.mean()), float((diff.max(axis=2) > level).mean())
    if mean > mean_tol or frac > frac_tol:
        write_png(tmp_path / f"{name}_actual.png", actual)
        write_png(tmp_path / f"{name}_diff.png", np.clip(diff * 4, 0, 255).astype(np.uint8))
        pytest.fail(f"{name}: differs from {ref_path} (mean |diff| {mean:.2f} > {mean_tol} or {frac:.2%} of pixels "
                    f"off by > {level} (limit {frac_tol:.2%})); see {tmp_path / (name + '_actual.png')} and "
                    f"{tmp_path / (name + '_diff.png')}")


def px(img: np.ndarray, x: int, y: int) -> tuple:
    """Pixel (x, y) counted from the bottom left, as RGB."""
    return tuple(int(v) for v in img[img.shape[0] - 1 - y, x, :3])


# ---- scenes shared by the reference tests --------------------------------------------------------

def draw_2d(gui) -> None:
    """Circles and an image from fields, lines / triangles / arrows from NumPy, and text."""
    img = ti.field(ti.f32, shape=(32, 16))
    img.from_numpy(np.add.outer(np.linspace(0, 1, 32), np.linspace(0, 0.2, 16)).astype(np.float32))
    pos = ti.Vector.field(2, ti.f32, shape=4)
    pos.from_numpy(np.array([[0.5, 0.5], [0.2, 0.25], [0.8, 0.3], [0.35, 0.7]], np.float32))
    col = ti.field(ti.i32, shape=4)
    col.from_numpy(np.array([0xFF0000, 0x00FF00, 0xFFFFFF, 0xFFFF00], np.int32))
    gui.set_image(img)
    gui.circles(pos, radius=np.array([10, 6, 8, 4], np.float32), color=col)
    gui.lines(np.array([[0.1, 0.1], [0.1, 0.9]]), np.array([[0.9, 0.1], [0.6, 0.95]]), radius=2, color=0x000000)
    gui.triangles(np.array([[0.6, 0.6]]), np.array([[0.9, 0.6]]), np.array([[0.75, 0.85]]), color=0xFF00FF)
    gui.arrows(np.array([[0.1, 0.4]]), np.array([[0.25, 0.1]]), radius=1.5, color=0xFFFFFF)
    gui.text("wgpu_ad 2-D", (0.05, 0.97), font_size=18, color=0xFFFFFF)


def sphere_mesh(nu: int = 24, nv: int = 12):
    """A unit sphere, triangles wound counter-clockwise seen from outside."""
    verts = []
    for i in range(nv + 1):
        th = math.pi * i / nv
        for j in range(nu):
            ph = 2 * math.pi * j / nu
            verts.append((math.sin(th) * math.cos(ph), math.cos(th), math.sin(th) * math.sin(ph)))
    idx = []
    for i in range(nv):
        for j in range(nu):
            a, b = i * nu + j, i * nu + (j + 1) % nu
            c, d = a + nu, b + nu
            idx += [a, b, c, b, d, c]
    return np.array(verts, np.float32), np.array(idx, np.int32)


def draw_3d(window) -> dict:
    """A sphere mesh (GPU normals) lit from +x, two particles, a line; returns the fields."""
    v, ix = sphere_mesh()
    verts = ti.Vector.field(3, ti.f32, shape=len(v))
    verts.from_numpy(v)
    idx = ti.field(ti.i32, shape=len(ix))
    idx.from_numpy(ix)
    parts = ti.Vector.field(3, ti.f32, shape=2)
    parts.from_numpy(np.array([[1.6, 1.2, 0.0], [-1.6, -1.2, 0.0]], np.float32))
    canvas, scene, cam = window.get_canvas(), ti.ui.Scene(), ti.ui.Camera()
    canvas.set_background_color((0.0, 0.0, 0.0))
    cam.position(0, 0, 5)
    cam.lookat(0, 0, 0)
    scene.set_camera(cam)
    scene.ambient_light((0.05, 0.05, 0.05))
    scene.point_light(pos=(10, 0, 0), color=(1, 1, 1))
    scene.mesh(verts, indices=idx, color=(0.9, 0.6, 0.3))
    scene.particles(parts, radius=0.25, color=(0.2, 0.9, 0.3))
    scene.lines(np.array([[-2, -1.9, 0], [2, -1.9, 0]], np.float32), width=3, color=(1, 1, 0))
    canvas.scene(scene)
    return {"verts": verts, "idx": idx, "parts": parts, "camera": cam}


def project(cam: Camera, p, size) -> tuple[int, int]:
    """Pixel (x, y from the bottom left) of world point p, by the camera's matrices."""
    clip = cam.projection_matrix(size[0] / size[1]) @ cam.view_matrix() @ np.array([*p, 1.0])
    ndc = clip[:2] / clip[3]
    return int((ndc[0] * 0.5 + 0.5) * size[0]), int((ndc[1] * 0.5 + 0.5) * size[1])


# ---- 2-D ----------------------------------------------------------------------------------------

def test_circle_pixels_and_background():
    gui = ti.GUI("t", res=256, background_color=BG, headless=True)
    gui.circle((0.5, 0.5), color=0xFF0000, radius=10)
    gui.circle((0.25, 0.75), color=0x00FF00, radius=3)
    gui.show()
    img = gui._display.read_image()
    assert px(img, 128, 128) == (255, 0, 0)           # centre of the big circle
    assert px(img, 128 + 7, 128) == (255, 0, 0)       # inside its 10 px radius
    assert px(img, 148, 128) == BG_RGB                # 20 px away: background
    assert px(img, 64, 192) == (0, 255, 0)
    assert px(img, 64 + 6, 192) == BG_RGB             # the 3 px circle ends before 6 px
    for x, y in ((0, 0), (255, 0), (0, 255), (255, 255)):
        assert px(img, x, y) == BG_RGB


def test_2d_reference_image(tmp_path):
    gui = ti.GUI("2d", res=256, background_color=BG, headless=True)
    draw_2d(gui)
    out = tmp_path / "frame.png"
    gui.show(str(out))
    img = read_png(out)
    assert img.shape == (256, 256, 3)
    # independent of the reference: per-circle colours from an int field, lines, triangle
    assert px(img, 128, 128) == (255, 0, 0)
    assert px(img, 51, 64) == (0, 255, 0)
    assert px(img, 204, 77) == (255, 255, 255)
    assert px(img, 128, 26) == (0, 0, 0)              # the black line y = 0.1
    assert px(img, 192, 180) == (255, 0, 255)         # inside the triangle
    compare(img, "gui_2d", tmp_path)


def test_image_colormap_orientation_and_values():
    w, h = 16, 8
    vals = np.add.outer(np.arange(w) / (w - 1), np.zeros(h)).astype(np.float32)  # rises with x
    vals[:, h - 1] = 0.0                                                         # the top row: 0
    gui = ti.GUI("img", res=(w * 8, h * 8), headless=True)
    field = ti.field(ti.f32, shape=(w, h))
    field.from_numpy(vals)
    gui.set_image(field)
    gui.show()
    img = gui._display.read_image()
    want = np.round(apply_colormap(vals) * 255).astype(int)
    for x in range(w):
        for y in range(h):
            got = px(img, x * 8 + 4, y * 8 + 4)
            assert np.abs(np.array(got) - want[x, y, :3]).max() <= 2, (x, y, got, want[x, y])
    # RGB NumPy image, uint8: channels and [x, y] layout
    rgb = np.zeros((w, h, 3), np.uint8)
    rgb[3, 2] = (10, 200, 30)
    gui.set_image(rgb)
    gui.show()
    img = gui._display.read_image()
    assert px(img, 3 * 8 + 4, 2 * 8 + 4) == (10, 200, 30)
    assert px(img, 4 * 8 + 4, 2 * 8 + 4) == (0, 0, 0)


def test_text_matches_the_font():
    gui = ti.GUI("text", res=(160, 40), background_color=0x000000, headless=True)
    gui.text("Hi 42!", (10 / 160, 1 - 5 / 40), font_size=18, color=0xFFFFFF)  # scale 2, top-left (10, 5) px
    gui.show()
    img = gui._display.read_image()
    mask = font.render_text_cpu("Hi 42!", scale=2)
    h, w = mask.shape
    got = img[5:5 + h, 10:10 + w, 0] > 128
    assert (got == mask).all(), f"{(got != mask).sum()} pixels differ from the font's own rendering"
    assert not (img[:, :10, :3] > 0).any() and not (img[5 + h:, :, :3] > 0).any()


def test_fps_readout_only_when_asked():
    gui = ti.GUI("fps", res=(200, 100), background_color=0x000000, headless=True, show_fps=True)
    gui.show()
    gui.show()
    img = gui._display.read_image()
    assert (img[:30, 100:, 0] > 128).any(), "no FPS text in the top-right corner"
    quiet = ti.GUI("fps", res=(200, 100), background_color=0x000000, headless=True)
    quiet.show()
    assert not (quiet._display.read_image()[:, :, :3] > 0).any()


def test_input_errors_name_the_argument():
    gui = ti.GUI("err", res=64, headless=True)
    with pytest.raises(WgpuAdError, match=r"gui\.circles\(pos\): expected an array of shape \(N, 2\), got shape \(5,\)"):
        gui.circles(np.zeros(5))
    with pytest.raises(WgpuAdError, match=r"gui\.lines: the per-element inputs have different lengths"):
        gui.lines(np.zeros((3, 2)), np.zeros((4, 2)))
    m = ti.Matrix.field(2, 2, ti.f32, shape=3)
    with pytest.raises(WgpuAdError, match="holds matrices"):
        gui.circles(m)


def test_gui_after_reset_is_refused():
    gui = ti.GUI("reset", res=64, headless=True)
    ti.reset()
    with pytest.raises(WgpuAdError, match=r"created before ti\.reset\(\)"):
        gui.circle((0.5, 0.5))


# ---- no read-back --------------------------------------------------------------------------------

def test_drawing_fields_reads_nothing_back(tmp_path):
    rt = ti.get_runtime()
    n = 64
    x = ti.Vector.field(2, ti.f32, shape=n)
    c = ti.field(ti.i32, shape=n)
    img = ti.field(ti.f32, shape=(32, 32))

    @ti.kernel
    def fill():
        for i in x:
            x[i] = ti.Vector([0.1 + 0.8 * i / n, 0.5])
            c[i] = 0xFF8000
        for i, j in img:
            img[i, j] = i / 32

    fill()
    gui = ti.GUI("rb", res=128, background_color=0x000000, headless=True)
    before = rt.readback_count
    for _ in range(3):
        gui.set_image(img)
        gui.circles(x, radius=3, color=c)
        gui.lines(x, x, radius=1, color=c)
        gui.show()
    assert rt.readback_count == before, "drawing fields read buffers back to the CPU"
    assert gui.image_reads == 0
    gui.circles(x, radius=3, color=c)
    gui.show(str(tmp_path / "f.png"))  # saving reads the *image* back, counted apart
    assert rt.readback_count == before and gui.image_reads == 1
    # the kernel's results were drawn (its launch was flushed before the frame): orange circles
    shot = read_png(tmp_path / "f.png")
    assert px(shot, int(0.1 * 128) + 1, 64) == (0xFF, 0x80, 0x00)

    window = ti.ui.Window("rb3", (96, 96), headless=True)
    draw_3d(window)
    window.show()
    assert rt.readback_count == before


# ---- 3-D ----------------------------------------------------------------------------------------

def test_3d_scene_lighting_particles_and_reference(tmp_path):
    window = ti.ui.Window("3d", (256, 256), headless=True)
    objs = draw_3d(window)
    out = tmp_path / "scene.png"
    window.save_image(str(out))
    img = read_png(out)
    cam, size = objs["camera"], (256, 256)
    cx, cy = project(cam, (0, 0, 0), size)
    lit = np.array(px(img, *project(cam, (0.7, 0, 0.7), size)))
    dark = np.array(px(img, *project(cam, (-0.7, 0, 0.7), size)))
    assert lit.sum() > 3 * dark.sum() + 100, f"lit side {lit} is not brighter than the dark side {dark}"
    assert lit[0] > lit[2], "the mesh colour (0.9, 0.6, 0.3) should show on the lit side"
    for p in ((1.6, 1.2, 0.0), (-1.6, -1.2, 0.0)):
        x, y = project(cam, p, size)
        r, g, b = px(img, x, y)                        # faces the eye, lit from the side: dim but green
        assert g > r and g > b, f"particle at {p} not visible: {(r, g, b)}"
        brightest = img[256 - 1 - y - 14:256 - y + 14, x - 14:x + 15, :3].reshape(-1, 3)
        brightest = brightest[brightest[:, 1].argmax()]
        assert brightest[1] > 120 and brightest[1] > 2 * brightest[0], f"particle at {p}: {brightest}"
    assert px(img, *project(cam, (0, -1.9, 0), size)) == (255, 255, 0)  # unlit line
    assert px(img, 2, 2) == (0, 0, 0)
    assert (cx, cy) == (128, 128)
    compare(img, "scene_3d", tmp_path)


def test_gpu_normals_match_numpy():
    v, ix = sphere_mesh(12, 6)
    rng = np.random.default_rng(0)
    v = v * (1 + 0.2 * rng.random((len(v), 1))).astype(np.float32)  # a lumpy sphere: not radial normals
    window = ti.ui.Window("n", (32, 32), headless=True)
    scene = ti.ui.Scene()
    scene.mesh(v, indices=ix)
    window.get_canvas().scene(scene)
    window.show()
    d = window._display
    normals_buf = d.renderer.normal_pool[0][0]
    got = np.frombuffer(d.renderer.device.queue.read_buffer(normals_buf, 0, len(v) * 12), np.float32).reshape(-1, 3)
    tri = ix.reshape(-1, 3)
    fn = np.cross(v[tri[:, 1]] - v[tri[:, 0]], v[tri[:, 2]] - v[tri[:, 0]]).astype(np.float64)
    fn /= np.linalg.norm(fn, axis=1, keepdims=True)
    acc = np.zeros((len(v), 3))
    for k in range(3):
        np.add.at(acc, tri[:, k], fn)
    want = acc / np.linalg.norm(acc, axis=1, keepdims=True)
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_camera_orbit_and_zoom_keep_the_target():
    cam = Camera()
    cam.position(0, 1, 4)
    cam.lookat(0, 1, 0)
    d0 = np.linalg.norm(cam.curr_position - cam.curr_lookat)
    cam.orbit(math.pi / 2, 0.0)
    assert np.linalg.norm(cam.curr_position - cam.curr_lookat) == pytest.approx(d0)
    assert abs(cam.curr_position[2]) < 1e-9 and abs(abs(cam.curr_position[0]) - 4) < 1e-9
    cam.zoom(0.5)
    assert np.linalg.norm(cam.curr_position - cam.curr_lookat) == pytest.approx(d0 / 2)
    assert project(cam, cam.curr_lookat, (200, 100)) == (100, 50)


def test_orbit_camera_follows_drag_and_scroll():
    window = ti.ui.Window("cam", (100, 100), headless=True)
    cam = Camera()
    q = window.events
    cam.track_user_inputs(window)
    start = cam.curr_position.copy()
    q.on_mouse_button(None, 1, 1, 0)             # right button down
    q.on_cursor_pos(None, 80, 50)
    cam.track_user_inputs(window)
    assert not np.allclose(cam.curr_position, start), "dragging with RMB did not orbit"
    d = np.linalg.norm(cam.curr_position)
    q.on_scroll(None, 0, 1)
    cam.track_user_inputs(window)
    assert np.linalg.norm(cam.curr_position) < d, "scrolling up did not zoom in"


# ---- events and widgets -------------------------------------------------------------------------

def test_events_from_glfw_callbacks():
    gui = ti.GUI("ev", res=(200, 100), headless=True)
    q = gui.events
    q.on_cursor_pos(None, 50, 25)                 # screen coordinates from the top left
    assert gui.get_cursor_pos() == (0.25, 0.75)
    q.on_key(None, 65, 0, 1, 0x1)                 # 'A' pressed with shift
    q.on_mouse_button(None, 0, 1, 0)
    q.on_scroll(None, 0.0, -2.0)
    q.on_key(None, 65, 0, 2, 0)                   # key repeat: not an event
    q.on_key(None, 65, 0, 0, 0)
    assert gui.is_pressed(ti.GUI.LMB) and not gui.is_pressed("a")
    assert gui.get_event(ti.GUI.PRESS)
    e = gui.event
    assert (e.type, e.key, e.modifier) == (ti.GUI.PRESS, "a", [ti.GUI.SHIFT])
    assert e.pos == (0.25, 0.75)
    rest = list(gui.get_events())
    assert [(r.type, r.key) for r in rest] == [(ti.GUI.PRESS, ti.GUI.LMB), (ti.GUI.WHEEL, ti.GUI.WHEEL),
                                               (ti.GUI.RELEASE, "a")]
    assert rest[1].delta == (0.0, -2.0)
    q.on_scroll(None, 0.0, 1.0)
    assert gui.get_event(ti.GUI.MOTION) and gui.event.key == ti.GUI.WHEEL  # Taichi filters wheels as MOTION
    assert not gui.get_event()


def test_pause_step_reset_and_escape_keys():
    gui = ti.GUI("keys", res=64, headless=True)
    q = gui.events
    assert gui.should_advance() and not gui.paused
    q.on_key(None, ord("P"), 0, 1, 0)
    assert gui.paused and not gui.should_advance()
    q.on_key(None, ord("S"), 0, 1, 0)
    assert gui.should_advance() and not gui.should_advance()   # exactly one step
    q.on_key(None, ord("R"), 0, 1, 0)
    assert gui.take_reset() and not gui.take_reset()
    assert [e.key for e in gui.get_events(ti.GUI.PRESS)] == ["p", "s", "r"]  # delivered as events too
    assert gui.running
    q.on_key(None, 256, 0, 1, 0)                                # Escape
    assert not gui.running


def test_glfw_key_table_agrees_with_glfw():
    glfw = pytest.importorskip("glfw", reason="glfw is not installed (pip install 'wgpu_ad[viewer]')")
    assert ev.glfw_key_name(glfw.KEY_ESCAPE) == ev.ESCAPE
    assert ev.glfw_key_name(glfw.KEY_SPACE) == ev.SPACE
    assert ev.glfw_key_name(glfw.KEY_A) == "a" and ev.glfw_key_name(glfw.KEY_Z) == "z"
    assert ev.glfw_key_name(glfw.KEY_0) == "0" and ev.glfw_key_name(glfw.KEY_F12) == "F12"
    for name in ("LEFT", "RIGHT", "UP", "DOWN", "TAB", "BACKSPACE"):
        assert ev.glfw_key_name(getattr(glfw, "KEY_" + name)) == getattr(ev, name)
    assert ev.glfw_key_name(glfw.KEY_LEFT_SHIFT) == ev.SHIFT
    assert (glfw.PRESS, glfw.RELEASE, glfw.REPEAT, glfw.MOUSE_BUTTON_LEFT, glfw.MOUSE_BUTTON_RIGHT) == (1, 0, 2, 0, 1)


def test_slider_and_button_follow_the_mouse():
    gui = ti.GUI("w", res=(400, 400), headless=True)
    s = gui.slider("k", 0, 10, step=1)
    name = gui.button("Go", "go")
    gui.show()                                     # lays the widgets out
    q = gui.events
    x0, y0, x1, y1 = gui._display.panel.rects[s]
    q.on_cursor_pos(None, x0 + 0.7 * (x1 - x0), (y0 + y1) / 2)
    q.on_mouse_button(None, 0, 1, 0)
    assert s.value == 7.0
    q.on_cursor_pos(None, x0 + 0.31 * (x1 - x0), (y0 + y1) / 2)  # drag
    assert s.value == 3.0
    q.on_mouse_button(None, 0, 0, 0)
    bx0, by0, bx1, by1 = gui._display.panel.rects[gui._display.panel.retained[1]]
    q.on_cursor_pos(None, (bx0 + bx1) / 2, (by0 + by1) / 2)
    q.on_mouse_button(None, 0, 1, 0)
    q.on_mouse_button(None, 0, 0, 0)
    keys = [(e.type, e.key) for e in gui.get_events(ti.GUI.PRESS, ti.GUI.RELEASE)]
    assert keys == [(ti.GUI.PRESS, name)], "the widgets' clicks must not reach the program as LMB events"
    q.on_cursor_pos(None, 390, 390)                # outside the panel: a plain click
    q.on_mouse_button(None, 0, 1, 0)
    assert gui.get_event(ti.GUI.PRESS) and gui.event.key == ti.GUI.LMB


def test_ggui_sub_window_widgets():
    window = ti.ui.Window("gg", (400, 400), headless=True)
    value, clicks = 0.25, 0
    for frame in range(3):
        with window.GUI.sub_window("controls", 0.05, 0.05, 0.5, 0.4) as w:
            value = w.slider_float("gain", value, 0.0, 2.0)
            clicks += w.button("reset")
        window.show()
        if frame == 0:
            p = window._display.panel
            x0, y0, x1, y1 = p.rects[("controls", "gain")]
            q = window.events
            q.on_cursor_pos(None, x0 + 0.75 * (x1 - x0), (y0 + y1) / 2)
            q.on_mouse_button(None, 0, 1, 0)
            q.on_mouse_button(None, 0, 0, 0)
            bx0, by0, bx1, by1 = p.rects[("controls", "reset")]
            q.on_cursor_pos(None, (bx0 + bx1) / 2, (by0 + by1) / 2)
            q.on_mouse_button(None, 0, 1, 0)
    assert value == pytest.approx(1.5, abs=0.02)
    assert clicks == 1


def test_auto_headless_says_so(monkeypatch, capsys):
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    gui = ti.GUI("auto", res=32)
    out = capsys.readouterr().out.strip().splitlines()
    assert gui.headless
    assert out == ["wgpu_ad.viewer: no display (DISPLAY and WAYLAND_DISPLAY are not set); rendering headless "
                   "(offscreen): show(file) / save_image(file) write PNG files"]
    with pytest.raises(WgpuAdError, match="pass headless=True"):
        ti.GUI("forced", res=32, headless=False)
    if shutil.which("Xvfb") and not os.path.exists("/tmp/.X11-unix/X12345"):  # a display nobody serves
        pytest.importorskip("glfw", reason="glfw is not installed")
        monkeypatch.setenv("DISPLAY", ":12345")
        assert ti.GUI("bad display", res=32).headless
        assert "glfw could not connect to the display ':12345'" in capsys.readouterr().out


def test_import_does_not_load_the_viewer():
    code = ("import sys, wgpu_ad as ti\n"
            "assert 'glfw' not in sys.modules and 'wgpu_ad.viewer' not in sys.modules\n"
            "assert ti.GUI.__name__ == 'GUI' and ti.ui.Window.__name__ == 'Window'\n"
            "assert 'glfw' not in sys.modules  # only opening a window imports glfw\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_recording(tmp_path):
    gui = ti.GUI("rec", res=32, headless=True, record=str(tmp_path / "movie.gif"))
    for k in range(3):
        gui.circle((0.5, 0.5), radius=4 + 2 * k, color=0xFFFFFF)
        gui.show()
    gui.close()
    rec = gui._display
    assert rec.renderer.image_reads == 3
    gif = tmp_path / "movie.gif"
    frames = tmp_path / "movie_frames"
    if gif.exists():
        assert gif.read_bytes()[:6] in (b"GIF89a", b"GIF87a")
    else:
        names = sorted(p.name for p in frames.iterdir())
        assert names == ["frame_00000.png", "frame_00001.png", "frame_00002.png"]
        sizes = [int((read_png(frames / n)[:, :, 0] > 128).sum()) for n in names]
        assert sizes[0] < sizes[1] < sizes[2]


# ---- PNG files ----------------------------------------------------------------------------------

def test_png_roundtrip_and_filtered_rows():
    rng = np.random.default_rng(3)
    for shape in ((5, 7), (6, 4, 3), (3, 9, 4)):
        a = rng.integers(0, 256, shape, dtype=np.uint8)
        b = decode_png(encode_png(a))
        assert (b.reshape(a.shape) == a).all()
    # rows written with the Sub, Up, Average and Paeth filters (encoded here by hand) decode exactly
    img = rng.integers(0, 256, (4, 5, 3), dtype=np.uint8).astype(int)
    raw = bytearray()
    prev = np.zeros(15, int)
    for ftype, row in zip((1, 2, 3, 4), img.reshape(4, 15)):
        left = np.concatenate([[0, 0, 0], row[:-3]])
        upleft = np.concatenate([[0, 0, 0], prev[:-3]])
        if ftype == 1:
            pred = left
        elif ftype == 2:
            pred = prev
        elif ftype == 3:
            pred = (left + prev) // 2
        else:
            p = left + prev - upleft
            pa, pb, pc = abs(p - left), abs(p - prev), abs(p - upleft)
            pred = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, prev, upleft))
        raw += bytes([ftype]) + bytes(((row - pred) % 256).astype(np.uint8))
        prev = row

    def chunk(tag, body):
        return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 5, 4, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(bytes(raw))) + chunk(b"IEND", b""))
    assert (decode_png(png) == img).all()


def test_font_covers_printable_ascii():
    table = font.font_table().reshape(-1, font.GLYPH_H)
    assert table.shape == (95, 7) and table.max() < 32
    letters = {tuple(table[font.glyph_code(c)]) for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"}
    assert len(letters) == 62, "two characters share a glyph"
    assert font.glyph_code("\u00e9") == font.glyph_code("?")


# ---- a real window under Xvfb -------------------------------------------------------------------

def parse_xwd(data: bytes) -> np.ndarray:
    """An X window dump (xwd, ZPixmap, 24 / 32 bits per pixel, TrueColor) as (h, w, 3) RGB."""
    names = ("header_size version format depth width height xoffset byte_order unit bit_order pad bpp "
             "bytes_per_line visual_class red_mask green_mask blue_mask bits_per_rgb colormap_entries ncolors").split()
    h = dict(zip(names, struct.unpack(">20I", data[:80])))
    assert h["version"] == 7 and h["format"] == 2, f"unexpected xwd header {h}"
    assert h["bpp"] in (24, 32), f"xwd with {h['bpp']} bits per pixel is not supported"
    off = h["header_size"] + h["ncolors"] * 12
    rows = np.frombuffer(data, np.uint8, h["bytes_per_line"] * h["height"], off).reshape(h["height"], -1)
    bpp = h["bpp"] // 8
    px_bytes = rows[:, :h["width"] * bpp].reshape(h["height"], h["width"], bpp).astype(np.uint32)
    order = range(bpp) if h["byte_order"] == 0 else range(bpp - 1, -1, -1)  # LSBFirst: byte 0 is lowest
    value = sum(px_bytes[:, :, b] << (8 * k) for k, b in enumerate(order))
    out = []
    for mask in (h["red_mask"], h["green_mask"], h["blue_mask"]):
        shift = (mask & -mask).bit_length() - 1
        out.append(((value & mask) >> shift).astype(np.uint8))
    return np.stack(out, axis=2)


@pytest.fixture
def x_display(monkeypatch):
    """A display for a real window: DISPLAY if set, else an Xvfb started here."""
    if shutil.which("xwd") is None:
        pytest.skip("xwd is not installed (apt-get install x11-apps; .ci/run installs it)")
    if os.environ.get("DISPLAY"):
        yield os.environ["DISPLAY"]
        return
    xvfb = shutil.which("Xvfb")
    if xvfb is None:
        pytest.skip("no DISPLAY and no Xvfb (apt-get install xvfb; .ci/run installs it)")
    # -displayfd: Xvfb picks a free display and writes its number to the pipe once it accepts
    # connections (or exits, closing the pipe): no polling, no clock
    rfd, wfd = os.pipe()
    proc = subprocess.Popen([xvfb, "-displayfd", str(wfd), "-screen", "0", "640x480x24", "-nolisten", "tcp"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(wfd,))
    os.close(wfd)
    try:
        with os.fdopen(rfd) as ready:
            n = ready.readline().strip()
        if not n.isdigit():
            proc.wait(10)
            pytest.skip(f"Xvfb did not start (exit code {proc.returncode})")
        monkeypatch.setenv("DISPLAY", f":{n}")
        yield f":{n}"
    finally:
        proc.terminate()
        proc.wait(10)


def test_window_screenshot_under_xvfb(x_display, tmp_path):
    gui = ti.GUI("window", res=(256, 256), background_color=BG, show_fps=False)
    try:
        assert not gui.headless, "a window should open on the display"
        surface = gui._display.surface
        for _ in range(3):
            draw_2d(gui)
            gui.show()
        headless_img = gui._display.read_image()[:, :, :3]
        win_id = int(surface.glfw.get_x11_window(surface.window))
        shot = None
        for _ in range(40):  # the X server shows the presented frame a moment later
            surface.poll()
            dump = subprocess.run(["xwd", "-id", str(win_id), "-display", x_display, "-silent"],
                                  capture_output=True, timeout=20, check=True).stdout
            shot = parse_xwd(dump)
            if shot.shape[:2] == (256, 256) and px(shot, 128, 128) == (255, 0, 0):
                break
            draw_2d(gui)
            gui.show()
            time.sleep(0.05)
    finally:
        gui.close()
    write_png(tmp_path / "window.png", shot)
    assert shot.shape == (256, 256, 3), f"window screenshot has shape {shot.shape}"
    diff = np.abs(shot.astype(int) - headless_img.astype(int))
    assert diff.max() <= 2, (f"the window shows something else than the rendered frame (max diff {diff.max()}); "
                             f"screenshot: {tmp_path / 'window.png'}")
    compare(shot, "window", tmp_path)
