"""A stand-in `taichi` package for running Taichi's own test files against wgpu_ad
(benchmarks/taichi_suite.py). Every name not defined here is wgpu_ad's, looked up at each access
(ti.root is remade by ti.reset()). What is defined here is what Taichi's tests touch that is not
part of the language: the extension names their decorator asks for, the arch names wgpu_ad has no
use for, and `ti.init` recording the options that `ti.lang.impl.current_cfg()` reports."""
import types as _types

import wgpu_ad as _w

from . import lang  # noqa: F401  (ti.lang.impl.current_cfg(), taichi.lang.util.has_pytorch, ...)
from .lang import impl as _impl

# Names of Taichi's backend extensions (tests say require=ti.extension.adstack); strings suffice
extension = _types.SimpleNamespace(adstack="adstack", data64="data64", assertion="assertion", bls="bls",
                                   sparse="sparse", quant="quant", quant_basic="quant_basic",
                                   mesh="mesh", dynamic_index="dynamic_index")

# Arch names Taichi has and wgpu_ad does not: only compared against, never run on
x64, arm64, dx11, gles, cc = "x64", "arm64", "dx11", "gles", "cc"


def init(arch=None, **options):
    """wgpu_ad.init, remembering arch and default_fp for ti.lang.impl.current_cfg()."""
    out = _w.init(arch=arch, **options)
    _impl.record_init(arch, options)
    return out


def reset():
    _impl.record_init(None, {})
    return _w.reset()


def __getattr__(name):
    return getattr(_w, name)
