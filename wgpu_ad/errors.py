"""User-facing errors. Compile errors carry file:line and a caret excerpt of the user's source."""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class SourceLoc:
    file: str
    line: int
    col: int = 0
    source_line: str = ""
    func: str = ""

    def excerpt(self) -> str:
        head = f'  File "{self.file}", line {self.line}' + (f", in {self.func}" if self.func else "")
        if not self.source_line:
            return head
        text = self.source_line.rstrip("\n")
        stripped = text.lstrip()
        indent = len(text) - len(stripped)
        caret = " " * max(self.col - indent, 0) + "^"
        return f"{head}\n    {stripped}\n    {caret}"


class WgpuAdError(Exception):
    """Base of every error wgpu_ad raises on purpose."""


class CompileError(WgpuAdError):
    """A kernel could not be compiled; the message shows where in the user's source."""

    def __init__(self, message: str, loc: SourceLoc | None = None):
        self.msg = message
        self.loc = loc
        text = message if loc is None else f"{message}\n{loc.excerpt()}"
        super().__init__(text)


class NotDifferentiableError(CompileError, RuntimeError):
    """Reverse mode refuses a kernel (ti.random, gradients read in the kernel, ...): the message
    names the kernel, the line and the fix. A RuntimeError too, as Taichi raises these."""


class UnsupportedError(CompileError):
    """A Python construct that kernels do not support."""


class AutodiffUsageError(WgpuAdError, RuntimeError):
    """The autodiff API used wrongly: @ti.ad.grad_for / grad_replaced / no_grad on the wrong kind
    of function, a ti.ad.Tape loss that is not one number with a gradient (a RuntimeError, as
    Taichi raises it)."""


class KernelArgError(WgpuAdError, TypeError):
    """A kernel was called with an argument of the wrong type or shape."""


class NoCompanionError(WgpuAdError, AttributeError):
    """x.grad or x.dual of a field / ndarray that has none (an AttributeError: hasattr(x, "grad")
    is False, as tools that inspect objects expect)."""


class GpuError(WgpuAdError, RuntimeError):
    """WebGPU reported a validation error, out-of-memory or device loss."""


class KernelRuntimeError(WgpuAdError, RuntimeError):
    """A check inside a kernel failed on the GPU (debug mode index checks, stack overflow)."""


class KernelAssertionError(KernelRuntimeError, AssertionError):
    """An `assert` in a kernel failed (debug mode: ti.init(debug=True))."""


class KernelZeroDivisionError(KernelRuntimeError, ZeroDivisionError):
    """An integer `//` or `%` by zero in a kernel (debug mode: ti.init(debug=True)). Attributes:
    kernel and line (of the division). Without debug mode the GPU gives x // 0 = x, x % 0 = 0."""

    def __init__(self, message: str, *, kernel: str = "", line: int | None = None):
        super().__init__(message)
        self.kernel, self.line = kernel, line


@dataclass(frozen=True)
class ZeroDivisionCheck:
    """The attr of a debug-mode ASSERT that an integer divisor is not 0 (frontend/values.py): what
    the runtime turns into KernelZeroDivisionError; the ASSERT reports the dividend."""

    kernel: str
    op: str            # '//' or '%'
    loc: SourceLoc | None

    def format(self, *values) -> str:
        where = f" at {self.loc.file}:{self.loc.line}" if self.loc else ""
        return f"integer division by zero: {values[0]} {self.op} 0{where}" if values else "integer division by zero"

    def error(self, values, storage=None) -> KernelZeroDivisionError:
        return KernelZeroDivisionError(f"kernel '{self.kernel}': {self.format(*values)}", kernel=self.kernel,
                                       line=self.loc.line if self.loc else None)


class DataAccessRuleError(KernelAssertionError):
    """A tape's launches break a global data access rule (a kernel overwrites what an earlier one
    read): the gradient would be silently wrong. Taichi raises TaichiAssertionError there (under
    validation=True), so Taichi programs and tests that catch it catch this too."""


class GradientDTypeError(KernelRuntimeError, TypeError):
    """A gradient or dual asked of an integer field / ndarray (Taichi's TaichiRuntimeError)."""


class GradientNaNError(KernelRuntimeError, FloatingPointError):
    """The backward pass produced a NaN or infinite gradient (the check of ti.init(debug=True) or
    ti.ad.Tape(check_nan=True)); the message names the kernel, the element and the operation whose
    derivative is not finite (wgpu_ad/nan_check.py). Attributes: kernel, field, index (the
    element's index and component indices, or None), value, op (the operation's name, or None)
    and line (its source line, or None)."""

    def __init__(self, message: str, *, kernel: str = "", field: str = "", index: tuple | None = None,
                 value: float = float("nan"), op: str | None = None, line: int | None = None):
        super().__init__(message)
        self.kernel, self.field, self.index, self.value, self.op, self.line = kernel, field, index, value, op, line


class DataAccessError(KernelRuntimeError):
    """A forward launch whose accesses the compiler could not prove safe for reverse mode (indices
    read from fields, counters stepped conditionally) was checked on the GPU, and the data broke
    the rule: an element stored twice, or read and then overwritten, in one launch (its gradient
    would be silently wrong; wgpu_ad/access_check.py). Attributes: kernel, field, index (the
    element's index and component indices, or None) and line (the write's source line, or None)."""

    def __init__(self, message: str, *, kernel: str = "", field: str = "", index: tuple | None = None,
                 line: int | None = None):
        super().__init__(message)
        self.kernel, self.field, self.index, self.line = kernel, field, index, line


class Float64Error(WgpuAdError):
    """ti.f64 used without ti.init(f64="f32"): WebGPU shaders have no 64-bit floats."""


class Float64Warning(UserWarning):
    """ti.init(f64="f32"): the program's ti.f64 computes in float32 (types.py F64_AS_F32)."""


class ConstantChangedWarning(UserWarning):
    """A Python number a kernel read when it compiled (a global, closure variable or attribute:
    a compile-time constant, as in Taichi) has changed since; the kernel still uses the old one."""


class TorchGradWarning(UserWarning):
    """kernel.grad() accumulated into the .grad of a leaf torch tensor while torch's own backward
    pass runs and will accumulate into it too: a torch.autograd.Function whose backward returns
    that .grad counts the gradient twice (docs/pytorch.md shows the fix)."""


def debug_enabled() -> bool:
    """WGPU_AD_DEBUG_COMPILER=1 shows compiler internals in tracebacks."""
    return os.environ.get("WGPU_AD_DEBUG_COMPILER", "") not in ("", "0")
