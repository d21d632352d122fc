"""Run Taichi's own autodiff test files against wgpu_ad, through a stand-in `taichi` package.

    python -m benchmarks.taichi_suite PATH_TO_TAICHI_GIT_DIR [--rev HEAD] [--files a.py,b.py]
                                      [--json OUT] [--keep DIR] [--timeout 1800] [--f64-as-f32]

The files (tests/python/test_ad_*.py, every tests/python/test_*grad*.py, test_torch_ad.py) are read
with `git show REV:path` into a temporary directory, never into this repository, beside our own glue
from benchmarks/taichi_shim/: a package `taichi` that is wgpu_ad plus the few names Taichi's tests
import from Taichi's internals, a tests/test_utils.py whose `test()` decorator runs each test once on
wgpu_ad (skipping float64-only and CUDA-only variants, with the reason), and a conftest.py that
calls ti.init / ti.reset around each test. pytest runs each file in a subprocess; the counts per file
and one line per failure are printed.

"Runnable in f32" = the test items pytest collects, less those skipped as f64-only or CUDA-only by
the decorator (with torch installed, no other skip applies). --f64-as-f32 runs the f64-only
variants too, under ti.init(f64="f32"), and counts them apart (ids ending in -f64-as-f32).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

SHIM = Path(__file__).resolve().parent / "taichi_shim"
NOT_RUNNABLE = ("f64-only", "CUDA-only")


def autodiff_files(git_dir: str, rev: str) -> list[str]:
    """Taichi's autodiff test files at rev: test_ad_*.py, test_*grad*.py, test_torch_ad.py."""
    out = subprocess.run(["git", f"--git-dir={git_dir}", "ls-tree", "--name-only", f"{rev}:tests/python"],
                         check=True, capture_output=True, text=True).stdout.split()
    return sorted(n for n in out if n.endswith(".py") and
                  (n.startswith("test_ad_") or ("grad" in n and n.startswith("test_")) or n == "test_torch_ad.py"))


def lay_out(git_dir: str, rev: str, files: list[str], root: Path) -> None:
    """Taichi's files under root/tests/python, our glue around them."""
    py = root / "tests" / "python"
    py.mkdir(parents=True)
    (root / "tests" / "__init__.py").write_text("")
    (py / "__init__.py").write_text("")
    shutil.copy(SHIM / "glue" / "test_utils_shim.py", root / "tests" / "test_utils.py")
    shutil.copy(SHIM / "glue" / "conftest_shim.py", py / "conftest.py")
    shutil.copytree(SHIM / "taichi", root / "taichi", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    for name in files:
        text = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{rev}:tests/python/{name}"],
                              check=True, capture_output=True).stdout
        (py / name).write_bytes(text)


def run_file(root: Path, name: str, timeout: float, f64_as_f32: bool = False) -> tuple[list[dict], str]:
    """pytest on one file; its test cases as dicts (name, outcome, message) and pytest's last line."""
    xml = root / f"{name}.xml"
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TAICHI_SUITE_F64_AS_F32="1" if f64_as_f32 else "0")
    env.setdefault("XDG_RUNTIME_DIR", "/tmp/xdg")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", f"--junitxml={xml}", f"tests/python/{name}"]
    try:
        p = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
        tail = (p.stdout.strip().splitlines() or [""])[-1]
    except subprocess.TimeoutExpired:
        return [dict(name=name, outcome="error", message=f"timed out after {timeout:.0f} s")], "timeout"
    if not xml.exists():
        return [dict(name=name, outcome="error", message=f"pytest wrote no report: {tail}")], tail
    return parse_junit(xml), tail


def parse_junit(path: Path) -> list[dict]:
    cases = []
    for tc in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for child in tc:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                message = child.get("message") or (child.text or "")
                break
        cases.append(dict(name=tc.get("name"), outcome=outcome, message=_one_line(message)))
    return cases


def _one_line(message: str) -> str:
    """The first two lines of a failure (an assert's own message, then what it compared)."""
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    return " | ".join(lines[:2])[:240]


def _f64_as_f32(case: dict) -> bool:
    return "-f64-as-f32" in case["name"]


def _runnable(case: dict) -> bool:
    """A test item that runs in float32: not skipped as f64-only / CUDA-only (and not an f64
    variant run under f64="f32", counted apart)."""
    return not (_f64_as_f32(case) or case["outcome"] == "skipped" and any(r in case["message"] for r in NOT_RUNNABLE))


def _not_passing(results: dict, which) -> list[str]:
    return [f"  {name}::{case['name']} [{case['outcome']}] {case['message']}" for name, cases in results.items()
            for case in cases if which(case) and case["outcome"] != "passed"]


def report(results: dict[str, list[dict]], commit: str) -> str:
    lines = [f"Taichi's autodiff tests at taichi-dev/taichi {commit} on wgpu_ad",
             f"{'file':<48} {'passed':>6} {'failed':>6} {'errors':>6} {'skipped':>7}  runnable"]
    total = Counter()
    for name, cases in results.items():
        c = Counter(case["outcome"] for case in cases if not _f64_as_f32(case))
        runnable = sum(_runnable(case) for case in cases)
        total.update(c)
        total["runnable"] += runnable
        lines.append(f"{name:<48} {c['passed']:>6} {c['failed']:>6} {c['error']:>6} {c['skipped']:>7}  {runnable}")
    lines.append(f"{'total':<48} {total['passed']:>6} {total['failed']:>6} {total['error']:>6} "
                 f"{total['skipped']:>7}  {total['runnable']}")
    reasons = Counter(case["message"].split(":")[0] for cases in results.values() for case in cases
                      if case["outcome"] == "skipped")
    lines.append("skipped: " + (", ".join(f"{n} {r}" for r, n in reasons.most_common()) or "none"))
    f32 = [c for cases in results.values() for c in cases if _runnable(c)]
    lines.append(f"PASSED {sum(c['outcome'] == 'passed' for c in f32)} of {len(f32)} runnable in f32")
    if bad := _not_passing(results, _runnable):
        lines += ["not passing:"] + bad
    f64 = [c for cases in results.values() for c in cases if _f64_as_f32(c)]
    if f64:
        lines.append(f"f64-only variants under ti.init(f64=\"f32\"): {sum(c['outcome'] == 'passed' for c in f64)} "
                     f"passed of {len(f64)}")
        if bad := _not_passing(results, _f64_as_f32):
            lines += ["not passing (f64 as f32):"] + bad
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("git_dir", help="a clone (or bare git dir) of taichi-dev/taichi")
    ap.add_argument("--rev", default="HEAD")
    ap.add_argument("--files", help="comma-separated file names under tests/python (default: the autodiff set)")
    ap.add_argument("--json", help="write the per-test results here")
    ap.add_argument("--keep", help="lay the files out here (kept) instead of in a temporary directory")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per file")
    ap.add_argument("--f64-as-f32", action="store_true",
                    help='also run the f64-only variants, under ti.init(f64="f32"), counted apart')
    args = ap.parse_args(argv)

    commit = subprocess.run(["git", f"--git-dir={args.git_dir}", "rev-parse", args.rev],
                            check=True, capture_output=True, text=True).stdout.strip()
    files = args.files.split(",") if args.files else autodiff_files(args.git_dir, commit)
    try:
        import autograd  # noqa: F401  (test_ad_basics.py's references: without it those tests check nothing)
    except ImportError:
        print("warning: `autograd` is not installed: test_ad_basics.py's grad_test cases pass without "
              "checking anything (pip install autograd)", file=sys.stderr)
    results = {}
    with tempfile.TemporaryDirectory(prefix="taichi-suite-") as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        if args.keep:
            shutil.rmtree(root, ignore_errors=True)
        lay_out(args.git_dir, commit, files, root)
        for name in files:
            t0 = time.perf_counter()
            results[name], tail = run_file(root, name, args.timeout, args.f64_as_f32)
            print(f"{name}: {tail} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    print(report(results, commit))
    if args.json:
        Path(args.json).write_text(json.dumps(dict(commit=commit, results=results), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
