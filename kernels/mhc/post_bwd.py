"""post's backward in TileLang (kernel mhc.post_bwd), its configurations and its wrapper.

Contract: ``docs/contract/mhc.md`` (mhc.post, Backward); signatures and argument checks: ``post_bwd``
of ``kernels/torch/mhc.py``.

One CTA of 128 threads owns one token and makes one pass over its rows.  Threads 0 .. MP^2 + MP - 1
first stage the token's comb and post in shared memory (comb[i, n] at i * MP + n, post[n] at
MP^2 + n; one weight each), then thread t takes vectors t, t + 128, ... of the hidden row (16-byte
vectors of 8 bf16, so that a warp reads or writes 512 consecutive bytes of a row).  For each vector it
loads the m rows of grad_out, x and the m rows of residual (2m + 1 vectors, all before the first use)
and

* stores grad_x = bf16(sum_n grad_out[n] post[n]) and grad_residual[i] = bf16(sum_n comb[i, n]
  grad_out[n]): fp32 from the n = 0 term (a sum of -0s stays -0), then the terms of n = 1 .. m - 1 in
  order, each product and sum rounded once (``__fmul_rn`` / ``__fadd_rn``), one conversion to bf16;
* adds grad_out[n, h] x[h] and residual[i, h] grad_out[n, h] into its own fp32 sums (MP + MP^2 of
  them, channels in order, each product and sum rounded once).

The threads' sums are then added across the CTA in shared memory by halving (`_block_sum` of
``apply_mix_bwd``), and threads 0 .. MP^2 + MP - 1 write the token's grad_comb and grad_post.  The
order of these sums is fixed (a thread's channels in order, then the halving tree), one of the orders
the contract's summation bound allows.

m <= MP, the loops unrolled to MP = 4 or 8 (a static configuration, as for the forward) with uniform
guards.  The tail: the vectorised configurations are used when H % 8 == 0 and every bf16 tensor is
16-byte aligned; otherwise a scalar configuration (one element per vector, MP = 8) runs the same
arithmetic.  Launches are cut into pieces so that grid sizes stay in range.  Three configurations:
vectorised with MP = 4 or 8, scalar with MP = 8.
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.

from typing import NamedTuple

import torch

from .. import _tilelang
from .._tilelang import KernelDef
from ..torch import mhc as eager_mhc
from .apply_mix_bwd import _block_sum
from .shared import MAX_M, MIX_THREADS, MIX_VECTOR, PASS_CONFIGS, _check_tokens_fit, _padded, _vectorizable


class PostBwdConfig(NamedTuple):
    vectorized: bool  # 16-byte accesses: H % 8 == 0 and every bf16 tensor 16-byte aligned
    padded: int  # MP: the loops over m (<= MP) are unrolled to MP


POST_BWD_CONFIGS = (PostBwdConfig(True, 4), PostBwdConfig(True, 8), PostBwdConfig(False, MAX_M))


def _post_bwd_config(vectorized: bool, m: int) -> PostBwdConfig:
    """The configuration of a call: MP = 4 or 8 for the vectorised kernel, 8 for the scalar one."""
    return PostBwdConfig(vectorized, _padded(m) if vectorized else MAX_M)


def build_post_bwd(config: PostBwdConfig):
    """prim_func(grad_out (T, m, H), x (T, H), residual (T, m, H), post (T, m), comb (T, m, m),
    grad_x (T, H), grad_residual (T, m, H), grad_post (T, m), grad_comb (T, m, m), num_blocks,
    block_offset); one CTA per token."""
    T = _tilelang.T()
    vectorized, mp = config
    threads = MIX_THREADS
    vec = MIX_VECTOR if vectorized else 1
    width = mp * mp + mp  # the per-token sums: grad_comb[i, n] at i * mp + n, grad_post[n] at mp * mp + n
    assert threads >= width, "one thread stages each weight and writes each sum"
    num_tokens, m, num_vecs = T.dynamic("num_tokens, m, num_vecs")
    reduce = _block_sum(T, threads, width)

    @T.macro
    def stage_weights(post, comb, token, m, tx, weights):
        if tx < mp * mp:
            if tx // mp < m and tx % mp < m:
                weights[tx] = comb[token, tx // mp, tx % mp]
        elif tx < width:
            if tx - mp * mp < m:
                weights[tx] = post[token, tx - mp * mp]

    @T.macro
    def load_inputs(grad_out, x, residual, token, v, m, g, xv, rows):
        for n in T.unroll(mp):
            if n < m:
                for k in T.vectorized(vec):
                    g[n, k] = grad_out[token, n, v * vec + k]
        for k in T.vectorized(vec):
            xv[k] = x[token, v * vec + k]
        for i in T.unroll(mp):
            if i < m:
                for k in T.vectorized(vec):
                    rows[i, k] = residual[token, i, v * vec + k]

    @T.macro
    def mix_and_store(grad_x, grad_residual, token, v, m, g, weights, out):
        # grad_x = sum_n g[n] post[n]; from the n = 0 term, then n = 1 .. m - 1 in order
        for k in T.unroll(vec):
            out[k] = T.ieee_mul(T.Cast("float32", g[0, k]), weights[mp * mp])
        for n in T.unroll(1, mp):
            if n < m:
                for k in T.unroll(vec):
                    out[k] = T.ieee_add(out[k], T.ieee_mul(T.Cast("float32", g[n, k]), weights[mp * mp + n]))
        for k in T.vectorized(vec):
            grad_x[token, v * vec + k] = T.Cast("bfloat16", out[k])
        # grad_residual[i] = sum_n comb[i, n] g[n], likewise
        for i in T.unroll(mp):
            if i < m:
                for k in T.unroll(vec):
                    out[k] = T.ieee_mul(weights[i * mp], T.Cast("float32", g[0, k]))
                for n in T.unroll(1, mp):
                    if n < m:
                        for k in T.unroll(vec):
                            out[k] = T.ieee_add(out[k], T.ieee_mul(weights[i * mp + n], T.Cast("float32", g[n, k])))
                for k in T.vectorized(vec):
                    grad_residual[token, i, v * vec + k] = T.Cast("bfloat16", out[k])

    @T.macro
    def accumulate(m, g, xv, rows, acc):
        for n in T.unroll(mp):
            if n < m:
                for k in T.unroll(vec):
                    acc[mp * mp + n] = T.ieee_add(acc[mp * mp + n], T.ieee_mul(T.Cast("float32", g[n, k]),
                                                                               T.Cast("float32", xv[k])))
                for i in T.unroll(mp):
                    if i < m:
                        for k in T.unroll(vec):
                            acc[i * mp + n] = T.ieee_add(acc[i * mp + n], T.ieee_mul(T.Cast("float32", rows[i, k]),
                                                                                     T.Cast("float32", g[n, k])))

    @T.macro
    def write_sums(grad_post, grad_comb, token, m, tx, staged):
        if tx < mp * mp:
            if tx // mp < m and tx % mp < m:
                grad_comb[token, tx // mp, tx % mp] = staged[tx * threads]
        elif tx < width:
            if tx - mp * mp < m:
                grad_post[token, tx - mp * mp] = staged[tx * threads]

    @T.prim_func
    def post_bwd(
        grad_out: T.Tensor((num_tokens, m, num_vecs * vec), "bfloat16"),
        x: T.Tensor((num_tokens, num_vecs * vec), "bfloat16"),
        residual: T.Tensor((num_tokens, m, num_vecs * vec), "bfloat16"),
        post: T.Tensor((num_tokens, m), "float32"),
        comb: T.Tensor((num_tokens, m, m), "float32"),
        grad_x: T.Tensor((num_tokens, num_vecs * vec), "bfloat16"),
        grad_residual: T.Tensor((num_tokens, m, num_vecs * vec), "bfloat16"),
        grad_post: T.Tensor((num_tokens, m), "float32"),
        grad_comb: T.Tensor((num_tokens, m, m), "float32"),
        num_blocks: T.int32,
        block_offset: T.int64,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(num_blocks, threads=threads) as block:
            tx = T.get_thread_binding()
            token = T.alloc_var("int64", init=block_offset + block)
            weights = T.alloc_shared((width,), "float32")
            staged = T.alloc_shared((width * threads,), "float32")
            acc = T.alloc_local((width,), "float32")
            g = T.alloc_local((mp, vec), "bfloat16")
            xv = T.alloc_local((vec,), "bfloat16")
            rows = T.alloc_local((mp, vec), "bfloat16")
            out = T.alloc_local((vec,), "float32")
            if token < num_tokens:  # block-uniform: every thread meets the barriers
                stage_weights(post, comb, token, m, tx, weights)
                for c in T.unroll(width):
                    acc[c] = T.float32(0)
                T.sync_threads()
                for step in T.serial(T.ceildiv(num_vecs, threads)):
                    if step * threads + tx < num_vecs:
                        load_inputs(grad_out, x, residual, token, step * threads + tx, m, g, xv, rows)
                        mix_and_store(grad_x, grad_residual, token, step * threads + tx, m, g, weights, out)
                        accumulate(m, g, xv, rows, acc)
                reduce(staged, acc, tx)
                write_sums(grad_post, grad_comb, token, m, tx, staged)

    return post_bwd


POST_BWD = KernelDef("mhc.post_bwd", build_post_bwd, POST_BWD_CONFIGS)


def post_bwd(grad_out: torch.Tensor, x: torch.Tensor, residual: torch.Tensor, post: torch.Tensor,
             comb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad_x bf16 (a, b, H), grad_residual bf16 (a, b, m, H), grad_post fp32 (a, b, m, 1), grad_comb fp32
    (a, b, m, m)); grad_post and grad_comb per token (see the module docstring).

    grad_out bf16 (a, b, m, H); x bf16 (a, b, H), residual bf16 (a, b, m, H), post fp32 (a, b, m, 1), comb
    fp32 (a, b, m, m).
    """
    post_weights = post
    m = eager_mhc._check_post_args(x, residual, post_weights, comb)
    eager_mhc._check_grad_out(grad_out, x, tuple(residual.shape), "(a, b, m, H)")
    _tilelang.require_cuda("x", x)
    a, b, hidden = x.shape
    _check_tokens_fit("residual", residual, m * hidden)
    grad_x = torch.empty_like(x)
    grad_residual = torch.empty_like(residual)
    grad_post = torch.empty_like(post_weights)
    grad_comb = torch.empty_like(comb)
    tokens = a * b
    if tokens == 0:
        return grad_x, grad_residual, grad_post, grad_comb
    vectorized = _vectorizable(hidden, (grad_out, x, residual, grad_x, grad_residual))
    kernel = _tilelang.kernel_for(POST_BWD, _post_bwd_config(vectorized, m), x.device)
    with _tilelang.device_guard(x.device):
        _tilelang.launch_in_pieces(kernel, tokens, grad_out.view(tokens, m, hidden), x.view(tokens, hidden),
                                   residual.view(tokens, m, hidden), post_weights.view(tokens, m),
                                   comb.view(tokens, m, m), grad_x.view(tokens, hidden),
                                   grad_residual.view(tokens, m, hidden), grad_post.view(tokens, m),
                                   grad_comb.view(tokens, m, m))
    return grad_x, grad_residual, grad_post, grad_comb
