// sum x^2: GROUPS workgroups grid-stride over x, each thread sums into a register, then one
// tree per workgroup writes partials[wg] (finished by sum_partials.wgsl). `sum_sq_grad` also
// writes dloss/dx = 2x in the same pass (seed 1).

const N: u32 = {{N}}u;
const WG: u32 = {{WG}}u;
const STRIDE: u32 = {{GROUPS}}u * {{WG}}u;

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> partials: array<f32>;
@group(0) @binding(2) var<storage, read_write> grad: array<f32>;

var<workgroup> sums: array<f32, WG>;

fn finish(lid: u32, wg: u32, v: f32) {
    sums[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if lid < s {
            sums[lid] += sums[lid + s];
        }
        workgroupBarrier();
    }
    if lid == 0u {
        partials[wg] = sums[0];
    }
}

@compute @workgroup_size(WG)
fn sum_sq(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
          @builtin(workgroup_id) wid: vec3<u32>) {
    var acc = 0.0;
    for (var k = gid.x; k < N; k += STRIDE) {
        let v = x[k];
        acc += v * v;
    }
    finish(lid, wid.x, acc);
}

@compute @workgroup_size(WG)
fn sum_sq_grad(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
               @builtin(workgroup_id) wid: vec3<u32>) {
    var acc = 0.0;
    for (var k = gid.x; k < N; k += STRIDE) {
        let v = x[k];
        acc += v * v;
        grad[k] = 2.0 * v;
    }
    finish(lid, wid.x, acc);
}
