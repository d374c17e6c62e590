"""Strategies for moe.topk_gate_scored, the sqrt-softplus scored top-k gate (docs/contract/moe_gate.md).

``topk_gate_scored_cases`` draws the logits as moe.topk_gate's strategy draws a score matrix
(`strategies.moe.gate.build_scores`: a base distribution, ties and near ties at the k-th place, subnormals,
signed zeros, infinities, NaNs, pinned special values), then lays the scored gate's own logit features over
it, each on the first, the last, some or all rows:

* ``saturated_high``: logits of 20 .. 2^127, where softplus(x) is x to the last bit and the score sqrt(x);
* ``saturated_low``: logits of -80 .. -2^127, where e^x leaves the float32 normal range (-87.3) or
  underflows entirely (-103.3): scores that are tiny, subnormal-born or exactly 0, so that a float32 kernel
  ties them at 0 where the exact scores still differ;
* ``equal_logits``: two experts of a row given the same logit (equal scores: the lower index wins).

and draws the bias from ``BIASES``:

* ``zero``: no bias (the keys are the scores);
* ``small``: normal values of scale 0.1, as a load-balancing bias is;
* ``bias_tie``: 2^23 .. 2^26 on some experts (0 on the others), which rounds the float32 sum score + bias
  of nearby scores onto one value: ties that the bias makes;
* ``masked_experts`` (first: the kind the smallest examples keep; the other experts' bias is 0): -inf on
  some experts, at least one: an expert that can only be chosen past every other one, and
  whose key is NaN (chosen first) where its logit is +inf;
* ``equalising``: bias[b] = u[a] - u[b] rounded, for two experts of the first row, which makes their keys
  equal there or one float32 ULP apart.

With the two kinds that make ties (``bias_tie``, ``equalising``) the seed decides, in half the cases, that
every logit whose score is finite is replaced by distinct ones (`untied_scores`): the bias is then the
only source of the key ties (``bias_made_tie``), which the features' own ties hide otherwise.

routed_scaling_factor comes from ``SCALINGS``; E from moe.topk_gate's expert counts (a padded width, then a
count of it: `strategies.moe.gate.expert_counts`; in about WIDEST_SHARE of the cases a count of the widest
width, `widest_expert_count`, with T <= WIDEST_MAX_TOKENS), k from its values (<= E) and k = E.  The
classes beyond every float input's value classes are computed from the case's tensors by `gate_classes`
(``nan_key``, a +inf logit on a masked expert, is tagged where drawn but too rare to promise under the ci
profile).
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

import references.moe_gate as ref
from strategies import seeds, torch_copy
from strategies.classes import draws_rng, tagging
from strategies.moe.gate import EXPERTS_BY_WIDTH, FEATURES, ROW_SPREADS, TOPK_VALUES, BASES, _pinned_values, \
    build_scores, expert_counts, plant_features, token_counts
from tkverify.case import Case

MAX_K = 32
SCALINGS = (1.0, 2.5, 0.75)
BIASES = ("masked_experts", "zero", "bias_tie", "small", "equalising")
_BIAS_EXPONENTS = (23, 24, 25, 26)
# softplus(x) rounds to x in float32 above this (log1p(e^-x) < 2^-28 x), and e^x leaves the float32 normal
# range below -87.3 and underflows below -103.3.
SATURATION_HIGH = 20.0
SATURATION_LOW = -80.0
EXP_UNDERFLOW = float(np.log(np.float64(2.0) ** -126))  # e^x below the float32 normal range


# -- logit features: rng, rows (R, E) float32 changed in place, k -> None --------------------------------


def _saturated_high(rng: np.random.Generator, rows: np.ndarray, k: int) -> None:
    mask = rng.random(rows.shape) < 0.5
    values = np.float32(2.0) ** rng.uniform(np.log2(SATURATION_HIGH), 127, size=rows.shape).astype(np.float32)
    rows[mask] = values[mask]


def _saturated_low(rng: np.random.Generator, rows: np.ndarray, k: int) -> None:
    mask = rng.random(rows.shape) < 0.5
    values = -(np.float32(2.0) ** rng.uniform(np.log2(-SATURATION_LOW), 8, size=rows.shape).astype(np.float32))
    values[rng.random(rows.shape) < 0.1] = -np.float32(2.0) ** 127
    rows[mask] = values[mask]


def _equal_logits(rng: np.random.Generator, rows: np.ndarray, k: int) -> None:
    if rows.shape[1] < 2:
        return
    a, b = rng.choice(rows.shape[1], size=2, replace=False)
    rows[:, b] = rows[:, a]


LOGIT_FEATURES = {"saturated_high": _saturated_high, "saturated_low": _saturated_low, "equal_logits": _equal_logits}


def build_bias(seed: int, kind: str, logits: np.ndarray) -> np.ndarray:
    """The (E,) float32 bias of a drawn kind (deterministic in its arguments)."""
    num_experts = logits.shape[1]
    rng = np.random.default_rng([seed, 100])
    bias = np.zeros(num_experts, dtype=np.float32)
    if kind == "small":
        bias = (0.1 * rng.standard_normal(num_experts)).astype(np.float32)
    elif kind == "bias_tie":
        bias = (np.float32(2.0) ** rng.choice(_BIAS_EXPONENTS, size=num_experts)).astype(np.float32)
        bias[rng.random(num_experts) < 0.25] = 0
    elif kind == "masked_experts":
        bias[rng.random(num_experts) < 0.3] = -np.inf
        bias[rng.integers(num_experts)] = -np.inf  # at least one
    elif kind == "equalising" and num_experts >= 2 and logits.shape[0]:
        a, b = rng.choice(num_experts, size=2, replace=False)
        with np.errstate(invalid="ignore"):  # a signalling NaN raises the invalid flag as it widens
            u = ref.sqrt_softplus(logits[0]).astype(np.float32)
        if np.isfinite(u[a]) and np.isfinite(u[b]):
            bias[b] = np.float32(u[a]) - np.float32(u[b])
    return bias


TYING_BIASES = ("bias_tie", "equalising")


def untied_scores(rng: np.random.Generator, logits: np.ndarray) -> np.ndarray:
    """logits with each row's logits of finite score (all but NaN and +inf) replaced by distinct values,
    evenly spaced over [0.2, 3] in a random order: their scores (0.89 .. 1.75) lie far more than a float32
    ULP apart, so no two scores of a row tie, and within a factor of two of each other, so that the
    ``equalising`` bias u[a] - u[b] is exact in float32 and makes the two keys equal."""
    num_tokens, num_experts = logits.shape
    spaced = np.linspace(0.2, 3.0, num_experts, dtype=np.float32)
    distinct = spaced[np.argsort(rng.random((num_tokens, num_experts)), axis=1)]
    keep = np.isnan(logits) | (logits == np.inf)
    return np.where(keep, logits, distinct).astype(np.float32)


def _float32_keys(case: Case) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        scores = ref.sqrt_softplus(case.inputs["logits"]).astype(np.float32)
        return scores + case.inputs["bias"].numpy()[None, :]


def gate_classes(case: Case) -> set[str]:
    """The scored gate's own classes, from the case's logits, bias and parameters."""
    logits, bias, k = case.inputs["logits"].numpy(), case.inputs["bias"].numpy(), case.params["k"]
    found = {"k_equals_experts"} if k == logits.shape[1] else set()
    if (bias == -np.inf).any():
        found.add("masked_expert")
    if logits.size == 0:
        return found
    finite = np.isfinite(logits)
    if (finite & (logits >= SATURATION_HIGH)).any():
        found.add("saturated_high")
    if (finite & (logits < EXP_UNDERFLOW)).any():
        found.add("score_underflow")
    keys = _float32_keys(case)
    # Ties among finite keys (NaNs tie too, but they are their own class): the index decides.
    sorted_keys = np.sort(np.where(np.isnan(keys), np.inf, keys) + 0.0, axis=1)
    key_tie = (sorted_keys[:, 1:] == sorted_keys[:, :-1]) & np.isfinite(sorted_keys[:, 1:])
    if key_tie.any():
        found.add("key_tie")
        with np.errstate(invalid="ignore"):
            scores32 = ref.sqrt_softplus(logits).astype(np.float32)
        sorted_scores = np.sort(np.where(np.isnan(scores32), np.inf, scores32), axis=1)
        if not ((sorted_scores[:, 1:] == sorted_scores[:, :-1]) & np.isfinite(sorted_scores[:, 1:])).any():
            found.add("bias_made_tie")
    if (np.isnan(keys) & ~np.isnan(logits)).any():
        found.add("nan_key")
    return found


# The share of the cases moved to an expert count of the widest padded width (`widest_expert_count`).
WIDEST_SHARE = 1 / 5
WIDEST_STREAM = 108
WIDEST_MAX_TOKENS = 33  # T of such a case at most (CPU time: E is 1000 or 1024)


def widest_expert_count(draws: tuple) -> int:
    """An expert count of the widest padded width (1024 lanes), the case's draws deciding which
    (`strategies.classes.draws_rng`, so that the draws stay as they are): `expert_counts` draws each of the
    six widths as often as the others, which left the widest kernel to chance in the ci profile's examples."""
    widest = EXPERTS_BY_WIDTH[-1]
    return int(widest[int(draws_rng(draws, WIDEST_STREAM + 1).integers(0, len(widest)))])


@st.composite
def topk_gate_scored_cases(draw) -> Case:
    """Cases of ``topk_gate_scored(logits f32 (T, E), bias f32 (E,), k, routed_scaling_factor)``."""
    num_experts = draw(expert_counts())  # each padded width of the kernel as often as the others
    k = draw(st.sampled_from(sorted({v for v in TOPK_VALUES if v <= num_experts} | {min(num_experts, MAX_K)})))
    num_tokens = draw(token_counts())
    base = draw(st.sampled_from(tuple(BASES)))
    features = draw(st.dictionaries(st.sampled_from(tuple(FEATURES)), st.sampled_from(ROW_SPREADS), max_size=3))
    logit_features = draw(st.dictionaries(st.sampled_from(tuple(LOGIT_FEATURES)), st.sampled_from(ROW_SPREADS),
                                          max_size=2))
    pinned = draw(_pinned_values(num_tokens, num_experts))
    bias_kind = draw(st.sampled_from(BIASES))
    scaling = draw(st.sampled_from(SCALINGS))
    seed = draw(seeds())
    draws = (num_experts, k, num_tokens, base, sorted(features.items()), sorted(logit_features.items()), pinned,
             bias_kind, scaling, seed)
    if draws_rng(draws, WIDEST_STREAM).random() < WIDEST_SHARE:
        num_experts, num_tokens = widest_expert_count(draws), min(num_tokens, WIDEST_MAX_TOKENS)
        pinned = [(row, column % num_experts, value) for row, column, value in pinned if row < num_tokens]
    logits = build_scores(seed, num_tokens, num_experts, k, base, features, pinned)
    # The streams after the gate's own features (they use 1 .. len(FEATURES)).
    plant_features(logits, seed, logit_features, LOGIT_FEATURES, 1 + len(FEATURES), k)
    rng = np.random.default_rng([seed, 101])
    if bias_kind in TYING_BIASES and rng.random() < 0.5:  # the bias alone ties keys (the seed decides)
        logits = untied_scores(rng, logits)
    bias = build_bias(seed, bias_kind, logits)
    return Case(params={"k": k, "routed_scaling_factor": scaling},
                inputs={"logits": torch_copy(logits), "bias": torch_copy(bias)})


topk_gate_scored_cases = tagging("logits", (
    "empty", "non_pow2", "nan:logits", "pos_inf:logits", "neg_inf:logits", "k_equals_experts", "masked_expert",
    "saturated_high", "score_underflow", "key_tie", "bias_made_tie",
), gate_classes)(topk_gate_scored_cases)

