// Copies the rendered frame (an rgba8unorm texture) onto the window's surface texture,
// scaling when the framebuffer size differs (HiDPI). For sRGB surfaces the colour is decoded
// first, so the window shows the same bytes the PNG files hold.

@group(0) @binding(0) var frame: texture_2d<f32>;
@group(0) @binding(1) var samp: sampler;

struct BlitOut {
    @builtin(position) pos: vec4f,
    @location(0) uv: vec2f,
};

@vertex
fn vs_blit(@builtin(vertex_index) v: u32) -> BlitOut {
    // one triangle covering the target
    let p = vec2f(f32((v << 1u) & 2u), f32(v & 2u));
    var o: BlitOut;
    o.pos = vec4f(p * 2.0 - 1.0, 0.0, 1.0);
    o.uv = vec2f(p.x, 1.0 - p.y);
    return o;
}

@fragment
fn fs_blit(in: BlitOut) -> @location(0) vec4f {
    return vec4f(textureSample(frame, samp, in.uv).rgb, 1.0);
}

fn srgb_to_linear(c: vec3f) -> vec3f {
    return select(pow((c + 0.055) / 1.055, vec3f(2.4)), c / 12.92, c <= vec3f(0.04045));
}

@fragment
fn fs_blit_srgb(in: BlitOut) -> @location(0) vec4f {
    return vec4f(srgb_to_linear(textureSample(frame, samp, in.uv).rgb), 1.0);
}
