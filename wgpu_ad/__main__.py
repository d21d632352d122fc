"""`python -m wgpu_ad`: which adapter wgpu_ad would use, its features and limits (exit 1 if none)."""
from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    from .errors import GpuError
    from .runtime import adapter as A

    try:
        arch = A.normalize_arch(None)
        adapters = A.enumerate_adapters()
        chosen = A.select_adapter(arch)
    except GpuError as e:
        what = "cannot take the adapter asked for" if os.environ.get(A.DEVICE_ENV_VAR) else "no usable WebGPU adapter"
        print(f"wgpu_ad: {what}.\n{e}", file=sys.stderr)
        return 1
    r = A.adapter_report(chosen)
    print(f"wgpu_ad would use: {r['device']}")
    print(f"  backend:      {r['backend_type']}")
    print(f"  adapter type: {r['adapter_type']}" + ("  (software: runs on the CPU)" if r["adapter_type"] == "CPU" else ""))
    if r["description"]:
        print(f"  driver:       {r['description']}")
    if arch:
        print(f"  arch:         {arch} (from {A.ARCH_ENV_VAR})")
    print("features wgpu_ad uses:")
    notes = {"shader-float32-atomic": "float atomic add (else emulated with compare-exchange)",
             "subgroup": "subgroup operations (atomic adds to a shared element: one per subgroup)",
             "shader-f16": "ti.f16 fields"}
    for f, present in r["features"].items():
        print(f"  {f:<24} {'yes' if present else 'no ':<4} {notes.get(f, '')}")
    print("limits:")
    for k, v in r["limits"].items():
        print(f"  {k:<40} {v}")
    if r["adapter_type"] == "CPU":
        print("parallel loops: multi-dimensional ones keep just enough leading dimensions parallel to fill "
              "the cores and loop over the rest in each thread; at most 256 workgroups per launch")
    from .compiler.cache import directory
    from .compiler.options import CompileOptions
    folder = directory(CompileOptions())
    print(f"offline cache: {folder if folder is not None else 'off (WGPU_AD_OFFLINE_CACHE)'}")
    print("adapters (pick with ti.init(device=index) or WGPU_AD_DEVICE; ti.init(arch=...) or WGPU_AD_ARCH):")
    for entry, a in zip(A.list_adapters(), A.listed()):
        print(f"  {entry}{'   <- this one' if a is chosen else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
