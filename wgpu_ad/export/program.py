"""One compiled kernel (a forward, an adjoint or a dual: the compiler's CompiledKernel and its
LaunchPlan) as the plain JSON record of manifest.json (FORMAT.md "Programs"), its tasks' WGSL
written next to it. Nothing here generates code: the WGSL is the compiler's, compiled with the
portable options (export/__init__.py)."""
from __future__ import annotations

import os

from .. import plan
from ..runtime.pipelines import args_block_size
from . import limits as _limits
from .limits import ExportError

_BINDING_TYPE = {"args": "uniform", "buffer": "storage", "error": "storage", "ret": "storage",
                 "stack": "storage", "print": "storage"}


class Names:
    """The manifest's name of each storage of a kernel (a field, its gradient or dual) and of each
    ndarray parameter; registers the buffers the manifest lists."""

    def __init__(self, name_of, register):
        self.name_of = name_of      # storage -> its manifest name ("x", "x.grad")
        self.register = register    # storage -> None: list it in the manifest's buffers

    def field(self, st) -> str:
        self.register(st)
        return self.name_of(st)


def source(src, storages: list, specs: list, names: Names, kernel: str) -> dict:
    """A plan.Source as JSON: where a launch finds the buffer."""
    if isinstance(src, plan.Field):
        return {"kind": "field", "name": names.field(storages[src.index])}
    if isinstance(src, (plan.FieldGrad, plan.FieldDual)):
        st = storages[src.index]
        comp = st.grad if isinstance(src, plan.FieldGrad) else st.dual
        return {"kind": "field", "name": names.field(comp)}
    for cls, kind in ((plan.Arg, "arg"), (plan.ArgGrad, "arg_grad"), (plan.ArgDual, "arg_dual")):
        if isinstance(src, cls):
            return {"kind": kind, "arg": src.arg, "name": specs[src.arg].name}
    if isinstance(src, plan.Snapshot):
        return {"kind": "snapshot", "index": src.index}
    if isinstance(src, plan.Scratch):
        return {"kind": "scratch", "index": src.index, "dtype": src.dtype, "count": src.count}
    if isinstance(src, (plan.ScratchGrad, plan.ScratchDual)):
        return {"kind": "scratch_grad" if isinstance(src, plan.ScratchGrad) else "scratch_dual", "index": src.index}
    raise ExportError(f"ti.export: kernel '{kernel}' needs a {type(src).__name__} buffer, which the export "
                      f"does not support")


def word(w, specs: list, kernel: str) -> dict:
    """A uniform word as JSON: its WGSL type and where its value comes from."""
    t = plan.word_dtype(w)
    if isinstance(w, plan.Scalar):
        return {"type": t, "source": {"kind": "scalar", "arg": w.arg, "name": specs[w.arg].name}}
    if isinstance(w, plan.Component):
        return {"type": t, "source": {"kind": "component", "arg": w.arg, "name": specs[w.arg].name,
                                      "index": w.index, "count": w.count}}
    if isinstance(w, plan.Extent):
        return {"type": t, "source": {"kind": "extent", "arg": w.arg, "name": specs[w.arg].name, "dim": w.dim}}
    if isinstance(w, plan.Seed):
        return {"type": t, "source": {"kind": "seed"}}
    if isinstance(w, plan.StackCapacity):
        return {"type": t, "source": {"kind": "stack_capacity", "begin": _expr(w.begin), "end": _expr(w.end)}}
    if isinstance(w, plan.PrintTag):
        raise ExportError(f"ti.export: kernel '{kernel}' calls print(), which exported kernels do not support; "
                          f"remove the print() calls before exporting it")
    raise ExportError(f"ti.export: kernel '{kernel}': unknown uniform word {w!r} (compiler bug)")


def _expr(e):
    return None if e is None else list(_expr(x) if isinstance(x, tuple) else x for x in e)


# what a browser needs before a module that calls subgroup builtins: the extension, and the
# uniformity analysis of subgroup builtins off (the helper calls them where control flow depends
# on the thread; naga, wgpu-py's compiler, rejects both lines, so Python's modules lack them)
SUBGROUP_HEADER = "enable subgroups;\ndiagnostic(off, subgroup_uniformity);\n"


def uses_subgroups(wgsl: str) -> bool:
    return "subgroupBroadcastFirst(" in wgsl or "subgroupAdd(" in wgsl


def program(ck, storages: list, specs: list, names: Names, folder: str, stem: str, role: str,
            lim: dict, kernel: str) -> dict:
    """The JSON record of one compiled kernel; writes its tasks' WGSL as `stem.<task>.wgsl`
    (with SUBGROUP_HEADER first where a task calls subgroup builtins)."""
    p = ck.plan
    what = {"forward": f"kernel '{kernel}'", "grad": f"the adjoint of kernel '{kernel}'",
            "dual": f"the forward-mode (dual) kernel of '{kernel}'"}[role]
    tasks = []
    for n, (t, tp) in enumerate(zip(ck.tasks, p.tasks)):
        where = f"{what}, task {n} ('{t.name}')" + (f" at {t.loc.file}:{t.loc.line}" if getattr(t.loc, "line", None) else "")
        nstorage = sum(b.kind != "args" for b in t.bindings)
        _limits.check(lim, "maxStorageBuffersPerShaderStage", nstorage,
                      f"{where}: the number of storage buffers it binds in one shader")
        _limits.check(lim, "maxUniformBuffersPerShaderStage", sum(b.kind == "args" for b in t.bindings),
                      f"{where}: the number of uniform buffers it binds")
        _limits.check(lim, "maxComputeWorkgroupSizeX", t.workgroup_size, f"{where}: its workgroup size")
        _limits.check(lim, "maxComputeInvocationsPerWorkgroup", t.workgroup_size, f"{where}: its workgroup size")
        if any(b.kind == "print" for b in t.bindings):
            word(plan.PrintTag(), specs, kernel)  # raises: print() is not exported
        file = f"{stem}.{n}.wgsl"
        with open(os.path.join(folder, file), "w", encoding="utf-8") as f:
            f.write(SUBGROUP_HEADER + t.wgsl if uses_subgroups(t.wgsl) else t.wgsl)
        tasks.append({
            "name": t.name, "file": file, "entry_point": t.entry_point, "workgroup_size": t.workgroup_size,
            "serial": bool(tp.serial), "storage_buffers": nstorage,
            "bindings": [{"binding": b.binding, "kind": b.kind, "type": "read-only-storage" if b.read_only
                          else _BINDING_TYPE[b.kind], **({"buffer": b.key} if b.kind == "buffer" else {})}
                         for b in t.bindings],
            "range": None if tp.range is None else [_expr(tp.range[0]), _expr(tp.range[1])],
            "stack": {"words": tp.stack[0], "plus_uniform_words": list(tp.stack[1])},
            "one_pass": bool(tp.one_pass), "grid_cap": tp.grid_cap,
        })
    ubytes = args_block_size(ck.arg_words)
    _limits.check(lim, "maxUniformBufferBindingSize", ubytes, f"{what}: its uniform block's size in bytes")
    return {
        "uniform": {"words": [word(w, specs, kernel) for w in p.words], "bytes": ubytes},
        "buffers": [source(s, storages, specs, names, kernel) for s in p.buffers],
        "tasks": tasks,
        "grid_cap": p.grid_cap,
        "returns": None if ck.ret_dtype is None else ck.ret_dtype.name,
        "asserts": [{"message": msg, "dtypes": [d.name if hasattr(d, "name") else str(d) for d in dts],
                     "kind": kind} for (msg, dts), kind in zip(ck.asserts, ck.assert_kinds or ["assert"] * len(ck.asserts))],
        "snapshots": [source(s, storages, specs, names, kernel) for s in p.snapshots],
        "scratch": [source(s, storages, specs, names, kernel) for s in p.scratch],
    }
