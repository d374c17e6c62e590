"""The report's files (report.json, report.md, report.html) and what a report says it ran on."""

from __future__ import annotations

import datetime as _dt
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import torch

from tkverify import claims
from tkverify.case import versions
from tkverify.report.reach import write_coverage
from tkverify.report.render import render_html, render_markdown
from tkverify.report.rows import GradientRow, Report, ResultRow, SpeedRow, UnsupportedRow
from tkverify.report.shards import merge_gradient_shards, merge_shards, merge_speed_shards, merge_unsupported_shards


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=5).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def device_info() -> dict[str, Any]:
    if not torch.cuda.is_available():
        return {"device": "cpu", "gpus": 0}
    info = {
        "device": torch.cuda.get_device_name(0),
        "gpus": torch.cuda.device_count(),
        "capability": "sm_%d%d" % torch.cuda.get_device_capability(0),
        "cuda": torch.version.cuda,
    }
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        info["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError, IndexError):
        info["driver"] = "unknown"
    return info


def meta(profile: str, impl: str, seed: int | None = None) -> dict[str, Any]:
    """What a report ran on; `seed` is hypothesis' seed where one chose the examples (None: each test's
    derandomised draw, or hypothesis' own random one)."""
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": os.environ.get("TKVERIFY_COMMIT") or git_commit(),
        "profile": profile,
        "impl": impl,
        **({} if seed is None else {"seed": seed}),
        "versions": versions(),
        **device_info(),
    }


def write_report(out_dir: Path, rows: list[ResultRow], meta_: dict[str, Any],
                 gradients: list[GradientRow] | None = None,
                 speed: list[SpeedRow] | None = None,
                 unsupported: list[UnsupportedRow] | None = None) -> dict[str, Path]:
    """report.json, report.md and report.html of these rows in out_dir, and coverage.json where an example
    launched one of our kernels (`tkverify.report.reach.write_coverage`)."""
    report = Report(meta_, rows, gradients or [], speed or [], unsupported or [])
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out_dir / "report.json",
        "md": out_dir / "report.md",
        "html": out_dir / "report.html",
    }
    paths["json"].write_text(json.dumps(report.to_json(), indent=1, default=str))
    paths["md"].write_text(render_markdown(report))
    paths["html"].write_text(render_html(report))
    covered = write_coverage(out_dir, report.speed)
    if covered is not None:
        paths["coverage"] = covered
    return paths


def report_from_shards(report_dir: Path, meta_: dict[str, Any], claims_dir: Path | None = None,
                       enforce_claims: bool = True) -> dict[str, Path]:
    """Merge the shards under report_dir/shards into report.{json,md,html} there; with `claims_dir`, each
    result row judged against its implementation's accuracy claim there (tkverify.claims.judge, which
    fails rows beyond their claim only with `enforce_claims`)."""
    shards = sorted((report_dir / "shards").glob("*.json"))
    rows = merge_shards(shards)
    if claims_dir is not None:
        claims.judge(rows, meta_, claims_dir, enforce=enforce_claims)
    return write_report(report_dir, rows, meta_, gradients=merge_gradient_shards(shards),
                        speed=merge_speed_shards(shards), unsupported=merge_unsupported_shards(shards))


def merge_partial_run(report_dir: Path) -> dict[str, Path]:
    """The report of the shards under report_dir when no run wrote one (profile and implementation
    choice as the shards recorded them): a run that did not finish, with `partial` saying which
    shards were final, or finished runs whose shards were put together (several processes of one
    hunt, one a seed), with `merged` naming them; a report is partial only if a shard is."""
    docs = {p.stem: json.loads(p.read_text()) for p in sorted((report_dir / "shards").glob("*.json"))}
    first = next(iter(docs.values()), {})
    meta_ = meta(first.get("profile", "?"), first.get("impl", "?"))
    if docs and all(d.get("complete") for d in docs.values()):
        meta_["merged"] = "merged from the final shards of finished runs: " + ", ".join(docs)
    else:
        meta_["partial"] = ("merged from the shards of a run that did not finish: "
                            + ", ".join(f"{w} ({'final' if d.get('complete') else 'written while running'})"
                                        for w, d in docs.items()))
    return report_from_shards(report_dir, meta_)
