"""ti.ad.Tape: record the kernel launches of a `with` block, then run their adjoints backwards.

    with ti.ad.Tape(loss=L):      # zeroes every gradient and L, then records
        compute_y()
        compute_loss()
    # on exit: L.grad = 1, then compute_loss.grad(), compute_y.grad(): x.grad holds dL/dx

The kernel launcher tells the session's open tape about every forward launch (Tape.record); the tape only
orders launches and calls `kernel.grad(*args)` (the generated adjoint) or a grad_replaced
function's gradient in reverse. The last launch of a tape with a loss is deferred (Tape.defer,
Runtime.defer) until anything else reaches the device; when nothing did by the end of the block, it
runs fused with its adjoint in one launch (passes/autodiff/fuse.py), which saves a pass over its
data.
Before the backward pass the tape checks that a gradient can actually flow from the loss to
something, and names the field that stops it: Taichi silently gives zero gradients there (or
"Gradients of loss are not allocated").
"""
from __future__ import annotations

import contextlib
import sys
import threading
from dataclasses import dataclass, field as dc_field
from typing import Any, Callable

from ..errors import AutodiffUsageError, WgpuAdError
from .. import session
from .flow import GradientWarning, accesses as _accesses, check_flow
from .naming import describe


def _live_storages():
    from ..lang.storage import live_storages
    return live_storages()


def clear_all_gradients() -> None:
    """Set the gradient of every field and ndarray that has one to zero (ti.ad.clear_all_gradients)."""
    for s in _live_storages():
        # A gradient never written is still unallocated, and so already zero: skip it (no allocation).
        if s.is_grad and s._buffer is not None:
            s.fill(0)


def _is_storage(x) -> bool:
    return hasattr(x, "gpu_buffer") and hasattr(x, "is_grad")


def _is_torch(x) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _set_torch(t, value: float) -> None:
    """A torch loss: its value (entering the tape) or its .grad (the seed) set to `value`."""
    torch = sys.modules["torch"]
    with torch.no_grad():
        t.fill_(value)


@dataclass
class _Held:
    """A forward launch the tape deferred (Tape.defer), with everything launch() needs."""

    entry: "TapeEntry"
    kernel: Any
    launcher: Any       # lang.launch.Launcher
    args: tuple
    rt: Any
    handle: Any = None  # runtime.device.Deferred

    def launch(self) -> None:
        from ..lang.launch import launch
        launch(self.launcher, self.args, self.rt)


@dataclass
class TapeEntry:
    """One recorded unit: a kernel launch, or a call of a grad_replaced / no_grad function."""

    fn: Any                      # the Kernel or GradReplaced object
    args: tuple
    kwargs: dict = dc_field(default_factory=dict)
    kind: str = "kernel"         # 'kernel' | 'custom' | 'no_grad'
    inner: list = dc_field(default_factory=list)  # (kernel, args) launched inside a custom call
    opaque: bool = False         # inserted by hand (Tape.insert): its launches are unknown

    @property
    def name(self) -> str:
        return getattr(self.fn, "__name__", repr(self.fn))

    def launches(self) -> list:
        """The kernel launches this entry made."""
        return [(self.fn, self.args)] if getattr(self.fn, "_wgpu_ad_kernel", False) else self.inner

    def forward(self) -> None:
        """Run it again (gradient checks replay the tape)."""
        self.fn(*self.args, **self.kwargs)

    def backward(self) -> None:
        if self.kind == "no_grad":  # nothing flows back through what it writes: zeroed gradients
            from .launches import zero_overwritten
            for kernel, args in reversed(self.launches()):
                zero_overwritten(kernel, args)
            return
        self.fn.grad(*self.args, **self.kwargs)


class Tape:
    """Reverse-mode autodiff over the kernel launches in a `with` block (Taichi's ti.ad.Tape).

    Args:
        loss: a 0-d float field with a gradient (needs_grad=True or ti.root.lazy_grad()), or a
            one-element float32 torch tensor with requires_grad=True (Taichi's torch loss). It is
            set to 0 when the tape is entered; on exit its gradient is set to 1 and the recorded
            kernels' gradients run in reverse order. With loss=None nothing runs on exit: seed the
            outputs' .grad yourself and call tape.grad().
        clear_gradients: zero every gradient when the tape is entered (Taichi's behaviour).
        validation: check, before the backward pass, Taichi's global data access rules across
            the kernels of the tape (nothing read is overwritten later; a written element is only
            accumulated into afterwards): breaking them gives silently wrong gradients. Costs a
            copy of the fields each kernel touches (see validate.py).
        grad_check: fields (or ndarrays) whose gradients are checked against central differences
            after the backward pass, by replaying the recorded launches; raises GradCheckError
            naming the worst element when they disagree. Python-scope writes inside the block are
            not replayed.
        check_nan: the adjoints of the backward pass check every gradient they write and raise
            ti.ad.GradientNaNError at the first NaN or inf, naming the kernel, the element and the
            operation whose derivative made it (on for every adjoint with ti.init(debug=True)).
    """

    def __init__(self, loss=None, clear_gradients: bool = True, validation: bool = False,
                 grad_check=None, check_nan: bool = False):
        if loss is not None and not _is_storage(loss) and not _is_torch(loss):
            raise WgpuAdError(f"ti.ad.Tape(loss=...): expected a 0-d field with needs_grad=True (or a one-element "
                              f"torch tensor with requires_grad=True), got {type(loss).__name__}")
        if grad_check is not None:
            if _is_storage(grad_check):
                grad_check = [grad_check]
            if not isinstance(grad_check, (list, tuple)) or not all(_is_storage(g) for g in grad_check):
                raise WgpuAdError("ti.ad.Tape(grad_check=...): expected a list of fields or ndarrays "
                                  "(the inputs whose gradients to check)")
            if loss is None:
                raise WgpuAdError("ti.ad.Tape(grad_check=...) needs a loss: ti.ad.Tape(loss=L, grad_check=[x])")
        self.loss = loss
        self.clear_gradients = bool(clear_gradients)
        self.validation = bool(validation)
        self.grad_check = list(grad_check) if grad_check else None
        self.check_nan = bool(check_nan)
        self.entries: list[TapeEntry] = []
        self.entered = False
        self.recording = False
        self.gradient_evaluated = False
        self.grad_check_report = None  # the GradCheckReport after a grad_check run
        self._custom: TapeEntry | None = None
        self._where = ""
        self._saved_in_backward = False
        self._snapshot = None   # gradcheck.Snapshot of written fields (grad_check / check_grad)
        self._validator = None  # validate.Validator (validation=True)
        self._snapshot_writes = self.grad_check is not None
        self._held: _Held | None = None  # the last launch, deferred to run fused with its adjoint
        # kernels that update fields in place keep a copy per launch for this tape's backward pass
        # (lang/kernel.py); a tape that only records (ti.ad.checkpoint) turns that off
        self.keep_copies = True
        self._after_backward: list[Callable[[], None]] = []  # see after_backward()

    # ---- the with block -----------------------------------------------------------------------

    def __enter__(self) -> "Tape":
        if self.entered:
            raise WgpuAdError("this ti.ad.Tape was already used; create a new Tape for each `with` block")
        other = session.ad().tape
        if other is not None:
            raise WgpuAdError(f"ti.ad.Tape: another tape is already recording (entered at {other._where}); "
                              f"tapes cannot be nested. Record everything in one tape, or finish the first "
                              f"`with` block before starting the next")
        fwd = session.ad().fwd
        if fwd is not None:
            raise WgpuAdError(f"ti.ad.Tape cannot be used inside ti.ad.FwdMode (entered at {fwd._where}): kernels "
                              f"there run their dual kernels, which the tape cannot differentiate. Finish the "
                              f"FwdMode `with` block first, or compute the derivative in one mode")
        f = sys._getframe(1)
        self._where = f"{f.f_code.co_filename}:{f.f_lineno}"
        self.entered = True
        if self.loss is not None:
            self._check_loss()
        for x in self.grad_check or ():
            if not x.needs_grad:
                raise WgpuAdError(f"ti.ad.Tape(grad_check=...): {describe(x)} has no gradient to check: "
                                  f"create it with needs_grad=True (or call ti.root.lazy_grad()) before the tape")
        self._claim_thread()
        if self.clear_gradients:
            clear_all_gradients()
        if _is_torch(self.loss):
            _set_torch(self.loss, 0.0)
        elif self.loss is not None:
            self.loss.fill(0)  # kernels usually accumulate into the loss (Taichi zeroes it too)
        if self._snapshot_writes:
            from .gradcheck import Snapshot
            self._snapshot = Snapshot()
        if self.validation:
            from .validate import Validator
            self._validator = Validator()
        self._saved_in_backward = session.ad().in_backward
        session.ad().in_backward = False
        session.ad().tape = self
        self.recording = True
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            self._stop()
            if exc_type is None and self.loss is not None:
                self.grad()
            else:
                self._release()
        finally:
            session.current().open_tapes.pop(threading.get_ident(), None)
        return False

    def _claim_thread(self) -> None:
        """Note the tape open in this thread; clear_gradients=True would zero another thread's."""
        open_tapes = session.current().open_tapes
        others = [w for t, w in open_tapes.items() if t != threading.get_ident()]
        if self.clear_gradients and others:
            raise AutodiffUsageError(
                f"ti.ad.Tape at {self._where}: another thread's tape (entered at {others[0]}) is open, and "
                f"clear_gradients=True zeroes every gradient of the program, that tape's too (Taichi's meaning). "
                f"With tapes in several threads, pass clear_gradients=False and zero the gradients this tape "
                f"computes yourself (x.grad.fill(0)) before it")
        open_tapes[threading.get_ident()] = self._where

    def _stop(self) -> None:
        if session.ad().tape is self:
            session.ad().tape = None
            session.ad().in_backward = self._saved_in_backward
        self.recording = False
        if self._validator is not None:
            self._validator.finish()

    def _check_loss(self) -> None:
        L = self.loss
        if _is_torch(L):
            return self._check_torch_loss()
        what = f"loss {describe(L)}"
        if L.is_grad:
            raise AutodiffUsageError(f"{what} is a gradient; pass the primal field as the loss")
        if not L.dtype.is_float:
            raise AutodiffUsageError(f"{what} has dtype {L.dtype}: the loss must be a float field")
        if L.n_scalars != 1:
            raise AutodiffUsageError(f"{what} has shape {L.shape + L.element_shape}: ti.ad.Tape(loss=...) needs a 0-d "
                              f"{L._kind} holding one number (shape=()). For several outputs, seed their .grad "
                              f"yourself and use ti.ad.Tape() without a loss, then tape.grad()")
        if not L.needs_grad:
            raise AutodiffUsageError(f"{what} has no gradient: create it with needs_grad=True (or call "
                              f"ti.root.lazy_grad()) before the tape")

    def _flow_loss(self):
        """The storage the kernels write as the loss: a torch loss's device copy (lang/external.py)."""
        if not _is_torch(self.loss):
            return self.loss
        from ..lang.external import EXTERNALS
        dev = EXTERNALS.copy_of(self.loss)
        if dev is None and self.entries:
            from ..user_code import warn
            warn("ti.ad.Tape(loss=...): the torch loss was passed to no kernel launched inside the tape, so every "
                 "gradient is zero. Pass it to the kernel that computes the loss, inside the `with` block",
                 GradientWarning)
        return dev

    def _check_torch_loss(self) -> None:
        L = self.loss
        what = f"the torch loss (a {L.dtype} tensor of shape {tuple(L.shape)})"
        if L.numel() != 1:
            raise AutodiffUsageError(f"ti.ad.Tape(loss=...): {what} must hold one number (shape () or (1,)). For "
                                     f"several outputs, seed their .grad yourself and use ti.ad.Tape() without a "
                                     f"loss, then tape.grad()")
        f64_ok = str(L.dtype) == "torch.float64" and session.f64_dtype().name == "f32"  # ti.init(f64="f32")
        if str(L.dtype) != "torch.float32" and not f64_ok:
            raise AutodiffUsageError(f"ti.ad.Tape(loss=...): {what} must be float32, the dtype wgpu_ad kernels "
                                     f"compute in; create it with dtype=torch.float32 (or run float64 in float32 "
                                     f"with ti.init(f64=\"f32\"))")
        if not L.requires_grad:
            raise AutodiffUsageError(f"ti.ad.Tape(loss=...): {what} has requires_grad=False, so it has no gradient "
                                     f"to seed: create it with requires_grad=True")

    # ---- recording (called by the launcher: session.ad().tape.record) ----------------------------

    def record(self, kernel, args: tuple) -> None:
        """A forward launch of `kernel` with `args` is about to run inside the with block."""
        if not self.recording or session.ad().in_backward:
            return
        args = tuple(args)
        if self._custom is not None:
            self._custom.inner.append((kernel, args))
        else:
            kind = "no_grad" if getattr(kernel, "_no_grad", False) else "kernel"
            self.entries.append(TapeEntry(kernel, args, kind=kind))
        if self._snapshot is not None or self._validator is not None:
            acc = _accesses(kernel, args)
            if acc is not None:
                if self._snapshot is not None:
                    self._snapshot.take(acc[1])  # values before the first write: the replay's start
                if self._validator is not None:
                    entry = self.entries[-1] if self._custom is None else None
                    self._validator.before_launch(entry, acc)

    def host_write(self, storage, who: str) -> None:
        """A Python-scope write (from_numpy, fill, x[i] = ...) inside the with block: refused when a
        kernel recorded before it read the storage, whose gradient would be computed from the new
        values (Taichi refuses NumPy I/O inside a tape altogether)."""
        for e in self.entries:
            for k, a in e.launches():
                acc = _accesses(k, a)
                if acc is not None and any(r is storage for r in acc[0]):
                    n = storage.name or "x"
                    raise AutodiffUsageError(
                        f"ti.ad.Tape: {describe(storage)} is written by {who} inside the tape after kernel "
                        f"'{e.name}' read it; the gradient of '{e.name}' would be computed from the new values "
                        f"and be silently wrong. Set {n} before the tape, or write it in a kernel "
                        f"(recorded, so the backward pass sees the values '{e.name}' read)")

    def defer(self, kernel, launcher, args: tuple, rt) -> bool:
        """Called by the launcher right after record(): defer this launch (True) when it may end
        up as the tape's last one and run fused with its adjoint. The runtime launches it as usual
        before anything else reaches the device (Runtime.defer), so nothing can observe the
        difference; only launches of plain kernels of a tape with a loss and no checks qualify."""
        if (self.loss is None or not self.recording or session.ad().in_backward or self._custom is not None
                or self._snapshot is not None or self._validator is not None or not session.compile_options().fuse_adjoint
                or not self.entries or self.entries[-1].fn is not kernel or self.entries[-1].kind != "kernel"
                or not launcher.may_fuse):
            return False
        rt.run_deferred()  # the launch deferred before this one runs first
        launcher.prepare(args)  # what the launch asks for now (allocation, Storage.all_zero), its errors
        held = _Held(self.entries[-1], kernel, launcher, tuple(args), rt)
        held.handle = rt.defer(self._run_held)
        self._held = held
        return True

    def _run_held(self) -> None:
        """The runtime's callback: something else is about to reach the device."""
        held, self._held = self._held, None
        if held is not None:
            held.launch()

    def _release(self) -> None:
        """Launch the deferred launch now (unless ti.reset() has dropped it)."""
        held = self._held
        if held is not None:
            held.handle.run()
        self._held = None

    def insert(self, func: Callable, args: tuple) -> None:
        """Taichi's Tape.insert: record a call of `func` (which must have .grad) by hand."""
        self.entries.append(TapeEntry(func, tuple(args), kind="custom", opaque=True))

    def after_backward(self, fn: Callable[[], None]) -> None:
        """Call fn() once the backward pass has run every entry's gradient (ti.ad.checkpoint puts
        the final state back there: the entries before it need the state it started from)."""
        self._after_backward.append(fn)

    @contextlib.contextmanager
    def custom_call(self, fn, args: tuple, kwargs: dict):
        """A grad_replaced / no_grad function runs: one entry; its launches go into entry.inner."""
        if self._custom is not None or not self.recording:
            yield  # nested inside another custom call: part of that one
            return
        entry = TapeEntry(fn, tuple(args), dict(kwargs), kind="no_grad" if fn.no_grad else "custom")
        self.entries.append(entry)
        self._custom = entry
        try:
            yield
        finally:
            self._custom = None

    @property
    def calls(self) -> list[tuple[Any, tuple]]:
        """(function, args) of every recorded entry, in launch order (Taichi's Tape.calls)."""
        return [(e.fn, e.args) for e in self.entries]

    # ---- the backward pass --------------------------------------------------------------------

    def grad(self) -> None:
        """Run the gradients of the recorded entries in reverse order. Called on exit when the
        tape has a loss; call it yourself after the with block otherwise."""
        if not self.entered:
            raise WgpuAdError("tape.grad(): the tape was never entered; use it as `with ti.ad.Tape(...) as tape:`")
        if self.recording:
            raise WgpuAdError("tape.grad() runs the backward pass after the `with` block; call it after "
                              "the block ends (with a loss, the tape does it for you on exit)")
        if self.gradient_evaluated:
            raise WgpuAdError("tape.grad(): the gradients of this tape were already computed; record a new "
                              "tape to compute them again")
        self.gradient_evaluated = True
        held = self._held
        if held is not None and (self.loss is None or held.entry is not self.entries[-1]):
            self._release()  # not the last thing recorded: it runs before the backward pass
        try:
            check_flow(self.entries, self._flow_loss())
            if self._validator is not None:
                self._validator.check()
            else:
                from .overwrite import check_overwrites
                check_overwrites(self.entries)
        except BaseException:
            self._release()  # the forward pass completes whatever the backward pass does
            raise
        held, self._held = self._held, None
        if held is not None and not held.handle.cancel():
            held = None  # dropped by ti.reset()
        # else the backward pass launches it, fused with its adjoint if it can
        if _is_torch(self.loss):
            from ..lang.external import seed_grad
            seed_grad(self.loss, 1.0)
        elif self.loss is not None:
            self.loss.grad.fill(1)
        prev = session.ad().in_backward, session.ad().check_nan
        session.ad().in_backward, session.ad().check_nan = True, self.check_nan or prev[1]
        try:
            for e in reversed(self.entries):
                if held is not None and e is held.entry:
                    h, held = held, None
                    if not h.kernel.launch_fused(h.args):
                        h.launch()
                        e.backward()
                    continue
                e.backward()
        finally:
            session.ad().in_backward, session.ad().check_nan = prev
            for fn in self._after_backward:
                fn()
        if self.grad_check:
            from .gradcheck import check_recorded
            self.grad_check_report = check_recorded(self, self.grad_check)

    def grad_again(self) -> None:
        """Run the recorded entries' gradients once more, after grad() (for another seed: torch may
        ask one forward pass for several backward passes). The caller seeds and zeroes gradients."""
        if not self.gradient_evaluated:
            raise WgpuAdError("tape.grad_again(): call tape.grad() first")
        prev = session.ad().in_backward, session.ad().check_nan
        session.ad().in_backward, session.ad().check_nan = True, self.check_nan or prev[1]
        try:
            for e in reversed(self.entries):
                e.backward()
        finally:
            session.ad().in_backward, session.ad().check_nan = prev

    def replay(self) -> None:
        """Run the recorded entries forward again, in order (not recorded anywhere)."""
        prev = session.ad().in_backward
        session.ad().in_backward = True
        try:
            for e in self.entries:
                e.forward()
        finally:
            session.ad().in_backward = prev

