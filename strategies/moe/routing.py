"""Strategies for the MoE routing chain: group_count, fused_mapping, expand_to_fused(_with_sf),
reduce_fused and normalize_weight (how a case is built: the comment below)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

import references.moe
from strategies import keyed_bits, rarely, seeds, tensor_from_bits, torch_copy
from strategies.moe.gate import ROW_SPREADS, _chosen_rows, plant_features, token_counts
from strategies.classes import draws_rng, tagging
from tkverify.case import Case

# Every case starts from a routing: topk_idx (T, K) built like the gate's
# scores (strategies.moe.gate), from a few drawn choices and a seed.
#
# 1. a base routing gives every row K distinct experts in [0, E), as top-k
#    does: uniformly, by popularity (a few experts take most tokens, many get
#    none), from a handful of experts only (every other expert empty; with
#    K = 1 every token on one expert), one expert in every row, or one row
#    repeated for every token;
# 2. up to three features, each on the first, the last, some or all rows:
#    masked slots (-1), whole rows masked (all rows: nothing is routed),
#    negative entries other than -1, and a row naming an expert twice (the
#    contract allows it: each (token, slot) pair is its own row).
#
# The data ops (expand, reduce) get the positions of that routing's
# fused_mapping (the oracle's), or a scattered injective map with padding
# rows anywhere, and values aimed at their edges.  Static parameters (E, K,
# alignment, H, dtypes, the sf layout) come from the small sets below; T and
# N are sizes.  N (num_expanded_rows) rides in a case's params only because
# expand_to_fused takes it as an int.


@functools.cache
def _choice(values: tuple) -> SearchStrategy:
    """st.sampled_from(values), built once: hypothesis validates a new strategy on every draw."""
    return st.sampled_from(values)


@functools.cache
def _feature_sets(names: tuple[str, ...], max_size: int) -> SearchStrategy[dict[str, str]]:
    """Up to max_size of the named features, each with the rows it goes to."""
    return st.dictionaries(st.sampled_from(names), st.sampled_from(ROW_SPREADS), max_size=max_size)


@functools.cache
def _built(make: Callable[[], SearchStrategy]) -> SearchStrategy:
    """make(), built once (for argument-less strategy functions)."""
    return make()


def _tokens() -> SearchStrategy[int]:
    return _built(token_counts)


def _seeds() -> SearchStrategy[int]:
    return _built(seeds)


def _tokens_or_one() -> SearchStrategy[int]:
    """T as `_tokens` draws it, or a single token about one case in five: the ci profile's few examples
    of token_counts seldom hold T = 1, the ops' single-row case."""
    return rarely(_tokens(), st.just(1), one_in=5)


ROUTING_EXPERT_COUNTS = (1, 2, 3, 8, 33, 64, 256, 384)
ROUTING_TOPK = (1, 2, 3, 6, 8, 9)
ALIGNMENTS = (1, 16, 64, 128)
# H for the data ops: one column, an odd width, and the usual tile widths.
HIDDEN_SIZES = (1, 7, 64, 128, 200)
# Moved or reduced elements per case: H shrinks to fit, keeping CPU CI fast.
MAX_ROUTED_ELEMENTS = 1 << 18
MASK = -1


def _top_k_columns(keys: np.ndarray, k: int) -> np.ndarray:
    """The columns of the k largest keys of each row (distinct), largest first."""
    return np.argsort(-keys, axis=1, kind="stable")[:, :k]


def _uniform_routing(rng: np.random.Generator, num_tokens: int, num_experts: int, k: int) -> np.ndarray:
    return _top_k_columns(rng.random((num_tokens, num_experts)), k)


def _popular_experts(rng: np.random.Generator, num_tokens: int, num_experts: int, k: int) -> np.ndarray:
    # Gumbel top-k: k distinct experts drawn with Zipf-like probabilities, so a
    # few experts are crowded and the tail often gets no token.
    popularity = 1.0 / (1.0 + rng.permutation(num_experts)) ** 1.5
    return _top_k_columns(np.log(popularity) + rng.gumbel(size=(num_tokens, num_experts)), k)


def _few_experts(rng: np.random.Generator, num_tokens: int, num_experts: int, k: int) -> np.ndarray:
    # k to k + 2 experts share every token; the others stay empty.  With as
    # many experts as slots, every token goes to every one of them.
    chosen = rng.permutation(num_experts)[: int(rng.integers(k, min(num_experts, k + 2), endpoint=True))]
    keys = np.full((num_tokens, num_experts), -np.inf)
    keys[:, chosen] = rng.random((num_tokens, chosen.size))
    return _top_k_columns(keys, k)


def _one_expert_for_all(rng: np.random.Generator, num_tokens: int, num_experts: int, k: int) -> np.ndarray:
    # Expert `hot` in every row, in a random slot; the other slots uniform.
    hot = int(rng.integers(0, num_experts))
    keys = rng.random((num_tokens, num_experts))
    keys[:, hot] = 2.0
    idx = _top_k_columns(keys, k)
    return rng.permuted(idx, axis=1)


def _identical_rows(rng: np.random.Generator, num_tokens: int, num_experts: int, k: int) -> np.ndarray:
    return np.repeat(_uniform_routing(rng, 1, num_experts, k), num_tokens, axis=0)


ROUTINGS: dict[str, Callable[[np.random.Generator, int, int, int], np.ndarray]] = {
    "uniform": _uniform_routing,
    "popular_experts": _popular_experts,
    "few_experts": _few_experts,
    "one_expert_for_all": _one_expert_for_all,
    "identical_rows": _identical_rows,
}


# -- routing features: rng, rows (R, K) int64 modified in place, E -> None ----------


def _masked_slots(rng: np.random.Generator, rows: np.ndarray, num_experts: int) -> None:
    """Slots set to -1 (an expert on another rank), each with a drawn probability."""
    rows[rng.random(rows.shape) < rng.uniform(0.1, 0.6)] = MASK


def _masked_rows(rng: np.random.Generator, rows: np.ndarray, num_experts: int) -> None:
    """Every slot of the row masked: the token goes nowhere."""
    rows[:] = MASK


def _other_negatives(rng: np.random.Generator, rows: np.ndarray, num_experts: int) -> None:
    """Masked slots marked with negatives other than -1, which must be dropped all the same."""
    values = np.array([-2, -num_experts, -num_experts - 1, -(2**31), -(2**63)], dtype=np.int64)
    mask = rng.random(rows.shape) < 0.3
    rows[mask] = values[rng.integers(0, values.size, size=rows.shape)][mask]


def _repeated_expert(rng: np.random.Generator, rows: np.ndarray, num_experts: int) -> None:
    """One slot naming the same expert as another slot of its row."""
    num_rows, k = rows.shape
    if k < 2:
        return
    source = rng.integers(0, k, size=num_rows)
    target = (source + rng.integers(1, k, size=num_rows)) % k
    every_row = np.arange(num_rows)
    rows[every_row, target] = rows[every_row, source]


# In the order they are applied (a repeat copies what the masks left).
ROUTING_FEATURES: dict[str, Callable[[np.random.Generator, np.ndarray, int], None]] = {
    "masked_slots": _masked_slots,
    "other_negatives": _other_negatives,
    "masked_rows": _masked_rows,
    "repeated_expert": _repeated_expert,
}


def build_topk_idx(seed: int, num_tokens: int, num_experts: int, k: int, routing: str,
                   features: dict[str, str]) -> np.ndarray:
    """The int64 (T, K) topk_idx that a drawn recipe describes (deterministic in its arguments).

    Without the "repeated_expert" feature every row's non-negative entries
    are distinct experts in [0, E), as top-k gives them.
    """
    idx = ROUTINGS[routing](np.random.default_rng([seed]), num_tokens, num_experts, k).astype(np.int64)
    plant_features(idx, seed, features, ROUTING_FEATURES, 1, num_experts)
    return idx


@st.composite
def routings(draw, tokens: Callable[[], SearchStrategy[int]] = _tokens) -> tuple[int, int, np.ndarray]:
    """(E, K, topk_idx int64 (T, K)): static E and K, T from `tokens` (`token_counts` by default)."""
    num_experts = draw(_choice(ROUTING_EXPERT_COUNTS))
    k = draw(_choice(tuple(k for k in ROUTING_TOPK if k <= num_experts)))
    num_tokens = draw(_built(tokens))
    routing = draw(_choice(tuple(ROUTINGS)))
    features = draw(_feature_sets(tuple(ROUTING_FEATURES), 3))
    return num_experts, k, build_topk_idx(draw(_seeds()), num_tokens, num_experts, k, routing, features)


# -- group_count and fused_mapping ------------------------------------------------------


def _beyond_groups(rng: np.random.Generator, idx: np.ndarray, num_groups: int) -> None:
    """Entries >= num_groups, which count in no group (num_groups itself, and far past it)."""
    values = np.array([num_groups, num_groups + 1, 2**31 - 1], dtype=np.int64)
    mask = rng.random(idx.shape) < 0.2
    idx[mask] = values[rng.integers(0, values.size, size=idx.shape)][mask]


def _single_entry() -> SearchStrategy[bool]:
    return rarely(st.just(False), st.just(True), one_in=3)


@st.composite
def group_count_cases(draw) -> Case:
    """Cases of ``group_count(idx int32|int64 (T, K), num_groups)``; one case in three keeps the first entry
    of a non-empty routing alone (T = K = 1: a launch over a single element, which routings seldom draw)."""
    num_groups, _, idx = draw(_built(routings))
    if draw(_built(_single_entry)) and idx.size:
        idx = idx[:1, :1].copy()
    if draw(_built(st.booleans)):
        _beyond_groups(np.random.default_rng([draw(_seeds())]), idx, num_groups)
    dtype = draw(_choice((np.int64, np.int32)))
    return Case(params={"num_groups": num_groups}, inputs={"idx": torch_copy(idx.astype(dtype))})


def routings_or_one_token() -> SearchStrategy[tuple[int, int, np.ndarray]]:
    """`routings` with T = 1 about one case in five (`_tokens_or_one`)."""
    return routings(_tokens_or_one)


@st.composite
def fused_mapping_cases(draw) -> Case:
    """Cases of ``fused_mapping(topk_idx int64 (T, K), num_experts, alignment)``; T is 1 more often than
    `routings` draws it (`_tokens_or_one`)."""
    num_experts, _, idx = draw(_built(routings_or_one_token))
    alignment = draw(_choice(ALIGNMENTS))
    return Case(params={"num_experts": num_experts, "alignment": alignment}, inputs={"topk_idx": torch_copy(idx)})


# -- positions for the data ops ---------------------------------------------------------

# "mapping": fused_mapping's layout (sorted, aligned); "scattered": each pair
# at a random row of a layout with padding rows anywhere (the ops must not
# assume fused_mapping's order).
POSITION_LAYOUTS = ("mapping", "scattered")


def build_positions(seed: int, idx: np.ndarray, num_experts: int, alignment: int, layout: str) -> tuple[np.ndarray, int]:
    """(token_topk_to_pos int32 (T, K), N) of a routing."""
    if layout == "mapping":
        _, _, positions, _, _, num_rows = references.moe.fused_mapping(idx, num_experts, alignment)
        return positions, num_rows
    rng = np.random.default_rng([seed, 99])
    placed = idx >= 0
    num_rows = int(placed.sum()) + int(rng.integers(0, 2 * alignment))
    positions = np.full(idx.shape, -1, dtype=np.int32)
    positions[placed] = rng.permutation(num_rows)[: int(placed.sum())]
    return positions, num_rows


@st.composite
def _routed(draw, routed: Callable[[], SearchStrategy] = routings) -> tuple[int, np.ndarray, int, int]:
    """(K, token_topk_to_pos, N, seed) of a routing drawn by `routed`."""
    num_experts, k, idx = draw(_built(routed))
    seed = draw(_seeds())
    positions, num_rows = build_positions(seed, idx, num_experts, draw(_choice(ALIGNMENTS)),
                                          draw(_choice(POSITION_LAYOUTS)))
    return k, positions, num_rows, seed


def _routed_or_one_token() -> SearchStrategy[tuple[int, np.ndarray, int, int]]:
    """`_routed` with T = 1 more often (`routings_or_one_token`): each of expand_to_fused's row and
    sf-column configurations meets a single token."""
    return _routed(routings_or_one_token)


def _hidden_size(draw, *row_counts: int) -> int:
    """H such that every (rows, H) tensor of the case stays under MAX_ROUTED_ELEMENTS."""
    rows = max(row_counts, default=1)
    return draw(_choice(tuple(h for h in HIDDEN_SIZES if h == 1 or rows * h <= MAX_ROUTED_ELEMENTS)))


# -- expand_to_fused -------------------------------------------------------------------

# x is moved bit for bit, so any bit pattern will do (NaN payloads included).
EXPAND_DTYPES = (torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.float16, torch.int8, torch.uint8)
# Quantised x with a per-token sf: e4m3, packed e2m1 (int8), packed e5m6 (uint8).
QUANTISED_DTYPES = (torch.float8_e4m3fn, torch.int8, torch.uint8)
SF_DTYPES = (torch.float32, torch.uint8, torch.int32)  # fp32, ue8m0, packed ue8m0
# sf columns: one per row, a few, and 7168 / 128 = 56.
SF_COLUMNS = (1, 2, 4, 7, 56)
SF_LAYOUTS = ("row_major", "tma_column_major")


def _with_infinities(x: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """x (a float with infinities) with about a sixteenth of its elements made -inf or +inf, and one -inf
    at least: random codes hold each infinity once in 2^16 (bf16, fp16) or 2^32 (fp32), and each must be
    moved as it is."""
    if x.numel() == 0:
        return x
    infinities = torch.from_numpy(np.where(rng.random(x.shape) < 0.5, -np.inf, np.inf)).to(x.dtype)
    x = torch.where(torch.from_numpy(rng.random(x.shape) < 1 / 16), infinities, x)
    x[int(rng.integers(0, x.shape[0])), int(rng.integers(0, x.shape[1]))] = -np.inf
    return x


@st.composite
def expand_to_fused_cases(draw) -> Case:
    """Cases of ``expand_to_fused(x (T, H), token_topk_to_pos, num_expanded_rows)``; in half the cases of a
    dtype with infinities (the seed decides) some of x's elements are infinite (`_with_infinities`)."""
    _, positions, num_rows, seed = draw(_built(_routed_or_one_token))
    hidden = _hidden_size(draw, num_rows, positions.shape[0])
    dtype = draw(_choice(EXPAND_DTYPES))
    x = tensor_from_bits(keyed_bits(seed, (positions.shape[0], hidden), dtype), dtype)
    rng = np.random.default_rng([seed, 3])
    if dtype in (torch.bfloat16, torch.float32, torch.float16) and rng.random() < 0.5:
        x = _with_infinities(x, rng)
    return Case(params={"num_expanded_rows": num_rows},
                inputs={"x": x, "token_topk_to_pos": torch_copy(positions)})


def _with_signed_zeros(x: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """x (a one-byte float) with an eighth of its codes made -0.0 or +0.0: zeros of both signs in a row,
    each of which must keep its sign bit when moved (random codes hold each zero once in 256), and one
    row holding both side by side."""
    codes = x.view(torch.uint8).numpy().copy()
    zero = rng.random(codes.shape) < 0.125
    codes[zero] = np.where(rng.random(codes.shape) < 0.5, 0x80, 0x00)[zero]
    if codes.shape[0] and codes.shape[1] >= 2:  # and at least one such pair, side by side
        col = int(rng.integers(0, codes.shape[1] - 1))
        codes[int(rng.integers(0, codes.shape[0])), col:col + 2] = (0x00, 0x80)
    return torch_copy(codes).view(x.dtype)


@st.composite
def expand_to_fused_with_sf_cases(draw) -> Case:
    """Cases of ``expand_to_fused(x, token_topk_to_pos, num_expanded_rows, x_sf)`` with a quantised x.

    ``sf_layout`` ("row_major" or "tma_column_major") says how x_sf is stored
    for the call; the case holds its logical (T, G) values.
    """
    _, positions, num_rows, seed = draw(_built(_routed_or_one_token))
    num_tokens = positions.shape[0]
    hidden = _hidden_size(draw, num_rows, num_tokens)
    dtype = draw(_choice(QUANTISED_DTYPES))
    sf_dtype = draw(_choice(SF_DTYPES))
    sf_columns = draw(_choice(SF_COLUMNS))
    x = tensor_from_bits(keyed_bits(seed, (num_tokens, hidden), dtype), dtype)
    if dtype.is_floating_point:
        x = _with_signed_zeros(x, np.random.default_rng([seed, 2]))
    x_sf = tensor_from_bits(keyed_bits(seed, (num_tokens, sf_columns), sf_dtype, stream=1), sf_dtype)
    # The layout travels as a parameter: a case's tensors lose their strides
    # on the way to the device and into a case file (the spec re-lays x_sf).
    layout = draw(_choice(SF_LAYOUTS))
    return Case(params={"num_expanded_rows": num_rows, "sf_layout": layout},
                inputs={"x": x, "token_topk_to_pos": torch_copy(positions), "x_sf": x_sf})


# -- reduce_fused and normalize_weight: values -------------------------------------------

REDUCE_DTYPES = (torch.bfloat16, torch.float32, torch.float8_e4m3fn)
_E4M3_MAX = 448.0


def _normal_values(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_normal(shape)


def _small_integers(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    # Exact in every dtype and in fp32 sums: ties and exact cancellations.
    return rng.integers(-4, 4, size=shape, endpoint=True).astype(np.float64)


def _wide_values(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    # Every binade from the subnormals up to 2^40.
    return rng.standard_normal(shape) * np.exp2(rng.integers(-140, 40, size=shape))


X_BASES: dict[str, Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]] = {
    "normal": _normal_values,
    "small_integers": _small_integers,
    "wide": _wide_values,
}


def _gate_weights(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    # A router's: softmax over the slots (normalised top-k probabilities).
    logits = rng.standard_normal(shape) * 2
    e = np.exp(logits - logits.max(axis=1, keepdims=True, initial=0.0))
    return e / e.sum(axis=1, keepdims=True)


def _uniform_weights(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    return rng.random(shape)


def _equal_weights(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    return np.full(shape, 1.0 / max(shape[1], 1))


def _wide_weights(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    # Positive, from fp32 subnormals (2^-149) to 2^61: products with any x stay far inside fp32.
    return (1 + rng.random(shape)) * np.exp2(rng.integers(-150, 60, size=shape))


W_BASES: dict[str, Callable[[np.random.Generator, tuple[int, int]], np.ndarray]] = {
    "gate": _gate_weights,
    "uniform": _uniform_weights,
    "equal": _equal_weights,
    "wide": _wide_weights,
}


def _subnormal_fp32(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(1, 2**23, size=shape).astype(np.float64) * 2.0**-149


# -- weight features: rng, w rows (R, K) float64 modified in place -> None ----------------


def _zero_slots(rng: np.random.Generator, w: np.ndarray) -> None:
    w[rng.random(w.shape) < 0.4] = 0.0


def _zero_rows(rng: np.random.Generator, w: np.ndarray) -> None:
    """All weights zero: denom is 1e-20 alone."""
    w[:] = 0.0


def _negative_zeros(rng: np.random.Generator, w: np.ndarray) -> None:
    w[rng.random(w.shape) < 0.4] = -0.0


def _signed_zero_slots(rng: np.random.Generator, w: np.ndarray) -> None:
    """-0.0 and +0.0 beside each other in a row: each weight keeps its zero's sign."""
    zero = rng.random(w.shape) < 0.5
    w[:] = np.where(zero, np.where(rng.random(w.shape) < 0.5, -0.0, 0.0), w)


def _denormal_slots(rng: np.random.Generator, w: np.ndarray) -> None:
    mask = rng.random(w.shape) < 0.5
    w[mask] = _subnormal_fp32(rng, w.shape)[mask]


def _denormal_rows(rng: np.random.Generator, w: np.ndarray) -> None:
    """Every weight subnormal: the 1e-20 dominates denom."""
    w[:] = _subnormal_fp32(rng, w.shape)


def _tiny_rows(rng: np.random.Generator, w: np.ndarray) -> None:
    """Normal weights whose sum is far below 1e-20 (w / sum_k w would be O(1), w / denom is not)."""
    w[:] = (1 + rng.random(w.shape)) * 2.0**-90


def _dominant_slot(rng: np.random.Generator, w: np.ndarray) -> None:
    """One slot 1, the others below its rounding error."""
    w[:] = rng.random(w.shape) * 2.0**-26
    w[np.arange(w.shape[0]), rng.integers(0, w.shape[1], size=w.shape[0])] = 1.0


WEIGHT_FEATURES: dict[str, Callable[[np.random.Generator, np.ndarray], None]] = {
    "zero_slots": _zero_slots,
    "zero_rows": _zero_rows,
    "negative_zeros": _negative_zeros,
    "denormal_slots": _denormal_slots,
    "denormal_rows": _denormal_rows,
    "tiny_rows": _tiny_rows,
    "dominant_slot": _dominant_slot,
}


def build_weights(seed: int, shape: tuple[int, int], base: str, features: dict[str, str]) -> np.ndarray:
    """The float32 (T, K) weights that a drawn recipe describes."""
    w = W_BASES[base](np.random.default_rng([seed, 200]), shape)
    if shape[1] > 0:
        plant_features(w, seed, features, WEIGHT_FEATURES, 201)
    return w.astype(np.float32)


def _weight_recipe(draw) -> tuple[str, dict[str, str]]:
    base = draw(_choice(tuple(W_BASES)))
    return base, draw(_feature_sets(tuple(WEIGHT_FEATURES), 3))


@st.composite
def normalize_weight_cases(draw) -> Case:
    """Cases of ``normalize_weight(topk_weights f32 (T, K))``; T is 1 more often than `token_counts` draws
    it (`_tokens_or_one`)."""
    k = draw(_choice(ROUTING_TOPK))
    num_tokens = draw(_built(_tokens_or_one))
    base, features = _weight_recipe(draw)
    seed = draw(_seeds())
    w = build_weights(seed, (num_tokens, k), base, features)
    rng = np.random.default_rng([seed, 300])
    if num_tokens and rng.random() < 0.5:  # in some rows -0.0 beside +0.0 (the seed decides)
        rows = _chosen_rows(rng, num_tokens, "some")
        block = w[rows].astype(np.float64)
        _signed_zero_slots(rng, block)
        w[rows] = block.astype(np.float32)
    return Case(params={}, inputs={"topk_weights": torch_copy(w)})


# -- reduce_fused: x rows aimed at the weighted sum's edges -------------------------------
# They work on the stored codes, so that a negated row cancels exactly in any dtype.

_SIGN_BIT = {1: 0x80, 2: 0x8000, 4: 0x8000_0000}


def _stored_codes(values: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """The codes (unsigned) of values rounded to dtype (e4m3 saturating to +-448)."""
    if dtype == torch.float8_e4m3fn:
        values = np.clip(values, -_E4M3_MAX, _E4M3_MAX)
    t = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64)).to(torch.float32).to(dtype)
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()]).numpy().view(
        {1: np.uint8, 2: np.uint16, 4: np.uint32}[t.element_size()])


@dataclasses.dataclass
class ReduceInputs:
    """The inputs of one reduce_fused case while its features are planted (NumPy, mutable)."""

    codes: np.ndarray  # x's codes (N, H), unsigned of x's width
    dtype: torch.dtype
    sf: np.ndarray | None  # float32 (N,), with an e4m3 x
    weights: np.ndarray  # float32 (T, K)
    positions: np.ndarray  # int32 (T, K)

    def valid_slots(self, token: int) -> np.ndarray:
        return np.flatnonzero(self.positions[token] >= 0)


def _cancelling_terms(rng: np.random.Generator, inputs: ReduceInputs, tokens: np.ndarray, near: bool) -> None:
    """Two slots whose terms cancel (exactly, or to one ULP of x), the other terms made tiny.

    The sum is then far below the terms, where every fp32 summation order is
    many ULPs off and only the bound in terms of sum |w x| can judge it.
    """
    sign = inputs.codes.dtype.type(_SIGN_BIT[inputs.codes.itemsize])
    for token in tokens:
        slots = inputs.valid_slots(token)
        if slots.size < 2:
            continue
        a, b = rng.choice(slots, size=2, replace=False)
        row_a, row_b = inputs.positions[token, a], inputs.positions[token, b]
        inputs.weights[token, b] = inputs.weights[token, a]
        others = np.setdiff1d(slots, [a, b])
        inputs.weights[token, others] *= np.float32(2.0**-20)
        negated = inputs.codes[row_a] ^ sign
        if near:  # one code towards zero (or off zero), never onto a NaN code
            magnitude = negated & ~sign
            negated = np.where(magnitude > 0, negated - 1, negated + 1).astype(negated.dtype)
        inputs.codes[row_b] = negated
        if inputs.sf is not None:
            inputs.sf[row_b] = inputs.sf[row_a]


def _nan_where_unused(rng: np.random.Generator, inputs: ReduceInputs, tokens: np.ndarray) -> None:
    """NaN in rows of x that no slot points to, and as the weight of masked slots: neither may leak."""
    used = np.zeros(inputs.codes.shape[0], bool)
    used[inputs.positions[inputs.positions >= 0]] = True
    nan_code = _stored_codes(np.array([np.nan]), inputs.dtype)[0]
    inputs.codes[~used] = nan_code
    if inputs.sf is not None:
        inputs.sf[~used] = np.nan
    masked = inputs.positions[tokens] < 0
    inputs.weights[tokens] = np.where(masked, np.float32(np.nan), inputs.weights[tokens])


def _non_finite_in_use(rng: np.random.Generator, inputs: ReduceInputs, tokens: np.ndarray) -> None:
    """One to three NaNs or infinities (e4m3: NaNs) in the rows the token's slots use, taking NaN, +inf and
    -inf in turn from a random one on: a token sums one of them alone, or several (+inf and -inf: NaN), and
    even a single token holds a given one in about two cases of three."""
    specials = _stored_codes(np.array([np.nan, np.inf, -np.inf]), inputs.dtype)
    turn = int(rng.integers(0, specials.size))
    for token in tokens:
        slots = inputs.valid_slots(token)
        if not (slots.size and inputs.codes.shape[1]):
            continue
        for _ in range(int(rng.integers(1, 3, endpoint=True))):
            row = inputs.positions[token, rng.choice(slots)]
            inputs.codes[row, rng.integers(0, inputs.codes.shape[1])] = specials[turn % specials.size]
            turn += 1


REDUCE_FEATURES: dict[str, Callable[[np.random.Generator, ReduceInputs, np.ndarray], None]] = {
    "cancelling_terms": lambda rng, inputs, tokens: _cancelling_terms(rng, inputs, tokens, near=False),
    "nearly_cancelling_terms": lambda rng, inputs, tokens: _cancelling_terms(rng, inputs, tokens, near=True),
    "nan_where_unused": _nan_where_unused,
    "non_finite_in_use": _non_finite_in_use,
}


def build_reduce_inputs(seed: int, positions: np.ndarray, num_rows: int, hidden: int, dtype: torch.dtype,
                        x_base: str, w_base: str, w_features: dict[str, str],
                        features: dict[str, str]) -> dict[str, torch.Tensor]:
    """The inputs of reduce_fused that a drawn recipe describes."""
    rng = np.random.default_rng([seed, 300])
    values = X_BASES[x_base](rng, (num_rows, hidden))
    sf = None
    if dtype == torch.float8_e4m3fn:
        values = values * 64  # spread over e4m3's codes
        sf = ((1 + rng.random(num_rows)) * np.exp2(rng.integers(-20, 5, size=num_rows))).astype(np.float32)
    inputs = ReduceInputs(_stored_codes(values, dtype), dtype, sf,
                          build_weights(seed, positions.shape, w_base, w_features), positions)
    for stream, (name, plant) in enumerate(REDUCE_FEATURES.items(), start=301):
        if name in features:
            rng = np.random.default_rng([seed, stream])
            plant(rng, inputs, _chosen_rows(rng, positions.shape[0], features[name]))
    out = {
        "x": tensor_from_bits(inputs.codes, dtype),
        "topk_weights": torch_copy(inputs.weights),
        "token_topk_to_pos": torch_copy(positions),
    }
    if sf is not None:
        out["x_sf"] = torch_copy(inputs.sf.reshape(num_rows, 1))
    return out


# The share of reduce_fused's cases cut to their first token (`one_token_corner`), and the H such a case
# takes for a vectorised (a multiple of every dtype's 16-byte vector) or a scalar kernel (odd).
ONE_TOKEN_SHARE = 7 / 10
ONE_TOKEN_STREAM = 407
ONE_TOKEN_HIDDEN = {True: 64, False: 7}


def one_token_corner(draws: tuple, positions: np.ndarray, num_rows: int, hidden: int,
                     dtype: torch.dtype) -> tuple[np.ndarray, int, torch.dtype]:
    """(positions, H, x dtype) as drawn, or in about ONE_TOKEN_SHARE of the non-empty cases (the case's draws
    deciding, `strategies.classes.draws_rng`, so that the draws stay as they are) the first token's row of
    positions alone, with an x dtype and an H of the vectorised or the scalar kernel chosen in the same way:
    a launch over a single token for each of the kernel's configurations, which the drawn token counts
    seldom give, in half of them with a slot dropped.  The rows of x keep their number N (those no slot
    names any more are rows the reduction never reads); H stays as drawn where N rows of the chosen H would
    pass MAX_ROUTED_ELEMENTS."""
    rng = draws_rng(draws, ONE_TOKEN_STREAM)
    if positions.shape[0] == 0 or rng.random() >= ONE_TOKEN_SHARE:
        return positions, hidden, dtype
    dtype = REDUCE_DTYPES[int(rng.integers(0, len(REDUCE_DTYPES)))]
    chosen = ONE_TOKEN_HIDDEN[bool(rng.random() < 0.5)]
    one = positions[:1].copy()
    if rng.random() < 0.5:  # one of its slots dropped (position -1): it adds nothing
        one[0, int(rng.integers(0, one.shape[1]))] = -1
    return one, chosen if num_rows * chosen <= MAX_ROUTED_ELEMENTS else hidden, dtype


@st.composite
def reduce_fused_cases(draw) -> Case:
    """Cases of ``reduce_fused(x (N, H), topk_weights (T, K), token_topk_to_pos [, x_sf])``."""
    k, positions, num_rows, seed = draw(_built(_routed))
    hidden = _hidden_size(draw, num_rows, positions.shape[0] * k)
    dtype = draw(_choice(REDUCE_DTYPES))
    x_base = draw(_choice(tuple(X_BASES)))
    w_base, w_features = _weight_recipe(draw)
    features = draw(_feature_sets(tuple(REDUCE_FEATURES), 2))
    # The seed adds non-finite values in use (on some tokens) to one case in four of the others: the ci
    # profile's examples repeat the drawn features more often than the seed, and only the dtypes other
    # than e4m3 have infinities.
    if "non_finite_in_use" not in features and np.random.default_rng([seed, 400]).random() < 0.25:
        features = {**features, "non_finite_in_use": "some"}
    draws = (k, positions, num_rows, seed, hidden, dtype, x_base, w_base, sorted(w_features.items()),
             sorted(features.items()))
    positions, hidden, dtype = one_token_corner(draws, positions, num_rows, hidden, dtype)
    inputs = build_reduce_inputs(seed, positions, num_rows, hidden, dtype, x_base, w_base, w_features, features)
    return Case(params={}, inputs=inputs)


# The classes each strategy reaches under the ci profile (tests/test_classes.py), as tkverify/specs/moe.py lists.
group_count_cases = tagging("idx", (
    'empty', 'non_pow2',
))(group_count_cases)
fused_mapping_cases = tagging("topk_idx", (
    'empty', 'non_pow2', 'single_row',
))(fused_mapping_cases)
expand_to_fused_cases = tagging("x", (
    'dtype_max:x', 'empty', 'nan:x', 'nan_payload:x', 'neg_inf:x',
    'neg_zero:x', 'non_pow2', 'signed_zero_tie:x', 'subnormal:x',
))(expand_to_fused_cases)
expand_to_fused_with_sf_cases = tagging("x", (
    'dtype_max:x', 'empty', 'nan:x', 'nan:x_sf', 'nan_payload:x_sf', 'neg_zero:x', 'non_pow2',
    'signed_zero_tie:x', 'single_row', 'subnormal:x', 'subnormal:x_sf',
))(expand_to_fused_with_sf_cases)
reduce_fused_cases = tagging("x", (
    'dtype_max:x', 'empty', 'nan:topk_weights', 'nan:x', 'nan:x_sf',
    'nan_payload:x', 'neg_inf:x', 'neg_zero:topk_weights', 'neg_zero:x', 'non_pow2',
    'pos_inf:x', 'signed_zero_tie:x', 'subnormal:topk_weights', 'subnormal:x', 'zero_row:topk_weights',
    'zero_row:x',
))(reduce_fused_cases)
normalize_weight_cases = tagging("topk_weights", (
    'empty', 'neg_zero:topk_weights', 'non_pow2', 'signed_zero_tie:topk_weights', 'single_row',
    'subnormal:topk_weights', 'zero_row:topk_weights',
))(normalize_weight_cases)
