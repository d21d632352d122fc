"""What fields and ndarrays share: one lazily allocated GPU buffer, Python-scope access, NumPy I/O.

Memory layout (the kernel frontend relies on it): one buffer per storage (and one per gradient),
row-major over `shape`, element components innermost; scalar index = flat(I) * prod(element_shape)
+ (c, or r * m + c for matrices).
"""
from __future__ import annotations

import collections
import math
from abc import ABC, abstractmethod
import operator
import weakref

import numpy as np

from ..types import DType, f16, to_dtype, u1
from ..errors import Float64Error, GradientDTypeError, NoCompanionError, WgpuAdError
from .. import session as _rt



def _guard():
    """The session's host guard: while set, called as guard(storage, what, index=None) before a
    Python-scope read or write of a storage (what: "to_numpy()", "fill()", ...; index: of x[i]);
    ti.ad.checkpoint watches the steps it runs with it (ad/checkpoint.py)."""
    return _rt.current().ad.host_guard


def _fitted(a: np.ndarray, dt: DType, what: str) -> np.ndarray:
    """a converted to dtype dt, or WgpuAdError naming the first value that does not fit: an
    integer out of dt's range (it would wrap), a float beyond f16 / f32's range (it would become
    inf), a float out of an integer type's range or NaN (the conversion is undefined)."""
    t = dt.np
    if a.dtype == t:
        return a
    with np.errstate(all="ignore"):
        out = a.astype(t)
        if t.kind in "iu":
            info = np.iinfo(t)
            bad = ~((a >= info.min) & (a <= info.max)) if a.dtype.kind in "iuf" else None
            fits = f"does not fit in {dt} ({info.min} to {info.max})"
        elif t.kind == "f" and a.dtype.kind == "f":
            bad = np.isinf(out) & np.isfinite(a)
            fits = f"is beyond {dt}'s largest finite value {float(np.finfo(t).max):g} and would become inf"
        else:
            bad = None
    if bad is None or not bad.any():
        return out
    k = int(np.argmax(bad))
    where = f" at index {tuple(int(i) for i in np.unravel_index(k, a.shape))}" if a.ndim else ""
    value = a.reshape(-1)[k].item()
    raise WgpuAdError(f"{what}: the {a.dtype} value {value!r}{where} {fits}"
                      + (f"; it would wrap to {out.reshape(-1)[k].item()!r}" if a.dtype.kind in "iu" else ""))


# How many of its latest writes a storage remembers for kernel.grad()'s check (lang/kernel.py): a
# simulation of that many stored steps differentiated by hand; past that the check assumes the worst.
WRITE_LOG = 4096

# Every storage alive; reset() drops their buffers so GPU memory goes with the device.
_live: "weakref.WeakSet[Storage]" = weakref.WeakSet()


def live_storages() -> list:
    """Every field and ndarray (gradients included) alive now."""
    return list(_live)


def _drop_buffers() -> None:
    for s in list(_live):
        s._buffer = None


_rt.on_close(_drop_buffers)


class StorageIndexError(WgpuAdError, IndexError):
    """A Python-scope index outside a field's / ndarray's shape."""


def check_dtype(dtype, what: str) -> DType:
    try:
        dt = to_dtype(dtype)
    except Float64Error as e:
        raise Float64Error(f"{what}: {e}") from None
    except TypeError as e:
        raise WgpuAdError(f"{what}: {e}") from None
    if dt == u1:
        raise WgpuAdError(f"{what}: u1 (bool) cannot be stored; use ti.i32 (0 / 1)")
    return dt


def normalize_shape(shape, what: str) -> tuple[int, ...]:
    """An int or a sequence of ints, each >= 1, as a tuple."""
    items = shape if isinstance(shape, (tuple, list)) else (shape,)
    out = []
    for n in items:
        try:
            n = operator.index(n)
        except TypeError:
            raise WgpuAdError(f"{what}: shape must be an int or a tuple of ints, got {shape!r}") from None
        if n < 1:
            raise WgpuAdError(f"{what}: every dimension of shape must be >= 1, got {shape!r}")
        out.append(n)
    return tuple(out)


class Storage(ABC):
    """Base of Field and Ndarray: a GPU array of `shape` elements of `dtype` (scalars, or vectors
    and matrices of `element_shape`), with an optional gradient of the same layout.

    Subclasses set `_kind` ('field' / 'ndarray') for messages."""

    _kind = "storage"

    def __init__(self, dtype: DType, shape: tuple | None, element_shape: tuple, name: str | None):
        self._name = name
        # `x = ti.field(...)` in the user's code: 'x', for messages before a kernel names it (user_code.py)
        self.assigned_name: str | None = None
        self.dtype = dtype
        self._shape = shape
        self.element_shape = tuple(element_shape)
        self.element_size = math.prod(self.element_shape)  # scalars per element
        self._buffer = None
        # True while every element is known to be zero (never written, or just filled with 0):
        # an adjoint can then store into a gradient instead of accumulating (lang/kernel.py)
        self.all_zero = True
        # bumped by every write (a kernel launch that writes it, or Python scope): kernel.grad()
        # refuses to run when what its forward launch read has changed since (lang/kernel.py)
        self.version = 0
        self.writer = ""  # who wrote it last, for that message
        # the latest writes, (version, who, launch): a kernel launch's record gives the footprint
        # indices it wrote (lang/kernel.py _Wrote), None stands for every element; kernel.grad()
        # accepts a write since its launch that provably missed what it read (x[t + 1] after x[t])
        self.writes: collections.deque = collections.deque(maxlen=WRITE_LOG)
        self._grad: Storage | None = None
        self._dual: Storage | None = None  # forward mode's tangent (needs_dual=True, lazy_dual())
        self._gen = _rt.generation()
        self.is_grad = False
        self.is_dual = False
        # the device copy of a NumPy array / torch tensor argument (lang/external.py): a tape
        # records the host array, and the backward pass uploads it again
        self.host_copy = False
        self.primal: Storage | None = None
        _live.add(self)

    # ---- identity -----------------------------------------------------------------------------

    @property
    def name(self) -> str | None:
        if self._name is None and self.primal is not None and self.primal.name is not None:
            return f"{self.primal.name}.{'dual' if self.is_dual else 'grad'}"
        return self._name or self.assigned_name

    @name.setter
    def name(self, value: str | None) -> None:
        self._name = value

    def name_after(self, variable: str) -> None:
        """Take the name of the variable a kernel reads it by, unless it has one of its own (name=,
        or a gradient's 'x.grad'); the variable its creating line assigned it to is a fallback."""
        if self._name is None and (self.primal is None or self.primal.name is None):
            self._name = variable

    def _label(self) -> str:
        """'field 'x'' for messages."""
        return f"{self._kind} '{self.name}'" if self.name else f"unnamed {self._kind}"

    @property
    def needs_grad(self) -> bool:
        """Whether it has a gradient (needs_grad=True, or ti.root.lazy_grad() for fields)."""
        return self._grad is not None

    @property
    def grad(self) -> "Storage":
        """The gradient: a field (ndarray) of the same shape and dtype; an error naming the fix
        when there is none."""
        if self._grad is None:
            raise NoCompanionError(self._no_grad_message())
        return self._grad

    def _no_grad_message(self) -> str:
        n = self.name or "x"
        if self.is_grad:
            return f"{self._label()} is a gradient and has no gradient of its own"
        return f"{self._label()} has no gradient: create it with needs_grad=True before using {n}.grad"

    @property
    def needs_dual(self) -> bool:
        return self._dual is not None

    @property
    def dual(self) -> "Storage":
        """The tangent of forward mode (ti.ad.FwdMode): a storage like this one."""
        if self._dual is None:
            raise NoCompanionError(self._no_dual_message())
        return self._dual

    def _no_dual_message(self) -> str:
        n = self.name or "x"
        if self.is_grad or self.is_dual:
            return f"{self._label()} is a {'dual' if self.is_dual else 'gradient'} and has no dual of its own"
        return f"{self._label()} has no dual: create it with needs_dual=True before using {n}.dual"

    def _attach_dual(self) -> None:
        if self._dual is None:
            self._dual = self._companion(self._new_dual, "is_dual", "duals (needs_dual=True)")

    def _companion(self, new, flag: str, what: str) -> "Storage":
        """A new gradient or dual of self (made by `new`, marked with `flag`); floats only."""
        if not self.dtype.is_float:
            raise GradientDTypeError(f"{self._label()} has dtype {self.dtype}: only float fields can have {what}")
        c = new()
        setattr(c, flag, True)
        c.primal = self
        _rt.current().track_companion(self)
        return c

    @abstractmethod
    def _new_dual(self) -> "Storage":
        """A storage like self, to be marked as self's dual."""

    @abstractmethod
    def _new_grad(self) -> "Storage":
        """A storage like self, marked as self's gradient (subclasses construct the right type)."""

    def _attach_grad(self) -> None:
        if self._grad is None:
            self._grad = self._companion(self._new_grad, "is_grad", "gradients (needs_grad=True)")

    # ---- shape --------------------------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape in elements (without the vector / matrix dimensions)."""
        return self._shape

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def n_scalars(self) -> int:
        return math.prod(self.shape) * self.element_size

    @property
    def nbytes(self) -> int:
        return self.n_scalars * self.dtype.nbytes

    @property
    def n(self) -> int:
        """Vector length / matrix rows (Taichi's x.n)."""
        if not self.element_shape:
            raise WgpuAdError(f"{self._label()} holds scalars; .n is for vector and matrix fields")
        return self.element_shape[0]

    @property
    def m(self) -> int:
        """Matrix columns (Taichi's x.m); 1 for vectors."""
        if not self.element_shape:
            raise WgpuAdError(f"{self._label()} holds scalars; .m is for vector and matrix fields")
        return self.element_shape[1] if len(self.element_shape) == 2 else 1

    # ---- the buffer ---------------------------------------------------------------------------

    def _check_alive(self) -> None:
        if self._gen != _rt.generation():
            if _rt.made_before_fork(self._gen):
                raise WgpuAdError(
                    f"{self._label()} was created by the parent of this process, before os.fork(); a forked "
                    f"process has no GPU device of its parent's, so it cannot use it. Create it again here after "
                    f"ti.init(), or start worker processes with the 'spawn' method "
                    f"(multiprocessing.get_context('spawn'); for torch: DataLoader(..., "
                    f"multiprocessing_context='spawn'))")
            raise WgpuAdError(f"{self._label()} was created before ti.reset() / ti.init() and is gone; "
                              f"create it again after ti.init()")

    def gpu_buffer(self):
        """The wgpu buffer (allocated, zero-filled, on first use). Whoever asks for it may write
        it, so the contents are no longer known to be zero."""
        self.all_zero = False
        b = self._buffer
        if b is not None:
            return b
        return self._allocate()

    def _allocate(self):
        self._check_alive()
        shape = self.shape  # raises for unplaced fields
        rt = _rt.runtime()
        if self.dtype == f16 and not rt.has_f16:
            raise WgpuAdError(f"{self._label()} has dtype f16, but this adapter lacks the 'shader-f16' "
                              f"feature; use ti.f32")
        nbytes = self.nbytes
        for key in ("max-storage-buffer-binding-size", "max-buffer-size"):
            limit = rt.limits[key]
            if nbytes > limit:
                raise WgpuAdError(f"{self._label()} of shape {shape} ({self.dtype}) needs {nbytes} bytes, "
                                  f"more than this adapter's {key} ({limit} bytes); make it smaller or "
                                  f"split it into several fields")
        with rt._lock:  # two threads' first launches must not make two buffers, one of them lost
            if self._buffer is None:
                self._buffer = rt.create_storage(nbytes, self.name or self._kind)
        return self._buffer

    # ---- indexing -----------------------------------------------------------------------------

    def _flat_index(self, key) -> int:
        shape = self.shape
        if key is None or key == ():
            if shape:
                raise WgpuAdError(f"{self._label()} has shape {shape}: index it with {len(shape)} "
                                  f"integer(s), not [None] (which is for 0-d fields)")
            return 0
        idx = key if isinstance(key, tuple) else (key,)
        if len(idx) != len(shape):
            want = "[None]" if not shape else f"{len(shape)} index(es)"
            raise WgpuAdError(f"{self._label()} has shape {shape} and needs {want}; got "
                              f"[{', '.join(map(repr, idx))}]")
        flat = 0
        for k, n in zip(idx, shape):
            try:
                k = operator.index(k)
            except TypeError:
                raise WgpuAdError(f"{self._label()}: index {key!r} must be integers, got {type(k).__name__}") from None
            if not 0 <= k < n:
                raise StorageIndexError(f"{self._label()}: index {key!r} is out of bounds for shape {shape}")
            flat = flat * n + k
        return flat

    def __getitem__(self, key):
        flat = self._flat_index(key)
        if (guard := _guard()) is not None:
            guard(self, f"{self.name or 'x'}[{key!r}] in Python scope", key)
        es, nb = self.element_size, self.dtype.nbytes
        if self._buffer is None:
            self._check_alive()
            data = bytes(es * nb)  # never written: zeros, no need to allocate
        else:
            data = _rt.runtime().read(self._buffer, es * nb, flat * es * nb)
        arr = np.frombuffer(data, dtype=self.dtype.np)
        if not self.element_shape:
            return arr[0].item()
        return arr.reshape(self.element_shape).copy()

    def __setitem__(self, key, value) -> None:
        flat = self._flat_index(key)
        arr = self._as_elements(value, self.element_shape, f"{self._label()}[{key!r}] = ...")
        if (guard := _guard()) is not None:
            guard(self, f"{self.name or 'x'}[{key!r}] = ... in Python scope", key)
        es, nb = self.element_size, self.dtype.nbytes
        _rt.runtime().write(self.gpu_buffer(), np.broadcast_to(arr, self.element_shape).ravel(), flat * es * nb)
        self.wrote("a Python-scope assignment")

    def _as_elements(self, value, shape: tuple, what: str) -> np.ndarray:
        """value as an array of our dtype that broadcasts to `shape` (a scalar or exactly `shape`)."""
        if hasattr(value, "to_numpy"):
            value = value.to_numpy()
        try:
            arr = np.asarray(value)
        except (ValueError, TypeError) as e:
            raise WgpuAdError(f"{what}: cannot use {value!r} as a value ({e})") from None
        if arr.dtype.kind not in "biuf":
            raise WgpuAdError(f"{what}: expected numbers, got {value!r}")
        if arr.shape not in ((), shape):
            raise WgpuAdError(f"{what}: expected a scalar or shape {shape}, got shape {arr.shape}")
        with np.errstate(all="ignore"):  # casts like Taichi's (u[0] = -1 is 2**32 - 1), as from_numpy does not
            return arr.astype(self.dtype.np)

    # ---- whole-storage operations -------------------------------------------------------------

    def to_numpy(self, dtype=None) -> np.ndarray:
        """A copy of the contents, shape = shape + element_shape."""
        shape = self.shape
        full = shape + self.element_shape
        if (guard := _guard()) is not None:
            guard(self, "to_numpy()")
        if self._buffer is None:
            self._check_alive()
            arr = np.zeros(full, dtype=self.dtype.np)
        else:
            view = _rt.runtime().read_view(self._buffer, self.nbytes)
            arr = np.frombuffer(view, dtype=self.dtype.np).reshape(full)
        return arr if dtype is None else arr.astype(dtype)

    def from_numpy(self, arr) -> None:
        """Copy an array of shape shape + element_shape in (float64 -> float32 etc. as NumPy's same_kind)."""
        self._load(arr, "from_numpy")

    def _load(self, arr, who: str) -> None:
        full = self.shape + self.element_shape
        a = np.asarray(arr)
        if a.shape != full:
            el = f" (shape {self.shape} + element shape {self.element_shape})" if self.element_shape else ""
            raise WgpuAdError(f"{self._label()}.{who}: expected an array of shape {full}{el}, "
                              f"got shape {a.shape}")
        if a.dtype.kind not in "biuf" or not np.can_cast(a.dtype, self.dtype.np, casting="same_kind"):
            raise WgpuAdError(f"{self._label()}.{who}: cannot store {a.dtype} data in a {self.dtype} "
                              f"{self._kind} without losing its kind; convert it first, e.g. "
                              f"arr.astype(np.{self.dtype.np.name})")
        data = _fitted(a, self.dtype, f"{self._label()}.{who}")
        if (guard := _guard()) is not None:
            guard(self, f"{who}()")
        _rt.runtime().write(self.gpu_buffer(), np.ascontiguousarray(data))
        self.wrote(who)

    def to_torch(self, device=None):
        """A torch tensor holding a copy of the contents (to_numpy's), on `device` (default: the CPU)."""
        import torch
        t = torch.from_numpy(self.to_numpy().copy())
        return t if device is None else t.to(device)

    def from_torch(self, tensor) -> None:
        """Copy a torch tensor in, as from_numpy (a tensor on a GPU is read back through the CPU)."""
        self._load(tensor.detach().cpu().numpy(), "from_torch")

    def wrote(self, who: str) -> None:
        """Note a write (see version)."""
        self.version += 1
        self.writer = who
        self.writes.append((self.version, who, None))
        if not self.is_grad and not self.host_copy:
            ad = _rt.current().ad
            tape = ad.tape  # (a ti.ad.checkpoint recorder watches through the host guard instead)
            check = getattr(tape, "host_write", None)
            if check is not None and tape.recording and not ad.in_backward:
                check(self, who)

    def fill(self, value) -> None:
        """Set every element to value (a scalar, or one element's vector / matrix)."""
        arr = self._as_elements(value, self.element_shape, f"{self._label()}.fill")
        if (guard := _guard()) is not None:
            guard(self, "fill()")
        rt = _rt.runtime()
        if arr.ndim == 0:
            rt.fill(self.gpu_buffer(), arr, self.dtype, self.n_scalars)
            self.all_zero = not arr.any()
        else:
            rt.write(self.gpu_buffer(), np.tile(arr.ravel(), math.prod(self.shape)))
        self.wrote("fill")

    def copy_from(self, other: "Storage") -> None:
        """Copy another field / ndarray of the same shape, element shape and dtype (on the GPU)."""
        if not isinstance(other, Storage):
            raise WgpuAdError(f"{self._label()}.copy_from: expected a field or ndarray, got {type(other).__name__}")
        mine = (self.shape, self.element_shape, self.dtype)
        theirs = (other.shape, other.element_shape, other.dtype)
        if mine != theirs:
            raise WgpuAdError(f"{self._label()}.copy_from({other._label()}): shape, element shape and dtype "
                              f"must match; {mine} vs {theirs}")
        if other is self:
            return
        if (guard := _guard()) is not None:
            guard(self, "copy_from()")
        self._copy_from(other)

    def _copy_from(self, other: "Storage") -> None:
        """copy_from without the checks: the library's own copies (in-place kernels, checkpoints)."""
        n = (self.nbytes + 3) // 4 * 4  # buffers are rounded up alike, so whole words are safe
        _rt.runtime().copy(other.gpu_buffer(), self.gpu_buffer(), n)
        self.wrote("copy_from")

    def __reduce__(self):
        n = self.name or "x"
        raise TypeError(f"{self._label()} cannot be pickled: its data lives on this process's GPU device. Send "
                        f"{n}.to_numpy() instead, and make the {self._kind} again on the other side (ti.{self._kind}"
                        f"(...) then .from_numpy(...)); a @ti.kernel pickles by name")

    def __repr__(self) -> str:
        shape = self._shape if self._shape is not None else "unplaced"
        el = f", element_shape={self.element_shape}" if self.element_shape else ""
        grad = ", needs_grad=True" if self.needs_grad else ""
        grad += ", needs_dual=True" if self.needs_dual else ""
        return f"<wgpu_ad {self._kind} {self.name or '(unnamed)'}: {self.dtype}, shape={shape}{el}{grad}>"

    def __str__(self) -> str:
        return str(self.to_numpy())
