"""Strategies for RMSNorm with a residual and an output scale: cases of
``norm(x, weight, residual, eps, out_scale)`` (docs/contract/quant_norm.md).

A case is drawn in three layers:

1. static parameters: the dtype (bf16 or fp32), H from a small set with non-powers of two and
   sizes that are not multiples of a 16-byte vector (1, 3, 100, 200 next to 64 and 128; DeepSeek's
   7168 rarely), eps and out_scale from small sets, and T (``strategies.quant.token_counts``:
   0, 1, odd counts and tails);
2. x and the residual: normal at a drawn scale (2^-20 .. 2^20), the residual either zeros
   (``class: zero residual``: s = x, the sign of a zero included) or normal at its own scale, so
   that the sum rounds; the weight normal around 1, or with zeros and negative entries;
3. row features, planted in the first, last, some or all rows, each tagged
   ``class: <name>``: ``zero row`` (s = 0: rstd = 1/sqrt(eps), out = 0), ``eps dominated`` (rms
   of s at sqrt(eps) times 2^-16 .. 2^3), ``tiny row`` (bf16 / fp32 subnormals: their squares
   underflow fp32), ``huge row`` (rms 2^56 .. 2^66: the fp32 sum of squares reaches or passes
   fp32's largest value, where the contract leaves rstd and out free), ``cancelling residual``
   (residual = -x plus a few ULPs: s is the rounding residue).

``norm_cast_cases`` adds per_token_cast's parameters, rows holding an infinity or a NaN
(``class: inf row``, ``-inf row``, ``nan row``), and drops the residual in half the cases (``class: no
residual``; norm_cases keeps it: its backward's differentiable inputs name it).  norm_cases' inputs are finite: the op's backward is judged on every case this strategy draws, and its
gradients are only defined on finite rows; rows with an infinity or a NaN are the unit tests'
(tests/test_quant_norm.py), with the contract's IEEE semantics.
"""

from __future__ import annotations

import numpy as np
from hypothesis import event, strategies as st

from strategies import rarely, seeds
from strategies.classes import draws_rng
from strategies.quant import MAX_ELEMENTS, TOKEN_BLOCKS, round_to_dtype, sf_options, to_input_tensor, token_counts
from tkverify.case import Case

HIDDEN_SIZES = (1, 3, 64, 100, 128, 200)
LARGE_HIDDEN = 7168
EPS_VALUES = (1e-6, 1e-5)
OUT_SCALES = (1.0, 0.5, 3.0, 2.0**-10)
ROW_SPREADS = ("first", "last", "some", "all")
ROW_FEATURES = ("zero row", "eps dominated", "tiny row", "huge row", "cancelling residual")
NON_FINITE_FEATURES = ("inf row", "-inf row", "nan row")  # one element of the row; the fused cast's cases only
TINY_SCALE = {"bf16": 2.0**-130, "fp32": 2.0**-140}
# `draws_rng`'s stream of a norm case's dtype, vector and single-row choice (42: a stream whose ci draws give every
# configuration of the norm kernels each boundary class)
NORM_CONFIG_STREAM = 42
VECTOR = {"bf16": 8, "fp32": 4}  # elements of a 16-byte vector (the TileLang kernels' vectorised configurations)
NO_RESIDUAL_STREAM = 28  # `draws_rng`'s stream of norm_cast_cases' choice of no residual


def _rows(rng: np.random.Generator, tokens: int, spread: str) -> np.ndarray:
    if tokens == 0:
        return np.zeros(0, dtype=np.int64)
    if spread == "first":
        return np.array([0])
    if spread == "last":
        return np.array([tokens - 1])
    if spread == "all":
        return np.arange(tokens)
    return np.flatnonzero(rng.random(tokens) < 0.3)


def _plant(rng: np.random.Generator, feature: str, x: np.ndarray, r: np.ndarray, rows: np.ndarray, eps: float,
           dtype: str) -> None:
    """Rewrite x (and r) in `rows` so that s = x + r has the feature."""
    shape = (len(rows), x.shape[1])
    if feature == "zero row":
        x[rows], r[rows] = 0.0, 0.0
    elif feature == "eps dominated":
        x[rows] = rng.standard_normal(shape) * np.sqrt(eps) * 2.0 ** rng.integers(-16, 4)
        r[rows] = 0.0
    elif feature == "tiny row":
        x[rows] = rng.standard_normal(shape) * TINY_SCALE[dtype] * 2.0 ** rng.integers(0, 8)
        r[rows] = 0.0
    elif feature == "huge row":
        x[rows] = rng.standard_normal(shape) * 2.0 ** rng.integers(56, 67)
        r[rows] = 0.0
    elif feature in NON_FINITE_FEATURES:
        columns = rng.integers(0, x.shape[1], size=len(rows))
        x[rows, columns] = {"inf row": np.inf, "-inf row": -np.inf, "nan row": np.nan}[feature]
    elif feature == "cancelling residual":
        r[rows] = -round_to_dtype(x[rows] * (1 + rng.standard_normal(shape) * 2.0**-10), dtype)


@st.composite
def norm_cases(draw) -> Case:
    return draw(_norm_case(non_finite=False, single_row_share=0.4, stream=0))


@st.composite
def _norm_case(draw, non_finite: bool, single_row_share: float, stream: int) -> Case:
    # The case's draws decide the dtype, whether H is a whole number of 16-byte vectors (the drawn H where it
    # is, else one of HIDDEN_SIZES that is) and, in `single_row_share` of the cases, a single row: the TileLang
    # kernels' configuration and boundary (`draws_rng`), spread over the ci profile's few examples more evenly
    # than draws of their own.
    hidden = draw(rarely(st.sampled_from(HIDDEN_SIZES), st.just(LARGE_HIDDEN), one_in=20))
    tokens = draw(token_counts(hidden))
    eps = draw(st.sampled_from(EPS_VALUES))
    out_scale = draw(st.sampled_from(OUT_SCALES))
    seed = draw(seeds())
    pick = draws_rng((hidden, tokens, eps, out_scale, seed, stream), NORM_CONFIG_STREAM)
    dtype = ("bf16", "fp32")[int(pick.integers(0, 2))]
    whole = bool(pick.integers(0, 2))
    if (hidden % VECTOR[dtype] == 0) != whole:
        hidden = int(pick.choice([h for h in HIDDEN_SIZES if (h % VECTOR[dtype] == 0) == whole]))
        tokens = min(tokens, max(1, MAX_ELEMENTS // hidden))
    tokens = 1 if tokens and pick.random() < single_row_share else tokens  # empty batches stay
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, hidden)) * 2.0 ** int(draw(st.integers(-20, 20)))
    zero_residual = draw(st.booleans())
    if zero_residual:
        event("class: zero residual")
        r = np.zeros_like(x)
    else:
        r = rng.standard_normal((tokens, hidden)) * 2.0 ** int(draw(st.integers(-20, 20)))
    if draw(st.booleans()):
        w = 1.0 + 0.1 * rng.standard_normal(hidden)
    else:
        event("class: signed weight")
        w = rng.standard_normal(hidden) * (rng.random(hidden) > 0.2)
    features = ROW_FEATURES + (NON_FINITE_FEATURES if non_finite else ())
    for feature in draw(st.lists(st.sampled_from(features), max_size=3, unique=True)):
        rows = _rows(rng, tokens, draw(st.sampled_from(ROW_SPREADS)))
        _plant(rng, feature, x, r, rows, eps, dtype)
        if len(rows):
            event(f"class: {feature}")
    if tokens == 0:
        event("class: empty")
    if hidden & (hidden - 1):
        event("class: non_pow2")
    x_t, r_t, w_t = (to_input_tensor(round_to_dtype(v, dtype), dtype) for v in (x, r, w))
    return Case(params={"eps": eps, "out_scale": out_scale},
                inputs={"x": x_t, "weight": w_t, "residual": r_t})


@st.composite
def norm_cast_cases(draw) -> Case:
    """Cases of norm_forward_and_per_token_cast: a norm case (with rows holding an infinity or a NaN too:
    this op has no backward) and per_token_cast's parameters: e4m3, or e2m1 where H is even, a block of
    16 .. 128 columns or the whole row where it divides H, and the sf options."""
    case = draw(_norm_case(non_finite=True, single_row_share=0.5, stream=1))
    hidden = case.inputs["x"].shape[1]
    fmt = draw(st.sampled_from(("e4m3", "e2m1") if hidden % 2 == 0 else ("e4m3",)))
    npc = draw(st.sampled_from([n for n in (*TOKEN_BLOCKS, hidden) if hidden % n == 0]))
    options = draw(sf_options(fmt))
    inputs = dict(case.inputs)
    x = inputs["x"]
    drawn = (draw(st.booleans()), fmt, npc, sorted(options.items()), tuple(x.shape), str(x.dtype),
             sorted(case.params.items()))
    # no residual (norm_input is x itself: the TileLang forward's kernels without one) in half the cases, the
    # case's draws deciding (`draws_rng`): a draw of its own left the ci examples without a configuration
    if draws_rng(drawn, NO_RESIDUAL_STREAM).random() < 0.5:
        event("class: no residual")
        del inputs["residual"]
    return Case(params={**case.params, "fmt": fmt, "num_per_channels": npc, **options}, inputs=inputs)
