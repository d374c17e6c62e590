"""Cases of the quantisation layout ops (docs/contract/quant_layout.md).

* per_channel_cast_and_transpose: quant.per_channel_cast's cases in e4m3 (its values, token tails and sf
  options; the transpose adds no edge of its own).
* per_channel_cast_fused: a plain x as for per_channel_cast, or e4m3 codes and sf from the per-token cast
  oracle, gathered (or not) by a pos_to_token with -1 rows; N ends in partial token blocks.
* per_block_cast_lossless: e2m1 codes and power-of-two input sf drawn per out block so that the cast is
  lossless: each out block gets a largest exponent K and its input blocks exponents in [K - 14, K]; edge
  classes (tagged ``lossless:<name>``): ``sf_span`` (an input sf exactly 2^-14 times its block's largest,
  whose 0.5 codes land on e4m3's smallest subnormal 2^-9), ``max_code`` (a +-6 code under the largest sf:
  384), ``min_code`` (a +-0.5 code), ``zero_block`` (an input block of zero codes, +0 and -0),
  ``nan_sf`` (a NaN input sf: its out block NaN), ``sf_top`` (2^127) and ``sf_bottom`` (2^-127, whose out sf
  2^-133 is an fp32 subnormal; only with an fp32 out sf).  T ends in partial out blocks.
* batched_transpose_weight_sf: one weight's power-of-two scales 2^e, e in [-127, 127] (no group dimension,
  or G in 1..3), block_size 32 or 128, n and k multiples of 128 in 128..1024; edge classes (tagged
  ``weight_sf:<name>``): ``grouped`` (a 3-D sf), ``partial_sf0_word`` / ``partial_sf1_word`` (num_sf_k /
  num_sf_n not a multiple of 4, so the last word of sf0 / sf1 holds padding bytes; block_size 128 only,
  since n / 32 is a multiple of 4), ``sf_top`` (2^127, byte 254) and ``sf_bottom`` (2^-127, an fp32
  subnormal, byte 0).
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from hypothesis import strategies as st

import strategies.quant as sq
import references.quant as qref
from references.quant import sf_grid, store_sf
from strategies.classes import draws_rng, tagging
from tkverify import formats
from tkverify.case import Case

LOSSLESS_IN_BLOCKS = ((1, 16), (1, 32))
LOSSLESS_OUT_BLOCKS = ((1, 128), (32, 32), (128, 128))
LOSSLESS_SPAN = 14
LOSSLESS_HEADROOM = 6
LOSSLESS_HIDDEN = (32, 64, 128, 256, 384)
LOSSLESS_TOKENS = (0, 1, 2, 31, 33, 127, 129, 200)
SF_STORAGES = ("fp32", "ue8m0", "packed")
EDGES = ("sf_span", "max_code", "min_code", "zero_block", "nan_sf", "sf_top", "sf_bottom")


@st.composite
def per_channel_cast_and_transpose_cases(draw) -> Case:
    dtype = draw(st.sampled_from(tuple(sq.DTYPES)))
    npt = draw(st.sampled_from(sq.CHANNEL_BLOCKS))
    hidden = draw(st.sampled_from(sq.CHANNEL_HIDDEN_SIZES + sq.CHANNEL_ODD_HIDDEN_SIZES))
    options = draw(sq.sf_options("e4m3"))
    num_rows = draw(sq.token_counts(hidden, npt))
    x, seed = draw(sq._values((num_rows, hidden), (npt, 1), "e4m3", dtype, options["round_sf"],
                              options["clamp_min"], max_pins=6))  # its ci examples reach -inf with more pins
    return Case(params={"fmt": "e4m3", "num_per_tokens": npt, **options}, inputs={"x": sq.cast_input(x, dtype, seed)})


FUSED_CHANNEL_BLOCKS = (16, 32, 64, 128)  # num_per_channels of a quantised x
FUSED_ROWS = (0, 1, 15, 16, 17, 129)  # N, the rows pos_to_token gathers


@st.composite
def per_channel_cast_fused_cases(draw) -> Case:
    """A plain x (bf16 / fp32, quant.per_channel_cast's values), or x quantised by the per-token cast oracle
    (e4m3 codes and an sf in any storage), optionally gathered by pos_to_token (-1 rows among them)."""
    quantised = draw(st.booleans())
    dtype = "fp32" if quantised else draw(st.sampled_from(tuple(sq.DTYPES)))
    npt = draw(st.sampled_from(sq.CHANNEL_BLOCKS))
    npc = draw(st.sampled_from(FUSED_CHANNEL_BLOCKS)) if quantised else None
    hidden = draw(st.sampled_from((128, 256) if quantised else sq.CHANNEL_HIDDEN_SIZES))
    options = draw(sq.sf_options("e4m3"))
    num_rows = draw(sq.token_counts(hidden, npt))
    x, seed = draw(sq._values((num_rows, hidden), (npt, 1), "e4m3", dtype, options["round_sf"],
                              options["clamp_min"]))
    inputs = {"x": sq.cast_input(x, dtype, seed)}
    params = {"fmt": "e4m3", "num_per_tokens": npt, **options}
    if quantised:
        round_sf, use_ue8m0, packed = draw(st.sampled_from(sq.SF_MODES))
        data, sf = qref.per_token_cast(inputs["x"], "e4m3", npc, round_sf=round_sf, use_ue8m0=use_ue8m0,
                                       use_packed_ue8m0=packed)
        inputs = {"x": data, "x_sf": sf}
        params["num_per_channels"] = npc
    if draw(st.booleans()):
        rows = draw(st.sampled_from(FUSED_ROWS))
        rng = np.random.default_rng(seed)
        pos = rng.integers(-1, max(num_rows, 0), size=rows) if num_rows else np.full(rows, -1)
        inputs["pos_to_token"] = torch.from_numpy(pos.astype(np.int32))
    return Case(params=params, inputs=inputs)


def _lossless_exponents(rng: np.random.Generator, shape: tuple[int, int], in_block, out_block, edges: set[str],
                        fp32_out: bool) -> np.ndarray:
    """Input sf exponents (rows, cols) of the in blocks: per out block a largest K, the others in [K - 14, K]."""
    rows, cols = sf_grid(*shape, in_block)
    per_row, per_col = out_block[0] // in_block[0], out_block[1] // in_block[1]
    out_rows, out_cols = -(-rows // per_row), cols // per_col
    bottom = -127 + (0 if fp32_out else LOSSLESS_HEADROOM)  # a ue8m0 out sf needs K - 6 >= -127
    top_k = rng.integers(bottom + LOSSLESS_SPAN, 40, size=(out_rows, out_cols))
    if "sf_top" in edges:
        top_k[0, 0] = 127
    if "sf_bottom" in edges and fp32_out:
        top_k[-1, -1] = -127
    big = np.repeat(np.repeat(top_k, per_row, 0), per_col, 1)[:rows, :cols]
    k = big - rng.integers(0, LOSSLESS_SPAN + 1, size=(rows, cols))
    k = np.maximum(k, -127)
    k[::per_row, ::per_col] = big[::per_row, ::per_col]  # every out block holds its K
    if "sf_span" in edges and rows:  # one more input block of out block (0, 0) at K - 14
        if per_col > 1:
            k[0, 1] = big[0, 1] - LOSSLESS_SPAN
        elif rows > 1:
            k[1, 0] = big[1, 0] - LOSSLESS_SPAN
    return k


def _lossless_codes(rng: np.random.Generator, shape: tuple[int, int], in_block, exponents: np.ndarray,
                    edges: set[str]) -> np.ndarray:
    codes = rng.integers(0, 16, size=shape)
    if not codes.size:
        return codes
    if "min_code" in edges:
        codes[0, : in_block[1]] = rng.choice([1, 9], size=in_block[1])
    if "max_code" in edges:
        i, j = np.unravel_index(np.argmax(exponents), exponents.shape)
        codes[i * in_block[0], j * in_block[1]] = rng.choice([7, 15])
    if "zero_block" in edges:
        codes[-1, -in_block[1]:] = rng.choice([0, 8], size=in_block[1])
    return codes


LOSSLESS_CONFIG_STREAM = 17  # `draws_rng`'s stream of per_block_cast_lossless_cases' block pair


@st.composite
def per_block_cast_lossless_cases(draw) -> Case:
    """quant.per_block_cast_lossless: the (input block, out block) pair, each a configuration of the TileLang
    kernel, and H (a multiple of the out block's columns) as the case's draws decide (`draws_rng`): the ci
    profile's few examples repeat draws of their own, which left pairs unlaunched."""
    drawn_hidden = draw(st.sampled_from(LOSSLESS_HIDDEN))
    num_rows = draw(st.sampled_from(LOSSLESS_TOKENS))
    storage = draw(st.sampled_from(SF_STORAGES))
    use_ue8m0 = draw(st.booleans())
    options = {"use_ue8m0": use_ue8m0, "use_packed_ue8m0": use_ue8m0 and draw(st.booleans()),
               "use_tma_aligned_col_major_sf": draw(st.booleans())}
    edges = set(draw(st.lists(st.sampled_from(EDGES), max_size=4, unique=True))) if num_rows else set()
    seed = draw(st.integers(0, 2**32 - 1))
    pick = draws_rng((drawn_hidden, num_rows, storage, sorted(options.items()), sorted(edges), seed),
                     LOSSLESS_CONFIG_STREAM)
    in_block = LOSSLESS_IN_BLOCKS[int(pick.integers(0, len(LOSSLESS_IN_BLOCKS)))]
    out_block = LOSSLESS_OUT_BLOCKS[int(pick.integers(0, len(LOSSLESS_OUT_BLOCKS)))]
    hidden = drawn_hidden if drawn_hidden % out_block[1] == 0 else int(
        pick.choice([h for h in LOSSLESS_HIDDEN if h % out_block[1] == 0]))
    rng = np.random.default_rng(seed)
    exponents = _lossless_exponents(rng, (num_rows, hidden), in_block, out_block, edges, not use_ue8m0)
    sf = np.ldexp(1.0, exponents)
    if "nan_sf" in edges:
        sf[rng.integers(0, sf.shape[0]), rng.integers(0, sf.shape[1])] = np.nan
    codes = _lossless_codes(rng, (num_rows, hidden), in_block, exponents, edges)
    x = torch.from_numpy(np.ascontiguousarray(formats.pack_e2m1(codes) if num_rows
                                              else np.zeros((0, hidden // 2), np.int8))).reshape(num_rows, hidden // 2)
    x_sf = store_sf(sf, use_ue8m0=storage != "fp32", use_packed_ue8m0=storage == "packed")
    params = {"fmt": "e4m3", "x_block_size": in_block, "out_block_size": out_block, **options}
    return Case(params=params, inputs={"x": x.clone(memory_format=torch.contiguous_format), "x_sf": x_sf})


def lossless_edges(case: Case) -> set[str]:
    """The ``lossless:<edge>`` classes of a case, from its tensors."""
    from references.quant import data_codes, sf_logical_values

    x, x_sf = case.inputs["x"], case.inputs["x_sf"]
    in_block, out_block = tuple(case.params["x_block_size"]), tuple(case.params["out_block_size"])
    if x.shape[0] == 0:
        return set()
    codes = data_codes(x, "e2m1") & 7
    sf = sf_logical_values(x_sf, 2 * x.shape[1] // in_block[1])
    found = set()
    if np.isnan(sf).any():
        found.add("nan_sf")
    if np.nanmax(sf, initial=0) == 2.0**127:
        found.add("sf_top")
    if np.nanmin(sf, initial=np.inf) == 2.0**-127 and not case.params["use_ue8m0"]:
        found.add("sf_bottom")
    if (codes == 7).any():
        found.add("max_code")
    if (codes == 1).any():
        found.add("min_code")
    blocks = sq._as_blocks(codes.astype(np.float64), in_block)
    if (blocks.max(axis=-1) == 0).any():
        found.add("zero_block")
    per_row, per_col = out_block[0] // in_block[0], out_block[1] // in_block[1]
    padded = np.full((-(-sf.shape[0] // per_row) * per_row, sf.shape[1]), np.nan)
    padded[: sf.shape[0]] = sf
    grouped = padded.reshape(-1, per_row, sf.shape[1] // per_col, per_col)
    with warnings.catch_warnings():  # an all-NaN out block has no ratio
        warnings.simplefilter("ignore", RuntimeWarning)
        ratio = np.nanmax(grouped, axis=(1, 3)) / np.nanmin(grouped, axis=(1, 3))
    if (ratio == 2.0**LOSSLESS_SPAN).any():
        found.add("sf_span")
    return {f"lossless:{e}" for e in found}


per_channel_cast_and_transpose_cases = tagging("x", (
    'dtype_max:x', 'empty', 'nan:x', 'nan_payload:x', 'neg_inf:x', 'neg_zero:x', 'non_pow2', 'pos_inf:x',
    'signed_zero_tie:x', 'single_row', 'subnormal:x',
))(per_channel_cast_and_transpose_cases)
def fused_padding(case: Case) -> set[str]:
    """``padding_row:pos_to_token``: a -1 row (written as a zero row)."""
    pos = case.inputs.get("pos_to_token")
    return {"padding_row:pos_to_token"} if pos is not None and bool((pos < 0).any()) else set()


per_channel_cast_fused_cases = tagging("x", (
    'empty', 'nan:x', 'nan:x_sf', 'non_pow2', 'single_row', 'padding_row:pos_to_token',
), fused_padding)(per_channel_cast_fused_cases)
per_block_cast_lossless_cases = tagging("x", (
    'empty', 'non_pow2', 'single_row', 'lossless:sf_span', 'lossless:max_code', 'lossless:min_code',
    'lossless:zero_block', 'lossless:nan_sf', 'lossless:sf_top', 'lossless:sf_bottom',
), lossless_edges)(per_block_cast_lossless_cases)


WEIGHT_SF_BLOCKS = (32, 128)
WEIGHT_SF_SIZES = tuple(range(128, 1025, 128))  # n and k


@st.composite
def batched_transpose_weight_sf_cases(draw) -> Case:
    """One weight's scales: fp32 2^e (e uniform in [-127, 127], or in a narrow band of everyday scales), the
    extreme exponents placed where asked."""
    block_size = draw(st.sampled_from(WEIGHT_SF_BLOCKS))
    groups = draw(st.sampled_from((None, 1, 2, 3)))
    n, k = draw(st.sampled_from(WEIGHT_SF_SIZES)), draw(st.sampled_from(WEIGHT_SF_SIZES))
    shape = ((groups,) if groups else ()) + (n // block_size, k // block_size)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    low = draw(st.sampled_from((-127, -20)))
    exponents = rng.integers(low, 128 if low == -127 else 1, size=shape)
    flat = exponents.reshape(-1)
    if draw(st.booleans()):
        flat[rng.integers(0, flat.size)] = 127
    if draw(st.booleans()):
        flat[rng.integers(0, flat.size)] = -127
    sf = torch.from_numpy(np.ldexp(1.0, exponents)).float()  # 2^-127 is an exact fp32 subnormal
    return Case(params={"block_size": block_size, "transpose_sf1": draw(st.booleans())},
                inputs={"sf": sf.contiguous()})


def weight_sf_edges(case: Case) -> set[str]:
    """The ``weight_sf:<edge>`` classes of a case, from its tensors."""
    sf = case.inputs["sf"]
    found = set()
    if sf.dim() == 3:
        found.add("grouped")
    if sf.shape[-1] % 4:
        found.add("partial_sf0_word")
    if sf.shape[-2] % 4:
        found.add("partial_sf1_word")
    if bool((sf == 2.0**127).any()):
        found.add("sf_top")
    if bool((sf == 2.0**-127).any()):
        found.add("sf_bottom")
    return {f"weight_sf:{e}" for e in found}


batched_transpose_weight_sf_cases = tagging("sf", (
    'non_pow2', 'single_row', 'subnormal:sf', 'weight_sf:grouped', 'weight_sf:partial_sf0_word',
    'weight_sf:partial_sf1_word', 'weight_sf:sf_top', 'weight_sf:sf_bottom',
), weight_sf_edges)(batched_transpose_weight_sf_cases)
