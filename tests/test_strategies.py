"""Properties of the strategies: every edge they promise turns up within a
fixed (derandomised) search, every case stays within the declared ranges, and
the eager implementations refuse arguments outside them."""

from __future__ import annotations

import functools
import json
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis.errors import NoSuchExample

from kernels.torch import moe as torch_moe
from kernels.torch import transpose as torch_transpose
from strategies.moe import EXPERT_COUNTS, LARGEST_TOKENS, TOPK_VALUES, token_counts, topk_gate_cases
from strategies.transpose import (
    BATCHES,
    DTYPES,
    LARGE_DIMS,
    MAX_ELEMENTS,
    batched_transpose_cases,
    dims,
    transpose_cases,
)
from tkverify.case import load_case, save_case


def reaches(strategy, predicate, max_examples: int = 1000) -> bool:
    """Whether `strategy` draws a value satisfying `predicate` (a fixed search, so never flaky)."""
    search = settings(
        max_examples=max_examples,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],  # the first hit will do; no need to shrink it
        suppress_health_check=list(HealthCheck),
    )
    try:
        find(strategy, predicate, settings=search)
    except NoSuchExample:
        return False
    return True


def features_reached(strategy, features: dict, max_examples: int = 1000) -> set[str]:
    """The names of `features` (name -> predicate) that `strategy` reaches.

    One shared search for all of them, which stops as soon as every feature
    has turned up; a predicate is no longer evaluated once its feature has.
    """
    seen: set[str] = set()

    def every_feature_seen(value) -> bool:
        seen.update(name for name, has in features.items() if name not in seen and has(value))
        return len(seen) == len(features)

    reaches(strategy, every_feature_seen, max_examples)
    return seen


# -- topk_gate -------------------------------------------------------------------


def _ranked(scores: np.ndarray) -> np.ndarray:
    """Each row's scores in the gate's order (NaN first, -inf last)."""
    return torch.sort(torch.from_numpy(scores), dim=1, descending=True, stable=True).values.numpy()


def _at_the_cut(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k-th and (k+1)-th largest score of every row (empty when E == k)."""
    if scores.shape[1] <= k:
        return np.empty(0, np.float32), np.empty(0, np.float32)
    ranked = _ranked(scores)
    return ranked[:, k - 1], ranked[:, k]


def _finite_tie_at_cut(scores, k):
    kth, next_ = _at_the_cut(scores, k)
    return (np.isfinite(kth) & (kth == next_)).any()


def _nan_tie_at_cut(scores, k):
    kth, next_ = _at_the_cut(scores, k)
    return (np.isnan(kth) & np.isnan(next_)).any()


def _neg_inf_tie_at_cut(scores, k):
    kth, next_ = _at_the_cut(scores, k)
    return (np.isneginf(kth) & np.isneginf(next_)).any()


def _one_ulp_apart_at_cut(scores, k):
    kth, next_ = _at_the_cut(scores, k)
    finite = np.isfinite(kth) & np.isfinite(next_)
    return (np.nextafter(kth[finite], np.float32(-np.inf)) == next_[finite]).any()


def _all_equal_row(scores, k):
    # -0 == +0 counts as equal, and so do NaNs of any payload.
    same = (scores == scores[:, :1]) | (np.isnan(scores) & np.isnan(scores[:, :1]))
    return scores.shape[1] > 1 and same.all(axis=1).any()


def _fewer_than_k_above_neg_inf(scores, k):
    neg_inf = np.isneginf(scores)
    return (neg_inf.any(axis=1) & ((~neg_inf).sum(axis=1) < k)).any()


def _negative(scores):
    return scores.view(np.uint32) >> 31 == 1


def _nan_payload(scores, k):
    nan = np.isnan(scores)
    return (nan & (scores.view(np.uint32) & 0x7FFF_FFFF != 0x7FC0_0000)).any()


def _both_zeros_in_a_row(scores, k):
    zero = scores == 0
    return ((zero & _negative(scores)).any(axis=1) & (zero & ~_negative(scores)).any(axis=1)).any()


def _subnormal(scores, k):
    return ((scores != 0) & (np.abs(scores) < np.finfo(np.float32).tiny)).any()


TOPK_VALUE_FEATURES = {
    "finite tie straddling k": _finite_tie_at_cut,
    "NaN tie straddling k": _nan_tie_at_cut,
    "-inf tie straddling k": _neg_inf_tie_at_cut,
    "one ULP apart at k": _one_ulp_apart_at_cut,
    "all-equal row": _all_equal_row,
    "fewer than k scores above -inf": _fewer_than_k_above_neg_inf,
    "NaN": lambda s, k: np.isnan(s).any(),
    "negative NaN": lambda s, k: (np.isnan(s) & _negative(s)).any(),
    "NaN with a payload": _nan_payload,
    "several NaNs in a row": lambda s, k: (np.isnan(s).sum(axis=1) >= 2).any(),
    "all-NaN row": lambda s, k: s.shape[1] > 1 and np.isnan(s).all(axis=1).any(),
    "+inf": lambda s, k: np.isposinf(s).any(),
    "-0 and +0 in a row": _both_zeros_in_a_row,
    "subnormal": _subnormal,
}


def _on_case(has_feature):
    return lambda case: has_feature(case.inputs["scores"].numpy(), case.params["k"])


@functools.cache
def topk_features_reached() -> set[str]:
    features = {
        **{name: _on_case(has) for name, has in TOPK_VALUE_FEATURES.items()},
        **{f"E={e}": (lambda case, e=e: case.inputs["scores"].shape[1] == e) for e in EXPERT_COUNTS},
        **{f"k={k}": (lambda case, k=k: case.params["k"] == k) for k in TOPK_VALUES},
        "T > 300": lambda case: case.inputs["scores"].shape[0] > 300,
    }
    return features_reached(topk_gate_cases(), features)


@pytest.mark.parametrize(
    "feature",
    [
        *TOPK_VALUE_FEATURES,
        *(f"E={e}" for e in EXPERT_COUNTS),
        *(f"k={k}" for k in TOPK_VALUES),
        "T > 300",  # token_counts() is what the case's T comes from
    ],
)
def test_topk_strategy_reaches(feature):
    assert feature in topk_features_reached()


@pytest.mark.parametrize(
    "name, tokens_wanted",
    [("T=0", lambda t: t == 0), ("T=1", lambda t: t == 1), ("large odd T", lambda t: t > 2048 and t % 2)],
)
def test_topk_token_counts_reach(name, tokens_wanted):
    assert reaches(token_counts(), tokens_wanted)


def test_topk_expert_counts_include_ragged_warps():
    assert any(e % 32 for e in EXPERT_COUNTS) and max(EXPERT_COUNTS) == 1024


def summarize_draws(strategy, summarize, count: int) -> list:
    """summarize(case) for `count` cases drawn with a fixed seed (summaries only: the cases can be large)."""
    summaries = []

    @settings(
        max_examples=count,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(case):
        summaries.append(summarize(case))

    collect()
    return summaries


def _layout(case) -> dict:
    ((name, x),) = case.inputs.items()
    return {
        "params": case.params,
        "name": name,
        "shape": tuple(x.shape),
        "dtype": x.dtype,
        "cpu_contiguous": x.device.type == "cpu" and x.is_contiguous(),
    }


def test_topk_cases_stay_in_declared_ranges():
    layouts = summarize_draws(topk_gate_cases(), _layout, count=150)
    for s in layouts:
        (num_tokens, num_experts), k = s["shape"], s["params"]["k"]
        assert s["name"] == "scores" and s["dtype"] == torch.float32 and s["cpu_contiguous"]
        assert set(s["params"]) == {"k"} and type(k) is int and json.loads(json.dumps(s["params"])) == s["params"]
        assert num_experts in EXPERT_COUNTS and k in TOPK_VALUES and k <= num_experts
        assert 0 <= num_tokens <= LARGEST_TOKENS
    # Large token counts find tile bugs, but should not make every run slow.
    assert sum(s["shape"][0] > 300 for s in layouts) < 0.15 * len(layouts)


# -- transpose -------------------------------------------------------------------

_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32}
# (sign bit, exponent field, mantissa field) of each dtype's bit layout
_LAYOUT = {
    torch.float32: (1 << 31, 0x7F80_0000, 0x007F_FFFF),
    torch.bfloat16: (1 << 15, 0x7F80, 0x007F),
    torch.float8_e4m3fn: (1 << 7, 0x78, 0x07),
}


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _raw_bits(x: torch.Tensor) -> np.ndarray:
    return x.contiguous().view(torch.uint8).numpy().view(_UNSIGNED[x.element_size()]).astype(np.int64)


def _nan_codes(x: torch.Tensor) -> np.ndarray:
    bits = _raw_bits(x)
    sign, exponent, mantissa = _LAYOUT[x.dtype]
    if x.dtype == torch.float8_e4m3fn:  # one NaN a sign: S.1111.111
        return bits[bits & ~sign == exponent | mantissa]
    return bits[(bits & exponent == exponent) & (bits & mantissa != 0)]


def _has_negative_zero(x):
    return (_raw_bits(x) == _LAYOUT[x.dtype][0]).any()


def _has_negative_nan(x):
    return (_nan_codes(x) & _LAYOUT[x.dtype][0] != 0).any()


def _has_nan_payloads(x):
    # Two NaNs that differ in more than their sign.
    return len(np.unique(_nan_codes(x) & ~_LAYOUT[x.dtype][0])) >= 2


BITS_FEATURES = {"-0": _has_negative_zero, "negative NaN": _has_negative_nan, "NaN payloads": _has_nan_payloads}
# (dtype, feature) pairs to look for; e4m3fn has a single NaN code, so no payloads.
_BITS_CASES = [
    (dtype, feature)
    for dtype in DTYPES
    for feature in BITS_FEATURES
    if not (dtype == torch.float8_e4m3fn and feature == "NaN payloads")
]
_TRANSPOSE_STRATEGIES = {"transpose": transpose_cases, "batched_transpose": batched_transpose_cases}


def _bits_feature(dtype, has_feature):
    return lambda case: case.inputs["x"].dtype == dtype and has_feature(case.inputs["x"])


@functools.cache
def transpose_features_reached(op: str) -> set[str]:
    features = {f"{_short(dtype)} {name}": _bits_feature(dtype, BITS_FEATURES[name]) for dtype, name in _BITS_CASES}
    for axis in (-2, -1):
        features[f"axis {axis} = 0"] = lambda case, axis=axis: case.inputs["x"].shape[axis] == 0
        features[f"axis {axis} = 64n + 1"] = lambda case, axis=axis: case.inputs["x"].shape[axis] % 64 == 1
    if op == "batched_transpose":
        features.update({f"B={b}": (lambda case, b=b: case.inputs["x"].shape[0] == b) for b in BATCHES})
    return features_reached(_TRANSPOSE_STRATEGIES[op](), features)


_SIZES = ("0", "64n + 1")


@pytest.mark.parametrize(
    "op, feature",
    [
        *((op, f"{_short(dtype)} {name}") for op in _TRANSPOSE_STRATEGIES for dtype, name in _BITS_CASES),
        *((op, f"axis {axis} = {size}") for op in _TRANSPOSE_STRATEGIES for axis in (-2, -1) for size in _SIZES),
        *(("batched_transpose", f"B={b}") for b in BATCHES),
    ],
)
def test_transpose_strategies_reach(op, feature):
    assert feature in transpose_features_reached(op)


def _is_prime(n: int) -> bool:
    return n > 1 and all(n % d for d in range(2, math.isqrt(n) + 1))


DIM_FEATURES = {
    "0": lambda d: d == 0,
    "1": lambda d: d == 1,
    "tail past a multiple of 64": lambda d: d > 64 and d % 64 == 1,
    "tail short of a multiple of 64": lambda d: d > 64 and d % 64 == 63,
    "multiple of 64": lambda d: d > 0 and d % 64 == 0,
    "prime > 64": lambda d: d > 64 and _is_prime(d),
    "large": lambda d: d >= 2048,
}


@pytest.mark.parametrize("feature", DIM_FEATURES)
def test_transpose_dims_reach(feature):
    assert reaches(dims(), DIM_FEATURES[feature])


@pytest.mark.parametrize("op", _TRANSPOSE_STRATEGIES)
def test_transpose_cases_stay_in_declared_ranges(op):
    batched = op == "batched_transpose"
    for s in summarize_draws(_TRANSPOSE_STRATEGIES[op](), _layout, count=100):
        assert s["params"] == {} and s["name"] == "x" and s["dtype"] in DTYPES and s["cpu_contiguous"]
        assert len(s["shape"]) == (3 if batched else 2)
        assert all(0 <= d <= max(LARGE_DIMS) for d in s["shape"][-2:])
        if batched:
            assert s["shape"][0] in BATCHES and math.prod(s["shape"]) <= MAX_ELEMENTS


@settings(max_examples=10, deadline=None)
@given(batched_transpose_cases())
def test_transpose_cases_survive_a_case_file(tmp_path_factory, case):
    path = save_case(tmp_path_factory.mktemp("case") / "x", case, op="transpose.batched_transpose", impl="torch")
    loaded, _ = load_case(path)
    x, y = case.inputs["x"], loaded.inputs["x"]
    assert y.dtype == x.dtype and y.shape == x.shape
    assert torch.equal(y.view(torch.uint8), x.view(torch.uint8))


# -- argument validation of the eager implementations ---------------------------


def _scores(*shape, dtype=torch.float32):
    return torch.zeros(shape, dtype=dtype)


@pytest.mark.parametrize(
    "scores, k, error, names",
    [
        (_scores(4, 8, dtype=torch.float64), 2, TypeError, "scores"),
        (_scores(4, 8, dtype=torch.bfloat16), 2, TypeError, "scores"),
        (np.zeros((4, 8), np.float32), 2, TypeError, "scores"),
        (_scores(8), 2, ValueError, "scores"),
        (_scores(2, 4, 8), 2, ValueError, "scores"),
        (_scores(4, 1025), 2, ValueError, "scores"),
        (_scores(4, 0), 1, ValueError, "scores"),
        (_scores(4, 8), 0, ValueError, "k"),
        (_scores(4, 8), 9, ValueError, "k"),
        (_scores(4, 64), 33, ValueError, "k"),
        (_scores(4, 8), 2.0, TypeError, "k"),
        (_scores(4, 8), True, TypeError, "k"),
    ],
)
def test_torch_topk_gate_rejects_bad_arguments(scores, k, error, names):
    with pytest.raises(error, match=rf"^{names}\b"):
        torch_moe.topk_gate(scores, k)


def test_torch_topk_gate_accepts_the_limits():
    assert torch_moe.topk_gate(_scores(0, 1024), 32).shape == (0, 32)
    assert torch_moe.topk_gate(_scores(3, 1), 1).tolist() == [[0], [0], [0]]
    assert torch_moe.topk_gate(_scores(1, 9), np.int64(9)).dtype == torch.int64


@pytest.mark.parametrize("fn", [torch_transpose.transpose, torch_transpose.batched_transpose])
@pytest.mark.parametrize(
    "make_x, error",
    [
        (lambda nd: torch.zeros((2,) * nd, dtype=torch.float64), TypeError),
        (lambda nd: torch.zeros((2,) * nd, dtype=torch.int64), TypeError),
        (lambda nd: np.zeros((2,) * nd, np.float32), TypeError),
        (lambda nd: torch.zeros((2,) * (nd - 1)), ValueError),
        (lambda nd: torch.zeros((2,) * (nd + 1)), ValueError),
    ],
)
def test_torch_transposes_reject_bad_arguments(fn, make_x, error):
    ndim = 2 if fn is torch_transpose.transpose else 3
    with pytest.raises(error, match=r"^x\b"):
        fn(make_x(ndim))


@pytest.mark.parametrize("dtype", [*DTYPES, torch.int8, torch.int16])
def test_torch_transposes_accept_every_element_size(dtype):
    x = torch.zeros(2, 3, 4, dtype=dtype)
    assert torch_transpose.batched_transpose(x).shape == (2, 4, 3)
    assert torch_transpose.transpose(x[0]).shape == (4, 3)


@pytest.mark.parametrize("shape", [(0, 5), (5, 0), (3, 0, 2)])
def test_torch_transposes_of_empty_tensors_have_plain_strides(shape):
    # Comparisons look at raw bytes, and x.view(torch.uint8) needs a unit last stride.
    fn = torch_transpose.transpose if len(shape) == 2 else torch_transpose.batched_transpose
    assert fn(torch.empty(shape)).view(torch.uint8).shape == (*shape[:-2], shape[-1], shape[-2] * 4)


def test_single_row_corner_gives_each_padded_width_a_count_short_of_it():
    from kernels.moe.gate import config_for_experts
    from strategies.moe.gate import EXPERTS_BY_WIDTH, single_row_corner

    counts = [single_row_corner((i, "draws")) for i in range(400)]
    taken = [e for e in counts if e is not None]
    assert 0.55 < len(taken) / len(counts) < 0.78  # about SINGLE_ROW_SHARE
    assert all(e < config_for_experts(e).width for e in taken)  # lanes past E
    assert {config_for_experts(e).width for e in taken} == {config_for_experts(max(c)).width for c in EXPERTS_BY_WIDTH}
