"""Accuracy claims per implementation (tkverify.claims): the claims file, `tkverify claims --update/--check`,
and the plugin failing a run whose row stays inside the contract but goes beyond its implementation's claim.

The toy op (tests/claims_toy.py, loaded with --tk-load) doubles fp32 values; its implementation "toy"
rounds exactly or, with TOY_SLOPPY=1, one ULP off, which its 2-ULP contract still allows.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tkverify import claims
from tkverify.claims import Claim
from tkverify.report.rows import ResultRow

TESTS = Path(__file__).parent


def _row(max_ulp=0.0, bound_used=None, exact=10, count=10, verdict="pass", impl="toy", op="toy.double"):
    return ResultRow(op, "y", "fp32", impl, "ulp", cases=1, count=count, exact_count=exact, max_ulp=max_ulp,
                     bound_used=bound_used, verdict=verdict)


@pytest.mark.parametrize("x, up", [(0.0, 0.0), (0.5, 0.5), (1329.36767578125, 1330.0), (0.123456, 0.124),
                                   (1e-7, 1e-7), (1.0000001, 1.01), (float("inf"), float("inf"))])
def test_round_up_to_three_significant_digits(x, up):
    assert claims.round_up(x) == up and claims.round_up(x) >= x


def test_the_claims_file_round_trips_sorted_and_diff_friendly():
    table = {("b.op", "y", "fp32"): Claim(1.5, False, 0.25), ("a.op", "out.x", "e4m3"): Claim(0.0, True),
             ("a.op", "z", "bf16"): Claim(float("inf"), False)}
    text = claims.dumps("toy", table)
    assert claims.loads(text) == table
    assert claims.dumps("toy", claims.loads(text)) == text
    keys = [line for line in text.splitlines() if line.startswith("[")]
    assert keys == sorted(keys) and keys[0] == '["a.op"."out.x"."e4m3"]'


def test_update_never_lowers_a_claim_unless_tightened():
    old = {("op", "y", "fp32"): Claim(2.0, False, 0.5)}
    seen = {("op", "y", "fp32"): Claim(1.0, True, 0.75), ("new", "y", "fp32"): Claim(0.0, True)}
    assert claims.update(old, seen) == {("op", "y", "fp32"): Claim(2.0, False, 0.75),
                                        ("new", "y", "fp32"): Claim(0.0, True)}
    assert claims.update(old, seen, tighten=True) == seen
    assert claims.changes(old, claims.update(old, seen))[0].startswith("+ new:y:fp32")


def test_only_passing_rows_make_claims():
    rows = [_row(max_ulp=0.7, bound_used=0.35, exact=9), _row(max_ulp=9.0, verdict="fail", op="toy.bad")]
    assert claims.observed_claims(rows, "toy") == {("toy.double", "y", "fp32"): Claim(0.7, False, 0.5)}


@pytest.mark.parametrize("observed, claimed", [(0.0, 0.0), (0.5, 0.5), (0.5000076, 0.501), (1.0, 1.0),
                                               (1.01, 2.0), (5.77, 8.0), (950.0, 1024.0), (float("inf"), float("inf"))])
def test_claims_are_tight_up_to_one_ulp_and_a_power_of_two_beyond(observed, claimed):
    """A correctly rounded row claims what it showed, so any worse rounding fails; an error-analysis row, whose
    sampled maximum moves from draw to draw, claims the next power of two."""
    assert claims.claimed_ulp(observed) == claimed


def test_a_release_names_a_librarys_claims_file():
    assert claims.file_name("tile_kernels", {"versions": {"tile-kernels": "2.1.0"}}) == "tile_kernels-2.1.0.toml"
    assert claims.file_name("torch", {"versions": {"torch": "2.13"}}) == "torch.toml"
    # eager torch rounds differently on a GPU: its claims there are a file of their own
    assert claims.file_name("torch", {"versions": {}, "capability": "sm_90"}) == "torch-cuda.toml"
    assert claims.file_name("tilelang", {"versions": {}, "capability": "sm_90"}) == "tilelang.toml"


def test_judge_marks_rows_beyond_claim_within_claim_and_unclaimed(tmp_path):
    (tmp_path / "toy.toml").write_text(claims.dumps("toy", {
        ("toy.double", "y", "fp32"): Claim(0.5, True), ("toy.half", "y", "fp32"): Claim(1.0, False, 0.5)}))
    worse, within, bitwise_lost, unclaimed = (
        _row(max_ulp=1.0, op="toy.half", bound_used=0.75, exact=5), _row(max_ulp=0.5, op="toy.half", exact=5),
        _row(max_ulp=0.5, exact=9), _row(op="toy.new"))
    meta = {"versions": {}}
    assert claims.judge([worse, within, bitwise_lost, unclaimed], meta, tmp_path) == [worse, bitwise_lost]
    assert "bound used 0.75 > claimed 0.5" in claims.exceeded_text(worse)
    assert "not bitwise" in claims.exceeded_text(bitwise_lost)
    assert not within.claim_exceeded and within.claim["max_ulp"] == 1.0
    assert unclaimed.claim is None and not unclaimed.claim_exceeded
    assert meta["claims"] == {"toy": str(tmp_path / "toy.toml")}


def test_a_row_failing_its_contract_is_not_also_held_to_its_claim(tmp_path):
    """A contract failure is reported (or excused as a known discrepancy) on its own; the claims hold the
    passing rows to what they showed, so a known discrepancy does not fail the run a second time."""
    (tmp_path / "toy.toml").write_text(claims.dumps("toy", {("toy.double", "y", "fp32"): Claim(0.5, True)}))
    failing = _row(max_ulp=float("inf"), exact=9, verdict="fail")
    assert claims.judge([failing], {"versions": {}}, tmp_path) == []
    assert not failing.claim_exceeded and failing.claim["bitwise"]


def test_draws_the_claims_were_not_measured_on_list_rows_beyond_claim_without_failing_them(tmp_path):
    """Under a seed, dev, fuzz or worst the draws differ from the ci draws the claims came from: a row beyond
    its claim is listed for review in the meta, not failed."""
    (tmp_path / "toy.toml").write_text(claims.dumps("toy", {("toy.double", "y", "fp32"): Claim(0.5, True)}))
    lost = _row(max_ulp=0.5, exact=9)
    meta = {"versions": {}}
    assert claims.judge([lost], meta, tmp_path, enforce=False) == [lost]
    assert not lost.claim_exceeded and lost.claim["bitwise"]
    assert meta["claims_enforced"] is False and meta["claims_beyond"] == [
        f"toy.double:y fp32 [toy]: {claims.exceeded_text(lost)}"]


def _report(path: Path, rows: list[ResultRow], versions=None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    doc = {"meta": {"versions": versions or {}, "commit": "x", "profile": "ci", "impl": "toy"},
           "results": [r.to_json() for r in rows]}
    (path / "report.json").write_text(json.dumps(doc))
    return path


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tkverify.cli", "claims", *args], capture_output=True, text=True,
                          timeout=300)


def test_cli_update_then_check(tmp_path):
    out = tmp_path / "claims"
    first = _report(tmp_path / "r1", [_row(max_ulp=0.5, exact=9)])
    done = _cli("--update", str(first), "--claims", str(out))
    assert done.returncode == 0, done.stderr
    assert "+ toy.double:y:fp32: max ULP 0.5" in done.stdout
    assert claims.read(out / "toy.toml") == {("toy.double", "y", "fp32"): Claim(0.5, False)}
    assert _cli("--check", str(first), "--claims", str(out)).returncode == 0

    worse = _report(tmp_path / "r2", [_row(max_ulp=1.0, exact=9), _row(op="toy.new")])
    check = _cli("--check", str(worse), "--claims", str(out))
    assert check.returncode == 1 and "EXCEEDED toy.double:y" in check.stdout and "unclaimed toy.new" in check.stdout
    assert claims.read(out / "toy.toml") == {("toy.double", "y", "fp32"): Claim(0.5, False)}  # check writes nothing

    better = _report(tmp_path / "r3", [_row(max_ulp=0.0)])
    assert _cli("--update", str(better), "--claims", str(out)).returncode == 0
    assert claims.read(out / "toy.toml")[("toy.double", "y", "fp32")] == Claim(0.5, False)  # not lowered
    assert _cli("--update", str(better), "--claims", str(out), "--tighten").returncode == 0
    assert claims.read(out / "toy.toml")[("toy.double", "y", "fp32")] == Claim(0.0, True)
    assert _cli("--check", str(tmp_path / "nothing"), "--claims", str(out)).returncode == 2


def _suite(tmp_path: Path, claims_dir: Path, sloppy: bool) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
           "TOY_SLOPPY": "1" if sloppy else "0"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "tkverify.suite", "-p", "no:cacheprovider", "--tk-load",
         "claims_toy", "--tk-impl", "toy", "--tk-profile", "ci", f"--tk-claims={claims_dir}",
         f"--tk-report={tmp_path / 'report'}", "-k", "toy.double", "-q"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def test_a_kernel_inside_the_contract_but_beyond_its_claim_fails_the_run(tmp_path):
    claims_dir = tmp_path / "claims"
    claims_dir.mkdir()
    # Unclaimed: the run passes and lists the rows as unclaimed.
    unclaimed = _suite(tmp_path, claims_dir, sloppy=False)
    assert unclaimed.returncode == 0, unclaimed.stdout + unclaimed.stderr
    assert "rows unclaimed" in unclaimed.stdout
    assert "unclaimed" in (tmp_path / "report" / "report.md").read_text()

    # The claims of the exact kernel; the same kernel is within them.
    assert _cli("--update", str(tmp_path / "report"), "--claims", str(claims_dir)).returncode == 0
    assert claims.read(claims_dir / "toy.toml")[("toy.double", "y", "fp32")].bitwise
    within = _suite(tmp_path, claims_dir, sloppy=False)
    assert within.returncode == 0, within.stdout + within.stderr

    # One ULP worse: the contract (2 ULP) holds, every test passes, and the run fails on the claim.
    worse = _suite(tmp_path, claims_dir, sloppy=True)
    out = worse.stdout + worse.stderr
    assert worse.returncode == 1, out
    assert " passed" in worse.stdout and " failed" not in worse.stdout, out
    assert "beyond their accuracy claims" in out and "toy.double:y fp32 [toy]" in out, out
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    row = next(r for r in report["results"] if r["op"] == "toy.double")
    assert row["verdict"] == "pass" and row["claim_exceeded"] and row["claim"]["bitwise"]
    md = (tmp_path / "report" / "report.md").read_text()
    assert md.startswith("# tkverify report\n\n**FAIL**") and "beyond its accuracy claim" in md
