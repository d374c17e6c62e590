"""Float64 oracle of moe.topk_gate_scored, the sqrt-softplus scored top-k gate (docs/contract/moe_gate.md).

    scores = sqrt(softplus(logits)),  softplus(x) = log(1 + e^x)
    topk_idx = the k largest keys scores + bias of each row, in moe.topk_gate's order
    topk_weights[j] = routed_scaling_factor * u_j / (sum_j u_j + 1e-20),  u_j = scores[topk_idx[j]]

Written from the contract: softplus as ``log(1 + e^x)`` evaluated by `numpy.logaddexp` (no overflow, no
cancellation, exact at +-inf), the order of the keys by `references.moe.topk_gate`.  The oracle ranks the
float64 keys; the judging of an implementation ranks its own float32 scores plus the bias in float32
(`selection_given_scores`), since the contract defines the selection on the scores the op returns.

The backward (`topk_gate_scored_bwd`) is derived by hand.  With S = <g, w>, for a selected expert j
    dL/du_j = (routed_scaling_factor * g_j - S) / D,   D = sum_j u_j + 1e-20,
and du/dx = sigmoid(x) / (2 u); every expert not selected gets a zero gradient.  The selection is piecewise
constant in the logits, so the derivative holds away from ties among the first k + 1 keys of a row
(`near_kink_rows`).
"""

from __future__ import annotations

import numpy as np
import torch

import references.moe
from references import as_float64

NORMALIZE_EPS = 1e-20
# A float32 score may be off by 2^-63 absolutely where e^x leaves the float32 range (the contract's score
# bound); the backward is judged only where every selected score is at least 2^23 times that, so that this
# floor stays within 2^-23 of each selected score.
SMALLEST_JUDGED_SCORE = 2.0**-40


def sqrt_softplus(logits) -> np.ndarray:
    """sqrt(log(1 + e^x)) in float64: NaN -> NaN, +inf -> +inf, -inf -> 0."""
    x = as_float64(logits)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.sqrt(np.logaddexp(0.0, x))


def sqrt_softplus_derivative(logits) -> np.ndarray:
    """d sqrt(softplus(x)) / dx = sigmoid(x) / (2 sqrt(softplus(x))), float64; 0 where the score is 0 or +inf."""
    x = as_float64(logits)
    u = sqrt_softplus(x)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        # exp(-softplus(-x)): no overflow at either end, and no cancellation for very negative x, where
        # 0.5 (1 + tanh(x / 2)) rounds to 0 below about -37 (tanh(x / 2) = -1 + 2 e^x in float64)
        sigmoid = np.exp(-np.logaddexp(0.0, -x))
        out = sigmoid / (2.0 * u)
    return np.where((u > 0) & np.isfinite(u), out, 0.0)


def selection_keys(scores, bias) -> np.ndarray:
    """The keys the gate ranks, scores + bias per row, in float64 (exact for float32 inputs but for overflow)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return as_float64(scores) + as_float64(bias)[None, :]


def selection_given_scores(scores: torch.Tensor, bias: torch.Tensor, k: int) -> np.ndarray:
    """topk_idx for float32 scores: the float32 sum scores + bias ranked in moe.topk_gate's order."""
    keys = scores.detach().cpu().float() + bias.detach().cpu().float()[None, :]
    return references.moe.topk_gate(keys, k)


def weights_given_selection(scores, topk_idx: np.ndarray, routed_scaling_factor: float) -> np.ndarray:
    """routed_scaling_factor * u_j / (sum_j u_j + 1e-20) in float64 for the selected scores u_j, with the
    float32 rounding of routed_scaling_factor, as the op takes it (IEEE arithmetic: a selected NaN makes
    its row NaN, a selected +inf makes it NaN there and 0 elsewhere)."""
    u = as_float64(scores)
    picked = np.take_along_axis(u, np.asarray(topk_idx, dtype=np.int64), axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        denom = picked.sum(axis=1, keepdims=True) + NORMALIZE_EPS
        return float(np.float32(routed_scaling_factor)) * picked / denom


def topk_gate_scored(logits, bias, k: int, routed_scaling_factor: float):
    """(topk_idx int64 (T, k), topk_weights float64 (T, k), scores float64 (T, E)), exactly."""
    x = as_float64(logits)
    if x.ndim != 2:
        raise ValueError(f"logits must be 2-D (T, E), got shape {x.shape}")
    scores = sqrt_softplus(x)
    topk_idx = references.moe.topk_gate(selection_keys(scores, bias), k)
    return topk_idx, weights_given_selection(scores, topk_idx, routed_scaling_factor), scores


def near_kink_rows(logits, bias, k: int, margin: float) -> np.ndarray:
    """Rows (bool (T,)) where the backward is not judged: two of the first k + 1 keys within `margin` of each
    other, relative to |u| + |bias| of both (there the selection, or the slot an expert takes, may change
    under a perturbation or a float32 evaluation); a non-finite key; or a selected score below
    SMALLEST_JUDGED_SCORE (docs/contract/moe_gate.md#backward)."""
    u = sqrt_softplus(logits)
    b = as_float64(bias)
    keys = selection_keys(u, b)
    num_tokens, num_experts = keys.shape
    if num_tokens == 0:
        return np.zeros(0, dtype=bool)
    order = references.moe.topk_gate(keys, min(k + 1, num_experts))
    ranked = np.take_along_axis(keys, order, axis=1)
    size = np.take_along_axis(np.abs(u) + np.abs(b)[None, :], order, axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        gaps = np.abs(np.diff(ranked, axis=1))
        close = (gaps <= margin * (size[:, 1:] + size[:, :-1])).any(axis=1)
    tiny = (np.take_along_axis(u, order[:, :k], axis=1) < SMALLEST_JUDGED_SCORE).any(axis=1)
    return close | tiny | ~np.isfinite(keys).all(axis=1)


def topk_gate_scored_bwd(grad_topk_weights, logits, bias, k: int, routed_scaling_factor: float) -> np.ndarray:
    """grad_logits (T, E) float64 for the cotangent of topk_weights, by the hand-derived formula above."""
    x = as_float64(logits)
    g = as_float64(grad_topk_weights)
    grad = np.zeros(x.shape, dtype=np.float64)
    # A row no cotangent reaches contributes nothing, even where its forward is NaN (0 * NaN would say otherwise).
    active = (g != 0).any(axis=1)
    if not active.any():
        return grad
    x, g = x[active], g[active]
    topk_idx, weights, scores = topk_gate_scored(x, bias, k, routed_scaling_factor)
    picked = np.take_along_axis(scores, topk_idx, axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        denom = picked.sum(axis=1, keepdims=True) + NORMALIZE_EPS
        inner = (g * weights).sum(axis=1, keepdims=True)
        grad_scores = (float(np.float32(routed_scaling_factor)) * g - inner) / denom
    derivative = np.take_along_axis(sqrt_softplus_derivative(x), topk_idx, axis=1)
    rows = np.zeros(x.shape, dtype=np.float64)
    np.put_along_axis(rows, topk_idx, grad_scores * derivative, axis=1)
    grad[active] = rows
    return grad
