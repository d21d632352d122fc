"""Taichi's layout API: ti.root.dense(ti.ij, (4, 8)).place(x), root.place(y), root.lazy_grad(),
root.lazy_dual() (the same for forward mode's duals).

Only dense layouts exist, and every field keeps its own row-major buffer, so an SNode is just a
shape under construction. `root.lazy_grad()` is a sticky flag: every float field placed under root,
before or after the call (and fields given shape=, which are placed under root implicitly), gets
a gradient. Allocation is lazy per field, so the order of lazy_grad(), placement, assignment and
kernel launches does not matter.
"""
from __future__ import annotations

import operator
import weakref

from ..errors import WgpuAdError
from .. import session as _rt


class Axis:
    """ti.i, ti.j, ti.ij ...: which index axes a dense() level spans."""

    def __init__(self, *axes: int):
        self.axes = tuple(axes)

    def __repr__(self) -> str:
        return "ti." + "".join("ijkl"[a] for a in self.axes)


i, j, k, l = Axis(0), Axis(1), Axis(2), Axis(3)
ij, ik, jk, ijk, ijkl = Axis(0, 1), Axis(0, 2), Axis(1, 2), Axis(0, 1, 2), Axis(0, 1, 2, 3)
axes = Axis  # ti.axes(0, 1) in Taichi


def _axes_of(a) -> tuple[int, ...]:
    if isinstance(a, Axis):
        return a.axes
    if isinstance(a, (list, tuple)) and all(isinstance(x, Axis) for x in a):
        return tuple(x for ax in a for x in ax.axes)
    raise WgpuAdError(f"dense(): axes must be ti.i, ti.j, ti.ij, ti.ijk ..., got {a!r}")


class SNode:
    """A dense level of the layout tree; `shape` is the per-axis product of all levels above."""

    def __init__(self, parent: "SNode | None", sizes: dict[int, int]):
        self.parent = parent
        self._sizes = sizes

    @property
    def shape(self) -> tuple[int, ...]:
        if not self._sizes:
            return ()
        return tuple(self._sizes.get(a, 1) for a in range(max(self._sizes) + 1))

    def dense(self, axes, dimensions) -> "SNode":
        """A dense level below this one: `ti.root.dense(ti.ij, (4, 8))`. Sizes on an axis that a
        level above also has multiply (nesting changes no index: storage is row-major)."""
        ax = _axes_of(axes)
        dims = dimensions if isinstance(dimensions, (tuple, list)) else (dimensions,) * len(ax)
        if len(dims) == 1:  # one size for every axis, as Taichi: dense(ti.ij, (n,)) is n x n
            dims = tuple(dims) * len(ax)
        if len(dims) != len(ax):
            raise WgpuAdError(f"dense({axes!r}, {dimensions!r}): {len(ax)} axes need {len(ax)} sizes")
        if len(set(ax)) != len(ax):
            raise WgpuAdError(f"dense({axes!r}, ...): an axis appears twice")
        sizes = dict(self._sizes)
        for a, d in zip(ax, dims):
            try:
                d = operator.index(d)
            except TypeError:
                raise WgpuAdError(f"dense({axes!r}, {dimensions!r}): sizes must be ints") from None
            if d < 1:
                raise WgpuAdError(f"dense({axes!r}, {dimensions!r}): sizes must be >= 1")
            sizes[a] = sizes.get(a, 1) * d  # nesting on one axis multiplies, as in Taichi
        return SNode(self, sizes)

    def _unsupported(self, kind: str):
        raise WgpuAdError(f"ti.root.{kind}() (sparse layout) is not supported by wgpu_ad; use "
                          f"ti.root.dense(...) with the same shape (all elements are always active)")

    def pointer(self, *a, **kw):
        self._unsupported("pointer")

    def bitmasked(self, *a, **kw):
        self._unsupported("bitmasked")

    def dynamic(self, *a, **kw):
        self._unsupported("dynamic")

    def place(self, *fields, offset=None) -> "SNode":
        """Give each field this level's shape. Returns self, so calls chain."""
        if offset is not None:
            raise WgpuAdError("place(..., offset=...) is not supported: wgpu_ad fields start at index 0")
        shape = self.shape
        for f in fields:
            # a Field, known by its class marker: field.py imports this module, not the reverse
            if getattr(f, "is_field", False) is not True:
                raise WgpuAdError(f"place() takes fields made with ti.field / ti.Vector.field without "
                                  f"shape=, or their gradients (x.grad), got {f!r}")
            f._place(shape)
            if not (f.is_grad or f.is_dual):  # place(x.grad) / place(x.dual) is x's, not a field of its own
                root._adopt(f)
        return self

    def __repr__(self) -> str:
        return f"<SNode dense shape={self.shape}>"


class _Root(SNode):
    """ti.root: the top of the layout, and the lazy_grad / lazy_dual flags."""

    def __init__(self):
        super().__init__(None, {})
        self._fields: "weakref.WeakSet" = weakref.WeakSet()
        self._lazy_grad = False
        self._lazy_dual = False

    def _adopt(self, f) -> None:
        """Field f was placed (explicitly or through shape=)."""
        self._fields.add(f)
        if self._lazy_grad and f.dtype.is_float:
            f._attach_grad()
        if self._lazy_dual and f.dtype.is_float:
            f._attach_dual()

    def lazy_grad(self) -> None:
        """Give every float field placed under root, now or later, a gradient."""
        self._lazy_grad = True
        for f in list(self._fields):
            if f.dtype.is_float and f._gen == _rt.generation():
                f._attach_grad()

    def lazy_dual(self) -> None:
        """Give every float field placed under root, now or later, a dual (forward mode's
        tangent, ti.ad.FwdMode)."""
        self._lazy_dual = True
        for f in list(self._fields):
            if f.dtype.is_float and f._gen == _rt.generation():
                f._attach_dual()

    def _reset(self) -> None:
        self._fields = weakref.WeakSet()
        self._lazy_grad = False
        self._lazy_dual = False

    def __repr__(self) -> str:
        return "ti.root"


root = _Root()
_rt.on_close(root._reset)
