"""taichi.lang.enums: names of Taichi internals some tests compare against (an SNode's gradient kind,
a kernel's autodiff mode). wgpu_ad has no such attributes, so tests reading them fail, as they should."""
import enum


class SNodeGradType(enum.Enum):
    PRIMAL = 0
    ADJOINT = 1
    DUAL = 2
    ADJOINT_CHECKBIT = 3


class AutodiffMode(enum.Enum):
    NONE = 0
    VALIDATION = 1
    FORWARD = 2
    REVERSE = 3
