"""Eager PyTorch quantisation operators, in working precision (fp32 on the input's device).

The TileLang kernels of ``kernels.quant`` have exactly these names and
signatures; the contract is docs/contract/quant.md (the number formats and
their storage: docs/contract/README.md).

Signatures
----------
``fmt`` is one of "e4m3", "e2m1", "e5m6".  The sf options are keyword-only:

    SF_OPTIONS = round_sf: bool = False, use_ue8m0: bool = False,
                 use_packed_ue8m0: bool = False,
                 use_tma_aligned_col_major_sf: bool = False,
                 clamp_min: float | None = None

    per_token_cast(x, fmt="e4m3", num_per_channels=128, *, SF_OPTIONS) -> (data, sf)
    per_token_cast_with_sf_only(x, fmt="e4m3", num_per_channels=128, *, SF_OPTIONS) -> sf
    per_token_cast_with_precomputed_sf(x, sf, fmt="e4m3", num_per_channels=128) -> data
    per_block_cast(x, fmt="e4m3", block=(128, 128), *, SF_OPTIONS) -> (data, sf)
    per_block_cast_with_sf_only(x, fmt="e4m3", block=(128, 128), *, SF_OPTIONS) -> sf
    per_block_cast_with_precomputed_sf(x, sf, fmt="e4m3", block=(128, 128)) -> data
    per_channel_cast(x, fmt="e4m3", num_per_tokens=128, *, SF_OPTIONS) -> (data, sf)
    cast_back(data, sf, fmt="e4m3", block=(1, 128), out_dtype=torch.bfloat16) -> out
    swiglu_forward_and_per_token_cast(x, fmt="e4m3", num_per_channels=128, *,
        topk_weights=None, pos_to_token_topk=None, clamp=None, clamped_count=None,
        SF_OPTIONS) -> (data, sf)        # clamped_count is updated in place

Tensors
-------
x          (T, H) bfloat16 or float32 (swiglu: (N, 2H)), with contiguous rows: the last
           dimension's stride is 1, the row stride any (a slice of a wider buffer),
           no overlapping elements.
data       e4m3: float8_e4m3fn (T, H); e2m1: int8 (T, H/2), the first element of
           each pair in the low nibble; e5m6: uint8 (T, 3H/2), each 8 codes as
           three little-endian uint32 words (docs/contract/README.md).  Contiguous.
sf         logical (rows, cols) = (ceil(T/bm), H/bk) for blocks of bm x bk:
           per-token (1, num_per_channels), per-block (bm, bk), per-channel
           (num_per_tokens, 1).  Stored as float32 (plain or round_sf), uint8
           ue8m0 bytes (use_ue8m0) or int32 with four ue8m0 bytes along the
           column axis, the first in the low byte (use_packed_ue8m0; shape
           (rows, ceil(cols/4)), the bytes past cols are 0).  Row-major
           contiguous, or with use_tma_aligned_col_major_sf stride(0) = 1 and
           stride(1) = rows rounded up to a multiple of 16 bytes / element size
           (4 for float32 and int32, 16 for uint8); the padding rows hold zeros
           here but are never read.
           As an input (precomputed sf, cast_back) the dtype says which storage
           it is, and any strides are accepted.
block      (bm, bk), a tuple or a list of two ints.
out_dtype  torch.bfloat16 or torch.float32 (or "bf16" / "fp32").
clamp_min  None (the format's default: 1e-4 for e4m3 and e5m6, 6 * 2^-126 for
           e2m1) or a number; it is used as the nearest float32.

Options supported, and rejected with a ValueError naming the argument
-----------------------------------------------------------------------
* num_per_channels in {16, 32, 64, 128} or H, and H % num_per_channels == 0;
  e5m6 needs num_per_channels == H (one block per row) and H % 8 == 0; e2m1
  needs an even H.  e5m6 is per-token only (per_block_cast and
  per_channel_cast reject it).
* per_block_cast (and its sf-only and precomputed-sf variants): block in {(128, 128), (32, 32)},
  H % bk == 0.
* per_channel_cast: num_per_tokens in {16, 32, 64, 128}.
* cast_back: block one of the geometries above.
* use_ue8m0 needs round_sf; use_packed_ue8m0 needs use_ue8m0.
* clamp_min must be finite and at least max_q * 2^-126 (so that sf is a
  normal fp32 and 1/sf finite).
* swiglu: clamp None or finite > 0; topk_weights (float32 (T, K)) needs
  pos_to_token_topk (int32 (N,), values in [-1, T*K) with -1 for padding rows;
  the range is checked here by reading it back to the host, never by the
  TileLang wrapper, which takes an index outside it for a padding row);
  pos_to_token_topk may come alone (padding marks, weights 1); clamped_count
  is int64 (3,), contiguous, and shares no memory with x, topk_weights or
  pos_to_token_topk (it is written while they are read).
* H >= 1; T may be 0 (empty outputs of the right shapes).
* Devices: every tensor argument on x's device (any device torch runs on).

Numerics (what "working precision" means here)
----------------------------------------------
amax is exact; plain sf = a / max_q is one fp32 division, correctly rounded on
every device (max_q is given as a tensor: PyTorch's CUDA division by a Python
number multiplies by fl(1 / max_q) instead, up to 8/7 ULP off, which the spec
allows but the accuracy claims do not); round_sf's power of two is found exactly,
by exact comparisons with max_q * 2^k.  The element quotient x / sf is one fp32 division; it is then
rounded to the format exactly (RNE, satfinite): e4m3 by torch's cast after an
explicit clamp to +-448 (torch's cast is RNE, and saturates overflow, even
infinities - the clamp makes that explicit), e2m1 and e5m6 by adding and
subtracting a power of two in fp32, which rounds at the format's spacing.
cast_back forms q * sf exactly in float64 and rounds once (bf16 through
round-to-odd fp32, because torch's float64 -> bfloat16 cast rounds twice).
"""

from __future__ import annotations

import numbers
from typing import Any

import torch

from ._checks import check_contiguous as _check_contiguous, check_rows as _check_rows, check_tensor as _check_tensor

FORMATS = ("e4m3", "e2m1", "e5m6")
MAX_Q = {"e4m3": 448.0, "e2m1": 6.0, "e5m6": 65024.0}
DEFAULT_CLAMP_MIN = {"e4m3": 1e-4, "e5m6": 1e-4, "e2m1": 6 * 2.0**-126}
TOKEN_BLOCKS = (16, 32, 64, 128)  # or H
PER_BLOCK_SIZES = ((128, 128), (32, 32))
CHANNEL_BLOCKS = (16, 32, 64, 128)
INPUT_DTYPES = (torch.bfloat16, torch.float32)
OUT_DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32,
              "f32": torch.float32, "float32": torch.float32}
SF_DTYPES = (torch.float32, torch.uint8, torch.int32)
TMA_ALIGN_BYTES = 16
_SMALLEST_NORMAL_FP32 = 2.0**-126
_E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # codes 0..7


# -- argument checks ------------------------------------------------------------


def _check_same_device(x: torch.Tensor, **others: torch.Tensor | None) -> None:
    for name, t in others.items():
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} is on {t.device}, but x is on {x.device}")


def _check_int(name: str, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    return int(v)


def _check_bool(name: str, v: object) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"{name} must be a bool, got {type(v).__name__}")
    return v


def _check_fmt(fmt: object, allowed: tuple[str, ...] = FORMATS, why: str = "") -> str:
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a str, got {type(fmt).__name__}")
    if fmt not in allowed:
        raise ValueError(f"fmt must be one of {', '.join(allowed)}{why}, got {fmt!r}")
    return fmt


def _check_x(x: object, what: str = "(T, H)") -> torch.Tensor:
    """x of an input dtype, 2-D, with contiguous rows at any row stride (`_check_rows`)."""
    _check_tensor("x", x, INPUT_DTYPES, 2, what)
    _check_rows("x", x)
    if x.shape[1] == 0:
        raise ValueError(f"x must have at least one column, got shape {tuple(x.shape)}")
    return x


def _check_row_format(fmt: str, hidden: int, name: str = "x") -> None:
    """Constraints a format puts on the row length H (storage packing)."""
    if fmt == "e2m1" and hidden % 2:
        raise ValueError(f"{name}: e2m1 packs two values a byte, so H must be even, got H={hidden}")
    if fmt == "e5m6" and hidden % 8:
        raise ValueError(f"{name}: e5m6 packs eight values in three words, so H must be a multiple of 8, "
                         f"got H={hidden}")


def _check_num_per_channels(fmt: str, num_per_channels: object, hidden: int) -> int:
    n = _check_int("num_per_channels", num_per_channels)
    if fmt == "e5m6" and n != hidden:
        raise ValueError(f"num_per_channels must equal H={hidden} for e5m6 (one block per row), got {n}")
    if n not in TOKEN_BLOCKS and n != hidden:
        raise ValueError(f"num_per_channels must be one of {TOKEN_BLOCKS} or H={hidden}, got {n}")
    if hidden % n:
        raise ValueError(f"num_per_channels={n} must divide H={hidden}")
    return n


def _check_block(block: object, allowed: tuple[tuple[int, int], ...] | None = None) -> tuple[int, int]:
    if not isinstance(block, (tuple, list)) or len(block) != 2:
        raise TypeError(f"block must be a tuple (bm, bk) of two ints, got {block!r}")
    bm, bk = (_check_int("block", v) for v in block)
    if allowed is not None and (bm, bk) not in allowed:
        raise ValueError(f"block must be one of {allowed}, got {(bm, bk)}")
    return bm, bk


# The defaults as the fp32 values in force, rounded once here rather than on every call.
_DEFAULT_CLAMP_MIN_FP32 = {fmt: float(torch.tensor(v, dtype=torch.float32)) for fmt, v in DEFAULT_CLAMP_MIN.items()}


def _check_sf_options(fmt: str, round_sf: object, use_ue8m0: object, use_packed_ue8m0: object,
                      use_tma_aligned_col_major_sf: object, clamp_min: object) -> float:
    """Validates the sf options; returns clamp_min as the fp32 value in force."""
    round_sf = _check_bool("round_sf", round_sf)
    use_ue8m0 = _check_bool("use_ue8m0", use_ue8m0)
    use_packed_ue8m0 = _check_bool("use_packed_ue8m0", use_packed_ue8m0)
    _check_bool("use_tma_aligned_col_major_sf", use_tma_aligned_col_major_sf)
    if use_ue8m0 and not round_sf:
        raise ValueError("use_ue8m0 needs round_sf=True (a ue8m0 sf is a power of two)")
    if use_packed_ue8m0 and not use_ue8m0:
        raise ValueError("use_packed_ue8m0 needs use_ue8m0=True (it packs ue8m0 bytes)")
    if clamp_min is None:
        return _DEFAULT_CLAMP_MIN_FP32[fmt]
    if isinstance(clamp_min, bool) or not isinstance(clamp_min, numbers.Real):
        raise TypeError(f"clamp_min must be a number or None, got {type(clamp_min).__name__}")
    value = float(torch.tensor(float(clamp_min), dtype=torch.float32))
    least = MAX_Q[fmt] * _SMALLEST_NORMAL_FP32
    if not (least <= value < float("inf")):
        raise ValueError(f"clamp_min must be finite and at least {least!r} for {fmt} (sf a normal fp32), "
                         f"got {clamp_min!r}")
    return value


# -- scale factors ----------------------------------------------------------------


def _blocks(x: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """x (T, H) as (rows, cols, bm * bk) blocks, the last block row padded with zeros."""
    bm, bk = block
    num_rows, hidden = x.shape
    rows, cols = -(-num_rows // bm), hidden // bk
    if rows * bm != num_rows:
        x = torch.cat([x, x.new_zeros(rows * bm - num_rows, hidden)])
    return x.reshape(rows, bm, cols, bk).permute(0, 2, 1, 3).reshape(rows, cols, bm * bk)


def _to_elements(per_block: torch.Tensor, shape: torch.Size, block: tuple[int, int]) -> torch.Tensor:
    bm, bk = block
    full = per_block.repeat_interleave(bm, dim=0).repeat_interleave(bk, dim=1)
    return full[: shape[0], : shape[1]]


def _pow2(k: torch.Tensor) -> torch.Tensor:
    """fp32 2^k for integer k in [-149, 127], built from exponent bits (exact on every device)."""
    k = k.to(torch.int32)
    normal = torch.clamp(k, -126, 127)
    below = torch.clamp(k - normal, -126, 0)  # k < -126: a second, exact power-of-two factor

    def from_bits(e: torch.Tensor) -> torch.Tensor:
        return ((e + 127) << 23).view(torch.float32)

    return from_bits(normal) * from_bits(below)


def _power_of_two_at_least(ratio: torch.Tensor, a: torch.Tensor, max_q: float) -> torch.Tensor:
    """2^k, k the smallest integer with max_q * 2^k >= a, from the fp32 quotient ratio = a / max_q.

    ceil(log2(ratio)) read off the fp32 bits (ratio is a normal fp32 by the
    clamp_min check), then corrected by exact comparisons: max_q * 2^k is an
    fp32 without rounding (or inf), so the quotient's rounding cannot pick a
    wrong power.
    """
    bits = ratio.view(torch.int32)
    exponent = ((bits >> 23) & 0xFF) - 127
    k = torch.where((bits & 0x7FFFFF) != 0, exponent + 1, exponent)
    k = torch.where(max_q * _pow2(k) < a, k + 1, k)
    k = torch.where(max_q * _pow2(k - 1) >= a, k - 1, k)
    return _pow2(k)


def _scales(y: torch.Tensor, fmt: str, block: tuple[int, int], round_sf: bool, clamp_min: float) -> torch.Tensor:
    """fp32 sf (rows, cols) of y (T, H) fp32: NaN for blocks holding a NaN or an infinity."""
    amax = _blocks(y, block).abs().amax(dim=-1)  # torch's amax propagates NaN
    a = torch.clamp_min(amax, clamp_min)
    finite = torch.isfinite(a)
    a = torch.where(finite, a, torch.ones_like(a))
    max_q = MAX_Q[fmt]
    # Divided by a tensor, not a Python number: on CUDA, PyTorch turns division by a CPU scalar into a
    # multiplication by its fp32 reciprocal (one more rounding: 1 ULP off the correctly rounded sf where the
    # quotient lies near a rounding boundary); tensor by tensor division is IEEE division everywhere.
    sf = a / torch.full_like(a, max_q)
    if round_sf:
        sf = _power_of_two_at_least(sf, a, max_q)
    return torch.where(finite, sf, torch.full_like(sf, float("nan")))


def _ue8m0_bytes(sf: torch.Tensor) -> torch.Tensor:
    """Bytes k + 127 of fp32 powers of two 2^k (normal), 0xFF for NaN."""
    exponent_field = (sf.view(torch.int32) >> 23) & 0xFF  # the biased exponent is the byte
    return torch.where(torch.isnan(sf), torch.full_like(exponent_field, 0xFF), exponent_field).to(torch.uint8)


def _pack_ue8m0(codes: torch.Tensor) -> torch.Tensor:
    """uint8 (rows, cols) -> int32 (rows, ceil(cols/4)), the first byte lowest, padded with zero bytes."""
    rows, cols = codes.shape
    groups = -(-cols // 4)
    padded = codes.new_zeros(rows, 4 * groups)
    padded[:, :cols] = codes
    b = padded.reshape(rows, groups, 4).to(torch.int64)
    word = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


def _unpack_ue8m0(words: torch.Tensor, cols: int) -> torch.Tensor:
    w = words.to(torch.int64) & 0xFFFFFFFF
    b = torch.stack([(w >> (8 * i)) & 0xFF for i in range(4)], dim=-1)
    return b.reshape(words.shape[0], 4 * words.shape[1])[:, :cols].to(torch.uint8)


def _column_major(values: torch.Tensor) -> torch.Tensor:
    """(rows, cols) stored with stride(0) = 1 and rows padded to a multiple of 16 bytes / element size."""
    rows, cols = values.shape
    per_16_bytes = TMA_ALIGN_BYTES // values.element_size()
    padded_rows = -(-rows // per_16_bytes) * per_16_bytes
    storage = values.new_zeros(cols, padded_rows)
    storage[:, :rows] = values.T
    return storage.T[:rows]


def _store_sf(sf: torch.Tensor, use_ue8m0: bool, use_packed_ue8m0: bool, col_major: bool) -> torch.Tensor:
    if use_ue8m0:
        sf = _ue8m0_bytes(sf)
        if use_packed_ue8m0:
            sf = _pack_ue8m0(sf)
    return _column_major(sf) if col_major else sf.contiguous()


def _check_sf_input(sf: object, rows: int, cols: int) -> None:
    """An input sf (precomputed, cast_back): its dtype says the storage, any strides are accepted."""
    _check_tensor("sf", sf, SF_DTYPES, 2, "(rows, cols)")
    stored_cols = -(-cols // 4) if sf.dtype == torch.int32 else cols
    if tuple(sf.shape) != (rows, stored_cols):
        raise ValueError(f"sf must have shape {(rows, stored_cols)} for this x and block "
                         f"({'packed ue8m0, ' if sf.dtype == torch.int32 else ''}{sf.dtype}), got {tuple(sf.shape)}")


def _sf_values(sf: torch.Tensor, cols: int) -> torch.Tensor:
    """fp32 values (rows, cols) of a checked input sf of any storage and strides."""
    if sf.dtype == torch.float32:
        return sf
    codes = sf if sf.dtype == torch.uint8 else _unpack_ue8m0(sf, cols)
    values = _pow2(codes.to(torch.int32) - 127)  # byte 0 is 2^-127, an fp32 subnormal
    return torch.where(codes == 0xFF, torch.full_like(values, float("nan")), values)


# -- rounding to the element formats (RNE, satfinite) ----------------------------------


def _round_at_spacing(a: torch.Tensor, mbits: int, emin: int) -> torch.Tensor:
    """a >= 0 finite fp32 rounded to nearest-even at the spacing of a format with `mbits`
    mantissa bits and lowest normal exponent `emin` (subnormals below).

    Adding C = 2^(e + 23 - mbits), with e the binade of a (at least emin), makes
    fp32 itself round a to a multiple of 2^(e - mbits), ties to even; subtracting
    C back is exact.  Values must stay below 2^(emax + 2) (the caller clamps).
    """
    exponent = ((a.view(torch.int32) >> 23) & 0xFF) - 127  # fp32 subnormals and zero: -127
    e = torch.clamp_min(exponent, emin)
    c = ((e + 23 - mbits + 127) << 23).to(torch.int32).view(torch.float32)
    return (a + c) - c


def _quotient_is_infinite(x: torch.Tensor, sf: torch.Tensor) -> torch.Tensor:
    """Where x / sf is infinite exactly (not merely past the fp32 range)."""
    return (torch.isinf(x) & torch.isfinite(sf)) | ((sf == 0) & (x != 0) & ~torch.isnan(x))


def _encode_e4m3(q: torch.Tensor) -> torch.Tensor:
    return q.clamp(-448.0, 448.0).to(torch.float8_e4m3fn)  # clamp keeps NaN; the cast is RNE


def _encode_e2m1(q: torch.Tensor) -> torch.Tensor:
    """uint8 e2m1 codes (sign bit 8); NaN (no e2m1 code) gives code 0."""
    magnitude = torch.clamp_max(q.abs(), 8.0)  # past 7 every value saturates to 6
    rounded = torch.clamp_max(_round_at_spacing(magnitude, mbits=1, emin=0), 6.0)
    table = torch.tensor(_E2M1_MAGNITUDES, dtype=torch.float32, device=q.device)
    code = torch.searchsorted(table, rounded.contiguous())
    code = code | (torch.signbit(q).to(code.dtype) << 3)
    return torch.where(torch.isnan(q), torch.zeros_like(code), code).to(torch.uint8)


def _encode_e5m6(q: torch.Tensor, infinite: torch.Tensor) -> torch.Tensor:
    """int16 e5m6 codes (the top 12 bits of the fp16 of the rounded value).

    Finite quotients beyond 65024 saturate (also those that only overflowed
    fp32); exactly infinite ones stay infinite; NaN stays NaN.
    """
    magnitude = torch.clamp_max(q.abs(), 2.0 * MAX_Q["e5m6"])
    rounded = torch.clamp_max(_round_at_spacing(magnitude, mbits=6, emin=-14), MAX_Q["e5m6"])
    rounded = torch.where(infinite, torch.full_like(rounded, float("inf")), rounded)
    rounded = torch.where(torch.isnan(q), q.abs(), torch.copysign(rounded, q))
    return (rounded.to(torch.float16).view(torch.int16) >> 4) & 0xFFF  # e5m6 values are fp16 values


def _pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    pairs = codes.reshape(codes.shape[0], codes.shape[1] // 2, 2).to(torch.int16)
    byte = pairs[..., 0] | (pairs[..., 1] << 4)
    return torch.where(byte >= 128, byte - 256, byte).to(torch.int8)


def _unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    b = packed.to(torch.int16) & 0xFF
    return torch.stack([b & 0xF, b >> 4], dim=-1).reshape(packed.shape[0], 2 * packed.shape[1])


def _pack_e5m6(codes: torch.Tensor) -> torch.Tensor:
    h = codes.to(torch.int64).reshape(codes.shape[0], codes.shape[1] // 8, 8)
    h = [h[..., i] for i in range(8)]
    mask = 0xFFFFFFFF  # int64 arithmetic, cut to the uint32 word
    w0 = ((h[0] << 20) | (h[1] << 8) | (h[2] >> 4)) & mask
    w1 = ((h[2] << 28) | (h[3] << 16) | (h[4] << 4) | (h[5] >> 8)) & mask
    w2 = ((h[5] << 24) | (h[6] << 12) | h[7]) & mask
    words = torch.stack([w0, w1, w2], dim=-1)
    little_endian = torch.stack([(words >> (8 * i)) & 0xFF for i in range(4)], dim=-1)
    return little_endian.reshape(codes.shape[0], 3 * codes.shape[1] // 2).to(torch.uint8)


def _unpack_e5m6(packed: torch.Tensor) -> torch.Tensor:
    b = packed.to(torch.int64).reshape(packed.shape[0], packed.shape[1] // 12, 3, 4)
    w = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)
    w0, w1, w2 = w[..., 0], w[..., 1], w[..., 2]
    h = [w0 >> 20, (w0 >> 8) & 0xFFF, ((w0 & 0xFF) << 4) | (w1 >> 28), (w1 >> 16) & 0xFFF,
         (w1 >> 4) & 0xFFF, ((w1 & 0xF) << 8) | (w2 >> 24), (w2 >> 12) & 0xFFF, w2 & 0xFFF]
    return torch.stack(h, dim=-1).reshape(packed.shape[0], 2 * packed.shape[1] // 3)


def _quantise(y: torch.Tensor, sf_elements: torch.Tensor, fmt: str) -> torch.Tensor:
    """The data tensor of RNE_sat(y / sf) from the fp32 quotient."""
    q = y / sf_elements
    if fmt == "e4m3":
        return _encode_e4m3(q)
    if fmt == "e2m1":
        return _pack_e2m1(_encode_e2m1(q))
    return _pack_e5m6(_encode_e5m6(q, _quotient_is_infinite(y, sf_elements)))


# -- the casts ------------------------------------------------------------------------------


def _cast(y: torch.Tensor, fmt: str, block: tuple[int, int], round_sf: bool, use_ue8m0: bool,
          use_packed_ue8m0: bool, col_major: bool, clamp_min: float) -> tuple[torch.Tensor, torch.Tensor]:
    sf = _scales(y, fmt, block, round_sf, clamp_min)
    data = _quantise(y, _to_elements(sf, y.shape, block), fmt)
    return data, _store_sf(sf, use_ue8m0, use_packed_ue8m0, col_major)


def _check_per_token(x, fmt, num_per_channels, round_sf, use_ue8m0, use_packed_ue8m0,
                     use_tma_aligned_col_major_sf, clamp_min) -> tuple[str, int, float]:
    x = _check_x(x)
    fmt = _check_fmt(fmt)
    _check_row_format(fmt, x.shape[1])
    n = _check_num_per_channels(fmt, num_per_channels, x.shape[1])
    cm = _check_sf_options(fmt, round_sf, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf, clamp_min)
    return fmt, n, cm


def per_token_cast(x: torch.Tensor, fmt: str = "e4m3", num_per_channels: int = 128, *, round_sf: bool = False,
                   use_ue8m0: bool = False, use_packed_ue8m0: bool = False,
                   use_tma_aligned_col_major_sf: bool = False,
                   clamp_min: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, sf) of x (T, H) quantised in blocks of 1 x num_per_channels."""
    fmt, n, cm = _check_per_token(x, fmt, num_per_channels, round_sf, use_ue8m0, use_packed_ue8m0,
                                  use_tma_aligned_col_major_sf, clamp_min)
    return _cast(x.float(), fmt, (1, n), round_sf, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf, cm)


def per_token_cast_with_sf_only(x: torch.Tensor, fmt: str = "e4m3", num_per_channels: int = 128, *,
                                round_sf: bool = False, use_ue8m0: bool = False, use_packed_ue8m0: bool = False,
                                use_tma_aligned_col_major_sf: bool = False,
                                clamp_min: float | None = None) -> torch.Tensor:
    """The sf per_token_cast would return, without the data."""
    fmt, n, cm = _check_per_token(x, fmt, num_per_channels, round_sf, use_ue8m0, use_packed_ue8m0,
                                  use_tma_aligned_col_major_sf, clamp_min)
    sf = _scales(x.float(), fmt, (1, n), round_sf, cm)
    return _store_sf(sf, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf)


def _check_given_sf(x: torch.Tensor, sf: object, block: tuple[int, int]) -> None:
    """A precomputed sf for x cut into `block`: on x's device, of the logical shape (ceil(T/bm), H/bk)."""
    if isinstance(sf, torch.Tensor):
        _check_same_device(x, sf=sf)
    bm, bk = block
    _check_sf_input(sf, -(-x.shape[0] // bm), x.shape[1] // bk)


def _check_precomputed_args(x: object, sf: object, fmt: object, num_per_channels: object) -> tuple[str, int]:
    x = _check_x(x)
    fmt = _check_fmt(fmt)
    _check_row_format(fmt, x.shape[1])
    n = _check_num_per_channels(fmt, num_per_channels, x.shape[1])
    _check_given_sf(x, sf, (1, n))
    return fmt, n


def _cast_with_given_sf(x: torch.Tensor, sf: torch.Tensor, fmt: str, block: tuple[int, int]) -> torch.Tensor:
    """The data of x quantised in `block`-shaped blocks with a checked sf of any storage and layout."""
    values = _sf_values(sf, x.shape[1] // block[1])
    y = x.float()
    return _quantise(y, _to_elements(values, y.shape, block), fmt)


def per_token_cast_with_precomputed_sf(x: torch.Tensor, sf: torch.Tensor, fmt: str = "e4m3",
                                       num_per_channels: int = 128) -> torch.Tensor:
    """The data of x (T, H) quantised with a given sf (T, H / num_per_channels) of any storage and layout."""
    fmt, n = _check_precomputed_args(x, sf, fmt, num_per_channels)
    return _cast_with_given_sf(x, sf, fmt, (1, n))


def _check_per_block_args(x, fmt, block, round_sf, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf,
                          clamp_min) -> tuple[str, tuple[int, int], float]:
    x = _check_x(x)
    fmt = _check_fmt(fmt, ("e4m3", "e2m1"), " (e5m6 is per-token only)")
    bm, bk = _check_block(block, PER_BLOCK_SIZES)
    if x.shape[1] % bk:
        raise ValueError(f"block: bk={bk} must divide H={x.shape[1]}")
    cm = _check_sf_options(fmt, round_sf, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf, clamp_min)
    return fmt, (bm, bk), cm


def per_block_cast(x: torch.Tensor, fmt: str = "e4m3", block: tuple[int, int] | list[int] = (128, 128), *,
                   round_sf: bool = False, use_ue8m0: bool = False, use_packed_ue8m0: bool = False,
                   use_tma_aligned_col_major_sf: bool = False,
                   clamp_min: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, sf) of x (T, H) quantised in 2-D blocks of bm x bk (sf (ceil(T/bm), H/bk))."""
    fmt, (bm, bk), cm = _check_per_block_args(x, fmt, block, round_sf, use_ue8m0, use_packed_ue8m0,
                                              use_tma_aligned_col_major_sf, clamp_min)
    return _cast(x.float(), fmt, (bm, bk), round_sf, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf, cm)


def per_block_cast_with_sf_only(x: torch.Tensor, fmt: str = "e4m3", block: tuple[int, int] | list[int] = (128, 128),
                                *, round_sf: bool = False, use_ue8m0: bool = False, use_packed_ue8m0: bool = False,
                                use_tma_aligned_col_major_sf: bool = False,
                                clamp_min: float | None = None) -> torch.Tensor:
    """The sf per_block_cast would return, without the data."""
    fmt, block, cm = _check_per_block_args(x, fmt, block, round_sf, use_ue8m0, use_packed_ue8m0,
                                           use_tma_aligned_col_major_sf, clamp_min)
    return _store_sf(_scales(x.float(), fmt, block, round_sf, cm), use_ue8m0, use_packed_ue8m0,
                     use_tma_aligned_col_major_sf)


def _check_block_precomputed_args(x: object, sf: object, fmt: object, block: object) -> tuple[str, tuple[int, int]]:
    x = _check_x(x)
    fmt = _check_fmt(fmt, ("e4m3", "e2m1"), " (e5m6 is per-token only)")
    bm, bk = _check_block(block, PER_BLOCK_SIZES)
    if x.shape[1] % bk:
        raise ValueError(f"block: bk={bk} must divide H={x.shape[1]}")
    _check_given_sf(x, sf, (bm, bk))
    return fmt, (bm, bk)


def per_block_cast_with_precomputed_sf(x: torch.Tensor, sf: torch.Tensor, fmt: str = "e4m3",
                                       block: tuple[int, int] | list[int] = (128, 128)) -> torch.Tensor:
    """The data of x (T, H) quantised in bm x bk blocks with a given sf (ceil(T/bm), H/bk) of any storage and
    layout."""
    fmt, block = _check_block_precomputed_args(x, sf, fmt, block)
    return _cast_with_given_sf(x, sf, fmt, block)


def _check_per_channel_args(x, fmt, num_per_tokens, round_sf, use_ue8m0, use_packed_ue8m0,
                            use_tma_aligned_col_major_sf, clamp_min) -> tuple[str, int, float]:
    x = _check_x(x)
    fmt = _check_fmt(fmt, ("e4m3", "e2m1"), " (e5m6 is per-token only)")
    _check_row_format(fmt, x.shape[1])
    n = _check_int("num_per_tokens", num_per_tokens)
    if n not in CHANNEL_BLOCKS:
        raise ValueError(f"num_per_tokens must be one of {CHANNEL_BLOCKS}, got {n}")
    cm = _check_sf_options(fmt, round_sf, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf, clamp_min)
    return fmt, n, cm


def per_channel_cast(x: torch.Tensor, fmt: str = "e4m3", num_per_tokens: int = 128, *, round_sf: bool = False,
                     use_ue8m0: bool = False, use_packed_ue8m0: bool = False,
                     use_tma_aligned_col_major_sf: bool = False,
                     clamp_min: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, sf) of x (T, H) quantised in blocks of num_per_tokens x 1 (sf (ceil(T/npt), H))."""
    fmt, n, cm = _check_per_channel_args(x, fmt, num_per_tokens, round_sf, use_ue8m0, use_packed_ue8m0,
                                         use_tma_aligned_col_major_sf, clamp_min)
    return _cast(x.float(), fmt, (n, 1), round_sf, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf, cm)


# -- cast_back -----------------------------------------------------------------------------------


_DATA_DTYPES = {"e4m3": torch.float8_e4m3fn, "e2m1": torch.int8, "e5m6": torch.uint8}


def _hidden_of(data: torch.Tensor, fmt: str) -> int:
    width = data.shape[1]
    if fmt == "e2m1":
        return 2 * width
    if fmt == "e5m6":
        if width % 12:
            raise ValueError(f"data: an e5m6 row is 12 bytes per 8 values, got {width} bytes")
        return 2 * width // 3
    return width


def _check_cast_back_block(block: object, fmt: str, hidden: int) -> tuple[int, int]:
    bm, bk = _check_block(block)
    if bm == 1:
        if fmt == "e5m6" and bk != hidden:
            raise ValueError(f"block must be (1, H={hidden}) for e5m6, got {(bm, bk)}")
        if bk not in TOKEN_BLOCKS and bk != hidden:
            raise ValueError(f"block (1, bk) needs bk in {TOKEN_BLOCKS} or H={hidden}, got {(bm, bk)}")
    elif fmt == "e5m6":
        raise ValueError(f"block must be (1, H) for e5m6 (per-token only), got {(bm, bk)}")
    elif bk == 1:
        if bm not in CHANNEL_BLOCKS:
            raise ValueError(f"block (bm, 1) needs bm in {CHANNEL_BLOCKS}, got {(bm, bk)}")
    elif (bm, bk) not in PER_BLOCK_SIZES:
        raise ValueError(f"block must be (1, bk), (bm, 1) or one of {PER_BLOCK_SIZES}, got {(bm, bk)}")
    if hidden % bk:
        raise ValueError(f"block: bk={bk} must divide H={hidden}")
    return bm, bk


def _decode_data(data: torch.Tensor, fmt: str) -> torch.Tensor:
    """fp32 values of the element codes (exact)."""
    if fmt == "e4m3":
        return data.float()
    if fmt == "e2m1":
        codes = _unpack_e2m1(data)
        table = torch.tensor(_E2M1_MAGNITUDES, dtype=torch.float32, device=data.device)
        magnitude = table[(codes & 7).long()]
        return torch.where((codes & 8) != 0, -magnitude, magnitude)
    codes = _unpack_e5m6(data)
    return (codes << 4).to(torch.int16).view(torch.float16).float()


def _round_to_odd_fp32(d: torch.Tensor) -> torch.Tensor:
    """float64 -> fp32 rounding to odd: exact values stay, inexact ones take the neighbour with
    an odd last bit.  A later RNE to a format of at most 22 bits then rounds d correctly."""
    t = d.float()
    back = t.double()
    inexact = (back != d) & ~torch.isnan(d)
    toward_zero = torch.where(back.abs() > d.abs(), torch.nextafter(t, torch.zeros_like(t)), t)
    odd = (toward_zero.view(torch.int32) | 1).view(torch.float32)
    return torch.where(inexact, odd, t)


def _check_cast_back_args(data, sf, fmt, block, out_dtype) -> tuple[str, torch.dtype, int, tuple[int, int]]:
    """Returns fmt, out_dtype as a torch dtype, H, and the block."""
    fmt = _check_fmt(fmt)
    _check_tensor("data", data, (_DATA_DTYPES[fmt],), 2, "(T, H) in the format's storage")
    _check_contiguous("data", data)
    if isinstance(out_dtype, str):
        if out_dtype not in OUT_DTYPES:
            raise ValueError(f"out_dtype must be one of {', '.join(OUT_DTYPES)}, got {out_dtype!r}")
        out_dtype = OUT_DTYPES[out_dtype]
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise TypeError(f"out_dtype must be torch.bfloat16 or torch.float32, got {out_dtype!r}")
    hidden = _hidden_of(data, fmt)
    if hidden == 0:
        raise ValueError(f"data must have at least one column, got shape {tuple(data.shape)}")
    _check_row_format(fmt, hidden, "data")
    bm, bk = _check_cast_back_block(block, fmt, hidden)
    if isinstance(sf, torch.Tensor):
        _check_same_device(data, sf=sf)
    _check_sf_input(sf, -(-data.shape[0] // bm), hidden // bk)
    return fmt, out_dtype, hidden, (bm, bk)


def cast_back(data: torch.Tensor, sf: torch.Tensor, fmt: str = "e4m3", block: tuple[int, int] | list[int] = (1, 128),
              out_dtype: Any = torch.bfloat16) -> torch.Tensor:
    """q * sf per element, correctly rounded to out_dtype (bf16 or fp32), shape (T, H)."""
    fmt, out_dtype, hidden, (bm, bk) = _check_cast_back_args(data, sf, fmt, block, out_dtype)
    values = _sf_values(sf, hidden // bk)
    q = _decode_data(data, fmt)
    product = q.double() * _to_elements(values, q.shape, (bm, bk)).double()  # exact: <= 8 + 24 bits
    if out_dtype == torch.float32:
        return product.float()
    return _round_to_odd_fp32(product).to(torch.bfloat16)


# -- swiglu + per-token cast --------------------------------------------------------------------------


def _byte_span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last) byte addresses a tensor's elements can occupy (empty for no elements)."""
    if t.numel() == 0:
        return 0, 0
    extent = 1 + sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + extent * t.element_size()


def _check_not_aliased(name: str, buffer: torch.Tensor, **inputs: torch.Tensor | None) -> None:
    """An in-place buffer must not share memory with an input: it is written while they are read."""
    first, last = _byte_span(buffer)
    for other, t in inputs.items():
        if t is None or t.device != buffer.device:
            continue
        start, stop = _byte_span(t)
        if start < last and first < stop:
            raise ValueError(f"{name} shares memory with {other}; an in-place buffer must not alias an input")


def _check_swiglu_extras(x: torch.Tensor, topk_weights: object, pos_to_token_topk: object, clamp: object,
                         clamped_count: object) -> float | None:
    if topk_weights is not None:
        _check_tensor("topk_weights", topk_weights, (torch.float32,), 2, "(T, K)")
        _check_contiguous("topk_weights", topk_weights)
        if pos_to_token_topk is None:
            raise ValueError("topk_weights needs pos_to_token_topk (the (token, slot) of every row)")
    if pos_to_token_topk is not None:
        _check_tensor("pos_to_token_topk", pos_to_token_topk, (torch.int32,), 1, "(N,)")
        if pos_to_token_topk.shape[0] != x.shape[0]:
            raise ValueError(f"pos_to_token_topk must have N={x.shape[0]} entries (one per row of x), "
                             f"got {pos_to_token_topk.shape[0]}")
        _check_same_device(x, pos_to_token_topk=pos_to_token_topk)
    if clamped_count is not None:
        _check_tensor("clamped_count", clamped_count, (torch.int64,), 1, "(3,)")
        _check_contiguous("clamped_count", clamped_count)
        if clamped_count.shape[0] != 3:
            raise ValueError(f"clamped_count must have shape (3,), got {tuple(clamped_count.shape)}")
    _check_same_device(x, topk_weights=topk_weights, clamped_count=clamped_count)
    if clamped_count is not None:
        _check_not_aliased("clamped_count", clamped_count, x=x, topk_weights=topk_weights,
                           pos_to_token_topk=pos_to_token_topk)
    if clamp is None:
        return None
    if isinstance(clamp, bool) or not isinstance(clamp, numbers.Real):
        raise TypeError(f"clamp must be a number or None, got {type(clamp).__name__}")
    c = float(torch.tensor(float(clamp), dtype=torch.float32))
    if not 0 < c < float("inf"):
        raise ValueError(f"clamp must be finite and positive, got {clamp!r}")
    return c


def _check_routing_values(topk_weights: torch.Tensor | None, pos_to_token_topk: torch.Tensor | None) -> None:
    """pos_to_token_topk's values in [-1, T*K) ([-1, infinity) without weights), read back to the host (one
    device sync on CUDA): the eager implementations' check.  The TileLang wrappers do not read it; there an
    index outside the range is outside the contract, and the kernels take it for a padding row (-1)."""
    if pos_to_token_topk is None or not pos_to_token_topk.numel():
        return
    slots = topk_weights.numel() if topk_weights is not None else None
    low, high = torch.stack(torch.aminmax(pos_to_token_topk)).tolist()  # one device sync, not two
    if low < -1 or (slots is not None and high >= slots):
        bound = f"T*K={slots}" if slots is not None else "infinity"
        raise ValueError(f"pos_to_token_topk values must lie in [-1, {bound}), got [{low}, {high}]")


def _check_swiglu_args(x, fmt, num_per_channels, topk_weights, pos_to_token_topk, clamp, clamped_count, round_sf,
                       use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf,
                       clamp_min) -> tuple[int, str, int, float, float | None]:
    """Checks every argument's metadata (no tensor value is read); returns H, fmt, num_per_channels, clamp_min
    in force, clamp (None: no clamp).  The eager implementation adds `_check_routing_values`."""
    x = _check_x(x, "(N, 2H)")
    if x.shape[1] % 2:
        raise ValueError(f"x must have an even number of columns (l and r halves), got {x.shape[1]}")
    hidden = x.shape[1] // 2
    fmt = _check_fmt(fmt)
    _check_row_format(fmt, hidden)
    n = _check_num_per_channels(fmt, num_per_channels, hidden)
    cm = _check_sf_options(fmt, round_sf, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf, clamp_min)
    c = _check_swiglu_extras(x, topk_weights, pos_to_token_topk, clamp, clamped_count)
    return hidden, fmt, n, cm, c


def swiglu_forward_and_per_token_cast(x: torch.Tensor, fmt: str = "e4m3", num_per_channels: int = 128, *,
                                      topk_weights: torch.Tensor | None = None,
                                      pos_to_token_topk: torch.Tensor | None = None,
                                      clamp: float | None = None, clamped_count: torch.Tensor | None = None,
                                      round_sf: bool = False, use_ue8m0: bool = False,
                                      use_packed_ue8m0: bool = False, use_tma_aligned_col_major_sf: bool = False,
                                      clamp_min: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, sf) of y = l * sigmoid(l) * r * w, per-token cast (1 x num_per_channels blocks).

    x (N, 2H): l = x[:, :H], r = x[:, H:] in fp32; with clamp c, l = min(l, c) and
    r = clamp(r, -c, c), and clamped_count (int64 (3,), in place) grows by the
    numbers of l > c, r > c, r < -c.  w = topk_weights.flatten()[pos_to_token_topk]
    (1 without weights).  Rows with pos_to_token_topk == -1 are padding: their x
    is not read, their codes are +0, their sf that of an all-zero block, and
    they are not counted.
    """
    hidden, fmt, n, cm, c = _check_swiglu_args(x, fmt, num_per_channels, topk_weights, pos_to_token_topk, clamp,
                                               clamped_count, round_sf, use_ue8m0, use_packed_ue8m0,
                                               use_tma_aligned_col_major_sf, clamp_min)
    _check_routing_values(topk_weights, pos_to_token_topk)
    l, r = x[:, :hidden].float(), x[:, hidden:].float()
    live = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
    w = torch.ones(x.shape[0], dtype=torch.float32, device=x.device)
    if pos_to_token_topk is not None:
        live = pos_to_token_topk >= 0
        if topk_weights is not None:
            w = topk_weights.reshape(-1)[pos_to_token_topk.clamp_min(0).long()] if x.shape[0] else w
    if c is not None:
        if clamped_count is not None:
            counts = torch.stack([((l > c) & live[:, None]).sum(), ((r > c) & live[:, None]).sum(),
                                  ((r < -c) & live[:, None]).sum()])  # int64 sums
            clamped_count += counts
        l = torch.clamp_max(l, c)  # NaN stays NaN
        r = torch.clamp(r, -c, c)
    y = l * torch.sigmoid(l) * r * w[:, None]
    y = torch.where(live[:, None], y, torch.zeros_like(y))
    return _cast(y, fmt, (1, n), round_sf, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf, cm)
