"""tile-kernels' per-token dequantisation, its fake-quantisation round trip and its e2m1 decoder
(contract: docs/contract/quant_castback.md).

* ``quant.per_token_cast_back((data, sf), fmt, num_per_channels, x_special_fmt=None)`` (1.0.0 and
  2.1.0) is ``cast_back`` with the block (1, num_per_channels): not an op of its own but a second
  tile-kernels implementation of quant.cast_back, named ``tile_kernels.per_token_cast_back``
  (`register_all`).  A case whose block is not per-token (bm != 1) is `Unsupported`; the sf storages
  and out_dtype names are converted as for the adapter's cast_back (an sf handed over as fp32, e5m6
  through 1.0's x_special_fmt, 2.1.0 refusing e5m6).
* ``quant.per_token_cast_and_cast_back(x, fmt, num_per_channels, round_sf=False, use_e4m3_sf=False)``
  (2.1.0 only) writes the round trip into x: the adapter hands it a clone of x, so the case's x is
  never modified, and returns that clone as out.  use_e4m3_sf (an e4m3 sf inside the round trip) is
  not part of the contract and stays False; clamp_min is set through tile-kernels' amax clamp as for
  the casts; its own limits (fmt e4m3 or e2m1, num_per_channels 16..128, H a multiple of 64) are its
  asserts, which `_call` turns into `Unsupported`.
* ``quant.unpack_from_e2m1fn_x2(x, out_dtype=torch.float32)`` (1.0.0 and 2.1.0) maps
  quant.unpack_from_e2m1fn_x2, with out_dtype's names turned into the torch dtype.
"""

from __future__ import annotations

import torch

import references.quant as quant_ref
from tkverify import registry
from tkverify.adapters.tile_kernels import (MODULE, NAME, _OUT_DTYPE_ALIASES, _OUT_DTYPE_NAMES, _availability, _call,
                                            _clamp_min, _fmt, _gen, _known, _tk, _v, sf_as_fp32)
from tkverify.registry import Impl, Unsupported

# What each API generation lacks among this module's ops (tkverify.adapters.tile_kernels.MISSING's format).
MISSING = {1: {"quant.per_token_cast_and_cast_back": "tile-kernels 1.x has no per_token_cast_and_cast_back"}}

PER_TOKEN_CAST_BACK = f"{NAME}.per_token_cast_back"  # the implementation name on quant.cast_back


def _require(op: str) -> None:
    why = MISSING.get(_gen(), {}).get(op)
    if why:
        raise Unsupported(f"{_v()} lacks {op}: {why}")


def _out_dtype_name(out_dtype) -> str:
    name = _OUT_DTYPE_NAMES.get(out_dtype) or _OUT_DTYPE_ALIASES.get(out_dtype)
    if name is None:
        raise ValueError(f"out_dtype must be torch.bfloat16 or torch.float32, got {out_dtype!r}")
    return name


def per_token_cast_back(data, sf, fmt="e4m3", block=(1, 128), out_dtype=torch.bfloat16):
    """quant.cast_back through tile-kernels' per_token_cast_back: per-token blocks only."""
    bm, bk = int(block[0]), int(block[1])
    if bm != 1:
        raise Unsupported(f"{_v()} per_token_cast_back takes per-token blocks (1, bk) only, not {(bm, bk)}")
    name = _out_dtype_name(out_dtype)
    cols = -(-quant_ref.data_width(data.shape[1], fmt) // bk)
    special = "e5m6" if _fmt(fmt) == "e5m6" else None
    return _call(_tk("quant").per_token_cast_back, (data, sf_as_fp32(sf, cols)), name, bk, x_special_fmt=special)


def per_token_cast_and_cast_back(x, fmt="e4m3", num_per_channels=128, *, round_sf=False, clamp_min=None):
    """The in-place round trip on a clone of x (the clone is returned as out)."""
    _require("quant.per_token_cast_and_cast_back")
    out = x.clone(memory_format=torch.contiguous_format)
    with _clamp_min(_fmt(fmt), clamp_min):
        _call(_tk("quant").per_token_cast_and_cast_back, out, fmt, num_per_channels, round_sf=round_sf)
    return out


def unpack_from_e2m1fn_x2(x, out_dtype=torch.float32):
    dtype = quant_ref.out_dtype_of(_OUT_DTYPE_ALIASES.get(out_dtype, out_dtype))
    return _call(_tk("quant").unpack_from_e2m1fn_x2, x, dtype)


# Registered by tkverify.adapters.tile_kernels.register_all as the "tile_kernels" implementation.
FORWARD = {"quant.per_token_cast_and_cast_back": per_token_cast_and_cast_back,
           "quant.unpack_from_e2m1fn_x2": unpack_from_e2m1fn_x2}


def register_all() -> list[str]:
    """Add tile-kernels' per_token_cast_back to quant.cast_back under its own implementation name (the
    registry calls this once every adapter module is imported); returns the ops it extended."""
    if not registry.has("quant.cast_back"):
        return []
    registry.register_impl("quant.cast_back", Impl(
        PER_TOKEN_CAST_BACK, per_token_cast_back, device="cuda", requires=(MODULE,),
        available=_availability("quant.cast_back"), known=_known))
    return ["quant.cast_back"]
