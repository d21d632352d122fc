"""The compiler driver (driver.py), its options (options.py) and the offline cache (cache.py)."""
from .options import CompileOptions, current as current_options, set_options

__all__ = ["CompileOptions", "current_options", "set_options"]
