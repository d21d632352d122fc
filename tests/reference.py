"""Run a compiled kernel's IR with the NumPy reference interpreter, for an independent answer."""
import numpy as np

from wgpu_ad import plan
from wgpu_ad.ir.interpreter import run_kernel
from wgpu_ad.ir.ops import Op


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


def _trunc_div(a, b):
    q = np.abs(a.astype(np.int64)) // np.abs(b.astype(np.int64))
    return (np.sign(a.astype(np.int64)) * np.sign(b.astype(np.int64)) * q).astype(a.dtype)


# the meaning of every ALU op on NumPy arrays, written independently of the IR's semantics table and
# of the WGSL one (tests/test_codegen_ops.py runs every op on the adapter against it)
NUMPY_REF = {
    Op.NEG: np.negative, Op.ABS: np.abs, Op.SIGN: np.sign, Op.SIN: np.sin, Op.COS: np.cos,
    Op.TAN: np.tan, Op.ASIN: np.arcsin, Op.ACOS: np.arccos, Op.ATAN: np.arctan, Op.TANH: np.tanh,
    Op.EXP: np.exp, Op.LOG: np.log, Op.SQRT: np.sqrt, Op.RSQRT: lambda a: 1 / np.sqrt(a),
    Op.ASINH: np.arcsinh, Op.ACOSH: np.arccosh, Op.ATANH: np.arctanh, Op.LOG1P: np.log1p, Op.EXPM1: np.expm1,
    Op.FLOOR: np.floor, Op.CEIL: np.ceil, Op.ROUND: np.round, Op.BIT_NOT: np.invert,
    Op.NOT: np.logical_not,
    Op.ADD: np.add, Op.SUB: np.subtract, Op.MUL: np.multiply,
    Op.DIV: lambda a, b: a / b if a.dtype.kind == "f" else (_trunc_div(a, b) if a.dtype == np.int32 else a // b),
    Op.FLOORDIV: np.floor_divide, Op.MOD: np.mod, Op.POW: np.power, Op.ATAN2: np.arctan2,
    Op.MIN: np.minimum, Op.MAX: np.maximum, Op.BIT_AND: np.bitwise_and, Op.BIT_OR: np.bitwise_or,
    Op.BIT_XOR: np.bitwise_xor, Op.SHL: np.left_shift, Op.SHR: np.right_shift,
    Op.AND: np.logical_and, Op.OR: np.logical_or,
    Op.LT: np.less, Op.LE: np.less_equal, Op.GT: np.greater, Op.GE: np.greater_equal,
    Op.EQ: np.equal, Op.NE: np.not_equal, Op.SELECT: np.where,
}


def numpy_ref(op: Op):
    """NUMPY_REF[op], or an error naming the op and the table to add it to."""
    try:
        return NUMPY_REF[op]
    except KeyError:
        raise KeyError(f"Op.{op.name} has no NumPy reference: add it to NUMPY_REF in tests/reference.py") from None
