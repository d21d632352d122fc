"""Per-launch Python overhead: a trivial kernel launched many times, one sync at the end.

Prints microseconds per launch (amortised). Run: python benchmarks/launch_overhead.py [launches]
"""
import sys
import time

import wgpu_ad as ti


def main(n: int = 5000, repeats: int = 5):
    ti.init()
    a = ti.field(ti.f32, shape=1)

    @ti.kernel
    def tiny(s: ti.f32):
        for i in range(1):
            a[i] += s

    tiny(1.0)
    ti.sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            tiny(1.0)
        ti.sync()
        times.append((time.perf_counter() - t0) / n * 1e6)
    times.sort()
    print(f"{ti.get_runtime()}")
    print(f"launch overhead: median {times[len(times) // 2]:.1f} us/launch, best {times[0]:.1f} us/launch "
          f"({n} launches x {repeats}, one sync each)")
    assert a[0] == 1.0 + n * repeats


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5000)
