"""Where the user's code is: the frames outside the wgpu_ad package.

Warnings point at the user's line (not at the line of wgpu_ad that noticed the problem), and
fields are named after the variable the user's line assigns them to.
"""
from __future__ import annotations

import ast
import functools
import itertools
import linecache
import sys
import warnings

PACKAGE = __name__.rsplit(".", 1)[0]  # "wgpu_ad" (the viewer is wgpu_ad.viewer)


def is_internal(frame) -> bool:
    mod = frame.f_globals.get("__name__", "")
    return mod == PACKAGE or mod.startswith(PACKAGE + ".")


def user_frames(limit: int = 12, depth: int = 1):
    """The frames outside the package, innermost first, starting `depth` frames above the caller."""
    f = sys._getframe(depth + 1)
    while f is not None and limit > 0:
        if not is_internal(f):
            limit -= 1
            yield f
        f = f.f_back


def warn(message: str, category: type[Warning]) -> None:
    """warnings.warn, pointing at the first frame outside wgpu_ad: the user's line that led here
    (a fixed stacklevel points into wgpu_ad whenever the call path changes)."""
    level, f = 2, sys._getframe(1)
    while f is not None and is_internal(f):
        f, level = f.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


# the public functions that make fields and ndarrays: a call of one of them from the user's code
# is named after the variable that line assigns it to
_CONSTRUCTORS = frozenset({"field", "vector_field", "matrix_field", "ndarray"})


def assigned_name() -> str | None:
    """The variable that the user's line assigns the field being made to: 'x' for `x = ti.field(...)`,
    also with an annotation or over several lines; 'x' for `self.x = ...` (as a kernel reading
    self.x names it); 'b' for the second call in `a, b = ti.field(...), ti.field(...)`. None when
    the call is not the value assigned (an argument, a list element, a return value), when
    wgpu_ad itself made it, or when the source cannot be read."""
    inner, f = None, sys._getframe(1)
    while f is not None and is_internal(f):
        inner, f = f, f.f_back
    if f is None or inner is None or inner.f_code.co_name not in _CONSTRUCTORS:
        return None  # made inside wgpu_ad for its own use, not by a call in the user's code
    try:
        pos = next(itertools.islice(f.f_code.co_positions(), f.f_lasti // 2, None))
        lines = linecache.getlines(f.f_code.co_filename, f.f_globals)
        text = tuple(lines[max(pos[0] - 4, 0):pos[1] + 4]) if pos[0] and pos[1] else ()
        return _target_at(tuple(pos), text, max(pos[0] - 4, 0) if pos[0] else 0)
    except (AttributeError, StopIteration, ValueError, TypeError, IndexError):  # (co_positions: 3.11+)
        return None


@functools.lru_cache(maxsize=4096)  # per call site: a loop or a comprehension makes many fields at one
def _target_at(pos: tuple, text: tuple, offset: int) -> str | None:
    """_target_of_call for the lines `text` of a file (its line offset + 1 onwards)."""
    lines = [""] * offset + list(text)
    return _target_of_call(lines, *pos)


def _target_of_call(lines: list[str], line: int | None, end_line: int | None, col: int | None,
                    end_col: int | None) -> str | None:
    if not line or not end_line or col is None or not lines:
        return None
    for first in range(line, max(line - 4, 0), -1):   # the statement may start a few lines up
        for last in range(end_line, min(end_line + 4, len(lines)) + 1):
            text = "".join(lines[first - 1:last])
            indented = text[:1] in (" ", "\t")
            try:  # an indented statement parses as the body of `if 1:`, keeping its columns
                tree = ast.parse("if 1:\n" + text if indented else text)
            except SyntaxError:
                continue
            shift = first - 1 - indented  # parsed line k is the file's line k + shift
            for node in ast.walk(tree):
                if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                    name = _name_in(node, line - shift, col)
                    if name:
                        return name
    return None


def _name_in(node, line: int, col: int) -> str | None:
    """The target that the call at (line, col) is assigned to by the assignment `node`, if any."""
    def at(v):
        return isinstance(v, ast.Call) and v.lineno == line and v.col_offset == col

    def name(t):
        return t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else None
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    if at(node.value):
        return name(targets[0])
    if isinstance(node.value, (ast.Tuple, ast.List)):
        for k, v in enumerate(node.value.elts):
            if at(v):
                t = targets[0]
                if isinstance(t, (ast.Tuple, ast.List)) and len(t.elts) == len(node.value.elts):
                    return name(t.elts[k])
    return None
