"""post in TileLang (kernel mhc.post), its configurations and its wrapper.

Contract: ``docs/contract/mhc.md``.  Every global access of the bf16 tensors is a 16-byte vector
(8 bf16): a warp reads or writes 32 consecutive vectors (512 bytes) of one row.  All of a thread's
loads are issued before the first use, then the terms are added in order, each product and sum rounded
once (``__fmul_rn`` / ``__fadd_rn``), with one final round-to-nearest-even conversion to bf16:
acc = x * post_n, then acc + comb[i, n] * residual_i for i = 0 .. m - 1.

post writes as much as it reads (m rows out for m + 1 in), so it needs more bytes in flight than
pre_apply_mix: a CTA of 128 threads covers `chunks` x 128 vectors of one token (chunk j of thread t is
vector tile * span + j * 128 + t), and each thread loads its x vectors and m residual vectors of every
chunk (2 x 5 x 16 bytes for m = 4) before anything else.  Only then does it stage the token's comb and
post in shared memory (threads 0 .. MP^2 + MP - 1, one weight each) and meet the barrier, so the
weights' latency hides behind the data's; then the m outputs of each chunk are stored.  m <= MP, the
loops unrolled to MP = 4 or 8 (a static configuration, as for Sinkhorn) with uniform guards, so that
m = 4 needs 64 registers (8 CTAs, 1024 threads per SM; about 160 KB of loads in flight per SM).  The
last CTA of a token may have fewer chunks than `chunks` (every chunk is guarded); `PostConfig` holds
the geometry (`POST_TUNE_CONFIGS`: candidates a GPU run may time, `POST_OVERRIDES` selects one).

The tail: the vectorised configurations are used when H % 8 == 0 and every bf16 tensor is 16-byte
aligned; otherwise a scalar configuration (one element per vector, every access guarded) runs the same
arithmetic.  m (2 .. 8) is a run-time argument.  Launches are cut into pieces so that grid sizes stay
in range.  Three shipped configurations: vectorised with MP = 4 or 8, scalar with MP = 8.
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.

from typing import NamedTuple

import torch

from .. import _tilelang
from .._tilelang import KernelDef
from ..torch import mhc as eager_mhc
from .shared import MAX_M, MIX_THREADS, MIX_VECTOR, PASS_CONFIGS, PRELUDE, _check_tokens_fit, _padded, _vectorizable


class PostConfig(NamedTuple):
    vectorized: bool  # 16-byte accesses: H % 8 == 0 and every bf16 tensor 16-byte aligned
    padded: int  # MP: the loops over m (<= MP) are unrolled to MP
    chunks: int = 2  # vectors a thread takes from each row, `threads` vectors apart
    threads: int = MIX_THREADS
    min_blocks: int = 1  # CTAs per SM promised to ptxas (caps registers at 65536 / (threads * min_blocks))
    streaming: bool = False  # outputs stored with st.global.cs (evict-first), vectorised only


# post's shipped configurations, one per (vectorized, padded): register counts from ptxas (sm_90,
# no spills): MP = 4 64 (8 CTAs, 1024 threads per SM), MP = 8 96 (5 CTAs), scalar 46.
POST_CONFIGS = (PostConfig(True, 4, min_blocks=8), PostConfig(True, 8, min_blocks=5), PostConfig(False, 8))
# Candidates a GPU run times against PostConfig(True, 4, min_blocks=8) (bitwise equal by construction):
# 4 vectors a thread (120 registers, 4 CTAs per SM), and the default geometry with streaming stores.
POST_TUNE_CONFIGS = (PostConfig(True, 4, chunks=4, min_blocks=4), PostConfig(True, 4, min_blocks=8, streaming=True))
# (vectorized, padded) -> the configuration to use instead of the shipped one (any of POST.configs),
# for a tuning run.
POST_OVERRIDES: dict[tuple[bool, int], PostConfig] = {}


def post_config(vectorized: bool, padded: int) -> PostConfig:
    """The configuration of a post call: the shipped one, unless a tuning run overrides it."""
    override = POST_OVERRIDES.get((vectorized, padded))
    if override is not None:
        return override
    return next(c for c in POST_CONFIGS if c.vectorized == vectorized and c.padded == (padded if vectorized else MAX_M))


def build_post(config: PostConfig):
    """prim_func(x (T, H), residual (T, m, H), post (T, m), comb (T, m, m), out (T, m, H), ...)."""
    T = _tilelang.T()
    vectorized, mp, chunks, threads, min_blocks, streaming = config
    vec = MIX_VECTOR if vectorized else 1
    span = chunks * threads  # vectors of a token one CTA covers
    assert threads >= mp * mp + mp, "one thread stages each weight"
    assert vectorized or not streaming, "streaming stores are 16-byte vectors"
    num_tokens, m, num_vecs = T.dynamic("num_tokens, m, num_vecs")

    @T.macro
    def load_inputs(x, residual, token, first, m, num_vecs, xv, rows):
        # chunk j is vector first + j * threads: a warp reads 32 consecutive vectors of a row
        for j in T.unroll(chunks):
            if first + j * threads < num_vecs:
                for k in T.vectorized(vec):
                    xv[j, k] = x[token, (first + j * threads) * vec + k]
                for i in T.unroll(mp):
                    if i < m:
                        for k in T.vectorized(vec):
                            rows[j, i, k] = residual[token, i, (first + j * threads) * vec + k]

    @T.macro
    def stage_weights(post, comb, token, m, tx, weights):
        # comb[i, n] at i * mp + n, then post[n] at mp * mp + n
        if tx < mp * mp:
            if tx // mp < m and tx % mp < m:
                weights[tx] = comb[token, tx // mp, tx % mp]
        elif tx < mp * mp + mp:
            if tx - mp * mp < m:
                weights[tx] = post[token, tx - mp * mp]

    @T.macro
    def store(out, token, n, v, acc, packed):
        if streaming:
            for k in T.vectorized(vec):
                packed[k] = T.Cast("bfloat16", acc[k])
            T.call_extern("handle", _tilelang.STORE16_STREAM, T.address_of(out[token, n, v * vec]),
                          T.address_of(packed[0]))
        else:
            for k in T.vectorized(vec):
                out[token, n, v * vec + k] = T.Cast("bfloat16", acc[k])

    @T.macro
    def mix_and_store(out, token, first, m, num_vecs, xv, rows, weights, acc, packed):
        # out_n = x * post_n, then + comb[i, n] * residual_i for i = 0 .. m - 1, each rounded once
        for j in T.unroll(chunks):
            if first + j * threads < num_vecs:
                for n in T.unroll(mp):
                    if n < m:
                        for k in T.unroll(vec):
                            acc[k] = T.ieee_mul(T.Cast("float32", xv[j, k]), weights[mp * mp + n])
                        for i in T.unroll(mp):
                            if i < m:
                                for k in T.unroll(vec):
                                    acc[k] = T.ieee_add(acc[k], T.ieee_mul(weights[i * mp + n],
                                                                           T.Cast("float32", rows[j, i, k])))
                        store(out, token, n, first + j * threads, acc, packed)

    @T.prim_func
    def post_mix(
        x: T.Tensor((num_tokens, num_vecs * vec), "bfloat16"),
        residual: T.Tensor((num_tokens, m, num_vecs * vec), "bfloat16"),
        post: T.Tensor((num_tokens, m), "float32"),
        comb: T.Tensor((num_tokens, m, m), "float32"),
        out: T.Tensor((num_tokens, m, num_vecs * vec), "bfloat16"),
        num_blocks: T.int32,
        block_offset: T.int64,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        tiles = T.ceildiv(num_vecs, span)
        with T.Kernel(num_blocks, threads=threads, prelude=PRELUDE) as block:
            T.annotate_min_blocks_per_sm(min_blocks)
            tx = T.get_thread_binding()
            logical = T.alloc_var("int64", init=block_offset + block)
            token = T.alloc_var("int64", init=T.truncdiv(logical, tiles))
            first = T.alloc_var("int32", init=T.Cast("int32", T.truncmod(logical, tiles)) * span + tx)
            weights = T.alloc_shared((mp * mp + mp,), "float32")
            xv = T.alloc_local((chunks, vec), "bfloat16")
            rows = T.alloc_local((chunks, mp, vec), "bfloat16")
            acc = T.alloc_local((vec,), "float32")
            packed = T.alloc_local((vec,), "bfloat16")
            if token < num_tokens:  # block-uniform
                # the data loads go out before the barrier: the weights' latency hides behind theirs
                load_inputs(x, residual, token, first, m, num_vecs, xv, rows)
                stage_weights(post, comb, token, m, tx, weights)
                T.sync_threads()
                mix_and_store(out, token, first, m, num_vecs, xv, rows, weights, acc, packed)

    return post_mix


POST = KernelDef("mhc.post", build_post, POST_CONFIGS + POST_TUNE_CONFIGS, candidates=POST_TUNE_CONFIGS)


def post(x: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """out bf16 (a, b, m, H): out[..., n, :] = x * post[..., n, 0] + sum_i comb[..., i, n] * residual[..., i, :].

    fp32 from x * post_n, then the terms of i = 0 .. m - 1 in order, each rounded once; one rounding to bf16.
    x bf16 (a, b, H), residual bf16 (a, b, m, H), post fp32 (a, b, m, 1), comb fp32 (a, b, m, m).
    """
    post_weights = post
    m = eager_mhc._check_post_args(x, residual, post_weights, comb)
    _tilelang.require_cuda("x", x)
    a, b, hidden = x.shape
    _check_tokens_fit("residual", residual, m * hidden)
    out = torch.empty((a, b, m, hidden), dtype=torch.bfloat16, device=x.device)
    tokens = a * b
    if tokens == 0:
        return out
    vectorized = _vectorizable(hidden, (x, residual, out))
    config = post_config(vectorized, _padded(m))
    kernel = _tilelang.kernel_for(POST, config, x.device)
    vecs = hidden // MIX_VECTOR if vectorized else hidden
    tiles = -(-vecs // (config.chunks * config.threads))
    with _tilelang.device_guard(x.device):
        _tilelang.launch_in_pieces(kernel, tokens * tiles, x.view(tokens, hidden), residual.view(tokens, m, hidden),
                                   post_weights.view(tokens, m), comb.view(tokens, m, m),
                                   out.view(tokens, m, hidden))
    return out
