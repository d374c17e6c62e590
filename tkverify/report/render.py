"""A `Report` as markdown (report.md) and as an HTML page (report.html).

Both lead with the verdict (PASS or FAIL, the rows and gradient rows passing, the cases excused as
known discrepancies), then the failures (each failing row's bound, the fraction of it used, its
worst element and links to its case files), then per format a table of each op:output by
implementation, then every row, the figures policies add, the gradient checks, the known
discrepancies and the refused cases, and (markdown) the fuzzing speed.  A row is judged by its
policy's bound (`tkverify.report.bounds`): ULP figures appear only where the bound is in ULPs, the
fraction of the bound everywhere, and the page colours cells and histogram bars by that fraction.
"""

from __future__ import annotations

import html
import math
import re

from tkverify import claims
from tkverify.policies import ALLOWED_CODES, ALLOWED_RELATIVE, ALLOWED_ULP, HIST_LABELS
from tkverify.registry import KnownDiscrepancy
from tkverify.report.bounds import (
    BAR_COLOURS, BOUND_CLASSES, bound_class, bound_text, bucket_classes, fraction_text, in_ulps, ulp_text,
)
from tkverify.report.rows import (
    SPEED_PHASES, GradientRow, Report, ResultRow, SpeedRow, UnsupportedRow, fuzzed_rows, phase_split, split_known,
)


def _md_table(table: list[list[str]]) -> str:
    head, *body = table
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


# ---------------------------------------------------------------- result rows


def error_cell(row: ResultRow) -> str:
    """A per-format table's cell: the largest ULP error where the bound is in ULPs, else the largest
    fraction of the bound used (said to be exact where every element is the correctly rounded value);
    "FAIL" on a failing row, "exhaustive" on a row that judged every input."""
    if in_ulps(row):
        figure = ulp_text(row.max_ulp)
    else:
        figure = f"{fraction_text(row.bound_used)} of bound"
        if row.count and row.exact_count == row.count:  # the bound's ends may be the roundings themselves
            figure = "exact" if row.bound_used == 0 else f"exact ({figure})"
    return (figure + (" FAIL" if row.verdict != "pass" else "")
            + (" (exhaustive)" if row.coverage == "exhaustive" else ""))


def formats_table(rows: list[ResultRow]) -> dict[str, list[list[ResultRow | str | None]]]:
    """Per format, a libm-test-ulps style table: a header of implementations, then per op:output (and
    coverage: a sweep's exhaustive rows apart from the sampled ones) its rows by implementation (None
    where an implementation has none)."""
    tables = {}
    for fmt in sorted({r.format for r in rows}):
        sel = [r for r in rows if r.format == fmt]
        impls = sorted({r.impl for r in sel})
        by_key = {(r.op, r.output, r.coverage, r.impl): r for r in sel}
        table: list[list[ResultRow | str | None]] = [["op", *impls]]
        for op, output, coverage in sorted({(r.op, r.output, r.coverage) for r in sel}):
            table.append([f"{op}:{output}", *(by_key.get((op, output, coverage, impl)) for impl in impls)])
        tables[fmt] = table
    return tables


FORMATS_INTRO = ("A cell is the largest ULP error against the exact float64 value where the policy's bound is in "
                 "ULPs (ulp, codes, bitwise; 0 means bitwise equal to the correctly rounded value everywhere), "
                 "else the largest fraction of its bound any element used (1 = at the bound). FAIL marks a failing "
                 "row; (exhaustive) a row that judged every input of its domain, so that its figure is the worst "
                 "there is (a sampled row's is a lower bound).")


def _hist_text(hist: dict[str, int]) -> str:
    return " ".join(f"{k}:{v}" for k, v in hist.items())


ROWS_HEADER = ["op", "output", "format", "impl", "coverage", "policy", "bound", "bound used", "cases", "elements",
               "exact", "max ULP", "mean ULP"]


def row_cells(r: ResultRow) -> list[str]:
    """The cells of a row in the table of every row (ROWS_HEADER): ULP figures only where the bound is in ULPs."""
    ulps = in_ulps(r)
    return [r.op, r.output, r.format, r.impl, r.coverage, r.policy, bound_text(r), fraction_text(r.bound_used),
            str(r.cases), str(r.count), f"{100 * r.exact:.4g}%", ulp_text(r.max_ulp) if ulps else "-",
            f"{r.mean_ulp:.3g}" if ulps else "-"]


def worst_text(r: ResultRow) -> str:
    """The row's worst element in words: where, the value, the expected value, its ULP error where the
    bound is in ULPs, and the case it came from."""
    w = r.worst
    if not w:
        return "-"
    ulps = f", {ulp_text(w['ulp'])} ULP" if in_ulps(r) and "ulp" in w else ""
    case = f" in {w['case']}" if w.get("case") else ""
    return f"at {tuple(w.get('index', ()))}: actual {w.get('actual')}, expected {w.get('expected')}{ulps}{case}"


def case_links(r: ResultRow) -> list[tuple[str, str]]:
    """(label, path) of the case files the row names: a failing example, its worst example."""
    return [(label, path) for label, path in (("failing case", r.failing_case), ("worst case", r.worst_case)) if path]


FAILURES_HEADER = ["op:output", "format", "impl", "policy", "bound", "bound used", "worst element"]


def _failure_cells(r: ResultRow) -> list[str]:
    return [f"{r.op}:{r.output}", r.format, r.impl, r.policy, bound_text(r), fraction_text(r.bound_used),
            worst_text(r)]


def _known_note(failed: list[ResultRow], unsupported: list[UnsupportedRow]) -> str:
    """Says so when every failing row belongs to an (op, impl) that had failures a committed finding excused
    (whether it also had others is the test run's verdict, not the report's)."""
    known = {(r.op, r.impl) for r in split_known(unsupported)[1]}
    if failed and all((r.op, r.impl) in known for r in failed):
        return (f"; the {len(failed)} failing rows all belong to (op, implementation) pairs with known "
                "discrepancies")
    return ""


def verdict(report: Report) -> tuple[bool, str]:
    """Whether the report passes, and its verdict in one sentence: the rows and gradient rows passing,
    and the cases excused as known discrepancies."""
    rows, grads = report.results, report.gradients
    failed = [r for r in rows if r.verdict != "pass"]
    grads_failed = [r for r in grads if r.verdict != "pass"]
    known = split_known(report.unsupported)[1]
    text = f"{len(rows) - len(failed)} of {len(rows)} rows pass"
    if grads:
        text += f"; {len(grads) - len(grads_failed)} of {len(grads)} gradient rows pass"
    if known:
        text += (f"; {sum(r.cases for r in known)} cases of {len(known)} (op, implementation) pairs excused as "
                 "known discrepancies (listed below)")
    text += claims_verdict_text(report)
    return not (failed or grads_failed or beyond_claims(report)), text + _known_note(failed, report.unsupported)


# ---------------------------------------------------------------- accuracy claims (tkverify.claims)


def beyond_claims(report: Report) -> list[ResultRow]:
    """The rows whose observed error exceeds their implementation's claim (failures even inside the contract)."""
    return [r for r in report.results if r.claim_exceeded]


def claims_verdict_text(report: Report) -> str:
    """The verdict's words on the claims: rows beyond them and rows without one; nothing where the report was
    not judged against claims (its meta names no claims files)."""
    if "claims" not in report.meta:
        return ""
    unclaimed = sum(r.claim is None for r in report.results)
    return f"; {len(beyond_claims(report))} rows beyond their accuracy claims, {unclaimed} unclaimed"


def claim_cell(r: ResultRow) -> str:
    """The claim a row is held to, in the table of every row: its figures, and EXCEEDED where the row goes
    beyond them; "unclaimed" where its implementation claims nothing for it."""
    if r.claim is None:
        return "unclaimed"
    bound = "" if r.claim.get("bound_used") is None else f", {fraction_text(r.claim['bound_used'])} of bound"
    figures = f"max ULP {ulp_text(r.claim['max_ulp'])}{bound}{', bitwise' if r.claim['bitwise'] else ''}"
    return ("EXCEEDED: " if r.claim_exceeded else "") + figures


def claim_column(report: Report) -> tuple[list[str], dict[int, list[str]]]:
    """The claim column of the table of every row (header, and per row's id its cell); none where the report
    was not judged against claims."""
    if "claims" not in report.meta:
        return [], {id(r): [] for r in report.results}
    return ["claim"], {id(r): [claim_cell(r)] for r in report.results}


def claim_failure_lines(report: Report) -> list[str]:
    """One line per row beyond its claim: claimed against observed."""
    return [f"{r.op}:{r.output} {r.format} [{r.impl}] beyond its accuracy claim: {claims.exceeded_text(r)} "
            f"(contract: {r.verdict})" for r in beyond_claims(report)]


EXTRA_MEANINGS = {
    "max_sum_deviation": "largest |row or column sum - 1| of the implementation's output",
    "oracle_max_sum_deviation": "the same of the float64 oracle's output, on the same cases",
    "max_allowed_ulp": "widest bound a comparison allowed, in ULPs of the output format",
    "max_bound_used": "largest share of its bound a finite element used (1 = at the bound)",
    "max_relative": "largest relative error of an element",
}
# The figures that state a row's bound, shown in its bound column rather than among the extras.
BOUND_EXTRAS = (ALLOWED_ULP, ALLOWED_CODES, ALLOWED_RELATIVE)


def extras_markdown(rows: list[ResultRow]) -> list[str]:
    """Figures an op's policy adds beyond ULPs (e.g. Sinkhorn's sum deviations), per row."""
    rows = [r for r in rows if set(r.extra) - set(BOUND_EXTRAS)]
    if not rows:
        return []
    keys = sorted({k for r in rows for k in r.extra} - set(BOUND_EXTRAS))
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
    return ["", "## Gradients", "",
            "gradcheck: the float64 backward derived by hand against finite differences (torch.autograd.gradcheck); "
            "vs_oracle: the implementation's backward against it (max ULP against the exact gradient); "
            "consistency: the implementation's backward against central differences of its own forward "
            "(relative error of a directional derivative, and the largest bound it was held to).", "",
            _md_table([GRADIENT_HEADER, *[_gradient_cells(r) for r in grads]])]


def gradient_failure_text(r: GradientRow) -> str:
    w = r.worst or {}
    return f"{r.op} d/d{r.input} [{r.impl}] {r.check}: {w.get('message', '')} ({w.get('case', '')})"


def gradients_html(grads: list[GradientRow]) -> list[str]:
    if not grads:
        return []
    esc = html.escape
    parts = ["<h2>Gradients</h2><table><tr>" + "".join(f"<th>{esc(c)}</th>" for c in GRADIENT_HEADER) + "</tr>"]
    for r in grads:
        cls = "" if r.verdict == "pass" else " class='over'"
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


def layouts_markdown(counts: dict[tuple[str, str], dict[str, int]]) -> list[str]:
    """Examples per layout class, per (op, impl), of each input the implementation takes in more than one
    layout: `counts` maps (op, impl) to ``{"<input>=<class>": examples}`` (`strategies.layouts.layout_labels`);
    nothing where no implementation drew a layout."""
    classes = ("contiguous", "row_strided", "batch_slice", "other")
    lines = []
    for (op, impl), labels in sorted(counts.items()):
        inputs = sorted({label.partition("=")[0] for label in labels})
        lines += [[op, impl, name, *(str(labels.get(f"{name}={c}", 0)) for c in classes)] for name in inputs]
    if not lines:
        return []
    return ["", "## Layouts drawn", "", "Judged examples per memory layout of each input drawn in several "
            "(strategies/layouts.py).", "", _md_table([["op", "impl", "input", *classes], *lines])]


# ---------------------------------------------------------------- the documents


def _meta_lines(m: dict) -> list[str]:
    """What the report ran on: date, commit, profile, implementation, device, versions; partial or merged."""
    return [f"date: {m['date']}  commit: `{m['commit']}`  profile: {m['profile']}  impl: {m['impl']}",
            f"device: {m.get('device')}  driver: {m.get('driver', '-')}  CUDA: {m.get('cuda', '-')}",
            "versions: " + ", ".join(f"{k} {v}" for k, v in sorted(m["versions"].items())),
            *([f"**partial**: {m['partial']}"] if m.get("partial") else []),
            *([str(m["merged"])] if m.get("merged") else [])]


def _md_link(label: str, path: str) -> str:
    return f"[{label}]({path.replace(' ', '%20')})"


def failures_markdown(report: Report) -> list[str]:
    """The failing rows (their bound, the fraction of it used, the worst element, links to their case
    files) and the failing gradient checks."""
    failed = [r for r in report.results if r.verdict != "pass"]
    grads_failed = [r for r in report.gradients if r.verdict != "pass"]
    over_claims = claim_failure_lines(report)
    if not failed and not grads_failed and not over_claims:
        return []
    out = ["", "## Failures", *(["", *(f"- {line}" for line in over_claims)] if over_claims else [])]
    if failed:
        out += ["", _md_table([[*FAILURES_HEADER, "case files"],
                               *[[*_failure_cells(r), " ".join(_md_link(*link) for link in case_links(r)) or "-"]
                                 for r in failed]])]
    if grads_failed:
        out += ["", "Gradient checks:", "", *[f"- {gradient_failure_text(r)}" for r in grads_failed]]
    return out


def render_markdown(report: Report) -> str:
    passed, summary = verdict(report)
    rows = report.results
    out = ["# tkverify report", "", f"**{'PASS' if passed else 'FAIL'}**: {summary}", "",
           *(f"- {line}" for line in _meta_lines(report.meta))]
    out += failures_markdown(report)
    out += ["", "## Per format: the worst error of each op:output by implementation", "", FORMATS_INTRO]
    for fmt, table in formats_table(rows).items():
        head, *body = table
        out += ["", f"### {fmt}", "",
                _md_table([head, *[[label, *(error_cell(r) if r else "-" for r in cells)] for label, *cells in body]])]
    claim_head, claim_cells = claim_column(report)
    out += ["", "## All rows", "", _md_table([[*ROWS_HEADER, "code distance histogram", "verdict", *claim_head],
                                              *[[*row_cells(r), _hist_text(r.hist), r.verdict, *claim_cells[id(r)]]
                                                for r in rows]])]
    out += extras_markdown(rows)
    out += gradients_markdown(report.gradients)
    out += unsupported_markdown(report.unsupported)
    out += speed_markdown(report.speed)
    out += layouts_markdown({(r.op, r.impl): r.layouts for r in report.speed if r.layouts})
    from tkverify.report.reach import classes_markdown, coverage_markdown  # reach renders with this module's tables

    out += classes_markdown(report.speed)
    out += coverage_markdown(report.speed)
    return "\n".join(out) + "\n"


def _svg_histogram(row: ResultRow, width: int = 208, height: int = 48) -> str:
    """A small log-scale bar chart of the row's code distances, inline SVG (no plotting dependency), each
    bar coloured by the fraction of the bound its distances use (`bucket_classes`)."""
    labels = list(HIST_LABELS)
    values = [row.hist.get(k, 0) for k in labels]
    colours = [BAR_COLOURS[c] for c in bucket_classes(row, HIST_LABELS)]
    top = max((math.log10(v + 1) for v in values), default=1.0) or 1.0
    bw = width / len(labels)
    bars = []
    for i, (label, v, colour) in enumerate(zip(labels, values, colours)):
        h = (height - 14) * math.log10(v + 1) / top
        bars.append(
            f'<rect x="{i * bw + 1:.1f}" y="{height - 12 - h:.1f}" width="{bw - 2:.1f}" height="{h:.1f}" '
            f'fill="{colour}"><title>{label}: {v}</title></rect>'
            f'<text x="{i * bw + bw / 2:.1f}" y="{height - 2}" font-size="7" text-anchor="middle">{label}</text>'
        )
    return f'<svg width="{width}" height="{height}" role="img">{"".join(bars)}</svg>'


def _style() -> str:
    """The page's style sheet: the verdict banner, tables, and one class per colour of `BOUND_CLASSES`."""
    bound = "".join(f".{name}{{background:{bg};color:{fg}}}" for name, _, bg, fg in BOUND_CLASSES)
    return ("<style>body{font-family:system-ui,sans-serif;margin:0 2em 2em;color:#222;max-width:110em}"
            "#verdict{margin:0 -2em 1em;padding:0.8em 2em;color:#fff}#verdict h1{margin:0;font-size:1.7em}"
            "#verdict p{margin:0.3em 0 0;font-size:1.05em}#verdict.pass{background:#2e7d32}"
            "#verdict.fail{background:#c62828}.meta{color:#555;font-size:13px;margin:0.2em 0}"
            "h2{margin-top:1.4em;border-bottom:1px solid #ddd}h3{margin-bottom:0.3em}"
            "table{border-collapse:collapse;margin:0.4em 0}"
            "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px;text-align:left;vertical-align:middle}"
            "th{background:#f3f3f3}td.bound{min-width:9em}table.rows td,table.rows th{font-size:12px;padding:1px 4px}"
            "table.formats td:not(:first-child){text-align:right;white-space:nowrap}"
            "td.links a{white-space:nowrap}"
            ".legend span{display:inline-block;padding:1px 8px;margin-right:6px;font-size:12px;border-radius:3px}"
            f"{bound}</style>")


def _html_table(head: list[str], body: list[list[str]], cls: str = "") -> str:
    """A table of escaped header cells and of body cells given as HTML (each a whole <td>...</td>)."""
    attr = f" class='{cls}'" if cls else ""
    return (f"<table{attr}><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in head) + "</tr>"
            + "".join("<tr>" + "".join(cells) + "</tr>" for cells in body) + "</table>")


def _inline_html(markdown: str) -> str:
    """A line of the markdown's inline marks (**bold**, `code`) as HTML."""
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", html.escape(markdown))
    return re.sub(r"`(.+?)`", r"<code>\1</code>", text)


def _td(text: str, cls: str = "") -> str:
    return f"<td class='{cls}'>{html.escape(text)}</td>" if cls else f"<td>{html.escape(text)}</td>"


def _links_html(r: ResultRow) -> str:
    links = [f"<a href='{html.escape(path, quote=True)}'>{html.escape(label)}</a>" for label, path in case_links(r)]
    return "<td class='links'>" + (" &middot; ".join(links) or "-") + "</td>"


def failures_html(report: Report) -> list[str]:
    failed = [r for r in report.results if r.verdict != "pass"]
    grads_failed = [r for r in report.gradients if r.verdict != "pass"]
    over_claims = claim_failure_lines(report)
    if not failed and not grads_failed and not over_claims:
        return []
    parts = ["<section id='failures'><h2>Failures</h2>",
             *(["<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in over_claims) + "</ul>"]
               if over_claims else [])]
    if failed:
        parts.append(_html_table([*FAILURES_HEADER, "case files"],
                                 [[*(_td(c, "over" if head == "bound used" else "")
                                     for head, c in zip(FAILURES_HEADER, _failure_cells(r))),
                                   _links_html(r)] for r in failed]))
    if grads_failed:
        parts.append("<p>Gradient checks:</p><ul>"
                     + "".join(f"<li>{html.escape(gradient_failure_text(r))}</li>" for r in grads_failed) + "</ul>")
    return [*parts, "</section>"]


def formats_html(rows: list[ResultRow]) -> list[str]:
    """The per-format tables, each cell coloured by the fraction of the bound its row used."""
    legend = "".join(f"<span class='{name}'>{html.escape(meaning)}</span>" for name, meaning, _, _ in BOUND_CLASSES)
    parts = ["<section id='formats'><h2>Per format: the worst error of each op:output by implementation</h2>",
             f"<p>{html.escape(FORMATS_INTRO)}</p><p class='legend'>{legend}</p>"]
    for fmt, table in formats_table(rows).items():
        head, *body = table
        parts.append(f"<h3>{html.escape(fmt)}</h3>")
        parts.append(_html_table(head, [[_td(label), *(_td(error_cell(r), bound_class(r)) if r else _td("-")
                                                       for r in cells)] for label, *cells in body], "formats"))
    return [*parts, "</section>"]


def rows_html(rows: list[ResultRow], claim_cells_of: tuple[list[str], dict[int, list[str]]] = ([], {})) -> list[str]:
    """Every row: its cells, the fraction of the bound coloured, its histogram, verdict, case files and (where
    the report was judged against claims) its claim."""
    claim_head, claim_cells = claim_cells_of
    body = []
    classes = {"bound used": bound_class, "bound": lambda r: "bound"}
    for r in rows:
        cells = [_td(c, classes[head](r) if head in classes else "") for head, c in zip(ROWS_HEADER, row_cells(r))]
        cells[0] = "<td>" + re.sub(r"([._])", r"\1<wbr>", html.escape(r.op)) + "</td>"  # long names break at . and _
        body.append([*cells, f"<td>{_svg_histogram(r)}</td>", _td(r.verdict, bound_class(r)), _links_html(r),
                     *(_td(c, "over" if r.claim_exceeded else "") for c in claim_cells.get(id(r), []))])
    return ["<section id='rows'><h2>All rows</h2>",
            _html_table([*ROWS_HEADER, "code distances (log scale)", "verdict", "case files", *claim_head], body,
                        "rows"),
            "</section>"]


def render_html(report: Report) -> str:
    """The page: the verdict banner first, then the failures, the per-format tables, every row, the
    gradient checks and the known discrepancies and refused cases."""
    passed, summary = verdict(report)
    word = "PASS" if passed else "FAIL"
    parts = [
        "<!doctype html><meta charset='utf-8'><title>tkverify report: " + word + "</title>", _style(),
        f"<header id='verdict' class='{word.lower()}'><h1>tkverify report: {word}</h1>"
        f"<p>{html.escape(summary)}</p></header>",
        *(f"<p class='meta'>{_inline_html(line)}</p>" for line in _meta_lines(report.meta)),
    ]
    parts += failures_html(report)
    parts += formats_html(report.results)
    parts += rows_html(report.results, claim_column(report))
    parts += gradients_html(report.gradients)
    parts += unsupported_html(report.unsupported)
    return "\n".join(parts) + "\n"
