"""moe.topk_gate_scored on the CPU: the oracle by hand, its hand-derived backward against autograd and gradcheck,
the eager implementation (forward and backward) against the oracle through the spec, wrong implementations
caught, the argument checks, the TileLang wrappers' refusal of CPU tensors (after the argument checks), the
TileLang backward's 16-byte stores in its lowered source, the strategy's classes and the tile_kernels mapping."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings

import references.moe_gate as ref
from kernels.moe import gate_scored as tilelang_gate
from kernels.torch import moe_gate as impl
from strategies import moe_gate as strat
from tkverify import gradients, registry
from tkverify.adapters import tile_kernels_moe_gate as adapter
from tkverify.case import Case
from tkverify.check import VerificationError, check_case
from tkverify.registry import Unsupported, torch_impl

SPEC = registry.get("moe.topk_gate_scored")
fuzz = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
NAN, INF = float("nan"), float("inf")


def f32(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def case_of(logits, bias, k, scaling=1.0) -> Case:
    return Case({"k": k, "routed_scaling_factor": scaling}, {"logits": f32(logits), "bias": f32(bias)})


# -- the oracle, by hand ------------------------------------------------------------------------


def test_scores_by_hand():
    u = ref.sqrt_softplus(np.array([0.0, -INF, INF, NAN, math.log(math.e - 1), 30.0]))
    assert u[0] == pytest.approx(math.sqrt(math.log(2)), rel=1e-15)
    assert u[1] == 0 and u[2] == INF and np.isnan(u[3])
    assert u[4] == pytest.approx(1.0, rel=1e-15)  # softplus(log(e - 1)) = log(e) = 1
    assert u[5] == pytest.approx(math.sqrt(30 + math.log1p(math.exp(-30))), rel=1e-15)


def test_gate_by_hand():
    # Logits log(e^(s^2) - 1) score exactly s: scores 1, 2, 3, 2; the bias lifts expert 0 by 1.5 -> keys
    # 2.5, 2, 3, 2: picks 2 then 0; weights 2 * (3, 1) / 4.
    logits = [[math.log(math.expm1(s * s)) for s in (1.0, 2.0, 3.0, 2.0)]]
    idx, weights, scores = ref.topk_gate_scored(np.array(logits), np.array([1.5, 0, 0, 0]), 2, 2.0)
    assert np.allclose(scores, [[1, 2, 3, 2]], rtol=1e-14)
    assert idx.tolist() == [[2, 0]]
    assert np.allclose(weights, [[1.5, 0.5]], rtol=1e-14)
    # k = 3 reaches the tie of experts 1 and 3 (key 2): the lower index wins.
    idx3, _, _ = ref.topk_gate_scored(np.array(logits), np.array([1.5, 0, 0, 0]), 3, 2.0)
    assert idx3.tolist() == [[2, 0, 1]]


def test_masked_expert_and_nan_key():
    # Expert 0 masked by a -inf bias: picked last.  With a +inf logit its key is inf + -inf = NaN: picked first.
    idx, weights, _ = ref.topk_gate_scored(np.array([[5.0, 1.0, 0.0], [INF, 1.0, 0.0]]), np.array([-INF, 0, 0]), 3, 1.0)
    assert idx.tolist() == [[1, 2, 0], [0, 1, 2]]
    assert np.isnan(weights[1, 0]) and weights[1, 1] == 0 and weights[1, 2] == 0


def test_bias_makes_a_float32_tie():
    # Scores 0.5 and 0.75 differ, but float32 numbers are 2 apart at 2^24: both keys round to 2^24, a tie the
    # bias makes, and index 0 wins; without the bias expert 1 does.
    scores = f32([[0.5, 0.75]])
    assert ref.selection_given_scores(scores, f32([2.0**24, 2.0**24]), 1).tolist() == [[0]]
    assert ref.selection_given_scores(scores, f32([0.0, 0.0]), 1).tolist() == [[1]]


def test_empty_batch():
    idx, weights, scores = ref.topk_gate_scored(np.zeros((0, 5)), np.zeros(5), 2, 1.0)
    assert idx.shape == (0, 2) and weights.shape == (0, 2) and scores.shape == (0, 5)
    i, w, s = impl.topk_gate_scored(torch.zeros(0, 5), torch.zeros(5), 2, 1.0)
    assert i.shape == (0, 2) and w.shape == (0, 2) and s.shape == (0, 5)


# -- the backward -------------------------------------------------------------------------------


def test_backward_matches_autograd_in_float64():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 16, dtype=torch.float64, generator=g).requires_grad_(True)
    bias = 0.1 * torch.randn(16, dtype=torch.float64, generator=g)
    cot = torch.randn(6, 4, dtype=torch.float64, generator=g)
    idx, _, _ = ref.topk_gate_scored(x.detach(), bias, 4, 2.5)
    u = torch.sqrt(torch.nn.functional.softplus(x)).gather(1, torch.from_numpy(idx))
    (2.5 * u / (u.sum(1, keepdim=True) + 1e-20) * cot).sum().backward()
    hand = ref.topk_gate_scored_bwd(cot, x.detach(), bias, 4, 2.5)
    assert np.abs(hand - x.grad.numpy()).max() <= 1e-14 * np.abs(hand).max()
    assert (hand[x.grad.numpy() == 0] == 0).all()


def test_derivative_from_the_score_matches_sigmoid():
    x = torch.tensor([-60.0, -38.682, -10.0, -1.0, 0.0, 3.0, 25.0], dtype=torch.float32)
    u = impl._sqrt_softplus(x)
    exact = ref.sqrt_softplus_derivative(x.double())
    assert (exact > 0).all()
    assert np.allclose(impl._sqrt_softplus_derivative_from_score(u).double().numpy(), exact, rtol=1e-5, atol=0)


@pytest.mark.parametrize("x", [-700.0, -80.0, -38.68199920654297, -37.0, -20.0, -1e-3, 0.0, 2.0, 40.0, 700.0])
def test_regression_the_oracles_derivative_keeps_its_digits_for_very_negative_logits(x):
    """sigmoid(x) / (2 sqrt(softplus(x))), with sigmoid and softplus of a negative x written as e^x / (1 + e^x)
    and log1p(e^x) (no cancellation there).  The oracle once took sigmoid as 0.5 (1 + tanh(x / 2)), which
    is 0 below about -37: the GPU test of the TileLang backward found it on a selected logit of -38.68 (its
    kernel and the eager backward right, -3.6e-28; the oracle -0)."""
    if x <= 0:
        e = math.exp(x)
        sigmoid, softplus = e / (1.0 + e), math.log1p(e)
    else:
        e = math.exp(-x)
        sigmoid, softplus = 1.0 / (1.0 + e), x + math.log1p(e)
    expected = sigmoid / (2.0 * math.sqrt(softplus))
    got = float(ref.sqrt_softplus_derivative(np.array([x]))[0])
    assert got == pytest.approx(expected, rel=1e-13, abs=0)


@settings(max_examples=25, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(case=strat.topk_gate_scored_cases())
def test_backward_gradcheck_and_eager_backward(case):
    if case.inputs["logits"].shape[0] > 300:  # a gradcheck per case: keep them small on the CPU
        return
    results = (gradients.oracle_gradcheck(SPEC, case, seed=0) + gradients.impl_vs_oracle(SPEC, "torch", case, seed=0)
               + gradients.consistency(SPEC, "torch", case, seed=0))
    assert all(r.passed for r in results), [r.message for r in results if not r.passed]


def test_a_tied_row_is_outside_the_judged_domain():
    # Equal logits on experts 1 and 2 and k = 1 ... 2: a tie within the first k + 1 keys.
    assert ref.near_kink_rows(f32([[0.0, 1.0, 1.0], [0.0, 1.0, 2.0]]), f32([0, 0, 0]), 1, 0.0).tolist() == [True, False]
    # A picked score below 2^-40 (logit -200: score e^-100) is outside too.
    assert ref.near_kink_rows(f32([[-200.0, -300.0]]), f32([0, 0]), 1, 0.0).tolist() == [True]


# -- the eager implementation through the spec ---------------------------------------------------


@fuzz
@given(case=strat.topk_gate_scored_cases())
def test_eager_matches_the_oracle(case):
    check_case(SPEC, SPEC.impls["torch"], case, case_dir=None)


def _ties_to_higher_index(logits, bias, k, routed_scaling_factor):
    """Wrong on purpose: equal keys go to the higher index."""
    idx, _, scores = impl.topk_gate_scored(logits.flip(1).contiguous(), bias.flip(0).contiguous(), k,
                                           routed_scaling_factor)
    idx = logits.shape[1] - 1 - idx
    picked = scores.flip(1).gather(1, idx)
    return idx, routed_scaling_factor * picked / (picked.sum(1, keepdim=True) + 1e-20), scores.flip(1).contiguous()


def _bias_in_the_weights(logits, bias, k, routed_scaling_factor):
    """Wrong on purpose: weighs by the keys (score + bias), not the scores."""
    idx, _, scores = impl.topk_gate_scored(logits, bias, k, routed_scaling_factor)
    picked = (scores + bias).gather(1, idx)
    return idx, routed_scaling_factor * picked / (picked.sum(1, keepdim=True) + 1e-20), scores


def _scores_eight_ulps_high(logits, bias, k, routed_scaling_factor):
    """Wrong on purpose, by a little: scores times (1 + 2^-20), 8 to 16 ULPs high, beyond the 4 u bound."""
    idx, weights, scores = impl.topk_gate_scored(logits, bias, k, routed_scaling_factor)
    return idx, weights, scores * (1 + 2.0**-20)


@pytest.mark.parametrize("wrong, case", [
    (_ties_to_higher_index, case_of([[0.0, 1.0, 1.0]], [0, 0, 0], 1)),
    (_bias_in_the_weights, case_of([[0.0, 1.0, 2.0]], [0.5, 0, 0], 2)),
    (_scores_eight_ulps_high, case_of([[0.0, 1.0, 2.0]], [0, 0, 0], 1)),
])
def test_a_wrong_implementation_fails(wrong, case):
    with pytest.raises(VerificationError):
        check_case(SPEC, dataclasses.replace(torch_impl(wrong), name="wrong"), case, case_dir=None, excuse=False)


def test_a_wrong_backward_fails():
    case = case_of([[0.3, -1.0, 2.0, 0.5]], [0, 0, 0, 0], 2, 2.5)

    def forgets_the_normalisation(grad_topk_weights, logits, bias, topk_idx, topk_weights, scores, k,
                                  routed_scaling_factor):
        picked = scores.gather(1, topk_idx)
        denom = picked.sum(1, keepdim=True)
        grad = routed_scaling_factor * grad_topk_weights / denom * impl._sqrt_softplus_derivative_from_score(picked)
        return torch.zeros_like(scores).scatter_(1, topk_idx, grad)

    spec = dataclasses.replace(SPEC, backward=dataclasses.replace(
        SPEC.backward, impls={**SPEC.backward.impls, "torch": torch_impl(forgets_the_normalisation)}))
    results = gradients.impl_vs_oracle(spec, "torch", case, seed=0)
    assert not all(r.passed for r in results)


# -- argument checks -----------------------------------------------------------------------------


GOOD = {"logits": torch.zeros(3, 8), "bias": torch.zeros(8), "k": 2, "routed_scaling_factor": 1.0}


@pytest.mark.parametrize("change, error, name", [
    ({"logits": torch.zeros(3, 8, dtype=torch.float64)}, TypeError, "logits"),
    ({"logits": torch.zeros(3, 8, 1)}, ValueError, "logits"),
    ({"logits": torch.zeros(8, 3).t()}, ValueError, "logits"),
    ({"logits": torch.zeros(3, 1025), "bias": torch.zeros(1025)}, ValueError, "logits"),
    ({"bias": torch.zeros(7)}, ValueError, "bias"),
    ({"bias": torch.zeros(8, dtype=torch.bfloat16)}, TypeError, "bias"),
    ({"k": 0}, ValueError, "k"),
    ({"k": 9}, ValueError, "k"),
    ({"k": True}, TypeError, "k"),
    ({"k": 2.0}, TypeError, "k"),
    ({"routed_scaling_factor": INF}, ValueError, "routed_scaling_factor"),
    ({"routed_scaling_factor": "2"}, TypeError, "routed_scaling_factor"),
    ({"routed_scaling_factor": True}, TypeError, "routed_scaling_factor"),
])
@pytest.mark.parametrize("module", [impl, tilelang_gate])
def test_refuses(module, change, error, name):
    with pytest.raises(error, match=name):
        module.topk_gate_scored(**{**GOOD, **change})


def test_backward_refuses_a_wrong_saved_shape():
    idx, weights, scores = impl.topk_gate_scored(**GOOD)
    with pytest.raises(ValueError, match="topk_weights"):
        impl.topk_gate_scored_bwd(torch.zeros(3, 2), GOOD["logits"], GOOD["bias"], idx, weights[:, :1].contiguous(),
                                  scores, 2, 1.0)


def test_tilelang_wrapper_refuses_cpu_tensors():
    with pytest.raises(ValueError, match="logits"):
        tilelang_gate.topk_gate_scored(**GOOD)


def test_tilelang_backward_checks_its_arguments_before_the_device():
    idx, weights, scores = impl.topk_gate_scored(**GOOD)
    args = {"grad_topk_weights": torch.zeros(3, 2), "logits": GOOD["logits"], "bias": GOOD["bias"], "topk_idx": idx,
            "topk_weights": weights, "scores": scores, "k": 2, "routed_scaling_factor": 1.0}
    with pytest.raises(ValueError, match="^scores must have logits' shape"):
        tilelang_gate.topk_gate_scored_bwd(**{**args, "scores": scores[:2]})
    with pytest.raises(ValueError, match="^logits must be on a CUDA device"):
        tilelang_gate.topk_gate_scored_bwd(**args)


@pytest.mark.parametrize("vectorized", [True, False])
def test_tilelang_backward_stores_16_byte_vectors_where_e_allows(tilelang_only, vectorized):
    """Vectorisation failing is only a warning in tilelang: the E % 4 == 0 configuration must store float4s."""
    from kernels import _tilelang

    config = tilelang_gate.GateScoredBwdConfig(vectorized)
    source = _tilelang.lower_to_cuda(tilelang_gate.build_topk_gate_scored_bwd(config))
    assert ("*(float4*)(grad_logits" in source) == vectorized
    assert "expm1f(" in source and "__fdiv_rn(" in source


# -- the strategy and the adapter -----------------------------------------------------------------


def test_classes_are_true_of_the_case():
    tied = Case({"k": 1, "routed_scaling_factor": 1.0},
                {"logits": f32([[-1.0, -0.5, 30.0, -200.0]]), "bias": f32([2.0**24, 2.0**24, -INF, 0])})
    found = strat.gate_classes(tied)
    assert {"key_tie", "bias_made_tie", "masked_expert", "saturated_high", "score_underflow"} <= found
    plain = case_of([[0.0, 1.0, 2.0]], [0, 0, 0], 3)
    assert strat.gate_classes(plain) == {"k_equals_experts"}


def test_adapter_names_the_release_that_lacks_the_op(monkeypatch):
    assert set(adapter.FORWARD) == set(adapter.BACKWARD) == {SPEC.name}
    assert set(adapter.MISSING[1]) == {SPEC.name} and not adapter.MISSING[2]
    monkeypatch.setattr(adapter, "_gen", lambda: 1)
    with pytest.raises(Unsupported, match="lacks moe.topk_gate_scored"):
        adapter.topk_gate_scored(**GOOD)


def test_widest_expert_count_launches_the_widest_kernel():
    counts = {strat.widest_expert_count((i,)) for i in range(50)}
    assert {tilelang_gate.config_for_experts(e).width for e in counts} == {tilelang_gate.WIDTHS[-1]}
    assert any(e < tilelang_gate.WIDTHS[-1] for e in counts) and tilelang_gate.WIDTHS[-1] in counts
