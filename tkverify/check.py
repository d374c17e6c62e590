"""Run one case through an implementation and the oracle, and judge every output."""

from __future__ import annotations

import collections
import math
import os
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from tkverify.case import Case, save_case
from tkverify.poison import poisoned
from tkverify.policies import Comparison
from tkverify.registry import Failure, Impl, KnownDiscrepancy, OpSpec, Unsupported

DEFAULT_CASE_DIR = Path(os.environ.get("TKVERIFY_CASE_DIR", ".tkverify/cases"))


class VerificationError(AssertionError):
    """An implementation disagreed with the oracle; the message names the element and the replay."""

    def __init__(self, message: str, comparisons: list[Comparison] | None = None, case_file: Path | None = None):
        super().__init__(message)
        self.comparisons = comparisons or []
        self.case_file = case_file


def verification_errors(error: BaseException) -> list[VerificationError]:
    """The `VerificationError`s in `error`: itself, or those inside the exception group hypothesis raises
    when it found several distinct failures."""
    if isinstance(error, VerificationError):
        return [error]
    return [found for inner in getattr(error, "exceptions", ()) for found in verification_errors(inner)]


def output_error(c: Comparison) -> tuple[str, float]:
    """How bad one output's verdict is, as (label, error): the share of its allowed error that its worst
    element used where the policy measures it (`Comparison.bound_used`), else its largest ULP error (for
    an integer output, the largest difference).

    The worst-case search targets it and each report row keeps the example where it is largest; the label
    names the output and what is measured ("out: share of bound", "indices: ULP error"), so an output keeps
    one label from example to example."""
    if c.bound_used is not None:
        return f"{c.output}: share of bound", c.bound_used
    return f"{c.output}: ULP error", c.max_ulp


# What `hypothesis.target` is given for an infinite error (it takes finite scores only).
INFINITE_SCORE = 1e300


def target_score(error: float) -> float | None:
    """`error` as a `hypothesis.target` score: inf as INFINITE_SCORE, NaN as None (not a score)."""
    if math.isnan(error):
        return None
    return math.copysign(INFINITE_SCORE, error) if math.isinf(error) else error


def name_outputs(spec: OpSpec, result: Any, who: str) -> dict[str, Any]:
    """Map what an implementation or oracle returned onto the spec's output names."""
    names = list(spec.outputs)
    if isinstance(result, dict):
        missing = [n for n in names if n not in result]
        if missing:
            raise TypeError(f"{who} of {spec.name} returned no {missing}")
        return {n: result[n] for n in names}
    if not isinstance(result, (tuple, list)):
        result = (result,)
    if len(result) != len(names):
        raise TypeError(f"{who} of {spec.name} returned {len(result)} outputs, the spec names {len(names)}: {names}")
    return dict(zip(names, result))


def cuda_context_lost() -> bool:
    """Whether this process's CUDA context is gone (a device-side assert or a fault in an earlier call: every
    later CUDA call raises it again); False where CUDA was never used."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return False
    try:
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - any error here is the lost context
        return True
    return False


def run_impl(spec: OpSpec, impl: Impl, case: Case, timings: dict[str, float] | None = None) -> dict[str, Any]:
    """The implementation's outputs on `case`; `timings` (if given) gets the seconds spent
    moving the inputs to its device ("transfer") and running it to completion ("impl")."""
    device = impl.resolve_device()
    start = time.perf_counter()
    inputs = case.to(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    moved = time.perf_counter()
    with poisoned():  # what the implementation leaves unwritten holds NaN or a conspicuous integer
        result = impl.function()(**inputs, **case.params)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    if timings is not None:
        timings["transfer"] = moved - start
        timings["impl"] = time.perf_counter() - moved
    return name_outputs(spec, result, f"implementation {impl.name!r}")


def run_oracle(spec: OpSpec, case: Case, actual: dict[str, Any] | None = None,
               oracle: dict[str, Any] | None = None) -> dict[str, Any]:
    """The expected outputs of `case`: the float64 oracle's (`oracle`, when the caller already computed
    them for these inputs: they do not depend on the implementation), completed by the spec's `given`
    hook, which judges some outputs relative to the implementation's own (`actual`)."""
    expected = dict(oracle) if oracle is not None else oracle_outputs(spec, case)
    if spec.given is not None and actual is not None:
        expected.update(spec.given(case, actual))
    return expected


def oracle_outputs(spec: OpSpec, case: Case) -> dict[str, Any]:
    """The float64 oracle's outputs of `case`, by output name."""
    return name_outputs(spec, spec.oracle(**case.inputs, **case.params), "the oracle")


def judge(spec: OpSpec, actual: dict[str, Any], expected: dict[str, Any]) -> list[Comparison]:
    return [policy.compare(name, actual[name], expected[name]) for name, policy in spec.outputs.items()]


def case_file_for(spec: OpSpec, impl: Impl, case_dir: Path) -> Path:
    """One name per (op, impl): hypothesis ends by re-running the shrunk example, so the
    file left behind is the minimal failing case."""
    return case_dir / f"{spec.name}-{impl.name}"


def replay_command(path: Path) -> str:
    return f"tkverify replay {path}"


def excuse_known(impl: Impl, case: Case, failure: Failure) -> None:
    """Raise `KnownDiscrepancy` if `impl` knows this failure on this case as a committed finding."""
    finding = impl.known(case, failure) if impl.known is not None else None
    if finding:
        raise KnownDiscrepancy(finding)


def check_case(spec: OpSpec, impl: Impl, case: Case, *, case_dir: Path | None = DEFAULT_CASE_DIR,
               record=None, excuse: bool = True) -> list[Comparison]:
    """Judge `impl` on `case`; on failure save the case (unless case_dir is None) and raise.

    `record(spec, impl, comparisons, case, timings)` is called with every verdict,
    pass or fail, so that the report sees the whole distribution and not only
    failures; `timings` are the seconds spent per phase (transfer, impl, oracle,
    judge), which the report turns into fuzzing-speed figures.  With `excuse`, a failure the
    implementation knows as a committed finding raises `KnownDiscrepancy` instead (replays
    turn it off: they are there to show the failure).
    """
    header = f"{spec.name}[{impl.name}] on {case.describe()}"
    timings: dict[str, float] = {}
    # An `Unsupported` refusal is no Exception: it passes through, with no case file.
    try:
        actual = run_impl(spec, impl, case, timings)
    except Exception as e:
        if excuse:
            excuse_known(impl, case, Failure(spec.name, False, None, f"{type(e).__name__}: {e}"))
        path = save_case(case_file_for(spec, impl, case_dir), case, op=spec.name, impl=impl.name) \
            if case_dir is not None else None
        replay = f"\n  replay: {replay_command(path)}" if path else ""
        raise VerificationError(f"{header}: the implementation raised {type(e).__name__}: {e}{replay}",
                                case_file=path) from e
    start = time.perf_counter()
    expected = run_oracle(spec, case, actual)
    judged = time.perf_counter()
    comparisons = judge(spec, actual, expected)
    timings["oracle"] = judged - start
    timings["judge"] = time.perf_counter() - judged
    if record is not None:
        record(spec, impl, comparisons, case, timings)
    failed = [c for c in comparisons if not c.passed]
    if not failed:
        return comparisons
    if excuse:
        excuse_known(impl, case, Failure(spec.name, False, frozenset(c.output for c in failed),
                                         "\n".join(c.message for c in failed)))
    path = None
    if case_dir is not None:
        path = save_case(case_file_for(spec, impl, case_dir), case, op=spec.name, impl=impl.name,
                         extra={"failures": [c.message for c in failed]})
    lines = [f"{header}: {len(failed)} of {len(comparisons)} outputs disagree with the float64 oracle"]
    lines += [c.message for c in failed]
    if path is not None:
        lines.append(f"  replay: {replay_command(path)}")
    raise VerificationError("\n".join(lines), comparisons, path)


class UnsupportedCasesWarning(UserWarning):
    """Some drawn cases were outside what an implementation offers (`Unsupported`)."""


class UnsupportedTally:
    """Counts the examples of one test that an implementation refused with `Unsupported`
    (a `KnownDiscrepancy` among them).

    Hypothesis cannot skip a single example, so a refused example counts as
    unsupported (reported with its reason) and the search goes on; at the end a
    test whose every example was refused is skipped with the reasons, and a test
    with some refused ones warns, so that coverage is never overstated.
    """

    def __init__(self, op: str, impl: str, record: Callable[[str, str, str, float], None] | None = None):
        self.op, self.impl, self.record = op, impl, record
        self.examples = 0
        self.reasons: collections.Counter[str] = collections.Counter()

    def run(self, body: Callable[[], object]) -> None:
        self.examples += 1
        start = time.perf_counter()
        try:
            body()
        except Unsupported as e:
            self.reasons[e.reason] += 1
            if self.record is not None:  # with the seconds it took to refuse (a JIT compile, at times);
                # a known discrepancy was judged, and its phases are counted as a judged example's
                seconds = 0.0 if isinstance(e, KnownDiscrepancy) else time.perf_counter() - start
                self.record(self.op, self.impl, e.reason, seconds)

    def summary(self) -> str:
        n = sum(self.reasons.values())
        listed = "; ".join(f"{reason} ({count}x)" for reason, count in self.reasons.most_common(5))
        more = f"; and {len(self.reasons) - 5} more reasons" if len(self.reasons) > 5 else ""
        return f"{self.op}[{self.impl}] unsupported: {n} of {self.examples} cases ({listed}{more})"

    def finish(self) -> None:
        if not self.reasons:
            return
        if sum(self.reasons.values()) == self.examples:
            pytest.skip(self.summary())
        warnings.warn(UnsupportedCasesWarning(self.summary()), stacklevel=2)
