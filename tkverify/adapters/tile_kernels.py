"""DeepSeek's tile-kernels as the implementation "tile_kernels" of the registered ops.

tile-kernels is an implementation under test: it is called only through its
public functions, and each adapter below maps our contract (the signatures in
the eager docstrings of ``kernels/torch/*.py``) onto them: argument
conventions, out-parameters (allocated here), output layouts converted
exactly (bits moved, never recomputed).  The API differs between releases:
generation 1 is 1.0.x (tilelang 0.1.11), generation 2 is 2.x (2.1.0,
tilelang 0.1.15); the installed version is read from the package metadata
without importing tile-kernels.

What the adapter does when tile-kernels cannot do what a case asks
------------------------------------------------------------------
* The op is missing from the installed version: the implementation is
  unavailable (`Impl.available`), and says which version lacks what.
* An option, size, format or input domain is missing: the call raises
  `tkverify.Unsupported` with the reason.  Known limits are checked
  before the call (some of them are device asserts, which would end the CUDA
  context); an ``assert`` in tile-kernels' own Python code (its argument
  checks), or a ``ValueError`` its own code raises (its refusal of a size), is
  turned into `Unsupported` naming the line and the message.  Every other
  error is the implementation's, and fails the check.
* A size that tile-kernels does not compile and does not check either (sinkhorn
  with m not a power of two: a TileLang compile error) is refused before the
  call; TKVERIFY_TK_RAW=1 lifts that refusal, to see the error itself.

Conventions converted (exact), beside the layouts
-------------------------------------------------
* ue8m0 sf: tile-kernels has only packed ue8m0 (``use_packed_ue8m0``, which
  implies its round_sf).  Our unpacked ue8m0 bytes are the bytes of its packed
  words; our packed words are rebuilt from those bytes with zero padding bytes
  (the contract's; what tile-kernels leaves there is never read).  1.0 writes
  packed ue8m0 column-major only, so it is asked for that and re-laid out.
* A precomputed sf (cast_back, per_token_cast_with_precomputed_sf) in ue8m0
  or packed storage is handed over as the equal fp32 power of two (2^(e-127),
  0xFF -> NaN), the one sf storage both releases take as an input everywhere.
* moe.fused_mapping: tile-kernels' expert_end is the padded end of a segment;
  ours is the end of its real rows: start + the rows tile-kernels assigned to
  the expert (checked against its padded end).  Inside a segment our contract
  orders pairs by (token, slot); tile-kernels fills warps' chunks in its own
  order, so the rows of each segment are permuted into (token, slot) order,
  each row's entries moving together (no value is recomputed), and only when
  every row already lies in its expert's segment.  TKVERIFY_TK_RAW=1 turns both
  conversions off, to see the raw layout.
* moe.expand_to_fused: tile-kernels wants pos_to_expert to find padding rows;
  it is built from token_topk_to_pos (-1 on rows no pair maps to).

The table of what maps to what, per version, is in
``reports/tile-kernels/findings.md``; the findings reproduced there are
recognised as known discrepancies (``tile_kernels_known.py``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import os
import traceback
from typing import Any, Callable, Iterator

import numpy as np
import torch

from tkverify import registry
from tkverify.registry import Impl, Unsupported

NAME = "tile_kernels"
MODULE = "tile_kernels"
RAW_ENV = "TKVERIFY_TK_RAW"
KNOWN = {1: "1.0.0", 2: "2.1.0"}  # the release of each API generation the adapter was written against

# What each generation lacks, per op (absent: offered); a per-family module (`family_modules`) adds its
# own ops' in a MISSING of the same shape.
_GONE_IN_2 = ("tile-kernels 2.x dropped group_count, get_fused_mapping, expand_to_fused(_with_sf) and "
              "reduce_fused from tile_kernels.moe")
MISSING: dict[int, dict[str, str]] = {
    1: {},
    2: {
        "moe.group_count": _GONE_IN_2,
        "moe.fused_mapping": _GONE_IN_2,
        "moe.expand_to_fused": _GONE_IN_2,
        "moe.expand_to_fused_with_sf": _GONE_IN_2,
        "moe.reduce_fused": _GONE_IN_2,
        "transpose.transpose": "tile-kernels 2.x has no tile_kernels.transpose package",
        "transpose.batched_transpose": "tile-kernels 2.x has no tile_kernels.transpose package",
    },
}


# -- the installed version ---------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def installed_version() -> str | None:
    """The installed tile-kernels version, from its metadata (importing it would import tilelang)."""
    for dist in ("tile-kernels", "tile_kernels"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def generation(version: str | None) -> int | None:
    """The API generation of a version: 1 for 1.x, 2 for 2.x, None for anything else."""
    if not version:
        return None
    major = version.split(".", 1)[0]
    return int(major) if major in ("1", "2") else None


def missing_reason(op: str, version: str | None) -> str | None:
    """Why `op` cannot run on tile-kernels `version`, or None."""
    if version is None:
        return "tile-kernels is not installed (no package metadata for tile-kernels)"
    gen = generation(version)
    if gen is None:
        return (f"tile-kernels {version} is not a release this adapter maps "
                f"(it knows the APIs of {', '.join(KNOWN.values())})")
    why = MISSING[gen].get(op)
    for module in family_modules():  # the per-family tables name what their ops lack, in the same shape
        why = why or getattr(module, "MISSING", {}).get(gen, {}).get(op)
    return f"tile-kernels {version} lacks {op}: {why}" if why else None


def _gen() -> int:
    gen = generation(installed_version())
    if gen is None:  # unavailable_reason() said so before any call
        raise RuntimeError(f"tile-kernels {installed_version()} is not a release this adapter maps")
    return gen


def _v() -> str:
    return f"tile-kernels {installed_version()}"


def _tk(submodule: str) -> Any:
    return importlib.import_module(f"{MODULE}.{submodule}")


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call a tile-kernels function; an assert of its own Python code (an argument check), or a
    ValueError its own code raises (its refusal of a size, e.g. engram's "No valid blk_d for
    hidden_size=64"), becomes `Unsupported` naming it.  The same raised elsewhere (tilelang,
    torch, ours) stays an error, and so does every other exception."""
    _working_precision(*args, *kwargs.values())
    try:
        return fn(*args, **kwargs)
    except (AssertionError, ValueError) as e:
        frames = traceback.extract_tb(e.__traceback__)
        marker = f"{os.sep}{MODULE}{os.sep}"
        if not frames or marker not in frames[-1].filename:
            raise
        last = frames[-1]
        where = last.filename.rsplit(marker, 1)[-1]
        detail = f": {e}" if str(e) else ""
        raise Unsupported(f"{_v()} rejects the case: `{last.line}` ({where}:{last.lineno}){detail}") from e


def _raw() -> bool:
    return os.environ.get(RAW_ENV, "") not in ("", "0")


# -- exact layout conversions (pure torch, any device) -------------------------------------


def store_tma_column_major(values: torch.Tensor) -> torch.Tensor:
    """(rows, cols) stored with stride(0) = 1 and rows padded to 16 bytes (zeros in the padding)."""
    from references.moe import store_tma_column_major as store

    return store(values)


def _dense(t: torch.Tensor) -> torch.Tensor:
    """t with row-major strides, so that it can be viewed as bytes.  contiguous() is not enough: a
    tensor with a size-1 dim counts as contiguous whatever that dim's stride, and tile-kernels'
    TMA column-major sf of one row and one word has strides (1, 4), which view(uint8) refuses."""
    return t if t.stride(-1) == 1 and t.is_contiguous() else t.new_empty(t.shape).copy_(t)


def packed_to_bytes(packed: torch.Tensor, cols: int) -> torch.Tensor:
    """uint8 (rows, cols): the ue8m0 bytes of packed int32 words (rows, ceil(cols/4)), 4 per
    word along the columns, the first in the low byte (any strides)."""
    rows, words = packed.shape
    if packed.numel() == 0:  # T = 0: no bytes to move (and an empty view keeps any strides, odd ones too)
        return torch.empty((rows, min(cols, 4 * words)), dtype=torch.uint8, device=packed.device)
    return _dense(packed).view(torch.uint8).reshape(rows, 4 * words)[:, :cols]


def bytes_to_packed(codes: torch.Tensor) -> torch.Tensor:
    """int32 (rows, ceil(cols/4)): ue8m0 bytes (rows, cols) packed 4 a word along the columns,
    the first in the low byte, the bytes past cols zero (row-major)."""
    rows, cols = codes.shape
    padded = torch.zeros((rows, 4 * (-(-cols // 4))), dtype=torch.uint8, device=codes.device)
    padded[:, :cols] = codes
    return padded.view(torch.int32)


def row_packed_to_bytes(packed: torch.Tensor, rows: int) -> torch.Tensor:
    """uint8 (rows, cols) from tile-kernels 2.x's per-channel packing: int32 (ceil(rows/4),
    cols) with 4 consecutive block rows in a word, the first in the low byte."""
    words, cols = packed.shape
    if packed.numel() == 0:
        return torch.empty((min(rows, 4 * words), cols), dtype=torch.uint8, device=packed.device)
    b = _dense(packed).view(torch.uint8).reshape(words, cols, 4)
    return b.permute(0, 2, 1).reshape(words * 4, cols)[:rows]


def ue8m0_to_fp32(codes: torch.Tensor) -> torch.Tensor:
    """The fp32 value of ue8m0 bytes, exactly: 2^(e-127) (e = 0: the subnormal 2^-127), 0xFF NaN."""
    e = codes.to(torch.int32)
    bits = torch.where(e == 0, torch.full_like(e, 1 << 22), e << 23)
    bits = torch.where(e == 255, torch.full_like(e, 0x7FC00000), bits)
    return bits.view(torch.float32)


def sf_as_fp32(sf: torch.Tensor, cols: int) -> torch.Tensor:
    """Any sf storage of ours (fp32, ue8m0 bytes, packed ue8m0; any strides) as fp32 row-major."""
    if sf.dtype == torch.float32:
        return sf.contiguous()
    if sf.dtype == torch.uint8:
        return ue8m0_to_fp32(sf).contiguous()
    if sf.dtype == torch.int32:
        return ue8m0_to_fp32(packed_to_bytes(sf, cols)).contiguous()
    raise TypeError(f"sf must be float32, uint8 (ue8m0) or int32 (packed ue8m0), got {sf.dtype}")


def our_sf(theirs: torch.Tensor, rows: int, cols: int, *, use_ue8m0: bool, use_packed_ue8m0: bool,
           column_major: bool, packed_along_rows: bool = False) -> torch.Tensor:
    """tile-kernels' sf (fp32, or packed ue8m0 words, in any layout) in our storage.

    theirs is fp32 (rows, cols) when not use_ue8m0, else its packed ue8m0: int32
    (rows, ceil(cols/4)), or with packed_along_rows int32 (ceil(rows/4), cols).
    """
    if not use_ue8m0:
        values = theirs
    else:
        codes = row_packed_to_bytes(theirs, rows) if packed_along_rows else packed_to_bytes(theirs, cols)
        values = bytes_to_packed(codes) if use_packed_ue8m0 else codes
    return store_tma_column_major(values) if column_major else values.contiguous()


# -- quant ------------------------------------------------------------------------------------

_DEFAULT_CLAMP_MIN = {"e4m3": 1e-4, "e2m1": 6 * 2.0**-126, "e5m6": 1e-4}
_OUT_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float32: "fp32"}
_OUT_DTYPE_ALIASES = {"bf16": "bf16", "bfloat16": "bf16", "fp32": "fp32", "f32": "fp32", "float32": "fp32"}


def _fmt(fmt: str) -> str:
    if fmt == "e5m6" and _gen() == 2:
        raise Unsupported(f"{_v()} has no e5m6 format (its casts take e4m3 and e2m1)")
    return fmt


@contextlib.contextmanager
def _clamp_min(fmt: str, clamp_min: float | None) -> Iterator[None]:
    """Run with tile-kernels' amax clamp set to clamp_min (as fp32) if it is not the default."""
    default = np.float32(_DEFAULT_CLAMP_MIN[fmt])
    if clamp_min is None or np.float32(clamp_min) == default:
        yield
        return
    if _gen() == 1 or fmt == "e5m6":
        raise Unsupported(f"{_v()} has no clamp_min option for {fmt} (it is fixed at {float(default):.6g})")
    config = _tk("config")
    before = config.get_amax_clamp_for_quant(fmt, False)
    config.set_amax_clamp_for_quant(fmt, False, float(np.float32(clamp_min)))
    try:
        yield
    finally:
        config.set_amax_clamp_for_quant(fmt, False, before)


def _their_sf_flags(round_sf: bool, use_ue8m0: bool, use_tma_aligned_col_major_sf: bool) -> dict[str, bool]:
    # 1.0 stores packed ue8m0 at column-major indices whatever the flag, so it is asked for that layout.
    column_major = use_tma_aligned_col_major_sf or (use_ue8m0 and _gen() == 1)
    return {"use_tma_aligned_col_major_sf": column_major, "round_sf": round_sf or use_ue8m0,
            "use_packed_ue8m0": use_ue8m0}


def _sf_grid(x: torch.Tensor, block: tuple[int, int]) -> tuple[int, int]:
    from references.quant import sf_grid

    return sf_grid(x.shape[0], x.shape[1], block)


def per_token_cast(x, fmt="e4m3", num_per_channels=128, *, round_sf=False, use_ue8m0=False,
                   use_packed_ue8m0=False, use_tma_aligned_col_major_sf=False, clamp_min=None):
    quant = _tk("quant")
    with _clamp_min(_fmt(fmt), clamp_min):
        data, sf = _call(quant.per_token_cast, x, fmt, num_per_channels,
                         **_their_sf_flags(round_sf, use_ue8m0, use_tma_aligned_col_major_sf))
    rows, cols = _sf_grid(x, (1, num_per_channels))
    return data, our_sf(sf, rows, cols, use_ue8m0=use_ue8m0, use_packed_ue8m0=use_packed_ue8m0,
                        column_major=use_tma_aligned_col_major_sf)


def per_token_cast_with_sf_only(x, fmt="e4m3", num_per_channels=128, *, round_sf=False, use_ue8m0=False,
                                use_packed_ue8m0=False, use_tma_aligned_col_major_sf=False, clamp_min=None):
    quant = _tk("quant")
    with _clamp_min(_fmt(fmt), clamp_min):
        sf = _call(quant.per_token_cast_with_sf_only, x, fmt, num_per_channels,
                   **_their_sf_flags(round_sf, use_ue8m0, use_tma_aligned_col_major_sf))
    rows, cols = _sf_grid(x, (1, num_per_channels))
    return our_sf(sf, rows, cols, use_ue8m0=use_ue8m0, use_packed_ue8m0=use_packed_ue8m0,
                  column_major=use_tma_aligned_col_major_sf)


def per_token_cast_with_precomputed_sf(x, sf, fmt="e4m3", num_per_channels=128):
    quant = _tk("quant")
    _, cols = _sf_grid(x, (1, num_per_channels))
    return _call(quant.per_token_cast_with_precomputed_sf, x, _fmt(fmt), num_per_channels, sf_as_fp32(sf, cols))


def per_block_cast(x, fmt="e4m3", block=(128, 128), *, round_sf=False, use_ue8m0=False,
                   use_packed_ue8m0=False, use_tma_aligned_col_major_sf=False, clamp_min=None):
    quant = _tk("quant")
    block = (int(block[0]), int(block[1]))
    with _clamp_min(_fmt(fmt), clamp_min):
        data, sf = _call(quant.per_block_cast, x, fmt, block,
                         **_their_sf_flags(round_sf, use_ue8m0, use_tma_aligned_col_major_sf))
    rows, cols = _sf_grid(x, block)
    return data, our_sf(sf, rows, cols, use_ue8m0=use_ue8m0, use_packed_ue8m0=use_packed_ue8m0,
                        column_major=use_tma_aligned_col_major_sf)


def per_channel_cast(x, fmt="e4m3", num_per_tokens=128, *, round_sf=False, use_ue8m0=False,
                     use_packed_ue8m0=False, use_tma_aligned_col_major_sf=False, clamp_min=None):
    quant = _tk("quant")
    gen = _gen()
    if use_tma_aligned_col_major_sf:
        raise Unsupported(f"{_v()} per_channel_cast writes a row-major sf only")
    if use_ue8m0 and gen == 1:
        raise Unsupported(f"{_v()} per_channel_cast has no ue8m0 sf (only fp32, with or without round_sf)")
    extra = {"use_packed_ue8m0": True} if use_ue8m0 else {}
    with _clamp_min(_fmt(fmt), clamp_min):
        data, sf = _call(quant.per_channel_cast, x, fmt, num_per_tokens, round_sf=round_sf or use_ue8m0, **extra)
    rows, cols = _sf_grid(x, (num_per_tokens, 1))
    return data, our_sf(sf, rows, cols, use_ue8m0=use_ue8m0, use_packed_ue8m0=use_packed_ue8m0,
                        column_major=False, packed_along_rows=True)


def cast_back(data, sf, fmt="e4m3", block=(1, 128), out_dtype=torch.bfloat16):
    quant = _tk("quant")
    block = (int(block[0]), int(block[1]))
    name = _OUT_DTYPE_NAMES.get(out_dtype) or _OUT_DTYPE_ALIASES.get(out_dtype)
    if name is None:
        raise ValueError(f"out_dtype must be torch.bfloat16 or torch.float32, got {out_dtype!r}")
    logical_hidden = data.shape[1] * {"e4m3": 1, "e2m1": 2, "e5m6": 2}[fmt] // {"e4m3": 1, "e2m1": 1, "e5m6": 3}[fmt]
    cols = -(-logical_hidden // block[1])
    special = "e5m6" if _fmt(fmt) == "e5m6" else None
    return _call(quant.cast_back, (data, sf_as_fp32(sf, cols)), name, block, x_special_fmt=special)


def swiglu_forward_and_per_token_cast(x, fmt="e4m3", num_per_channels=128, *, topk_weights=None,
                                      pos_to_token_topk=None, clamp=None, clamped_count=None, round_sf=False,
                                      use_ue8m0=False, use_packed_ue8m0=False, use_tma_aligned_col_major_sf=False,
                                      clamp_min=None):
    """The call without weights, routing or clamp: its public function with those arguments left
    at None (their defaults in both releases), the sf options mapped as for per_token_cast."""
    if topk_weights is not None or pos_to_token_topk is not None:
        raise Unsupported(f"the tile_kernels adapter maps swiglu_forward_and_per_token_cast without weights only: "
                          f"{_v()} takes the routing as "
                          + ("pos_to_token_topk + topk_weights + pos_to_expert" if _gen() == 1
                             else "psum_num_tokens_per_expert + topk_weights")
                          + ", whose padding-row conventions are not mapped")
    if clamp is not None or clamped_count is not None:
        raise Unsupported(f"the tile_kernels adapter maps swiglu_forward_and_per_token_cast without clamp only: "
                          f"{_v()}'s clamp value and its counter ("
                          + ("int64 (3,)" if _gen() == 1 else "(4,), int32-bounded") + ") are not mapped")
    quant = _tk("quant")
    flags = _their_sf_flags(round_sf, use_ue8m0, use_tma_aligned_col_major_sf)
    x = x.contiguous()
    if _gen() == 1:
        extra = {}
        if clamp_min is not None and np.float32(clamp_min) != np.float32(_DEFAULT_CLAMP_MIN.get(fmt, 1e-4)):
            extra["sf_clamp_min"] = float(np.float32(clamp_min))
        data, sf = _call(quant.swiglu_forward_and_per_token_cast, x, fmt, num_per_channels, **flags, **extra)
    else:
        with _clamp_min(_fmt(fmt), clamp_min):
            data, sf = _call(quant.swiglu_forward_and_per_token_cast, x, fmt, num_per_channels, **flags)
    from references.quant import sf_grid

    rows, cols = sf_grid(x.shape[0], x.shape[1] // 2, (1, num_per_channels))
    return data, our_sf(sf, rows, cols, use_ue8m0=use_ue8m0, use_packed_ue8m0=use_packed_ue8m0,
                        column_major=use_tma_aligned_col_major_sf)


# -- moe --------------------------------------------------------------------------------------


def topk_gate(scores, k):
    if _gen() == 2 and not bool(torch.isfinite(scores).all()):
        raise Unsupported(f"{_v()} topk_gate takes finite scores only (a device assert, which would end "
                          "the CUDA context, guards it)")
    return _call(_tk("moe").topk_gate, scores, k)


def group_count(idx, num_groups):
    if bool(((idx < -1) | (idx >= num_groups)).any()):
        raise Unsupported(f"{_v()} group_count takes entries in [-1, num_groups) only (a device assert guards it)")
    return _call(_tk("moe").group_count, idx.to(torch.int64).contiguous(), num_groups)


def canonical_fused_order(pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start,
                          expert_end):
    """The fused layout with each segment's rows in (token, slot) order, or None.

    Rows (pos_to_token_topk >= 0) are sorted by (expert, t * K + k) and take the
    row positions in ascending order; every per-row entry moves with its row and
    token_topk_to_pos follows the moves.  None unless every row, before and
    after, lies in its expert's segment [expert_start, expert_end) (expert_end
    padded, as tile-kernels returns it): a misplaced row is left for the judge.
    """
    valid = pos_to_token_topk >= 0
    rows = torch.nonzero(valid).flatten()
    if rows.numel() == 0:
        return pos_to_token, pos_to_token_topk, token_topk_to_pos
    experts = pos_to_expert[rows].to(torch.int64)
    key = experts * (int(pos_to_token_topk.max()) + 1) + pos_to_token_topk[rows].to(torch.int64)
    by_key = rows[torch.argsort(key, stable=True)]  # old rows, in (expert, pair) order
    targets = torch.sort(rows).values  # the row positions, ascending
    def in_segments(positions: torch.Tensor) -> bool:
        e = pos_to_expert[positions].to(torch.int64)
        return bool(((e >= 0) & (positions >= expert_start[e.clamp(min=0)])
                     & (positions < expert_end[e.clamp(min=0)])).all())

    if not (torch.equal(pos_to_expert[by_key], pos_to_expert[targets]) and in_segments(rows)):
        return None
    new_ptt, new_ptt_topk = pos_to_token.clone(), pos_to_token_topk.clone()
    new_ptt[targets] = pos_to_token[by_key]
    new_ptt_topk[targets] = pos_to_token_topk[by_key]
    moved = torch.arange(pos_to_token.numel(), device=pos_to_token.device, dtype=torch.int64)
    moved[by_key] = targets
    flat = token_topk_to_pos.flatten().to(torch.int64)
    inside = (flat >= 0) & (flat < pos_to_token.numel())
    new_map = torch.where(inside, moved[flat.clamp(0, max(pos_to_token.numel() - 1, 0))], flat)
    return new_ptt, new_ptt_topk, new_map.to(torch.int32).view_as(token_topk_to_pos)


def fused_mapping(topk_idx, num_experts, alignment):
    if bool(((topk_idx < -1) | (topk_idx >= num_experts)).any()):
        raise Unsupported(f"{_v()} get_fused_mapping takes entries in [-1, num_experts) only (-1 is its mask; "
                          "others index out of bounds)")
    (pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start, expert_end,
     _, per_expert) = _call(_tk("moe").get_fused_mapping, topk_idx, num_experts, 0, alignment)
    n = int(sum(per_expert))
    if _raw():
        return pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start, expert_end, n
    real = torch.bincount(pos_to_expert[pos_to_expert >= 0].to(torch.int64), minlength=num_experts)
    real = real[:num_experts].to(torch.int32)
    padded = (real + alignment - 1) // alignment * alignment
    if not torch.equal(expert_end - expert_start, padded):
        raise AssertionError(f"{_v()} get_fused_mapping: expert_end - expert_start {(expert_end - expert_start).tolist()} "
                             f"is not the aligned count of the rows it assigned {padded.tolist()}")
    ordered = canonical_fused_order(pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos,
                                    expert_start, expert_end)
    if ordered is not None:
        pos_to_token, pos_to_token_topk, token_topk_to_pos = ordered
    return pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start, expert_start + real, n


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def padding_marks(token_topk_to_pos: torch.Tensor, num_rows: int) -> torch.Tensor:
    """pos_to_expert as tile-kernels' expand reads it: -1 on rows no pair maps to, else 0."""
    marks = torch.full((num_rows,), -1, dtype=torch.int32, device=token_topk_to_pos.device)
    pos = token_topk_to_pos.flatten().to(torch.int64)
    pos = pos[(pos >= 0) & (pos < num_rows)]
    marks[pos] = 0
    return marks


def expand_to_fused(x, token_topk_to_pos, num_expanded_rows, x_sf=None):
    moe = _tk("moe")
    marks = padding_marks(token_topk_to_pos, num_expanded_rows)
    if x_sf is None:
        return _call(moe.expand_to_fused, x, token_topk_to_pos, marks)
    column_major = x_sf.dim() == 2 and x_sf.shape[0] > 1 and x_sf.stride(0) == 1
    if x_sf.dtype == torch.uint8:
        raise Unsupported(f"{_v()} expand_to_fused_with_sf takes an fp32 or packed int32 sf, not ue8m0 bytes")
    if x_sf.dtype == torch.int32 and not column_major:
        raise Unsupported(f"{_v()} expand_to_fused_with_sf writes a packed ue8m0 sf column-major only")
    # Its num_per_channels only sizes the sf row: pick the one that gives x_sf's width.
    width = x_sf.shape[1]
    per_word = 4 if x_sf.dtype == torch.int32 else 1
    npc = [n for n in (32, 128) if _ceil_div(_ceil_div(x.shape[1], n), per_word) == width]
    if not npc:
        raise Unsupported(f"{_v()} expand_to_fused_with_sf sizes the sf by num_per_channels 32 or 128: none gives "
                          f"{width} sf columns for {x.shape[1]} stored columns")
    # Its x_sf is read row-major; column_major selects the layout it writes.
    return _call(moe.expand_to_fused_with_sf, (x, x_sf.contiguous()), npc[0], token_topk_to_pos, marks,
                 use_tma_aligned_col_major_sf=column_major)


def reduce_fused(x, topk_weights, token_topk_to_pos, x_sf=None):
    if x_sf is not None:
        raise Unsupported(f"{_v()} reduce_fused writes the sum of an e4m3 x in e4m3 (its output dtype is the "
                          "input's, or e4m3); the contract's bf16 output is not offered")
    if x.shape[1] % 256:
        raise Unsupported(f"{_v()} reduce_fused needs hidden % 256 == 0, got {x.shape[1]}")
    return _call(_tk("moe").reduce_fused, x, topk_weights, token_topk_to_pos)


def normalize_weight(topk_weights):
    return _call(_tk("moe").normalize_weight, topk_weights)


# -- transpose ---------------------------------------------------------------------------------


def _transposable(x: torch.Tensor) -> None:
    if x.shape[-1] % 64 or x.shape[-2] % 64:
        raise Unsupported(f"{_v()} transposes only sizes that are multiples of 64, got {tuple(x.shape)}")


def transpose(x):
    _transposable(x)
    return _call(_tk("transpose").transpose, x)


def batched_transpose(x):
    _transposable(x)
    return _call(_tk("transpose").batched_transpose, x)


# -- engram ------------------------------------------------------------------------------------


def _working_precision(*values: Any) -> None:
    """The gradient checks offer float64 inputs to any implementation, which must refuse them with a
    TypeError (not part of the kernel contract); tile-kernels has no float64 path, so every call into it
    (`_call`) refuses a float64 tensor among its arguments, or in a list of them, first."""
    for value in values:
        tensors = value if isinstance(value, (list, tuple)) else (value,)
        if any(isinstance(t, torch.Tensor) and t.dtype == torch.float64 for t in tensors):
            raise TypeError("tile-kernels computes in working precision: float64 inputs are not taken")


def _kv(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """2.x takes k and v as one (T, hc + 1, H) tensor, v last."""
    return torch.cat([k, v[:, None, :]], dim=1).contiguous()


def engram_gate_fwd(x, k, v, w, eps=1e-6, clamp=1e-6):
    engram = _tk("engram")
    if _gen() == 1:
        return _call(engram.engram_gate_fwd, x, k, v, w, eps, clamp, save_for_backward=True)
    return _call(engram.engram_gate_fwd, x, _kv(k, v), w, eps, clamp, save_for_backward=True)


def engram_gate_bwd(grad_out, x, k, v, w, d, g, rx, rk, eps=1e-6, clamp=1e-6):
    engram = _tk("engram")
    hc = x.shape[1]
    if _gen() == 1:
        grad_x, grad_k, grad_v, partial = _call(engram.engram_gate_bwd, grad_out, x, k, v, w, d, g, rx, rk, clamp)
    else:
        grad_x, grad_kv, partial = _call(engram.engram_gate_bwd, grad_out, x, _kv(k, v), w, d, g, rx, rk, clamp)
        grad_k, grad_v = grad_kv[:, :hc].contiguous(), grad_kv[:, hc].contiguous()
    # Its own reduction of the per-block partials, with both weights 1 (bf16, exact) and zero
    # accumulators: the "grad_wh" it returns is then the sum itself.
    ones = torch.ones(w.shape, dtype=torch.bfloat16, device=w.device)
    grad_w = torch.zeros(w.shape, dtype=torch.float32, device=w.device)
    unused = torch.zeros_like(grad_w)
    _call(engram.grad_w_reduce, partial, ones, ones, grad_w, unused)
    return grad_x, grad_k, grad_v, grad_w


# -- mhc --------------------------------------------------------------------------------------


def _sinkhorn_size(x: torch.Tensor) -> None:
    """m must be a power of two: tile-kernels' sinkhorn kernels reduce each m-wide row with a
    warp all-reduce that TileLang builds only for power-of-two widths.  2.1.0 (TileLang 0.1.15)
    fails to compile at m = 3 ("XOR-butterfly AllReduce requires ... a positive power of two,
    got 3") and m = 5 ("no available layout found"), whatever the batch; tile-kernels has no
    check of its own.  TKVERIFY_TK_RAW=1 calls it anyway, to see the compiler's error."""
    m = x.shape[-1]
    if m & (m - 1) and not _raw():
        raise Unsupported(f"{_v()} sinkhorn compiles only for power-of-two m (its warp all-reduce over a row), "
                          f"got m={m}")


def sinkhorn(x, repeat=10, eps=1e-6):
    _sinkhorn_size(x)
    if _gen() == 1:
        return _call(_tk("modeling.mhc.ops").sinkhorn_normalize, x, repeat, eps)
    flat = x.reshape(-1, *x.shape[-2:]).contiguous()
    out = torch.empty_like(flat)
    _call(_tk("mhc").mhc_sinkhorn_fwd, flat, out, repeat, eps)
    return out.view(x.shape)


def sinkhorn_bwd(grad_out, x, repeat=10, eps=1e-6):
    _sinkhorn_size(x)
    if _gen() == 1:  # 1.0's public backward is its autograd Function's
        leaf = x.detach().clone().requires_grad_(True)
        out = _call(_tk("modeling.mhc.ops").sinkhorn_normalize, leaf, repeat, eps)
        (grad,) = torch.autograd.grad(out, leaf, grad_out)
        return grad
    flat = x.reshape(-1, *x.shape[-2:]).contiguous()
    grad = torch.empty_like(flat)
    _call(_tk("mhc").mhc_sinkhorn_bwd, grad_out.reshape(flat.shape).contiguous(), flat, grad, repeat, eps)
    return grad.view(x.shape)


def pre_split_mixes(mixes, scale, base, m, post_mult, pre_eps):
    if _gen() == 1:
        return _call(_tk("modeling.mhc.ops").mhc_pre_split_mixes, mixes, scale, base, m, post_mult, pre_eps)
    lead = mixes.shape[:-1]
    flat = mixes.reshape(-1, mixes.shape[-1]).contiguous()
    n = flat.shape[0]
    pre = torch.empty((n, m), dtype=torch.float32, device=mixes.device)
    post = torch.empty_like(pre)
    comb = torch.empty((n, m * m), dtype=torch.float32, device=mixes.device)
    _call(_tk("mhc").mhc_pre_split_mixes_fwd, flat, scale, base, pre, post, comb, post_mult, pre_eps)
    return pre.view(*lead, m, 1), post.view(*lead, m, 1), comb.view(*lead, m, m)


def pre_apply_mix(x, mix):
    if _gen() == 1:
        return _call(_tk("modeling.mhc.ops").mhc_pre_apply_mix, x, mix)
    *lead, m, hidden = x.shape
    out = torch.empty((*lead, hidden), dtype=torch.bfloat16, device=x.device)
    _call(_tk("mhc").mhc_pre_apply_mix_fwd, x.reshape(-1, m, hidden).contiguous(),
          mix.reshape(-1, m).contiguous(), out.view(-1, hidden))
    return out


def post(x, residual, post, comb):
    module = _tk("mhc.post_kernel") if _gen() == 1 else _tk("mhc")
    return _call(module.mhc_post_fwd, x, residual, post, comb)


# -- registration -----------------------------------------------------------------------------


def _availability(op: str) -> Callable[[], str | None]:
    return lambda: missing_reason(op, installed_version())


def _known(case: Any, failure: registry.Failure) -> str | None:
    from tkverify.adapters import tile_kernels_known

    return tile_kernels_known.known(installed_version(), case, failure)


# The inputs whose row stride the release takes, passed through unchanged (no copy): tile-kernels 1.0's
# tests cast ``torch.randn((T, 2 * hidden))[:, :hidden]`` and transpose a twice-strided x.
ROW_STRIDED_INPUTS = {
    "quant.per_token_cast": ("x",),
    "transpose.transpose": ("x",),
    "transpose.batched_transpose": ("x",),
}


def _impl(op: str, target: Callable[..., Any]) -> Impl:
    layouts = {name: ("contiguous", "row_strided") for name in ROW_STRIDED_INPUTS.get(op, ())}
    return Impl(NAME, target, device="cuda", requires=(MODULE,), available=_availability(op), known=_known,
                layouts=layouts)


def family_modules() -> list[Any]:
    """The modules beside this one that map the ops added per family (``tile_kernels_<family>.py``): each
    holds FORWARD and BACKWARD (op -> mapping function) and registers none of them itself, so that every
    mapping is registered here, a forward before its backward.  (A second tile-kernels function for an op,
    under an implementation name of its own, is registered by its module's own `register_all`, which the
    registry calls like every adapter's: tile_kernels_quant_castback.py.)  The registry calls `register_all` once it has
    imported every adapter module, so none of them is half-imported then."""
    import pkgutil

    import tkverify.adapters

    names = sorted(info.name for info in pkgutil.iter_modules(tkverify.adapters.__path__)
                   if info.name.startswith(f"{NAME}_") and info.name != f"{NAME}_known")
    return [importlib.import_module(f"tkverify.adapters.{name}") for name in names]


def register_all() -> list[str]:
    """Add the tile_kernels implementation to every registered op it maps (the registry calls it after
    importing the adapters); returns their names, also kept in `REGISTERED`."""
    from tkverify.specs.moe import WithSfLayout
    from tkverify.specs.quant import ReturningClampedCount

    forward = {
        "moe.topk_gate": topk_gate,
        "moe.group_count": group_count,
        "moe.fused_mapping": fused_mapping,
        "moe.expand_to_fused": expand_to_fused,
        "moe.expand_to_fused_with_sf": WithSfLayout(expand_to_fused),
        "moe.reduce_fused": reduce_fused,
        "moe.normalize_weight": normalize_weight,
        "quant.per_token_cast": per_token_cast,
        "quant.per_token_cast_with_sf_only": per_token_cast_with_sf_only,
        "quant.per_token_cast_with_precomputed_sf": per_token_cast_with_precomputed_sf,
        "quant.per_block_cast": per_block_cast,
        "quant.per_channel_cast": per_channel_cast,
        "quant.cast_back": cast_back,
        "quant.swiglu_forward_and_per_token_cast": ReturningClampedCount(swiglu_forward_and_per_token_cast),
        "transpose.transpose": transpose,
        "transpose.batched_transpose": batched_transpose,
        "engram.gate": engram_gate_fwd,
        "mhc.sinkhorn": sinkhorn,
        # Declared by the mHC family's specs once they land; skipped until then.
        "mhc.pre_split_mixes": pre_split_mixes,
        "mhc.pre_apply_mix": pre_apply_mix,
        "mhc.post": post,
    }
    backward = {"engram.gate": engram_gate_bwd, "mhc.sinkhorn": sinkhorn_bwd}
    for module in family_modules():
        forward.update(getattr(module, "FORWARD", {}))
        backward.update(getattr(module, "BACKWARD", {}))
    done = []
    for op, fn in forward.items():
        if not registry.has(op):
            continue
        registry.register_impl(op, _impl(op, fn))
        if op in backward and registry.get(op).backward is not None:
            registry.register_backward_impl(op, _impl(op, backward[op]))
        done.append(op)
    REGISTERED[:] = done
    return done


REGISTERED: list[str] = []  # the ops register_all gave a tile_kernels implementation
