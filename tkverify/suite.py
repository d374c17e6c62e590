"""The differential suite: every registered op against every selected implementation.

`tkverify report` runs this module (``pytest --pyargs tkverify.suite``); the
project's own tests import it too.  Each (op, implementation) pair is one test
whose examples come from the op's strategy under the active hypothesis profile.
"""

from __future__ import annotations

import time

from hypothesis import given

from tkverify import gradients, registry
from tkverify.check import check_case


def verify(spec: registry.OpSpec, impl: registry.Impl, *, case_dir=None, record=None) -> None:
    """Let hypothesis hunt for a case where `impl` and the oracle disagree; raise on the shrunk one."""

    @given(case=spec.strategy())
    def run(case):
        check_case(spec, impl, case, case_dir=case_dir, record=record)

    run()


def test_differential(tk_op_impl, tk_state):
    op, impl_name = tk_op_impl
    spec = registry.get(op)
    start = time.perf_counter()
    try:
        verify(spec, spec.impls[impl_name], case_dir=tk_state["cases"], record=tk_state["collector"].record)
    finally:  # wall time includes drawing and shrinking, which the per-case timings do not see
        tk_state["collector"].add_wall(op, impl_name, time.perf_counter() - start)


def test_gradients(tk_grad_op_impl, tk_state):
    """Ops with a backward: the float64 backward by gradcheck (impl "oracle"), and each
    implementation's backward against it and against its own forward (tkverify.gradients)."""
    op, impl_name = tk_grad_op_impl
    gradients.verify(registry.get(op), impl_name, case_dir=tk_state["cases"],
                     record=tk_state["collector"].add_gradient)
