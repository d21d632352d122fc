// Per-thread random numbers: a 32-bit PCG stream (LCG step + RXS-M-XS output permutation).
// Each stream starts from a hash of (launch seed, loop index or thread id, salt), so results
// differ between threads and launches but do not depend on the dispatch shape.

//! snippet random
var<private> rng_state: u32;

fn rng_permute(s: u32) -> u32 {
    let w = ((s >> ((s >> 28u) + 4u)) ^ s) * 277803737u;
    return (w >> 22u) ^ w;
}

fn rng_hash(x: u32) -> u32 {
    return rng_permute(x * 747796405u + 2891336453u);
}

fn rng_seed(seed: u32, index: u32, salt: u32) {
    rng_state = rng_hash(seed ^ rng_hash(index ^ rng_hash(salt)));
}

fn rand_u32() -> u32 {
    rng_state = rng_state * 747796405u + 2891336453u;
    return rng_permute(rng_state);
}

// uniform in [0, 1): the top 24 bits scaled by 2^-24, so 1.0 is never reached
fn rand_f32() -> f32 {
    return f32(rand_u32() >> 8u) * 5.9604644775390625e-8f;
}
