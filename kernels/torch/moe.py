"""Eager PyTorch MoE routing operators."""

from __future__ import annotations

import numbers

import torch

# The limits every topk_gate implementation in tkverify supports.
MAX_EXPERTS = 1024
MAX_K = 32


def _check_topk_gate_args(scores: object, k: object) -> None:
    if not isinstance(scores, torch.Tensor):
        raise TypeError(f"scores must be a torch.Tensor, got {type(scores).__name__}")
    if scores.dtype != torch.float32:
        raise TypeError(f"scores must have dtype torch.float32, got {scores.dtype}")
    if scores.dim() != 2:
        raise ValueError(f"scores must be 2-D (T, E), got shape {tuple(scores.shape)}")
    num_experts = scores.shape[1]
    if not 1 <= num_experts <= MAX_EXPERTS:
        raise ValueError(f"scores must have 1 <= E <= {MAX_EXPERTS} columns (experts), got E={num_experts}")
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    if not 1 <= k <= min(MAX_K, num_experts):
        raise ValueError(f"k must satisfy 1 <= k <= min({MAX_K}, E={num_experts}), got k={k}")


def topk_gate(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest scores per row, int64 (T, k), on scores' device.

    A stable descending sort: ties go to the lower index, NaN sorts above
    +inf and -inf below every finite value, as OPS.md defines the operator.
    """
    _check_topk_gate_args(scores, k)
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices
    return order[:, : int(k)].contiguous()
