"""Oracles of tile-kernels 1.0's grouped gate and its tensor-parallel masking (docs/contract/moe_tp.md).

* `top2_sum_gate`: DeepSeek-V3's group-limited routing from the logits.  Each expert's score s = f(logit)
  (sigmoid, sqrt(softplus) or the row's softmax) plus its bias is its key; a group's key is the sum of
  its two largest keys; the num_topk_groups best groups are chosen, then the num_topk best experts of
  those groups, best first; each chosen expert's weight is routed_scaling_factor * s / (sum of the
  chosen s + 1e-20).  Keys rank in moe.topk_gate's total order (NaN first, ties to the lower index).
  A token whose mask is False is routed nowhere: -1 and weight 0 in every slot.
* `mask_indices_by_tp`: global expert indices rewritten into the expert numbering of one tensor-parallel
  rank.  n experts lie on num_ep_ranks ranks, per_gpu = n / num_ep_ranks consecutive experts a rank; rank
  r = d * num_tp_ranks + t is data-parallel group d's tensor-parallel rank t.  An expert v = r * per_gpu + j
  (0 <= j < per_gpu) held by a rank of tensor-parallel rank tp_rank (r mod num_tp_ranks = tp_rank) becomes
  d * per_gpu + j, its place among the experts of the ranks that share tp_rank; every other entry,
  negative ones (dropped slots) included, becomes -1.

Indices are int64 NumPy arrays, weights float64 ones.
"""

from __future__ import annotations

import numpy as np
import torch

from references import as_float64

DROPPED = -1  # an entry that no expert of the rank holds; also every slot of a token that is not routed
SCORING_FUNCS = ("sigmoid", "sqrtsoftplus", "softmax")
EPSILON = float(np.float32(1e-20))  # added to the weights' denominator (DeepSeek-V3's), as the float32 it is


def gate_scores(logits: torch.Tensor | np.ndarray, scoring_func: str) -> np.ndarray:
    """float64 (T, E): each expert's score, IEEE arithmetic on the exact logits.

    sigmoid 1 / (1 + e^-x); sqrtsoftplus sqrt(log(1 + e^x)); softmax e^(x - m) / sum e^(x - m), m the row's
    largest logit, so a row holding NaN or +inf, or only -inf, is NaN throughout."""
    x = as_float64(logits)
    with np.errstate(all="ignore"):
        if scoring_func == "sigmoid":
            return 1.0 / (1.0 + np.exp(-x))
        if scoring_func == "sqrtsoftplus":
            return np.sqrt(np.logaddexp(0.0, x))
        if scoring_func == "softmax":
            if x.shape[0] == 0:
                return x.copy()
            e = np.exp(x - x.max(axis=1, keepdims=True))
            return e / e.sum(axis=1, keepdims=True)
    raise ValueError(f"scoring_func must be one of {SCORING_FUNCS}, got {scoring_func!r}")


def input_ids(logits: torch.Tensor | np.ndarray, bias: torch.Tensor | np.ndarray) -> np.ndarray:
    """int64 (T, E): equal for two experts of a row whose logits are equal and whose biases are equal (-0.0 =
    +0.0, every NaN one value): experts whose keys every deterministic implementation computes equal."""
    x = as_float64(logits)
    b = np.broadcast_to(as_float64(bias).reshape(1, -1), x.shape)

    def bits(v: np.ndarray) -> np.ndarray:
        v32 = np.where(np.isnan(v), np.nan, v + 0.0).astype(np.float32)
        return v32.view(np.uint32).astype(np.int64)

    return bits(x) << 32 | bits(b)


def ranked(values: np.ndarray, excluded: np.ndarray | None = None) -> np.ndarray:
    """Per row, the column indices in moe.topk_gate's order (every NaN first, then descending, -0.0 equal
    to +0.0, equal values by the lower index), the `excluded` columns after all others."""
    is_nan = np.isnan(values)
    descending = np.where(is_nan, 0.0, -values) + 0.0
    index = np.broadcast_to(np.arange(values.shape[1]), values.shape)
    last = np.zeros(values.shape, dtype=bool) if excluded is None else excluded
    return np.lexsort((index, descending, ~is_nan, last), axis=-1)


def group_keys(keys: np.ndarray, num_groups: int) -> np.ndarray:
    """float64 (T, G): the exact sum of each group's two largest keys (moe.topk_gate's order: a NaN key
    is among them, +inf beside -inf sums to NaN)."""
    num_tokens, num_experts = keys.shape
    grouped = keys.reshape(num_tokens * num_groups, num_experts // num_groups)
    top = np.take_along_axis(grouped, ranked(grouped)[:, :2], axis=1)
    with np.errstate(invalid="ignore"):
        return (top[:, 0] + top[:, 1]).reshape(num_tokens, num_groups)


def chosen_groups(keys: np.ndarray, num_groups: int, num_topk_groups: int) -> np.ndarray:
    """bool (T, G): the num_topk_groups best groups of each token by `group_keys`; all when it is G."""
    num_tokens = keys.shape[0]
    chosen = np.zeros((num_tokens, num_groups), dtype=bool)
    if num_topk_groups == num_groups:
        chosen[:] = True
        return chosen
    best = ranked(group_keys(keys, num_groups))[:, :num_topk_groups]
    np.put_along_axis(chosen, best, True, axis=1)
    return chosen


def gate_weights(scores: np.ndarray, topk_idx: np.ndarray, routed_scaling_factor: float) -> np.ndarray:
    """float64 (T, K): scale * s / (sum of the row's chosen s + EPSILON) for the chosen experts in topk_idx,
    0 in a row of -1 (a token not routed)."""
    routed = (topk_idx >= 0).all(axis=1, keepdims=True)
    chosen = np.take_along_axis(scores, np.where(topk_idx >= 0, topk_idx, 0), axis=1)
    with np.errstate(all="ignore"):
        w = routed_scaling_factor * chosen / (chosen.sum(axis=1, keepdims=True) + EPSILON)
    return np.where(routed, w, 0.0)


def top2_sum_gate(logits: torch.Tensor | np.ndarray, bias: torch.Tensor | np.ndarray, num_topk: int,
                  num_topk_groups: int, num_groups: int, routed_scaling_factor: float, scoring_func: str,
                  mask: torch.Tensor | np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(topk_idx int64 (T, K), topk_weights float64 (T, K)): each token's num_topk best experts of its
    num_topk_groups best groups, best first by key = score + bias, and their normalised, scaled scores."""
    scores = gate_scores(logits, scoring_func)
    num_tokens, num_experts = scores.shape
    if num_groups < 1 or num_experts % num_groups:
        raise ValueError(f"num_groups must divide E={num_experts}, got {num_groups}")
    per_group = num_experts // num_groups
    if not 1 <= num_topk_groups <= num_groups or (num_topk_groups < num_groups and per_group < 2):
        raise ValueError(f"num_topk_groups must be in [1, G={num_groups}] (G when groups have one expert), "
                         f"got {num_topk_groups}")
    if not 1 <= num_topk <= num_topk_groups * per_group:
        raise ValueError(f"num_topk must be in [1, {num_topk_groups * per_group}], got {num_topk}")
    with np.errstate(invalid="ignore"):
        keys = scores + as_float64(bias)[None, :]
    excluded = ~np.repeat(chosen_groups(keys, num_groups, num_topk_groups), per_group, axis=1)
    topk_idx = ranked(keys, excluded)[:, :num_topk].astype(np.int64)
    if mask is not None:
        routed = np.asarray(mask.detach().cpu() if isinstance(mask, torch.Tensor) else mask, dtype=bool)
        topk_idx[~routed] = DROPPED
    return topk_idx, gate_weights(scores, topk_idx, routed_scaling_factor)


def _int64(x: torch.Tensor | np.ndarray, name: str) -> np.ndarray:
    a = x.detach().to("cpu", torch.int64).numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.int64)
    if a.ndim != 2:
        raise ValueError(f"{name} must be 2-D (T, K), got shape {a.shape}")
    return a


def mask_indices_by_tp(indices: torch.Tensor | np.ndarray, n: int, num_ep_ranks: int, tp_rank: int,
                       num_tp_ranks: int) -> np.ndarray:
    """int64 (T, K): each entry v >= 0 whose expert rank r = v // per_gpu has r mod num_tp_ranks = tp_rank
    becomes (r // num_tp_ranks) * per_gpu + v mod per_gpu; every other entry becomes -1."""
    idx = _int64(indices, "indices")
    if not 1 <= num_ep_ranks <= n or n % num_ep_ranks:
        raise ValueError(f"num_ep_ranks must divide n={n}, got {num_ep_ranks}")
    if not 1 <= num_tp_ranks <= num_ep_ranks or num_ep_ranks % num_tp_ranks:
        raise ValueError(f"num_tp_ranks must divide num_ep_ranks={num_ep_ranks}, got {num_tp_ranks}")
    if not 0 <= tp_rank < num_tp_ranks:
        raise ValueError(f"tp_rank must be in [0, {num_tp_ranks}), got {tp_rank}")
    per_gpu = n // num_ep_ranks
    valid = idx >= 0
    v = np.where(valid, idx, 0)  # negative entries divide as 0 here and become -1 below
    rank, within = v // per_gpu, v % per_gpu
    local = (rank // num_tp_ranks) * per_gpu + within
    return np.where(valid & (rank % num_tp_ranks == tp_rank), local, DROPPED).astype(np.int64)
