"""A broken implementation registered like a user's kernel must fail the suite, name the
element, and leave a case file whose replay reproduces the failure."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("op, impl", [("moe.topk_gate", "ties_high"), ("transpose.transpose", "drop_tail")])
def test_broken_impl_fails_and_replays(tmp_path, op, impl):
    cases = tmp_path / "cases"
    suite = run("-m", "pytest", "--pyargs", "tkverify.suite", "-p", "no:cacheprovider", "--tk-load", "broken",
                "--tk-impl", impl, "--tk-profile", "ci", "--tk-cases", str(cases),
                "--tk-report", str(tmp_path / "report"), "-k", op, "-q", cwd=tmp_path)
    out = suite.stdout + suite.stderr
    assert suite.returncode == 1, out
    assert "worst at index" in out and "actual" in out and "expected" in out, out
    assert "tkverify replay" in out, out

    saved = sorted(cases.glob("*.json"))
    assert [p.name for p in saved] == [f"{op}-{impl}.json"]
    assert json.loads(saved[0].read_text())["impl"] == impl

    replay = run("-m", "tkverify.cli", "replay", str(saved[0]), "--load", "broken", cwd=tmp_path)
    assert replay.returncode == 1, replay.stdout + replay.stderr
    assert "FAIL" in replay.stdout and "worst at index" in replay.stdout

    # The same case passes against the correct implementation: the failure is the impl's, not the case's.
    fixed = run("-m", "tkverify.cli", "replay", str(saved[0]), "--load", "broken", "--impl", "torch", cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "PASS" in fixed.stdout

    report = json.loads((tmp_path / "report" / "report.json").read_text())
    rows = [r for r in report["results"] if r["impl"] == impl]
    assert rows and all(r["op"] == op for r in rows)
    assert any(r["verdict"] == "fail" for r in rows)
