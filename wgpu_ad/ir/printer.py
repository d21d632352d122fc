"""Text form of the IR: one statement a line, nested blocks indented."""
from __future__ import annotations

from .nodes import Block, Kernel, Stmt, Task
from .ops import Op


def _attr(s: Stmt) -> str:
    a = s.attr
    if a is None:
        return ""
    if s.op is Op.ATOMIC:
        kind, buf = a
        return f" {kind.value} {buf!r}"
    if isinstance(a, Task):
        return f" task:{a.name}"
    if isinstance(a, Stmt):
        return f" loop:{a!r}"
    if s.op is Op.ALLOCA:
        return f" '{a}'"
    if s.op is Op.PRINT:
        return f" {a.template!r} at {a.where}"
    return f" {a!r}"


def format_stmt(s: Stmt) -> str:
    lhs = f"{s!r}:{s.dtype} = " if s.dtype is not None else (f"{s!r}: " if s.blocks else "")
    name = f"  # {s.name}" if s.name and s.op is not Op.ALLOCA else ""
    args = ", ".join(repr(a) for a in s.args)
    return f"{lhs}{s.op.name.lower()}{_attr(s)}({args}){name}"


def format_block(block: Block, indent: int = 1) -> list[str]:
    pad = "  " * indent
    lines = []
    for s in block.stmts:
        lines.append(pad + format_stmt(s))
        for k, b in enumerate(s.blocks):
            if s.op is Op.IF:
                lines.append(pad + ("then:" if k == 0 else "else:"))
            lines.extend(format_block(b, indent + 1))
    return lines


def format_kernel(kernel: Kernel) -> str:
    args = ", ".join(f"{a!r}:{a.dtype}" for a in kernel.args)
    bufs = ", ".join(f"{b!r}:{b.dtype}" for b in kernel.buffers)
    out = [f"kernel {kernel.name}({args})" + (f" -> {kernel.ret}" if kernel.ret else "")]
    if bufs:
        out.append(f"  buffers: {bufs}")
    for t in kernel.tasks:
        if t.kind == "range":
            out.append(f"  task {t.name} range for i in [{t.begin!r}, {t.end!r}):")
            if t.bounds.stmts:
                out.append("    bounds:")
                out.extend(format_block(t.bounds, 3))
            out.append("    body:")
            out.extend(format_block(t.body, 3))
            if t.epilogue.stmts:
                out.append("    epilogue:")
                out.extend(format_block(t.epilogue, 3))
        else:
            out.append(f"  task {t.name} serial:")
            out.extend(format_block(t.body, 2))
    return "\n".join(out)
