"""What the lowering of one function carries around: its parsed source, and the loop and
`return` context of the statement being lowered; and how messages name a Python construct.

Shared by lower.py (the visitor, with statements.py and expressions.py), loops.py, inline.py and
kernel.py, which import it, never the other way round.
"""
from __future__ import annotations

import ast
import inspect
import linecache
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
        if fn.__name__ == "<lambda>":
            return cls._parse_lambda(fn)
        try:
            src_lines, start = inspect.getsourcelines(fn)
        except (OSError, TypeError) as e:
            raise WgpuAdError(f"cannot read the source of {fn.__qualname__}: kernels must be defined in a file") from e
        src = textwrap.dedent("".join(src_lines))
        tree = ast.parse(src).body[0]
        if not isinstance(tree, ast.FunctionDef):
            raise WgpuAdError(f"{fn.__qualname__} is not a plain function definition")
        return cls(fn, tree, fn.__code__.co_filename, start - 1, src_lines, _assign_counts(tree))

    @classmethod
    def _parse_lambda(cls, fn: Callable) -> "ParsedFunc":
        """A lambda's source is part of a statement (`f = lambda x: ti.sin(x)`, or an argument of a
        call spanning lines): parse its whole file and find it by line, parameter names and, for
        several lambdas on one line, the position of its body in the compiled code."""
        code = fn.__code__
        lines = linecache.getlines(code.co_filename, fn.__globals__)
        try:
            module = ast.parse("".join(lines))
        except (SyntaxError, ValueError):
            module = None
        if module is None or not lines:
            raise WgpuAdError(f"cannot read the source of the lambda on line {code.co_firstlineno} of "
                              f"{code.co_filename}: lambdas called in kernels must be defined in a file")
        params = list(code.co_varnames[:code.co_argcount])
        found = [n for n in ast.walk(module) if isinstance(n, ast.Lambda) and n.lineno == code.co_firstlineno
                 and [a.arg for a in n.args.args] == params]
        if len(found) > 1:  # the one whose body holds every source position of the code
            spans = [p for p in code.co_positions() if None not in p and p != (p[0], p[0], 0, 0)]
            found = [n for n in found if spans and all(
                (n.body.lineno, n.body.col_offset) <= (l, c) and (el, ec) <= (n.body.end_lineno, n.body.end_col_offset)
                for l, el, c, ec in spans)]
        if len(found) != 1:
            raise WgpuAdError(f"cannot tell which lambda of line {code.co_firstlineno} of {code.co_filename} "
                              f"this is; define it with def (or @ti.func) to call it in a kernel")
        lam = found[0]
        ret = ast.copy_location(ast.Return(value=lam.body), lam.body)
        ret.end_lineno, ret.end_col_offset = lam.body.end_lineno, lam.body.end_col_offset
        tree = ast.copy_location(ast.FunctionDef(name="<lambda>", args=lam.args, body=[ret], decorator_list=[],
                                                 returns=None, type_comment=None), lam)
        return cls(fn, tree, code.co_filename, 0, lines, _assign_counts(tree))

    def loc(self, node: ast.AST) -> SourceLoc:
        ln = getattr(node, "lineno", self.tree.lineno)
        col = getattr(node, "col_offset", 0)
        text = self.lines[ln - 1] if 0 < ln <= len(self.lines) else ""
        # dedent shifted columns; re-add the original indentation
        indent = len(self.lines[0]) - len(self.lines[0].lstrip()) if self.lines else 0
        return SourceLoc(self.file, ln + self.line_offset, col + indent, text, self.fn.__name__)


def _assign_counts(tree: ast.FunctionDef) -> dict[str, int]:
    """How often each name is assigned (a parameter assigned in the body is copied on entry)."""
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
    return counts


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


def construct_name(node: ast.AST) -> str:
    """How a message names a Python construct: `lambda is not supported in kernels`."""
    names = {"Lambda": "lambda", "ListComp": "list comprehension", "DictComp": "dict comprehension",
             "SetComp": "set comprehension", "GeneratorExp": "generator expression", "Try": "try/except",
             "With": "with", "FunctionDef": "a nested function definition", "ClassDef": "a class definition",
             "Global": "global", "Nonlocal": "nonlocal", "Delete": "del", "Raise": "raise",
             "Import": "import", "ImportFrom": "import", "Yield": "yield", "Await": "await",
             "Dict": "a dict literal", "Set": "a set literal", "NamedExpr": "the walrus operator :=",
             "Match": "match", "AsyncFor": "async for", "Lambda_": "lambda", "Starred": "star unpacking"}
    n = type(node).__name__
    return names.get(n, f"'{n}'")
