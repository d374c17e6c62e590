"""tile-kernels 1.0's grouped gate and its tensor-parallel masking (docs/contract/moe_tp.md).

top2_sum_gate, one thread a token.  A score is computed from its logit wherever it is needed (sigmoid
1 / (1 + e^-x); sqrt(max(x, 0) + log1p(e^-|x|)); softmax e^(x - m) / sum, the row's m and sum found first in
two passes), always by the same expression, so each expert's float32 score and key (score + bias) are the
same in every pass.  With grouping (num_topk_groups < G) the thread scans each group once keeping its two
largest order keys (`kernels.moe.gate._order_key`: moe.topk_gate's order; a strict > keeps the first index
of equal keys), sums the two keys' values with __fadd_rn, and picks num_topk_groups groups by order key,
lowest group first (kernels/moe/groups.py's method).  The experts are then picked in num_topk passes over
the chosen groups: each pass takes the largest (order key, -index) pair below the previous pass's pick, a
packed int64 key * 2^11 + (2^11 - 1 - index), so ties go to the lower index and no expert is taken twice.
The float32 sum of the chosen scores is accumulated in pick order, then each weight is
score / (sum + 1e-20) * scale.  An unrouted token (mask False) gets -1 and 0 in every slot.  The kernel
rereads each logit K + 2 times (from L1/L2: a row is at most 4 KB); it is latency-bound and simple, one
static configuration a scoring function.

mask_indices_by_tp: the (T, K) indices are one flat run of T * K int64 entries; thread i reads entry i,
and writes -1 where the entry is negative or its rank r = v / per_gpu is not of tensor-parallel rank
tp_rank (r mod num_tp_ranks), else (r / num_tp_ranks) * per_gpu + v mod per_gpu.  Every operand is a
non-negative int64 there, so C's truncating division and remainder are the contract's floor ones and
the result is exact, equal bit for bit to kernels/torch/moe_tp.py's.  Consecutive threads touch
consecutive 8-byte entries (coalesced); the op moves 16 bytes an entry and at DeepSeek-V3's routing
(T = 16384, K = 8, 2 MB) is latency-bound.  One static configuration; every size and the four integer
parameters are runtime arguments.  Global accesses are guarded by hand (PASS_CONFIGS).
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.
from typing import NamedTuple

import torch

from kernels.torch import moe_tp as eager  # the argument checks are the eager module's

from .. import _tilelang
from .._tilelang import KernelDef
from .common import PASS_CONFIGS
from .gate import NO_KEY, _order_key

THREADS = 256
GATE_THREADS = 64
DROPPED = -1
_INDEX_BITS = 11  # E <= 1024 < 2^11
_ABOVE_EVERY_PACKED = 1 << 44  # packed keys are below 2^32 * 2^11
_EPSILON = 1e-20


class GateConfig(NamedTuple):
    scoring_func: str  # one of kernels.torch.moe_tp.SCORING_FUNCS


GATE_CONFIGS = tuple(GateConfig(f) for f in eager.SCORING_FUNCS)


def _score_expr(T, scoring_func: str, x, row_max, row_sum):
    """The float32 score of logit x (the same expression in every pass)."""
    if scoring_func == "sigmoid":
        return T.float32(1) / (T.float32(1) + T.exp(-x))
    if scoring_func == "sqrtsoftplus":
        return T.sqrt(T.max(x, T.float32(0)) + T.log1p(T.exp(-T.abs(x))))
    return T.exp(x - row_max) / row_sum


def build_top2_sum_gate(config: GateConfig):
    """prim_func(logits f32 (T, E), bias f32 (E,), routed bool (T,), topk_idx int64 (T, K), topk_weights f32 (T, K),
    num_groups, per_group, num_topk_groups, scale)."""
    T = _tilelang.T()
    num_tokens, num_experts, num_topk = T.dynamic("num_tokens, num_experts, num_topk")
    index_mask = (1 << _INDEX_BITS) - 1

    def score(x, row_max, row_sum):
        return _score_expr(T, config.scoring_func, x, row_max, row_sum)

    @T.prim_func
    def top2_sum_gate(
        logits: T.Tensor((num_tokens, num_experts), "float32"),
        bias: T.Tensor((num_experts,), "float32"),
        routed: T.Tensor((num_tokens,), "bool"),
        topk_idx: T.Tensor((num_tokens, num_topk), "int64"),
        topk_weights: T.Tensor((num_tokens, num_topk), "float32"),
        num_groups: T.int32,
        per_group: T.int32,
        num_topk_groups: T.int32,
        scale: T.float32,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(T.ceildiv(num_tokens, GATE_THREADS), threads=GATE_THREADS) as block:
            token = T.alloc_var("int64", init=T.Cast("int64", block) * GATE_THREADS + T.get_thread_binding())
            chosen = T.alloc_local((eager.MAX_GROUPS,), "int32")
            group_keys = T.alloc_local((eager.MAX_GROUPS,), "uint32")
            row_max = T.alloc_var("float32", init=-T.infinity("float32"))
            row_sum = T.alloc_var("float32", init=T.float32(0))
            first_key = T.alloc_var("uint32", init=NO_KEY)
            second_key = T.alloc_var("uint32", init=NO_KEY)
            first = T.alloc_var("float32", init=T.float32(0))
            second = T.alloc_var("float32", init=T.float32(0))
            best_key = T.alloc_var("uint32", init=NO_KEY)
            best_group = T.alloc_var("int32", init=0)
            previous = T.alloc_var("int64", init=T.int64(_ABOVE_EVERY_PACKED))
            best = T.alloc_var("int64", init=T.int64(-1))
            total = T.alloc_var("float32", init=T.float32(0))

            if token < num_tokens:
                if routed[token]:
                    if config.scoring_func == "softmax":
                        for e in T.serial(num_experts):
                            row_max = T.max(row_max, logits[token, e])
                        for e in T.serial(num_experts):
                            row_sum = row_sum + T.exp(logits[token, e] - row_max)
                    for g in T.serial(num_groups):
                        chosen[g] = T.if_then_else(num_topk_groups < num_groups, 0, 1)
                    if num_topk_groups < num_groups:
                        for g in T.serial(num_groups):
                            first_key = T.uint32(NO_KEY)
                            second_key = T.uint32(NO_KEY)
                            first = T.float32(0)
                            second = T.float32(0)
                            for m in T.serial(per_group):
                                e = g * per_group + m
                                value = score(logits[token, e], row_max, row_sum) + bias[e]
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
                            group_keys[g] = _order_key(T, T.reinterpret(T.ieee_add(first, second), "uint32"))
                        for r in T.serial(num_topk_groups):
                            best_key = T.uint32(NO_KEY)
                            best_group = 0
                            for g in T.serial(num_groups):
                                if group_keys[g] > best_key:
                                    best_key = group_keys[g]
                                    best_group = g
                            chosen[best_group] = 1
                            group_keys[best_group] = T.uint32(NO_KEY)
                    previous = T.int64(_ABOVE_EVERY_PACKED)
                    total = T.float32(0)
                    for k in T.serial(num_topk):
                        best = T.int64(-1)
                        for e in T.serial(num_experts):
                            if chosen[e // per_group] != 0:
                                value = score(logits[token, e], row_max, row_sum) + bias[e]
                                key = _order_key(T, T.reinterpret(value, "uint32"))
                                packed = T.Cast("int64", key) * (index_mask + 1) + (index_mask - e)
                                if packed < previous and packed > best:
                                    best = packed
                        previous = best
                        topk_idx[token, k] = index_mask - (best & index_mask)
                        total = total + score(logits[token, index_mask - (best & index_mask)], row_max, row_sum)
                    total = total + T.float32(_EPSILON)
                    for k in T.serial(num_topk):
                        chosen_score = score(logits[token, topk_idx[token, k]], row_max, row_sum)
                        topk_weights[token, k] = chosen_score / total * scale
                else:
                    for k in T.serial(num_topk):
                        topk_idx[token, k] = T.int64(DROPPED)
                        topk_weights[token, k] = T.float32(0)

    return top2_sum_gate


class TpConfig(NamedTuple):
    pass


TP_CONFIGS = (TpConfig(),)


def build_mask_indices_by_tp(config: TpConfig):
    """prim_func(indices int64 (N,), out int64 (N,), per_gpu, num_tp_ranks, tp_rank)."""
    T = _tilelang.T()
    num_entries = T.dynamic("num_entries")

    @T.prim_func
    def mask_indices_by_tp(
        indices: T.Tensor((num_entries,), "int64"),
        out: T.Tensor((num_entries,), "int64"),
        per_gpu: T.int64,
        num_tp_ranks: T.int64,
        tp_rank: T.int64,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(T.ceildiv(num_entries, THREADS), threads=THREADS) as block:
            entry = T.alloc_var("int64", init=T.Cast("int64", block) * THREADS + T.get_thread_binding())
            if entry < num_entries:
                value = indices[entry]
                rank = T.truncdiv(T.max(value, T.int64(0)), per_gpu)
                local = T.truncdiv(rank, num_tp_ranks) * per_gpu + T.truncmod(T.max(value, T.int64(0)), per_gpu)
                keep = (value >= 0) & (T.truncmod(rank, num_tp_ranks) == tp_rank)
                out[entry] = T.if_then_else(keep, local, T.int64(DROPPED))

    return mask_indices_by_tp


TOP2_SUM_GATE = KernelDef("moe.top2_sum_gate", build_top2_sum_gate, GATE_CONFIGS)
MASK_INDICES_BY_TP = KernelDef("moe.mask_indices_by_tp", build_mask_indices_by_tp, TP_CONFIGS)


def top2_sum_gate(logits: torch.Tensor, bias: torch.Tensor, num_topk: int, num_topk_groups: int, num_groups: int,
                  routed_scaling_factor: float, scoring_func: str,
                  mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_idx int64 (T, K), topk_weights float32 (T, K)) of the grouped gate, on a CUDA device; the rest as
    kernels/torch/moe_tp.py.  No host sync."""
    eager._check_top2_sum_gate_args(logits, bias, num_topk, num_topk_groups, num_groups, routed_scaling_factor,
                                    scoring_func, mask)
    _tilelang.require_cuda("logits", logits)
    _tilelang.check_dims_fit_int32("logits", logits)
    num_tokens, num_experts = logits.shape
    topk_idx = torch.empty((num_tokens, int(num_topk)), dtype=torch.int64, device=logits.device)
    topk_weights = torch.empty((num_tokens, int(num_topk)), dtype=torch.float32, device=logits.device)
    if num_tokens == 0:
        return topk_idx, topk_weights
    routed = mask if mask is not None else torch.ones(num_tokens, dtype=torch.bool, device=logits.device)
    kernel = _tilelang.kernel_for(TOP2_SUM_GATE, GateConfig(scoring_func), logits.device)
    with _tilelang.device_guard(logits.device):
        kernel(logits, bias, routed, topk_idx, topk_weights, int(num_groups), num_experts // int(num_groups),
               int(num_topk_groups), float(routed_scaling_factor))
    return topk_idx, topk_weights


def mask_indices_by_tp(indices: torch.Tensor, n: int, num_ep_ranks: int, tp_rank: int,
                       num_tp_ranks: int) -> torch.Tensor:
    """int64 (T, K): indices (int64 (T, K), contiguous, on a CUDA device) in tensor-parallel rank tp_rank's
    expert numbering, -1 where no expert of that rank is named; the rest as kernels/torch/moe_tp.py.
    Bitwise equal to the eager implementation.  No host sync."""
    eager._check_mask_indices_by_tp_args(indices, n, num_ep_ranks, tp_rank, num_tp_ranks)
    _tilelang.require_cuda("indices", indices)
    _tilelang.check_dims_fit_int32("indices", indices.view(-1))  # the kernel binds T * K to one int32 size
    out = torch.empty_like(indices)
    if indices.numel() == 0:
        return out
    kernel = _tilelang.kernel_for(MASK_INDICES_BY_TP, TP_CONFIGS[0], indices.device)
    with _tilelang.device_guard(indices.device):
        kernel(indices.view(-1), out.view(-1), int(n) // int(num_ep_ranks), int(num_tp_ranks), int(tp_rank))
    return out
