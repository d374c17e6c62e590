"""Collect verdicts into rows keyed by (op, output, format, impl); merge shards; write reports.

Each pytest-xdist worker writes its rows to ``DIR/shards/<worker>.json``; the
controller merges the shards into ``report.json``, ``report.md`` and
``report.html``.  Merging is a plain fold over rows with the same key, so the
merged report equals the union of the shards whatever the split.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from tkverify.case import versions
from tkverify.policies import HIST_LABELS, Comparison
from tkverify.registry import KnownDiscrepancy

KEY = ("op", "output", "format", "impl")


def new_row(op: str, output: str, fmt: str, impl: str, policy: str) -> dict[str, Any]:
    return {
        "op": op, "output": output, "format": fmt, "impl": impl, "policy": policy,
        "cases": 0, "count": 0, "exact_count": 0, "exact": 1.0,
        "max_ulp": 0.0, "sum_ulp": 0.0, "mean_ulp": 0.0,
        "hist": {}, "failures": 0, "verdict": "pass", "worst": None, "extra": {},
    }


def fold(row: dict[str, Any], other: dict[str, Any]) -> None:
    """Add `other` (a row of the same key) into `row`."""
    row["cases"] += other["cases"]
    row["count"] += other["count"]
    row["exact_count"] += other["exact_count"]
    row["sum_ulp"] += other["sum_ulp"]
    row["failures"] += other["failures"]
    for k, v in other["hist"].items():
        row["hist"][k] = row["hist"].get(k, 0) + v
    for k, v in other["extra"].items():
        row["extra"][k] = max(row["extra"].get(k, -math.inf), v)
    if other["worst"] is not None and (row["worst"] is None or other["max_ulp"] > row["max_ulp"]):
        row["worst"] = other["worst"]
    row["max_ulp"] = max(row["max_ulp"], other["max_ulp"])
    finish(row)


def finish(row: dict[str, Any]) -> None:
    """Derived fields: shares and verdict."""
    row["exact"] = row["exact_count"] / row["count"] if row["count"] else 1.0
    row["mean_ulp"] = row["sum_ulp"] / row["count"] if row["count"] else 0.0
    row["verdict"] = "fail" if row["failures"] else "pass"
    row["hist"] = {k: row["hist"][k] for k in HIST_LABELS if k in row["hist"]} | {
        k: v for k, v in row["hist"].items() if k not in HIST_LABELS
    }


class Collector:
    """Rows of one process, keyed by (op, output, format, impl)."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, ...], dict[str, Any]] = {}
        self.gradients: dict[tuple[str, ...], dict[str, Any]] = {}  # gradient checks, keyed by GRADIENT_KEY
        self.speed: dict[tuple[str, str], dict[str, Any]] = {}  # fuzzing speed, keyed by (op, impl)
        self.unsupported: dict[tuple[str, str], dict[str, int]] = {}  # (op, impl) -> reason -> cases

    def record(self, spec, impl, comparisons: Iterable[Comparison], case=None,
               timings: dict[str, float] | None = None) -> None:
        for c in comparisons:
            self.add(spec.name, impl.name, c, case.describe() if case is not None else "")
        if timings:
            self.add_timings(spec.name, impl.name, timings)

    def _speed_row(self, op: str, impl: str) -> dict[str, Any]:
        if (op, impl) not in self.speed:
            self.speed[op, impl] = new_speed_row(op, impl)
        return self.speed[op, impl]

    def add_timings(self, op: str, impl: str, timings: dict[str, float]) -> None:
        """The phase times of one judged example."""
        one = new_speed_row(op, impl)
        one["examples"] = 1
        one.update({f"{k}_s": v for k, v in timings.items() if f"{k}_s" in one})
        one["first_impl_s"] = timings.get("impl", 0.0) if not self._speed_row(op, impl)["examples"] else 0.0
        fold_speed(self._speed_row(op, impl), one)

    def add_wall(self, op: str, impl: str, seconds: float) -> None:
        """Wall time of a whole hypothesis run of (op, impl): drawing and shrinking included."""
        self._speed_row(op, impl)["wall_s"] += seconds

    def add(self, op: str, impl: str, c: Comparison, case_desc: str = "") -> None:
        one = new_row(op, c.output, c.fmt, impl, c.policy)
        one.update(cases=1, count=c.count, exact_count=c.exact, max_ulp=c.max_ulp, sum_ulp=c.sum_ulp,
                   hist=dict(c.hist), failures=0 if c.passed else 1, extra=dict(c.extra))
        if c.worst is not None:
            one["worst"] = {**c.worst, "case": case_desc}
        key = (op, c.output, c.fmt, impl)
        if key not in self.rows:
            self.rows[key] = new_row(*key, c.policy)
        fold(self.rows[key], one)

    def add_unsupported(self, op: str, impl: str, reason: str, seconds: float = 0.0) -> None:
        """A case the implementation refused (`tkverify.registry.Unsupported`), with its reason
        and the seconds spent before the refusal (the fuzzing-speed table's "refused")."""
        reasons = self.unsupported.setdefault((op, impl), {})
        reasons[reason] = reasons.get(reason, 0) + 1
        self._speed_row(op, impl)["refused_s"] += seconds

    def add_gradient(self, check: Any, case_desc: str = "") -> None:
        """One `tkverify.gradients.GradientCheck` verdict."""
        one = gradient_row(check, case_desc)
        key = tuple(one[k] for k in GRADIENT_KEY)
        if key not in self.gradients:
            self.gradients[key] = new_gradient_row(*key, one["unit"], one["policy"])
        fold_gradient(self.gradients[key], one)

    def write_shard(self, path: Path, **about: Any) -> None:
        """One worker's rows, with what it ran on (`about`: worker id, GPU, pid) and the
        memory it touched on each visible GPU (evidence that a pinned worker kept to its own)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            about["peak_bytes_per_gpu"] = [torch.cuda.max_memory_allocated(d) for d in range(torch.cuda.device_count())]
        unsupported = [{"op": op, "impl": impl, "reasons": reasons}
                       for (op, impl), reasons in self.unsupported.items()]
        # Written while the run goes on too: replace the file whole, so a reader never sees half of one.
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps({**about, "rows": list(self.rows.values()),
                                   "gradients": list(self.gradients.values()),
                                   "speed": list(self.speed.values()),
                                   "unsupported": unsupported}, default=str))
        os.replace(tmp, path)


def fold_shards(paths: Iterable[Path], section: str, key_fields: tuple[str, ...],
                new: Callable[[dict[str, Any]], dict[str, Any]],
                fold_into: Callable[[dict[str, Any], dict[str, Any]], None]) -> list[dict[str, Any]]:
    """The rows of one section of every shard, folded per key as one collector would have."""
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for p in sorted(paths):
        for row in json.loads(Path(p).read_text()).get(section, []):
            key = tuple(row[k] for k in key_fields)
            if key not in merged:
                merged[key] = new(row)
            fold_into(merged[key], row)
    return [merged[k] for k in sorted(merged)]


def merge_shards(paths: Iterable[Path]) -> list[dict[str, Any]]:
    return fold_shards(paths, "rows", KEY, lambda r: new_row(*(r[k] for k in KEY), r["policy"]), fold)


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
    union = json.loads(json.dumps(merge_shards(shards), default=str))  # as report.json serialises it
    return workers, union == report["results"]


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


def report_from_shards(report_dir: Path, meta_: dict[str, Any]) -> dict[str, Path]:
    """Merge the shards under report_dir/shards into report.{json,md,html} there."""
    shards = sorted((report_dir / "shards").glob("*.json"))
    return write_report(report_dir, merge_shards(shards), meta_, gradients=merge_gradient_shards(shards),
                        speed=merge_speed_shards(shards), unsupported=merge_unsupported_shards(shards))


# ---------------------------------------------------------------- fuzzing speed

# "refused": examples the implementation refused (`Unsupported`), whole; the others are phases of judged ones.
SPEED_PHASES = ("transfer", "impl", "oracle", "judge", "refused")


def new_speed_row(op: str, impl: str) -> dict[str, Any]:
    """Where the time of fuzzing (op, impl) went; `first_impl_s` is the first call of a
    process (compilation or a kernel-cache load), also counted in `impl_s`."""
    return {"op": op, "impl": impl, "examples": 0, "wall_s": 0.0, "first_impl_s": 0.0,
            **{f"{p}_s": 0.0 for p in SPEED_PHASES}}


def fold_speed(row: dict[str, Any], other: dict[str, Any]) -> None:
    for k in ("examples", "wall_s", "first_impl_s", *(f"{p}_s" for p in SPEED_PHASES)):
        row[k] += other.get(k, 0)  # shards written before a phase existed lack it


def merge_speed_shards(paths: Iterable[Path]) -> list[dict[str, Any]]:
    return fold_shards(paths, "speed", ("op", "impl"), lambda r: new_speed_row(r["op"], r["impl"]), fold_speed)


SPEED_HEADER = ["op", "impl", "examples", "wall s", "examples/s", "first call s", "transfer", "impl", "oracle",
                "judge", "refused", "draw, shrink, other"]


def _speed_cells(r: dict[str, Any]) -> list[str]:
    wall = r["wall_s"]
    shares = phase_split([r])
    rate = f"{r['examples'] / wall:.1f}" if wall > 0 else "-"
    return [r["op"], r["impl"], str(r["examples"]), f"{wall:.2f}", rate, f"{r['first_impl_s']:.2f}",
            *(f"{100 * shares[p]:.0f}%" if shares else "-" for p in (*SPEED_PHASES, "other"))]


def fuzzed_rows(speed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of the differential suite's hypothesis runs, the ones with a wall time (a backward's
    refusals leave a row of refused seconds only)."""
    return [r for r in speed if r["wall_s"] > 0]


def phase_split(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Each phase's share of the rows' summed wall time, and "other" (drawing, shrinking, the rest)."""
    wall = sum(r["wall_s"] for r in rows)
    if not wall:
        return {}
    shares = {p: sum(r.get(f"{p}_s", 0.0) for r in rows) / wall for p in SPEED_PHASES}
    return {**shares, "other": max(1.0 - sum(shares.values()), 0.0)}


def speed_markdown(speed: list[dict[str, Any]]) -> list[str]:
    speed = fuzzed_rows(speed)
    if not speed:
        return []
    total_wall = sum(r["wall_s"] for r in speed)
    total_examples = sum(r["examples"] for r in speed)
    shares = phase_split(speed)
    split = ", ".join(f"{p} {100 * shares[p]:.0f}%" for p in SPEED_PHASES)
    return ["", "## Fuzzing speed", "",
            f"Summed over workers: {total_examples} judged examples in {total_wall:.1f} s of test time "
            f"({total_examples / total_wall:.1f} examples/s); {split}, "
            f"drawing, shrinking and the rest {100 * shares['other']:.0f}%. "
            "The first call of each (op, impl) in a process includes compiling or loading its kernel.", "",
            _md_table([SPEED_HEADER, *[_speed_cells(r) for r in speed]])]


def merge_unsupported_shards(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Per (op, impl): the cases refused as unsupported, in all, and per reason."""
    merged: dict[tuple[str, str], dict[str, int]] = {}
    for p in sorted(paths):
        for row in json.loads(Path(p).read_text()).get("unsupported", []):
            reasons = merged.setdefault((row["op"], row["impl"]), {})
            for reason, n in row["reasons"].items():
                reasons[reason] = reasons.get(reason, 0) + n
    return [{"op": op, "impl": impl, "cases": sum(r.values()),
             "reasons": dict(sorted(r.items(), key=lambda kv: (-kv[1], kv[0])))}
            for (op, impl), r in sorted(merged.items())]


def _split_known(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(refusals, known discrepancies): the same rows, each keeping only its reasons of that kind."""
    def part(known: bool) -> list[dict[str, Any]]:
        out = []
        for r in rows:
            reasons = {k: n for k, n in r["reasons"].items() if k.startswith(KnownDiscrepancy.PREFIX) == known}
            if reasons:
                out.append({**r, "cases": sum(reasons.values()), "reasons": reasons})
        return out
    return part(False), part(True)


_KNOWN_INTRO = ("Cases where the implementation failed in exactly the way a committed finding describes (its id "
                "names the section of the findings file). They are not counted as passes: the rows above include "
                "their failing elements; the finding's own case replays the failure.")
_REFUSED_INTRO = ("Cases an implementation refused because it lacks the option, format, size or input domain they "
                  "ask for (in the installed version). They were not judged: the rows above cover only the cases "
                  "that ran.")


def _reason_section(title: str, intro: str, rows: list[dict[str, Any]], label: str, strip: str = "") -> list[str]:
    if not rows:
        return []
    out = ["", f"## {title}", "", intro, ""]
    for r in rows:
        reasons = "; ".join(f"{reason[len(strip):].strip()} ({n})" for reason, n in r["reasons"].items())
        out.append(f"- {r['op']} [{r['impl']}]{label}: {r['cases']} cases ({reasons})")
    return out


def unsupported_markdown(rows: list[dict[str, Any]]) -> list[str]:
    refused, known = _split_known(rows)
    return (_reason_section("Known discrepancies: failures excused by a committed finding", _KNOWN_INTRO, known,
                            "", KnownDiscrepancy.PREFIX)
            + _reason_section("Not available: unsupported cases", _REFUSED_INTRO, refused, " unsupported"))


# ---------------------------------------------------------------- gradients

# One row per (op, differentiable input, implementation, check): see tkverify.gradients.
GRADIENT_KEY = ("op", "input", "impl", "check")


def new_gradient_row(op: str, input_: str, impl: str, check: str, unit: str, policy: str) -> dict[str, Any]:
    return {
        "kind": "gradient", "op": op, "input": input_, "impl": impl, "check": check, "unit": unit,
        "policy": policy, "cases": 0, "count": 0, "exact_count": 0, "max_error": 0.0, "sum_error": 0.0,
        "max_bound": None, "failures": 0, "verdict": "pass", "worst": None,
    }


def gradient_row(check: Any, case_desc: str = "") -> dict[str, Any]:
    """The row of a single verdict (a GradientCheck)."""
    row = new_gradient_row(check.op, check.input, check.impl, check.check, check.unit, check.policy)
    row.update(cases=1, count=check.count, exact_count=check.exact, max_error=check.error,
               sum_error=check.sum_error, max_bound=check.bound, failures=0 if check.passed else 1)
    row["worst"] = {"failed": not check.passed, "error": check.error, "bound": check.bound,
                    "message": check.message, "element": check.worst, "case": case_desc}
    return row


def fold_gradient(row: dict[str, Any], other: dict[str, Any]) -> None:
    """Add `other` (a gradient row of the same key) into `row`."""
    for k in ("cases", "count", "exact_count", "sum_error", "failures"):
        row[k] += other[k]

    def rank(w: dict[str, Any] | None) -> tuple[bool, float]:  # a failure over a pass, then the larger error
        return (False, -math.inf) if w is None else (bool(w["failed"]), w["error"])

    if other["worst"] is not None and rank(other["worst"]) > rank(row["worst"]):
        row["worst"] = other["worst"]
    row["max_error"] = max(row["max_error"], other["max_error"])
    if other["max_bound"] is not None:
        row["max_bound"] = other["max_bound"] if row["max_bound"] is None else max(row["max_bound"], other["max_bound"])
    row["verdict"] = "fail" if row["failures"] else "pass"


def merge_gradient_shards(paths: Iterable[Path]) -> list[dict[str, Any]]:
    return fold_shards(paths, "gradients", GRADIENT_KEY,
                       lambda r: new_gradient_row(*(r[k] for k in GRADIENT_KEY), r["unit"], r["policy"]), fold_gradient)


def _gradient_cells(r: dict[str, Any]) -> list[str]:
    bound = "-" if r["max_bound"] is None else f"{r['max_bound']:.3g}"
    return [r["op"], r["input"], r["impl"], r["check"], str(r["cases"]), f"{r['max_error']:.3g} {r['unit']}",
            bound, r["verdict"]]


GRADIENT_HEADER = ["op", "input", "impl", "check", "cases", "max error", "largest bound", "verdict"]


def gradients_markdown(grads: list[dict[str, Any]]) -> list[str]:
    if not grads:
        return []
    out = ["", "## Gradients", "",
           "gradcheck: the float64 backward derived by hand against finite differences (torch.autograd.gradcheck); "
           "vs_oracle: the implementation's backward against it (max ULP against the exact gradient); "
           "consistency: the implementation's backward against central differences of its own forward "
           "(relative error of a directional derivative, and the largest bound it was held to).", "",
           _md_table([GRADIENT_HEADER, *[_gradient_cells(r) for r in grads]])]
    failed = [r for r in grads if r["verdict"] != "pass"]
    if failed:
        out += ["", "### Gradient failures", ""]
        for r in failed:
            w = r.get("worst") or {}
            out.append(f"- {r['op']} d/d{r['input']} [{r['impl']}] {r['check']}: {w.get('message', '')} "
                       f"({w.get('case', '')})")
    return out


def gradients_html(grads: list[dict[str, Any]]) -> list[str]:
    if not grads:
        return []
    esc = html.escape
    parts = ["<h2>Gradients</h2><table><tr>" + "".join(f"<th>{esc(c)}</th>" for c in GRADIENT_HEADER) + "</tr>"]
    for r in grads:
        cls = "" if r["verdict"] == "pass" else " class='fail'"
        parts.append(f"<tr{cls}>" + "".join(f"<td>{esc(c)}</td>" for c in _gradient_cells(r)) + "</tr>")
    parts.append("</table>")
    return parts


# ---------------------------------------------------------------- meta


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


def meta(profile: str, impl: str) -> dict[str, Any]:
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": os.environ.get("TKVERIFY_COMMIT") or git_commit(),
        "profile": profile,
        "impl": impl,
        "versions": versions(),
        **device_info(),
    }


# ---------------------------------------------------------------- writers


def write_report(out_dir: Path, rows: list[dict[str, Any]], meta_: dict[str, Any],
                 gradients: list[dict[str, Any]] | None = None,
                 speed: list[dict[str, Any]] | None = None,
                 unsupported: list[dict[str, Any]] | None = None) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta_, "results": rows, "gradients": gradients or [], "speed": speed or [],
           "unsupported": unsupported or []}
    paths = {
        "json": out_dir / "report.json",
        "md": out_dir / "report.md",
        "html": out_dir / "report.html",
    }
    paths["json"].write_text(json.dumps(doc, indent=1, default=str))
    paths["md"].write_text(render_markdown(doc))
    paths["html"].write_text(render_html(doc))
    return paths


def _ulp_cell(row: dict[str, Any]) -> str:
    mark = "" if row["verdict"] == "pass" else " FAIL"
    return f"{row['max_ulp']:.3g}{mark}"


def formats_table(rows: list[dict[str, Any]]) -> dict[str, list[list[str]]]:
    """Per format, a libm-test-ulps style table: op.output by implementation, max ULP."""
    tables = {}
    for fmt in sorted({r["format"] for r in rows}):
        sel = [r for r in rows if r["format"] == fmt]
        impls = sorted({r["impl"] for r in sel})
        ops = sorted({(r["op"], r["output"]) for r in sel})
        table = [["op", *impls]]
        for op, output in ops:
            cells = []
            for impl in impls:
                hit = [r for r in sel if (r["op"], r["output"], r["impl"]) == (op, output, impl)]
                cells.append(_ulp_cell(hit[0]) if hit else "-")
            table.append([f"{op}:{output}", *cells])
        tables[fmt] = table
    return tables


def _md_table(table: list[list[str]]) -> str:
    head, *body = table
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def _hist_text(hist: dict[str, int]) -> str:
    return " ".join(f"{k}:{v}" for k, v in hist.items())


def _known_note(failed: list[dict[str, Any]], unsupported: list[dict[str, Any]]) -> str:
    """Says so when every failing row belongs to an (op, impl) that had failures a committed finding excused
    (whether it also had others is the test run's verdict, not the report's)."""
    known = {(r["op"], r["impl"]) for r in _split_known(unsupported)[1]}
    if failed and all((r["op"], r["impl"]) in known for r in failed):
        return (f"; the {len(failed)} failing rows all belong to (op, implementation) pairs with known "
                "discrepancies, listed at the end")
    return ""


def render_markdown(doc: dict[str, Any]) -> str:
    m, rows = doc["meta"], doc["results"]
    failed = [r for r in rows if r["verdict"] != "pass"]
    grads = doc.get("gradients", [])
    grads_failed = [r for r in grads if r["verdict"] != "pass"]
    out = [
        "# tkverify report",
        "",
        f"- date: {m['date']}  commit: `{m['commit']}`  profile: {m['profile']}  impl: {m['impl']}",
        f"- device: {m.get('device')}  driver: {m.get('driver', '-')}  CUDA: {m.get('cuda', '-')}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in sorted(m["versions"].items())),
        f"- verdict: **{'FAIL' if failed or grads_failed else 'pass'}** ({len(rows) - len(failed)} of {len(rows)} "
        f"rows pass" + (f"; {len(grads) - len(grads_failed)} of {len(grads)} gradient rows pass" if grads else "")
        + _known_note(failed, doc.get("unsupported", [])) + ")",
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
            f"| {r['op']} | {r['output']} | {r['format']} | {r['impl']} | {r['policy']} | {r['cases']} "
            f"| {r['count']} | {100 * r['exact']:.4g}% | {r['max_ulp']:.3g} | {r['mean_ulp']:.3g} "
            f"| {_hist_text(r['hist'])} | {r['verdict']} |"
        )
    if failed:
        out += ["", "## Failures", ""]
        for r in failed:
            w = r.get("worst") or {}
            out.append(f"- {r['op']}:{r['output']} [{r['impl']}] worst at {w.get('index')}: actual "
                       f"{w.get('actual')}, expected {w.get('expected')}, ULP {w.get('ulp')} ({w.get('case', '')})")
    out += extras_markdown(rows)
    out += gradients_markdown(grads)
    out += unsupported_markdown(doc.get("unsupported", []))
    out += speed_markdown(doc.get("speed", []))
    return "\n".join(out) + "\n"


EXTRA_MEANINGS = {
    "max_sum_deviation": "largest |row or column sum - 1| of the implementation's output",
    "oracle_max_sum_deviation": "the same of the float64 oracle's output, on the same cases",
    "max_allowed_ulp": "widest bound a comparison allowed, in ULPs of the output format",
    "max_bound_used": "largest share of its bound an element used (1 = at the bound)",
}


def extras_markdown(rows: list[dict[str, Any]]) -> list[str]:
    """Figures an op's policy adds beyond ULPs (e.g. Sinkhorn's sum deviations), per row."""
    rows = [r for r in rows if r.get("extra")]
    if not rows:
        return []
    keys = sorted({k for r in rows for k in r["extra"]})
    out = ["", "## Op-specific figures", ""]
    out += [f"- `{k}`: {EXTRA_MEANINGS.get(k, 'see the op spec')}" for k in keys]
    out += ["", _md_table([["op", "output", "format", "impl", *keys],
                           *[[r["op"], r["output"], r["format"], r["impl"],
                              *(f"{r['extra'][k]:.3g}" if k in r["extra"] else "-" for k in keys)] for r in rows]])]
    return out


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


def render_html(doc: dict[str, Any]) -> str:
    m, rows = doc["meta"], doc["results"]
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
        cls = "" if r["verdict"] == "pass" else " class='fail'"
        parts.append(
            f"<tr{cls}><td>{esc(r['op'])}</td><td>{esc(r['output'])}</td><td>{esc(r['format'])}</td>"
            f"<td>{esc(r['impl'])}</td><td>{r['cases']}</td><td>{r['count']}</td>"
            f"<td>{100 * r['exact']:.4g}%</td><td>{r['max_ulp']:.3g}</td><td>{r['mean_ulp']:.3g}</td>"
            f"<td>{_svg_histogram(r['hist'])}</td><td>{esc(r['verdict'])}</td></tr>"
        )
    parts.append("</table>")
    parts += gradients_html(doc.get("gradients", []))
    in_list = False
    for line in unsupported_markdown(doc.get("unsupported", [])):
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
    return "\n".join(parts) + "\n"
