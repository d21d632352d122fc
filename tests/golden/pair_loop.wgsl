// ==== pair_loop: forward

// wgpu_ad kernel pair_loop, task 0 (range): pair_loop_t0

@group(0) @binding(0) var<storage, read> pos: array<vec2<f32>>;
@group(0) @binding(1) var<storage, read_write> energy: array<atomic<u32>>;  // f32 bits, atomics emulated by compare-exchange
var<workgroup> partial_sums0: array<f32, 128>;

fn atomic_add_energy(elem: i32, operand: f32) -> f32 {
    var seen = atomicLoad(&energy[elem]);
    loop {
        let old = bitcast<f32>(seen);
        let desired = bitcast<u32>(old + operand);
        if desired == seen {
            break;  // nothing to write: reading the old value is the whole operation
        }
        let swap = atomicCompareExchangeWeak(&energy[elem], seen, desired);
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
    var energy_partial: f32 = 0.0f;
    let range_begin = 0i;
    let range_end = 8i;
    let range_count = select(0u, u32(range_end - range_begin), range_end > range_begin);
    // forward
    for (var iter = thread_id; iter < range_count; iter += min(num_threads, range_count - iter)) {
        let i = range_begin + i32(iter);
        let pos_v = pos[i];
        let pos_x = pos_v.x;
        let pos_y = pos_v.y;
        for (var j: i32 = 0i; j < 8i; j += 1i) {
            let pos_v_1 = pos[j];
            let pos_x_1 = pos_v_1.x;
            let pos_y_1 = pos_v_1.y;
            let r_x = pos_x - pos_x_1;
            let r_y = pos_y - pos_y_1;
            let v0 = r_x * r_x;
            let v1 = r_y * r_y;
            let v2 = v0 + v1;
            let v3 = v2 + 0.001f;
            let v4 = sqrt(v3);
            let v5 = (-1.0f) / v4;
            let v6 = energy_partial;
            let v7 = v6 + v5;
            energy_partial = v7;
        }
    }
    // epilogue: one atomic per workgroup
    let energy_partial_1 = energy_partial;
    partial_sums0[lid] = energy_partial_1;
    workgroupBarrier();
    for (var step = 64u; step > 0u; step = step >> 1u) {
        if lid < step && lid + step < 128u {
            partial_sums0[lid] = partial_sums0[lid] + partial_sums0[lid + step];
        }
        workgroupBarrier();
    }
    let v8 = partial_sums0[0];
    let v9 = lid == 0u;
    if v9 {
        atomic_add_energy(0i, v8);
    }
}

// ==== pair_loop: adjoint

// wgpu_ad kernel pair_loop_grad, task 0 (range): pair_loop_t0_adj

@group(0) @binding(0) var<storage, read> pos: array<vec2<f32>>;
@group(0) @binding(1) var<storage, read_write> pos_grad: array<atomic<u32>>;  // f32 bits, atomics emulated by compare-exchange
@group(0) @binding(2) var<storage, read> energy_grad: array<f32>;

fn atomic_add_pos_grad(elem: i32, operand: f32) -> f32 {
    var seen = atomicLoad(&pos_grad[elem]);
    loop {
        let old = bitcast<f32>(seen);
        let desired = bitcast<u32>(old + operand);
        if desired == seen {
            break;  // nothing to write: reading the old value is the whole operation
        }
        let swap = atomicCompareExchangeWeak(&pos_grad[elem], seen, desired);
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
    let v0 = energy_grad[0i];
    let v1 = v0 != 0.0f;
    let range_begin = 0i;
    let range_end = 8i;
    let range_count = select(0u, u32(range_end - range_begin), range_end > range_begin);
    // adjoint
    for (var iter = thread_id; iter < range_count; iter += min(num_threads, range_count - iter)) {
        let i = range_begin + i32(iter);
        // replay
        let v2 = i * 2i;
        let v3 = v2 + 1i;
        let pos_v = pos[i];
        let pos_x = pos_v.x;
        let pos_y = pos_v.y;
        // reverse
        var pos_x_adj: f32 = 0.0f;
        var pos_y_adj: f32 = 0.0f;
        for (var j_rev: i32 = 0i; j_rev < 8i; j_rev += 1i) {
            // replay
            let j = 7i - j_rev;
            let v4 = j * 2i;
            let v5 = v4 + 1i;
            let pos_v_1 = pos[j];
            let pos_x_1 = pos_v_1.x;
            let pos_y_1 = pos_v_1.y;
            let r_x = pos_x - pos_x_1;
            let r_y = pos_y - pos_y_1;
            let v6 = r_x * r_x;
            let v7 = r_y * r_y;
            let v8 = v6 + v7;
            let v9 = v8 + 0.001f;
            let v10 = sqrt(v9);
            let v11 = (-1.0f) / v10;
            // reverse
            let v12 = 1.0f / v10;
            let v13 = v0 * v11;
            let v14 = v13 * v12;
            let v15 = -v14;
            let v16 = select(0.0f, v15, v1);
            let v17 = v16 * 0.5f;
            let v18 = v17 * v12;
            let v19 = v16 != 0.0f;
            let v20 = select(0.0f, v18, v19);
            let r_y_adj = v20 * r_y;
            let r_y_adj_1 = r_y_adj + r_y_adj;
            let r_x_adj = v20 * r_x;
            let r_x_adj_1 = r_x_adj + r_x_adj;
            let pos_y_adj_1 = -r_y_adj_1;
            let pos_y_adj_2 = pos_y_adj;
            let v21 = pos_y_adj_2 + r_y_adj_1;
            pos_y_adj = v21;
            let pos_x_adj_1 = -r_x_adj_1;
            let pos_x_adj_2 = pos_x_adj;
            let v22 = pos_x_adj_2 + r_x_adj_1;
            pos_x_adj = v22;
            atomic_add_pos_grad(v5, pos_y_adj_1);
            atomic_add_pos_grad(v4, pos_x_adj_1);
        }
        let pos_y_adj_3 = pos_y_adj;
        atomic_add_pos_grad(v3, pos_y_adj_3);
        let pos_x_adj_3 = pos_x_adj;
        atomic_add_pos_grad(v2, pos_x_adj_3);
    }
}
