"""Cases of the plain SwiGLU (quant.swiglu, forward and backward), of its backward fused with a
per-token cast (quant.swiglu_backward_and_per_token_cast) and of its forward fused with a transposed
per-channel cast (quant.swiglu_forward_and_per_channel_cast_and_transpose);
docs/contract/quant_swiglu.md.

x is drawn by `strategies.quant.build_swiglu_x` (values at the clamp and one ULP either side,
very negative l where the sigmoid underflows, NaN and infinities, signed zeros, subnormals,
values near the dtype's largest, zero router weights), plus the classes named here:

* ``saturated_l``: |l| from 16 to 120, where sigmoid(l) is 1 or 0 in fp32 and 1 - s cancels;
* ``zero_row``: whole rows of x zero;
* ``padding``: rows whose pos_to_token_topk is -1 (their x is not read: NaN there changes nothing);
* ``zero_grad_row``: rows of the cotangent zero (backward with cast: an all-zero block).

H runs from 1 to 320 with partial tiles (H not a multiple of 8 or of 64), rows from 0 (an empty
batch) up.  Each case is tagged with its input classes (`strategies.classes.tagging`).
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

import references.quant as ref
from strategies import rarely, seeds, torch_copy
from strategies.classes import draws_rng
from strategies.quant import (CHANNEL_BLOCKS, DTYPES, MAX_ELEMENTS, SPREADS, SWIGLU_CLAMPS, SWIGLU_FEATURES, _chosen_blocks,
                              build_swiglu_x, cast_input, nan_payload_seeds, round_to_dtype, sf_options, tagging,
                              token_counts)
from tkverify.case import Case

SWIGLU_VECTOR = 8  # elements of the plain SwiGLU kernel's 16-byte vector of bf16 (kernels.quant.swiglu_plain)
# Row lengths H: partial vectors (1, 7, 12), partial 64-wide tiles (96, 136, 320), tile-kernels' multiples of 64.
SWIGLU_HIDDEN = (1, 7, 12, 64, 96, 128, 136, 256, 320)
EXTRA_FEATURES = ("saturated_l", "zero_row", "padding")
OUT_FORMATS = ("bf16", "fp32")


def _plant_extras(x: np.ndarray, hidden: int, dtype: str, features: dict[str, str], seed: int) -> None:
    rng = np.random.default_rng(seed + 7)
    num_rows = x.shape[0]
    if "saturated_l" in features and num_rows:
        rows = _chosen_blocks(rng, num_rows, features["saturated_l"])
        part = x[rows, :hidden]
        mask = rng.random(part.shape) < 0.5
        big = rng.uniform(16, 120, size=part.shape) * np.where(rng.random(part.shape) < 0.5, -1.0, 1.0)
        part[mask] = round_to_dtype(big, dtype)[mask]
        x[rows, :hidden] = part
    if "zero_row" in features and num_rows:
        x[_chosen_blocks(rng, num_rows, "one")] = 0.0


def _routing(draw, rng: np.random.Generator, num_rows: int, features: dict[str, str],
             routed: bool | None = None) -> dict[str, torch.Tensor]:
    """pos_to_token_topk (with padding rows where the case asks) and, mostly, topk_weights; none in about a
    quarter of the cases, or as `routed` says where it is given."""
    choices = ("none", "index_only", "weights", "weights")
    if routed is not None:
        choices = choices[1:] if routed else choices[:1]
    weighting = draw(st.sampled_from(choices))
    if weighting == "none":
        return {}
    k = draw(st.sampled_from((1, 2, 8)))
    padding = rng.random(num_rows) < draw(st.sampled_from((0.0, 0.25, 1.0)))
    tokens = -(-num_rows // k) + 1
    slots = rng.permutation(tokens * k)[:num_rows]
    inputs = {"pos_to_token_topk": torch_copy(np.where(padding, -1, slots).astype(np.int32))}
    if weighting == "weights":
        w = rng.uniform(0, 2, size=(tokens, k)).astype(np.float32)
        if "zero_weights" in features:
            w[rng.random(w.shape) < 0.3] = 0.0
        inputs["topk_weights"] = torch_copy(w)
    return inputs


def _features(draw) -> dict[str, str]:
    return draw(st.dictionaries(st.sampled_from(SWIGLU_FEATURES + EXTRA_FEATURES), st.sampled_from(SPREADS),
                                max_size=3))


def _x_values(draw, seed: int, num_rows: int, hidden: int, dtype: str, clamp, features,
              nonfinite_share: float = 0.0, subnormal_share: float = 0.0) -> np.ndarray:
    """x with `features` and this module's extras planted; `nonfinite_share` and `subnormal_share` as
    `build_swiglu_x` takes them."""
    x = build_swiglu_x(seed, num_rows, hidden, dtype, clamp, features, nonfinite_share, subnormal_share)
    _plant_extras(x, hidden, dtype, features, seed)
    if "padding" in features and num_rows:
        # padding rows are never read: a NaN planted anywhere must change nothing there
        x[np.random.default_rng(seed + 3).integers(0, num_rows), 0] = np.nan
    return x


# `draws_rng`'s stream of swiglu_cases' configuration choice (of those tried, the one whose ci draws reach every
# swiglu_plain configuration, forward and backward, with its single-row and routed classes: `tkverify coverage`)
SWIGLU_CONFIG_STREAM = 1
SINGLE_ROW_SHARE = 0.4
ROUTED_SHARE = 0.85
COTANGENT_DTYPES = ("bfloat16", "float32")  # the backward's grad_out, whatever the forward's x and fmt


def _swiglu_configuration(draws: tuple, hidden: int, num_rows: int) -> tuple[str, str, str, int, int, bool]:
    """(x dtype, out format, cotangent dtype, H, rows, routed) of a quant.swiglu case: each (dtype, format,
    cotangent dtype, H a multiple of the kernel's 8-element vector or not) configuration in turn, H from
    `SWIGLU_HIDDEN`, a single row in `SINGLE_ROW_SHARE` of the non-empty cases, and routing in `ROUTED_SHARE` of
    the cases.  The case's draws decide (`draws_rng`): the ci profile's few examples repeat draws of their own,
    which left configurations unlaunched, or without one row or routing."""
    rng = draws_rng(draws, SWIGLU_CONFIG_STREAM)
    which = int(rng.integers(0, 2 * len(DTYPES) * len(OUT_FORMATS) * len(COTANGENT_DTYPES)))
    dtype, fmt = tuple(DTYPES)[which % 2], OUT_FORMATS[which // 2 % 2]
    vectorized = which // 4 % 2 == 0
    cotangent = COTANGENT_DTYPES[which // 8]
    hidden = int(rng.choice([h for h in SWIGLU_HIDDEN if (h % SWIGLU_VECTOR == 0) == vectorized]))
    num_rows = min(num_rows, max(1, MAX_ELEMENTS // (2 * hidden)))
    single = num_rows and rng.random() < SINGLE_ROW_SHARE
    return dtype, fmt, cotangent, hidden, 1 if single else num_rows, bool(rng.random() < ROUTED_SHARE)


@st.composite
def swiglu_cases(draw) -> Case:
    """quant.swiglu: x (N, 2H) bf16 / fp32, fmt bf16 / fp32, clamp, routing, and the backward's cotangent
    dtype; the dtypes, H and a single row as `_swiglu_configuration` chooses them."""
    hidden = draw(st.sampled_from(SWIGLU_HIDDEN))
    num_rows = draw(token_counts(2 * hidden))
    clamp = draw(st.sampled_from(SWIGLU_CLAMPS))
    features = _features(draw)
    seed = draw(seeds())
    payload_seed = draw(nan_payload_seeds())
    dtype, fmt, cotangent, hidden, num_rows, routed = _swiglu_configuration(
        (hidden, num_rows, clamp, sorted(features.items()), seed, payload_seed), hidden, num_rows)
    # (subnormals seed-decided too: the ci examples draw the feature seldom, and a zero row may cover it)
    x = _x_values(draw, seed, num_rows, hidden, dtype, clamp, features, nonfinite_share=1 / 3, subnormal_share=1 / 4)
    inputs = {"x": cast_input(x, dtype, payload_seed)}
    inputs.update(_routing(draw, np.random.default_rng(seed + 1), num_rows, features, routed))
    return Case(params={"fmt": fmt, "clamp": clamp}, inputs=inputs, cotangent_dtype=cotangent)


BACKWARD_CAST_STREAM = 20  # `draws_rng`'s stream of backward_cast_cases' configuration choice
BACKWARD_CAST_TAIL_HIDDEN = (12, 100)  # H not a multiple of the kernel's 8-element vector (one block a row)


def _backward_cast_configuration(draws: tuple, hidden: int, npc: int, num_rows: int) -> tuple[str, int, int, int]:
    """(grad_out dtype, H, num_per_channels, rows) of a swiglu_backward_and_per_token_cast case: the grad_out
    dtype in turn, in 2 cases of 5 an H of `BACKWARD_CAST_TAIL_HIDDEN` (the kernel's scalar configuration, one
    block a row), else the drawn H and block, and a single row in `SINGLE_ROW_SHARE` of the cases with rows.  The
    case's draws decide (`draws_rng`): the ci profile's few examples repeat draws of their own."""
    rng = draws_rng(draws, BACKWARD_CAST_STREAM)
    grad_dtype = tuple(DTYPES)[int(rng.integers(0, len(DTYPES)))]
    if rng.random() < 0.4:
        hidden = npc = int(rng.choice(BACKWARD_CAST_TAIL_HIDDEN))
        num_rows = min(num_rows, max(1, MAX_ELEMENTS // (2 * hidden)))
    return grad_dtype, hidden, npc, 1 if num_rows and rng.random() < SINGLE_ROW_SHARE else num_rows


def _quantised_x(draw, x: np.ndarray, npc: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x as tile-kernels' backward takes it: e4m3 codes and their fp32 per-token sf (1 x npc blocks),
    the sf mostly a power of two (round_sf), sometimes a plain a / 448."""
    round_sf = draw(rarely(st.just(True), st.just(False), one_in=3))
    data, sf = ref.per_token_cast(torch_copy(x.astype(np.float32)), "e4m3", npc, round_sf=round_sf)
    return data, sf


@st.composite
def backward_cast_cases(draw) -> Case:
    """quant.swiglu_backward_and_per_token_cast: e4m3 x with its sf, a bf16 / fp32 cotangent, the cast's
    format and sf options, clamp and routing."""
    fmt = draw(rarely(st.just("e4m3"), st.just("e2m1"), one_in=5))  # not e5m6: one block a row straddles l, r
    hidden = draw(st.sampled_from((32, 64, 128, 256, 320)))
    npc_choices = tuple(n for n in (32, 128) if hidden % n == 0) or (hidden,)
    npc = draw(st.sampled_from(npc_choices))
    options = draw(sf_options(fmt))
    num_rows = draw(token_counts(2 * hidden))
    clamp = draw(st.sampled_from(SWIGLU_CLAMPS))
    features = _features(draw)
    seed = draw(seeds())
    grad_dtype = draw(st.sampled_from(tuple(DTYPES)))
    grad_dtype, hidden, npc, num_rows = _backward_cast_configuration(
        (fmt, hidden, npc, sorted(options.items()), num_rows, clamp, sorted(features.items()), seed, grad_dtype),
        hidden, npc, num_rows)
    x = _x_values(draw, seed, num_rows, hidden, "fp32", clamp, features)
    data, sf = _quantised_x(draw, x, npc)
    rng = np.random.default_rng(seed + 2)
    grad = round_to_dtype(rng.standard_normal((num_rows, hidden)) * np.exp2(rng.uniform(-8, 8)), grad_dtype)
    if draw(st.booleans()) and num_rows:
        grad[_chosen_blocks(rng, num_rows, draw(st.sampled_from(SPREADS)))] = 0.0
    inputs = {"x": data, "x_sf": sf, "grad_out": cast_input(grad, grad_dtype, None)}
    inputs.update(_routing(draw, np.random.default_rng(seed + 1), num_rows, features))
    return Case(params={"fmt": fmt, "num_per_channels": npc, "clamp": clamp, **options}, inputs=inputs)


@st.composite
def per_channel_transpose_cases(draw) -> Case:
    """quant.swiglu_forward_and_per_channel_cast_and_transpose: x (N, 2H) bf16 / fp32, clamp, e4m3 in
    num_per_tokens x 1 blocks (N ending in a partial block), data transposed or not, the sf options."""
    dtype = draw(st.sampled_from(tuple(DTYPES)))
    hidden = draw(st.sampled_from(SWIGLU_HIDDEN))
    npt = draw(st.sampled_from(CHANNEL_BLOCKS))
    num_rows = draw(token_counts(2 * hidden, npt))
    clamp = draw(st.sampled_from(SWIGLU_CLAMPS))
    features = _features(draw)
    features.pop("padding", None)  # no routing here
    seed = draw(seeds())
    x = _x_values(draw, seed, num_rows, hidden, dtype, clamp, features)
    options = draw(sf_options("e4m3"))
    return Case(params={"fmt": "e4m3", "num_per_tokens": npt, "clamp": clamp, "transpose": draw(st.booleans()),
                        **options},
                inputs={"x": cast_input(x, dtype, draw(nan_payload_seeds()))})


def named_classes(case: Case) -> set[str]:
    """This module's named classes of a case, computed from its tensors: ``saturated_l``, ``zero_row``,
    ``padding``, ``zero_grad_row``, ``pow2_x_sf`` (every sf of an e4m3 x a power of two)."""
    found = set()
    sf = case.inputs.get("x_sf")
    x = case.inputs["x"]
    x64 = x.double() if sf is None else x.double() * torch.repeat_interleave(sf.double(), x.shape[1] // max(
        sf.shape[1], 1), dim=1)
    hidden = x64.shape[1] // 2
    if x64.numel():
        l = x64[:, :hidden]
        if bool(((l.abs() >= 16) & torch.isfinite(l)).any()):
            found.add("saturated_l")
        if bool((x64 == 0).all(dim=1).any()):
            found.add("zero_row")
    pos = case.inputs.get("pos_to_token_topk")
    if pos is not None and bool((pos < 0).any()):
        found.add("padding")
    grad = case.inputs.get("grad_out")
    if grad is not None and grad.numel() and bool((grad == 0).all(dim=1).any()):
        found.add("zero_grad_row")
    if sf is not None and sf.numel() and bool(ref.is_power_of_two(sf.double().numpy()).all()):
        found.add("pow2_x_sf")
    return found


# The classes each strategy reaches under the ci profile (tests/test_classes.py), those the quant family's spec
# docstring (tkverify/specs/quant.py) lists.  `named_classes` adds this module's own (saturated_l, zero_row,
# padding, zero_grad_row, pow2_x_sf), which the report counts; tkverify/specs/quant_swiglu.py lists them.
swiglu_cases = tagging("x", (
    'empty', 'nan:x', 'neg_inf:x', 'non_pow2', 'pos_inf:x', 'single_row', 'subnormal:x',
), named_classes)(swiglu_cases)
backward_cast_cases = tagging("x", (
    'empty', 'non_pow2', 'single_row',
), named_classes)(backward_cast_cases)
per_channel_transpose_cases = tagging("x", (
    'empty', 'nan:x', 'non_pow2', 'single_row',
), named_classes)(per_channel_transpose_cases)
