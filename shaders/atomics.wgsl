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
