"""The TileLang kernels of moe.top2_sum_gate and moe.mask_indices_by_tp on a GPU.

GPU tests (skipped, with the reason, without CUDA or tilelang): each kernel against the oracle through its spec
on the strategies' cases; on hand-made cases, the gate against the oracle through its spec (DeepSeek-V3's
layout and T = 16384, token counts ending in partial thread blocks, every scoring function, grouping off and
on, identical experts and groups, masked experts and empty groups, NaN and infinite logits, unrouted tokens,
T = 0), and the masking bitwise against the eager implementation and the oracle (ranks' boundaries, dropped
and other negative slots, K = 32).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given

import gpu_settings

import references.moe_tp as ref
from kernels.torch import moe_tp as eager
from strategies import moe_tp as strat
from tkverify import registry
from tkverify.case import Case
from tkverify.check import check_case

GATE, MASK = registry.get("moe.top2_sum_gate"), registry.get("moe.mask_indices_by_tp")
gpu_fuzz = gpu_settings.gpu_fuzz(80)


@pytest.fixture(scope="module")
def moe(tilelang_family):
    return tilelang_family("moe")


@pytest.fixture(scope="module")
def tp(moe):
    import kernels.moe.tp

    return kernels.moe.tp


@gpu_fuzz
@given(case=strat.top2_sum_gate_cases())
def test_gate_kernel_matches_the_oracle(tp, case):
    check_case(GATE, GATE.impls["tilelang"], case, case_dir=None)


@gpu_fuzz
@given(case=strat.mask_indices_by_tp_cases())
def test_mask_kernel_matches_the_oracle(tp, case):
    check_case(MASK, MASK.impls["tilelang"], case, case_dir=None)


def _gate_inputs(tokens: int, num_experts: int, seed: int, features: dict[str, str]) -> dict[str, np.ndarray]:
    return strat.build_gate_inputs(seed, tokens, (8, num_experts // 8), 8, "normal", "small", features, "some")


@pytest.mark.parametrize("tokens", [0, 1, 63, 64, 65, 16384])
@pytest.mark.parametrize("scoring_func", ref.SCORING_FUNCS)
@pytest.mark.parametrize("num_topk_groups", [1, 4, 8])
@pytest.mark.parametrize("features", [{}, {"expert_tie": "all", "group_tie": "all"},
                                      {"masked_experts": "all", "empty_group": "all"},
                                      {"non_finite_logits": "some"}], ids=["plain", "ties", "masked", "non_finite"])
def test_gate_kernel_on_hand_made_cases(tp, tokens, scoring_func, num_topk_groups, features):
    arrays = _gate_inputs(tokens, 256, tokens + num_topk_groups, features)
    params = {"num_topk": 8, "num_topk_groups": num_topk_groups, "num_groups": 8, "routed_scaling_factor": 2.5,
              "scoring_func": scoring_func}
    case = Case(params, {name: torch.from_numpy(a.copy()) for name, a in arrays.items()})
    check_case(GATE, GATE.impls["tilelang"], case, case_dir=None)


@pytest.mark.parametrize("tokens", [0, 1, 255, 257, 16384])
@pytest.mark.parametrize("n, num_ep_ranks, num_tp_ranks", [(256, 64, 8), (256, 1, 1), (257, 257, 257), (96, 6, 3)])
@pytest.mark.parametrize("num_slots", [1, 8, 32])
def test_mask_kernel_equals_eager(tp, tokens, n, num_ep_ranks, num_tp_ranks, num_slots):
    rng = np.random.default_rng(tokens + n + num_slots)
    idx = rng.integers(-2, n, size=(tokens, num_slots))
    idx[rng.random(idx.shape) < 0.05] = np.iinfo(np.int64).min
    indices = torch.from_numpy(idx).cuda()
    for tp_rank in sorted({0, num_tp_ranks - 1}):
        got = tp.mask_indices_by_tp(indices, n, num_ep_ranks, tp_rank, num_tp_ranks)
        assert got.dtype == torch.int64 and torch.equal(got, eager.mask_indices_by_tp(indices, n, num_ep_ranks,
                                                                                      tp_rank, num_tp_ranks))
        assert np.array_equal(got.cpu().numpy(), ref.mask_indices_by_tp(idx, n, num_ep_ranks, tp_rank, num_tp_ranks))


def test_wrappers_refuse_what_the_eager_checks_refuse(tp):
    with pytest.raises(ValueError, match="^num_groups"):
        tp.top2_sum_gate(torch.zeros(2, 16, device="cuda"), torch.zeros(16, device="cuda"), 4, 2, 3, 1.0, "sigmoid")
    with pytest.raises(ValueError, match="^tp_rank"):
        tp.mask_indices_by_tp(torch.zeros(2, 4, dtype=torch.int64, device="cuda"), 16, 4, 2, 2)
