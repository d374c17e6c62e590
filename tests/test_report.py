"""Report rows, shard merging and the written files."""

import json
import os
import random
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tkverify.policies import Comparison
from tkverify.report import Collector, merge_shards, meta, write_report


def comparison(rng: random.Random, fmt: str) -> Comparison:
    n = rng.randint(1, 50)
    exact = rng.randint(0, n)
    return Comparison(output="y", fmt=fmt, policy="ulp", count=n, exact=exact, max_ulp=rng.random() * 2,
                      sum_ulp=rng.random() * n, hist={"0": exact, "1": n - exact}, passed=rng.random() > 0.1)


def test_merged_shards_equal_one_collector(tmp_path):
    rng = random.Random(1)
    verdicts = [(rng.choice(["a.x", "b.y"]), rng.choice(["torch", "tilelang"]), comparison(rng, rng.choice(["bf16", "e4m3"])))
                for _ in range(200)]
    whole, shards = Collector(), [Collector() for _ in range(3)]
    for i, (op, impl, c) in enumerate(verdicts):
        whole.add(op, impl, c)
        shards[i % 3].add(op, impl, c)
    for i, s in enumerate(shards):
        s.write_shard(tmp_path / f"gw{i}.json", worker=f"gw{i}", gpu=None, pid=0)
    merged = merge_shards(tmp_path.glob("*.json"))
    assert len(merged) == len(whole.rows)
    for row in merged:
        ref = whole.rows[row.key]
        for field in ("cases", "count", "exact_count", "failures", "hist", "verdict"):
            assert getattr(row, field) == getattr(ref, field), field
        for field in ("max_ulp", "sum_ulp", "exact", "mean_ulp"):
            assert getattr(row, field) == pytest.approx(getattr(ref, field)), field


def test_every_table_merges_from_shards_as_one_collector_folds_it(tmp_path):
    """Verdicts of all four tables, split over three collectors, written as shards and merged, give
    the rows one collector folds (the values are multiples of 1/8, so that sums do not depend on the
    order; a process's first call is its own, so `first_impl_s` is left out)."""
    from tkverify.report import merge_gradient_shards, merge_speed_shards, merge_unsupported_shards

    rng = random.Random(3)
    whole, shards = Collector(), [Collector() for _ in range(3)]
    for i in range(150):
        op, impl = rng.choice(["a.x", "b.y"]), rng.choice(["torch", "lib"])
        n = rng.randint(1, 8)
        verdict = Comparison("y", rng.choice(["bf16", "e4m3"]), "ulp", n, rng.randint(0, n), i / 8, rng.randint(0, 64) / 8,
                             {"0": n}, rng.random() > 0.2, worst={"index": [0], "ulp": i / 8},
                             extra={"max_bound_used": rng.randint(0, 8) / 8})
        check = SimpleNamespace(op=op, input="x", impl=impl, check=rng.choice(["vs_oracle", "consistency"]), unit="ULP",
                                policy="ulp", count=n, exact=rng.randint(0, n), error=i / 16, sum_error=i / 8,
                                bound=rng.choice([None, i / 4]), passed=rng.random() > 0.2, message="", worst=None)
        timings = {"transfer": 0.125, "impl": rng.randint(1, 8) / 8, "oracle": 0.25, "judge": 0.5}
        reason = rng.choice(["odd lengths", "no fp64", "known discrepancy T1: wrong"])
        for c in (whole, shards[i % 3]):
            c.add(op, impl, verdict, f"case {i}")
            c.add_gradient(check, f"case {i}")
            c.add_timings(op, impl, timings)
            c.add_wall(op, impl, 1.5)
            c.add_unsupported(op, impl, reason, 0.5)
    for i, s in enumerate(shards):
        s.write_shard(tmp_path / f"gw{i}.json", worker=f"gw{i}", gpu=None, pid=i)
    paths = list(tmp_path.glob("*.json"))
    for table, merged in (("rows", merge_shards(paths)), ("gradients", merge_gradient_shards(paths)),
                          ("speed", merge_speed_shards(paths)), ("unsupported", merge_unsupported_shards(paths))):
        folded = getattr(whole, table)
        assert [r.key for r in merged] == sorted(folded), table
        for row in merged:
            got, want = row.to_json(), folded[row.key].to_json()
            got.pop("first_impl_s", None), want.pop("first_impl_s", None)
            assert got == want and list(got) == list(want), (table, row.key)


def test_a_report_round_trips_through_its_json(tmp_path):
    """report.json read back (`Report.from_json`) is the report that was written, and renders the same
    markdown; a row written before a field existed reads with that field's default."""
    from tkverify.report import Report, SpeedRow, render_markdown

    col = Collector()
    rng = random.Random(4)
    for _ in range(20):
        col.add("quant.cast", "torch", comparison(rng, "e4m3"))
        col.add_timings("quant.cast", "torch", {"impl": 0.5})
        col.add_unsupported("quant.cast", "torch", "no fp64", 0.25)
    col.add_wall("quant.cast", "torch", 4.0)
    report = Report(meta("ci", "torch"), list(col.rows.values()), [], list(col.speed.values()),
                    list(col.unsupported.values()))
    paths = write_report(tmp_path, report.results, report.meta, speed=report.speed, unsupported=report.unsupported)
    again = Report.from_json(json.loads(paths["json"].read_text()))
    assert again == report and again.to_json() == json.loads(paths["json"].read_text())
    assert render_markdown(again) == paths["md"].read_text()
    old = SpeedRow.from_json({"op": "fam.op", "impl": "lib", "examples": 2, "wall_s": 3.0})
    assert old.refused_s == 0.0 and old.to_json()["refused_s"] == 0.0


def test_written_report_has_the_promised_fields(tmp_path):
    col = Collector()
    rng = random.Random(2)
    for _ in range(20):
        col.add("moe.topk_gate", "torch", comparison(rng, "int64"))
        col.add("quant.cast", "torch", comparison(rng, "e4m3"))
    paths = write_report(tmp_path, list(col.rows.values()), meta("ci", "torch"))
    doc = json.loads(paths["json"].read_text())
    for key in ("versions", "device", "commit", "date", "profile"):
        assert key in doc["meta"]
    for row in doc["results"]:
        for key in ("op", "output", "format", "impl", "count", "exact", "max_ulp", "mean_ulp", "hist", "verdict"):
            assert key in row
        assert row["verdict"] in ("pass", "fail")
    md = paths["md"].read_text()
    assert "### e4m3" in md and "### int64" in md and "| moe.topk_gate:y | " in md
    assert "<svg" in paths["html"].read_text()


def test_speed_shards_sum_and_the_first_call_is_kept_apart(tmp_path):
    from tkverify.report import merge_speed_shards, speed_markdown

    timings = {"transfer": 0.01, "impl": 0.02, "oracle": 0.03, "judge": 0.04}
    workers = []
    for w, (first, examples) in enumerate(((5.0, 3), (0.5, 2))):
        c = Collector()
        c.add_timings("fam.op", "torch", {**timings, "impl": first})  # compile or cache load
        for _ in range(examples - 1):
            c.add_timings("fam.op", "torch", timings)
        c.add_wall("fam.op", "torch", 10.0)
        c.write_shard(tmp_path / f"gw{w}.json")
        workers.append(c)
    (row,) = merge_speed_shards(tmp_path.glob("*.json"))
    assert row.examples == 5 and row.wall_s == 20.0
    assert row.first_impl_s == pytest.approx(5.5)
    assert row.impl_s == pytest.approx(5.5 + 3 * 0.02)
    assert row.judge_s == pytest.approx(5 * 0.04)
    text = "\n".join(speed_markdown([row]))
    assert "| fam.op | torch | 5 | 20.00 | 0.2 |" in text


def test_refused_examples_count_as_their_own_phase_and_backward_refusals_stay_out(tmp_path):
    from tkverify.report import merge_speed_shards, speed_markdown

    c = Collector()
    c.add_timings("fam.op", "lib", {"transfer": 0.0, "impl": 1.0, "oracle": 0.0, "judge": 0.0})
    c.add_unsupported("fam.op", "lib", "no odd sizes", 6.0)  # e.g. a JIT compile before the refusal
    c.add_unsupported("fam.op (backward)", "lib", "no backward here", 2.0)
    c.add_wall("fam.op", "lib", 8.0)
    c.write_shard(tmp_path / "gw0.json")
    rows = {r.op: r for r in merge_speed_shards(tmp_path.glob("*.json"))}
    assert rows["fam.op"].refused_s == pytest.approx(6.0)
    text = "\n".join(speed_markdown(list(rows.values())))
    assert "| fam.op | lib | 1 | 8.00 | 0.1 | 1.00 | 0% | 12% | 0% | 0% | 75% | 12% |" in text
    assert "backward" not in text


def test_speed_shards_from_before_the_refused_phase_still_merge(tmp_path):
    import json

    from tkverify.report import merge_speed_shards

    old = {"op": "fam.op", "impl": "lib", "examples": 2, "wall_s": 3.0, "first_impl_s": 1.0,
           "transfer_s": 0.0, "impl_s": 1.5, "oracle_s": 0.1, "judge_s": 0.1}
    (tmp_path / "gw0.json").write_text(json.dumps({"speed": [old]}))
    (row,) = merge_speed_shards(tmp_path.glob("*.json"))
    assert row.refused_s == 0 and row.impl_s == 1.5


def test_shard_summary_checks_that_the_merge_is_the_union(tmp_path):
    from tkverify.report import shard_summary

    for w in range(3):
        c = Collector()
        c.add("fam.op", "torch", Comparison("out", "fp32", "ulp", 10, 9, 0.5 * w, 0.5, {"0": 9, "1": 1}, True))
        c.add_timings("fam.op", "torch", {"impl": 0.1})
        c.write_shard(tmp_path / "shards" / f"gw{w}.json", worker=f"gw{w}", gpu=0, pid=100 + w)
    write_report(tmp_path, merge_shards((tmp_path / "shards").glob("*.json")), meta("ci", "torch"))
    workers, union_equal = shard_summary(tmp_path)
    assert union_equal and [w["worker"] for w in workers] == ["gw0", "gw1", "gw2"]
    assert [w["examples"] for w in workers] == [1, 1, 1]
    doc = json.loads((tmp_path / "report.json").read_text())
    doc["results"][0].update(claim={"max_ulp": 0.5, "bitwise": False}, claim_exceeded=True)  # set after the merge
    (tmp_path / "report.json").write_text(json.dumps(doc))
    assert shard_summary(tmp_path)[1]
    doc["results"][0]["count"] -= 1  # a merge that lost an element
    (tmp_path / "report.json").write_text(json.dumps(doc))
    assert not shard_summary(tmp_path)[1]


def test_op_specific_figures_are_rendered_with_their_meaning(tmp_path):
    c = Collector()
    comparison = Comparison("out", "fp32", "within", 16, 16, 2.0, 3.0, {"0": 16}, True,
                            extra={"max_sum_deviation": 0.25, "oracle_max_sum_deviation": 0.125})
    c.add("mhc.sinkhorn", "tilelang", comparison)
    paths = write_report(tmp_path, list(c.rows.values()), meta("ci", "tilelang"))
    text = paths["md"].read_text()
    assert "## Op-specific figures" in text and "largest |row or column sum - 1|" in text
    assert "| mhc.sinkhorn | out | fp32 | tilelang | 0.25 | 0.125 |" in text


def test_a_run_cut_short_leaves_shards_that_merge_into_a_partial_report(tmp_path):
    """Workers rewrite their shard as they go; a run killed before its end (a time cap) still
    leaves what it judged, and `tkverify shards --merge` makes the report of it."""
    (tmp_path / "test_killed.py").write_text(
        "import os, signal\n\ndef test_killed():\n    os.kill(os.getpid(), signal.SIGKILL)\n")
    report = tmp_path / "report"
    env = {**os.environ, "TKVERIFY_SHARD_EVERY_S": "0"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--pyargs", "tkverify.suite",
                          str(tmp_path / "test_killed.py"), "-k", "moe.group_count-torch or killed",
                          "--tk-impl", "torch", "--tk-profile", "ci", "--tk-report", str(report)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == -signal.SIGKILL, run.stdout + run.stderr
    shard = json.loads((report / "shards" / "main.json").read_text())
    assert shard["complete"] is False and [r["op"] for r in shard["rows"]] == ["moe.group_count"]
    assert not (report / "report.json").exists()

    shards = [sys.executable, "-m", "tkverify.cli", "shards", str(report)]
    refused = subprocess.run(shards, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 1 and "did not finish" in refused.stderr
    merged = subprocess.run([*shards, "--merge"], capture_output=True, text=True, timeout=300)
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert "report.json rows equal the union of 1 shards" in merged.stdout
    md = (report / "report.md").read_text()
    assert "- **partial**: merged from the shards of a run that did not finish: main (written while running)" in md
    assert "| moe.group_count | counts | int32 | torch |" in md


def test_shards_of_finished_runs_put_together_merge_into_a_report_that_is_not_partial(tmp_path):
    """Several processes of one hunt (a hunt split over seeds, one process a seed) each finish and
    leave final shards; their union is a whole report, and calling it partial would be a false alarm.
    One shard written while running still makes it partial."""
    from tkverify.report import merge_partial_run

    report = tmp_path / "seeds"
    for seed in (1, 2):
        c = Collector()
        c.add("fam.op", "torch", Comparison("out", "fp32", "ulp", 10, 9, 0.5, 0.5, {"0": 9, "1": 1}, True))
        c.write_shard(report / "shards" / f"seed-{seed}-gw0.json", worker="gw0", gpu=0, pid=seed, complete=True)
    doc = json.loads(merge_partial_run(report)["json"].read_text())
    assert "partial" not in doc["meta"] and doc["meta"]["merged"].endswith("seed-1-gw0, seed-2-gw0")
    assert "**partial**" not in (report / "report.md").read_text()

    c.write_shard(report / "shards" / "seed-3-gw0.json", worker="gw0", gpu=0, pid=3, complete=False)
    doc = json.loads(merge_partial_run(report)["json"].read_text())
    assert "merged" not in doc["meta"] and "seed-3-gw0 (written while running)" in doc["meta"]["partial"]


# -- a report that leads with the verdict, each row judged by its bound ------------------------------


def _folded(op: str, impl: str, comparison: Comparison, case: str = ""):
    """The report row of one comparison, folded as a collector folds it."""
    c = Collector()
    c.add(op, impl, comparison, case)
    return next(iter(c.rows.values()))


def _judged_rows():
    """Rows of real comparisons: bitwise (exact), codes (1 code off, allowed 1), relative (half its bound),
    within (3/4 of it), and a summation row 2^23 ULPs from the exact sum that passes, and one that fails."""
    import numpy as np
    import torch

    from tkverify.policies import Bracket, ErrorBound, bitwise, codes, relative, summation, within

    x = np.array([1.0, 2.0])
    cancelled = ErrorBound(np.array([2.0**-30]), np.array([2.0**-4]), "fp32")  # a sum whose terms cancel
    return {
        "bitwise": _folded("t.copy", "torch", bitwise().compare("out", torch.tensor(x, dtype=torch.float32), x)),
        "codes": _folded("q.cast", "lib", codes("e4m3", 1).compare(
            "q", torch.tensor([1.125, 2.0]).to(torch.float8_e4m3fn), x)),
        "relative": _folded("m.mix", "torch", relative(1e-3).compare("w", torch.tensor([1000.5]), np.array([1000.0]))),
        "within": _folded("m.pre", "lib", within("fp32").compare("comb", torch.tensor([1.75, 2.0]),
                                                                  Bracket(x, x - 1, x + 1))),
        "summation": _folded("m.reduce", "torch", summation().compare("out", torch.tensor([0.0]), cancelled)),
        "failing": _folded("m.reduce", "lib", summation().compare("out", torch.tensor([1.0]), cancelled), "case 3"),
    }


def test_each_row_states_its_bound_and_the_fraction_used_with_ulps_only_where_the_bound_is_in_ulps():
    from tkverify.report.bounds import bound_class, bound_text, fraction_text, in_ulps
    from tkverify.report.render import error_cell

    rows = _judged_rows()
    assert {k: bound_text(r) for k, r in rows.items()} == {
        "bitwise": "bitwise", "codes": "≤ 1 code", "relative": "relative ≤ 0.001",
        "within": "within the fp32 error analysis", "summation": "within the fp32 summation error bound",
        "failing": "within the fp32 summation error bound"}
    assert {k for k, r in rows.items() if in_ulps(r)} == {"bitwise", "codes"}
    assert {k: fraction_text(r.bound_used) for k, r in rows.items()} == {
        "bitwise": "0", "codes": "1", "relative": "0.5", "within": "0.75", "summation": "1.49e-08", "failing": "16"}
    # The summation row is 2^23 ULPs from the exact sum and passes: its cell is the fraction, not the ULPs.
    assert rows["summation"].max_ulp == 2.0**23 and error_cell(rows["summation"]) == "1.49e-08 of bound"
    assert error_cell(rows["codes"]) == "1" and error_cell(rows["failing"]) == "16 of bound FAIL"
    assert {k: bound_class(r) for k, r in rows.items()} == {
        "bitwise": "exact", "codes": "near", "relative": "inside", "within": "near", "summation": "inside",
        "failing": "over"}
    rows["bitwise"].coverage = "exhaustive"
    assert error_cell(rows["bitwise"]) == "0 (exhaustive)"


def test_the_histogram_is_coloured_by_the_bound():
    from tkverify.policies import HIST_LABELS
    from tkverify.report.bounds import bucket_classes

    rows = _judged_rows()
    codes = dict(zip(HIST_LABELS, bucket_classes(rows["codes"], HIST_LABELS)))  # allowed: 1 code
    assert (codes["0"], codes["1"], codes["2"], codes["256+"]) == ("exact", "near", "over", "over")
    assert set(bucket_classes(rows["summation"], HIST_LABELS)[1:]) == {"inside"}  # passing, far in ULPs
    assert set(bucket_classes(rows["failing"], HIST_LABELS)[1:]) == {"over"}


def test_the_markdown_leads_with_the_verdict_then_the_failures_then_the_tables(tmp_path):
    from tkverify.report import Report, UnsupportedRow, render_markdown

    rows = _judged_rows()
    rows["failing"].failing_case, rows["failing"].worst_case = "cases/m.reduce-lib.json", "worst/m.reduce-lib.json"
    known = UnsupportedRow("m.reduce", "lib", 4, {"known discrepancy F1: off by one": 4})
    md = render_markdown(Report(meta("ci", "lib"), list(rows.values()), unsupported=[known]))
    lines = md.splitlines()
    assert lines[2] == ("**FAIL**: 5 of 6 rows pass; 4 cases of 1 (op, implementation) pairs excused as known "
                        "discrepancies (listed below); the 1 failing rows all belong to (op, implementation) pairs "
                        "with known discrepancies")
    order = [md.index(h) for h in ("**FAIL**", "## Failures", "## Per format", "### e4m3", "## All rows",
                                   "## Known discrepancies")]
    assert order == sorted(order)
    assert ("| m.reduce:out | fp32 | lib | summation | within the fp32 summation error bound | 16 | at (0,): actual 1, "
            "expected 9.31322575e-10 in case 3 | [failing case](cases/m.reduce-lib.json) "
            "[worst case](worst/m.reduce-lib.json) |") in lines
    assert "| m.reduce:out | 16 of bound FAIL | 1.49e-08 of bound |" in lines
    # ULP figures only where the bound is in ULPs.
    assert ("| m.reduce | out | fp32 | torch | sampled | summation | within the fp32 summation error bound | 1.49e-08 "
            "| 1 | 1 | 0% | - | - |") in md
    assert "| q.cast | q | e4m3 | lib | sampled | codes | ≤ 1 code | 1 | 1 | 2 | 50% | 1 | 0.5 |" in md
    passing = render_markdown(Report(meta("ci", "lib"), [rows["bitwise"]]))
    assert passing.splitlines()[2] == "**PASS**: 1 of 1 rows pass" and "## Failures" not in passing


def test_the_page_leads_with_the_verdict_and_colours_cells_by_the_bound():
    from tkverify.report import Report, render_html

    rows = _judged_rows()
    page = render_html(Report(meta("ci", "lib"), list(rows.values())))
    assert page.index("<header id='verdict' class='fail'>") < page.index("<section id='failures'>") \
        < page.index("<section id='formats'>") < page.index("<section id='rows'>")
    assert "<td class='over'>16 of bound FAIL</td>" in page and "<td class='inside'>0.5 of bound</td>" in page
    assert "<td class='exact'>0</td>" in page and "<td class='near'>1</td>" in page
    assert "<header id='verdict' class='pass'>" in render_html(Report(meta("ci", "lib"), [rows["bitwise"]]))
