"""Reports: verdicts collected into rows, merged across workers, written as report.json, .md and .html.

* `tkverify.report.rows`    the typed rows of the four tables (results, gradients, fuzzing speed,
                            unsupported cases) and the `Report` that holds them; how rows of one key fold.
* `tkverify.report.shards`  the `Collector` of one process, its shard file, and merging shards.
* `tkverify.report.render`  a report as markdown and HTML.
* `tkverify.report.bounds`  how a row stands against its policy's bound: the bound in words, the fraction
                            used, the colour classes.
* `tkverify.report.reach`   what a run reached: examples per input class, the kernel-path coverage table
                            and coverage.json.
* `tkverify.report.files`   the files of a report and its meta (date, commit, versions, device).

The names below are what the plugin, the CLI, the bench and the tests use.
"""

from tkverify.report.files import (
    device_info, git_commit, merge_partial_run, meta, report_from_shards, write_report,
)
from tkverify.report.render import render_html, render_markdown, speed_markdown
from tkverify.report.rows import (
    SPEED_PHASES, GradientRow, Report, ResultRow, Row, SpeedRow, UnsupportedRow, fuzzed_rows, phase_split,
)
from tkverify.report.shards import (
    Collector, merge_gradient_shards, merge_shards, merge_speed_shards, merge_unsupported_shards, shard_summary,
)

__all__ = [
    "Collector", "GradientRow", "Report", "ResultRow", "Row", "SPEED_PHASES", "SpeedRow", "UnsupportedRow",
    "device_info", "fuzzed_rows", "git_commit", "merge_gradient_shards", "merge_partial_run", "merge_shards",
    "merge_speed_shards", "merge_unsupported_shards", "meta", "phase_split", "render_html", "render_markdown",
    "report_from_shards", "shard_summary", "speed_markdown", "write_report",
]
