"""Float64 oracles for the quantisation family (docs/contract/quant.md; the number
formats: docs/contract/README.md).

Every oracle is written from the maths, in float64 NumPy, and encodes with
`tkverify.formats` (exact round-to-nearest-even, satfinite):

* amax of each block, a = max(amax, clamp_min), with clamp_min taken as the
  float32 nearest the given number (the kernels hold it in fp32);
* plain sf = a / max_q, stored as fp32; ``round_sf``: sf = 2^ceil(log2(a / max_q));
  ``use_ue8m0``: the byte k + 127 of sf = 2^k; ``use_packed_ue8m0``: four bytes
  along the block-column axis in one int32, the first in the low byte, the
  last group padded with zero bytes; ``use_tma_aligned_col_major_sf``: the same
  logical (rows, cols) tensor with stride(0) = 1 and the row count padded to a
  multiple of 16 bytes / element size (the padding holds zeros here, and is
  never judged);
* a block holding a NaN or +-Inf gets sf = NaN (ue8m0 0xFF), and every element
  of it becomes NaN (x / NaN) where the format has a NaN.  e2m1 has none: the
  oracle writes code 0 there, and the spec leaves those codes unconstrained
  (the NaN sf already makes the whole block dequantise to NaN);
* q = RNE_sat(x / sf), from the float64 quotient.  That quotient is exact
  enough: x and sf have 24-bit significands, so an exact quotient that is not
  itself a rounding boundary (a number of at most 9 significant bits) lies at
  least ~2^-35 (relative) away from every boundary, while float64 division is
  off by at most 2^-53; the float64 quotient is on the same side of every
  boundary, and equals a boundary exactly when the exact quotient does.  The
  same argument covers a / max_q (max_q = 7*2^6, 3*2, 127*2^9), so rounding
  the float64 quotient to fp32 is correctly rounding the exact one.

Data comes back in each format's storage: e4m3 as a torch.float8_e4m3fn
tensor (T, H); e2m1 as int8 (T, H/2), two codes a byte, the first in the low
nibble; e5m6 as uint8 (T, 3H/2), eight 12-bit codes in three little-endian
uint32 words.  Scale factors come back as float32 (rows, cols), uint8 ue8m0
bytes (rows, cols) or int32 packed ue8m0 (rows, ceil(cols/4)), in the layout
asked for.  Every returned tensor is a CPU torch tensor.

A block is ``bm x bk`` elements: per-token casts use (1, num_per_channels),
per-block casts (bm, bk), per-channel casts (num_per_tokens, 1).  The last row
of blocks may be partial (T is dynamic); H is always a multiple of bk.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from references import as_float64  # noqa: F401  (also part of this module's interface)
from tkverify import formats

# Largest finite value of each element format: sf = a / max_q maps amax onto it.
MAX_Q = {"e4m3": 448.0, "e2m1": 6.0, "e5m6": 65024.0}
# clamp_min by format (docs/contract/quant.md#scale-factors): 6 * 2^-126 makes the e2m1 sf at least the
# smallest normal fp32.
DEFAULT_CLAMP_MIN = {"e4m3": 1e-4, "e5m6": 1e-4, "e2m1": 6 * 2.0**-126}
DATA_FORMATS = tuple(MAX_Q)
# TMA wants every column of a column-major sf to start on a 16-byte boundary.
TMA_ALIGN_BYTES = 16
UE8M0_NAN = 0xFF


# -- small helpers ------------------------------------------------------------


def _owned(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy with standard strides: NumPy gives empty arrays zero strides, which
    torch keeps through clone() and contiguous() and its dtype views then reject."""
    return t.clone(memory_format=torch.contiguous_format)


def clamp_min_value(fmt: str, clamp_min: float | None = None) -> float:
    """The clamp_min in force, as the fp32 value the kernels hold (exactly, in float64)."""
    value = DEFAULT_CLAMP_MIN[fmt] if clamp_min is None else float(clamp_min)
    return float(np.float32(value))


def sf_grid(num_rows: int, num_cols: int, block: tuple[int, int]) -> tuple[int, int]:
    """Logical sf shape (rows, cols) of a (T, H) tensor cut into blocks, the last block row partial."""
    bm, bk = block
    return -(-num_rows // bm), num_cols // bk


def expand_to_elements(per_block: np.ndarray, shape: tuple[int, int], block: tuple[int, int]) -> np.ndarray:
    """A (rows, cols) per-block array repeated over each block's elements, cropped to `shape`."""
    bm, bk = block
    full = np.repeat(np.repeat(per_block, bm, axis=0), bk, axis=1)
    return full[: shape[0], : shape[1]]


def block_amax(x64: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """max |x| of each block (NaN if it holds a NaN, inf if it holds an inf), float64 (rows, cols)."""
    bm, bk = block
    num_rows, num_cols = x64.shape
    rows, cols = sf_grid(num_rows, num_cols, block)
    padded = np.zeros((rows * bm, cols * bk))  # zeros never raise an amax
    padded[:num_rows] = np.abs(x64)
    return padded.reshape(rows, bm, cols, bk).max(axis=(1, 3), initial=0.0)


def power_of_two_at_least(v: np.ndarray, max_q: float, a: np.ndarray) -> np.ndarray:
    """2^k with k the smallest integer such that max_q * 2^k >= a (v = a / max_q), exactly.

    frexp of the float64 quotient gives the candidate; the exact comparisons
    with max_q * 2^k (a float64 product without rounding) settle it, so the
    quotient's rounding can never pick the wrong power.
    """
    mantissa, exponent = np.frexp(v)
    k = np.where(mantissa == 0.5, exponent - 1, exponent).astype(np.int64)
    k = np.where(np.ldexp(max_q, k) < a, k + 1, k)
    k = np.where(np.ldexp(max_q, k - 1) >= a, k - 1, k)
    return np.ldexp(1.0, k)


# -- scale factors --------------------------------------------------------------


def scale_from_amax(a: np.ndarray, fmt: str, round_sf: bool) -> np.ndarray:
    """The sf a block of clamped amax `a` gets, float64: a / max_q exactly (plain, before
    its fp32 rounding) or 2^ceil(log2(a / max_q)) (round_sf); NaN where a is not finite."""
    max_q = MAX_Q[fmt]
    finite = np.isfinite(a)
    safe = np.where(finite, a, 1.0)
    sf = power_of_two_at_least(safe / max_q, max_q, safe) if round_sf else safe / max_q
    return np.where(finite, sf, np.nan)


def exact_scales(
    x64: np.ndarray, fmt: str, block: tuple[int, int], round_sf: bool, clamp_min: float | None = None
) -> np.ndarray:
    """The exact sf of every block, float64 (rows, cols): plain sf unrounded, round_sf a power of two."""
    a = np.maximum(block_amax(x64, block), clamp_min_value(fmt, clamp_min))
    return scale_from_amax(a, fmt, round_sf)


def stored_scales(exact: np.ndarray) -> np.ndarray:
    """The sf as stored in fp32 (correctly rounded; powers of two and NaN unchanged), as float64."""
    return exact.astype(np.float32).astype(np.float64)


def sf_storage_dtype(use_ue8m0: bool, use_packed_ue8m0: bool) -> torch.dtype:
    if use_packed_ue8m0:
        return torch.int32
    return torch.uint8 if use_ue8m0 else torch.float32


def tma_padded_rows(rows: int, dtype: torch.dtype) -> int:
    """The row count of a TMA-aligned column-major sf: a multiple of 16 bytes / element size."""
    per_16_bytes = TMA_ALIGN_BYTES // torch.empty((), dtype=dtype).element_size()
    return -(-rows // per_16_bytes) * per_16_bytes


def packed_sf_cols(cols: int) -> int:
    return -(-cols // 4)


def ue8m0_codes(sf: np.ndarray) -> np.ndarray:
    """ue8m0 bytes of powers of two (NaN -> 0xFF), uint8."""
    return formats.UE8M0.encode(sf)


def column_major(values: torch.Tensor) -> torch.Tensor:
    """`values` (rows, cols) stored TMA-aligned column-major: stride(0) = 1, rows padded."""
    rows, cols = values.shape
    storage = torch.zeros((cols, tma_padded_rows(rows, values.dtype)), dtype=values.dtype)
    storage[:, :rows] = values.T
    return storage.T[:rows]


def store_sf(
    sf: np.ndarray,
    *,
    use_ue8m0: bool = False,
    use_packed_ue8m0: bool = False,
    use_tma_aligned_col_major_sf: bool = False,
) -> torch.Tensor:
    """Logical float64 sf (rows, cols) in the storage the flags ask for (a CPU torch tensor).

    fp32 (round_sf or not), ue8m0 bytes, or ue8m0 bytes packed four to an int32
    (the last group of a row padded with zero bytes); row-major, or TMA-aligned
    column-major.
    """
    rows, cols = sf.shape
    if use_ue8m0:
        codes = ue8m0_codes(sf)
        if use_packed_ue8m0:
            padded = np.zeros((rows, 4 * packed_sf_cols(cols)), dtype=np.uint8)
            padded[:, :cols] = codes
            values = torch.from_numpy(np.ascontiguousarray(formats.pack_ue8m0(padded)))
            values = values.reshape(rows, packed_sf_cols(cols))
        else:
            values = torch.from_numpy(np.ascontiguousarray(codes)).reshape(rows, cols)
    else:
        values = torch.from_numpy(np.ascontiguousarray(sf.astype(np.float32))).reshape(rows, cols)
    values = _owned(values)
    return column_major(values) if use_tma_aligned_col_major_sf else values.contiguous()


def sf_logical_values(sf: torch.Tensor, cols: int) -> np.ndarray:
    """float64 (rows, cols) values of a stored sf, whatever its layout.

    float32: the values; uint8: ue8m0 bytes; int32: packed ue8m0 (padding bytes dropped).
    """
    if sf.dtype == torch.float32:
        return as_float64(sf)
    raw = sf.detach().cpu().contiguous().numpy()
    if sf.dtype == torch.uint8:
        return formats.UE8M0.decode(raw)
    if sf.dtype == torch.int32:
        codes = np.asarray(formats.unpack_ue8m0(raw)).reshape(raw.shape[0], 4 * raw.shape[1])
        return formats.UE8M0.decode(codes[:, :cols])
    raise TypeError(f"sf must be float32, uint8 (ue8m0) or int32 (packed ue8m0), got {sf.dtype}")


# -- element codes ----------------------------------------------------------------


def quotients(x64: np.ndarray, sf: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """x / sf per element (float64; see the module docstring for why this is exact enough)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        return x64 / expand_to_elements(sf, x64.shape, block)


def encode_elements(q: np.ndarray, fmt: str) -> np.ndarray:
    """RNE_sat codes of the quotients; NaN gives the format's NaN (e2m1: code 0, see the module docstring)."""
    f = formats.get(fmt)
    if f.has_nan:
        return f.encode(q)
    return np.where(np.isnan(q), 0, f.encode(np.where(np.isnan(q), 0.0, q))).astype(f.code_dtype)


def pack_data(codes: np.ndarray, fmt: str) -> torch.Tensor:
    """Element codes (T, H) in the format's storage tensor (see the module docstring)."""
    num_rows, num_cols = codes.shape
    if fmt == "e4m3":
        out = formats.to_tensor(np.ascontiguousarray(codes.reshape(num_rows, num_cols)), "e4m3")
    elif fmt == "e2m1":
        packed = formats.pack_e2m1(codes) if num_rows else np.zeros((0, num_cols // 2), np.int8)
        out = torch.from_numpy(np.ascontiguousarray(packed)).reshape(num_rows, num_cols // 2)
    else:
        packed = formats.pack_e5m6(codes) if num_rows else np.zeros((0, 3 * num_cols // 2), np.uint8)
        out = torch.from_numpy(np.ascontiguousarray(packed)).reshape(num_rows, 3 * num_cols // 2)
    return _owned(out)


def data_codes(data: torch.Tensor, fmt: str) -> np.ndarray:
    """The element codes (T, H) held by a data tensor of `fmt` (inverse of pack_data)."""
    if fmt == "e4m3":
        return formats.codes_of(data)
    raw = data.detach().cpu().contiguous().numpy()
    if raw.shape[0] == 0:
        width = 2 * raw.shape[1] if fmt == "e2m1" else 2 * raw.shape[1] // 3
        return np.zeros((0, width), dtype=formats.get(fmt).code_dtype)
    if fmt == "e2m1":
        return np.asarray(formats.unpack_e2m1(raw))
    return np.asarray(formats.unpack_e5m6(raw))


def data_width(data_cols: int, fmt: str) -> int:
    """H, the element count of a row, from the width of a stored data row."""
    return {"e4m3": data_cols, "e2m1": 2 * data_cols, "e5m6": 2 * data_cols // 3}[fmt]


# -- the casts ------------------------------------------------------------------------


def cast_in_blocks(
    x: Any,
    fmt: str,
    block: tuple[int, int],
    round_sf: bool,
    use_ue8m0: bool,
    use_packed_ue8m0: bool,
    use_tma_aligned_col_major_sf: bool,
    clamp_min: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, sf) of x cut into `block`-shaped blocks: the exact scales, stored as the flags ask, and the
    codes of x / sf."""
    x64 = as_float64(x)
    sf = stored_scales(exact_scales(x64, fmt, block, round_sf, clamp_min))
    data = pack_data(encode_elements(quotients(x64, sf, block), fmt), fmt)
    return data, store_sf(
        sf,
        use_ue8m0=use_ue8m0,
        use_packed_ue8m0=use_packed_ue8m0,
        use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf,
    )


def per_token_cast(
    x: Any,
    fmt: str = "e4m3",
    num_per_channels: int = 128,
    *,
    round_sf: bool = False,
    use_ue8m0: bool = False,
    use_packed_ue8m0: bool = False,
    use_tma_aligned_col_major_sf: bool = False,
    clamp_min: float | None = None,
):
    """(data, sf) of x (T, H) cut into 1 x num_per_channels blocks."""
    return cast_in_blocks(
        x, fmt, (1, num_per_channels), round_sf, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf, clamp_min
    )


def scales_in_blocks(
    x: Any,
    fmt: str,
    block: tuple[int, int],
    round_sf: bool,
    use_ue8m0: bool,
    use_packed_ue8m0: bool,
    use_tma_aligned_col_major_sf: bool,
    clamp_min: float | None,
) -> torch.Tensor:
    """The sf of `cast_in_blocks`, alone: the exact scales of x's blocks, stored as the flags ask."""
    sf = stored_scales(exact_scales(as_float64(x), fmt, block, round_sf, clamp_min))
    return store_sf(
        sf,
        use_ue8m0=use_ue8m0,
        use_packed_ue8m0=use_packed_ue8m0,
        use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf,
    )


def cast_with_given_sf(x: Any, sf: torch.Tensor, fmt: str, block: tuple[int, int]) -> torch.Tensor:
    """The data of x quantised in `block`-shaped blocks with a given sf (any storage the casts produce, any
    layout): q = RNE_sat(x / sf) with IEEE division (sf = 0 gives +-inf, then +-max where the format has no
    inf)."""
    x64 = as_float64(x)
    values = sf_logical_values(sf, sf_grid(*x64.shape, block)[1])
    return pack_data(encode_elements(quotients(x64, values, block), fmt), fmt)


def per_token_cast_with_sf_only(
    x: Any,
    fmt: str = "e4m3",
    num_per_channels: int = 128,
    *,
    round_sf: bool = False,
    use_ue8m0: bool = False,
    use_packed_ue8m0: bool = False,
    use_tma_aligned_col_major_sf: bool = False,
    clamp_min: float | None = None,
):
    """The sf per_token_cast returns, alone."""
    return scales_in_blocks(x, fmt, (1, num_per_channels), round_sf, use_ue8m0, use_packed_ue8m0,
                            use_tma_aligned_col_major_sf, clamp_min)


def per_token_cast_with_precomputed_sf(x: Any, sf: torch.Tensor, fmt: str = "e4m3", num_per_channels: int = 128):
    """The data of x quantised with a given sf (T, H / num_per_channels): `cast_with_given_sf`."""
    return cast_with_given_sf(x, sf, fmt, (1, num_per_channels))


def per_block_cast(
    x: Any,
    fmt: str = "e4m3",
    block: tuple[int, int] | list[int] = (128, 128),
    *,
    round_sf: bool = False,
    use_ue8m0: bool = False,
    use_packed_ue8m0: bool = False,
    use_tma_aligned_col_major_sf: bool = False,
    clamp_min: float | None = None,
):
    """(data, sf) of x (T, H) cut into bm x bk blocks (sf (ceil(T/bm), H/bk))."""
    return cast_in_blocks(x, fmt, tuple(block), round_sf, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf,
                          clamp_min)


def per_block_cast_with_sf_only(
    x: Any,
    fmt: str = "e4m3",
    block: tuple[int, int] | list[int] = (128, 128),
    *,
    round_sf: bool = False,
    use_ue8m0: bool = False,
    use_packed_ue8m0: bool = False,
    use_tma_aligned_col_major_sf: bool = False,
    clamp_min: float | None = None,
):
    """The sf per_block_cast returns, alone."""
    return scales_in_blocks(x, fmt, tuple(block), round_sf, use_ue8m0, use_packed_ue8m0,
                            use_tma_aligned_col_major_sf, clamp_min)


def per_block_cast_with_precomputed_sf(x: Any, sf: torch.Tensor, fmt: str = "e4m3",
                                       block: tuple[int, int] | list[int] = (128, 128)):
    """The data of x quantised in bm x bk blocks with a given sf (ceil(T/bm), H/bk): `cast_with_given_sf`."""
    return cast_with_given_sf(x, sf, fmt, tuple(block))


def per_channel_cast(
    x: Any,
    fmt: str = "e4m3",
    num_per_tokens: int = 128,
    *,
    round_sf: bool = False,
    use_ue8m0: bool = False,
    use_packed_ue8m0: bool = False,
    use_tma_aligned_col_major_sf: bool = False,
    clamp_min: float | None = None,
):
    """(data, sf) of x (T, H) cut into num_per_tokens x 1 blocks (sf (ceil(T/npt), H))."""
    return cast_in_blocks(
        x, fmt, (num_per_tokens, 1), round_sf, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf, clamp_min
    )


# -- cast_back --------------------------------------------------------------------------

_OUT_FORMATS = {torch.bfloat16: formats.BF16, torch.float32: formats.FP32}
OUT_DTYPE_NAMES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp32": torch.float32,
    "f32": torch.float32,
    "float32": torch.float32,
}


def out_dtype_of(out_dtype: Any) -> torch.dtype:
    return OUT_DTYPE_NAMES[out_dtype] if isinstance(out_dtype, str) else out_dtype


def dequantised(data: torch.Tensor, sf: torch.Tensor, fmt: str, block: tuple[int, int]) -> np.ndarray:
    """q * sf per element, float64, exact (at most 8 + 24 significant bits)."""
    codes = data_codes(data, fmt)
    q = formats.get(fmt).decode(codes)
    values = sf_logical_values(sf, sf_grid(*q.shape, block)[1])
    with np.errstate(invalid="ignore", over="ignore"):
        return q * expand_to_elements(values, q.shape, block)


def cast_back(
    data: torch.Tensor,
    sf: torch.Tensor,
    fmt: str = "e4m3",
    block: tuple[int, int] | list[int] = (1, 128),
    out_dtype: Any = torch.bfloat16,
) -> torch.Tensor:
    """q * sf correctly rounded (once, from the exact product) to out_dtype (bf16 or fp32)."""
    dtype = out_dtype_of(out_dtype)
    exact = dequantised(data, sf, fmt, tuple(block))
    codes = _OUT_FORMATS[dtype].encode(exact)  # IEEE: overflow to inf, NaN stays NaN
    out = torch.empty(exact.shape, dtype=dtype)
    if exact.size:
        out.copy_(formats.to_tensor(codes, _OUT_FORMATS[dtype]).reshape(exact.shape))
    return out


# -- swiglu + per-token cast ------------------------------------------------------------------


def swiglu_rows(x: Any, topk_weights: Any = None, pos_to_token_topk: Any = None, clamp: float | None = None):
    """(y, l, r, w, padding, counts) of swiglu_forward_and_per_token_cast, in float64.

    y = min(l, c) * sigmoid(min(l, c)) * clamp(r, -c, c) * w with IEEE arithmetic on
    non-finite values (l = -inf gives -inf * 0 = NaN).  w is topk_weights
    gathered through pos_to_token_topk (1 without weights); rows whose index is
    -1 are padding: y = 0 there and they are not counted.  counts = (#l > c,
    #r > c, #r < -c) over the other rows, as Python ints; c is fp32(clamp).
    l, r and w are returned clamped, as the kernel multiplies them.
    """
    x64 = as_float64(x)
    num_rows, width = x64.shape
    hidden = width // 2
    l, r = x64[:, :hidden], x64[:, hidden:]
    padding = np.zeros(num_rows, dtype=bool)
    w = np.ones(num_rows)
    if pos_to_token_topk is not None:
        index = np.asarray(
            pos_to_token_topk.detach().cpu().numpy()
            if isinstance(pos_to_token_topk, torch.Tensor)
            else pos_to_token_topk,
            dtype=np.int64,
        ).reshape(num_rows)
        padding = index < 0
        if topk_weights is not None:
            w = np.where(padding, 0.0, as_float64(topk_weights).reshape(-1)[np.maximum(index, 0)]) if index.size else w
    counts = (0, 0, 0)
    if clamp is not None:
        c = float(np.float32(clamp))
        live = ~padding[:, None]
        counts = (int(((l > c) & live).sum()), int(((r > c) & live).sum()), int(((r < -c) & live).sum()))
        l = np.minimum(l, c)  # NaN stays NaN
        r = np.clip(r, -c, c)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        sigmoid = 1.0 / (1.0 + np.exp(-l))
        y = l * sigmoid * r * w[:, None]
    y = np.where(padding[:, None], 0.0, y)
    return y, l, r, w, padding, counts


def swiglu_forward_and_per_token_cast(
    x: Any,
    fmt: str = "e4m3",
    num_per_channels: int = 128,
    *,
    topk_weights: Any = None,
    pos_to_token_topk: Any = None,
    clamp: float | None = None,
    clamped_count: Any = None,
    round_sf: bool = False,
    use_ue8m0: bool = False,
    use_packed_ue8m0: bool = False,
    use_tma_aligned_col_major_sf: bool = False,
    clamp_min: float | None = None,
):
    """(data, sf, clamped_count after the call) of the per-token cast of y (see swiglu_rows).

    y beyond the fp32 range counts as infinite (the row's sf is NaN), as an fp32
    kernel's would be.  The counter is returned as a new int64 (3,) tensor
    (empty when the call had none); the oracle never writes its inputs.
    Padding rows come out as +0 codes with the sf of an all-zero block.
    """
    y, _, _, _, _, counts = swiglu_rows(x, topk_weights, pos_to_token_topk, clamp)
    y = fp32_range(y)
    data, sf = cast_in_blocks(y, fmt, (1, num_per_channels), round_sf, use_ue8m0, use_packed_ue8m0,
                              use_tma_aligned_col_major_sf, clamp_min)
    return data, sf, updated_count(clamped_count, counts)


def fp32_range(y: np.ndarray) -> np.ndarray:
    """y with values that round past the fp32 range replaced by +-inf."""
    overflow = np.abs(y) >= formats.FP32.overflow_threshold
    return np.where(overflow, np.copysign(np.inf, y), y)


def updated_count(clamped_count: Any, counts: tuple[int, int, int]) -> torch.Tensor:
    """The counter after adding `counts` (exact Python integers, then int64)."""
    if clamped_count is None:
        return torch.empty(0, dtype=torch.int64)
    before = [int(v) for v in clamped_count.detach().cpu().tolist()]
    return torch.tensor([b + c for b, c in zip(before, counts)], dtype=torch.int64)


def is_power_of_two(v: np.ndarray) -> np.ndarray:
    """Finite positive powers of two (whose reciprocal is exact in fp32 as long as it is finite)."""
    mantissa, _ = np.frexp(np.where(np.isfinite(v), v, 0.0))
    return np.isfinite(v) & (v > 0) & (np.abs(mantissa) == 0.5)
