"""Oracles of the grouped MoE routing helpers (docs/contract/moe_groups.md).

* `topk_sum_and_topk_group_idx`: each token's experts form G groups of M; a group's score is its largest score
  (num_topk_sum = 1) or the float32 sum of its two largest (num_topk_sum = 2), and the result is the
  indices of the num_topk_groups best groups, best first.  Both rankings use moe.topk_gate's total
  order (NaN above +inf, -0.0 equal to +0.0, ties to the lower index), so both call its oracle.
* `unique_group_indices`: each row's group indices with every repeat of an earlier non-negative
  entry replaced by -1.
* `aux_fi`: DeepSeek-V3's expert load statistic f_i = E / (K' T) * (times expert i is routed), the
  counts being moe.group_count's.

Integer outputs are int64 NumPy arrays; they are judged bitwise.
"""

from __future__ import annotations

import numpy as np
import torch

from references import as_float64
from references.moe import group_count, topk_gate

MASKED = -1  # what a repeated group index becomes


def group_scores(scores: torch.Tensor | np.ndarray, num_topk_sum: int) -> np.ndarray:
    """float32 (T, G): each group's largest score, or the float32 sum of its two largest.

    scores is (T, G, M).  The two largest are the first two of moe.topk_gate's order within the group.
    Their sum is taken in float64, where the sum of two float32 values is rounded once, and then rounded
    to float32: rounding to 53 bits and then to 24 gives the correctly rounded float32 sum, because
    53 >= 2 * 24 + 2 (double rounding is innocuous for addition).  So this is fl32(a + b), NaN for
    +inf + -inf, inf past the float32 range.
    """
    values = as_float64(scores)
    if values.ndim != 3:
        raise ValueError(f"scores must be 3-D (T, G, M), got shape {values.shape}")
    num_tokens, num_groups, per_group = values.shape
    if num_topk_sum not in (1, 2) or num_topk_sum > per_group:
        raise ValueError(f"num_topk_sum must be 1 or 2 and at most M={per_group}, got {num_topk_sum}")
    flat = values.reshape(num_tokens * num_groups, per_group)
    top = topk_gate(flat, num_topk_sum)
    picked = np.take_along_axis(flat, top, axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        total = picked.sum(axis=1) if num_topk_sum == 2 else picked[:, 0]
        return total.astype(np.float32).reshape(num_tokens, num_groups)


def topk_sum_and_topk_group_idx(scores: torch.Tensor | np.ndarray, num_topk_sum: int, num_topk_groups: int) -> np.ndarray:
    """int64 (T, num_topk_groups): the indices of the best groups by `group_scores`, best first.

    The groups are ranked like moe.topk_gate ranks experts: NaN first, then +inf, finite scores
    descending, -inf last, -0.0 equal to +0.0, equal scores to the lower group index first.
    """
    per_group_score = group_scores(scores, num_topk_sum)
    num_groups = per_group_score.shape[1]
    if not 1 <= num_topk_groups <= num_groups:
        raise ValueError(f"num_topk_groups must be in [1, G={num_groups}], got {num_topk_groups}")
    return topk_gate(per_group_score, num_topk_groups)


def unique_group_indices(group_indices: torch.Tensor | np.ndarray, num_groups: int) -> np.ndarray:
    """int64 (T, K): group_indices with each non-negative entry that equals an earlier entry of its row
    replaced by -1; the first occurrence of a group, and every negative entry, stay as they are.

    `num_groups` bounds the entries a caller may pass; no entry's fate depends on it.
    """
    idx = group_indices.detach().to("cpu", torch.int64).numpy() if isinstance(group_indices, torch.Tensor) \
        else np.asarray(group_indices, dtype=np.int64)
    if idx.ndim != 2:
        raise ValueError(f"group_indices must be 2-D (T, K), got shape {idx.shape}")
    if num_groups < 1:
        raise ValueError(f"num_groups must be positive, got {num_groups}")
    out = idx.copy()
    for slot in range(1, idx.shape[1]):
        seen_before = (idx[:, :slot] == idx[:, slot:slot + 1]).any(axis=1)
        out[seen_before & (idx[:, slot] >= 0), slot] = MASKED
    return out


def aux_fi(topk_idx: torch.Tensor | np.ndarray, num_experts: int, num_aux_topk: int) -> np.ndarray:
    """float64 (E,): f_i = c_i * E / (num_aux_topk * T), c_i = moe.group_count(topk_idx, E)[i] (entries
    outside [0, E) count nowhere).  The quotient of exact integers, rounded once to float64; T = 0
    gives 0 / 0 = NaN everywhere."""
    counts = group_count(topk_idx, num_experts).astype(np.int64)
    num_tokens = topk_idx.shape[0]
    if num_aux_topk < 1:
        raise ValueError(f"num_aux_topk must be positive, got {num_aux_topk}")
    with np.errstate(invalid="ignore"):
        return (counts * num_experts).astype(np.float64) / float(num_aux_topk * num_tokens)
