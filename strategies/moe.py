"""Strategies for the MoE routing operators.

`topk_gate_cases` draws a score matrix in three layers, each a few hypothesis
choices:

1. a base distribution filling every row (distinct values, a handful of
   integers that tie everywhere, gate-like values in [0, 1), or arbitrary
   finite float32 bit patterns from subnormals to 3e38);
2. up to four features, each planted in the first row, the last row, some
   rows or every row, at positions a seeded NumPy generator picks: exact and one-ULP ties at the
   k-th place, rows of equal scores, subnormals, signed zeros, infinities,
   rows with fewer finite scores than k, NaNs of any sign and payload;
3. a few pinned special values at positions hypothesis draws (so a failure
   caused by one NaN in one place can shrink to exactly that).
"""

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
from tkverify.case import Case

# Static parameters: E and k select a compiled kernel.  E covers 1..1024 with
# values on and off the 32-lane warp width; k stays <= 32 and <= E.
EXPERT_COUNTS = (1, 2, 7, 31, 33, 64, 100, 255, 256, 384, 1000, 1024)
TOPK_VALUES = (1, 2, 4, 8, 9, 32)

# Token counts: mostly small (fast), tails of common token tiles, and about
# once in 16 cases up to a few thousand (always odd, so no tile size divides
# them).  Each kind can shrink to one token on its own, without hypothesis
# having to switch kinds: 1 leads the tails, and the large ones start at 1.
TOKEN_TAILS = (1, 31, 33, 63, 65, 127, 129, 255, 257)
LARGEST_TOKENS = 4097

_EXPONENT_BITS = np.uint32(0x7F80_0000)
_MANTISSA_BITS = np.uint32(0x007F_FFFF)

# Values that pinned placements write: every class the total order separates.
SPECIAL_SCORES = (
    float("nan"),
    -float("nan"),
    float("inf"),
    -float("inf"),
    0.0,
    -0.0,
    float(np.float32(2.0**-149)),  # smallest subnormal
    -float(np.float32(2.0**-149)),
    float(np.finfo(np.float32).max),
    -float(np.finfo(np.float32).max),
    1.0,
)


def token_counts() -> SearchStrategy[int]:
    """T: mostly 0..300 with token-tile tails, rarely an odd count up to 4097."""
    common = st.one_of(st.integers(0, 17), st.sampled_from(TOKEN_TAILS), st.integers(0, 300))
    odd_up_to_largest = st.integers(0, LARGEST_TOKENS // 2).map(lambda n: 2 * n + 1)
    return rarely(common, odd_up_to_largest, one_in=16)


# -- base distributions: rng, shape -> float32 array ----------------------------


def _distinct_normal(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32)


def _few_integers(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    # Seven values only: exact ties everywhere, across the k-th place too.
    return rng.integers(-3, 3, size=shape, endpoint=True).astype(np.float32)


def _gate_like(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    # Sigmoid or softmax outputs, the scores a router really produces.
    return rng.random(shape, dtype=np.float32)


def _any_finite(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    # Uniform bit patterns cover every binade, subnormals included; an all-ones
    # exponent (inf/NaN) is folded onto a finite one by clearing the exponent's
    # top bit.
    bits = rng.integers(0, 2**32, size=shape, dtype=np.uint32)
    not_finite = (bits & _EXPONENT_BITS) == _EXPONENT_BITS
    bits[not_finite] &= ~np.uint32(0x4000_0000)
    return bits.view(np.float32)


BASES: dict[str, Callable[[np.random.Generator, tuple[int, int]], np.ndarray]] = {
    "distinct_normal": _distinct_normal,
    "few_integers": _few_integers,
    "gate_like": _gate_like,
    "any_finite": _any_finite,
}


# -- features: rng, rows (R, E) float32 modified in place, k -> None ------------


def _kth_and_next(rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row index, column of the k-th largest, column of the (k+1)-th largest) of every row.

    Only used before NaNs are planted, where a plain descending argsort ranks
    the scores as the gate does.
    """
    order = np.argsort(-rows, axis=1, kind="stable")
    return np.arange(rows.shape[0]), order[:, k - 1], order[:, k]


def _exactly_n_per_row(rng: np.random.Generator, shape: tuple[int, int], counts: np.ndarray) -> np.ndarray:
    """A mask with counts[r] True entries at random positions of row r."""
    keys = rng.random(shape)
    nth_smallest = np.take_along_axis(np.sort(keys, axis=1), np.maximum(counts - 1, 0)[:, None], axis=1)
    return (keys <= nth_smallest) & (counts[:, None] > 0)


def _random_signs(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    return rng.integers(0, 2, size=shape, dtype=np.uint32) << np.uint32(31)


def _equal_row(rng: np.random.Generator, rows: np.ndarray, k: int) -> None:
    """Every score of the row equal: the answer is 0..k-1."""
    rows[:] = rows[:, :1]


def _tie_at_kth(rng: np.random.Generator, rows: np.ndarray, k: int) -> None:
    """The k-th and (k+1)-th largest scores equal, so the index decides the cut.

    A few more copies of that value land at random positions, before or after
    the two, which keeps the tie at the k-th place and widens it.
    """
    num_rows, num_experts = rows.shape
    if num_experts <= k:
        return
    every_row, kth, next_ = _kth_and_next(rows, k)
    kth_value = rows[every_row, kth]
    rows[every_row, next_] = kth_value
    more_copies = rng.integers(0, num_experts, size=(num_rows, int(rng.integers(0, 3, endpoint=True))))
    np.put_along_axis(rows, more_copies, kth_value[:, None], axis=1)


def _near_tie_at_kth(rng: np.random.Generator, rows: np.ndarray, k: int) -> None:
    """The (k+1)-th largest score one float32 ULP below or above the k-th: the cut hangs on the last bit."""
    num_rows, num_experts = rows.shape
    if num_experts <= k:
        return
    every_row, kth, next_ = _kth_and_next(rows, k)
    direction = np.where(rng.random(num_rows) < 0.5, -np.inf, np.inf).astype(np.float32)
    rows[every_row, next_] = np.nextafter(rows[every_row, kth], direction)


def _subnormals(rng: np.random.Generator, rows: np.ndarray, k: int) -> None:
    """Subnormal scores of either sign, up to the whole row: a kernel that flushes them to zero ties them."""
    num_rows, num_experts = rows.shape
    mask = _exactly_n_per_row(rng, rows.shape, rng.integers(1, num_experts, size=num_rows, endpoint=True))
    mantissas = rng.integers(1, int(_MANTISSA_BITS), size=rows.shape, dtype=np.uint32, endpoint=True)
    rows[mask] = (_random_signs(rng, rows.shape) | mantissas).view(np.float32)[mask]


def _signed_zeros(rng: np.random.Generator, rows: np.ndarray, k: int) -> None:
    """+0.0 and -0.0 in one row, which must tie; half the time every other score is made negative so the zeros lead."""
    num_rows, num_experts = rows.shape
    counts = rng.integers(min(2, num_experts), min(num_experts, k + 2), size=num_rows, endpoint=True)
    if rng.random() < 0.5:
        rows[:] = -np.abs(rows)
    mask = _exactly_n_per_row(rng, rows.shape, counts)
    rows[mask] = _random_signs(rng, rows.shape).view(np.float32)[mask]


def _pos_inf(rng: np.random.Generator, rows: np.ndarray, k: int) -> None:
    """Up to k+1 scores of +inf: ties above every finite score."""
    num_rows, num_experts = rows.shape
    counts = rng.integers(1, min(num_experts, k + 1), size=num_rows, endpoint=True)
    rows[_exactly_n_per_row(rng, rows.shape, counts)] = np.inf


def _neg_inf(rng: np.random.Generator, rows: np.ndarray, k: int) -> None:
    """Scores of -inf anywhere in the row (masked-out experts)."""
    num_rows, num_experts = rows.shape
    counts = rng.integers(1, num_experts, size=num_rows, endpoint=True)
    rows[_exactly_n_per_row(rng, rows.shape, counts)] = -np.inf


def _fewer_finite_than_k(rng: np.random.Generator, rows: np.ndarray, k: int) -> None:
    """Only 0..k-1 scores not -inf: the top k must reach into the -inf ties."""
    num_rows, _ = rows.shape
    finite_counts = rng.integers(0, k, size=num_rows)
    rows[~_exactly_n_per_row(rng, rows.shape, finite_counts)] = -np.inf


def _nans(rng: np.random.Generator, rows: np.ndarray, k: int) -> None:
    """NaNs of either sign with random payloads (quiet and signalling).

    Mostly up to k+2 a row, so that NaN ties straddle the cut; sometimes up to
    the whole row, and sometimes the whole row.
    """
    num_rows, num_experts = rows.shape
    how_many = rng.random()
    if how_many < 0.15:
        counts = np.full(num_rows, num_experts)
    else:
        most = num_experts if how_many < 0.35 else min(num_experts, k + 2)
        counts = rng.integers(1, most, size=num_rows, endpoint=True)
    mask = _exactly_n_per_row(rng, rows.shape, counts)
    payloads = rng.integers(1, int(_MANTISSA_BITS), size=rows.shape, dtype=np.uint32, endpoint=True)
    rows[mask] = (_random_signs(rng, rows.shape) | _EXPONENT_BITS | payloads).view(np.float32)[mask]


# In the order they are applied, whatever order they were drawn in: ties are
# shaped on finite values first, then the special values are laid over them.
FEATURES: dict[str, Callable[[np.random.Generator, np.ndarray, int], None]] = {
    "equal_row": _equal_row,
    "tie_at_kth": _tie_at_kth,
    "near_tie_at_kth": _near_tie_at_kth,
    "subnormals": _subnormals,
    "signed_zeros": _signed_zeros,
    "pos_inf": _pos_inf,
    "neg_inf": _neg_inf,
    "fewer_finite_than_k": _fewer_finite_than_k,
    "nans": _nans,
}

# Which rows a feature goes to.  The first and the last row stay put while
# hypothesis shrinks T (a seeded choice would move), and the last row sits in
# the ragged tail tile of a token-tiled kernel.
ROW_SPREADS = ("first", "last", "some", "all")


def _chosen_rows(rng: np.random.Generator, num_tokens: int, spread: str) -> np.ndarray:
    if num_tokens == 0 or spread == "all":
        return np.arange(num_tokens)
    if spread == "first":
        return np.array([0])
    if spread == "last":
        return np.array([num_tokens - 1])
    some = np.flatnonzero(rng.random(num_tokens) < 0.25)
    return some if some.size else rng.integers(0, num_tokens, size=1)


def build_scores(
    seed: int,
    num_tokens: int,
    num_experts: int,
    k: int,
    base: str,
    features: dict[str, str],
    pinned: list[tuple[int, int, float]],
) -> np.ndarray:
    """The (T, E) float32 scores that a drawn recipe describes (deterministic in its arguments)."""
    scores = BASES[base](np.random.default_rng([seed]), (num_tokens, num_experts))
    for stream, (name, plant) in enumerate(FEATURES.items(), start=1):
        if name in features:
            # A stream of its own for each feature, so that dropping another
            # feature or shrinking T while shrinking leaves its draws alone.
            rng = np.random.default_rng([seed, stream])
            rows = _chosen_rows(rng, num_tokens, features[name])
            block = scores[rows]
            plant(rng, block, k)
            scores[rows] = block
    for row, column, value in pinned:
        scores[row, column] = value
    return scores


@st.composite
def _pinned_values(draw, num_tokens: int, num_experts: int) -> list[tuple[int, int, float]]:
    if num_tokens == 0:
        return []
    placement = st.tuples(
        st.integers(0, num_tokens - 1), st.integers(0, num_experts - 1), st.sampled_from(SPECIAL_SCORES)
    )
    return draw(st.lists(placement, max_size=6))


@st.composite
def topk_gate_cases(draw) -> Case:
    """Cases of ``topk_gate(scores f32 (T, E), k)``."""
    num_experts = draw(st.sampled_from(EXPERT_COUNTS))
    k = draw(st.sampled_from([k for k in TOPK_VALUES if k <= num_experts]))
    num_tokens = draw(token_counts())
    base = draw(st.sampled_from(tuple(BASES)))
    features = draw(st.dictionaries(st.sampled_from(tuple(FEATURES)), st.sampled_from(ROW_SPREADS), max_size=4))
    pinned = draw(_pinned_values(num_tokens, num_experts))
    seed = draw(seeds())
    scores = build_scores(seed, num_tokens, num_experts, k, base, features, pinned)
    return Case(params={"k": k}, inputs={"scores": torch_copy(scores)})


# == the routing chain: group_count, fused_mapping, expand_to_fused, reduce_fused, normalize_weight ==
#
# Every case starts from a routing: topk_idx (T, K) built like the scores
# above, from a few drawn choices and a seed.
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
    for stream, (name, plant) in enumerate(ROUTING_FEATURES.items(), start=1):
        if name in features:
            rng = np.random.default_rng([seed, stream])
            rows = _chosen_rows(rng, num_tokens, features[name])
            block = idx[rows]
            plant(rng, block, num_experts)
            idx[rows] = block
    return idx


@st.composite
def routings(draw) -> tuple[int, int, np.ndarray]:
    """(E, K, topk_idx int64 (T, K)): static E and K, T from `token_counts`."""
    num_experts = draw(_choice(ROUTING_EXPERT_COUNTS))
    k = draw(_choice(tuple(k for k in ROUTING_TOPK if k <= num_experts)))
    num_tokens = draw(_tokens())
    routing = draw(_choice(tuple(ROUTINGS)))
    features = draw(_feature_sets(tuple(ROUTING_FEATURES), 3))
    return num_experts, k, build_topk_idx(draw(_seeds()), num_tokens, num_experts, k, routing, features)


# -- group_count and fused_mapping ------------------------------------------------------


def _beyond_groups(rng: np.random.Generator, idx: np.ndarray, num_groups: int) -> None:
    """Entries >= num_groups, which count in no group (num_groups itself, and far past it)."""
    values = np.array([num_groups, num_groups + 1, 2**31 - 1], dtype=np.int64)
    mask = rng.random(idx.shape) < 0.2
    idx[mask] = values[rng.integers(0, values.size, size=idx.shape)][mask]


@st.composite
def group_count_cases(draw) -> Case:
    """Cases of ``group_count(idx int32|int64 (T, K), num_groups)``."""
    num_groups, _, idx = draw(_built(routings))
    if draw(_built(st.booleans)):
        _beyond_groups(np.random.default_rng([draw(_seeds())]), idx, num_groups)
    dtype = draw(_choice((np.int64, np.int32)))
    return Case(params={"num_groups": num_groups}, inputs={"idx": torch_copy(idx.astype(dtype))})


@st.composite
def fused_mapping_cases(draw) -> Case:
    """Cases of ``fused_mapping(topk_idx int64 (T, K), num_experts, alignment)``."""
    num_experts, _, idx = draw(_built(routings))
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
def _routed(draw) -> tuple[int, np.ndarray, int, int]:
    """(K, token_topk_to_pos, N, seed) of a drawn routing."""
    num_experts, k, idx = draw(_built(routings))
    seed = draw(_seeds())
    positions, num_rows = build_positions(seed, idx, num_experts, draw(_choice(ALIGNMENTS)),
                                          draw(_choice(POSITION_LAYOUTS)))
    return k, positions, num_rows, seed


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


@st.composite
def expand_to_fused_cases(draw) -> Case:
    """Cases of ``expand_to_fused(x (T, H), token_topk_to_pos, num_expanded_rows)``."""
    _, positions, num_rows, seed = draw(_built(_routed))
    hidden = _hidden_size(draw, num_rows, positions.shape[0])
    dtype = draw(_choice(EXPAND_DTYPES))
    x = tensor_from_bits(keyed_bits(seed, (positions.shape[0], hidden), dtype), dtype)
    return Case(params={"num_expanded_rows": num_rows},
                inputs={"x": x, "token_topk_to_pos": torch_copy(positions)})


@st.composite
def expand_to_fused_with_sf_cases(draw) -> Case:
    """Cases of ``expand_to_fused(x, token_topk_to_pos, num_expanded_rows, x_sf)`` with a quantised x.

    ``sf_layout`` ("row_major" or "tma_column_major") says how x_sf is stored
    for the call; the case holds its logical (T, G) values.
    """
    _, positions, num_rows, seed = draw(_built(_routed))
    num_tokens = positions.shape[0]
    hidden = _hidden_size(draw, num_rows, num_tokens)
    dtype = draw(_choice(QUANTISED_DTYPES))
    sf_dtype = draw(_choice(SF_DTYPES))
    sf_columns = draw(_choice(SF_COLUMNS))
    x = tensor_from_bits(keyed_bits(seed, (num_tokens, hidden), dtype), dtype)
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
    for stream, (name, plant) in enumerate(WEIGHT_FEATURES.items(), start=201):
        if name in features and shape[1] > 0:
            rng = np.random.default_rng([seed, stream])
            rows = _chosen_rows(rng, shape[0], features[name])
            block = w[rows]
            plant(rng, block)
            w[rows] = block
    return w.astype(np.float32)


def _weight_recipe(draw) -> tuple[str, dict[str, str]]:
    base = draw(_choice(tuple(W_BASES)))
    return base, draw(_feature_sets(tuple(WEIGHT_FEATURES), 3))


@st.composite
def normalize_weight_cases(draw) -> Case:
    """Cases of ``normalize_weight(topk_weights f32 (T, K))``."""
    k = draw(_choice(ROUTING_TOPK))
    num_tokens = draw(_tokens())
    base, features = _weight_recipe(draw)
    w = build_weights(draw(_seeds()), (num_tokens, k), base, features)
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
    """A NaN or an infinity (e4m3: NaN) in a row some slot of the token uses."""
    specials = _stored_codes(np.array([np.nan, np.inf, -np.inf]), inputs.dtype)
    for token in tokens:
        slots = inputs.valid_slots(token)
        if slots.size and inputs.codes.shape[1]:
            row = inputs.positions[token, rng.choice(slots)]
            inputs.codes[row, rng.integers(0, inputs.codes.shape[1])] = specials[rng.integers(0, 3)]


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


@st.composite
def reduce_fused_cases(draw) -> Case:
    """Cases of ``reduce_fused(x (N, H), topk_weights (T, K), token_topk_to_pos [, x_sf])``."""
    k, positions, num_rows, seed = draw(_built(_routed))
    hidden = _hidden_size(draw, num_rows, positions.shape[0] * k)
    dtype = draw(_choice(REDUCE_DTYPES))
    x_base = draw(_choice(tuple(X_BASES)))
    w_base, w_features = _weight_recipe(draw)
    features = draw(_feature_sets(tuple(REDUCE_FEATURES), 2))
    inputs = build_reduce_inputs(seed, positions, num_rows, hidden, dtype, x_base, w_base, w_features, features)
    return Case(params={}, inputs=inputs)
