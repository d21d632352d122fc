"""print() in kernels and ti.funcs: the line becomes one PRINT statement.

Everything known at compile time (strings, Python numbers, the brackets and commas of a vector,
f-string text) is folded into the text of a plan.Print record; the values computed on the GPU
become the statement's operands, each with a plan.PrintValue saying how the host formats it
(dtype, format spec, conversion). The kernel only writes the values' bits; the host formats the
line after the launch (codegen/statements.py, runtime/printing.py), with Python's format() rules:
f-strings, str.format() and format specs (`{v:.3f}`) work as in Python.
"""
from __future__ import annotations

import ast
import string

from .. import plan
from ..errors import UnsupportedError
from ..ir.nodes import Stmt
from ..ir.ops import Op
from ..types import f32
from .values import Mat, dtype_of_entries, is_static

_CONVERSION = {-1: "", ord("s"): "s", ord("r"): "r", ord("a"): "a"}


class _Line:
    """The pieces of one line: text and (PrintValue, Stmt) pairs, in order."""

    def __init__(self, fl, node):
        self.fl, self.node = fl, node
        self.parts: list = []
        self.values: list[Stmt] = []

    def text(self, s: str) -> None:
        if self.parts and isinstance(self.parts[-1], str):
            self.parts[-1] += s
        elif s:
            self.parts.append(s)

    def value(self, v, spec: str = "", conversion: str = "", in_list: bool = False) -> None:
        """Any kernel value: a GPU scalar, a vector / matrix, a Python constant or a list of them."""
        fl = self.fl
        if isinstance(v, Stmt):
            name = v.dtype.name
            if name not in ("f32", "f16", "i32", "u32", "u1"):
                raise fl.error(self.node, f"print() cannot show a value of type {v.dtype}")
            pv = plan.PrintValue(name, spec, conversion)
            _check_spec(fl, self.node, pv)
            self.parts.append(pv)
            self.values.append(v)
        elif isinstance(v, Mat):
            # as Taichi prints them: [1.0, 2.0] and [[1.0, 2.0], [3.0, 4.0]]; a spec applies to
            # every component
            common = dtype_of_entries(v.entries)
            rows = [v.entries] if v.is_vector else v.rows()
            self.text("[")
            for r, row in enumerate(rows):
                if r:
                    self.text(", ")
                if not v.is_vector:
                    self.text("[")
                for c, e in enumerate(row):
                    if c:
                        self.text(", ")
                    self.value(e if isinstance(e, Stmt) else _static_as(e, common), spec, conversion)
                if not v.is_vector:
                    self.text("]")
            self.text("]")
        elif isinstance(v, (list, tuple)):
            if spec:
                raise fl.error(self.node, f"format spec '{spec}' cannot apply to a {type(v).__name__}")
            close = "]" if isinstance(v, list) else ",)" if len(v) == 1 else ")"
            self.text("[" if isinstance(v, list) else "(")
            for k, e in enumerate(v):
                if k:
                    self.text(", ")
                self.value(e, in_list=True)
            self.text(close)
        elif isinstance(v, _F32):
            self.text(plan.PrintValue("f32", spec, conversion).format(v.x))
        elif isinstance(v, float):
            # a Python float in a kernel is an f32, and prints as one
            self.value(_F32(v), spec, conversion)
        elif isinstance(v, (bool, int, str)) or v is None:
            conv = {"": None, "s": str, "r": repr, "a": ascii}[conversion]
            if conv is None and in_list and isinstance(v, str):
                conv = repr  # Python shows list items with repr: ['a', 1]
            try:
                self.text(format(conv(v) if conv else v, spec))
            except (ValueError, TypeError) as e:
                raise fl.error(self.node, f"bad format spec '{spec}' for {v!r}: {e}") from None
        else:
            what = "a field or ndarray" if hasattr(v, "shape") else f"a {type(v).__name__}"
            raise fl.error(self.node, f"print() in a kernel cannot show {what}; print its elements "
                                      f"(e.g. x[i]), or print it outside the kernel", UnsupportedError)

    def emit(self):
        where = self.fl.pf.loc(self.node)
        rec = plan.Print(tuple(self.parts), f"{where.file}:{where.line}")
        return self.fl.b.emit(Op.PRINT, self.values, None, rec)


class _F32:
    """A compile-time float shown as the f32 the kernel computes with."""

    def __init__(self, x: float):
        self.x = x


def _static_as(e, dtype):
    if dtype == f32 or getattr(dtype, "is_float", False):
        return _F32(float(e))
    return e


def _check_spec(fl, node, pv: plan.PrintValue) -> None:
    """A format spec that Python's format() refuses for this kind of value is a compile error."""
    sample = {"u1": True}.get(pv.dtype, 0.5 if pv.dtype in ("f32", "f16") else 7)
    try:
        pv.format(sample)
    except (ValueError, TypeError) as e:
        raise fl.error(node, f"bad format spec '{pv.spec}' for a {pv.dtype} value: {e}") from None


def _spec_text(fl, spec_node) -> str:
    """An f-string field's format spec, which must be known at compile time."""
    if spec_node is None:
        return ""
    out = []
    for part in spec_node.values:
        if isinstance(part, ast.Constant):
            out.append(str(part.value))
            continue
        v = fl.visit(part.value)
        if not is_static(v):
            raise fl.error(part, "a format spec must be known at compile time, not computed on the GPU")
        out.append(format(v, _spec_text(fl, part.format_spec)))
    return "".join(out)


def _fstring(line: _Line, node: ast.JoinedStr) -> None:
    fl = line.fl
    for part in node.values:
        if isinstance(part, ast.Constant):
            line.text(str(part.value))
        elif isinstance(part, ast.FormattedValue):
            line.value(fl.visit(part.value), _spec_text(fl, part.format_spec), _CONVERSION[part.conversion])
        else:
            raise fl.error(part, "unsupported f-string part", UnsupportedError)


def _str_format(line: _Line, fmt: str, call: ast.Call) -> None:
    """'{} and {name:.2f}'.format(a, name=b): automatic and explicit field numbers, keyword
    fields, specs and conversions; fields with attribute or index lookups are refused."""
    fl = line.fl
    for a in call.args:
        if isinstance(a, ast.Starred):
            raise fl.error(call, "*args in str.format() is not supported in kernels", UnsupportedError)
    args = [fl.visit(a) for a in call.args]
    kwargs = {}
    for kw in call.keywords:
        if kw.arg is None:
            raise fl.error(call, "**kwargs in str.format() is not supported in kernels", UnsupportedError)
        kwargs[kw.arg] = fl.visit(kw.value)
    auto = 0
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError as e:
        raise fl.error(call, f"bad format string {fmt!r}: {e}") from None
    for text, name, spec, conv in fields:
        line.text(text)
        if name is None:
            continue
        if "{" in (spec or ""):
            raise fl.error(call, "nested fields in a format spec are not supported in kernels", UnsupportedError)
        if name == "":
            key = auto
            auto += 1
        elif name.isdigit():
            key = int(name)
        elif name.isidentifier():
            key = name
        else:
            raise fl.error(call, f"format field '{{{name}}}' is not supported in kernels: use a plain name or "
                                 f"number", UnsupportedError)
        try:
            v = args[key] if isinstance(key, int) else kwargs[key]
        except (IndexError, KeyError):
            raise fl.error(call, f"format field '{{{name}}}' has no matching argument in {fmt!r}.format(...)") from None
        line.value(v, spec or "", conv or "")


def _static_str(node) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def lower_print(fl, node: ast.Call) -> None:
    """print(*values, sep=' ', end='\\n') in a kernel: one PRINT statement."""
    opts = {}
    for kw in node.keywords:
        if kw.arg not in ("sep", "end", "flush"):
            what = "**kwargs" if kw.arg is None else f"print(..., {kw.arg}=...)"
            raise fl.error(node, f"{what} is not supported in kernels (sep=, end= and flush= are)", UnsupportedError)
        v = fl.visit(kw.value)
        if kw.arg == "flush":
            continue  # lines reach sys.stdout after the launch anyway
        if v is not None and not isinstance(v, str):
            raise fl.error(node, f"print(..., {kw.arg}=...) must be a string known at compile time, got {v!r}")
        opts[kw.arg] = v
    sep = " " if opts.get("sep") is None else opts["sep"]
    end = "\n" if opts.get("end") is None else opts["end"]
    line = _Line(fl, node)
    for k, a in enumerate(node.args):
        if k:
            line.text(sep)
        if isinstance(a, ast.Starred):
            v = fl.visit(a.value)
            items = v.entries if isinstance(v, Mat) else list(v)
            for j, e in enumerate(items):
                if j:
                    line.text(sep)
                line.value(e)
        elif isinstance(a, ast.JoinedStr):
            _fstring(line, a)
        elif isinstance(a, ast.Call) and isinstance(a.func, ast.Attribute) and a.func.attr == "format" \
                and _static_str(a.func.value) is not None:
            _str_format(line, _static_str(a.func.value), a)
        else:
            line.value(fl.visit(a))
    line.text(end)
    line.emit()
    return None


def fstring_value(fl, node: ast.JoinedStr) -> str:
    """An f-string outside print(): allowed when every field is known at compile time."""
    line = _Line(fl, node)
    _fstring(line, node)
    if line.values:
        raise fl.error(node, "f-strings with values computed on the GPU can only be used as arguments of "
                             "print() in kernels", UnsupportedError)
    return "".join(line.parts)
