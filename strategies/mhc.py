"""Strategies for the mHC Sinkhorn normalisation: cases of ``sinkhorn(x, repeat, eps)``.

A case is x fp32 of shape (T, m, m) (now and then (2, T, m, m): any leading
shape is allowed), with params repeat and eps.  Drawn in three layers:

1. static parameters: m from 2..8, repeat from ``REPEATS`` (1..30: one
   normalisation only, a few sweeps, the default 10, and 30), eps from
   ``EPS_VALUES`` (the default 1e-6 first), T from 0, 1 and odd counts;
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
   eps), ``large`` (the whole matrix scaled to magnitudes 2^8..2^10).

Every logit is finite and |x| <= ``MAX_LOGIT``: within that the float64
finite differences of the gradient checks resolve the derivative (a step must
exceed float64's resolution of x by far, and stay small against the softmax's
curvature, which is on the scale of 1).  Non-finite entries (NaN, +-inf)
come from `sinkhorn_nonfinite_cases`, which the tests and the forward checks
use; they are kept out of the gradient checks (the op's strategy draws none).
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from strategies import rarely, seeds, torch_copy
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

    rng = np.random.default_rng([seed])
    x = rng.standard_normal((tokens, m, m)) * scale
    for stream, name in enumerate(FEATURES, start=1):
        if name in features and tokens:
            frng = np.random.default_rng([seed, stream])
            which = _which(frng, tokens, features[name])
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
