"""Rows collected while a run goes on, written per worker as shards, and merged.

Each pytest-xdist worker (or the one process without xdist) keeps a `Collector` and writes its rows
to ``DIR/shards/<worker>.json``; the controller merges the shards table by table
(`merge_shards`, ...), folding the rows of one key as one collector would have.

A collector also keeps, per result row, the example of its largest error (`tkverify.check.output_error`)
and, per failing (op, impl), the shrunk failing case; `save_cases` writes them under the report folder
(``DIR/worst/``, ``DIR/cases/``) as case files `tkverify replay` runs, and the rows name them
(`ResultRow.worst_case`, `ResultRow.failing_case`, relative to DIR) so that the folder stands alone.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from pathlib import Path
from typing import Any, Iterable

import torch

from strategies.layouts import layout_labels
from tkverify.case import Case, save_case
from tkverify.check import output_error
from tkverify.policies import Comparison
from tkverify.report.rows import SPEED_PHASES, GradientRow, ResultRow, Row, SpeedRow, UnsupportedRow, fold_into

# The list of each table in a shard (report.json calls the result rows "results").
SHARD_TABLES: dict[type[Row], str] = {ResultRow: "rows", GradientRow: "gradients", SpeedRow: "speed",
                                      UnsupportedRow: "unsupported"}


# The folders of a report that hold its rows' case files.
WORST_DIR, CASES_DIR = "worst", "cases"


@dataclasses.dataclass
class WorstCase:
    """The example of a result row's largest error so far, to be saved as a case file of the report."""

    case: Case
    label: str      # what `error` measures (`tkverify.check.output_error`)
    error: float
    policy: str
    saved: bool = False  # written since it became the worst

    def about(self, row: ResultRow) -> dict[str, Any]:
        """What its case file records beside the case: the row and the error there."""
        return {"output": row.output, "format": row.format, "policy": self.policy, "label": self.label,
                "error": self.error}


def _rank(error: float) -> float:
    """An error as a worst-case search compares them: NaN is no error to keep."""
    return -math.inf if math.isnan(error) else error


def worst_case_name(key: tuple[str, ...]) -> str:
    """The base name of a row's worst case in DIR/worst: ``<op>-<impl>-<output>-<format>`` (one op writes
    one output in several formats, a row each), with characters a file name should not hold as ``_``."""
    op, output, fmt, impl = key
    return re.sub(r"[^A-Za-z0-9._+-]", "_", f"{op}-{impl}-{output}-{fmt}")


def recorded_error(json_path: Path) -> float:
    """The error a worst-case file records (-inf where there is none or the file is unreadable)."""
    try:
        return _rank(float(json.loads(json_path.read_text())["worst"]["error"]))
    except (OSError, ValueError, KeyError, TypeError):
        return -math.inf


class Collector:
    """The rows of one process, each table keyed by its rows' key, and the case files the rows name."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, ...], ResultRow] = {}
        self.gradients: dict[tuple[str, ...], GradientRow] = {}
        self.speed: dict[tuple[str, str], SpeedRow] = {}
        self.unsupported: dict[tuple[str, str], UnsupportedRow] = {}
        self.worst_cases: dict[tuple[str, ...], WorstCase] = {}
        # (op, impl) -> (the result rows it failed, the bytes of its case file's .json and .npz, base name)
        self.failing_cases: dict[tuple[str, str], tuple[list[tuple[str, ...]], bytes, bytes, str]] = {}

    def record(self, spec, impl, comparisons: Iterable[Comparison], case=None,
               timings: dict[str, float] | None = None) -> None:
        """The verdicts of one judged case (`tkverify.check.check_case`'s `record`)."""
        for c in comparisons:
            self.add(spec.name, impl.name, c, case.describe() if case is not None else "")
            if case is not None:
                self.keep_if_worst((spec.name, c.output, c.fmt, impl.name), c, case)
        if case is not None:
            counts = self._speed_row(spec.name, impl.name).layouts
            for label in layout_labels(case, impl.layouts):
                counts[label] = counts.get(label, 0) + 1
        if timings:
            self.add_timings(spec.name, impl.name, timings)

    def add_coverage(self, op: str, impl: str, classes: Iterable[str], paths: Iterable[str]) -> None:
        """One judged example's input classes and kernel-path labels (`tkverify.suite.covering`)."""
        row = self._speed_row(op, impl)
        for counts, labels in ((row.classes, classes), (row.coverage, paths)):
            for label in labels:
                counts[label] = counts.get(label, 0) + 1

    def keep_if_worst(self, key: tuple[str, ...], c: Comparison, case: Case) -> None:
        """Keep `case` as the worst example of the row `key` if its error is the largest yet."""
        label, error = output_error(c)
        kept = self.worst_cases.get(key)
        if _rank(error) > -math.inf and (kept is None or _rank(error) > kept.error):
            self.worst_cases[key] = WorstCase(case, label, error, c.policy)

    def add_failing_case(self, op: str, impl: str, error: Any) -> None:
        """The case file a `tkverify.check.VerificationError` saved (its shrunk failing case, where the test
        ended): read now, so that a later run writing the same file changes nothing; `save_cases` copies it."""
        path = getattr(error, "case_file", None)
        if path is None:
            return
        json_path = Path(path)
        npz_path = json_path.with_name(json_path.name.removesuffix(".json") + ".npz")
        try:
            saved = json_path.read_bytes(), npz_path.read_bytes()
        except OSError:
            return
        failed = [(op, c.output, c.fmt, impl) for c in error.comparisons if not c.passed]
        self.failing_cases[(op, impl)] = (failed, *saved, json_path.name.removesuffix(".json"))

    def save_cases(self, report_dir: Path) -> None:
        """Write the worst examples not yet written (``DIR/worst/``) and the failing cases (``DIR/cases/``),
        and name them in the rows, relative to `report_dir`.

        A worst-case file another process of the run wrote with a larger error stays (it is the row's
        worst then), so the file of a row holds the largest error of every process that judged the row."""
        for key, worst in self.worst_cases.items():
            row = self.rows.get(key)
            if row is None:
                continue
            json_path = report_dir / WORST_DIR / f"{worst_case_name(key)}.json"
            if not worst.saved and recorded_error(json_path) <= worst.error:
                save_case(json_path, worst.case, op=row.op, impl=row.impl, extra={"worst": worst.about(row)})
            worst.saved = True
            row.worst_case = json_path.relative_to(report_dir).as_posix()
        for failed, json_bytes, npz_bytes, name in self.failing_cases.values():
            folder = report_dir / CASES_DIR
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{name}.npz").write_bytes(npz_bytes)
            (folder / f"{name}.json").write_bytes(json_bytes)
            for key in failed:
                if key in self.rows:
                    self.rows[key].failing_case = f"{CASES_DIR}/{name}.json"

    def add(self, op: str, impl: str, c: Comparison, case_desc: str = "") -> None:
        fold_into(self.rows, ResultRow.of(op, impl, c, case_desc))

    def _speed_row(self, op: str, impl: str) -> SpeedRow:
        return self.speed.setdefault((op, impl), SpeedRow(op, impl))

    def add_timings(self, op: str, impl: str, timings: dict[str, float]) -> None:
        """The phase times of one judged example; the first of (op, impl) also counts as its first call."""
        row = self._speed_row(op, impl)
        phases = {f"{k}_s": v for k, v in timings.items() if k in SPEED_PHASES}
        one = SpeedRow(op, impl, examples=1, **phases)
        one.first_impl_s = timings.get("impl", 0.0) if not row.examples else 0.0
        row.fold(one)

    def add_wall(self, op: str, impl: str, seconds: float) -> None:
        """Wall time of a whole hypothesis run of (op, impl): drawing and shrinking included."""
        self._speed_row(op, impl).wall_s += seconds

    def add_unsupported(self, op: str, impl: str, reason: str, seconds: float = 0.0) -> None:
        """A case the implementation refused (`tkverify.Unsupported`), with its reason
        and the seconds spent before the refusal (the fuzzing-speed table's "refused")."""
        fold_into(self.unsupported, UnsupportedRow(op, impl, 1, {reason: 1}))
        self._speed_row(op, impl).refused_s += seconds

    def add_gradient(self, check: Any, case_desc: str = "") -> None:
        """One `tkverify.gradients.GradientCheck` verdict."""
        fold_into(self.gradients, GradientRow.of(check, case_desc))

    def write_shard(self, path: Path, **about: Any) -> None:
        """One worker's rows, with what it ran on (`about`: worker id, GPU, pid) and the
        memory it touched on each visible GPU (evidence that a pinned worker kept to its own)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            about["peak_bytes_per_gpu"] = [torch.cuda.max_memory_allocated(d) for d in range(torch.cuda.device_count())]
        tables = {ResultRow: self.rows, GradientRow: self.gradients, SpeedRow: self.speed,
                  UnsupportedRow: self.unsupported}
        # Written while the run goes on too: replace the file whole, so a reader never sees half of one.
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps({**about, **{SHARD_TABLES[row_type]: [r.to_json() for r in table.values()]
                                               for row_type, table in tables.items()}}, default=str))
        os.replace(tmp, path)


def merge_table(paths: Iterable[Path], row_type: type[Row]) -> list[Row]:
    """The rows of one table of every shard, folded per key as one collector would have, sorted by key."""
    merged: dict[tuple[Any, ...], Row] = {}
    for p in sorted(paths):
        for doc in json.loads(Path(p).read_text()).get(SHARD_TABLES[row_type], []):
            fold_into(merged, row_type.from_json(doc))
    return [merged[k] for k in sorted(merged)]


def merge_shards(paths: Iterable[Path]) -> list[ResultRow]:
    return merge_table(paths, ResultRow)


def merge_gradient_shards(paths: Iterable[Path]) -> list[GradientRow]:
    return merge_table(paths, GradientRow)


def merge_speed_shards(paths: Iterable[Path]) -> list[SpeedRow]:
    return merge_table(paths, SpeedRow)


def merge_unsupported_shards(paths: Iterable[Path]) -> list[UnsupportedRow]:
    """Per (op, impl): the cases refused as unsupported, in all, and per reason."""
    return merge_table(paths, UnsupportedRow)


# Row fields the controller sets after merging the shards (tkverify.claims.judge), absent from the shards.
CLAIM_FIELDS = ("claim", "claim_exceeded")


def shard_summary(report_dir: Path) -> tuple[list[dict[str, Any]], bool]:
    """Per worker shard: who it was and what it did; and whether report.json's rows
    equal the fold of the shards (the merged report is the union of its shards)."""
    shards = sorted((report_dir / "shards").glob("*.json"))
    workers = []
    for p in shards:
        doc = json.loads(p.read_text())
        workers.append({
            "worker": doc.get("worker", p.stem), "pid": doc.get("pid"), "gpu": doc.get("gpu"),
            "peak_bytes_per_gpu": doc.get("peak_bytes_per_gpu"), "rows": len(doc["rows"]),
            "gradients": len(doc.get("gradients", [])),
            "examples": sum(r["examples"] for r in doc.get("speed", [])),
        })
    report = json.loads((report_dir / "report.json").read_text())
    # As report.json serialises them, less what the controller adds after the merge (the claims' verdicts).
    union = json.loads(json.dumps([r.to_json() for r in merge_shards(shards)], default=str))
    return workers, _without_claims(union) == _without_claims(report["results"])


def _without_claims(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k not in CLAIM_FIELDS} for row in rows]
