"""`tkverify diff OLD NEW`: what changed between two reports, or between two benches.

The inputs are two report.json files (`tkverify report`) or two bench.json files (`tkverify bench`);
which, each file's content says (a report has ``results``, a bench ``rows`` and its copy bandwidth).
Rows are paired by their key: a report's result rows by (op, output, format, impl, coverage), its
gradient rows by (op, input, impl, check), a bench's rows by (op, shape, impl).  Each pair lands in
one category:

* regression   something got worse by more than the threshold (a verdict pass -> fail always);
* improvement  something got better, and nothing worse;
* changed      neither, but the yardstick moved (the row's policy, or a gradient check's unit);
* new          a row only NEW has; vanished: a row only OLD has (with the refusals or the
               unavailability the other side records for it, where it records any);
* unchanged    the rest (counted, not listed).

What counts as worse (`Thresholds`):

* verdict: pass -> fail, or (bench) a row that timed and now errors;
* where the row's bound is in ULPs (`tkverify.report.bounds.in_ulps`, as the report decides it):
  the max ULP error higher by more than ``ulp`` ULPs (0: any increase);
* elsewhere, the fraction of the bound used (`ResultRow.bound_used`; for a report written before
  that field, the summation policy's ``max_bound_used``) higher by more than ``share`` (0.05: five
  hundredths of the bound), where both rows measure it.  Their ULP figures are shown, not judged: a
  summation or relative bound allows errors of any number of ULPs;
* either only where both rows are judged by the same policy;
* the exact share lower by more than ``share`` (0.05: five percentage points);
* a gradient check's max error higher by more than ``share`` of its old value (``ulp`` ULPs for a
  check measured in ULPs);
* a bench row's eager time, what the bench judges (its p50: ``time_us``, the eager median in a
  bench.json of any age), longer by more than ``share`` of its old time.  Its graph-replayed p50 is
  shown, and noted where it moves by more than ``share``, but not judged: a caller pays the eager time.

The same figures moving the other way by more than the threshold are improvements.  The figures of a
sampled row are lower bounds of its worst case, so a row whose cases changed can move without the
implementation changing; where NEW judged fewer than half of OLD's cases the row says so.

`ImplMap` compares implementation A's rows of OLD with implementation B's rows of NEW (rows of other
implementations are left out): tile-kernels 1.0.0 against 2.1.0 in one merged bench.json
(``tile_kernels==1.0.0`` against ``tile_kernels==2.1.0``), or tilelang against tile_kernels in
one report given twice.

`main` writes the diff as markdown (stdout or ``--md``) and JSON (``--json``): the summary counts
first, then a table per category.  Exit status: 1 if there is a regression, 0 if not, 2 when an input
cannot be read, is of neither kind, the two are of different kinds, or an implementation named by the
mapping has no rows.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any, Callable

from tkverify.bench import FIELDS, judged_time_us
from tkverify.registry import KnownDiscrepancy
from tkverify.report.bounds import in_ulps
from tkverify.report.rows import GradientRow, Report, ResultRow, UnsupportedRow, split_known

CATEGORIES = ("regression", "improvement", "changed", "new", "vanished")
TITLES = {"regression": "Regressions", "improvement": "Improvements", "changed": "Changed yardstick",
          "new": "New rows", "vanished": "Vanished rows"}
ARROW = " → "


class DiffInputError(ValueError):
    """An input the diff cannot use (unreadable, of neither kind, of different kinds, an impl without rows)."""


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """How far a figure must move to count (see the module docstring for each figure)."""

    share: float = 0.05  # a time's relative change, a bound fraction's and an exact share's absolute change
    ulp: float = 0.0     # max ULP error, absolute

    def describe(self, kind: str) -> str:
        if kind == "bench":
            return (f"an eager p50 time that moves by more than {self.share:.0%} of its old value (graph times are "
                    "noted, not judged)")
        return (f"a verdict that flips; a max ULP error that moves by more than {self.ulp:g} ULP where the "
                f"bound is in ULPs, elsewhere a bound fraction that moves by more than {self.share:g} (where both "
                f"rows measure it; either under one policy); an exact share that moves by more than "
                f"{100 * self.share:g} points; a gradient's max error that moves by more than {self.share:.0%} of "
                f"its old value ({self.ulp:g} ULP for checks in ULPs)")


@dataclasses.dataclass(frozen=True)
class ImplMap:
    """Implementation `old` of OLD is compared with implementation `new` of NEW."""

    old: str
    new: str

    @property
    def label(self) -> str:
        return self.old if self.old == self.new else f"{self.old}{ARROW}{self.new}"


@dataclasses.dataclass
class Change:
    """One row that differs: its table, category and key, what moved (``worse`` first, then
    ``better``, then a moved yardstick in ``changed``), notes, and the figures of each side."""

    table: str
    category: str
    key: dict[str, Any]
    worse: list[str] = dataclasses.field(default_factory=list)
    better: list[str] = dataclasses.field(default_factory=list)
    changed: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    old: dict[str, Any] | None = None
    new: dict[str, Any] | None = None


@dataclasses.dataclass
class Side:
    """One input: the name it is shown by and its meta (date, commit, device, versions)."""

    label: str
    meta: dict[str, Any]
    runs: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # the bench runs behind the rows


@dataclasses.dataclass
class Diff:
    """Everything the diff found; `to_json` and `render_markdown` write it."""

    kind: str  # "report" or "bench"
    old: Side
    new: Side
    thresholds: Thresholds
    impls: ImplMap | None
    tables: tuple[str, ...]
    changes: list[Change]
    unchanged: dict[str, int]

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.category == "regression"]

    def counts(self) -> dict[str, dict[str, int]]:
        """Per table, the number of rows of each category (and unchanged)."""
        out = {t: {c: 0 for c in CATEGORIES} | {"unchanged": self.unchanged.get(t, 0)} for t in self.tables}
        for c in self.changes:
            out[c.table][c.category] += 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "old": dataclasses.asdict(self.old), "new": dataclasses.asdict(self.new),
                "thresholds": dataclasses.asdict(self.thresholds),
                "impls": None if self.impls is None else dataclasses.asdict(self.impls),
                "regressions": len(self.regressions), "summary": self.counts(),
                "changes": [dataclasses.asdict(c) for c in self.changes]}


# ------------------------------------------------------------------ reading


def read_input(path: Path) -> tuple[str, dict[str, Any]]:
    """("report" or "bench", the document) of a report.json or bench.json."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise DiffInputError(f"cannot read {path}: {e}") from e
    if isinstance(doc, dict) and isinstance(doc.get("results"), list):
        return "report", doc
    if isinstance(doc, dict) and isinstance(doc.get("rows"), list) and "copy_bandwidth_TBps" in doc:
        return "bench", doc
    raise DiffInputError(f"{path} is neither a report.json (a 'results' list) nor a bench.json ('rows' and "
                         "'copy_bandwidth_TBps')")


def _report_of(doc: dict[str, Any], label: str) -> Report:
    try:
        return Report.from_json({"meta": {}, **doc})
    except (TypeError, KeyError) as e:
        raise DiffInputError(f"{label}: a row of the report cannot be read: {e}") from e


# ------------------------------------------------------------------ judging figures


def _moved(old: float | None, new: float | None, tolerance: float, *, relative: bool = False) -> int:
    """+1 if `new` is higher than `old` by more than `tolerance` (of `old`'s magnitude when `relative`),
    -1 if lower by more, 0 otherwise or when either is missing.  NaN counts as +inf (the worst)."""
    if old is None or new is None:
        return 0
    old, new = (math.inf if math.isnan(v) else v for v in (old, new))
    if old == new:
        return 0
    delta = new - old
    if relative:
        delta = delta / abs(old) if old else math.copysign(math.inf, delta)
    return 1 if delta > tolerance else -1 if delta < -tolerance else 0


def _g(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def _digits(old: float | None, new: float | None) -> int:
    """The significant digits (3 or more) that tell two different values apart."""
    digits = 3
    while digits < 17 and None not in (old, new) and old != new and _g(old, digits) == _g(new, digits):
        digits += 1
    return digits


def _moved_text(name: str, old: float, new: float, unit: str = "") -> str:
    digits = _digits(old, new)
    return f"{name} {_g(old, digits)}{ARROW}{_g(new, digits)}{unit}"


def _fewer_cases(change: Change, old_cases: int, new_cases: int, refusals: str) -> None:
    """Note a row whose NEW side judged fewer than half of OLD's cases (its figures rest on fewer examples)."""
    if new_cases * 2 < old_cases:
        change.notes.append(f"NEW judged {new_cases} case{'s' * (new_cases != 1)}, OLD {old_cases}"
                            + (f"; NEW {refusals}" if refusals else ""))


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.4g}%"


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _record(change: Change, direction: int, what: str) -> None:
    """File `what` under worse (+1) or better (-1); 0 files nothing."""
    if direction > 0:
        change.worse.append(what)
    elif direction < 0:
        change.better.append(what)


def bound_fraction(row: ResultRow) -> float | None:
    """The largest share of its bound an element of the row used: `bound_used`, or for a report written
    before that field the summation policy's ``max_bound_used``; None where neither is measured."""
    if row.bound_used is not None:
        return row.bound_used
    return row.extra.get("max_bound_used")


def _result_figures(r: ResultRow) -> dict[str, Any]:
    return {"verdict": r.verdict, "policy": r.policy, "cases": r.cases, "count": r.count, "max_ulp": r.max_ulp,
            "bound_used": bound_fraction(r), "exact": r.exact, "worst": r.worst, "worst_case": r.worst_case,
            "failing_case": r.failing_case}


def judge_result(change: Change, old: ResultRow, new: ResultRow, t: Thresholds) -> None:
    if old.verdict != new.verdict:
        _record(change, 1 if new.verdict == "fail" else -1, f"verdict {old.verdict}{ARROW}{new.verdict}")
    fractions = bound_fraction(old), bound_fraction(new)
    if old.policy != new.policy:
        change.changed.append(f"policy {old.policy}{ARROW}{new.policy}")
    elif in_ulps(new):
        _record(change, _moved(old.max_ulp, new.max_ulp, t.ulp), _moved_text("max ULP", old.max_ulp, new.max_ulp))
    elif None not in fractions:
        _record(change, _moved(*fractions, t.share), _moved_text("bound used", *fractions))
    _record(change, _moved(-old.exact, -new.exact, t.share), f"exact {_pct(old.exact)}{ARROW}{_pct(new.exact)}")


def _gradient_figures(r: GradientRow) -> dict[str, Any]:
    return {"verdict": r.verdict, "policy": r.policy, "unit": r.unit, "cases": r.cases, "max_error": r.max_error,
            "max_bound": r.max_bound, "worst": r.worst}


def judge_gradient(change: Change, old: GradientRow, new: GradientRow, t: Thresholds) -> None:
    if old.verdict != new.verdict:
        _record(change, 1 if new.verdict == "fail" else -1, f"verdict {old.verdict}{ARROW}{new.verdict}")
    if old.unit != new.unit:
        change.changed.append(f"unit {old.unit}{ARROW}{new.unit}")
        return
    moved = (_moved(old.max_error, new.max_error, t.ulp) if new.unit == "ULP"
             else _moved(old.max_error, new.max_error, t.share, relative=True))
    _record(change, moved, _moved_text("max error", old.max_error, new.max_error, f" {new.unit}"))


def _bench_figures(r: dict[str, Any]) -> dict[str, Any]:
    return {**{f: r.get(f) for f in FIELDS["eager"] + FIELDS["graph"]}, "TBps": r.get("TBps"),
            "of_copy": r.get("of_copy"), "met": r.get("met"), "error": r.get("error"),
            "graph_error": r.get("graph_error")}


def _time_text(name: str, a: float | None, b: float | None) -> str:
    return f"{name} {_us(a)}{ARROW}{_us(b)} us" + (f" ({(b - a) / a:+.1%})" if a and b else "")


def judge_bench(change: Change, old: dict[str, Any], new: dict[str, Any], t: Thresholds) -> None:
    """Judge the eager p50 (what the bench judges); note a graph p50 that moves, and an eager p50 that
    moves to within OLD's p10-p90 (a move the spread of OLD's own reps covers)."""
    if bool(old.get("error")) != bool(new.get("error")):
        _record(change, 1 if new.get("error") else -1,
                f"error: {new['error']}" if new.get("error") else f"no longer errors (was: {old['error']})")
        return
    a, b = judged_time_us(old), judged_time_us(new)
    moved = _moved(a, b, t.share, relative=True)
    _record(change, moved, _time_text("eager p50", a, b))
    low, high = (old.get(f) for f in (FIELDS["eager"][0], FIELDS["eager"][2]))
    if moved and None not in (low, high, b) and low <= b <= high:
        change.notes.append(f"NEW's eager p50 lies within OLD's p10-p90 ({_us(low)}-{_us(high)} us)")
    a, b = old.get("kernel_us"), new.get("kernel_us")
    if _moved(a, b, t.share, relative=True):
        change.notes.append(_time_text("graph p50", a, b) + ", not judged")
    if old.get("kernel_us") and not new.get("kernel_us") and new.get("graph_error"):
        change.notes.append(f"no graph time in NEW: {_clip(new['graph_error'], 100)}")
    if old.get("met") is True and new.get("met") is False:
        change.notes.append("NEW misses its target")
    elif old.get("met") is False and new.get("met") is True:
        change.notes.append("NEW meets its target")


# ------------------------------------------------------------------ pairing rows


@dataclasses.dataclass(frozen=True)
class _Table:
    """How one table's rows are keyed, judged and shown."""

    name: str
    key_fields: tuple[str, ...]
    field: Callable[[Any, str], Any]
    figures: Callable[[Any], dict[str, Any]]
    judge: Callable[[Change, Any, Any, Thresholds], None]

    def key(self, row: Any) -> tuple[Any, ...]:
        return tuple(self.field(row, f) for f in self.key_fields)


RESULTS = _Table("results", ("op", "output", "format", "impl", "coverage"), getattr, _result_figures, judge_result)
GRADIENTS = _Table("gradients", GradientRow.KEY, getattr, _gradient_figures, judge_gradient)
BENCH = _Table("bench", ("op", "shape", "impl"), lambda row, f: row[f], _bench_figures, judge_bench)


def _index(table: _Table, rows: list[Any], impl: str | None, label: str | None) -> dict[tuple[Any, ...], Any]:
    """The rows by key; with `impl`, only its rows, their key naming the mapping's `label` instead."""
    out = {}
    at = table.key_fields.index("impl")
    for row in rows:
        key = table.key(row)
        if impl is not None:
            if key[at] != impl:
                continue
            key = (*key[:at], label, *key[at + 1:])
        out[key] = row
    return out


def compare_table(table: _Table, old_rows: list[Any], new_rows: list[Any], t: Thresholds, impls: ImplMap | None,
                  absent: dict[str, Callable[[Any, str], str]]) -> tuple[list[Change], int]:
    """The changes between two lists of one table's rows, and how many pairs are unchanged.

    ``absent[side](row, impl)`` says why `side` ("OLD" or "NEW") has no row of `row`'s key, its
    implementation being `impl` there.
    """
    olds = _index(table, old_rows, impls and impls.old, impls and impls.label)
    news = _index(table, new_rows, impls and impls.new, impls and impls.label)
    changes, unchanged = [], 0
    for key in sorted(olds.keys() | news.keys(), key=lambda k: tuple(map(str, k))):
        old, new = olds.get(key), news.get(key)
        change = Change(table.name, "", dict(zip(table.key_fields, key)),
                        old=None if old is None else table.figures(old),
                        new=None if new is None else table.figures(new))
        if old is None or new is None:
            change.category = "new" if old is None else "vanished"
            present, side = (new, "OLD") if old is None else (old, "NEW")
            impl = table.field(present, "impl") if impls is None else impls.old if side == "OLD" else impls.new
            change.notes.append(absent[side](present, impl))
        else:
            table.judge(change, old, new, t)
            change.category = ("regression" if change.worse else "improvement" if change.better
                               else "changed" if change.changed else "")
            if not change.category:
                unchanged += 1
                continue
        changes.append(change)
    return changes, unchanged


def _report_absence(report: Report, side: str, backward: bool) -> Callable[[Any, str], str]:
    """Why `report` (`side`) has no row of an (op, impl): the cases it refused, or that it ran none."""
    def absent(row: Any, impl: str) -> str:
        ops = {row.op, f"{row.op} (backward)"} if backward else {row.op}
        rows = [u for u in report.unsupported if u.op in ops and u.impl == impl]
        return f"{side} {refusal_summary(rows) or f'did not run {row.op} [{impl}] (no row, no refused case)'}"
    return absent


def refusal_summary(rows: list[UnsupportedRow]) -> str:
    """A line saying which cases these rows refused or excused, the most frequent reason first."""
    refused, known = split_known(rows)
    parts = []
    for kind, part in (("refused", refused), ("excused as known discrepancies", known)):
        reasons: dict[str, int] = {}
        for r in part:
            for reason, n in r.reasons.items():
                reasons[reason] = reasons.get(reason, 0) + n
        if reasons:
            top, n = max(reasons.items(), key=lambda kv: (kv[1], kv[0]))
            top = top.removeprefix(KnownDiscrepancy.PREFIX).strip() if part is known else top
            others = len(reasons) - 1
            more = f" (and {others} other reason{'s' * (others > 1)})" if others else ""
            parts.append(f"{kind} {sum(reasons.values())} cases: {_clip(top)} ({n}){more}")
    return "; ".join(parts)


def known_ids(report: Report, op: str, impl: str) -> list[str]:
    """The finding ids of the known discrepancies `report` excused for (op, impl)."""
    prefix = KnownDiscrepancy.PREFIX
    return sorted({reason[len(prefix):].split()[0] for r in split_known(report.unsupported)[1]
                   if r.op == op and r.impl == impl for reason in r.reasons if reason[len(prefix):].split()})


def _bench_absence(doc: dict[str, Any], side: str) -> Callable[[dict[str, Any], str], str]:
    """Why a bench (`side`) has no row of (op, shape, impl): its `unavailable` entry, if it has one."""
    def absent(row: dict[str, Any], impl: str) -> str:
        for u in doc.get("unavailable", []):
            if (u["op"], u["shape"]) == (row["op"], row["shape"]) and u["impl"] in (impl, impl.split("==")[0]):
                return f"{side}: not run: {_clip(u['reason'])}"
        return f"{side} did not time it (no row, no entry under unavailable)"
    return absent


def _clip(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _impls_present(name: str, side: str, impls: list[str]) -> None:
    if name not in impls:
        raise DiffInputError(f"{side} has no rows of implementation {name!r} (it has: {', '.join(sorted(impls))})")


def diff_reports(old_doc: dict[str, Any], new_doc: dict[str, Any], old_label: str = "OLD", new_label: str = "NEW",
                 thresholds: Thresholds = Thresholds(), impls: ImplMap | None = None) -> Diff:
    """The diff of two report.json documents."""
    old, new = _report_of(old_doc, old_label), _report_of(new_doc, new_label)
    if impls is not None:
        _impls_present(impls.old, f"OLD ({old_label})", [r.impl for r in old.results + old.gradients])
        _impls_present(impls.new, f"NEW ({new_label})", [r.impl for r in new.results + new.gradients])
    changes, unchanged = [], {}
    for table, rows_of, backward in ((RESULTS, lambda r: r.results, False), (GRADIENTS, lambda r: r.gradients, True)):
        absent = {"OLD": _report_absence(old, "OLD", backward), "NEW": _report_absence(new, "NEW", backward)}
        found, unchanged[table.name] = compare_table(table, rows_of(old), rows_of(new), thresholds, impls, absent)
        changes += found
    for c in changes:
        op, impl = c.key["op"], impls.new if impls else c.key["impl"]
        if c.old is not None and c.new is not None:
            ops = {op, f"{op} (backward)"} if c.table == "gradients" else {op}
            _fewer_cases(c, c.old["cases"], c.new["cases"],
                         refusal_summary([u for u in new.unsupported if u.op in ops and u.impl == impl]))
        if c.new is not None and c.new["verdict"] == "fail" and known_ids(new, op, impl):
            c.notes.append(f"NEW excuses other cases of {op} [{impl}] as known discrepancies "
                           + ", ".join(known_ids(new, op, impl)))
    return Diff("report", Side(old_label, old.meta), Side(new_label, new.meta), thresholds, impls,
                ("results", "gradients"), _ordered(changes), unchanged)


def diff_benches(old_doc: dict[str, Any], new_doc: dict[str, Any], old_label: str = "OLD", new_label: str = "NEW",
                 thresholds: Thresholds = Thresholds(), impls: ImplMap | None = None) -> Diff:
    """The diff of two bench.json documents."""
    try:
        if impls is not None:
            _impls_present(impls.old, f"OLD ({old_label})", [r["impl"] for r in old_doc["rows"]])
            _impls_present(impls.new, f"NEW ({new_label})", [r["impl"] for r in new_doc["rows"]])
        absent = {"OLD": _bench_absence(old_doc, "OLD"), "NEW": _bench_absence(new_doc, "NEW")}
        changes, unchanged = compare_table(BENCH, old_doc["rows"], new_doc["rows"], thresholds, impls, absent)
    except (KeyError, TypeError) as e:
        raise DiffInputError(f"a bench row lacks a field: {e}") from e
    return Diff("bench", _bench_side(old_doc, old_label, impls and impls.old),
                _bench_side(new_doc, new_label, impls and impls.new), thresholds, impls, ("bench",),
                _ordered(changes), {"bench": unchanged})


def _bench_side(doc: dict[str, Any], label: str, impl: str | None) -> Side:
    """A bench as one side of the diff, naming the runs that timed its compared rows: in a merged bench
    (`tkverify.bench.merge`), ``tile_kernels==V`` was timed by the runs of tile-kernels V and every other
    implementation by the first run; without a mapping, every run."""
    runs = doc.get("runs") or [doc.get("meta", {})]
    if impl is not None:
        version = impl.partition("==")[2]
        runs = [r for r in runs if (r.get("versions") or {}).get("tile-kernels") == version] if version else runs[:1]
    return Side(label, runs[0] if runs else doc.get("meta", {}), runs)


def _ordered(changes: list[Change]) -> list[Change]:
    """By category; within one, verdict flips and errors first, then by key (already sorted)."""
    def flips(c: Change) -> bool:
        return any(w.startswith(("verdict", "error")) for w in c.worse + c.better)
    return sorted(changes, key=lambda c: (CATEGORIES.index(c.category), not flips(c)))


def diff_files(old: Path, new: Path, old_label: str | None = None, new_label: str | None = None,
               thresholds: Thresholds = Thresholds(), impls: ImplMap | None = None) -> Diff:
    """The diff of two report.json or two bench.json files."""
    (old_kind, old_doc), (new_kind, new_doc) = read_input(old), read_input(new)
    if old_kind != new_kind:
        raise DiffInputError(f"cannot compare a {old_kind}.json ({old}) with a {new_kind}.json ({new}): give two "
                             "report.json or two bench.json files")
    compare = diff_reports if old_kind == "report" else diff_benches
    return compare(old_doc, new_doc, old_label or str(old), new_label or str(new), thresholds, impls)


# ------------------------------------------------------------------ markdown


def _sides_cell(change: Change, show: Callable[[dict[str, Any]], str]) -> str:
    """``old → new`` of what `show` makes of each side's figures, one value where only one side has the
    row or both agree."""
    sides = [show(side) for side in (change.old, change.new) if side is not None]
    return sides[0] if len(set(sides)) == 1 else ARROW.join(sides)


def _cell(change: Change, field: str, show: Callable[[Any], str]) -> str:
    """`_sides_cell` of one figure."""
    return _sides_cell(change, lambda side: show(side[field]))


def _number_cell(change: Change, field: str) -> str:
    """`_cell` of a number, with the digits that tell two different values apart."""
    values = [side[field] for side in (change.old, change.new) if side is not None]
    digits = _digits(*values) if len(values) == 2 else 3
    return _cell(change, field, lambda v: _g(v, digits))


def _spread_cell(change: Change, series: str) -> str:
    """`_sides_cell` of a bench series' p10-p90 ("-" for a bench written before the percentiles)."""
    low, _, high = FIELDS[series]
    return _sides_cell(change, lambda side: "-" if side[low] is None or side[high] is None
                       else f"{_us(side[low])}-{_us(side[high])}")


def _what(change: Change) -> str:
    """What moved (the worse in bold), then the notes in italics."""
    parts = [f"**{w}**" for w in change.worse] + change.better + change.changed + [f"_{n}_" for n in change.notes]
    return "; ".join(parts)


def _where(change: Change) -> str:
    """Where to look in NEW: its failing or worst case file, else its worst element and that case."""
    new = change.new or {}
    path = new.get("failing_case") or new.get("worst_case")
    if path:
        return f"`{path}`"
    w = new.get("worst") or {}
    if "actual" in w:  # a result row's worst element
        return f"at {tuple(w.get('index', ()))}: actual {w['actual']}, expected {w['expected']} ({w.get('case', '')})"
    if w.get("message") or w.get("case"):  # a gradient row's worst verdict
        return "; ".join(part for part in (w.get("message"), f"case {w.get('case')}" if w.get("case") else "") if part)
    return "-"


def _key_cell(change: Change) -> str:
    k = change.key
    name = f"{k['op']}:{k['output']}" if "output" in k else k["op"]
    return name + (f" ({k['coverage']})" if k.get("coverage", "sampled") != "sampled" else "")


_Column = tuple[str, Callable[[Change], str]]
COLUMNS: dict[str, list[_Column]] = {
    "results": [
        ("op:output", _key_cell), ("format", lambda c: c.key["format"]), ("impl", lambda c: c.key["impl"]),
        ("policy", lambda c: _cell(c, "policy", str)), ("what changed", _what),
        ("verdict", lambda c: _cell(c, "verdict", str)), ("max ULP", lambda c: _number_cell(c, "max_ulp")),
        ("bound used", lambda c: _number_cell(c, "bound_used")), ("exact", lambda c: _cell(c, "exact", _pct)),
        ("cases", lambda c: _cell(c, "cases", str))],
    "gradients": [
        ("op", _key_cell), ("input", lambda c: c.key["input"]), ("impl", lambda c: c.key["impl"]),
        ("check", lambda c: c.key["check"]), ("what changed", _what), ("verdict", lambda c: _cell(c, "verdict", str)),
        ("max error", lambda c: _number_cell(c, "max_error") + " " + (c.new or c.old)["unit"]),
        ("bound", lambda c: _cell(c, "max_bound", _g)), ("cases", lambda c: _cell(c, "cases", str))],
    "bench": [
        ("op", _key_cell), ("shape", lambda c: c.key["shape"]), ("impl", lambda c: c.key["impl"]),
        ("what changed", _what), ("eager p50 us", lambda c: _cell(c, "time_us", _us)),
        ("eager p10-p90 us", lambda c: _spread_cell(c, "eager")),
        ("graph p50 us", lambda c: _cell(c, "kernel_us", _us)),
        ("TB/s", lambda c: _cell(c, "TBps", _g)),
        ("of copy", lambda c: _cell(c, "of_copy", lambda v: "-" if v is None else f"{v:.0%}")),
        ("target met", lambda c: _cell(c, "met", lambda v: {None: "-", True: "yes", False: "no"}[v]))],
}


def _md_escape(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _table(columns: list[_Column], changes: list[Change]) -> list[str]:
    lines = ["| " + " | ".join(h for h, _ in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_md_escape(cell(c)) for _, cell in columns) + " |" for c in changes]
    return lines


def _run_line(m: dict[str, Any], dates: list[str] | None = None) -> str:
    """A run's meta in one line; `dates`: those of several runs that share the rest of it."""
    dates = sorted(dates or [m.get("date", "?")])
    when = dates[0] if len(dates) == 1 else f"{len(dates)} runs from {dates[0]} to {dates[-1]}"
    versions = m.get("versions") or {}
    where = f"{m.get('device', '?')}" + (f" (driver {m['driver']})" if m.get("driver") else "")
    how = ", ".join(f"{k} {m[k]}" for k in ("profile", "impl") if m.get(k))
    return (f"{when}, commit `{m.get('commit', '?')}`, {where}" + (f", {how}" if how else "")
            + "; " + ", ".join(f"{k} {versions[k]}" for k in sorted(versions) if versions[k]))


def _side_lines(name: str, side: Side) -> list[str]:
    """The meta of one side; a bench's runs that differ only in their date share a line."""
    groups: dict[str, tuple[dict[str, Any], list[str]]] = {}
    for run in side.runs or [side.meta]:
        rest = json.dumps({k: v for k, v in run.items() if k != "date"}, sort_keys=True, default=str)
        groups.setdefault(rest, (run, []))[1].append(run.get("date", "?"))
    lines = [_run_line(run, dates) for run, dates in groups.values()]
    if len(lines) == 1:
        return [f"- {name} `{side.label}`: {lines[0]}"]
    return [f"- {name} `{side.label}`, joined from runs:", *(f"  - {line}" for line in lines)]


def _differences(old: dict[str, Any], new: dict[str, Any]) -> str:
    """What differs between two metas: commit, device, driver, profile, implementations, versions."""
    out = [f"{k} {old.get(k, '-')}{ARROW}{new.get(k, '-')}" for k in ("commit", "device", "driver", "profile", "impl")
           if old.get(k) != new.get(k)]
    ov, nv = old.get("versions") or {}, new.get("versions") or {}
    out += [f"{k} {ov.get(k, '-')}{ARROW}{nv.get(k, '-')}" for k in sorted(ov.keys() | nv.keys())
            if ov.get(k) != nv.get(k)]
    return ", ".join(out) or "nothing in their meta"


def _title(diff: Diff) -> str:
    def side(s: Side, impl: str | None) -> str:
        return f"`{s.label}`" + (f" [{impl}]" if impl else "") + f" ({s.meta.get('commit', '?')})"
    what = "correctness reports" if diff.kind == "report" else "benches"
    old_impl, new_impl = (diff.impls.old, diff.impls.new) if diff.impls else (None, None)
    return f"# tkverify diff of two {what}: {side(diff.old, old_impl)}{ARROW}{side(diff.new, new_impl)}"


def render_markdown(diff: Diff) -> str:
    lines = [_title(diff), ""]
    for name, side in (("OLD", diff.old), ("NEW", diff.new)):
        lines += _side_lines(name, side)
    lines.append(f"- what differs: {_differences(diff.old.meta, diff.new.meta)}")
    if diff.impls is not None:
        lines.append(f"- implementations: `{diff.impls.old}` of OLD against `{diff.impls.new}` of NEW (the rows of "
                     "other implementations are left out)")
    lines.append(f"- counts as a change: {diff.thresholds.describe(diff.kind)}")
    flips = sum(1 for c in diff.regressions if any(w.startswith("verdict") for w in c.worse))
    verdict = (f"**{len(diff.regressions)} regressions**" + (f" ({flips} verdicts pass{ARROW}fail)" if flips else "")
               if diff.regressions else "no regression")
    lines += [f"- verdict: {verdict}", "", "## Summary", ""]
    counts = diff.counts()
    lines += ["| rows | " + " | ".join(diff.tables) + " |", "|---|" + "---|" * len(diff.tables)]
    for category in (*CATEGORIES, "unchanged"):
        title = TITLES.get(category, "Unchanged").lower()
        lines.append(f"| {title} | " + " | ".join(str(counts[t][category]) for t in diff.tables) + " |")
    for category in CATEGORIES:
        found = [c for c in diff.changes if c.category == category]
        if not found:
            continue
        lines += ["", f"## {TITLES[category]} ({len(found)})"]
        for table in diff.tables:
            rows = [c for c in found if c.table == table]
            if not rows:
                continue
            columns = COLUMNS[table] + ([("where to look in NEW", _where)] if category == "regression"
                                        and table != "bench" else [])
            lines += ["", f"### {table} ({len(rows)})", "", *_table(columns, rows)]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ the command


def _non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a number >= 0")
    return value


def configure_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("old", type=Path, metavar="OLD", help="report.json or bench.json of the earlier run")
    p.add_argument("new", type=Path, metavar="NEW", help="the same kind of file of the later run")
    p.add_argument("--threshold", type=_non_negative, default=0.05,
                   help="share that counts (default 0.05): a time 5%% slower, a bound fraction 0.05 higher, an "
                        "exact share 5 points lower, a gradient's error 5%% larger")
    p.add_argument("--ulp-threshold", type=_non_negative, default=0.0,
                   help="ULPs of max error that count, for rows whose bound is in ULPs and gradient checks in ULPs "
                        "(default 0: any increase)")
    p.add_argument("--old-impl", metavar="A", help="compare implementation A's rows of OLD ...")
    p.add_argument("--new-impl", metavar="B", help="... with implementation B's rows of NEW (either defaults to the "
                   "other; rows of other implementations are left out)")
    p.add_argument("--old-label", help="the name OLD is shown by (default its path)")
    p.add_argument("--new-label", help="the name NEW is shown by (default its path)")
    p.add_argument("--md", type=Path, metavar="PATH", help="write the markdown there instead of to stdout")
    p.add_argument("--json", type=Path, metavar="PATH", help="write the diff as JSON there")
    return p


def main(args: argparse.Namespace) -> int:
    """Exit status: 1 if there is a regression, 0 if not, 2 on bad input."""
    name = args.old_impl or args.new_impl
    impls = None if name is None else ImplMap(args.old_impl or name, args.new_impl or name)
    try:
        diff = diff_files(args.old, args.new, args.old_label, args.new_label,
                          Thresholds(share=args.threshold, ulp=args.ulp_threshold), impls)
    except DiffInputError as e:
        print(f"tkverify diff: {e}", file=sys.stderr)
        return 2
    text = render_markdown(diff)
    as_json = json.dumps(diff.to_json(), indent=1, default=str, ensure_ascii=False) + "\n"
    for path, content in ((args.md, text), (args.json, as_json)):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content, encoding="utf-8")
    if args.md is None:
        print(text, end="")
    else:
        counts = {c: sum(n[c] for n in diff.counts().values()) for c in (*CATEGORIES, "unchanged")}
        print("tkverify diff: " + ", ".join(f"{n} {TITLES.get(c, 'unchanged').lower()}" for c, n in counts.items())
              + f" ({args.md})")
    return 1 if diff.regressions else 0
