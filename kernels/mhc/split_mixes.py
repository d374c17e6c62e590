"""pre_split_mixes in TileLang (kernel mhc.pre_split_mixes) and its wrapper.

Element-wise: one thread per element of mixes (T, m(m + 2)); its segment decides the scale and the
output it goes to.  u = mixes * s + base (two roundings), sigmoid(u) = 1 / (1 + expf(-u)) with an IEEE
division: exactly 1 at +inf, exactly 0 at -inf (1 / inf), NaN for NaN.  One configuration, m a
run-time argument.  Contract: ``docs/contract/mhc.md``.
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.

from typing import NamedTuple

import torch

from .. import _tilelang
from .._tilelang import KernelDef
from ..torch import mhc as eager_mhc
from .shared import PASS_CONFIGS

ELEMENTWISE_THREADS = 256


class SplitConfig(NamedTuple):
    pass


SPLIT_CONFIGS = (SplitConfig(),)


def _sigmoid(T, u):
    # 1 / (1 + exp(-u)): exp(-inf) = 0 gives 1, exp(+inf) = inf gives 1 / inf = 0, NaN stays NaN
    return T.ieee_fdiv(T.float32(1), T.ieee_add(T.float32(1), T.exp(-u)))


def build_pre_split_mixes(config: SplitConfig):
    """prim_func(mixes (T, W), scale (3,), base (W,), pre (T, m), post (T, m), comb (T, mm), ...)."""
    T = _tilelang.T()
    threads = ELEMENTWISE_THREADS
    num_tokens, width, m, mm = T.dynamic("num_tokens, width, m, mm")

    @T.prim_func
    def pre_split_mixes(
        mixes: T.Tensor((num_tokens, width), "float32"),
        scale: T.Tensor((3,), "float32"),
        base: T.Tensor((width,), "float32"),
        pre: T.Tensor((num_tokens, m), "float32"),
        post: T.Tensor((num_tokens, m), "float32"),
        comb: T.Tensor((num_tokens, mm), "float32"),
        post_mult: T.float32,
        pre_eps: T.float32,
        num_blocks: T.int32,
        block_offset: T.int64,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(num_blocks, threads=threads) as block:
            tx = T.get_thread_binding()
            flat = T.alloc_var("int64", init=(block_offset + block) * threads + tx)
            token = T.alloc_var("int64", init=T.truncdiv(flat, width))
            e = T.alloc_var("int32", init=T.Cast("int32", T.truncmod(flat, width)))
            u = T.alloc_var("float32", init=T.float32(0))
            if token < num_tokens:
                if e < m:
                    u = T.ieee_add(T.ieee_mul(mixes[token, e], scale[0]), base[e])
                    pre[token, e] = T.ieee_add(_sigmoid(T, u), pre_eps)
                elif e < 2 * m:
                    u = T.ieee_add(T.ieee_mul(mixes[token, e], scale[1]), base[e])
                    post[token, e - m] = T.ieee_mul(_sigmoid(T, u), post_mult)
                else:
                    comb[token, e - 2 * m] = T.ieee_add(T.ieee_mul(mixes[token, e], scale[2]), base[e])

    return pre_split_mixes


PRE_SPLIT_MIXES = KernelDef("mhc.pre_split_mixes", build_pre_split_mixes, SPLIT_CONFIGS)


def pre_split_mixes(mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, m: int, post_mult: float,
                    pre_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pre (a, b, m, 1), post (a, b, m, 1), comb (a, b, m, m)) from mixes (a, b, m (m + 2)), all fp32.

    u = mixes * s + base (s = scale[0], scale[1], scale[2] on the three segments); pre = sigmoid(u[:m])
    + pre_eps, post = sigmoid(u[m:2m]) * post_mult, comb = u[2m:] as (m, m); sigmoid = 1 / (1 + exp(-u)).
    """
    m, post_mult, pre_eps = eager_mhc._check_pre_split_mixes_args(mixes, scale, base, m, post_mult, pre_eps)
    _tilelang.require_cuda("mixes", mixes)
    width = m * (m + 2)
    a, b = mixes.shape[:2]
    pre = torch.empty((a, b, m, 1), dtype=torch.float32, device=mixes.device)
    post = torch.empty((a, b, m, 1), dtype=torch.float32, device=mixes.device)
    comb = torch.empty((a, b, m, m), dtype=torch.float32, device=mixes.device)
    tokens = a * b
    if tokens == 0:
        return pre, post, comb
    if tokens > _tilelang.MAX_DIM:
        raise ValueError(f"mixes: at most {_tilelang.MAX_DIM} tokens (a * b), got shape {tuple(mixes.shape)}")
    kernel = _tilelang.kernel_for(PRE_SPLIT_MIXES, SPLIT_CONFIGS[0], mixes.device)
    total_blocks = -(-tokens * width // ELEMENTWISE_THREADS)
    with _tilelang.device_guard(mixes.device):
        _tilelang.launch_in_pieces(kernel, total_blocks, mixes.view(tokens, width), scale, base, pre.view(tokens, m),
                          post.view(tokens, m), comb.view(tokens, m * m), post_mult, pre_eps)
    return pre, post, comb
