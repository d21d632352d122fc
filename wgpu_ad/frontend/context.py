"""What the lowering of one function carries around: its parsed source, and the loop and
`return` context of the statement being lowered.

Shared by lower.py (the visitor), loops.py, inline.py and kernel.py, which import it, never the
other way round.
"""
from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import SourceLoc, WgpuAdError
from ..ir.nodes import Block, Stmt
from .refs import LocalRef


@dataclass
class ParsedFunc:
    """A user function's AST with what is needed to point at its source lines."""

    fn: Callable
    tree: ast.FunctionDef
    file: str
    line_offset: int
    lines: list[str]
    assign_counts: dict[str, int]

    @classmethod
    def parse(cls, fn: Callable) -> "ParsedFunc":
        try:
            src_lines, start = inspect.getsourcelines(fn)
        except (OSError, TypeError) as e:
            raise WgpuAdError(f"cannot read the source of {fn.__qualname__}: kernels must be defined in a file") from e
        src = textwrap.dedent("".join(src_lines))
        tree = ast.parse(src).body[0]
        if not isinstance(tree, ast.FunctionDef):
            raise WgpuAdError(f"{fn.__qualname__} is not a plain function definition")
        counts: dict[str, int] = {}
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
                if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
                    counts[node.target.id] = counts.get(node.target.id, 0) + 1
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                        counts[n.id] = counts.get(n.id, 0) + 1
                root = t
                while isinstance(root, (ast.Subscript, ast.Attribute)):
                    root = root.value
                if root is not t and isinstance(root, ast.Name):
                    counts[root.id] = counts.get(root.id, 0) + 2  # v[0] = ... mutates v
        return cls(fn, tree, fn.__code__.co_filename, start - 1, src_lines, counts)

    def loc(self, node: ast.AST) -> SourceLoc:
        ln = getattr(node, "lineno", self.tree.lineno)
        col = getattr(node, "col_offset", 0)
        text = self.lines[ln - 1] if 0 < ln <= len(self.lines) else ""
        # dedent shifted columns; re-add the original indentation
        indent = len(self.lines[0]) - len(self.lines[0].lstrip()) if self.lines else 0
        return SourceLoc(self.file, ln + self.line_offset, col + indent, text, self.fn.__name__)


def static_globals(fn: Callable) -> dict:
    g = dict(fn.__globals__)
    if fn.__closure__:
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__):
            try:
                g[name] = cell.cell_contents
            except ValueError:
                pass
    return g


@dataclass
class LoopCtx:
    kind: str                   # 'serial' | 'multi' | 'parallel' | 'static'
    stmt: Any = None


@dataclass
class ReturnCtx:
    """How `return` works in the function being lowered."""

    kind: str                   # 'kernel' | 'tail' | 'flag'
    value: Any = None
    flag: Stmt | None = None
    slots: LocalRef | None = None
    entry: Block | None = None
    loop_depth: int = 0         # serial loops entered inside this function


def contains_return(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Return) for n in ast.walk(node))
