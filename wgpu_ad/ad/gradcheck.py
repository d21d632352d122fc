"""Gradient checks: the tape's gradients against central differences of the loss, in float64.

    report = ti.ad.check_grad(forward, loss=L, inputs=[x, w])   # raises GradCheckError on mismatch

(check_grad itself is in check.py: it needs the Tape, and tape.py imports this module.)

`forward` runs the kernels that compute L from the inputs. The check runs it once under a tape
(analytic gradients), remembering the value of every field the kernels write before its first
write. Then, for each checked element x_i, it puts those values back, sets x_i to x_i ± h, runs
`forward` again and reads L. So `forward` does not have to reset anything itself (a loss
accumulated with += starts from its value at the start again), but it must not overwrite the
inputs. At the end the fields hold what one forward run leaves.

Everything is float32 on the GPU. The step is h = cbrt(eps_f32) * max(1, |x_i|) ~ 5e-3 *
max(1, |x_i|) (rounding of the loss vs truncation), the step actually taken is the difference of
the two float32 values, and differences at h and 2h are combined (Richardson) so the h^2 error
cancels; their disagreement estimates what is left (stiff simulations, float32 noise). An element
passes when |analytic - numeric| <= atol + |n(h) - n(2h)| + rtol * max(|analytic|, |numeric|);
atol defaults to the loss's own rounding noise over the step.

Elements of an input that the forward stores to (x[t + 1] = f(x[t]) on a time axis) are
intermediates, not inputs: their .grad is the gradient of the value stored there. They are found
by perturbation and skipped (the report counts them).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field as dc_field
from typing import Callable, Sequence

import numpy as np

from ..errors import WgpuAdError
from ..session import runtime as get_runtime
from .naming import name_of

EPS_F32 = float(np.finfo(np.float32).eps)
STEP = EPS_F32 ** (1 / 3)  # ~4.9e-3: truncation h^2 vs rounding eps/h balance
NOISE_ULPS = 32.0


class GradCheckError(WgpuAdError, AssertionError):
    """Analytic and numeric gradients disagree; .report has the details. An AssertionError too,
    as Taichi's failed ti.ad.Tape(grad_check=...) is."""

    def __init__(self, message: str, report: "GradCheckReport"):
        super().__init__(message)
        self.report = report


class Snapshot:
    """Copies of storages' contents, put back by restore()."""

    def __init__(self):
        self._saved: dict[int, tuple[object, np.ndarray]] = {}

    def take(self, storages) -> None:
        """Copy each storage not copied yet (the first copy is the one kept)."""
        for s in storages:
            if id(s) not in self._saved:
                self._saved[id(s)] = (s, np.array(s.to_numpy(), copy=True))

    def restore(self) -> None:
        for s, arr in self._saved.values():
            s.from_numpy(arr)

    def __contains__(self, s) -> bool:
        return id(s) in self._saved

    def __len__(self) -> int:
        return len(self._saved)


@dataclass
class ElementResult:
    """One checked element (index None: a random direction through the whole field)."""

    field: str
    index: tuple | None
    analytic: float
    numeric: float
    step: float
    tol: float

    @property
    def abs_err(self) -> float:
        return abs(self.analytic - self.numeric)

    @property
    def rel_err(self) -> float:
        scale = max(abs(self.analytic), abs(self.numeric))
        return self.abs_err / scale if scale > 0 else 0.0

    @property
    def ok(self) -> bool:
        return math.isfinite(self.analytic) and math.isfinite(self.numeric) and self.abs_err <= self.tol

    @property
    def badness(self) -> float:
        if not (math.isfinite(self.analytic) and math.isfinite(self.numeric)):
            return math.inf
        return self.abs_err / max(self.tol, 1e-300)

    def where(self) -> str:
        if self.index is None:
            return f"{self.field} (all elements, along a random direction)"
        return f"{self.field}[{', '.join(map(str, self.index))}]" if self.index else f"{self.field}[None]"


@dataclass
class FieldResult:
    field: str
    total: int                       # scalars in the field
    elements: list[ElementResult] = dc_field(default_factory=list)
    overwritten: int = 0             # sampled elements the forward stores to: not inputs, skipped

    @property
    def failures(self) -> list[ElementResult]:
        return [e for e in self.elements if not e.ok]

    @property
    def worst(self) -> ElementResult | None:
        return max(self.elements, key=lambda e: e.badness, default=None)


@dataclass
class GradCheckReport:
    """What check_grad found; str() gives a summary."""

    fields: list[FieldResult]
    rtol: float

    @property
    def ok(self) -> bool:
        return all(not f.failures for f in self.fields)

    @property
    def worst(self) -> ElementResult | None:
        return max((e for f in self.fields for e in f.elements), key=lambda e: e.badness, default=None)

    @property
    def max_abs_err(self) -> float:
        return max((e.abs_err for f in self.fields for e in f.elements), default=0.0)

    @property
    def max_rel_err(self) -> float:
        return max((e.rel_err for f in self.fields for e in f.elements), default=0.0)

    def __str__(self) -> str:
        lines = [f"gradient check {'passed' if self.ok else 'FAILED'}: max |error| {self.max_abs_err:.3g}, "
                 f"max relative error {self.max_rel_err:.3g}"]
        for f in self.fields:
            w = f.worst
            n = sum(e.index is not None for e in f.elements)
            skipped = (f" ({f.overwritten} skipped: the forward stores to them, so they are not "
                       f"inputs)") if f.overwritten else ""
            lines.append(f"  {f.field}: {n} of {f.total} elements checked{skipped}, {len(f.failures)} failed"
                         + (f"; worst {w.where()}: analytic {w.analytic:.6g}, numeric {w.numeric:.6g}" if w else ""))
        return "\n".join(lines)


def _not_finite(v: float) -> str:
    return "NaN" if math.isnan(v) else "inf" if v > 0 else "-inf"


def _failure_message(report: GradCheckReport) -> str:
    w = report.worst
    f = next(f for f in report.fields if w in f.elements)
    n_bad = sum(e.index is not None for e in f.failures)
    n = sum(e.index is not None for e in f.elements)
    where = w.where()
    if not math.isfinite(w.analytic):
        nonfinite = sum(not math.isfinite(e.analytic) for e in f.elements)
        return (f"gradient check failed for field '{f.field}': the analytic gradient of {where} is "
                f"{_not_finite(w.analytic)} ({f.field}.grad; central differences give {w.numeric:.6g}); "
                f"{nonfinite} of the {len(f.elements)} checks found a NaN or infinite gradient. A derivative in the "
                f"backward pass is not finite there (sqrt or log at 0, a division by zero, pow with a "
                f"negative base, 0 * inf) or the forward values already are: run the backward pass with "
                f"ti.ad.Tape(loss, check_nan=True) (or ti.init(debug=True)) to be told the kernel, the element "
                f"and the operation")
    if not math.isfinite(w.numeric):
        return (f"gradient check failed for field '{f.field}': the loss is {_not_finite(w.numeric)} near "
                f"{where} (central differences give {w.numeric:.6g}, the analytic gradient is "
                f"{w.analytic:.6g}): the forward pass is not finite at the perturbed values; check the inputs "
                f"and the step (eps=...)")
    if w.index is None:
        head = (f"gradient check failed for field '{f.field}': along a random direction through all "
                f"{f.total} elements, the gradient predicts a loss change of {w.analytic:.6g} but the loss "
                f"changed by {w.numeric:.6g}; |difference| {w.abs_err:.3g} > tolerance {w.tol:.3g}")
    else:
        head = (f"gradient check failed for field '{f.field}': worst element {w.where()}: analytic "
                f"{w.analytic:.6g} ({f.field}.grad) vs numeric {w.numeric:.6g} (central differences, step "
                f"{w.step:.3g}); |difference| {w.abs_err:.3g} > tolerance {w.tol:.3g} (relative error "
                f"{w.rel_err:.3g}); {n_bad} of the {n} elements checked disagree")
    return (head + ". Look for a gradient replaced with ti.ad.grad_for that is wrong, kernels that break "
            "the global data access rules (check with ti.ad.Tape(validation=True)), or a forward that "
            "overwrites the inputs")


def _unravel(x, flat: int) -> tuple:
    return tuple(int(i) for i in np.unravel_index(flat, x.shape + x.element_shape))


def _set_scalar(x, full_index: tuple, value: float, base: np.ndarray) -> None:
    """x[element] = base's element with one scalar replaced by value (Python-scope write)."""
    nd = len(x.shape)
    el, comp = full_index[:nd], full_index[nd:]
    key = el if el else None
    if not comp:
        x[key] = value
    else:
        v = np.array(base[el], dtype=np.float64, copy=True)
        v[comp] = value
        x[key] = v


def _loss_value(loss) -> float:
    return float(np.asarray(loss.to_numpy(), dtype=np.float64).reshape(-1)[0])


def _check_field(x, post: np.ndarray, loss, start: Snapshot, replay: Callable[[], None], eps, rtol,
                 atol, max_elements: int, rng) -> FieldResult:
    """x holds its value at the start of the forward; post is its value after the forward."""
    name = name_of(x) or "input"
    analytic = np.asarray(x.grad.to_numpy(), dtype=np.float64)
    base = np.array(x.to_numpy(), copy=True)
    base64, post64 = base.astype(np.float64), post.astype(np.float64)
    f32 = x.dtype.np.type
    res = FieldResult(name, int(base.size))
    nd = len(x.shape)

    def run_at(index: tuple | None, values) -> tuple[float, object]:
        """The loss with x perturbed, and x afterwards (the whole field, or the one scalar)."""
        start.restore()
        if index is None:
            x.from_numpy(values)
        else:
            _set_scalar(x, index, values, base)
        replay()
        out = _loss_value(loss)
        if index is None:
            after = np.array(x.to_numpy(), copy=True)
        else:
            el = x[index[:nd] if nd else None]
            after = float(np.asarray(el, dtype=np.float64)[index[nd:]])
        if x not in start:  # x is not written by the forward: put it back ourselves
            x.from_numpy(base)
        return out, after

    steps = eps if eps is not None else STEP * np.maximum(1.0, np.abs(base64))
    steps = np.broadcast_to(np.asarray(steps, dtype=np.float64), base.shape)
    # An element the forward stores to (x[t + 1] = f(x[t])) is an intermediate, not an input:
    # its .grad is the gradient of the value stored there. Elements the forward never writes
    # keep a perturbed value bit for bit; the others are told apart one by one when sampled
    # (an element accumulated into moves with its start value, an overwritten one does not).
    untouched = np.ones(base.shape, dtype=bool)
    if x in start:
        # random sizes and signs: a uniform shift could come out unchanged through a
        # translation-invariant forward (x[t + 1] = x[t] + ...)
        jitter = rng.uniform(0.5, 1.5, size=base.shape) * rng.choice([-1.0, 1.0], size=base.shape)
        probe = (base64 + steps * jitter).astype(f32)
        untouched = run_at(None, probe)[1] == probe
    order = list(rng.permutation(np.flatnonzero(untouched.ravel())))
    order += list(rng.permutation(np.flatnonzero(~untouched.ravel())))
    inputs = untouched.copy()
    probes_left = max(16, 2 * max_elements)  # for written elements, most of which may be intermediates
    for k in order:
        if len(res.elements) >= max_elements:
            break
        idx = _unravel(x, int(k))
        v, h = float(base64[idx]), float(steps[idx])
        first = None
        if not untouched[idx]:
            if probes_left == 0:
                break
            probes_left -= 1
            hi = float(f32(v + h))
            first = run_at(idx, hi)
            if abs(first[1] - post64[idx]) <= 0.5 * abs(hi - v):
                res.overwritten += 1
                continue
            inputs[idx] = True
        diffs = []
        for step in (h, 2 * h):
            hi, lo = float(f32(v + step)), float(f32(v - step))
            Lp = first[0] if first is not None and step == h else run_at(idx, hi)[0]
            Lm = run_at(idx, lo)[0]
            diffs.append(((Lp - Lm) / (hi - lo), max(abs(Lp), abs(Lm)), hi - lo))
        (n1, mag, width), (n2, mag2, width2) = diffs
        r2 = (width2 / width) ** 2
        numeric = (r2 * n1 - n2) / (r2 - 1)   # Richardson: the h^2 truncation term cancels
        noise = 2 * NOISE_ULPS * EPS_F32 * max(mag, mag2) / width
        tol = (atol if atol is not None else noise + 1e-7) + abs(n1 - n2) \
            + rtol * max(abs(analytic[idx]), abs(numeric))
        res.elements.append(ElementResult(name, idx, float(analytic[idx]), numeric, width / 2, tol))
    if np.count_nonzero(inputs) > len(res.elements):  # the inputs not sampled count, all at once
        t = rng.choice([-1.0, 1.0], size=base.shape) * inputs
        changes = []
        for scale in (1.0, 2.0):
            hi = (base64 + scale * steps * t).astype(f32)
            lo = (base64 - scale * steps * t).astype(f32)
            Lp, Lm = run_at(None, hi)[0], run_at(None, lo)[0]
            changes.append((Lp - Lm, max(abs(Lp), abs(Lm)), hi.astype(np.float64) - lo.astype(np.float64)))
        (dL1, mag, d), (dL2, mag2, _) = changes
        first_order = (8 * dL1 - dL2) / 6     # the loss change without its cubic term
        pred = float(np.sum(analytic * d))
        scale = float(np.sum(np.abs(analytic * d)))
        tol = (atol * float(np.sum(np.abs(d))) if atol is not None else 1e-7) + abs(dL2 - 2 * dL1) / 2 \
            + 2 * NOISE_ULPS * EPS_F32 * max(mag, mag2) + rtol * max(scale, abs(first_order))
        res.elements.append(ElementResult(name, None, pred, first_order, float(np.mean(np.abs(d))) / 2, tol))
    return res


def run_check(start: Snapshot, loss, inputs: Sequence, replay: Callable[[], None], *, eps=None,
              rtol: float = 1e-2, atol: float | None = None, max_elements: int = 64, seed: int = 0,
              raise_on_fail: bool = True) -> GradCheckReport:
    """Compare inputs' .grad with central differences. Called right after the forward and
    backward ran; `start` puts back what the forward wrote, `replay` runs it again."""
    rng = np.random.default_rng(seed)
    inputs = [x for x in inputs if x is not loss]
    posts = [np.array(x.to_numpy(), copy=True) for x in inputs]
    fields = []
    with get_runtime().mute_prints():  # the forward ran (and printed) once already
        try:
            for x, post in zip(inputs, posts):
                start.restore()
                fields.append(_check_field(x, post, loss, start, replay, eps, rtol, atol, max_elements, rng))
        finally:
            start.restore()  # leave the fields as one forward run leaves them
            replay()
    report = GradCheckReport(fields, rtol)
    if raise_on_fail and not report.ok:
        raise GradCheckError(_failure_message(report), report)
    return report


def check_recorded(tape, inputs) -> GradCheckReport:
    """Tape(grad_check=[...]): replay the tape's recorded launches as the forward."""
    return run_check(tape._snapshot, tape.loss, inputs, tape.replay)
