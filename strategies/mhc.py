"""Strategies for the mHC operators: Sinkhorn, and the mix ops (`pre_split_mixes_cases`,
`pre_apply_mix_cases`, `post_cases`, described where they are defined).

Sinkhorn: cases of ``sinkhorn(x, repeat, eps)``.

A case is x fp32 of shape (T, m, m) (now and then (2, T, m, m): any leading
shape is allowed), with params repeat and eps.  Drawn in three layers:

1. static parameters: m from 2..8, repeat from ``REPEATS`` (1..30: one
   normalisation only, a few sweeps, the default 10, and 30), eps from
   ``EPS_VALUES`` (the default 1e-6 first), T from 0, 1 and odd counts; in about a
   third of the cases a single matrix (T = 1) with m <= 4 or m > 4 (``PADDED_ROW_CORNERS``,
   `corner_sizes`: the kernels pad m to 4 or 8);
2. a base: normal logits at a drawn scale 2^-4..2^4;
3. up to four matrix features, each planted in the first, the last, some or
   all matrices: ``saturated`` (one entry per row raised by 80..1000 above
   the rest: the softmax saturates to exact 0 and 1 in fp32 and float64),
   ``equal_rows`` (every row constant: softmax uniform), ``dominant`` (one
   entry per row raised by 8..40, in random columns or all in one column:
   a column of near-eps entries, the badly conditioned case),
   ``near_permutation`` (a permutation matrix times 8..40 plus noise 2^-8:
   Sinkhorn starts almost converged), ``eps_entries`` (half the entries
   lowered by ln(1/eps) +- 2, so that their softmax weight is comparable to
   eps), ``large`` (the whole matrix scaled to magnitudes 2^8..2^10);
4. half the time, ``zeros`` in some matrices (entries -0.0 or +0.0 beside each other, the row maximum a
   tie of the two zeros, and fp32 subnormals; one row all zeros: its softmax uniform).

Every logit is finite and |x| <= ``MAX_LOGIT``: within that the float64
finite differences of the gradient checks resolve the derivative (a step must
exceed float64's resolution of x by far, and stay small against the softmax's
curvature, which is on the scale of 1).  Non-finite entries (NaN, +-inf)
come from `sinkhorn_nonfinite_cases`, which the tests and the forward checks
use; they are kept out of the gradient checks (the op's strategy draws none).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from strategies import rarely, seeds, torch_copy
from strategies.classes import tagging
from strategies.classes import draws_rng, in_turn
from tkverify.case import Case

M_VALUES = tuple(range(2, 9))
REPEATS = (1, 2, 3, 4, 7, 10, 16, 30)
EPS_VALUES = (1e-6, 1e-8, 1e-3)
TOKEN_COUNTS = (0, 1, 3, 5, 7, 9, 17, 33)
MAX_TOKENS = 129
MAX_LOGIT = 2.0**11

FEATURES = ("saturated", "equal_rows", "dominant", "near_permutation", "eps_entries", "large")
SPREADS = ("first", "last", "some", "all")
NONFINITE = ("nan", "pos_inf", "neg_inf", "neg_inf_row")


def token_counts() -> SearchStrategy[int]:
    odd = st.integers(0, MAX_TOKENS // 2).map(lambda n: 2 * n + 1)
    return rarely(st.sampled_from(TOKEN_COUNTS), odd, one_in=8)


def _which(rng: np.random.Generator, tokens: int, spread: str) -> np.ndarray:
    if spread == "all":
        return np.arange(tokens)
    if spread == "first":
        return np.array([0])
    if spread == "last":
        return np.array([tokens - 1])
    some = np.flatnonzero(rng.random(tokens) < 0.3)
    return some if len(some) else rng.integers(0, tokens, size=1)


def _plant(rng: np.random.Generator, x: np.ndarray, feature: str, eps: float) -> None:
    """Plant `feature` in the matrices x (n, m, m) in place."""
    n, m, _ = x.shape
    rows = np.arange(m)
    if feature == "saturated":
        for b in range(n):
            x[b, rows, rng.integers(0, m, size=m)] += rng.choice([80.0, 104.0, 200.0, 1000.0])
    elif feature == "equal_rows":
        x[:] = x[:, :, :1]
    elif feature == "dominant":
        for b in range(n):
            cols = np.full(m, int(rng.integers(0, m))) if rng.random() < 0.5 else rng.integers(0, m, size=m)
            x[b, rows, cols] += rng.uniform(8.0, 40.0)
    elif feature == "near_permutation":
        for b in range(n):
            x[b] = rng.standard_normal((m, m)) * 2.0**-8
            x[b, rows, rng.permutation(m)] += rng.uniform(8.0, 40.0)
    elif feature == "eps_entries":
        low = rng.random(x.shape) < 0.5
        x[low] -= math.log(1.0 / eps) + rng.uniform(-2.0, 2.0, size=int(low.sum()))
    elif feature == "large":
        scale = np.abs(x).max(axis=(-1, -2), keepdims=True)
        x[:] = x / np.where(scale > 0, scale, 1.0) * 2.0 ** rng.uniform(8.0, 10.0, size=(n, 1, 1))
    elif feature == "zeros":
        signed = np.where(rng.random(x.shape) < 0.5, -0.0, 0.0)
        tiny = rng.integers(1, 1 << 23, size=x.shape) * 2.0**-149 * np.where(rng.random(x.shape) < 0.5, -1, 1)
        pick = rng.random(x.shape)
        x[:] = np.where(pick < 0.4, signed, np.where(pick < 0.6, tiny, x))
        x[:, int(rng.integers(0, m))] = signed[:, 0]  # a whole row of zeros
    else:
        raise ValueError(feature)


@st.composite
def _cases(draw, nonfinite: bool) -> Case:
    m = draw(st.sampled_from(M_VALUES))
    repeat = draw(st.sampled_from(REPEATS))
    eps = draw(st.sampled_from(EPS_VALUES))
    tokens = draw(token_counts())
    lead = draw(rarely(st.just(False), st.just(True), one_in=8))
    scale = 2.0 ** draw(st.integers(-4, 4))
    features = draw(st.dictionaries(st.sampled_from(FEATURES), st.sampled_from(SPREADS), max_size=4))
    bad = draw(st.dictionaries(st.sampled_from(NONFINITE), st.sampled_from(SPREADS), min_size=1, max_size=3)) \
        if nonfinite else {}
    seed = draw(seeds())
    zeros = np.random.default_rng([seed, 7]).random() < 0.5  # the seed decides: the other draws stay
    draws = (repeat, eps, lead, scale, sorted(features.items()), sorted(bad.items()), seed)
    (m, _, tokens, _), corner = corner_sizes(draws, (m, 1, tokens, 1), PADDED_ROW_CORNERS)
    lead = lead and corner is None

    rng = np.random.default_rng([seed])
    x = rng.standard_normal((tokens, m, m)) * scale
    for stream, name in enumerate(FEATURES + ("zeros",), start=1):
        if (name in features or (name == "zeros" and zeros)) and tokens:
            frng = np.random.default_rng([seed, stream])
            which = _which(frng, tokens, features.get(name, "some"))
            sub = x[which]
            _plant(frng, sub, name, eps)
            x[which] = sub
    x = np.clip(x, -MAX_LOGIT, MAX_LOGIT)
    for stream, name in enumerate(NONFINITE, start=100):
        if name in bad and tokens:
            frng = np.random.default_rng([seed, stream])
            for b in _which(frng, tokens, bad[name]):
                i, j = int(frng.integers(0, m)), int(frng.integers(0, m))
                if name == "nan":
                    x[b, i, j] = np.nan
                elif name == "pos_inf":
                    x[b, i, j] = np.inf
                elif name == "neg_inf":
                    x[b, i, j] = -np.inf
                else:
                    x[b, i, :] = -np.inf
    x = x.astype(np.float32)
    if lead:
        x = np.concatenate([x, x[::-1]], axis=0).reshape(2, tokens, m, m)
    return Case(params={"repeat": repeat, "eps": eps}, inputs={"x": torch_copy(np.ascontiguousarray(x))})


def sinkhorn_cases() -> SearchStrategy[Case]:
    """Cases of ``sinkhorn(x, repeat, eps)``, all logits finite (the op's strategy)."""
    return _cases(False)


def sinkhorn_nonfinite_cases() -> SearchStrategy[Case]:
    """Cases with NaN, +inf, -inf entries and rows all -inf planted in some matrices."""
    return _cases(True)


# -- the mix operators ---------------------------------------------------------------------
#
# Sizes: m from 2..8 (4 half the time: DeepSeek's), a from {1, 0, 2, 3}, b from the token
# counts (0, 1, odd), H with the tails of 8-element vectors and of tiles (1, 7, 9, 127, 129,
# ...) and now and then a model's 4096 or 7168 (post's CTA-span tails, H = 2056 and 4104, are
# in tests/test_mhc_kernels_gpu.py's grid: here they crowded the planted features out).  a * b * m * H is capped at MIX_ELEMENTS (b is
# lowered to fit) so that a case stays cheap for the CPU and its float64 oracle.  In about a third of
# the cases the drawn sizes are moved to a corner of the kernels' dispatch (`corner_sizes`: a single row
# on the vectorised or the scalar kernels, m padded to 4 or 8), so that every kernel configuration meets
# its one-row and padding boundaries within the ci profile's examples.
#
# Values: features planted in a subset of the (a, b) rows, each from its own random stream
# so that shrinking one leaves the others alone.  Magnitudes are chosen so that no exact sum
# overflows bf16 (rounding to infinity there is a regression case instead,
# tests/regressions/mhc.post-bf16-overflow-to-inf.json): weights are at most 2 in
# magnitude, and wherever bf16's largest values are planted every weight of the row is scaled
# by EXTREME_WEIGHT = 2^-5, so that each term is at most 2^-4 2^128 = 2^124 and the at most 9
# terms of a sum stay below 2^127.2, short of bf16's largest value (~2^128).

MIX_ELEMENTS = 2**18
MIX_VECTOR = 8  # bf16 elements per 16-byte vector (the vectorised kernels' width)
HIDDEN = (1, 7, 8, 9, 16, 31, 33, 127, 128, 129, 255, 1000)
HIDDEN_LARGE = (4096, 4095, 7168, 7169)
LEADING = (1, 0, 2, 3)
POST_MULTS = (2.0, 1.0, 0.0, -1.5, 1e-3, 3.5)
PRE_EPS = (1e-6, 0.0, 1e-2, 1.0)
BF16_MAX = 3.3895313892515355e38  # (2 - 2^-7) 2^127
BF16_SUBNORMAL = 2.0**-133  # bf16's subnormal spacing
EXTREME_WEIGHT = 2.0**-5

SPLIT_FEATURES = ("saturated", "zero_u", "nonfinite", "scale_zero", "subnormal", "huge", "cancel")
NONFINITE_VALUES = np.array([np.nan, np.inf, -np.inf])
APPLY_FEATURES = ("extremes", "subnormal", "cancel", "zero_weights", "nonfinite")
POST_FEATURES = ("extremes", "subnormal", "cancel", "identity_comb", "zero_comb", "zero_post", "nonfinite")


@st.composite
def _mix_sizes(draw, hidden: bool) -> tuple[int, int, int, int]:
    """(m, a, b, H), b lowered so that a b m H <= MIX_ELEMENTS (H = 1 without `hidden`)."""
    m = draw(rarely(st.just(4), st.sampled_from(M_VALUES), one_in=2))
    a = draw(st.sampled_from(LEADING))
    b = draw(token_counts())
    h = draw(rarely(st.sampled_from(HIDDEN), st.sampled_from(HIDDEN_LARGE), one_in=6)) if hidden else 1
    if a * b * m * h > MIX_ELEMENTS:
        b = max(1, MIX_ELEMENTS // (a * m * h))
    return m, a, b, h


@dataclasses.dataclass(frozen=True)
class Corner:
    """A corner of the kernels' dispatch that a strategy plants in some of its cases (`corner_sizes`):
    ``single``, a single row (a = b = 1: the one-token boundary of every kernel); ``vector``, H a
    multiple of 8 (True: 16-byte vectors of bf16, the vectorised kernels) or not (False: the scalar
    ones), None leaving H as drawn; ``m``, the stream counts m is taken from (the kernels unroll their
    loops over m to 4 or 8 streams, so that m short of either pads them), empty leaving m as drawn."""

    single: bool = False
    vector: bool | None = None
    m: tuple[int, ...] = ()


CORNER_STREAM = 10


def corner_sizes(draws: tuple, sizes: tuple[int, int, int, int], corners: tuple[Corner, ...],
                 share: float = 1 / 3) -> tuple[tuple[int, int, int, int], Corner | None]:
    """(sizes (m, a, b, H), None), or in about `share` of the cases one of `corners` applied to the sizes
    and that corner, the case's draws (`draws`, with the sizes) deciding which (`draws_rng`): the ci
    profile's few examples draw a and b from the first sizes, many empty and few a single row, and m and
    H independently of them, so that a kernel configuration (by m's padding and the vector width) seldom
    met its one-row boundary.  b is lowered again so that a b m H <= MIX_ELEMENTS."""
    rng = draws_rng((draws, sizes), CORNER_STREAM)
    if rng.random() >= share:
        return sizes, None
    corner = corners[int(rng.integers(0, len(corners)))]
    m, a, b, h = sizes
    if corner.single:
        a, b = 1, 1
    if corner.m:
        m = int(rng.choice(corner.m))
    if corner.vector is True:
        h = -(-h // MIX_VECTOR) * MIX_VECTOR
    elif corner.vector is False and h % MIX_VECTOR == 0:
        h += 1
    if a * b * m * h > MIX_ELEMENTS:
        b = max(1, MIX_ELEMENTS // (a * m * h))
    return (m, a, b, h), corner


# The corners each mix strategy plants: a single row on the vectorised and the scalar kernels; post's
# vectorised kernels at m padded to 4 (m 2, 3: one row) and to 8 (m 5 .. 7: its backward's gradient
# checks); a single row (one token, one matrix) with m padded to 4 and to 8 (pre_split_mixes' backward,
# Sinkhorn's).
VECTOR_ROW_CORNERS = (Corner(single=True, vector=True), Corner(single=True, vector=False))
POST_CORNERS = (Corner(single=True, vector=True, m=(2, 3)), Corner(vector=True, m=(5, 6, 7)),
                Corner(single=True, vector=True, m=(5, 6, 7)))
PADDED_ROW_CORNERS = (Corner(single=True, m=(2, 3, 4)), Corner(single=True, m=(5, 6, 7, 8)))


def _rows(rng: np.random.Generator, a: int, b: int) -> np.ndarray:
    """A bool (a, b) mask of the rows a feature goes to: all, one, or about a third."""
    kind = rng.integers(0, 3)
    if kind == 0:
        return np.ones((a, b), dtype=bool)
    mask = rng.random((a, b)) < 0.3 if kind == 2 else np.zeros((a, b), dtype=bool)
    if a * b:
        mask.flat[rng.integers(0, a * b)] = True
    return mask


def _nonfinite(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """NaN where NaN, +inf, -inf are planted (about one entry in four), else 0; a mask of where."""
    where = rng.random(shape) < 0.25
    values = rng.choice(np.array([np.nan, np.inf, -np.inf]), size=shape)
    return np.where(where, values, 0.0), where


def _bf16(values: np.ndarray) -> torch.Tensor:
    """bf16 rounded from float64 through fp32: exact for every value planted here (all are bf16 values or
    normal draws, for which the double rounding is immaterial)."""
    return torch_copy(np.ascontiguousarray(values, dtype=np.float32)).to(torch.bfloat16)


def _f32(values: np.ndarray) -> torch.Tensor:
    return torch_copy(np.ascontiguousarray(values, dtype=np.float32))


def _extreme_values(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """bf16's largest and smallest normal values, subnormals, zeros, each signed."""
    choices = np.array([BF16_MAX, 2.0**-126, BF16_SUBNORMAL, 127 * BF16_SUBNORMAL, 0.0, 2.0**120])
    return rng.choice(choices, size=shape) * rng.choice(np.array([1.0, -1.0]), size=shape)


@st.composite
def pre_split_mixes_cases(draw) -> Case:
    """Cases of ``pre_split_mixes(mixes, scale, base, m, post_mult, pre_eps)``.

    Base: mixes normal at a drawn scale 2^-4..2^4, scale entries in +-[1/4, 4], base normal.
    Features: ``saturated`` (|mixes| 400..2e4: |u| far beyond 90, the sigmoid exactly 0 or 1 in
    fp32), ``zero_u`` (u exactly 0: base = -mixes * s with few-bit operands, or mixes and base
    0), ``nonfinite`` (NaN, +-inf in mixes; now and then in base), ``scale_zero`` (a scale entry
    0: inf * 0 = NaN), ``subnormal`` (mixes and base fp32 subnormals: u and the products in the
    subnormal range), ``huge`` (|mixes| ~ 2^126 with |scale| >= 2: the product overflows fp32, a
    fused multiply-add may not), ``cancel`` (base = -RN(mixes * s) in some entries: u is the
    product's rounding error, which an fma keeps and a product-then-sum loses).  Besides the drawn
    features, the seed decides (so that the other draws stay as they are) ``nonfinite`` in half the
    cases, and in half ``signed_zeros`` (base entries -0.0 and +0.0 beside each other: u is mixes * s
    exactly, and 0 of either sign where mixes * s is 0): the ci profile's few examples draw small
    feature sets, which left the non-finite and signed-zero classes undrawn.
    """
    sizes = draw(_mix_sizes(False))
    post_mult = draw(st.sampled_from(POST_MULTS))
    pre_eps = draw(st.sampled_from(PRE_EPS))
    features = draw(st.sets(st.sampled_from(SPLIT_FEATURES), max_size=3))
    magnitude = 2.0 ** draw(st.integers(-4, 4))
    seed = draw(seeds())
    decide = np.random.default_rng([seed, 9]).random(2)  # the seed decides: the other draws stay
    features |= {name for name, u in zip(("nonfinite", "signed_zeros"), decide) if u < 0.5}
    draws = (post_mult, pre_eps, sorted(features), magnitude, seed)
    (m, a, b, _), _ = corner_sizes(draws, sizes, PADDED_ROW_CORNERS)
    width = m * (m + 2)

    rng = np.random.default_rng([seed])
    mixes = rng.standard_normal((a, b, width)) * magnitude
    scale = rng.uniform(0.25, 4.0, size=3) * rng.choice(np.array([1.0, -1.0]), size=3)
    base = rng.standard_normal(width)
    s = np.repeat(scale, [m, m, m * m])
    for stream, name in enumerate(SPLIT_FEATURES + ("signed_zeros",), start=1):
        if name not in features:
            continue
        frng = np.random.default_rng([seed, stream])
        rows = _rows(frng, a, b)
        cols = frng.random(width) < 0.5
        where = rows[..., None] & cols
        if name == "saturated":
            mixes = np.where(where, frng.uniform(400, 2e4, size=mixes.shape) * np.sign(frng.standard_normal(mixes.shape)), mixes)
        elif name == "zero_u":
            scale = np.exp2(np.round(np.log2(np.abs(scale)))) * np.sign(scale)  # powers of two
            s = np.repeat(scale, [m, m, m * m])
            c = frng.integers(-8, 9, size=width) / 8.0
            mixes = np.where(where, c, mixes)
            base = np.where(cols, -c * s, base)
        elif name == "nonfinite":  # about a quarter of the rows' entries, each of NaN, +inf, -inf in turn
            which = np.full(mixes.shape, -1)
            which[rows] = in_turn(frng, mixes[rows].shape, 0.25, len(NONFINITE_VALUES))
            mixes = np.where(which >= 0, NONFINITE_VALUES[np.maximum(which, 0)], mixes)
            if frng.random() < 0.2:
                base[frng.integers(0, width)] = frng.choice(np.array([np.nan, np.inf, -np.inf]))
        elif name == "scale_zero":
            scale[frng.integers(0, 3)] = 0.0
            s = np.repeat(scale, [m, m, m * m])
        elif name == "subnormal":
            tiny = frng.integers(-2**23, 2**23, size=mixes.shape) * 2.0**-149
            mixes = np.where(where, tiny, mixes)
            base = np.where(cols, frng.integers(-2**10, 2**10, size=width) * 2.0**-149, base)
        elif name == "huge":
            scale = np.sign(scale + 0.0) * np.maximum(np.abs(scale), 2.0)
            s = np.repeat(scale, [m, m, m * m])
            mixes = np.where(where, frng.uniform(1.0, 1.99, size=mixes.shape) * 2.0**126
                             * np.sign(frng.standard_normal(mixes.shape)), mixes)
        elif name == "cancel" and a * b:
            first = tuple(np.argwhere(rows)[0])
            row = np.float32(mixes[first])
            with np.errstate(over="ignore", invalid="ignore"):
                product = (row * np.float32(s)).astype(np.float64)  # RN32(mixes * s), per entry
            base = np.where(cols & np.isfinite(product), -product, base)
            mixes = np.where(where, row, mixes)
        elif name == "signed_zeros":  # about a quarter of base's entries, -0.0 and +0.0 in turn
            zero = in_turn(frng, base.shape, 0.25, 2)
            base = np.where(zero >= 0, np.where(zero == 0, -0.0, 0.0), base)
    case_inputs = {"mixes": _f32(mixes), "scale": _f32(scale), "base": _f32(base)}
    return Case(params={"m": m, "post_mult": post_mult, "pre_eps": pre_eps}, inputs=case_inputs)


def _weights(rng: np.random.Generator, shape: tuple[int, ...], kind: int) -> np.ndarray:
    """Mixing weights with |w| <= 2: a sigmoid's (0, 1), post's (0, 2), or signed +-1."""
    if kind == 0:
        return rng.random(shape)
    if kind == 1:
        return 2 * rng.random(shape)
    return rng.uniform(-1.0, 1.0, size=shape)


def _values(rng: np.random.Generator, shape: tuple[int, ...], magnitude: float) -> np.ndarray:
    return rng.standard_normal(shape) * magnitude


def _plant_rows(rng, rows: np.ndarray, x: np.ndarray, weights: list[np.ndarray], name: str) -> None:
    """Features common to pre_apply_mix and post on stacked rows x (a, b, R, H) weighted by
    `weights` ((a, b, ...) arrays whose first dims are a, b), in place."""
    sel = rows
    if name == "extremes":
        x[sel] = np.where(rng.random(x[sel].shape) < 0.5, _extreme_values(rng, x[sel].shape), x[sel])
        for w in weights:
            w[sel] *= EXTREME_WEIGHT
    elif name == "subnormal":
        sub = rng.integers(-127, 128, size=x[sel].shape) * BF16_SUBNORMAL
        x[sel] = np.where(rng.random(x[sel].shape) < 0.7, sub, x[sel])
        for w in weights:
            w[sel] *= np.exp2(-rng.integers(0, 30, size=w[sel].shape))
    elif name == "nonfinite":
        bad, mask = _nonfinite(rng, x[sel].shape)
        x[sel] = np.where(mask & (rng.random(x[sel].shape) < 0.1), bad, x[sel])
        for w in weights:
            bad, mask = _nonfinite(rng, w[sel].shape)
            w[sel] = np.where(mask & (rng.random(w[sel].shape) < 0.3), bad, w[sel])


@st.composite
def pre_apply_mix_cases(draw) -> Case:
    """Cases of ``pre_apply_mix(x bf16 (a, b, m, H), mix f32 (a, b, m, 1))``.

    Base: x normal at 2^-4..2^4, mix from (0, 1) (a sigmoid's), (0, 2) or +-1.  Features:
    ``extremes`` (bf16's largest and smallest values, subnormals and zeros in x, every weight
    scaled by 2^-5), ``subnormal`` (bf16 subnormals times weights down to 2^-30: products in fp32's
    subnormal range), ``cancel`` (rows in equal pairs with opposite weights: for even m the exact
    sum is 0 and fp32 may leave a residue within the bound), ``zero_weights`` (0 and -0 weights,
    which meet infinities as NaN), ``nonfinite`` (NaN, +-inf in x and mix); and half the time
    ``signed_zeros`` (x elements -0.0 or +0.0 beside each other: a sum of only -0.0 terms is -0.0, one
    +0.0 makes it +0.0).
    """
    sizes = draw(_mix_sizes(True))
    features = draw(st.sets(st.sampled_from(APPLY_FEATURES), max_size=3))
    magnitude = 2.0 ** draw(st.integers(-4, 4))
    kind = draw(st.integers(0, 2))
    seed = draw(seeds())
    if np.random.default_rng([seed, 9]).random() < 0.5:  # the seed decides: the other draws stay
        features.add("signed_zeros")
    (m, a, b, h), _ = corner_sizes((sorted(features), magnitude, kind, seed), sizes, VECTOR_ROW_CORNERS)

    rng = np.random.default_rng([seed])
    x = _values(rng, (a, b, m, h), magnitude)
    mix = _weights(rng, (a, b, m, 1), kind)
    for stream, name in enumerate(APPLY_FEATURES + ("signed_zeros",), start=1):
        if name not in features or not a * b:
            continue
        frng = np.random.default_rng([seed, stream])
        rows = _rows(frng, a, b)
        if name == "cancel":
            pairs = np.arange(m // 2) * 2
            x[:, :, pairs + 1] = np.where(rows[..., None, None], x[:, :, pairs], x[:, :, pairs + 1])
            mix[:, :, pairs + 1] = np.where(rows[..., None, None], -mix[:, :, pairs], mix[:, :, pairs + 1])
        elif name == "zero_weights":
            zero = rows[..., None, None] & (frng.random(mix.shape) < 0.5)
            mix = np.where(zero, frng.choice(np.array([0.0, -0.0]), size=mix.shape), mix)
        elif name == "signed_zeros":
            zero = rows[..., None, None] & (frng.random(x.shape) < 0.5)
            x = np.where(zero, frng.choice(np.array([0.0, -0.0]), size=x.shape), x)
        else:
            _plant_rows(frng, rows, x, [mix], name)
    return Case(params={}, inputs={"x": _bf16(x), "mix": _f32(mix)})


@st.composite
def post_cases(draw) -> Case:
    """Cases of ``post(x bf16 (a, b, H), residual bf16 (a, b, m, H), post f32 (a, b, m, 1),
    comb f32 (a, b, m, m))``.

    Base: x and residual normal at 2^-4..2^4, post from (0, 2) (sigmoid * 2) or +-1, comb from
    (0, 1) or +-1.  Features: ``extremes``, ``subnormal`` and ``nonfinite`` as for
    pre_apply_mix (on x and residual, scaling post and comb); ``cancel`` (residual rows in equal
    pairs with opposite comb weights, and x equal to residual row 0 with post = -comb[0, n]: the
    exact sum is 0 for even m); ``identity_comb`` (comb = I: out_n = x post_n + residual_n),
    ``zero_comb`` (comb entries 0 and -0), ``zero_post`` (post 0 and -0).  Half the empty cases become a
    single row, a = b = 1, the seed deciding (so that the other draws stay as they are): the ci
    profile's examples draw a and b from the first sizes, many empty and none a single row.
    """
    m, a, b, h = draw(_mix_sizes(True))
    features = draw(st.sets(st.sampled_from(POST_FEATURES), max_size=3))
    magnitude = 2.0 ** draw(st.integers(-4, 4))
    kinds = draw(st.tuples(st.sampled_from((1, 2)), st.sampled_from((0, 2))))
    seed = draw(seeds())
    if a * b == 0 and np.random.default_rng([seed, 8]).random() < 0.5:  # the seed decides: other draws stay
        a, b = 1, 1
    (m, a, b, h), _ = corner_sizes((sorted(features), magnitude, kinds, seed), (m, a, b, h), POST_CORNERS)

    rng = np.random.default_rng([seed])
    rows_x = _values(rng, (a, b, m + 1, h), magnitude)  # residual rows, then x as row m
    post = _weights(rng, (a, b, m, 1), kinds[0])
    comb = _weights(rng, (a, b, m, m), kinds[1])
    for stream, name in enumerate(POST_FEATURES, start=1):
        if name not in features or not a * b:
            continue
        frng = np.random.default_rng([seed, stream])
        rows = _rows(frng, a, b)
        r4 = rows[..., None, None]
        if name == "cancel":
            pairs = np.arange(m // 2) * 2
            rows_x[:, :, pairs + 1] = np.where(r4, rows_x[:, :, pairs], rows_x[:, :, pairs + 1])
            comb[:, :, pairs + 1, :] = np.where(r4, -comb[:, :, pairs, :], comb[:, :, pairs + 1, :])
            if m % 2:  # the odd residual row cancels against x
                rows_x[:, :, m] = np.where(rows[..., None], rows_x[:, :, m - 1], rows_x[:, :, m])
                post[..., 0] = np.where(rows[..., None], -comb[:, :, m - 1, :], post[..., 0])
        elif name == "identity_comb":
            comb = np.where(r4, np.eye(m), comb)
        elif name == "zero_comb":
            comb = np.where(r4 & (frng.random(comb.shape) < 0.5), frng.choice(np.array([0.0, -0.0]), size=comb.shape), comb)
        elif name == "zero_post":
            post = np.where(r4, frng.choice(np.array([0.0, -0.0]), size=post.shape), post)
        else:
            _plant_rows(frng, rows, rows_x, [post, comb], name)
    inputs = {"x": _bf16(rows_x[:, :, m]), "residual": _bf16(rows_x[:, :, :m]), "post": _f32(post), "comb": _f32(comb)}
    return Case(params={}, inputs=inputs)


# The classes each strategy reaches under the ci profile (tests/test_classes.py), as tkverify/specs/mhc.py lists.
sinkhorn_cases = tagging("x", (
    'empty', 'neg_zero:x', 'non_pow2', 'signed_zero_tie:x', 'subnormal:x', 'zero_row:x',
))(sinkhorn_cases)
pre_split_mixes_cases = tagging("mixes", (
    'empty', 'nan:mixes', 'neg_inf:mixes', 'neg_zero:base', 'non_pow2',
    'pos_inf:mixes', 'signed_zero_tie:base', 'subnormal:base', 'subnormal:mixes',
))(pre_split_mixes_cases)
pre_apply_mix_cases = tagging("x", (
    'empty', 'neg_zero:mix', 'neg_zero:x', 'non_pow2', 'signed_zero_tie:x', 'subnormal:x', 'zero_row:mix',
))(pre_apply_mix_cases)
post_cases = tagging("x", (
    'dtype_max:residual', 'dtype_max:x', 'empty', 'neg_zero:comb', 'neg_zero:residual',
    'neg_zero:x', 'non_pow2', 'signed_zero_tie:comb', 'signed_zero_tie:residual', 'signed_zero_tie:x',
    'single_row', 'subnormal:residual', 'subnormal:x', 'zero_row:comb',
))(post_cases)
