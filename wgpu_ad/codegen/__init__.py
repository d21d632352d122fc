"""WGSL code generation: IR kernel -> CompiledKernel (one WGSL compute module per task)."""
from .kernel import format_wgsl, generate

__all__ = ["generate", "format_wgsl"]
