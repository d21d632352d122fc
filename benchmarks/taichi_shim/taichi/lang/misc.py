"""taichi.lang.misc.get_host_arch_list: the host's CPU arch (wgpu_ad's ti.cpu: a CPU adapter)."""
import wgpu_ad as _w


def get_host_arch_list():
    return [_w.cpu]
