"""Autodiff, the user-facing part (Taichi's ti.ad): the tape that records kernel launches and
runs their adjoints backwards, forward mode (FwdMode), user-defined gradients, gradient checks.

The adjoint and dual kernels themselves come from the compiler (passes/autodiff) through
`kernel.grad` and the launcher; launches.py is what autodiff adds to a launch.
"""
from .. import session as _session
from . import launches as _launches
from .check import check_grad
from .checkpoint import CheckpointStats, checkpoint
from .custom import GradReplaced, grad_for, grad_replaced, no_grad
from .fwd import FwdMode, clear_all_duals
from .gradcheck import GradCheckError, GradCheckReport
from .flow import GradientWarning
from .tape import Tape, clear_all_gradients
from ..errors import DataAccessError, GradientNaNError

__all__ = ["FwdMode", "clear_all_duals", "checkpoint", "CheckpointStats", "Tape", "clear_all_gradients", "grad_replaced",
           "grad_for", "no_grad", "GradReplaced", "check_grad", "GradCheckReport", "GradCheckError", "GradientWarning",
           "GradientNaNError", "DataAccessError"]

_session.use_autodiff(_launches)  # kernel calls hand their launches to it while autodiff has work
