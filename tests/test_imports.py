"""Imports inside the package go one way: no module imports, even from inside a function, a
module that imports it back (directly or through others).

The graph is read from the source with `ast`, not by importing: a function-local import counts
like a module-level one, since it only hides a circle. `from pkg import name` is an edge to the
submodule pkg.name when there is one, else to pkg itself; the implicit import of the parent
packages is left out (every module would otherwise reach wgpu_ad/__init__.py's re-exports).
"""
from __future__ import annotations

from benchmarks.architecture import cycles, imports, modules  # the graph is read once, there

# Circles allowed to remain, each as the sorted names of its modules (none today). A circle not
# listed here fails, and so does a listed one that is gone (delete it).
KNOWN_CYCLES: set[tuple[str, ...]] = set()


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


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
