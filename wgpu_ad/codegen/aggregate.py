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
   same in every thread: no two lanes could ever agree, so the check would be pure cost);
3. otherwise (a native atomic<f32>, i32 or u32 add into a thread-dependent element): not.

Why, measured on lavapipe (llvmpipe: a workgroup runs as 8-wide SIMD lanes on one CPU thread,
subgroups are those 8 lanes) with the P2G scatter of benchmarks/workloads/scatter.py (262,144
particles, 27 float adds each into a 128^2 grid), on raw-WGSL variants of its p2g shader:

- A compare-exchange loop is quadratic in the lanes that hit one element: the lanes run in
  lockstep, each iteration only one of them wins, the others retry. Sorted particles (a workgroup
  covers a few cells) made the emulated scatter 2.1-4.1x slower than random ones (438-860 ms
  against 185-221 ms). Summing the subgroup first makes that one compare-exchange per subgroup:
  76-180 ms sorted (3.5-6x faster), at a cost of 1.15-1.27x in random order (236-259 ms), where
  lanes rarely agree and llvmpipe runs the aggregated branch under an empty mask anyway (a one-time
  check per thread for all 27 adds cost the same). On a GPU the check is three subgroup
  instructions beside a global compare-exchange round trip, and a warp of 32 hitting one element
  serialises 32 retries, so the trade is better there.
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

from ..ir.nodes import Stmt, Task, walk
from ..ir.ops import Op
from ..types import f32, i32, u32
from .common import SUBGROUP_KINDS, _thread_uniform


def subgroup_atomics(task: Task, buf_mode: dict[int, str], used: set[int]) -> list[Stmt]:
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
        if id(idx) in uniform or buf_mode.get(id(buf)) == "cas" and not _distinct(idx, task, uniform):
            out.append(s)
    return out


def _distinct(s: Stmt, task: Task, uniform: set[int]) -> bool:
    """s differs between any two threads at the same point: the task's own loop index i, or
    i + b, b + i, i - b, b - i, i * a, a * i of such a value, with b the same in every thread and
    a a nonzero constant (wrap-around would need indices beyond any buffer). False when unsure."""
    if s.op is Op.LOOP_INDEX:
        return s.attr is task
    if s.op in (Op.ADD, Op.SUB) and len(s.args) == 2:
        a, b = s.args
        return (_distinct(a, task, uniform) and id(b) in uniform
                or id(a) in uniform and _distinct(b, task, uniform))
    if s.op is Op.MUL and len(s.args) == 2:
        a, b = s.args
        return (_distinct(a, task, uniform) and b.op is Op.CONST and b.attr != 0
                or a.op is Op.CONST and a.attr != 0 and _distinct(b, task, uniform))
    return False
