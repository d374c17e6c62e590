"""topk_gate: the k largest scores of each row, in the order of a stable descending sort.

``topk_gate(scores, k)`` equals
``torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k]``.

One warp owns one row.  Every score is mapped to a 32-bit unsigned key whose
integer order is the order torch.sort (descending) uses (`_order_key`):

* non-negative x: bits + 0x80000000; negative x: -bits (mod 2**32), i.e.
  0x80000000 - |x|'s bits.  So -inf < finite < +inf, and -0.0 and +0.0 both
  map to 0x80000000: they compare equal (tie -> lower index);
* every NaN, whatever its sign or payload, becomes 0xFFFFFFFF, above +inf,
  because torch.sort puts NaN first when sorting descending (and, being one
  key, NaNs tie among themselves -> lower index first).

Every real key is >= key(-inf) = 0x00800000 > 0, so 0 marks "no element"
(padding past E, or an element already picked).

Lane l holds the keys of elements l, l + 32, l + 64, ... (coalesced loads) and
caches its own best (largest key, lowest index on ties: ascending scan with a
strict >).  Each of the k rounds then picks the row's best with two warp
reductions (redux.sync on sm_80+): the largest key among the lanes' cached
bests, then the smallest index among lanes whose cached key equals it.  That
element is the largest key with the lowest index, i.e. the next element of a
stable descending sort.  Its owner lane zeroes it and rescans.  Because k <= E,
each round still has an unpicked element with key > 0, so the k indices are
distinct and in [0, E).

The padded row width (32 .. 1024, a multiple of the warp size) is the only
static parameter; the number of rows, E and k are symbolic sizes.

Layouts: scores is read in place at any row stride (a slice ``buf[:, :E]`` of a wider
buffer, a slice of a batch of rows): the kernel takes it as one flat span from its first
element to its last and the row stride as a runtime argument (element ``(row, e)`` at
``row * row_stride + e``), so a contiguous and a strided scores run the same compiled
configuration.  Its loads are single 4-byte words, so no row stride needs an alignment.
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.
from typing import NamedTuple

import torch

from kernels.torch import moe as eager  # the argument checks are the eager module's
from ..torch._checks import span_view

from .. import _tilelang
from .._tilelang import KernelDef
from .common import MAX_EXPERTS, WARP

WARPS_PER_BLOCK = 4
# Row counts above this are processed in chunks (rows are int32 inside the kernel).
MAX_ROWS_PER_LAUNCH = 2**30

NAN_KEY = 0xFFFFFFFF
NO_KEY = 0


class TopkGateConfig(NamedTuple):
    width: int  # scores row length padded up to this (a multiple of 32)


WIDTHS = (32, 64, 128, 256, 512, 1024)
STATIC_CONFIGS = tuple(TopkGateConfig(width) for width in WIDTHS)


def _order_key(T, bits):
    """uint32 key of the float32 with IEEE bits `bits` (a uint32 variable).

    Its unsigned order is torch.sort's order.  Integer ops on the raw bits
    only, so no compiler flag about NaN or signed zeros can change it.
    Negative x: key = -bits (mod 2**32) = 0x80000000 - |x| bits, so -0.0
    lands on 0x80000000 like +0.0 and key(-inf) = 0x00800000.  Non-negative
    x: key = bits + 0x80000000.  NaN: NAN_KEY.
    """
    is_nan = (bits & T.uint32(0x7FFFFFFF)) > T.uint32(0x7F800000)
    is_negative = (bits & T.uint32(0x80000000)) != T.uint32(0)
    monotone = T.if_then_else(is_negative, ~bits + T.uint32(1), bits + T.uint32(0x80000000))
    return T.if_then_else(is_nan, T.uint32(NAN_KEY), monotone)


def build_topk_gate(config: TopkGateConfig):
    """prim_func(scores f32 span, out int64 (T, k), E, row stride) for rows of E <= config.width.

    scores is the flat span of a (T, E) tensor whose rows lie `row_stride` elements apart.
    """
    T = _tilelang.T()
    width = config.width
    per_lane = width // WARP  # keys each lane holds
    no_index = width  # larger than every real index
    num_tokens, span, k = T.dynamic("num_tokens, span, k")

    @T.prim_func
    def topk_gate(
        scores: T.Tensor((span,), "float32"),
        out: T.Tensor((num_tokens, k), "int64"),
        num_experts: T.int32,
        row_stride: T.int64,
    ):
        # Every access is guarded by hand (row < T, column < E): the compiler's bounds legalisation
        # cannot see that a row stride keeps a load inside the span, and would add a check per load.
        T.annotate_pass_configs({"tl.disable_safe_memory_legalize": True})
        with T.Kernel(T.ceildiv(num_tokens, WARPS_PER_BLOCK), threads=WARPS_PER_BLOCK * WARP) as block:
            tx = T.get_thread_binding()
            lane = tx % WARP
            row = block * WARPS_PER_BLOCK + tx // WARP
            keys = T.alloc_local((per_lane,), "uint32")
            best_key = T.alloc_var("uint32", init=NO_KEY)
            best_index = T.alloc_var("int32", init=no_index)
            my_pick = T.alloc_var("int32", init=0)  # lane r keeps the index picked in round r
            # `row` is uniform across the warp, so the warp reductions below
            # always run with all 32 lanes.
            if row < num_tokens:
                for j in T.unroll(per_lane):
                    if j * WARP + lane < num_experts:
                        bits = T.reinterpret(scores[T.Cast("int64", row) * row_stride + (j * WARP + lane)], "uint32")
                        keys[j] = _order_key(T, bits)
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
                        # Owner lane: drop the picked key and find its next best.
                        best_key = T.uint32(NO_KEY)
                        best_index = no_index
                        for j in T.unroll(per_lane):
                            if j * WARP + lane == picked:
                                keys[j] = T.uint32(NO_KEY)
                            if keys[j] > best_key:
                                best_key = keys[j]
                                best_index = j * WARP + lane
                if lane < k:
                    out[row, lane] = T.Cast("int64", my_pick)

    return topk_gate


TOPK_GATE = KernelDef("moe.topk_gate", build_topk_gate, STATIC_CONFIGS)


def config_for_experts(num_experts: int) -> TopkGateConfig:
    """The narrowest static configuration whose width holds `num_experts`."""
    for config in STATIC_CONFIGS:
        if num_experts <= config.width:
            return config
    raise ValueError(f"scores: at most {MAX_EXPERTS} experts (columns) are supported, got {num_experts}")


def topk_gate(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest scores of each row, as a stable descending sort orders them.

    scores: float32 (T, E), on a CUDA device, 1 <= E <= 1024, its last dimension contiguous at any row
    stride (read in place).
    k: 1 <= k <= min(32, E).
    Returns int64 (T, k) equal to
    ``torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k]``
    (NaN first, then +inf, ..., -inf; -0.0 == +0.0; ties to the lower index).
    """
    eager._check_topk_gate_args(scores, k)
    _tilelang.require_cuda("scores", scores)
    num_tokens, num_experts = scores.shape
    k = int(k)
    out = torch.empty((num_tokens, k), dtype=torch.int64, device=scores.device)
    if num_tokens == 0:
        return out
    kernel = _tilelang.kernel_for(TOPK_GATE, config_for_experts(num_experts), scores.device)
    row_stride = scores.stride(0) if num_tokens > 1 else num_experts
    with _tilelang.device_guard(scores.device):
        for start in range(0, num_tokens, MAX_ROWS_PER_LAUNCH):
            stop = min(start + MAX_ROWS_PER_LAUNCH, num_tokens)
            kernel(span_view(scores[start:stop]), out[start:stop], num_experts, row_stride)
    return out
