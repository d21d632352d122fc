"""User-defined gradients: ti.ad.grad_replaced, ti.ad.grad_for and ti.ad.no_grad (Taichi's names).

A grad_replaced function is a plain Python function that launches kernels. Inside a tape its
call is recorded as one entry, and the kernels it launches are not: in the backward pass the tape
calls the function registered with grad_for, with the same arguments. `f.grad(*args)` calls it
directly, like `kernel.grad(*args)`, for use without a tape. Typical uses: a hand-written,
numerically better gradient (SVD), and checkpointing (the gradient function recomputes the
forward state it needs, then calls the kernels' .grad).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

from ..errors import AutodiffUsageError, WgpuAdError
from .. import session


def _is_kernel(obj) -> bool:
    return bool(getattr(obj, "_wgpu_ad_kernel", False))


class GradReplaced:
    """A Python function whose gradient is a user function (see grad_replaced)."""

    _wgpu_ad_grad_replaced = True

    def __init__(self, fn: Callable, grad: Callable | None = None, no_grad: bool = False):
        self.fn = fn
        self.grad_fn = grad
        self.no_grad = no_grad
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        tape = session.ad().tape
        if self.no_grad and session.ad().fwd is not None:
            session.ad().no_grad_depth += 1  # no tangent either: its kernels run plain (Taichi's behaviour)
            try:
                return self.fn(*args, **kwargs)
            finally:
                session.ad().no_grad_depth -= 1
        if tape is None or session.ad().in_backward:
            return self.fn(*args, **kwargs)
        with tape.custom_call(self, args, kwargs):
            return self.fn(*args, **kwargs)

    def grad(self, *args, **kwargs) -> None:
        """Run the registered gradient function (what the tape calls in the backward pass)."""
        if self.no_grad:
            return None
        if self.grad_fn is None:
            raise WgpuAdError(
                f"'{self.__name__}' is decorated with @ti.ad.grad_replaced but has no gradient function: "
                f"define one with @ti.ad.grad_for({self.__name__})")
        prev = session.ad().in_backward
        session.ad().in_backward = True  # kernels it launches (recomputation, .grad) are not recorded
        try:
            self.grad_fn(*args, **kwargs)
        finally:
            session.ad().in_backward = prev
        return None

    def __get__(self, obj, objtype=None):
        """A method (of a @ti.data_oriented class): bound to its object, for the call and .grad."""
        return self if obj is None else _BoundGradReplaced(self, obj)

    def __repr__(self) -> str:
        what = "no_grad" if self.no_grad else "grad_replaced"
        return f"<ti.ad.{what} function {self.__name__}>"


class _BoundGradReplaced:
    """obj.method for a grad_replaced (no_grad) method: the tape records the call with obj as the
    first argument, so the gradient method gets it as self."""

    def __init__(self, fn: GradReplaced, obj):
        self.__func__, self.__self__ = fn, obj
        self.__name__ = fn.__name__

    def __call__(self, *args, **kwargs):
        return self.__func__(self.__self__, *args, **kwargs)

    def grad(self, *args, **kwargs) -> None:
        return self.__func__.grad(self.__self__, *args, **kwargs)

    def __repr__(self) -> str:
        return f"<bound {self.__func__!r} of {self.__self__!r}>"


def grad_replaced(func: Callable) -> GradReplaced:
    """@ti.ad.grad_replaced: inside a ti.ad.Tape, record calls of `func` as one unit whose
    backward is the function decorated with @ti.ad.grad_for(func), called with the same arguments.

        @ti.ad.grad_replaced
        def forward(mul):
            func(mul)
            func(mul)

        @ti.ad.grad_for(forward)
        def backward(mul):
            func.grad(mul)
    """
    if _is_kernel(func):
        # A kernel already has a gradient; wrap it so the decorator does what the user means.
        kern = func

        def call(*args, **kwargs):
            return kern(*args, **kwargs)
        functools.update_wrapper(call, getattr(kern, "fn", kern))
        return GradReplaced(call)
    if isinstance(func, GradReplaced):
        raise AutodiffUsageError(f"'{func.__name__}' is already decorated with @ti.ad.grad_replaced or "
                          f"@ti.ad.no_grad; decorate it once")
    if not callable(func):
        raise AutodiffUsageError(f"@ti.ad.grad_replaced decorates a function, got {type(func).__name__}")
    return GradReplaced(func)


def grad_for(primal: Any) -> Callable[[Callable], Callable]:
    """@ti.ad.grad_for(primal): register the decorated function as the gradient of `primal`,
    a function decorated with @ti.ad.grad_replaced. Returns the function unchanged."""
    if not isinstance(primal, GradReplaced):
        name = getattr(primal, "__name__", type(primal).__name__)
        if _is_kernel(primal):
            raise AutodiffUsageError(
                f"@ti.ad.grad_for({name}): '{name}' is a kernel; its gradient is generated. To replace "
                f"it, wrap the launch in a Python function decorated with @ti.ad.grad_replaced and "
                f"register the gradient for that function")
        raise AutodiffUsageError(f"@ti.ad.grad_for({name}): '{name}' must be decorated with "
                          f"@ti.ad.grad_replaced first")
    if primal.no_grad:
        raise AutodiffUsageError(f"@ti.ad.grad_for({primal.__name__}): '{primal.__name__}' is marked "
                          f"@ti.ad.no_grad (its gradient is zero); use @ti.ad.grad_replaced instead")

    def decorator(func: Callable) -> Callable:
        if primal.grad_fn is not None:
            raise AutodiffUsageError(f"'{primal.__name__}' already has a gradient function "
                              f"('{getattr(primal.grad_fn, '__name__', '?')}'); register one only")
        if not callable(func):
            raise AutodiffUsageError(f"@ti.ad.grad_for({primal.__name__}) decorates a function, got "
                              f"{type(func).__name__}")
        primal.grad_fn = func
        return func
    return decorator


def no_grad(func: Any) -> Any:
    """@ti.ad.no_grad: the tape runs this kernel (or Python function) forward but gives it no
    gradient: nothing flows back through what it writes. Use it for kernels that set up
    inputs, read gradients, or draw random numbers inside a tape."""
    if _is_kernel(func):
        func._no_grad = True
        return func
    if isinstance(func, GradReplaced):
        raise AutodiffUsageError(f"'{func.__name__}' is already decorated with @ti.ad.grad_replaced or "
                          f"@ti.ad.no_grad; decorate it once")
    if not callable(func):
        raise AutodiffUsageError(f"@ti.ad.no_grad decorates a kernel or a function, got {type(func).__name__}")
    return GradReplaced(func, no_grad=True)
