"""tile-kernels 1.0's grouped gate and its tensor-parallel masking: moe.top2_sum_gate (DeepSeek-V3's
group-limited routing from the logits: the best groups by the sum of their two largest keys, then the best
experts of those groups, and their normalised weights) and moe.mask_indices_by_tp (global expert indices
rewritten into one tensor-parallel rank's expert numbering, -1 for other ranks' experts and dropped slots).

What each op computes and its edge semantics are docs/contract/moe_tp.md; signatures and argument checks
are kernels/torch/moe_tp.py's.  Judging:

* mask_indices_by_tp: bitwise, int64 pinned (one right answer).
* top2_sum_gate's topk_idx: bitwise, int64 pinned, against the row the implementation gave where that row
  is admissible (`GateAnalysis.admissible`), else against the oracle's.  A float32 key is known only to within
  an interval (`key_intervals`: the fp32 error model of docs/contract/README.md, rounded outward to
  float32); a row is admissible when no comparison it decided contradicts an order that every fp32
  implementation must give: a key whose interval lies wholly above another's, or a tie of identical
  inputs, which goes to the lower index.  Where every deciding comparison is that certain, the oracle's
  row is the only admissible one.
* topk_weights: `within` fp32, the bracket of routed_scaling_factor * s_j / (sum s + 1e-20) over the
  experts the implementation chose (`weight_brackets`).

Input classes (the differential suite tags each judged case ``class: <name>``; `strategies.moe_tp`
computes them from the case's tensors):

* moe.top2_sum_gate: ``empty``, ``non_pow2``, ``k_one``, ``sigmoid``, ``sqrtsoftplus``, ``softmax``,
  ``no_grouping``, ``expert_tie``, ``group_tie``, ``masked_expert``, ``empty_group``, ``k_reaches_masked``,
  ``nan:logits``, ``pos_inf:logits``, ``neg_inf:logits``, ``saturated``, ``unrouted_token``.
* moe.mask_indices_by_tp: ``empty``, ``k_one``, ``non_pow2``, ``tp_one``, ``single_dp_group``,
  ``last_tp_rank``, ``dropped_slot``, ``other_negative``, ``foreign_expert``, ``kept_expert``,
  ``rank_boundary``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import references.moe_tp
import strategies.moe_tp
from references import as_float64
from tkverify import benchshapes
from tkverify.case import Case
from tkverify.policies import FP32_UNIT_ROUNDOFF as U, Bracket, bitwise, gamma
from tkverify.registry import BenchShape, OpSpec, register, tilelang_impl, torch_impl
from tkverify.specs.engram import within_as

RHO = 2.0**-20  # an exp, log1p, sqrt or division, relative (docs/contract/README.md's model)
TINY = 2.0**-126  # a result that underflows fp32's normal range may lose this much, absolute
# sqrt(softplus(x)) where e^x underflows: softplus off by TINY, its square root by sqrt(TINY).
SQRT_TINY = 2.0**-63
# The order of keys as finite float64 "ranks": -inf < finite < +inf < NaN (float32 keys and sums of two
# stay below 2^129).
_NEG_INF_RANK, _POS_INF_RANK, _NAN_RANK = -1e300, 1e300, 1e301

# -- top2_sum_gate: what an fp32 implementation may compute ------------------------------------------


def _down32(v: np.ndarray) -> np.ndarray:
    """The largest float32 <= v, as float64 (NaN stays NaN; a finite v above the largest float32 gives it)."""
    with np.errstate(over="ignore", invalid="ignore"):
        f = v.astype(np.float32)
        f = np.where(f.astype(np.float64) > v, np.nextafter(f, np.float32(-np.inf)), f)
    return f.astype(np.float64)


def _up32(v: np.ndarray) -> np.ndarray:
    return -_down32(-v)


def _ranks(v: np.ndarray) -> np.ndarray:
    """Keys as finite float64 ranks in moe.topk_gate's order: -inf < finite < +inf < NaN."""
    finite = np.where(v == np.inf, _POS_INF_RANK, np.where(v == -np.inf, _NEG_INF_RANK, v))
    return np.where(np.isnan(v), _NAN_RANK, finite)


def score_errors(logits: np.ndarray, scores: np.ndarray, scoring_func: str) -> np.ndarray:
    """Per element, how far a float32 score may lie from the exact one (NaN where the score is NaN)."""
    with np.errstate(invalid="ignore", over="ignore"):
        if scoring_func == "sigmoid":  # e^-x (RHO), 1 + it (u), the reciprocal (RHO), the rounding (u)
            return (2 * RHO + 2 * U) * scores + TINY
        if scoring_func == "sqrtsoftplus":
            # e^-|x| (RHO, which log1p does not grow), log1p (RHO), max(x, 0) + it (u), sqrt (RHO), rounding (u)
            return (3 * RHO + 2 * U) * scores + SQRT_TINY
        # softmax: x - m rounded (u |x - m|, which e^ turns into relative error), e^ (RHO), the float32 sum of E
        # terms (gamma_E, and the terms' own e^ and x - m errors), the division (RHO), the rounding (u)
        if scores.shape[0] == 0:
            return scores.copy()
        shift = np.abs(logits - np.max(logits, axis=1, keepdims=True))
        shift = np.where(np.isfinite(shift), shift, 0.0)  # e^-inf = 0 exactly
        relative = 3 * RHO + U * (shift + shift.max(axis=1, keepdims=True)) + gamma(scores.shape[1]) + 2 * U
        return relative * scores + TINY


def key_intervals(logits: np.ndarray, bias: np.ndarray, scores: np.ndarray,
                  errors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) float32 (as float64) bounds of each fp32 key s + b: the score's error, the addition's
    rounding, rounded outward; a NaN or infinite key is exact."""
    with np.errstate(invalid="ignore", over="ignore"):
        keys = scores + bias
        err = errors + U * (np.abs(scores) + errors + np.abs(bias))
        exact = ~np.isfinite(keys)
        return np.where(exact, keys, _down32(keys - err)), np.where(exact, keys, _up32(keys + err))


def _top2_sums(v: np.ndarray, num_groups: int) -> np.ndarray:
    """Per group, the float64 sum of its two largest (no NaN in v)."""
    grouped = np.sort(v.reshape(v.shape[0], num_groups, v.shape[1] // num_groups), axis=2)
    with np.errstate(invalid="ignore"):
        return grouped[..., -1] + grouped[..., -2]


def group_intervals(low: np.ndarray, high: np.ndarray, num_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) ranks of each group's fp32 key fl32(a + b), a and b its two largest keys.  A NaN key makes
    the group NaN; where +inf beside -inf can be the two largest, NaN is possible (the top rank)."""
    grouped_nan = np.isnan(low).reshape(low.shape[0], num_groups, low.shape[1] // num_groups).any(axis=2)
    filler = np.where(np.isnan(low), 0.0, low)
    lo_sum = _top2_sums(filler, num_groups)
    hi_sum = _top2_sums(np.where(np.isnan(high), 0.0, high), num_groups)
    lo = np.where(np.isnan(lo_sum), _POS_INF_RANK, _ranks(_down32(lo_sum)))
    hi = np.where(np.isnan(hi_sum), _NAN_RANK, _ranks(_up32(hi_sum)))
    return np.where(grouped_nan, _NAN_RANK, lo), np.where(grouped_nan, _NAN_RANK, hi)


def _certainly_before(low, high, ids, e, f):
    """Whether item e (an index array) ranks before item f in every fp32 implementation: its key lies wholly
    above f's, or the two keys are certainly equal (identical inputs, or both intervals one same point) and
    e is the lower index."""
    point = (low[e] == high[e]) & (low[f] == high[f]) & (low[e] == low[f])
    return (low[e] > high[f]) | (((ids[e] == ids[f]) | point) & (e < f))


class GateAnalysis:
    """What judging one top2_sum_gate case needs: exact scores and their errors, key and group intervals,
    input identities, and the oracle's answer."""

    def __init__(self, case: Case):
        p, i = case.params, case.inputs
        self.logits = as_float64(i["logits"])
        bias = as_float64(i["bias"])[None, :]
        self.scores = references.moe_tp.gate_scores(self.logits, p["scoring_func"])
        self.errors = score_errors(self.logits, self.scores, p["scoring_func"])
        low, high = key_intervals(self.logits, bias, self.scores, self.errors)
        self.low, self.high = _ranks(low), _ranks(high)
        self.ids = references.moe_tp.input_ids(self.logits, bias)
        self.num_groups, self.num_topk_groups = p["num_groups"], p["num_topk_groups"]
        self.per_group = self.logits.shape[1] // self.num_groups
        self.grouped = self.num_topk_groups < self.num_groups
        if self.grouped:
            self.group_low, self.group_high = group_intervals(low, high, self.num_groups)
            signature = np.sort(self.ids.reshape(self.ids.shape[0], self.num_groups, self.per_group), axis=2)
            # Two groups of the same (logit, bias) multiset have equal keys: their ids are made equal.
            self.group_ids = np.stack([(signature[:, g:g + 1] == signature).all(axis=2).argmax(axis=1)
                                       for g in range(self.num_groups)], axis=1)
        self.oracle_idx, _ = references.moe_tp.top2_sum_gate(**i, **p)

    def admissible(self, t: int, row: np.ndarray) -> bool:
        """Whether `row` (token t's topk_idx) contradicts no comparison every fp32 implementation makes."""
        low, high, ids = self.low[t], self.high[t], self.ids[t]
        num_experts, k = low.shape[0], row.shape[0]
        if (row < 0).any() or (row >= num_experts).any() or np.unique(row).size != k:
            return False
        earlier, later = np.triu_indices(k, 1)
        if _certainly_before(low, high, ids, row[later], row[earlier]).any():
            return False
        eligible = np.ones(num_experts, dtype=bool)
        if self.grouped:
            g = np.arange(self.num_groups)
            before = _certainly_before(self.group_low[t], self.group_high[t], self.group_ids[t], g[:, None], g[None, :])
            used = np.unique(row // self.per_group)
            if used.size > self.num_topk_groups or (before[:, used].sum(axis=0) >= self.num_topk_groups).any():
                return False
            certainly_in = (self.num_groups - 1 - before.sum(axis=1)) < self.num_topk_groups
            forced = certainly_in | np.isin(g, used) | before[:, used].any(axis=1)
            eligible = np.repeat(forced, self.per_group)
        passed_over = np.flatnonzero(eligible & ~np.isin(np.arange(num_experts), row))
        return not _certainly_before(low, high, ids, passed_over[:, None], row[None, :]).any()

    def weight_brackets(self, topk_idx: np.ndarray, scale: float) -> Bracket:
        """The bracket of scale * s_j / (sum s + 1e-20) over each row's chosen experts: the scores' errors,
        the denominator's K additions, the division and the scaling, rounded outward to float32."""
        routed = (topk_idx >= 0).all(axis=1, keepdims=True)
        safe = np.where(topk_idx >= 0, topk_idx, 0)
        s, ds = (np.take_along_axis(a, safe, axis=1) for a in (self.scores, self.errors))
        exact = references.moe_tp.gate_weights(self.scores, topk_idx, scale)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            total = s.sum(axis=1, keepdims=True) + references.moe_tp.EPSILON
            d_total = ds.sum(axis=1, keepdims=True) + gamma(topk_idx.shape[1]) * total
            err = scale * (ds / total + s * d_total / total**2) + exact * (RHO + U)
            low, high = np.maximum(_down32(exact - err), 0.0), _up32(exact + err)
            # Denominators dominated by underflow: only the sign is known.
            vague = np.broadcast_to(d_total >= total / 2, exact.shape)
            low, high = np.where(vague, 0.0, low), np.where(vague, np.inf, high)
            fixed = ~routed | ~np.isfinite(total) | np.isnan(exact)
        return Bracket(exact=exact, low=np.where(fixed, exact, low), high=np.where(fixed, exact, high))


def given_gate(case: Case, actual: dict[str, Any]) -> dict[str, Any]:
    """topk_idx: the implementation's rows that are admissible, the oracle's elsewhere; topk_weights: the
    bracket over the experts of those rows."""
    a = GateAnalysis(case)
    expected = a.oracle_idx.copy()
    got = actual["topk_idx"]
    if isinstance(got, torch.Tensor) and tuple(got.shape) == expected.shape:
        got = got.detach().cpu().to(torch.int64).numpy()
        for t in np.flatnonzero((expected >= 0).all(axis=1)):
            if a.admissible(t, got[t]):
                expected[t] = got[t]
    return {"topk_idx": expected,
            "topk_weights": a.weight_brackets(expected, float(case.params["routed_scaling_factor"]))}


# DeepSeek-V3's routing: T = 16384 tokens, K = 8 of 256 experts in G = 8 groups, the best 4 groups, weights
# scaled by 2.5; for the masking, 64 expert-parallel ranks (4 experts a rank) in groups of 8 tensor-parallel
# ranks, the rank kept the last.
_T, _E, _K, _G, _TOP_GROUPS, _SCALE, _EP, _TP = 16384, 256, 8, 8, 4, 2.5, 64, 8


def _routing_shape(device):
    topk_idx = benchshapes.routing(_T, _E, _K, 128, device)["topk_idx"]
    return ({"indices": topk_idx},
            {"n": _E, "num_ep_ranks": _EP, "tp_rank": _TP - 1, "num_tp_ranks": _TP})


def _gate_shape(device):
    logits = benchshapes.randn((_T, _E), torch.float32, device)
    bias = benchshapes.randn((_E,), torch.float32, device, seed=1) * 0.01
    return ({"logits": logits, "bias": bias},
            {"num_topk": _K, "num_topk_groups": _TOP_GROUPS, "num_groups": _G, "routed_scaling_factor": _SCALE,
             "scoring_func": "sigmoid"})


# Latency-bound (a few MB moved): judged by time alone, and against tile-kernels.
BENCH = {
    "moe.top2_sum_gate": (
        BenchShape(f"T{_T} E{_E} G{_G} top{_TOP_GROUPS} K{_K} sigmoid f32", _gate_shape,
                   lambda i, p: benchshapes.nbytes(i["logits"]) + i["logits"].shape[0] * _K * 12, target=None),),
    "moe.mask_indices_by_tp": (
        BenchShape(f"T{_T} K{_K} E{_E} ep{_EP} tp{_TP} int64", _routing_shape,
                   lambda i, p: 2 * benchshapes.nbytes(i["indices"]), target=None),),
}


register(OpSpec(
    name="moe.top2_sum_gate",
    bench=BENCH["moe.top2_sum_gate"],
    oracle=references.moe_tp.top2_sum_gate,
    strategy=strategies.moe_tp.top2_sum_gate_cases,
    outputs={"topk_idx": bitwise(torch.int64), "topk_weights": within_as("fp32", torch.float32)},
    impls={"torch": torch_impl("kernels.torch.moe_tp:top2_sum_gate"),
           "tilelang": tilelang_impl("kernels.moe.tp:top2_sum_gate")},
    given=given_gate,
    doc="Group-limited routing: the best groups by their top-2 key sum, then the best experts, weights s / sum s.",
))

register(OpSpec(
    name="moe.mask_indices_by_tp",
    bench=BENCH["moe.mask_indices_by_tp"],
    oracle=references.moe_tp.mask_indices_by_tp,
    strategy=strategies.moe_tp.mask_indices_by_tp_cases,
    outputs={"masked_indices": bitwise(torch.int64)},
    impls={"torch": torch_impl("kernels.torch.moe_tp:mask_indices_by_tp"),
           "tilelang": tilelang_impl("kernels.moe.tp:mask_indices_by_tp")},
    doc="Expert indices in one tensor-parallel rank's numbering; -1 for other ranks' experts and dropped slots.",
))
