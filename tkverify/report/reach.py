"""What a run reached, as the report shows it: examples per input class and the kernel-path coverage table
(`tkverify.coverage` computes both labels; the rows fold them per (op, impl) in `SpeedRow`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tkverify import coverage
from tkverify.report.render import _md_table
from tkverify.report.rows import SpeedRow

COVERAGE_FILE = "coverage.json"


def classes_markdown(speed: list[SpeedRow]) -> list[str]:
    """Judged examples per input class per (op, impl) (the strategies' ``class: <name>`` tags)."""
    lines = [[r.op, r.impl, ", ".join(f"{name} {n}" for name, n in sorted(r.classes.items()))]
             for r in speed if r.classes]
    if not lines:
        return []
    return ["", "## Input classes drawn", "", "Judged examples per input class the strategies tag "
            "(each family's spec docstring lists its classes).", "", _md_table([["op", "impl", "classes"], *lines])]


def path_counts(speed: list[SpeedRow]) -> dict[tuple[str, str], dict[str, int]]:
    """(op, impl) -> its kernel-path labels' counts, for the rows whose examples launched a kernel."""
    return {(r.op, r.impl): r.coverage for r in speed
            if any(label.split(coverage.SEPARATOR)[0] != coverage.NO_LAUNCH for label in r.coverage)}


def coverage_markdown(speed: list[SpeedRow], shipped: dict | None = None) -> list[str]:
    """The kernel-path coverage table: per shipped configuration, per (op, impl) that launched it, its
    examples and those of each boundary class; a configuration no example launched as a gap; and the
    examples of each (op, impl) that launched nothing (an empty batch)."""
    counts = path_counts(speed)
    if not counts:
        return []
    listed = coverage.coverage_list(counts, shipped)
    lines = []
    for kernel, configs in listed.items():
        for config, entry in configs.items():
            for who in entry["ops"] or ["**gap**"]:
                op, _, impl = who.rstrip("]").partition("[")
                labels = counts.get((op, impl), {})
                head = coverage.SEPARATOR.join((kernel, config))
                classes = ", ".join(f"{name} {labels.get(coverage.SEPARATOR.join((head, name)), 0)}"
                                    + ("" if labels.get(coverage.SEPARATOR.join((head, name))) else " (gap)")
                                    for name in entry["classes"]) if entry["ops"] else "-"
                lines.append([kernel, f"`{config}`", who, str(labels.get(head, 0)), classes or "-"])
    no_launch = [f"{op}[{impl}] {labels.get(coverage.NO_LAUNCH, 0)} (empty "
                 f"{labels.get(coverage.SEPARATOR.join((coverage.NO_LAUNCH, 'empty')), 0)})"
                 for (op, impl), labels in sorted(counts.items()) if labels.get(coverage.NO_LAUNCH)]
    missing = coverage.gaps(listed)
    return ["", "## Kernel-path coverage", "",
            "Judged examples per shipped static configuration (tuning candidates exempt) and (op, impl) that "
            "launched it, and how many of them were in each of the kernel's boundary classes "
            f"(tkverify/coverage.py); {len(missing)} gaps.", "",
            _md_table([["kernel", "config", "op [impl]", "examples", "boundary classes"], *lines]),
            *(["", "Examples that launched nothing: " + "; ".join(no_launch)] if no_launch else [])]


def write_coverage(out_dir: Path, speed: list[SpeedRow]) -> Path | None:
    """DIR/coverage.json, the coverage list of the run (`tkverify.coverage.coverage_list`), where an example
    launched a kernel; the test tests/test_coverage.py fails on its gaps when given it."""
    counts = path_counts(speed)
    path = out_dir / COVERAGE_FILE
    if not counts:  # a file an earlier run left would describe that run
        path.unlink(missing_ok=True)
        return None
    path.write_text(json.dumps(coverage.coverage_list(counts), indent=1, sort_keys=True))
    return path


def read_coverage(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())
