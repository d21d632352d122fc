// The viewer's shared prelude: the bind group every viewer pipeline uses, and attribute fetches
// that read field data straight from the storage buffers the kernels write.
//
// A draw command binds up to four buffers (d0..d3: field buffers, the frame's upload arena, the
// font) and describes each input as an Attr:
//   src = (slot, base word, stride in words, kind | components << 8)
//   idx = (index slot or NONE, index base word, multiplier, addend)
//   value = the constant (kind CONST), or the defaults of components the buffer lacks
// Element e of an input is read at words base + e * stride + c. For item i the element is
// i * multiplier + addend, or the index buffer's word at that position when there is one
// (mesh indices, GGUI line / triangle indices).

struct Attr {
    src: vec4u,
    idx: vec4u,
    value: vec4f,
};

struct Params {
    res: vec2f,        // target size in pixels
    count: u32,        // items
    flags: u32,
    misc: vec4f,
    misc2: vec4f,
    attrs: array<Attr, 6>,
};

struct Scene {
    view_proj: mat4x4f,
    cam_pos: vec4f,
    cam_right: vec4f,
    cam_up: vec4f,
    ambient: vec4f,
    light_pos: array<vec4f, 4>,
    light_color: array<vec4f, 4>,
    n_lights: vec4u,
};

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> d0: array<u32>;
@group(0) @binding(2) var<storage, read> d1: array<u32>;
@group(0) @binding(3) var<storage, read> d2: array<u32>;
@group(0) @binding(4) var<storage, read> d3: array<u32>;
@group(0) @binding(5) var<uniform> S: Scene;

const NONE: u32 = 0xffffffffu;
const K_CONST: u32 = 0u;    // the constant value
const K_F32: u32 = 1u;      // components are f32
const K_I32: u32 = 2u;      // components are i32 (converted to f32)
const K_RGB: u32 = 3u;      // one u32 0xRRGGBB per element
const K_PALETTE: u32 = 4u;  // one u32 index per element into a 0xRRGGBB table at (value.x = slot, value.y = base)
const K_U32: u32 = 5u;      // components are u32 (converted to f32)

fn word(slot: u32, i: u32) -> u32 {
    switch slot {
        case 0u: { return d0[i]; }
        case 1u: { return d1[i]; }
        case 2u: { return d2[i]; }
        default: { return d3[i]; }
    }
}

fn unpack_rgb(c: u32) -> vec4f {
    return vec4f(f32((c >> 16u) & 0xffu), f32((c >> 8u) & 0xffu), f32(c & 0xffu), 255.0) / 255.0;
}

// the element that item i reads
fn element(a: Attr, i: u32) -> u32 {
    let k = i * a.idx.z + a.idx.w;
    if a.idx.x == NONE {
        return k;
    }
    return word(a.idx.x, a.idx.y + k);
}

fn fetch_element(a: Attr, e: u32) -> vec4f {
    let kind = a.src.w & 0xffu;
    if kind == K_CONST {
        return a.value;
    }
    let at = a.src.y + e * a.src.z;
    if kind == K_RGB {
        return unpack_rgb(word(a.src.x, at));
    }
    if kind == K_PALETTE {
        let k = word(a.src.x, at);
        return unpack_rgb(word(u32(a.value.x), u32(a.value.y) + k));
    }
    let n = a.src.w >> 8u;
    var v = a.value;
    for (var c = 0u; c < min(n, 4u); c++) {
        let w = word(a.src.x, at + c);
        if kind == K_F32 {
            v[c] = bitcast<f32>(w);
        } else if kind == K_I32 {
            v[c] = f32(bitcast<i32>(w));
        } else {
            v[c] = f32(w);
        }
    }
    return v;
}

fn fetch(a: Attr, i: u32) -> vec4f {
    if (a.src.w & 0xffu) == K_CONST {
        return a.value;
    }
    return fetch_element(a, element(a, i));
}
