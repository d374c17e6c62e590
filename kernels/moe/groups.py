"""The grouped MoE routing helpers (docs/contract/moe_groups.md), one thread a token.

topk_sum_and_topk_group_idx: the thread scans each group's M scores once, keeping the two largest
order keys (`kernels.moe.gate._order_key`: the order of moe.topk_gate, NaN above +inf, -0.0 equal to
+0.0) with the first index winning ties (a strict >), and the scores they came from.  The group's
score is the first of them, or their float32 sum (__fadd_rn: rounded once, whatever nvcc's flags).
The G group keys sit in a per-thread array; num_topk_groups rounds each pick the largest key,
lowest group first (strict >), write it out and clear it to `NO_KEY` (0, below every real key,
>= key(-inf) = 0x00800000).  So the output is the contract's ranking, bit for bit.

unique_group_indices: the thread compares each non-negative slot with the slots before it and writes
-1 where one is equal, else the slot's own value; K <= 32, so the K^2 / 2 compares stay in registers
and cache.

aux_fi: moe.group_count's histogram kernel counts the experts (`kernels.moe.histogram`), then a thread an
expert writes fp32((double)(c_i * E) / (double)(K' * T)): both operands are exact integers below 2^53, the
double division is IEEE (nvcc's -prec-div concerns single precision only) and its rounding to fp32 is
the correctly rounded quotient (53 >= 2 * 24 + 2), as kernels/torch/moe_groups.py computes it.

The first two read their input once and write their output once; T is the only size that grows (G, M, K are
small), so a thread a token keeps every thread busy at DeepSeek-V3's T = 16384.  One static
configuration each; every size is symbolic.  Global accesses are guarded by hand (PASS_CONFIGS).
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.
from typing import NamedTuple

import torch

from kernels.torch import moe_groups as eager  # the argument checks are the eager module's

from .. import _tilelang
from .._tilelang import KernelDef
from .common import PASS_CONFIGS
from .gate import NO_KEY, _order_key
from .histogram import group_count

THREADS = 128
MASKED = -1


class GroupsConfig(NamedTuple):
    pass


GROUPS_CONFIGS = (GroupsConfig(),)


def build_topk_group_idx(config: GroupsConfig):
    """prim_func(scores f32 (T, G * M), out int64 (T, n), G, M, num_topk_sum)."""
    T = _tilelang.T()
    num_tokens, num_experts, num_out = T.dynamic("num_tokens, num_experts, num_out")

    @T.prim_func
    def topk_sum_and_topk_group_idx(
        scores: T.Tensor((num_tokens, num_experts), "float32"),
        out: T.Tensor((num_tokens, num_out), "int64"),
        num_groups: T.int32,
        per_group: T.int32,
        num_topk_sum: T.int32,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(T.ceildiv(num_tokens, THREADS), threads=THREADS) as block:
            tx = T.get_thread_binding()
            token = T.alloc_var("int64", init=T.Cast("int64", block) * THREADS + tx)
            group_keys = T.alloc_local((eager.MAX_GROUPS,), "uint32")
            first_key = T.alloc_var("uint32", init=NO_KEY)
            second_key = T.alloc_var("uint32", init=NO_KEY)
            first = T.alloc_var("float32", init=T.float32(0))
            second = T.alloc_var("float32", init=T.float32(0))
            best_key = T.alloc_var("uint32", init=NO_KEY)
            best_group = T.alloc_var("int32", init=0)
            if token < num_tokens:
                for g in T.serial(num_groups):
                    first_key = T.uint32(NO_KEY)
                    second_key = T.uint32(NO_KEY)
                    first = T.float32(0)
                    second = T.float32(0)
                    for e in T.serial(per_group):
                        value = scores[token, g * per_group + e]
                        key = _order_key(T, T.reinterpret(value, "uint32"))
                        if key > first_key:
                            second_key = first_key
                            second = first
                            first_key = key
                            first = value
                        else:
                            if key > second_key:
                                second_key = key
                                second = value
                    total = T.if_then_else(num_topk_sum == 2, T.ieee_add(first, second), first)
                    group_keys[g] = _order_key(T, T.reinterpret(total, "uint32"))
                for r in T.serial(num_out):
                    best_key = T.uint32(NO_KEY)
                    best_group = 0
                    for g in T.serial(num_groups):
                        if group_keys[g] > best_key:
                            best_key = group_keys[g]
                            best_group = g
                    out[token, r] = T.Cast("int64", best_group)
                    group_keys[best_group] = T.uint32(NO_KEY)

    return topk_sum_and_topk_group_idx


def build_unique_group_indices(config: GroupsConfig):
    """prim_func(group_indices int64 (T, K), out int64 (T, K))."""
    T = _tilelang.T()
    num_tokens, num_slots = T.dynamic("num_tokens, num_slots")

    @T.prim_func
    def unique_group_indices(
        group_indices: T.Tensor((num_tokens, num_slots), "int64"),
        out: T.Tensor((num_tokens, num_slots), "int64"),
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(T.ceildiv(num_tokens, THREADS), threads=THREADS) as block:
            tx = T.get_thread_binding()
            token = T.alloc_var("int64", init=T.Cast("int64", block) * THREADS + tx)
            repeated = T.alloc_var("bool", init=False)
            if token < num_tokens:
                for k in T.serial(num_slots):
                    value = group_indices[token, k]
                    repeated = False
                    for j in T.serial(num_slots):
                        if j < k:
                            if group_indices[token, j] == value:
                                repeated = True
                    masked = T.if_then_else(value >= 0, T.int64(MASKED), value)
                    out[token, k] = T.if_then_else(repeated, masked, value)

    return unique_group_indices


def build_fi_from_counts(config: GroupsConfig):
    """prim_func(counts int32 (E,), fi f32 (E,), denominator f64): fi = fp32(counts * E / denominator)."""
    T = _tilelang.T()
    num_experts = T.dynamic("num_experts")

    @T.prim_func
    def fi_from_counts(
        counts: T.Tensor((num_experts,), "int32"),
        fi: T.Tensor((num_experts,), "float32"),
        denominator: T.float64,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(T.ceildiv(num_experts, THREADS), threads=THREADS) as block:
            expert = block * THREADS + T.get_thread_binding()
            if expert < num_experts:
                numerator = T.Cast("float64", T.Cast("int64", counts[expert]) * T.Cast("int64", num_experts))
                fi[expert] = T.Cast("float32", numerator / denominator)

    return fi_from_counts


TOPK_GROUP_IDX = KernelDef("moe.topk_sum_and_topk_group_idx", build_topk_group_idx, GROUPS_CONFIGS)
UNIQUE_GROUP_INDICES = KernelDef("moe.unique_group_indices", build_unique_group_indices, GROUPS_CONFIGS)
FI_FROM_COUNTS = KernelDef("moe.aux_fi", build_fi_from_counts, GROUPS_CONFIGS)


def topk_sum_and_topk_group_idx(scores: torch.Tensor, num_topk_sum: int, num_topk_groups: int) -> torch.Tensor:
    """The num_topk_groups best groups of each token, best first: int64 (T, num_topk_groups).

    scores: float32 (T, G, M), contiguous, on a CUDA device; the rest as kernels/torch/moe_groups.py.
    Bitwise equal to the eager implementation.  No host sync.
    """
    eager._check_topk_sum_and_topk_group_idx_args(scores, num_topk_sum, num_topk_groups)
    _tilelang.require_cuda("scores", scores)
    _tilelang.check_dims_fit_int32("scores", scores)
    num_tokens, num_groups, per_group = scores.shape
    out = torch.empty((num_tokens, int(num_topk_groups)), dtype=torch.int64, device=scores.device)
    if num_tokens == 0:
        return out
    kernel = _tilelang.kernel_for(TOPK_GROUP_IDX, GROUPS_CONFIGS[0], scores.device)
    with _tilelang.device_guard(scores.device):
        kernel(scores.view(num_tokens, num_groups * per_group), out, num_groups, per_group, int(num_topk_sum))
    return out


def unique_group_indices(group_indices: torch.Tensor, num_groups: int) -> torch.Tensor:
    """group_indices (int64 (T, K), contiguous, on a CUDA device) with every non-negative entry that repeats
    an earlier entry of its row replaced by -1, as a new tensor.  Bitwise equal to the eager
    implementation.  No host sync."""
    eager._check_unique_group_indices_args(group_indices, num_groups)
    _tilelang.require_cuda("group_indices", group_indices)
    _tilelang.check_dims_fit_int32("group_indices", group_indices)
    out = torch.empty_like(group_indices)
    if group_indices.shape[0] == 0:
        return out
    kernel = _tilelang.kernel_for(UNIQUE_GROUP_INDICES, GROUPS_CONFIGS[0], group_indices.device)
    with _tilelang.device_guard(group_indices.device):
        kernel(group_indices, out)
    return out


def aux_fi(topk_idx: torch.Tensor, num_experts: int, num_aux_topk: int) -> torch.Tensor:
    """float32 (num_experts,): f_i = c_i * E / (num_aux_topk * T), c_i the count of expert i in topk_idx
    (int64 (T, K), contiguous, on a CUDA device; entries outside [0, E) count nowhere), correctly rounded;
    NaN everywhere for T = 0.  Bitwise equal to the eager implementation.  No host sync."""
    eager._check_aux_fi_args(topk_idx, num_experts, num_aux_topk)
    _tilelang.require_cuda("topk_idx", topk_idx)
    counts = group_count(topk_idx, int(num_experts))
    fi = torch.empty(int(num_experts), dtype=torch.float32, device=topk_idx.device)
    kernel = _tilelang.kernel_for(FI_FROM_COUNTS, GROUPS_CONFIGS[0], topk_idx.device)
    with _tilelang.device_guard(topk_idx.device):
        kernel(counts, fi, float(int(num_aux_topk) * topk_idx.shape[0]))
    return fi
