// The trivial kernel of the launch-overhead benchmark: a[0] += s, one thread.

struct Args {
    s: f32,
}

@group(0) @binding(0) var<uniform> args: Args;
@group(0) @binding(1) var<storage, read_write> a: array<f32>;

@compute @workgroup_size(1)
fn main() {
    a[0] = a[0] + args.s;
}
