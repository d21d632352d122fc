"""What autodiff needs from a kernel launch, in one place: the observer of launches.

A kernel call (lang/kernel.py) launches on its own while nothing in the program has a gradient
or a dual and no tape, FwdMode or checkpoint is open. Otherwise it hands the launch to
`launch` / `launch_external` here, which add, around the same launch:

- the tape's record (and its deferred, fused last launch: Tape.defer),
- forward mode: the dual kernel instead, and FwdMode's check of where tangents stop,
- the checked variant of kernels whose indices the compiler cannot prove safe (shadow.py), and
  whether each launch was checked, for kernel.grad(),
- copies of fields updated in place, for the adjoint's replay (lang/keep.py),
- the version log kernel.grad() by hand checks: what each launch read, and the write logs of
  what it wrote (Storage.writes).

`grad` is kernel.grad(*args) by hand. Per-kernel records live in a `Records` on the kernel
(`kernel._ad`), made on first use; a launch made without the observer drops them (they would
be older than that launch).
"""
from __future__ import annotations

import collections
import weakref

import numpy as np

from .. import plan
from .. import session as _session
from ..errors import WgpuAdError
from ..lang.external import EXTERNALS, Externals
from ..lang.launch import Launcher, check_binding_limit, launch, overlap, storage_getter
from ..lang.ndarray import Ndarray
from ..lang.specialised import can_hold
from ..types import to_dtype

_PLAIN = (int, float, bool)  # argument types that name themselves in keys
READ_LOG = 4096  # argument sets per kernel whose reads kernel.grad() can check (as WRITE_LOG in storage.py)


class Records:
    """A kernel's autodiff records."""

    __slots__ = ("read_versions", "forgot", "checked_lc", "checked_runs")

    def __init__(self) -> None:
        # _versions_key of a launch -> (unlogged launches then, [(weakref, version)] of what it read),
        # for the latest READ_LOG argument sets; forgot: older ones were dropped (refused then)
        self.read_versions: collections.OrderedDict = collections.OrderedDict()
        self.forgot = False
        # checked forward variants (passes/autodiff/shadow.py) per forward Launcher (held weakly),
        # and per launch key (_run_key) whether its latest launch was checked
        self.checked_lc = weakref.WeakKeyDictionary()
        self.checked_runs: dict = {}


def records(k) -> Records:
    rec = k._ad
    if rec is None:
        rec = k._ad = Records()
    return rec


# ---- launches ----------------------------------------------------------------------------------

def launch_observed(k, args: tuple, s, ad):
    """A forward launch of kernel k while autodiff has work (see the module's docstring)."""
    if ad.fwd is not None and not k._no_grad and not ad.no_grad_depth:
        return _launch_dual(k, args, s, ad)
    lc, specs, rt = k._get(args, s)
    tape = ad.tape
    want = _may_want_grad(lc, args, tape, ad)
    run = _checked(k, lc) if want and lc.compiled.shadowed else lc
    taped = tape is not None and tape.recording and not ad.in_backward and tape.keep_copies
    zeroed = _zeroed(k, tape, ad)
    if zeroed and ad.keep_copies and (want or ad.fwd is not None):  # (before a deferred launch)
        _keep_for_zeroing(k, args, taped, ad)
    if tape is not None:
        tape.record(k, args)
        if tape.defer(k, run, args, rt):
            _note_versions(k, lc, args, s)
            return None  # launched before anything else reaches the device, or fused with its adjoint
    if lc.snapshots and ad.keep_copies and not zeroed:  # no_grad: no adjoint reads them
        k._keep.keep_snapshots(lc, args, taped)
    if lc.ck.ret_dtype is not None and ad.host_guard is not None:
        ad.host_guard(k, f"the return value of kernel '{k.__name__}'")
    if _shadowed(lc, want):
        ret = _launch(k, lc, run, args, k._keep.scratch(lc, taped), rt, _run_key(lc, args))
    else:
        ret = launch(lc, args + k._keep.scratch(lc, taped), rt)
    _note_versions(k, lc, args, s)
    if ad.fwd is not None:  # a no_grad launch in forward mode: what it overwrote has no tangent
        zero_overwritten(k, args, duals=True)
    return ret


def launch_external(k, args: tuple, s, ad):
    """A launch with host arrays (lang/external.py) while autodiff has work: copied in, launched,
    written back."""
    tape = ad.tape
    if ad.host_guard is not None:
        ad.host_guard(k, f"the NumPy arrays or torch tensors passed to kernel '{k.__name__}' "
                         f"(copied back after the launch)")
    if tape is not None:
        tape.record(k, args)  # the host arrays: the backward pass copies them in again
    dev, bound = EXTERNALS.to_device(k, args, k._ndarrays, with_grads=False)
    taped = tape is not None and tape.recording and not ad.in_backward and tape.keep_copies
    fwd, _specs, rt = k._get(dev, s)
    lc = fwd
    if ad.fwd is not None and not k._no_grad and not ad.no_grad_depth:
        lc = k._get_dual(dev)[0]  # host arrays have no duals; fields may
        _before_dual(k, fwd, dev, ad, external=True)
    zeroed = _zeroed(k, tape, ad)
    if zeroed and ad.keep_copies:
        _keep_for_zeroing(k, dev, taped, ad)
    if lc.snapshots and ad.keep_copies and not zeroed:  # no_grad: no adjoint reads them
        k._keep.keep_snapshots(lc, dev, taped)
    want = lc is fwd and _may_want_grad(lc, dev, tape, ad)
    if lc is fwd and _shadowed(lc, want):
        run = _checked(k, lc) if want else lc
        ret = _launch(k, lc, run, dev, k._keep.scratch(lc, taped), rt, _run_key(lc, dev, external=True))
    else:
        ret = launch(lc, dev + k._keep.scratch(fwd, taped), rt)
    Externals.to_host(bound, lc.ck, grads=False)
    if ad.fwd is not None and lc is fwd:  # a no_grad launch in forward mode: see launch_observed
        zero_overwritten(k, dev, duals=True)
    return ret


def _zeroed(k, tape, ad) -> bool:
    """Whether the gradients (or in forward mode the tangents) of what this launch overwrites
    will be zeroed (zero_overwritten) instead of its adjoint run: a no_grad kernel, or a kernel a
    no_grad function launches."""
    custom = getattr(tape, "_custom", None)
    return k._no_grad or bool(ad.no_grad_depth) or (custom is not None and custom.kind == "no_grad")


def _keep_for_zeroing(k, args, taped: bool, ad) -> None:
    """Before such a launch: copies of what it writes that its zeroing kernel replays (which
    elements it overwrites depends on them: passes/autodiff/overwritten.py)."""
    duals = ad.fwd is not None
    z = k._get_zeroing(args, duals)[0]
    if isinstance(z, Launcher) and z.snapshots:
        k._keep.keep_snapshots(z, args, taped and not duals, always=True)


def _launch_dual(k, args, s, ad):
    """Inside ti.ad.FwdMode: the dual kernel (primal values and tangents) instead."""
    lc = k._get(args, s)[0]
    d, _specs, rt = k._get_dual(args)
    _before_dual(k, lc, args, ad)
    if lc.ck.ret_dtype is not None and ad.host_guard is not None:
        ad.host_guard(k, f"the return value of kernel '{k.__name__}'")
    ret = launch(d, args + k._keep.scratch(lc, False), rt)
    _note_versions(k, lc, args, s)
    return ret


def _before_dual(k, lc, args, ad, external: bool = False) -> None:
    """A launch of the dual kernel of forward Launcher lc inside ti.ad.FwdMode: the FwdMode
    checks where tangents stop (fwd.py note_launch); and as the dual kernel checks nothing,
    kernel.grad() must not trust the check of an older launch with these arguments."""
    ad.fwd.note_launch(k.__name__, [get(args) for get in lc.loads], [get(args) for get in lc.writes])
    if _shadowed(lc, False):
        _set_checked(k, _run_key(lc, args, external), False, in_fwd_mode=True)


# ---- run-time access checks (passes/autodiff/shadow.py) -----------------------------------------

def _shadowed(lc, want: bool) -> bool:
    """Whether forward Launcher lc has accesses a checked launch tracks; the access checks that
    tell run only once a gradient may be asked for (`want`), or have run already."""
    return (want or lc.compiled.shadowed_known) and bool(lc.compiled.shadowed)


def _may_want_grad(lc, args, tape, ad) -> bool:
    """Whether a gradient may be asked for a forward launch: a tape records it, or something it
    reads has a gradient (as for keep_snapshots)."""
    if tape is not None and tape.recording and not ad.in_backward:
        return True
    return any(get(args).needs_grad for get in lc.loads + lc.snapshots)


def _checked(k, lc) -> Launcher:
    """The checked variant of a forward Launcher whose accesses are not all proven safe for
    reverse mode, compiled on first use."""
    rec = records(k)
    run = rec.checked_lc.get(lc)
    if run is None:
        from ..compiler.driver import compile_checked
        run = Launcher(compile_checked(lc.compiled, _session.current().options), lc.specs)
        check_binding_limit(run, k.__name__, "checked", _session.runtime())
        rec.checked_lc[lc] = run
        run.shadow_of = [storage_getter(src.of, run.compiled.storages) for src in run.plan.shadows]
    return run


checked_variant = _checked  # kernel.get_wgsl(checked=True)


def _run_key(lc, args, external: bool = False) -> tuple:
    """What names a launch for kernel.grad(): the forward Launcher and the storages it reads and
    writes (host arrays get fresh device copies per launch: only the Launcher for them), as ids
    with weak references beside them: a storage made later at a freed one's address is another
    key (_was_checked compares the referents)."""
    if external:
        return (id(lc),), (weakref.ref(lc),)
    sts = [get(args) for get in lc.loads + lc.writes]
    return (id(lc), *map(id, sts)), (weakref.ref(lc),) + tuple(weakref.ref(st) for st in sts)


def _set_checked(k, key: tuple, checked: bool, in_fwd_mode: bool = False) -> None:
    records(k).checked_runs[key[0]] = (checked, key[1], in_fwd_mode)


def _seen(k, key: tuple):
    return k._ad.checked_runs.get(key[0]) if k._ad is not None else None


def _was_checked(k, key: tuple) -> bool:
    """Whether the latest launch with this key was checked, with these very storages."""
    seen = _seen(k, key)
    return bool(seen and seen[0] and all(a() is not None and a() is b() for a, b in zip(seen[1], key[1])))


def _launch(k, lc, run, args, scratch: tuple, rt, key: tuple):
    """Launch `run` (lc, whose plan has shadowed sources, or its checked variant) with fresh zeroed
    shadow buffers when checked; remember whether a launch with this key was checked
    (_require_checked)."""
    if run is lc:
        _set_checked(k, key, False)
        return launch(lc, args + scratch, rt)
    keep = k._keep
    keep.drop_dead()
    shadows = []
    for get in run.shadow_of:
        n = get(args).n_scalars
        spare = keep.shadow_spare.get(n)
        arr = spare.pop() if spare else Ndarray(to_dtype("u32"), (n,), name=f"{get(args).name or 'field'}_accesses")
        arr.fill(0)
        shadows.append(arr)
    _set_checked(k, key, False)
    try:
        ret = launch(run, args + scratch + tuple(shadows), rt)
    finally:  # a later clear is recorded after the launch: the buffers may serve the next one
        for arr in shadows:
            keep.shadow_spare.setdefault(arr.n_scalars, []).append(arr)
    _set_checked(k, key, True)
    return ret


def _require_checked(k, lc, args, external: bool = False) -> None:
    """kernel.grad(): refuse unless the latest forward launch with these storages was checked."""
    if not lc.compiled.shadowed:
        return
    key = _run_key(lc, args, external)
    if _was_checked(k, key):
        return
    seen = _seen(k, key)
    why = ("it ran inside ti.ad.FwdMode, whose dual kernel checks nothing" if seen and seen[2]
           else "nothing it reads needed a gradient")
    raise WgpuAdError(
        f"{k.__name__}.grad(): kernel '{k.__name__}' indexes a field by values the compiler "
        f"cannot prove safe for reverse mode (read from a field, a counter stepped conditionally, or loop "
        f"ranges set by its arguments), so its gradient is right only after a forward launch that checked them on the GPU, and its "
        f"latest launch with these arguments was not checked ({why}). "
        f"Launch it inside ti.ad.Tape, or while something it reads has needs_grad=True, right before "
        f"its .grad()")


# ---- the version log kernel.grad() by hand checks ---------------------------------------------

def _versions_key(reads: list, args: tuple) -> tuple:
    """Names the launch kernel.grad(*args) differentiates: the storages it read and its arguments
    (k(t) and k(t + 1) read different elements, and k.grad(t) must compare with k(t)'s reads)."""
    ids = tuple(map(id, reads))
    if all(type(a) in _PLAIN for a in args):
        return ids, args

    def value(a):
        if isinstance(a, (int, float, str, np.generic)) or a is None:
            return a
        if isinstance(a, np.ndarray):  # a vector argument
            return tuple(a.ravel().tolist())
        if isinstance(a, (list, tuple)):  # a vector argument, or a tuple of fields as a template
            return tuple(map(value, a))
        if type(a) is dict:
            return tuple((value(k), value(v)) for k, v in a.items())
        return id(a)  # a field, ndarray or template object (by id: the key must not keep it)
    return ids, tuple(value(a) for a in args)


_GONE = object()


class _Items(tuple):
    """A tuple or list argument (of fields, for a template) held item by item (_hold)."""
    __slots__ = ()


def _hold(a):
    """An argument as a write log keeps it: storages and data-oriented objects weakly, tuples and
    lists of them item by item, anything else as it is."""
    if can_hold(a):
        return weakref.ref(a)
    if type(a) in (tuple, list):
        return _Items((type(a), *map(_hold, a)))
    if type(a) is dict:
        return _Items((_pairs, *(_Items((tuple, _hold(k), _hold(v))) for k, v in a.items())))
    return a


def _pairs(items: list) -> dict:
    return dict(items)


def _alive(h):
    """What _hold kept, back as the argument, or _GONE when a storage in it was dropped."""
    if isinstance(h, weakref.ref):
        v = h()
        return _GONE if v is None else v
    if isinstance(h, _Items):
        items = [_alive(x) for x in h[1:]]
        return _GONE if any(x is _GONE for x in items) else h[0](items)
    return h


class _Wrote:
    """A launch in the write logs of the storages it wrote (Storage.writes): the footprint indices
    it wrote in one of them, computed only when kernel.grad() asks (a launch pays for an append).
    Storages are held weakly (the log lives on them); None once one is gone."""

    __slots__ = ("footprint", "held")

    def __init__(self, lc: Launcher, args: tuple):
        # (not the Launcher: a long-lived storage's log would keep it, and the fields it names, alive)
        self.footprint = lc.footprint_plan
        self.held = args if all(type(a) in _PLAIN for a in args) else tuple(map(_hold, args))

    def indices(self, st) -> list | None:
        live = tuple(map(_alive, self.held))
        found = None if any(v is _GONE for v in live) else self.footprint.of(live)
        if found is None:  # a storage it named is gone: assume it wrote every element
            return None
        return [idx for obj, kind, idx in found if obj is st and kind not in ("load", "load_before")]


def _note_versions(k, lc, args, s) -> None:
    """A forward launch: bump the versions of what it wrote, remember those of what it read (with
    the session's count of unlogged launches then: see _check_versions)."""
    if lc.writes:
        who, wrote = f"kernel '{k.__name__}'", _Wrote(lc, args)
        for get in lc.writes:
            st = get(args)
            st.version += 1
            st.writer = who
            st.writes.append((st.version, who, wrote))
    if lc.replays:
        reads = [get(args) for get in lc.replays]
        key = _versions_key(reads, args)
        rec = records(k)
        versions = rec.read_versions
        if key in versions:
            versions.move_to_end(key)
        versions[key] = (s.unlogged_launches, [(weakref.ref(st), st.version) for st in reads])
        if len(versions) > READ_LOG:
            versions.popitem(last=False)
            rec.forgot = True


def _check_versions(k, lc, args) -> None:
    """kernel.grad() by hand: refuse when elements that the forward launch with these arguments
    read (or combined into with an atomic min / max) were written since: its adjoint would replay
    the new values. Writes since are compared by footprint (Storage.writes); one the log no
    longer holds, or a Python-scope write, counts as touching every element."""
    reads = [get(args) for get in lc.replays]
    if not reads:
        return
    name = k.__name__
    rec = records(k)
    record = rec.read_versions.get(_versions_key(reads, args))
    unlogged = _session.current().unlogged_launches
    if record is None and k._unlogged or record is not None and record[0] != unlogged:
        raise WgpuAdError(
            f"{name}.grad(): kernel '{name}' (or another kernel) ran while nothing in the program had a "
            f"gradient or a dual, and such launches keep no record of what they read or wrote, so whether "
            f"what this launch read is unchanged is not known and its gradient cannot be trusted. Give the "
            f"fields their gradients first (needs_grad=True, or ti.root.lazy_grad() before the launches), "
            f"launch {name} again right before its .grad(), or record the launches in ti.ad.Tape")
    if record is None and rec.forgot:
        raise WgpuAdError(
            f"{name}.grad(): kernel '{name}' ran with more than {READ_LOG} other argument sets since its "
            f"launch with these arguments (if there was one), and what that launch read is no longer known, "
            f"so its gradient cannot be trusted. Launch {name} with these arguments again right before its "
            f".grad(), or record the launches in ti.ad.Tape")
    footprint = None
    for ref, version in (record[1] if record is not None else ()):
        st = ref()
        if st is None or st.version == version:
            continue
        since = [w for w in st.writes if w[0] > version]
        if len(since) != st.version - version:  # older than the log: assume the worst
            since = [(None, st.writer, None)]
        if footprint is None:
            footprint = lc.footprint(args)
        read = [idx for obj, kind, idx in footprint if obj is st and kind in ("load", "atomic")]
        for _version, who, wrote in since:
            idx = wrote.indices(st) if wrote is not None else None
            if idx is not None and not any(overlap(r, w) for r in read for w in idx):
                continue  # other elements (x[t + 1] written, x[t] read): the replay sees the same values
            what = st.name or "the field"
            raise WgpuAdError(
                f"{name}.grad(): kernel '{name}' read {st._label()} when it ran, and {who} wrote it since, so "
                f"the gradient would be computed from the new values and be silently wrong. Call "
                f"{name}.grad() before {what} is overwritten (gradients go in the reverse order of the "
                f"launches), launch {name} again right before its .grad() once {what} holds what it read "
                f"(recomputed), keep one copy per step ({what}[t + 1] = f({what}[t])), or record the "
                f"launches in ti.ad.Tape, which orders them for you")


# ---- kernel.grad(*args) -------------------------------------------------------------------------

def zero_overwritten(k, args: tuple, duals: bool = False) -> None:
    """The backward pass of a launch of k as a @ti.ad.no_grad kernel (or one launched by a no_grad
    function): the gradients of the elements it overwrote go to 0, since nothing flows back through
    what it writes (passes/autodiff/overwritten.py); what it accumulated into passes through. With
    duals=True, right after such a launch in forward mode: their tangents go to 0."""
    bound = None
    if k._ndarrays and k._has_external(args):
        args, bound = EXTERNALS.to_device(k, args, k._ndarrays, with_grads=not duals)
    z, rt = k._get_zeroing(args, duals)
    if isinstance(z, str):
        from ..user_code import warn
        from .flow import GradientWarning
        left = ("their tangents are left as they were (the kernels after it read the tangents of the values "
                "it replaced)") if duals else ("their gradients are left as the later kernels made them (whatever "
                                               "wrote those elements before gets them)")
        warn(f"@ti.ad.no_grad kernel '{k.__name__}' overwrites elements of fields with "
             f"{'tangents' if duals else 'gradients'}, and {z}: {left}. Write those fields in a kernel without "
             f"@ti.ad.no_grad, or compute the indices from fields", GradientWarning)
    elif z is not None:
        snaps = k._keep.pop_snapshots(z, args)  # what it replays (_keep_for_zeroing)
        launch(z, args + snaps, rt)
        k._keep.recycle(snaps)
        if bound is not None and not duals:
            Externals.to_host(bound, z.ck, grads=True, kernel=k.__name__)


def grad(k, args: tuple):
    """kernel.grad(*args): the adjoint of k for these arguments, after the checks above."""
    if k._no_grad:
        return zero_overwritten(k, args)  # @ti.ad.no_grad: nothing flows back through what it writes
    ad = _session.current().ad
    if ad.fwd is not None:
        raise WgpuAdError(
            f"{k.__name__}.grad() inside ti.ad.FwdMode (entered at {ad.fwd._where}): reverse mode on top of "
            f"forward mode is not supported; call {k.__name__}.grad() outside the FwdMode `with` block")
    if k._ndarrays and k._has_external(args):
        dev, bound = EXTERNALS.to_device(k, args, k._ndarrays, with_grads=True)
        fwd = k._get(dev)[0]
        _require_checked(k, fwd, dev, external=True)
        ret, g = _adjoint(k, fwd, dev, ad)
        read = {a.source.arg for a in fwd.plan.accesses if a.kind == "load" and isinstance(a.source, plan.Arg)}
        Externals.to_host(bound, g.ck, grads=True, inputs=read, kernel=k.__name__)
        return ret
    fwd = k._get(args)[0]
    if not any(st.needs_grad for group in fwd.accessed(args) for st in group):
        return None  # nothing it reads or writes has a gradient (integer fields): its adjoint changes nothing
    _require_checked(k, fwd, args)
    if not ad.in_backward:  # a tape checks its launches itself
        _check_versions(k, fwd, args)
    return _adjoint(k, fwd, args, ad)[0]


def _adjoint(k, fwd, args, ad):
    """Launch the adjoint of forward Launcher fwd with the copies and sums its launch kept;
    (its return value, the adjoint's Launcher)."""
    keep = k._keep
    g, _specs, rt = k._get_grad(args, launching=True)
    snaps = keep.pop_snapshots(fwd, args)
    scratch = keep.scratch_for_grad(fwd, ad.in_backward)
    ret = launch(g, args + snaps + scratch, rt)
    keep.recycle(snaps)
    keep.recycle_scratch(fwd, scratch)
    return ret, g
