"""The architecture's numbers (issue #30), measured from the source and one warm launch:

    python -m benchmarks.architecture          # prints them; tests/test_architecture.py holds the limits

- calls: Python function calls inside wgpu_ad during one warm launch of a kernel with nothing to
  differentiate anywhere in the program (`scale(src: ndarray, dst: ndarray, s)`, and a field +
  scalar kernel), counted with sys.setprofile;
- cycles: import cycles between wgpu_ad's subpackages (lang, ad, runtime, ...; a top-level module
  counts as its own), counting imports inside functions;
- long files: modules over 500 lines;
- globals: module-level mutable state: names a `global` statement rebinds, and module-level
  names bound to a mutable container (dict, list, set, their collections / weakref kinds).
"""

import ast
import collections
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = {"wgpu_ad": ROOT / "wgpu_ad", "wgpu_ad.shaders": ROOT / "shaders", "wgpu_ad.viewer": ROOT / "viewer"}
MAX_LINES = 500
_MUTABLE_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "deque", "Counter", "WeakSet",
                  "WeakKeyDictionary", "WeakValueDictionary"}


def modules() -> dict[str, Path]:
    out = {}
    for pkg, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if pkg == "wgpu_ad" and parts[0] in ("shaders", "viewer"):
                continue  # a copy laid out inside the checkout, not a source
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([pkg, *parts])] = path
    return out


def unit(name: str) -> str:
    """The subpackage a module belongs to (wgpu_ad.lang.kernel -> lang; wgpu_ad.session -> session)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports(name: str, path: Path, known: dict) -> set[str]:
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
            b = ".".join(base)
            targets = [f"{b}.{a.name}" if f"{b}.{a.name}" in known else b for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


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



def subpackage_cycles() -> list[list[str]]:
    """Strongly connected groups of subpackages (more than one), each sorted."""
    known = modules()
    graph: dict[str, set[str]] = collections.defaultdict(set)
    for name, path in known.items():
        for t in imports(name, path, known):
            a, b = unit(name), unit(t)
            if a != b:
                graph[a].add(b)
    return cycles(graph)


def edges_within(cycle: list[str]) -> list[str]:
    """The module imports that make a cycle, 'a.b -> c.d', for the report."""
    known = modules()
    members = set(cycle)
    out = []
    for name, path in known.items():
        for t in sorted(imports(name, path, known)):
            if unit(name) in members and unit(t) in members and unit(name) != unit(t):
                out.append(f"{name} -> {t}")
    return out


def long_files() -> dict[str, int]:
    out = {}
    for name, path in modules().items():
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > MAX_LINES:
            out[str(path.relative_to(ROOT))] = n
    return out


def _module_aliases(name: str, path: Path, tree: ast.Module, known: dict) -> dict[str, str]:
    """Local names bound to the package's modules by imports anywhere in the module."""
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module.split(".") if node.module else []
            if node.level:
                base = here[:len(here) - node.level + 1] + base
            for a in node.names:
                full = ".".join(base + [a.name])
                if full in known:
                    out[a.asname or a.name] = full
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in known and a.asname:
                    out[a.asname] = a.name
    return out


def mutable_globals() -> list[str]:
    """Module-level state: names a `global` statement rebinds, names bound to a mutable container,
    and names another module assigns (`state.current_tape = ...`)."""
    out = []
    known = modules()
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases = _module_aliases(name, path, tree, known)
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
            flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
            for t in flat:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in aliases:
                    out.append(f"{aliases[t.value.id]}.{t.attr}")
        rebound = {n for node in ast.walk(tree) if isinstance(node, ast.Global) for n in node.names}
        for node in tree.body:
            targets, value = [], None
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            for t in targets:
                if not isinstance(t, ast.Name) or t.id.startswith("__"):
                    continue
                mutable = isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)) or (
                    isinstance(value, ast.Call) and (getattr(value.func, "id", None) or getattr(value.func, "attr", None))
                    in _MUTABLE_CALLS)
                if t.id in rebound or (mutable and not t.id.isupper()):
                    out.append(f"{name}.{t.id}")
    return sorted(set(out))


def launch_calls() -> dict[str, collections.Counter]:
    """Calls inside the package during one warm launch of each probe kernel (in this process)."""

    import wgpu_ad as ti

    pkg = os.path.dirname(ti.__file__)
    ti.init()

    @ti.kernel
    def scale(src: ti.types.ndarray(), dst: ti.types.ndarray(), s: ti.f32):
        for i in src:
            dst[i] = s * src[i]

    x = ti.field(ti.f32, shape=1024)

    @ti.kernel
    def fill(s: ti.f32):
        for i in x:
            x[i] = s

    a, b = ti.ndarray(ti.f32, 1024), ti.ndarray(ti.f32, 1024)
    out = {}
    for label, fn in (("scale(src: ndarray, dst: ndarray, s: f32)", lambda: scale(a, b, 2.0)),
                      ("fill(s: f32) on a field", lambda: fill(1.0))):
        for _ in range(3):
            fn()
        ti.sync()
        c: collections.Counter = collections.Counter()

        def prof(frame, event, arg, c=c):
            if event == "call" and frame.f_code.co_filename.startswith(pkg):
                c[f"{os.path.relpath(frame.f_code.co_filename, pkg)}:{frame.f_code.co_name}"] += 1
        sys.setprofile(prof)
        try:
            fn()
        finally:
            sys.setprofile(None)
        out[label] = c
    ti.sync()
    return out


def main() -> None:
    for label, c in launch_calls().items():
        print(f"calls in one warm launch of {label}: {sum(c.values())}")
        for where, n in c.most_common():
            print(f"    {n:3d}  {where}")
    cycles = subpackage_cycles()
    print(f"import cycles between subpackages: {len(cycles)}")
    for cyc in cycles:
        print(f"    {' <-> '.join(cyc)}")
        for e in edges_within(cyc):
            print(f"        {e}")
    files = long_files()
    print(f"files over {MAX_LINES} lines: {len(files)}")
    for f, n in sorted(files.items(), key=lambda kv: -kv[1]):
        print(f"    {n:4d}  {f}")
    g = mutable_globals()
    print(f"module-level mutable globals: {len(g)}")
    for name in g:
        print(f"    {name}")


if __name__ == "__main__":
    main()
