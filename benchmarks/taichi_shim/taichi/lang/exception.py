"""taichi.lang.exception: Taichi's exception names, which wgpu_ad exports as aliases of its own."""
from wgpu_ad import (TaichiAssertionError, TaichiCompilationError, TaichiRuntimeError,  # noqa: F401
                     TaichiSyntaxError, TaichiTypeError)
