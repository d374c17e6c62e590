"""Rows collected while a run goes on, written per worker as shards, and merged.

Each pytest-xdist worker (or the one process without xdist) keeps a `Collector` and writes its rows
to ``DIR/shards/<worker>.json``; the controller merges the shards table by table
(`merge_shards`, ...), folding the rows of one key as one collector would have.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

import torch

from tkverify.policies import Comparison
from tkverify.report.rows import SPEED_PHASES, GradientRow, ResultRow, Row, SpeedRow, UnsupportedRow, fold_into

# The list of each table in a shard (report.json calls the result rows "results").
SHARD_TABLES: dict[type[Row], str] = {ResultRow: "rows", GradientRow: "gradients", SpeedRow: "speed",
                                      UnsupportedRow: "unsupported"}


class Collector:
    """The rows of one process, each table keyed by its rows' key."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, ...], ResultRow] = {}
        self.gradients: dict[tuple[str, ...], GradientRow] = {}
        self.speed: dict[tuple[str, str], SpeedRow] = {}
        self.unsupported: dict[tuple[str, str], UnsupportedRow] = {}

    def record(self, spec, impl, comparisons: Iterable[Comparison], case=None,
               timings: dict[str, float] | None = None) -> None:
        """The verdicts of one judged case (`tkverify.check.check_case`'s `record`)."""
        for c in comparisons:
            self.add(spec.name, impl.name, c, case.describe() if case is not None else "")
        if timings:
            self.add_timings(spec.name, impl.name, timings)

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
    # As report.json serialises them.
    union = json.loads(json.dumps([r.to_json() for r in merge_shards(shards)], default=str))
    return workers, union == report["results"]
