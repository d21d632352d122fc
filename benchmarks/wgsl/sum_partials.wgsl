// The second pass of every reduction: one workgroup sums partials[0..COUNT) into out[0].
// Deterministic, and accurate (a tree, not a chain of float atomics).

const COUNT: u32 = {{COUNT}}u;
const WG: u32 = 256u;

@group(0) @binding(0) var<storage, read> partials: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;

var<workgroup> sums: array<f32, WG>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32) {
    var acc = 0.0;
    for (var k = lid; k < COUNT; k += WG) {
        acc += partials[k];
    }
    sums[lid] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if lid < s {
            sums[lid] += sums[lid + s];
        }
        workgroupBarrier();
    }
    if lid == 0u {
        out[0] = sums[0];
    }
}
