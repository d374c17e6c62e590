"""topk_gate_scored and its backward: the sqrt-softplus scored top-k gate
(docs/contract/moe_gate.md#moe.topk_gate_scored).

    scores = sqrt(softplus(logits)); topk_idx = the k largest scores + bias (moe.topk_gate's order);
    topk_weights[j] = routed_scaling_factor * u_j / (sum_j u_j + 1e-20)

One warp owns one row, as in ``kernels.moe.gate``: lane l scores the elements l, l + 32, ... of its row
(coalesced 4-byte loads and stores), writes each score, and keeps the order key (`gate._order_key`) of
its float32 sum with the bias.  The k rounds of two warp reductions then pick the row's largest key, lowest
index first, exactly as topk_gate does.  Lane r < k holds the r-th pick; it scores that logit again (the
same instructions on the same value, so the same bits as the score it stored), the warp adds the k picked
scores (a butterfly sum), and lane r writes the pick and its weight.

softplus(x) is x above 20 (where log1p(e^-x) < 2^-28 x) and log1p(exp(x)) elsewhere: no overflow, NaN
stays NaN, -inf gives 0.  No fast math (tilelang compiles without --use_fast_math): expf and log1pf are
libdevice's, sqrtf and the division are IEEE, subnormals are kept.

The padded row width (32 .. 1024) is the forward's only static parameter; the number of rows, E and k are
symbolic.

The backward (`topk_gate_scored_bwd`) also gives one warp to one row.  Lane r < k loads the r-th pick, its
cotangent g_r and saved weight w_r, and gathers its saved score u_r; two warp sums give D = sum u_r + 1e-20
(the forward's butterfly on the same lanes, so the forward's D to the bit) and <g, w>, and lane r computes (rsf g_r - <g, w>) / D times du/dx = -expm1(-u^2) / (2 u) (the series
u / 2 (1 - u^2 / 2) below u^2 = 2^-12), the eager backward's formula, every operation rounded once
(``__fmul_rn`` and friends: nothing is contracted into an FMA).  The picks and their gradients are then
broadcast to the warp, and each lane writes whole 16-byte vectors of the row (4 floats; one float where
E % 4 != 0): the gradient at a picked column, 0 at every other, so every element of grad_logits is written.
A repeated pick takes the value of its last slot; an index outside [0, E) reads and writes nothing.  Whether
E % 4 == 0 (16-byte stores) is the backward's only static parameter.
"""

# No `from __future__ import annotations` here: tilelang evaluates the prim_func parameter annotations.
from typing import NamedTuple

import torch

from kernels.torch import moe_gate as eager  # the argument checks are the eager module's

from .. import _tilelang
from .._tilelang import KernelDef
from .common import MAX_EXPERTS, MAX_K, WARP
from .gate import NO_KEY, _order_key

WARPS_PER_BLOCK = 4
SOFTPLUS_LINEAR_ABOVE = 20.0
NORMALIZE_EPS = 1e-20
INT32_ELEMENTS = 2**31 - 1


class GateScoredConfig(NamedTuple):
    width: int  # logits row length padded up to this (a multiple of 32)


WIDTHS = (32, 64, 128, 256, 512, 1024)
STATIC_CONFIGS = tuple(GateScoredConfig(width) for width in WIDTHS)


def _sqrt_softplus(T, x):
    return T.sqrt(T.if_then_else(x > T.float32(SOFTPLUS_LINEAR_ABOVE), x, T.log1p(T.exp(x))))


def build_topk_gate_scored(config: GateScoredConfig):
    """prim_func(logits (T, E), bias (E,), topk_idx (T, k), topk_weights (T, k), scores (T, E), scaling f32)."""
    T = _tilelang.T()
    width = config.width
    per_lane = width // WARP
    no_index = width
    num_tokens, num_experts, k = T.dynamic("num_tokens, num_experts, k")

    @T.prim_func
    def topk_gate_scored(
        logits: T.Tensor((num_tokens, num_experts), "float32"),
        bias: T.Tensor((num_experts,), "float32"),
        topk_idx: T.Tensor((num_tokens, k), "int64"),
        topk_weights: T.Tensor((num_tokens, k), "float32"),
        scores: T.Tensor((num_tokens, num_experts), "float32"),
        scaling: T.float32,
    ):
        # Every access is guarded by hand (row < T, column < E, lane < k).
        T.annotate_pass_configs({"tl.disable_safe_memory_legalize": True})
        with T.Kernel(T.ceildiv(num_tokens, WARPS_PER_BLOCK), threads=WARPS_PER_BLOCK * WARP) as block:
            tx = T.get_thread_binding()
            lane = tx % WARP
            row = block * WARPS_PER_BLOCK + tx // WARP
            keys = T.alloc_local((per_lane,), "uint32")
            best_key = T.alloc_var("uint32", init=NO_KEY)
            best_index = T.alloc_var("int32", init=no_index)
            my_pick = T.alloc_var("int32", init=0)
            my_score = T.alloc_var("float32", init=T.float32(0))
            # `row` is uniform across the warp, so the warp reductions run with all 32 lanes.
            if row < num_tokens:
                for j in T.unroll(per_lane):
                    if j * WARP + lane < num_experts:
                        u = _sqrt_softplus(T, logits[row, j * WARP + lane])
                        scores[row, j * WARP + lane] = u
                        key = T.ieee_add(u, bias[j * WARP + lane])
                        keys[j] = _order_key(T, T.reinterpret(key, "uint32"))
                    else:
                        keys[j] = T.uint32(NO_KEY)
                for j in T.unroll(per_lane):
                    if keys[j] > best_key:
                        best_key = keys[j]
                        best_index = j * WARP + lane
                for r in T.serial(k):
                    top_key = T.warp_reduce_max(best_key)
                    picked = T.warp_reduce_min(T.if_then_else(best_key == top_key, best_index, no_index))
                    if lane == r:
                        my_pick = picked
                    if best_index == picked:
                        best_key = T.uint32(NO_KEY)
                        best_index = no_index
                        for j in T.unroll(per_lane):
                            if j * WARP + lane == picked:
                                keys[j] = T.uint32(NO_KEY)
                            if keys[j] > best_key:
                                best_key = keys[j]
                                best_index = j * WARP + lane
                if lane < k:
                    my_score = _sqrt_softplus(T, logits[row, my_pick])
                denom = T.ieee_add(T.warp_reduce_sum(my_score), T.float32(NORMALIZE_EPS))
                if lane < k:
                    topk_idx[row, lane] = T.Cast("int64", my_pick)
                    topk_weights[row, lane] = T.ieee_fdiv(T.ieee_mul(scaling, my_score), denom)

    return topk_gate_scored


TOPK_GATE_SCORED = KernelDef("moe.topk_gate_scored", build_topk_gate_scored, STATIC_CONFIGS)


def config_for_experts(num_experts: int) -> GateScoredConfig:
    """The narrowest static configuration whose width holds `num_experts`."""
    for config in STATIC_CONFIGS:
        if num_experts <= config.width:
            return config
    raise ValueError(f"logits: at most {MAX_EXPERTS} experts (columns) are supported, got {num_experts}")


def topk_gate_scored(logits: torch.Tensor, bias: torch.Tensor, k: int, routed_scaling_factor: float):
    """(topk_idx int64 (T, k), topk_weights float32 (T, k), scores float32 (T, E)); arguments and results as
    ``kernels.torch.moe_gate.topk_gate_scored`` (docs/contract/moe_gate.md)."""
    k = eager._check_gate_args(logits, bias, k, routed_scaling_factor)
    _tilelang.require_cuda("logits", logits)
    num_tokens, num_experts = logits.shape
    topk_idx = torch.empty((num_tokens, k), dtype=torch.int64, device=logits.device)
    topk_weights = torch.empty((num_tokens, k), dtype=torch.float32, device=logits.device)
    scores = torch.empty_like(logits)
    if num_tokens == 0:
        return topk_idx, topk_weights, scores
    kernel = _tilelang.kernel_for(TOPK_GATE_SCORED, config_for_experts(num_experts), logits.device)
    # Element offsets are int32 inside the kernel: launch at most that many elements of logits at a time.
    rows_per_launch = INT32_ELEMENTS // num_experts
    with _tilelang.device_guard(logits.device):
        for start in range(0, num_tokens, rows_per_launch):
            stop = min(start + rows_per_launch, num_tokens)
            kernel(logits[start:stop], bias, topk_idx[start:stop], topk_weights[start:stop], scores[start:stop],
                   float(routed_scaling_factor))
    return topk_idx, topk_weights, scores


# -- backward ------------------------------------------------------------------------------------------

# Below this squared score du/dx is evaluated as its series u / 2 (1 - u^2 / 2), as the eager backward does.
SERIES_BELOW = 2.0**-12
VECTOR = 4  # floats in one 16-byte store


class GateScoredBwdConfig(NamedTuple):
    vectorized: bool  # 16-byte stores of grad_logits: E % 4 == 0


BWD_CONFIGS = (GateScoredBwdConfig(True), GateScoredBwdConfig(False))


def _sqrt_softplus_derivative(T, u):
    """d sqrt(softplus(x)) / dx from the score u: -expm1(-u^2) / (2 u), its series for small u."""
    s = T.ieee_mul(u, u)
    series = T.ieee_mul(T.ieee_mul(T.float32(0.5), u), T.ieee_sub(T.float32(1.0), T.ieee_mul(T.float32(0.5), s)))
    direct = T.ieee_fdiv(-T.call_extern("float32", "expm1f", -s), T.ieee_mul(T.float32(2.0), u))
    return T.if_then_else(s < T.float32(SERIES_BELOW), series, direct)


def build_topk_gate_scored_bwd(config: GateScoredBwdConfig):
    """prim_func(grad_topk_weights (T, k), topk_idx (T, k), topk_weights (T, k), scores (T, E),
    grad_logits (T, E), scaling f32)."""
    T = _tilelang.T()
    vec = VECTOR if config.vectorized else 1
    num_tokens, num_vecs, k = T.dynamic("num_tokens, num_vecs, k")
    num_experts = num_vecs * vec

    @T.prim_func
    def topk_gate_scored_bwd(
        grad_topk_weights: T.Tensor((num_tokens, k), "float32"),
        topk_idx: T.Tensor((num_tokens, k), "int64"),
        topk_weights: T.Tensor((num_tokens, k), "float32"),
        scores: T.Tensor((num_tokens, num_vecs * vec), "float32"),
        grad_logits: T.Tensor((num_tokens, num_vecs * vec), "float32"),
        scaling: T.float32,
    ):
        # Every access is guarded by hand (row < T, column < E, lane < k).
        T.annotate_pass_configs({"tl.disable_safe_memory_legalize": True})
        with T.Kernel(T.ceildiv(num_tokens, WARPS_PER_BLOCK), threads=WARPS_PER_BLOCK * WARP) as block:
            tx = T.get_thread_binding()
            lane = tx % WARP
            row = block * WARPS_PER_BLOCK + tx // WARP
            my_column = T.alloc_var("int32", init=-1)  # no column: a lane past k, or an index outside [0, E)
            my_score = T.alloc_var("float32", init=T.float32(0))
            my_cotangent = T.alloc_var("float32", init=T.float32(0))
            my_weighted = T.alloc_var("float32", init=T.float32(0))
            out = T.alloc_local((vec,), "float32")
            # `row` is uniform across the warp, so the warp sums and shuffles run with all 32 lanes.
            if row < num_tokens:
                if lane < k:
                    pick = topk_idx[row, lane]
                    my_cotangent = grad_topk_weights[row, lane]
                    my_weighted = T.ieee_mul(my_cotangent, topk_weights[row, lane])
                    if pick >= 0 and pick < T.Cast("int64", num_experts):
                        my_column = T.Cast("int32", pick)
                        my_score = scores[row, my_column]
                denom = T.ieee_add(T.warp_reduce_sum(my_score), T.float32(NORMALIZE_EPS))
                inner = T.warp_reduce_sum(my_weighted)
                grad_score = T.ieee_fdiv(T.ieee_sub(T.ieee_mul(scaling, my_cotangent), inner), denom)
                my_grad = T.ieee_mul(grad_score, _sqrt_softplus_derivative(T, my_score))
                for c in T.serial(T.ceildiv(num_vecs, WARP)):
                    v = c * WARP + lane
                    for e in T.unroll(vec):
                        out[e] = T.float32(0)
                    # Pick j is broadcast where it is compared (not kept in 2 x 32 registers a lane: the
                    # occupancy that hides the loads' latency needs few registers).
                    for j in T.unroll(MAX_K):
                        if j < k:
                            column = T.shfl_sync(my_column, j)
                            value = T.shfl_sync(my_grad, j)
                            for e in T.unroll(vec):
                                if column == v * vec + e:
                                    out[e] = value
                    if v < num_vecs:
                        for e in T.vectorized(vec):
                            grad_logits[row, v * vec + e] = out[e]

    return topk_gate_scored_bwd


TOPK_GATE_SCORED_BWD = KernelDef("moe.topk_gate_scored_bwd", build_topk_gate_scored_bwd, BWD_CONFIGS)


def topk_gate_scored_bwd(grad_topk_weights: torch.Tensor, logits: torch.Tensor, bias: torch.Tensor,
                         topk_idx: torch.Tensor, topk_weights: torch.Tensor, scores: torch.Tensor, k: int,
                         routed_scaling_factor: float) -> torch.Tensor:
    """grad_logits float32 (T, E) from the forward's saved topk_idx, topk_weights and scores; arguments and
    result as ``kernels.torch.moe_gate.topk_gate_scored_bwd`` (logits and bias give the shapes only)."""
    eager._check_gate_bwd_args(grad_topk_weights, logits, bias, topk_idx, topk_weights, scores, k,
                               routed_scaling_factor)
    _tilelang.require_cuda("logits", logits)
    num_tokens, num_experts = scores.shape
    grad_logits = torch.empty_like(scores)
    if num_tokens == 0:
        return grad_logits
    config = GateScoredBwdConfig(num_experts % VECTOR == 0)
    kernel = _tilelang.kernel_for(TOPK_GATE_SCORED_BWD, config, logits.device)
    # The row count is an int32 inside the kernel: launch at most 2^31 - 1 elements of scores at a time, as the
    # forward does.
    rows_per_launch = INT32_ELEMENTS // num_experts
    with _tilelang.device_guard(logits.device):
        for start in range(0, num_tokens, rows_per_launch):
            stop = min(start + rows_per_launch, num_tokens)
            kernel(grad_topk_weights[start:stop], topk_idx[start:stop], topk_weights[start:stop],
                   scores[start:stop], grad_logits[start:stop], float(routed_scaling_factor))
    return grad_logits
