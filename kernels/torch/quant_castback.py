"""Eager PyTorch quantisation round trips, each a composition of the eager quant ops
(contract: docs/contract/quant_castback.md).  The TileLang versions in ``kernels.quant.quant_castback``
compose the TileLang kernels the same way, with the same names and signatures.

    per_token_cast_and_cast_back(x, fmt="e4m3", num_per_channels=128, *, round_sf=False,
                                 clamp_min=None) -> out
        cast_back(*per_token_cast(x, fmt, num_per_channels, round_sf=round_sf, clamp_min=clamp_min),
                  fmt, (1, num_per_channels), out_dtype=x.dtype): the fake-quantised x, a new (T, H)
        tensor of x's dtype (x itself is not written).
    unpack_from_e2m1fn_x2(x, out_dtype=torch.float32) -> out
        packed e2m1 codes (..., K), int8 or uint8, contiguous, K >= 1, decoded to (..., 2K) in
        out_dtype (bfloat16 or float32, or their names): cast_back of the codes with a unit sf.

The arguments are checked by the composed ops (per_token_cast's x, fmt, num_per_channels, round_sf
and clamp_min; cast_back's out_dtype) and, for unpack, x's dtype, dimensions and layout here: bad
arguments raise TypeError or ValueError naming the argument.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from . import quant
from ._checks import check_contiguous


def check_unpack_args(x: object, out_dtype: object) -> torch.Tensor:
    """unpack's arguments: x an int8 or uint8 tensor of at least one dimension, contiguous, its last dimension
    >= 1; out_dtype bf16 or fp32 (a dtype or its name), as cast_back takes it.  Returns x."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.int8, torch.uint8):
        raise TypeError(f"x must have dtype torch.int8 or torch.uint8 (two e2m1 codes a byte), got {x.dtype}")
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"x must have at least one dimension and a last dimension of at least one byte, "
                         f"got shape {tuple(x.shape)}")
    check_contiguous("x", x)
    if isinstance(out_dtype, str):
        if out_dtype not in quant.OUT_DTYPES:
            raise ValueError(f"out_dtype must be one of {', '.join(quant.OUT_DTYPES)}, got {out_dtype!r}")
    elif out_dtype not in (torch.bfloat16, torch.float32):
        raise TypeError(f"out_dtype must be torch.bfloat16 or torch.float32, got {out_dtype!r}")
    return x


def round_trip(cast: Callable[..., Any], cast_back: Callable[..., Any], x: torch.Tensor, fmt: str,
               num_per_channels: int, round_sf: bool, clamp_min: float | None) -> torch.Tensor:
    """cast_back(cast(x)) in x's dtype, for one pair of implementations of the two ops."""
    data, sf = cast(x, fmt, num_per_channels, round_sf=round_sf, clamp_min=clamp_min)
    return cast_back(data, sf, fmt, (1, int(num_per_channels)), out_dtype=x.dtype)


def unpack_rows(cast_back: Callable[..., Any], x: torch.Tensor, out_dtype: Any) -> torch.Tensor:
    """cast_back of packed e2m1 codes (..., K) with a unit sf, as (..., 2K), for one cast_back."""
    check_unpack_args(x, out_dtype)
    lead, width = tuple(x.shape[:-1]), x.shape[-1]
    rows = x.reshape(-1, width).view(torch.int8)
    unit = torch.ones((rows.shape[0], 1), dtype=torch.float32, device=x.device)
    return cast_back(rows, unit, "e2m1", (1, 2 * width), out_dtype=out_dtype).reshape(*lead, 2 * width)


def per_token_cast_and_cast_back(x: torch.Tensor, fmt: str = "e4m3", num_per_channels: int = 128, *,
                                 round_sf: bool = False, clamp_min: float | None = None) -> torch.Tensor:
    """The fake-quantised x: per_token_cast, then cast_back to x's dtype (a new tensor)."""
    return round_trip(quant.per_token_cast, quant.cast_back, x, fmt, num_per_channels, round_sf, clamp_min)


def unpack_from_e2m1fn_x2(x: torch.Tensor, out_dtype: Any = torch.float32) -> torch.Tensor:
    """The e2m1 values of packed codes (..., K) as (..., 2K), the low nibble first."""
    return unpack_rows(quant.cast_back, x, out_dtype)
