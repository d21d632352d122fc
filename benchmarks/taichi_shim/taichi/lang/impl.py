"""taichi.lang.impl: current_cfg() (read by the tests for arch and default_fp) and call_internal."""
import types

import wgpu_ad as _w

_cfg = types.SimpleNamespace(arch=_w.vulkan, default_fp=_w.f32, default_ip=_w.i32, debug=False)


def record_init(arch, options):
    # WebGPU on Linux runs on Vulkan: the tests' arch-dependent branches (torch device, tolerances)
    # take their Vulkan path, which is float32 with Taichi's default relative tolerance 1e-6.
    _cfg.arch = _w.vulkan
    fp = options.get("default_fp", _w.f32)
    if options.get("f64") == "f32" and str(fp) in ("f64", "float64"):
        fp = _w.f64  # read after ti.init(f64="f32"): the float32 that stands for it
    _cfg.default_fp = fp
    _cfg.default_ip = options.get("default_ip", _w.i32)
    _cfg.debug = bool(options.get("debug", False))


def current_cfg():
    return _cfg


def call_internal(name, *args):
    raise NotImplementedError(f"impl.call_internal({name!r}) calls a test hook inside Taichi's C++ runtime; "
                              "wgpu_ad has no counterpart")
