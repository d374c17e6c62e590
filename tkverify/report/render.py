"""A `Report` as markdown (report.md) and as an HTML page (report.html).

The markdown has: what the report ran on and its verdict; per format, a table of the largest ULP
error of each op:output by implementation; every row; the failures; the figures policies add;
the gradient checks; the known discrepancies and the refused cases; the fuzzing speed.  The page
shows the same tables, with the code distance histogram of each row drawn.
"""

from __future__ import annotations

import html
import math

from tkverify.policies import HIST_LABELS
from tkverify.registry import KnownDiscrepancy
from tkverify.report.rows import (
    SPEED_PHASES, GradientRow, Report, ResultRow, SpeedRow, UnsupportedRow, fuzzed_rows, phase_split, split_known,
)


def _md_table(table: list[list[str]]) -> str:
    head, *body = table
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


# ---------------------------------------------------------------- result rows


def _ulp_cell(row: ResultRow) -> str:
    mark = "" if row.verdict == "pass" else " FAIL"
    return f"{row.max_ulp:.3g}{mark}"


def formats_table(rows: list[ResultRow]) -> dict[str, list[list[str]]]:
    """Per format, a libm-test-ulps style table: op.output by implementation, max ULP."""
    tables = {}
    for fmt in sorted({r.format for r in rows}):
        sel = [r for r in rows if r.format == fmt]
        impls = sorted({r.impl for r in sel})
        ops = sorted({(r.op, r.output) for r in sel})
        table = [["op", *impls]]
        for op, output in ops:
            cells = []
            for impl in impls:
                hit = [r for r in sel if (r.op, r.output, r.impl) == (op, output, impl)]
                cells.append(_ulp_cell(hit[0]) if hit else "-")
            table.append([f"{op}:{output}", *cells])
        tables[fmt] = table
    return tables


def _hist_text(hist: dict[str, int]) -> str:
    return " ".join(f"{k}:{v}" for k, v in hist.items())


def _known_note(failed: list[ResultRow], unsupported: list[UnsupportedRow]) -> str:
    """Says so when every failing row belongs to an (op, impl) that had failures a committed finding excused
    (whether it also had others is the test run's verdict, not the report's)."""
    known = {(r.op, r.impl) for r in split_known(unsupported)[1]}
    if failed and all((r.op, r.impl) in known for r in failed):
        return (f"; the {len(failed)} failing rows all belong to (op, implementation) pairs with known "
                "discrepancies, listed at the end")
    return ""


EXTRA_MEANINGS = {
    "max_sum_deviation": "largest |row or column sum - 1| of the implementation's output",
    "oracle_max_sum_deviation": "the same of the float64 oracle's output, on the same cases",
    "max_allowed_ulp": "widest bound a comparison allowed, in ULPs of the output format",
    "max_bound_used": "largest share of its bound an element used (1 = at the bound)",
}


def extras_markdown(rows: list[ResultRow]) -> list[str]:
    """Figures an op's policy adds beyond ULPs (e.g. Sinkhorn's sum deviations), per row."""
    rows = [r for r in rows if r.extra]
    if not rows:
        return []
    keys = sorted({k for r in rows for k in r.extra})
    out = ["", "## Op-specific figures", ""]
    out += [f"- `{k}`: {EXTRA_MEANINGS.get(k, 'see the op spec')}" for k in keys]
    out += ["", _md_table([["op", "output", "format", "impl", *keys],
                           *[[r.op, r.output, r.format, r.impl,
                              *(f"{r.extra[k]:.3g}" if k in r.extra else "-" for k in keys)] for r in rows]])]
    return out


# ---------------------------------------------------------------- gradient rows

GRADIENT_HEADER = ["op", "input", "impl", "check", "cases", "max error", "largest bound", "verdict"]


def _gradient_cells(r: GradientRow) -> list[str]:
    bound = "-" if r.max_bound is None else f"{r.max_bound:.3g}"
    return [r.op, r.input, r.impl, r.check, str(r.cases), f"{r.max_error:.3g} {r.unit}", bound, r.verdict]


def gradients_markdown(grads: list[GradientRow]) -> list[str]:
    if not grads:
        return []
    out = ["", "## Gradients", "",
           "gradcheck: the float64 backward derived by hand against finite differences (torch.autograd.gradcheck); "
           "vs_oracle: the implementation's backward against it (max ULP against the exact gradient); "
           "consistency: the implementation's backward against central differences of its own forward "
           "(relative error of a directional derivative, and the largest bound it was held to).", "",
           _md_table([GRADIENT_HEADER, *[_gradient_cells(r) for r in grads]])]
    failed = [r for r in grads if r.verdict != "pass"]
    if failed:
        out += ["", "### Gradient failures", ""]
        for r in failed:
            w = r.worst or {}
            out.append(f"- {r.op} d/d{r.input} [{r.impl}] {r.check}: {w.get('message', '')} ({w.get('case', '')})")
    return out


def gradients_html(grads: list[GradientRow]) -> list[str]:
    if not grads:
        return []
    esc = html.escape
    parts = ["<h2>Gradients</h2><table><tr>" + "".join(f"<th>{esc(c)}</th>" for c in GRADIENT_HEADER) + "</tr>"]
    for r in grads:
        cls = "" if r.verdict == "pass" else " class='fail'"
        parts.append(f"<tr{cls}>" + "".join(f"<td>{esc(c)}</td>" for c in _gradient_cells(r)) + "</tr>")
    parts.append("</table>")
    return parts


# ---------------------------------------------------------------- unsupported rows

_KNOWN_INTRO = ("Cases where the implementation failed in exactly the way a committed finding describes (its id "
                "names the section of the findings file). They are not counted as passes: the rows above include "
                "their failing elements; the finding's own case replays the failure.")
_REFUSED_INTRO = ("Cases an implementation refused because it lacks the option, format, size or input domain they "
                  "ask for (in the installed version). They were not judged: the rows above cover only the cases "
                  "that ran.")


def _reason_section(title: str, intro: str, rows: list[UnsupportedRow], label: str, strip: str = "") -> list[str]:
    if not rows:
        return []
    out = ["", f"## {title}", "", intro, ""]
    for r in rows:
        reasons = "; ".join(f"{reason[len(strip):].strip()} ({n})" for reason, n in r.reasons.items())
        out.append(f"- {r.op} [{r.impl}]{label}: {r.cases} cases ({reasons})")
    return out


def unsupported_markdown(rows: list[UnsupportedRow]) -> list[str]:
    refused, known = split_known(rows)
    return (_reason_section("Known discrepancies: failures excused by a committed finding", _KNOWN_INTRO, known,
                            "", KnownDiscrepancy.PREFIX)
            + _reason_section("Not available: unsupported cases", _REFUSED_INTRO, refused, " unsupported"))


def unsupported_html(rows: list[UnsupportedRow]) -> list[str]:
    """The markdown's sections of known discrepancies and refused cases, as headings, paragraphs and lists."""
    parts = []
    in_list = False
    for line in unsupported_markdown(rows):
        if line.startswith("- ") and not in_list:
            parts.append("<ul>")
        elif not line.startswith("- ") and line and in_list:
            parts.append("</ul>")
        in_list = line.startswith("- ") or (in_list and not line)
        if line.startswith("## "):
            parts.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif line.startswith("- "):
            parts.append(f"<li>{html.escape(line[2:])}</li>")
        elif line:
            parts.append(f"<p>{html.escape(line)}</p>")
    if in_list:
        parts.append("</ul>")
    return parts


# ---------------------------------------------------------------- speed rows

SPEED_HEADER = ["op", "impl", "examples", "wall s", "examples/s", "first call s", "transfer", "impl", "oracle",
                "judge", "refused", "draw, shrink, other"]


def _speed_cells(r: SpeedRow) -> list[str]:
    shares = phase_split([r])
    rate = f"{r.examples / r.wall_s:.1f}" if r.wall_s > 0 else "-"
    return [r.op, r.impl, str(r.examples), f"{r.wall_s:.2f}", rate, f"{r.first_impl_s:.2f}",
            *(f"{100 * shares[p]:.0f}%" if shares else "-" for p in (*SPEED_PHASES, "other"))]


def speed_markdown(speed: list[SpeedRow]) -> list[str]:
    speed = fuzzed_rows(speed)
    if not speed:
        return []
    total_wall = sum(r.wall_s for r in speed)
    total_examples = sum(r.examples for r in speed)
    shares = phase_split(speed)
    split = ", ".join(f"{p} {100 * shares[p]:.0f}%" for p in SPEED_PHASES)
    return ["", "## Fuzzing speed", "",
            f"Summed over workers: {total_examples} judged examples in {total_wall:.1f} s of test time "
            f"({total_examples / total_wall:.1f} examples/s); {split}, "
            f"drawing, shrinking and the rest {100 * shares['other']:.0f}%. "
            "The first call of each (op, impl) in a process includes compiling or loading its kernel.", "",
            _md_table([SPEED_HEADER, *[_speed_cells(r) for r in speed]])]


# ---------------------------------------------------------------- the documents


def render_markdown(report: Report) -> str:
    m, rows = report.meta, report.results
    failed = [r for r in rows if r.verdict != "pass"]
    grads = report.gradients
    grads_failed = [r for r in grads if r.verdict != "pass"]
    out = [
        "# tkverify report",
        "",
        f"- date: {m['date']}  commit: `{m['commit']}`  profile: {m['profile']}  impl: {m['impl']}",
        f"- device: {m.get('device')}  driver: {m.get('driver', '-')}  CUDA: {m.get('cuda', '-')}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in sorted(m["versions"].items())),
        f"- verdict: **{'FAIL' if failed or grads_failed else 'pass'}** ({len(rows) - len(failed)} of {len(rows)} "
        f"rows pass" + (f"; {len(grads) - len(grads_failed)} of {len(grads)} gradient rows pass" if grads else "")
        + _known_note(failed, report.unsupported) + ")",
        *([f"- **partial**: {m['partial']}"] if m.get("partial") else []),
        *([f"- {m['merged']}"] if m.get("merged") else []),
        "",
        "## Max ULP error per format (op:output by implementation)",
        "",
        "A cell is the largest ULP error seen against the exact float64 value; "
        "0 means bitwise equal to the correctly rounded value everywhere.",
    ]
    for fmt, table in formats_table(rows).items():
        out += ["", f"### {fmt}", "", _md_table(table)]
    out += ["", "## All rows", "",
            "| op | output | format | impl | policy | cases | elements | exact | max ULP | mean ULP "
            "| code distance histogram | verdict |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(
            f"| {r.op} | {r.output} | {r.format} | {r.impl} | {r.policy} | {r.cases} "
            f"| {r.count} | {100 * r.exact:.4g}% | {r.max_ulp:.3g} | {r.mean_ulp:.3g} "
            f"| {_hist_text(r.hist)} | {r.verdict} |"
        )
    if failed:
        out += ["", "## Failures", ""]
        for r in failed:
            w = r.worst or {}
            out.append(f"- {r.op}:{r.output} [{r.impl}] worst at {w.get('index')}: actual "
                       f"{w.get('actual')}, expected {w.get('expected')}, ULP {w.get('ulp')} ({w.get('case', '')})")
    out += extras_markdown(rows)
    out += gradients_markdown(grads)
    out += unsupported_markdown(report.unsupported)
    out += speed_markdown(report.speed)
    return "\n".join(out) + "\n"


def _svg_histogram(hist: dict[str, int], width: int = 220, height: int = 60) -> str:
    """A small log-scale bar chart of code distances, inline SVG (no plotting dependency)."""
    labels = list(HIST_LABELS)
    values = [hist.get(k, 0) for k in labels]
    top = max((math.log10(v + 1) for v in values), default=1.0) or 1.0
    bw = width / len(labels)
    bars = []
    for i, (label, v) in enumerate(zip(labels, values)):
        h = (height - 14) * math.log10(v + 1) / top
        colour = "#3a7" if i == 0 else ("#db3" if i == 1 else "#c33")
        bars.append(
            f'<rect x="{i * bw + 1:.1f}" y="{height - 12 - h:.1f}" width="{bw - 2:.1f}" height="{h:.1f}" '
            f'fill="{colour}"><title>{label}: {v}</title></rect>'
            f'<text x="{i * bw + bw / 2:.1f}" y="{height - 2}" font-size="8" text-anchor="middle">{label}</text>'
        )
    return f'<svg width="{width}" height="{height}" role="img">{"".join(bars)}</svg>'


def render_html(report: Report) -> str:
    m, rows = report.meta, report.results
    esc = html.escape
    parts = [
        "<!doctype html><meta charset='utf-8'><title>tkverify report</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px}.fail{background:#fdd}</style>",
        "<h1>tkverify report</h1>",
        f"<p>{esc(m['date'])} &middot; commit <code>{esc(m['commit'])}</code> &middot; profile {esc(m['profile'])}"
        f" &middot; {esc(str(m.get('device')))} &middot; driver {esc(str(m.get('driver', '-')))}</p>",
        "<p>" + esc(", ".join(f"{k} {v}" for k, v in sorted(m["versions"].items()))) + "</p>",
        *([f"<p><b>partial</b>: {esc(str(m['partial']))}</p>"] if m.get("partial") else []),
        *([f"<p>{esc(str(m['merged']))}</p>"] if m.get("merged") else []),
    ]
    for fmt, table in formats_table(rows).items():
        parts.append(f"<h2>{esc(fmt)}: max ULP</h2><table>")
        for i, r in enumerate(table):
            tag = "th" if i == 0 else "td"
            parts.append("<tr>" + "".join(f"<{tag}>{esc(c)}</{tag}>" for c in r) + "</tr>")
        parts.append("</table>")
    parts.append("<h2>All rows</h2><table><tr><th>op</th><th>output</th><th>format</th><th>impl</th>"
                 "<th>cases</th><th>elements</th><th>exact</th><th>max ULP</th><th>mean ULP</th>"
                 "<th>code distances (log scale)</th><th>verdict</th></tr>")
    for r in rows:
        cls = "" if r.verdict == "pass" else " class='fail'"
        parts.append(
            f"<tr{cls}><td>{esc(r.op)}</td><td>{esc(r.output)}</td><td>{esc(r.format)}</td>"
            f"<td>{esc(r.impl)}</td><td>{r.cases}</td><td>{r.count}</td>"
            f"<td>{100 * r.exact:.4g}%</td><td>{r.max_ulp:.3g}</td><td>{r.mean_ulp:.3g}</td>"
            f"<td>{_svg_histogram(r.hist)}</td><td>{esc(r.verdict)}</td></tr>"
        )
    parts.append("</table>")
    parts += gradients_html(report.gradients)
    parts += unsupported_html(report.unsupported)
    return "\n".join(parts) + "\n"
