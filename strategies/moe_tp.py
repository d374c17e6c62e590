"""Strategies for tile-kernels 1.0's grouped gate and its tensor-parallel masking (docs/contract/moe_tp.md).

``top2_sum_gate_cases`` draws a routing layout (G groups of M experts, E <= 256; num_topk_groups, num_topk, the
scaling factor, the scoring function), logits from a base (``normal``; ``wide``, N(0, 8^2); ``saturated``,
|x| in 30 .. 200 where sigmoid rounds to 1 or 0 and e^x underflows; ``few_values``, exact ties), a bias
(zero, small, or powers of two 2^23 .. 2^26 that round nearby keys onto one float32), and features:

* ``expert_tie``: an expert gets another's logits and bias (identical keys: the lower index first);
* ``group_tie``: a group gets another group's logits and biases, permuted alike (identical group keys);
* ``masked_experts``: some biases -inf (masked experts);
* ``empty_group``: a whole group's biases -inf;
* ``k_reaches_masked``: all but fewer than num_topk experts masked, so the top-k reaches -inf keys;
* ``non_finite_logits``: NaN, +inf and -inf logits in some rows;
* ``unrouted``: a mask leaving some tokens (or all) unrouted.

``mask_indices_by_tp_cases`` draws a parallel layout (per_gpu experts a rank, num_tp_ranks tensor-parallel
ranks in each of dp data-parallel groups: num_ep_ranks = dp * num_tp_ranks, n = num_ep_ranks * per_gpu;
tp_rank the first, the last or any) and indices (T, K) from one of:

* ``uniform``: experts in [0, n);
* ``boundaries``: the first and last expert of ranks (r * per_gpu and r * per_gpu + per_gpu - 1), 0 and n - 1,
  where an off-by-one in the rank or the remainder shows;
* ``local``: experts of the ranks of tp_rank only (every entry kept);
* ``foreign``: experts of the other ranks only (every entry dropped, where num_tp_ranks > 1);

then dropped slots: -1 in some slots or whole rows, and rarely other negatives (-2, -n, the int64 minimum).

Each strategy lists the input classes it reaches (`strategies.classes.tagging`); `tp_classes` computes the
classes beyond the shape classes from the case's tensors and parameters.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

import references.moe_tp as ref
from strategies import seeds, torch_copy
from strategies.classes import tagging
from strategies.moe.gate import ROW_SPREADS, _chosen_rows, token_counts
from tkverify.case import Case

# (G, M) layouts, E = G * M <= 256: DeepSeek-V3 (8, 32), smaller and odd ones, one group (no grouping).
GATE_LAYOUTS = ((8, 32), (8, 8), (4, 4), (3, 6), (16, 2), (1, 16), (32, 8), (5, 3), (2, 1))
SCALES = (1.0, 2.5)
_BIAS_EXPONENTS = (23, 24, 25, 26)
_SATURATING = (30.0, 60.0, 100.0, 120.0, 200.0)

# The layout: experts a rank, tensor-parallel ranks, data-parallel groups.  DeepSeek-V3: 256 experts on
# 64 EP ranks (per_gpu = 4); TP of 1, 2, 4 or 8.
PER_GPU = (1, 2, 3, 4, 8, 32, 257)
TP_RANKS = (1, 2, 3, 4, 8)
DP_GROUPS = (1, 2, 3, 8, 16)
SLOT_COUNTS = (1, 2, 3, 8, 9, 32)

_INT64_MIN = np.iinfo(np.int64).min


def _uniform(rng: np.random.Generator, shape: tuple[int, int], layout: dict) -> np.ndarray:
    return rng.integers(0, layout["n"], size=shape)


def _boundaries(rng: np.random.Generator, shape: tuple[int, int], layout: dict) -> np.ndarray:
    per_gpu, n = layout["per_gpu"], layout["n"]
    rank = rng.integers(0, n // per_gpu, size=shape)
    edge = np.where(rng.random(shape) < 0.5, 0, per_gpu - 1)
    out = rank * per_gpu + edge
    ends = rng.random(shape)
    return np.where(ends < 0.1, 0, np.where(ends < 0.2, n - 1, out))


def _ranks_where(rng: np.random.Generator, shape: tuple[int, int], layout: dict, same_tp: bool) -> np.ndarray:
    per_gpu, tp, tp_rank = layout["per_gpu"], layout["num_tp_ranks"], layout["tp_rank"]
    ranks = np.arange(layout["n"] // per_gpu)
    chosen = ranks[(ranks % tp == tp_rank) == same_tp]
    if chosen.size == 0:  # one tensor-parallel rank: no foreign rank exists
        chosen = ranks
    return rng.choice(chosen, size=shape) * per_gpu + rng.integers(0, per_gpu, size=shape)


INDEX_BASES = {
    "uniform": _uniform,
    "boundaries": _boundaries,
    "local": lambda rng, shape, layout: _ranks_where(rng, shape, layout, True),
    "foreign": lambda rng, shape, layout: _ranks_where(rng, shape, layout, False),
}
DROPPINGS = ("none", "some", "whole_rows", "other_negatives")


def build_tp_indices(seed: int, shape: tuple[int, int], layout: dict, base: str, dropping: str) -> np.ndarray:
    """The (T, K) int64 indices a drawn recipe describes (deterministic in its arguments)."""
    rng = np.random.default_rng([seed])
    idx = INDEX_BASES[base](rng, shape, layout).astype(np.int64)
    if dropping == "some":
        idx[rng.random(shape) < 0.3] = ref.DROPPED
    elif dropping == "whole_rows":
        idx[rng.random(shape[0]) < 0.5] = ref.DROPPED
    elif dropping == "other_negatives":
        negatives = np.array([ref.DROPPED, -2, -layout["n"], _INT64_MIN], dtype=np.int64)
        pick = rng.random(shape) < 0.3
        idx[pick] = rng.choice(negatives, size=int(pick.sum()))
    return idx


def tp_classes(case: Case) -> set[str]:
    """mask_indices_by_tp's classes, from the case's indices and parameters."""
    p = case.params
    idx = case.inputs["indices"].numpy()
    found = {"k_one"} if idx.shape[1] == 1 else set()
    if p["num_tp_ranks"] == 1:
        found.add("tp_one")
    if p["num_tp_ranks"] == p["num_ep_ranks"]:
        found.add("single_dp_group")
    if p["num_tp_ranks"] > 1 and p["tp_rank"] == p["num_tp_ranks"] - 1:
        found.add("last_tp_rank")
    if idx.size == 0:
        return found
    per_gpu = p["n"] // p["num_ep_ranks"]
    out = ref.mask_indices_by_tp(idx, **p)
    if (idx == ref.DROPPED).any():
        found.add("dropped_slot")
    if (idx < ref.DROPPED).any():
        found.add("other_negative")
    if ((idx >= 0) & (out == ref.DROPPED)).any():
        found.add("foreign_expert")
    if (out >= 0).any():
        found.add("kept_expert")
    if per_gpu > 1 and ((idx >= 0) & ((idx % per_gpu == 0) | (idx % per_gpu == per_gpu - 1))).any():
        found.add("rank_boundary")
    return found


@st.composite
def tp_layouts(draw) -> dict:
    """n, num_ep_ranks, tp_rank, num_tp_ranks (and per_gpu) of one parallel layout."""
    per_gpu = draw(st.sampled_from(PER_GPU))
    num_tp_ranks = draw(st.sampled_from(TP_RANKS))
    num_ep_ranks = num_tp_ranks * draw(st.sampled_from(DP_GROUPS))
    tp_rank = draw(st.one_of(st.sampled_from((0, num_tp_ranks - 1)), st.integers(0, num_tp_ranks - 1)))
    return {"n": num_ep_ranks * per_gpu, "num_ep_ranks": num_ep_ranks, "tp_rank": tp_rank,
            "num_tp_ranks": num_tp_ranks, "per_gpu": per_gpu}


@st.composite
def mask_indices_by_tp_cases(draw) -> Case:
    """Cases of ``mask_indices_by_tp(indices int64 (T, K), n, num_ep_ranks, tp_rank, num_tp_ranks)``."""
    layout = draw(tp_layouts())
    num_slots = draw(st.sampled_from(SLOT_COUNTS))
    num_tokens = draw(token_counts())
    base = draw(st.sampled_from(tuple(INDEX_BASES)))
    dropping = draw(st.sampled_from(DROPPINGS))
    seed = draw(seeds())
    idx = build_tp_indices(seed, (num_tokens, num_slots), layout, base, dropping)
    params = {name: layout[name] for name in ("n", "num_ep_ranks", "tp_rank", "num_tp_ranks")}
    return Case(params=params, inputs={"indices": torch_copy(idx)})


mask_indices_by_tp_cases = tagging("indices", (
    "empty", "k_one", "non_pow2", "tp_one", "single_dp_group", "last_tp_rank", "dropped_slot", "other_negative",
    "foreign_expert", "kept_expert", "rank_boundary",
), tp_classes)(mask_indices_by_tp_cases)


# -- top2_sum_gate ----------------------------------------------------------------------------------


def _normal(rng, shape):
    return rng.standard_normal(shape, dtype=np.float32)


def _wide(rng, shape):
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(8)


def _saturated(rng, shape):
    magnitude = rng.choice(np.array(_SATURATING, dtype=np.float32), size=shape)
    return np.where(rng.random(shape) < 0.5, -magnitude, magnitude).astype(np.float32)


def _few_values(rng, shape):
    return rng.choice(np.array([-1.0, 0.0, 0.5, 2.0], dtype=np.float32), size=shape)


LOGIT_BASES = {"normal": _normal, "wide": _wide, "saturated": _saturated, "few_values": _few_values}


def _bias(rng: np.random.Generator, num_experts: int, kind: str) -> np.ndarray:
    if kind == "zero":
        return np.zeros(num_experts, dtype=np.float32)
    if kind == "small":
        return rng.standard_normal(num_experts, dtype=np.float32) * np.float32(0.01)
    return (np.float32(2.0) ** rng.choice(_BIAS_EXPONENTS, size=num_experts)).astype(np.float32)


# -- gate features: rng, logits (T, E), bias (E,), layout, rows -> changed in place ------------------


def _expert_tie(rng, logits, bias, layout, rows):
    source, target = rng.choice(logits.shape[1], size=2, replace=logits.shape[1] < 2)
    logits[rows, target] = logits[rows, source]
    bias[target] = bias[source]


def _group_tie(rng, logits, bias, layout, rows):
    num_groups, per_group = layout
    if num_groups < 2:
        return
    g, h = rng.choice(num_groups, size=2, replace=False)
    order = rng.permutation(per_group)
    src, dst = g * per_group + order, h * per_group + np.arange(per_group)
    logits[:, dst] = logits[:, src]
    bias[dst] = bias[src]


def _masked_experts(rng, logits, bias, layout, rows):
    bias[rng.random(bias.shape[0]) < 0.25] = -np.inf


def _empty_group(rng, logits, bias, layout, rows):
    num_groups, per_group = layout
    g = rng.integers(num_groups)
    bias[g * per_group:(g + 1) * per_group] = -np.inf


def _k_reaches_masked(rng, logits, bias, layout, rows, num_topk):
    keep = rng.choice(bias.shape[0], size=max(num_topk - 1, 0), replace=False)
    masked = np.ones(bias.shape[0], dtype=bool)
    masked[keep] = False
    bias[masked] = -np.inf


def _non_finite_logits(rng, logits, bias, layout, rows):
    for value in (np.nan, np.inf, -np.inf):
        logits[rows, rng.integers(logits.shape[1])] = value


GATE_FEATURES = {
    "expert_tie": _expert_tie,
    "group_tie": _group_tie,
    "masked_experts": _masked_experts,
    "empty_group": _empty_group,
    "k_reaches_masked": None,  # needs num_topk: applied by build_gate_inputs
    "non_finite_logits": _non_finite_logits,
}


def build_gate_inputs(seed: int, num_tokens: int, layout: tuple[int, int], num_topk: int, base: str, bias_kind: str,
                      features: dict[str, str], unrouted: str | None) -> dict[str, np.ndarray]:
    """The logits, bias and (unless `unrouted` is None) mask a drawn recipe describes (deterministic)."""
    rng = np.random.default_rng([seed])
    num_experts = layout[0] * layout[1]
    logits = LOGIT_BASES[base](rng, (num_tokens, num_experts))
    bias = _bias(rng, num_experts, bias_kind)
    for name in GATE_FEATURES:  # a fixed order, whatever order the draw listed them in
        if name not in features:
            continue
        rows = _chosen_rows(rng, num_tokens, features[name])
        if name == "k_reaches_masked":
            _k_reaches_masked(rng, logits, bias, layout, rows, num_topk)
        else:
            GATE_FEATURES[name](rng, logits, bias, layout, rows)
    out = {"logits": logits, "bias": bias}
    if unrouted is not None:
        out["mask"] = rng.random(num_tokens) >= (1.0 if unrouted == "all" else 0.3)
    return out


def gate_classes(case: Case) -> set[str]:
    """top2_sum_gate's classes, from the case's tensors and parameters."""
    p = case.params
    logits, bias = case.inputs["logits"].numpy(), case.inputs["bias"].numpy()
    num_groups = p["num_groups"]
    found = {p["scoring_func"]}
    if p["num_topk"] == 1:
        found.add("k_one")
    if p["num_topk_groups"] == num_groups:
        found.add("no_grouping")
    if np.isneginf(bias).any():
        found.add("masked_expert")
    if np.isneginf(bias.reshape(num_groups, -1)).all(axis=1).any():
        found.add("empty_group")
    if "mask" in case.inputs and not case.inputs["mask"].numpy().all():
        found.add("unrouted_token")
    if logits.size == 0:
        return found
    finite = logits[np.isfinite(logits)]
    if (np.abs(finite) >= 30).any():
        found.add("saturated")
    ids = ref.input_ids(logits, bias)
    if (np.diff(np.sort(ids, axis=1), axis=1) == 0).any():
        found.add("expert_tie")
    if num_groups > 1:
        signature = np.sort(ids.reshape(ids.shape[0], num_groups, -1), axis=2)
        if any((signature[:, g] == signature[:, h]).all(axis=1).any()
               for g in range(num_groups) for h in range(g + 1, num_groups)):
            found.add("group_tie")
    idx, _ = ref.top2_sum_gate(**case.inputs, **p)
    with np.errstate(invalid="ignore"):
        keys = ref.gate_scores(logits, p["scoring_func"]) + bias
    chosen = np.take_along_axis(keys, np.where(idx >= 0, idx, 0), axis=1)
    if (np.isneginf(chosen) & (idx >= 0)).any():
        found.add("k_reaches_masked")
    return found


@st.composite
def top2_sum_gate_cases(draw) -> Case:
    """Cases of ``top2_sum_gate(logits f32 (T, E), bias f32 (E,), num_topk, num_topk_groups, num_groups,
    routed_scaling_factor, scoring_func, mask=None)``."""
    num_groups, per_group = draw(st.sampled_from(GATE_LAYOUTS))
    num_topk_groups = num_groups if per_group == 1 else draw(
        st.one_of(st.integers(1, num_groups), st.sampled_from((1, num_groups))))
    most = min(32, num_topk_groups * per_group)
    num_topk = draw(st.one_of(st.sampled_from(sorted({1, min(8, most), most})), st.integers(1, most)))
    scoring_func = draw(st.sampled_from(ref.SCORING_FUNCS))
    num_tokens = draw(token_counts())
    base = draw(st.sampled_from(tuple(LOGIT_BASES)))
    bias_kind = draw(st.sampled_from(("zero", "small", "pow2")))
    features = draw(st.dictionaries(st.sampled_from(tuple(GATE_FEATURES)), st.sampled_from(ROW_SPREADS), max_size=3))
    unrouted = draw(st.sampled_from((None, None, "some", "all")))
    scale = draw(st.sampled_from(SCALES))
    seed = draw(seeds())
    arrays = build_gate_inputs(seed, num_tokens, (num_groups, per_group), num_topk, base, bias_kind, features,
                               unrouted)
    params = {"num_topk": num_topk, "num_topk_groups": num_topk_groups, "num_groups": num_groups,
              "routed_scaling_factor": scale, "scoring_func": scoring_func}
    return Case(params=params, inputs={name: torch_copy(a) for name, a in arrays.items()})


top2_sum_gate_cases = tagging("logits", (
    "empty", "non_pow2", "k_one", "sigmoid", "sqrtsoftplus", "softmax", "no_grouping", "expert_tie", "group_tie",
    "masked_expert", "empty_group", "k_reaches_masked", "nan:logits", "pos_inf:logits", "neg_inf:logits",
    "saturated", "unrouted_token",
), gate_classes)(top2_sum_gate_cases)
