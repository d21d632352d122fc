"""Printing: per-case blocks while the run goes, the summary table (Markdown), and the targets
of the benchmark issue, each met or missed by a stated factor."""
from __future__ import annotations

REF = "wgpu_ad"


def _fmt(v: float | None, unit: str = "") -> str:
    if v is None:
        return "-"
    s = f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return f"{s} {unit}".strip()


def _val(v) -> str:
    return "-" if v is None else f"{v:.7g}"


def _err(e) -> str:
    return "" if e is None else f" (rel err {e:.1e})"


def case_block(rec: dict, systems: list[str]) -> str:
    """What one case measured: medians with ratios, then the loss/gradient checks."""
    lines = [f"== {rec['case']}"]
    med, unit = rec["median"], rec["unit"]
    for m in rec["modes"]:
        cells = []
        for s in systems:
            if s not in med:
                continue
            v = med[s][m]
            cell = f"{s} {_fmt(v, unit)}"
            if s != REF and REF in med:
                cell += f" [wgpu_ad/{s} {med[REF][m] / v:.2f}]"
            cells.append(cell)
        lines.append(f"  {m:<9} " + " | ".join(cells))
    ref = rec.get("reference", {})
    lines.append(f"  reference (float64): {rec['loss_name']} = {_val(ref.get('loss'))}"
                 + (f", {rec['grad_name']} = {_val(ref.get('grad'))}" if rec["grad_name"] else ""))
    for s, c in rec["checks"].items():
        flag = "ok" if c["ok"] else f"OUTSIDE TOLERANCE {rec['tol']:g}"
        g = f", {rec['grad_name']} = {_val(c['grad'])}{_err(c['grad_rel_err'])}" if rec["grad_name"] else ""
        lines.append(f"  {s:<14} {rec['loss_name']} = {_val(c['loss'])}{_err(c['loss_rel_err'])}{g}  {flag}")
    if "copy" in rec:
        lines += copy_lines(rec)
    for s, e in rec["errors"].items():
        lines.append(f"  {s:<14} FAILED: {_first_line(e)}")
    for s, e in rec.get("skipped", {}).items():
        lines.append(f"  {s:<14} not run: {_first_line(e).split(': ', 1)[-1]}")
    return "\n".join(lines)


def bandwidth_fractions(rec: dict) -> tuple[float | None, dict]:
    """The reduction's physical limit, the fastest device copy measured (GB/s, reads and writes
    counted), and per system and mode the fraction of it the reduction reaches: fwd reads the
    n floats once; fwd+bwd reads them and writes their gradient."""
    limit = max((c["gb_s"] for c in rec.get("copy", {}).values()), default=None)
    if not limit:
        return None, {}
    nbytes = 4 * rec["params"]["n"]
    moved = {"fwd": nbytes, "fwd+bwd": 2 * nbytes}
    return limit, {s: {m: moved[m] / (t * 1e-3) / 1e9 / limit for m, t in med.items() if m in moved}
                   for s, med in rec["median"].items()}


def copy_lines(rec: dict) -> list[str]:
    lines = [f"  copy bandwidth ({_fmt(rec['params']['n'] * 4 / 2**20)} MiB): " + " | ".join(
        f"{s} {c['gb_s']:.3g} GB/s ({c['how']})" for s, c in rec["copy"].items())]
    lines += [f"  copy bandwidth: {s} FAILED: {_first_line(e)}" for s, e in rec.get("copy_errors", {}).items()]
    limit, frac = bandwidth_fractions(rec)
    if limit:
        lines.append(f"  reduction at a fraction of the fastest copy ({limit:.3g} GB/s; fwd reads n floats, fwd+bwd "
                     f"also writes n): " + " | ".join(
                         f"{s} " + "/".join(f"{f * 100:.2g}%" for f in fr.values()) for s, fr in frac.items()))
    return lines


def _first_line(e: str) -> str:
    """The error's message (the traceback is in the JSON output)."""
    lines = [ln for ln in e.strip().splitlines() if ln.strip()]
    return lines[0] if lines else "?"


def compile_block(c: dict) -> str:
    p = c["params"]
    title = (f"== compile: cloth n={p['n']} steps={p['steps']}, step + loss kernels, forward and gradient "
             f"(fresh process each, median of {c['reps']})")
    lines = [title]
    for s, r in c["systems"].items():
        parts = ", ".join(f"{k} {v:.0f}" for k, v in r["first_parts_ms"].items())
        lines.append(f"  {s:<14} first run {r['first_ms']:.0f} ms ({parts}); cached {r['cached_ms']:.0f} ms; "
                     f"start-up before them {r['init_ms']:.0f} ms")
    for s, e in c["errors"].items():
        lines.append(f"  {s:<14} FAILED: {_first_line(e)} ... {e.strip().splitlines()[-1]}")
    return "\n".join(lines)


def summary_table(out: dict) -> str:
    """Medians per case and mode, Markdown; other systems show wgpu_ad/system (< 1: wgpu_ad faster)."""
    systems = out["systems"]
    head = "| case | mode | " + " | ".join(systems) + " |"
    lines = ["", "Medians (other systems: value, then wgpu_ad / system; below 1 means wgpu_ad is faster)",
             "", head, "|" + "---|" * (len(systems) + 2)]
    for rec in out["cases"]:
        med, unit = rec["median"], rec["unit"]
        for m in rec["modes"]:
            cells = []
            for s in systems:
                if s not in med:
                    cells.append("failed" if s in rec["errors"] else "-")
                    continue
                cell = _fmt(med[s][m], unit)
                if s != REF and REF in med:
                    cell += f" ({med[REF][m] / med[s][m]:.2f})"
                cells.append(cell)
            lines.append(f"| {rec['case']} | {m} | " + " | ".join(cells) + " |")
    c = out.get("compile")
    if c:
        for phase in ("first", "cached"):
            cells = []
            for s in systems:
                r = c["systems"].get(s)
                if r is None:
                    cells.append("failed" if s in c["errors"] else "-")
                    continue
                cell = _fmt(r[f"{phase}_ms"], "ms")
                if s != REF and REF in c["systems"]:
                    cell += f" ({c['systems'][REF][f'{phase}_ms'] / max(r[f'{phase}_ms'], 1e-9):.2f})"
                cells.append(cell)
            lines.append(f"| compile cloth n={c['params']['n']} | {phase} run | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _target(rows: list, what: str, value: float | None, limit: float, strict: bool = False, unit: str = "") -> None:
    if value is None:
        rows.append({"target": what, "value": None, "limit": limit, "met": None, "miss": None})
        return
    met = value < limit if strict else value <= limit
    rows.append({"target": what, "value": value, "limit": limit, "met": met, "unit": unit,
                 "miss": None if met else value / limit})


ANCHORS = ("wgsl", "taichi-vulkan", "taichi-cuda", "taichi-cpu", "warp-cpu", "torch", "torch-compile", "jax")
# (not wgpu_ad-cas: that is wgpu_ad too)


def _best_anchor(rec: dict, mode: str) -> str | None:
    """The fastest other system of the case whose loss and gradient passed the float64 check."""
    ok = [s for s in ANCHORS if s in rec["median"] and rec["checks"].get(s, {}).get("ok")]
    return min(ok, key=lambda s: rec["median"][s][mode]) if ok else None


def targets(out: dict) -> list[dict]:
    """The issue's targets, as ratios wgpu_ad / other (or absolute values) against their limits."""
    rows: list[dict] = []
    for rec in out["cases"]:
        med = rec["median"]

        def ratio(other: str, mode: str, med=med):
            if REF not in med or other not in med:
                return None
            return med[REF][mode] / med[other][mode]
        w = rec["workload"]
        if w in ("gravity", "reduction"):
            for mode, lim in (("fwd", 1.2), ("fwd+bwd", 1.5)):
                _target(rows, f"{rec['case']} {mode}: wgpu_ad / wgsl <= {lim}", ratio("wgsl", mode), lim)
                for t in ("taichi-vulkan", "taichi-cpu"):
                    _target(rows, f"{rec['case']} {mode}: wgpu_ad / {t} < 1", ratio(t, mode), 1.0, strict=True)
        elif w in ("cloth", "scatter"):
            for mode in rec["modes"]:
                _target(rows, f"{rec['case']} {mode}: wgpu_ad / taichi-cpu <= 1", ratio("taichi-cpu", mode), 1.0)
        if w in ("cloth", "scatter", "reduction") and REF in med:   # issue #18: the best anchor of the run
            for mode in rec["modes"]:
                best = _best_anchor(rec, mode)
                what = f"{rec['case']} {mode}: wgpu_ad / best anchor" + (f" ({best})" if best else "") + " <= 1"
                _target(rows, what, ratio(best, mode) if best else None, 1.0)
        if w in ("gravity", "cloth", "reduction", "scatter"):   # issue #29: the GPU users' anchors
            for other in ("torch", "jax"):
                _target(rows, f"{rec['case']} fwd+bwd: wgpu_ad / {other} < 1", ratio(other, "fwd+bwd"), 1.0, strict=True)
        if w == "reduction":
            limit, frac = bandwidth_fractions(rec)
            f = frac.get(REF, {}).get("fwd")
            _target(rows, f"{rec['case']} fwd: copy bandwidth / wgpu_ad's <= 1 / 0.7", f and 1.0 / f, 1.0 / 0.7)
        if w == "launch":
            v = med.get(REF, {}).get("launches")
            _target(rows, f"{rec['case']}: wgpu_ad us/launch <= 15", v, 15.0, unit="us")
            _target(rows, f"{rec['case']}: wgpu_ad sync with nothing pending <= 50 us", med.get(REF, {}).get("sync"),
                    50.0, unit="us")
    c = out.get("compile")
    if c:
        r = c["systems"].get(REF)
        _target(rows, "compile cloth (fwd + grad), first run < 1000 ms", r and r["first_ms"], 1000.0, True, "ms")
        _target(rows, "compile cloth (fwd + grad), cached < 50 ms", r and r["cached_ms"], 50.0, True, "ms")
    t = out.get("torch")
    if t:
        _target(rows, "torch bridge fwd+bwd / bare kernels + copies <= 1.2", t.get("ratio"), 1.2)
    ck = out.get("checkpoint")
    if ck:
        from benchmarks.checkpoint import targets as checkpoint_targets
        r = checkpoint_targets(ck) or {}
        _target(rows, "checkpoint cloth: revolve / store_all <= 2.5", r.get("revolve_over_store_all"), 2.5)
    fm = out.get("fwdmode")
    for c in (fm or {}).get("cases", ()):
        label = c["workload"] + " " + " ".join(f"{k}={v}" for k, v in c["params"].items())
        _target(rows, f"forward mode {label}: dual kernels / fwd <= 2", c.get("ratio"), 2.0)
    return rows


def targets_block(rows: list[dict]) -> str:
    lines = ["Targets of the benchmark issue (lavapipe):", ""]
    for r in rows:
        if r["met"] is None:
            status = "not measured"
        elif r["met"]:
            status = "met"
        else:
            status = f"MISSED by {r['miss']:.2f}x"
        v = "-" if r["value"] is None else f"{r['value']:.3g}{' ' + r['unit'] if r.get('unit') else ''}"
        lines.append(f"  {r['target']:<62} {v:>10}  {status}")
    return "\n".join(lines) + "\n"
