"""Where the user's code is: the frames outside the wgpu_ad package.

Warnings point at the user's line (not at the line of wgpu_ad that noticed the problem), and
fields are named after the variable the user's line assigns them to.
"""
from __future__ import annotations

import sys
import warnings

PACKAGE = __name__.rsplit(".", 1)[0]  # "wgpu_ad" (the viewer is wgpu_ad.viewer)


def is_internal(frame) -> bool:
    mod = frame.f_globals.get("__name__", "")
    return mod == PACKAGE or mod.startswith(PACKAGE + ".")


def user_frames(limit: int = 12, depth: int = 1):
    """The frames outside the package, innermost first, starting `depth` frames above the caller."""
    f = sys._getframe(depth + 1)
    while f is not None and limit > 0:
        if not is_internal(f):
            limit -= 1
            yield f
        f = f.f_back


def warn(message: str, category: type[Warning]) -> None:
    """warnings.warn, pointing at the first frame outside wgpu_ad: the user's line that led here
    (a fixed stacklevel points into wgpu_ad whenever the call path changes)."""
    level, f = 2, sys._getframe(1)
    while f is not None and is_internal(f):
        f, level = f.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
