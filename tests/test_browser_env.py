"""The browser harness itself (tests/browser_env.py): a hand-written WGSL kernel runs in headless
Chromium and in node + Dawn with the values NumPy computes; results travel bit-exact; and every way a
page can fail (a throw, a console error, a shader WebGPU refuses, a missing file) is a BrowserError
that says what went wrong."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest

import browser_env as B

ENVS = ["node", "chromium"]

# y[i] = a * x[i] + b for i < n, and one workgroup's sum of x into total (integer-valued floats: exact)
SAXPY = """
export default async function (device, ctx) {
  const { a, b, x } = ctx.args;
  const n = x.length;
  const code = `
    struct Params { a: f32, b: f32, n: u32 }
    @group(0) @binding(0) var<uniform> p: Params;
    @group(0) @binding(1) var<storage, read> x: array<f32>;
    @group(0) @binding(2) var<storage, read_write> y: array<f32>;
    @group(0) @binding(3) var<storage, read_write> total: array<f32>;
    var<workgroup> part: array<f32, 64>;
    @compute @workgroup_size(64)
    fn main(@builtin(local_invocation_index) i: u32) {
      var s = 0.0;
      for (var k = i; k < p.n; k += 64u) { y[k] = p.a * x[k] + p.b; s += x[k]; }
      part[i] = s;
      workgroupBarrier();
      if (i == 0u) { var t = 0.0; for (var j = 0u; j < 64u; j++) { t += part[j]; } total[0] = t; }
    }`;
  const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;
  const params = device.createBuffer({ size: 16, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
  const words = new ArrayBuffer(16);
  new Float32Array(words, 0, 2).set([a, b]);
  new Uint32Array(words, 8, 1)[0] = n;
  device.queue.writeBuffer(params, 0, words);
  const xb = device.createBuffer({ size: 4 * n, usage }), yb = device.createBuffer({ size: 4 * n, usage });
  const tb = device.createBuffer({ size: 4, usage });
  device.queue.writeBuffer(xb, 0, new Float32Array(x));
  const pipeline = device.createComputePipeline({
    layout: "auto", compute: { module: device.createShaderModule({ code }), entryPoint: "main" } });
  const group = device.createBindGroup({ layout: pipeline.getBindGroupLayout(0), entries:
    [params, xb, yb, tb].map((buffer, binding) => ({ binding, resource: { buffer } })) });
  const readback = device.createBuffer({ size: 4 * n + 4, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  pass.setPipeline(pipeline); pass.setBindGroup(0, group); pass.dispatchWorkgroups(1); pass.end();
  enc.copyBufferToBuffer(yb, 0, readback, 0, 4 * n);
  enc.copyBufferToBuffer(tb, 0, readback, 4 * n, 4);
  device.queue.submit([enc.finish()]);
  await readback.mapAsync(GPUMapMode.READ);
  const out = new Float32Array(readback.getMappedRange().slice(0));
  return { y: out.subarray(0, n), total: out[n], env: ctx.env };
}
"""


@pytest.fixture(scope="module")
def chromium():
    if B.chromium_skip_reason():
        yield None  # the tests that need it skip (or fail in CI) through B.require
        return
    with B.Chromium() as browser:
        yield browser


def run(env, tmp_path, source, args=None, browser=None, **kw):
    B.require(env)
    module = tmp_path / "case.mjs"
    module.write_text(source)
    return B.run_module(env, module, tmp_path, args, browser=browser, **kw)


@pytest.mark.parametrize("env", ENVS)
def test_a_wgsl_kernel_runs_with_numpys_values(env, tmp_path, chromium):
    rng = np.random.default_rng(1)
    x = rng.integers(-1000, 1000, size=300).astype(np.float32)
    out = run(env, tmp_path, SAXPY, {"a": 3.0, "b": -2.0, "x": x.tolist()}, chromium)
    assert out["env"] == env
    assert out["y"].dtype == np.float32 and out["y"].shape == (300,)
    np.testing.assert_array_equal(out["y"], 3.0 * x - 2.0)  # integers below 2^24: exact in float32
    assert out["total"] == float(x.astype(np.int64).sum())


@pytest.mark.parametrize("env", ENVS)
def test_typed_arrays_come_back_bit_exact(env, tmp_path, chromium):
    source = """export default async function (device, ctx) {
      return { f: new Float32Array([NaN, -0, Infinity, 1e-45, 0.1]), i: new Int32Array([-2147483648, 7]),
               u: new Uint32Array([4294967295]), plain: [1.5, "text", null], args: ctx.args };
    }"""
    out = run(env, tmp_path, source, {"nested": [1, 2]}, chromium)
    expected = np.array([np.nan, -0.0, np.inf, 1e-45, 0.1], np.float32)
    assert out["f"].tobytes() == expected.tobytes()
    assert out["i"].tolist() == [-2147483648, 7] and out["i"].dtype == np.int32
    assert out["u"].tolist() == [4294967295] and out["u"].dtype == np.uint32
    assert out["plain"] == [1.5, "text", None] and out["args"] == {"nested": [1, 2]}


@pytest.mark.parametrize("env", ENVS)
def test_default_limits_are_what_a_page_gets(env, tmp_path, chromium):
    source = """export default async function (device, ctx) {
      return { device: device.limits.maxStorageBuffersPerShaderStage,
               adapter: ctx.adapter.limits.maxStorageBuffersPerShaderStage };
    }"""
    default = run(env, tmp_path, source, browser=chromium)
    assert default["device"] == 8  # the WebGPU spec's default, whatever the adapter offers
    full = run(env, tmp_path, source, browser=chromium, limits="adapter")
    assert full["device"] == full["adapter"] >= 10


@pytest.mark.parametrize("env", ENVS)
def test_a_throw_names_the_module_and_the_message(env, tmp_path, chromium):
    source = 'export default async function () { throw new Error("the answer is not 42"); }'
    with pytest.raises(B.BrowserError, match=f"case.mjs failed in {env}:\n(.|\n)*Error: the answer is not 42"):
        run(env, tmp_path, source, browser=chromium)


@pytest.mark.parametrize("env", ENVS)
def test_a_console_error_fails_the_run(env, tmp_path, chromium):
    source = 'export default async function () { console.error("lost a particle"); return 1; }'
    with pytest.raises(B.BrowserError, match="lost a particle"):
        run(env, tmp_path, source, browser=chromium)


@pytest.mark.parametrize("env", ENVS)
def test_a_shader_webgpu_refuses_is_an_error_not_zeros(env, tmp_path, chromium):
    # WebGPU does not throw here: the pipeline is invalid, the dispatch is skipped, the read-back
    # would be zeros. The harness turns the device's uncaptured error into the failure.
    bad = SAXPY.replace("y[k] = p.a * x[k] + p.b;", "y[k] = p.a * x[k] + undefined_name;")
    with pytest.raises(B.BrowserError, match="WebGPU reported errors:(.|\n)*undefined_name"):
        run(env, tmp_path, bad, {"a": 1.0, "b": 0.0, "x": [1.0, 2.0]}, chromium)


@pytest.mark.parametrize("env", ENVS)
def test_a_missing_file_is_named(env, tmp_path, chromium):
    source = """export default async function (device, ctx) {
      const r = await fetch(new URL("export/manifest.json", ctx.base));
      if (!r.ok) throw new Error(`fetching export/manifest.json: ${r.status}`);
    }"""
    with pytest.raises(B.BrowserError, match="fetching export/manifest.json: 404(.|\n)*"
                                             "not found on the server: /export/manifest.json"):
        run(env, tmp_path, source, browser=chromium)


def test_the_server_gives_modules_a_javascript_mime_type_and_stays_in_its_folder(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "m.mjs").write_text("export const a = 1;")
    (tmp_path / "site" / "k.wgsl").write_text("fn f() {}")
    (tmp_path / "site" / "m.json").write_text(json.dumps({"a": 1}))
    (tmp_path / "secret.txt").write_text("not served")
    with B.Server({"/": tmp_path / "site"}) as server:
        def get(path):
            with urllib.request.urlopen(server.url + path) as r:
                return r.headers["Content-Type"], r.read()

        assert get("m.mjs") == ("text/javascript", b"export const a = 1;")
        assert get("k.wgsl")[0] == "text/plain"
        assert get("m.json")[0] == "application/json"
        for outside in ("../secret.txt", "%2e%2e/secret.txt"):
            with pytest.raises(urllib.error.HTTPError, match="404"):
                get(outside)
        assert "/secret.txt" in server.missing or "/%2e%2e/secret.txt" in server.missing


def test_bad_arguments_are_named(tmp_path):
    (tmp_path / "a").mkdir()
    with pytest.raises(ValueError, match="must be inside the served folder"):
        B.run_module("node", tmp_path / "m.mjs", tmp_path / "a")
    with pytest.raises(ValueError, match="env must be 'chromium' or 'node', not 'firefox'"):
        B.run_module("firefox", tmp_path / "a" / "m.mjs", tmp_path / "a")
    with pytest.raises(ValueError, match="limits must be 'default' or 'adapter', not 'max'"):
        B.run_module("node", tmp_path / "a" / "m.mjs", tmp_path / "a", limits="max")


def test_a_swiftshader_without_its_json_gets_one_written(tmp_path, monkeypatch):
    # Debian's package extracted (dpkg -x) rather than installed, or a build without the json:
    # the library alone is found through WGPU_AD_SWIFTSHADER and node runs on it
    B.require("node")
    installed = B.swiftshader_icd()
    lib = json.loads(installed.read_text())["ICD"]["library_path"]
    lib = (installed.parent / lib).resolve()
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libvk_swiftshader.so").symlink_to(lib)
    monkeypatch.setenv("WGPU_AD_SWIFTSHADER", str(tmp_path / "lib"))
    icd = B.swiftshader_icd.__wrapped__()
    assert icd.parent != tmp_path / "lib" and icd.name == "vk_swiftshader_icd.json"
    assert json.loads(icd.read_text())["ICD"]["library_path"] == str(tmp_path / "lib" / "libvk_swiftshader.so")
    monkeypatch.setattr(B, "swiftshader_icd", lambda: icd)
    (tmp_path / "site").mkdir()
    out = run("node", tmp_path / "site", SAXPY, {"a": 2.0, "b": 1.0, "x": [1.0, 2.0, 3.0]})
    assert out["y"].tolist() == [3.0, 5.0, 7.0]
