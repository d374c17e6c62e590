"""Strategies for moe.topk_gate: score matrices aimed at the total order's edges.

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

from collections.abc import Callable

import numpy as np
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from strategies import rarely, seeds, torch_copy
from strategies.classes import draws_rng, tagging
from tkverify.case import Case

# Static parameters: E and k select a compiled kernel.  E covers 1..1024 with
# values on and off the 32-lane warp width, grouped by the lanes a row is padded
# to (the gates' configurations: 32, 64, ..., 1024), each group with a count
# short of its width (padded lanes); k stays <= 32 and <= E.
EXPERTS_BY_WIDTH = ((1, 2, 7, 31), (33, 64), (100,), (255, 256), (384,), (1000, 1024))
EXPERT_COUNTS = tuple(e for counts in EXPERTS_BY_WIDTH for e in counts)
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


@st.composite
def expert_counts(draw) -> int:
    """E: a padded width (`EXPERTS_BY_WIDTH`), each as often as the others, then an expert count of it."""
    return draw(st.sampled_from(draw(st.sampled_from(EXPERTS_BY_WIDTH))))


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
    """+0.0 and -0.0 in one row, which must tie; half the time every other score is made negative so the zeros
    lead, and a quarter of the time the whole row is zeros of both signs (every score tied)."""
    num_rows, num_experts = rows.shape
    counts = rng.integers(min(2, num_experts), min(num_experts, k + 2), size=num_rows, endpoint=True)
    if rng.random() < 0.25:
        counts[:] = num_experts
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


def plant_features(values: np.ndarray, seed: int, features: dict[str, str], table: dict[str, Callable[..., None]],
                   first_stream: int, *args: object) -> None:
    """Plant each drawn feature of `table` into `values` (rows first) in place: ``features`` maps a feature's
    name to its row spread (`ROW_SPREADS`), and ``table[name](rng, rows, *args)`` changes the chosen rows.
    Each feature draws from a stream of its own, ``[seed, first_stream + its place in table]``, so that
    dropping another feature or shrinking T while shrinking leaves its draws alone."""
    for stream, (name, plant) in enumerate(table.items(), start=first_stream):
        if name in features:
            rng = np.random.default_rng([seed, stream])
            rows = _chosen_rows(rng, values.shape[0], features[name])
            block = values[rows]
            plant(rng, block, *args)
            values[rows] = block


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
    plant_features(scores, seed, features, FEATURES, 1, k)
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
    draws = (num_experts, k, num_tokens, base, sorted(features.items()), pinned, seed)
    corner = single_row_corner(draws) if num_tokens else None  # (empty batches stay empty)
    if corner is not None:
        num_experts, k, num_tokens, pinned = corner, _topk_within(k, corner), 1, _on_one_row(pinned, corner)
    scores = build_scores(seed, num_tokens, num_experts, k, base, features, pinned)
    plant_nan_after_inf(scores, draws)
    return Case(params={"k": k}, inputs={"scores": torch_copy(scores)})


# The share of topk_gate's cases moved to a single row of a padded width (`single_row_corner`).
SINGLE_ROW_SHARE = 2 / 3
SINGLE_ROW_STREAM = 25


def single_row_corner(draws: tuple) -> int | None:
    """In about SINGLE_ROW_SHARE of the cases (the case's draws deciding, `strategies.classes.draws_rng`, so
    that the draws stay as they are), the expert count of a single-row case: a count short of one of the
    padded widths (`EXPERTS_BY_WIDTH`, each width as often as the others), so that each width's kernel meets
    one row and lanes past E; None otherwise.  The drawn counts seldom give T = 1, and the counts short of
    the wider widths come one case in twelve."""
    rng = draws_rng(draws, SINGLE_ROW_STREAM)
    if rng.random() >= SINGLE_ROW_SHARE:
        return None
    counts = EXPERTS_BY_WIDTH[int(rng.integers(0, len(EXPERTS_BY_WIDTH)))]
    padded = [e for e in counts if e < max(32, 1 << (e - 1).bit_length())]  # short of the width
    return int(padded[int(rng.integers(0, len(padded)))])


def _topk_within(k: int, num_experts: int) -> int:
    """The largest of TOPK_VALUES up to k that fits E (k itself where it does)."""
    return max(v for v in TOPK_VALUES if v <= min(k, num_experts))


def _on_one_row(pinned: list[tuple[int, int, float]], num_experts: int) -> list[tuple[int, int, float]]:
    """The pinned values of a case moved to one row of E columns (each column folded onto one of E)."""
    return [(0, column % num_experts, value) for _, column, value in pinned]


# The share of topk_gate's cases with a +inf and, at a higher index of the same row, a NaN (`plant_nan_after_inf`).
NAN_AFTER_INF_SHARE = 1 / 3


def plant_nan_after_inf(scores: np.ndarray, draws: tuple) -> None:
    """In about NAN_AFTER_INF_SHARE of the cases (the case's draws deciding, `strategies.classes.draws_rng`), one
    row gets a +inf and, at a higher index, a NaN: the total order ranks the NaN first, a top-k that lets NaN tie
    with +inf (the lower index winning) puts the +inf first.  The drawn rows of NaNs straddle the cut and
    +inf pins land at random places; both together with the +inf at the lower index came too seldom in the
    ci profile's 30 examples to catch that tie."""
    num_tokens, num_experts = scores.shape
    if num_tokens == 0 or num_experts < 2:
        return
    rng = draws_rng(draws, NAN_AFTER_INF_STREAM)
    if rng.random() >= NAN_AFTER_INF_SHARE:
        return
    row = int(rng.integers(0, num_tokens))
    inf_col, nan_col = sorted(rng.choice(num_experts, size=2, replace=False).tolist())
    scores[row, inf_col] = np.inf
    scores[row, nan_col] = np.nan


NAN_AFTER_INF_STREAM = 23


# The classes the strategy reaches under the ci profile (tests/test_classes.py), as tkverify/specs/moe.py lists.
topk_gate_cases = tagging("scores", (
    'dtype_max:scores', 'empty', 'nan:scores', 'nan_payload:scores', 'neg_inf:scores',
    'neg_zero:scores', 'non_pow2', 'pos_inf:scores', 'signed_zero_tie:scores', 'subnormal:scores',
    'zero_row:scores',
))(topk_gate_cases)
