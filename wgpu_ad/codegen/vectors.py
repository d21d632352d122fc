"""Read-only buffers of 2- or 4-scalar elements read as arrays of vec2 / vec4.

When a task only reads a buffer whose elements are 2 or 4 scalars of 4 bytes, and every load
names an element and a component (address e * C + k), each element is loaded once as a vector:
one load and one bounds check per element instead of one per scalar, which the shader compiler
cannot merge itself (gravity's pair loop on lavapipe: 1.22 -> 0.91 ms). The scalar address
arithmetic that fed those loads is then left unwritten.

A range task that pre-reduces (passes/prereduce.py: a streaming sum) and reads scalar buffers at
its loop index runs four consecutive iterations per step of its grid-stride loop and reads each
such buffer as one vec4 for the four (quad_views): lavapipe loads each lane's value with its own
bounds check, so a vec4 costs little more than one scalar (sum of squares: 0.7x the time). A
buffer each iteration stores once at its loop index (a fused adjoint's gradient) is written as one
vec4 per step the same way.
"""
from __future__ import annotations

from ..ir.nodes import Buffer, Stmt, Task, walk, walk_task
from ..ir.ops import Op
from ..ir.utils import jumps_to_loop
from ..types import f32, i32, u32
from .ops_table import ALU


def vector_views(buffers: list[Buffer], addresses: dict[int, list], modes: dict[int, str]) -> dict[int, int]:
    """id(buffer) -> C for the buffers read as arrays of vecC. addresses: id(buffer) -> the
    index Stmts of its loads, for the buffers the task reads but never writes; modes: the
    buffers' binding modes ('plain' for non-atomic ones)."""
    out = {}
    for b in buffers:
        addr = addresses.get(id(b))
        if addr is None or modes.get(id(b)) != "plain" or b.vector not in (2, 4) or b.dtype not in (f32, i32, u32):
            continue
        if all(element_component(a, b.vector) for a in addr):
            out[id(b)] = b.vector
    return out


def element_component(a: Stmt, c: int) -> tuple | None:
    """(element, component) of a scalar address of the form element * c + component, with the
    element a Stmt or an int and the component a constant in [0, c); None for any other form."""
    if a.op is Op.CONST:
        v = int(a.attr)
        return (v // c, v % c) if v >= 0 else None
    k = 0
    if a.op is Op.ADD:
        x, y = a.args
        if y.op is not Op.CONST:
            x, y = y, x
        if y.op is not Op.CONST or not 0 <= int(y.attr) < c:
            return None
        a, k = x, int(y.attr)
    if a.op is Op.MUL:
        x, y = a.args
        if y.op is not Op.CONST:
            x, y = y, x
        if y.op is Op.CONST and int(y.attr) == c:
            return x, k
    return None


def unused_addresses(task: Task, views: dict[int, int]) -> set[int]:
    """ids of the ALU statements whose values only fed the addresses of vector-read loads (a
    load names its element e, not e * C + k): the code generator writes no `let` for them."""
    if not views:
        return set()
    uses: dict[int, int] = {}
    stmts = list(walk_task(task))
    for s in stmts:
        args = s.args
        if s.op is Op.GLOBAL_LOAD and id(s.attr) in views:
            e, _ = element_component(args[0], views[id(s.attr)])
            args = [e] if isinstance(e, Stmt) else []
        for a in args:
            uses[id(a)] = uses.get(id(a), 0) + 1
    for a in (task.begin, task.end):
        if a is not None:
            uses[id(a)] = uses.get(id(a), 0) + 1
    unused: set[int] = set()
    for s in reversed(stmts):  # every user comes after its operands in the walk (nested blocks too)
        if s.op in ALU and not uses.get(id(s)):
            unused.add(id(s))
            for a in s.args:
                uses[id(a)] -= 1
    return unused


def vector_hint(s: Stmt, buf: Buffer) -> str:
    """The name of the vector a load reads: its variable's (`a` for a load named `a_x`), else the
    buffer's with `_v`."""
    base = s.name[:-2] if s.name and s.name[-2:] in ("_x", "_y", "_z", "_w") else None
    return base if base and base != buf.name.replace(".", "_") else f"{buf.name}_v"


# a quad step runs four iterations one after the other in one thread: none may leave the body
# early, draw random numbers seeded by its index, or keep an autodiff stack
_NOT_IN_QUADS = (Op.RANDOM, Op.PRINT, Op.RETURN, Op.ASSERT, Op.STACK_ALLOC)


def quad_views(task: Task, buffers: list[Buffer], modes: dict[int, str], workgroup_size: int) -> list[tuple]:
    """(buffer, written) for each buffer a pre-reduced range task reads or writes as an array of
    vec4, four iterations per step (module docstring); empty when it runs one iteration per step.
    modes: the binding modes ('plain' for buffers without atomics). Needs a constant begin that
    is a multiple of 4 (each vec4 holds the elements of one step), a workgroup of at least 4
    threads (the last range_count % 4 iterations take one thread each), and buffers of 4-byte
    scalars that the task reads only at its loop index, or stores once per iteration at its loop
    index at the top of the body and reads there only before that store. A stored one must be
    the only buffer the task stores to: two bindings can be one storage (an ndarray passed twice,
    a gradient passed as a field), and a vec4 written at the end of a step would undo the other
    binding's stores of that step. The runtime rounds every buffer up to 16 bytes
    (Runtime.create_storage), so the last elements lie in the last vec4."""
    lo = task.begin
    if task.kind != "range" or workgroup_size < 4 or lo is None or lo.op is not Op.CONST or int(lo.attr) % 4 \
            or int(lo.attr) < 0:
        return []
    if not any(s.op is Op.WG_SUM for s in walk(task.epilogue)):
        return []
    if jumps_to_loop(task.body, Op.CONTINUE) or jumps_to_loop(task.body, Op.BREAK):
        return []
    if any(s.op in _NOT_IN_QUADS for s in walk_task(task)):
        return []
    access: dict[int, list] = {}
    for s in walk_task(task):
        if s.op in (Op.GLOBAL_LOAD, Op.GLOBAL_STORE, Op.ATOMIC):
            access.setdefault(id(s.attr[1] if s.op is Op.ATOMIC else s.attr), []).append(s)
    top = {id(s): k for k, s in enumerate(task.body.stmts)}
    stored = sum(any(s.op is Op.GLOBAL_STORE for s in acc) for acc in access.values())
    out = []
    for b in buffers:
        acc = access.get(id(b), [])
        if not acc or modes.get(id(b)) != "plain" or b.dtype not in (f32, i32, u32):
            continue
        if not all(s.args[0].op is Op.LOOP_INDEX and s.args[0].attr is task for s in acc):
            continue
        stores = [s for s in acc if s.op is Op.GLOBAL_STORE]
        if not stores:
            out.append((b, False))
        elif stored == 1 and len(stores) == 1 and id(stores[0]) in top and all(
                s is stores[0] or top.get(id(s), len(top)) < top[id(stores[0])] for s in acc):
            out.append((b, True))
    return out
