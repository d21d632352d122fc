// print() in kernels: records in the runtime's print buffer, decoded by the host after the launch
// (wgpu_ad/runtime/printing.py). Words: [0] record words written, [1] lines asked for, [2] the
// most lines the buffer holds (set by the host), then the records: launch tag, print index, values.

//! snippet print_reserve
// The word where a record of `words` words goes, or 0xffffffffu when it is not written: the
// launch is muted (tag 0xffffffffu) or the buffer is full (the host counts the lines dropped).
fn print_reserve(tag: u32, words: u32) -> u32 {
    if tag == 0xffffffffu {
        return 0xffffffffu;
    }
    let line = atomicAdd(&{{buf}}[1], 1u);
    if line >= atomicLoad(&{{buf}}[2]) {
        return 0xffffffffu;
    }
    let at = atomicAdd(&{{buf}}[0], words) + 3u;
    if at + words > arrayLength(&{{buf}}) {
        return 0xffffffffu;
    }
    return at;
}
