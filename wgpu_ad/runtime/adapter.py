"""Choosing a WebGPU adapter: arch names, preference order, and what to install when there is none."""
from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass

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
DEVICE_ENV_VAR = "WGPU_AD_DEVICE"
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


def select_adapter(arch: str | None, device: int | str | None = None):
    """Pick an adapter for `arch` (already normalised), or the one `device` names (an index into
    list_adapters(), or a substring of its name; WGPU_AD_DEVICE overrides it). Raises GpuError
    saying what to install, or listing the adapters when `device` names none of them."""
    adapters = enumerate_adapters()
    if not adapters:
        raise GpuError(install_instructions())
    device = _device_choice(device)
    if device is not None:
        return _by_device(device, arch)
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


# ---- choosing one adapter among several (ti.init(device=...), WGPU_AD_DEVICE) ----------------

@dataclass(frozen=True)
class AdapterEntry:
    """One adapter as wgpu_ad lists it (ti.list_adapters(), python -m wgpu_ad)."""

    index: int          # what ti.init(device=index) and WGPU_AD_DEVICE take
    name: str
    backend: str        # Vulkan, Metal, D3D12, OpenGL
    type: str           # DiscreteGPU, IntegratedGPU, CPU, Unknown
    vendor_id: int
    device_id: int
    driver: str

    def __str__(self) -> str:
        ids = f", vendor 0x{self.vendor_id:04x} device 0x{self.device_id:04x}" if self.vendor_id else ""
        return f"[{self.index}] {self.name} ({self.backend}, {self.type}{ids})"


def listed() -> list:
    """The adapters in wgpu_ad's order: the one ti.init() takes by default first (hardware before
    software, native backends before OpenGL), wgpu's order among equals (identical GPUs keep the
    order the driver reports them in)."""
    return sorted(enumerate_adapters(), key=_rank)  # sorted is stable


def list_adapters() -> list[AdapterEntry]:
    """Every adapter wgpu finds, with the index ti.init(device=...) takes."""
    out = []
    for i, a in enumerate(listed()):
        info = a.info
        out.append(AdapterEntry(i, info.get("device", "") or "?", info.get("backend_type", "?"),
                                info.get("adapter_type", "?"), int(info.get("vendor_id", 0) or 0),
                                int(info.get("device_id", 0) or 0), info.get("description", "")))
    return out


def _device_choice(device):
    env = os.environ.get(DEVICE_ENV_VAR, "").strip()
    if env:
        return int(env) if env.lstrip("-").isdigit() else env
    if device is None or isinstance(device, (int, str)) and not isinstance(device, bool):
        return device
    raise GpuError(f"ti.init(device={device!r}): expected an index into ti.list_adapters() or a part of an "
                   f"adapter's name")


def _by_device(device, arch):
    adapters, entries = listed(), list_adapters()
    where = f"{DEVICE_ENV_VAR}={os.environ[DEVICE_ENV_VAR]!r}" if os.environ.get(DEVICE_ENV_VAR, "").strip() \
        else f"ti.init(device={device!r})"
    table = "\n".join(f"  {e}" for e in entries)
    if isinstance(device, int):
        if not 0 <= device < len(adapters):
            raise GpuError(f"{where}: there is no adapter {device}; wgpu_ad lists {len(adapters)}:\n{table}")
        chosen = adapters[device]
    else:
        hits = [a for a in adapters if device.lower() in (a.info.get("device", "") or "").lower()]
        if not hits:
            raise GpuError(f"{where}: no adapter's name contains {device!r}; wgpu_ad lists:\n{table}")
        chosen = hits[0]  # identical names: the first listed (pick by index to take another)
    if arch is not None:
        ok = (chosen.info.get("backend_type") == _BACKEND_OF_ARCH[arch] if arch in _BACKEND_OF_ARCH
              else chosen.info.get("adapter_type") == "CPU" if arch == cpu else True)
        if not ok:
            raise GpuError(f"{where} names {describe(chosen)}, which is not a '{arch}' adapter (arch={arch!r}); "
                           f"drop one of the two, or choose among:\n{table}")
    return chosen


def worker_device(rank: int | None = None) -> int:
    """The adapter index (into list_adapters()) for this worker process of a multi-GPU job: rank
    `rank`, else the first GPU id Ray assigned to this worker (ray.get_gpu_ids()), else the
    LOCAL_RANK that torchrun sets, else 0; mapped onto the hardware GPUs of the preferred backend
    in listing order (onto the software adapters when there is no GPU), modulo their count.

    Limits: Vulkan lists every GPU whatever CUDA_VISIBLE_DEVICES says, in the driver's order,
    which usually but not always matches nvidia-smi's; identical GPUs are told apart by that order
    only (wgpu reports no PCI bus id)."""
    if rank is None:
        rank = _ray_gpu_id()
    if rank is None:
        local = os.environ.get("LOCAL_RANK", "").strip()
        rank = int(local) if local.isdigit() else 0
    entries = list_adapters()
    if not entries:
        raise GpuError(install_instructions())
    gpus = [e for e in entries if e.type in ("DiscreteGPU", "IntegratedGPU")] or entries
    best = gpus[0].backend  # the same GPUs under another backend (OpenGL) are not more devices
    pool = [e for e in gpus if e.backend == best]
    return pool[rank % len(pool)].index


def _ray_gpu_id() -> int | None:
    ray = sys.modules.get("ray")  # only when the program uses Ray
    if ray is None:
        return None
    try:
        ids = ray.get_gpu_ids() if ray.is_initialized() else []
    except Exception:  # not in a Ray worker
        return None
    return int(ids[0]) if ids else None
