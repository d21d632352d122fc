"""The limits an exported kernel must fit: WebGPU's defaults (what a page gets from
`adapter.requestDevice()` without asking for more), and the check that names the kernel, the task,
the limit and the count when one does not fit."""
from __future__ import annotations

from ..errors import WgpuAdError


class ExportError(WgpuAdError):
    """ti.export() cannot write a kernel in a form a browser runs (a limit, an unsupported feature,
    a field without a name)."""


# WebGPU's default limits (the spec's "default" column, as Chrome and Dawn hand them to a device
# requested without requiredLimits; maxStorageBuffersPerShaderStage: the spec says 8, which node's
# `webgpu` package (Dawn) gives; some Chrome versions give 10: tests/test_export_browser.py reads it back)
BROWSER_LIMITS = {
    "maxStorageBuffersPerShaderStage": 8,
    "maxUniformBuffersPerShaderStage": 12,
    "maxBindingsPerBindGroup": 1000,
    "maxComputeWorkgroupSizeX": 256,
    "maxComputeInvocationsPerWorkgroup": 256,
    "maxComputeWorkgroupsPerDimension": 65535,
    "maxUniformBufferBindingSize": 65536,
    "maxStorageBufferBindingSize": 134217728,
    "maxBufferSize": 268435456,
}

_FIX = {
    "maxStorageBuffersPerShaderStage":
        "split the loop into kernels that each touch fewer fields (or keep values that go together in "
        "one ti.Vector.field), or pass ti.export(..., limits={...}) with the limits of the devices you "
        "target (the page must then request them in requestDevice's requiredLimits)",
}
_DEFAULT_FIX = ("make it smaller, or pass ti.export(..., limits={...}) with the limits of the devices you "
                "target (the page must then request them in requestDevice's requiredLimits)")


def resolve(limits) -> dict:
    """limits="browser" (WebGPU's defaults) or a dict of WebGPU limit names to values on top of them."""
    if limits == "browser" or limits is None:
        return dict(BROWSER_LIMITS)
    if not isinstance(limits, dict):
        raise ExportError(f"ti.export: limits must be \"browser\" or a dict of WebGPU limit names "
                          f"(maxStorageBuffersPerShaderStage, ...) to values, got {limits!r}")
    unknown = sorted(set(limits) - set(BROWSER_LIMITS))
    if unknown:
        raise ExportError(f"ti.export: unknown limit(s) {', '.join(unknown)}; the limits checked are "
                          f"{', '.join(BROWSER_LIMITS)}")
    return {**BROWSER_LIMITS, **{k: int(v) for k, v in limits.items()}}


def check(limits: dict, limit: str, count: int, what: str) -> None:
    """Raise ExportError when `count` exceeds limits[limit]; what: the kernel, task and thing counted."""
    if count > limits[limit]:
        raise ExportError(f"ti.export: {what} is {count}, over WebGPU's {limit} ({limits[limit]}), so a "
                          f"browser would refuse it; {_FIX.get(limit, _DEFAULT_FIX)}")


def required(limits: dict) -> dict:
    """The limits a page must request because they are above WebGPU's defaults."""
    return {k: v for k, v in limits.items() if v > BROWSER_LIMITS[k]}
