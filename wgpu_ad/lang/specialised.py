"""Where a kernel keeps its compiled specialisations for an object passed as a ti.template()
argument: on the object itself, when it is a field, an ndarray or a @ti.data_oriented object.

A specialisation (its Launcher, the compiled kernel's storage table) names the object and the
fields it holds, so a kernel's own cache would keep them alive until ti.reset() (issue 25: 4 MiB
per dropped field). Kept in the object's __dict__, weakly keyed by the kernel, the specialisation
and the object form a cycle that the collector frees once the program drops the object, and it
goes with the kernel too. A tuple or list is keyed by what it holds (template_key), so a fresh
tuple of the same fields each call reuses one specialisation and lives on its first field. Other
objects (one without a __dict__) are pinned by the kernel (Kernel._pinned): their specialisation is
found by id, which must stay theirs.
"""
from __future__ import annotations

import weakref

from .storage import Storage

KEY = "_wgpu_ad_specialised"


def can_hold(obj) -> bool:
    """Whether obj keeps kernels' specialisations for itself."""
    return (isinstance(obj, Storage) or getattr(type(obj), "_data_oriented", False)) and hasattr(obj, "__dict__")


def template_key(v, objects: list):
    """The part of a kernel's cache key for v, passed as a ti.template() argument: a plain value by
    its value, a tuple, list or dict by the keys of its items (so `k((a, b))` with a fresh tuple each call
    is one specialisation, and a list changed between calls is another), any other object by its
    id; such objects are appended to `objects` (the caller keeps them alive, or lets one hold the
    specialisation: can_hold)."""
    if v is None or isinstance(v, (int, float, bool, str)):
        return (type(v), v)
    if type(v) in (tuple, list):
        return (type(v), tuple(template_key(x, objects) for x in v))
    if type(v) is dict:
        return (dict, tuple((template_key(k, objects), template_key(x, objects)) for k, x in v.items()))
    objects.append(v)
    return id(v)


def specialisations(obj, kernel) -> dict:
    """`kernel`'s specialisations for obj (can_hold(obj)), by the rest of their cache key."""
    table = obj.__dict__.get(KEY)
    if table is None:
        table = obj.__dict__[KEY] = weakref.WeakKeyDictionary()
    found = table.get(kernel)
    if found is None:
        found = table[kernel] = {}
    return found


def without_specialisations(state):
    """A data-oriented object's pickled or copied state, without what kernels keep on it."""
    if isinstance(state, dict) and KEY in state:
        state = {k: v for k, v in state.items() if k != KEY}
    return state
