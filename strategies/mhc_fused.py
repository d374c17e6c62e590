"""Strategies for mHC's fused pre-block pieces: `fn_normw_merge_cases`,
`reduce_partials_and_rmsnorm_cases` and `multilayer_recompute_cases`, described where they are
defined.

Sizes follow the mix ops' (strategies/mhc.py): m from 2..8 (4 half the time), M = m (m + 2) rows of
the projection (now and then m alone, the output head's), token counts from 0, 1 and odd counts,
hidden sizes that end in partial 16-byte vectors and tiles.  Features are planted in a subset of the
rows, each from its own random stream, so that shrinking one leaves the others alone.

The partials of `reduce_partials_and_rmsnorm_cases` are built from a residual x and a projection fn
drawn in float64: P_s = x_s fn_s^T and Q_s = sum x_s^2 over S slices of each RMS group, then
rounded to fp32, so that out_mul and sqrsum are what a GEMM would hand over (|out_mul| <=
sqrt(sqrsum) |fn|, sqrsum >= 0).

The ops' own strategies (the gradient checks draw from them too) keep every value finite and every
fp32 intermediate in range; the ``*_extreme_cases`` strategies add overflow and non-finite values
for the forward checks.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from strategies import rarely, seeds
from strategies.classes import draws_rng
from strategies.mhc import BF16_SUBNORMAL, M_VALUES, _bf16, _f32, _nonfinite, _rows, token_counts
from tkverify.case import Case

HIDDEN = (1, 3, 4, 7, 16, 33, 128, 129, 1000)
HIDDEN_LARGE = (4096, 7168)  # cut to MERGE_ELEMENTS / M columns; the GPU tests take the full m H
MERGE_ELEMENTS = 2**14  # M K at most (K lowered to fit): the gradcheck of a case stays under a second
MERGE_VECTOR = 4  # fp32 elements per 16-byte vector (the vectorised kernels' width)
SINGLE_ROW_SHARE = 1 / 3

MERGE_FEATURES = ("ones", "zero_weights", "subnormal", "large")
MERGE_EXTREMES = ("overflow", "nonfinite")
SPLITS = (1, 2, 3, 16)
GROUP_COUNTS = (1, 1, 1, 2, 3)
GROUP_SIZES = (1, 3, 8, 64, 257)
EPS_VALUES = (1e-6, 1e-20, 1e-2)
REDUCE_FEATURES = ("zero_rows", "eps_comparable", "tiny", "large", "cancel")
REDUCE_EXTREMES = ("huge", "nonfinite")
REDUCE_ELEMENTS = 2**17  # N G size values of x at most (N lowered to fit)


def _widths(draw, m: int) -> int:
    """The projection's rows: m (m + 2) (a pre-block), now and then m (the output head's)."""
    return draw(rarely(st.just(m * (m + 2)), st.just(m), one_in=6))


def _single_fn_row(draws: tuple, width: int, k: int) -> tuple[int, int]:
    """(width, k), or in about SINGLE_ROW_SHARE of the cases a single row of fn (M = 1: the contract takes
    any M >= 0, mHC's own M being m (m + 2) or m) with K a whole number of 16-byte vectors or not, the
    case's draws deciding (`draws_rng`, so that they stay as they are): the one-row boundary of the
    vectorised and the scalar kernels, which the drawn M (at least 2) never reaches.  An empty K stays."""
    rng = draws_rng((draws, width, k), 10)
    if k == 0 or rng.random() >= SINGLE_ROW_SHARE:
        return width, k
    if rng.random() < 0.5:
        return 1, -(-k // MERGE_VECTOR) * MERGE_VECTOR
    return 1, min(k | 1, MERGE_ELEMENTS - 1)


def _features(draw, common: tuple[str, ...], extremes: tuple[str, ...], extreme: bool) -> set[str]:
    """Up to three features; with `extreme`, at least one of `extremes` among them."""
    if not extreme:
        return draw(st.sets(st.sampled_from(common), max_size=3))
    return draw(st.sets(st.sampled_from(extremes), min_size=1)) | draw(st.sets(st.sampled_from(common), max_size=2))


@st.composite
def _merge_cases(draw, extreme: bool) -> Case:
    m = draw(rarely(st.just(4), st.sampled_from(M_VALUES), one_in=2))
    width = _widths(draw, m)
    hidden = draw(rarely(st.sampled_from(HIDDEN), st.sampled_from(HIDDEN_LARGE + (0,)), one_in=6))
    k = m * hidden
    if width * k > MERGE_ELEMENTS:
        k = MERGE_ELEMENTS // width
    features = _features(draw, MERGE_FEATURES, MERGE_EXTREMES, extreme)
    magnitude = 2.0 ** draw(st.integers(-4, 4))
    seed = draw(seeds())
    width, k = _single_fn_row((m, hidden, sorted(features), magnitude, seed), width, k)

    rng = np.random.default_rng([seed])
    fn = rng.standard_normal((width, k)) * magnitude
    normw = 1.0 + 0.25 * rng.standard_normal(k)
    for stream, name in enumerate(MERGE_FEATURES + MERGE_EXTREMES, start=1):
        if name not in features or not k:
            continue
        frng = np.random.default_rng([seed, stream])
        cols = frng.random(k) < 0.5
        if name == "ones":
            normw = np.where(cols, 1.0, normw)
        elif name == "zero_weights":
            normw = np.where(cols, frng.choice(np.array([0.0, -0.0]), size=k), normw)
        elif name == "subnormal":
            fn = np.where(cols, frng.integers(-2**12, 2**12, size=fn.shape) * 2.0**-140, fn)
            normw = np.where(cols, np.exp2(-frng.integers(0, 24, size=k)), normw)
        elif name in ("large", "overflow"):
            exponent = 100 if name == "large" else 127
            fn = np.where(cols, frng.uniform(1.0, 1.99, size=fn.shape) * 2.0**exponent, fn)
            normw = np.where(cols, np.where(normw < 0, -1.0, 1.0) * np.maximum(np.abs(normw), 2.0), normw)
        elif name == "nonfinite":
            bad, mask = _nonfinite(frng, fn.shape)
            fn = np.where(mask & (frng.random(fn.shape) < 0.2), bad, fn)
            bad, mask = _nonfinite(frng, normw.shape)
            normw = np.where(mask & (frng.random(k) < 0.2), bad, normw)
    return Case(params={}, inputs={"fn": _f32(fn), "normw": _f32(normw)})


def fn_normw_merge_cases() -> SearchStrategy[Case]:
    """Cases of ``fn_normw_merge(fn fp32 (M, K), normw fp32 (K,))``, K = m H, every value finite.

    Base: fn normal at 2^-4..2^4, normw normal around 1 (RMSNorm weights).  Features: ``ones``
    (normw exactly 1: out_fn is fn), ``zero_weights`` (normw +0 and -0: signed zeros),
    ``subnormal`` (fn and normw whose products fall in fp32's subnormal range or to 0), ``large``
    (|fn| ~ 2^100 with |normw| >= 2: large products short of overflow).  Now and then K = 0
    (empty); in about a third of the cases a single row, M = 1 (`_single_fn_row`).
    """
    return _merge_cases(False)


def fn_normw_merge_extreme_cases() -> SearchStrategy[Case]:
    """fn_normw_merge's cases with ``overflow`` (|fn| ~ 2^127 times |normw| >= 2: the product is inf)
    or ``nonfinite`` (NaN, +-inf in fn and normw; +-0 weights meet them as NaN): forward checks only
    (the gradient checks' finite differences need finite values)."""
    return _merge_cases(True)


def _partials(x: np.ndarray, fn: np.ndarray, splits: int) -> tuple[np.ndarray, np.ndarray]:
    """(P (S, N, G, M), Q (S, N, G)) of x (N, G, size) and fn (M, G, size): each group's values cut
    into S contiguous slices (empty slices give zero partials), in float64."""
    bounds = np.linspace(0, x.shape[-1], splits + 1).round().astype(int)
    p = np.stack([np.einsum("ngk,mgk->ngm", x[..., lo:hi], fn[..., lo:hi]) for lo, hi in zip(bounds, bounds[1:])])
    q = np.stack([(x[..., lo:hi] ** 2).sum(-1) for lo, hi in zip(bounds, bounds[1:])])
    return p, q


@st.composite
def _reduce_cases(draw, extreme: bool) -> Case:
    m = draw(rarely(st.just(4), st.sampled_from(M_VALUES), one_in=2))
    width = _widths(draw, m)
    splits = draw(st.sampled_from(SPLITS))
    groups = draw(st.sampled_from(GROUP_COUNTS))
    size = draw(st.sampled_from(GROUP_SIZES))
    tokens = draw(token_counts())
    if tokens * groups * size > REDUCE_ELEMENTS:
        tokens = max(1, REDUCE_ELEMENTS // (groups * size))
    eps = draw(st.sampled_from(EPS_VALUES))
    features = _features(draw, REDUCE_FEATURES, REDUCE_EXTREMES, extreme)
    magnitude = 2.0 ** draw(st.integers(-4, 4))
    seed = draw(seeds())

    rng = np.random.default_rng([seed])
    x = rng.standard_normal((tokens, groups, size)) * magnitude
    fn = rng.standard_normal((width, groups, size)) / np.sqrt(size)
    planted = {}
    for stream, name in enumerate(REDUCE_FEATURES + REDUCE_EXTREMES, start=1):
        if name not in features or not tokens:
            continue
        frng = np.random.default_rng([seed, stream])
        rows = _rows(frng, 1, tokens)[0]
        planted[name] = (frng, rows)
        if name == "zero_rows":
            x[rows] = 0.0
        elif name == "eps_comparable":
            rms = np.sqrt((x[rows] ** 2).mean(-1, keepdims=True))
            target = np.sqrt(eps * frng.uniform(0.25, 4.0, size=rms.shape))
            x[rows] = x[rows] / np.where(rms > 0, rms, 1.0) * target
        elif name == "tiny":
            x[rows] *= 2.0**-70
        elif name == "large":
            x[rows] *= 2.0**20
        elif name == "huge":
            x[rows] *= 2.0**50
    p, q = _partials(x, fn, splits)
    with np.errstate(over="ignore"):  # "large" and "huge" on one token: its squares overflow to inf (extremes only)
        p, q = p.astype(np.float32).astype(np.float64), q.astype(np.float32).astype(np.float64)
    if "cancel" in planted and splits > 1:
        frng, rows = planted["cancel"]
        first = frng.integers(0, splits - 1)
        p[first + 1, rows] = -p[first, rows] + p[first + 1, rows] * 2.0**-20
    if "nonfinite" in planted:
        frng, rows = planted["nonfinite"]
        bad, mask = _nonfinite(frng, p[:, rows].shape)
        p[:, rows] = np.where(mask & (frng.random(mask.shape) < 0.2), bad, p[:, rows])
        where = frng.random(q[:, rows].shape) < 0.1
        q[:, rows] = np.where(where, frng.choice(np.array([np.nan, np.inf]), size=where.shape), q[:, rows])
    return Case(params={"rms_group_size": size, "rms_eps": eps},
                inputs={"out_mul_splitted": _f32(p), "sqrsum_splitted": _f32(q)})


def reduce_partials_and_rmsnorm_cases() -> SearchStrategy[Case]:
    """Cases of ``reduce_partials_and_rmsnorm(out_mul_splitted (S, N, G, M), sqrsum_splitted (S, N, G),
    rms_group_size, rms_eps)``, every partial finite.

    Partials from x (N, G, size) normal at 2^-4..2^4 and fn (M, G, size) normal / sqrt(size) (module
    docstring); S from 1, 2, 3, 16 (tile-kernels' default split count), G mostly 1.  Features on
    some tokens: ``zero_rows`` (x = 0: out_mul = sqrsum = 0, r = eps^-1/2, out = 0),
    ``eps_comparable`` (sqrsum / size within a factor 4 of eps), ``tiny`` (x ~ 2^-70: partials
    in fp32's subnormal range or 0), ``large`` (x ~ 2^20: r ~ 2^-20, and r^3 stays a normal fp32
    value), ``cancel`` (a split's product partials negated into the next split: out_mul's sum
    cancels to the residue of the others).
    """
    return _reduce_cases(False)


def reduce_partials_and_rmsnorm_extreme_cases() -> SearchStrategy[Case]:
    """The op's cases with ``huge`` (x ~ 2^50: sqrsum near 2^100 size, r ~ 2^-50, whose cube
    underflows fp32) or ``nonfinite`` (NaN, +-inf in out_mul partials, +inf and NaN in sqrsum
    partials): forward checks only."""
    return _reduce_cases(True)


RECOMPUTE_LAYERS = (1, 2, 3, 4)
RECOMPUTE_HIDDEN = (1, 7, 8, 9, 33, 128, 129)
RECOMPUTE_ELEMENTS = 2**15  # N m H at most (N lowered to fit)
RECOMPUTE_FEATURES = ("zero_post", "identity_comb", "huge_mix", "tiny_mix", "subnormal", "nonfinite")


@st.composite
def multilayer_recompute_cases(draw) -> Case:
    """Cases of ``multilayer_recompute(initial_residual bf16 (N, m, H), pre_mix (L, N, m),
    layer_output bf16 (P, N, H), post_mix (P, N, m), comb_mix (P, N, m, m))``, P = L or L - 1.

    Base: the residual and the layer outputs normal at 2^-4..2^4; pre_mix from (0, 1) (a sigmoid's,
    plus eps), post_mix from (0, 2) (post_mult 2), comb_mix from a Sinkhorn-like doubly stochastic
    matrix (rows and columns summing to about 1, so the residual keeps its scale over the layers).
    Features on some tokens of some layers: ``zero_post`` (post_mix +0 and -0: post_mult 0),
    ``identity_comb`` (comb = I: the residual passes through), ``huge_mix`` (mixes of 2^8..2^12 with
    residuals scaled by 2^-40, so that the sums stay far inside bf16's range), ``tiny_mix`` (mixes
    down to 2^-30: products in fp32's subnormal range), ``subnormal`` (bf16 subnormals in the
    residual), ``nonfinite`` (NaN, +-inf in the residual, the layer outputs and the mixes).  N = 0
    now and then (empty batches).
    """
    m = draw(rarely(st.just(4), st.sampled_from(M_VALUES), one_in=2))
    layers = draw(st.sampled_from(RECOMPUTE_LAYERS))
    posts = layers - draw(st.integers(0, 1)) if layers > 1 else draw(st.integers(0, 1))
    hidden = draw(st.sampled_from(RECOMPUTE_HIDDEN))
    tokens = draw(token_counts())
    if tokens * m * hidden > RECOMPUTE_ELEMENTS:
        tokens = max(1, RECOMPUTE_ELEMENTS // (m * hidden))
    features = draw(st.sets(st.sampled_from(RECOMPUTE_FEATURES), max_size=3))
    magnitude = 2.0 ** draw(st.integers(-4, 4))
    seed = draw(seeds())

    rng = np.random.default_rng([seed])
    residual = rng.standard_normal((tokens, m, hidden)) * magnitude
    outputs = rng.standard_normal((posts, tokens, hidden)) * magnitude
    pre = rng.random((layers, tokens, m)) + 1e-6
    post = 2 * rng.random((posts, tokens, m))
    comb = rng.random((posts, tokens, m, m)) + 0.1
    for _ in range(3):  # a few Sinkhorn sweeps: rows and columns near 1
        comb = comb / comb.sum(-1, keepdims=True)
        comb = comb / comb.sum(-2, keepdims=True)
    for stream, name in enumerate(RECOMPUTE_FEATURES, start=1):
        if name not in features or not tokens:
            continue
        frng = np.random.default_rng([seed, stream])
        rows = _rows(frng, 1, tokens)[0]
        if name == "zero_post":
            post[:, rows] = frng.choice(np.array([0.0, -0.0]), size=post[:, rows].shape)
        elif name == "identity_comb":
            comb[:, rows] = np.eye(m)
        elif name == "huge_mix":
            residual[rows] *= 2.0**-40
            outputs[:, rows] *= 2.0**-40
            for mix in (pre, post, comb):
                mix[:, rows] *= np.exp2(frng.integers(8, 13))
        elif name == "tiny_mix":
            for mix in (pre, post, comb):
                mix[:, rows] *= np.exp2(-frng.integers(0, 31, size=mix[:, rows].shape))
        elif name == "subnormal":
            sub = frng.integers(-127, 128, size=residual[rows].shape) * BF16_SUBNORMAL
            residual[rows] = np.where(frng.random(sub.shape) < 0.7, sub, residual[rows])
        elif name == "nonfinite":
            for values, where in ((residual, rows[:, None, None]), (outputs, rows[None, :, None]),
                                  (comb, rows[None, :, None, None])):
                bad, mask = _nonfinite(frng, values.shape)
                values[...] = np.where(where & mask & (frng.random(values.shape) < 0.1), bad, values)
    return Case(params={}, inputs={"initial_residual": _bf16(residual), "pre_mix": _f32(pre),
                                   "layer_output": _bf16(outputs), "post_mix": _f32(post), "comb_mix": _f32(comb)})
