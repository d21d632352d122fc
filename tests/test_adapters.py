"""Choosing one adapter among several: ti.list_adapters(), ti.init(device=...), WGPU_AD_DEVICE and
ti.worker_device(). Two identical adapters come from lavapipe's Vulkan driver listed twice (its
ICD file under a second name in VK_ICD_FILENAMES), in a subprocess: wgpu enumerates once per process."""
import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import wgpu_ad as ti
from wgpu_ad.runtime import adapter as A

pytestmark = pytest.mark.gpu


def test_the_listing_puts_the_default_first_and_init_takes_an_index():
    entries = ti.list_adapters()
    assert [e.index for e in entries] == list(range(len(entries)))
    rt = ti.init()
    assert rt.adapter is A.listed()[0]  # index 0 is what ti.init() takes by default
    last = len(entries) - 1
    rt = ti.init(device=last)
    assert rt.adapter is A.listed()[last]
    assert str(entries[0]).startswith("[0] ")


def test_an_index_out_of_range_lists_the_adapters():
    n = len(ti.list_adapters())
    with pytest.raises(ti.GpuError) as e:
        ti.init(device=n + 3)
    msg = str(e.value)
    assert msg.startswith(f"ti.init(device={n + 3}): there is no adapter {n + 3}; wgpu_ad lists {n}:\n  [0] ")
    assert all(str(entry) in msg for entry in ti.list_adapters())


def test_a_name_part_picks_the_first_adapter_with_it_and_a_wrong_one_is_named():
    first = ti.list_adapters()[0]
    rt = ti.init(device=first.name[:5].upper())  # case does not matter
    assert rt.adapter is A.listed()[0]
    with pytest.raises(ti.GpuError, match=r"ti.init\(device='no such gpu'\): no adapter's name contains 'no such "
                                          r"gpu'; wgpu_ad lists:\n  \[0\] "):
        ti.init(device="no such gpu")
    with pytest.raises(ti.GpuError, match=r"ti.init\(device=1.5\): expected an index into ti.list_adapters\(\)"):
        ti.init(device=1.5)


def test_the_environment_variable_overrides_the_argument(monkeypatch):
    monkeypatch.setenv("WGPU_AD_DEVICE", "99")
    with pytest.raises(ti.GpuError, match=r"WGPU_AD_DEVICE='99': there is no adapter 99"):
        ti.init(device=0)


def test_a_device_of_another_backend_than_the_arch_is_refused():
    others = [e for e in ti.list_adapters() if e.backend != "Vulkan"]
    if not others:
        pytest.skip("every adapter here is a Vulkan one")
    with pytest.raises(ti.GpuError, match=rf"ti.init\(device={others[0].index}\) names .* which is not a 'vulkan' "
                                          r"adapter \(arch='vulkan'\); drop one of the two"):
        ti.init(arch=ti.vulkan, device=others[0].index)


_CHILD = r"""
import json, os, sys
import numpy as np
import wgpu_ad as ti
entries = [e.__dict__ for e in ti.list_adapters()]
rank_dev = {r: ti.worker_device(r) for r in range(3)}
local = ti.worker_device()
rt = ti.init(device=int(sys.argv[1]))
from wgpu_ad.runtime import adapter as A
chosen = A.listed().index(rt.adapter)
x = ti.field(ti.f32, shape=8)
@ti.kernel
def k():
    for i in x:
        x[i] = i * 0.5
k()
print(json.dumps({"entries": entries, "rank_dev": rank_dev, "local": local, "chosen": chosen,
                  "x": x.to_numpy().tolist()}))
"""


@pytest.fixture
def two_lavapipes(tmp_path):
    icds = sorted(glob.glob("/usr/share/vulkan/icd.d/lvp_icd.*.json"))
    if not icds:
        pytest.skip("lavapipe's ICD file (/usr/share/vulkan/icd.d/lvp_icd.*.json) is not installed")
    twin = tmp_path / "lvp_twin.json"
    twin.write_text(open(icds[0]).read())
    script = tmp_path / "child.py"
    script.write_text(_CHILD)

    def run(device: int, local_rank: str | None = None) -> dict:
        env = {**os.environ, "VK_ICD_FILENAMES": f"{icds[0]}:{twin}", "WGPU_AD_CACHE_DIR": str(tmp_path / "c")}
        env.pop("WGPU_AD_DEVICE", None)
        env.pop("LOCAL_RANK", None)
        if local_rank is not None:
            env["LOCAL_RANK"] = local_rank
        r = subprocess.run([sys.executable, str(script), str(device)], env=env, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout.strip().splitlines()[-1])
    return run


def test_two_identical_adapters_are_told_apart_by_index(two_lavapipes):
    out = two_lavapipes(1, local_rank="1")
    vulkan = [e for e in out["entries"] if e["backend"] == "Vulkan"]
    assert len(vulkan) == 2 and vulkan[0]["name"] == vulkan[1]["name"], out["entries"]
    assert [e["index"] for e in vulkan] == [0, 1]  # listed first (Vulkan before OpenGL), in driver order
    assert out["chosen"] == 1
    np.testing.assert_array_equal(out["x"], np.arange(8) * 0.5)
    # workers spread over the two (no GPU here: the software adapters of the preferred backend)
    assert out["rank_dev"] == {"0": 0, "1": 1, "2": 0}
    assert out["local"] == 1  # LOCAL_RANK=1, as torchrun sets it
