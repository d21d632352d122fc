"""Imports inside the package go one way: no module imports, even from inside a function, a
module that imports it back (directly or through others).

The graph is read from the source with `ast`, not by importing: a function-local import counts
like a module-level one, since it only hides a circle. `from pkg import name` is an edge to the
submodule pkg.name when there is one, else to pkg itself; the implicit import of the parent
packages is left out (every module would otherwise reach wgpu_ad/__init__.py's re-exports).
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the package's folders, by the package name they install as (pyproject's package-dir)
PACKAGES = {"wgpu_ad": ROOT / "wgpu_ad", "wgpu_ad.shaders": ROOT / "shaders", "wgpu_ad.viewer": ROOT / "viewer"}

# Circles allowed to remain, each as the sorted names of its modules (none today). A circle not
# listed here fails, and so does a listed one that is gone (delete it).
KNOWN_CYCLES: set[tuple[str, ...]] = set()


def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own name)."""
    out = {}
    for pkg, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join([pkg, *parts])
            if name.split(".")[:2] == ["wgpu_ad", "shaders"] and pkg == "wgpu_ad":
                continue  # an installed copy inside the package folder: shaders/ is the source
            out[name] = path
    return out


def _imports(name: str, path: Path, known: dict) -> set[str]:
    """The package's modules that `name` (at `path`) imports, anywhere in its body."""
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module.split(".") if node.module else []
            if node.level:
                base = here[:len(here) - node.level + 1] + base
            base_name = ".".join(base)
            targets = [f"{base_name}.{a.name}" if f"{base_name}.{a.name}" in known else base_name
                       for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # `import wgpu_ad.x.y` names a module; a name in it is not one
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: _imports(name, path, known) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def a_circle(graph: dict[str, set[str]], comp: list[str]) -> list[str]:
    """One concrete circle through the component's first module, for the failure message."""
    members, start = set(comp), comp[0]
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop(0)
        for w in sorted(graph[path[-1]] & members):
            if w == start:
                return path + [start]
            if w not in seen:
                seen.add(w)
                paths.append(path + [w])
    return comp


def test_the_graph_sees_local_and_relative_imports():
    g = import_graph()
    assert "wgpu_ad.ir.ops" in g["wgpu_ad.ir.nodes"]                 # from .ops import ...
    assert "wgpu_ad.session" in g["wgpu_ad.lang.snode"]              # from .. import session
    assert "wgpu_ad.errors" in g["wgpu_ad.viewer.pipelines"]         # absolute, in the viewer
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert a_circle(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]


def test_no_import_cycles():
    g = import_graph()
    found = {tuple(c) for c in cycles(g)}
    new = sorted(found - KNOWN_CYCLES)
    assert not new, "import cycles (module -> module it imports):\n" + "\n".join(
        "  " + " -> ".join(a_circle(g, list(c))) for c in new)
    gone = sorted(KNOWN_CYCLES - found)
    assert not gone, f"these known cycles are gone; delete them from KNOWN_CYCLES: {gone}"
