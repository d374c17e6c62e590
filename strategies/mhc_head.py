"""Strategies for the two ends of the mHC stack: `expand_to_mhc_cases` and
`head_compute_mix_cases` (with `head_compute_mix_nonfinite_cases`), described where defined.

Sizes are the mix ops' (`strategies.mhc`): m from 2..8 (4 half the time), a from {1, 0, 2, 3},
b from the token counts (0, 1, odd counts), H with the tails of 8-element vectors and of
128-thread tiles (1, 7, 9, 127, 129, ...) and now and then a model's 4096 or 7168; a b m H is
capped so that a case stays cheap for the CPU; in about a third of the cases a single row
(`strategies.mhc.corner_sizes`: with H a multiple of 8 or not for expand_to_mhc's vectorised and
scalar kernels).  Features go to a random subset of the (a, b)
rows, each from its own random stream, so that shrinking one leaves the others alone.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from strategies import rarely, seeds
from strategies.mhc import (PRE_EPS, VECTOR_ROW_CORNERS, Corner, _bf16, _extreme_values, _f32, _mix_sizes, _nonfinite,
                            _rows, corner_sizes)
from strategies.classes import tagging
from strategies.classes import in_turn
from tkverify.case import Case

EXPAND_FEATURES = ("extremes", "subnormal", "signed_zero", "nonfinite")
HEAD_FEATURES = ("saturated", "zero_u", "scale_zero", "subnormal", "huge", "cancel", "tiny_scale")
HEAD_NONFINITE = ("mixes", "base", "scale")
HEAD_CORNERS = (Corner(single=True),)


@st.composite
def expand_to_mhc_cases(draw) -> Case:
    """Cases of ``expand_to_mhc(x bf16 (a, b, H), m)`` (now and then x (b, H): any leading shape).

    Base: x normal at 2^-4..2^4.  Features: ``extremes`` (bf16's largest and smallest normal
    values, subnormals, zeros, each signed), ``subnormal`` (bf16 subnormals only),
    ``signed_zero`` (+0 and -0: a copy keeps the sign), ``nonfinite`` (NaN, +-inf).  The
    gradient checks draw their own (normal) cotangents; the backward's sums of extreme values
    are exercised in tests/test_mhc_head.py.
    """
    sizes = draw(_mix_sizes(True))
    flat = draw(rarely(st.just(False), st.just(True), one_in=8))
    features = draw(st.sets(st.sampled_from(EXPAND_FEATURES), max_size=3))
    magnitude = 2.0 ** draw(st.integers(-4, 4))
    seed = draw(seeds())
    (m, a, b, h), _ = corner_sizes((flat, sorted(features), magnitude, seed), sizes, VECTOR_ROW_CORNERS)

    rng = np.random.default_rng([seed])
    x = rng.standard_normal((a, b, h)) * magnitude
    for stream, name in enumerate(EXPAND_FEATURES, start=1):
        if name not in features or not a * b:
            continue
        frng = np.random.default_rng([seed, stream])
        where = _rows(frng, a, b)[..., None] & (frng.random(x.shape) < 0.5)
        if name == "extremes":
            x = np.where(where, _extreme_values(frng, x.shape), x)
        elif name == "subnormal":
            x = np.where(where, frng.integers(-127, 128, size=x.shape) * 2.0**-133, x)
        elif name == "signed_zero":
            x = np.where(where, frng.choice(np.array([0.0, -0.0]), size=x.shape), x)
        else:
            bad, mask = _nonfinite(frng, x.shape)
            x = np.where(where & mask, bad, x)
    if flat:
        x = x.reshape(a * b, h)
    return Case(params={"m": m}, inputs={"x": _bf16(x)})


def _head_values(draw, nonfinite: bool) -> Case:
    sizes = draw(_mix_sizes(False))
    pre_eps = draw(st.sampled_from(PRE_EPS))
    features = draw(st.sets(st.sampled_from(HEAD_FEATURES), max_size=3))
    bad = draw(st.sets(st.sampled_from(HEAD_NONFINITE), min_size=1, max_size=2)) if nonfinite else set()
    magnitude = 2.0 ** draw(st.integers(-4, 4))
    seed = draw(seeds())
    decide = np.random.default_rng([seed, 9]).random(2)  # the seed decides: the other draws stay
    features |= {name for name, u, p in zip(("scale_zero", "signed_zeros"), decide, (0.25, 0.5)) if u < p}
    draws = (pre_eps, sorted(features), sorted(bad), magnitude, seed)
    (m, a, b, _), _ = corner_sizes(draws, sizes, HEAD_CORNERS)

    rng = np.random.default_rng([seed])
    mixes = rng.standard_normal((a, b, m)) * magnitude
    scale = rng.uniform(0.25, 4.0, size=1) * rng.choice(np.array([1.0, -1.0]))
    base = rng.standard_normal(m)
    for stream, name in enumerate(HEAD_FEATURES + ("signed_zeros",), start=1):
        if name not in features:
            continue
        frng = np.random.default_rng([seed, stream])
        cols = frng.random(m) < 0.5
        where = _rows(frng, a, b)[..., None] & cols
        if name == "saturated":
            sign = np.sign(frng.standard_normal(mixes.shape))
            mixes = np.where(where, frng.uniform(400, 2e4, size=mixes.shape) * sign, mixes)
        elif name == "zero_u":  # u exactly 0: few-bit mixes, a power-of-two scale, base = -mixes * scale
            scale = np.exp2(np.round(np.log2(np.abs(scale)))) * np.sign(scale)
            c = frng.integers(-8, 9, size=m) / 8.0
            mixes = np.where(where, c, mixes)
            base = np.where(cols, -c * scale[0], base)
        elif name == "scale_zero":  # +0.0 or -0.0, whatever the drawn scale's sign
            scale = frng.choice(np.array([0.0, -0.0]), size=1)
        elif name == "subnormal":
            mixes = np.where(where, frng.integers(-2**23, 2**23, size=mixes.shape) * 2.0**-149, mixes)
            base = np.where(cols, frng.integers(-2**10, 2**10, size=m) * 2.0**-149, base)
        elif name == "huge":  # the fp32 product overflows (u is +-inf in fp32)
            scale = np.sign(scale) * np.maximum(np.abs(scale), 2.0)
            sign = np.sign(frng.standard_normal(mixes.shape))
            mixes = np.where(where, frng.uniform(1.0, 1.99, size=mixes.shape) * 2.0**126 * sign, mixes)
        elif name == "cancel" and a * b:  # base = -RN(mixes * scale): u is the product's rounding error
            first = tuple(np.argwhere(_rows(frng, a, b))[0])
            row = np.float32(mixes[first])
            with np.errstate(over="ignore"):
                product = (row * np.float32(scale[0])).astype(np.float64)  # RN32(mixes * scale), per entry
            base = np.where(cols & np.isfinite(product), -product, base)
            mixes = np.where(where, row, mixes)
        elif name == "tiny_scale":  # mixes * scale far below 1: the mix is sigmoid(base) to fp32's precision
            scale = scale * 2.0**-60
        elif name == "signed_zeros":  # about a quarter of base's entries, -0.0 and +0.0 in turn
            zero = in_turn(frng, base.shape, 0.25, 2)
            base = np.where(zero >= 0, np.where(zero == 0, -0.0, 0.0), base)
    for stream, name in enumerate(HEAD_NONFINITE, start=100):
        if name not in bad:
            continue
        frng = np.random.default_rng([seed, stream])
        if name == "mixes":
            values, mask = _nonfinite(frng, mixes.shape)
            where = mask & _rows(frng, a, b)[..., None]
            if mixes.size and not where.any():
                where.flat[frng.integers(0, where.size)] = True
            mixes = np.where(where, np.where(mask, values, np.nan), mixes)
        elif name == "base":
            base[frng.integers(0, m)] = frng.choice(np.array([np.nan, np.inf, -np.inf]))
        else:
            scale = frng.choice(np.array([np.nan, np.inf, -np.inf]), size=1)
    return Case(params={"pre_eps": pre_eps}, inputs={"mixes": _f32(mixes), "scale": _f32(scale), "base": _f32(base)})


@st.composite
def head_compute_mix_cases(draw) -> Case:
    """Cases of ``head_compute_mix(mixes f32 (a, b, m), scale f32 (1,), base f32 (m,), pre_eps)``, all
    finite (the op's strategy: its gradient checks need finite inputs).

    Base: mixes normal at 2^-4..2^4, scale in +-[1/4, 4], base normal, pre_eps from the mix ops'
    set (1e-6, 0, 1e-2, 1).  Features: ``saturated`` (|mixes| 400..2e4: the sigmoid exactly 0 or
    1 in fp32, its slope 0), ``zero_u`` (u exactly 0: the slope's maximum 1/4), ``scale_zero``
    (scale +0.0 or -0.0: every u is base), ``subnormal`` (mixes and base fp32 subnormals), ``huge`` (|mixes|
    ~ 2^126 with |scale| >= 2: the fp32 product overflows), ``cancel`` (base = -RN(mixes * scale):
    u is the product's rounding error, which an fma keeps), ``tiny_scale`` (scale ~ 2^-60: huge
    mixes times a tiny scale).  Besides the drawn features, the seed decides (so that the other draws
    stay as they are) ``scale_zero`` in one case of four, and in half ``signed_zeros`` (base entries
    -0.0 and +0.0 beside each other: u is mixes * scale exactly, or 0 of either sign): the ci profile's
    examples draw small feature sets, which left a scale of -0.0 and a base of -0.0 all but undrawn.
    """
    return _head_values(draw, False)


@st.composite
def head_compute_mix_nonfinite_cases(draw) -> Case:
    """As `head_compute_mix_cases`, with NaN or +-inf planted in mixes, in one base entry, or as the
    scale (judged by the forward checks only: the gradient of a NaN has nothing to compare)."""
    return _head_values(draw, True)



# The classes each strategy reaches under the ci profile (tests/test_classes.py), as tkverify/specs/mhc_head.py
# lists.
expand_to_mhc_cases = tagging("x", (
    'dtype_max:x', 'empty', 'nan:x', 'nan_payload:x', 'neg_inf:x', 'neg_zero:x', 'non_pow2', 'pos_inf:x',
    'signed_zero_tie:x', 'subnormal:x',
))(expand_to_mhc_cases)
head_compute_mix_cases = tagging("mixes", (
    'empty', 'neg_zero:base', 'neg_zero:scale', 'non_pow2', 'single_row', 'zero_row:scale',
))(head_compute_mix_cases)
