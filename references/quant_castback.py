"""Float64 oracles of the quantisation round trips that are compositions of quant.per_token_cast and
quant.cast_back (contract: docs/contract/quant_castback.md).

Neither op has maths of its own: each oracle is the composed oracles of `references.quant`, called in
turn, so that the round trips are defined by exactly the ops they compose.

* per_token_cast_and_cast_back(x, fmt, num_per_channels, round_sf, clamp_min): the per-token cast of
  x, then its cast_back to x's dtype: every element RN_dtype(q * sf), q = RNE_sat(x / sf).
* unpack_from_e2m1fn_x2(x, out_dtype): cast_back of e2m1 codes with a unit sf (one block per row),
  over any number of leading dimensions: the value of each nibble, low nibble first.
"""

from __future__ import annotations

from typing import Any

import torch

import references.quant as quant

ROUND_TRIP_FORMATS = ("e4m3", "e2m1", "e5m6")
UNPACK_OUT_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def per_token_cast_and_cast_back(x: Any, fmt: str = "e4m3", num_per_channels: int = 128, *,
                                 round_sf: bool = False, clamp_min: float | None = None) -> torch.Tensor:
    """cast_back(per_token_cast(x)) in x's dtype: the fake-quantised x, (T, H)."""
    data, sf = quant.per_token_cast(x, fmt, num_per_channels, round_sf=round_sf, clamp_min=clamp_min)
    return quant.cast_back(data, sf, fmt, (1, num_per_channels), out_dtype=x.dtype)


def unpack_from_e2m1fn_x2(x: torch.Tensor, out_dtype: Any = torch.float32) -> torch.Tensor:
    """The e2m1 values of packed codes (..., K) (int8 or uint8, the first code in the low nibble)
    as (..., 2K) in out_dtype: quant.cast_back of the codes with sf = 1 over (1, 2K) blocks."""
    dtype = quant.out_dtype_of(out_dtype)
    lead, width = tuple(x.shape[:-1]), x.shape[-1]
    rows = x.reshape(-1, width).view(torch.int8)
    unit = torch.ones((rows.shape[0], 1), dtype=torch.float32)
    out = quant.cast_back(rows, unit, "e2m1", (1, 2 * width), out_dtype=dtype)
    return out.reshape(*lead, 2 * width)
