"""Oracles for the transposes: they move raw bits and never touch a value.

The tensor is viewed as unsigned integers of its width and transposed by
NumPy, so that NaN payloads, -0.0 and fp8 codes survive untouched and the
result can be compared bitwise with a kernel's.
"""

from __future__ import annotations

import numpy as np
import torch

# Integer views of each element width (numpy has no bf16 or fp8).
_BITS_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _swap_last_two_axes(x: torch.Tensor) -> torch.Tensor:
    x = x.detach().cpu()
    if x.element_size() not in _BITS_VIEW:
        raise TypeError(f"x has dtype {x.dtype}, whose element size {x.element_size()} has no integer view")
    carrier = _BITS_VIEW[x.element_size()]
    # Allocated by torch and written by NumPy: torch.from_numpy would keep the
    # zero strides NumPy gives empty arrays, which torch's dtype views reject.
    out = torch.empty(x.shape[:-2] + (x.shape[-1], x.shape[-2]), dtype=carrier)
    if x.numel():
        out.numpy()[...] = np.swapaxes(x.contiguous().view(carrier).numpy(), -1, -2)
    return out.view(x.dtype)


def transpose(x: torch.Tensor) -> torch.Tensor:
    """out[j, i] = x[i, j] for x of shape (M, N): a contiguous CPU tensor of x's dtype."""
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (M, N), got shape {tuple(x.shape)}")
    return _swap_last_two_axes(x)


def batched_transpose(x: torch.Tensor) -> torch.Tensor:
    """out[b, j, i] = x[b, i, j] for x of shape (B, M, N): a contiguous CPU tensor of x's dtype."""
    if x.dim() != 3:
        raise ValueError(f"x must be 3-D (B, M, N), got shape {tuple(x.shape)}")
    return _swap_last_two_axes(x)
