"""The session: the one owner of a program's state.

`ti.init()` opens a session, `ti.reset()` (or the next `ti.init()`) closes it; a program that never
calls `ti.init()` gets a default session on first use. A session owns

- the runtime (the wgpu device, its queue and caches: runtime/device.py's Runtime),
- the compile options (the device's defaults with the user's settings on top),
- the autodiff context (`AdContext`: the tape recording, the FwdMode open, no_grad depth, checks),
  one per thread, so a tape records the launches of its own thread,
- its generation: data made in an older session (fields, compiled kernels) is invalid in a newer one.

Layers above (lang/, ad/, viewer/) ask `current()` for it; the runtime and the compiler below know
nothing of it. What must be dropped when a session closes (the data layer's buffers, ti.root's
fields, the viewer's pipelines) registers with `on_close` once, at import.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import weakref
from typing import Callable

from .compiler.options import CompileOptions, check_changes, for_device
from .errors import GpuError, WgpuAdError
from .runtime.adapter import enumerate_adapters
from .runtime.device import Runtime
from .types import F64, f32


class AdContext:
    """What autodiff is doing now: set and restored by ti.ad.Tape, FwdMode, no_grad and checkpoint."""

    __slots__ = ("tape", "in_backward", "fwd", "no_grad_depth", "check_nan", "keep_copies", "host_guard")

    def __init__(self) -> None:
        self.tape = None            # the ti.ad.Tape inside whose `with` block we are
        self.in_backward = False    # a tape runs gradient functions: their launches are not recorded
        self.fwd = None             # the ti.ad.FwdMode inside whose `with` block we are: launches run duals
        self.no_grad_depth = 0      # depth of @ti.ad.no_grad calls: their launches run plain in FwdMode
        self.check_nan = False      # a ti.ad.Tape(check_nan=True) runs its adjoints: they check gradients
        # False while ti.ad.checkpoint runs steps whose adjoints will not run (its forward pass and
        # its recomputation): kernels that update fields in place then keep no copy for their adjoint
        self.keep_copies = True
        # set by ti.ad.checkpoint inside a step: called with (what, description) before a read-back
        # or a Python-scope write, to refuse it (a step must be replayable)
        self.host_guard: Callable | None = None


class Session:
    """One device, its compile options and the autodiff context (see the module's docstring)."""

    def __init__(self, generation: int, runtime_kwargs: dict | None = None, options: dict | None = None):
        self.generation = generation
        self._runtime_kwargs = dict(runtime_kwargs or {})
        self._runtime: Runtime | None = None
        self._user_options = dict(options or {})
        check_changes(self._user_options)
        self._options: CompileOptions | None = None
        self._ad = threading.local()  # each thread's autodiff context: a tape records its own thread
        self.closed = False
        # live storages that have a gradient or a dual: while there are none, and no tape or FwdMode
        # is open, nothing can ask for a derivative and a launch is only a launch (lang/kernel.py)
        self.companions = 0
        # launches that kept no autodiff records (made while nothing had a gradient or a dual):
        # kernel.grad() refuses to trust a record older than one of them
        self.unlogged_launches = 0
        self.open_tapes: dict[int, str] = {}  # thread id -> where its open ti.ad.Tape was entered
        self.f64_as_f32 = False  # ti.init(f64="f32"): ti.f64 reads as ti.f32 (types.py F64_AS_F32)

    def track_companion(self, owner) -> None:
        """`owner` got a gradient or a dual: launches keep autodiff records while it lives."""
        self.companions += 1
        weakref.finalize(owner, self._companion_gone)

    def _companion_gone(self) -> None:
        self.companions -= 1

    @property
    def ad(self) -> AdContext:
        """The calling thread's autodiff context."""
        try:
            return self._ad.ctx
        except AttributeError:
            ctx = self._ad.ctx = AdContext()
            return ctx

    @property
    def runtime(self) -> Runtime:
        rt = self._runtime
        if rt is None:
            with _state["lock"]:  # threads that start together must share one device
                rt = self._runtime
                if rt is None:
                    if self.closed:
                        raise WgpuAdError("this wgpu_ad session was closed (ti.reset()); its device is gone")
                    rt = self._runtime = Runtime(**self._runtime_kwargs)
        return rt

    @property
    def options(self) -> CompileOptions:
        """The options kernels compile with now."""
        opts = self._options
        if opts is None:
            opts = self._options = for_device(self.runtime, **self._user_options)
        return opts

    def set_options(self, **changes) -> CompileOptions:
        check_changes(changes)
        self._user_options.update(changes)
        self._options = None
        return self.options

    @contextlib.contextmanager
    def options_changed(self, **changes):
        """A context in which kernels compile with these options on top of the session's (ti.export
        compiles the portable form), the session's own options back afterwards."""
        check_changes(changes)
        saved_user, saved = dict(self._user_options), self._options
        self._user_options.update(changes)
        self._options = None
        try:
            yield self.options
        finally:
            self._user_options.clear()
            self._user_options.update(saved_user)
            self._options = saved

    def sync(self) -> None:
        if self._runtime is not None:
            self._runtime.sync()

    def close(self) -> None:
        """Cancel deferred work, flush kernels' printed lines, drop the device."""
        if self.closed:
            return
        self.closed = True
        rt, self._runtime = self._runtime, None
        if rt is not None:
            for d in rt._deferred:  # deferred launches belong to the fields that are gone
                d.cancel()
            rt._deferred.clear()
            _flush_prints(rt)


# the open session (None before the first use and after ti.reset()), and the hooks run when one closes
_state = {"session": None, "generation": 0, "lock": threading.RLock(), "forked_at": -1, "abandoned": []}
_close_hooks: list[Callable[[], None]] = []


def current() -> Session:
    """The open session, opened with the defaults if ti.init() was not called."""
    s = _state["session"]
    if s is None:
        with _state["lock"]:
            s = _state["session"]
            if s is None:
                s = open_session()
    return s


def open_session(runtime_kwargs: dict | None = None, options: dict | None = None) -> Session:
    """Close the open session, if any, and open a new one (ti.init)."""
    with _state["lock"]:
        if _state.get("forked_with_gpu"):
            raise GpuError(FORKED)
        if _state["session"] is not None:
            close()
        s = Session(_state["generation"], runtime_kwargs, options)
        if runtime_kwargs is not None:
            s.runtime  # ti.init() creates the device now: its errors belong to the call
        _state["session"] = s
        return s


def close() -> None:
    """Close the open session (ti.reset()): the device, fields and compiled kernels go."""
    with _state["lock"]:
        s = _state["session"]
        _state["generation"] += 1
        _state["session"] = None
        if s is not None:
            s.close()
        for hook in list(_close_hooks):
            hook()


def _after_fork_in_child() -> None:
    """os.fork() copies no GPU device, and the parent's one hangs when used from the child: the
    child starts without a session. If the parent had not touched the GPU, the child's first use
    (or its ti.init()) opens one as usual; if it had, opening one is refused with the fix (spawn),
    since a new device hangs too. What the parent made is refused, naming the fork."""
    _state["lock"] = threading.RLock()  # (another thread of the parent may have held it)
    s = _state["session"]
    _state["session"] = None
    _state["generation"] += 1
    _state["forked_at"] = _state["generation"]
    if s is not None:  # the parent's device: never used, nor released, here
        s.closed = True
        _state["abandoned"].append(s)
    # the GPU driver's state (its threads, the parent's wgpu instance) does not survive a fork: a
    # device made here after one was made in the parent hangs at its first submit (lavapipe, seen)
    _state["forked_with_gpu"] = enumerate_adapters.cache_info().currsize > 0
    enumerate_adapters.cache_clear()
    for hook in list(_close_hooks):
        hook()


os.register_at_fork(after_in_child=_after_fork_in_child)


FORKED = ("this process was forked (os.fork(), multiprocessing's default 'fork' start method on Linux, torch "
          "DataLoader workers) from one in which wgpu_ad had already used the GPU; the GPU driver's state does not "
          "survive a fork, so wgpu_ad cannot open a device here (it would hang). Start worker processes with the "
          "'spawn' method (multiprocessing.get_context('spawn'), torch.multiprocessing.spawn, DataLoader(..., "
          "multiprocessing_context='spawn')), or fork before the parent first uses wgpu_ad")


def made_before_fork(generation: int) -> bool:
    """Whether data of this generation was made by the parent of this forked process."""
    return generation < _state["forked_at"]


def on_close(hook: Callable[[], None]) -> None:
    """Call hook() whenever a session closes (the layers above drop what they made for it)."""
    if hook not in _close_hooks:
        _close_hooks.append(hook)


def generation() -> int:
    """Bumped whenever a session closes; data made under an older generation is invalid."""
    return _state["generation"]


def runtime() -> Runtime:
    return current().runtime


def sync() -> None:
    """Wait for the GPU to finish what was launched (Taichi's ti.sync)."""
    s = _state["session"]
    if s is not None:
        s.sync()


def f64_dtype():
    """What `ti.f64` reads as: ti.f32 in a session opened with ti.init(f64="f32"), else the dtype
    that is refused when used (types.py F64), so that `ti.init(default_fp=ti.f64, ...)` can read it."""
    s = _state["session"]
    return f32 if s is not None and s.f64_as_f32 else F64


def compile_options() -> CompileOptions:
    """The compile options kernels compile with now (`ti.compile_options()`)."""
    return current().options


def set_compile_options(**changes) -> CompileOptions:
    """Change compile options for the kernels compiled from now on (each kernel recompiles for the
    new options on its next call); returns the new options. Names: CompileOptions' fields."""
    return current().set_options(**changes)


def use_autodiff(provider) -> None:
    """wgpu_ad.ad registers itself here at import (ad/launches.py): kernel calls hand it their
    launches while autodiff has work, and kernel.grad() its adjoints. The layers below ad/ reach
    it only through this, so they do not import it."""
    _state["autodiff"] = provider


def autodiff():
    """The autodiff provider (ad/launches.py)."""
    provider = _state.get("autodiff")
    if provider is None:  # importing any part of wgpu_ad imports wgpu_ad/__init__.py, and it wgpu_ad.ad
        raise WgpuAdError("wgpu_ad.ad was not imported, so nothing handles autodiff (a packaging bug)")
    return provider


def runtime_stats() -> dict:
    """ti.runtime_stats(): what holds GPU memory now, as a dict: `buffers`, `buffer_bytes`,
    `bind_groups` and `pipelines` alive in this process (wgpu's counts), and `cached`, what the
    device's pipeline cache holds (`kernels`, `pipelines`, `bind_groups`). Call gc.collect()
    first for exact counts (objects in reference cycles wait for the collector)."""
    return current().runtime.stats()


def ad() -> AdContext:
    """The autodiff context of the open session."""
    return current().ad


def _flush_prints(rt: Runtime | None) -> None:
    """Lines printed by kernels since the last read-back reach sys.stdout before the runtime goes
    (ti.reset(), ti.init() again, the end of the program)."""
    if rt is None or not rt.prints.launches or rt.lost is not None:
        return
    try:
        rt.sync()
    except WgpuAdError as e:  # the runtime is going away: report, instead of a traceback
        print(f"wgpu_ad: while reading back the lines printed by kernels: {e}", file=sys.stderr)


atexit.register(lambda: _flush_prints(_state["session"]._runtime if _state["session"] else None))

__all__ = ["AdContext", "Session", "current", "open_session", "close", "on_close", "generation", "runtime",
           "sync", "compile_options", "set_compile_options", "runtime_stats", "ad", "use_autodiff", "autodiff", "made_before_fork"]
