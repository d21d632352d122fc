"""Optimisation passes: plain functions kernel -> kernel, run in order by pipeline.optimize."""
from .cse import cse
from .dce import dce
from .pipeline import PASSES, optimize
from .simplify import constant_fold

__all__ = ["PASSES", "constant_fold", "cse", "dce", "optimize"]
