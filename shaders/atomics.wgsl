// Float atomics emulated with a compare-exchange loop on the raw bits of an array<atomic<u32>>.
// WGSL cannot pass a pointer into a storage buffer to a function, so the code generator
// instantiates one helper per (buffer, operation): {{buf}} is the buffer variable and
// {{combine}} the new value computed from `old` and `operand`.
// Comparing bits (not floats) makes the loop end even when the stored value is NaN.

//! snippet cas_f32
fn {{fn_name}}(elem: i32, operand: f32) -> f32 {
    var seen = atomicLoad(&{{buf}}[elem]);
    loop {
        let old = bitcast<f32>(seen);
        let desired = bitcast<u32>({{combine}});
        if desired == seen {
            break;  // nothing to write: reading the old value is the whole operation
        }
        let swap = atomicCompareExchangeWeak(&{{buf}}[elem], seen, desired);
        if swap.exchanged {
            break;
        }
        seen = swap.old_value;
    }
    return bitcast<f32>(seen);
}

//! snippet subgroup_add
// An atomic add with one atomic per subgroup when every active invocation of the subgroup adds
// to the same element (sums into a few addresses: the gradient of a value all threads read, the
// inner loop of a pair sum; emulated float adds of a sorted scatter), one per invocation
// otherwise (codegen/aggregate.py says where it is used). The subgroup sums in registers first;
// the invocation with the lowest `lid` among those present does the atomic.
fn {{fn_name}}(elem: i32, operand: {{dtype}}, lid: u32) {
    let first = subgroupBroadcastFirst(elem);
    var slot = elem;
    var amount = operand;
    var leader = true;
    if subgroupAll(elem == first) {
        slot = first;
        amount = subgroupAdd(operand);
        leader = lid == subgroupBroadcastFirst(lid);
    }
    if leader {
        {{apply}};
    }
}
