"""The grouped MoE routing helpers and aux_fi on the CPU: the oracles by hand, the eager implementations against
them through the specs, a wrong implementation caught, their argument checks, the TileLang wrappers'
refusal of CPU tensors, the strategies' classes and the tile_kernels mapping's refusals."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings

import references.moe_groups as ref
from kernels.moe import groups as tilelang_groups
from kernels.torch import moe_groups as impl
from strategies import moe_groups as strat
from tkverify import registry
from tkverify.adapters import tile_kernels_moe_groups as adapter
from tkverify.case import Case
from tkverify.check import VerificationError, check_case
from tkverify.registry import Unsupported, torch_impl

GROUP_IDX, UNIQUE = registry.get("moe.topk_sum_and_topk_group_idx"), registry.get("moe.unique_group_indices")
AUX_FI = registry.get("moe.aux_fi")
fuzz = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
NAN, INF = float("nan"), float("inf")


def scores(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


# -- the oracles, by hand -------------------------------------------------------------------


def test_group_idx_by_hand():
    # Token 0: groups (3, 1, 0), (2, 2, -5), (4, -1, -1): top-2 sums 4, 4, 3; top-1 3, 2, 4.
    # Token 1: a NaN in group 2 ranks it first; groups 0 and 1 tie at -inf + ... : (-inf, -inf, 1) sums to
    # 1 + -inf = -inf, (-inf, -inf, -inf) to -inf: a tie, so group 0 before group 1.
    x = scores([[[3, 1, 0], [2, 2, -5], [4, -1, -1]],
                [[-INF, -INF, 1], [-INF, -INF, -INF], [0, NAN, 7]]])
    assert ref.group_scores(x, 2).tolist()[0] == [4, 4, 3]
    assert ref.topk_sum_and_topk_group_idx(x, 2, 3).tolist() == [[0, 1, 2], [2, 0, 1]]
    assert ref.topk_sum_and_topk_group_idx(x, 1, 2).tolist() == [[2, 0], [2, 0]]


def test_group_sum_rounds_to_float32():
    # 1 + 2^-24 is a float32 midpoint and rounds to even: 1.0; so (1, 2^-24) ties with (1, 0), and the lower
    # group wins, where the exact sums would put group 1 first.
    x = scores([[[1.0, 0.0], [1.0, 2.0**-24]]])
    assert ref.group_scores(x, 2).tolist() == [[1.0, 1.0]]
    assert ref.topk_sum_and_topk_group_idx(x, 2, 1).tolist() == [[0]]
    # +inf beside -inf sums to NaN, which ranks above +inf; two float32 maxima overflow to +inf.
    big = float(np.finfo(np.float32).max)
    y = scores([[[INF, INF], [INF, -INF], [big, big], [0.0, -0.0]]])
    assert np.isnan(ref.group_scores(y, 2)[0, 1]) and ref.group_scores(y, 2)[0, 2] == INF
    assert ref.topk_sum_and_topk_group_idx(y, 2, 4).tolist() == [[1, 0, 2, 3]]


def test_signed_zero_groups_tie():
    x = scores([[[-0.0], [0.0], [-0.0]]])
    assert ref.topk_sum_and_topk_group_idx(x, 1, 3).tolist() == [[0, 1, 2]]


def test_unique_by_hand():
    idx = torch.tensor([[3, 1, 3, -1, 1, 0], [2, 2, 2, 2, 2, 2], [-1, -1, 5, -1, 5, -2]])
    assert ref.unique_group_indices(idx, 8).tolist() == [[3, 1, -1, -1, -1, 0], [2, -1, -1, -1, -1, -1],
                                                        [-1, -1, 5, -1, -1, -2]]


def test_aux_fi_by_hand():
    # E 4, T 3, K' 2: counts 1, 3, 0, 1 (the -1 counts nowhere); f = c * 4 / 6.
    idx = torch.tensor([[0, 1], [1, -1], [1, 3]])
    assert ref.aux_fi(idx, 4, 2).tolist() == [4 / 6, 2.0, 0.0, 4 / 6]
    # An expert named twice in a row counts twice; out-of-range entries never.
    assert ref.aux_fi(torch.tensor([[2, 2, 7]]), 4, 3).tolist() == [0.0, 0.0, 8 / 3, 0.0]
    assert np.isnan(ref.aux_fi(torch.zeros(0, 2, dtype=torch.int64), 4, 2)).all()


def test_eager_aux_fi_is_correctly_rounded():
    # c E = 5 * 3 = 15 over K' T = 7: 15 / 7 rounded once to float32.
    idx = torch.tensor([[0]] * 5 + [[1]] * 2)
    assert impl.aux_fi(idx, 3, 1)[0].item() == float(np.float32(15 / 7))


def test_empty_batches():
    assert ref.topk_sum_and_topk_group_idx(torch.zeros(0, 4, 8), 2, 3).shape == (0, 3)
    assert ref.unique_group_indices(torch.zeros(0, 8, dtype=torch.int64), 8).shape == (0, 8)
    assert impl.topk_sum_and_topk_group_idx(torch.zeros(0, 4, 8), 2, 3).shape == (0, 3)
    assert impl.unique_group_indices(torch.zeros(0, 8, dtype=torch.int64), 8).shape == (0, 8)


# -- the eager implementations through the specs --------------------------------------------


@fuzz
@given(case=strat.topk_sum_and_topk_group_idx_cases())
def test_eager_group_idx_matches_the_oracle(case):
    check_case(GROUP_IDX, GROUP_IDX.impls["torch"], case, case_dir=None)


@fuzz
@given(case=strat.unique_group_indices_cases())
def test_eager_unique_matches_the_oracle(case):
    check_case(UNIQUE, UNIQUE.impls["torch"], case, case_dir=None)


@fuzz
@given(case=strat.aux_fi_cases())
def test_eager_aux_fi_matches_the_oracle(case):
    check_case(AUX_FI, AUX_FI.impls["torch"], case, case_dir=None)


def test_eager_unique_leaves_its_input_alone():
    idx = torch.tensor([[1, 1, 2]])
    impl.unique_group_indices(idx, 4)
    assert idx.tolist() == [[1, 1, 2]]


def _ties_to_higher_group(scores, num_topk_sum, num_topk_groups):
    """Wrong on purpose: ranks equal group scores to the higher group index first."""
    flipped = impl.topk_sum_and_topk_group_idx(scores.flip(1).contiguous(), num_topk_sum, num_topk_groups)
    return scores.shape[1] - 1 - flipped


def _keeps_repeats(group_indices, num_groups):
    return group_indices.clone()


def _normalised_by_k(topk_idx, num_experts, num_aux_topk):
    """Wrong on purpose: divides by the slots K instead of num_aux_topk."""
    return impl.aux_fi(topk_idx, num_experts, topk_idx.shape[1])


def _four_ulps_short(topk_idx, num_experts, num_aux_topk):
    """Wrong on purpose, by a little: f_i times (1 - 2^-21), 4 to 8 ULPs below, beyond four roundings."""
    return impl.aux_fi(topk_idx, num_experts, num_aux_topk) * (1 - 2.0**-21)


@pytest.mark.parametrize("spec, wrong, case", [
    (AUX_FI, _normalised_by_k, Case({"num_experts": 4, "num_aux_topk": 3},
                                    {"topk_idx": torch.tensor([[0, 1], [2, 1]])})),
    (AUX_FI, _four_ulps_short, Case({"num_experts": 4, "num_aux_topk": 2},
                                        {"topk_idx": torch.tensor([[0, 1], [2, 1]])})),
    (GROUP_IDX, _ties_to_higher_group, Case({"num_topk_sum": 2, "num_topk_groups": 1},
                                            {"scores": scores([[[1, 1], [2, 0]]])})),
    (UNIQUE, _keeps_repeats, Case({"num_groups": 4}, {"group_indices": torch.tensor([[0, 0]])})),
])
def test_a_wrong_implementation_fails(spec, wrong, case):
    with pytest.raises(VerificationError):
        check_case(spec, dataclasses.replace(torch_impl(wrong), name="wrong"), case, case_dir=None, excuse=False)


# -- argument checks --------------------------------------------------------------------------


GOOD_SCORES = torch.zeros(2, 4, 8)
BAD_GROUP_IDX = [
    (dict(scores=GOOD_SCORES.double()), TypeError, "scores"),
    (dict(scores=GOOD_SCORES.tolist()), TypeError, "scores"),
    (dict(scores=torch.zeros(2, 32)), ValueError, "scores"),
    (dict(scores=GOOD_SCORES.transpose(1, 2)), ValueError, "scores"),
    (dict(scores=torch.zeros(2, 33, 1)), ValueError, "scores"),
    (dict(scores=torch.zeros(2, 2, 513)), ValueError, "scores"),
    (dict(scores=torch.zeros(2, 4, 0)), ValueError, "scores"),
    (dict(num_topk_sum=3), ValueError, "num_topk_sum"),
    (dict(num_topk_sum=0), ValueError, "num_topk_sum"),
    (dict(scores=torch.zeros(2, 4, 1), num_topk_sum=2), ValueError, "num_topk_sum"),
    (dict(num_topk_sum=True), TypeError, "num_topk_sum"),
    (dict(num_topk_groups=5), ValueError, "num_topk_groups"),
    (dict(num_topk_groups=0), ValueError, "num_topk_groups"),
    (dict(num_topk_groups=2.0), TypeError, "num_topk_groups"),
]
GOOD_IDX = torch.zeros(2, 8, dtype=torch.int64)
BAD_UNIQUE = [
    (dict(group_indices=GOOD_IDX.int()), TypeError, "group_indices"),
    (dict(group_indices=torch.zeros(8, dtype=torch.int64)), ValueError, "group_indices"),
    (dict(group_indices=torch.zeros(8, 2, dtype=torch.int64).T), ValueError, "group_indices"),
    (dict(group_indices=torch.zeros(2, 33, dtype=torch.int64)), ValueError, "group_indices"),
    (dict(group_indices=torch.zeros(2, 0, dtype=torch.int64)), ValueError, "group_indices"),
    (dict(num_groups=0), ValueError, "num_groups"),
    (dict(num_groups=1025), ValueError, "num_groups"),
    (dict(num_groups=False), TypeError, "num_groups"),
]


@pytest.mark.parametrize("module", [impl, tilelang_groups], ids=["torch", "tilelang"])
@pytest.mark.parametrize("change, error, name", BAD_GROUP_IDX)
def test_group_idx_refuses(module, change, error, name):
    args = {"scores": GOOD_SCORES, "num_topk_sum": 2, "num_topk_groups": 2, **change}
    with pytest.raises(error, match=f"^{name}"):
        module.topk_sum_and_topk_group_idx(**args)


@pytest.mark.parametrize("module", [impl, tilelang_groups], ids=["torch", "tilelang"])
@pytest.mark.parametrize("change, error, name", BAD_UNIQUE)
def test_unique_refuses(module, change, error, name):
    args = {"group_indices": GOOD_IDX, "num_groups": 8, **change}
    with pytest.raises(error, match=f"^{name}"):
        module.unique_group_indices(**args)


GOOD_ROUTING = torch.zeros(2, 8, dtype=torch.int64)
BAD_AUX_FI = [
    (dict(topk_idx=GOOD_ROUTING.int()), TypeError, "topk_idx"),
    (dict(topk_idx=torch.zeros(8, dtype=torch.int64)), ValueError, "topk_idx"),
    (dict(topk_idx=torch.zeros(8, 2, dtype=torch.int64).T), ValueError, "topk_idx"),
    (dict(topk_idx=torch.zeros(2, 33, dtype=torch.int64)), ValueError, "topk_idx"),
    (dict(num_experts=0), ValueError, "num_experts"),
    (dict(num_experts=1025), ValueError, "num_experts"),
    (dict(num_aux_topk=0), ValueError, "num_aux_topk"),
    (dict(num_aux_topk=1.0), TypeError, "num_aux_topk"),
]


@pytest.mark.parametrize("module", [impl, tilelang_groups], ids=["torch", "tilelang"])
@pytest.mark.parametrize("change, error, name", BAD_AUX_FI)
def test_aux_fi_refuses(module, change, error, name):
    args = {"topk_idx": GOOD_ROUTING, "num_experts": 8, "num_aux_topk": 8, **change}
    with pytest.raises(error, match=f"^{name}"):
        module.aux_fi(**args)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal of CPU tensors")
def test_tilelang_wrappers_refuse_cpu_tensors():
    with pytest.raises(ValueError, match="^scores.*CUDA"):
        tilelang_groups.topk_sum_and_topk_group_idx(GOOD_SCORES, 2, 2)
    with pytest.raises(ValueError, match="^group_indices.*CUDA"):
        tilelang_groups.unique_group_indices(GOOD_IDX, 8)
    with pytest.raises(ValueError, match="^topk_idx.*CUDA"):
        tilelang_groups.aux_fi(GOOD_ROUTING, 8, 8)


# -- strategies and the tile_kernels mapping ------------------------------------------------------


def test_bias_tie_creates_ties():
    # One expert, two tokens scoring 0.25 and 0.5: a bias of 2^23 or more (float32 spacing >= 1) rounds both
    # onto 2^e, a tie; a zero bias (a quarter of the experts) leaves them apart.
    results = set()
    for seed in range(8):
        block = np.array([[[0.25]], [[0.5]]], dtype=np.float32)
        strat._bias_tie(np.random.default_rng(seed), block, 1)
        assert block[0, 0, 0] == block[1, 0, 0] or block.ravel().tolist() == [0.25, 0.5]
        results.add(bool(block[0, 0, 0] == block[1, 0, 0]))
    assert True in results


def test_classes_are_true_of_the_case():
    tie = Case({"num_topk_sum": 1, "num_topk_groups": 2}, {"scores": scores([[[1.0], [1.0]]])})
    assert {"tie_across_groups", "k_all", "sum_of_1"} <= strat.group_classes(tie)
    apart = Case({"num_topk_sum": 1, "num_topk_groups": 1}, {"scores": scores([[[1.0], [-INF]]])})
    assert "tie_across_groups" not in strat.group_classes(apart) and "empty_group" in strat.group_classes(apart)
    repeat = Case({"num_groups": 2}, {"group_indices": torch.tensor([[1, 1]])})
    assert {"repeated_group", "one_group_row", "k_equals_groups"} <= strat.unique_classes(repeat)


def test_adapter_names_the_release_that_lacks_each_op():
    assert set(adapter.FORWARD) == {GROUP_IDX.name, UNIQUE.name, AUX_FI.name}
    assert set(adapter.MISSING[2]) == set(adapter.FORWARD) and not adapter.MISSING[1]


def test_adapter_refuses_more_groups_than_tile_kernels_takes(monkeypatch):
    monkeypatch.setattr(adapter, "_gen", lambda: 1)
    with pytest.raises(Unsupported, match="num_groups <= 128"):
        adapter.unique_group_indices(GOOD_IDX, 129)
    monkeypatch.setattr(adapter, "_gen", lambda: 2)
    with pytest.raises(Unsupported, match="lacks moe.unique_group_indices"):
        adapter.unique_group_indices(GOOD_IDX, 8)
