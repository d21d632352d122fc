"""The gradient NaN / Inf check (check_nan: ti.init(debug=True), ti.ad.Tape(check_nan=True)): what
its checks carry from the adjoint emitter (passes/autodiff/nancheck.py) through code generation
to the runtime, and the message a failed check becomes.

In an adjoint compiled with the check, every local derivative a rule produces is tested (its value,
and its operands where the op has a singular point: passes/autodiff/nancheck.py DOMAIN, as a shader
compiler may fold the NaN or inf away); the first one in a thread that is not finite is remembered, with the operation's values, in
thread-local variables (an Origin names the operation). Every contribution to a gradient buffer
is tested before it is added (a GradCheck, the attr of an ASSERT): a non-finite one stops the
thread and reports the element, its value and the remembered origin. The records are plain data
(they pickle into the offline cache with their kernel); no IR here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from .errors import GradientNaNError, SourceLoc

# what a GradCheck's ASSERT reports, in order (after its condition)
VALUES = ("value", "index", "site", "at", "x", "y", "r", "g", "c")


@dataclass(frozen=True)
class Origin:
    """Where a non-finite adjoint can first appear in a thread: the derivative of the primal op
    `op` (its lower-case Op name) with respect to operand `operand` (0 or 1) of `arity`; or, with
    op None, a gradient the adjoint reads (the output's: y.grad[j] for y[j] = ...), `field`."""

    loc: SourceLoc | None
    op: str | None = None
    operand: int = 0
    arity: int = 1
    field: str | None = None
    source: object = None        # the gradient buffer's plan source (for element names)


@dataclass(eq=False)
class GradCheck:
    """A test of one contribution to a gradient buffer (`field`'s, its plan source `source`), for
    the read of `field` at `loc` in kernel `kernel`. `origins` is shared by the checks of one
    adjoint kernel: the reported site k > 0 is origins[k - 1]."""

    kernel: str
    field: str
    source: object
    loc: SourceLoc | None
    origins: list

    def __repr__(self) -> str:
        line = f" line {self.loc.line}" if self.loc else ""
        return f"<gradient of {self.field} is finite{line}>"

    def format(self, *values) -> str:
        """The message (the interpreter formats assert templates with .format)."""
        return _message(self, values, None)

    def error(self, values, storage: Callable | None = None) -> GradientNaNError:
        """The error for the values the failed check reported. storage(source): the name, shape
        and element shape of the storage (the primal field or ndarray) whose gradient a plan
        source names in the failed launch, or None; without it elements are named by their
        position in the buffer."""
        v = dict(zip(VALUES, values))
        site = int(v["site"])
        o = self.origins[site - 1] if 0 < site <= len(self.origins) else None
        geometry = storage(self.source) if storage is not None else None
        index = element_index(geometry[1], geometry[2], int(v["index"])) if geometry is not None else None
        return GradientNaNError(_message(self, values, storage), kernel=self.kernel, field=self.field, index=index,
                                value=float(v["value"]), op=o.op if o is not None else None,
                                line=(o.loc.line if o is not None and o.loc else None))


def element_index(shape: tuple, element_shape: tuple, linear: int) -> tuple | None:
    """The (element index, component index) of a scalar's linear index in a row-major storage."""
    per = math.prod(element_shape)
    n = math.prod(shape) * per
    if not 0 <= linear < n:
        return None
    el, comp = divmod(linear, per)
    idx = tuple(int(i) for i in _unravel(el, shape))
    return idx + tuple(int(i) for i in _unravel(comp, element_shape))


def element_label(name: str, shape: tuple, element_shape: tuple, linear: int) -> str:
    """"x[3]", "pos[2][0]", "loss[None]" for the scalar at `linear`."""
    full = element_index(shape, element_shape, linear)
    if full is None:
        return f"{name}[scalar #{linear}]"
    el, comp = full[:len(shape)], full[len(shape):]
    text = f"{name}[{', '.join(map(str, el))}]" if el else f"{name}[None]"
    return text + (f"[{', '.join(map(str, comp))}]" if comp else "")


def _unravel(k: int, shape: tuple) -> list:
    out = []
    for n in reversed(shape):
        k, r = divmod(k, n)
        out.append(r)
    return out[::-1]


def _f(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return f"{v:.6g}"


def _finite(*vs) -> bool:
    return all(math.isfinite(v) for v in vs)


# how an op reads in a message, where not by its name
_SHOW = {"div": "/", "mul": "*", "pow": "** (pow)", "mod": "%"}

# the operands' names in messages (default: "its argument", or "its first / second operand")
_ROLES = {"div": ("the dividend", "the divisor"), "mod": ("the dividend", "the divisor"),
          "pow": ("the base", "the exponent"), "atan2": ("y", "x")}


def _singular(o: Origin, x: float, y: float) -> tuple[str, str] | None:
    """(why the derivative is not finite, how to avoid it) at a singular point of o's op."""
    op, k = o.op, o.operand
    if op == "sqrt" and x <= 0:
        if x == 0:
            return ("d/dx sqrt(x) = 1 / (2 sqrt(x)) is infinite at x = 0",
                    "keep the argument above 0: ti.sqrt(ti.max(x, 1e-12)), or for a vector length "
                    "v.norm(eps) (or v.norm_sqr(), which has no square root)")
        return (f"sqrt of the negative number {_f(x)} is NaN", "keep the argument of sqrt non-negative")
    if op == "rsqrt" and x <= 0:
        return (f"rsqrt(x) and its derivative -1 / (2 x^1.5) are not finite at x = {_f(x)}",
                "keep the argument above 0: ti.rsqrt(ti.max(x, 1e-12))")
    if op == "log" and x <= 0:
        why = ("d/dx log(x) = 1 / x is infinite at x = 0 (and log(0) = -inf)" if x == 0
               else f"log of the negative number {_f(x)} is NaN")
        return why, "keep the argument of log above 0: ti.log(ti.max(x, 1e-12)), or log(x + eps)"
    if op in ("div", "mod") and y == 0:
        what = ("d/dx (x / y) = 1 / y and d/dy (x / y) = -x / y^2 are infinite at y = 0 (a division by zero)"
                if op == "div" else "d/dy (x % y) = -floor(x / y) is not finite at y = 0 (a division by zero)")
        return what, ("add a small epsilon to the divisor (x / (y + 1e-10)), or skip the term where y = 0 "
                      "(ti.select(y != 0, x / y, 0.0), or an `if`)")
    if op == "pow":
        if k == 1 and x <= 0:
            return (f"d/dy x**y = x**y log(x) needs log(x), which is not finite for the base x = {_f(x)} <= 0 "
                    f"(a negative or zero base has no derivative with respect to the exponent)",
                    "make the exponent a constant (it is then not differentiated), or use ti.abs(x) ** y, or "
                    "ti.exp(y * ti.log(x)) with x > 0")
        if k == 0 and x == 0 and y < 1:
            return (f"d/dx x**y = y x**(y - 1) is infinite at x = 0 for y = {_f(y)} < 1",
                    "keep the base above 0 (ti.max(x, 1e-12) ** y)")
        if k == 0 and x < 0 and not float(y).is_integer():
            return (f"a negative base x = {_f(x)} to the non-integer power y = {_f(y)} is NaN",
                    "keep the base non-negative, or use an integer exponent")
    if op in ("asin", "acos") and abs(x) >= 1:
        return (f"d/dx {op}(x) = {'-' if op == 'acos' else ''}1 / sqrt(1 - x^2) is not finite at x = {_f(x)} "
                f"(|x| >= 1)", f"clamp the argument into the open interval (-1, 1): "
                f"ti.{op}(ti.min(ti.max(x, -1 + 1e-6), 1 - 1e-6))")
    if op == "log1p" and x <= -1:
        why = ("d/dx log1p(x) = 1 / (1 + x) is infinite at x = -1" if x == -1
               else f"log1p of {_f(x)} < -1 is NaN")
        return why, "keep the argument of log1p above -1"
    if op == "atanh" and abs(x) == 1:
        return (f"d/dx atanh(x) = 1 / (1 - x^2) is infinite at x = {_f(x)}",
                "clamp the argument into the open interval (-1, 1)")
    if op == "acosh" and abs(x) <= 1:
        return (f"d/dx acosh(x) = 1 / sqrt(x^2 - 1) is not finite at x = {_f(x)} (|x| <= 1)",
                "keep the argument of acosh above 1: ti.acosh(ti.max(x, 1 + 1e-6))")
    if op == "atan2" and x == 0 and y == 0:
        return ("the derivatives of atan2(y, x), x / (x^2 + y^2) and -y / (x^2 + y^2), are 0 / 0 at (0, 0)",
                "keep the point away from the origin (add a small epsilon to x^2 + y^2), or skip it with an `if`")
    return None


def _origin_text(o: Origin, vals: dict, storage) -> str:
    """Where the first non-finite adjoint of the thread came from."""
    x, y, r, g, c = (float(vals[k]) for k in ("x", "y", "r", "g", "c"))
    if o.op is None:  # a gradient the adjoint read
        name = _element(storage, o.source, int(vals["at"]), o.field)
        where = f" (read at {_place(o.loc)})" if o.loc else ""
        return (f"It was already {_f(x)} in {name}.grad when the backward pass read it{where}: "
                f"it was set so by hand (the seed of the loss's gradient?) or by the adjoint of a later "
                f"kernel that ran without the check")
    shown = _SHOW.get(o.op, o.op)
    roles = _ROLES.get(o.op, ("its first operand", "its second operand") if o.arity == 2 else ("its argument",))
    at = f"the derivative of {shown} at {_place(o.loc)}"
    operands = [x, y][:o.arity]
    args = (f"the argument is {_f(x)}" if o.arity == 1 else
            f"the operands are {_f(x)} and {_f(y)}")
    if not _finite(*operands):
        role, bad = next((n, v) for n, v in zip(roles, operands) if not math.isfinite(v))
        role = role.split(" ", 1)[1] if role.startswith(("its ", "the ")) else role
        return (f"It starts at {at}, whose {role} is already {_f(bad)} in the forward "
                f"pass ({args}): the {_f(bad)} is in the forward values the adjoint recomputes (an input "
                f"holding {_f(bad)}, or an operation of the forward before this one: log(0), x / 0, sqrt of a "
                f"negative number, an overflow), not made by a derivative. Check the inputs and the forward's "
                f"result (the loss is probably not finite either)")
    zero_inf = " (an infinite derivative times an incoming adjoint of 0: 0 * inf = NaN)" \
        if math.isnan(c) and g == 0 else ""
    sing = _singular(o, x, y)
    if sing is not None:
        why, fix = sing
        passed = (f"is {_f(c)}{zero_inf}" if not math.isfinite(c) else
                  f"is not finite in IEEE arithmetic, though the GPU computed {_f(c)}: a shader compiler may fold a NaN "
                  f"or inf away, and WGSL leaves some of these results undefined; the check found it from the "
                  f"operands")
        return (f"It starts at {at}: {why} (here {args}; incoming adjoint {_f(g)}, so the gradient passed to "
                f"{roles[o.operand]} {passed}).\nFix: {fix}")
    if not math.isfinite(r):
        return (f"It starts at {at}: its value is already {_f(r)} in the forward pass ({args}), so its "
                f"derivative is not finite either (an overflow?). Keep the operation in range")
    if not math.isfinite(g):
        return (f"It starts at {at}: the adjoint arriving there is already {_f(g)}: the adjoints of its "
                f"result summed to more than float32 holds (overflow)")
    if math.isinf(c):
        return (f"It starts at {at}: the incoming adjoint {_f(g)} times the local derivative overflows "
                f"float32 ({args}): scale the loss down")
    return (f"It starts at {at}: its derivative with respect to {roles[o.operand]} is not finite where {args} "
            f"(incoming adjoint {_f(g)}){zero_inf}")


def _place(loc: SourceLoc) -> str:
    return f"line {loc.line}" + (f" of {loc.func}" if loc.func else "")


def _element(storage, source, linear: int, field: str) -> str:
    """"x[3]" for scalar `linear` of the gradient buffer `source` names (see GradCheck.error)."""
    geometry = storage(source) if storage is not None else None
    if geometry is None:
        return f"{field}[scalar #{linear}]"
    name, shape, element_shape = geometry
    return element_label(name or field, shape, element_shape, linear)


def _message(check: GradCheck, values, storage) -> str:
    v = dict(zip(VALUES, values))
    value, site = float(v["value"]), int(v["site"])
    name = _element(storage, check.source, int(v["index"]), check.field)
    why = "checked because of ti.init(debug=True) or ti.ad.Tape(check_nan=True)"
    if math.isfinite(value):  # a derivative's operands were out of its domain (nancheck.py DOMAIN)
        head = (f"a derivative in the backward pass of kernel '{check.kernel}' is not finite ({why}; the backward "
                f"pass stopped before adding {_f(value)} to the gradient of {name}; the gradients are incomplete)")
    else:
        head = (f"the gradient of {name} is {_f(value)}: the backward pass of kernel '{check.kernel}' adds "
                f"{_f(value)} to its gradient ({why}; the other gradients are incomplete)")
    origin = check.origins[site - 1] if 0 < site <= len(check.origins) else None
    if origin is None:
        body = ("No derivative was infinite: finite adjoints summed to more than float32 holds (an overflow; "
                "scale the loss down)")
        loc = check.loc
    else:
        body = _origin_text(origin, v, storage)
        loc = origin.loc or check.loc
    excerpt = f"\n{loc.excerpt()}" if loc is not None else ""
    read = ""
    if check.loc is not None and loc is not check.loc and (loc is None or check.loc.line != loc.line):
        read = f"\n({check.field} is read at {_place(check.loc)}: {check.loc.source_line.strip()})"
    return f"{head}.\n{body}.{excerpt}{read}"
