"""Which atomic adds are aggregated per subgroup before they reach memory (shaders/atomics.wgsl
subgroup_add: when every active invocation of a subgroup adds to the same element, the subgroup
sums in registers and one invocation does the atomic; otherwise each does its own).

The rule, for an add or sub whose old value is unused, in the body of a range task, on a device
with subgroup operations:

1. the element is the same in every thread (common._thread_uniform: a constant, an argument, the
   j of a pair sum's inner loop): aggregated, whatever the atomic;
2. the buffer's float atomics are compare-exchange loops (no `shader-float32-atomic`, or
   `ti.init(force_emulated_atomics=True)`): aggregated, unless the element is provably different
   in every thread (the parallel loop's index i, or a*i + b with a a nonzero constant and b the
   same in every thread; for a multi-dimensional loop, each of its indices so in a dimension of
   the field's index of its own, as in a stencil's x.grad[i + 1, j - 1] += ...: no two lanes
   could ever agree, so the check would be pure cost);
3. otherwise (a native atomic<f32>, i32 or u32 add into a thread-dependent element): not.

Why, measured on lavapipe (llvmpipe: a workgroup runs as 8-wide SIMD lanes on one CPU thread,
subgroups are those 8 lanes) with the P2G scatter of benchmarks/workloads/scatter.py (262,144
particles, 27 float adds each into a 128^2 grid), on raw-WGSL variants of its p2g shader:

- A compare-exchange loop is quadratic in the lanes that hit one element: the lanes run in
  lockstep, each iteration only one of them wins, the others retry. Sorted particles (a workgroup
  covers a few cells) made the emulated scatter 2.1-4.1x slower than random ones (438-860 ms
  against 185-221 ms). Summing the subgroup first makes that one compare-exchange per subgroup:
  76-180 ms sorted (3.5-6x faster), at a cost of 1.15-1.27x in random order (236-259 ms), where
  lanes rarely agree and llvmpipe's subgroup operations, loops over the lanes, make the check
  itself the cost (the check alone cost as much; one check per thread for all 27 adds, and a
  loop instead of an `if` around the aggregated path, cost the same). In the whole benchmark
  (benchmarks/RESULTS.md) the sorted case's emulated forward got 3.8x faster and the random
  one's change was within the noise. On a GPU the check is three subgroup instructions beside a
  global compare-exchange round trip, and a warp of 32 hitting one element serialises 32
  retries, so the trade is better there.
- A native atomic add gains nothing: the hardware (or llvmpipe's lock-prefixed instruction per
  lane) settles lanes on one address without retries. The helper made it slower in both orders
  (random 89-97 ms against 44-54; sorted 56-86 against 28-51).
- Workgroup-memory aggregation (a per-workgroup hash table keyed by the element, atomic<u32>
  keys, one global atomic per touched slot after a barrier) was measured and not built: naga
  rejects atomic<f32> in workgroup memory, so the table's values are compare-exchange loops on
  u32 bits with the same lockstep retries in workgroup memory (sorted 735-1142 ms, worse than
  the global loop), and random order touches ~1150 elements per buffer per workgroup of 128,
  which does not fit WebGPU's default 16 KiB of workgroup storage (the table overflowed: 970-1236
  ms). llvmpipe scalarises every lane's memory access, atomic or not (a racy non-atomic `+=` took
  71-80 ms, more than the native atomic), so no scheme that touches memory per lane beats the
  native add there.

Not measured here (no GPU on this machine): native adds of a sorted scatter on a GPU, where the
adds of a whole warp to one node serialise in the L2's atomic unit and MPM codes sum per warp
first (rule 3 could then depend on the adapter: the runtime knows a CPU one, `Runtime.is_cpu`).
"""
from __future__ import annotations

from ..ir.nodes import Kernel, Stmt, Task, walk
from ..ir.ops import Op
from ..types import f32, i32, u32
from .common import SUBGROUP_KINDS, _thread_uniform
from .ops_table import ALU


def subgroup_atomics(kernel: Kernel, task: Task, buf_mode: dict[int, str], used: set[int]) -> list[Stmt]:
    """The ATOMIC statements of a range task's body that go through the subgroup helper; buf_mode:
    id(buffer) -> 'plain' | 'atomic' | 'cas' (common.BufferUse.mode); used: ids of the statements
    whose value something reads. (The epilogue's atomics are one per workgroup already.)"""
    uniform = _thread_uniform(task)
    out = []
    for s in walk(task.body):
        if s.op is not Op.ATOMIC or s.attr[0] not in SUBGROUP_KINDS or id(s) in used:
            continue
        buf, idx = s.attr[1], s.args[0]
        if buf.dtype not in (f32, i32, u32):
            continue
        if id(idx) in uniform or buf_mode.get(id(buf)) == "cas" and not _one_per_thread(s, kernel, task):
            out.append(s)
    return out


def _one_per_thread(s: Stmt, kernel: Kernel, task: Task) -> bool:
    """The element of atomic s is different in every thread of the task (at the same point of its
    serial loops). False when unsure: that only costs the subgroup check."""
    if _along(s.args[0], lambda x: x.op is Op.LOOP_INDEX and x.attr is task):
        return True
    # the multi-index (the original statements, also in a clone: ir/clone.py) against the task's
    # parallel dimensions (Kernel.loop_dims): each alone in an index dimension of its own
    dims = sorted({d for t, d in kernel.loop_dims.values() if t is task})
    if not dims or not s.index:
        return False
    free = [x for x in s.index if isinstance(x, Stmt)]
    for d in dims:
        hit = next((x for x in free if _along(x, lambda v, d=d: kernel.loop_dims.get(v) == (task, d))), None)
        if hit is None:
            return False
        free.remove(hit)
    return True


def _along(s: Stmt, is_dim) -> bool:
    """s is a*v + b where is_dim(v), a is a nonzero constant and b is the same in every thread
    (wrap-around would need indices beyond any buffer)."""
    if is_dim(s):
        return True
    if s.op in (Op.ADD, Op.SUB) and len(s.args) == 2:
        a, b = s.args
        return _along(a, is_dim) and _same(b) or _same(a) and _along(b, is_dim)
    if s.op is Op.MUL and len(s.args) == 2:
        a, b = s.args
        return (_along(a, is_dim) and b.op is Op.CONST and b.attr != 0
                or a.op is Op.CONST and a.attr != 0 and _along(b, is_dim))
    return False


def _same(s: Stmt, depth: int = 0) -> bool:
    """s is the same in every thread: constants, arguments and arithmetic on them."""
    if s.op in (Op.CONST, Op.ARG):
        return True
    return depth < 8 and s.op in ALU and bool(s.args) and all(_same(a, depth + 1) for a in s.args)
