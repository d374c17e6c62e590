"""Eager PyTorch implementations of the quantisation layout ops (docs/contract/quant_layout.md) and the
argument checks that the TileLang wrappers share.

* `per_channel_cast_and_transpose`: quant.per_channel_cast (e4m3), then its data transposed to (H, T).
* `per_channel_cast_fused`: quant.cast_back (e4m3 codes times x_sf, fp32) where x is quantised, the rows
  gathered by pos_to_token (-1: a zero row), then quant.per_channel_cast (e4m3).  The eager function reads
  pos_to_token's range back to the host (`_check_pos_to_token_values`); the TileLang wrapper shares the
  metadata checks (`_check_fused_args`) and the gather, which takes an index outside [0, T) for -1.
* `per_block_cast_lossless`: e2m1 codes with power-of-two sf re-coded exactly as e4m3 codes in larger
  blocks; the out block's sf is 2^-6 times the largest input sf it covers.  `_lossless_out_sf` computes
  the out sf on the device, NaN for an out block the contract refuses, and the refusal flags; the eager
  function reads the flags back to the host and refuses (ValueError naming x_sf) such a case
  (`_check_lossless_refusals`), the TileLang wrapper reads nothing back.
* `batched_transpose_weight_sf`: a weight's power-of-two scales as deep_gemm's MN-major packed ue8m0 sf0 and
  sf1, through the casts' ue8m0 packing (`quant._ue8m0_bytes`, `quant._pack_ue8m0`); the sf values are not read
  back to be checked.
"""

from __future__ import annotations

import torch

from . import quant as eager
from ._checks import check_contiguous, check_rows, check_tensor

LOSSLESS_FORMATS = ("e4m3",)
LOSSLESS_IN_BLOCKS = ((1, 16), (1, 32))
LOSSLESS_OUT_BLOCKS = ((1, 128), (32, 32), (128, 128))
LOSSLESS_HEADROOM = 6  # 6 * 2^6 = 384 <= 448 (e4m3's largest) < 6 * 2^7
LOSSLESS_SPAN = 14  # c * 2^j is an e4m3 value for every e2m1 c iff -8 <= j <= 6
SF_EXPONENTS = (-127, 127)  # the input sf values accepted: 2^k, k in this range (the ue8m0 values), or NaN
# Magnitudes of the e2m1 codes 0..7 (bit 3 is the sign).
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


# -- per_channel_cast_and_transpose -------------------------------------------------------------------


def _check_channel_transpose_fmt(fmt: object) -> str:
    return eager._check_fmt(fmt, ("e4m3",), " (the transposed per-channel cast writes e4m3)")


def per_channel_cast_and_transpose(x: torch.Tensor, fmt: str = "e4m3", num_per_tokens: int = 128, *,
                                   round_sf: bool = False, use_ue8m0: bool = False, use_packed_ue8m0: bool = False,
                                   use_tma_aligned_col_major_sf: bool = False,
                                   clamp_min: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(data e4m3 (H, T) contiguous, sf (ceil(T / num_per_tokens), H)): per_channel_cast, data transposed."""
    _check_channel_transpose_fmt(fmt)
    data, sf = eager.per_channel_cast(x, fmt, num_per_tokens, round_sf=round_sf, use_ue8m0=use_ue8m0,
                                      use_packed_ue8m0=use_packed_ue8m0,
                                      use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf, clamp_min=clamp_min)
    return data.t().contiguous(), sf


# -- per_channel_cast_fused ---------------------------------------------------------------------------


def _check_fused_args(x: object, x_sf: object, fmt: object, num_per_tokens: object, num_per_channels: object,
                      pos_to_token: object, round_sf: object, use_ue8m0: object, use_packed_ue8m0: object,
                      use_tma_aligned_col_major_sf: object, clamp_min: object) -> int | None:
    """Checks x (plain, or e4m3 codes with x_sf), num_per_channels, num_per_tokens and the sf options (the
    per-channel cast's, checked here before any work), and pos_to_token's metadata; no tensor value is read.
    Returns num_per_channels (None for a plain x)."""
    _check_channel_transpose_fmt(fmt)
    if x_sf is None:
        if num_per_channels is not None:
            raise ValueError("num_per_channels is the block of x_sf: it needs x_sf (a quantised x)")
        eager._check_x(x)
    else:
        check_tensor("x", x, (torch.float8_e4m3fn,), 2, "(T, H) of e4m3 codes (with x_sf)")
        check_rows("x", x)
        check_tensor("x_sf", x_sf, eager.SF_DTYPES, 2, "(T, H / num_per_channels)")
        eager._check_same_device(x, x_sf=x_sf)
        n = eager._check_int("num_per_channels", num_per_channels)
        if n not in eager.TOKEN_BLOCKS or x.shape[1] == 0 or x.shape[1] % n:
            raise ValueError(f"num_per_channels must be one of {eager.TOKEN_BLOCKS} and divide H={x.shape[1]} "
                             f"(H >= 1), got {n}")
        stored_cols = -(-(x.shape[1] // n) // 4) if x_sf.dtype == torch.int32 else x.shape[1] // n
        if tuple(x_sf.shape) != (x.shape[0], stored_cols):
            raise ValueError(f"x_sf must have shape {(x.shape[0], stored_cols)} for x {tuple(x.shape)} and "
                             f"num_per_channels={n} ({x_sf.dtype}), got {tuple(x_sf.shape)}")
    npt = eager._check_int("num_per_tokens", num_per_tokens)
    if npt not in eager.CHANNEL_BLOCKS:
        raise ValueError(f"num_per_tokens must be one of {eager.CHANNEL_BLOCKS}, got {npt}")
    eager._check_sf_options("e4m3", round_sf, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf, clamp_min)
    if pos_to_token is not None:
        check_tensor("pos_to_token", pos_to_token, (torch.int32,), 1, "(N,)")
        eager._check_same_device(x, pos_to_token=pos_to_token)
    return num_per_channels


def _check_pos_to_token_values(pos_to_token: torch.Tensor | None, num_tokens: int) -> None:
    """pos_to_token's values in [-1, T), read back to the host (one device sync on CUDA): the eager
    function's check; the TileLang wrapper reads nothing back (`_gather_rows` bounds the index instead)."""
    if pos_to_token is None or not pos_to_token.numel():
        return
    low, high = torch.stack(torch.aminmax(pos_to_token)).tolist()  # one read back
    if low < -1 or high >= num_tokens:
        raise ValueError(f"pos_to_token values must be in [-1, T={num_tokens}), got [{low}, {high}]")


def _gather_rows(values: torch.Tensor, pos_to_token: torch.Tensor | None) -> torch.Tensor:
    """Row n is values[pos_to_token[n]], a zero row where it is -1 (values itself without pos_to_token).

    The index is bounded on the device: one outside [0, T) gives a zero row, as -1 does, so an index
    the contract refuses (which only the eager function checks) is never read out of bounds."""
    if pos_to_token is None:
        return values
    pos = pos_to_token.long()
    if values.shape[0] == 0:
        return values.new_zeros(pos.numel(), values.shape[1])
    inside = (pos >= 0) & (pos < values.shape[0])
    gathered = values.index_select(0, torch.where(inside, pos, 0))
    return torch.where(inside[:, None], gathered, torch.zeros_like(gathered))


def per_channel_cast_fused(x: torch.Tensor, x_sf: torch.Tensor | None = None, fmt: str = "e4m3",
                           num_per_tokens: int = 128, num_per_channels: int | None = None,
                           pos_to_token: torch.Tensor | None = None, *, round_sf: bool = False,
                           use_ue8m0: bool = False, use_packed_ue8m0: bool = False,
                           use_tma_aligned_col_major_sf: bool = False,
                           clamp_min: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(data e4m3 (N, H), sf): quant.per_channel_cast of x (or of quant.cast_back(x, x_sf) in fp32) with its rows
    gathered by pos_to_token."""
    n = _check_fused_args(x, x_sf, fmt, num_per_tokens, num_per_channels, pos_to_token, round_sf, use_ue8m0,
                          use_packed_ue8m0, use_tma_aligned_col_major_sf, clamp_min)
    _check_pos_to_token_values(pos_to_token, x.shape[0])
    return _fused_cast(x, x_sf, n, pos_to_token, eager.cast_back, eager.per_channel_cast, num_per_tokens,
                      round_sf=round_sf, use_ue8m0=use_ue8m0, use_packed_ue8m0=use_packed_ue8m0,
                      use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf, clamp_min=clamp_min)


def _fused_cast(x: torch.Tensor, x_sf: torch.Tensor | None, n: int, pos_to_token: torch.Tensor | None,
               cast_back, per_channel_cast, num_per_tokens: int, **sf_options) -> tuple[torch.Tensor, torch.Tensor]:
    """per_channel_cast_fused after its checks, from a `cast_back` and a `per_channel_cast` (the eager ones, or
    the TileLang ones): x's values (decoded in fp32 where x is quantised, 1 x n blocks), their rows gathered by
    pos_to_token (`_gather_rows`), cast per channel to e4m3."""
    # cast_back takes contiguous codes; a quantised x may have a row stride (check_rows)
    values = x if x_sf is None else cast_back(x.contiguous(), x_sf, "e4m3", (1, n), torch.float32)
    return per_channel_cast(_gather_rows(values, pos_to_token).contiguous(), "e4m3", num_per_tokens, **sf_options)


# -- per_block_cast_lossless --------------------------------------------------------------------------


def _check_lossless_block(name: str, block: object, allowed: tuple[tuple[int, int], ...]) -> tuple[int, int]:
    if not isinstance(block, (tuple, list)) or len(block) != 2:
        raise TypeError(f"{name} must be a tuple of two ints, got {block!r}")
    value = tuple(eager._check_int(name, v) for v in block)
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value}")
    return value


def _check_lossless_args(x: object, x_sf: object, fmt: object, x_block_size: object, out_block_size: object,
                        use_ue8m0: object, use_packed_ue8m0: object,
                        use_tma_aligned_col_major_sf: object) -> tuple[int, tuple[int, int], tuple[int, int]]:
    """Checks every argument but the sf values; returns (H, in block, out block)."""
    check_tensor("x", x, (torch.int8,), 2, "(T, H / 2) of packed e2m1 codes")
    check_rows("x", x)
    check_tensor("x_sf", x_sf, eager.SF_DTYPES, 2, "(rows, cols)")
    eager._check_same_device(x, x_sf=x_sf)
    eager._check_fmt(fmt, LOSSLESS_FORMATS, " (the lossless cast writes e4m3)")
    in_block = _check_lossless_block("x_block_size", x_block_size, LOSSLESS_IN_BLOCKS)
    out_block = _check_lossless_block("out_block_size", out_block_size, LOSSLESS_OUT_BLOCKS)
    use_ue8m0 = eager._check_bool("use_ue8m0", use_ue8m0)
    if eager._check_bool("use_packed_ue8m0", use_packed_ue8m0) and not use_ue8m0:
        raise ValueError("use_packed_ue8m0 needs use_ue8m0=True (it packs ue8m0 bytes)")
    eager._check_bool("use_tma_aligned_col_major_sf", use_tma_aligned_col_major_sf)
    if out_block[0] % in_block[0] or out_block[1] % in_block[1]:
        raise ValueError(f"out_block_size {out_block} must be a multiple of x_block_size {in_block}")
    hidden = 2 * x.shape[1]
    if hidden == 0 or hidden % out_block[1]:
        raise ValueError(f"x: H = 2 * x.shape[1] = {hidden} must be a positive multiple of out_block_size[1] = "
                         f"{out_block[1]}")
    rows, cols = -(-x.shape[0] // in_block[0]), hidden // in_block[1]
    stored_cols = -(-cols // 4) if x_sf.dtype == torch.int32 else cols
    if tuple(x_sf.shape) != (rows, stored_cols):
        raise ValueError(f"x_sf must have shape {(rows, stored_cols)} for x {tuple(x.shape)} and x_block_size "
                         f"{in_block} ({x_sf.dtype}), got {tuple(x_sf.shape)}")
    return hidden, in_block, out_block


def _block_max(values: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """max over each block of non-negative values (the partial last block row padded with zeros)."""
    if not values.numel():
        return values.new_zeros(0, values.shape[1] // block[1])
    return eager._blocks(values, block).amax(dim=-1)


def _input_scales(x_sf: torch.Tensor, cols: int) -> torch.Tensor:
    """The input sf values, fp32 (rows, cols) contiguous, whatever their storage."""
    return eager._sf_values(x_sf, cols).float().contiguous()


def _lossless_out_sf(in_sf: torch.Tensor, in_block: tuple[int, int], out_block: tuple[int, int],
                    use_ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(out sf, refusals), computed on in_sf's device with nothing read back.

    out sf per block (ceil(T / bm), H / bk), fp32: 2^-6 times the largest input sf of the block, NaN where
    one is NaN, and NaN for a block the contract refuses.  in_sf: the fp32 input sf (rows, cols)
    (`_input_scales`); input blocks are one row.  refusals: bool (3,), whether some input sf is not a power
    of two 2^k, -127 <= k <= 127, or NaN; some input sf is below 2^-14 times the largest of its out block;
    some ue8m0 out sf is below 2^-127 (`_check_lossless_refusals` says each in words).  A refused out
    block is NaN (its sf and, through the kernel's quotient in sf / NaN, every code), as a NaN input sf
    makes it: a deterministic answer that no exact one is mistaken for.  Everything is exact in fp32
    (products and reciprocals of powers of two)."""
    group = (out_block[0] // in_block[0], out_block[1] // in_block[1])  # out blocks on the input sf's grid
    mantissa, exponent = torch.frexp(in_sf)
    nan = torch.isnan(in_sf)
    bad = ~nan & ~(torch.isfinite(in_sf) & (mantissa == 0.5) & (exponent - 1 >= SF_EXPONENTS[0])
                   & (exponent - 1 <= SF_EXPONENTS[1]))
    known = torch.where(nan | bad, torch.ones_like(in_sf), in_sf)
    high = _block_max(torch.where(nan, torch.zeros_like(in_sf), known), group)
    low = 1.0 / _block_max(torch.where(nan, torch.zeros_like(in_sf), 1.0 / known), group)
    nan_blocks = _block_max(nan.float(), group) > 0
    bad_blocks = _block_max(bad.float(), group) > 0
    spread = ~nan_blocks & (low < high * 2.0**-LOSSLESS_SPAN)
    tiny = ~nan_blocks & (high * 2.0**-LOSSLESS_HEADROOM < 2.0**-127) if use_ue8m0 else torch.zeros_like(spread)
    refusals = torch.stack([bad.any(), spread.any(), tiny.any()])
    out = high * 2.0**-LOSSLESS_HEADROOM
    nan_out = nan_blocks | bad_blocks | spread | tiny
    return torch.where(nan_out, torch.full_like(out, float("nan")), out).contiguous(), refusals


def _check_lossless_refusals(refusals: torch.Tensor) -> None:
    """Raises ValueError (naming x_sf) for a refusal `_lossless_out_sf` found: its flags read back to the host
    (one device sync on CUDA), by the eager function only."""
    flags = refusals.tolist()  # one read back
    if flags[0]:
        raise ValueError("x_sf: every input sf must be a power of two 2^k with -127 <= k <= 127, or NaN")
    if flags[1]:
        raise ValueError(f"x_sf: the cast cannot be lossless: an input sf below 2^-{LOSSLESS_SPAN} times the "
                         f"largest of its out block")
    if flags[2]:
        raise ValueError("x_sf: the cast cannot be lossless: an out sf below 2^-127 (the least ue8m0 value)")


def _store_out_sf(sf: torch.Tensor, use_ue8m0: bool, use_packed_ue8m0: bool, col_major: bool) -> torch.Tensor:
    """The out sf (fp32 powers of two or NaN) in the storage the flags ask for."""
    return eager._store_sf(sf, use_ue8m0, use_packed_ue8m0, col_major)


def per_block_cast_lossless(x: torch.Tensor, x_sf: torch.Tensor, fmt: str = "e4m3",
                            x_block_size: tuple[int, int] | list[int] = (1, 32),
                            out_block_size: tuple[int, int] | list[int] = (128, 128), *, use_ue8m0: bool = False,
                            use_packed_ue8m0: bool = False,
                            use_tma_aligned_col_major_sf: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(data e4m3 (T, H), sf (ceil(T / bm), H / bk)): the e2m1 values codes(x) * x_sf, exactly, as e4m3 codes
    times the out block's sf."""
    hidden, in_block, out_block = _check_lossless_args(x, x_sf, fmt, x_block_size, out_block_size, use_ue8m0,
                                                      use_packed_ue8m0, use_tma_aligned_col_major_sf)
    shape = (x.shape[0], hidden)
    in_sf = _input_scales(x_sf, hidden // in_block[1])
    out_sf, refusals = _lossless_out_sf(in_sf, in_block, out_block, use_ue8m0)
    _check_lossless_refusals(refusals)
    in_scales = eager._to_elements(in_sf, torch.Size(shape), in_block)
    codes = eager._unpack_e2m1(x).long()
    table = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=x.device)
    c = torch.where(codes >= 8, -table[codes & 7], table[codes & 7])
    # in / out is an exact power of two in [2^-14, 2^6] (or NaN), and c times it an e4m3 value
    values = c * (in_scales / eager._to_elements(out_sf, torch.Size(shape), out_block))
    return values.to(torch.float8_e4m3fn), _store_out_sf(out_sf, use_ue8m0, use_packed_ue8m0,
                                                        use_tma_aligned_col_major_sf)


# -- batched_transpose_weight_sf ----------------------------------------------------------------------

WEIGHT_SF_BLOCKS = (32, 128)  # block_size: the weight's scaling block (square)
WEIGHT_SF_ALIGN = 128  # n and k (the weight's sizes) must be multiples of it


def _check_weight_sf_args(sf: object, block_size: object, transpose_sf1: object) -> tuple[int, int, int, int]:
    """Checks sf (fp32 (n / bs, k / bs) or (G, n / bs, k / bs), contiguous, G >= 1, n and k positive
    multiples of 128), block_size and transpose_sf1; returns (G, num_sf_n, num_sf_k, block_size).  The sf
    values are not read (that would need a read back from the device): values other than powers of two
    2^e, -127 <= e <= 127, are outside the contract."""
    if not isinstance(sf, torch.Tensor):
        raise TypeError(f"sf must be a torch.Tensor, got {type(sf).__name__}")
    if sf.dtype != torch.float32:
        raise TypeError(f"sf must have dtype torch.float32, got {sf.dtype}")
    if sf.dim() not in (2, 3):
        raise ValueError(f"sf must be 2-D (n / block_size, k / block_size) or 3-D (G, n / block_size, "
                         f"k / block_size), got shape {tuple(sf.shape)}")
    check_contiguous("sf", sf)
    bs = eager._check_int("block_size", block_size)
    if bs not in WEIGHT_SF_BLOCKS:
        raise ValueError(f"block_size must be one of {WEIGHT_SF_BLOCKS}, got {bs}")
    eager._check_bool("transpose_sf1", transpose_sf1)
    groups = sf.shape[0] if sf.dim() == 3 else 1
    num_sf_n, num_sf_k = sf.shape[-2:]
    n, k = num_sf_n * bs, num_sf_k * bs
    if groups == 0 or n == 0 or k == 0 or n % WEIGHT_SF_ALIGN or k % WEIGHT_SF_ALIGN:
        raise ValueError(f"sf: G >= 1 and n = {num_sf_n} * {bs}, k = {num_sf_k} * {bs} must be positive multiples "
                         f"of {WEIGHT_SF_ALIGN}, got shape {tuple(sf.shape)}")
    return groups, num_sf_n, num_sf_k, bs


def _weight_sf_layouts(groups: int, num_sf_n: int, num_sf_k: int, block_size: int, transpose_sf1: bool,
                      grouped: bool) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
    """((shape, strides) of sf0, (shape, strides) of sf1), deep_gemm's MN-major packed layouts: sf0
    (G?, n, ceil(num_sf_k / 4)) with strides (G?: words * n,) + (1, n); sf1 (G?, k, ceil(num_sf_n / 4)) with
    strides (..., 1, k), or with transpose_sf1 (G?, ceil(num_sf_n / 4), k) with strides (..., k, 1)."""
    n, k = num_sf_n * block_size, num_sf_k * block_size
    words0, words1 = -(-num_sf_k // 4), -(-num_sf_n // 4)
    lead = ((groups,), (words0 * n,)) if grouped else ((), ())
    lead1 = ((groups,), (words1 * k,)) if grouped else ((), ())
    sf1 = ((words1, k), (k, 1)) if transpose_sf1 else ((k, words1), (1, k))
    return ((lead[0] + (n, words0), lead[1] + (1, n)), (lead1[0] + sf1[0], lead1[1] + sf1[1]))


def _packed_words(rows: torch.Tensor) -> torch.Tensor:
    """fp32 powers of two (G, R, C) -> int32 (G, ceil(C / 4), R): the packed ue8m0 words of each row, word-major
    (the storage of an MN-major layout)."""
    groups, num_rows, cols = rows.shape
    words = eager._pack_ue8m0(eager._ue8m0_bytes(rows.reshape(groups * num_rows, cols)))
    return words.reshape(groups, num_rows, -1).transpose(1, 2).contiguous()


def batched_transpose_weight_sf(sf: torch.Tensor, block_size: int = 128,
                                transpose_sf1: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(sf0, sf1) int32 packed ue8m0 in deep_gemm's MN-major layouts (`_weight_sf_layouts`): sf0[.., r, w] packs
    sf[.., r // bs, 4w + j] and sf1[.., c, w] packs sf[.., 4w + j, c // bs], byte j of the word (the lowest
    first) holding the ue8m0 byte (the fp32 exponent field) of the j-th sf; bytes past the last sf zero."""
    groups, num_sf_n, num_sf_k, bs = _check_weight_sf_args(sf, block_size, transpose_sf1)
    values = sf.reshape(groups, num_sf_n, num_sf_k)
    storage0 = _packed_words(values.repeat_interleave(bs, dim=1))  # (G, words0, n)
    storage1 = _packed_words(values.transpose(1, 2).repeat_interleave(bs, dim=1))  # (G, words1, k)
    return _weight_sf_views(storage0, storage1, bs, transpose_sf1, sf.dim() == 3)


def _weight_sf_views(storage0: torch.Tensor, storage1: torch.Tensor, block_size: int, transpose_sf1: bool,
                    grouped: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(sf0, sf1): word-major contiguous storages (G, words0, n) and (G, words1, k) viewed with exactly the
    shapes and strides of `_weight_sf_layouts` (a dimension of one element included)."""
    groups, words0, n = storage0.shape
    num_sf_n, num_sf_k = n // block_size, storage1.shape[2] // block_size
    layouts = _weight_sf_layouts(groups, num_sf_n, num_sf_k, block_size, transpose_sf1, grouped)
    return tuple(torch.as_strided(s, shape, strides) for s, (shape, strides) in zip((storage0, storage1), layouts))
