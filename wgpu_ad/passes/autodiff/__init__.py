"""Automatic differentiation on the IR: reverse mode (reverse.py) with its rules (rules.py),
the control-flow normalisation it needs (normalize.py) and the checks that refuse what it
cannot differentiate correctly (checks.py)."""
from __future__ import annotations

from typing import Callable

from ...ir.nodes import Buffer, Kernel
from .checks import check_differentiable
from ...ir.clone import clone_kernel
from .demote import demote_atomics
from .normalize import normalize_task
from .reverse import AdjointEmitter

DEFAULT_STACK_SIZE = 256  # loops bounded by constants or arguments are sized exactly or per launch


def reverse_kernel(kernel: Kernel, grad_source: Callable[[Buffer], object],
                   stack_size: int = DEFAULT_STACK_SIZE) -> Kernel:
    """The adjoint kernel of `kernel` (its tasks reversed, each replaced by its adjoint).

    grad_source(buffer) gives the gradient storage of a primal buffer, or None when it has none.
    """
    check_differentiable(kernel)
    k = clone_kernel(kernel)
    grads: dict[int, Buffer] = {}
    buffers = list(k.buffers)
    by_source = {id(b.source): b for b in buffers if not isinstance(b.source, tuple)}
    for b in k.buffers:
        if b.grad or not b.dtype.is_float:
            continue
        src = grad_source(b)
        if src is None:
            continue
        g = by_source.get(id(src)) if not isinstance(src, tuple) else next(
            (x for x in buffers if x.source == src), None)
        if g is None:
            g = Buffer(b.name + ".grad", b.dtype, src, grad=True)
            buffers.append(g)
        grads[id(b)] = g
    flags = {id(t): normalize_task(t) for t in k.tasks}
    tasks = []
    for t, orig in zip(reversed(k.tasks), reversed(kernel.tasks)):
        nt = AdjointEmitter(k, grads, stack_size, flags[id(t)]).task(t)
        demote_atomics(k, kernel, nt, orig)
        tasks.append(nt)
    return Kernel(k.name + "_grad", tasks, list(k.args), buffers, None, False, k.debug, k.loc)


__all__ = ["reverse_kernel", "DEFAULT_STACK_SIZE", "clone_kernel"]
