"""Eager PyTorch transposes (any dtype of 1, 2 or 4 bytes, moved bitwise)."""

from __future__ import annotations

import torch

from ._checks import check_rows

SUPPORTED_ELEMENT_SIZES = (1, 2, 4)


def _check_transpose_arg(x: object, ndim: int, layout: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.element_size() not in SUPPORTED_ELEMENT_SIZES:
        raise TypeError(
            f"x must have a dtype of 1, 2 or 4 bytes (e.g. float8_e4m3fn, bfloat16, float32), "
            f"got {x.dtype} of {x.element_size()} bytes"
        )
    if x.dim() != ndim:
        raise ValueError(f"x must be {ndim}-D {layout}, got shape {tuple(x.shape)}")
    # Rows at any row stride (and a batch at any batch stride), as tile-kernels' transpose takes them.
    check_rows("x", x)


def _contiguous_copy(x: torch.Tensor) -> torch.Tensor:
    # Not .contiguous(): torch deems every empty tensor contiguous and keeps
    # the transposed strides, which byte views (x.view(torch.uint8)) reject.
    return x.clone(memory_format=torch.contiguous_format)


def transpose(x: torch.Tensor) -> torch.Tensor:
    """out[j, i] = x[i, j] for x of shape (M, N) with contiguous rows (any row stride); out is contiguous,
    on x's device."""
    _check_transpose_arg(x, 2, "(M, N)")
    return _contiguous_copy(x.transpose(-1, -2))


def batched_transpose(x: torch.Tensor) -> torch.Tensor:
    """out[b, j, i] = x[b, i, j] for x of shape (B, M, N) with contiguous rows (any row and batch
    strides); out is contiguous, on x's device."""
    _check_transpose_arg(x, 3, "(B, M, N)")
    return _contiguous_copy(x.transpose(-1, -2))
