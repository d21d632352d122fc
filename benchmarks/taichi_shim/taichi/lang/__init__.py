"""taichi.lang's modules that Taichi's autodiff tests import (impl, util, misc, exception, enums)."""
from . import enums, exception, impl, misc, util  # noqa: F401
