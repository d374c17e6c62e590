"""The TileLang kernel of moe.topk_gate_scored on a GPU.

GPU tests (skipped, with the reason, without CUDA or tilelang): the kernel against the oracle through its
spec on the strategy's cases (scores within the contract's bound, the selection bitwise from its own scores,
the weights within gamma_{k+2} of its own scores' weights), and on hand-made cases: tile-kernels' training
shape (16384 x 256, k = 8), token counts ending in partial thread blocks, E = 1 and E = 1024, k = E, NaN and
infinite logits, a masked expert, saturated and underflowing logits, T = 0; the eager implementation's
backward on the kernel's saved outputs against the float64 backward.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from kernels.torch import moe_gate as eager
from strategies import moe_gate as strat
from tkverify import registry
from tkverify.case import Case
from tkverify.check import check_case

SPEC = registry.get("moe.topk_gate_scored")
gpu_fuzz = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def gate(tilelang_family):
    tilelang_family("moe")
    import kernels.moe.gate_scored

    return kernels.moe.gate_scored


@gpu_fuzz
@given(case=strat.topk_gate_scored_cases())
def test_kernel_matches_the_oracle(gate, case):
    check_case(SPEC, SPEC.impls["tilelang"], case, case_dir=None)


def _case(logits: torch.Tensor, bias: torch.Tensor, k: int, scaling: float = 2.5) -> Case:
    return Case({"k": k, "routed_scaling_factor": scaling}, {"logits": logits, "bias": bias})


def _random(num_tokens: int, num_experts: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn((num_tokens, num_experts), generator=g),
            0.1 * torch.randn((num_experts,), generator=g))


@pytest.mark.parametrize("num_tokens, num_experts, k", [
    (16384, 256, 8), (1, 1, 1), (5, 1024, 32), (33, 100, 9), (129, 33, 33), (4097, 256, 8), (3, 7, 7),
])
def test_kernel_at_shapes(gate, num_tokens, num_experts, k):
    logits, bias = _random(num_tokens, num_experts)
    check_case(SPEC, SPEC.impls["tilelang"], _case(logits, bias, k), case_dir=None)


def test_kernel_at_the_edges(gate):
    logits, bias = _random(9, 64, seed=1)
    logits[0, :5] = float("nan")
    logits[1, 3] = float("inf")
    logits[2, :] = -float("inf")
    logits[3, :40] = 1e30  # saturated: sqrt(x)
    logits[4, :] = -150.0  # e^x underflows: every score 0 in float32, an all-tie row
    logits[5, 10] = logits[5, 11]  # equal scores
    bias[7] = -float("inf")  # a masked expert
    logits[6, 7] = float("inf")  # its key inf + -inf = NaN: picked first
    bias[20:24] = 2.0**24  # ties the bias makes
    check_case(SPEC, SPEC.impls["tilelang"], _case(logits, bias, 8), case_dir=None)


def test_kernel_on_an_empty_batch(gate):
    idx, weights, scores = gate.topk_gate_scored(torch.zeros(0, 64, device="cuda"), torch.zeros(64, device="cuda"),
                                                 8, 1.0)
    assert idx.shape == (0, 8) and weights.shape == (0, 8) and scores.shape == (0, 64)


def test_kernel_selection_equals_the_eager_selection_of_its_scores(gate):
    logits, bias = _random(1000, 256, seed=2)
    idx, _, scores = gate.topk_gate_scored(logits.cuda(), bias.cuda(), 8, 2.5)
    assert torch.equal(idx.cpu(), eager.topk_gate(scores.cpu() + bias, 8))


def test_eager_backward_on_the_kernels_saved_outputs(gate):
    logits, bias = _random(257, 256, seed=3)
    case = _case(logits, bias, 8)
    fwd = dict(zip(SPEC.outputs, gate.topk_gate_scored(logits.cuda(), bias.cuda(), 8, 2.5)))
    cot = torch.randn(257, 8, generator=torch.Generator().manual_seed(4))
    grad = eager.topk_gate_scored_bwd(cot.cuda(), logits.cuda(), bias.cuda(), fwd["topk_idx"], fwd["topk_weights"],
                                      fwd["scores"], 8, 2.5)
    rows = ~torch.from_numpy(gradients_mask(case))
    exact = SPEC.backward.oracle(grad_topk_weights=cot * rows[:, None], **case.inputs, **case.params)
    expected = SPEC.backward.given(case, {"topk_weights": cot * rows[:, None]}, {"grad_logits": exact})["grad_logits"]
    grad = grad.cpu()[rows]
    low, high = (torch.from_numpy(v)[rows] for v in (expected.low, expected.high))
    assert bool(((grad >= low) & (grad <= high)).all())


def gradients_mask(case: Case):
    """Rows outside the judged domain or within the kink margin (the spec's mask at its kink margin)."""
    return SPEC.backward.mask(case, SPEC.backward.kink_margin)["topk_weights"][:, 0]

