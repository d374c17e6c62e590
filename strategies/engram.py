"""Strategies for Engram gating: cases of ``engram_gate_fwd(x, k, v, w, eps, clamp)``; and, at the end
of the module, of fused_weight and grad_w_reduce (the n-gram hash: strategies/engram_hash.py).

A case is drawn in four layers, each a few hypothesis choices:

1. static parameters: H from a small set (64 and 128 mostly, DeepSeek's 7168
   about once in eight cases), hc from 1 to 8, eps and the clamp c from small
   sets (the default c = 1e-6 first), and T (0, 1, small odd counts and tails,
   capped so that T hc H stays under ``MAX_ELEMENTS`` for CPU time, but one
   token always fits); in about half the non-empty cases one of ``CORNERS``
   (`_corner`): a single token, or a single token of H for the mid-size or
   widest kernels, whose rows are small integers (`_exact_row`: no features);
2. a base distribution for x, k, v (normal at a drawn scale, log-uniform
   magnitudes over 2^-30..2^30, or small integers) and for w (normal, or
   positive like a product of norm weights);
3. up to five row features, each planted in the first, last, some or all rows
   (t, h): rows where eps dominates the mean of squares (rms of x or k at
   sqrt(eps) times 2^-16..2^3) or which are all zero; k nearly parallel to x
   (k = +-2^j x plus noise 2^-12 relative); x nearly orthogonal to w k (its
   projection on w k removed before rounding to bf16, so d cancels to a few
   bf16 ULPs); bf16 subnormals scattered in x, k and v; extremes (|v| up to
   the largest bf16, |x|, |k| up to 2^40, the edge of the judged domain);
4. per head, the gate argument z of one token (the first, the last, or one at
   random) planted relative to the clamp by scaling that head's w (z is linear
   in w): below c (0 < |z| < c, where the gradient through d is zero), at c,
   just above (c (1 + 2^-j), j in 6, 12, 20), or far from it; the planted row
   lands within an fp32 rounding of its target.  Its sign is drawn too.

Everything stays inside the spec's judged domain (|x|, |k| <= 2^40, |w| <=
2^32); NaN and infinite inputs are not drawn.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import event, strategies as st
from hypothesis.strategies import SearchStrategy

from strategies import rarely, seeds, torch_copy
from strategies.classes import draws_rng
from tkverify.case import Case

HIDDEN_SIZES = (64, 128)
LARGE_HIDDEN = 7168
MAX_HEADS = 8
EPS_VALUES = (1e-6, 1e-5, 1e-2)
CLAMP_VALUES = (1e-6, 1e-3)
TOKEN_TAILS = (1, 2, 3, 5, 7, 9, 17, 31, 33, 63, 65)
LARGEST_TOKENS = 257
MAX_ELEMENTS = 2**15  # T * hc * H of one case (CPU time); one token always fits

MAX_INPUT = 2.0**40  # |x|, |k| (the spec's judged domain)
MAX_SCALE_W = 2.0**24  # how far planting z may scale a head's w
MAX_W = 2.0**32  # |w| (the spec's judged domain)
BF16_MAX = float(torch.finfo(torch.bfloat16).max)
BF16_MIN_SUBNORMAL = 2.0**-133
BF16_MIN_NORMAL = 2.0**-126

# Corners of the kernels' dispatch, taken in about CORNER_SHARE of the non-empty cases, the case's draws
# deciding which (`_corner`): a single token (the 128-thread kernel's single row); H of the mid-size kernels
# (rows of 1025 .. 4096 elements: the forward's 256 threads x 2 chunks, the backward's 512 threads with v
# copied once) or of the widest (4097 .. 7168: 896 threads), each with a single token.
CORNERS = ("single_token", "mid_hidden", "wide_hidden")
CORNER_SHARE = 1 / 2
CORNER_STREAM = 17
CORNER_HIDDEN = {"mid_hidden": (1032, 4096), "wide_hidden": (4104, LARGE_HIDDEN)}
CORNER_MAX_HEADS = 1  # hc of a mid or wide corner (CPU time: the gradient checks' float64 oracle)

ROW_SPREADS = ("first", "last", "some", "all")
Z_TARGETS = ("below", "at", "just_above", "far")


def token_counts() -> SearchStrategy[int]:
    common = st.one_of(st.sampled_from((0, *TOKEN_TAILS)), st.integers(0, 12))
    odd = st.integers(0, LARGEST_TOKENS // 2).map(lambda n: 2 * n + 1)
    return rarely(common, odd, one_in=16)


def hidden_sizes() -> SearchStrategy[int]:
    return rarely(st.sampled_from(HIDDEN_SIZES), st.just(LARGE_HIDDEN), one_in=8)


# -- base distributions -----------------------------------------------------------------


def _base(rng: np.random.Generator, kind: str, shape: tuple[int, ...], scale: float) -> np.ndarray:
    if kind == "normal":
        return rng.standard_normal(shape) * scale
    if kind == "wide":  # log-uniform magnitudes, random signs
        mags = np.exp2(rng.uniform(-30, 30, size=shape))
        return np.where(rng.random(shape) < 0.5, -mags, mags)
    if kind == "integers":
        return rng.integers(-4, 4, size=shape, endpoint=True).astype(np.float64)
    raise ValueError(kind)


BASES = ("normal", "wide", "integers")
W_BASES = ("normal", "positive")


def _weights(rng: np.random.Generator, kind: str, shape: tuple[int, int], scale: float) -> np.ndarray:
    w = rng.standard_normal(shape) * scale
    return np.abs(w) + 0.25 * scale if kind == "positive" else w


# -- row features ---------------------------------------------------------------------


def _rows(rng: np.random.Generator, tokens: int, heads: int, spread: str) -> tuple[np.ndarray, np.ndarray]:
    """(token, head) indices of the rows a feature goes to."""
    every = np.stack(np.meshgrid(np.arange(tokens), np.arange(heads), indexing="ij"), -1).reshape(-1, 2)
    if tokens == 0 or spread == "all":
        return every[:, 0], every[:, 1]
    if spread == "first":
        return np.array([0]), np.array([int(rng.integers(0, heads))])
    if spread == "last":
        return np.array([tokens - 1]), np.array([int(rng.integers(0, heads))])
    some = every[rng.random(len(every)) < 0.25]
    if not len(some):
        some = every[rng.integers(0, len(every), size=1)]
    return some[:, 0], some[:, 1]


def _rescale_rows(rng, a: np.ndarray, t: np.ndarray, h: np.ndarray, eps: float) -> None:
    """Rows to rms sqrt(eps) 2^j: eps dominates (j << 0), matches, or is matched (j ~ 0..3)."""
    rows = a[t, h]
    rms = np.sqrt((rows * rows).mean(-1, keepdims=True))
    rms = np.where(rms > 0, rms, 1.0)
    j = rng.choice(np.array([-16, -8, -4, -1, 0, 1, 3]), size=(len(t), 1))
    a[t, h] = rows / rms * math.sqrt(eps) * np.exp2(j)


def _parallel(rng, x: np.ndarray, k: np.ndarray, t, h) -> None:
    sign = np.where(rng.random((len(t), 1)) < 0.5, -1.0, 1.0)
    scale = np.exp2(rng.integers(-4, 4, size=(len(t), 1), endpoint=True))
    noise = rng.standard_normal(x[t, h].shape) * np.abs(x[t, h]) * 2.0**-12
    k[t, h] = sign * scale * x[t, h] + noise


def _orthogonal(x: np.ndarray, k: np.ndarray, w: np.ndarray, t, h) -> None:
    """x minus its projection on w k, so that d = sum x w k cancels."""
    wk = w[h] * k[t, h]
    norm = (wk * wk).sum(-1, keepdims=True)
    coef = np.where(norm > 0, (x[t, h] * wk).sum(-1, keepdims=True) / np.where(norm > 0, norm, 1.0), 0.0)
    x[t, h] = x[t, h] - coef * wk


def _subnormals(rng, a: np.ndarray, fraction: float) -> None:
    where = rng.random(a.shape) < fraction
    mags = rng.integers(1, 128, size=a.shape) * BF16_MIN_SUBNORMAL
    a[where] = np.where(rng.random(a.shape) < 0.5, -mags, mags)[where]


def _extremes(rng, x: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    for a, top in ((x, MAX_INPUT), (k, MAX_INPUT), (v, BF16_MAX)):
        where = rng.random(a.shape) < 0.02
        mags = np.where(rng.random(a.shape) < 0.5, top, top * 2.0**-rng.integers(1, 20, size=a.shape))
        a[where] = np.where(rng.random(a.shape) < 0.5, -mags, mags)[where]


ROW_FEATURES = ("eps_x", "eps_k", "zero_x", "zero_k", "parallel", "orthogonal")
TENSOR_FEATURES = ("subnormals", "extremes")


def _bf16(a: np.ndarray) -> torch.Tensor:
    """Round float64 values to bf16 (magnitudes kept within the finite range)."""
    a = np.clip(a, -BF16_MAX, BF16_MAX)
    return torch_copy(a.astype(np.float32)).to(torch.bfloat16)


def _z_of(x: torch.Tensor, k: torch.Tensor, w: np.ndarray, eps: float, t: int, h: int) -> float:
    xr = x[t, h].double().numpy()
    kr = k[t, h].double().numpy()
    hidden = xr.shape[-1]
    d = float((xr * w[h] * kr).sum())
    return d / math.sqrt((xr * xr).mean() + eps) / math.sqrt((kr * kr).mean() + eps) / math.sqrt(hidden)


def _plant_z(rng, x: torch.Tensor, k: torch.Tensor, w: np.ndarray, eps: float, clamp: float,
             plants: list[tuple[int, str, str, bool]]) -> None:
    """Scale w[h] so that one token's z hits the target (z is linear in w)."""
    tokens = x.shape[0]
    if tokens == 0:
        return
    for head, target, where, flip in plants:
        t = {"first": 0, "last": tokens - 1}.get(where, int(rng.integers(0, tokens)))
        z = _z_of(x, k, w, eps, t, head)
        if z == 0 or not math.isfinite(z):
            continue
        goal = {
            "below": clamp * rng.uniform(0.05, 0.95),
            "at": clamp,
            "just_above": clamp * (1 + 2.0 ** -int(rng.choice([6, 12, 20]))),
            "far": 10.0 ** rng.uniform(-2, 1),
        }[target]
        factor = goal / abs(z) * (-1.0 if flip else 1.0)
        if not 2.0**-60 <= abs(factor) <= MAX_SCALE_W or np.abs(w[head]).max() * abs(factor) > MAX_W:
            continue
        w[head] = (w[head] * factor).astype(np.float32)


def _corner(draws: tuple, tokens: int) -> str | None:
    """One of CORNERS in about CORNER_SHARE of the non-empty cases, the case's draws deciding
    (`strategies.classes.draws_rng`, so that they stay as they are); None otherwise.  hidden_sizes() leaves
    the kernels for rows beyond 128 elements to one case in eight, and the ci profile's examples seldom draw
    a single token."""
    rng = draws_rng(draws, CORNER_STREAM)
    if tokens == 0 or rng.random() >= CORNER_SHARE:
        return None
    return CORNERS[int(rng.integers(0, len(CORNERS)))]


def _exact_row(rng: np.random.Generator, hidden: int, heads: int, w_scale: float) -> tuple[np.ndarray, ...]:
    """(x, k, v, w) of one token of a mid or wide corner: small integers (w times a power of two), so that
    every fp32 sum over the row (x^2, k^2, x w k) is exact and the rows' rounding is that of the narrow ones:
    the corner reaches the wide kernels' dispatch without judging the longer sums' rounding against claims
    measured on narrow rows."""
    def integers(shape):
        return rng.integers(-4, 4, size=shape, endpoint=True).astype(np.float64)
    return (integers((1, heads, hidden)), integers((1, heads, hidden)), integers((1, hidden)),
            (integers((heads, hidden)) * w_scale).astype(np.float32))


@st.composite
def engram_gate_cases(draw) -> Case:
    """Cases of ``engram_gate_fwd(x, k, v, w, eps, clamp)`` (params eps, clamp)."""
    hidden = draw(hidden_sizes())
    heads = draw(st.integers(1, MAX_HEADS))
    drawn = draw(token_counts())
    tokens = min(drawn, max(1, MAX_ELEMENTS // (heads * hidden)))
    eps = draw(st.sampled_from(EPS_VALUES))
    clamp = draw(st.sampled_from(CLAMP_VALUES))
    base = draw(st.sampled_from(BASES))
    scale = 2.0 ** draw(st.integers(-8, 8))
    w_base = draw(st.sampled_from(W_BASES))
    w_scale = 2.0 ** draw(st.integers(-4, 4))
    rows = draw(st.dictionaries(st.sampled_from(ROW_FEATURES), st.sampled_from(ROW_SPREADS), max_size=4))
    tensor_features = draw(st.sets(st.sampled_from(TENSOR_FEATURES)))
    plants = draw(st.lists(st.tuples(st.integers(0, heads - 1), st.sampled_from(Z_TARGETS),
                                     st.sampled_from(("first", "last", "random")), st.booleans()),
                           max_size=heads, unique_by=lambda plant: plant[0]))
    seed = draw(seeds())
    draws = (hidden, heads, drawn, eps, clamp, base, scale, w_base, w_scale, sorted(rows.items()),
             sorted(tensor_features), plants, seed)
    corner = _corner(draws, tokens)
    if corner is not None:
        tokens = 1
    if corner in CORNER_HIDDEN:
        hidden = int(draws_rng(draws, CORNER_STREAM + 1).choice(CORNER_HIDDEN[corner]))
        x, k, v, w = _exact_row(np.random.default_rng([seed]), hidden, min(heads, CORNER_MAX_HEADS), w_scale)
        return Case(params={"eps": eps, "clamp": clamp},
                    inputs={"x": _bf16(x), "k": _bf16(k), "v": _bf16(v), "w": torch_copy(w)})

    rng = np.random.default_rng([seed])
    x = _base(rng, base, (tokens, heads, hidden), scale)
    k = _base(rng, base, (tokens, heads, hidden), scale)
    v = _base(rng, base, (tokens, hidden), scale)
    w = _weights(rng, w_base, (heads, hidden), w_scale).astype(np.float32)
    for stream, name in enumerate(ROW_FEATURES, start=1):
        if name not in rows or tokens == 0:
            continue
        frng = np.random.default_rng([seed, stream])
        t, h = _rows(frng, tokens, heads, rows[name])
        if name == "eps_x":
            _rescale_rows(frng, x, t, h, eps)
        elif name == "eps_k":
            _rescale_rows(frng, k, t, h, eps)
        elif name == "zero_x":
            x[t, h] = 0.0
        elif name == "zero_k":
            k[t, h] = 0.0
        elif name == "parallel":
            _parallel(frng, x, k, t, h)
        elif name == "orthogonal":
            _orthogonal(x, k, w.astype(np.float64), t, h)
    trng = np.random.default_rng([seed, 100])
    if "subnormals" in tensor_features:
        for a in (x, k, v):
            _subnormals(trng, a, 0.1)
    if "extremes" in tensor_features:
        _extremes(trng, x, k, v)
    x = np.clip(x, -MAX_INPUT, MAX_INPUT)
    k = np.clip(k, -MAX_INPUT, MAX_INPUT)
    xt, kt, vt = _bf16(x), _bf16(k), _bf16(v)
    _plant_z(np.random.default_rng([seed, 200]), xt, kt, w, eps, clamp, plants)
    return Case(params={"eps": eps, "clamp": clamp},
                inputs={"x": xt, "k": kt, "v": vt, "w": torch_copy(np.ascontiguousarray(w, dtype=np.float32))})


# -- fused_weight and grad_w_reduce ----------------------------------------------------------------
#
# Cases of ``fused_weight(weight_hidden, weight_embed)`` and of ``grad_w_reduce(grad_w_partial,
# weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed)``: (hc, H) with hc 1 .. 8 and H
# ending in partial tiles of the kernels' 128 and 1024 columns (DeepSeek's 7168 about once in eight).
# Each value class is tagged with ``event("class: ...")``.
#
# fused_weight draws every bf16, NaN and the infinities included: random bit patterns; products that
# land in the fp32 subnormal range or below it (exponents summing to -152 .. -126, so ties at half the
# smallest subnormal occur); products around the overflow threshold (exponents summing to 125 .. 129);
# and specials (+-0, +-inf, NaN, inf against 0) scattered over either operand.
# grad_w_reduce stays in the contract's judged domain (finite; sum_b |p_b| <= 2^64, |w| <= 2^60,
# |accumulator| <= 2^120): P from 0 (an empty reduction) to 256 blocks; partials that cancel (pairs p,
# -p and a residue 2^-20 smaller), that are zero (some blocks or all), or of log-uniform magnitudes;
# accumulators that are zero, random, or the negated product S * w (the final add cancels).

WEIGHT_HIDDEN_SIZES = (1, 3, 8, 64, 100, 1024, 1030)
REDUCE_HIDDEN_SIZES = (4, 12, 64, 100, 1028)  # hc H a multiple of 4 (the kernels' float4 columns)
BLOCK_COUNTS = (0, 1, 2, 3, 7, 8, 9, 33, 128)
FUSED_CLASSES = ("normal", "bits", "subnormal_products", "overflow_products", "specials")
PARTIAL_CLASSES = ("normal", "cancellation", "zero_blocks", "all_zero", "wide")
ACCUMULATOR_CLASSES = ("zero", "random", "cancel_final_add")
MAX_REDUCE_ELEMENTS = 2**15  # P hc H of one case (CPU time)
MAX_PARTIAL_SUM = 2.0**64  # sum_b |p_b| (the judged domain)
MAX_REDUCE_WEIGHT = 2.0**60


def _bf16_bits(bits: np.ndarray) -> torch.Tensor:
    """bf16 tensor of the given 16-bit patterns (every code, NaN and infinities included)."""
    return torch_copy(bits.astype(np.uint16).view(np.int16)).view(torch.bfloat16)


def _bf16_exact(a: np.ndarray) -> torch.Tensor:
    """bf16 of float64 values, rounded (inf and NaN kept)."""
    return torch_copy(a.astype(np.float32)).to(torch.bfloat16)


def _signed_powers(rng, shape, low: int, high: int) -> np.ndarray:
    """+-(1 + k/128) 2^e, e uniform in [low, high]: bf16 values with random 8-bit significands."""
    mags = (1.0 + rng.integers(0, 128, size=shape) / 128.0) * np.exp2(rng.integers(low, high, size=shape,
                                                                                  endpoint=True))
    return np.where(rng.random(shape) < 0.5, -mags, mags)


def _fused_operands(rng, kind: str, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    if kind == "normal":
        return _bf16_exact(rng.standard_normal(shape)), _bf16_exact(rng.standard_normal(shape) + 1.0)
    if kind == "bits":
        return (_bf16_bits(rng.integers(0, 2**16, size=shape)), _bf16_bits(rng.integers(0, 2**16, size=shape)))
    if kind == "subnormal_products":  # exponent sums -152 .. -126; bf16 subnormal operands too
        ea = rng.integers(-133, -19, size=shape, endpoint=True)
        eb = rng.integers(-152, -126, size=shape, endpoint=True) - ea
        eb = np.clip(eb, -133, 127)
        sig = lambda: 1.0 + rng.integers(0, 128, size=shape) / 128.0  # noqa: E731
        return _bf16_exact(sig() * np.exp2(ea)), _bf16_exact(-sig() * np.exp2(eb))
    if kind == "overflow_products":  # exponent sums 125 .. 129: the fp32 overflow threshold inside
        ea = rng.integers(-2, 127, size=shape, endpoint=True)
        eb = np.clip(rng.integers(125, 129, size=shape, endpoint=True) - ea, -133, 127)
        return _bf16_exact(_signed_powers(rng, shape, 0, 0) * np.exp2(ea)), \
            _bf16_exact(_signed_powers(rng, shape, 0, 0) * np.exp2(eb))
    if kind == "specials":
        specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0])
        a, b = rng.standard_normal(shape), rng.standard_normal(shape)
        for arr in (a, b):
            where = rng.random(shape) < 0.3
            arr[where] = rng.choice(specials, size=shape)[where]
        inf_zero = rng.random(shape) < 0.1  # inf times 0: NaN
        a[inf_zero], b[inf_zero] = np.inf, 0.0
        return _bf16_exact(a), _bf16_exact(b)
    raise ValueError(kind)


@st.composite
def fused_weight_cases(draw) -> Case:
    """Cases of ``fused_weight(weight_hidden, weight_embed)`` (no params)."""
    heads = draw(st.integers(1, MAX_HEADS))
    hidden = draw(rarely(st.sampled_from(WEIGHT_HIDDEN_SIZES), st.just(LARGE_HIDDEN), one_in=8))
    kind = draw(st.sampled_from(FUSED_CLASSES))
    event(f"class: {kind}")
    rng = np.random.default_rng([draw(seeds())])
    wh, we = _fused_operands(rng, kind, (heads, hidden))
    return Case(params={}, inputs={"weight_hidden": wh, "weight_embed": we})


def _partials(rng, kind: str, parts: int, shape: tuple[int, int]) -> np.ndarray:
    p = rng.standard_normal((parts, *shape))
    if kind == "wide":
        p = _signed_powers(rng, (parts, *shape), -60, 50)
    elif kind == "cancellation" and parts >= 2:  # pairs p, -p; the last block off by 2^-20 (or unpaired, that small)
        half = parts // 2
        p[half:2 * half] = -p[:half]
        if parts % 2:
            p[-1] *= 2.0**-20
        p[-1] += rng.standard_normal(shape) * 2.0**-20
    elif kind == "zero_blocks":
        p[rng.random(parts) < 0.5] = 0.0
    elif kind == "all_zero":
        p[:] = 0.0
    p = p.astype(np.float32)
    total = np.abs(p.astype(np.float64)).sum(0)
    scale = np.where(total > MAX_PARTIAL_SUM, MAX_PARTIAL_SUM / np.maximum(total, 1.0), 1.0)
    return (p * scale).astype(np.float32)


@st.composite
def grad_w_reduce_cases(draw) -> Case:
    """Cases of ``grad_w_reduce(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden,
    grad_weight_embed)`` (no params)."""
    heads = draw(st.integers(1, MAX_HEADS))
    hidden = draw(rarely(st.sampled_from(REDUCE_HIDDEN_SIZES), st.just(LARGE_HIDDEN), one_in=8))
    parts = draw(rarely(st.sampled_from(BLOCK_COUNTS), st.integers(129, 256), one_in=8))
    parts = min(parts, MAX_REDUCE_ELEMENTS // (heads * hidden))
    kind = draw(st.sampled_from(PARTIAL_CLASSES))
    acc_kind = draw(st.sampled_from(ACCUMULATOR_CLASSES))
    wide_weights = draw(st.booleans())
    event(f"class: partials {kind}")
    event(f"class: accumulators {acc_kind}")
    if parts == 0:
        event("class: empty reduction")
    rng = np.random.default_rng([draw(seeds())])
    shape = (heads, hidden)
    p = _partials(rng, kind, parts, shape)
    if wide_weights:
        wh, we = (np.clip(_signed_powers(rng, shape, -40, 60), -MAX_REDUCE_WEIGHT, MAX_REDUCE_WEIGHT)
                  for _ in range(2))
    else:
        wh, we = rng.standard_normal(shape) * 0.1 + 1.0, rng.standard_normal(shape) * 0.1 + 1.0
    wh_t, we_t = _bf16_exact(wh), _bf16_exact(we)
    accs = []
    for w in (we_t, wh_t):
        if acc_kind == "zero":
            acc = np.zeros(shape)
        elif acc_kind == "random":
            acc = rng.standard_normal(shape) * np.exp2(rng.integers(-20, 20))
        else:  # minus S * w rounded to fp32: the final addition cancels to the rounding error
            acc = -(p.astype(np.float64).sum(0) * w.float().numpy().astype(np.float64))
        accs.append(np.clip(acc, -2.0**120, 2.0**120).astype(np.float32))
    return Case(params={}, inputs={"grad_w_partial": torch_copy(np.ascontiguousarray(p)), "weight_hidden": wh_t,
                                   "weight_embed": we_t, "grad_weight_hidden": torch_copy(accs[0]),
                                   "grad_weight_embed": torch_copy(accs[1])})
