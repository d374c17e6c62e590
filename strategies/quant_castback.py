"""Cases of cast_back, and of the quantisation round trips (docs/contract/quant_castback.md), these drawn
by the strategies of the ops they compose: nothing there invents values of its own.

* cast_back_cases: random codes of each format (salted with zeros, the extreme magnitudes, NaN and inf)
  and sf of three kinds (plain fp32 over a wide range, powers of two, values on and one ULP off bf16
  midpoints), in every sf storage, each case on one of the kernel's configurations (format, out dtype,
  path) chosen from its draws, half of them single rows.

* per_token_cast_and_cast_back_cases: quant.per_token_cast's cases, keeping what the round trip takes
  (fmt, num_per_channels, round_sf, clamp_min; a ue8m0 sf is round_sf's power of two, so use_ue8m0
  becomes round_sf) and dropping the sf storage flags, which change no value of the round trip.  The
  same x, so the same edge classes: saturation edges, zero rows, NaN, subnormals, empty batches.
* unpack_cases: quant.cast_back's e2m1 data (all sixteen codes, salted with zeros, -0, 0.5 and 6),
  reshaped to 1 to 3 dimensions (the last holding a row's bytes) or cut to no rows, as int8 or uint8, with its
  out_dtype; its sf is dropped (unpack has a unit sf).
"""

from __future__ import annotations

import zlib

import numpy as np
import torch
from hypothesis import strategies as st

import references.quant as ref
import strategies.quant as quant
from strategies import rarely, seeds
from strategies.classes import draws_rng, tagging
from strategies.quant import (CHANNEL_BLOCKS, FORMATS, HIDDEN_SIZES, LARGE_HIDDEN, MAX_ELEMENTS, PER_BLOCK_SIZES,
                              SF_SPECIALS, TOKEN_BLOCKS, format_values, token_counts, with_special_sf)
from tkverify import formats
from tkverify.case import Case



# -- cast_back -----------------------------------------------------------------------------


def _random_codes(rng: np.random.Generator, shape: tuple[int, int], fmt: str) -> np.ndarray:
    f = formats.get(fmt)
    codes = rng.integers(0, 1 << f.bits, size=shape).astype(f.code_dtype)
    # Salt with zeros, the largest and smallest magnitudes, NaN and inf codes.
    values = format_values(fmt)
    salt = np.array([0.0, values[1], values[-1], -values[-1], -0.0])
    salted = rng.random(shape) < 0.2
    codes[salted] = f.encode(salt[rng.integers(0, len(salt), size=shape)])[salted]
    return codes


def _random_sf(rng: np.random.Generator, shape: tuple[int, int], kind: str) -> np.ndarray:
    """sf values: "plain" random fp32 over a wide range; "pow2"; "ties" - values on and
    one fp32 ULP off bf16 rounding midpoints (so q * sf tests bf16 ties and double rounding)."""
    if kind == "pow2":
        return np.exp2(rng.integers(-127, 128, size=shape).astype(np.float64))
    if kind == "ties":
        mantissa = 1 + (2 * rng.integers(0, 128, size=shape) + 1) * 2.0**-8  # a bf16 midpoint
        nudge = rng.integers(-1, 2, size=shape) * 2.0**-23
        return np.exp2(rng.integers(-30, 30, size=shape).astype(np.float64)) * (mantissa + nudge)
    return np.float32(np.exp2(rng.uniform(-60, 60, size=shape))).astype(np.float64)


# Rows that are not a whole number of 8-element chunks (the TileLang kernel's unit: its rows then
# start anywhere in a chunk, and a partial chunk ends the tensor); 12 and 100 are whole 4-element
# chunks (its fp32 unit) but not 8-element ones.  e2m1 needs an even H.
CAST_BACK_ODD_HIDDEN = {"e4m3": (1, 3, 7, 12, 13, 100, 1001), "e2m1": (2, 6, 12, 14, 100, 1002)}
CAST_BACK_CHANNEL_HIDDEN = {"e4m3": (2, 6, 12, 13, 32, 128), "e2m1": (2, 6, 12, 32, 128)}


# The cast_back kernel's paths (kernels.quant.dequant), each a configuration of its own per format and out
# dtype: "block" (H a multiple of the out dtype's 16-byte chunk, bk > 1), "column" (the same H, bm x 1
# blocks: an sf per element) and "flat" (H not a multiple of the chunk: a chunk may span rows); e5m6
# (H % 8 == 0, 1 x H blocks) has the block path only.
CAST_BACK_PATHS = ("block", "column", "flat")
CAST_BACK_CHUNK = {"bf16": 8, "fp32": 4}  # out elements in a 16-byte chunk


# (fmt, out dtype, path) of each cast_back configuration
# `draws_rng`'s stream of cast_back_cases' configuration choice (74: a stream whose ci draws, with the round trips'
# and unpack's, reach every cast_back configuration and its single row)
CAST_BACK_SALT = 74
CAST_BACK_KINDS = tuple((fmt, out, path) for fmt in FORMATS for out in CAST_BACK_CHUNK for path in CAST_BACK_PATHS
                        if fmt != "e5m6" or path == "block")
# The share of cases of each path (`CAST_BACK_PATHS`): the column path the most, since only cast_back's cases
# reach its configurations (the round trips and unpack take the block and flat paths too).
CAST_BACK_PATH_SHARES = (0.2, 0.45, 0.35)


def _cast_back_geometry(rng: np.random.Generator, fmt: str, out_dtype: str, path: str) -> tuple[int, tuple[int, int]]:
    """(H, block) of a cast_back case that takes `path`."""
    chunk = CAST_BACK_CHUNK[out_dtype]
    if path == "column":
        hidden = int(rng.choice([h for h in CAST_BACK_CHANNEL_HIDDEN[fmt] if h % chunk == 0]))
        return hidden, (int(rng.choice(CHANNEL_BLOCKS)), 1)
    if path == "flat":  # per token with one block a row (npc = H), or per channel
        if rng.random() < 0.5:
            hidden = int(rng.choice([h for h in CAST_BACK_ODD_HIDDEN[fmt] if h % chunk]))
            return hidden, (1, hidden)
        hidden = int(rng.choice([h for h in CAST_BACK_CHANNEL_HIDDEN[fmt] if h % chunk]))
        return hidden, (int(rng.choice(CHANNEL_BLOCKS)), 1)
    if fmt == "e5m6" or rng.random() < 0.5:
        hidden = int(rng.choice(HIDDEN_SIZES)) if rng.random() < 0.95 else LARGE_HIDDEN
        npc = [n for n in (*TOKEN_BLOCKS, hidden) if hidden % n == 0] if fmt != "e5m6" else [hidden]
        return hidden, (1, int(rng.choice(npc)))
    block = PER_BLOCK_SIZES[int(rng.integers(0, len(PER_BLOCK_SIZES)))]
    return int(rng.choice([h for h in (*HIDDEN_SIZES, 384) if h % block[1] == 0])), block


@st.composite
def cast_back_cases(draw) -> Case:
    """Cases of cast_back.  What the case's draws give (`draws_rng`: its seed, sf storage and kind, and row
    count, drawn first) decides the kernel configuration it takes (`CAST_BACK_KINDS`: format, out dtype,
    path), its H and block, and in half the cases a single row (half the empty batches stay): the ci profile's few
    examples then spread over the configurations, each with one row, more evenly than draws of their own
    (hypothesis repeats a draw's value across examples).  The row count (0, 1, small, odd, tails of every
    per-channel block, rarely a few hundred) is cut to `MAX_ELEMENTS` once H is known."""
    seed = draw(seeds())
    storage = draw(st.sampled_from(("fp32", "ue8m0", "packed")))
    sf_kind = "pow2" if storage != "fp32" else draw(st.sampled_from(("plain", "pow2", "ties")))
    specials = draw(rarely(st.just(False), st.just(True), one_in=2))  # special sf values, every other case
    num_rows = draw(token_counts(1, max(CHANNEL_BLOCKS)))
    pick = draws_rng((seed, storage, sf_kind, specials, num_rows), CAST_BACK_SALT)
    path = CAST_BACK_PATHS[int(pick.choice(len(CAST_BACK_PATHS), p=CAST_BACK_PATH_SHARES))]
    kinds = [kind for kind in CAST_BACK_KINDS if kind[2] == path]
    fmt, out_dtype, path = kinds[int(pick.integers(0, len(kinds)))]
    hidden, block = _cast_back_geometry(pick, fmt, out_dtype, path)
    num_rows = min(num_rows, max(1, MAX_ELEMENTS // hidden))
    # a single row in half the cases, and half the empty batches drawn (a fifth of the ci examples) stay
    num_rows = 1 if pick.random() < 0.5 else num_rows
    rng = np.random.default_rng(seed)
    codes = _random_codes(rng, (num_rows, hidden), fmt)
    rows, cols = ref.sf_grid(num_rows, hidden, block)
    sf = _random_sf(rng, (rows, cols), sf_kind)
    if specials and sf.size:
        sf = with_special_sf(rng, sf, SF_SPECIALS if storage == "fp32" else (np.nan, 2.0**-127, 2.0**127))
    stored = ref.store_sf(sf, use_ue8m0=storage != "fp32", use_packed_ue8m0=storage == "packed")
    return Case(params={"fmt": fmt, "block": list(block), "out_dtype": out_dtype},
                inputs={"data": ref.pack_data(codes, fmt), "sf": stored})


cast_back_cases = tagging("data", (
    'dtype_max:data', 'empty', 'nan:data', 'nan:sf', 'nan_payload:data',
    'neg_zero:data', 'non_pow2', 'pos_inf:sf', 'signed_zero_tie:data', 'single_row',
    'subnormal:data', 'subnormal:sf',
))(cast_back_cases)

ROUND_TRIP_ROW_STREAM = 21  # `draws_rng`'s stream of the round trip's single-row choice
ROUND_TRIP_SINGLE_ROW_SHARE = 0.4


@st.composite
def per_token_cast_and_cast_back_cases(draw) -> Case:
    """per_token_cast's case, cut to its first row in `ROUND_TRIP_SINGLE_ROW_SHARE` of the cases with rows, the
    case's draws deciding (`draws_rng`: its parameters and x's bytes): the decode kernel's configurations
    this round trip reaches (per format, dtype and path) are reached with one row too."""
    case = draw(quant.per_token_cast_cases())
    p, x = case.params, case.inputs["x"]
    params = {"fmt": p["fmt"], "num_per_channels": p["num_per_channels"],
              "round_sf": bool(p["round_sf"] or p["use_ue8m0"]), "clamp_min": p["clamp_min"]}
    digest = zlib.crc32(x.contiguous().view(torch.uint8).numpy().tobytes())
    pick = draws_rng((sorted(p.items()), tuple(x.shape), str(x.dtype), digest), ROUND_TRIP_ROW_STREAM)
    if x.shape[0] > 1 and pick.random() < ROUND_TRIP_SINGLE_ROW_SHARE:
        x = x[:1].clone()
    return Case(params=params, inputs={"x": x})


@st.composite
def unpack_cases(draw) -> Case:
    case = draw(cast_back_cases().filter(lambda c: c.params["fmt"] == "e2m1"))
    data = case.inputs["data"]  # int8 (T, H/2)
    rows, width = data.shape
    shape = draw(st.sampled_from(("1d", "2d", "3d", "empty")))
    if shape == "empty":  # no rows: an empty out of (0, 2K)
        data = data[:0]
    elif shape == "1d":
        data = data.reshape(rows * width)
        if data.numel() == 0:  # a 1-D tensor keeps one byte at least (K >= 1)
            data = data.new_zeros(1)
    elif shape == "3d" and rows % 2 == 0:
        data = data.reshape(2, rows // 2, width)
    if draw(st.booleans()):
        data = data.view(torch.uint8)
    return Case(params={"out_dtype": case.params["out_dtype"]}, inputs={"x": data})


per_token_cast_and_cast_back_cases = tagging(
    "x", quant.per_token_cast_cases.classes,
    quant.computed_sf_saturation(lambda p, x: (1, p["num_per_channels"])),
)(per_token_cast_and_cast_back_cases)
def code_classes(case: Case) -> set[str]:
    """The value classes of packed e2m1 codes: -0 (nibble 0x8) and the largest magnitude, 6 (0x7, 0xF)."""
    nibbles = set(case.inputs["x"].view(torch.uint8).flatten().tolist())
    nibbles = {b & 0xF for b in nibbles} | {b >> 4 for b in nibbles}
    return ({"neg_zero:x"} if 0x8 in nibbles else set()) | ({"dtype_max:x"} if nibbles & {0x7, 0xF} else set())


unpack_cases = tagging("x", (
    'dtype_max:x', 'empty', 'neg_zero:x', 'non_pow2', 'single_row',
), code_classes)(unpack_cases)
