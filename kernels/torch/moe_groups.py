"""Eager PyTorch grouped MoE routing helpers, on the inputs' device; the contract is
docs/contract/moe_groups.md.  The TileLang kernels of ``kernels.moe.groups`` have the same names,
signatures, return conventions and argument checks.

Signatures
----------
    topk_sum_and_topk_group_idx(scores, num_topk_sum, num_topk_groups) -> group_idx
    unique_group_indices(group_indices, num_groups) -> unique_indices
    aux_fi(topk_idx, num_experts, num_aux_topk) -> fi

Tensors (T tokens, G groups of M experts, K slots)
---------------------------------------------------
scores          float32 (T, G, M), contiguous, 1 <= G <= 32, G * M <= 1024.
num_topk_sum    1 or 2, at most M: how many of a group's largest scores make its score.
num_topk_groups 1 <= num_topk_groups <= G.
group_idx       int64 (T, num_topk_groups): the best groups, best first.
group_indices   int64 (T, K), contiguous, 1 <= K <= 32; entries are group indices in
                [0, num_groups) or negative (a masked slot).  1 <= num_groups <= 1024.
unique_indices  int64 (T, K): a new tensor; group_indices is left as it is.
topk_idx        int64 (T, K), contiguous, 1 <= K <= 32: entries in [0, num_experts) count, others not;
                1 <= num_experts <= 1024, 1 <= num_aux_topk <= 1024.
fi              float32 (num_experts,): counts * num_experts / (num_aux_topk * T), rounded once (NaN for T = 0).
"""

from __future__ import annotations

import torch

from ._checks import check_contiguous, check_tensor
from .moe import MAX_EXPERTS, MAX_K, _check_int, group_count

MAX_GROUPS = 32
MAX_NUM_GROUPS = 1024  # the bound unique_group_indices takes on group indices
MAX_AUX_TOPK = 1024
MASKED = -1

# The order key of a float32 (`_order_keys`) spans 2**32 values; an element's index below 2**11 = 2048 > 1024
# is packed under it, so that one int64 per element orders by key, then by the lower index.
_INDEX_BITS = 11
_NAN_KEY = 2**31  # above key(+inf) = 0x7F800000


def _check_topk_sum_and_topk_group_idx_args(scores: object, num_topk_sum: object, num_topk_groups: object) -> None:
    check_tensor("scores", scores, (torch.float32,), 3, "(T, G, M)")
    check_contiguous("scores", scores)
    _, num_groups, per_group = scores.shape
    if not 1 <= num_groups <= MAX_GROUPS:
        raise ValueError(f"scores must have 1 <= G <= {MAX_GROUPS} groups, got G={num_groups}")
    if not 1 <= num_groups * per_group <= MAX_EXPERTS:
        raise ValueError(f"scores must have 1 <= G * M <= {MAX_EXPERTS} experts, got G={num_groups}, M={per_group}")
    _check_int("num_topk_sum", num_topk_sum, 1, min(2, per_group))
    _check_int("num_topk_groups", num_topk_groups, 1, num_groups)


def _check_slots(name: str, t: object) -> None:
    """t is a contiguous int64 (T, K) tensor of 1 <= K <= MAX_K slots a token."""
    check_tensor(name, t, (torch.int64,), 2, "(T, K)")
    check_contiguous(name, t)
    if not 1 <= t.shape[1] <= MAX_K:
        raise ValueError(f"{name} must have 1 <= K <= {MAX_K} slots, got K={t.shape[1]}")


def _check_unique_group_indices_args(group_indices: object, num_groups: object) -> None:
    _check_slots("group_indices", group_indices)
    _check_int("num_groups", num_groups, 1, MAX_NUM_GROUPS)


def _check_aux_fi_args(topk_idx: object, num_experts: object, num_aux_topk: object) -> None:
    _check_slots("topk_idx", topk_idx)
    _check_int("num_experts", num_experts, 1, MAX_EXPERTS)
    _check_int("num_aux_topk", num_aux_topk, 1, MAX_AUX_TOPK)


def _order_keys(values: torch.Tensor) -> torch.Tensor:
    """int64 keys whose order is moe.topk_gate's: -inf < finite ascending < +inf < every NaN, -0.0 == +0.0."""
    bits = values.view(torch.int32).to(torch.int64)
    magnitude = bits & 0x7FFFFFFF
    key = torch.where(bits < 0, -magnitude, magnitude)
    return torch.where(magnitude > 0x7F800000, torch.full_like(key, _NAN_KEY), key)


def _top_indices(values: torch.Tensor, n: int) -> torch.Tensor:
    """Indices of the n first elements along the last dimension in moe.topk_gate's order (best first)."""
    width = values.shape[-1]
    index = torch.arange(width, device=values.device)
    # Unique keys (the index breaks every tie, the lower index ranking higher), so topk has one answer.
    packed = _order_keys(values) * (1 << _INDEX_BITS) + (width - 1 - index)
    return torch.topk(packed, n, dim=-1, largest=True, sorted=True).indices


def topk_sum_and_topk_group_idx(scores: torch.Tensor, num_topk_sum: int, num_topk_groups: int) -> torch.Tensor:
    """The num_topk_groups best groups of each token, best first: int64 (T, num_topk_groups).

    A group's score is its largest score (num_topk_sum = 1) or the float32 sum of its two largest
    (num_topk_sum = 2), the largest taken in moe.topk_gate's order; groups are ranked in the same order.
    """
    _check_topk_sum_and_topk_group_idx_args(scores, num_topk_sum, num_topk_groups)
    top = scores.gather(2, _top_indices(scores, int(num_topk_sum)))
    group_score = top[..., 0] + top[..., 1] if num_topk_sum == 2 else top[..., 0]
    return _top_indices(group_score.contiguous(), int(num_topk_groups)).contiguous()


def unique_group_indices(group_indices: torch.Tensor, num_groups: int) -> torch.Tensor:
    """group_indices (int64 (T, K)) with every non-negative entry that repeats an earlier entry of its
    row replaced by -1, as a new tensor."""
    _check_unique_group_indices_args(group_indices, num_groups)
    num_slots = group_indices.shape[1]
    same = group_indices.unsqueeze(2) == group_indices.unsqueeze(1)  # [t, k, j]: slot k equals slot j
    earlier = torch.ones(num_slots, num_slots, dtype=torch.bool, device=group_indices.device).tril(-1)
    repeated = (same & earlier).any(dim=2) & (group_indices >= 0)
    return torch.where(repeated, torch.full_like(group_indices, MASKED), group_indices)


def aux_fi(topk_idx: torch.Tensor, num_experts: int, num_aux_topk: int) -> torch.Tensor:
    """float32 (num_experts,): f_i = c_i * E / (num_aux_topk * T), c_i = group_count(topk_idx, E)[i].

    Numerator and denominator are exact integers and their float64 quotient, rounded to float32, is the
    correctly rounded f_i (53 >= 2 * 24 + 2: rounding twice is rounding once).  No host sync.
    """
    _check_aux_fi_args(topk_idx, num_experts, num_aux_topk)
    return _fi_from_counts(group_count(topk_idx, int(num_experts)), topk_idx.shape[0], int(num_aux_topk))


def _fi_from_counts(counts: torch.Tensor, num_tokens: int, num_aux_topk: int) -> torch.Tensor:
    """float32 counts * E / (num_aux_topk * T), E = counts.numel(), through exact int64 and one float64 division."""
    numerator = (counts.to(torch.int64) * counts.numel()).to(torch.float64)
    return (numerator / float(num_aux_topk * num_tokens)).float()  # T = 0: 0 / 0 = NaN
