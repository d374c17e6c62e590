"""pre_apply_mix's backward in TileLang (kernel mhc.pre_apply_mix_bwd), its wrapper, and the CTA sum
the mix ops' backward kernels share.

Contract: ``docs/contract/mhc.md`` (mhc.pre_apply_mix, Backward); signatures and argument checks:
``pre_apply_mix_bwd`` of ``kernels/torch/mhc.py``.

One CTA of 128 threads owns one token and makes one pass over its rows: thread t takes vectors
t, t + 128, ... of the hidden row (16-byte vectors of 8 bf16, so that a warp reads or writes 512
consecutive bytes of a row).  For each vector it loads grad_out's and all m of x's (up to 9 x 16 bytes
in flight) and

* stores grad_x[i] = bf16(RN(grad_out * mix[i])) for every i (one fp32 product, one conversion), and
* adds grad_out[h] * x[i, h] into its own fp32 sum of row i (each product and sum rounded once,
  ``__fmul_rn`` / ``__fadd_rn``, channels in order).

The threads' m sums are then added across the CTA in shared memory by halving (`_block_sum`), and
threads 0 .. m - 1 write the token's grad_mix.  The order of the sum is fixed (a thread's channels in
order, then the halving tree), one of the orders the contract's summation bound allows.

The tail: the vectorised configuration is used when H % 8 == 0 and every bf16 tensor is 16-byte
aligned; otherwise a scalar configuration (one element per vector) runs the same arithmetic.  m
(2 .. 8) is a run-time argument.  Launches are cut into pieces so that grid sizes stay in range.  Two
configurations: vectorised or scalar.
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.

import torch

from .. import _tilelang
from .._tilelang import KernelDef
from ..torch import mhc as eager_mhc
from .apply_mix import MIX_CONFIGS, MixConfig
from .shared import MAX_M, MIX_THREADS, MIX_VECTOR, PASS_CONFIGS, _check_tokens_fit, _vectorizable


def _block_sum(T, threads: int, width: int):
    """A macro (staged, acc, tx): each thread's `width` fp32 values `acc` summed over the CTA's `threads`
    threads (a power of two) by halving in `staged` (shared, width * threads); value c's sum ends in
    staged[c * threads].  Every thread of the CTA must reach it (it holds barriers)."""
    levels = threads.bit_length() - 1
    assert threads == 1 << levels, "halving needs a power-of-two CTA"

    @T.macro
    def reduce(staged, acc, tx):
        for c in T.unroll(width):
            staged[c * threads + tx] = acc[c]
        T.sync_threads()
        for level in T.unroll(levels):
            half = T.shift_right(threads // 2, level)
            if tx < half:
                for c in T.unroll(width):
                    staged[c * threads + tx] = T.ieee_add(staged[c * threads + tx], staged[c * threads + tx + half])
            T.sync_threads()

    return reduce


def build_pre_apply_mix_bwd(config: MixConfig):
    """prim_func(grad_out bf16 (T, H), x bf16 (T, m, H), mix f32 (T, m), grad_x bf16 (T, m, H),
    grad_mix f32 (T, m), num_blocks, block_offset); one CTA per token."""
    T = _tilelang.T()
    threads = MIX_THREADS
    vec = MIX_VECTOR if config.vectorized else 1
    num_tokens, m, num_vecs = T.dynamic("num_tokens, m, num_vecs")
    reduce = _block_sum(T, threads, MAX_M)

    @T.prim_func
    def pre_apply_mix_bwd(
        grad_out: T.Tensor((num_tokens, num_vecs * vec), "bfloat16"),
        x: T.Tensor((num_tokens, m, num_vecs * vec), "bfloat16"),
        mix: T.Tensor((num_tokens, m), "float32"),
        grad_x: T.Tensor((num_tokens, m, num_vecs * vec), "bfloat16"),
        grad_mix: T.Tensor((num_tokens, m), "float32"),
        num_blocks: T.int32,
        block_offset: T.int64,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(num_blocks, threads=threads) as block:
            tx = T.get_thread_binding()
            token = T.alloc_var("int64", init=block_offset + block)
            weights = T.alloc_local((MAX_M,), "float32")
            acc = T.alloc_local((MAX_M,), "float32")
            g = T.alloc_local((vec,), "bfloat16")
            rows = T.alloc_local((MAX_M, vec), "bfloat16")
            products = T.alloc_local((vec,), "float32")
            staged = T.alloc_shared((MAX_M * threads,), "float32")
            if token < num_tokens:  # block-uniform: every thread meets the barriers
                for i in T.unroll(MAX_M):
                    acc[i] = T.float32(0)
                    weights[i] = T.float32(0)
                    if i < m:
                        weights[i] = mix[token, i]
                for step in T.serial(T.ceildiv(num_vecs, threads)):
                    if step * threads + tx < num_vecs:
                        # every load first: up to 9 x 16 bytes in flight
                        for k in T.vectorized(vec):
                            g[k] = grad_out[token, (step * threads + tx) * vec + k]
                        for i in T.unroll(MAX_M):
                            if i < m:
                                for k in T.vectorized(vec):
                                    rows[i, k] = x[token, i, (step * threads + tx) * vec + k]
                        for i in T.unroll(MAX_M):
                            if i < m:
                                for k in T.unroll(vec):
                                    products[k] = T.ieee_mul(T.Cast("float32", g[k]), weights[i])
                                for k in T.vectorized(vec):
                                    grad_x[token, i, (step * threads + tx) * vec + k] = T.Cast("bfloat16",
                                                                                              products[k])
                                for k in T.unroll(vec):
                                    acc[i] = T.ieee_add(acc[i], T.ieee_mul(T.Cast("float32", g[k]),
                                                                           T.Cast("float32", rows[i, k])))
                reduce(staged, acc, tx)
                if tx < m:
                    grad_mix[token, tx] = staged[tx * threads]

    return pre_apply_mix_bwd


PRE_APPLY_MIX_BWD = KernelDef("mhc.pre_apply_mix_bwd", build_pre_apply_mix_bwd, MIX_CONFIGS)


def pre_apply_mix_bwd(grad_out: torch.Tensor, x: torch.Tensor, mix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_x bf16 (a, b, m, H), grad_mix fp32 (a, b, m, 1)): grad_x[i] = grad_out * mix[i], grad_mix[i] =
    sum_h grad_out[h] x[i, h] per token (fp32; see the module docstring).

    grad_out bf16 (a, b, H); x bf16 (a, b, m, H), H >= 1, 2 <= m <= 8; mix fp32 (a, b, m, 1).
    """
    eager_mhc._check_pre_apply_mix_args(x, mix)
    a, b, m, hidden = x.shape
    eager_mhc._check_grad_out(grad_out, x, (a, b, hidden), "(a, b, H)")
    _tilelang.require_cuda("x", x)
    _check_tokens_fit("x", x, m * hidden)
    grad_x = torch.empty_like(x)
    grad_mix = torch.empty_like(mix)
    tokens = a * b
    if tokens == 0:
        return grad_x, grad_mix
    vectorized = _vectorizable(hidden, (grad_out, x, grad_x))
    kernel = _tilelang.kernel_for(PRE_APPLY_MIX_BWD, MixConfig(vectorized), x.device)
    with _tilelang.device_guard(x.device):
        _tilelang.launch_in_pieces(kernel, tokens, grad_out.view(tokens, hidden), x.view(tokens, m, hidden),
                                   mix.view(tokens, m), grad_x.view(tokens, m, hidden), grad_mix.view(tokens, m))
    return grad_x, grad_mix
