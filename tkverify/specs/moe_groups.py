"""The grouped MoE routing helpers: moe.topk_sum_and_topk_group_idx (DeepSeek-V3's group-limited
routing: the best groups by the sum of each group's top scores), moe.unique_group_indices (each
token's group indices without repeats) and moe.aux_fi (the per-expert load statistic of the auxiliary
balance loss).

What each op computes and its edge semantics are docs/contract/moe_groups.md; signatures and
argument checks are kernels/torch/moe_groups.py's.  The indices have one right answer, judged bitwise
with int64 pinned; aux_fi's f_i by `summation` within three fp32 roundings of the exact quotient
(`aux_fi_bound`).  Input classes (the differential suite tags each judged case
``class: <name>``; `strategies.moe_groups` computes them from the case's tensors):

* moe.topk_sum_and_topk_group_idx: ``empty``, ``k_all``, ``k_one``, ``nan:scores``, ``neg_inf:scores``,
  ``pos_inf:scores``, ``non_pow2``, ``sum_of_1``, ``sum_of_2``, ``tie_across_groups``, ``nan_group``,
  ``empty_group``, ``inf_group``.
* moe.unique_group_indices: ``empty``, ``k_one``, ``k_equals_groups``, ``masked_slot``, ``repeated_group``,
  ``one_group_row``, ``non_pow2``.
* moe.aux_fi: ``empty``, ``masked_slot``, ``unused_expert``, ``aux_topk_not_k``, ``non_pow2``.
"""

from __future__ import annotations

import numpy as np
import torch

import references.moe_groups
import strategies.moe_groups
from tkverify import benchshapes
from tkverify.policies import ErrorBound, bitwise, summation, summation_error
from tkverify.registry import BenchShape, OpSpec, register, tilelang_impl, torch_impl

# DeepSeek-V3's routing: T = 16384 tokens, 256 experts in G = 8 groups of M = 32, the best 4 groups by the
# sum of their top 2 scores; K = 8 experts a token, so 8 group indices a token to deduplicate.
_T, _G, _M, _SUM, _TOP_GROUPS, _K = 16384, 8, 32, 2, 4, 8


def _group_scores_shape(device):
    return ({"scores": benchshapes.randn((_T, _G, _M), torch.float32, device)},
            {"num_topk_sum": _SUM, "num_topk_groups": _TOP_GROUPS})


def _group_idx_bytes(i, p):
    return benchshapes.nbytes(i["scores"]) + i["scores"].shape[0] * p["num_topk_groups"] * 8


def _group_indices_shape(device):
    topk_idx = benchshapes.routing(_T, _G * _M, _K, 128, device)["topk_idx"]
    return {"group_indices": (topk_idx // _M).contiguous()}, {"num_groups": _G}


def _routing_shape(device):
    topk_idx = benchshapes.routing(_T, _G * _M, _K, 128, device)["topk_idx"]
    return {"topk_idx": topk_idx}, {"num_experts": _G * _M, "num_aux_topk": _K}


# Latency-bound (a few MB): judged by time alone, and against tile-kernels.
BENCH = {
    "moe.topk_sum_and_topk_group_idx": (
        BenchShape(f"T{_T} G{_G} M{_M} sum{_SUM} top{_TOP_GROUPS} f32", _group_scores_shape, _group_idx_bytes,
                   target=None),),
    "moe.unique_group_indices": (
        BenchShape(f"T{_T} K{_K} groups{_G} int64", _group_indices_shape,
                   lambda i, p: 2 * benchshapes.nbytes(i["group_indices"]), target=None),),
    "moe.aux_fi": (BenchShape(f"T{_T} E{_G * _M} K{_K} int64", _routing_shape,
                              lambda i, p: benchshapes.nbytes(i["topk_idx"]) + p["num_experts"] * 4, target=None),),
}


def aux_fi_bound(topk_idx, num_experts: int, num_aux_topk: int) -> ErrorBound:
    """The exact f_i and what three fp32 roundings may add to it (docs/contract/moe_groups.md#moe.aux_fi):
    c_i * E, K' * T and their quotient (or c_i times a rounded E / (K' T)), each rounded once."""
    exact = references.moe_groups.aux_fi(topk_idx, num_experts, num_aux_topk)
    with np.errstate(invalid="ignore"):
        error = summation_error(np.abs(exact), 1, roundings_per_term=3)
    return ErrorBound(exact, error, "fp32")


def _impls(name: str) -> dict:
    return {"torch": torch_impl(f"kernels.torch.moe_groups:{name}"),
            "tilelang": tilelang_impl(f"kernels.moe.groups:{name}")}


register(OpSpec(
    name="moe.topk_sum_and_topk_group_idx",
    bench=BENCH["moe.topk_sum_and_topk_group_idx"],
    oracle=references.moe_groups.topk_sum_and_topk_group_idx,
    strategy=strategies.moe_groups.topk_sum_and_topk_group_idx_cases,
    outputs={"group_idx": bitwise(torch.int64)},
    impls=_impls("topk_sum_and_topk_group_idx"),
    doc="The best groups, best first, by each group's top score or float32 sum of its top two (topk_gate's order).",
))

register(OpSpec(
    name="moe.unique_group_indices",
    bench=BENCH["moe.unique_group_indices"],
    oracle=references.moe_groups.unique_group_indices,
    strategy=strategies.moe_groups.unique_group_indices_cases,
    outputs={"unique_indices": bitwise(torch.int64)},
    impls=_impls("unique_group_indices"),
    doc="Each row's group indices with every repeat of an earlier non-negative entry replaced by -1.",
))

register(OpSpec(
    name="moe.aux_fi",
    bench=BENCH["moe.aux_fi"],
    oracle=aux_fi_bound,
    strategy=strategies.moe_groups.aux_fi_cases,
    outputs={"fi": summation("fp32")},
    impls=_impls("aux_fi"),
    doc="f_i = E / (K' T) * #(slots routed to expert i), fp32; NaN for T = 0.",
))
