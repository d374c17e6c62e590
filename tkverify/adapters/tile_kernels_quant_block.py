"""tile-kernels' per-block cast variants as the "tile_kernels" implementation of
quant.per_block_cast_with_sf_only and quant.per_block_cast_with_precomputed_sf (contract:
docs/contract/quant.md).

Both releases export ``quant.per_block_cast_with_sf_only(x, fmt, block_size, use_tma_aligned_col_major_sf,
round_sf, use_packed_ue8m0)``, returning the sf per_block_cast would return, and
``quant.per_block_cast_with_precomputed_sf(x, fmt, block_size, sf, ...)``, returning the data of x cast
with the given sf.  The sf-only call takes the sf flags, clamp_min and the sf storage as per_block_cast's
mapping does (`tkverify.adapters.tile_kernels._their_sf_flags`, `our_sf`).  The precomputed call is
made with its flags off (both releases assert that use_tma_aligned_col_major_sf and use_packed_ue8m0 are
off with a given sf), so it reads an fp32 sf: a ue8m0 or packed sf is handed over as the equal fp32
powers of two (`sf_as_fp32`).  Both releases take a contiguous x only (their ``assert
x.is_contiguous()``), and 2.1.0 also T and H multiples of 128, 1.0.0 H a multiple of 64: their asserts
make other cases `Unsupported`.
"""

from __future__ import annotations

from tkverify.adapters.tile_kernels import _call, _clamp_min, _fmt, _sf_grid, _their_sf_flags, _tk, our_sf, sf_as_fp32

# Both releases have both functions (tkverify.adapters.tile_kernels.MISSING's format).
MISSING: dict[int, dict[str, str]] = {1: {}, 2: {}}


def per_block_cast_with_sf_only(x, fmt="e4m3", block=(128, 128), *, round_sf=False, use_ue8m0=False,
                                use_packed_ue8m0=False, use_tma_aligned_col_major_sf=False, clamp_min=None):
    block = (int(block[0]), int(block[1]))
    with _clamp_min(_fmt(fmt), clamp_min):
        sf = _call(_tk("quant").per_block_cast_with_sf_only, x, fmt, block,
                   **_their_sf_flags(round_sf, use_ue8m0, use_tma_aligned_col_major_sf))
    rows, cols = _sf_grid(x, block)
    return our_sf(sf, rows, cols, use_ue8m0=use_ue8m0, use_packed_ue8m0=use_packed_ue8m0,
                  column_major=use_tma_aligned_col_major_sf)


def per_block_cast_with_precomputed_sf(x, sf, fmt="e4m3", block=(128, 128)):
    block = (int(block[0]), int(block[1]))
    _, cols = _sf_grid(x, block)
    return _call(_tk("quant").per_block_cast_with_precomputed_sf, x, _fmt(fmt), block, sf_as_fp32(sf, cols))


# Registered by tkverify.adapters.tile_kernels.register_all.
FORWARD = {"quant.per_block_cast_with_sf_only": per_block_cast_with_sf_only,
           "quant.per_block_cast_with_precomputed_sf": per_block_cast_with_precomputed_sf}
BACKWARD: dict = {}
