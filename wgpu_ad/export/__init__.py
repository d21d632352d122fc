"""ti.export(): kernels, their gradients (and duals) and the fields they use, written as a folder a
browser runs with wgpu_ad.js (no Python there): one WGSL module per task, manifest.json (FORMAT.md)
and wgpu_ad.js itself.

The WGSL is the compiler's own output, compiled with the portable options (PORTABLE: no float
atomics, no subgroups, no loop checks, no debug asserts, no packed bindings) through the same path as a launch
(Kernel._get, _get_grad, _get_dual); the launch plans are serialised, not re-derived. What the
browser gets of each kernel: its unchecked forward, its adjoint and (dual=True) its dual kernel;
the checked variant that verifies the data access rules on a tape in Python is not exported.
"""
from __future__ import annotations

import json
import os
import shutil

import numpy as np

from .. import session as _session
from ..lang.kernel import Kernel
from ..types import to_dtype
from . import limits as _limits
from .limits import BROWSER_LIMITS, ExportError
from .program import Names, program, uses_subgroups

__all__ = ["export", "ExportError", "BROWSER_LIMITS", "FORMAT_VERSION", "PORTABLE"]

FORMAT_VERSION = 1
# what every browser's WebGPU has: Chrome (Dawn) rejects atomic<f32>; subgroups need `enable
# subgroups;` and a feature a page may lack; the loop check is for older Mesa llvmpipe only
PORTABLE = dict(float_atomics=False, subgroups=False, loop_check=False, debug=False, check_nan=False,
                min_parallel=None, grid_cap=BROWSER_LIMITS["maxComputeWorkgroupsPerDimension"],
                reduce_grid_cap=2048,
                max_storage_buffers=None)  # no packed bindings (a launch's copies): the page's limit is checked
_JS = os.path.join(os.path.dirname(__file__), "wgpu_ad.js")
_LAYOUT = "row-major over shape, element components innermost (matrices row-major), no gaps"


def export(folder, kernels, *, grad: bool = True, dual: bool = False, limits="browser",
           names: dict | None = None, subgroups: bool = False) -> dict:
    """Write kernels, their gradients and the fields they use as a folder a browser runs.

    The folder gets one WGSL module per task (the compiler's own shaders, compiled without float
    atomics or subgroups), `manifest.json` (its format: `wgpu_ad/export/FORMAT.md`) and `wgpu_ad.js`,
    which a page imports: `const prog = await load(device, folderUrl); await prog.run("step", {dt});`.

        ti.export("site/sim", [substep, compute_loss, (init, (positions_ndarray,))], grad=True)

    Args:
        folder: the folder to write (created; its old manifest.json and .wgsl files are replaced).
        kernels: a list of entries, or a dict {exported name: entry}. An entry is a `@ti.kernel`
            whose parameters are scalars or vectors, or a tuple `(kernel, example_args)` for one
            with ndarray or template parameters (an ndarray fixes dtype, element shape and ndim,
            not the extents; templates are compiled in).
        grad: also export each kernel's adjoint, where something it touches has a gradient (a
            kernel that itself reads or writes gradients, such as an optimiser step or forces
            from the adjoint, is exported without one: none can be derived).
        dual: also export each kernel's dual kernel (forward mode), where something has a dual.
        limits: "browser" (WebGPU's default limits, what a page gets without asking) or a dict
            {limit name: value} of the devices you target (the page must request them). A task
            over a limit is an ExportError naming the kernel, the task, the limit and the count.
        names: {name: field} for fields created without `name=` that no kernel reads through a
            variable (a field's name is its `name=`, else that variable's name).
        subgroups: also write, for kernels whose code then differs, a variant with subgroup
            operations (atomic adds summed per subgroup first), which wgpu_ad.js runs on a device
            with the "subgroups" feature (requested by the page); the portable form stays the default.

    Returns:
        The manifest, as written to manifest.json.

    The browser runs each kernel's forward and adjoint as they are; the data access rules a tape
    checks in Python are not checked there (run the program under `ti.ad.Tape` in Python first)."""
    entries = _entries(kernels)
    lim = _limits.resolve(limits)
    os.makedirs(folder, exist_ok=True)
    for f in os.listdir(folder):
        if f.endswith(".wgsl") or f == "manifest.json":
            os.remove(os.path.join(folder, f))
    buffers: dict = {}
    by_id: dict = {}
    given = {id(v): k for k, v in (names or {}).items()}
    globals_seen: list = []
    features: set = set()

    def name_of(st) -> str:
        if getattr(st, "is_grad", False) or getattr(st, "is_dual", False):
            return name_of(st.primal) + (".grad" if st.is_grad else ".dual")
        n = given.get(id(st)) or st.name or _global_name(st, globals_seen)
        if n is None:
            raise ExportError(f"ti.export: a field of shape {tuple(st.shape)} ({st.dtype}) used by kernel "
                              f"'{globals_seen[-1][0]}' has no name: create it with name=..., or pass "
                              f"ti.export(..., names={{'x': x}})")
        other = by_id.setdefault(n, st)
        if other is not st:
            raise ExportError(f"ti.export: two different fields are named '{n}'; give them distinct names "
                              f"(name= at creation, or ti.export(..., names={{...}}))")
        return n

    def register(st) -> None:
        name = name_of(st)
        if name in buffers:
            return
        if st.dtype.name == "f16":
            features.add("shader-f16")
        nbytes = st.n_scalars * st.dtype.nbytes
        _limits.check(lim, "maxStorageBufferBindingSize", nbytes, f"field '{name}': its size in bytes")
        primal = st.primal if (getattr(st, "is_grad", False) or getattr(st, "is_dual", False)) else None
        buffers[name] = {
            "dtype": st.dtype.name, "shape": list(st.shape), "element_shape": list(st.element_shape),
            "scalars": st.n_scalars, "bytes": nbytes, "padded_bytes": max(16, (nbytes + 15) // 16 * 16),
            "layout": _LAYOUT, "role": "grad" if primal is not None and st.is_grad else "dual" if primal is not None else "field",
            "primal": None if primal is None else name_of(primal), "grad": None, "dual": None,
        }
        if primal is None:
            if grad and getattr(st, "needs_grad", False):
                buffers[name]["grad"] = name + ".grad"
                register(st.grad)
            if dual and getattr(st, "needs_dual", False):
                buffers[name]["dual"] = name + ".dual"
                register(st.dual)

    names_ = Names(name_of, register)
    out_kernels = {}
    s = _session.current()
    with s.options_changed(**PORTABLE):
        for name, k, args in entries:
            globals_seen.append((name, getattr(k.fn, "__globals__", {})))
            out_kernels[name] = _kernel(k, name, args, folder, names_, lim, grad, dual, subgroups)
    manifest = {
        "format": "wgpu_ad-export", "version": FORMAT_VERSION,
        "features": sorted(features),
        "optional_features": ["subgroups"] if any("variants" in k for k in out_kernels.values()) else [],
        "limits": lim, "required_limits": _limits.required(lim),
        "buffers": buffers, "kernels": out_kernels,
        "dispatch": DISPATCH_RULE,
        "tape": TAPE,
    }
    with open(os.path.join(folder, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
    shutil.copyfile(_JS, os.path.join(folder, "wgpu_ad.js"))
    return manifest


DISPATCH_RULE = (
    "per task: serial -> 1 workgroup; range [begin, end] (expressions over the uniform words) -> "
    "n = max(0, end - begin), skipped when 0, else min(ceil(n / workgroup_size), grid_cap) workgroups "
    "(grid_cap: the task's if set, else the program's, whichever is smaller); range null -> "
    "min(1024, grid_cap) workgroups (the shader grid-strides); a task with stack words s = "
    "stack.words + sum(uniform[w] for w in stack.plus_uniform_words) > 0 binds a scratch buffer of "
    "threads * s * 4 bytes (threads = 1 if serial else workgroups * workgroup_size), workgroups first "
    "lowered to floor(134217728 / (s * 4 * workgroup_size)) (at least 1)")


# a tape (ti.ad.Tape(loss), wgpu_ad.js prog.tape(loss, body)), in order
TAPE = [{"op": "zero", "target": "every buffer whose role is grad, and every ndarray gradient"},
        {"op": "zero", "target": "loss"},
        {"op": "record", "what": "each call.forward run in the body, with its snapshots and scratch buffers"},
        {"op": "fill", "target": "loss.grad", "value": 1},
        {"op": "grad", "what": "call.grad of each recorded launch, the last first, with its own snapshots and scratch"}]


def _entries(kernels) -> list:
    items = list(kernels.items()) if isinstance(kernels, dict) else [(None, e) for e in kernels]
    out, seen = [], {}
    for name, e in items:
        if isinstance(e, tuple):
            if len(e) != 2 or not isinstance(e[0], Kernel):
                raise ExportError(f"ti.export: an entry must be a @ti.kernel or a tuple (kernel, example_args), "
                                  f"got a tuple of {len(e)} items")
            k, args = e[0], tuple(e[1])
        elif isinstance(e, Kernel):
            k, args = e, None
        else:
            raise ExportError(f"ti.export: an entry must be a @ti.kernel or a tuple (kernel, example_args), "
                              f"got {type(e).__name__}")
        if args is None:
            args = tuple(_example(k, n) for n in range(len(k.params)))
        name = name or k.__name__
        if name in seen:
            raise ExportError(f"ti.export: two entries are named '{name}'; pass a dict {{name: entry}} to "
                              f"export a kernel more than once")
        seen[name] = k
        out.append((name, k, args))
    return out


def _example(k, n: int):
    """An example value of a scalar or vector parameter (its value does not change the code)."""
    from ..types import MatrixType, VectorType
    ann = k.anns[n]
    if isinstance(ann, (VectorType, MatrixType)):
        return np.zeros(ann.shape).tolist()
    try:
        to_dtype(ann)
        return 0
    except (TypeError, ValueError):
        raise ExportError(f"ti.export: kernel '{k.__name__}' has ndarray or template parameters; "
                          f"pass it as (kernel, example_args)") from None


def _global_name(st, globals_seen: list) -> str | None:
    """The name of a module-level variable of the kernel's module that holds this storage."""
    if not globals_seen:
        return None
    for var, value in globals_seen[-1][1].items():
        if value is st and not var.startswith("_"):
            return var
    return None


def _kernel(k, name: str, args: tuple, folder: str, names: Names, lim: dict, grad: bool, dual: bool,
            subgroups: bool) -> dict:
    out = _programs(k, name, args, folder, names, lim, grad, dual, "")
    if subgroups:  # the optional variant: the same kernels with subgroup operations
        with _session.current().options_changed(subgroups=True):
            variant = _programs(k, name, args, folder, names, lim, grad, dual, ".subgroups")
        tasks = [t for p in ("forward", "grad", "dual") if variant[p] for t in variant[p]["tasks"]]
        if any(uses_subgroups(_read(os.path.join(folder, t["file"]))) for t in tasks):
            out["variants"] = {"subgroups": {"feature": "subgroups", **variant}}
        else:
            for t in tasks:  # nothing of the kernel uses them: the portable programs serve
                os.remove(os.path.join(folder, t["file"]))
    return out


def _programs(k, name: str, args: tuple, folder: str, names: Names, lim: dict, grad: bool, dual: bool,
              variant: str) -> dict:
    """The forward, grad and dual programs of a kernel under the session's options, their call sequences."""
    from ..compiler.driver import dual_sources, grad_sources
    lc, specs, _rt = k._get(args)
    storages = lc.compiled.storages
    out = {
        "params": [_param(sp) for sp in specs],
        "forward": program(lc.ck, storages, specs, names, folder, f"{name}{variant}.forward", "forward", lim, name),
        "grad": None, "dual": None,
    }
    uses_grads = any(getattr(o, "is_grad", False) for o in storages)  # its own gradient cannot be derived
    if grad and not k._no_grad and not uses_grads and \
            any(isinstance(g, _field_or_arg()) for g in grad_sources(lc.compiled, specs)):
        g = k._get_grad(args)[0]
        out["grad"] = program(g.ck, storages, specs, names, folder, f"{name}{variant}.grad", "grad", lim, name)
    if dual and any(d is not None for d in dual_sources(lc.compiled, specs)):
        d = k._get_dual(args)[0]
        if d is not lc:
            out["dual"] = program(d.ck, storages, specs, names, folder, f"{name}{variant}.dual", "dual", lim, name)
    out["call"] = _call_sequence(out)
    if variant:
        del out["params"]
    return out


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _field_or_arg():
    from .. import plan
    return (plan.Field, plan.FieldGrad, plan.ArgGrad)


def _param(sp) -> dict:
    d = {"name": sp.name, "kind": sp.kind}
    if sp.kind in ("scalar", "vector", "ndarray"):
        d["dtype"] = sp.dtype.name
    if sp.kind == "vector":
        d["shape"] = list(sp.shape)
    if sp.kind == "ndarray":
        d.update(element_shape=list(sp.shape), ndim=sp.ndim, needs_grad=sp.needs_grad, needs_dual=sp.needs_dual)
    if sp.kind == "template":
        d["value"] = sp.value if isinstance(sp.value, (int, float, bool, str)) else None
    return d


def _call_sequence(k: dict) -> dict:
    """The launch sequences of a forward call and of a gradient call (what wgpu_ad.js runs)."""
    f, g = k["forward"], k["grad"]
    fwd = []
    if g is not None:
        fwd += [{"op": "snapshot", "index": n, "of": s} for n, s in enumerate(f["snapshots"])]
    fwd += [{"op": "scratch", "index": n} for n in range(len(f["scratch"]))]
    fwd += [{"op": "dispatch", "program": "forward", "task": n} for n in range(len(f["tasks"]))]
    if f["returns"]:
        fwd.append({"op": "read_return", "dtype": f["returns"]})
    out = {"forward": fwd, "grad": None}
    if g is not None:
        out["grad"] = ([{"op": "zero", "target": {"kind": "scratch_grad", "index": n}} for n in range(len(f["scratch"]))]
                       + [{"op": "dispatch", "program": "grad", "task": n} for n in range(len(g["tasks"]))])
    return out
