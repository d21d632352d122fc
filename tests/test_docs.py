"""Every code block of the documentation runs as a test, so the docs cannot drift from the code.

Pages: README.md and docs/*.md. The ```python blocks of a page run in order in one namespace (a
later block uses what an earlier one defined), one test per block, each compiled under the page's
own path and line numbers, so kernels find their source and error messages point into the page.

What a block must do is written next to it, visible to the reader:
- a ```text block right after a python block is its expected output: what it prints, then the
  warnings it gives (`GradientWarning: ...`), compared line by line;
- a ```pytb block right after a python block says the block raises: `ExceptionName: message`,
  compared in full with what it raised.
Blocks in other languages (sh, text, wgsl ...) are not run; `<!-- docs-test: skip -->` on the line
before a python block leaves it out too. `<!-- docs-test: xfail #N -->` there marks a block that
shows what an open issue will make work: it must fail today (strict: once it passes, the marker and
the page's "not yet" go). A block that mentions torch is skipped when torch is not installed.

WGPU_AD_DOCS_UPDATE=1 writes the actual output into the text / pytb blocks instead of comparing
(then review the diff; run twice when a block's output changes its number of lines, since later
messages carry line numbers).
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))
UPDATE = os.environ.get("WGPU_AD_DOCS_UPDATE", "") not in ("", "0")
HAVE_TORCH = importlib.util.find_spec("torch") is not None
SKIP_MARK = "<!-- docs-test: skip -->"
_XFAIL = re.compile(r"^<!-- docs-test: xfail (?P<reason>.+?) -->$")
LOOP_LIMIT_MARK = "<!-- docs-test: loop-limit -->"
_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)[^\n]*$")


@dataclass
class Block:
    lang: str
    code: str
    first: int             # 1-based line of the block's first code line
    last: int              # 1-based line of its closing fence
    skip: bool = False
    xfail: str | None = None  # the reason (an open issue) it fails today
    loop_limit: bool = False  # shows what older Mesa llvmpipe does: skipped where loops are not limited


@dataclass
class Snippet:
    """A python block and the expected-result block after it, if any."""

    page: str
    code: Block
    expect: Block | None = None  # lang 'text' (output) or 'pytb' (exception)

    @property
    def id(self) -> str:
        return f"{self.page}:{self.code.first - 1}"


def parse_blocks(text: str) -> list[Block]:
    lines = text.split("\n")
    blocks, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = len(m["indent"]), m["fence"], m["lang"].lower()
        skip = i > 0 and lines[i - 1].strip() == SKIP_MARK
        xf = _XFAIL.match(lines[i - 1].strip()) if i > 0 else None
        lim = i > 0 and lines[i - 1].strip() == LOOP_LIMIT_MARK
        j = i + 1
        while j < len(lines) and not (lines[j].strip().startswith(fence[0] * len(fence))
                                      and lines[j].strip().strip(fence[0]) == ""):
            j += 1
        if j == len(lines):
            raise ValueError(f"unclosed code block starting at line {i + 1}")
        body = [ln[indent:] if ln[:indent].strip() == "" else ln for ln in lines[i + 1:j]]
        blocks.append(Block(lang, "\n".join(body), i + 2, j + 1, skip, xf["reason"] if xf else None, lim))
        i = j + 1
    return blocks


def snippets(page: str, text: str | None = None) -> list[Snippet]:
    text = (ROOT / page).read_text() if text is None else text
    lines = text.split("\n")
    blocks = parse_blocks(text)
    out = []
    for k, b in enumerate(blocks):
        if b.lang not in ("python", "py") or b.skip:
            continue
        s = Snippet(page, b)
        nxt = blocks[k + 1] if k + 1 < len(blocks) else None
        # the expectation block follows after blank lines only
        if nxt is not None and nxt.lang in ("text", "pytb") and \
                all(ln.strip() == "" for ln in lines[b.last:nxt.first - 2]):
            s.expect = nxt
        out.append(s)
    return out


ALL = [s for p in PAGES for s in snippets(p)]


@dataclass
class PageState:
    namespace: dict = field(default_factory=dict)
    done: int = 0           # how many of the page's snippets ran
    failed: str | None = None
    updates: list = field(default_factory=list)


_STATE: dict[str, PageState] = {}


@pytest.fixture(autouse=True)
def fresh_runtime():
    """Overrides conftest's per-test reset: the blocks of a page share fields and kernels; the
    runtime is reset when a page starts instead (run_through)."""
    yield


def _loops_limited() -> bool:
    import wgpu_ad
    return wgpu_ad.get_runtime().loops_limited


def _format_exc(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _needs_torch(code: str) -> bool:
    return re.search(r"\btorch\b", code) is not None


def _run(s: Snippet, ns: dict) -> tuple[str, BaseException | None]:
    code = "\n" * (s.code.first - 1) + s.code.code + "\n"
    out = io.StringIO()
    err = None
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out):
        warnings.simplefilter("always")
        try:
            exec(compile(code, s.page, "exec"), ns)
        except Exception as e:  # noqa: BLE001 (compared with the page's pytb block)
            err = e
    text = out.getvalue()
    for w in caught:
        if w.category.__module__.startswith("wgpu_ad"):
            text += f"{w.category.__name__}: {w.message}\n"
    return text, err


def _norm(text: str) -> str:
    return "\n".join(ln.rstrip() for ln in text.strip("\n").split("\n"))


def _check(s: Snippet, output: str, err: BaseException | None, st: PageState) -> None:
    where = f"{s.page}, the block at line {s.code.first - 1}"
    exp = s.expect
    if exp is not None and exp.lang == "pytb":
        got = _norm(_format_exc(err)) if err is not None else None
        if UPDATE and got is not None:
            st.updates.append((exp, got))
            return
        assert err is not None, f"{where} should raise (its pytb block says so) but ran without error"
        assert got == _norm(exp.code), f"{where} raised a different error:\n{got}\nexpected:\n{exp.code}"
        return
    if err is not None:
        tb = "".join(traceback.format_exception(err))
        pytest.fail(f"{where} raised {_format_exc(err)}\n{tb}", pytrace=False)
    if exp is not None:
        if UPDATE:
            st.updates.append((exp, _norm(output)))
            return
        assert _norm(output) == _norm(exp.code), \
            f"{where} printed:\n{output}\nthe page says:\n{exp.code}"


def _write_updates(page: str, st: PageState) -> None:
    if not st.updates:
        return
    lines = (ROOT / page).read_text().split("\n")
    for blk, text in sorted(st.updates, key=lambda u: -u[0].first):
        lines[blk.first - 1:blk.last - 1] = text.split("\n")
    (ROOT / page).write_text("\n".join(lines))
    st.updates.clear()


def run_through(s: Snippet) -> None:
    """Run the page's snippets up to s (those not run yet), checking each."""
    import wgpu_ad

    page = [x for x in ALL if x.page == s.page]
    k = page.index(s)
    st = _STATE.get(s.page)
    if st is None or st.done > k:  # first block of the page, or a rerun: start the page again
        wgpu_ad.reset()
        st = _STATE[s.page] = PageState(namespace={"__name__": "__docs__", "__file__": str(ROOT / s.page)})
    if st.failed:
        pytest.skip(f"an earlier block of {s.page} failed ({st.failed})")
    cwd = os.getcwd()
    os.chdir(ROOT)  # blocks are compiled as "docs/x.md": kernels read their source from there
    try:
        while st.done <= k:
            cur = page[st.done]
            st.done += 1
            if _needs_torch(cur.code.code) and not HAVE_TORCH:
                if cur is s:
                    pytest.skip("torch is not installed (pip install torch==2.13.0)")
                continue
            if cur.code.loop_limit and not _loops_limited():
                if cur is s:
                    pytest.skip("shows what older Mesa llvmpipe does (its loop limit); this adapter's loops run to "
                                "their end")
                continue
            output, err = _run(cur, st.namespace)
            if cur.code.xfail:
                if err is None:
                    st.failed = cur.id
                    pytest.fail(f"{cur.id} works now: remove its xfail marker ({cur.code.xfail}) and the "
                                f"page's 'not yet'", pytrace=False)
                if cur is s:
                    pytest.xfail(f"{cur.code.xfail}: {_format_exc(err)}")
                continue
            try:
                _check(cur, output, err, st)
            except AssertionError:
                st.failed = cur.id
                raise
    finally:
        os.chdir(cwd)
        if st.done == len(page):
            _write_updates(s.page, st)
            wgpu_ad.reset()


@pytest.mark.gpu
@pytest.mark.parametrize("snippet", ALL, ids=[s.id for s in ALL])
def test_doc_block(snippet: Snippet):
    run_through(snippet)


def test_parser_finds_expectations():
    """The collector itself: a python block, its output block, a skipped block, a raising one."""
    page = ("text\n\n```python\nprint(1)\n```\n\n```text\n1\n```\n\n" + SKIP_MARK +
            "\n```python\nnot run\n```\n\n```python\nraise ValueError('x')\n```\n```pytb\nValueError: x\n```\n"
            "\n```sh\npip install\n```\n")
    blocks = parse_blocks(page)
    assert [(b.lang, b.first, b.skip) for b in blocks] == [
        ("python", 4, False), ("text", 8, False), ("python", 13, True), ("python", 17, False),
        ("pytb", 20, False), ("sh", 24, False)]
    assert blocks[0].code == "print(1)" and blocks[4].code == "ValueError: x"
    found = snippets("page.md", page)
    assert [(s.code.first, s.expect and s.expect.lang) for s in found] == [(4, "text"), (17, "pytb")]
    assert parse_blocks("<!-- docs-test: xfail #17 -->\n```python\nx\n```\n")[0].xfail == "#17"
