"""Strategies for the grouped MoE routing helpers (docs/contract/moe_groups.md).

``topk_sum_and_topk_group_idx_cases`` draws scores (T, G, M) as moe.topk_gate's strategy draws a score matrix
(`strategies.moe.gate.build_scores` over the G * M experts: a base distribution, features aimed at the
order's edges, pinned special values) and then lays group features over it, each on the first, the
last, some or all rows:

* ``tie_across_groups``: a group gets another group's scores, permuted, so both groups' scores are
  equal and the lower group index must win;
* ``bias_tie``: a per-expert bias of 2^23 .. 2^26 added in float32, which rounds nearby scores onto
  the same values (the DeepSeek-V3 gate ranks scores + bias): ties within and across groups;
* ``masked_group``: a whole group at -inf (an empty group: no expert of it may be chosen);
* ``inf_and_neg_inf``: a group of -inf scores but one +inf: its two largest sum to NaN;
* ``overflow``: a group whose two largest are the float32 maximum, whose sum overflows to +inf.

``unique_group_indices_cases`` draws group indices (T, K) in [-1, num_groups): uniform, from a
handful of groups (many repeats), one group per row, or distinct; then masked slots (-1).

``aux_fi_cases`` draws a routing as the routing chain's strategies do (`strategies.moe.routings`: uniform,
popular or few experts, masked slots and rows, negative entries, a row naming an expert twice) and
num_aux_topk from 1, K and K + 1.

Each strategy lists the input classes it reaches (`strategies.classes.tagging`); the classes beyond the
value classes of every float input are computed from the case's tensors by `group_classes` and
`unique_classes`.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

import references.moe_groups as ref
from strategies import seeds, torch_copy
from strategies.moe.gate import BASES, FEATURES, ROW_SPREADS, _pinned_values, build_scores, plant_features, \
    token_counts
from strategies.moe.routing import routings_or_one_token
from strategies.classes import tagging
from tkverify.case import Case

# Static parameters: G groups of M experts, G * M <= 1024; DeepSeek-V3 has G = 8, M = 32.
GROUP_COUNTS = (1, 2, 3, 4, 8, 16, 32)
PER_GROUP = (1, 2, 3, 8, 16, 32, 33)
MAX_EXPERTS = 1024

# group_indices: K slots and num_groups groups (tile-kernels 1.0 takes num_groups <= 128).
SLOT_COUNTS = (1, 2, 3, 4, 8, 9, 32)
NUM_GROUPS = (1, 2, 3, 8, 16, 128)

_BIAS_EXPONENTS = (23, 24, 25, 26)
_FLOAT32_MAX = np.float32(np.finfo(np.float32).max)


# -- group features: rng, (rows, G, M) float32 block, num_topk_sum -> changed in place -------


def _tie_across_groups(rng: np.random.Generator, block: np.ndarray, num_topk_sum: int) -> None:
    num_groups = block.shape[1]
    if num_groups < 2:
        return
    source, target = rng.choice(num_groups, size=2, replace=False)
    block[:, target] = block[:, source][:, rng.permutation(block.shape[2])]


def _bias_tie(rng: np.random.Generator, block: np.ndarray, num_topk_sum: int) -> None:
    bias = np.float32(2.0) ** rng.choice(_BIAS_EXPONENTS, size=block.shape[1:]).astype(np.float32)
    bias[rng.random(block.shape[1:]) < 0.25] = 0
    with np.errstate(invalid="ignore", over="ignore"):
        block[...] = block + bias  # float32 arithmetic: rounded once, as a kernel adding a bias rounds


def _masked_group(rng: np.random.Generator, block: np.ndarray, num_topk_sum: int) -> None:
    block[:, rng.integers(block.shape[1])] = -np.inf


def _inf_and_neg_inf(rng: np.random.Generator, block: np.ndarray, num_topk_sum: int) -> None:
    group = rng.integers(block.shape[1])
    block[:, group] = -np.inf
    block[:, group, rng.integers(block.shape[2])] = np.inf


def _overflow(rng: np.random.Generator, block: np.ndarray, num_topk_sum: int) -> None:
    group = rng.integers(block.shape[1])
    count = min(2, block.shape[2])
    block[:, group, rng.choice(block.shape[2], size=count, replace=False)] = _FLOAT32_MAX


GROUP_FEATURES = {
    "tie_across_groups": _tie_across_groups,
    "bias_tie": _bias_tie,
    "masked_group": _masked_group,
    "inf_and_neg_inf": _inf_and_neg_inf,
    "overflow": _overflow,
}


def build_group_scores(seed: int, shape: tuple[int, int, int], num_topk_sum: int, num_topk_groups: int,
                       base: str, features: dict[str, str], group_features: dict[str, str],
                       pinned: list[tuple[int, int, float]]) -> np.ndarray:
    """The (T, G, M) float32 scores a drawn recipe describes (deterministic in its arguments)."""
    num_tokens, num_groups, per_group = shape
    k = min(num_topk_groups * per_group, num_groups * per_group)
    flat = build_scores(seed, num_tokens, num_groups * per_group, k, base, features, pinned)
    scores = flat.reshape(shape)
    # The streams after the gate's own features (they use 1 .. len(FEATURES)).
    plant_features(scores, seed, group_features, GROUP_FEATURES, 1 + len(FEATURES), num_topk_sum)
    return scores


def group_classes(case: Case) -> set[str]:
    """The grouped top-k's own classes, from the case's scores and parameters."""
    scores = case.inputs["scores"]
    num_topk_sum, num_topk_groups = case.params["num_topk_sum"], case.params["num_topk_groups"]
    found = {f"sum_of_{num_topk_sum}"}
    num_groups = scores.shape[1]
    if num_topk_groups == 1:
        found.add("k_one")
    if num_topk_groups == num_groups:
        found.add("k_all")
    if scores.numel() == 0:
        return found
    group_score = ref.group_scores(scores, num_topk_sum).astype(np.float64)
    is_nan = np.isnan(group_score)
    # One finite float64 key per key of the contract's order: -0.0 == +0.0 (+ 0.0), +inf below every NaN.
    keys = np.where(is_nan, 1e301, np.where(group_score == np.inf, 1e300, group_score)) + 0.0
    ordered = np.sort(keys, axis=1)
    if (ordered[:, 1:] == ordered[:, :-1]).any():
        found.add("tie_across_groups")
    if is_nan.any():
        found.add("nan_group")
    if (group_score == -np.inf).any():
        found.add("empty_group")
    if (group_score == np.inf).any():
        found.add("inf_group")
    return found


@st.composite
def topk_sum_and_topk_group_idx_cases(draw) -> Case:
    """Cases of ``topk_sum_and_topk_group_idx(scores f32 (T, G, M), num_topk_sum, num_topk_groups)``."""
    num_groups = draw(st.sampled_from(GROUP_COUNTS))
    per_group = draw(st.sampled_from([m for m in PER_GROUP if num_groups * m <= MAX_EXPERTS]))
    num_topk_sum = draw(st.sampled_from([s for s in (1, 2) if s <= per_group]))
    num_topk_groups = draw(st.one_of(st.sampled_from((1, num_groups)), st.integers(1, num_groups)))
    num_tokens = draw(token_counts())
    base = draw(st.sampled_from(tuple(BASES)))
    features = draw(st.dictionaries(st.sampled_from(tuple(FEATURES)), st.sampled_from(ROW_SPREADS), max_size=2))
    group_features = draw(st.dictionaries(st.sampled_from(tuple(GROUP_FEATURES)), st.sampled_from(ROW_SPREADS),
                                          max_size=3))
    pinned = draw(_pinned_values(num_tokens, num_groups * per_group))
    seed = draw(seeds())
    scores = build_group_scores(seed, (num_tokens, num_groups, per_group), num_topk_sum, num_topk_groups,
                                base, features, group_features, pinned)
    return Case(params={"num_topk_sum": num_topk_sum, "num_topk_groups": num_topk_groups},
                inputs={"scores": torch_copy(scores)})


topk_sum_and_topk_group_idx_cases = tagging("scores", (
    "empty", "k_all", "k_one", "nan:scores", "neg_inf:scores", "pos_inf:scores", "non_pow2",
    "sum_of_1", "sum_of_2", "tie_across_groups", "nan_group", "empty_group", "inf_group",
), group_classes)(topk_sum_and_topk_group_idx_cases)


# -- unique_group_indices -----------------------------------------------------------------------


def _uniform(rng: np.random.Generator, shape: tuple[int, int], num_groups: int) -> np.ndarray:
    return rng.integers(0, num_groups, size=shape)


def _few_groups(rng: np.random.Generator, shape: tuple[int, int], num_groups: int) -> np.ndarray:
    handful = rng.choice(num_groups, size=min(num_groups, 2), replace=False)
    return rng.choice(handful, size=shape)


def _one_group(rng: np.random.Generator, shape: tuple[int, int], num_groups: int) -> np.ndarray:
    return np.repeat(rng.integers(0, num_groups, size=(shape[0], 1)), shape[1], axis=1)


def _distinct(rng: np.random.Generator, shape: tuple[int, int], num_groups: int) -> np.ndarray:
    """Distinct groups in each row where K <= num_groups (a permutation's prefix), else uniform."""
    if shape[1] > num_groups:
        return _uniform(rng, shape, num_groups)
    keys = rng.random((shape[0], num_groups))
    return np.argsort(keys, axis=1)[:, : shape[1]]


INDEX_BASES = {"uniform": _uniform, "few_groups": _few_groups, "one_group": _one_group, "distinct": _distinct}
MASKINGS = ("none", "some", "whole_rows")


def build_group_indices(seed: int, shape: tuple[int, int], num_groups: int, base: str, masking: str) -> np.ndarray:
    """The (T, K) int64 group indices a drawn recipe describes (deterministic in its arguments)."""
    rng = np.random.default_rng([seed])
    idx = INDEX_BASES[base](rng, shape, num_groups).astype(np.int64)
    if masking == "some":
        idx[rng.random(shape) < 0.3] = ref.MASKED
    elif masking == "whole_rows":
        idx[rng.random(shape[0]) < 0.5] = ref.MASKED
    return idx


def unique_classes(case: Case) -> set[str]:
    """unique_group_indices' classes, from the case's indices and parameters."""
    idx = case.inputs["group_indices"].numpy()
    num_slots, num_groups = idx.shape[1], case.params["num_groups"]
    found = {"k_one"} if num_slots == 1 else set()
    if num_slots == num_groups:
        found.add("k_equals_groups")
    if idx.size == 0:
        return found
    if (idx < 0).any():
        found.add("masked_slot")
    if (ref.unique_group_indices(idx, num_groups) != idx).any():
        found.add("repeated_group")
    if (idx == idx[:, :1]).all(axis=1).any() and num_slots > 1:
        found.add("one_group_row")
    return found


@st.composite
def unique_group_indices_cases(draw) -> Case:
    """Cases of ``unique_group_indices(group_indices int64 (T, K), num_groups)``."""
    num_groups = draw(st.sampled_from(NUM_GROUPS))
    num_slots = draw(st.one_of(st.sampled_from(SLOT_COUNTS), st.just(min(num_groups, 32))))
    num_tokens = draw(token_counts())
    base = draw(st.sampled_from(tuple(INDEX_BASES)))
    masking = draw(st.sampled_from(MASKINGS))
    seed = draw(seeds())
    idx = build_group_indices(seed, (num_tokens, num_slots), num_groups, base, masking)
    return Case(params={"num_groups": num_groups}, inputs={"group_indices": torch_copy(idx)})


unique_group_indices_cases = tagging("group_indices", (
    "empty", "k_one", "k_equals_groups", "masked_slot", "repeated_group", "one_group_row", "non_pow2",
), unique_classes)(unique_group_indices_cases)


# -- aux_fi ---------------------------------------------------------------------------------------


def aux_fi_classes(case: Case) -> set[str]:
    """aux_fi's classes, from the case's routing."""
    idx = case.inputs["topk_idx"].numpy()
    num_experts = case.params["num_experts"]
    found = set()
    if idx.size == 0:
        return found
    if (idx < 0).any():
        found.add("masked_slot")
    counts = np.bincount(idx[(idx >= 0) & (idx < num_experts)], minlength=num_experts)
    if (counts == 0).any():
        found.add("unused_expert")
    if case.params["num_aux_topk"] != idx.shape[1]:
        found.add("aux_topk_not_k")
    return found


@st.composite
def aux_fi_cases(draw) -> Case:
    """Cases of ``aux_fi(topk_idx int64 (T, K), num_experts, num_aux_topk)``; T is 1 more often than
    `routings` draws it (`routings_or_one_token`)."""
    num_experts, k, idx = draw(routings_or_one_token())
    num_aux_topk = draw(st.sampled_from(sorted({1, k, k + 1})))
    return Case(params={"num_experts": num_experts, "num_aux_topk": num_aux_topk},
                inputs={"topk_idx": torch_copy(idx)})


aux_fi_cases = tagging("topk_idx", (
    "empty", "masked_slot", "unused_expert", "aux_topk_not_k", "non_pow2",
), aux_fi_classes)(aux_fi_cases)
