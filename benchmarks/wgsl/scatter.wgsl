// P2G-like scatter with quadratic B-spline weights: float atomics (atomic<f32>) into the grid;
// loss = sum of squared grid values (per-workgroup partials); and the adjoint, a gather:
// dloss/dx_p = sum over the 9 nodes of dw/dx * (2 m_node * P_MASS + 2 mv_node . (P_MASS v_p)).

const P: u32 = {{P}}u;
const G: i32 = {{G}};
const WG: u32 = {{WG}}u;
const INV_DX: f32 = {{INV_DX}};
const P_MASS: f32 = {{P_MASS}};

@group(0) @binding(0) var<storage, read> x: array<vec2<f32>>;
@group(0) @binding(1) var<storage, read> pv: array<vec2<f32>>;
@group(0) @binding(2) var<storage, read_write> grid_m: array<atomic<f32>>;
@group(0) @binding(3) var<storage, read_write> grid_mv: array<atomic<f32>>;   // 2 per node
@group(0) @binding(4) var<storage, read_write> partials: array<f32>;
@group(0) @binding(5) var<storage, read_write> gx: array<vec2<f32>>;

var<workgroup> sums: array<f32, WG>;

@compute @workgroup_size(WG)
fn p2g(@builtin(global_invocation_id) gid: vec3<u32>) {
    let q = gid.x;
    if q >= P {
        return;
    }
    let X = x[q] * INV_DX;
    let base = vec2<i32>(X - 0.5);
    let fx = X - vec2<f32>(base);
    var w = array<vec2<f32>, 3>(0.5 * (1.5 - fx) * (1.5 - fx), 0.75 - (fx - 1.0) * (fx - 1.0),
                                0.5 * (fx - 0.5) * (fx - 0.5));
    let mv = P_MASS * pv[q];
    for (var i = 0; i < 3; i++) {
        for (var j = 0; j < 3; j++) {
            let wt = w[i].x * w[j].y;
            let node = (base.x + i) * G + base.y + j;
            atomicAdd(&grid_m[node], wt * P_MASS);
            atomicAdd(&grid_mv[2 * node], wt * mv.x);
            atomicAdd(&grid_mv[2 * node + 1], wt * mv.y);
        }
    }
}

@compute @workgroup_size(WG)
fn loss_fwd(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
            @builtin(workgroup_id) wid: vec3<u32>) {
    let node = i32(gid.x);
    var e = 0.0;
    if node < G * G {
        let m = atomicLoad(&grid_m[node]);
        let mx = atomicLoad(&grid_mv[2 * node]);
        let my = atomicLoad(&grid_mv[2 * node + 1]);
        e = m * m + mx * mx + my * my;
    }
    sums[lid] = e;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if lid < s {
            sums[lid] += sums[lid + s];
        }
        workgroupBarrier();
    }
    if lid == 0u {
        partials[wid.x] = sums[0];
    }
}

@compute @workgroup_size(WG)
fn p2g_bwd(@builtin(global_invocation_id) gid: vec3<u32>) {
    let q = gid.x;
    if q >= P {
        return;
    }
    let X = x[q] * INV_DX;
    let base = vec2<i32>(X - 0.5);
    let fx = X - vec2<f32>(base);
    var w = array<vec2<f32>, 3>(0.5 * (1.5 - fx) * (1.5 - fx), 0.75 - (fx - 1.0) * (fx - 1.0),
                                0.5 * (fx - 0.5) * (fx - 0.5));
    var dw = array<vec2<f32>, 3>(fx - 1.5, 2.0 * (1.0 - fx), fx - 0.5);
    let mv = P_MASS * pv[q];
    var g = vec2<f32>(0.0, 0.0);
    for (var i = 0; i < 3; i++) {
        for (var j = 0; j < 3; j++) {
            let node = (base.x + i) * G + base.y + j;
            let m = atomicLoad(&grid_m[node]);
            let mvn = vec2<f32>(atomicLoad(&grid_mv[2 * node]), atomicLoad(&grid_mv[2 * node + 1]));
            let gnode = 2.0 * m * P_MASS + 2.0 * dot(mvn, mv);
            g += vec2<f32>(dw[i].x * w[j].y, w[i].x * dw[j].y) * (INV_DX * gnode);
        }
    }
    gx[q] = g;
}
