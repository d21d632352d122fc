// ==== scalar_map: forward

// wgpu_ad kernel scalar_map, task 0 (range): scalar_map_t0

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;

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
        let s = sin(x_1);
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
        let s = sin(x_1);
        // reverse
        let v0 = y_grad[i];
        y_grad[i] = 0.0f;
        let s_adj = v0 * x_1;
        let x_adj = v0 * s;
        let v1 = cos(x_1);
        let v2 = s_adj * v1;
        let x_adj_1 = x_adj + v2;
        let x_grad_1 = x_grad[i];
        let v3 = x_grad_1 + x_adj_1;
        x_grad[i] = v3;
    }
}
