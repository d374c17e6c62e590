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


def check_contiguous(name: str, t: torch.Tensor, why: str = "") -> None:
    """A contiguous tensor (any storage offset); `why` is appended to the error."""
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous{why}, got strides {t.stride()} for shape {tuple(t.shape)}")


def check_dense_rows(name: str, t: torch.Tensor) -> None:
    """For the TileLang wrappers, after the eager checks (`check_rows`) let a row stride through: their
    kernels read `name` as one dense block of rows and take no row stride yet, so refuse it by name."""
    check_contiguous(name, t, " (the TileLang kernel reads it as dense rows and takes no row stride)")


def rows_aligned(t: torch.Tensor, nbytes: int) -> bool:
    """Whether every row of `t` (rows: its last dimension, at any leading strides) starts on an `nbytes`
    boundary: the data pointer and each leading stride of a dimension of more than one element, in
    bytes, are multiples of `nbytes` (the vector loads of a TileLang kernel reading `t` in place)."""
    if t.data_ptr() % nbytes:
        return False
    return all(stride * t.element_size() % nbytes == 0 for size, stride in zip(t.shape[:-1], t.stride()[:-1])
               if size > 1)


def span_view(t: torch.Tensor) -> torch.Tensor:
    """`t`'s memory from its first element to its last as one flat view of its dtype (no copy; the
    padding between rows included): what a TileLang kernel reading `t` at explicit strides takes.
    `t` has at least one element and non-negative strides."""
    extent = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()) if size > 1)
    return torch.as_strided(t, (extent,), (1,))


def check_rows(name: str, t: torch.Tensor) -> None:
    """Contiguous rows in any row layout: the last dimension's stride is 1 (where it holds more than one
    element) and no two elements share memory; the leading strides are free (a slice ``buf[..., :n]`` of
    a wider buffer, a slice of a batch).  torch has no negative strides, so none needs refusing."""
    if t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dimension (stride 1), got strides {t.stride()} "
                         f"for shape {tuple(t.shape)}")
    if overlapping(t):
        raise ValueError(f"{name} must not have overlapping elements, got strides {t.stride()} "
                         f"for shape {tuple(t.shape)}")


def overlapping(t: torch.Tensor) -> bool:
    """Whether two elements of `t` share memory: the dimensions of more than one element, taken by
    increasing stride, each step past the whole extent of the ones before it."""
    if t.numel() <= 1:
        return False
    dims = sorted((s, n) for n, s in zip(t.shape, t.stride()) if n > 1)
    extent = 1
    for stride, size in dims:
        if stride < extent:
            return True
        extent = stride * (size - 1) + extent
    return False
