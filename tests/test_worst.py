"""The worst-case search: each output's error targeted under the fuzz and worst profiles, each report
row's worst example kept as a case file that `tkverify replay` reproduces, and failing cases copied into
the report folder."""

import collections
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import hypothesis
import pytest
import torch

from tkverify import cli, registry
from tkverify.case import Case, load_case, save_case
from tkverify.check import INFINITE_SCORE, VerificationError, check_case, output_error, verification_errors
from tkverify.policies import Comparison
from tkverify.report import Collector, merge_shards
from tkverify.suite import target_errors

ROOT = Path(__file__).resolve().parent.parent

# Imported by the suite's pytest process with -p: logs every hypothesis.target call, one JSON line each.
TARGET_PROBE = """\
import json, os
import hypothesis

_target = hypothesis.target


def _logged(observation, *, label=""):
    with open(os.environ["TK_TARGET_LOG"], "a") as log:
        log.write(json.dumps([label, observation]) + "\\n")
    return _target(observation, label=label)


hypothesis.target = _logged
"""


def run_suite(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The differential suite in a fresh pytest process, in tmp_path (its hypothesis database lands there),
    with the target probe loaded; every target call goes to tmp_path/targets.jsonl."""
    (tmp_path / "tk_target_probe.py").write_text(TARGET_PROBE)
    path = os.pathsep.join(filter(None, [str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "TK_TARGET_LOG": str(tmp_path / "targets.jsonl"), **(env or {})}
    env.pop("CI", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tk_target_probe", "-q",
                           "--pyargs", "tkverify.suite", "--tk-cases", str(tmp_path / "saved"), *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def targets_logged(tmp_path: Path) -> list[tuple[str, float]]:
    log = tmp_path / "targets.jsonl"
    return [tuple(json.loads(line)) for line in log.read_text().splitlines()] if log.exists() else []


def comparison(output: str, *, max_ulp: float = 0.0, bound_used: float | None = None, count: int = 4,
               passed: bool = True) -> Comparison:
    return Comparison(output, "fp32", "summation", count, count, max_ulp, 0.0, {"0": count}, passed,
                      bound_used=bound_used)


def test_the_error_of_an_output_is_its_share_of_the_bound_where_measured_else_its_ulps():
    assert output_error(comparison("out", max_ulp=7.0, bound_used=0.25)) == ("out: share of bound", 0.25)
    assert output_error(comparison("idx", max_ulp=3.0)) == ("idx: ULP error", 3.0)


def test_targets_are_finite_one_label_per_output_and_skip_what_is_no_score(monkeypatch):
    seen = []
    monkeypatch.setattr(hypothesis, "target", lambda score, *, label: seen.append((label, score)))
    target_errors([comparison("a", bound_used=0.5), comparison("b", max_ulp=math.inf),
                   comparison("c", max_ulp=math.nan), comparison("d", bound_used=math.inf),
                   Comparison.rejected("e", "fp32", "ulp", "shape (1,) differs from the expected (2,)")])
    assert seen == [("a: share of bound", 0.5), ("b: ULP error", INFINITE_SCORE), ("d: share of bound", INFINITE_SCORE)]


@pytest.mark.parametrize("profile, targeted", [("ci", False), ("fuzz", True), ("worst", True)])
def test_the_search_targets_each_outputs_error_under_fuzz_and_worst_only(tmp_path, profile, targeted):
    run = run_suite(tmp_path, "-k", "test_differential and moe.normalize_weight-torch", "--tk-impl", "torch",
                    "--tk-profile", profile, env={"TKVERIFY_FUZZ_EXAMPLES": "20", "TKVERIFY_WORST_EXAMPLES": "20"})
    assert run.returncode == 0, run.stdout + run.stderr
    logged = targets_logged(tmp_path)
    if not targeted:
        assert logged == []
        return
    outputs = list(registry.get("moe.normalize_weight").outputs)
    per_label = collections.Counter(label for label, _ in logged)
    # One label per output, the same in every judged example, with a finite score.
    assert {label.split(": ")[0] for label in per_label} == set(outputs) and len(per_label) == len(outputs)
    assert len(set(per_label.values())) == 1 and all(math.isfinite(score) for _, score in logged)


def test_the_worst_profile_draws_ten_thousand_examples_unless_told_otherwise(monkeypatch):
    from hypothesis import settings

    from tkverify import profiles

    try:
        monkeypatch.delenv("TKVERIFY_WORST_EXAMPLES", raising=False)
        profiles.register_profiles()
        assert settings.get_profile("worst").max_examples >= 10_000
        monkeypatch.setenv("TKVERIFY_WORST_EXAMPLES", "123")
        profiles.register_profiles()
        assert settings.get_profile("worst").max_examples == 123
    finally:
        monkeypatch.undo()
        profiles.register_profiles()
    assert [p for p in profiles.PROFILES if profiles.targets(p)] == ["fuzz", "worst"]
    assert profiles.targets("fuzz-seeded") and not profiles.targets("ci-seeded")


def test_each_rows_worst_case_replays_to_its_recorded_error(tmp_path, capsys):
    report = tmp_path / "report"
    stale = report / "worst" / "gone-from-an-earlier-run.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    run = run_suite(tmp_path, "-k", "test_differential and (moe.normalize_weight-torch or quant.per_token_cast-torch)",
                    "--tk-impl", "torch", "--tk-profile", "fuzz", "--tk-report", str(report),
                    env={"TKVERIFY_FUZZ_EXAMPLES": "30"})
    assert run.returncode == 0, run.stdout + run.stderr
    assert not stale.exists()  # a report's case files are those of its run
    rows = json.loads((report / "report.json").read_text())["results"]
    assert {r["op"] for r in rows} == {"moe.normalize_weight", "quant.per_token_cast"}
    # quant.per_token_cast writes its data in several formats, a row and a worst case each.
    assert len({r["worst_case"] for r in rows}) == len(rows) > len({(r["op"], r["output"]) for r in rows})
    best_scores: dict[str, float] = {}
    for label, score in targets_logged(tmp_path):
        best_scores[label] = max(best_scores.get(label, -math.inf), score)
    for row in rows:
        path = report / row["worst_case"]
        case, meta = load_case(path)
        recorded = meta["worst"]
        assert (meta["op"], meta["impl"], recorded["output"], recorded["format"], recorded["policy"]) == \
            (row["op"], row["impl"], row["output"], row["format"], row["policy"])
        # The kept example is the row's largest error: what the row folds as its maximum.
        row_error = row["bound_used"] if recorded["label"].endswith("share of bound") else row["max_ulp"]
        assert recorded["error"] == row_error
        assert recorded["error"] <= best_scores[recorded["label"]]  # the search saw it (formats share a label)

        spec = registry.get(row["op"])
        replayed = check_case(spec, spec.impls[row["impl"]], case, case_dir=None, excuse=False)
        assert [output_error(c) for c in replayed if c.output == row["output"]] == \
            [(recorded["label"], recorded["error"])]

        assert cli.main(["replay", str(path)]) == 0
        printed = capsys.readouterr().out
        assert (f"worst case of its report row: {recorded['label']} recorded {recorded['error']!r}, "
                f"replayed {recorded['error']!r}") in printed


def test_a_failing_rows_case_is_copied_into_the_report_and_replays_as_a_failure(tmp_path):
    report = tmp_path / "report"
    run = run_suite(tmp_path, "-k", "test_differential and moe.topk_gate-mine", "--tk-load", "examples.my_kernel",
                    "--tk-impl", "mine", "--tk-profile", "ci", "--tk-report", str(report))
    assert run.returncode == 1, run.stdout + run.stderr
    [row] = json.loads((report / "report.json").read_text())["results"]
    assert row["verdict"] == "fail" and row["failing_case"] == "cases/moe.topk_gate-mine.json"
    copied = report / row["failing_case"]
    saved = tmp_path / "saved" / "moe.topk_gate-mine.json"
    assert copied.read_bytes() == saved.read_bytes()
    assert copied.with_suffix(".npz").read_bytes() == saved.with_suffix(".npz").read_bytes()
    # Its worst case is a failing one too, and its replay says what it was kept for.
    worst = report / row["worst_case"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    replay = subprocess.run([sys.executable, "-m", "tkverify.cli", "replay", "--load", "examples.my_kernel",
                             str(copied), str(worst)], env=env, capture_output=True, text=True, timeout=300)
    assert replay.returncode == 1, replay.stdout + replay.stderr
    assert f"FAIL        {copied}" in replay.stdout and f"FAIL        {worst}" in replay.stdout
    assert "worst case of its report row: indices: " in replay.stdout


def _spec(name: str = "fam.op") -> SimpleNamespace:
    return SimpleNamespace(name=name)


def test_a_collector_keeps_each_rows_largest_error_and_names_its_file(tmp_path):
    collector = Collector()
    impl = SimpleNamespace(name="torch", layouts={})
    cases = [Case({"i": i}, {"x": torch.full((2,), float(i))}) for i in range(4)]
    for case, share in zip(cases, (0.25, 0.75, math.nan, 0.5)):
        collector.record(_spec(), impl, [comparison("out", bound_used=share, max_ulp=1.0)], case)
    collector.save_cases(tmp_path)
    row = collector.rows[("fam.op", "out", "fp32", "torch")]
    assert row.worst_case == "worst/fam.op-torch-out-fp32.json"
    loaded, meta = load_case(tmp_path / row.worst_case)
    assert loaded.params == {"i": 1} and meta["worst"] == {
        "output": "out", "format": "fp32", "policy": "summation", "label": "out: share of bound", "error": 0.75}


def test_a_worst_case_file_with_a_larger_error_from_another_process_stays(tmp_path):
    """Two processes that judged the same row leave the larger error's case at the row's one path, so that
    every shard names the worst of all and the merged row does too."""
    impl = SimpleNamespace(name="torch", layouts={})
    small, large = Collector(), Collector()
    small.record(_spec(), impl, [comparison("out", bound_used=0.1)], Case({"who": "small"}, {}))
    large.record(_spec(), impl, [comparison("out", bound_used=0.9)], Case({"who": "large"}, {}))
    for name, collector in (("gw0", large), ("gw1", small)):
        collector.save_cases(tmp_path)
        collector.write_shard(tmp_path / "shards" / f"{name}.json", worker=name)
    [row] = merge_shards(sorted((tmp_path / "shards").glob("*.json")))
    case, meta = load_case(tmp_path / row.worst_case)
    assert case.params == {"who": "large"} and meta["worst"]["error"] == 0.9 == row.bound_used


def test_verification_errors_are_found_inside_hypothesis_exception_groups(tmp_path):
    one, two = VerificationError("a"), VerificationError("b")
    group = ExceptionGroup("Hypothesis found 2 distinct failures.", [one, ValueError("x"), ExceptionGroup("g", [two])])
    assert verification_errors(group) == [one, two]
    assert verification_errors(one) == [one] and verification_errors(KeyError("k")) == []
    # A failure the collector is told of names its rows' copy of the case file.
    path = save_case(tmp_path / "saved" / "fam.op-torch", Case({}, {"x": torch.ones(1)}), op="fam.op", impl="torch")
    collector = Collector()
    failed = comparison("out", bound_used=2.0, passed=False)
    collector.record(_spec(), SimpleNamespace(name="torch", layouts={}), [failed, comparison("ok")], Case({}, {}))
    collector.add_failing_case("fam.op", "torch", VerificationError("fails", [failed], path))
    collector.save_cases(tmp_path / "report")
    assert collector.rows[("fam.op", "out", "fp32", "torch")].failing_case == "cases/fam.op-torch.json"
    assert collector.rows[("fam.op", "ok", "fp32", "torch")].failing_case is None
    assert (tmp_path / "report" / "cases" / "fam.op-torch.npz").is_file()
