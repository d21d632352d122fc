"""The tape's check that gradients can flow (Tape.grad, before the backward pass): a loss no
recorded kernel wrote, launches that no field with a gradient feeds, and kernels that overwrite
with constants what a gradient would flow through are named in a GradientWarning at the user's
line, or refused (Taichi returns zero gradients there, silently)."""
from __future__ import annotations

from ..errors import WgpuAdError
from ..user_code import warn
from .naming import describe, quoted


def accesses(kernel, args) -> tuple[list, list] | None:
    """(reads, writes) of one launch, from the compiler; None if the kernel cannot tell."""
    accessed = getattr(kernel, "accessed", None)
    if accessed is None:
        return None
    return accessed(*args)


def _float(s) -> bool:
    return s.dtype.is_float and not s.is_grad


def check_flow(entries: list, loss) -> None:
    """Refuse a backward pass that cannot produce the gradients the user expects, naming why."""
    infos = []
    for e in entries:
        reads, writes, known = [], [], not e.opaque
        for k, a in e.launches():
            acc = accesses(k, a)
            if acc is None:
                known = False
                continue
            reads += acc[0]
            writes += acc[1]
        infos.append((e, reads, writes, known))
    if not all(known for *_, known in infos):
        return  # kernels that cannot list their accesses: nothing to check against
    _warn_initialisers(infos)
    if loss is not None and infos and not any(loss is w for _, _, ws, _ in infos for w in ws):
        # Taichi gives zero gradients here, and so do we; the warning says why
        warn(
            f"ti.ad.Tape(loss=...): no kernel launched inside the tape writes the loss {describe(loss)}, so "
            f"every gradient is zero. Compute the loss in a kernel called inside the `with` block "
            f"(Python-scope assignments such as {_n(loss)}[None] = ... are not recorded)", GradientWarning)
        return
    # Fields computed on the tape from something with a gradient, but without one themselves.
    dependent: dict = {}
    for e, reads, writes, _ in infos:
        if e.kind == "no_grad":
            continue
        if e.kind == "kernel" and any(w.needs_grad for w in writes):
            for r in reads:
                if _float(r) and not r.needs_grad and id(r) in dependent:
                    src = dependent[id(r)]
                    raise WgpuAdError(
                        f"ti.ad.Tape: kernel '{e.name}' reads {describe(r)}, which '{src.name}' computed on "
                        f"the tape from fields with gradients, but {quoted(r)} has no gradient: the gradient "
                        f"stops there and everything before it would get zero. Create {quoted(r)} with "
                        f"needs_grad=True (or call ti.root.lazy_grad() before creating the fields); if "
                        f"stopping the gradient is intended, mark '{src.name}' with @ti.ad.no_grad")
        carries = e.kind == "custom" or any(_float(r) and (r.needs_grad or id(r) in dependent) for r in reads)
        if carries:
            for w in writes:
                if _float(w):
                    dependent.setdefault(id(w), e)
    active = [(e, reads) for e, reads, _, _ in infos if e.kind != "no_grad"]
    if active and all(e.kind == "kernel" for e, _ in active):
        if not any(_float(r) and r.needs_grad for _, reads in active for r in reads):
            names = sorted({quoted(r) for _, reads in active for r in reads if _float(r)})
            read = f"they read {', '.join(names)}" if names else "they read no float fields"
            # Taichi gives zero gradients here, and so do we (the loss may truly not depend on
            # anything with a gradient); the warning says why, in case that was not meant
            warn(
                f"ti.ad.Tape: none of the fields read by the kernels on the tape has a gradient ({read}), so "
                f"every gradient stays zero. If gradients were wanted, create those fields with "
                f"needs_grad=True (or call ti.root.lazy_grad() before the tape)", GradientWarning)


def _warn_initialisers(infos: list) -> None:
    """Warn (once per tape) about a kernel that stores into a field with a gradient from values
    that carry none, when a later kernel reads those very values: the field's gradient after the
    backward pass is the gradient with respect to its value *before* that kernel, which nothing
    read, so zero (seed 000: `v[p] = [0.1, 0.2, 0.3]` inside the tape, then v.grad is all zeros)."""
    for n, (e, reads, _writes, _) in enumerate(infos):
        if e.kind != "kernel" or any(_float(r) and r.needs_grad for r in reads):
            continue
        stored = {id(obj): obj for obj, kind, _ in e.fn.footprint(*e.args) if kind == "store"}
        for obj in stored.values():
            if not (_float(obj) and obj.needs_grad):
                continue
            for later, later_reads, later_writes, _ in infos[n + 1:]:
                if any(r is obj for r in later_reads):
                    warn(
                        f"ti.ad.Tape: kernel '{e.name}' overwrites {describe(obj)} inside the tape with values "
                        f"that carry no gradient, and kernel '{later.name}' reads them: after the backward pass "
                        f"{quoted(obj)}.grad is the gradient with respect to its value before '{e.name}' ran, "
                        f"which nothing read, so zero. To get the gradient with respect to the values "
                        f"'{e.name}' writes, run '{e.name}' before the tape (outside the `with` block)",
                        GradientWarning)
                    return
                if any(w is obj for w in later_writes):
                    break  # written again (e.g. accumulated into) before anything read it


class GradientWarning(UserWarning):
    """A gradient that is mathematically right but is probably not the one the program wants."""


def _n(s) -> str:
    from .naming import name_of
    return name_of(s) or "loss"
