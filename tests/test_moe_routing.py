"""The MoE routing chain (group_count, fused_mapping, expand_to_fused, reduce_fused,
normalize_weight): oracle self-checks on hand-worked examples, the features the
strategies promise, and the argument checks of the eager implementations."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis.errors import NoSuchExample

import strategies.moe as sm
from kernels.torch import moe as torch_moe
from references import moe
from tkverify.policies import summation
from tkverify.specs.moe import normalize_denom_bound, reduce_fused_bound

NAN, INF = float("nan"), float("inf")

oracle_checks = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                         suppress_health_check=list(HealthCheck))


def i64(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int64).reshape(len(rows), -1)


def i32(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int32).reshape(len(rows), -1)


# -- oracles: hand-worked examples -------------------------------------------------


def test_group_count_counts_each_group_and_nothing_else():
    idx = i64([[0, 2], [2, -1], [5, 1], [3, -7]])
    assert moe.group_count(idx, 3).tolist() == [1, 1, 2]  # 5 and 3 are past the groups, -1 and -7 masked
    assert moe.group_count(idx, 3).dtype == np.int32
    assert moe.group_count(i64([[-1]]), 4).tolist() == [0, 0, 0, 0]
    assert moe.group_count(torch.empty(0, 3, dtype=torch.int64), 2).tolist() == [0, 0]


def test_fused_mapping_hand_worked_with_alignment():
    # T = 3, K = 2, E = 3, alignment 4.  Pairs by flat index t*K + k:
    # expert 0: flat 1 (t0), 4 (t2); expert 1: flat 0 (t0), 2 (t1), 5 (t2); expert 2: none; flat 3 masked.
    p2t, p2tk, tk2p, start, end, n = moe.fused_mapping(i64([[1, 0], [1, -1], [0, 1]]), 3, 4)
    assert n == 8 and type(n) is int
    assert start.tolist() == [0, 4, 8] and end.tolist() == [2, 7, 8]  # expert 2 is empty: no padding
    assert p2t.tolist() == [0, 2, -1, -1, 0, 1, 2, -1]
    assert p2tk.tolist() == [1, 4, -1, -1, 0, 2, 5, -1]
    assert tk2p.tolist() == [[4, 0], [5, -1], [1, 6]]
    assert {a.dtype for a in (p2t, p2tk, tk2p, start, end)} == {np.dtype(np.int32)}


def test_fused_mapping_without_alignment_has_no_padding():
    p2t, p2tk, tk2p, start, end, n = moe.fused_mapping(i64([[1, 0], [1, -1], [0, 1]]), 3, 1)
    assert n == 5 and p2t.tolist() == [0, 2, 0, 1, 2] and p2tk.tolist() == [1, 4, 0, 2, 5]
    assert start.tolist() == [0, 2, 5] and end.tolist() == [2, 5, 5]
    assert tk2p.tolist() == [[2, 0], [3, -1], [1, 4]]


def test_fused_mapping_empty_experts_between_full_ones():
    # Experts 0 and 2 of 4 are empty; each segment starts where the previous padded one ends.
    p2t, _, tk2p, start, end, n = moe.fused_mapping(i64([[1], [3], [1]]), 4, 16)
    assert start.tolist() == [0, 0, 16, 16] and end.tolist() == [0, 2, 16, 17] and n == 32
    assert p2t[:2].tolist() == [0, 2] and p2t[16] == 1 and (np.delete(p2t, [0, 1, 16]) == -1).all()
    assert tk2p.tolist() == [[0], [16], [1]]


def test_fused_mapping_drops_every_negative_entry():
    p2t, p2tk, tk2p, start, end, n = moe.fused_mapping(i64([[-1, -2], [-(2**63), -5]]), 2, 64)
    assert n == 0 and p2t.shape == (0,) and p2tk.shape == (0,)
    assert tk2p.tolist() == [[-1, -1], [-1, -1]] and start.tolist() == [0, 0] and end.tolist() == [0, 0]


def test_fused_mapping_repeated_expert_gives_each_pair_a_row():
    p2t, p2tk, tk2p, start, end, n = moe.fused_mapping(i64([[0, 0], [1, 0]]), 2, 1)
    assert n == 4 and p2t.tolist() == [0, 0, 1, 1] and p2tk.tolist() == [0, 1, 3, 2]
    assert tk2p.tolist() == [[0, 1], [3, 2]] and end.tolist() == [3, 4]


def test_fused_mapping_of_no_tokens_and_beyond_the_experts():
    p2t, _, tk2p, start, end, n = moe.fused_mapping(torch.empty(0, 6, dtype=torch.int64), 5, 128)
    assert n == 0 and p2t.shape == (0,) and tk2p.shape == (0, 6) and start.tolist() == [0] * 5
    with pytest.raises(ValueError, match="num_experts"):
        moe.fused_mapping(i64([[0, 3]]), 3, 1)


def _invariants_hold(idx: np.ndarray, num_experts: int, alignment: int) -> None:
    p2t, p2tk, tk2p, start, end, n = moe.fused_mapping(idx, num_experts, alignment)
    k = idx.shape[1]
    counts = moe.group_count(idx, num_experts)
    assert (end - start == counts).all() and (start % alignment == 0).all()
    padded_end = np.append(start[1:], n)
    assert (padded_end - start == moe.align_up(counts.astype(np.int64), alignment)).all()
    placed = idx >= 0
    assert ((tk2p >= 0) == placed).all()
    rows = tk2p[placed]
    assert len(set(rows.tolist())) == rows.size  # every pair its own row
    tokens = np.nonzero(placed)[0]
    assert (p2t[rows] == tokens).all() and (p2tk[rows] == np.flatnonzero(placed.ravel())).all()
    assert (p2t[rows] == p2tk[rows] // max(k, 1)).all()
    for e in range(num_experts):
        segment = p2tk[start[e]:end[e]]
        assert (idx.ravel()[segment] == e).all() and (np.diff(segment) > 0).all()  # (token, slot) order
        assert (p2t[end[e]:padded_end[e]] == -1).all() and (p2tk[end[e]:padded_end[e]] == -1).all()


@oracle_checks
@given(sm.fused_mapping_cases())
def test_fused_mapping_oracle_invariants(case):
    _invariants_hold(case.inputs["topk_idx"].numpy(), **case.params)


def test_expand_oracle_moves_rows_and_sf_and_zeroes_padding():
    bits = torch.tensor([[0x7FC1, -0x8000], [0x3F80, 0x0001]], dtype=torch.int16)  # NaN payload, -0, 1, subnormal
    x = bits.view(torch.bfloat16)
    sf = torch.tensor([[7], [9]], dtype=torch.uint8)
    out, out_sf = moe.expand_to_fused(x, i32([[2, -1], [0, 3]]), 5, sf)
    assert out.dtype == torch.bfloat16 and out.shape == (5, 2)
    assert out.view(torch.int16).tolist() == [[0x3F80, 0x0001], [0, 0], [0x7FC1, -0x8000], [0x3F80, 0x0001], [0, 0]]
    assert out_sf.tolist() == [[9], [0], [7], [9], [0]]
    assert moe.expand_to_fused(x, i32([[0], [7]]), 1).view(torch.int16).tolist() == [[0x7FC1, -0x8000]]  # 7 >= N


def test_exact_sum_is_compensated():
    terms = [np.array([1e16]), np.array([1.0]), np.array([-1e16])]
    assert moe.exact_sum(terms, (1,)).tolist() == [1.0]  # a plain float64 sum gives 0
    assert np.isnan(moe.exact_sum([np.array([INF]), np.array([-INF])], (1,))).all()
    assert moe.exact_sum([np.array([INF]), np.array([1.0])], (1,)).tolist() == [INF]


def test_reduce_oracle_hand_worked():
    x = torch.tensor([[1.0, 2.0], [3.0, NAN], [-1.0, 0.5]], dtype=torch.bfloat16)
    w = torch.tensor([[0.5, NAN], [2.0, 0.25], [1.0, 1.0]])
    pos = i32([[0, -1], [2, 0], [-1, -1]])
    out = moe.reduce_fused(x, w, pos)
    # Row 0: the NaN weight is on a masked slot and must not leak; row 2 has no slot: zeros.
    assert out.tolist() == [[0.5, 1.0], [-1.75, 1.5], [0.0, 0.0]]
    # Row 1 of x (a NaN) is used by nobody.  Terms that cancel give exactly 0.
    cancelling = torch.tensor([[1.5], [-1.5]], dtype=torch.bfloat16)
    assert moe.reduce_fused(cancelling, torch.tensor([[2.0, 2.0]]), i32([[0, 1]])).tolist() == [[0.0]]
    e4m3 = torch.tensor([[2.0], [-3.0]]).to(torch.float8_e4m3fn)
    sf = torch.tensor([[0.5], [2.0**-10]])
    assert moe.reduce_fused(e4m3, torch.tensor([[3.0, 1024.0]]), i32([[0, 1]]), sf).tolist() == [[0.0]]


def test_reduce_bound_allows_cancellation_and_not_more():
    # bf16 x: 1 and -(1 + 2^-7) weighted 1 and 1, plus a tiny third term: the sum is
    # -2^-7 + 2^-20, far below the terms.
    x = torch.tensor([[1.0], [-(1 + 2**-7)], [2**-20]], dtype=torch.bfloat16)
    pos, w = i32([[0, 1, 2]]), torch.ones(1, 3)
    bound = reduce_fused_bound(x, w, pos)
    exact = -(2.0**-7) + 2.0**-20
    assert bound.exact.tolist() == [[exact]] and bound.fmt == "bf16"
    gamma_3 = 3 * 2.0**-24 / (1 - 3 * 2.0**-24)
    assert bound.error[0, 0] == pytest.approx(gamma_3 * (2 + 2**-7 + 2**-20) + 3 * 2.0**-150 * (1 + 2 * 2.0**-24 / (1 - 2 * 2.0**-24)))
    policy = summation()
    eager = torch_moe.reduce_fused(x, w, pos)  # fp32: -2^-7 + 2^-20 exactly, then bf16: -2^-7
    assert eager.tolist() == [[-(2.0**-7)]] and policy.compare("out", eager, bound).passed
    one_code_off = (eager.view(torch.int16) + 1).view(torch.bfloat16)
    assert not policy.compare("out", one_code_off, bound).passed


def test_normalize_oracle_and_denom_bound():
    denom, weights = moe.normalize_weight(torch.tensor([[0.0, 0.0], [1.0, 3.0], [2.0**-149, 0.0]]))
    assert denom.tolist() == [1e-20, 4.0, 1e-20]  # as float64 rounds them
    assert weights[0].tolist() == [0.0, 0.0] and weights[1].tolist() == [0.25, 0.75]
    assert weights[2].tolist() == [2.0**-149 / 1e-20, 0.0]
    # The fp32 constant 1e-20 is off by its own rounding: allowed, and nothing more.
    bound = normalize_denom_bound(torch.zeros(1, 4))
    assert summation("fp32").compare("denom", torch.tensor([1e-20]), bound).passed
    assert not summation("fp32").compare("denom", torch.tensor([0.0]), bound).passed


# -- strategies: the features they promise -------------------------------------------------


def features_reached(strategy, features: dict, max_examples: int = 400) -> set[str]:
    """Names of `features` (name -> predicate on a case) seen in a fixed, derandomised search.

    The search stops as soon as every feature has turned up.
    """
    seen: set[str] = set()

    def every_feature_seen(case) -> bool:
        seen.update(name for name, has in features.items() if name not in seen and has(case))
        return len(seen) == len(features)

    search = settings(max_examples=max_examples, derandomize=True, database=None, deadline=None,
                      phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    try:
        find(strategy, every_feature_seen, settings=search)
    except NoSuchExample:
        pass
    return seen


def _idx(case) -> np.ndarray:
    return case.inputs["topk_idx"].numpy()


def _counts(case) -> np.ndarray:
    return moe.group_count(_idx(case), case.params["num_experts"])


def _has_repeat(idx: np.ndarray) -> bool:
    ordered = np.sort(idx, axis=1)
    return bool(((np.diff(ordered, axis=1) == 0) & (ordered[:, 1:] >= 0)).any())


ROUTING_FEATURES = {
    "masked slot (-1)": lambda c: (_idx(c) == -1).any(),
    "whole row masked": lambda c: (_idx(c) < 0).all(axis=1).any() and (_idx(c) >= 0).any(),
    "every row masked": lambda c: _idx(c).size > 0 and (_idx(c) < 0).all(),
    "negative other than -1": lambda c: (_idx(c) < -1).any(),
    "expert without a token": lambda c: (_idx(c) >= 0).any() and (_counts(c) == 0).any(),
    "every token on one expert": lambda c: _idx(c).shape[0] >= 2 and (_counts(c) == _idx(c).shape[0]).any()
    and (_idx(c) >= 0).all(),
    "repeated expert in a row": lambda c: _has_repeat(_idx(c)),
    "T = 0": lambda c: _idx(c).shape[0] == 0,
    "T = 1": lambda c: _idx(c).shape[0] == 1,
    "large odd T": lambda c: _idx(c).shape[0] > 2048 and _idx(c).shape[0] % 2 == 1,
    **{f"K={k}": (lambda c, k=k: _idx(c).shape[1] == k) for k in sm.ROUTING_TOPK},
    **{f"E={e}": (lambda c, e=e: c.params["num_experts"] == e) for e in sm.ROUTING_EXPERT_COUNTS},
    **{f"alignment={a}": (lambda c, a=a: c.params["alignment"] == a) for a in sm.ALIGNMENTS},
}


@functools.cache
def routing_features_reached() -> set[str]:
    return features_reached(sm.fused_mapping_cases(), ROUTING_FEATURES, max_examples=600)


@pytest.mark.parametrize("feature", ROUTING_FEATURES)
def test_routing_strategy_reaches(feature):
    assert feature in routing_features_reached()


def test_routing_covers_k_from_1_to_9_and_e_to_384():
    assert set(range(1, 10)) - set(sm.ROUTING_TOPK) <= {4, 5, 7} and max(sm.ROUTING_TOPK) >= 9
    assert min(sm.ROUTING_EXPERT_COUNTS) == 1 and max(sm.ROUTING_EXPERT_COUNTS) >= 384
    assert set(sm.ALIGNMENTS) == {1, 16, 64, 128}


@pytest.mark.parametrize("routing", sm.ROUTINGS)
@pytest.mark.parametrize("num_experts, k", [(1, 1), (3, 3), (8, 6), (384, 9)])
def test_routings_without_repeats_give_distinct_experts(routing, num_experts, k):
    masks = {"masked_slots": "some", "other_negatives": "all", "masked_rows": "first"}
    for seed in range(5):
        idx = sm.build_topk_idx(seed, 37, num_experts, k, routing, masks if seed % 2 else {})
        assert idx.dtype == np.int64 and idx.shape == (37, k) and (idx < num_experts).all()
        assert not _has_repeat(idx)
        if seed % 2 == 0:
            assert (idx >= 0).all()


def test_group_count_strategy_reaches_int32_and_entries_past_the_groups():
    features = {
        "int32 idx": lambda c: c.inputs["idx"].dtype == torch.int32,
        "entries >= num_groups": lambda c: (c.inputs["idx"] >= c.params["num_groups"]).any().item(),
        "masked entries": lambda c: (c.inputs["idx"] < 0).any().item(),
    }
    assert features_reached(sm.group_count_cases(), features) == set(features)


def _positions(case) -> np.ndarray:
    return case.inputs["token_topk_to_pos"].numpy()


EXPAND_SF_FEATURES = {
    **{f"sf {str(d).removeprefix('torch.')}": (lambda c, d=d: c.inputs["x_sf"].dtype == d) for d in sm.SF_DTYPES},
    **{f"x {str(d).removeprefix('torch.')}": (lambda c, d=d: c.inputs["x"].dtype == d) for d in sm.QUANTISED_DTYPES},
    **{f"layout {layout}": (lambda c, layout=layout: c.params["sf_layout"] == layout) for layout in sm.SF_LAYOUTS},
    "56 sf columns": lambda c: c.inputs["x_sf"].shape[1] == 56,
    "padding rows": lambda c: c.params["num_expanded_rows"] > (_positions(c) >= 0).sum(),
    "scattered positions": lambda c: (np.diff(_positions(c)[_positions(c) >= 0]) < 0).any(),
    "N = 0": lambda c: c.params["num_expanded_rows"] == 0,
}


@functools.cache
def expand_sf_features_reached() -> set[str]:
    return features_reached(sm.expand_to_fused_with_sf_cases(), EXPAND_SF_FEATURES)


@pytest.mark.parametrize("feature", EXPAND_SF_FEATURES)
def test_expand_with_sf_strategy_reaches(feature):
    assert feature in expand_sf_features_reached()


def test_expand_strategy_reaches_every_dtype():
    features = {str(d): (lambda c, d=d: c.inputs["x"].dtype == d) for d in sm.EXPAND_DTYPES}
    assert features_reached(sm.expand_to_fused_cases(), features) == set(features)


def _weights(case) -> np.ndarray:
    return case.inputs["topk_weights"].numpy().astype(np.float64)


WEIGHT_FEATURES = {
    "zero weight": lambda w: (w == 0).any(),
    "-0.0 weight": lambda w: ((w == 0) & np.signbit(w)).any(),
    "subnormal weight": lambda w: ((w != 0) & (np.abs(w) < 2.0**-126)).any(),
    "dominant slot": lambda w: w.shape[1] > 1 and (np.sort(w, axis=1)[:, -1] > 2.0**20 * np.sort(w, axis=1)[:, -2]).any(),
    "row summing below 1e-20": lambda w: w.size > 0 and (w.sum(axis=1) < 1e-22).any(),
    "all-zero row": lambda w: w.size > 0 and (w == 0).all(axis=1).any(),
    "weight above 2^40": lambda w: (w > 2.0**40).any(),
}


@functools.cache
def normalize_features_reached() -> set[str]:
    features = {name: (lambda c, has=has: bool(has(_weights(c)))) for name, has in WEIGHT_FEATURES.items()}
    features.update({f"K={k}": (lambda c, k=k: _weights(c).shape[1] == k) for k in sm.ROUTING_TOPK})
    features["T = 0"] = lambda c: _weights(c).shape[0] == 0
    return features_reached(sm.normalize_weight_cases(), features)


@pytest.mark.parametrize("feature", [*WEIGHT_FEATURES, *(f"K={k}" for k in sm.ROUTING_TOPK), "T = 0"])
def test_normalize_strategy_reaches(feature):
    assert feature in normalize_features_reached()


def _cancels(case) -> bool:
    exact = moe.reduce_fused(**case.inputs)
    magnitude, _, _ = moe.reduce_fused_magnitudes(**case.inputs)
    finite = np.isfinite(exact) & np.isfinite(magnitude) & (magnitude > 0)
    return bool((np.abs(exact[finite]) < 2.0**-12 * magnitude[finite]).any())


def _non_finite_sum(case) -> bool:
    return bool((~np.isfinite(moe.reduce_fused(**case.inputs))).any())


def _unused_rows_nan(case) -> bool:
    x = case.inputs["x"]
    used = np.zeros(x.shape[0], bool)
    pos = _positions(case)
    used[pos[pos >= 0]] = True
    return bool((~used).any() and torch.isnan(x.float()[torch.from_numpy(~used)]).all())


REDUCE_FEATURES = {
    **{f"x {str(d).removeprefix('torch.')}": (lambda c, d=d: c.inputs["x"].dtype == d) for d in sm.REDUCE_DTYPES},
    "terms cancelling (sum far below sum |w x|)": _cancels,
    "NaN in rows nobody uses": _unused_rows_nan,
    "NaN weight on a masked slot": lambda c: bool((np.isnan(_weights(c)) & (_positions(c) < 0)).any()),
    "NaN or inf in a used row": _non_finite_sum,
    "token without a valid slot": lambda c: bool((_positions(c) < 0).all(axis=1).any()),
    "subnormal weight": lambda c: WEIGHT_FEATURES["subnormal weight"](_weights(c)),
    "dominant slot": lambda c: WEIGHT_FEATURES["dominant slot"](np.nan_to_num(_weights(c))),
}


@functools.cache
def reduce_features_reached() -> set[str]:
    return features_reached(sm.reduce_fused_cases(), REDUCE_FEATURES)


@pytest.mark.parametrize("feature", REDUCE_FEATURES)
def test_reduce_strategy_reaches(feature):
    assert feature in reduce_features_reached()


def test_reduce_cases_stay_small():
    sizes = []

    @settings(max_examples=150, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(sm.reduce_fused_cases())
    def collect(case):
        num_tokens, k = case.inputs["topk_weights"].shape
        sizes.append(max(case.inputs["x"].numel(), num_tokens * k * case.inputs["x"].shape[1]))

    collect()
    assert max(sizes) <= sm.MAX_ROUTED_ELEMENTS * max(sm.HIDDEN_SIZES)
    assert np.median(sizes) < 20_000  # typical cases are small: CPU CI stays fast


# -- the eager implementations: argument checks ----------------------------------------------

_IDX = torch.zeros(4, 2, dtype=torch.int64)
_POS = torch.zeros(4, 2, dtype=torch.int32)
_W = torch.ones(4, 2)


@pytest.mark.parametrize(
    "args, error, name",
    [
        ((np.zeros((4, 2), np.int64), 8), TypeError, "idx"),
        ((_IDX.float(), 8), TypeError, "idx"),
        ((_IDX.to(torch.int16), 8), TypeError, "idx"),
        ((_IDX.reshape(-1), 8), ValueError, "idx"),
        ((torch.zeros(4, 33, dtype=torch.int64), 8), ValueError, "idx"),
        ((torch.zeros(4, 0, dtype=torch.int64), 8), ValueError, "idx"),
        ((torch.zeros(2, 4, dtype=torch.int64).T, 8), ValueError, "idx"),
        ((_IDX, 0), ValueError, "num_groups"),
        ((_IDX, 1025), ValueError, "num_groups"),
        ((_IDX, 8.0), TypeError, "num_groups"),
        ((_IDX, True), TypeError, "num_groups"),
    ],
)
def test_group_count_rejects(args, error, name):
    with pytest.raises(error, match=rf"^{name}\b"):
        torch_moe.group_count(*args)


@pytest.mark.parametrize(
    "args, error, name",
    [
        ((_IDX.to(torch.int32), 8, 1), TypeError, "topk_idx"),
        (([[0, 1]], 8, 1), TypeError, "topk_idx"),
        ((_IDX[None], 8, 1), ValueError, "topk_idx"),
        ((torch.zeros(4, 33, dtype=torch.int64), 64, 1), ValueError, "topk_idx"),
        ((torch.zeros(2, 4, dtype=torch.int64).T, 8, 1), ValueError, "topk_idx"),
        ((torch.tensor([[0, 8]]), 8, 1), ValueError, "topk_idx"),  # an expert past num_experts
        ((_IDX, 0, 1), ValueError, "num_experts"),
        ((_IDX, 1025, 1), ValueError, "num_experts"),
        ((_IDX, "8", 1), TypeError, "num_experts"),
        ((_IDX, 8, 0), ValueError, "alignment"),
        ((_IDX, 8, 1025), ValueError, "alignment"),
        ((_IDX, 8, 16.0), TypeError, "alignment"),
    ],
)
def test_fused_mapping_rejects(args, error, name):
    with pytest.raises(error, match=rf"^{name}\b"):
        torch_moe.fused_mapping(*args)


def test_fused_mapping_rejects_sizes_past_int32():
    huge = torch.empty(2**26, 32, dtype=torch.int64, device="meta")  # 2^31 pairs, no memory: too many for int32
    with pytest.raises(ValueError, match=r"^topk_idx\b"):
        torch_moe.fused_mapping(huge, 8, 1)


_X = torch.zeros(4, 8, dtype=torch.bfloat16)


@pytest.mark.parametrize(
    "kwargs, error, name",
    [
        (dict(x=_X.double()), TypeError, "x"),
        (dict(x=[[0.0]]), TypeError, "x"),
        (dict(x=_X[None]), ValueError, "x"),
        (dict(x=torch.zeros(8, 4, dtype=torch.bfloat16).T), ValueError, "x"),
        (dict(x=torch.zeros(4, 0, dtype=torch.bfloat16)), ValueError, "x"),
        (dict(token_topk_to_pos=_POS.long()), TypeError, "token_topk_to_pos"),
        (dict(token_topk_to_pos=_POS[:3]), ValueError, "token_topk_to_pos"),
        (dict(token_topk_to_pos=torch.zeros(4, 33, dtype=torch.int32)), ValueError, "token_topk_to_pos"),
        (dict(token_topk_to_pos=torch.zeros(2, 4, dtype=torch.int32).T), ValueError, "token_topk_to_pos"),
        (dict(num_expanded_rows=-1), ValueError, "num_expanded_rows"),
        (dict(num_expanded_rows=2**31), ValueError, "num_expanded_rows"),
        (dict(num_expanded_rows=torch.tensor(8)), TypeError, "num_expanded_rows"),
        (dict(x_sf=torch.zeros(4, 2, dtype=torch.float64)), TypeError, "x_sf"),
        (dict(x_sf=torch.zeros(3, 2)), ValueError, "x_sf"),
        (dict(x_sf=torch.zeros(4, 0)), ValueError, "x_sf"),
        (dict(x_sf=torch.zeros(4)), ValueError, "x_sf"),
        (dict(x_sf=torch.zeros(2, 6).T[:4]), ValueError, "x_sf"),  # column-major, rows padded to 6, not 4
        (dict(x_sf=torch.zeros(4, 4)[:, ::2]), ValueError, "x_sf"),
    ],
)
def test_expand_to_fused_rejects(kwargs, error, name):
    args = dict(x=_X, token_topk_to_pos=_POS, num_expanded_rows=8) | kwargs
    with pytest.raises(error, match=rf"^{name}\b"):
        torch_moe.expand_to_fused(**args)


def test_expand_to_fused_accepts_both_sf_layouts_and_keeps_them():
    sf = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    pos = i32([[0], [2], [-1], [1]])
    row_out = torch_moe.expand_to_fused(_X[:, :1].contiguous(), pos, 5, sf)[1]
    col_out = torch_moe.expand_to_fused(_X[:, :1].contiguous(), pos, 5, moe.store_tma_column_major(sf))[1]
    assert row_out.is_contiguous() and col_out.stride() == (1, 8)
    assert torch.equal(row_out, col_out) and row_out[:3].tolist() == [[0, 1, 2], [9, 10, 11], [3, 4, 5]]


@pytest.mark.parametrize(
    "kwargs, error, name",
    [
        (dict(x=_X.half()), TypeError, "x"),
        (dict(x=[[0.0]]), TypeError, "x"),
        (dict(x=_X.reshape(-1)), ValueError, "x"),
        (dict(x=torch.zeros(8, 4, dtype=torch.bfloat16).T), ValueError, "x"),
        (dict(topk_weights=_W.bfloat16()), TypeError, "topk_weights"),
        (dict(topk_weights=torch.ones(4, 33), token_topk_to_pos=torch.zeros(4, 33, dtype=torch.int32)),
         ValueError, "topk_weights"),
        (dict(topk_weights=torch.ones(2, 4).T), ValueError, "topk_weights"),
        (dict(token_topk_to_pos=_POS.long()), TypeError, "token_topk_to_pos"),
        (dict(token_topk_to_pos=_POS[:, :1].contiguous()), ValueError, "token_topk_to_pos"),
        (dict(x_sf=torch.ones(4, 1)), ValueError, "x_sf"),  # a bf16 x takes no sf
        (dict(x=_X.to(torch.float8_e4m3fn)), ValueError, "x_sf"),  # e4m3 x needs one
        (dict(x=_X.to(torch.float8_e4m3fn), x_sf=torch.ones(4, 1, dtype=torch.bfloat16)), TypeError, "x_sf"),
        (dict(x=_X.to(torch.float8_e4m3fn), x_sf=torch.ones(4, 2)), ValueError, "x_sf"),
        (dict(x=_X.to(torch.float8_e4m3fn), x_sf=torch.ones(4)), ValueError, "x_sf"),
        (dict(x=_X.to(torch.float8_e4m3fn), x_sf=torch.ones(8, 1)[::2]), ValueError, "x_sf"),
    ],
)
def test_reduce_fused_rejects(kwargs, error, name):
    args = dict(x=_X, topk_weights=_W, token_topk_to_pos=_POS) | kwargs
    with pytest.raises(error, match=rf"^{name}\b"):
        torch_moe.reduce_fused(**args)


@pytest.mark.parametrize(
    "w, error",
    [
        (_W.double(), TypeError),
        (_W.numpy(), TypeError),
        (_W.reshape(-1), ValueError),
        (torch.ones(4, 0), ValueError),
        (torch.ones(4, 33), ValueError),
        (torch.ones(2, 4).T, ValueError),
    ],
)
def test_normalize_weight_rejects(w, error):
    with pytest.raises(error, match=r"^topk_weights\b"):
        torch_moe.normalize_weight(w)


def _snapshot(tensors: dict) -> dict:
    return {k: v.clone() for k, v in tensors.items()}


def _unchanged(before: dict, after: dict) -> bool:
    return all(torch.equal(before[k].contiguous().view(torch.uint8), after[k].contiguous().view(torch.uint8))
               for k in before)


def test_no_function_writes_into_its_inputs():
    # None takes an output buffer; neither may it scribble on what it reads.
    idx = i64([[1, 0], [1, -1], [0, 1]])
    p2t, p2tk, tk2p, start, end, n = torch_moe.fused_mapping(idx, 3, 4)
    x = torch.randn(3, 5).bfloat16()
    w = torch.rand(3, 2)
    sf = moe.store_tma_column_major(torch.rand(3, 2))
    calls = [
        (torch_moe.group_count, dict(idx=idx, num_groups=3)),
        (torch_moe.fused_mapping, dict(topk_idx=idx, num_experts=3, alignment=4)),
        (torch_moe.expand_to_fused, dict(x=x, token_topk_to_pos=tk2p, num_expanded_rows=n, x_sf=sf)),
        (torch_moe.reduce_fused, dict(x=torch.randn(n, 5).bfloat16(), topk_weights=w, token_topk_to_pos=tk2p)),
        (torch_moe.normalize_weight, dict(topk_weights=w)),
    ]
    for fn, kwargs in calls:
        tensors = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
        before = _snapshot(tensors)
        fn(**kwargs)
        assert _unchanged(before, tensors), fn.__name__
        assert sf.stride() == (1, 4)


def test_bad_arguments_leave_the_inputs_alone():
    x, pos = torch.randn(4, 8).bfloat16(), _POS.clone()
    before = _snapshot({"x": x, "pos": pos})
    with pytest.raises(ValueError):
        torch_moe.expand_to_fused(x, pos, 8, torch.zeros(3, 2))
    with pytest.raises(ValueError):
        torch_moe.fused_mapping(torch.tensor([[0, 9]]), 8, 1)
    assert _unchanged(before, {"x": x, "pos": pos})


def test_positions_past_n_are_skipped_by_expand_and_reduce():
    x = torch.tensor([[1.0], [2.0]], dtype=torch.bfloat16)
    pos = i32([[0, 5], [1, 2]])  # 5 and 2 are not rows of a 2-row layout
    assert torch_moe.expand_to_fused(x, pos, 2).tolist() == [[1.0], [2.0]]
    out = torch_moe.reduce_fused(torch.tensor([[3.0], [4.0]]), torch.tensor([[1.0, NAN], [0.5, NAN]]), pos)
    assert out.tolist() == [[3.0], [2.0]]


def test_normalize_weight_keeps_the_fp32_constant():
    denom, weights = torch_moe.normalize_weight(torch.zeros(2, 3))
    assert denom.tolist() == [float(np.float32(1e-20))] * 2 and weights.abs().sum() == 0


# -- regressions --------------------------------------------------------------------------


def test_expand_with_sf_case_keeps_its_sf_layout_through_a_case_file(tmp_path):
    """A case's tensors lose their strides on the way to the device (Case.to copies them) and
    into a case file, where a column-major x_sf would become a dense column-major tensor without
    the TMA padding, which the implementation rejects.  So the layout travels as the parameter
    sf_layout, and the spec lays x_sf out just before the call."""
    from tkverify.case import Case, load_case, save_case
    from tkverify.check import VerificationError, check_case
    from tkverify.registry import Impl, get
    from tkverify.specs.moe import WithSfLayout

    spec = get("moe.expand_to_fused_with_sf")
    case = Case(params={"num_expanded_rows": 5, "sf_layout": "tma_column_major"},
                inputs={"x": torch.arange(6, dtype=torch.uint8).reshape(3, 2), "token_topk_to_pos": i32([[3], [0], [1]]),
                        "x_sf": torch.arange(6, dtype=torch.float32).reshape(3, 2)})
    loaded, _ = load_case(save_case(tmp_path / "case", case, op=spec.name, impl="torch"))
    assert loaded.params["sf_layout"] == "tma_column_major" and loaded.inputs["x_sf"].is_contiguous()
    check_case(spec, spec.impls["torch"], loaded, case_dir=None)

    def row_major_sf(**kwargs):
        out, sf = torch_moe.expand_to_fused(**kwargs)
        return out, sf.contiguous()

    with pytest.raises(VerificationError, match="TMA-aligned column-major output needs strides"):
        check_case(spec, Impl("row_major_sf", WithSfLayout(row_major_sf), device="cpu"), loaded, case_dir=None)


def test_one_token_corner_keeps_the_first_token_for_each_configuration():
    routing = sm.routing
    positions = np.arange(12, dtype=np.int32).reshape(4, 3)
    seen = set()
    for i in range(300):
        out, hidden, dtype = routing.one_token_corner((i,), positions, 12, 200, torch.bfloat16)
        if out.shape[0] == 4:  # left as drawn
            assert (out == positions).all() and (hidden, dtype) == (200, torch.bfloat16)
            continue
        assert out.shape == (1, 3) and int((out < 0).sum()) <= 1
        assert set(out[0][out[0] >= 0].tolist()) <= set(positions[0].tolist())
        seen.add((dtype, hidden % 16 == 0, bool((out < 0).any())))
    assert len(seen) == len(sm.REDUCE_DTYPES) * 2 * 2  # every dtype, vector width and dropped slot
    # an H that would take N rows past MAX_ROUTED_ELEMENTS is left as drawn
    many_rows = sm.MAX_ROUTED_ELEMENTS
    assert {routing.one_token_corner((i,), positions, many_rows, 1, torch.float32)[1] for i in range(100)} == {1}
