"""tile-kernels 1.0's grouped gate and its tensor-parallel masking on the CPU: the oracles by hand, the gate's
admissibility judge, the eager implementations against the oracles through the specs, wrong implementations
caught, the argument checks, the TileLang wrappers' refusal of CPU tensors, the strategies' classes and the
tile_kernels mapping."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings

import references.moe_tp as ref
from kernels.moe import tp as tilelang_tp
from kernels.torch import moe_tp as impl
from strategies import moe_tp as strat
from tkverify import registry
from tkverify.adapters import tile_kernels_moe_tp as adapter
from tkverify.case import Case
from tkverify.check import VerificationError, check_case
from tkverify.registry import Unsupported, torch_impl
from tkverify.specs import moe_tp as spec

GATE, MASK = registry.get("moe.top2_sum_gate"), registry.get("moe.mask_indices_by_tp")
fuzz = settings(max_examples=80, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
NAN, INF = float("nan"), float("inf")


def f32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def gate_case(logits, bias, num_topk, num_topk_groups, num_groups, scale=1.0, func="sigmoid", mask=None) -> Case:
    inputs = {"logits": f32(logits), "bias": f32(bias)}
    if mask is not None:
        inputs["mask"] = torch.tensor(mask, dtype=torch.bool)
    return Case({"num_topk": num_topk, "num_topk_groups": num_topk_groups, "num_groups": num_groups,
                 "routed_scaling_factor": scale, "scoring_func": func}, inputs)


def oracle(case: Case):
    return ref.top2_sum_gate(**case.inputs, **case.params)


# -- the oracles, by hand -------------------------------------------------------------------------


def test_mask_indices_by_tp_by_hand():
    # n = 16 on 4 EP ranks (4 experts each), 2 TP ranks: rank r = 2 d + t.  tp_rank 1 keeps ranks 1 and 3, i.e.
    # experts 4..7 (d = 0: 0..3) and 12..15 (d = 1: 4..7); negative entries and the other ranks' experts are -1.
    idx = np.array([[0, 3, 4, 7, 8, 11, 12, 15, -1, -5]])
    assert ref.mask_indices_by_tp(idx, 16, 4, 1, 2).tolist() == [[-1, -1, 0, 3, -1, -1, 4, 7, -1, -1]]
    assert ref.mask_indices_by_tp(idx, 16, 4, 0, 2).tolist() == [[0, 3, -1, -1, 4, 7, -1, -1, -1, -1]]
    # One TP rank keeps every expert as it is.
    assert ref.mask_indices_by_tp(idx, 16, 4, 0, 1).tolist() == [[0, 3, 4, 7, 8, 11, 12, 15, -1, -1]]


def test_gate_by_hand():
    # sigmoid(0) = 1/2, sigmoid(+-ln 3) = 3/4 and 1/4: both groups' top-2 sums are 1 (to float32 accuracy);
    # with no bias the lower group wins and its two equal experts come lower index first, each weighing
    # scale * 0.5 / 1.  A bias of 0.25 on expert 2 lifts group 1 (1.25): experts 2 (key 1) and 3.
    ln3 = math.log(3.0)
    flat = gate_case([[0.0, 0.0, ln3, -ln3]], [0, 0, 0, 0], 2, 1, 2, scale=2.5)
    idx, w = oracle(flat)
    assert idx.tolist() == [[0, 1]] and np.allclose(w, [[1.25, 1.25]], rtol=1e-12)
    biased = gate_case([[0.0, 0.0, ln3, -ln3]], [0, 0, 0.25, 0], 2, 1, 2, scale=2.5)
    idx, w = oracle(biased)
    # Weights use the unbiased scores: 0.75 / (0.75 + 0.25) and 0.25 / 1, times 2.5.
    assert idx.tolist() == [[2, 3]] and np.allclose(w, [[1.875, 0.625]], rtol=1e-6)


def test_gate_scoring_functions_by_hand():
    # softmax of four zeros is 1/4 each; sqrt(softplus(0)) = sqrt(ln 2); the weights of two equal scores are 1/2.
    assert np.allclose(ref.gate_scores(np.zeros((1, 4)), "softmax"), 0.25)
    assert np.allclose(ref.gate_scores(np.zeros((1, 1)), "sqrtsoftplus"), math.sqrt(math.log(2.0)))
    idx, w = oracle(gate_case([[0.0, 0.0, 0.0, 0.0]], [0, 0, 0, 0], 2, 2, 2, func="softmax"))
    assert idx.tolist() == [[0, 1]] and np.allclose(w, 0.5)
    # softmax ranks by probability + bias: the logit 1 (probability e / (e + 3)) beats three zeros.
    idx, _ = oracle(gate_case([[0.0, 1.0, 0.0, 0.0]], [0, 0, 0, 0], 1, 1, 1, func="softmax"))
    assert idx.tolist() == [[1]]


def test_gate_non_finite_and_masked_by_hand():
    # A NaN logit makes a NaN key, which ranks first, and a NaN denominator: every weight of its row is NaN.
    idx, w = oracle(gate_case([[0.0, NAN, 1.0, 2.0]], [0, 0, 0, 0], 2, 2, 2))
    assert idx.tolist() == [[1, 3]] and np.isnan(w).all()
    # Masked experts (bias -inf) come last, by index; k reaching them still weighs their scores.
    idx, w = oracle(gate_case([[0.0, 0.0, 0.0, 0.0]], [-INF, 0, -INF, -INF], 3, 2, 2))
    assert idx.tolist() == [[1, 0, 2]] and np.allclose(w, 1 / 3)
    # An empty group (every bias -inf) scores -inf and loses to any other.
    idx, _ = oracle(gate_case([[5.0, 5.0, 0.0, 0.0]], [-INF, -INF, 0, 0], 1, 1, 2))
    assert idx.tolist() == [[2]]


def test_gate_unrouted_tokens_and_empty_batch():
    idx, w = oracle(gate_case([[0.0, 1.0], [1.0, 0.0]], [0, 0], 1, 1, 1, mask=[True, False]))
    assert idx.tolist() == [[1], [-1]] and w[1].tolist() == [0.0]
    idx, w = oracle(gate_case(np.zeros((0, 4)), [0, 0, 0, 0], 2, 1, 2, func="softmax"))
    assert idx.shape == (0, 2) and w.shape == (0, 2)
    t_idx, t_w = impl.top2_sum_gate(torch.zeros(0, 4), torch.zeros(4), 2, 1, 2, 1.0, "softmax")
    assert t_idx.shape == (0, 2) and t_idx.dtype == torch.int64 and t_w.dtype == torch.float32


# -- the gate's judge: rows every fp32 implementation may give -------------------------------------


def test_keys_that_round_together_admit_either_order():
    # sigmoid(30) and sigmoid(60) both round to 1.0 in float32: the exact keys put expert 1 first, an fp32
    # implementation sees a tie and puts expert 0 first.  Both rows are admissible; a far smaller key first is not.
    case = gate_case([[30.0, 60.0, 0.0]], [0, 0, 0], 2, 1, 1)
    assert oracle(case)[0].tolist() == [[1, 0]]
    a = spec.GateAnalysis(case)
    assert a.admissible(0, np.array([0, 1])) and a.admissible(0, np.array([1, 0]))
    assert not a.admissible(0, np.array([2, 0])) and not a.admissible(0, np.array([0, 0]))


def test_identical_inputs_fix_the_lower_index_first():
    case = gate_case([[0.5, 0.5, 0.5, 0.5]], [0.1, 0.1, 0.1, 0.1], 2, 1, 2)
    a = spec.GateAnalysis(case)
    assert a.admissible(0, np.array([0, 1]))
    assert not a.admissible(0, np.array([1, 0])), "identical experts: the lower index first"
    assert not a.admissible(0, np.array([2, 3])), "identical groups: the lower group first"


def test_weights_bracket_follows_the_chosen_experts():
    # Keys 0.5 + 0.5 (expert 0) and sigmoid(30) + 0 = 1 - 9e-14 (expert 1) are equal to fp32 accuracy, so either
    # may come first; the weights are judged for the order given: scale * (1, 0.5) / 1.5 for [1, 0].
    case = gate_case([[0.0, 30.0, 0.0]], [0.5, 0, 0], 2, 1, 1, scale=3.0)
    assert oracle(case)[0].tolist() == [[0, 1]]
    got = {"topk_idx": torch.tensor([[1, 0]]), "topk_weights": torch.tensor([[2.0, 1.0]])}
    expected = spec.given_gate(case, got)
    assert expected["topk_idx"].tolist() == [[1, 0]]
    b = expected["topk_weights"]
    assert np.allclose(b.exact, [[2.0, 1.0]], rtol=1e-12)
    assert (b.low < b.exact).all() and (b.exact < b.high).all() and ((b.high - b.low) / b.exact < 2.0**-15).all()


# -- the eager implementations against the oracles ------------------------------------------------


@fuzz
@given(case=strat.top2_sum_gate_cases())
def test_eager_gate_matches_the_oracle(case):
    check_case(GATE, GATE.impls["torch"], case, case_dir=None)


@fuzz
@given(case=strat.mask_indices_by_tp_cases())
def test_eager_mask_matches_the_oracle(case):
    check_case(MASK, MASK.impls["torch"], case, case_dir=None)


def _ties_to_higher_index(logits, bias, num_topk, num_topk_groups, num_groups, routed_scaling_factor,
                          scoring_func, mask=None):
    idx, w = impl.top2_sum_gate(logits.flip(1), bias.flip(0), num_topk, num_topk_groups, num_groups,
                                routed_scaling_factor, scoring_func, mask)
    return logits.shape[1] - 1 - idx, w


def _groups_by_top1(logits, bias, num_topk, num_topk_groups, num_groups, routed_scaling_factor, scoring_func,
                    mask=None):
    """Ranks groups by their best key instead of the sum of their two best."""
    num_tokens, num_experts = logits.shape
    keys = impl._gate_scores(logits, scoring_func) + bias
    best = keys.view(num_tokens, num_groups, -1).amax(dim=2).argsort(dim=1, descending=True, stable=True)
    allowed = torch.zeros(num_tokens, num_groups, dtype=torch.bool).scatter_(1, best[:, :num_topk_groups], True)
    keys = torch.where(allowed.repeat_interleave(num_experts // num_groups, 1), keys, -torch.inf)
    idx = keys.argsort(dim=1, descending=True, stable=True)[:, :num_topk]
    s = impl._gate_scores(logits, scoring_func).gather(1, idx)
    return idx, s / (s.sum(1, keepdim=True) + 1e-20) * routed_scaling_factor


def _unnormalised(*args, **kwargs):
    idx, w = impl.top2_sum_gate(*args, **kwargs)
    return idx, w * 1.001


def _next_tp_rank(indices, n, num_ep_ranks, tp_rank, num_tp_ranks):
    return impl.mask_indices_by_tp(indices, n, num_ep_ranks, (tp_rank + 1) % num_tp_ranks, num_tp_ranks)


@pytest.mark.parametrize("spec_, wrong, case", [
    (GATE, _ties_to_higher_index, gate_case([[0.5, 0.5, 0.0, 0.0]], [0, 0, 0, 0], 1, 1, 2)),
    # Group 0 holds the best key (3) beside a poor one; group 1 two good ones: top-2 sums pick group 1.
    (GATE, _groups_by_top1, gate_case([[3.0, -3.0, 1.5, 1.5]], [0, 0, 0, 0], 1, 1, 2)),
    (GATE, _unnormalised, gate_case([[0.0, 1.0, 2.0, 3.0]], [0, 0, 0, 0], 2, 1, 2)),
    (MASK, _next_tp_rank, Case({"n": 8, "num_ep_ranks": 4, "tp_rank": 0, "num_tp_ranks": 2},
                               {"indices": torch.tensor([[0, 2, 5, 7]])})),
])
def test_a_wrong_implementation_fails(spec_, wrong, case):
    with pytest.raises(VerificationError):
        check_case(spec_, dataclasses.replace(torch_impl(wrong), name="wrong"), case, case_dir=None, excuse=False)


# -- argument checks --------------------------------------------------------------------------------


GOOD_GATE = {"logits": torch.zeros(2, 16), "bias": torch.zeros(16), "num_topk": 4, "num_topk_groups": 2,
             "num_groups": 4, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid"}
BAD_GATE = [
    (dict(logits=torch.zeros(2, 16, dtype=torch.float64)), TypeError, "logits"),
    (dict(logits=torch.zeros(2, 16).tolist()), TypeError, "logits"),
    (dict(logits=torch.zeros(16)), ValueError, "logits"),
    (dict(logits=torch.zeros(16, 2).T), ValueError, "logits"),
    (dict(logits=torch.zeros(2, 2048), bias=torch.zeros(2048)), ValueError, "logits"),
    (dict(bias=torch.zeros(15)), ValueError, "bias"),
    (dict(bias=torch.zeros(16, dtype=torch.bfloat16)), TypeError, "bias"),
    (dict(num_groups=3), ValueError, "num_groups"),
    (dict(num_groups=0), ValueError, "num_groups"),
    (dict(num_groups=4.0), TypeError, "num_groups"),
    (dict(num_topk_groups=5), ValueError, "num_topk_groups"),
    (dict(num_topk_groups=0), ValueError, "num_topk_groups"),
    (dict(num_groups=16, num_topk_groups=8), ValueError, "num_topk_groups"),
    (dict(num_topk=9), ValueError, "num_topk"),
    (dict(num_topk=0), ValueError, "num_topk"),
    (dict(num_topk=True), TypeError, "num_topk"),
    (dict(routed_scaling_factor=0.0), ValueError, "routed_scaling_factor"),
    (dict(routed_scaling_factor=INF), ValueError, "routed_scaling_factor"),
    (dict(routed_scaling_factor="2"), TypeError, "routed_scaling_factor"),
    (dict(scoring_func="identity"), ValueError, "scoring_func"),
    (dict(mask=torch.ones(3, dtype=torch.bool)), ValueError, "mask"),
    (dict(mask=torch.ones(2)), TypeError, "mask"),
]


@pytest.mark.parametrize("module", [impl, tilelang_tp], ids=["torch", "tilelang"])
@pytest.mark.parametrize("change, error, name", BAD_GATE)
def test_gate_refuses(module, change, error, name):
    with pytest.raises(error, match=f"^{name}"):
        module.top2_sum_gate(**{**GOOD_GATE, **change})


GOOD_MASK = {"indices": torch.zeros(2, 8, dtype=torch.int64), "n": 16, "num_ep_ranks": 4, "tp_rank": 1,
             "num_tp_ranks": 2}
BAD_MASK = [
    (dict(indices=torch.zeros(2, 8, dtype=torch.int32)), TypeError, "indices"),
    (dict(indices=torch.zeros(8, dtype=torch.int64)), ValueError, "indices"),
    (dict(indices=torch.zeros(8, 2, dtype=torch.int64).T), ValueError, "indices"),
    (dict(indices=torch.zeros(2, 33, dtype=torch.int64)), ValueError, "indices"),
    (dict(n=0), ValueError, "n"),
    (dict(n=2**31), ValueError, "n"),
    (dict(n=16.0), TypeError, "n"),
    (dict(num_ep_ranks=3), ValueError, "num_ep_ranks"),
    (dict(num_ep_ranks=32), ValueError, "num_ep_ranks"),
    (dict(num_tp_ranks=3), ValueError, "num_tp_ranks"),
    (dict(num_tp_ranks=8), ValueError, "num_tp_ranks"),
    (dict(tp_rank=2), ValueError, "tp_rank"),
    (dict(tp_rank=-1), ValueError, "tp_rank"),
    (dict(tp_rank=False), TypeError, "tp_rank"),
]


@pytest.mark.parametrize("module", [impl, tilelang_tp], ids=["torch", "tilelang"])
@pytest.mark.parametrize("change, error, name", BAD_MASK)
def test_mask_refuses(module, change, error, name):
    with pytest.raises(error, match=f"^{name}"):
        module.mask_indices_by_tp(**{**GOOD_MASK, **change})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal of CPU tensors")
def test_tilelang_wrappers_refuse_cpu_tensors():
    with pytest.raises(ValueError, match="^logits.*CUDA"):
        tilelang_tp.top2_sum_gate(**GOOD_GATE)
    with pytest.raises(ValueError, match="^indices.*CUDA"):
        tilelang_tp.mask_indices_by_tp(**GOOD_MASK)


def test_eager_mask_leaves_its_input_alone():
    idx = torch.tensor([[0, 5, -1, 15]])
    before = idx.clone()
    impl.mask_indices_by_tp(idx, 16, 4, 1, 2)
    assert torch.equal(idx, before)


# -- strategies and the tile_kernels mapping --------------------------------------------------------


def test_classes_are_true_of_the_case():
    tie = gate_case([[0.5, 0.5, 0.5, 0.5]], [0.0, 0.0, 0.0, 0.0], 1, 1, 2, func="softmax", mask=[False])
    assert {"expert_tie", "group_tie", "softmax", "k_one", "unrouted_token"} <= strat.gate_classes(tie)
    masked = gate_case([[40.0, 0.0, 1.0, 2.0]], [0.0, -INF, -INF, -INF], 2, 2, 2)
    found = strat.gate_classes(masked)
    assert {"masked_expert", "empty_group", "k_reaches_masked", "saturated", "no_grouping"} <= found
    assert "expert_tie" not in found and "group_tie" not in found
    layout = {"n": 8, "num_ep_ranks": 4, "tp_rank": 1, "num_tp_ranks": 2}
    boundary = Case(layout, {"indices": torch.tensor([[2, 3, -1, -7]])})
    assert {"rank_boundary", "kept_expert", "dropped_slot", "other_negative", "last_tp_rank"} <= \
        strat.tp_classes(boundary)


def test_adapter_names_the_release_that_lacks_each_op():
    assert set(adapter.FORWARD) == {GATE.name, MASK.name}
    assert set(adapter.MISSING[2]) == {GATE.name} and not adapter.MISSING[1]
    assert adapter.MASK_INDICES_BY_TP_MODULE == {1: "moe", 2: "torch"}


def test_adapter_refuses_what_would_trip_a_device_assert(monkeypatch):
    monkeypatch.setattr(adapter, "_gen", lambda: 1)
    monkeypatch.setattr(adapter, "_tk", lambda name: pytest.fail("tile-kernels must not be called"))
    with pytest.raises(Unsupported, match="NaN or infinite logit"):
        adapter.top2_sum_gate(**{**GOOD_GATE, "logits": torch.full((2, 16), NAN)})
    few = torch.zeros(16)
    few[4:] = -INF  # group 0 alone holds finite biases: any 2 groups hold at most 4 < 5
    with pytest.raises(Unsupported, match="finite biases"):
        adapter.top2_sum_gate(**{**GOOD_GATE, "bias": few, "num_topk": 5})
    assert not adapter.too_few_finite_biases(few, 4, 4, 4)
    one_each = torch.tensor([0, -INF, 0, -INF, 0, -INF, 0, -INF])  # every group key is -inf: none to rank
    assert adapter.too_few_finite_biases(one_each, 2, 2, 4) and not adapter.too_few_finite_biases(one_each, 2, 4, 4)
    monkeypatch.setattr(adapter, "_gen", lambda: 2)
    with pytest.raises(Unsupported, match="lacks moe.top2_sum_gate"):
        adapter.top2_sum_gate(**GOOD_GATE)
