"""Choosing a WebGPU adapter: arch names, preference order, and what to install when there is none."""
from __future__ import annotations

import functools
import os
import sys

import wgpu

from ..errors import GpuError

# Arch constants (ti.vulkan, ti.cpu ...). Plain strings so they print and compare simply.
vulkan = "vulkan"
metal = "metal"
dx12 = "dx12"
opengl = "opengl"
cpu = "cpu"   # a software adapter (adapter_type 'CPU', e.g. Mesa lavapipe)
gpu = "gpu"   # the best hardware adapter, falling back to any adapter
# Taichi's GPU backends: a Taichi program's ti.init(arch=ti.cuda) runs on the best WebGPU adapter
# (NVIDIA and AMD GPUs through Vulkan), like ti.gpu
cuda = "cuda"
amdgpu = "amdgpu"
_GPU_ALIASES = (cuda, amdgpu)
ARCHES = (vulkan, metal, dx12, opengl, cpu, gpu)

ARCH_ENV_VAR = "WGPU_AD_ARCH"
_BACKEND_OF_ARCH = {vulkan: "Vulkan", metal: "Metal", dx12: "D3D12", opengl: "OpenGL"}
# lower rank = preferred
_TYPE_RANK = {"DiscreteGPU": 0, "IntegratedGPU": 1, "Unknown": 2, "CPU": 3}
_BACKEND_RANK = {"Vulkan": 0, "Metal": 0, "D3D12": 0, "OpenGL": 2}

# Device features wgpu_ad uses when the adapter has them.
WANTED_FEATURES = ("shader-float32-atomic", "subgroup", "shader-f16")
# Limits worth showing (python -m wgpu_ad) and that the runtime checks.
KEY_LIMITS = (
    "max-buffer-size",
    "max-storage-buffer-binding-size",
    "max-storage-buffers-per-shader-stage",
    "max-uniform-buffer-binding-size",
    "min-uniform-buffer-offset-alignment",
    "max-compute-workgroups-per-dimension",
    "max-compute-invocations-per-workgroup",
    "max-compute-workgroup-size-x",
    "max-compute-workgroup-storage-size",
)

def install_instructions() -> str:
    """What to install so that wgpu finds an adapter, for the platform we run on."""
    lines = [
        "wgpu_ad needs a WebGPU adapter (a Vulkan, Metal or D3D12 driver), and wgpu found none.",
        "  Debian/Ubuntu: sudo apt-get install mesa-vulkan-drivers libvulkan1"
        "   (Mesa lavapipe, a software Vulkan driver that runs on the CPU; `vulkaninfo --summary` "
        "from vulkan-tools checks it)",
        "  macOS: Metal is built in; use macOS 10.13 or newer on a Metal-capable Mac",
        "  Windows: update the GPU driver from the vendor (NVIDIA, AMD or Intel)",
    ]
    if sys.platform.startswith("linux"):
        lines.append("  In a container, also make the host GPU visible (e.g. `docker run --gpus all`) "
                     "or use lavapipe as above.")
    return "\n".join(lines)


def _default_runtime_dir() -> None:
    """Mesa's Vulkan drivers print `error: XDG_RUNTIME_DIR is invalid or not set` four times when
    the variable is unset (containers, CI, cron). Only then, point it at a private folder, as
    the XDG spec asks (owned by the user, mode 0700), before the drivers load."""
    if os.environ.get("XDG_RUNTIME_DIR") or not sys.platform.startswith("linux"):
        return
    import tempfile

    folder = os.path.join(tempfile.gettempdir(), f"wgpu_ad-runtime-{os.getuid()}")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        st = os.stat(folder)
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            return  # not ours, or open to others: leave the variable unset, the noise is harmless
    except OSError:
        return
    os.environ["XDG_RUNTIME_DIR"] = folder


@functools.cache
def enumerate_adapters() -> list:
    """All adapters wgpu sees; enumerated once per process (the first call takes ~0.5 s; a failure
    is not kept, so the next call tries again)."""
    _default_runtime_dir()
    try:
        return list(wgpu.gpu.enumerate_adapters_sync())
    except Exception as e:  # wgpu-native could not load any backend
        raise GpuError(f"wgpu could not enumerate adapters ({e}).\n{install_instructions()}") from e


def describe(adapter) -> str:
    info = adapter.info
    return f"{info.get('device', '?')} ({info.get('backend_type', '?')}, {info.get('adapter_type', '?')})"


def normalize_arch(arch) -> str | None:
    """The arch to use: WGPU_AD_ARCH overrides the argument; None means 'best available'."""
    env = os.environ.get(ARCH_ENV_VAR, "").strip().lower()
    if env:
        if env not in ARCHES:
            raise GpuError(f"{ARCH_ENV_VAR}={env!r} is not an arch wgpu_ad knows; use one of {', '.join(ARCHES)}")
        return env
    if arch is None:
        return None
    name = getattr(arch, "name", arch)
    if isinstance(name, str) and name.lower() in ARCHES:
        return name.lower()
    if isinstance(name, str) and name.lower() in _GPU_ALIASES:
        return gpu
    raise GpuError(f"unknown arch {arch!r}: wgpu_ad supports ti.vulkan, ti.metal, ti.dx12, ti.opengl, ti.cpu "
                   f"(software adapter) and ti.gpu (best hardware adapter; ti.cuda and ti.amdgpu mean the same)")


def _rank(adapter) -> tuple:
    info = adapter.info
    return (_TYPE_RANK.get(info.get("adapter_type"), 2), _BACKEND_RANK.get(info.get("backend_type"), 1))


def select_adapter(arch: str | None):
    """Pick an adapter for `arch` (already normalised). Raises GpuError saying what to install."""
    adapters = enumerate_adapters()
    if not adapters:
        raise GpuError(install_instructions())
    if arch in _BACKEND_OF_ARCH:
        candidates = [a for a in adapters if a.info.get("backend_type") == _BACKEND_OF_ARCH[arch]]
    elif arch == cpu:
        candidates = [a for a in adapters if a.info.get("adapter_type") == "CPU"]
    else:  # gpu or None: hardware first, then anything
        candidates = list(adapters)
    if not candidates:
        found = "\n".join("  " + describe(a) for a in adapters)
        raise GpuError(f"no adapter for arch '{arch}'; wgpu found:\n{found}\n"
                       f"Use ti.init(arch=ti.gpu) to take the best one, or install a driver:\n"
                       f"{install_instructions()}")
    return min(candidates, key=_rank)  # min is stable: ties keep wgpu's order


def adapter_report(adapter) -> dict:
    """Plain-data summary used by `python -m wgpu_ad` and Runtime.__repr__."""
    info = adapter.info
    return {
        "device": info.get("device", ""),
        "description": info.get("description", ""),
        "vendor": info.get("vendor", ""),
        "backend_type": info.get("backend_type", ""),
        "adapter_type": info.get("adapter_type", ""),
        "features": {f: f in adapter.features for f in WANTED_FEATURES},
        "limits": {k: adapter.limits.get(k) for k in KEY_LIMITS},
    }
