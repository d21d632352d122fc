"""Run a compiled kernel's IR with the NumPy reference interpreter, for an independent answer."""
import numpy as np

from wgpu_ad import plan
from wgpu_ad.ir.interpreter import run_kernel


def run_on_reference(kernel, *args):
    """Execute `kernel(*args)` on the CPU interpreter against copies of its fields' current data.

    Returns ({field: array after the run}, return value); the fields themselves are not changed."""
    lc, specs, _rt = kernel._get(args)
    ir = lc.ir
    arrays = []
    for buf, src, get in zip(ir.buffers, lc.plan.buffers, lc.storage):
        if isinstance(src, plan.Scratch):  # a kernel-scope reduction's hidden sum: not returned
            arrays.append((None, np.zeros(src.count, buf.dtype.np)))
            continue
        obj = get(args)
        arrays.append((obj, obj.to_numpy().reshape(-1).astype(buf.dtype.np).copy()))
    vals = lc.pack.unpack(lc.pack(args, _FakeRt())) if ir.args else ()
    # the words code generation adds after the kernel's own (a print tag) are not the IR's
    ret = run_kernel(ir, [a for _, a in arrays], list(vals)[:len(ir.args)])
    out = {}
    for obj, a in arrays:
        if obj is None:
            continue
        out[id(obj)] = a.reshape(tuple(obj.shape) + tuple(obj.element_shape))
    return out, ret


class _FakeRt:
    def next_seed(self):
        return 1234

    def print_tag(self, kernel, prints, record_words):
        return 0
