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
    let m = pow(abs(x), y);
    if !(x < 0.0f) {
        return m;
    }
    if floor(y) != y {
        return bitcast<f32>(0x7fc00000u);
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
