"""The compiler driver (driver.py), its options (options.py) and the offline cache (cache.py)."""
from .options import CompileOptions

__all__ = ["CompileOptions"]
