// Gravity energy U = sum_ij -1/sqrt(|xi - xj|^2 + EPS) and its gradient, one thread per i.
// `energy`: per-workgroup partial sums of U (finished by sum_partials.wgsl).
// `energy_grad`: the same partial sums and dU/dxi = 2 sum_j (xi - xj) / (|xi - xj|^2 + EPS)^1.5
// (the (i, j) and (j, i) terms), gathered per thread: no atomics.

const N: u32 = {{N}}u;
const WG: u32 = {{WG}}u;
const EPS: f32 = {{EPS}};

@group(0) @binding(0) var<storage, read> pos: array<vec2<f32>>;
@group(0) @binding(1) var<storage, read_write> partials: array<f32>;
@group(0) @binding(2) var<storage, read_write> grad: array<vec2<f32>>;

var<workgroup> sums: array<f32, WG>;

fn workgroup_sum(lid: u32, v: f32) -> f32 {
    sums[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if lid < s {
            sums[lid] += sums[lid + s];
        }
        workgroupBarrier();
    }
    return sums[0];
}

@compute @workgroup_size(WG)
fn energy(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
          @builtin(workgroup_id) wid: vec3<u32>) {
    let i = gid.x;
    var e = 0.0;
    if i < N {
        let xi = pos[i];
        for (var j = 0u; j < N; j++) {
            let d = xi - pos[j];
            e -= inverseSqrt(dot(d, d) + EPS);
        }
    }
    let s = workgroup_sum(lid, e);
    if lid == 0u {
        partials[wid.x] = s;
    }
}

@compute @workgroup_size(WG)
fn energy_grad(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
               @builtin(workgroup_id) wid: vec3<u32>) {
    let i = gid.x;
    var e = 0.0;
    if i < N {
        let xi = pos[i];
        var g = vec2<f32>(0.0, 0.0);
        for (var j = 0u; j < N; j++) {
            let d = xi - pos[j];
            let inv = inverseSqrt(dot(d, d) + EPS);
            e -= inv;
            g += d * (inv * inv * inv);
        }
        grad[i] = 2.0 * g;
    }
    let s = workgroup_sum(lid, e);
    if lid == 0u {
        partials[wid.x] = s;
    }
}
