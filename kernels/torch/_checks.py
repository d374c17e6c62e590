"""Argument checks shared by the eager modules (and, through them, the TileLang wrappers)."""

from __future__ import annotations

import torch


def check_tensor(name: str, t: object, dtypes: tuple[torch.dtype, ...], ndim: int, layout: str) -> torch.Tensor:
    """A tensor of one of `dtypes` with `ndim` dimensions (`layout` names them in the message)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype {' or '.join(str(d) for d in dtypes)}, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D {layout}, got shape {tuple(t.shape)}")
    return t


def check_contiguous(name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {t.stride()} for shape {tuple(t.shape)}")
