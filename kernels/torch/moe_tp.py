"""Eager PyTorch tensor-parallel MoE routing helpers, on the inputs' device; the contract is
docs/contract/moe_tp.md.  The TileLang kernels of ``kernels.moe.tp`` have the same names, signatures,
return conventions and argument checks.

Signatures
----------
    top2_sum_gate(logits, bias, num_topk, num_topk_groups, num_groups, routed_scaling_factor, scoring_func,
                  mask=None) -> (topk_idx, topk_weights)
    mask_indices_by_tp(indices, n, num_ep_ranks, tp_rank, num_tp_ranks) -> masked

Tensors (T tokens, E experts in G groups of M, K slots)
-------------------------------------------------------
logits        float32 (T, E), contiguous, 1 <= E <= 1024.
bias          float32 (E,), contiguous.
num_groups    int G in [1, 32] dividing E; num_topk_groups in [1, G], G where M = 1.
num_topk      int K in [1, min(32, num_topk_groups * M)].
routed_scaling_factor  a finite float > 0 (an int too).
scoring_func  "sigmoid", "sqrtsoftplus" or "softmax".
mask          None, or bool (T,), contiguous: False leaves a token unrouted.
topk_idx      int64 (T, K): the chosen experts, best first; -1 in every slot of an unrouted token.
topk_weights  float32 (T, K): scale * s / (sum of the token's chosen s + 1e-20); 0 for an unrouted token.
indices       int64 (T, K), contiguous, 1 <= K <= 32: global expert indices in [0, n), or negative
              (a dropped slot).
n             int in [1, 2^31 - 1]: the experts of all ranks together.
num_ep_ranks  int, a divisor of n: the expert-parallel ranks, n / num_ep_ranks experts each.
num_tp_ranks  int, a divisor of num_ep_ranks: the tensor-parallel ranks of a data-parallel group.
tp_rank       int in [0, num_tp_ranks): the tensor-parallel rank whose experts are kept.
masked        int64 (T, K): a new tensor; each kept entry in the rank's numbering, every other -1.
"""

from __future__ import annotations

import math
import numbers

import torch

from ._checks import check_contiguous, check_tensor
from .moe import MAX_EXPERTS, MAX_K, _check_int
from .moe_groups import MAX_GROUPS, _order_keys, topk_sum_and_topk_group_idx

SCORING_FUNCS = ("sigmoid", "sqrtsoftplus", "softmax")
EPSILON = 1e-20  # added to the weights' denominator, as a float32
# Packs an order key above an index (E <= 1024 < 2**11), as kernels/torch/moe_groups.py does.
_INDEX_BITS = 11
_EXCLUDED_KEY = -(2**33)  # below every order key (key(-inf) = -0x7F800000)

MAX_N = 2**31 - 1  # n, and so every expert index it allows, fits an int32
DROPPED = -1


def _check_mask_indices_by_tp_args(indices: object, n: object, num_ep_ranks: object, tp_rank: object,
                                   num_tp_ranks: object) -> None:
    check_tensor("indices", indices, (torch.int64,), 2, "(T, K)")
    check_contiguous("indices", indices)
    if not 1 <= indices.shape[1] <= MAX_K:
        raise ValueError(f"indices must have 1 <= K <= {MAX_K} slots, got K={indices.shape[1]}")
    n = _check_int("n", n, 1, MAX_N)
    num_ep_ranks = _check_int("num_ep_ranks", num_ep_ranks, 1, n)
    if n % num_ep_ranks:
        raise ValueError(f"num_ep_ranks must divide n={n}, got {num_ep_ranks}")
    num_tp_ranks = _check_int("num_tp_ranks", num_tp_ranks, 1, num_ep_ranks)
    if num_ep_ranks % num_tp_ranks:
        raise ValueError(f"num_tp_ranks must divide num_ep_ranks={num_ep_ranks}, got {num_tp_ranks}")
    _check_int("tp_rank", tp_rank, 0, num_tp_ranks - 1)


def mask_indices_by_tp(indices: torch.Tensor, n: int, num_ep_ranks: int, tp_rank: int,
                       num_tp_ranks: int) -> torch.Tensor:
    """int64 (T, K): each entry v >= 0 held by a rank r = v // per_gpu with r mod num_tp_ranks = tp_rank,
    rewritten as (r // num_tp_ranks) * per_gpu + v mod per_gpu (per_gpu = n / num_ep_ranks); every other
    entry -1.  Exact integer arithmetic; no host sync."""
    _check_mask_indices_by_tp_args(indices, n, num_ep_ranks, tp_rank, num_tp_ranks)
    per_gpu = int(n) // int(num_ep_ranks)
    valid = indices >= 0
    v = torch.where(valid, indices, torch.zeros_like(indices))  # negatives divide as 0, then become -1
    rank, within = v // per_gpu, v % per_gpu
    local = (rank // int(num_tp_ranks)) * per_gpu + within
    keep = valid & (rank % int(num_tp_ranks) == int(tp_rank))
    return torch.where(keep, local, torch.full_like(indices, DROPPED))


def _check_top2_sum_gate_args(logits: object, bias: object, num_topk: object, num_topk_groups: object,
                              num_groups: object, routed_scaling_factor: object, scoring_func: object,
                              mask: object) -> None:
    check_tensor("logits", logits, (torch.float32,), 2, "(T, E)")
    check_contiguous("logits", logits)
    num_tokens, num_experts = logits.shape
    if not 1 <= num_experts <= MAX_EXPERTS:
        raise ValueError(f"logits must have 1 <= E <= {MAX_EXPERTS} experts, got E={num_experts}")
    check_tensor("bias", bias, (torch.float32,), 1, "(E,)")
    check_contiguous("bias", bias)
    if bias.shape[0] != num_experts or bias.device != logits.device:
        raise ValueError(f"bias must be ({num_experts},) on {logits.device}, got {tuple(bias.shape)} on {bias.device}")
    num_groups = _check_int("num_groups", num_groups, 1, MAX_GROUPS)
    if num_experts % num_groups:
        raise ValueError(f"num_groups must divide E={num_experts}, got {num_groups}")
    per_group = num_experts // num_groups
    num_topk_groups = _check_int("num_topk_groups", num_topk_groups, 1 if per_group > 1 else num_groups, num_groups)
    _check_int("num_topk", num_topk, 1, min(MAX_K, num_topk_groups * per_group))
    if isinstance(routed_scaling_factor, bool) or not isinstance(routed_scaling_factor, numbers.Real):
        raise TypeError(f"routed_scaling_factor must be a float, got {type(routed_scaling_factor).__name__}")
    if not (math.isfinite(routed_scaling_factor) and routed_scaling_factor > 0):
        raise ValueError(f"routed_scaling_factor must be finite and positive, got {routed_scaling_factor}")
    if scoring_func not in SCORING_FUNCS:
        raise ValueError(f"scoring_func must be one of {SCORING_FUNCS}, got {scoring_func!r}")
    if mask is not None:
        check_tensor("mask", mask, (torch.bool,), 1, "(T,)")
        check_contiguous("mask", mask)
        if mask.shape[0] != num_tokens or mask.device != logits.device:
            raise ValueError(f"mask must be ({num_tokens},) on {logits.device}, "
                             f"got {tuple(mask.shape)} on {mask.device}")


def _gate_scores(logits: torch.Tensor, scoring_func: str) -> torch.Tensor:
    """float32 (T, E): sigmoid, sqrt(softplus) (softplus as max(x, 0) + log1p(e^-|x|), accurate at both
    ends) or the row's softmax e^(x - m) / sum (m the row's largest: NaN or +inf make the row NaN)."""
    if scoring_func == "sigmoid":
        return 1.0 / (1.0 + torch.exp(-logits))
    if scoring_func == "sqrtsoftplus":
        softplus = torch.clamp_min(logits, 0.0) + torch.log1p(torch.exp(-logits.abs()))
        return torch.sqrt(torch.where(logits.isnan(), logits, softplus))
    if logits.shape[0] == 0:
        return logits.clone()
    e = torch.exp(logits - logits.amax(dim=1, keepdim=True))
    return e / e.sum(dim=1, keepdim=True)


def top2_sum_gate(logits: torch.Tensor, bias: torch.Tensor, num_topk: int, num_topk_groups: int, num_groups: int,
                  routed_scaling_factor: float, scoring_func: str,
                  mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_idx int64 (T, K), topk_weights float32 (T, K)): the num_topk best experts of each token's
    num_topk_groups best groups (a group's key the float32 sum of its two largest keys, key = score + bias),
    best first in moe.topk_gate's order, and scale * s / (sum of the chosen s + 1e-20).  No host sync."""
    _check_top2_sum_gate_args(logits, bias, num_topk, num_topk_groups, num_groups, routed_scaling_factor,
                              scoring_func, mask)
    num_tokens, num_experts = logits.shape
    per_group = num_experts // num_groups
    scores = _gate_scores(logits, scoring_func)
    keys = scores + bias
    if num_topk_groups < num_groups:
        best = topk_sum_and_topk_group_idx(keys.view(num_tokens, num_groups, per_group), 2, num_topk_groups)
        chosen = torch.zeros(num_tokens, num_groups, dtype=torch.bool, device=logits.device)
        chosen.scatter_(1, best, True)
        allowed = chosen.repeat_interleave(per_group, dim=1)
    else:
        allowed = torch.ones_like(keys, dtype=torch.bool)
    index = torch.arange(num_experts, device=logits.device)
    packed = torch.where(allowed, _order_keys(keys), torch.full_like(index, _EXCLUDED_KEY))
    packed = packed * (1 << _INDEX_BITS) + (num_experts - 1 - index)  # unique: ties to the lower index
    topk_idx = torch.topk(packed, int(num_topk), dim=1, largest=True, sorted=True).indices
    chosen_scores = scores.gather(1, topk_idx)
    denominator = chosen_scores.sum(dim=1, keepdim=True) + EPSILON
    topk_weights = chosen_scores / denominator * float(routed_scaling_factor)
    if mask is not None:
        routed = mask.unsqueeze(1)
        topk_idx = torch.where(routed, topk_idx, torch.full_like(topk_idx, DROPPED))
        topk_weights = torch.where(routed, topk_weights, torch.zeros_like(topk_weights))
    return topk_idx.contiguous(), topk_weights.contiguous()
