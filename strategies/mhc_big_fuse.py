"""Strategies for mHC's fused pre-block forward: `pre_big_fuse_cases`.

A case is what tile-kernels' pre-block hands its fused kernel: a bf16 residual x (N, m, H), the
projection GEMM's S split-K partials of x against a projection fn (M, m H), M = m (m + 2) (built by
`strategies.mhc_fused._partials` from the float64 values of the rounded residual, one RMS group of m H
values, then rounded to fp32), and the mix scale (3,) and base (M,).  Sizes follow the mix ops'
(m from 2..8, 4 half the time; N from 0, 1 and odd counts; H ending in partial vectors); S from
`strategies.mhc_fused.SPLITS`; the parameters from the stages' own sets (rms_eps, pre_eps, post_mult,
including 0, Sinkhorn's repeat and eps).

Features, each from its own random stream: ``zero_rows`` (x = 0 on some tokens: sqrsum 0, the
mixes 0, u = base), ``eps_comparable`` (rms of the token within a factor 4 of sqrt(rms_eps)),
``huge_mixes`` (a scale of 2^8..2^14: saturated sigmoids and comb logits in the thousands),
``tiny_mixes`` (a scale of 2^-40..2^-20: u is base), ``sinkhorn_stress`` (the comb part of base
planted with Sinkhorn's ``saturated``, ``dominant``, ``near_permutation`` or ``eps_entries`` logits,
`strategies.mhc._plant`), ``cancel`` (a split's partials negated into the next: the sum cancels),
and rarely ``nonfinite`` (NaN and infinities in the partials of some tokens, or in the residual).
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from strategies import rarely, seeds
from strategies.mhc import (EPS_VALUES as SINKHORN_EPS, M_VALUES, POST_MULTS, PRE_EPS, REPEATS, _bf16, _f32,
                            _plant, _rows, token_counts)
from strategies.mhc_fused import EPS_VALUES as RMS_EPS, SPLITS, _partials
from tkverify.case import Case

HIDDEN = (1, 3, 7, 8, 16, 33, 128, 129, 1000)
ELEMENTS = 2**17  # N m H residual values at most (N lowered to fit)
FEATURES = ("zero_rows", "eps_comparable", "huge_mixes", "tiny_mixes", "sinkhorn_stress", "cancel")
NONFINITE = np.array([np.nan, np.inf, -np.inf])
STRESS = ("saturated", "dominant", "near_permutation", "eps_entries")


@st.composite
def pre_big_fuse_cases(draw) -> Case:
    """Cases of ``pre_big_fuse(gemm_out_mul, gemm_out_sqrsum, scale, base, residual, rms_eps, pre_eps,
    sinkhorn_eps, post_mult, sinkhorn_repeat)``; see the module docstring."""
    m = draw(rarely(st.just(4), st.sampled_from(M_VALUES), one_in=2))
    width = m * (m + 2)
    hidden = draw(st.sampled_from(HIDDEN))
    tokens = draw(token_counts())
    if tokens * m * hidden > ELEMENTS:
        tokens = max(1, ELEMENTS // (m * hidden))
    splits = draw(st.sampled_from(SPLITS))
    params = {"rms_eps": draw(st.sampled_from(RMS_EPS)), "pre_eps": draw(st.sampled_from(PRE_EPS)),
              "sinkhorn_eps": draw(st.sampled_from(SINKHORN_EPS)), "post_mult": draw(st.sampled_from(POST_MULTS)),
              "sinkhorn_repeat": draw(st.sampled_from(REPEATS))}
    features = draw(st.sets(st.sampled_from(FEATURES), max_size=3))
    if draw(rarely(st.just(False), st.just(True), one_in=6)):
        features.add("nonfinite")
    magnitude = 2.0 ** draw(st.integers(-4, 4))
    seed = draw(seeds())

    rng = np.random.default_rng([seed])
    x = rng.standard_normal((tokens, m, hidden)) * magnitude
    fn = rng.standard_normal((width, m * hidden)) / np.sqrt(m * hidden)
    scale = rng.uniform(0.5, 2.0, size=3) * 2.0 ** rng.integers(-3, 2, size=3)
    base = rng.standard_normal(width)
    planted = {}
    for stream, name in enumerate(FEATURES + ("nonfinite",), start=1):
        if name not in features:
            continue
        frng = np.random.default_rng([seed, stream])
        rows = _rows(frng, 1, tokens)[0] if tokens else np.zeros(0, dtype=bool)
        planted[name] = (frng, rows)
        if name == "zero_rows":
            x[rows] = 0.0
        elif name == "eps_comparable":
            rms = np.sqrt((x[rows] ** 2).mean(axis=(-1, -2), keepdims=True))
            target = np.sqrt(params["rms_eps"] * frng.uniform(0.25, 4.0, size=rms.shape))
            x[rows] = x[rows] / np.where(rms > 0, rms, 1.0) * target
        elif name == "huge_mixes":
            scale = scale * 2.0 ** frng.integers(8, 15, size=3)
        elif name == "tiny_mixes":
            scale = scale * 2.0 ** frng.integers(-40, -19, size=3)
        elif name == "sinkhorn_stress":
            comb = base[2 * m:].reshape(1, m, m).copy()
            _plant(frng, comb, str(frng.choice(STRESS)), params["sinkhorn_eps"])
            base[2 * m:] = comb.reshape(-1)
    residual = _bf16(x)
    xr = residual.double().numpy()  # the rounded residual's own values
    p, q = _partials(xr.reshape(tokens, 1, m * hidden), fn.reshape(width, 1, m * hidden), splits)
    p, q = p[:, :, 0].astype(np.float32).astype(np.float64), q[:, :, 0].astype(np.float32).astype(np.float64)
    if "cancel" in planted and splits > 1:
        frng, rows = planted["cancel"]
        first = frng.integers(0, splits - 1)
        p[first + 1, rows] = -p[first, rows] + p[first + 1, rows] * 2.0**-20
    if "nonfinite" in planted and tokens:
        frng, rows = planted["nonfinite"]
        in_partials = frng.random() < 0.5
        values = p[:, rows] if in_partials else xr[rows]
        count = 1 + values.size // 64
        values.flat[frng.integers(0, values.size, size=count)] = frng.choice(NONFINITE, size=count)
        if in_partials:
            p[:, rows] = values
        else:
            xr[rows] = values
            residual = _bf16(xr)
    return Case(params=params, inputs={"gemm_out_mul": _f32(p), "gemm_out_sqrsum": _f32(q), "scale": _f32(scale),
                                       "base": _f32(base), "residual": residual})

