"""Cases an implementation cannot run (`tkverify.Unsupported`): counted and reported as
unsupported with their reasons, never judged, never saved as failing cases; a test whose every
case is refused is skipped.  A toy implementation on the CPU stands in for a library."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import strategies as st

from tkverify import cli, registry
from tkverify.case import Case, save_case
from tkverify.check import UnsupportedCasesWarning, check_case
from tkverify.policies import bitwise
from tkverify.registry import Impl, OpSpec, Unsupported
from tkverify.report import Collector, ResultRow, UnsupportedRow, merge_unsupported_shards, meta, write_report
from tkverify.report.render import _known_note
from tkverify.suite import verify

OP = "toy.negate"


def _oracle(x):
    return -x.double()


def _cases():
    return st.integers(0, 9).map(lambda n: Case(params={}, inputs={"x": torch.arange(n, dtype=torch.float32)}))


def _odd_refused(x):
    if x.numel() % 2:
        raise Unsupported("toylib 0.1 negates even lengths only")
    return -x


def _all_refused(x):
    raise Unsupported("toylib 0.1 has no negate")


@pytest.fixture
def toy():
    spec = registry.register(OpSpec(name=OP, oracle=lambda x: _oracle(x).float(), strategy=_cases,
                                    outputs={"y": bitwise(torch.float32)},
                                    impls={"picky": Impl("picky", _odd_refused, device="cpu"),
                                           "none": Impl("none", _all_refused, device="cpu")}))
    yield spec
    del registry._REGISTRY[OP]


def test_refused_cases_are_counted_not_judged(toy, tmp_path):
    collector = Collector()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        verify(toy, toy.impls["picky"], case_dir=tmp_path, record=collector.record,
               record_unsupported=collector.add_unsupported)
    refused = collector.unsupported[(OP, "picky")].reasons
    assert list(refused) == ["toylib 0.1 negates even lengths only"]
    assert refused["toylib 0.1 negates even lengths only"] > 0
    assert collector.speed[(OP, "picky")].refused_s > 0  # the fuzzing-speed table's own phase
    # The cases that ran were judged (and passed); none of the refused ones left a case file.
    row = collector.rows[(OP, "y", "fp32", "picky")]
    assert row.cases > 0 and row.verdict == "pass"
    assert not list(tmp_path.iterdir())
    warned = [w for w in seen if issubclass(w.category, UnsupportedCasesWarning)]
    assert len(warned) == 1 and "toy.negate[picky] unsupported:" in str(warned[0].message)


def test_a_test_whose_every_case_is_refused_is_skipped(toy, tmp_path):
    collector = Collector()
    with pytest.raises(pytest.skip.Exception, match=r"toy.negate\[none\] unsupported: (\d+) of \1 cases "
                                                   r"\(toylib 0.1 has no negate"):
        verify(toy, toy.impls["none"], case_dir=tmp_path, record=collector.record,
               record_unsupported=collector.add_unsupported)
    assert not collector.rows and not list(tmp_path.iterdir())


def test_check_case_lets_unsupported_through_without_a_case_file(toy, tmp_path):
    case = Case(params={}, inputs={"x": torch.ones(3)})
    with pytest.raises(Unsupported) as info:
        check_case(toy, toy.impls["picky"], case, case_dir=tmp_path)
    assert info.value.reason == "toylib 0.1 negates even lengths only"
    assert not list(tmp_path.iterdir())
    # A real failure still fails (and is saved): Unsupported does not swallow errors.
    broken = Impl("broken", lambda x: x, device="cpu")
    with pytest.raises(AssertionError):
        check_case(toy, broken, Case(params={}, inputs={"x": torch.ones(2)}), case_dir=tmp_path)
    assert list(tmp_path.glob("*.json"))


def test_report_lists_unsupported_cases_per_op_and_impl(tmp_path):
    shards = [Collector(), Collector()]
    shards[0].add_unsupported(OP, "picky", "odd lengths")
    shards[1].add_unsupported(OP, "picky", "odd lengths")
    shards[1].add_unsupported(OP, "picky", "no fp64")
    shards[1].add_unsupported("toy.other", "none", "no op")
    for i, s in enumerate(shards):
        s.write_shard(tmp_path / "shards" / f"gw{i}.json", worker=f"gw{i}", gpu=None, pid=0)
    merged = merge_unsupported_shards((tmp_path / "shards").glob("*.json"))
    assert merged == [
        UnsupportedRow(OP, "picky", 3, {"odd lengths": 2, "no fp64": 1}),
        UnsupportedRow("toy.other", "none", 1, {"no op": 1}),
    ]
    paths = write_report(tmp_path / "out", [], meta("ci", "picky"), unsupported=merged)
    md = paths["md"].read_text()
    assert "- toy.negate [picky] unsupported: 3 cases (odd lengths (2); no fp64 (1))" in md
    assert "toy.other [none] unsupported: 1 cases" in paths["html"].read_text()


def test_replay_says_unsupported(toy, tmp_path, capsys):
    path = save_case(tmp_path / "toy", Case(params={}, inputs={"x": torch.ones(5)}), op=OP, impl="picky")
    assert cli.main(["replay", str(path)]) == cli.UNSUPPORTED_EXIT
    assert "UNSUPPORTED: toylib 0.1 negates even lengths only" in capsys.readouterr().out
    assert cli.main(["replay", str(path), "--impl", "none"]) == cli.UNSUPPORTED_EXIT


def test_an_impl_supplies_its_own_availability():
    reasons = iter(["toylib 0.1 lacks negate", None])
    impl = Impl("toy", _odd_refused, device="cpu", available=lambda: next(reasons))
    assert impl.unavailable_reason() == "toylib 0.1 lacks negate"
    assert impl.unavailable_reason() is None
    # A missing module is reported before the implementation's own check runs.
    missing = Impl("toy", _odd_refused, device="cpu", requires=("no_such_module_xyz",),
                   available=lambda: pytest.fail("must not be asked"))
    assert "no_such_module_xyz" in missing.unavailable_reason()


def test_unsupported_is_not_an_exception_an_implementation_error_handler_catches():
    try:
        try:
            raise Unsupported("why")
        except Exception:  # what check_case and the gradient checks catch
            pytest.fail("Unsupported was caught as an implementation error")
    except Unsupported as e:
        assert str(e) == "why"
    assert np.isfinite(1.0)


_REFUSING_TESTS = textwrap.dedent("""\
    import pytest
    from hypothesis import given, strategies as st

    import tkverify


    def call_the_library():
        raise tkverify.Unsupported("toylib 0.1 has no negate")


    def test_called_directly():
        call_the_library()


    @given(st.integers())
    def test_under_hypothesis(n):
        call_the_library()


    @pytest.fixture
    def library():
        call_the_library()


    def test_in_a_fixture(library):
        pass


    def test_a_failure_still_fails():
        assert False
""")


def test_an_unsupported_that_reaches_a_test_is_a_skip_with_its_reason(tmp_path):
    """The plugin reports it as pytest reports its own skips: at the line that raised it (a fixture's:
    at the test), with the exception's line as the reason."""
    (tmp_path / "test_refusing.py").write_text(_REFUSING_TESTS)
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs",
                             "test_refusing.py"], cwd=tmp_path, env=env, capture_output=True, text=True)
    lines = _REFUSING_TESTS.splitlines()
    raised_at = lines.index('    raise tkverify.Unsupported("toylib 0.1 has no negate")') + 1
    fixture_user = lines.index("def test_in_a_fixture(library):") + 1
    reason = "tkverify.registry.Unsupported: toylib 0.1 has no negate"
    assert f"SKIPPED [2] test_refusing.py:{raised_at}: {reason}" in result.stdout, result.stdout
    assert f"SKIPPED [1] test_refusing.py:{fixture_user}: {reason}" in result.stdout, result.stdout
    assert "1 failed, 3 skipped" in result.stdout, result.stdout


# -- known discrepancies: a failure the implementation's `known` hook recognises --------------


def _wrong_on_long(x):
    return -x if x.numel() < 5 else x  # a "library" that forgets to negate from length 5 on


def _knows_the_long_case(case, failure):
    return "T1 (toy findings): no negation from length 5" if case.inputs["x"].numel() >= 5 \
        and failure.outputs == frozenset({"y"}) else None


def test_a_known_failure_is_counted_under_its_finding_and_a_new_one_still_fails(toy, tmp_path):
    impl = Impl("toylib", _wrong_on_long, device="cpu", known=_knows_the_long_case)
    collector = Collector()
    verify(toy, impl, case_dir=tmp_path, record=collector.record, record_unsupported=collector.add_unsupported)
    reasons = collector.unsupported[(OP, "toylib")].reasons
    assert list(reasons) == ["known discrepancy T1 (toy findings): no negation from length 5"]
    # An excused example was judged: its seconds are in the judged phases, not a second time as refused.
    assert collector.speed[(OP, "toylib")].refused_s == 0 and collector.speed[(OP, "toylib")].impl_s > 0
    # The row keeps the failing elements; no case file is left for an excused failure.
    assert collector.rows[(OP, "y", "fp32", "toylib")].verdict == "fail"
    assert not list(tmp_path.iterdir())
    # Without the hook, or where it does not recognise the failure, the same failure fails.
    with pytest.raises(AssertionError):
        verify(toy, Impl("toylib", _wrong_on_long, device="cpu"), case_dir=tmp_path)
    with pytest.raises(AssertionError):
        verify(toy, Impl("toylib", lambda x: x, device="cpu", known=_knows_the_long_case), case_dir=tmp_path)


def test_replay_shows_a_known_failure_as_a_failure(toy, tmp_path, capsys):
    toy.add_impl(Impl("toylib", _wrong_on_long, device="cpu", known=_knows_the_long_case))
    path = save_case(tmp_path / "toy", Case(params={}, inputs={"x": torch.ones(6)}), op=OP, impl="toylib")
    assert cli.main(["replay", str(path)]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_report_separates_known_discrepancies_from_refusals(tmp_path):
    c = Collector()
    c.add_unsupported(OP, "toylib", "known discrepancy T1 (toy findings): no negation")
    c.add_unsupported(OP, "toylib", "odd lengths")
    c.write_shard(tmp_path / "shards" / "gw0.json", worker="gw0", gpu=None, pid=0)
    merged = merge_unsupported_shards((tmp_path / "shards").glob("*.json"))
    paths = write_report(tmp_path / "out", [], meta("ci", "toylib"), unsupported=merged)
    md = paths["md"].read_text()
    known_at, refused_at = md.index("## Known discrepancies"), md.index("## Not available")
    assert "- toy.negate [toylib]: 1 cases (T1 (toy findings): no negation (1))" in md[known_at:refused_at]
    assert "- toy.negate [toylib] unsupported: 1 cases (odd lengths (1))" in md[refused_at:]
    page = paths["html"].read_text()
    assert page.count("<ul>") == page.count("</ul>") == 2


def test_the_verdict_line_points_failing_rows_to_their_known_discrepancies():
    def failing(op):
        return ResultRow(op, "y", "fp32", "toylib", "bitwise", cases=1, failures=1, verdict="fail")

    rows = [failing(OP)]
    known = [UnsupportedRow(OP, "toylib", 1, {"known discrepancy T1 (toy): x": 1})]
    refused = [UnsupportedRow("toy.other", "toylib", 1, {"odd lengths": 1})]
    assert "1 failing rows all belong to (op, implementation) pairs with known discrepancies" in \
        _known_note(rows, known + refused)
    assert _known_note(rows + [failing("toy.other")], known + refused) == ""
    assert _known_note([], known) == ""
