"""Run a compiled kernel's IR with the NumPy reference interpreter, for an independent answer."""
import numpy as np

from wgpu_ad.ir.interpreter import run_kernel


def run_on_reference(kernel, *args):
    """Execute `kernel(*args)` on the CPU interpreter against copies of its fields' current data.

    Returns ({field: array after the run}, return value); the fields themselves are not changed."""
    c, specs, _rt = kernel._get(args)
    ir = c.ir
    arrays = []
    for buf in ir.buffers:
        src = buf.source
        if isinstance(src, tuple):
            obj = args[[s.name for s in specs].index(src[1])]
            obj = obj.grad if src[0] == "arg_grad" else obj
        else:
            obj = src
        arrays.append((obj, obj.to_numpy().reshape(-1).astype(buf.dtype.np).copy()))
    vals = c.pack.unpack(c.pack(args, _FakeRt())) if ir.args else ()
    ret = run_kernel(ir, [a for _, a in arrays], list(vals))
    out = {}
    for obj, a in arrays:
        out[id(obj)] = a.reshape(tuple(obj.shape) + tuple(obj.element_shape))
    return out, ret


class _FakeRt:
    def next_seed(self):
        return 1234
