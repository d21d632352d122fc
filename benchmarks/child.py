"""One measurement in a fresh Python process: its own device and compile cache, and libraries
(torch, Taichi) that stay out of the driver. The child prints `RESULT <json>`; anything else it
prints is ignored, and a failure comes back as {"error": its last line}."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(module: str, call: str, timeout: float = 1800) -> dict:
    """`call` (a Python expression over `module`, imported as m) evaluated in a child process."""
    code = f"import json, {module} as m; print('RESULT ' + json.dumps({call}))"
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"no result in {timeout:.0f} s"}
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    if r.returncode != 0 or line is None:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": tail[0]}
    return json.loads(line[len("RESULT "):])
