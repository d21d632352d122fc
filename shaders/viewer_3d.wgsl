// 3-D scene primitives of ti.ui.Scene: sphere-shaded particles, lit meshes, lines.
// S holds the camera and the lights; every pipeline here tests and writes depth.
// Requires the viewer_common prelude.

struct Out3 {
    @builtin(position) pos: vec4f,
    @location(0) color: vec4f,
    @location(1) world: vec3f,
    @location(2) normal: vec3f,
    @location(3) @interpolate(flat) sphere: vec4f,  // particles: centre and radius
};

fn quad_corner(v: u32) -> vec2f {
    var c = array<vec2f, 6>(vec2f(-1.0, -1.0), vec2f(1.0, -1.0), vec2f(1.0, 1.0),
                            vec2f(-1.0, -1.0), vec2f(1.0, 1.0), vec2f(-1.0, 1.0));
    return c[v];
}

// Lambert + ambient, with every point light
fn shade(base: vec3f, n: vec3f, world: vec3f) -> vec3f {
    var light = S.ambient.rgb;
    for (var k = 0u; k < S.n_lights.x; k++) {
        let l = normalize(S.light_pos[k].xyz - world);
        light += max(dot(n, l), 0.0) * S.light_color[k].rgb;
    }
    return base * light;
}

// ---- particles: attrs 0 centre, 1 radius (world units), 2 colour --------------------------
// A camera-facing quad, enlarged so perspective never clips the sphere's outline; the
// fragment shader intersects the eye ray with the sphere for the normal and the depth.

const SPRITE_MARGIN: f32 = 1.5;

@vertex
fn vs_particles(@builtin(vertex_index) v: u32, @builtin(instance_index) i: u32) -> Out3 {
    let c = fetch(P.attrs[0], i).xyz;
    let r = fetch(P.attrs[1], i).x;
    let k = quad_corner(v) * r * SPRITE_MARGIN;
    let world = c + k.x * S.cam_right.xyz + k.y * S.cam_up.xyz;
    var o: Out3;
    o.pos = S.view_proj * vec4f(world, 1.0);
    o.color = fetch(P.attrs[2], i);
    o.world = world;
    o.normal = vec3f(0.0);
    o.sphere = vec4f(c, r);
    return o;
}

struct SphereOut {
    @location(0) color: vec4f,
    @builtin(frag_depth) depth: f32,
};

@fragment
fn fs_particles(in: Out3) -> SphereOut {
    let eye = S.cam_pos.xyz;
    let d = normalize(in.world - eye);
    let oc = eye - in.sphere.xyz;
    let b = dot(oc, d);
    let disc = b * b - (dot(oc, oc) - in.sphere.w * in.sphere.w);
    if disc < 0.0 {
        discard;
    }
    let hit = eye + d * (-b - sqrt(disc));
    let n = (hit - in.sphere.xyz) / max(in.sphere.w, 1e-12);
    let clip = S.view_proj * vec4f(hit, 1.0);
    var o: SphereOut;
    o.color = vec4f(shade(in.color.rgb, n, hit), 1.0);
    o.depth = clamp(clip.z / clip.w, 0.0, 1.0);
    return o;
}

// ---- meshes: item = vertex_index; attrs 0 position, 1 normal, 2 colour ---------------------
// flags bit 0: two-sided (normals turned towards the eye before lighting).

@vertex
fn vs_mesh(@builtin(vertex_index) v: u32) -> Out3 {
    let p = fetch(P.attrs[0], v).xyz;
    var o: Out3;
    o.pos = S.view_proj * vec4f(p, 1.0);
    o.color = fetch(P.attrs[2], v);
    o.world = p;
    o.normal = fetch(P.attrs[1], v).xyz;
    o.sphere = vec4f(0.0);
    return o;
}

@fragment
fn fs_mesh(in: Out3) -> @location(0) vec4f {
    var n = in.normal;
    let len = length(n);
    n = select(vec3f(0.0, 0.0, 1.0), n / len, len > 1e-20);
    if (P.flags & 1u) != 0u && dot(n, S.cam_pos.xyz - in.world) < 0.0 {
        n = -n;
    }
    return vec4f(shade(in.color.rgb, n, in.world), 1.0);
}

// ---- lines: attrs 0 first end, 1 second end, 2 colour; misc.x = width in pixels ------------
// A screen-space quad around each projected segment; segments with an end behind the eye are
// dropped.

@vertex
fn vs_lines3d(@builtin(vertex_index) v: u32, @builtin(instance_index) i: u32) -> Out3 {
    let a = S.view_proj * vec4f(fetch(P.attrs[0], i).xyz, 1.0);
    let b = S.view_proj * vec4f(fetch(P.attrs[1], i).xyz, 1.0);
    let k = quad_corner(v);
    var o: Out3;
    o.color = fetch(P.attrs[2], i);
    o.world = vec3f(0.0);
    o.normal = vec3f(0.0);
    o.sphere = vec4f(0.0);
    if a.w <= 1e-6 || b.w <= 1e-6 {
        o.pos = vec4f(2.0, 2.0, 2.0, 1.0);  // outside the clip volume
        return o;
    }
    let half_res = P.res * 0.5;
    let sa = a.xy / a.w * half_res;
    let sb = b.xy / b.w * half_res;
    var dir = sb - sa;
    let len = length(dir);
    dir = select(vec2f(1.0, 0.0), dir / len, len > 1e-6);
    let nrm = vec2f(-dir.y, dir.x);
    let end = select(a, b, k.x > 0.0);
    let off = (nrm * k.y + dir * k.x) * (P.misc.x * 0.5) / half_res;
    o.pos = end + vec4f(off * end.w, 0.0, 0.0);
    return o;
}

@fragment
fn fs_flat3d(in: Out3) -> @location(0) vec4f {
    return vec4f(in.color.rgb, 1.0);
}
