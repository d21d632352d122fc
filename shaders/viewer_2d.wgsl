// 2-D primitives of ti.GUI and the GGUI canvas, drawn as instanced quads / triangles.
// Positions are in [0, 1]^2 with the origin at the bottom left; sizes are in pixels.
// Each vertex entry point documents which P.attrs it reads. Requires the viewer_common prelude.

struct VOut {
    @builtin(position) pos: vec4f,
    @location(0) color: vec4f,
    // circles: (offset from centre in px, radius); capsules: (along, across, length, radius);
    // images: (u, v); text: (glyph px x, y, code, scale)
    @location(1) local: vec4f,
    @location(2) @interpolate(flat) shape: u32,
};

const SHAPE_FLAT: u32 = 0u;
const SHAPE_CIRCLE: u32 = 1u;
const SHAPE_CAPSULE: u32 = 2u;

fn to_clip(px: vec2f) -> vec4f {
    return vec4f(px / P.res * 2.0 - 1.0, 0.0, 1.0);
}

// the two triangles of a unit quad, corners in [-1, 1]^2
fn corner(v: u32) -> vec2f {
    var c = array<vec2f, 6>(vec2f(-1.0, -1.0), vec2f(1.0, -1.0), vec2f(1.0, 1.0),
                            vec2f(-1.0, -1.0), vec2f(1.0, 1.0), vec2f(-1.0, 1.0));
    return c[v];
}

// attrs: 0 centre, 1 radius (px), 2 colour
@vertex
fn vs_circles(@builtin(vertex_index) v: u32, @builtin(instance_index) i: u32) -> VOut {
    let c = fetch(P.attrs[0], i).xy * P.res;
    let r = fetch(P.attrs[1], i).x;
    let off = corner(v) * (r + 1.0);
    var o: VOut;
    o.pos = to_clip(c + off);
    o.color = fetch(P.attrs[2], i);
    o.local = vec4f(off, r, 0.0);
    o.shape = SHAPE_CIRCLE;
    return o;
}

// a quad around the segment a-b, wide enough for a capsule of radius r plus a pixel of edge
fn capsule_vertex(a: vec2f, b: vec2f, r: f32, v: u32) -> VOut {
    let ab = b - a;
    let len = length(ab);
    var dir = vec2f(1.0, 0.0);
    if len > 1e-6 {
        dir = ab / len;
    }
    let nrm = vec2f(-dir.y, dir.x);
    let k = corner(v);
    let e = r + 1.0;
    let along = select(-e, len + e, k.x > 0.0);
    let across = k.y * e;
    var o: VOut;
    o.pos = to_clip(a + dir * along + nrm * across);
    o.local = vec4f(along, across, len, r);
    o.shape = SHAPE_CAPSULE;
    return o;
}

// attrs: 0 first end, 1 second end, 2 radius (half width, px), 3 colour
@vertex
fn vs_lines(@builtin(vertex_index) v: u32, @builtin(instance_index) i: u32) -> VOut {
    let a = fetch(P.attrs[0], i).xy * P.res;
    let b = fetch(P.attrs[1], i).xy * P.res;
    var o = capsule_vertex(a, b, fetch(P.attrs[2], i).x, v);
    o.color = fetch(P.attrs[3], i);
    return o;
}

// attrs: 0 origin, 1 direction (both in [0, 1] units), 2 radius (px), 3 colour.
// Vertices 0-5: the shaft (a capsule up to the head's base); 6-8: the head triangle.
@vertex
fn vs_arrows(@builtin(vertex_index) v: u32, @builtin(instance_index) i: u32) -> VOut {
    let a = fetch(P.attrs[0], i).xy * P.res;
    let tip = a + fetch(P.attrs[1], i).xy * P.res;
    let r = fetch(P.attrs[2], i).x;
    let len = length(tip - a);
    var dir = vec2f(1.0, 0.0);
    if len > 1e-6 {
        dir = (tip - a) / len;
    }
    let head = min(3.0 * r + 6.0, len);
    let base = tip - dir * head;
    var o: VOut;
    if v < 6u {
        o = capsule_vertex(a, base, r, v);
    } else {
        let nrm = vec2f(-dir.y, dir.x);
        let half_w = head * 0.6;
        var p = array<vec2f, 3>(base + nrm * half_w, tip, base - nrm * half_w);
        o.pos = to_clip(p[v - 6u]);
        o.local = vec4f(0.0);
        o.shape = SHAPE_FLAT;
    }
    o.color = fetch(P.attrs[3], i);
    return o;
}

// attrs: 0, 1, 2 the corners, 3 colour: per triangle, or per vertex (item 3 i + v) when flags == 1
@vertex
fn vs_triangles(@builtin(vertex_index) v: u32, @builtin(instance_index) i: u32) -> VOut {
    var o: VOut;
    o.pos = to_clip(fetch(P.attrs[v], i).xy * P.res);
    o.color = fetch(P.attrs[3], select(i, i * 3u + v, P.flags == 1u));
    o.local = vec4f(0.0);
    o.shape = SHAPE_FLAT;
    return o;
}

@fragment
fn fs_shape(in: VOut) -> @location(0) vec4f {
    var cover = 1.0;
    if in.shape == SHAPE_CIRCLE {
        cover = clamp(in.local.z + 0.5 - length(in.local.xy), 0.0, 1.0);
    } else if in.shape == SHAPE_CAPSULE {
        let t = clamp(in.local.x, 0.0, in.local.z);
        cover = clamp(in.local.w + 0.5 - length(vec2f(in.local.x - t, in.local.y)), 0.0, 1.0);
    }
    if cover <= 0.0 {
        discard;
    }
    return vec4f(in.color.rgb, in.color.a * cover);
}

// ---- images: the whole target; attrs 0 the image data, 1 the colormap stops ----------------
// misc = (image width W, height H, vmin, vmax); misc2 = (value scale (1/255 for integer data),
// number of colormap stops, 0, 0);
// flags: 0 = scalar through the colormap, 1 = RGB(A). Pixel (x, y) from the bottom left is
// element x * H + y, as Taichi's img[x, y].

@vertex
fn vs_image(@builtin(vertex_index) v: u32) -> VOut {
    let k = corner(v);
    var o: VOut;
    o.pos = vec4f(k, 0.0, 1.0);
    o.local = vec4f(k * 0.5 + 0.5, 0.0, 0.0);
    o.color = vec4f(1.0);
    o.shape = SHAPE_FLAT;
    return o;
}

fn colormap(t: f32) -> vec4f {
    let n = u32(P.misc2.y);  // number of stops
    let x = clamp(t, 0.0, 1.0) * f32(n - 1u);
    let k = min(u32(floor(x)), n - 2u);
    let f = x - f32(k);
    return mix(fetch_element(P.attrs[1], k), fetch_element(P.attrs[1], k + 1u), f);
}

@fragment
fn fs_image(in: VOut) -> @location(0) vec4f {
    let w = u32(P.misc.x);
    let h = u32(P.misc.y);
    let x = min(u32(in.local.x * f32(w)), w - 1u);
    let y = min(u32(in.local.y * f32(h)), h - 1u);
    let val = fetch_element(P.attrs[0], x * h + y);
    if P.flags == 0u {
        let span = select(P.misc.w - P.misc.z, 1.0, P.misc.w == P.misc.z);
        return colormap((val.x * P.misc2.x - P.misc.z) / span);
    }
    return vec4f(clamp(val.rgb * P.misc2.x, vec3f(0.0), vec3f(1.0)), 1.0);
}

// ---- text: one quad per character -----------------------------------------------------------
// attrs: 0 characters (glyph code, column, line), 1 the font rows (slot and base only),
// 2 colour. misc = (left px, top px (from the bottom), scale, 0).

const GLYPH_W: f32 = 5.0;
const GLYPH_H: f32 = 7.0;
const CELL_W: f32 = 6.0;
const CELL_H: f32 = 9.0;

@vertex
fn vs_text(@builtin(vertex_index) v: u32, @builtin(instance_index) i: u32) -> VOut {
    let ch = fetch(P.attrs[0], i);
    let s = P.misc.z;
    let k = corner(v) * 0.5 + 0.5;               // [0, 1]^2, y up
    let glyph = vec2f(k.x * GLYPH_W, (1.0 - k.y) * GLYPH_H);  // glyph pixels, y down
    let top_left = vec2f(P.misc.x + ch.y * CELL_W * s, P.misc.y - ch.z * CELL_H * s);
    var o: VOut;
    o.pos = to_clip(top_left + vec2f(glyph.x, -glyph.y) * s);
    o.color = fetch(P.attrs[2], i);
    o.local = vec4f(glyph, ch.x, s);
    o.shape = SHAPE_FLAT;
    return o;
}

@fragment
fn fs_text(in: VOut) -> @location(0) vec4f {
    let col = min(u32(in.local.x), 4u);
    let row = min(u32(in.local.y), 6u);
    let bits = word(P.attrs[1].src.x, P.attrs[1].src.y + u32(in.local.z) * 7u + row);
    if ((bits >> (4u - col)) & 1u) == 0u {
        discard;
    }
    return in.color;
}
