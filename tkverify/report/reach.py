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


def _fields(label: str) -> tuple[str, list[str]]:
    """A configuration's repr, ``Name(a=1, b=(2, 3))``, as its name and its top-level ``field=value`` items."""
    name, _, rest = label.partition("(")
    items, depth, start = [], 0, 0
    body = rest[:-1] if rest.endswith(")") else rest
    for i, ch in enumerate(body):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            items.append(body[start:i].strip())
            start = i + 1
    if body[start:].strip():
        items.append(body[start:].strip())
    return name, items


def short_config_labels(labels: list[str]) -> dict[str, str]:
    """Each of one kernel's configuration labels with only the fields that tell it from the kernel's other
    configurations (all of them where the labels do not parse as ``Name(field=value, ...)``): a 200-character
    repr that repeats the defaults says less than ``threads=512, v_once=True``."""
    parsed = {label: _fields(label) for label in labels}
    if len(labels) < 2 or any(not all("=" in item for item in items) for _, items in parsed.values()):
        return {label: label for label in labels}
    keys = [[item.partition("=")[0] for item in items] for _, items in parsed.values()]
    if any(k != keys[0] for k in keys):
        return {label: label for label in labels}
    differ = [i for i in range(len(keys[0])) if len({items[i] for _, items in parsed.values()}) > 1]
    return {label: f"{name}({', '.join(items[i] for i in differ)})" for label, (name, items) in parsed.items()}


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
        short = short_config_labels(list(configs))
        for config, entry in configs.items():
            for who in entry["ops"] or ["**gap**"]:
                op, _, impl = who.rstrip("]").partition("[")
                labels = counts.get((op, impl), {})
                head = coverage.SEPARATOR.join((kernel, config))
                classes = ", ".join(f"{name} {labels.get(coverage.SEPARATOR.join((head, name)), 0)}"
                                    + ("" if labels.get(coverage.SEPARATOR.join((head, name))) else " (gap)")
                                    for name in entry["classes"]) if entry["ops"] else "-"
                lines.append([kernel, f"`{short[config]}`", who, str(labels.get(head, 0)), classes or "-"])
    no_launch = [f"{op}[{impl}] {labels.get(coverage.NO_LAUNCH, 0)} (empty "
                 f"{labels.get(coverage.SEPARATOR.join((coverage.NO_LAUNCH, 'empty')), 0)})"
                 for (op, impl), labels in sorted(counts.items()) if labels.get(coverage.NO_LAUNCH)]
    missing = coverage.gaps(listed)
    return ["", "## Kernel-path coverage", "",
            "Judged examples per shipped static configuration (tuning candidates exempt) and (op, impl) that "
            "launched it, and how many of them were in each of the kernel's boundary classes "
            f"(tkverify/coverage.py); {len(missing)} gaps.  A configuration shows the fields that tell it from "
            "the kernel's other configurations (coverage.json names each in full).", "",
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
