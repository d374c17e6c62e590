"""Strategies for the quantisation family.

A case is a handful of draws: the static parameters (format, block geometry,
sf options, input dtype, H - each from a small set, since they select a
compiled kernel), a token count, a seed, and which *block kinds* to plant in
which blocks.  The tensor is then built with NumPy, block by block:

* ``normal``: Gaussian values at a per-block scale from 2^-12 to 2^12;
* ``wide``: magnitudes spread over 40 binades, so the small ones land in the
  format's subnormal range or round to zero;
* ``midpoints``, ``subnormal_midpoints``, ``top_midpoints``: the block's amax
  is planted first, which fixes its sf (computed by the oracle's rule, plain
  or round_sf); the other elements are rounding boundaries of the format
  (midpoints between neighbouring codes) and representable values, times
  that sf, rounded to the input dtype and moved by -1, 0 or +1 of its ULPs: on,
  just below and just above every kind of tie, in the normal range, in the
  subnormal range (e5m6's down to 2^-20 included), and at the top codes next
  to the saturation edge (448, 6, 65024);
* ``clamp_edge``: amax one ULP below, at, or one ULP above clamp_min, the
  other values below it, down to subnormal inputs (the e2m1 default puts the
  sf at the smallest normal fp32, "denormal scales");
* ``zeros``: +-0 only;  ``outlier``: tiny values and one huge one (up to the
  dtype's largest);  ``nonfinite``: NaN, +inf or -inf among normal values;
* ``pow2_amax``: amax = max_q * 2^k exactly, or one input ULP either side
  (round_sf switches power there);  ``huge``: values near the dtype's max.

Pinned special values (NaN, +-inf, +-0, the dtype's max and smallest
subnormal, clamp_min and its neighbours) land at drawn positions last, so that
a failure can shrink to one of them.

Token counts are dynamic (0, 1, small odd, tile tails, rarely a few hundred);
the element count of a case stays below `MAX_ELEMENTS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

import references.quant as ref
from strategies import rarely, seeds, tensor_from_bits, torch_copy
from strategies.classes import INT_OF_WIDTH, float_bits, in_turn, tagging
from strategies.quant_classes import SATURATION_MIDPOINT, computed_sf_saturation, given_sf_saturation  # noqa: F401
from strategies.quant_token import format_configuration, options_for_format, plant_rounding_probe, token_configuration
from tkverify import formats
from tkverify.case import Case

FORMATS = ("e4m3", "e2m1", "e5m6")
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
HIDDEN_SIZES = (32, 64, 96, 128, 256, 320, 512)  # 96 and 320: not multiples of a 128-wide tile
LARGE_HIDDEN = 7168
TOKEN_BLOCKS = (16, 32, 64, 128)
PER_BLOCK_SIZES = ((128, 128), (32, 32))
CHANNEL_BLOCKS = (16, 32, 64, 128)
# per_channel_cast's H: below a 16-byte chunk (2, 6), H % 8 != 0 past a tile's chunks (66: the
# TileLang kernel's element path), multiples of 8 below, at and past its 128-column tile (32,
# 136: a tile of one chunk), and odd H (e4m3 only: e2m1 needs an even H).
CHANNEL_HIDDEN_SIZES = (2, 6, 32, 66, 128, 136, 256)
CHANNEL_ODD_HIDDEN_SIZES = (7, 131)
CHANNEL_TAIL_SHARE = 0.3
BLOCK_PARTIAL_TILE_SHARE = 0.3
BLOCK_FORMATS = ("e4m3", "e2m1")  # per_block_cast's and per_channel_cast's
# `draws_rng`'s streams of per_block_cast_cases' and per_channel_cast_cases' configuration choices (30: a stream
# whose ci draws give each block_cast configuration of per_block_cast_with_precomputed_sf every boundary class)
BLOCK_CONFIG_STREAM, CHANNEL_CONFIG_STREAM = 30, 25
# `draws_rng`'s stream of per_token_cast_cases' format choice with `spread` (39: a stream whose ci draws give
# each configuration of the precomputed-sf cast a tail and a single row)
TOKEN_SPREAD_STREAM = 39
# `draws_rng`'s stream of swiglu_cases' configuration choice (36: a stream whose ci draws reach each
# configuration with a single row)
SWIGLU_CAST_CONFIG_STREAM = 36
TOKEN_TAILS = (15, 17, 31, 33, 63, 65, 127, 129)
MAX_ELEMENTS = 1 << 16
# (round_sf, use_ue8m0, use_packed_ue8m0): every combination the contract allows.
SF_MODES = ((False, False, False), (True, False, False), (True, True, False), (True, True, True))
# Non-default clamp_min values per format (the default is drawn most of the time).
OTHER_CLAMP_MINS = {"e4m3": (1e-6, 0.5), "e2m1": (1e-30, 1e-3), "e5m6": (1e-8, 0.25)}
SWIGLU_CLAMPS = (None, 0.5, 7.0, 10.0)

_DTYPE_FORMAT = {"bf16": formats.BF16, "fp32": formats.FP32}
_BITS_STEP = {"bf16": 1 << 16, "fp32": 1}  # one ULP of the dtype, in fp32 bit patterns


# -- values of the input dtype ------------------------------------------------------


def round_to_dtype(v: np.ndarray, dtype: str) -> np.ndarray:
    """float64 values rounded (RNE) to the dtype, as float64."""
    f = _DTYPE_FORMAT[dtype]
    return f.decode(f.encode(v))


def step_ulps(v: np.ndarray, steps: np.ndarray, dtype: str) -> np.ndarray:
    """Values of the dtype moved by `steps` representable values (towards +inf for steps > 0)."""
    bits = np.asarray(v, dtype=np.float32).view(np.int32).astype(np.int64)
    # A monotone integer line: non-negative floats keep their bits, negative ones mirror.
    line = np.where(bits < 0, -(bits & 0x7FFFFFFF), bits)
    line = line + np.asarray(steps, dtype=np.int64) * _BITS_STEP[dtype]
    back = np.where(line < 0, (-line) | (1 << 31), line).astype(np.uint32)
    return back.view(np.float32).astype(np.float64)


def dtype_max(dtype: str) -> float:
    return _DTYPE_FORMAT[dtype].max_finite


def dtype_min_subnormal(dtype: str) -> float:
    return _DTYPE_FORMAT[dtype].min_subnormal


def format_values(fmt: str) -> np.ndarray:
    """Every finite non-negative value of the element format, ascending."""
    f = formats.get(fmt)
    values = f.decode(f.all_codes())
    return np.unique(values[np.isfinite(values) & (values >= 0)])


def rounding_targets(fmt: str, part: str) -> np.ndarray:
    """Values and midpoints of the format (as multiples of sf) in a part of its range.

    part: "any", "subnormal" (below the smallest normal, including the tie
    between 0 and the smallest subnormal), or "top" (the two top binades, the
    saturation edge max_q included).
    """
    values = format_values(fmt)
    midpoints = (values[:-1] + values[1:]) / 2
    targets = np.unique(np.concatenate([values, midpoints]))
    f = formats.get(fmt)
    smallest_normal = 2.0**f.emin
    if part == "subnormal":
        return targets[targets <= smallest_normal]
    if part == "top":
        return targets[targets >= values[-1] / 4]
    return targets


# -- block kinds: (rng, blocks (m, n) float64, ctx) -> None, filling in place ---------------


@dataclass
class BlockContext:
    fmt: str
    dtype: str
    round_sf: bool
    clamp_min: float  # the fp32 value in force

    @property
    def max_q(self) -> float:
        return ref.MAX_Q[self.fmt]

    def scale_of(self, amax: np.ndarray) -> np.ndarray:
        """The stored sf the oracle gives a block whose amax is `amax` (clamped here)."""
        a = np.maximum(amax, self.clamp_min)
        return ref.stored_scales(ref.scale_from_amax(a, self.fmt, self.round_sf))


def _random_signs(rng: np.random.Generator, shape) -> np.ndarray:
    return np.where(rng.random(shape) < 0.5, -1.0, 1.0)


def _block_scales(rng: np.random.Generator, m: int, low: int = -12, high: int = 12) -> np.ndarray:
    return np.exp2(rng.uniform(low, high, size=(m, 1)))


def _plant(rng: np.random.Generator, blocks: np.ndarray, values: np.ndarray) -> None:
    """Put values[i] at a random position of block i."""
    m, n = blocks.shape
    blocks[np.arange(m), rng.integers(0, n, size=m)] = values


def _normal(rng, blocks, ctx) -> None:
    blocks[:] = round_to_dtype(rng.standard_normal(blocks.shape) * _block_scales(rng, len(blocks)), ctx.dtype)


def _wide(rng, blocks, ctx) -> None:
    top = rng.uniform(-10, 10, size=(len(blocks), 1))
    exponents = top - rng.uniform(0, 40, size=blocks.shape)
    blocks[:] = round_to_dtype(_random_signs(rng, blocks.shape) * np.exp2(exponents), ctx.dtype)


def _planted_amax(rng, m: int, ctx) -> np.ndarray:
    """Positive amax values of the dtype, one per block, at least clamp_min (the sf is then set by them)."""
    amax = round_to_dtype(np.exp2(rng.uniform(-10, 10, size=m)) * rng.uniform(1, 2, size=m), ctx.dtype)
    return np.maximum(amax, round_to_dtype(np.array(ctx.clamp_min), ctx.dtype) * 2)


def _targets_at_scale(part: str):
    def fill(rng, blocks, ctx) -> None:
        m, n = blocks.shape
        amax = _planted_amax(rng, m, ctx)
        sf = ctx.scale_of(amax)[:, None]
        targets = rounding_targets(ctx.fmt, part)
        picked = targets[rng.integers(0, len(targets), size=(m, n))]
        values = round_to_dtype(picked * sf, ctx.dtype)
        values = step_ulps(values, rng.integers(-1, 2, size=(m, n)), ctx.dtype)  # on, below, above
        values = np.minimum(values, amax[:, None]) * _random_signs(rng, (m, n))
        blocks[:] = values
        _plant(rng, blocks, amax * _random_signs(rng, m))
    return fill


def _clamp_edge(rng, blocks, ctx) -> None:
    m, n = blocks.shape
    at = round_to_dtype(np.array([ctx.clamp_min]), ctx.dtype)
    amax = step_ulps(np.repeat(at, m), rng.integers(-1, 2, size=m), ctx.dtype)
    fractions = rng.random((m, n))
    values = round_to_dtype(fractions * amax[:, None], ctx.dtype)
    subnormal = rng.random((m, n)) < 0.25
    # Any subnormal of the dtype: the top ones are what an e2m1 sf of 2^-126 turns into 0.5 and 1.
    tiny = rng.integers(1, 1 << _DTYPE_FORMAT[ctx.dtype].mbits, size=(m, n)) * dtype_min_subnormal(ctx.dtype)
    blocks[:] = np.where(subnormal, tiny, values) * _random_signs(rng, (m, n))
    _plant(rng, blocks, amax * _random_signs(rng, m))


def _zeros(rng, blocks, ctx) -> None:
    blocks[:] = np.where(rng.random(blocks.shape) < 0.5, -0.0, 0.0)


def _outlier(rng, blocks, ctx) -> None:
    m, n = blocks.shape
    blocks[:] = round_to_dtype(rng.standard_normal((m, n)) * _block_scales(rng, m, -30, -10), ctx.dtype)
    huge = np.where(rng.random(m) < 0.25, dtype_max(ctx.dtype), np.exp2(rng.uniform(10, 60, size=m)))
    _plant(rng, blocks, round_to_dtype(huge, ctx.dtype) * _random_signs(rng, m))


def _nonfinite(rng, blocks, ctx) -> None:
    _normal(rng, blocks, ctx)
    specials = np.array([np.nan, np.inf, -np.inf])
    for _ in range(int(rng.integers(1, 4))):
        _plant(rng, blocks, specials[rng.integers(0, 3, size=len(blocks))])


def _pow2_amax(rng, blocks, ctx) -> None:
    m, n = blocks.shape
    low = int(np.ceil(np.log2(ctx.clamp_min / ctx.max_q))) + 1
    k = rng.integers(max(low, -30), 30, size=m)
    amax = step_ulps(ctx.max_q * np.exp2(k.astype(np.float64)), rng.integers(-1, 2, size=m), ctx.dtype)
    values = round_to_dtype(rng.uniform(-1, 1, size=(m, n)) * amax[:, None], ctx.dtype)
    blocks[:] = values
    _plant(rng, blocks, amax * _random_signs(rng, m))


def _huge(rng, blocks, ctx) -> None:
    top = dtype_max(ctx.dtype)
    blocks[:] = round_to_dtype(rng.uniform(-1, 1, size=blocks.shape) * top, ctx.dtype)
    _plant(rng, blocks, step_ulps(np.full(len(blocks), top), -rng.integers(0, 2, size=len(blocks)), ctx.dtype))


BLOCK_KINDS: dict[str, Callable[[np.random.Generator, np.ndarray, BlockContext], None]] = {
    "normal": _normal,
    "wide": _wide,
    "midpoints": _targets_at_scale("any"),
    "subnormal_midpoints": _targets_at_scale("subnormal"),
    "top_midpoints": _targets_at_scale("top"),
    "clamp_edge": _clamp_edge,
    "zeros": _zeros,
    "outlier": _outlier,
    "nonfinite": _nonfinite,
    "pow2_amax": _pow2_amax,
    "huge": _huge,
}
SPREADS = ("one", "some", "all")


def _chosen_blocks(rng: np.random.Generator, count: int, spread: str) -> np.ndarray:
    if count == 0 or spread == "all":
        return np.arange(count)
    if spread == "some":
        some = np.flatnonzero(rng.random(count) < 0.3)
        if some.size:
            return some
    return rng.integers(0, count, size=1)


def _as_blocks(x: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """(T, H) padded to whole blocks, as (blocks, bm * bk)."""
    bm, bk = block
    num_rows, hidden = x.shape
    rows, cols = -(-num_rows // bm), hidden // bk
    padded = np.zeros((rows * bm, hidden))
    padded[:num_rows] = x
    return padded.reshape(rows, bm, cols, bk).transpose(0, 2, 1, 3).reshape(rows * cols, bm * bk)


def _from_blocks(blocks: np.ndarray, shape: tuple[int, int], block: tuple[int, int]) -> np.ndarray:
    bm, bk = block
    num_rows, hidden = shape
    rows, cols = -(-num_rows // bm), hidden // bk
    full = blocks.reshape(rows, cols, bm, bk).transpose(0, 2, 1, 3).reshape(rows * bm, hidden)
    return full[:num_rows]


def special_values(ctx: BlockContext) -> np.ndarray:
    cm = round_to_dtype(np.array([ctx.clamp_min]), ctx.dtype)[0]
    return np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, dtype_max(ctx.dtype), -dtype_max(ctx.dtype),
                     dtype_min_subnormal(ctx.dtype), cm, *step_ulps(np.array([cm, cm]), np.array([-1, 1]),
                                                                    ctx.dtype)])


def build_values(seed: int, shape: tuple[int, int], block: tuple[int, int], ctx: BlockContext,
                 kinds: dict[str, str], pinned: list[tuple[int, int, int]],
                 zero_row: int | None = None) -> np.ndarray:
    """The (T, H) float64 values (all representable in ctx.dtype) a drawn recipe describes.

    `zero_row`: that row is all zeros of both signs (-0.0 beside +0.0: a tie of the two zeros, each code
    keeping its sign; a per-token block's amax 0, below clamp_min), before the pinned values."""
    rng = np.random.default_rng(seed)
    blocks = _as_blocks(np.zeros(shape), block)
    _normal(rng, blocks, ctx)
    for name, fill in BLOCK_KINDS.items():  # a fixed order, whatever order they were drawn in
        if name in kinds:
            chosen = _chosen_blocks(rng, len(blocks), kinds[name])
            part = blocks[chosen]
            fill(rng, part, ctx)
            blocks[chosen] = part
    x = _from_blocks(blocks, shape, block)
    if zero_row is not None:
        x[zero_row] = np.where(rng.random(shape[1]) < 0.5, -0.0, 0.0)
        x[zero_row, :2] = (0.0, -0.0)[: shape[1]]
    specials = special_values(ctx)
    for row, col, which in pinned:
        x[row, col] = specials[which]
    return x


def to_input_tensor(x: np.ndarray, dtype: str) -> torch.Tensor:
    """The CPU tensor of the dtype holding x (whose values it represents exactly)."""
    if dtype == "fp32":
        return torch_copy(x.astype(np.float32))
    return tensor_from_bits(formats.BF16.encode(x), torch.bfloat16)


# The NaN bit patterns `with_nan_payloads` chooses from, per dtype: (exponent and quiet bit, mantissa bits
# below the quiet bit, sign bit).
_NAN_BITS = {torch.float32: (0x7F800000, 0x003FFFFF, 0x80000000), torch.bfloat16: (0x7F80, 0x003F, 0x8000)}


def with_nan_payloads(t: torch.Tensor, seed: int, plant: bool = False) -> torch.Tensor:
    """`t` with each NaN (with `plant`, one planted where it holds none) replaced by a NaN of another bit pattern: quiet
    or signalling, a random payload (mantissa bits) and a random sign, so that an implementation that
    reads a NaN's bits (as a code, a comparison of integers, a sign) rather than its being NaN shows it."""
    rng = np.random.default_rng([seed, 77])
    nan = torch.isnan(t)
    if not bool(nan.any()):
        if not plant or t.numel() == 0:
            return t
        nan.view(-1)[int(rng.integers(0, t.numel()))] = True  # one NaN, so that a payload is there to read
    exponent, low, sign = _NAN_BITS[t.dtype]
    count = int(nan.sum())
    quiet = (low + 1) * (rng.random(count) < 0.5)
    payload = np.maximum(rng.integers(0, low + 1, size=count), quiet == 0)  # a signalling NaN needs a bit set
    bits = exponent | quiet | payload | np.where(rng.random(count) < 0.5, sign, 0)
    out = float_bits(t).to(torch.int64)
    out[nan] = torch.from_numpy(bits.astype(np.int64))
    width = INT_OF_WIDTH[t.element_size()]
    signed = torch.where(out >= 1 << (8 * t.element_size() - 1), out - (1 << (8 * t.element_size())), out)
    return signed.to(width).view(t.dtype)


def cast_input(x: np.ndarray, dtype: str, payload_seed: int | None, plant_nan: bool = True) -> torch.Tensor:
    """The cast's input tensor of x (`to_input_tensor`); one time in three its NaNs get other payloads
    (`with_nan_payloads`, a NaN planted first with `plant_nan` where x holds none), else they stay
    canonical; never where `payload_seed` is None.  The seed (the
    case's own) decides, not a draw of its own, so that the rest of what hypothesis draws for the case
    stays as it was."""
    t = to_input_tensor(x, dtype)
    if payload_seed is not None and np.random.default_rng([payload_seed, 76]).random() < 1 / 3:
        t = with_nan_payloads(t, payload_seed, plant_nan)
    return t


def nan_payload_seeds() -> SearchStrategy[int]:
    """Seeds for `cast_input`, for a strategy without a seed of its own to pass."""
    return seeds()


# -- drawing cases -----------------------------------------------------------------------


def token_counts(hidden: int, block_rows: int = 1) -> SearchStrategy[int]:
    """T: 0, 1, small, odd, tile tails, rarely a few hundred; within MAX_ELEMENTS."""
    cap = max(1, MAX_ELEMENTS // hidden)
    # 1 before 0: hypothesis starts from the simplest draw and mutates around it, so with 0
    # first a fifth to a half of the ci profile's examples were empty tensors.
    common = st.one_of(st.sampled_from((1, 0)), st.integers(2, 9), st.sampled_from(TOKEN_TAILS))
    larger = st.integers(130, 600).map(lambda n: 2 * (n // 2) + 1)
    if block_rows > 1:
        common = st.one_of(common, st.sampled_from((block_rows - 1, block_rows, block_rows + 1)))
    return rarely(common, larger, one_in=10).map(lambda t: min(t, cap))


def hidden_sizes() -> SearchStrategy[int]:
    return rarely(st.sampled_from(HIDDEN_SIZES), st.just(LARGE_HIDDEN), one_in=20)


@st.composite
def sf_options(draw, fmt: str) -> dict:
    round_sf, use_ue8m0, use_packed = draw(st.sampled_from(SF_MODES))
    clamp_min = draw(rarely(st.none(), st.sampled_from(OTHER_CLAMP_MINS[fmt]), one_in=8))
    return {
        "round_sf": round_sf,
        "use_ue8m0": use_ue8m0,
        "use_packed_ue8m0": use_packed,
        "use_tma_aligned_col_major_sf": draw(st.booleans()),
        "clamp_min": clamp_min,
    }


@st.composite
def _values(draw, shape: tuple[int, int], block: tuple[int, int], fmt: str, dtype: str, round_sf: bool,
            clamp_min: float | None, max_pins: int = 3) -> tuple[np.ndarray, int]:
    """(x, its seed): x built by `build_values` from drawn block kinds and up to `max_pins` special values
    (`special_values`: NaN, +-inf, +-0, the dtype's largest, ...) pinned at drawn places; an op whose ci
    examples would otherwise miss the non-finite or largest-value classes asks for more pins."""
    ctx = BlockContext(fmt, dtype, round_sf, ref.clamp_min_value(fmt, clamp_min))
    kinds = draw(st.dictionaries(st.sampled_from(tuple(BLOCK_KINDS)), st.sampled_from(SPREADS), max_size=4))
    num_rows, hidden = shape
    pinned = []
    if num_rows:
        placement = st.tuples(st.integers(0, num_rows - 1), st.integers(0, hidden - 1),
                              st.integers(0, len(special_values(ctx)) - 1))
        pinned = draw(st.lists(placement, max_size=max_pins))
    seed = draw(seeds())
    # Half the time (the seed decides, so that the other draws stay as they were) one row of zeros, where
    # there are others (a single row keeps its values for what they are drawn for).
    rng = np.random.default_rng([seed, 5])
    zero_row = int(rng.integers(0, num_rows)) if num_rows >= 2 and rng.random() < 0.5 else None
    return build_values(seed, shape, block, ctx, kinds, pinned, zero_row), seed


def _num_per_channels(fmt: str, hidden: int) -> SearchStrategy[int]:
    if fmt == "e5m6":
        return st.just(hidden)
    return st.sampled_from([n for n in (*TOKEN_BLOCKS, hidden) if hidden % n == 0])


@st.composite
def per_token_cast_cases(draw, max_pins: int = 3, probe: bool = False, spread: bool = False) -> Case:
    """Cases of per_token_cast (and of per_token_cast_with_sf_only: the same parameters); `max_pins` as
    `_values` takes it; with `probe`, a block of x holds a rounding probe (`plant_rounding_probe`: no draw of
    its own, so the cases are the same but for that block); with `spread`, the format and, in 2 cases of 5, a
    single row as `format_configuration` chooses them (empty batches stay), for a cast whose ci examples
    reach each format's configurations too seldom otherwise (the precomputed-sf variant)."""
    fmt = draw(st.sampled_from(FORMATS))
    dtype = draw(st.sampled_from(tuple(DTYPES)))
    hidden = draw(hidden_sizes())
    npc = draw(_num_per_channels(fmt, hidden))
    options = draw(sf_options(fmt))
    num_rows = draw(token_counts(hidden))
    if spread:
        drawn_fmt = fmt
        fmt, _, single, _ = format_configuration((fmt, dtype, hidden, npc, sorted(options.items()), num_rows),
                                                 TOKEN_SPREAD_STREAM, FORMATS, tuple(DTYPES), 0.4)
        options = options_for_format(options, drawn_fmt, fmt, OTHER_CLAMP_MINS)
        npc = hidden if fmt == "e5m6" else npc
        num_rows = 1 if single and num_rows else num_rows
    dtype, hidden, npc = token_configuration((fmt, dtype, hidden, npc, sorted(options.items()), num_rows),
                                             fmt, hidden, npc, tuple(DTYPES))
    num_rows = min(num_rows, max(1, MAX_ELEMENTS // hidden))
    x, seed = draw(_values((num_rows, hidden), (1, npc), fmt, dtype, options["round_sf"], options["clamp_min"],
                           max_pins))
    plain_sf = not (options["round_sf"] or options["use_ue8m0"] or options["use_packed_ue8m0"])
    x = cast_input(x, dtype, seed)
    if probe:
        plant_rounding_probe(x, fmt, npc, plain_sf, (fmt, dtype, hidden, npc, sorted(options.items()), num_rows,
                                                     seed))
    return Case(params={"fmt": fmt, "num_per_channels": npc, **options}, inputs={"x": x})


@st.composite
def per_block_cast_cases(draw, max_pins: int = 6) -> Case:  # 6 pins: its ci examples reach +inf in x
    """Cases of per_block_cast; `max_pins` as `_values` takes it.  The (format, dtype) pair, in 3 cases of 10 a
    single row (empty batches stay) and in `BLOCK_PARTIAL_TILE_SHARE` of the cases 32 x 32 blocks in an H that ends
    in a partial 128-column tile of the TileLang kernel, as `format_configuration` chooses them."""
    drawn_fmt = draw(st.sampled_from(BLOCK_FORMATS))
    dtype = draw(st.sampled_from(tuple(DTYPES)))
    bm, bk = draw(st.sampled_from(PER_BLOCK_SIZES))
    hidden = draw(st.sampled_from([h for h in (*HIDDEN_SIZES, 384) if h % bk == 0]))
    options = draw(sf_options(drawn_fmt))
    num_rows = draw(token_counts(hidden, bm))
    fmt, dtype, single, pick = format_configuration(
        (drawn_fmt, dtype, bm, hidden, sorted(options.items()), num_rows), BLOCK_CONFIG_STREAM, BLOCK_FORMATS,
        tuple(DTYPES), 0.3)
    options = options_for_format(options, drawn_fmt, fmt, OTHER_CLAMP_MINS)
    if pick.random() < BLOCK_PARTIAL_TILE_SHARE:  # 32 x 32 blocks, H ending in a partial 128-column tile
        (bm, bk), hidden = PER_BLOCK_SIZES[1], int(pick.choice([h for h in HIDDEN_SIZES if h % 128 and h % 32 == 0]))
    num_rows = 1 if single and num_rows else num_rows
    x, seed = draw(_values((num_rows, hidden), (bm, bk), fmt, dtype, options["round_sf"], options["clamp_min"],
                           max_pins))
    return Case(params={"fmt": fmt, "block": [bm, bk], **options},
                inputs={"x": cast_input(x, dtype, seed)})


def _channel_hidden_sizes(fmt: str) -> tuple[int, ...]:
    return CHANNEL_HIDDEN_SIZES + (CHANNEL_ODD_HIDDEN_SIZES if fmt == "e4m3" else ())


@st.composite
def per_channel_cast_cases(draw) -> Case:
    """Cases of per_channel_cast.  The (format, dtype) pair, in 3 cases of 10 a single row (empty batches stay),
    and in `CHANNEL_TAIL_SHARE` of the cases an H not a multiple of 8 (the kernel's 8-element chunk) as
    `format_configuration` chooses them; else the drawn H where the format takes it."""
    drawn_fmt = draw(st.sampled_from(BLOCK_FORMATS))
    dtype = draw(st.sampled_from(tuple(DTYPES)))
    npt = draw(st.sampled_from(CHANNEL_BLOCKS))
    hidden = draw(st.sampled_from(_channel_hidden_sizes(drawn_fmt)))
    options = draw(sf_options(drawn_fmt))
    num_rows = draw(token_counts(hidden, npt))
    fmt, dtype, single, pick = format_configuration(
        (drawn_fmt, dtype, npt, hidden, sorted(options.items()), num_rows), CHANNEL_CONFIG_STREAM, BLOCK_FORMATS,
        tuple(DTYPES), 0.3)
    options = options_for_format(options, drawn_fmt, fmt, OTHER_CLAMP_MINS)
    sizes = _channel_hidden_sizes(fmt)
    if pick.random() < CHANNEL_TAIL_SHARE:
        hidden = int(pick.choice([h for h in sizes if h % 8]))
    elif hidden not in sizes:  # an odd H drawn for e4m3, in a case moved to e2m1
        hidden = int(pick.choice(sizes))
    num_rows = 1 if single and num_rows else min(num_rows, max(1, MAX_ELEMENTS // hidden))
    x, seed = draw(_values((num_rows, hidden), (npt, 1), fmt, dtype, options["round_sf"], options["clamp_min"],
                           max_pins=6))  # its ci examples reach +-inf with more pins
    return Case(params={"fmt": fmt, "num_per_tokens": npt, **options},
                inputs={"x": cast_input(x, dtype, seed)})


# -- precomputed sf ----------------------------------------------------------------------

# Factors t: the block's sf is replaced by amax / t, so its amax lands on t
# (as a multiple of sf): at max_q, at the midpoint past it (464, 7, 65280),
# just either side of those, far past it (saturation), or well inside.
def _saturation_targets(fmt: str) -> np.ndarray:
    top, past = ref.MAX_Q[fmt], SATURATION_MIDPOINT[fmt]
    return np.array([top, past, past * (1 - 2.0**-20), past * (1 + 2.0**-20), top * (1 + 2.0**-22), 2 * top,
                     1e6 * top, top / 3])


SF_SPECIALS = (0.0, np.inf, np.nan, 2.0**-149, 2.0**-127, 2.0**127)


def with_special_sf(rng: np.random.Generator, sf: np.ndarray, specials: tuple[float, ...]) -> np.ndarray:
    """sf with about 30% of its entries (every special at least once, where sf has room) special values."""
    which = in_turn(rng, sf.shape, 0.3, len(specials))
    return np.where(which >= 0, np.array(specials)[np.maximum(which, 0)], sf)


@st.composite
def given_sf(draw, params: dict, x: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """A precomputed sf for x cut into `block`, stored as params' sf flags ask (row-major): the oracle's, or
    one moved so that amax / sf hits the saturation edges, or a special value.  params: a computed-sf cast's
    (fmt, round_sf, use_ue8m0, use_packed_ue8m0, clamp_min)."""
    fmt = params["fmt"]
    x64 = ref.as_float64(x)
    exact = ref.exact_scales(x64, fmt, block, params["round_sf"], params["clamp_min"])
    sf = ref.stored_scales(exact)
    rng = np.random.default_rng(draw(seeds()))
    # The seed decides (as for the special values below): move some blocks' sf towards saturation, in 3
    # cases of 4, every target where sf has room.
    if rng.random() < 0.75 and sf.size:
        amax = np.maximum(ref.block_amax(x64, block), ref.clamp_min_value(fmt, params["clamp_min"]))
        targets = _saturation_targets(fmt)
        which = in_turn(rng, sf.shape, 0.5, len(targets))  # every target, where sf has room
        with np.errstate(invalid="ignore"):
            new = amax / targets[np.maximum(which, 0)]
        if params["round_sf"]:
            new = ref.power_of_two_at_least(new, 1.0, new)
        sf = np.where((which >= 0) & np.isfinite(new), ref.stored_scales(new), sf)
    # Special values in every other case, the seed deciding: the ci profile's examples repeat the other
    # draws of a case more often than its seed, and an fp32 sf's NaN, inf, subnormal and zero classes have
    # only the cases the ue8m0 storages (codes without float classes) leave them.
    if rng.random() < 0.5 and sf.size:
        sf = with_special_sf(rng, sf, SF_SPECIALS if not params["use_ue8m0"] else (np.nan, 2.0**-127, 2.0**127))
        if not params["use_ue8m0"] and rng.random() < 0.5:  # a block row whose every sf is 0 (ue8m0 has no 0)
            sf[int(rng.integers(0, sf.shape[0]))] = 0.0
    return ref.store_sf(sf, use_ue8m0=params["use_ue8m0"], use_packed_ue8m0=params["use_packed_ue8m0"])


@st.composite
def precomputed_sf_cases(draw) -> Case:
    """Cases of per_token_cast_with_precomputed_sf: x, and a `given_sf`."""
    # its ci examples reach the dtype's largest with more pins, and each format's kernel configurations spread
    case = draw(per_token_cast_cases(max_pins=6, spread=True))
    params, x = case.params, case.inputs["x"]
    sf = draw(given_sf(params, x, (1, params["num_per_channels"])))
    return Case(params={"fmt": params["fmt"], "num_per_channels": params["num_per_channels"]},
                inputs={"x": x, "sf": sf})


# -- swiglu -----------------------------------------------------------------------------------

# clamped_count before the call: every lane one count short of 2^31 (a signed 32-bit counter) or
# of 2^32 (a carry out of the low word), or far beyond 32 bits.
COUNTER_STARTS = {"zero": (0, 0, 0), "near_int32": (2**31 - 1,) * 3, "near_uint32": (2**32 - 1,) * 3,
                  "large": (2**40, 2**53 + 1, 7)}
SWIGLU_FEATURES = ("at_clamp", "very_negative_l", "nonfinite", "zeros", "subnormal", "huge", "zero_weights")


def _near(rng: np.random.Generator, value: float, shape, dtype: str) -> np.ndarray:
    """value (rounded to the dtype) and its neighbours, with random signs."""
    base = round_to_dtype(np.full(shape, value), dtype)
    return step_ulps(base, rng.integers(-1, 2, size=shape), dtype) * _random_signs(rng, shape)


def build_swiglu_x(seed: int, num_rows: int, hidden: int, dtype: str, clamp: float | None,
                   features: dict[str, str], nonfinite_share: float = 0.0, subnormal_share: float = 0.0) -> np.ndarray:
    """x (num_rows, 2 * hidden) in the dtype: normal values at a random scale a row, with each of `features`
    (`SWIGLU_FEATURES`, each with its spread of rows) planted in some rows.  In `nonfinite_share` of the cases
    that lack ``nonfinite`` the seed adds it in one row (the seed decides, not a draw, so that the rest of
    what hypothesis draws for the case stays as it was: the ci profile's few examples seldom draw that one
    feature among the others); a case with it holds NaN, +inf and -inf each at least once where x has room.
    `subnormal_share` adds ``subnormal`` in one row the same way."""
    rng = np.random.default_rng(seed)
    if "nonfinite" not in features and np.random.default_rng([seed, 5]).random() < nonfinite_share:
        features = {**features, "nonfinite": "one"}
    if "subnormal" not in features and np.random.default_rng([seed, 6]).random() < subnormal_share:
        features = {**features, "subnormal": "one"}
    x = rng.standard_normal((num_rows, 2 * hidden)) * np.exp2(rng.uniform(-6, 6, size=(num_rows, 1)))
    x = round_to_dtype(x, dtype)
    for name in SWIGLU_FEATURES:
        if name not in features or not num_rows:
            continue
        rows = _chosen_blocks(rng, num_rows, features[name])
        part = x[rows]
        mask = rng.random(part.shape) < 0.3
        if name == "at_clamp" and clamp is not None:
            part[mask] = _near(rng, clamp, part.shape, dtype)[mask]
        elif name == "very_negative_l":  # sigmoid underflows in fp32
            left = np.zeros(part.shape, bool)
            left[:, :hidden] = mask[:, :hidden]
            part[left] = -round_to_dtype(rng.uniform(80, 120, size=part.shape), dtype)[left]
            part[:, hidden:] *= np.exp2(rng.uniform(0, 120))
            part[:] = round_to_dtype(part, dtype)
        elif name == "nonfinite":  # one in each chosen row, and NaN, +inf and -inf in turn at 3 places
            which = in_turn(rng, part.shape, 0.0, 3)
            one = np.zeros(part.shape, bool)
            one[np.arange(len(part)), rng.integers(0, 2 * hidden, size=len(part))] = True
            which = np.where(one & (which < 0), rng.integers(0, 3, size=part.shape), which)
            part[which >= 0] = np.array([np.nan, np.inf, -np.inf])[which[which >= 0]]
        elif name == "zeros":
            part[mask] = 0.0
        elif name == "subnormal":
            part[mask] = (rng.integers(1, 1 << 7, size=part.shape) * dtype_min_subnormal(dtype))[mask]
        elif name == "huge":
            part[mask] = round_to_dtype(rng.uniform(-1, 1, size=part.shape) * dtype_max(dtype) / 4, dtype)[mask]
        x[rows] = part
    return x


@st.composite
def swiglu_cases(draw) -> Case:
    """Cases of swiglu_forward_and_per_token_cast: the (format, dtype) pair and, in 2 cases of 5, a single row as
    `format_configuration` chooses them (empty batches stay); e5m6 casts a row as one block."""
    drawn_fmt = draw(rarely(st.just("e4m3"), st.sampled_from(("e2m1", "e5m6")), one_in=4))
    dtype = draw(st.sampled_from(tuple(DTYPES)))
    # 320 (40 chunks): with num_per_channels = H, the row path of token_cast (96: the generic one)
    hidden = draw(st.sampled_from((32, 64, 96, 128, 256, 320)))
    npc = draw(_num_per_channels(drawn_fmt, hidden))
    options = draw(sf_options(drawn_fmt))
    num_rows = draw(token_counts(2 * hidden))
    fmt, dtype, single, _ = format_configuration(
        (drawn_fmt, dtype, hidden, npc, sorted(options.items()), num_rows), SWIGLU_CAST_CONFIG_STREAM, FORMATS,
        tuple(DTYPES), 0.4)
    options = options_for_format(options, drawn_fmt, fmt, OTHER_CLAMP_MINS)
    npc = hidden if fmt == "e5m6" else npc
    num_rows = 1 if single and num_rows else num_rows
    clamp = draw(st.sampled_from(SWIGLU_CLAMPS))
    features = draw(st.dictionaries(st.sampled_from(SWIGLU_FEATURES), st.sampled_from(SPREADS), max_size=3))
    counter = draw(st.sampled_from(tuple(COUNTER_STARTS) + ("none", "near_uint32")))
    if counter == "near_uint32":
        # A counter one short of 2^32 in every lane only tests the carry if something is clamped.
        if clamp is None:
            clamp = draw(st.sampled_from([c for c in SWIGLU_CLAMPS if c is not None]))
        features.setdefault("at_clamp", draw(st.sampled_from(SPREADS)))
    seed = draw(seeds())
    x = build_swiglu_x(seed, num_rows, hidden, dtype, clamp, features, nonfinite_share=1 / 3)
    tie_rng = np.random.default_rng([seed, 3])
    if num_rows and tie_rng.random() < 0.5:  # -0.0 beside +0.0 in one row (l or r): each code keeps its sign
        row, col = int(tie_rng.integers(0, num_rows)), int(tie_rng.integers(0, 2 * hidden - 1))
        x[row, col:col + 2] = (0.0, -0.0)
    inputs = {"x": cast_input(x, dtype, seed)}
    rng = np.random.default_rng(seed + 1)
    weighting = draw(st.sampled_from(("none", "index_only", "weights")))
    if weighting != "none":
        k = draw(st.sampled_from((1, 2, 8)))
        padding = rng.random(num_rows) < draw(st.sampled_from((0.0, 0.25, 1.0)))
        tokens = -(-num_rows // k) + 1
        slots = rng.permutation(tokens * k)[:num_rows]
        inputs["pos_to_token_topk"] = torch_copy(np.where(padding, -1, slots).astype(np.int32))
        if weighting == "weights":
            w = rng.uniform(0, 2, size=(tokens, k)).astype(np.float32)
            if "zero_weights" in features:
                w[rng.random(w.shape) < 0.3] = 0.0
            inputs["topk_weights"] = torch_copy(w)
    if counter != "none":
        inputs["clamped_count"] = torch.tensor(COUNTER_STARTS[counter], dtype=torch.int64)
    return Case(params={"fmt": fmt, "num_per_channels": npc, "clamp": clamp, **options}, inputs=inputs)


# The classes each strategy reaches under the ci profile (tests/test_classes.py), as tkverify/specs/quant.py lists.
per_token_cast_cases = tagging("x", (
    'dtype_max:x', 'empty', 'nan:x', 'nan_payload:x', 'neg_zero:x', 'non_pow2', 'saturation_edge:x',
    'signed_zero_tie:x', 'single_row', 'subnormal:x', 'zero_row:x',
), computed_sf_saturation(lambda p, x: (1, p["num_per_channels"])))(per_token_cast_cases)


def per_token_cast_probed_cases(max_pins: int = 3) -> SearchStrategy[Case]:
    """The cases of per_token_cast and its sf-only form: `per_token_cast_cases` with a rounding probe planted
    (the strategies built on per_token_cast_cases, such as the cast-and-cast-back one, keep its plain cases)."""
    return per_token_cast_cases(max_pins=max_pins, probe=True)


per_token_cast_probed_cases.classes = per_token_cast_cases.classes
per_token_cast_probed_cases.classify = per_token_cast_cases.classify

per_block_cast_cases = tagging("x", (
    'dtype_max:x', 'empty', 'nan:x', 'nan_payload:x', 'neg_inf:x', 'neg_zero:x', 'non_pow2', 'pos_inf:x',
    'saturation_edge:x', 'signed_zero_tie:x', 'single_row', 'subnormal:x',
), computed_sf_saturation(lambda p, x: tuple(p["block"])))(per_block_cast_cases)
per_channel_cast_cases = tagging("x", (
    'dtype_max:x', 'empty', 'nan:x', 'nan_payload:x', 'neg_inf:x', 'neg_zero:x', 'non_pow2', 'pos_inf:x',
    'saturation_edge:x', 'signed_zero_tie:x', 'single_row', 'subnormal:x',
), computed_sf_saturation(lambda p, x: (p["num_per_tokens"], 1)))(per_channel_cast_cases)
precomputed_sf_cases = tagging("x", (
    'dtype_max:x', 'nan:sf', 'nan:x', 'nan_payload:x', 'neg_zero:x', 'non_pow2', 'pos_inf:sf', 'pos_inf:x',
    'saturation_edge:x', 'saturation_midpoint:x', 'signed_zero_tie:x', 'single_row', 'subnormal:sf',
    'subnormal:x', 'zero_row:sf',
), given_sf_saturation(lambda p: (1, p["num_per_channels"])))(precomputed_sf_cases)
swiglu_cases = tagging("x", (
    'empty', 'nan:x', 'nan_payload:x', 'neg_inf:x', 'neg_zero:x', 'non_pow2', 'pos_inf:x',
    'signed_zero_tie:x', 'single_row', 'subnormal:x', 'zero_row:topk_weights',
))(swiglu_cases)
