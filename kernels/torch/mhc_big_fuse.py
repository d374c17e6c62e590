"""Eager PyTorch implementation of mHC's fused pre-block forward, in working precision (fp32): the
composition of the eager stages of kernels.torch.mhc_fused and kernels.torch.mhc.

The contract is docs/contract/mhc_big_fuse.md.  The signature and argument checks below are every
implementation's, the TileLang one of ``kernels.mhc.big_fuse`` included (same tensors, same errors: a
TypeError or ValueError naming the argument):

``pre_big_fuse(gemm_out_mul, gemm_out_sqrsum, scale, base, residual, rms_eps, pre_eps, sinkhorn_eps,
post_mult, sinkhorn_repeat) -> (post_mix, comb_mix, layer_input)``
    gemm_out_mul    fp32 (S, N, m (m + 2)), S >= 1, N >= 0: the projection GEMM's split-K partials
    gemm_out_sqrsum fp32 (S, N): the partial sums of squares of the token's m H residual values
    scale           fp32 (3,); base fp32 (m (m + 2),)
    residual        bf16 (N, m, H), 2 <= m <= 8, H >= 1; all contiguous, on one device
    rms_eps         finite float > 0 within fp32's range
    pre_eps         finite float >= 0 within fp32's range; post_mult finite within fp32's range
    sinkhorn_eps    finite float > 0 within fp32's range; sinkhorn_repeat int >= 1
    post_mix        fp32 (N, m):    pre_split_mixes' post of mixes = the RMS-normalised sum of the partials
    comb_mix        fp32 (N, m, m): sinkhorn of pre_split_mixes' comb logits
    layer_input     bf16 (N, H):    pre_apply_mix of residual with pre_split_mixes' pre

The stages run one after the other in fp32, each with its own eager code, the RMS group being the
token's m H values.
"""

from __future__ import annotations

import numbers

import torch

from . import mhc as eager_mhc
from . import mhc_fused as eager_fused
from .mhc import _check_float, _check_m, _check_shape, _check_tensor


def _check_positive(name: str, value: object) -> float:
    value = _check_float(name, value)
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return value


def _check_repeat(sinkhorn_repeat: object) -> int:
    if isinstance(sinkhorn_repeat, bool) or not isinstance(sinkhorn_repeat, numbers.Integral):
        raise TypeError(f"sinkhorn_repeat must be an int, got {type(sinkhorn_repeat).__name__}")
    if sinkhorn_repeat < 1:
        raise ValueError(f"sinkhorn_repeat must be >= 1, got {sinkhorn_repeat}")
    return int(sinkhorn_repeat)


def _check_pre_big_fuse_args(gemm_out_mul, gemm_out_sqrsum, scale, base, residual, rms_eps, pre_eps, sinkhorn_eps,
                             post_mult, sinkhorn_repeat) -> tuple[float, float, float, float, int]:
    """pre_big_fuse's checks (every implementation's): (rms_eps, pre_eps, sinkhorn_eps, post_mult, sinkhorn_repeat)."""
    _check_tensor("residual", residual, (torch.bfloat16,))
    if residual.dim() != 3 or residual.shape[-1] < 1:
        raise ValueError(f"residual must have shape (N, m, H) with H >= 1, got {tuple(residual.shape)}")
    _check_m("residual", residual.shape[1])
    tokens, m, _ = residual.shape
    width = m * (m + 2)
    device = residual.device
    _check_tensor("gemm_out_mul", gemm_out_mul, (torch.float32,), device, "residual")
    if gemm_out_mul.dim() != 3 or gemm_out_mul.shape[0] < 1 or tuple(gemm_out_mul.shape[1:]) != (tokens, width):
        raise ValueError(f"gemm_out_mul must have shape (S, N, m (m + 2)) = (S >= 1, {tokens}, {width}), "
                         f"got {tuple(gemm_out_mul.shape)}")
    _check_tensor("gemm_out_sqrsum", gemm_out_sqrsum, (torch.float32,), device, "residual")
    _check_shape("gemm_out_sqrsum", gemm_out_sqrsum, tuple(gemm_out_mul.shape[:2]), "(S, N)")
    _check_tensor("scale", scale, (torch.float32,), device, "residual")
    _check_shape("scale", scale, (3,), "(3,)")
    _check_tensor("base", base, (torch.float32,), device, "residual")
    _check_shape("base", base, (width,), "(m (m + 2),)")
    return (_check_positive("rms_eps", rms_eps), _check_float("pre_eps", pre_eps, nonnegative=True),
            _check_positive("sinkhorn_eps", sinkhorn_eps), _check_float("post_mult", post_mult),
            _check_repeat(sinkhorn_repeat))


def pre_big_fuse(gemm_out_mul: torch.Tensor, gemm_out_sqrsum: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
                 residual: torch.Tensor, rms_eps: float, pre_eps: float, sinkhorn_eps: float, post_mult: float,
                 sinkhorn_repeat: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(post_mix fp32 (N, m), comb_mix fp32 (N, m, m), layer_input bf16 (N, H)); see the module docstring."""
    rms_eps, pre_eps, sinkhorn_eps, post_mult, sinkhorn_repeat = _check_pre_big_fuse_args(
        gemm_out_mul, gemm_out_sqrsum, scale, base, residual, rms_eps, pre_eps, sinkhorn_eps, post_mult,
        sinkhorn_repeat)
    _, m, hidden = residual.shape
    _, _, mixes = eager_fused.reduce_partials_and_rmsnorm(gemm_out_mul[:, :, None], gemm_out_sqrsum[:, :, None],
                                                          m * hidden, rms_eps)
    pre, post, logits = eager_mhc.pre_split_mixes(mixes[None], scale, base, m, post_mult, pre_eps)
    comb = eager_mhc.sinkhorn(logits[0], sinkhorn_repeat, sinkhorn_eps)
    layer_input = eager_mhc.pre_apply_mix(residual[None], pre)[0]
    return post[0, :, :, 0].contiguous(), comb, layer_input
