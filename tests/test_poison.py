"""Poisoned outputs (tkverify.poison): inside `poisoned()` every uninitialised torch allocation holds
its dtype's sentinel, the deterministic-algorithms settings come back afterwards, TKVERIFY_POISON=0
turns it off, and check_case catches an implementation that leaves its output unwritten."""

import pytest
import torch

from tkverify import poison, registry
from tkverify.case import Case
from tkverify.check import VerificationError, check_case
from tkverify.mutants import unwritten_rows
from tkverify.policies import bitwise, ulp

ALLOCATORS = {
    "empty": lambda dtype: torch.empty(5, dtype=dtype),
    "empty_like": lambda dtype: torch.empty_like(torch.zeros(5, dtype=dtype)),
    "new_empty": lambda dtype: torch.zeros(1, dtype=dtype).new_empty(5),
    "empty_strided": lambda dtype: torch.empty_strided((5, 3), (1, 5), dtype=dtype),
}

# The sentinel's bits, as the unsigned integer of each width (fp8's 0x7F is a NaN in both formats).
SENTINEL_BITS = {
    torch.float32: 0x7FC00000, torch.float16: 0x7E00, torch.float8_e4m3fn: 0x7F, torch.float8_e5m2: 0x7F,
    torch.int8: 0x7F, torch.uint8: 0xFF, torch.int16: 0x7FFF, torch.int32: 0x7FFFFFFF, torch.bool: 1,
}
_UNSIGNED = {1: torch.uint8, 2: torch.uint16, 4: torch.uint32}


def _bits(t: torch.Tensor) -> set[int]:
    return set(t.contiguous().view(_UNSIGNED[t.element_size()]).to(torch.int64).reshape(-1).tolist())


@pytest.mark.parametrize("allocate", list(ALLOCATORS), ids=list(ALLOCATORS))
@pytest.mark.parametrize("dtype", list(SENTINEL_BITS), ids=str)
def test_uninitialised_allocations_hold_the_sentinel(allocate, dtype):
    with poison.poisoned(True) as active:
        t = ALLOCATORS[allocate](dtype)
    assert active
    assert _bits(t) == {SENTINEL_BITS[dtype]}


def test_floating_sentinels_are_nan_and_integers_the_largest_value():
    with poison.poisoned(True):
        assert torch.isnan(torch.empty(4, dtype=torch.bfloat16)).all()
        assert torch.isnan(torch.empty(4, dtype=torch.float64)).all()
        assert torch.isnan(torch.empty(4, dtype=torch.float8_e4m3fn).float()).all()
        assert (torch.empty(4, dtype=torch.int64) == torch.iinfo(torch.int64).max).all()
        # -1 is a padding mark in the contracts: the sentinel must never be it.
        assert not (torch.empty(4, dtype=torch.int32) == -1).any()


def test_settings_are_restored_also_when_the_call_raises():
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.utils.deterministic.fill_uninitialized_memory)
    with pytest.raises(RuntimeError, match="inside"):
        with poison.poisoned(True):
            assert torch.are_deterministic_algorithms_enabled()
            assert torch.is_deterministic_algorithms_warn_only_enabled()  # non-deterministic ops still run
            assert torch.utils.deterministic.fill_uninitialized_memory
            raise RuntimeError("inside")
    assert (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.utils.deterministic.fill_uninitialized_memory) == before


def test_nested_contexts_keep_the_outer_one_active():
    with poison.poisoned(True):
        with poison.poisoned(True):
            pass
        assert torch.isnan(torch.empty(3)).all()
    assert not torch.are_deterministic_algorithms_enabled()


@pytest.mark.parametrize("value, on", [(None, True), ("1", True), ("0", False), ("off", False), ("False", False)])
def test_environment_switch(monkeypatch, value, on):
    if value is None:
        monkeypatch.delenv(poison.ENV, raising=False)
    else:
        monkeypatch.setenv(poison.ENV, value)
    assert poison.enabled() is on
    with poison.poisoned() as active:
        assert active is on
        assert torch.are_deterministic_algorithms_enabled() is on


def test_unwritten_rows_keeps_layout_and_poisons_the_rest():
    t = torch.arange(12, dtype=torch.float32).reshape(4, 3).T.contiguous().T  # column-major (4, 3)
    with poison.poisoned(True):
        out = unwritten_rows(t, torch.tensor([True, False, True, False]))
    assert out.shape == t.shape and out.stride() == t.stride()
    assert torch.equal(out[[0, 2]], t[[0, 2]])
    assert torch.isnan(out[[1, 3]]).all()


# -- check_case poisons the implementation call --------------------------------------------------


@pytest.fixture
def zeros_op():
    """fake.zeros: y = 0 (fp32) and n = 0 (int32), the shape of x; two implementations that allocate
    with torch.empty, one writing, one not."""
    def writes(x):
        y, n = torch.empty_like(x), torch.empty(x.shape, dtype=torch.int32)
        return y.zero_(), n.zero_()

    def forgets(x):
        return torch.empty_like(x), torch.empty(x.shape, dtype=torch.int32)

    spec = registry.register(registry.OpSpec(
        name="fake.zeros",
        oracle=lambda x: (torch.zeros_like(x, dtype=torch.float64), torch.zeros(x.shape, dtype=torch.int32)),
        strategy=lambda: None,
        outputs={"y": ulp("fp32", 0.5), "n": bitwise(torch.int32)},
        impls={"writes": registry.Impl("writes", writes, device="cpu"),
               "forgets": registry.Impl("forgets", forgets, device="cpu")},
    ))
    yield spec
    registry._REGISTRY.pop("fake.zeros", None)


def test_check_case_catches_an_unwritten_output(zeros_op, monkeypatch):
    monkeypatch.delenv(poison.ENV, raising=False)
    case = Case(params={}, inputs={"x": torch.ones(7)})
    assert all(c.passed for c in check_case(zeros_op, zeros_op.impls["writes"], case, case_dir=None))
    with pytest.raises(VerificationError) as caught:
        check_case(zeros_op, zeros_op.impls["forgets"], case, case_dir=None)
    # Every element of both outputs fails: the poison, not the allocator's leftovers, decides.
    failed = {c.output: c for c in caught.value.comparisons if not c.passed}
    assert set(failed) == {"y", "n"}
    assert all(c.count == 7 and c.exact == 0 for c in failed.values())
    assert not torch.are_deterministic_algorithms_enabled()  # restored after the call
