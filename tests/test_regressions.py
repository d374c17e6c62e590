"""Every case in tests/regressions/ once broke an implementation; it must now pass on every
implementation of its op that can run here (CPU: torch; a CUDA machine adds tilelang)."""

from pathlib import Path

import pytest

from tkverify import registry
from tkverify.case import load_case
from tkverify.check import check_case

CASES = sorted((Path(__file__).parent / "regressions").glob("*.json"))


def _params():
    for path in CASES:
        case, meta = load_case(path)
        spec = registry.get(meta["op"])
        for name, impl in spec.impls.items():
            reason = impl.unavailable_reason()
            marks = [pytest.mark.skip(reason=reason)] if reason else []
            yield pytest.param(spec, impl, case, id=f"{path.stem}-{name}", marks=marks)


@pytest.mark.parametrize("spec, impl, case", list(_params()))
def test_regression_case_passes(spec, impl, case):
    check_case(spec, impl, case, case_dir=None)
