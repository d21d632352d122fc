// ==== scalar_map: forward

// wgpu_ad kernel scalar_map, task 0 (range): scalar_map_t0

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;

// sin x from sincos_f32: WGSL bounds sin only absolutely (2^-11 on [-pi, pi]; SwiftShader's gives
// 0 for sin 1e-30 and 11-17 ulps for cos near 0).
fn sin_f32(x: f32) -> f32 {
    return sincos_f32(x).x;
}

// (sin x, cos x) within a few ulps for |x| <= 8192, WGSL's sin and cos beyond (and NaN for inf and
// NaN). |x| = q pi / 2 + z with |z| <= pi / 4: q from |x| 4 / pi rounded up to even, z by
// subtracting q pi / 2 in four parts (three of 10 bits, whose products are exact here), then the
// minimax polynomials of sin and cos on [-pi / 4, pi / 4] (Cephes' sinf / cosf coefficients), whose
// values swap and change sign by quadrant.
fn sincos_f32(x: f32) -> vec2<f32> {
    let a = abs(x);
    if !(a <= 8192.0f) {
        return vec2<f32>(sin(x), cos(x));
    }
    var j = u32(a * 1.2732395f);
    j = j + (j & 1u);
    let y = f32(j);
    let z = (((a - y * 0.78515625f) - y * 0.00024199486f) + y * 8.1490725e-8f) - y * 3.0385503e-11f;
    let zz = z * z;
    let s = z + z * zz * ((-1.9515296e-4f * zz + 8.3321608e-3f) * zz - 1.6666655e-1f);
    let c = (1.0f - 0.5f * zz) + zz * zz * ((2.4433157e-5f * zz - 1.3887316e-3f) * zz + 4.1666646e-2f);
    let q = (j >> 1u) & 3u;
    let odd = (q & 1u) == 1u;
    var sn = select(s, c, odd);
    var cs = select(c, s, odd);
    if q == 1u || q == 2u {
        cs = -cs;
    }
    if q >= 2u {
        sn = -sn;
    }
    if (bitcast<u32>(x) & 0x80000000u) != 0u {
        sn = -sn;
    }
    return vec2<f32>(sn, cs);
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wg_id: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let thread_id = ((wg_id.z * n_wg.y + wg_id.y) * n_wg.x + wg_id.x) * 128u + lid;
    let num_threads = n_wg.x * n_wg.y * n_wg.z * 128u;
    let range_begin = 0i;
    let range_end = 8i;
    let range_count = select(0u, u32(range_end - range_begin), range_end > range_begin);
    // forward
    for (var iter = thread_id; iter < range_count; iter += min(num_threads, range_count - iter)) {
        let i = range_begin + i32(iter);
        let x_1 = x[i];
        let s = sin_f32(x_1);
        let v0 = s * x_1;
        let v1 = v0 + 2.0f;
        y[i] = v1;
    }
}

// ==== scalar_map: adjoint

// wgpu_ad kernel scalar_map_grad, task 0 (range): scalar_map_t0_adj

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> x_grad: array<f32>;
@group(0) @binding(2) var<storage, read_write> y_grad: array<f32>;

// sin x from sincos_f32: WGSL bounds sin only absolutely (2^-11 on [-pi, pi]; SwiftShader's gives
// 0 for sin 1e-30 and 11-17 ulps for cos near 0).
fn sin_f32(x: f32) -> f32 {
    return sincos_f32(x).x;
}

// cos x from sincos_f32 (see sin_f32).
fn cos_f32(x: f32) -> f32 {
    return sincos_f32(x).y;
}

// (sin x, cos x) within a few ulps for |x| <= 8192, WGSL's sin and cos beyond (and NaN for inf and
// NaN). |x| = q pi / 2 + z with |z| <= pi / 4: q from |x| 4 / pi rounded up to even, z by
// subtracting q pi / 2 in four parts (three of 10 bits, whose products are exact here), then the
// minimax polynomials of sin and cos on [-pi / 4, pi / 4] (Cephes' sinf / cosf coefficients), whose
// values swap and change sign by quadrant.
fn sincos_f32(x: f32) -> vec2<f32> {
    let a = abs(x);
    if !(a <= 8192.0f) {
        return vec2<f32>(sin(x), cos(x));
    }
    var j = u32(a * 1.2732395f);
    j = j + (j & 1u);
    let y = f32(j);
    let z = (((a - y * 0.78515625f) - y * 0.00024199486f) + y * 8.1490725e-8f) - y * 3.0385503e-11f;
    let zz = z * z;
    let s = z + z * zz * ((-1.9515296e-4f * zz + 8.3321608e-3f) * zz - 1.6666655e-1f);
    let c = (1.0f - 0.5f * zz) + zz * zz * ((2.4433157e-5f * zz - 1.3887316e-3f) * zz + 4.1666646e-2f);
    let q = (j >> 1u) & 3u;
    let odd = (q & 1u) == 1u;
    var sn = select(s, c, odd);
    var cs = select(c, s, odd);
    if q == 1u || q == 2u {
        cs = -cs;
    }
    if q >= 2u {
        sn = -sn;
    }
    if (bitcast<u32>(x) & 0x80000000u) != 0u {
        sn = -sn;
    }
    return vec2<f32>(sn, cs);
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wg_id: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let thread_id = ((wg_id.z * n_wg.y + wg_id.y) * n_wg.x + wg_id.x) * 128u + lid;
    let num_threads = n_wg.x * n_wg.y * n_wg.z * 128u;
    let range_begin = 0i;
    let range_end = 8i;
    let range_count = select(0u, u32(range_end - range_begin), range_end > range_begin);
    // adjoint
    for (var iter = thread_id; iter < range_count; iter += min(num_threads, range_count - iter)) {
        let i = range_begin + i32(iter);
        // replay
        let x_1 = x[i];
        let s = sin_f32(x_1);
        // reverse
        let v0 = y_grad[i];
        y_grad[i] = 0.0f;
        let s_adj = v0 * x_1;
        let x_adj = v0 * s;
        let v1 = cos_f32(x_1);
        let v2 = s_adj * v1;
        let x_adj_1 = x_adj + v2;
        let x_grad_1 = x_grad[i];
        let v3 = x_grad_1 + x_adj_1;
        x_grad[i] = v3;
    }
}
