"""What reverse mode refuses, with the reason, before it emits anything.

A refused kernel gets a CompileError naming the kernel, the line and the fix: an adjoint that
would be silently wrong is never generated.
"""
from __future__ import annotations

from ...errors import NotDifferentiableError
from ...ir.nodes import Kernel, Stmt, walk
from ...ir.ops import Op


def _fail(kernel: Kernel, s: Stmt, msg: str):
    raise NotDifferentiableError(f"cannot differentiate kernel '{kernel.name}': {msg}", s.loc)


def check_differentiable(kernel: Kernel, snapshot_loads: frozenset = frozenset(), checks=None) -> None:
    """snapshot_loads: ids of loads whose adjoint replay reads a copy of the field taken before the
    launch (promote.py): no later write can change what they see. checks: an access.RuntimeChecks
    that collects the accesses the forward launch checks at run time instead of refusing them."""
    for t in kernel.tasks:
        used = set()
        stmts = list(walk(t.bounds)) + list(walk(t.body))
        for s in stmts:
            used.update(id(a) for a in s.args)
        for s in stmts:
            if s.op is Op.RANDOM:
                _fail(kernel, s, "it calls ti.random(); the gradient kernel replays the forward computation "
                                 "and would draw different numbers. Draw the random numbers into a field in a "
                                 "separate kernel (outside the tape, or marked @ti.ad.no_grad) and read them here")
            if s.op is Op.ATOMIC and id(s) in used:
                _fail(kernel, s, "it uses the value returned by an atomic operation; the gradient kernel "
                                 "cannot replay it. Compute that value in a separate kernel")
            if s.op in (Op.GLOBAL_LOAD, Op.GLOBAL_STORE, Op.ATOMIC):
                buf = s.attr[1] if s.op is Op.ATOMIC else s.attr
                if buf.grad:
                    _fail(kernel, s, f"it reads or writes the gradient '{buf.name}'; a kernel that uses "
                                     f"gradients cannot itself be differentiated. Launch it outside the tape "
                                     f"or mark it @ti.ad.no_grad")
        ret = [s for s in walk(t.body) if s.op is Op.RETURN]
        if ret and not (len(ret) == 1 and t.body.stmts and t.body.stmts[-1] is ret[0]):
            _fail(kernel, ret[0], "it returns from the middle of its body; a differentiated kernel may "
                                  "return only as its last statement")
    from .access import check_global_access
    from .pinned import pinned_loops
    check_global_access(kernel, snapshot_loads, checks, pinned_loops(kernel))

