// Cloth mass-spring step, its loss, and their hand-derived adjoints.
// x, v, gx, gv are flat f32 arrays indexed ((t * N + i) * N + j) * 3 + component.
// The adjoint of a step is a gather: with d = x_j - x_i and the symmetric spring Jacobian
// J(d) = KS * ((1 - L/|d|) I + L/|d|^3 d d^T), dloss/dx_i(t) = gx_i(t+1)
//   + sum_j J(d) (gf_j - gf_i), gf = DT/MASS * (gv(t+1) + DT gx(t+1)); no atomics anywhere.

const N: i32 = {{N}};
const NN: i32 = {{N}} * {{N}};
const STEPS: i32 = {{STEPS}};
const WG: u32 = {{WG}}u;
const DT: f32 = {{DT}};
const KS: f32 = {{KS}};
const MASS: f32 = {{MASS}};
const DAMPING: f32 = {{DAMPING}};
const GRAVITY: f32 = {{GRAVITY}};
const REST1: f32 = {{REST1}};
const REST2: f32 = {{REST2}};
const TARGET: vec3<f32> = vec3<f32>({{TX}}, {{TY}}, {{TZ}});
const INV_NN: f32 = {{INV_NN}};

struct Step {
    t: i32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> v: array<f32>;
@group(0) @binding(3) var<storage, read_write> gx: array<f32>;
@group(0) @binding(4) var<storage, read_write> gv: array<f32>;
@group(0) @binding(5) var<storage, read_write> partials: array<f32>;

var<workgroup> sums: array<f32, WG>;

fn load_x(b: i32) -> vec3<f32> { return vec3<f32>(x[b], x[b + 1], x[b + 2]); }
fn load_v(b: i32) -> vec3<f32> { return vec3<f32>(v[b], v[b + 1], v[b + 2]); }
fn load_gx(b: i32) -> vec3<f32> { return vec3<f32>(gx[b], gx[b + 1], gx[b + 2]); }
fn load_gv(b: i32) -> vec3<f32> { return vec3<f32>(gv[b], gv[b + 1], gv[b + 2]); }
fn store_x(b: i32, a: vec3<f32>) { x[b] = a.x; x[b + 1] = a.y; x[b + 2] = a.z; }
fn store_v(b: i32, a: vec3<f32>) { v[b] = a.x; v[b + 1] = a.y; v[b + 2] = a.z; }
fn store_gx(b: i32, a: vec3<f32>) { gx[b] = a.x; gx[b + 1] = a.y; gx[b + 2] = a.z; }
fn store_gv(b: i32, a: vec3<f32>) { gv[b] = a.x; gv[b + 1] = a.y; gv[b + 2] = a.z; }

fn in_grid(i: i32, j: i32) -> bool {
    return i >= 0 && i < N && j >= 0 && j < N;
}

fn rest_length(di: i32, dj: i32) -> f32 {
    return select(REST2, REST1, di * dj == 0);
}

@compute @workgroup_size(WG)
fn step_fwd(@builtin(global_invocation_id) gid: vec3<u32>) {
    let p = i32(gid.x);
    if p >= NN {
        return;
    }
    let i = p / N;
    let j = p % N;
    let base = step.t * NN * 3;
    let b = base + p * 3;
    let xi = load_x(b);
    var f = vec3<f32>(0.0, -GRAVITY * MASS, 0.0);
    for (var di = -1; di <= 1; di++) {
        for (var dj = -1; dj <= 1; dj++) {
            if (di != 0 || dj != 0) && in_grid(i + di, j + dj) {
                let d = load_x(base + ((i + di) * N + j + dj) * 3) - xi;
                let len = length(d);
                f += KS * (len - rest_length(di, dj)) / len * d;
            }
        }
    }
    let vn = load_v(b) * DAMPING + (DT / MASS) * f;
    store_v(b + NN * 3, vn);
    store_x(b + NN * 3, xi + DT * vn);
}

// the gradient on the force of the particle at b1 (time t + 1): DT/MASS * (gv + DT * gx)
fn force_grad(b1: i32) -> vec3<f32> {
    return (DT / MASS) * (load_gv(b1) + DT * load_gx(b1));
}

@compute @workgroup_size(WG)
fn step_bwd(@builtin(global_invocation_id) gid: vec3<u32>) {
    let p = i32(gid.x);
    if p >= NN {
        return;
    }
    let i = p / N;
    let j = p % N;
    let base = step.t * NN * 3;
    let b = base + p * 3;
    let b1 = b + NN * 3;
    let gvn = load_gv(b1) + DT * load_gx(b1);   // total gradient on v(t+1)_i
    let gfi = (DT / MASS) * gvn;
    var gxi = load_gx(b1);
    let xi = load_x(b);
    for (var di = -1; di <= 1; di++) {
        for (var dj = -1; dj <= 1; dj++) {
            if (di != 0 || dj != 0) && in_grid(i + di, j + dj) {
                let q = ((i + di) * N + j + dj) * 3;
                let d = load_x(base + q) - xi;
                let len = length(d);
                let rest = rest_length(di, dj);
                let w = force_grad(base + NN * 3 + q) - gfi;
                gxi += KS * ((1.0 - rest / len) * w + (rest / (len * len * len)) * dot(d, w) * d);
            }
        }
    }
    store_gx(b, gxi);
    store_gv(b, DAMPING * gvn);
}

@compute @workgroup_size(WG)
fn loss_fwd(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
            @builtin(workgroup_id) wid: vec3<u32>) {
    let p = i32(gid.x);
    var e = 0.0;
    if p < NN {
        let d = load_x((STEPS * NN + p) * 3) - TARGET;
        e = dot(d, d) * INV_NN;
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
fn loss_bwd(@builtin(global_invocation_id) gid: vec3<u32>) {
    let p = i32(gid.x);
    if p >= NN {
        return;
    }
    let b = (STEPS * NN + p) * 3;
    store_gx(b, 2.0 * INV_NN * (load_x(b) - TARGET));
    store_gv(b, vec3<f32>(0.0));
}
