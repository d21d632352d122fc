"""ti.ad.check_grad: a gradient check of a forward function, run once under a fresh tape.

How the check works is in gradcheck.py; this module only adds the tape, so that gradcheck.py does
not import tape.py (which imports it for Tape(grad_check=...)).
"""
from __future__ import annotations

from typing import Callable

from ..errors import WgpuAdError
from .gradcheck import GradCheckReport, run_check
from .naming import describe
from .tape import Tape


def _as_list(inputs) -> list:
    if hasattr(inputs, "gpu_buffer"):
        return [inputs]
    return list(inputs)


def check_grad(forward: Callable[[], None], loss, inputs, *, eps: float | None = None,
               rtol: float = 1e-2, atol: float | None = None, max_elements: int = 64, seed: int = 0,
               raise_on_fail: bool = True) -> GradCheckReport:
    """Check the gradients of `loss` with respect to `inputs` against central differences.

    Clears all gradients (like ti.ad.Tape) and leaves the inputs' .grad holding the analytic
    gradients.

    Args:
        forward: a function with no arguments that launches the kernels computing `loss` from
            `inputs`. It is run once under a ti.ad.Tape and then four times per checked element
            (steps h and 2h); it need not reset the loss (the fields its kernels write are
            restored before each run) but must not overwrite the inputs.
        loss: a 0-d float field with needs_grad=True.
        inputs: a field or ndarray, or a list of them, with needs_grad=True.
        eps: the finite-difference step h (default ~5e-3 * max(1, |x|) per element).
        rtol: an element passes when |analytic - numeric| <= atol + |n(h) - n(2h)| +
            rtol * max(|a|, |n|).
        atol: see rtol; defaults to the loss's rounding noise over the step.
        max_elements: check at most this many elements per input (a random subset, seeded by
            `seed`), plus one random direction through all elements when some are left out.
        seed: the seed of the random subset and direction.
        raise_on_fail: raise GradCheckError naming the field and its worst element (default), or
            return the report with report.ok False.

    Returns:
        A GradCheckReport (str() gives a summary).
    """
    inputs = _as_list(inputs)
    if not callable(forward):
        raise WgpuAdError(f"check_grad: forward must be a function that launches the kernels, got "
                          f"{type(forward).__name__}")
    for x in inputs:
        if not hasattr(x, "gpu_buffer"):
            raise WgpuAdError(f"check_grad: inputs must be fields or ndarrays, got {type(x).__name__}")
        if not x.needs_grad:
            raise WgpuAdError(f"check_grad: input {describe(x)} has no gradient: create it with "
                              f"needs_grad=True (or call ti.root.lazy_grad())")
    if not (isinstance(max_elements, int) and max_elements >= 1):
        raise WgpuAdError(f"check_grad: max_elements must be an int >= 1, got {max_elements!r}")
    if eps is not None and not eps > 0:
        raise WgpuAdError(f"check_grad: eps must be > 0, got {eps!r}")
    tape = Tape(loss=loss)
    tape._snapshot_writes = True
    with tape:
        forward()
    return run_check(tape._snapshot, loss, inputs, forward, eps=eps, rtol=rtol, atol=atol,
                     max_elements=max_elements, seed=seed, raise_on_fail=raise_on_fail)
