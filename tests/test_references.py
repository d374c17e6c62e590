"""Self-checks of the float64 oracles: hand-worked examples, and agreement with
an independent implementation (torch.sort, NumPy's swapaxes) on drawn cases."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings

from references import moe, transpose
from strategies.moe import topk_gate_cases
from strategies.transpose import batched_transpose_cases, transpose_cases

NAN, INF = float("nan"), float("inf")

oracle_checks = settings(max_examples=60, deadline=None)


# -- topk_gate -------------------------------------------------------------------


@pytest.mark.parametrize(
    "row, k, expected",
    [
        # NaNs of either sign first (by index), then 3 > 1 > 0 == -0 > -inf.
        ([1, NAN, -INF, 0, -0.0, 3, NAN, -NAN], 8, [1, 6, 7, 5, 0, 3, 4, 2]),
        ([1, NAN, -INF, 0, -0.0, 3, NAN, -NAN], 4, [1, 6, 7, 5]),
        ([2, 2, 2], 2, [0, 1]),  # ties go to the lower index
        ([-0.0, 0.0], 1, [0]),  # the two zeros tie
        ([0.0, -0.0], 1, [0]),
        ([-INF, -3.4e38], 1, [1]),  # -inf after every finite value
        ([-INF, -INF, 5.0], 3, [2, 0, 1]),
        ([INF, NAN], 1, [1]),  # NaN above +inf
        ([1e-45, 0.0, -1e-45], 3, [0, 1, 2]),  # subnormals order like any number
    ],
)
def test_topk_oracle_hand_worked(row, k, expected):
    scores = torch.tensor([row], dtype=torch.float32)
    assert moe.topk_gate(scores, k).tolist() == [expected]


def test_topk_oracle_orders_nans_of_any_payload_together():
    payloads = np.array([[0x7FC0_0000, 0xFFC0_0000, 0x7F80_0001, 0xFFFF_FFFF, 0x3F80_0000]], dtype=np.uint32)
    scores = torch.from_numpy(payloads.view(np.float32))
    assert moe.topk_gate(scores, 5).tolist() == [[0, 1, 2, 3, 4]]


def test_topk_oracle_accepts_numpy_and_empty_input():
    assert moe.topk_gate(np.array([[0.5, 1.5]], dtype=np.float32), 1).tolist() == [[1]]
    empty = moe.topk_gate(torch.empty(0, 7), 4)
    assert empty.shape == (0, 4) and empty.dtype == np.int64


@oracle_checks
@given(topk_gate_cases())
def test_topk_oracle_matches_stable_descending_sort(case):
    scores, k = case.inputs["scores"], case.params["k"]
    expected = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k]
    got = moe.topk_gate(scores, k)
    assert got.dtype == np.int64 and got.shape == (scores.shape[0], k)
    np.testing.assert_array_equal(got, expected.numpy())


@oracle_checks
@given(topk_gate_cases())
def test_topk_oracle_rows_are_distinct_valid_indices(case):
    scores, k = case.inputs["scores"], case.params["k"]
    got = moe.topk_gate(scores, k)
    assert ((got >= 0) & (got < scores.shape[1])).all()
    assert (np.diff(np.sort(got, axis=1), axis=1) > 0).all()


# -- transpose -------------------------------------------------------------------

_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32}


def raw_bits(x: torch.Tensor) -> np.ndarray:
    """x's elements as unsigned integers of their width (by way of bytes, not torch's integer views)."""
    as_bytes = x.contiguous().view(torch.uint8).numpy()  # (..., N * element size)
    return as_bytes.view(_UNSIGNED[x.element_size()]).reshape(tuple(x.shape))


def assert_transposed_bitwise(x: torch.Tensor, out: torch.Tensor) -> None:
    assert out.dtype == x.dtype and out.device.type == "cpu" and out.is_contiguous()
    np.testing.assert_array_equal(raw_bits(out), np.swapaxes(raw_bits(x), -1, -2))


@oracle_checks
@given(transpose_cases())
def test_transpose_oracle_moves_bits(case):
    assert_transposed_bitwise(case.inputs["x"], transpose.transpose(**case.inputs))


@oracle_checks
@given(batched_transpose_cases())
def test_batched_transpose_oracle_moves_bits(case):
    assert_transposed_bitwise(case.inputs["x"], transpose.batched_transpose(**case.inputs))


def test_transpose_oracle_keeps_nan_payloads_and_negative_zero():
    bits = np.array([[0x7FC0_0001, 0x8000_0000, 0xFF80_0001]], dtype=np.uint32)
    x = torch.from_numpy(bits.view(np.int32)).view(torch.float32)
    out = transpose.transpose(x)
    assert out.shape == (3, 1)
    np.testing.assert_array_equal(raw_bits(out)[:, 0], bits[0])


def test_transpose_oracle_handles_empty_and_fp8():
    x = torch.arange(6, dtype=torch.uint8).view(torch.float8_e4m3fn).reshape(2, 3)
    assert raw_bits(transpose.transpose(x)).tolist() == [[0, 3], [1, 4], [2, 5]]
    assert transpose.batched_transpose(torch.empty(2, 0, 5, dtype=torch.bfloat16)).shape == (2, 5, 0)


@pytest.mark.parametrize("fn, ndim", [(transpose.transpose, 3), (transpose.batched_transpose, 2)])
def test_transpose_oracles_reject_wrong_rank(fn, ndim):
    with pytest.raises(ValueError, match="x must be"):
        fn(torch.zeros((2,) * ndim))
