// Scalar helpers for the ALU ops whose Python meaning differs from the WGSL builtin.
// The code generator copies in only the snippets a shader calls.
// Integer division by zero follows WGSL (x / 0 = x, x % 0 = 0): no trap, no defined answer.

//! snippet floordiv_i32
// Python '//': WGSL '/' truncates toward zero; step down when inexact and the signs differ.
fn floordiv_i32(a: i32, b: i32) -> i32 {
    let q = a / b;
    let r = a % b;
    return select(q, q - 1i, r != 0i && ((r < 0i) != (b < 0i)));
}

//! snippet mod_i32
// Python '%': the result takes the sign of the divisor (WGSL '%' takes the dividend's).
fn mod_i32(a: i32, b: i32) -> i32 {
    let r = a % b;
    return select(r, r + b, r != 0i && ((r < 0i) != (b < 0i)));
}

//! snippet pow_f32
// WGSL pow(x, y) is undefined for x < 0; Python gives +-|x|^y when y is an integer, NaN otherwise.
fn pow_f32(x: f32, y: f32) -> f32 {
    if y == 0.0f {
        return 1.0f;
    }
    var m: f32;
    let n = abs(y);
    if n <= 4.0f && floor(n) == n {
        // small integer powers by products (within 2 ulps; SwiftShader's pow gives 5.6 at (-0.97)^3)
        let a = abs(x);
        let a2 = a * a;
        m = select(select(a, a2, n == 2.0f), select(a2 * a, a2 * a2, n == 4.0f), n >= 3.0f);
        if y < 0.0f {
            m = 1.0f / m;
        }
    } else {
        m = pow(abs(x), y);
    }
    if !(x < 0.0f) {
        return m;
    }
    if floor(y) != y {
        let nan_bits = 0x7fc00000u;  // (a constant NaN is an error in Chrome's WGSL: bits_f32 below)
        return bitcast<f32>(nan_bits);
    }
    let odd = abs(y) < 16777216.0f && fract(y * 0.5f) != 0.0f;
    return select(m, -m, odd);
}

//! snippet pow_i32
// Integer power by repeated squaring, wrapping on overflow. A negative exponent gives the
// truncated integer 1 / x^-e: 1 for x = 1, +-1 for x = -1, 0 otherwise (x = 0 included).
fn pow_i32(x: i32, e: i32) -> i32 {
    if e < 0i {
        if x == 1i {
            return 1i;
        }
        if x == -1i {
            return select(1i, -1i, (e & 1i) != 0i);
        }
        return 0i;
    }
    var result = 1i;
    var base = x;
    var n = u32(e);
    loop {
        if n == 0u {
            break;
        }
        if (n & 1u) != 0u {
            result = result * base;
        }
        base = base * base;
        n = n >> 1u;
    }
    return result;
}

//! snippet pow_u32
fn pow_u32(x: u32, e: u32) -> u32 {
    var result = 1u;
    var base = x;
    var n = e;
    loop {
        if n == 0u {
            break;
        }
        if (n & 1u) != 0u {
            result = result * base;
        }
        base = base * base;
        n = n >> 1u;
    }
    return result;
}

//! snippet asinh_f32
// asinh x = sign(x) log1p(a + a^2 / (1 + sqrt(1 + a^2))), a = |x|: accurate near 0, where
// log(x + sqrt(x * x + 1)) (what WGSL lets asinh be) loses the digits of x; log(a) + log 2 where
// a^2 would overflow.
fn asinh_f32(x: f32) -> f32 {
    let a = abs(x);
    var r: f32;
    if a > 1e18f {
        r = log_f32(a) + 0.6931472f;
    } else {
        let a2 = a * a;
        r = log1p_f32(a + a2 / (1.0f + sqrt(1.0f + a2)));
    }
    return select(r, -r, x < 0.0f);
}

//! snippet acosh_f32
// acosh x = log1p(t + sqrt(t (2 + t))), t = x - 1 (exact near 1, where x * x - 1 cancels);
// log(x) + log 2 where x^2 would overflow; NaN below 1.
fn acosh_f32(x: f32) -> f32 {
    if !(x >= 1.0f) {
        let nan_bits = 0x7fc00000u;
        return bitcast<f32>(nan_bits);
    }
    if x > 1e18f {
        return log_f32(x) + 0.6931472f;
    }
    let t = x - 1.0f;
    return log1p_f32(t + sqrt(t * (2.0f + t)));
}

//! snippet atanh_f32
// atanh x = sign(x) log1p(2a / (1 - a)) / 2, a = |x| (1 - a is exact near 1): accurate near 0,
// where log((1 + x) / (1 - x)) / 2 is not; +-inf at +-1, NaN beyond.
fn atanh_f32(x: f32) -> f32 {
    let a = abs(x);
    var r: f32;
    if a < 1.0f {
        r = 0.5f * log1p_f32(2.0f * a / (1.0f - a));
    } else {
        let nan_bits = 0x7fc00000u;
        let inf_bits = 0x7f800000u;
        r = select(bitcast<f32>(nan_bits), bitcast<f32>(inf_bits), a == 1.0f);
    }
    return select(r, -r, x < 0.0f);
}

//! snippet log1p_f32
// log(1 + x), accurate near 0, where 1 + x drops the low digits of x and a GPU's log near 1 has
// only an absolute error bound: 2 atanh(s), s = x / (2 + x), by its series where 1 + x is in
// [sqrt(1/2), sqrt(2)] (|s| <= 0.1716: the terms after s^9 are below 2e-9 of the sum).
fn log1p_f32(x: f32) -> f32 {
    let u = 1.0f + x;
    if !(u > 0.70710677f && u < 1.4142135f) {
        return log_f32(u);
    }
    let s = x / (2.0f + x);
    let z = s * s;
    return s * (2.0f + z * (0.6666667f + z * (0.4f + z * (0.2857143f + z * 0.22222222f))));
}

//! snippet expm1_f32
// exp(x) - 1, accurate near 0, where it cancels: the Taylor series for |x| < 1 (the terms after
// x^11 / 11! are below 4e-9 of the sum); exp(x) - 1 elsewhere (|exp(x) - 1| > 0.63 there, so
// exp's error is not magnified; with |x| < 0.35 tanh_f32 had 6.5 ulps at 0.2).
fn expm1_f32(x: f32) -> f32 {
    if !(abs(x) < 1.0f) {
        if (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u {
            return x;  // NaN (SwiftShader's exp(NaN) is inf)
        }
        return exp(x) - 1.0f;
    }
    return x * (1.0f + x * (0.5f + x * (0.16666667f + x * (0.041666668f + x * (0.008333334f
        + x * (0.0013888889f + x * (0.0001984127f + x * (0.000024801587f + x * (2.7557319e-6f
        + x * (2.7557319e-7f + x * 2.5052108e-8f))))))))));
}

//! snippet tanh_f32
// tanh x = sign(x) -t / (2 + t), t = expm1(-2|x|): lavapipe's tanh (sinh / cosh, as WGSL lets it
// be) is off by 1.3e-2 of the value at 1e-6 and 0.44 near 1e-7; this stays within a few ulps.
fn tanh_f32(x: f32) -> f32 {
    let t = expm1_f32(-2.0f * abs(x));
    let r = -t / (2.0f + t);
    return select(r, -r, x < 0.0f);
}

//! snippet log_f32
// log x for every x: x = m 2^e from its bits (a subnormal scaled by 2^25 first), m in [sqrt(1/2),
// sqrt(2)), and log x = e log 2 + log1p(m - 1) (m - 1 is exact) by log1p_f32's series, log 2 in two
// parts. WGSL bounds log only absolutely on [0.5, 2] (lavapipe: 2e6 ulps of log(1 - 6e-8)) and says
// nothing at the edges (SwiftShader: log 0 = -88, log -1 = 0, log NaN = 89): here log +-0 = -inf,
// log inf = inf, NaN below 0 and for NaN.
fn log_f32(x: f32) -> f32 {
    var b = bitcast<u32>(x);
    if b == 0u || b == 0x80000000u {
        let minus_inf_bits = 0xff800000u;  // (a let: Chrome refuses a non-finite constant expression)
        return bitcast<f32>(minus_inf_bits);
    }
    if b >= 0x7f800000u {  // +inf, NaN, or negative
        let nan_bits = 0x7fc00000u;
        return select(bitcast<f32>(nan_bits), x, b == 0x7f800000u);
    }
    var e = 0i;
    if b < 0x00800000u {
        b = bitcast<u32>(x * 33554432.0f);
        e = -25i;
    }
    e += i32(b >> 23u) - 127i;
    var m = bitcast<f32>((b & 0x007fffffu) | 0x3f800000u);
    if m > 1.4142135f {
        m = m * 0.5f;
        e += 1i;
    }
    let f = m - 1.0f;
    let s = f / (2.0f + f);
    let z = s * s;
    let l = s * (2.0f + z * (0.6666667f + z * (0.4f + z * (0.2857143f + z * 0.22222222f))));
    let ef = f32(e);
    return ef * 0.69314575f + (ef * 1.4286068e-6f + l);
}

//! snippet tan_f32
// tan x = sin x / cos x from sincos_f32 (one reduction for both).
fn tan_f32(x: f32) -> f32 {
    let v = sincos_f32(x);
    return v.x / v.y;
}

//! snippet sin_f32
// sin x from sincos_f32: WGSL bounds sin only absolutely (2^-11 on [-pi, pi]; SwiftShader's gives
// 0 for sin 1e-30 and 11-17 ulps for cos near 0).
fn sin_f32(x: f32) -> f32 {
    return sincos_f32(x).x;
}

//! snippet cos_f32
// cos x from sincos_f32 (see sin_f32).
fn cos_f32(x: f32) -> f32 {
    return sincos_f32(x).y;
}

//! snippet sincos_f32
// (sin x, cos x) within a few ulps for |x| <= 8192, WGSL's sin and cos beyond (and NaN for inf and
// NaN). |x| = q pi / 2 + z with |z| <= pi / 4: q from |x| 4 / pi rounded up to even, z by
// subtracting q pi / 2 in four parts (three of 10 bits, whose products are exact here), then the
// minimax polynomials of sin and cos on [-pi / 4, pi / 4] (Cephes' sinf / cosf coefficients), whose
// values swap and change sign by quadrant.
fn sincos_f32(x: f32) -> vec2<f32> {
    let a = abs(x);
    if !(a <= 8192.0f) {
        return vec2<f32>(sin(x), cos(x));
    }
    var j = u32(a * 1.2732395f);
    j = j + (j & 1u);
    let y = f32(j);
    let z = (((a - y * 0.78515625f) - y * 0.00024199486f) + y * 8.1490725e-8f) - y * 3.0385503e-11f;
    let zz = z * z;
    let s = z + z * zz * ((-1.9515296e-4f * zz + 8.3321608e-3f) * zz - 1.6666655e-1f);
    let c = (1.0f - 0.5f * zz) + zz * zz * ((2.4433157e-5f * zz - 1.3887316e-3f) * zz + 4.1666646e-2f);
    let q = (j >> 1u) & 3u;
    let odd = (q & 1u) == 1u;
    var sn = select(s, c, odd);
    var cs = select(c, s, odd);
    if q == 1u || q == 2u {
        cs = -cs;
    }
    if q >= 2u {
        sn = -sn;
    }
    if (bitcast<u32>(x) & 0x80000000u) != 0u {
        sn = -sn;
    }
    return vec2<f32>(sn, cs);
}

//! snippet atan2_f32
// atan2(y, x) from atan of the ratio min / max <= 1, reflected by octant with pi / 2 and pi in two
// parts; lavapipe's atan and atan2 are off by 350 ulps (WGSL allows 4096). C's special values:
// +-0 and +-inf keep their signs (atan2(+-0, -0) = +-pi, atan2(+-inf, -inf) = +-3 pi / 4).
fn atan2_f32(y: f32, x: f32) -> f32 {
    let ax = abs(x);
    let ay = abs(y);
    var r: f32;
    if ax == ay {
        r = select(0.7853982f, 0.0f, ax == 0.0f);
    } else if ay > ax {
        r = (1.5707964f - atan_f32(ax / ay)) - 4.3711388e-8f;
    } else {
        r = atan_f32(ay / ax);
    }
    if (bitcast<u32>(x) & 0x80000000u) != 0u {
        r = (3.1415927f - r) - 8.742278e-8f;
    }
    return select(r, -r, (bitcast<u32>(y) & 0x80000000u) != 0u);
}

//! snippet atan_f32
// atan x (Cephes atanf): |x| reduced to |t| <= tan(pi / 8) by atan a = pi / 4 + atan((a - 1) / (a + 1))
// or pi / 2 + atan(-1 / a), then an odd polynomial (relative error 2e-7 on that interval).
fn atan_f32(x: f32) -> f32 {
    let a = abs(x);
    var base = 0.0f;
    var t = a;
    if a > 2.4142137f {
        base = 1.5707964f;
        t = -1.0f / a;
    } else if a > 0.41421357f {
        base = 0.7853982f;
        t = (a - 1.0f) / (a + 1.0f);
    }
    let z = t * t;
    let r = base + (((((0.0805374449538f * z - 0.138776856032f) * z + 0.199777106478f) * z
        - 0.333329491539f) * z) * t + t);
    return select(r, -r, x < 0.0f);
}

//! snippet bits_f32
// The f32 with these bits: how generated code spells a NaN or an infinity. A call of a function is
// not a constant expression; a bitcast of a constant is one, and WGSL rejects a constant that is
// not finite (Chrome and Dawn refuse the shader; naga lets it pass).
fn bits_f32(bits: u32) -> f32 {
    return bitcast<f32>(bits);
}
