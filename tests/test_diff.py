"""`tkverify diff`: two reports or two benches, written here through the report and bench APIs, compared."""

import json

import pytest

from tkverify import bench, cli, diff
from tkverify.report import GradientRow, ResultRow, UnsupportedRow, write_report

META = {"date": "2026-12-01T00:00:00+00:00", "commit": "abc", "profile": "ci", "impl": "all",
        "versions": {"torch": "2.11.0", "tile-kernels": "2.1.0"}, "device": "cpu", "gpus": 0}


def result(op="a.x", impl="tilelang", *, output="y", fmt="bf16", policy="ulp", cases=10, count=1000, exact=1000,
           max_ulp=0.5, failures=0, bound_used=None, extra=None, **fields) -> ResultRow:
    row = ResultRow(op, output, fmt, impl, policy, cases=cases, count=count, exact_count=exact, max_ulp=max_ulp,
                    failures=failures, bound_used=bound_used, extra=dict(extra or {}), **fields)
    row.fold(ResultRow(op, output, fmt, impl, policy))  # derives exact, mean_ulp and verdict from the counts
    return row


def gradient(op="a.x", impl="tilelang", *, check="consistency", unit="rel", error=1e-3, failures=0,
             cases=10) -> GradientRow:
    return GradientRow(op, "x", impl, check, unit, "policy", cases=cases, count=cases, max_error=error,
                       max_bound=1e-2, failures=failures, verdict="fail" if failures else "pass")


def write(tmp_path, name, rows, gradients=(), unsupported=(), meta=None):
    out = tmp_path / name
    write_report(out, list(rows), dict(META, **(meta or {})), gradients=list(gradients),
                 unsupported=list(unsupported))
    return out / "report.json"


def categories(d: diff.Diff) -> dict[tuple, str]:
    return {tuple(c.key.values()): c.category for c in d.changes}


def test_every_category_of_result_rows(tmp_path):
    old = write(tmp_path, "old", [
        result("flip"), result("worse_ulp", max_ulp=0.5), result("better_exact", exact=900), result("gone"),
        result("same"), result("policy", policy="ulp"), result("fixed", failures=1, max_ulp=float("inf"))])
    new = write(tmp_path, "new", [
        result("flip", failures=1, max_ulp=3.0), result("worse_ulp", max_ulp=0.75), result("better_exact", exact=1000),
        result("same"), result("policy", policy="within"), result("fixed"), result("fresh")],
        unsupported=[UnsupportedRow("gone", "tilelang", 7, {"mylib has no gone": 7})])
    d = diff.diff_files(old, new)
    got = {key[0]: category for key, category in categories(d).items()}
    assert got == {"flip": "regression", "worse_ulp": "regression", "better_exact": "improvement",
                   "gone": "vanished", "policy": "changed", "fixed": "improvement", "fresh": "new"}
    assert d.unchanged == {"results": 1, "gradients": 0}
    flip = next(c for c in d.changes if c.key["op"] == "flip")
    assert flip.worse[0] == "verdict pass → fail" and "max ULP 0.5 → 3" in flip.worse
    gone = next(c for c in d.changes if c.key["op"] == "gone")
    assert gone.notes == ["NEW refused 7 cases: mylib has no gone (7)"]
    fresh = next(c for c in d.changes if c.key["op"] == "fresh")
    assert fresh.notes == ["OLD did not run fresh [tilelang] (no row, no refused case)"]
    # verdict flips lead the regressions
    assert [c.key["op"] for c in d.changes if c.category == "regression"] == ["flip", "worse_ulp"]
    assert [c.key["op"] for c in d.changes if c.category == "improvement"] == ["fixed", "better_exact"]


def test_a_verdict_flip_is_a_regression_whatever_the_thresholds(tmp_path):
    old = write(tmp_path, "old", [result(max_ulp=0.5)])
    new = write(tmp_path, "new", [result(max_ulp=0.5, failures=1)])
    d = diff.diff_files(old, new, thresholds=diff.Thresholds(share=10.0, ulp=1e9))
    assert [c.category for c in d.changes] == ["regression"]


@pytest.mark.parametrize("field, old, new, category", [
    ("bound_used", 0.50, 0.54, None), ("bound_used", 0.50, 0.56, "regression"),
    ("bound_used", 0.60, 0.50, "improvement"),
    ("exact", 990, 950, None), ("exact", 990, 930, "regression"), ("exact", 900, 990, "improvement"),
    ("max_ulp", 0.5, 1.4, None), ("max_ulp", 0.5, 1.6, "regression"), ("max_ulp", 2.0, 0.5, "improvement"),
])
def test_thresholds(tmp_path, field, old, new, category):
    """share 0.05: a bound fraction 0.05 higher, an exact share 5 points lower; --ulp-threshold 1: a max ULP
    error more than 1 ULP higher."""
    def row(value):
        if field == "exact":
            return result(exact=value)
        if field == "bound_used":  # judged where the bound is not in ULPs
            return result(policy="relative", bound_used=value)
        return result(max_ulp=value)
    d = diff.diff_files(write(tmp_path, "old", [row(old)]), write(tmp_path, "new", [row(new)]),
                        thresholds=diff.Thresholds(share=0.05, ulp=1.0))
    assert [c.category for c in d.changes] == ([category] if category else [])


def test_any_ulp_increase_counts_by_default_but_only_where_the_bound_is_in_ulps(tmp_path):
    """A summation or within row may be any number of ULPs off and pass: its ULPs are shown, not judged."""
    old = write(tmp_path, "old", [result("ulp", max_ulp=0.5), result("sum", policy="summation", max_ulp=3.0,
                                                                      extra={"max_bound_used": 0.9}),
                                  result("within", policy="within", max_ulp=6.7)])
    new = write(tmp_path, "new", [result("ulp", max_ulp=0.5001), result("sum", policy="summation", max_ulp=1e6,
                                                                         extra={"max_bound_used": 0.91}),
                                  result("within", policy="within", max_ulp=26.9)])
    d = diff.diff_files(old, new)
    assert categories(d) == {("ulp", "y", "bf16", "tilelang", "sampled"): "regression"}
    assert d.changes[0].worse == ["max ULP 0.5 → 0.5001"]


def test_rows_of_an_older_report_without_the_newer_fields_take_their_defaults(tmp_path):
    """A report.json written before bound_used, coverage and the case files: its rows still pair, and
    the summation policy's max_bound_used stands in for the bound fraction."""
    new = write(tmp_path, "new", [result("sum", policy="summation", bound_used=0.97)])
    doc = json.loads(new.read_text())
    for row in doc["results"]:
        for field in ("bound_used", "coverage", "worst_case", "failing_case"):
            del row[field]
        row["extra"] = {"max_bound_used": 0.5}
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    (change,) = diff.diff_files(old, new).changes
    assert change.category == "regression" and change.worse == ["bound used 0.5 → 0.97"]


def test_coverage_is_part_of_a_rows_identity(tmp_path):
    old = write(tmp_path, "old", [result()])
    new = write(tmp_path, "new", [result(), result(coverage="exhaustive", max_ulp=0.5)])
    (change,) = diff.diff_files(old, new).changes
    assert change.category == "new" and change.key["coverage"] == "exhaustive"


def test_gradient_rows(tmp_path):
    old = write(tmp_path, "old", [], gradients=[
        gradient("rel_up", error=1.00e-3), gradient("rel_noise", error=1.00e-3),
        gradient("ulp_up", unit="ULP", error=2), gradient("flip"), gradient("gone")])
    new = write(tmp_path, "new", [], gradients=[
        gradient("rel_up", error=1.10e-3), gradient("rel_noise", error=1.04e-3),
        gradient("ulp_up", unit="ULP", error=3), gradient("flip", failures=1)],
        unsupported=[UnsupportedRow("gone (backward)", "tilelang", 3, {"no backward here": 3})])
    d = diff.diff_files(old, new)
    got = {c.key["op"]: c.category for c in d.changes}
    assert got == {"rel_up": "regression", "ulp_up": "regression", "flip": "regression", "gone": "vanished"}
    assert next(c for c in d.changes if c.key["op"] == "gone").notes == ["NEW refused 3 cases: no backward here (3)"]
    assert d.unchanged["gradients"] == 1


def test_impl_mapping_compares_one_implementation_of_old_with_another_of_new(tmp_path):
    report = write(tmp_path, "one", [result("a", "tilelang", max_ulp=0.5), result("a", "tile_kernels", max_ulp=4.0),
                                     result("b", "tilelang"), result("c", "torch", failures=1)])
    d = diff.diff_files(report, report, impls=diff.ImplMap("tilelang", "tile_kernels"))
    assert categories(d) == {("a", "y", "bf16", "tilelang → tile_kernels", "sampled"): "regression",
                             ("b", "y", "bf16", "tilelang → tile_kernels", "sampled"): "vanished"}
    assert "`tilelang` of OLD against `tile_kernels` of NEW" in diff.render_markdown(d)
    with pytest.raises(diff.DiffInputError, match="no rows of implementation 'mylib'"):
        diff.diff_files(report, report, impls=diff.ImplMap("tilelang", "mylib"))


def _bench_doc(rows, unavailable=(), version="2.1.0"):
    doc = {"meta": dict(META, versions={"tile-kernels": version}), "copy_bandwidth_TBps": 4.0,
           "write_bandwidth_TBps": 4.5, "rows": rows, "unavailable": list(unavailable)}
    return bench.derive(doc)


def _bench_row(op, impl, time_us, kernel_us=None, **extra):
    return {"op": op, "shape": "s", "bytes": 4_000_000, "flops": None, "written": None, "target": 0.9,
            "impl": impl, "time_us": time_us, "kernel_us": kernel_us, **extra}


def write_bench(tmp_path, name, doc):
    return bench.write(doc, tmp_path / name)["json"]


def _spread(low, high, graph_low=None, graph_high=None):
    return {"time_p10_us": low, "time_p90_us": high, "kernel_p10_us": graph_low, "kernel_p90_us": graph_high}


def test_bench_rows_are_judged_by_the_eager_p50(tmp_path):
    """The bench judges the eager p50 (``time_us`` in a bench.json of any age): graph times move without a
    verdict; a row of an old bench (no percentiles) pairs with one of a new bench."""
    old = write_bench(tmp_path, "old", _bench_doc([
        _bench_row("slower", "tilelang", 100.0, 90.0), _bench_row("noise", "tilelang", 100.0, 90.0),
        _bench_row("faster_graph", "tilelang", 100.0, 90.0), _bench_row("slower_graph", "tilelang", 100.0, 90.0),
        _bench_row("old_to_new", "tilelang", 100.0, 90.0),
        _bench_row("within_spread", "tilelang", 100.0, 90.0, **_spread(95.0, 112.0, 88.0, 92.0)),
        _bench_row("breaks", "tilelang", 100.0), _bench_row("gone", "tilelang", 100.0)]))
    new = write_bench(tmp_path, "new", _bench_doc([
        _bench_row("slower", "tilelang", 106.0, 90.0), _bench_row("noise", "tilelang", 104.0, 93.0),
        _bench_row("faster_graph", "tilelang", 100.0, 80.0), _bench_row("slower_graph", "tilelang", 100.0, 150.0),
        _bench_row("old_to_new", "tilelang", 112.0, 80.0, **_spread(108.0, 114.0, 79.0, 81.0)),
        _bench_row("within_spread", "tilelang", 108.0, 90.0, **_spread(104.0, 113.0, 88.0, 92.0)),
        _bench_row("breaks", "tilelang", None, error="boom"), _bench_row("fresh", "tilelang", 1.0)],
        unavailable=[{"op": "gone", "shape": "s", "impl": "tilelang", "reason": "no CUDA"}]))
    d = diff.diff_files(old, new)
    got = {c.key["op"]: c.category for c in d.changes}
    assert got == {"slower": "regression", "old_to_new": "regression", "within_spread": "regression",
                   "breaks": "regression", "gone": "vanished", "fresh": "new"}
    assert d.unchanged == {"bench": 3}  # noise, and the two whose graph time alone moved
    changes = {c.key["op"]: c for c in d.changes}
    assert changes["slower"].worse == ["eager p50 100.0 → 106.0 us (+6.0%)"] and changes["slower"].notes == []
    assert changes["old_to_new"].notes == ["graph p50 90.0 → 80.0 us (-11.1%), not judged"]
    assert changes["within_spread"].notes == ["NEW's eager p50 lies within OLD's p10-p90 (95.0-112.0 us)"]
    assert changes["gone"].notes == ["NEW: not run: no CUDA"]
    md = diff.render_markdown(d)
    assert "| slower | s | tilelang | **eager p50 100.0 → 106.0 us (+6.0%)** | 100.0 → 106.0 | - | 90.0 |" in md
    assert "| 100.0 → 112.0 | - → 108.0-114.0 | 90.0 → 80.0 |" in md
    assert "- counts as a change: an eager p50 time that moves by more than 5% of its old value" in md
    # a 10% threshold lets the 6% and 8% slower eager times pass, not the 12% one
    assert {c.key["op"] for c in diff.diff_files(old, new, thresholds=diff.Thresholds(share=0.1)).changes
            if c.category == "regression"} == {"old_to_new", "breaks"}


def test_bench_mapping_compares_two_tile_kernels_columns_of_one_merged_bench(tmp_path):
    merged = bench.merge([_bench_doc([_bench_row("op", "tile_kernels", 50.0), _bench_row("op", "tilelang", 40.0)]),
                          _bench_doc([_bench_row("op", "tile_kernels", 100.0)], version="1.0.0")])
    path = write_bench(tmp_path, "merged", merged)
    d = diff.diff_files(path, path, impls=diff.ImplMap("tile_kernels==1.0.0", "tile_kernels==2.1.0"))
    (change,) = d.changes
    assert change.category == "improvement" and change.key["impl"] == "tile_kernels==1.0.0 → tile_kernels==2.1.0"
    assert change.better == ["eager p50 100.0 → 50.0 us (-50.0%)"]
    # each side names the run that timed its column
    assert d.old.meta["versions"]["tile-kernels"] == "1.0.0" and d.new.meta["versions"]["tile-kernels"] == "2.1.0"
    assert "- what differs: tile-kernels 1.0.0 → 2.1.0" in diff.render_markdown(d)


def test_cli_exit_codes_and_outputs(tmp_path, capsys):
    passing = write(tmp_path, "old", [result()])
    failing = write(tmp_path, "new", [result(failures=1)])
    bench_json = write_bench(tmp_path, "bench", _bench_doc([_bench_row("op", "tilelang", 1.0)]))
    assert cli.main(["diff", str(passing), str(passing)]) == 0
    assert "- verdict: no regression" in capsys.readouterr().out
    md, js = tmp_path / "d" / "diff.md", tmp_path / "d" / "diff.json"
    assert cli.main(["diff", str(passing), str(failing), "--md", str(md), "--json", str(js),
                     "--old-label", "main", "--new-label", "mine"]) == 1
    text = md.read_text()
    assert text.startswith("# tkverify diff of two correctness reports: `main` (abc) → `mine` (abc)")
    assert text.index("## Summary") < text.index("## Regressions (1)") < text.index("| a.x:y | bf16 | tilelang |")
    doc = json.loads(js.read_text())
    assert doc["regressions"] == 1 and doc["summary"]["results"]["regression"] == 1
    assert doc["changes"][0]["worse"][0] == "verdict pass → fail"
    assert "1 regressions" in capsys.readouterr().out
    assert cli.main(["diff", str(failing), str(passing)]) == 0  # an improvement only
    capsys.readouterr()
    assert cli.main(["diff", str(passing), str(bench_json)]) == 2
    assert "cannot compare a report.json" in capsys.readouterr().err
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    assert cli.main(["diff", str(garbage), str(passing)]) == 2
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"rows": []}))
    assert cli.main(["diff", str(other), str(other)]) == 2
    assert cli.main(["diff", str(tmp_path / "missing.json"), str(passing)]) == 2
    assert cli.main(["diff", str(passing), str(passing), "--old-impl", "nope"]) == 2
    assert "no rows of implementation 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["diff", str(passing), str(passing), "--threshold", "-1"])
    assert e.value.code == 2


def test_markdown_points_at_the_failing_case_of_a_regression(tmp_path):
    old = write(tmp_path, "old", [result()])
    new = write(tmp_path, "new", [result(failures=1, failing_case=".tkverify/cases/a.x-tilelang.json",
                                         worst={"index": [3], "actual": "1", "expected": "2", "case": "x=(4,)"})])
    md = diff.render_markdown(diff.diff_files(old, new))
    assert "| where to look in NEW |" in md and "`.tkverify/cases/a.x-tilelang.json` |" in md
    new = write(tmp_path, "new2", [result(failures=1, worst={"index": [3], "actual": "1", "expected": "2",
                                                            "case": "x=(4,)"})])
    assert "at (3,): actual 1, expected 2 (x=(4,)) |" in diff.render_markdown(diff.diff_files(old, new))
