"""The browser demo (examples/browser), served as a user serves it (build.py's export next to
index.html): its page runs the Python-written gravity kernels and compute_U's adjoint in headless
Chromium with the values of the same substeps run by wgpu_ad in Python, and with the analytic
float64 forces; node + `webgpu` runs the same gravity.js as the fast check; a click adds a particle
where it lands and a drag throws it; the page draws; without WebGPU it says what is missing.

    python tests/test_browser_demo.py --screenshot   # the picture of the README and docs/browser.md
"""
from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import browser_env as B
import wgpu_ad as ti

pytestmark = pytest.mark.gpu  # build.py's export and the Python runs compile on wgpu_ad's adapter

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "browser"
EPS = 1e-3  # build.py's softening
N, K = 48, 12  # particles, substeps compared

# Runs `k` substeps from the state (x0, v0) in the demo's simulation (gravity.js) and returns the
# forces of the first tape (at x0), the state after it, and the state after all k.
STEPS_JS = """async (sim, x0, v0, k) => {
  const plain = (s) => ({ x: Array.from(s.x), v: Array.from(s.v), grad: Array.from(s.grad), U: s.U });
  sim.setState(x0, v0);
  await sim.substep();
  const first = plain(await sim.state());
  await sim.substeps(k - 1);
  return { first, last: plain(await sim.state()), dt: sim.dt, n: sim.n };
}"""


def load_build():
    spec = importlib.util.spec_from_file_location("browser_build", EXAMPLE / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """`python examples/browser/build.py --out SITE/export` (the export is not committed: it is the
    compiler's output of the day), and a copy of gravity.js beside it for node."""
    root = tmp_path_factory.mktemp("site")
    load_build().main(["--out", str(root / "export")])
    shutil.copy(EXAMPLE / "gravity.js", root)
    return root


def initial_state(n: int, seed: int = 7):
    """A disc of n particles turning slowly: float32, as the page holds it."""
    rng = np.random.default_rng(seed)
    r, a = 0.3 * np.sqrt(rng.uniform(size=n)), rng.uniform(0, 2 * np.pi, size=n)
    x = np.stack([0.5 + r * np.cos(a), 0.5 + r * np.sin(a)], 1).astype(np.float32)
    v = (3.0 * np.stack([-(x[:, 1] - 0.5), x[:, 0] - 0.5], 1)).astype(np.float32)
    return x, v


def analytic_grad(x: np.ndarray) -> np.ndarray:
    """dU/dx of U = sum over ordered pairs -1/sqrt(|xi - xj|^2 + EPS), in float64: each pair (i, j)
    appears twice, so dU/dxi = 2 sum_j (xi - xj) / (|xi - xj|^2 + EPS)^(3/2)."""
    x = x.astype(np.float64)
    d = x[:, None] - x[None]
    s = np.sqrt((d * d).sum(-1) + EPS)
    return 2 * (d / s[..., None] ** 3).sum(1)


def python_run(x0, v0, k: int, dt: float):
    """The same k substeps by wgpu_ad in Python (build.py's Gravity, here on lavapipe)."""
    ti.init()
    sim = load_build().Gravity()
    full = lambda a: np.concatenate([a, np.zeros((sim.capacity - len(a), 2), np.float32)])  # noqa: E731
    sim.x.from_numpy(full(x0))
    sim.v.from_numpy(full(v0))
    n = len(x0)
    for _ in range(k):
        sim.substep(n, dt)
    return sim.x.to_numpy()[:n], sim.v.to_numpy()[:n], sim.x.grad.to_numpy()[:n]


@pytest.fixture(scope="module")
def server(site):
    """examples/browser itself, with the fresh export at /export/ (as `python -m http.server -d
    examples/browser` serves it after build.py)."""
    with B.Server({"/": EXAMPLE, "/export/": site / "export"}) as server:
        yield server


def open_demo(browser, server, query: str) -> B.Page:
    page = browser.new_page(680, 800)
    page.goto(server.url + "index.html" + query)
    page.evaluate("demo.ready")  # rejects (a BrowserError with the console) when the page failed
    return page


def run_steps(env, site, browser, server, x0, v0, k):
    """STEPS_JS in the page (Chromium) or in node, from (x0, v0)."""
    args = [x0.ravel().tolist(), v0.ravel().tolist(), k]
    if env == "chromium":
        page = open_demo(browser, server, "?paused=1")
        try:
            out = page.evaluate(f"demo.serial(() => ({STEPS_JS})(demo.sim, ...{json.dumps(args)}))")
            assert not page.errors(), "\n".join(page.console)
            return out
        finally:
            page.close()
    module = site / "steps_case.mjs"
    module.write_text('import { createGravity } from "./gravity.js";\n'
                      "export default async function (device, ctx) {\n"
                      '  const sim = await createGravity(device, new URL("export/", ctx.base));\n'
                      f"  return ({STEPS_JS})(sim, ...ctx.args);\n}}\n")
    return B.run_module("node", module, site, args)


def flat(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float64).reshape(-1, 2)


@pytest.mark.parametrize("env", ["node", "chromium"])
def test_the_demo_runs_the_python_kernels_and_their_adjoint_with_pythons_values(env, site, server, chromium):
    B.require(env)
    x0, v0 = initial_state(N)
    out = run_steps(env, site, chromium, server, x0, v0, K)
    dt = out["dt"]
    assert out["n"] == N and dt == pytest.approx(2.5e-3 / N)

    # Tolerances for float32: the forces are sums of N terms up to 1/EPS^1.5 in size; measured
    # (N = 48 and 128, Chromium and node on SwiftShader) within 5e-7 of the largest force, the
    # states within 3e-7 relative: the bounds below leave a factor of 4 to 10.
    # The first tape's forces against the float64 analytic gradient...
    g_ref = analytic_grad(x0)
    scale = np.abs(g_ref).max()
    np.testing.assert_allclose(flat(out["first"]["grad"]), g_ref, rtol=0, atol=2e-6 * scale)
    # ...and the step they drove: symplectic Euler, in float64
    v1 = v0 - dt * g_ref
    np.testing.assert_allclose(flat(out["first"]["v"]), v1, rtol=0, atol=2e-6 * np.abs(v1).max())
    np.testing.assert_allclose(flat(out["first"]["x"]), x0 + dt * v1, rtol=0, atol=3e-7)

    # All K substeps against wgpu_ad in Python (lavapipe): the same kernels on another float32
    # device, the atomic sums in another order.
    x_py, v_py, g_py = python_run(x0, v0, K, dt)
    last = out["last"]
    np.testing.assert_allclose(flat(last["x"]), x_py, rtol=0, atol=3e-7)
    np.testing.assert_allclose(flat(last["v"]), v_py, rtol=0, atol=2e-6 * np.abs(v_py).max())
    np.testing.assert_allclose(flat(last["grad"]), g_py, rtol=0, atol=2e-6 * np.abs(g_py).max())
    assert np.abs(x_py - x0).max() > 1e-4  # the particles moved: the comparison is not of the start


def mouse(page, kind: str, x: float, y: float, **more) -> None:
    page.call("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1, **more})


def test_a_click_adds_a_particle_where_it_lands(server, chromium):
    B.require("chromium")
    page = open_demo(chromium, server, "?paused=1&n=16")
    try:
        box = page.evaluate("(() => { const r = document.getElementById('view').getBoundingClientRect();"
                            " return [r.x, r.y, r.width, r.height]; })()")
        x, y = box[0] + 0.25 * box[2], box[1] + 0.75 * box[3]  # at (0.25, 0.25) in simulation units (y up)
        mouse(page, "mousePressed", x, y)
        mouse(page, "mouseReleased", x, y)
        n = page.wait_for("demo.sim.n === 17 && demo.sim.n", timeout=10)
        state = page.evaluate("demo.serial(async () => { const s = await demo.sim.state();"
                              " return { x: Array.from(s.x), v: Array.from(s.v) }; })")
        assert n == 17
        np.testing.assert_allclose(state["x"][-2:], [0.25, 0.25], atol=2 / box[2])  # within 2 pixels
        assert state["v"][-2:] == [0.0, 0.0]  # a click without a drag: at rest

        # a drag throws one: pressed at (0.25, 0.25), released at (0.75, 0.25); its velocity is the
        # drag times 2 sqrt(n), n = 17 before it
        x2 = box[0] + 0.75 * box[2]
        mouse(page, "mousePressed", x, y)
        mouse(page, "mouseMoved", x2, y, buttons=1)
        mouse(page, "mouseReleased", x2, y)
        page.wait_for("demo.sim.n === 18", timeout=10)
        state = page.evaluate("demo.serial(async () => { const s = await demo.sim.state();"
                              " return { x: Array.from(s.x), v: Array.from(s.v) }; })")
        np.testing.assert_allclose(state["x"][-2:], [0.25, 0.25], atol=2 / box[2])
        speed = 2 * np.sqrt(17)
        np.testing.assert_allclose(state["v"][-2:], [0.5 * speed, 0.0], atol=2 / box[2] * speed)
        assert not page.errors(), "\n".join(page.console)
    finally:
        page.close()


def test_the_page_draws_the_particles(server, chromium, tmp_path):
    B.require("chromium")
    page = open_demo(chromium, server, "?n=64&substeps=2&arrows=1")
    try:
        page.wait_for("document.getElementById('stats').textContent.includes('N = 64')", timeout=30)
        lit = page.evaluate("(() => { const c = document.getElementById('view');"
                            " const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
                            " let lit = 0; for (let i = 0; i < d.length; i += 4) lit += d[i] > 60;"
                            " return lit; })()")
        assert 64 * 5 < lit < 640 * 640 / 4, f"{lit} bright pixels: not 64 particles on a dark background"
        png = page.screenshot(tmp_path / "page.png")
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert not page.errors(), "\n".join(page.console)
    finally:
        page.close()


def test_without_webgpu_the_page_says_what_is_missing(server, chromium):
    B.require("chromium")
    page = chromium.new_page(680, 800)
    try:
        # a browser without WebGPU: navigator.gpu is undefined before the page's scripts run
        page.call("Page.addScriptToEvaluateOnNewDocument", {"source": "delete Navigator.prototype.gpu;"})
        page.goto(server.url + "index.html")
        with pytest.raises(B.BrowserError, match="This browser has no WebGPU"):
            page.evaluate("demo.ready")
        shown = page.wait_for("document.getElementById('error').textContent", timeout=10)
        assert shown.startswith("This browser has no WebGPU (navigator.gpu is undefined). Chrome and Edge 113+")
        assert page.evaluate("document.getElementById('stats').textContent") == "stopped"
    finally:
        page.close()


PICTURES = [EXAMPLE.parent / "images" / "browser.png", EXAMPLE.parents[1] / "docs" / "images" / "browser.png"]


def test_the_docs_show_the_readmes_picture():
    assert PICTURES[0].read_bytes() == PICTURES[1].read_bytes(), \
        "docs/images/browser.png differs from examples/images/browser.png: python tests/test_browser_demo.py --screenshot"


def screenshot(paths, query: str = "?arrows=1&n=192", seconds: float = 90) -> None:
    """The README's picture: the page after `seconds` of its run (on SwiftShader about 100 frames), forces drawn."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp, B.Chromium() as browser:
        load_build().main(["--out", str(Path(tmp) / "export")])
        with B.Server({"/": EXAMPLE, "/export/": Path(tmp) / "export"}) as srv:
            page = open_demo(browser, srv, query)
            page.wait_for(f"demo.sim && performance.now() > {1000 * seconds}", timeout=seconds + 60, poll=1.0)
            page.screenshot(paths[0], selector="main")
            for p in paths[1:]:
                shutil.copy(paths[0], p)
            print("wrote", ", ".join(map(str, paths)))


if __name__ == "__main__":
    if sys.argv[1:] == ["--screenshot"]:
        screenshot(PICTURES)
    else:
        sys.exit(__doc__)
