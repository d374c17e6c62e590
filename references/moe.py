"""Oracles for the MoE routing operators."""

from __future__ import annotations

import numpy as np
import torch


def _as_float64(x: torch.Tensor | np.ndarray) -> np.ndarray:
    # float32 -> float64 is exact, keeps -0.0, +-inf and NaN.
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def topk_gate(scores: torch.Tensor | np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest scores of each row, int64 (T, k).

    The order is total: every NaN (whatever its sign or payload) is greater
    than +inf, finite values come in descending order, -inf is last, and
    -0.0 equals +0.0.  Equal scores are ordered by index, lowest first.

    The ranking is written out as explicit sort keys rather than delegated to
    a sort's NaN and stability conventions, so that it stays independent of
    ``torch.sort``, which the operator's contract is phrased in.
    """
    values = _as_float64(scores)
    if values.ndim != 2:
        raise ValueError(f"scores must be 2-D (T, E), got shape {values.shape}")
    num_experts = values.shape[1]
    if not 0 <= k <= num_experts:
        raise ValueError(f"k must be in [0, E={num_experts}], got {k}")

    is_nan = np.isnan(values)
    # Ascending keys, most significant last (np.lexsort's convention):
    nan_after_numbers = ~is_nan  # False (a NaN) sorts first
    # Negated for a descending order; NaNs get a dummy key; "+ 0.0" turns -0.0
    # into +0.0 so the two zeros are one key.
    descending_value = np.where(is_nan, 0.0, -values) + 0.0
    lower_index_first = np.broadcast_to(np.arange(num_experts), values.shape)
    order = np.lexsort((lower_index_first, descending_value, nan_after_numbers), axis=-1)
    return np.ascontiguousarray(order[:, :k], dtype=np.int64)
