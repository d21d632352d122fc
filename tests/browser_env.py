"""Run JavaScript that uses WebGPU from tests: in headless Chromium and in node + Dawn.

    reason = chromium_skip_reason()          # None, or why the Chromium tests are skipped
    with Chromium() as browser:              # one headless browser; pages are cheap
        value = run_module("chromium", tmp_path / "case.mjs", tmp_path, {"n": 4}, browser=browser)
    value = run_module("node", tmp_path / "case.mjs", tmp_path, {"n": 4})

A test module is an ES module under the served folder with a default export
`async function (device, ctx)`; `ctx.args` is what Python passed, `ctx.base` the served folder's URL
(fetch exported kernels from there: the same in Chromium and node), `ctx.env` "chromium" or "node".
Its return value comes back as JSON, typed arrays as NumPy arrays (bit-exact). The run fails with a
`BrowserError` carrying the browser's console when the module throws, when WebGPU reports an error
(validation errors do not throw in JavaScript: a broken pipeline reads back zeros) or when anything
is logged at the error level.

Why Chromium is driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`, the transport
Puppeteer uses), with the standard library only: nothing to install besides Debian's chromium (no
Playwright wheel and its node driver, no browser download, no websocket client), no port to find, and
the few commands used (Target, Runtime.evaluate, console events, Page.captureScreenshot) have been
stable in the protocol for years. node runs the same harness (tests/browser/harness.mjs) with the
`webgpu` package (`npm ci --prefix tests/browser`) on SwiftShader, the software Vulkan driver that
Debian's chromium package ships (Dawn refuses lavapipe).
"""
from __future__ import annotations

import base64
import functools
import http.server
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

HARNESS = Path(__file__).resolve().parent / "browser"  # harness.html, harness.mjs, run_node.mjs, package.json
HARNESS_URL = "/__harness__/"                             # where the server mounts HARNESS

CHROMIUM_FLAGS = (
    "--headless=new", "--no-sandbox",   # CI runs as root in a container
    # WebGPU on Linux, here on SwiftShader (Vulkan on the CPU); it ran with and without --disable-gpu
    # (Chromium 156), and --use-angle=vulkan hangs
    "--enable-unsafe-webgpu",
    "--disable-dev-shm-usage",          # containers have a small /dev/shm
    # the network is closed: no background connections (they are refused and logged as errors)
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-quic", "--no-first-run", "--no-default-browser-check", "--mute-audio",
    "--hide-scrollbars",
)
# Chromium and node print this to stderr on a machine without a session bus / XDG_RUNTIME_DIR
_STDERR_NOISE = ("dbus", "XDG_RUNTIME_DIR", "Fontconfig")


class BrowserError(RuntimeError):
    """JavaScript failed in Chromium or node; the message carries its error and the console."""


# ---- what is installed ------------------------------------------------------------------------

def chromium_path() -> str | None:
    """The Chromium executable: $WGPU_AD_CHROMIUM, else Debian's chromium on the PATH."""
    if os.environ.get("WGPU_AD_CHROMIUM"):
        return os.environ["WGPU_AD_CHROMIUM"]
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def chromium_skip_reason() -> str | None:
    """None when headless Chromium can run the tests, else why not and what to install."""
    if chromium_path() is None:
        return "no Chromium: apt-get install chromium (or set WGPU_AD_CHROMIUM to a Chromium binary)"
    return None


def chromium_available() -> bool:
    return chromium_skip_reason() is None


@functools.lru_cache(maxsize=None)
def swiftshader_icd() -> Path | None:
    """A Vulkan ICD json for SwiftShader's libvk_swiftshader.so (Debian's chromium package ships both;
    the package may also be extracted with dpkg -x rather than installed): $WGPU_AD_SWIFTSHADER names
    the .so or its folder. Where the json is missing, one is written into a temporary folder."""
    dirs = [Path(p) for p in (os.environ.get("WGPU_AD_SWIFTSHADER", ""),) if p]
    dirs += [Path("/usr/lib/chromium"), Path("/opt/google/chrome")]
    if chromium_path():
        dirs.append(Path(os.path.realpath(chromium_path())).parent)
    for d in dirs:
        lib = d if d.suffix == ".so" else d / "libvk_swiftshader.so"
        if not lib.is_file():
            continue
        icd = lib.parent / "vk_swiftshader_icd.json"
        if icd.is_file():
            return icd
        icd = Path(tempfile.mkdtemp(prefix="swiftshader_icd_")) / "vk_swiftshader_icd.json"
        icd.write_text(json.dumps({"file_format_version": "1.0.0",
                                   "ICD": {"library_path": str(lib), "api_version": "1.0.5"}}))
        return icd
    return None


@functools.lru_cache(maxsize=None)
def node_skip_reason() -> str | None:
    """None when node + the `webgpu` package can run the tests, else why not and what to install."""
    node = shutil.which("node")
    if node is None:
        return "no node: install node 20 (node + the npm package `webgpu` is the fast check)"
    version = subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()
    if int(version.lstrip("v").split(".")[0]) < 20:
        return f"node {version} is too old: the `webgpu` package needs node 20"
    if not (HARNESS / "node_modules" / "webgpu").is_dir():
        return f"the npm package `webgpu` is not installed: npm ci --prefix {HARNESS}"
    if swiftshader_icd() is None:
        return ("no SwiftShader Vulkan driver (libvk_swiftshader.so, in Debian's chromium package): "
                "apt-get install chromium, or set WGPU_AD_SWIFTSHADER to the folder holding it")
    return None


def skip_reason(env: str) -> str | None:
    """Why `env` ("chromium" or "node") cannot run here, or None."""
    return chromium_skip_reason() if env == "chromium" else node_skip_reason()


def require(env: str) -> None:
    """Skip the calling test when `env` cannot run here; where WGPU_AD_REQUIRE_BROWSER=1 (CI, which
    installs both) fail it instead, so a broken install cannot pass as a skip."""
    import pytest

    reason = skip_reason(env)
    if reason and os.environ.get("WGPU_AD_REQUIRE_BROWSER") == "1":
        pytest.fail(f"WGPU_AD_REQUIRE_BROWSER=1 but {reason}")
    if reason:
        pytest.skip(reason)


# ---- a static file server -----------------------------------------------------------------------

MIME = {".html": "text/html", ".js": "text/javascript", ".mjs": "text/javascript",
        ".wgsl": "text/plain", ".json": "application/json", ".css": "text/css",
        ".png": "image/png", ".svg": "image/svg+xml", ".bin": "application/octet-stream"}


class Server:
    """Serves folders over http on a free localhost port, in a thread: `mounts` maps URL prefixes
    ("/" or "/lib/") to folders. Module scripts need a JavaScript MIME type; nothing is cached.
    Requests that found nothing are kept in `missing` (the usual cause of a page that fails)."""

    def __init__(self, mounts: dict[str, Path | str]):
        self.mounts = sorted(((p if p.endswith("/") else p + "/", Path(d).resolve()) for p, d in mounts.items()),
                             key=lambda m: -len(m[0]))
        self.missing: list[str] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                path = self.path.split("?", 1)[0].split("#", 1)[0]
                target = server.find(path)
                if target is None:
                    server.missing.append(path)
                    self.send_error(404, f"nothing served at {path}")
                    return
                body = target.read_bytes()
                self.send_response(200)
                self.send_header("Content-Type", MIME.get(target.suffix, "application/octet-stream"))
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # quiet: failures are reported through `missing`
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def find(self, url_path: str) -> Path | None:
        from urllib.parse import unquote

        url_path = unquote(url_path)
        for prefix, folder in self.mounts:
            if url_path.startswith(prefix):
                target = (folder / url_path[len(prefix):]).resolve()
                if target.is_dir():
                    target = target / "index.html"
                if target.is_relative_to(folder) and target.is_file():
                    return target
                return None
        return None

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---- headless Chromium over the DevTools protocol ----------------------------------------------

class Chromium:
    """One headless Chromium, driven over `--remote-debugging-pipe` (fds 3 and 4, NUL-separated JSON).
    Calls are synchronous: each reads messages until its reply, filing the events met on the way
    (console messages, exceptions) with the page they belong to."""

    def __init__(self, executable: str | None = None, timeout: float = 30.0):
        executable = executable or chromium_path()
        if executable is None:
            raise BrowserError(chromium_skip_reason())
        self.profile = tempfile.mkdtemp(prefix="wgpu_ad_chromium_")
        self.stderr = open(os.path.join(self.profile, "stderr.log"), "w+")
        to_browser, self._out = os.pipe()    # we write commands, Chromium reads fd 3
        self._in, from_browser = os.pipe()   # Chromium writes fd 4, we read replies and events
        # a small exec wrapper puts the pipe ends on fds 3 and 4 (Popen keeps fd numbers as they are)
        wrapper = ("import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); "
                   "os.execv(sys.argv[3], sys.argv[3:])")
        argv = [executable, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-pipe",
                "about:blank"]
        self.proc = subprocess.Popen([sys.executable, "-c", wrapper, str(to_browser), str(from_browser), *argv],
                                     pass_fds=(to_browser, from_browser), stdin=subprocess.DEVNULL,
                                     stdout=self.stderr, stderr=self.stderr)
        os.close(to_browser)
        os.close(from_browser)
        self._buffer, self._next_id = b"", 0
        self.pages: dict[str, Page] = {}
        self.call("Browser.getVersion", timeout=timeout)  # waits until the browser answers

    # -- the protocol --
    def _read(self, deadline: float, waiting_for: str) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            ready = select.select([self._in], [], [], max(left, 0))[0] if left > 0 else []
            if not ready:
                raise BrowserError(f"Chromium did not answer {waiting_for} in time" + self._context())
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise BrowserError(f"Chromium closed the connection while waiting for {waiting_for}"
                                   + self._context())
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 30.0) -> dict:
        """Send one command, return its result; protocol errors raise BrowserError."""
        self._next_id += 1
        ident = self._next_id
        message = {"id": ident, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        data = memoryview(json.dumps(message).encode() + b"\0")
        while data:  # a pipe may take a long message in parts
            data = data[os.write(self._out, data):]
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline, method)
            if reply.get("id") == ident:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error'].get('message')}" + self._context(session))
                return reply.get("result", {})
            self._dispatch(reply)

    def wait_event(self, done, timeout: float, waiting_for: str) -> None:
        """Read events until `done()` is true."""
        deadline = time.monotonic() + timeout
        while not done():
            self._dispatch(self._read(deadline, waiting_for))

    def _dispatch(self, message: dict) -> None:
        page = self.pages.get(message.get("sessionId"))
        if page is not None and "method" in message:
            page._event(message["method"], message.get("params", {}))

    def _context(self, session: str | None = None) -> str:
        page = self.pages.get(session) if session else None
        text = ""
        if page is not None and page.console:
            text += "\nconsole:\n" + "\n".join("  " + line for line in page.console[-40:])
        if self.proc.poll() is not None:
            self.stderr.flush()
            self.stderr.seek(0)
            lines = [ln for ln in self.stderr.read().splitlines() if not any(n in ln for n in _STDERR_NOISE)]
            text += f"\nChromium exited with status {self.proc.returncode}; its stderr:\n" + "\n".join(lines[-30:])
        return text

    def new_page(self, width: int = 800, height: int = 600) -> "Page":
        target = self.call("Target.createTarget", {"url": "about:blank"})
        session = self.call("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})
        page = Page(self, target["targetId"], session["sessionId"])
        self.pages[page.session] = page
        for domain in ("Runtime", "Log", "Page"):
            page.call(f"{domain}.enable")
        page.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        return page

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.call("Browser.close", timeout=5)
            except BrowserError:
                pass
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        os.close(self._out)
        os.close(self._in)
        self.stderr.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Page:
    """A tab. `console` holds what the page logged ("error: ...", "exception: ..."); `errors()` those
    at the error level."""

    def __init__(self, browser: Chromium, target: str, session: str):
        self.browser, self.target, self.session = browser, target, session
        self.console: list[str] = []
        self._loaded = False

    def call(self, method: str, params: dict | None = None, timeout: float = 30.0) -> dict:
        return self.browser.call(method, params, self.session, timeout)

    def _event(self, method: str, params: dict) -> None:
        if method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", a.get("type")))) for a in params["args"])
            level = {"warning": "warning", "error": "error", "assert": "error"}.get(params["type"], "log")
            self.console.append(f"{level}: {text}")
        elif method == "Runtime.exceptionThrown":
            d = params["exceptionDetails"]
            text = d.get("exception", {}).get("description") or d.get("text", "")
            self.console.append(f"exception: {text} ({d.get('url', '')}:{d.get('lineNumber', 0) + 1})")
        elif method == "Log.entryAdded":
            e = params["entry"]  # the browser's own messages: a failed request, a WebGPU warning
            self.console.append(f"{e['level']}: [{e['source']}] {e['text']} {e.get('url', '')}".rstrip())
        elif method == "Page.loadEventFired":
            self._loaded = True

    def errors(self) -> list[str]:
        return [c for c in self.console if c.startswith(("error:", "exception:"))]

    def goto(self, url: str, timeout: float = 30.0) -> None:
        """Load `url` and wait for its load event (module scripts without top-level await have run)."""
        self._loaded = False
        reply = self.call("Page.navigate", {"url": url}, timeout)
        if reply.get("errorText"):
            raise BrowserError(f"loading {url}: {reply['errorText']}")
        self.browser.wait_event(lambda: self._loaded, timeout, f"the load event of {url}")

    def evaluate(self, expression: str, timeout: float = 60.0) -> Any:
        """The value of a JavaScript expression (a promise is awaited), as JSON. A thrown exception
        raises BrowserError with the page's console."""
        reply = self.call("Runtime.evaluate", {"expression": expression, "awaitPromise": True,
                                               "returnByValue": True}, timeout)
        if "exceptionDetails" in reply:
            d = reply["exceptionDetails"]
            text = d.get("exception", {}).get("description") or d.get("text", "")
            raise BrowserError(f"JavaScript threw: {text}" + self.browser._context(self.session))
        return reply["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60.0, poll: float = 0.05) -> Any:
        """Evaluate `expression` until it is truthy, and return it."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression, timeout)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"{expression} still false after {timeout:.0f} s"
                                   + self.browser._context(self.session))
            time.sleep(poll)

    def screenshot(self, path: Path | str, selector: str | None = None) -> Path:
        """A PNG of the page, or of the element `selector` selects."""
        params: dict = {"format": "png"}
        if selector:
            box = self.evaluate(f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
                                ".getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; })()")
            params["clip"] = dict(zip(("x", "y", "width", "height"), box), scale=1)
        data = self.call("Page.captureScreenshot", params)["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)

    def close(self) -> None:
        self.browser.call("Target.closeTarget", {"targetId": self.target})
        self.browser.pages.pop(self.session, None)


# ---- running a test module ----------------------------------------------------------------------

_TYPED = {"Float32Array": np.float32, "Float64Array": np.float64, "Int32Array": np.int32,
          "Uint32Array": np.uint32, "Int16Array": np.int16, "Uint16Array": np.uint16,
          "Int8Array": np.int8, "Uint8Array": np.uint8, "Uint8ClampedArray": np.uint8}


def decode(value: Any) -> Any:
    """The harness's JSON with its typed arrays ({"$typed", "base64"}) turned into NumPy arrays."""
    if isinstance(value, dict):
        if set(value) == {"$typed", "base64"}:
            return np.frombuffer(base64.b64decode(value["base64"]), dtype=_TYPED[value["$typed"]]).copy()
        return {k: decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode(v) for v in value]
    return value


def run_module(env: str, module: Path | str, root: Path | str, args: Any = None, *,
               limits: str = "default", timeout: float = 60.0, browser: Chromium | None = None) -> Any:
    """Run the ES module `module` (a file under `root`, which is served over http) in `env`:
    "chromium" (headless, in `browser` or a new one) or "node" (+ `webgpu` on SwiftShader).
    `limits`: "default" (what a web page gets) or "adapter" (all the adapter offers)."""
    module, root = Path(module).resolve(), Path(root).resolve()
    if not module.is_relative_to(root):
        raise ValueError(f"run_module: the module {module} must be inside the served folder {root}")
    if limits not in ("default", "adapter"):
        raise ValueError(f"run_module: limits must be 'default' or 'adapter', not {limits!r}")
    with Server({"/": root, HARNESS_URL: HARNESS}) as server:
        ctx = {"args": args, "base": server.url, "limits": limits}
        if env == "chromium":
            reply = _run_chromium(browser, server, "/" + module.relative_to(root).as_posix(), ctx, timeout)
        elif env == "node":
            reply = _run_node(module, ctx, timeout)
        else:
            raise ValueError(f"run_module: env must be 'chromium' or 'node', not {env!r}")
        if server.missing and not reply.get("ok"):
            reply["error"] += "\nnot found on the server: " + ", ".join(server.missing)
    if not reply["ok"]:
        raise BrowserError(f"{module.name} failed in {env}:\n{reply['error']}")
    return decode(reply["value"])


def _run_chromium(browser: Chromium | None, server: Server, module_url: str, ctx: dict, timeout: float) -> dict:
    own = browser is None
    browser = browser or Chromium()
    try:
        page = browser.new_page()
        try:
            page.goto(server.url + HARNESS_URL.lstrip("/") + "harness.html", timeout)
            reply = page.evaluate(f"runHarness({json.dumps(module_url)}, {json.dumps(ctx)})", timeout)
            page.evaluate("0")  # collect console events that came with the reply
            errors = page.errors()
            if reply["ok"] and errors:
                reply = {"ok": False, "error": "the page logged errors"}
            if not reply["ok"] and page.console:
                reply["error"] += "\nconsole:\n" + "\n".join("  " + c for c in page.console[-40:])
            return reply
        finally:
            page.close()
    finally:
        if own:
            browser.close()


def _run_node(module: Path, ctx: dict, timeout: float) -> dict:
    reason = node_skip_reason()
    if reason:
        raise BrowserError(reason)
    with tempfile.TemporaryDirectory(prefix="wgpu_ad_node_") as tmp:
        ctx_file, out_file = Path(tmp, "ctx.json"), Path(tmp, "out.json")
        ctx_file.write_text(json.dumps(ctx))
        icd = str(swiftshader_icd())
        env = dict(os.environ, VK_ICD_FILENAMES=icd, VK_DRIVER_FILES=icd)
        env.setdefault("XDG_RUNTIME_DIR", tempfile.gettempdir())
        try:
            proc = subprocess.run(["node", str(HARNESS / "run_node.mjs"), str(module), str(ctx_file), str(out_file)],
                                  capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired as e:
            return {"ok": False, "error": f"node did not finish in {timeout:.0f} s\n{e.stderr or ''}"}
        output = "\n".join(ln for ln in (proc.stdout + proc.stderr).splitlines()
                           if not any(n in ln for n in _STDERR_NOISE))
        if proc.returncode != 0:
            return {"ok": False, "error": output or f"node exited with status {proc.returncode}"}
        return {"ok": True, "value": json.loads(out_file.read_text())}
