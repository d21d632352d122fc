"""NumPy arrays and torch tensors as ndarray arguments (Taichi's "external arrays").

Wherever a kernel declares `ti.types.ndarray()`, a NumPy array or a torch tensor may be passed
instead of a ti.ndarray. For each launch its values are copied to a device copy (a ti.ndarray that
stays with the host array while it lives, so every kernel and a tape see one storage per host
array; when the host array is freed its copy goes back to a pool that later arrays of the same
dtype and shape reuse: no allocation per call in steady state), the kernel runs on it, and the
arguments the kernel writes are copied back into the host array afterwards (the launch waits for
the GPU there). CUDA tensors go through the host
(there is no memory shared between CUDA and WebGPU): correct, but a copy each way.

Gradients: a launch (forward or gradient) gives every float leaf tensor argument with
requires_grad=True and no `.grad` a zero `.grad`, as Taichi does, so that the outputs' `.grad` can be seeded in place
(`y.grad.fill_(1)`); `kernel.grad(...)` reads `t.grad` of the outputs as the seed and accumulates
into `t.grad` of the inputs (the arguments the kernel reads), as Taichi's torch interop does; the
outputs' `.grad` tensors are not written.
Only tensors with requires_grad=True have gradients. Under ti.init(f64="f32"), float64 arrays and
tensors are taken too: computed in float32 and written back (values, gradients) as float64. NumPy arrays carry none: pass a
ti.ndarray(needs_grad=True) or a torch tensor where a gradient is wanted.
"""
from __future__ import annotations

import sys
import warnings
import weakref

import numpy as np

from .. import plan
from ..errors import KernelArgError, TorchGradWarning
from ..session import f64_dtype, generation as _generation
from ..types import MatrixType, VectorType, f32, i32, u32
from ..user_code import warn

_DTYPES = {np.dtype(np.float32): f32, np.dtype(np.int32): i32, np.dtype(np.uint32): u32}
_CONVERT = {"float64": "float32", "int64": "int32", "float16": "float32", "bool": "int32"}


def is_external(v) -> bool:
    """A NumPy array or a torch tensor (torch is not imported to find out)."""
    return isinstance(v, np.ndarray) or _is_torch(v)


def _is_torch(v) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(v, torch.Tensor)


def host_view(v) -> np.ndarray:
    """The values of a host array as a NumPy array (a view for CPU tensors and C-ordered arrays)."""
    if isinstance(v, np.ndarray):
        return v
    return v.detach().cpu().numpy()


def element_shape_of(ann) -> tuple:
    """The element shape an ndarray annotation asks for: the trailing dimensions of a host array."""
    dt = getattr(ann, "dtype", None)
    if isinstance(dt, (VectorType, MatrixType)):
        return tuple(dt.shape)
    return ()


def describe(kernel: str, name: str, v, ann) -> tuple:
    """(dtype, shape, element shape, needs_grad) of a host array passed for argument `name`, or
    KernelArgError naming what is wrong with it."""
    arr = host_view(v)
    dt = _DTYPES.get(arr.dtype)
    if dt is None and arr.dtype == np.float64 and f64_dtype() is f32:  # ti.init(f64="f32"): computed in f32
        dt = f32
    kind = "tensor" if _is_torch(v) else "array"
    a_kind = "a tensor" if kind == "tensor" else "an array"
    if dt is None:
        hint = _CONVERT.get(arr.dtype.name)
        fix = f"; convert it first (e.g. .astype(np.{hint}) or .to(torch.{hint}))" if hint else ""
        raise KernelArgError(f"kernel '{kernel}': argument '{name}' is a {arr.dtype} {kind}; wgpu_ad kernels take "
                             f"float32, int32 or uint32 arrays{fix}")
    es = element_shape_of(ann)
    if es and (len(arr.shape) <= len(es) or tuple(arr.shape[-len(es):]) != es):
        raise KernelArgError(f"kernel '{kernel}': argument '{name}' must end in the element shape {es} of its "
                             f"dtype, got {a_kind} of shape {tuple(arr.shape)}")
    shape = tuple(arr.shape[: len(arr.shape) - len(es)])
    if not shape or any(n < 1 for n in shape):
        raise KernelArgError(f"kernel '{kernel}': argument '{name}' must have at least one element per "
                             f"dimension, got {a_kind} of shape {tuple(arr.shape)}")
    needs_grad = bool(getattr(v, "requires_grad", False)) and dt.is_float
    return dt, shape, es, needs_grad


class Externals:
    """The device copies of host arrays: one per live host array, pooled when it dies."""

    def __init__(self):
        self.live: dict[int, tuple] = {}   # id(host) -> (weakref to host, device copy)
        self.free: dict[tuple, list] = {}  # (dtype, shape, element shape, needs_grad) -> copies

    def device_copy(self, host, dt, shape: tuple, es: tuple, needs_grad: bool, name: str):
        """The device copy of `host` (made, or taken from the pool, on first use)."""
        hit = self.live.get(id(host))
        key = (dt.name, shape, es, needs_grad)
        if hit is not None and hit[0]() is host and hit[2] == key and hit[1]._gen == _generation():
            return hit[1]
        from .ndarray import Ndarray
        spare = self.free.get(key)
        dev = spare.pop() if spare else None
        if dev is None or dev._gen != _generation():
            dev = Ndarray(dt, shape, es, name=name)
            dev.host_copy = True  # its uploads are the launch's own, not the user's writes
            if needs_grad:
                dev._attach_grad()
        hid = id(host)

        def release(_ref, hid=hid, dev=dev, key=key):
            if self.live.get(hid, (None,))[0] is _ref:
                del self.live[hid]
            self.free.setdefault(key, []).append(dev)
        self.live[hid] = (weakref.ref(host, release), dev, key)
        return dev

    def copy_of(self, host):
        """The live device copy of `host`, or None when no launch has taken it."""
        hit = self.live.get(id(host))
        return hit[1] if hit is not None and hit[0]() is host else None

    def to_device(self, kernel, args: tuple, positions: list, with_grads: bool) -> tuple[tuple, list]:
        """args with every host array replaced by its device copy (values uploaded; with_grads:
        the tensors' .grad too, zeros where absent); and the (position, host, device) triples."""
        out, bound = list(args), []
        for pos in positions:
            v = args[pos]
            if not is_external(v):
                continue
            name = kernel.params[pos].name
            dt, shape, es, needs_grad = describe(kernel.__name__, name, v, kernel.anns[pos])
            if needs_grad and (v.is_leaf or v.retains_grad) and v.grad is None:
                _zero_grad(v)  # Taichi's rule: every launch allocates it (a non-leaf's .grad: kernel.grad)
            dev = self.device_copy(v, dt, shape, es, needs_grad, name)
            dev.from_numpy(np.ascontiguousarray(host_view(v)).reshape(shape + es))
            if with_grads and needs_grad:
                g = _grad(v)
                if g is None:
                    dev.grad.fill(0)
                else:
                    dev.grad.from_numpy(np.ascontiguousarray(host_view(g), dtype=np.float32).reshape(shape + es))
            out[pos] = dev
            bound.append((pos, v, dev))
        return tuple(out), bound

    @staticmethod
    def to_host(bound: list, ck, grads: bool, inputs: set | None = None, kernel: str = "") -> None:
        """Copy back what the launch wrote: the arguments (grads=False) or the gradients (True)
        that a task binds writable. With grads, only those of `inputs` (the arguments the forward
        kernel reads): an output's gradient is the seed, which the adjoint consumes (zeroes) on the
        device; the caller's tensor (often torch's own grad_output) is left as it was."""
        kind = plan.ArgGrad if grads else plan.Arg
        written = {ck.plan.buffers[key].arg for _, key, read_only in plan.bound_buffers(ck)
                   if not read_only and isinstance(ck.plan.buffers[key], kind)}
        if grads:
            written &= inputs or set()
        for pos, host, dev in bound:
            if pos not in written:
                continue
            if grads:
                _write_grad(host, dev.grad.to_numpy())
                if _torch_accumulates_too(host):
                    _warn_double_count(kernel, dev.name or "x")
            else:
                _write(host, dev.to_numpy())


def _write(host, values: np.ndarray) -> None:
    if isinstance(host, np.ndarray):
        host[...] = values.reshape(host.shape)
        return
    torch = sys.modules["torch"]
    with torch.no_grad():
        host.copy_(torch.from_numpy(values.reshape(tuple(host.shape))))


def _grad(t):
    """t.grad, without torch's warning for a tensor that is not a leaf: kernel.grad reads and writes
    a non-leaf's .grad on purpose (Taichi's interop: a torch.autograd.Function returns it)."""
    if t.is_leaf or t.retains_grad:
        return t.grad
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return t.grad


def _zero_grad(t) -> None:
    """t.grad = zeros shaped like t (a torch tensor with requires_grad and no .grad yet)."""
    seed_grad(t, 0.0)


def seed_grad(t, value: float) -> None:
    """Set every element of a torch tensor's .grad to value, making the .grad when it has none (a
    torch loss of ti.ad.Tape: its seed)."""
    torch = sys.modules["torch"]
    with torch.no_grad():
        g = _grad(t)
        if g is None:
            t.grad = torch.full_like(t, value)
        else:
            g.fill_(value)


def _write_grad(host, values: np.ndarray) -> None:
    torch = sys.modules["torch"]
    values = torch.from_numpy(values.reshape(tuple(host.shape)))
    with torch.no_grad():
        if _grad(host) is None:
            host.grad = values.to(device=host.device, dtype=host.dtype)
        else:
            host.grad.copy_(values)


def _torch_accumulates_too(t) -> bool:
    """Whether torch's backward pass is running and will accumulate into t.grad itself (t is a
    leaf of the graph it is differentiating)."""
    if not (t.is_leaf and t.requires_grad):
        return False
    torch = sys.modules["torch"]
    try:
        if torch._C._current_graph_task_id() == -1:  # no backward pass running (on this thread)
            return False
        from torch.autograd.graph import get_gradient_edge
        # the leaf's AccumulateGrad node runs in this pass (as torch's register_multi_grad_hook asks)
        return bool(torch._C._will_engine_execute_node(get_gradient_edge(t).node))
    except (AttributeError, RuntimeError):  # another torch: no warning rather than a wrong one
        return False


def _warn_double_count(kernel: str, name: str) -> None:
    warn(f"{kernel}.grad() added the gradient of argument '{name}' into {name}.grad while torch's backward "
         f"pass is running, and {name} is a leaf tensor of that pass, into whose .grad torch accumulates "
         f"too: if the torch.autograd.Function's backward returns {name}.grad, the gradient is counted "
         f"twice. Pass a detached copy instead and return its .grad: "
         f"{name}d = {name}.detach().requires_grad_(); {kernel}.grad({name}d, ...); return {name}d.grad",
         TorchGradWarning)


EXTERNALS = Externals()
