// Debug-mode checks. The error buffer holds [0] = 1 + index of the failed assert (0 = none),
// [1..] = the bits of its values. The first thread to fail claims word 0; returns whether it won.

//! snippet report_error
fn report_error(code: u32) -> bool {
    loop {
        let claim = atomicCompareExchangeWeak(&{{err}}[0], 0u, code);
        if claim.exchanged {
            return true;
        }
        if claim.old_value != 0u {
            return false;  // another failure was recorded first
        }
    }
    return false;
}
