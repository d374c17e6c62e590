"""tile-kernels' layout casts as the "tile_kernels" implementation of quant.per_channel_cast_and_transpose and
quant.per_block_cast_lossless (contract: docs/contract/quant_layout.md).

1.0.0 exports ``quant.per_channel_cast_and_transpose(x, fmt, num_per_tokens, round_sf=False)``, returning the
e4m3 data (H, T) and an fp32 sf (T / num_per_tokens, H); it writes no ue8m0 and no column-major sf (those
cases are `Unsupported`), and 2.1.0 lacks it (`MISSING`).  1.0.0's ``quant.per_channel_cast_fused(x, fmt,
num_per_tokens, round_sf, num_per_channels, pos_to_token)`` takes a quantised x as the pair (codes, fp32 sf);
the same sf limits; 2.1.0 lacks it.  Both releases export
``quant.per_block_cast_lossless((data, sf), fmt, x_block_size, out_block_size, use_tma_aligned_col_major_sf,
round_sf, use_packed_ue8m0)``; the input sf is handed over as fp32 (any storage of ours converted
exactly), round_sf is always set (the contract's out sf is a power of two), and the out sf's flags and
storage are converted as for the casts.  Their asserts (sizes, blocks) make a case `Unsupported`.
2.1.0 exports ``quant.batched_transpose_weight_sf(sf, block_size, transpose_sf1s, outs)``, a list of weights'
sf in and a list of (sf0, sf1) out; the op is one weight a call, mapped as a list of one (`weight_sf_batch`
takes several, for the GPU test that batching changes nothing); 1.0.0 lacks it (`MISSING`).
"""

from __future__ import annotations

from tkverify.adapters.tile_kernels import (_call, _clamp_min, _fmt, _gen, _their_sf_flags, _tk, _v, our_sf,
                                            sf_as_fp32)
from tkverify.registry import Unsupported

# What each API generation lacks among this module's ops (tkverify.adapters.tile_kernels.MISSING's format).
MISSING = {2: {"quant.per_channel_cast_and_transpose":
               "tile-kernels 2.x has no per_channel_cast_and_transpose in tile_kernels.quant",
               "quant.per_channel_cast_fused": "tile-kernels 2.x has no per_channel_cast_fused in tile_kernels.quant"},
           1: {"quant.batched_transpose_weight_sf":
               "tile-kernels 1.x has no batched_transpose_weight_sf in tile_kernels.quant"}}


def _require(op: str) -> None:
    why = MISSING.get(_gen(), {}).get(op)
    if why:
        raise Unsupported(f"{_v()} lacks {op}: {why}")


def per_channel_cast_and_transpose(x, fmt="e4m3", num_per_tokens=128, *, round_sf=False, use_ue8m0=False,
                                   use_packed_ue8m0=False, use_tma_aligned_col_major_sf=False, clamp_min=None):
    _require("quant.per_channel_cast_and_transpose")
    if use_ue8m0 or use_tma_aligned_col_major_sf:
        raise Unsupported(f"{_v()} per_channel_cast_and_transpose writes a row-major fp32 sf only")
    with _clamp_min(_fmt(fmt), clamp_min):
        data, sf = _call(_tk("quant").per_channel_cast_and_transpose, x, fmt, num_per_tokens, round_sf=round_sf)
    return data, sf.contiguous()


def per_channel_cast_fused(x, x_sf=None, fmt="e4m3", num_per_tokens=128, num_per_channels=None, pos_to_token=None,
                           *, round_sf=False, use_ue8m0=False, use_packed_ue8m0=False,
                           use_tma_aligned_col_major_sf=False, clamp_min=None):
    _require("quant.per_channel_cast_fused")
    if use_ue8m0 or use_tma_aligned_col_major_sf:
        raise Unsupported(f"{_v()} per_channel_cast_fused writes a row-major fp32 sf only")
    if x_sf is not None:  # a QuantTensor of e4m3 codes and an fp32 sf
        x = (x, sf_as_fp32(x_sf, x.shape[1] // num_per_channels))
    with _clamp_min(_fmt(fmt), clamp_min):
        data, sf = _call(_tk("quant").per_channel_cast_fused, x, fmt, num_per_tokens, round_sf=round_sf,
                         num_per_channels=num_per_channels, pos_to_token=pos_to_token)
    return data, sf.contiguous()


def per_block_cast_lossless(x, x_sf, fmt="e4m3", x_block_size=(1, 32), out_block_size=(128, 128), *,
                            use_ue8m0=False, use_packed_ue8m0=False, use_tma_aligned_col_major_sf=False):
    in_block = (int(x_block_size[0]), int(x_block_size[1]))
    out_block = (int(out_block_size[0]), int(out_block_size[1]))
    hidden = 2 * x.shape[1]
    data, sf = _call(_tk("quant").per_block_cast_lossless, (x, sf_as_fp32(x_sf, hidden // in_block[1])), fmt,
                     in_block, out_block, **_their_sf_flags(True, use_ue8m0, use_tma_aligned_col_major_sf))
    rows, cols = -(-x.shape[0] // out_block[0]), hidden // out_block[1]
    return data, our_sf(sf, rows, cols, use_ue8m0=use_ue8m0, use_packed_ue8m0=use_packed_ue8m0,
                        column_major=use_tma_aligned_col_major_sf)


# 2^-127, the smallest sf the contract takes (an fp32 subnormal, UE8M0 byte 0): 2.1.0's kernel raises a device
# assert on the sf that held it (finding F22, reports/tile-kernels/findings.md), which leaves the process's CUDA
# context unusable, so every later call in it fails; the adapter refuses such an sf instead, listed as unsupported.
SMALLEST_SF = 2.0**-127


def weight_sf_batch(sfs, block_size=128, transpose_sf1s=None):
    """tile-kernels' (sf0, sf1) of each weight's sf in `sfs`, converted in one call (new outputs)."""
    _require("quant.batched_transpose_weight_sf")
    if any(bool((sf == SMALLEST_SF).any()) for sf in sfs):
        raise Unsupported(f"{_v()} batched_transpose_weight_sf: an sf of 2^-127 raises a device assert that "
                          "leaves the CUDA context unusable (finding F22), so it is not called")
    flags = [False] * len(sfs) if transpose_sf1s is None else [bool(t) for t in transpose_sf1s]
    return _call(_tk("quant").batched_transpose_weight_sf, list(sfs), block_size, flags, [None] * len(sfs))


def batched_transpose_weight_sf(sf, block_size=128, transpose_sf1=False):
    (pair,) = weight_sf_batch([sf], block_size, [transpose_sf1])
    return tuple(pair)


# Registered by tkverify.adapters.tile_kernels.register_all.
FORWARD = {"quant.per_channel_cast_and_transpose": per_channel_cast_and_transpose,
           "quant.per_channel_cast_fused": per_channel_cast_fused,
           "quant.per_block_cast_lossless": per_block_cast_lossless,
           "quant.batched_transpose_weight_sf": batched_transpose_weight_sf}
BACKWARD: dict = {}
