"""The autodiff state the kernel launcher looks at: the tape now recording, the FwdMode active.

lang/kernel.py calls `on_launch(kernel, args)` (or `current_tape.record(kernel, args)`) before
every forward launch while `current_tape` is not None. Kept import-free so the launcher can
import it at no cost.
"""
from __future__ import annotations

current_tape = None   # the ti.ad.Tape inside whose `with` block we are, or None
in_backward = False   # True while a tape runs gradient functions: their launches are not recorded
current_fwd = None    # the ti.ad.FwdMode inside whose `with` block we are: launches run dual kernels
in_no_grad = 0        # depth of @ti.ad.no_grad function calls: their launches run plain in FwdMode
check_nan = False     # True while a ti.ad.Tape(check_nan=True) runs them: adjoints check their gradients
# False while ti.ad.checkpoint runs steps whose adjoints will not run (its forward pass and its
# recomputation): kernels that update fields in place then keep no copy for their adjoint
keep_copies = True


def on_launch(kernel, args: tuple) -> None:
    """Called before a forward launch of `kernel` with its (positional) arguments."""
    tape = current_tape
    if tape is not None and not in_backward:
        tape.record(kernel, args)
