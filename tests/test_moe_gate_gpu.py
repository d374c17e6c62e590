"""The TileLang kernel of moe.topk_gate_scored on a GPU.

GPU tests (skipped, with the reason, without CUDA or tilelang): the kernel against the oracle through its
spec on the strategy's cases (scores within the contract's bound, the selection bitwise from its own scores,
the weights within gamma_{k+2} of its own scores' weights), and on hand-made cases: tile-kernels' training
shape (16384 x 256, k = 8), token counts ending in partial thread blocks, E = 1 and E = 1024, k = E, NaN and
infinite logits, a masked expert, saturated and underflowing logits, T = 0; the eager implementation's
backward on the kernel's saved outputs against the float64 backward.

The TileLang backward: against the float64 backward through the spec (`gradients.impl_vs_oracle`, its
forward then its backward) on the strategy's cases and at shapes that take the 16-byte and the one-float
stores, with partial thread blocks and partial warps of vectors; against the eager backward on the same
saved outputs (both within the contract's bracket, identical zeros off the selection, with the allocator
poisoned so that an unwritten element shows); T = 0; repeated and out-of-range picks as documented.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given

import gpu_settings

from kernels.torch import moe_gate as eager
from strategies import moe_gate as strat
from tkverify import gradients, registry
from tkverify.case import Case
from tkverify.check import check_case
from tkverify.poison import poisoned

SPEC = registry.get("moe.topk_gate_scored")
gpu_fuzz = gpu_settings.gpu_fuzz(120)


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
    (16384, 256, 8), (1, 1, 1), (5, 1024, 32), (33, 100, 9), (129, 33, 32), (4097, 256, 8), (3, 7, 7),
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



# -- the TileLang backward ----------------------------------------------------------------------------------


def _assert_backward_passes(case: Case, seed: int) -> None:
    results = gradients.impl_vs_oracle(SPEC, "tilelang", case, seed=seed)
    assert results and all(r.passed for r in results), [r.message for r in results if not r.passed]


@gpu_fuzz
@given(case=strat.topk_gate_scored_cases())
def test_backward_kernel_matches_the_oracle(gate, case):
    _assert_backward_passes(case, seed=5)


@pytest.mark.parametrize("num_tokens, num_experts, k", [
    (16384, 256, 8), (1, 1, 1), (5, 1024, 32), (33, 100, 9), (129, 33, 32), (4097, 256, 8), (3, 7, 7),
    (6, 132, 5), (2, 516, 32),
])
def test_backward_kernel_at_shapes(gate, num_tokens, num_experts, k):
    logits, bias = _random(num_tokens, num_experts, seed=num_tokens + num_experts)
    _assert_backward_passes(_case(logits, bias, k), seed=k)


@pytest.mark.parametrize("num_tokens, num_experts, k", [(257, 256, 8), (65, 33, 6), (9, 1024, 32)])
def test_backward_kernel_against_the_eager_backward(gate, num_tokens, num_experts, k):
    logits, bias = _random(num_tokens, num_experts, seed=7)
    case = _case(logits, bias, k)
    idx, weights, scores = gate.topk_gate_scored(logits.cuda(), bias.cuda(), k, 2.5)
    rows = ~torch.from_numpy(gradients_mask(case))
    cot = torch.randn(num_tokens, k, generator=torch.Generator().manual_seed(8)) * rows[:, None]
    args = (cot.cuda(), logits.cuda(), bias.cuda(), idx, weights, scores, k, 2.5)
    with poisoned(True):
        kernel_grad = gate.topk_gate_scored_bwd(*args).cpu()
    eager_grad = eager.topk_gate_scored_bwd(*args).cpu()
    selected = torch.zeros(num_tokens, num_experts, dtype=torch.bool).scatter_(1, idx.cpu(), True)
    assert torch.equal(kernel_grad[~selected], torch.zeros_like(kernel_grad[~selected]))
    assert torch.equal(eager_grad[~selected], kernel_grad[~selected])
    exact = SPEC.backward.oracle(grad_topk_weights=cot, **case.inputs, **case.params)
    bracket = SPEC.backward.given(case, {"topk_weights": cot}, {"grad_logits": exact})["grad_logits"]
    low, high = torch.from_numpy(bracket.low), torch.from_numpy(bracket.high)
    for grad in (kernel_grad, eager_grad):
        assert bool(((grad.double() >= low) & (grad.double() <= high))[rows].all())


def test_backward_kernel_on_an_empty_batch(gate):
    zeros = torch.zeros(0, 8, device="cuda")
    grad = gate.topk_gate_scored_bwd(zeros, torch.zeros(0, 64, device="cuda"), torch.zeros(64, device="cuda"),
                                     torch.zeros(0, 8, dtype=torch.int64, device="cuda"), zeros,
                                     torch.zeros(0, 64, device="cuda"), 8, 1.0)
    assert grad.shape == (0, 64) and grad.dtype == torch.float32


@pytest.mark.parametrize("num_experts", [8, 7])
def test_backward_kernel_with_repeated_and_out_of_range_picks(gate, num_experts):
    """A repeated pick keeps its last slot's gradient; an index outside [0, E) reads and writes nothing."""
    scores = torch.full((2, num_experts), 0.5, device="cuda")
    idx = torch.tensor([[3, 3, 1], [-1, num_experts, 2]], device="cuda")
    cot = torch.tensor([[1.0, -2.0, 0.5], [1.0, 1.0, 1.0]], device="cuda")
    weights = torch.full((2, 3), 0.25, device="cuda")
    with poisoned(True):
        grad = gate.topk_gate_scored_bwd(cot, torch.zeros_like(scores), torch.zeros(num_experts, device="cuda"),
                                         idx, weights, scores, 3, 1.0).cpu()
    assert torch.isfinite(grad).all()
    assert grad[0].nonzero().flatten().tolist() == [1, 3] and grad[1].nonzero().flatten().tolist() == [2]
    # row 0: three picked scores of 0.5 (D = 1.5), <g, w> = -0.125; slot 1 (g = -2) lands at expert 3
    unit = (torch.tensor(-2.0) + 0.125) / 1.5 * (-torch.expm1(torch.tensor(-0.25))) / 1.0
    assert torch.allclose(grad[0, 3], unit, rtol=1e-6)
