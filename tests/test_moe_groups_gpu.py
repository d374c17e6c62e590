"""The TileLang kernels of moe.topk_sum_and_topk_group_idx and moe.unique_group_indices on a GPU.

GPU tests (skipped, with the reason, without CUDA or tilelang): each kernel (and aux_fi's pair) against the
oracle through its spec on the strategies' cases, and bitwise against the eager implementation on hand-made
cases (aux_fi also against the correctly rounded oracle):
DeepSeek-V3's shape, token counts ending in partial thread blocks, every G up to 32 with M at the
G * M <= 1024 limit, scores of NaN, infinities and signed zeros, ties across groups, T = 0; the indices
with every group repeated, masked slots, K = 32.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given

import gpu_settings

import references.moe_groups as ref
from kernels.torch import moe_groups as eager
from strategies import moe_groups as strat
from tkverify import registry
from tkverify.check import check_case

GROUP_IDX, UNIQUE = registry.get("moe.topk_sum_and_topk_group_idx"), registry.get("moe.unique_group_indices")
AUX_FI = registry.get("moe.aux_fi")
gpu_fuzz = gpu_settings.gpu_fuzz(80)


@pytest.fixture(scope="module")
def moe(tilelang_family):
    return tilelang_family("moe")


@pytest.fixture(scope="module")
def groups(moe):
    import kernels.moe.groups

    return kernels.moe.groups


@gpu_fuzz
@given(case=strat.topk_sum_and_topk_group_idx_cases())
def test_group_idx_kernel_matches_the_oracle(groups, case):
    check_case(GROUP_IDX, GROUP_IDX.impls["tilelang"], case, case_dir=None)


@gpu_fuzz
@given(case=strat.unique_group_indices_cases())
def test_unique_kernel_matches_the_oracle(groups, case):
    check_case(UNIQUE, UNIQUE.impls["tilelang"], case, case_dir=None)


@gpu_fuzz
@given(case=strat.aux_fi_cases())
def test_aux_fi_kernel_matches_the_oracle(groups, case):
    check_case(AUX_FI, AUX_FI.impls["tilelang"], case, case_dir=None)


@pytest.mark.parametrize("tokens", [0, 1, 129, 16384])
@pytest.mark.parametrize("num_experts, k, num_aux_topk", [(256, 8, 8), (1, 1, 1), (1024, 32, 33), (7, 3, 1)])
def test_aux_fi_kernel_equals_eager(groups, tokens, num_experts, k, num_aux_topk):
    rng = np.random.default_rng(tokens + num_experts)
    idx = torch.from_numpy(rng.integers(-1, num_experts + 1, size=(tokens, k))).cuda()
    got = groups.aux_fi(idx, num_experts, num_aux_topk)
    want = eager.aux_fi(idx, num_experts, num_aux_topk)
    assert got.dtype == torch.float32 and torch.equal(got.view(torch.int32), want.view(torch.int32))
    exact = ref.aux_fi(idx.cpu(), num_experts, num_aux_topk)
    assert np.array_equal(got.cpu().numpy(), exact.astype(np.float32), equal_nan=True)


def _special_scores(shape: tuple[int, int, int], seed: int) -> torch.Tensor:
    """Integers in [-3, 3] (ties everywhere) with NaN, +-inf and -0.0 sprinkled in."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, size=shape).astype(np.float32)
    specials = np.array([np.nan, np.inf, -np.inf, -0.0], dtype=np.float32)
    where = rng.random(shape) < 0.05
    x[where] = rng.choice(specials, size=int(where.sum()))
    return torch.from_numpy(x)


@pytest.mark.parametrize("tokens", [0, 1, 127, 128, 129, 16384])
@pytest.mark.parametrize("num_groups, per_group", [(8, 32), (1, 1), (1, 1024), (3, 7), (32, 32), (32, 1)])
@pytest.mark.parametrize("num_topk_sum", [1, 2])
def test_group_idx_kernel_equals_eager(groups, tokens, num_groups, per_group, num_topk_sum):
    if num_topk_sum > per_group:
        pytest.skip("num_topk_sum > M is refused")
    x = _special_scores((tokens, num_groups, per_group), tokens + num_groups).cuda()
    for num_topk_groups in sorted({1, (num_groups + 1) // 2, num_groups}):
        got = groups.topk_sum_and_topk_group_idx(x, num_topk_sum, num_topk_groups)
        want = eager.topk_sum_and_topk_group_idx(x, num_topk_sum, num_topk_groups)
        assert got.dtype == torch.int64 and torch.equal(got, want)
        assert np.array_equal(got.cpu().numpy(), ref.topk_sum_and_topk_group_idx(x.cpu(), num_topk_sum,
                                                                                  num_topk_groups))


@pytest.mark.parametrize("tokens", [0, 1, 129, 16384])
@pytest.mark.parametrize("num_slots, num_groups", [(1, 1), (8, 8), (9, 2), (32, 128), (32, 1024)])
def test_unique_kernel_equals_eager(groups, tokens, num_slots, num_groups):
    rng = np.random.default_rng(tokens + num_slots)
    idx = torch.from_numpy(rng.integers(-1, min(num_groups, 4), size=(tokens, num_slots))).cuda()
    before = idx.clone()
    got = groups.unique_group_indices(idx, num_groups)
    assert torch.equal(idx, before), "the input is left as it is"
    assert torch.equal(got, eager.unique_group_indices(idx, num_groups))
    assert np.array_equal(got.cpu().numpy(), ref.unique_group_indices(idx.cpu(), num_groups))


def test_wrappers_refuse_what_the_eager_checks_refuse(groups):
    with pytest.raises(ValueError, match="^num_topk_sum"):
        groups.topk_sum_and_topk_group_idx(torch.zeros(2, 4, 1, device="cuda"), 2, 2)
    with pytest.raises(TypeError, match="^group_indices"):
        groups.unique_group_indices(torch.zeros(2, 4, dtype=torch.int32, device="cuda"), 8)
