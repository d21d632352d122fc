"""wgpu_ad kernels as PyTorch autograd functions (`import wgpu_ad.torch`; torch is optional).

    @ti.kernel
    def scale(x: ti.types.ndarray(), y: ti.types.ndarray()):
        for i in x:
            y[i] = 3 * x[i] ** 2

    f = wgpu_ad.torch.function(scale, outputs={"y": "x"})   # y: zeros shaped like x
    y = f(x)                                               # x: a torch tensor
    y.sum().backward()                                     # x.grad = 6 x

`function(fn, outputs)` takes a @ti.kernel, or a Python function that launches kernels, whose
tensor arguments are `ti.types.ndarray()` arguments of the kernels (annotate a Python function's
arguments of vector or matrix elements, e.g. `p: ti.types.ndarray(dtype=ti.math.vec2)`, so that the
tensor's trailing dimension becomes the elements' components). `outputs` names the arguments
fn writes and says how to make each: the name of an input to copy the shape of, a shape tuple, or a
callable given the inputs (by name) that returns a shape. The returned function takes the other
arguments (tensors, Python numbers, fields), in fn's order; it returns the outputs as float32
tensors (one, or a tuple in the order of `outputs`). Its backward pass runs the recorded kernels'
adjoints (ti.ad.Tape) and returns the gradients of the inputs that require them.

Tensors are copied to device ndarrays for the call and the outputs back (CUDA tensors through the
host); the ndarrays are reused by later calls once torch drops the call's graph.
"""
from __future__ import annotations

import inspect
import weakref
from typing import Callable

import numpy as np
import torch

from .errors import WgpuAdError
from .lang.external import describe, element_shape_of
from .lang.ndarray import Ndarray
from .types import f32


def function(fn: Callable, outputs: dict, fields: dict | None = None) -> Callable:
    """fn as a torch autograd function; see the module docstring. fields: {name: field} of the
    fields fn's kernels read whose values come from torch (a parameter an optimiser updates): each
    is one more input of the returned function, by that name, after fn's own."""
    return _Bridge(fn, outputs, fields or {})


def parameter(field) -> "torch.nn.Parameter":
    """A torch Parameter holding a copy of a field's values: pass it to a function(...,
    fields={name: field}) as `name=` and to a torch optimiser; its .grad is the field's gradient."""
    return torch.nn.Parameter(torch.from_numpy(np.array(field.to_numpy(), dtype=np.float32)))


class _Bridge:
    def __init__(self, fn: Callable, outputs: dict, fields: dict):
        self.fn = fn
        self.name = getattr(fn, "__name__", "function")
        kernel_params = getattr(fn, "params", None)
        params = kernel_params if kernel_params is not None else list(inspect.signature(fn).parameters.values())
        self.names = [p.name for p in params]
        # a kernel's annotations; a Python function's own, where it has them (ti.types.ndarray(dtype=
        # ti.math.vec2) makes the trailing dimension of a tensor its elements' components)
        self.anns = list(getattr(fn, "anns", None) or _annotations(fn, params))
        if not isinstance(outputs, dict) or not outputs:
            raise WgpuAdError(f"wgpu_ad.torch.function({self.name}): outputs must be a dict naming the arguments it "
                              f"writes, e.g. outputs={{'y': 'x'}} (y shaped like x)")
        for out in outputs:
            if out not in self.names:
                raise WgpuAdError(f"wgpu_ad.torch.function({self.name}): output '{out}' is not an argument of "
                                  f"{self.name} ({', '.join(self.names)})")
        self.outputs = dict(outputs)
        for n, fld in fields.items():
            if n in self.names:
                raise WgpuAdError(f"wgpu_ad.torch.function({self.name}): field input '{n}' has the name of an "
                                  f"argument of {self.name}; name it differently")
            if not getattr(fld, "is_field", False):
                raise WgpuAdError(f"wgpu_ad.torch.function({self.name}): fields['{n}'] must be a field, got "
                                  f"{type(fld).__name__}")
        self.fields = dict(fields)
        self.inputs = [n for n in self.names if n not in self.outputs] + list(self.fields)
        self.pool: dict = {}

        bridge = self

        class _Function(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *inputs):
                return bridge._forward(ctx, inputs)

            @staticmethod
            def backward(ctx, *grad_outputs):
                return bridge._backward(ctx, grad_outputs)

        self._apply = _Function.apply

    def __call__(self, *args, **kwargs):
        if len(args) > len(self.inputs):
            raise WgpuAdError(f"{self.name} takes {len(self.inputs)} input(s) ({', '.join(self.inputs)}), "
                              f"got {len(args)}")
        bound = dict(zip(self.inputs, args))
        for k, v in kwargs.items():
            if k not in self.inputs or k in bound:
                raise WgpuAdError(f"{self.name}: unexpected or repeated argument '{k}'")
            bound[k] = v
        missing = [n for n in self.inputs if n not in bound]
        if missing:
            raise WgpuAdError(f"{self.name}: missing input(s) {', '.join(missing)}")
        return self._apply(*(bound[n] for n in self.inputs))

    # ---- device ndarrays ---------------------------------------------------------------------
    def _ndarray(self, dt, shape, es, needs_grad) -> Ndarray:
        spare = self.pool.get((dt.name, shape, es, needs_grad))
        if spare:
            return spare.pop()
        nd = Ndarray(dt, shape, es)
        if needs_grad:
            nd._attach_grad()
        return nd

    def _release(self, nds) -> None:
        for nd in nds:
            self.pool.setdefault((nd.dtype.name, nd.shape, nd.element_shape, nd.needs_grad), []).append(nd)

    def _shape_of(self, name: str, spec, inputs: dict) -> tuple:
        if isinstance(spec, str):
            if spec not in inputs or not isinstance(inputs[spec], torch.Tensor):
                raise WgpuAdError(f"{self.name}: output '{name}' is shaped like '{spec}', which is not a tensor input")
            return tuple(inputs[spec].shape)
        if callable(spec):
            return tuple(spec(**inputs))
        return tuple(spec) if isinstance(spec, (tuple, list)) else (int(spec),)

    # ---- the autograd function ---------------------------------------------------------------
    def _forward(self, ctx, inputs: tuple):
        from .ad.tape import Tape
        by_name = dict(zip(self.inputs, inputs))
        call, nds, grads_in, field_values = {}, [], [], []
        for n in self.inputs:
            v = by_name[n]
            if n in self.fields:
                values, fld = self._field_in(n, v)
                field_values.append((self.fields[n], values))
                grads_in.append(fld)
            elif isinstance(v, torch.Tensor):
                ann = self.anns[self.names.index(n)]
                dt, shape, es, needs_grad = describe(self.name, n, v, ann)
                nd = self._ndarray(dt, shape, es, needs_grad)
                nd.from_numpy(np.ascontiguousarray(v.detach().cpu().numpy()).reshape(shape + es))
                call[n] = nd
                nds.append(nd)
                grads_in.append(nd if needs_grad else None)
            else:
                call[n] = v
                grads_in.append(None)
        outs = []
        for n, spec in self.outputs.items():
            full = self._shape_of(n, spec, by_name)
            es = element_shape_of(self.anns[self.names.index(n)])
            shape = full[: len(full) - len(es)] if es else full
            nd = self._ndarray(f32, shape, es, True)
            nd.fill(0)
            call[n] = nd
            nds.append(nd)
            outs.append(nd)
        tape = Tape(clear_gradients=False)
        with tape:
            self.fn(*(call[n] for n in self.names if n not in self.fields))
        device = next((v.device for v in inputs if isinstance(v, torch.Tensor)), torch.device("cpu"))
        results = [torch.from_numpy(nd.to_numpy().reshape(self._shape_of(n, s, by_name))).to(device)
                   for nd, (n, s) in zip(outs, self.outputs.items())]
        if any(g is not None for g in grads_in):
            ctx.state = (tape, outs, grads_in, field_values, nds,
                         [tuple(v.shape) if isinstance(v, torch.Tensor) else None for v in inputs], device,
                         self._keep_written(tape, nds))
            # the ndarrays hold this call's values until torch drops the graph
            weakref.finalize(ctx, self._release, nds)
        else:
            self._release(nds)
        return results[0] if len(results) == 1 else tuple(results)

    def _field_in(self, name: str, v):
        """Copy a field input's tensor into the field: (the values copied, the field when its
        gradient is wanted or else None)."""
        fld = self.fields[name]
        if not isinstance(v, torch.Tensor):
            raise WgpuAdError(f"{self.name}: field input '{name}' must be a tensor (e.g. wgpu_ad.torch.parameter"
                              f"(field)), got {type(v).__name__}")
        want = tuple(fld.shape) + tuple(fld.element_shape)
        if tuple(v.shape) != want:
            raise WgpuAdError(f"{self.name}: field input '{name}' must have shape {want}, got {tuple(v.shape)}")
        values = np.array(v.detach().cpu().numpy(), dtype=np.float32)  # a copy: the backward pass reloads it
        fld.from_numpy(values)
        if not v.requires_grad:
            return values, None
        if not fld.needs_grad:
            raise WgpuAdError(f"{self.name}: field input '{name}' requires a gradient, but its field has none: "
                              f"create it with needs_grad=True")
        return values, fld

    @staticmethod
    def _keep_written(tape, nds: list) -> list:
        """(field, its version, a device copy of its values) for every field the call's launches
        wrote: a later call of the graph (or any launch) may overwrite it before this call's backward
        pass, whose adjoints read the values this forward pass left there."""
        own = {id(nd) for nd in nds}
        written: dict = {}
        for kernel, args in (la for entry in tape.entries for la in entry.launches()):
            accessed = getattr(kernel, "accessed", None)  # (the kernels a grad_replaced function launched too)
            if accessed is None:
                continue
            for st in accessed(*args)[1]:
                if getattr(st, "is_field", False) and not st.is_grad and id(st) not in own:
                    written[id(st)] = st
        kept = []
        for st in written.values():
            copy = Ndarray(st.dtype, st.shape, st.element_shape, name=f"{st.name or 'field'}_kept")
            copy._copy_from(st)
            kept.append((st, st.version, copy))
        return kept

    def _backward(self, ctx, grad_outputs: tuple):
        tape, outs, grads_in, field_values, nds, shapes, device, kept = ctx.state
        # a field input may be shared by several calls of one graph (a rollout): each call's adjoint
        # needs the values its forward pass copied in, and a zero gradient to accumulate into
        for fld, values in field_values:
            fld.from_numpy(values)
        # fields the call wrote and something overwrote since (the next call of a rollout): this
        # call's values go back for its adjoints, and the newer ones after them
        newer = []
        for fld, version, copy in kept:
            if fld.version != version:
                now = Ndarray(fld.dtype, fld.shape, fld.element_shape, name=f"{fld.name or 'field'}_now")
                now._copy_from(fld)
                newer.append((fld, now))
                fld._copy_from(copy)
        for nd in grads_in:
            if nd is not None:
                nd.grad.fill(0)
        for nd, g in zip(outs, grad_outputs):
            if g is None:
                nd.grad.fill(0)
            else:
                nd.grad.from_numpy(np.ascontiguousarray(g.detach().cpu().numpy(), dtype=np.float32)
                                   .reshape(nd.shape + nd.element_shape))
        if tape.gradient_evaluated:  # another backward pass of the same forward pass
            tape.grad_again()
        else:
            tape.grad()
        for fld, now in newer:
            fld._copy_from(now)
        result = tuple(None if nd is None else torch.from_numpy(
            np.ascontiguousarray(nd.grad.to_numpy()).reshape(shape)).to(device) for nd, shape in zip(grads_in, shapes))
        return result


def _annotations(fn, params) -> list:
    """A Python function's parameter annotations (strings evaluated), None where it has none."""
    try:
        got = inspect.get_annotations(fn, eval_str=True)
    except Exception as e:
        raise WgpuAdError(f"wgpu_ad.torch.function({fn.__name__}): cannot evaluate its annotations: {e}") from None
    return [got.get(p.name) for p in params]


__all__ = ["function", "parameter"]
