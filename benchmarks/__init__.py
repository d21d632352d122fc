"""Benchmarks: wgpu_ad against Taichi (Vulkan, CPU) and hand-written WGSL. See benchmarks/README.md."""
