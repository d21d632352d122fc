"""A glfw window with a wgpu surface on the kernels' device, or the reason there can be none.

glfw is imported only here, and only when a window is wanted, so headless use needs neither
glfw nor a display. The surface comes from wgpu's canvas-context API with the platform handles
rendercanvas computes for glfw windows (X11, Wayland, Windows, macOS).
"""
from __future__ import annotations

import os
import sys
import warnings

from wgpu_ad.errors import WgpuAdError

from .events import EventQueue

_open_windows = 0


class WindowError(WgpuAdError):
    """A window could not be opened."""


def _glfw():
    import glfw  # noqa: PLC0415 (optional dependency, imported on demand)
    return glfw


def no_window_reason() -> str | None:
    """None when a window can be opened here, else a short reason (for the headless notice)."""
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        return "no display (DISPLAY and WAYLAND_DISPLAY are not set)"
    try:
        glfw = _glfw()
    except ImportError:
        return "glfw is not installed (pip install 'wgpu_ad[viewer]')"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ok = glfw.init()
    except Exception as e:  # pyglfw raises GLFWError when its error reporting is set to 'raise'
        return f"glfw could not start ({e})"
    if not ok:
        return f"glfw could not connect to the display {os.environ.get('DISPLAY') or os.environ.get('WAYLAND_DISPLAY')!r}"
    return None


def _present_info(glfw, window) -> dict:
    try:
        from rendercanvas.glfw import get_glfw_present_info  # noqa: PLC0415
        return dict(get_glfw_present_info(window))
    except ImportError:
        pass
    if sys.platform.startswith("win"):
        return {"method": "screen", "platform": "windows", "window": int(glfw.get_win32_window(window))}
    if sys.platform.startswith("darwin"):
        return {"method": "screen", "platform": "cocoa", "window": int(glfw.get_cocoa_window(window))}
    return {"method": "screen", "platform": "x11", "window": int(glfw.get_x11_window(window)),
            "display": int(glfw.get_x11_display())}


class Surface:
    """A non-resizable glfw window showing frames rendered by a Renderer; feeds an EventQueue."""

    def __init__(self, title: str, size: tuple[int, int], queue: EventQueue, device, adapter, vsync: bool = False):
        global _open_windows
        import wgpu  # noqa: PLC0415

        glfw = self.glfw = _glfw()
        glfw.window_hint(glfw.CLIENT_API, glfw.NO_API)
        glfw.window_hint(glfw.RESIZABLE, False)
        self.window = glfw.create_window(int(size[0]), int(size[1]), str(title), None, None)
        if not self.window:
            raise WindowError(f"glfw could not create a {size[0]}x{size[1]} window")
        _open_windows += 1
        info = _present_info(glfw, self.window)
        info["vsync"] = bool(vsync)
        self.context = wgpu.gpu.get_canvas_context(info)
        self.context.set_physical_size(*glfw.get_framebuffer_size(self.window))
        self.format = "bgra8unorm"  # a linear format shows the rendered bytes unchanged
        try:
            self.context.configure(device=device, format=self.format)
        except ValueError:
            self.format = self.context.get_preferred_format(adapter)
            self.context.configure(device=device, format=self.format)
        self.queue = queue
        queue.size = glfw.get_window_size(self.window)
        glfw.set_key_callback(self.window, queue.on_key)
        glfw.set_mouse_button_callback(self.window, queue.on_mouse_button)
        glfw.set_cursor_pos_callback(self.window, queue.on_cursor_pos)
        glfw.set_scroll_callback(self.window, queue.on_scroll)
        glfw.set_window_close_callback(self.window, queue.on_close)
        self.poll()

    @property
    def is_open(self) -> bool:
        return self.window is not None

    def current_texture(self):
        fb = self.glfw.get_framebuffer_size(self.window)
        if tuple(fb) != tuple(self.context.physical_size):
            self.context.set_physical_size(*fb)
        return self.context.get_current_texture()

    def present(self) -> None:
        self.context.present()

    def poll(self) -> None:
        if self.window is not None:
            self.glfw.poll_events()
            self.queue.size = self.glfw.get_window_size(self.window)

    def set_title(self, title: str) -> None:
        if self.window is not None:
            self.glfw.set_window_title(self.window, title)

    def position(self) -> tuple[int, int]:
        """The window's content area, top left, in screen pixels."""
        return tuple(self.glfw.get_window_pos(self.window))

    def close(self) -> None:
        """Release the surface, then the window; glfw stops with the last window (while the display
        is still there: terminating later, at exit, can fail once a test's X server is gone)."""
        global _open_windows
        if self.window is None:
            return
        try:
            self.context.unconfigure()
        except Exception:
            pass
        self.context = None
        self.glfw.destroy_window(self.window)
        self.window = None
        _open_windows -= 1
        if _open_windows == 0:
            self.glfw.terminate()
