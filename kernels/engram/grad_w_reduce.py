"""The grad_w reduction: the gate backward's per-block partials summed in a fixed order, and engram.grad_w_reduce.

grad_w[j] = sum over b of partials[b, j], j = h H + i: a CTA of 8 warps takes 128 consecutive j (a
float4 per lane), warp q adds the partials b = q, q + 8, q + 16, ... in increasing b, and the 8 warp
sums are added in warp order.  The number of blocks is a function of T alone
(``configs.backward_blocks``), so grad_w is bitwise reproducible run to run and device to device.
Its error stays within the spec's gamma(T - 1) bound: every path from a term to the result has at
most T - 1 additions.

The fused configuration is the op engram.grad_w_reduce (docs/contract/engram.md#engram.grad_w_reduce):
the same sums S, then each updated accumulator is acc + S w with one rounded product and one rounded
sum, inside the spec's summation bound of P + 1 roundings a term.
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.

from typing import NamedTuple

from .. import _tilelang
from .._tilelang import KernelDef
from .configs import PASS_CONFIGS, WARP

REDUCE_THREADS = 256
REDUCE_WARPS = REDUCE_THREADS // WARP
REDUCE_COLUMNS = WARP * 4  # grad_w elements a reduce CTA takes (a float4 per lane)


class ReduceConfig(NamedTuple):
    # The epilogue: False writes grad_w = S (the gate backward's reduction); True accumulates
    # grad_weight_hidden += S * weight_embed and grad_weight_embed += S * weight_hidden (engram.grad_w_reduce).
    fused: bool = False


REDUCE_CONFIGS = (ReduceConfig(), ReduceConfig(fused=True))

# float4 loads in flight a lane: 16, so that at the benchmark's 128 partials (8 MiB) each warp issues
# all of its 16 before its first add, one DRAM round trip (with 8 in flight, the reduction of 256
# partials takes 8.3 us: reports/evidence/engram.md#grad-w-reduce).
# The adds keep their order (increasing b), so the bits do not depend on it.
UNROLL = 16


def _column_sum_macro(T):
    """column_sum(partials, num_parts, n4, block, tx, red, acc, tmp): for tx < 128 whose column j =
    128 block + tx is < 4 n4, acc[0] <- sum over b of partials[b, j] in the fixed order of the module
    docstring (other threads' acc[0] is unspecified).  Has the CTA's one barrier."""

    @T.macro
    def column_sum(partials, num_parts, n4, block, tx, red, acc, tmp):
        lane = tx % WARP
        warp = tx // WARP
        col = T.alloc_var("int32", init=block * WARP + lane)  # float4 column
        for e in T.unroll(4):
            acc[e] = T.float32(0)
        if col < n4:
            for it in T.serial(T.ceildiv(num_parts, REDUCE_WARPS * UNROLL)):
                for u in T.unroll(UNROLL):
                    if (it * UNROLL + u) * REDUCE_WARPS + warp < num_parts:
                        for e in T.vectorized(4):
                            tmp[u, e] = partials[(it * UNROLL + u) * REDUCE_WARPS + warp, col * 4 + e]
                for u in T.unroll(UNROLL):
                    if (it * UNROLL + u) * REDUCE_WARPS + warp < num_parts:
                        for e in T.unroll(4):
                            acc[e] = acc[e] + tmp[u, e]
        for e in T.vectorized(4):
            red[warp * REDUCE_COLUMNS + lane * 4 + e] = acc[e]
        T.sync_threads()
        if tx < REDUCE_COLUMNS:
            if block * REDUCE_COLUMNS + tx < n4 * 4:
                acc[0] = red[tx]
                for q in T.unroll(1, REDUCE_WARPS):
                    acc[0] = acc[0] + red[q * REDUCE_COLUMNS + tx]

    return column_sum


def build_grad_w_reduce(config: ReduceConfig):
    """The reduction's prim_func: `config.fused` picks the epilogue.

    Not fused: prim_func(partials (P, n), grad_w (n,)), grad_w[j] = S[j].
    Fused: prim_func(partials (P, n), weight_hidden, weight_embed bf16 (n,), grad_weight_hidden,
    grad_weight_embed fp32 (n,)): grad_weight_hidden[j] = grad_weight_hidden[j] + S[j] * weight_embed[j]
    and grad_weight_embed[j] = grad_weight_embed[j] + S[j] * weight_hidden[j], each product and sum
    rounded once (``__fmul_rn``, ``__fadd_rn``: never contracted to an FMA).

    n = hc H (a multiple of 4), S[j] = sum over b of partials[b, j]: CTA c takes j in [128 c, 128 c + 128),
    a float4 per lane; warp q adds b = q, q + 8, ... in increasing order (sixteen loads in flight), then
    the 8 warp sums are added in warp order."""
    if config.fused:
        return _build_fused(config)
    T = _tilelang.T()
    num_parts, n4 = T.dynamic("num_parts, n4")
    column_sum = _column_sum_macro(T)

    @T.prim_func
    def engram_grad_w_reduce(
        partials: T.Tensor((num_parts, n4 * 4), "float32"),
        grad_w: T.Tensor((n4 * 4,), "float32"),
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(T.ceildiv(n4, WARP), threads=REDUCE_THREADS) as block:
            tx = T.get_thread_binding()
            red = T.alloc_shared((REDUCE_WARPS * REDUCE_COLUMNS,), "float32")
            acc = T.alloc_local((4,), "float32")
            tmp = T.alloc_local((UNROLL, 4), "float32")
            column_sum(partials, num_parts, n4, block, tx, red, acc, tmp)
            if tx < REDUCE_COLUMNS:
                if block * REDUCE_COLUMNS + tx < n4 * 4:
                    grad_w[block * REDUCE_COLUMNS + tx] = acc[0]

    return engram_grad_w_reduce


def _build_fused(config: ReduceConfig):
    T = _tilelang.T()
    num_parts, n4 = T.dynamic("num_parts, n4")
    column_sum = _column_sum_macro(T)

    @T.prim_func
    def engram_grad_w_reduce_fused(
        partials: T.Tensor((num_parts, n4 * 4), "float32"),
        weight_hidden: T.Tensor((n4 * 4,), "bfloat16"),
        weight_embed: T.Tensor((n4 * 4,), "bfloat16"),
        grad_weight_hidden: T.Tensor((n4 * 4,), "float32"),
        grad_weight_embed: T.Tensor((n4 * 4,), "float32"),
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(T.ceildiv(n4, WARP), threads=REDUCE_THREADS) as block:
            tx = T.get_thread_binding()
            red = T.alloc_shared((REDUCE_WARPS * REDUCE_COLUMNS,), "float32")
            acc = T.alloc_local((4,), "float32")
            tmp = T.alloc_local((UNROLL, 4), "float32")
            column_sum(partials, num_parts, n4, block, tx, red, acc, tmp)
            if tx < REDUCE_COLUMNS:
                if block * REDUCE_COLUMNS + tx < n4 * 4:
                    j = block * REDUCE_COLUMNS + tx
                    grad_weight_hidden[j] = T.ieee_add(
                        grad_weight_hidden[j], T.ieee_mul(acc[0], T.Cast("float32", weight_embed[j])))
                    grad_weight_embed[j] = T.ieee_add(
                        grad_weight_embed[j], T.ieee_mul(acc[0], T.Cast("float32", weight_hidden[j])))

    return engram_grad_w_reduce_fused


GRAD_W_REDUCE = KernelDef("engram.grad_w_reduce", build_grad_w_reduce, REDUCE_CONFIGS)
