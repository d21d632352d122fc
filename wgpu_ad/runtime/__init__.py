"""The wgpu runtime: adapter choice, device, buffers, batched launches, read-back.

It knows CompiledKernel (plain data from the compiler) and nothing of the IR.
"""
from .adapter import (ARCH_ENV_VAR, ARCHES, KEY_LIMITS, WANTED_FEATURES, adapter_report, amdgpu, cpu, cuda, dx12,
                      enumerate_adapters, gpu, install_instructions, metal, opengl, select_adapter, vulkan)
from ..plan import ERROR_WORDS, BindingSpec, CompiledKernel, CompiledTask
from .device import Runtime

__all__ = [
    "ARCH_ENV_VAR", "ARCHES", "KEY_LIMITS", "WANTED_FEATURES", "adapter_report", "amdgpu", "cpu", "cuda", "dx12",
    "enumerate_adapters", "gpu", "install_instructions", "metal", "opengl", "select_adapter", "vulkan",
    "ERROR_WORDS", "BindingSpec", "CompiledKernel", "CompiledTask",
    "Runtime",
]
