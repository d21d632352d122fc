"""Loads the hand-written WGSL snippets of shaders/NAME.wgsl and fills their template variables.

Templates write variables as {{name}}. A file may hold several snippets, each starting with a
line `//! snippet NAME`; text before the first marker is a file comment and is dropped.
This module lives with the .wgsl files: the checkout's shaders/ folder is the package
wgpu_ad.shaders (pyproject's package-dir), and the files ship as its package data. The compiler
(codegen/wgsl.py) and the viewer both load their WGSL here; neither reaches into the other.
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from ..errors import WgpuAdError

_DIR = Path(__file__).resolve().parent  # the .wgsl files sit next to this module
_VAR = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_MARK = re.compile(r"^//! snippet ([A-Za-z_][A-Za-z0-9_]*)\s*$", re.M)


class ShaderTemplateError(WgpuAdError):
    """A shader snippet is missing, or its template variables do not match what was passed."""


def shader_dir() -> Path:
    if _DIR.is_dir() and any(_DIR.glob("*.wgsl")):
        return _DIR
    raise ShaderTemplateError(
        f"wgpu_ad's WGSL snippets were not found in {_DIR}. Reinstall wgpu_ad so that its "
        f"shaders/*.wgsl files are included.")


@lru_cache(maxsize=None)
def _read(name: str) -> str:
    path = shader_dir() / f"{name}.wgsl"
    if not path.is_file():
        raise ShaderTemplateError(f"no WGSL snippet file {path}")
    return path.read_text(encoding="utf-8")


@lru_cache(maxsize=None)
def snippets(name: str) -> dict[str, str]:
    """The snippets of shaders/NAME.wgsl by name (one entry, NAME, if the file has no markers)."""
    text = _read(name)
    marks = list(_MARK.finditer(text))
    if not marks:
        return {name: text.strip() + "\n"}
    out = {}
    for k, m in enumerate(marks):
        end = marks[k + 1].start() if k + 1 < len(marks) else len(text)
        out[m.group(1)] = text[m.end():end].strip() + "\n"
    return out


def render(template: str, where: str, /, **values) -> str:
    """Substitutes {{name}}; every variable must be given, and every given value used."""
    wanted = set(_VAR.findall(template))
    missing = sorted(wanted - values.keys())
    if missing:
        raise ShaderTemplateError(f"WGSL template {where} needs {', '.join(missing)} (given: {', '.join(sorted(values)) or 'nothing'})")
    extra = sorted(values.keys() - wanted)
    if extra:
        raise ShaderTemplateError(f"WGSL template {where} has no variable {', '.join(extra)} (it uses: {', '.join(sorted(wanted)) or 'none'})")
    return _VAR.sub(lambda m: str(values[m.group(1)]), template)


def load(file: str, snippet: str | None = None, /, **values) -> str:
    """The WGSL of shaders/FILE.wgsl (or one snippet of it) with its template variables filled."""
    table = snippets(file)
    key = snippet or file
    if key not in table:
        raise ShaderTemplateError(f"shaders/{file}.wgsl has no snippet {key!r} (it has: {', '.join(table)})")
    return render(table[key], f"shaders/{file}.wgsl:{key}", **values)
