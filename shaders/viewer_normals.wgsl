// Smooth vertex normals of a triangle mesh, computed on the GPU when scene.mesh gets none.
// Pass 1 (one thread per triangle) adds each triangle's unit normal to its three vertices in
// fixed point (WGSL has no float atomics); pass 2 (one thread per vertex) normalises the sums
// into `normals` and clears the sums for the next frame.
// P.attrs[0]: positions with the mesh's index mapping (item j = corner j), P.count: triangles,
// P.flags: vertices. Requires the viewer_common prelude.

@group(0) @binding(6) var<storage, read_write> sums: array<atomic<i32>>;
@group(0) @binding(7) var<storage, read_write> normals: array<f32>;

const FIXED: f32 = 1048576.0;  // 2^20: 2^11 triangles per vertex before i32 overflow

@compute @workgroup_size(64)
fn accumulate(@builtin(global_invocation_id) gid: vec3u) {
    let t = gid.x;
    if t >= P.count {
        return;
    }
    let a = P.attrs[0];
    let e0 = element(a, 3u * t);
    let e1 = element(a, 3u * t + 1u);
    let e2 = element(a, 3u * t + 2u);
    let p0 = fetch_element(a, e0).xyz;
    let p1 = fetch_element(a, e1).xyz;
    let p2 = fetch_element(a, e2).xyz;
    let c = cross(p1 - p0, p2 - p0);
    let len = length(c);
    if !(len > 0.0) {
        return;  // degenerate (or NaN) triangles add nothing
    }
    let q = vec3i(round(c / len * FIXED));
    for (var k = 0u; k < 3u; k++) {
        let e = select(select(e2, e1, k == 1u), e0, k == 0u);
        atomicAdd(&sums[3u * e], q.x);
        atomicAdd(&sums[3u * e + 1u], q.y);
        atomicAdd(&sums[3u * e + 2u], q.z);
    }
}

@compute @workgroup_size(64)
fn finish(@builtin(global_invocation_id) gid: vec3u) {
    let e = gid.x;
    if e >= P.flags {
        return;
    }
    let s = vec3f(f32(atomicLoad(&sums[3u * e])), f32(atomicLoad(&sums[3u * e + 1u])),
                  f32(atomicLoad(&sums[3u * e + 2u])));
    let len = length(s);
    let n = select(vec3f(0.0, 0.0, 1.0), s / len, len > 0.0);
    normals[3u * e] = n.x;
    normals[3u * e + 1u] = n.y;
    normals[3u * e + 2u] = n.z;
    atomicStore(&sums[3u * e], 0);
    atomicStore(&sums[3u * e + 1u], 0);
    atomicStore(&sums[3u * e + 2u], 0);
}
