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
* ``batched_transpose_weight_sf``: a weight's power-of-two scales 2^e as ue8m0 bytes e + 127, packed four to an
  int32 word in deep_gemm's two MN-major layouts (along k for each weight row, along n for each weight
  column); no value changes, so the words are exact.
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
UE8M0_MAX_EXPONENT = 127


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


# -- batched_transpose_weight_sf: deep_gemm's MN-major packed ue8m0 scale layouts --------------------------


def check_weight_sf_values(values: np.ndarray) -> None:
    """Raises ValueError unless every sf is a power of two 2^e with -127 <= e <= 127 (a ue8m0 value): the
    contract's domain (NaN, infinities, zero, negatives and other values are outside it)."""
    mantissa, exponent = np.frexp(values)
    ok = np.isfinite(values) & (mantissa == 0.5) & (exponent - 1 >= UE8M0_MIN_EXPONENT) \
        & (exponent - 1 <= UE8M0_MAX_EXPONENT)
    if not ok.all():
        raise ValueError("sf: every scale must be a power of two 2^e with -127 <= e <= 127")


def packed_rows(rows: np.ndarray) -> torch.Tensor:
    """float64 powers of two (G, R, C) -> int32 (G, R, ceil(C / 4)): each row's ue8m0 bytes packed four to a
    word along C (the quant casts' packed ue8m0 storage: the first byte lowest, the bytes past C zero)."""
    groups, num_rows, cols = rows.shape
    packed = ref.store_sf(rows.reshape(groups * num_rows, cols), use_ue8m0=True, use_packed_ue8m0=True)
    return packed.reshape(groups, num_rows, -1)


def mn_major(words: torch.Tensor) -> torch.Tensor:
    """int32 (G, R, W) stored MN-major: the same values with strides (W * R, 1, R)."""
    return words.transpose(1, 2).contiguous().transpose(1, 2)


def batched_transpose_weight_sf(sf: torch.Tensor, block_size: int = 128, transpose_sf1: bool = False):
    """(sf0, sf1) of one weight's scales sf (n / bs, k / bs) or (G, n / bs, k / bs), bs = block_size.

    sf0 int32 (G?, n, ceil(num_sf_k / 4)), strides (G?: words * n,) + (1, n): word [r, w] packs the ue8m0 bytes
    of sf[r // bs, 4w + j], j = 0..3, byte j holding the j-th.  sf1 int32 (G?, k, ceil(num_sf_n / 4)), strides
    (..., 1, k), word [c, w] packing sf[4w + j, c // bs]; with transpose_sf1 its transpose (G?, words, k),
    strides (..., k, 1).  Bytes past the last sf of a word are zero."""
    values = ref.as_float64(sf)
    check_weight_sf_values(values)
    grouped = values.ndim == 3
    v = values if grouped else values[None]
    sf0 = mn_major(packed_rows(np.repeat(v, block_size, axis=1)))  # row r holds sf[r // bs, :]
    sf1 = mn_major(packed_rows(np.repeat(v.transpose(0, 2, 1), block_size, axis=1)))  # row c: sf[:, c // bs]
    if transpose_sf1:
        sf1 = sf1.transpose(1, 2)
    return (sf0, sf1) if grouped else (sf0[0], sf1[0])
