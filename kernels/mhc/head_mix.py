"""head_compute_mix and its backward in TileLang (kernels mhc.head_compute_mix,
mhc.head_compute_mix_bwd) and their wrappers.  Contract: ``docs/contract/mhc.md``
(mhc.head_compute_mix); signatures and argument checks: ``kernels/torch/mhc_head.py``.

Forward, element-wise over the flat (T m,) mixes: one thread per 16-byte vector of 4 fp32 (the
vectorised configuration, when T m % 4 == 0 and mixes starts 16-byte aligned) or per element (the
scalar one); u = RN(RN(x scale) + base[e mod m]) (two roundings, no fma), sigmoid(u) =
1 / (1 + expf(-u)) with an IEEE division (exactly 1 at +inf, 0 at -inf, NaN for NaN), then + pre_eps.

Backward: one thread per token, grid-stride over the tokens, so that each CTA's threads sum their
own tokens' terms in registers: t = RN(grad RN(s (1 - s))), grad_mixes = RN(t scale), and per
thread the sums of t per column (grad_base) and of RN(t x) (grad_scale).  A CTA then adds its
threads' sums in shared memory by halving (8 levels for 256 threads) and writes one row of
partial sums (MAX_M + 1 values: the m base columns, then the scale) per CTA; the wrapper adds the
rows (at most 4 per SM) in fp32 with torch.  The sums follow no fixed order across CTAs, which the
summation bound of the contract allows.  One configuration each; m (2 .. 8) is a run-time argument.
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.

import functools
from typing import NamedTuple

import torch

from .. import _tilelang
from .._tilelang import KernelDef
from ..torch import mhc_head as eager
from ..torch.mhc import _check_tensor
from .shared import MAX_M, PASS_CONFIGS
from .split_mixes import _sigmoid

ELEMENT_THREADS = 256
FP32_VECTOR = 4  # fp32 per 16 bytes
BWD_THREADS = 256
BWD_LEVELS = 8  # log2(BWD_THREADS): the halving steps of the CTA's sum
PARTIALS_PER_SM = 4


class HeadMixConfig(NamedTuple):
    vectorized: bool  # 16-byte accesses: T m % 4 == 0 and mixes 16-byte aligned


HEAD_MIX_CONFIGS = (HeadMixConfig(True), HeadMixConfig(False))


class HeadMixBwdConfig(NamedTuple):
    pass


HEAD_MIX_BWD_CONFIGS = (HeadMixBwdConfig(),)


def _logit(T, x, scale, base):
    return T.ieee_add(T.ieee_mul(x, scale), base)


def build_head_compute_mix(config: HeadMixConfig):
    """prim_func(mixes f32 (N,), scale (1,), base (m,), mix f32 (N,), pre_eps, num_blocks, block_offset)."""
    T = _tilelang.T()
    threads = ELEMENT_THREADS
    vec = FP32_VECTOR if config.vectorized else 1
    num_vecs, m = T.dynamic("num_vecs, m")

    @T.prim_func
    def head_compute_mix(
        mixes: T.Tensor((num_vecs * vec,), "float32"),
        scale: T.Tensor((1,), "float32"),
        base: T.Tensor((m,), "float32"),
        mix: T.Tensor((num_vecs * vec,), "float32"),
        pre_eps: T.float32,
        num_blocks: T.int32,
        block_offset: T.int64,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(num_blocks, threads=threads) as block:
            tx = T.get_thread_binding()
            v = T.alloc_var("int64", init=(block_offset + block) * threads + tx)
            values = T.alloc_local((vec,), "float32")
            if v < num_vecs:
                for k in T.vectorized(vec):
                    values[k] = mixes[v * vec + k]
                for k in T.unroll(vec):
                    j = T.Cast("int32", T.truncmod(v * vec + k, T.Cast("int64", m)))
                    values[k] = T.ieee_add(_sigmoid(T, _logit(T, values[k], scale[0], base[j])), pre_eps)
                for k in T.vectorized(vec):
                    mix[v * vec + k] = values[k]

    return head_compute_mix


def build_head_compute_mix_bwd(config: HeadMixBwdConfig):
    """prim_func(grad_mix, mixes f32 (T, m), scale (1,), base (m,), grad_mixes f32 (T, m),
    partials f32 (P, MAX_M + 1)); one CTA per partial row."""
    T = _tilelang.T()
    threads = BWD_THREADS
    width = MAX_M + 1
    num_tokens, m, num_partials = T.dynamic("num_tokens, m, num_partials")

    @T.prim_func
    def head_compute_mix_bwd(
        grad_mix: T.Tensor((num_tokens, m), "float32"),
        mixes: T.Tensor((num_tokens, m), "float32"),
        scale: T.Tensor((1,), "float32"),
        base: T.Tensor((m,), "float32"),
        grad_mixes: T.Tensor((num_tokens, m), "float32"),
        partials: T.Tensor((num_partials, width), "float32"),
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(num_partials, threads=threads) as block:
            tx = T.get_thread_binding()
            acc = T.alloc_local((width,), "float32")
            staged = T.alloc_shared((width * threads,), "float32")
            sg = T.alloc_var("float32", init=T.float32(0))
            t = T.alloc_var("float32", init=T.float32(0))
            x = T.alloc_var("float32", init=T.float32(0))
            for c in T.unroll(width):
                acc[c] = T.float32(0)
            for step in T.serial(T.ceildiv(num_tokens, num_partials * threads)):
                token = (T.Cast("int64", step) * num_partials + block) * threads + tx
                if token < num_tokens:
                    for j in T.unroll(MAX_M):
                        if j < m:
                            x = mixes[token, j]
                            sg = _sigmoid(T, _logit(T, x, scale[0], base[j]))
                            t = T.ieee_mul(grad_mix[token, j], T.ieee_mul(sg, T.ieee_sub(T.float32(1), sg)))
                            grad_mixes[token, j] = T.ieee_mul(t, scale[0])
                            acc[j] = T.ieee_add(acc[j], t)
                            acc[MAX_M] = T.ieee_add(acc[MAX_M], T.ieee_mul(t, x))
            for c in T.unroll(width):
                staged[c * threads + tx] = acc[c]
            T.sync_threads()
            for level in T.unroll(BWD_LEVELS):
                half = T.shift_right(threads // 2, level)
                if tx < half:
                    for c in T.unroll(width):
                        staged[c * threads + tx] = T.ieee_add(staged[c * threads + tx], staged[c * threads + tx + half])
                T.sync_threads()
            if tx < width:
                partials[block, tx] = staged[tx * threads]

    return head_compute_mix_bwd


HEAD_COMPUTE_MIX = KernelDef("mhc.head_compute_mix", build_head_compute_mix, HEAD_MIX_CONFIGS)
HEAD_COMPUTE_MIX_BWD = KernelDef("mhc.head_compute_mix_bwd", build_head_compute_mix_bwd, HEAD_MIX_BWD_CONFIGS)


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _check_fp32(mixes: torch.Tensor) -> None:
    _check_tensor("mixes", mixes, (torch.float32,))


def head_compute_mix(mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, pre_eps: float) -> torch.Tensor:
    """mix fp32 (a, b, m) = sigmoid(RN(RN(mixes * scale[0]) + base)) + pre_eps."""
    _check_fp32(mixes)
    _, pre_eps = eager._check_head_args(mixes, scale, base, pre_eps)
    _tilelang.require_cuda("mixes", mixes)
    mix = torch.empty_like(mixes)
    total = mixes.numel()
    if total == 0:
        return mix
    if total > _tilelang.MAX_DIM:
        raise ValueError(f"mixes: at most {_tilelang.MAX_DIM} elements, got shape {tuple(mixes.shape)}")
    vectorized = total % FP32_VECTOR == 0 and mixes.data_ptr() % 16 == 0
    vec = FP32_VECTOR if vectorized else 1
    kernel = _tilelang.kernel_for(HEAD_COMPUTE_MIX, HeadMixConfig(vectorized), mixes.device)
    with _tilelang.device_guard(mixes.device):
        _tilelang.launch_in_pieces(kernel, -(-(total // vec) // ELEMENT_THREADS), mixes.view(-1), scale, base,
                                   mix.view(-1), pre_eps)
    return mix


def head_compute_mix_bwd(grad_mix: torch.Tensor, mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
                         pre_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad_mixes fp32 (a, b, m), grad_scale fp32 (1,), grad_base fp32 (m,)); see the module docstring."""
    _check_fp32(mixes)
    eager._check_head_bwd_args(grad_mix, mixes, scale, base, pre_eps)
    _tilelang.require_cuda("mixes", mixes)
    m = mixes.shape[-1]
    tokens = mixes.numel() // m
    grad_mixes = torch.empty_like(mixes)
    if tokens == 0:
        return grad_mixes, torch.zeros_like(scale), torch.zeros_like(base)
    if tokens > _tilelang.MAX_DIM:
        raise ValueError(f"mixes: at most {_tilelang.MAX_DIM} tokens (a * b), got shape {tuple(mixes.shape)}")
    num_partials = min(-(-tokens // BWD_THREADS), PARTIALS_PER_SM * _sm_count(mixes.device))
    partials = torch.empty((num_partials, MAX_M + 1), dtype=torch.float32, device=mixes.device)
    kernel = _tilelang.kernel_for(HEAD_COMPUTE_MIX_BWD, HEAD_MIX_BWD_CONFIGS[0], mixes.device)
    with _tilelang.device_guard(mixes.device):
        kernel(grad_mix.view(tokens, m), mixes.view(tokens, m), scale, base, grad_mixes.view(tokens, m), partials)
    sums = partials.sum(0)
    return grad_mixes, sums[MAX_M:].clone(), sums[:m].clone()
