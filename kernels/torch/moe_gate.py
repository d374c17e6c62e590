"""Eager PyTorch sqrt-softplus scored top-k gate and its backward, on the inputs' device; the contract is
docs/contract/moe_gate.md.  ``kernels.moe.gate_scored`` has the same signatures and argument checks.

Signatures
----------
    topk_gate_scored(logits, bias, k, routed_scaling_factor) -> (topk_idx, topk_weights, scores)
    topk_gate_scored_bwd(grad_topk_weights, logits, bias, topk_idx, topk_weights, scores, k,
                         routed_scaling_factor) -> grad_logits

Tensors (T tokens, E experts)
-----------------------------
logits                float32 (T, E), contiguous, 1 <= E <= 1024.
bias                  float32 (E,), contiguous, on logits' device: added to the scores for the selection only.
k                     int, 1 <= k <= min(32, E).
routed_scaling_factor a finite python float (or int).
scores                float32 (T, E): sqrt(softplus(logits)).
topk_idx              int64 (T, k): the k largest scores + bias (float32 sum), moe.topk_gate's order.
topk_weights          float32 (T, k): routed_scaling_factor * u_j / (sum_j u_j + 1e-20), u_j the selected scores.
grad_topk_weights     float32 (T, k), the cotangent of topk_weights.
grad_logits           float32 (T, E): zero outside the selected experts.
"""

from __future__ import annotations

import math
import numbers

import torch

from ._checks import check_contiguous, check_tensor
from .moe import MAX_EXPERTS, MAX_K, _check_int, topk_gate

NORMALIZE_EPS = 1e-20
# Below this squared score, -expm1(-s) / (2 u) is evaluated as its series u / 2 (1 - s / 2): the next term,
# s^2 / 6 relative, is under 2^-25 there, and the series has no underflow of s for tiny u.
_SERIES_BELOW = 2.0**-12


def _check_gate_args(logits: object, bias: object, k: object, routed_scaling_factor: object) -> int:
    """The forward's argument checks; returns k as an int."""
    check_tensor("logits", logits, (torch.float32,), 2, "(T, E)")
    check_contiguous("logits", logits)
    num_experts = logits.shape[1]
    if not 1 <= num_experts <= MAX_EXPERTS:
        raise ValueError(f"logits must have 1 <= E <= {MAX_EXPERTS} columns (experts), got E={num_experts}")
    check_tensor("bias", bias, (torch.float32,), 1, "(E,)")
    check_contiguous("bias", bias)
    if bias.shape[0] != num_experts:
        raise ValueError(f"bias must have E={num_experts} elements, got {bias.shape[0]}")
    if bias.device != logits.device:
        raise ValueError(f"bias must be on logits' device {logits.device}, got {bias.device}")
    k = _check_int("k", k, 1, min(MAX_K, num_experts))
    if isinstance(routed_scaling_factor, bool) or not isinstance(routed_scaling_factor, numbers.Real):
        raise TypeError(f"routed_scaling_factor must be a float, got {type(routed_scaling_factor).__name__}")
    if not math.isfinite(routed_scaling_factor):
        raise ValueError(f"routed_scaling_factor must be finite, got {routed_scaling_factor}")
    return k


def _check_gate_bwd_args(grad_topk_weights: object, logits: object, bias: object, topk_idx: object,
                        topk_weights: object, scores: object, k: object, routed_scaling_factor: object) -> int:
    """The backward's argument checks (the forward's, and the saved outputs' shapes); returns k."""
    k = _check_gate_args(logits, bias, k, routed_scaling_factor)
    num_tokens = logits.shape[0]
    for name, t, dtype in (("grad_topk_weights", grad_topk_weights, torch.float32), ("topk_idx", topk_idx, torch.int64),
                           ("topk_weights", topk_weights, torch.float32)):
        check_tensor(name, t, (dtype,), 2, "(T, k)")
        check_contiguous(name, t)
        if t.device != logits.device:
            raise ValueError(f"{name} must be on logits' device {logits.device}, got {t.device}")
        if tuple(t.shape) != (num_tokens, k):
            raise ValueError(f"{name} must have shape (T, k) = {(num_tokens, k)}, got {tuple(t.shape)}")
    check_tensor("scores", scores, (torch.float32,), 2, "(T, E)")
    check_contiguous("scores", scores)
    if scores.device != logits.device:
        raise ValueError(f"scores must be on logits' device {logits.device}, got {scores.device}")
    if scores.shape != logits.shape:
        raise ValueError(f"scores must have logits' shape {tuple(logits.shape)}, got {tuple(scores.shape)}")
    return k


def _sqrt_softplus(logits: torch.Tensor) -> torch.Tensor:
    """sqrt(log1p(exp(x))) in float32 (x itself above 20, where log1p(e^-x) < 2^-28 x)."""
    return torch.sqrt(torch.nn.functional.softplus(logits))


def topk_gate_scored(logits: torch.Tensor, bias: torch.Tensor, k: int, routed_scaling_factor: float):
    """(topk_idx int64 (T, k), topk_weights float32 (T, k), scores float32 (T, E)) (module docstring)."""
    k = _check_gate_args(logits, bias, k, routed_scaling_factor)
    scores = _sqrt_softplus(logits)
    topk_idx = topk_gate(scores + bias, k)
    picked = scores.gather(1, topk_idx)
    denom = picked.sum(dim=1, keepdim=True) + NORMALIZE_EPS
    topk_weights = (float(routed_scaling_factor) * picked / denom).contiguous()
    return topk_idx, topk_weights, scores


def _sqrt_softplus_derivative_from_score(u: torch.Tensor) -> torch.Tensor:
    """d sqrt(softplus(x)) / dx from u = sqrt(softplus(x)): sigmoid(x) = 1 - e^-softplus(x) = -expm1(-u^2),
    over 2 u; the series u / 2 (1 - u^2 / 2) for small u, 0 at u = 0 and at u = +inf."""
    s = u * u
    series = 0.5 * u * (1.0 - 0.5 * s)
    direct = -torch.expm1(-s) / (2.0 * u)
    return torch.where(s < _SERIES_BELOW, series, direct)


def topk_gate_scored_bwd(grad_topk_weights: torch.Tensor, logits: torch.Tensor, bias: torch.Tensor,
                         topk_idx: torch.Tensor, topk_weights: torch.Tensor, scores: torch.Tensor, k: int,
                         routed_scaling_factor: float) -> torch.Tensor:
    """grad_logits float32 (T, E) from the forward's saved topk_idx, topk_weights and scores:
    (routed_scaling_factor g_j - <g, w>) / D times du/dx at each selected expert, zero elsewhere."""
    _check_gate_bwd_args(grad_topk_weights, logits, bias, topk_idx, topk_weights, scores, k, routed_scaling_factor)
    picked = scores.gather(1, topk_idx)
    denom = picked.sum(dim=1, keepdim=True) + NORMALIZE_EPS
    inner = (grad_topk_weights * topk_weights).sum(dim=1, keepdim=True)
    grad_picked = (float(routed_scaling_factor) * grad_topk_weights - inner) / denom
    grad_picked = grad_picked * _sqrt_softplus_derivative_from_score(picked)
    return torch.zeros_like(scores).scatter_(1, topk_idx, grad_picked)
