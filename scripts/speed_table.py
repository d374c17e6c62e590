"""Fuzzing speed of several runs side by side: examples per second per (op, impl), from each run's report.json.

    python3 scripts/speed_table.py LABEL=PATH/report.json ...   # e.g. h200=reports/h200/report.json

A column per run: judged examples over the wall time of that (op, impl)'s hypothesis run (summed over
workers); a last line with every row's totals and each run's split of the time (tkverify.report's phases).
"""

import json
import sys

from tkverify.report import Report, SpeedRow, fuzzed_rows, phase_split


def load(path: str) -> dict[tuple[str, str], SpeedRow]:
    with open(path) as f:
        return {(r.op, r.impl): r for r in fuzzed_rows(Report.from_json(json.load(f)).speed)}


def rate(row: SpeedRow | None) -> str:
    if row is None:
        return "-"
    return f"{row.examples / row.wall_s:.1f} ({row.examples} in {row.wall_s:.1f} s)"


def split(rows: dict[tuple[str, str], SpeedRow]) -> str:
    return ", ".join(f"{p} {100 * v:.0f}%" for p, v in phase_split(list(rows.values())).items() if v >= 0.005)


def main(args: list[str]) -> None:
    runs = [(label, load(path)) for label, path in (a.split("=", 1) for a in args)]
    keys = sorted({k for _, rows in runs for k in rows})
    print("| op | impl | " + " | ".join(label for label, _ in runs) + " |")
    print("|---|---|" + "---|" * len(runs))
    for op, impl in keys:
        print(f"| {op} | {impl} | " + " | ".join(rate(rows.get((op, impl))) for _, rows in runs) + " |")
    totals = []
    for _, rows in runs:
        examples, wall = sum(r.examples for r in rows.values()), sum(r.wall_s for r in rows.values())
        totals.append(f"**{examples / wall:.1f}** ({examples} in {wall:.1f} s; {split(rows)})")
    print("| **all** | | " + " | ".join(totals) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
