// ==== reduction: forward

// wgpu_ad kernel reduction, task 0 (range): reduction_t0

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> loss: array<atomic<u32>>;  // f32 bits, atomics emulated by compare-exchange
var<workgroup> partial_sums0: array<f32, 128>;

fn atomic_add_loss(elem: i32, operand: f32) -> f32 {
    var seen = atomicLoad(&loss[elem]);
    loop {
        let old = bitcast<f32>(seen);
        let desired = bitcast<u32>(old + operand);
        if desired == seen {
            break;  // nothing to write: reading the old value is the whole operation
        }
        let swap = atomicCompareExchangeWeak(&loss[elem], seen, desired);
        if swap.exchanged {
            break;
        }
        seen = swap.old_value;
    }
    return bitcast<f32>(seen);
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wg_id: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let thread_id = ((wg_id.z * n_wg.y + wg_id.y) * n_wg.x + wg_id.x) * 128u + lid;
    let num_threads = n_wg.x * n_wg.y * n_wg.z * 128u;
    // bounds
    var loss_partial: f32 = 0.0f;
    let range_begin = 0i;
    let range_end = 8i;
    let range_count = select(0u, u32(range_end - range_begin), range_end > range_begin);
    // forward: four iterations per step, reading x as vec4
    let quad_count = range_count / 4u;
    for (var quad = thread_id; quad < quad_count; quad += min(num_threads, quad_count - quad)) {
        let x_v = x[quad];
        {
            let x_1 = x_v.x;
            let sq = x_1 * x_1;
            let v0 = loss_partial;
            let v1 = v0 + sq;
            loss_partial = v1;
        }
        {
            let x_2 = x_v.y;
            let sq_1 = x_2 * x_2;
            let v2 = loss_partial;
            let v3 = v2 + sq_1;
            loss_partial = v3;
        }
        {
            let x_3 = x_v.z;
            let sq_2 = x_3 * x_3;
            let v4 = loss_partial;
            let v5 = v4 + sq_2;
            loss_partial = v5;
        }
        {
            let x_4 = x_v.w;
            let sq_3 = x_4 * x_4;
            let v6 = loss_partial;
            let v7 = v6 + sq_3;
            loss_partial = v7;
        }
    }
    // the last range_count % 4 iterations
    let iter = quad_count * 4u + thread_id;
    if iter < range_count {
        let i = range_begin + i32(iter);
        let x_5 = x[u32(i) / 4u][u32(i) % 4u];
        let sq_4 = x_5 * x_5;
        let v8 = loss_partial;
        let v9 = v8 + sq_4;
        loss_partial = v9;
    }
    // epilogue: one atomic per workgroup
    let loss_partial_1 = loss_partial;
    partial_sums0[lid] = loss_partial_1;
    workgroupBarrier();
    for (var step = 64u; step > 0u; step = step >> 1u) {
        if lid < step && lid + step < 128u {
            partial_sums0[lid] = partial_sums0[lid] + partial_sums0[lid + step];
        }
        workgroupBarrier();
    }
    let v10 = partial_sums0[0];
    let v11 = lid == 0u;
    if v11 {
        atomic_add_loss(0i, v10);
    }
}

// ==== reduction: adjoint

// wgpu_ad kernel reduction_grad, task 0 (range): reduction_t0_adj

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> x_grad: array<f32>;
@group(0) @binding(2) var<storage, read> loss_grad: array<f32>;

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wg_id: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let thread_id = ((wg_id.z * n_wg.y + wg_id.y) * n_wg.x + wg_id.x) * 128u + lid;
    let num_threads = n_wg.x * n_wg.y * n_wg.z * 128u;
    // bounds
    let sq_adj = loss_grad[0i];
    let range_begin = 0i;
    let range_end = 8i;
    let range_count = select(0u, u32(range_end - range_begin), range_end > range_begin);
    // adjoint
    for (var iter = thread_id; iter < range_count; iter += min(num_threads, range_count - iter)) {
        let i = range_begin + i32(iter);
        // replay
        let x_1 = x[i];
        // reverse
        let x_adj = sq_adj * x_1;
        let x_adj_1 = x_adj + x_adj;
        let x_grad_1 = x_grad[i];
        let v0 = x_grad_1 + x_adj_1;
        x_grad[i] = v0;
    }
}
