"""The differential suite: every registered op against every selected implementation.

`tkverify report` runs this module (``pytest --pyargs tkverify.suite``); the
project's own tests import it too.  Each (op, implementation) pair is one test
whose examples come from the op's strategy under the active hypothesis profile; under the profiles
that search for the worst case (`tkverify.profiles.targets`: fuzz, worst) each output's error is a
`hypothesis.target`, which steers the search towards larger errors.
"""

from __future__ import annotations

import collections
import dataclasses
import time

import hypothesis
from hypothesis import given

from strategies.layouts import with_layouts
from tkverify import coverage, gradients, registry
from tkverify.check import UnsupportedTally, check_case, output_error, target_score, verification_errors
from tkverify.policies import Comparison


def target_errors(comparisons: list[Comparison]) -> None:
    """Report each output's error (`tkverify.check.output_error`) to `hypothesis.target`, one label per
    output; an output rejected as a whole (no element judged) and a NaN error give no score."""
    for c in comparisons:
        label, error = output_error(c)
        score = target_score(error)
        if c.count and score is not None:
            hypothesis.target(score, label=label)


def targeting(record=None):
    """`record` (if any), followed by reporting each output's error to `hypothesis.target` (`target_errors`)."""
    def record_and_target(spec, impl, comparisons, case, timings):
        if record is not None:
            record(spec, impl, comparisons, case, timings)
        target_errors(comparisons)
    return record_and_target


def drawing_layouts(spec: registry.OpSpec, impl: registry.Impl) -> registry.OpSpec:
    """`spec` with a strategy that redraws each input `impl` takes in more than one layout among those
    (`strategies.layouts.with_layouts`); `spec` itself where `impl` takes only contiguous inputs."""
    if not any(set(classes) - {"contiguous"} for classes in impl.layouts.values()):
        return spec
    return dataclasses.replace(spec, strategy=lambda: with_layouts(spec.strategy(), impl.layouts))


def covering(record, listener: coverage.Listener, record_coverage, classify=None):
    """`record` (if any), followed by ``record_coverage(op, impl, classes, paths)`` with the example's input
    classes and the kernel paths its implementation call launched (`tkverify.coverage.example_labels`)."""
    def record_and_cover(spec, impl, comparisons, case, timings):
        if record is not None:
            record(spec, impl, comparisons, case, timings)
        classes, paths = coverage.example_labels(case, listener, classify)
        record_coverage(spec.name, impl.name, classes, paths)
    return record_and_cover


def verify(spec: registry.OpSpec, impl: registry.Impl, *, case_dir=None, record=None,
           record_unsupported=None, target: bool = False, record_coverage=None) -> None:
    """Let hypothesis hunt for a case where `impl` and the oracle disagree; raise on the shrunk one.

    Each input is drawn in the layouts `impl` declares for it (`registry.Impl.layouts`).
    Cases `impl` refuses with `registry.Unsupported` are counted (and passed to
    ``record_unsupported(op, impl, reason, seconds)``), never judged; if it refuses all, the test is skipped.
    With `target`, every judged example's output errors are targets of the search (`target_errors`).
    With `record_coverage`, each judged example's input classes and launched kernel paths go to it
    (`covering`).
    """
    tally = UnsupportedTally(spec.name, impl.name, record_unsupported)
    if target:
        record = targeting(record)
    classify = getattr(spec.strategy, "classify", None)  # the input classes of the op's own strategy
    spec = drawing_layouts(spec, impl)
    if record_coverage is not None:
        listener = coverage.Listener()
        impl = coverage.listening(impl, listener)
        record = covering(record, listener, record_coverage, classify)

    # Under a derandomised profile (ci) hypothesis seeds the search from this function's source (its
    # decorator included): any edit to `run` changes every example ci draws, so what varies (recording,
    # targeting, the layouts drawn) lives in `record` and in `spec`.
    @given(case=spec.strategy())
    def run(case):
        tally.run(lambda: check_case(spec, impl, case, case_dir=case_dir, record=record))

    run()
    tally.finish()


@dataclasses.dataclass
class JudgedClasses:
    """The input classes of the examples the differential suite judged for one (op, implementation)."""

    first: dict[str, int]  # class -> the first example (1-based, judged and refused ones counted) judged with it
    counts: collections.Counter  # class -> the judged examples with it
    drawn: int  # the examples judged or refused
    failure: str = ""  # the implementation's first disagreement or error (the run stops there); "" if none


def judged_classes(spec: registry.OpSpec, impl: registry.Impl) -> JudgedClasses:
    """The input classes of every example `verify` judges of `impl` on `spec` under the hypothesis profile
    in force: the same strategy, layouts and test function as the differential suite, hence (under a
    derandomised profile) the same draws as ``pytest tests/test_differential.py``.  The strategy is left
    untouched (even a ``map`` that only counts adds a span to each example, and hypothesis' mutations of
    later examples follow the spans: the draws would change); an example is counted when it is judged or
    refused.  A disagreement of the implementation ends the run and is returned as `JudgedClasses.failure`."""
    from hypothesis.control import _current_build_context

    judged = JudgedClasses({}, collections.Counter(), 0)
    running = [None]  # the hypothesis build context of the example counted last

    def count_example():
        context = _current_build_context.value
        if context is not running[0]:
            running[0] = context
            judged.drawn += 1

    def seen(op, impl_name, classes, paths):
        count_example()
        judged.counts.update(classes)
        for c in classes:
            judged.first.setdefault(c, judged.drawn)

    def refused(op, impl_name, reason, seconds):
        count_example()

    try:
        verify(spec, impl, record_coverage=seen, record_unsupported=refused)
    except Exception as e:  # the shrunk (or, without a shrink phase, the first) failing case
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else ""
        judged.failure = f"{type(e).__name__}: {first_line}"[:200]
    return judged


def test_differential(tk_op_impl, tk_state):
    op, impl_name = tk_op_impl
    spec = registry.get(op)
    collector = tk_state["collector"]
    start = time.perf_counter()
    try:
        verify(spec, spec.impls[impl_name], case_dir=tk_state["cases"], record=collector.record,
               record_unsupported=collector.add_unsupported, target=tk_state["target"],
               record_coverage=collector.add_coverage)
    except BaseException as e:  # the shrunk failing case, which the report's row links to
        for error in verification_errors(e):
            collector.add_failing_case(op, impl_name, error)
        raise
    finally:  # wall time includes drawing and shrinking, which the per-case timings do not see
        collector.add_wall(op, impl_name, time.perf_counter() - start)


def test_gradients(tk_grad_op_impl, tk_state):
    """Ops with a backward: the float64 backward by gradcheck (impl "oracle"), and each
    implementation's backward against it and against its own forward (tkverify.gradients), with the
    kernel paths each judged example's backward launched (the row ``<op> (backward)``)."""
    op, impl_name = tk_grad_op_impl
    collector = tk_state["collector"]
    gradients.verify(registry.get(op), impl_name, case_dir=tk_state["cases"], record=collector.add_gradient,
                     record_unsupported=collector.add_unsupported, record_coverage=collector.add_coverage)
