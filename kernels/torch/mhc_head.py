"""Eager PyTorch implementations of the two ends of the mHC stack, forward and backward, in
working precision: `expand_to_mhc` and `head_compute_mix`.

The contract is docs/contract/mhc.md (sections mhc.expand_to_mhc and mhc.head_compute_mix).
The signatures below are every implementation's, the TileLang kernels of
``kernels.mhc.expand`` and ``kernels.mhc.head_mix`` included (same tensors, same errors for the
same bad arguments: a TypeError or ValueError naming the argument):

``expand_to_mhc(x, m) -> out``
    x    bf16 (..., H), at least one dimension, H >= 1, contiguous; leading dimensions any
         (>= 0), any of them 0
    m    int, 2 <= m <= 8
    out  bf16 (..., m, H), out[..., k, :] = x[..., :] (bits moved, NaN payloads included)

``expand_to_mhc_bwd(grad_out, x, m) -> grad_x``
    grad_out bf16 (..., m, H) with x's leading dimensions and H, contiguous, on x's device
    grad_x   bf16 (..., H) = sum_k grad_out[..., k, :], accumulated in fp32 in the order
             k = 0 .. m - 1 and rounded once to bf16 (x supplies the shape only)

``head_compute_mix(mixes, scale, base, pre_eps) -> mix``
    mixes   fp32 (a, b, m), 2 <= m <= 8, contiguous (a, b >= 0)
    scale   fp32 (1,), base fp32 (m,): contiguous, on mixes' device
    pre_eps float, finite, >= 0 and within fp32's range
    mix     fp32 (a, b, m) = sigmoid(mixes * scale[0] + base) + pre_eps

``head_compute_mix_bwd(grad_mix, mixes, scale, base, pre_eps) -> (grad_mixes, grad_scale, grad_base)``
    grad_mix fp32 with mixes' shape; with t = grad_mix * s (1 - s), s = sigmoid(u):
    grad_mixes fp32 (a, b, m) = t * scale[0]
    grad_scale fp32 (1,)      = sum over tokens and j of t * mixes
    grad_base  fp32 (m,)      = sum over tokens of t
    (both sums accumulated in fp32; an empty batch gives zeros)

Every function also accepts its floating-point tensors in float64 (all of them, then) and
computes and returns float64.  That is not part of the kernel contract: it lets tkverify's
gradient consistency check differentiate these formulas in float64.
"""

from __future__ import annotations

import torch

from .mhc import MAX_M, MIN_M, _check_float, _check_int_m, _check_m, _check_shape, _check_tensor

WIDE = torch.float64  # the dtype every function also accepts (see the module docstring)


def _working(name: str, t: object, dtype: torch.dtype) -> torch.dtype:
    """The dtype of the first tensor argument: the working one or float64."""
    return _check_tensor(name, t, (dtype, WIDE)).dtype


def _check_expand_x(x: object, m: object) -> tuple[torch.dtype, int]:
    dtype = _working("x", x, torch.bfloat16)
    if x.dim() < 1 or x.shape[-1] < 1:
        raise ValueError(f"x must have shape (..., H) with H >= 1, got {tuple(x.shape)}")
    return dtype, _check_int_m(m)


def _check_expand_args(x, m) -> int:
    """expand_to_mhc's argument checks (every implementation's); returns m."""
    return _check_expand_x(x, m)[1]


def _check_expand_bwd_args(grad_out, x, m) -> int:
    """expand_to_mhc_bwd's argument checks (every implementation's); returns m."""
    dtype, m = _check_expand_x(x, m)
    _check_tensor("grad_out", grad_out, (dtype,), x.device)
    _check_shape("grad_out", grad_out, tuple(x.shape[:-1]) + (m, x.shape[-1]), "(..., m, H) with x's ... and H")
    return m


def expand_to_mhc(x: torch.Tensor, m: int) -> torch.Tensor:
    """out (..., m, H), x's dtype: x copied into m streams; see the module docstring."""
    m = _check_expand_args(x, m)
    return x.unsqueeze(-2).expand(*x.shape[:-1], m, x.shape[-1]).contiguous()


def expand_to_mhc_bwd(grad_out: torch.Tensor, x: torch.Tensor, m: int) -> torch.Tensor:
    """grad_x (..., H) = sum over the m streams, accumulated in fp32 (float64 for float64); one rounding."""
    m = _check_expand_bwd_args(grad_out, x, m)
    acc_dtype = WIDE if x.dtype == WIDE else torch.float32
    with torch.no_grad():
        acc = grad_out[..., 0, :].to(acc_dtype)
        for k in range(1, m):
            acc = acc + grad_out[..., k, :].to(acc_dtype)
        return acc.to(x.dtype)


def _check_head_args(mixes, scale, base, pre_eps) -> tuple[torch.dtype, float]:
    """head_compute_mix's argument checks (every implementation's): (dtype, pre_eps)."""
    dtype = _working("mixes", mixes, torch.float32)
    if mixes.dim() != 3:
        raise ValueError(f"mixes must have shape (a, b, m), got {tuple(mixes.shape)}")
    _check_m("mixes", mixes.shape[-1])
    _check_tensor("scale", scale, (dtype,), mixes.device, "mixes")
    _check_shape("scale", scale, (1,), "(1,)")
    _check_tensor("base", base, (dtype,), mixes.device, "mixes")
    _check_shape("base", base, (mixes.shape[-1],), "(m,)")
    return dtype, _check_float("pre_eps", pre_eps, nonnegative=True)


def _check_head_bwd_args(grad_mix, mixes, scale, base, pre_eps) -> tuple[torch.dtype, float]:
    """head_compute_mix_bwd's argument checks (every implementation's)."""
    dtype, pre_eps = _check_head_args(mixes, scale, base, pre_eps)
    _check_tensor("grad_mix", grad_mix, (dtype,), mixes.device, "mixes")
    _check_shape("grad_mix", grad_mix, tuple(mixes.shape), "mixes' shape")
    return dtype, pre_eps


def head_compute_mix(mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, pre_eps: float) -> torch.Tensor:
    """mix (a, b, m) = sigmoid(mixes * scale[0] + base) + pre_eps; see the module docstring."""
    _, pre_eps = _check_head_args(mixes, scale, base, pre_eps)
    with torch.no_grad():
        return torch.sigmoid(mixes * scale + base) + pre_eps


def head_compute_mix_bwd(grad_mix: torch.Tensor, mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
                         pre_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad_mixes, grad_scale (1,), grad_base (m,)); the sums over tokens in the working dtype."""
    _check_head_bwd_args(grad_mix, mixes, scale, base, pre_eps)
    m = mixes.shape[-1]
    with torch.no_grad():
        s = torch.sigmoid(mixes * scale + base)
        t = grad_mix * (s * (1 - s))
        grad_scale = (t * mixes).reshape(1, -1).sum(-1)
        grad_base = t.reshape(-1, m).sum(0)
        return t * scale, grad_scale, grad_base


__all__ = ["MAX_M", "MIN_M", "expand_to_mhc", "expand_to_mhc_bwd", "head_compute_mix", "head_compute_mix_bwd"]
