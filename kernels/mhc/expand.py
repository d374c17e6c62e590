"""expand_to_mhc and its backward in TileLang (kernels mhc.expand_to_mhc, mhc.expand_to_mhc_bwd) and
their wrappers.  Contract: ``docs/contract/mhc.md`` (mhc.expand_to_mhc); signatures and argument
checks: ``kernels/torch/mhc_head.py``.

Both are memory-bound copies.  One thread owns one 16-byte vector (8 bf16) of a token's hidden row;
a block of 128 threads takes 1024 consecutive channels of one token, so a warp reads or writes 512
consecutive bytes of a row.  Forward: the thread loads its vector of x once and stores it into each
of the m streams.  Backward: the thread loads its vector of all m streams of grad_out first (up to
8 x 16 bytes in flight), then adds them in fp32 in stream order, starting from stream 0 (a sum of
-0s stays -0), each addition rounded once (``__fadd_rn``), and converts once to bf16 (round to
nearest even).

The tail: the vectorised configuration is used when H % 8 == 0 and every bf16 tensor is 16-byte
aligned; otherwise the scalar configuration (one element per vector) runs the same code.  m (2 .. 8)
is a run-time argument.  Launches are cut into pieces so that grid sizes stay in range.
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.

from typing import NamedTuple

import torch

from .. import _tilelang
from .._tilelang import KernelDef
from ..torch import mhc_head as eager
from ..torch.mhc import _check_tensor
from .shared import MAX_M, MIX_THREADS, MIX_VECTOR, PASS_CONFIGS, _check_tokens_fit, _launch_token_vectors


class ExpandConfig(NamedTuple):
    vectorized: bool  # 16-byte accesses: H % 8 == 0 and every bf16 tensor 16-byte aligned


EXPAND_CONFIGS = (ExpandConfig(True), ExpandConfig(False))


def build_expand_to_mhc(config: ExpandConfig):
    """prim_func(x bf16 (T, H), out bf16 (T, m, H), num_blocks, block_offset)."""
    T = _tilelang.T()
    threads = MIX_THREADS
    vec = MIX_VECTOR if config.vectorized else 1
    num_tokens, m, num_vecs = T.dynamic("num_tokens, m, num_vecs")

    @T.prim_func
    def expand_to_mhc(
        x: T.Tensor((num_tokens, num_vecs * vec), "bfloat16"),
        out: T.Tensor((num_tokens, m, num_vecs * vec), "bfloat16"),
        num_blocks: T.int32,
        block_offset: T.int64,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        tiles = T.ceildiv(num_vecs, threads)
        with T.Kernel(num_blocks, threads=threads) as block:
            tx = T.get_thread_binding()
            logical = T.alloc_var("int64", init=block_offset + block)
            token = T.alloc_var("int64", init=T.truncdiv(logical, tiles))
            v = T.alloc_var("int32", init=T.Cast("int32", T.truncmod(logical, tiles)) * threads + tx)
            row = T.alloc_local((vec,), "bfloat16")
            if token < num_tokens and v < num_vecs:
                for k in T.vectorized(vec):
                    row[k] = x[token, v * vec + k]
                for i in T.unroll(MAX_M):
                    if i < m:
                        for k in T.vectorized(vec):
                            out[token, i, v * vec + k] = row[k]

    return expand_to_mhc


def build_expand_to_mhc_bwd(config: ExpandConfig):
    """prim_func(grad_out bf16 (T, m, H), grad_x bf16 (T, H), num_blocks, block_offset)."""
    T = _tilelang.T()
    threads = MIX_THREADS
    vec = MIX_VECTOR if config.vectorized else 1
    num_tokens, m, num_vecs = T.dynamic("num_tokens, m, num_vecs")

    @T.prim_func
    def expand_to_mhc_bwd(
        grad_out: T.Tensor((num_tokens, m, num_vecs * vec), "bfloat16"),
        grad_x: T.Tensor((num_tokens, num_vecs * vec), "bfloat16"),
        num_blocks: T.int32,
        block_offset: T.int64,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        tiles = T.ceildiv(num_vecs, threads)
        with T.Kernel(num_blocks, threads=threads) as block:
            tx = T.get_thread_binding()
            logical = T.alloc_var("int64", init=block_offset + block)
            token = T.alloc_var("int64", init=T.truncdiv(logical, tiles))
            v = T.alloc_var("int32", init=T.Cast("int32", T.truncmod(logical, tiles)) * threads + tx)
            rows = T.alloc_local((MAX_M, vec), "bfloat16")
            acc = T.alloc_local((vec,), "float32")
            if token < num_tokens and v < num_vecs:
                # every stream's load first, so that up to 8 x 16 bytes are in flight
                for i in T.unroll(MAX_M):
                    if i < m:
                        for k in T.vectorized(vec):
                            rows[i, k] = grad_out[token, i, v * vec + k]
                for k in T.unroll(vec):
                    acc[k] = T.Cast("float32", rows[0, k])
                for i in T.unroll(MAX_M - 1):
                    if i + 1 < m:
                        for k in T.unroll(vec):
                            acc[k] = T.ieee_add(acc[k], T.Cast("float32", rows[i + 1, k]))
                for k in T.vectorized(vec):
                    grad_x[token, v * vec + k] = T.Cast("bfloat16", acc[k])

    return expand_to_mhc_bwd


EXPAND_TO_MHC = KernelDef("mhc.expand_to_mhc", build_expand_to_mhc, EXPAND_CONFIGS)
EXPAND_TO_MHC_BWD = KernelDef("mhc.expand_to_mhc_bwd", build_expand_to_mhc_bwd, EXPAND_CONFIGS)


def expand_to_mhc(x: torch.Tensor, m: int) -> torch.Tensor:
    """out bf16 (..., m, H): x bf16 (..., H) copied into each of the m streams, 2 <= m <= 8."""
    _check_tensor("x", x, (torch.bfloat16,))
    m = eager._check_expand_args(x, m)
    _tilelang.require_cuda("x", x)
    hidden = x.shape[-1]
    _check_tokens_fit("x", x, m * hidden)
    out = torch.empty((*x.shape[:-1], m, hidden), dtype=torch.bfloat16, device=x.device)
    tokens = x.numel() // hidden
    if tokens == 0:
        return out
    _launch_token_vectors(EXPAND_TO_MHC, ExpandConfig, tokens, hidden, (x, out), x.view(tokens, hidden),
                          out.view(tokens, m, hidden))
    return out


def expand_to_mhc_bwd(grad_out: torch.Tensor, x: torch.Tensor, m: int) -> torch.Tensor:
    """grad_x bf16 (..., H) = sum over the m streams of grad_out bf16 (..., m, H): fp32 from stream 0 in
    order, one rounding to bf16.  x gives the shape only (it is not read)."""
    _check_tensor("x", x, (torch.bfloat16,))
    m = eager._check_expand_bwd_args(grad_out, x, m)
    _tilelang.require_cuda("x", x)
    hidden = x.shape[-1]
    _check_tokens_fit("grad_out", grad_out, m * hidden)
    grad_x = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    tokens = x.numel() // hidden
    if tokens == 0:
        return grad_x
    _launch_token_vectors(EXPAND_TO_MHC_BWD, ExpandConfig, tokens, hidden, (grad_out, grad_x),
                          grad_out.view(tokens, m, hidden), grad_x.view(tokens, hidden))
    return grad_x
