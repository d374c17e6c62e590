"""The quantisation round trips on the GPU, composed of our TileLang kernels (contract:
docs/contract/quant_castback.md): the same compositions as ``kernels.torch.quant_castback``, with
the TileLang per_token_cast (kernel quant.token_cast) and cast_back (kernel quant.cast_back) in place
of the eager ones.  No kernel of their own: each op is two launches (cast, then cast_back; unpack is
one cast_back with a unit sf), whose arguments the wrappers check as the eager ops do.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _tilelang
from .dequant import cast_back
from .token_cast import per_token_cast
from ..torch.quant_castback import check_unpack_args, round_trip, unpack_rows


def per_token_cast_and_cast_back(x: torch.Tensor, fmt: str = "e4m3", num_per_channels: int = 128, *,
                                 round_sf: bool = False, clamp_min: float | None = None) -> torch.Tensor:
    """The fake-quantised x: the TileLang per_token_cast, then its cast_back to x's dtype (a new tensor)."""
    return round_trip(per_token_cast, cast_back, x, fmt, num_per_channels, round_sf, clamp_min)


def unpack_from_e2m1fn_x2(x: torch.Tensor, out_dtype: Any = torch.float32) -> torch.Tensor:
    """The e2m1 values of packed codes (..., K) as (..., 2K), by the TileLang cast_back with a unit sf."""
    _tilelang.require_cuda("x", check_unpack_args(x, out_dtype))  # x named before cast_back names its own argument
    return unpack_rows(cast_back, x, out_dtype)
