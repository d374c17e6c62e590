"""reduce_fused: each token's K expanded rows, weighted and summed in slot order.

A gather: logical block (t, tile) stages the token's K positions and weights
(and, for e4m3, the K row scales) in shared memory; each thread owns one
16-byte vector of columns (8 bf16, 4 fp32 or 16 e4m3 values) or, in the
fallback, one column.  It loads the rows of up to 8 slots at once (only
slots with 0 <= pos < N), then adds their terms in slot order:
acc = __fadd_rn(acc, __fmul_rn(w, x)) from acc = +0, with x = __fmul_rn(q, sf)
for e4m3.  The _rn intrinsics are never contracted into an FMA, so every
product and every sum is rounded once, as in the eager PyTorch
implementation, which this kernel matches bit for bit (NaN payloads aside:
the bf16 conversion, cvt.rn.bf16.f32, returns the canonical NaN).  One final
round-to-nearest-even conversion to the output dtype.
Static configuration: x dtype and vectorized (H a multiple of the vector and
16-byte aligned rows) or not.
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.
from typing import NamedTuple

import torch

from kernels.torch import moe as eager  # the argument checks are the eager module's

from .. import _tilelang
from .._tilelang import KernelDef
from .common import MAX_K, PASS_CONFIGS, _ceildiv

REDUCE_THREADS = 128
REDUCE_BATCH = 8  # slots whose rows a thread loads before adding them (bytes in flight)
REDUCE_VECTOR = {"bfloat16": 8, "float32": 4, "float8_e4m3fn": 16}  # elements per 16 bytes
REDUCE_OUT = {"bfloat16": "bfloat16", "float32": "float32", "float8_e4m3fn": "bfloat16"}
TORCH_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float8_e4m3fn: "float8_e4m3fn"}


class ReduceConfig(NamedTuple):
    dtype: str  # x dtype: "bfloat16", "float32" or "float8_e4m3fn" (with a per-row sf)
    vectorized: bool  # 16-byte accesses; needs H a multiple of 16 bytes' worth and aligned x, out


REDUCE_CONFIGS = tuple(ReduceConfig(dtype, vectorized) for dtype in REDUCE_VECTOR for vectorized in (True, False))


def build_reduce(config: ReduceConfig):
    """prim_func(x (N, H), topk_weights (T, K), token_topk_to_pos (T, K)[, sf (N,)], out (T, H), ...)."""
    T = _tilelang.T()
    threads, batch = REDUCE_THREADS, REDUCE_BATCH
    dtype, out_dtype = config.dtype, REDUCE_OUT[config.dtype]
    vec = REDUCE_VECTOR[dtype] if config.vectorized else 1
    scaled = dtype == "float8_e4m3fn"
    num_rows, num_vecs, num_tokens, num_slots, sf_rows = T.dynamic(
        "num_rows, num_vecs, num_tokens, num_slots, sf_rows")

    @T.macro
    def body(x, topk_weights, token_topk_to_pos, sf, out, num_blocks, block_offset):
        tiles = T.ceildiv(num_vecs, threads)
        with T.Kernel(num_blocks, threads=threads) as block:
            tx = T.get_thread_binding()
            logical = T.alloc_var("int64", init=block_offset + block)
            token = T.alloc_var("int64", init=T.truncdiv(logical, tiles))
            v = T.alloc_var("int32", init=T.Cast("int32", T.truncmod(logical, tiles)) * threads + tx)
            positions = T.alloc_shared((MAX_K,), "int32")
            weights = T.alloc_shared((MAX_K,), "float32")
            scales = T.alloc_shared((MAX_K,), "float32")
            rows = T.alloc_local((batch, vec), dtype)
            acc = T.alloc_local((vec,), "float32")
            if token < num_tokens:  # always true for launched blocks; block-uniform
                if tx < num_slots:
                    positions[tx] = token_topk_to_pos[token, tx]
                    weights[tx] = topk_weights[token, tx]
                    if scaled:
                        scales[tx] = T.float32(0)
                        if token_topk_to_pos[token, tx] >= 0 and token_topk_to_pos[token, tx] < num_rows:
                            scales[tx] = sf[token_topk_to_pos[token, tx]]
                T.sync_threads()
                if v < num_vecs:
                    for i in T.unroll(vec):
                        acc[i] = T.float32(0)
                    for kb in T.serial(T.ceildiv(num_slots, batch)):
                        # Loads of up to `batch` slots first (independent, in flight together) ...
                        for u in T.unroll(batch):
                            if kb * batch + u < num_slots:
                                if positions[kb * batch + u] >= 0 and positions[kb * batch + u] < num_rows:
                                    for i in T.vectorized(vec):
                                        rows[u, i] = x[positions[kb * batch + u], v * vec + i]
                        # ... then their terms, added in slot order, each op rounded once.
                        for u in T.unroll(batch):
                            if kb * batch + u < num_slots:
                                if positions[kb * batch + u] >= 0 and positions[kb * batch + u] < num_rows:
                                    for i in T.unroll(vec):
                                        if scaled:
                                            acc[i] = T.ieee_add(acc[i], T.ieee_mul(
                                                weights[kb * batch + u],
                                                T.ieee_mul(T.Cast("float32", rows[u, i]), scales[kb * batch + u])))
                                        else:
                                            acc[i] = T.ieee_add(acc[i], T.ieee_mul(
                                                weights[kb * batch + u], T.Cast("float32", rows[u, i])))
                    for i in T.vectorized(vec):
                        out[token, v * vec + i] = T.Cast(out_dtype, acc[i])

    if scaled:
        @T.prim_func
        def reduce_fused_scaled(
            x: T.Tensor((num_rows, num_vecs * vec), dtype),
            topk_weights: T.Tensor((num_tokens, num_slots), "float32"),
            token_topk_to_pos: T.Tensor((num_tokens, num_slots), "int32"),
            sf: T.Tensor((sf_rows,), "float32"),
            out: T.Tensor((num_tokens, num_vecs * vec), out_dtype),
            num_blocks: T.int32,
            block_offset: T.int64,
        ):
            T.annotate_pass_configs(PASS_CONFIGS)
            body(x, topk_weights, token_topk_to_pos, sf, out, num_blocks, block_offset)

        return reduce_fused_scaled

    @T.prim_func
    def reduce_fused(
        x: T.Tensor((num_rows, num_vecs * vec), dtype),
        topk_weights: T.Tensor((num_tokens, num_slots), "float32"),
        token_topk_to_pos: T.Tensor((num_tokens, num_slots), "int32"),
        out: T.Tensor((num_tokens, num_vecs * vec), out_dtype),
        num_blocks: T.int32,
        block_offset: T.int64,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        body(x, topk_weights, token_topk_to_pos, None, out, num_blocks, block_offset)

    return reduce_fused


REDUCE_FUSED = KernelDef("moe.reduce_fused", build_reduce, REDUCE_CONFIGS)


def _check_reduce_args(x, topk_weights, token_topk_to_pos, x_sf) -> None:
    eager._check_reduce_args(x, topk_weights, token_topk_to_pos, x_sf)
    _tilelang.require_cuda("x", x)
    _tilelang.check_dims_fit_int32("x", x)


def reduce_fused(x: torch.Tensor, topk_weights: torch.Tensor, token_topk_to_pos: torch.Tensor,
                 x_sf: torch.Tensor | None = None) -> torch.Tensor:
    """out[t] = sum_k w[t, k] * x[pos(t, k)] over slots with 0 <= pos < N, fp32 in slot order, one rounding.

    x: (N, H) bfloat16, float32, or float8_e4m3fn with x_sf float32 (N, 1)
    (x = q * sf).  out: (T, H), bfloat16 (float32 for a float32 x).  Bitwise
    equal to kernels/torch/moe.py's reduce_fused.  No host sync.
    """
    _check_reduce_args(x, topk_weights, token_topk_to_pos, x_sf)
    num_rows, hidden = x.shape
    num_tokens, k = topk_weights.shape
    out_dtype = torch.float32 if x.dtype == torch.float32 else torch.bfloat16
    if num_tokens == 0 or num_rows == 0:  # no slot can reach a row: zeros
        return torch.zeros((num_tokens, hidden), dtype=out_dtype, device=x.device)
    out = torch.empty((num_tokens, hidden), dtype=out_dtype, device=x.device)
    name = TORCH_DTYPE_NAMES[x.dtype]
    vec = REDUCE_VECTOR[name]
    vectorized = hidden % vec == 0 and x.data_ptr() % 16 == 0 and out.data_ptr() % 16 == 0
    config = ReduceConfig(name, vectorized)
    kernel = _tilelang.kernel_for(REDUCE_FUSED, config, x.device)
    total = num_tokens * _ceildiv(hidden // vec if vectorized else hidden, REDUCE_THREADS)
    # fp8 data goes in as its own dtype (tilelang converts it); one sf per row, stride 1.
    args = (x, topk_weights, token_topk_to_pos)
    if x_sf is not None:
        args += (torch.as_strided(x_sf, (num_rows,), (1,)),)
    with _tilelang.device_guard(x.device):
        _tilelang.launch_in_pieces(kernel, total, *args, out)
    return out
