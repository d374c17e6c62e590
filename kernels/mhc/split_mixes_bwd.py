"""pre_split_mixes' backward in TileLang (kernel mhc.pre_split_mixes_bwd) and its wrapper.

Contract: ``docs/contract/mhc.md`` (mhc.pre_split_mixes, Backward); signatures and argument checks:
``pre_split_mixes_bwd`` of ``kernels/torch/mhc.py``.

One thread per token, grid-stride over the tokens, so that each CTA's threads sum their own tokens'
terms in registers.  For each entry j of the token's row (its segment decides the scale s_j and the
cotangent), with every product and sum rounded once (``__fmul_rn`` / ``__fadd_rn``):

* pre's entries: u = RN(RN(x s) + base), sigmoid(u) as the forward computes it, D = RN(p RN(1 - p)),
  t = RN(grad_pre D);
* post's entries: the same D, t = RN(RN(grad_post post_mult) D) (exactly 0 for post_mult = 0);
* comb's entries: t = grad_comb;
* grad_mixes[j] = RN(t s_j); the thread adds t into its sum of column j (grad_base) and RN(t x) into
  its sum of the entry's segment (grad_scale).

A CTA then adds its threads' sums in shared memory by halving (`_block_sum` of ``apply_mix_bwd``) and
writes one row of partial sums (MP (MP + 2) base columns, then the 3 scales) per CTA; the wrapper adds
the rows (at most 4 per SM) in fp32 with torch.  The sums follow no fixed order across CTAs, which the
contract's summation bound allows.  m <= MP, the loops over a row unrolled to MP = 4 or 8 (a static
configuration) with uniform guards.  Two configurations: MP = 4 and MP = 8.
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.

from typing import NamedTuple

import torch

from .. import _tilelang
from .._tilelang import KernelDef
from ..torch import mhc as eager_mhc
from .apply_mix_bwd import _block_sum
from .shared import PASS_CONFIGS, _padded
from .split_mixes import _sigmoid

SPLIT_BWD_THREADS = 128  # the CTA's staging (MP (MP + 2) + 3 sums a thread) stays within 48 KB for MP = 8
PARTIALS_PER_SM = 4


class SplitBwdConfig(NamedTuple):
    padded: int  # MP: a row's loops unrolled to MP (MP + 2) entries


SPLIT_BWD_CONFIGS = (SplitBwdConfig(4), SplitBwdConfig(8))


def _sums(padded: int) -> int:
    """The partial sums of a CTA: MP (MP + 2) base columns, then the 3 scales."""
    return padded * (padded + 2) + 3


def build_pre_split_mixes_bwd(config: SplitBwdConfig):
    """prim_func(grad_pre (T, m), grad_post (T, m), grad_comb (T, mm), mixes (T, W), scale (3,), base (W,),
    grad_mixes (T, W), partials f32 (P, MP (MP + 2) + 3), post_mult); one CTA per partial row."""
    T = _tilelang.T()
    threads = SPLIT_BWD_THREADS
    mp = config.padded
    entries = mp * (mp + 2)
    width = _sums(mp)
    num_tokens, m, mm, row, num_partials = T.dynamic("num_tokens, m, mm, row, num_partials")
    reduce = _block_sum(T, threads, width)

    @T.macro
    def entry(grad_pre, grad_post, grad_comb, mixes, scale, base, grad_mixes, post_mult, token, j, m, acc, v):
        # v: x, u, p, t, s (scratch); the segment of entry j decides s and t
        v[0] = mixes[token, j]
        if j < 2 * m:
            if j < m:
                v[4] = scale[0]
            else:
                v[4] = scale[1]
            v[1] = T.ieee_add(T.ieee_mul(v[0], v[4]), base[j])
            v[2] = _sigmoid(T, v[1])
            v[2] = T.ieee_mul(v[2], T.ieee_sub(T.float32(1), v[2]))  # D = p (1 - p)
            if j < m:
                v[3] = T.ieee_mul(grad_pre[token, j], v[2])
            else:
                v[3] = T.ieee_mul(T.ieee_mul(grad_post[token, j - m], post_mult), v[2])
        else:
            v[4] = scale[2]
            v[3] = grad_comb[token, j - 2 * m]
        grad_mixes[token, j] = T.ieee_mul(v[3], v[4])
        acc[j] = T.ieee_add(acc[j], v[3])
        if j < m:
            acc[entries] = T.ieee_add(acc[entries], T.ieee_mul(v[3], v[0]))
        elif j < 2 * m:
            acc[entries + 1] = T.ieee_add(acc[entries + 1], T.ieee_mul(v[3], v[0]))
        else:
            acc[entries + 2] = T.ieee_add(acc[entries + 2], T.ieee_mul(v[3], v[0]))

    @T.prim_func
    def pre_split_mixes_bwd(
        grad_pre: T.Tensor((num_tokens, m), "float32"),
        grad_post: T.Tensor((num_tokens, m), "float32"),
        grad_comb: T.Tensor((num_tokens, mm), "float32"),
        mixes: T.Tensor((num_tokens, row), "float32"),
        scale: T.Tensor((3,), "float32"),
        base: T.Tensor((row,), "float32"),
        grad_mixes: T.Tensor((num_tokens, row), "float32"),
        partials: T.Tensor((num_partials, width), "float32"),
        post_mult: T.float32,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(num_partials, threads=threads) as block:
            tx = T.get_thread_binding()
            acc = T.alloc_local((width,), "float32")
            v = T.alloc_local((5,), "float32")
            staged = T.alloc_shared((width * threads,), "float32")
            for c in T.unroll(width):
                acc[c] = T.float32(0)
            for step in T.serial(T.ceildiv(num_tokens, num_partials * threads)):
                token = (T.Cast("int64", step) * num_partials + block) * threads + tx
                if token < num_tokens:
                    for j in T.unroll(entries):
                        if j < row:
                            entry(grad_pre, grad_post, grad_comb, mixes, scale, base, grad_mixes, post_mult, token,
                                  j, m, acc, v)
            reduce(staged, acc, tx)
            if tx < width:
                partials[block, tx] = staged[tx * threads]

    return pre_split_mixes_bwd


PRE_SPLIT_MIXES_BWD = KernelDef("mhc.pre_split_mixes_bwd", build_pre_split_mixes_bwd, SPLIT_BWD_CONFIGS)


def pre_split_mixes_bwd(grad_pre: torch.Tensor, grad_post: torch.Tensor, grad_comb: torch.Tensor,
                        mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, m: int, post_mult: float,
                        pre_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad_mixes fp32 (a, b, m (m + 2)), grad_scale fp32 (3,), grad_base fp32 (m (m + 2),)); the scale and
    base gradients summed over tokens (see the module docstring).  pre_eps does not enter."""
    m, post_mult = eager_mhc._check_pre_split_mixes_bwd_args(grad_pre, grad_post, grad_comb, mixes, scale, base, m,
                                                            post_mult, pre_eps)
    _tilelang.require_cuda("mixes", mixes)
    width = m * (m + 2)
    tokens = mixes.shape[0] * mixes.shape[1]
    grad_mixes = torch.empty_like(mixes)
    if tokens == 0:
        return grad_mixes, torch.zeros_like(scale), torch.zeros_like(base)
    if tokens > _tilelang.MAX_DIM:
        raise ValueError(f"mixes: at most {_tilelang.MAX_DIM} tokens (a * b), got shape {tuple(mixes.shape)}")
    config = SplitBwdConfig(_padded(m))
    sms = torch.cuda.get_device_properties(mixes.device).multi_processor_count
    num_partials = min(-(-tokens // SPLIT_BWD_THREADS), PARTIALS_PER_SM * sms)
    partials = torch.empty((num_partials, _sums(config.padded)), dtype=torch.float32, device=mixes.device)
    kernel = _tilelang.kernel_for(PRE_SPLIT_MIXES_BWD, config, mixes.device)
    with _tilelang.device_guard(mixes.device):
        kernel(grad_pre.view(tokens, m), grad_post.view(tokens, m), grad_comb.view(tokens, m * m),
               mixes.view(tokens, width), scale, base, grad_mixes.view(tokens, width), partials, post_mult)
    sums = partials.sum(0)
    entries = config.padded * (config.padded + 2)
    return grad_mixes, sums[entries:].clone(), sums[:width].clone()
