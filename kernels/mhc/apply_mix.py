"""pre_apply_mix in TileLang (kernel mhc.pre_apply_mix) and its wrapper.

Contract: ``docs/contract/mhc.md``.  Every global access of the bf16 tensors is a 16-byte vector
(8 bf16): a warp reads or writes 32 consecutive vectors (512 bytes) of one row.  All of a thread's
loads are issued before the first use, then the terms are added in order, each product and sum rounded
once (``__fmul_rn`` / ``__fadd_rn``), with one final round-to-nearest-even conversion to bf16:
acc = +0, then acc + x_i * mix_i for i = 0 .. m - 1.

One thread owns one vector of a token's hidden row; a block of 128 threads takes 1024 consecutive
channels of one token and loads all m rows (up to 8 x 16 bytes in flight per thread).

The tail: the vectorised configurations are used when H % 8 == 0 and every bf16 tensor is 16-byte
aligned; otherwise a scalar configuration (one element per vector, every access guarded) runs the same
arithmetic.  m (2 .. 8) is a run-time argument.  Launches are cut into pieces so that grid sizes stay
in range.  Two configurations: vectorised or scalar.
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.

from typing import NamedTuple

import torch

from .. import _tilelang
from .._tilelang import KernelDef
from ..torch import mhc as eager_mhc
from .shared import MAX_M, MIX_THREADS, MIX_VECTOR, PASS_CONFIGS, _check_tokens_fit, _launch_token_vectors


class MixConfig(NamedTuple):
    vectorized: bool  # 16-byte accesses: H % 8 == 0 and every tensor 16-byte aligned


MIX_CONFIGS = (MixConfig(True), MixConfig(False))


def build_pre_apply_mix(config: MixConfig):
    """prim_func(x bf16 (T, m, H), mix f32 (T, m), out bf16 (T, H), num_blocks, block_offset)."""
    T = _tilelang.T()
    threads = MIX_THREADS
    vec = MIX_VECTOR if config.vectorized else 1
    num_tokens, m, num_vecs = T.dynamic("num_tokens, m, num_vecs")

    @T.prim_func
    def pre_apply_mix(
        x: T.Tensor((num_tokens, m, num_vecs * vec), "bfloat16"),
        mix: T.Tensor((num_tokens, m), "float32"),
        out: T.Tensor((num_tokens, num_vecs * vec), "bfloat16"),
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
                # every row's load first, so that up to 8 x 16 bytes are in flight
                for i in T.unroll(MAX_M):
                    if i < m:
                        for k in T.vectorized(vec):
                            rows[i, k] = x[token, i, v * vec + k]
                for k in T.unroll(vec):
                    acc[k] = T.float32(0)
                for i in T.unroll(MAX_M):
                    if i < m:
                        for k in T.unroll(vec):
                            acc[k] = T.ieee_add(acc[k], T.ieee_mul(T.Cast("float32", rows[i, k]), mix[token, i]))
                for k in T.vectorized(vec):
                    out[token, v * vec + k] = T.Cast("bfloat16", acc[k])

    return pre_apply_mix


PRE_APPLY_MIX = KernelDef("mhc.pre_apply_mix", build_pre_apply_mix, MIX_CONFIGS)


def pre_apply_mix(x: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
    """out bf16 (a, b, H) = sum_i x[..., i, :] * mix[..., i, 0]: fp32 from +0 in order i = 0 .. m - 1, one rounding.

    x bf16 (a, b, m, H), H >= 1, 2 <= m <= 8; mix fp32 (a, b, m, 1).
    """
    eager_mhc._check_pre_apply_mix_args(x, mix)
    _tilelang.require_cuda("x", x)
    a, b, m, hidden = x.shape
    _check_tokens_fit("x", x, m * hidden)
    out = torch.empty((a, b, hidden), dtype=torch.bfloat16, device=x.device)
    tokens = a * b
    if tokens == 0:
        return out
    _launch_token_vectors(PRE_APPLY_MIX, MixConfig, tokens, hidden, (x, out), x.view(tokens, m, hidden),
                          mix.view(tokens, m), out.view(tokens, hidden))
    return out
