"""Float64 oracles of the quantisation layout ops (docs/contract/quant_layout.md).

* ``per_channel_cast_and_transpose``: quant.per_channel_cast's oracle (e4m3), its data transposed to
  (H, T).  A composition: nothing here recomputes the cast.
* ``per_block_cast_lossless``: e2m1 codes with power-of-two scale factors re-expressed, without rounding,
  as e4m3 codes with larger blocks.  Every e2m1 value c is one of 0, 0.5, 1, 1.5, 2, 3, 4, 6 (signed),
  so c * 2^j is an e4m3 value for every c exactly when -8 <= j <= 6: 6 * 2^6 = 384 <= 448 < 6 * 2^7 at the
  top, 0.5 * 2^-8 = 2^-9 (e4m3's smallest subnormal) and 1.5 * 2^-8 = 3 * 2^-9 at the bottom.  The out
  block's sf is therefore 2^-6 times the largest input sf it covers (the smallest power of two that holds
  the largest code of that input sf), and every input sf of the block must be at least 2^-14 times that
  largest one.  A NaN input sf makes the whole out block NaN (sf and data).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from references import quant as ref
from tkverify import formats

# c * 2^j is an e4m3 value for every e2m1 value c iff LOSSLESS_SHIFT_MIN <= j <= LOSSLESS_HEADROOM.
LOSSLESS_HEADROOM = 6
LOSSLESS_SHIFT_MIN = -8
LOSSLESS_SPAN = LOSSLESS_HEADROOM - LOSSLESS_SHIFT_MIN  # largest / smallest input sf of an out block: 2^14
UE8M0_MIN_EXPONENT = -127


def per_channel_cast_and_transpose(x: Any, fmt: str = "e4m3", num_per_tokens: int = 128, **sf_options: Any):
    """(data (H, T) contiguous, sf (ceil(T / num_per_tokens), H)): quant.per_channel_cast, data transposed."""
    data, sf = ref.per_channel_cast(x, fmt, num_per_tokens, **sf_options)
    return ref._owned(data.t().contiguous()), sf


def element_scales(sf_values: np.ndarray, shape: tuple[int, int], block: tuple[int, int]) -> np.ndarray:
    """The sf of every element (T, H), float64."""
    return ref.expand_to_elements(sf_values, shape, block)


def lossless_out_scales(in_scales: np.ndarray, out_block: tuple[int, int]) -> np.ndarray:
    """sf of each out block: 2^-6 times the largest input sf of its elements (NaN where one is NaN)."""
    return np.ldexp(ref.block_amax(in_scales, out_block), -LOSSLESS_HEADROOM)


def lossless_refusal(in_scales: np.ndarray, out_block: tuple[int, int], use_ue8m0: bool) -> str | None:
    """Why the cast cannot be lossless (None where it can): an input sf below 2^-14 times its out block's
    largest, or (ue8m0 out) an out sf below 2^-127."""
    nan_blocks = np.isnan(ref.block_amax(in_scales, out_block))
    known = np.where(np.isnan(in_scales), 0.0, in_scales)
    with np.errstate(divide="ignore", invalid="ignore"):
        high = ref.block_amax(known, out_block)
        # the least sf of each block, through the largest reciprocal (the zero padding raises neither)
        low = 1.0 / ref.block_amax(np.where(known > 0, 1.0 / np.where(known > 0, known, 1.0), 0.0), out_block)
        spread = ~nan_blocks & (low < np.ldexp(high, -LOSSLESS_SPAN))
        tiny = ~nan_blocks & (np.ldexp(high, -LOSSLESS_HEADROOM) < 2.0**UE8M0_MIN_EXPONENT)
    if spread.any():
        return f"an input sf below 2^-{LOSSLESS_SPAN} times the largest of its out block"
    if use_ue8m0 and tiny.any():
        return f"an out sf below 2^{UE8M0_MIN_EXPONENT} (the least ue8m0 value)"
    return None


def per_block_cast_lossless(x: torch.Tensor, x_sf: torch.Tensor, fmt: str = "e4m3",
                            x_block_size: tuple[int, int] | list[int] = (1, 32),
                            out_block_size: tuple[int, int] | list[int] = (128, 128), *, use_ue8m0: bool = False,
                            use_packed_ue8m0: bool = False, use_tma_aligned_col_major_sf: bool = False):
    """(data e4m3 (T, H), sf (ceil(T / bm), H / bk)): every element's exact value codes(x) * x_sf re-coded
    with the out block's sf (module docstring).  Raises ValueError where the contract refuses the case."""
    in_block, out_block = tuple(x_block_size), tuple(out_block_size)
    codes = ref.data_codes(x, "e2m1")
    shape = codes.shape
    in_scales = element_scales(ref.sf_logical_values(x_sf, ref.sf_grid(*shape, in_block)[1]), shape, in_block)
    why = lossless_refusal(in_scales, out_block, use_ue8m0)
    if why:
        raise ValueError(f"x_sf: the cast cannot be lossless: {why}")
    out_scales = lossless_out_scales(in_scales, out_block)
    with np.errstate(invalid="ignore"):
        ratio = in_scales / element_scales(out_scales, shape, out_block)  # an exact power of two, or NaN
        values = formats.E2M1.decode(codes) * ratio
    data = ref.pack_data(formats.E4M3.encode(values), "e4m3")
    sf = ref.store_sf(out_scales, use_ue8m0=use_ue8m0, use_packed_ue8m0=use_packed_ue8m0,
                      use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf)
    return data, sf


def fused_cast_values(x: Any, x_sf: torch.Tensor | None = None, num_per_channels: int | None = None,
                      pos_to_token: torch.Tensor | None = None) -> np.ndarray:
    """The values per_channel_cast_fused casts, float64 (N, H): x (its e4m3 codes times x_sf rounded once to
    fp32, quant.cast_back's float32 result, where x_sf is given), rows gathered by pos_to_token (row n is
    x[pos_to_token[n]], a zero row where it is -1)."""
    if x_sf is not None:
        values = ref.as_float64(ref.cast_back(x, x_sf, "e4m3", (1, num_per_channels), torch.float32))
    else:
        values = ref.as_float64(x)
    if pos_to_token is None:
        return values
    pos = pos_to_token.detach().cpu().numpy().astype(np.int64)
    gathered = values[np.maximum(pos, 0)] if values.shape[0] else np.zeros((pos.size, values.shape[1]))
    return np.where((pos < 0)[:, None], 0.0, gathered)


def per_channel_cast_fused(x: Any, x_sf: torch.Tensor | None = None, fmt: str = "e4m3", num_per_tokens: int = 128,
                           num_per_channels: int | None = None, pos_to_token: torch.Tensor | None = None,
                           **sf_options: Any):
    """(data e4m3 (N, H), sf (ceil(N / num_per_tokens), H)): quant.per_channel_cast of `fused_cast_values`
    (exact fp32 values, so the cast's oracle takes them as an fp32 x)."""
    values = fused_cast_values(x, x_sf, num_per_channels, pos_to_token)
    y = torch.from_numpy(np.ascontiguousarray(values.astype(np.float32)))
    return ref.per_channel_cast(y, fmt, num_per_tokens, **sf_options)
