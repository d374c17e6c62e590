"""Eager PyTorch RMSNorm with an optional residual and an output scale (quant.norm), forward and
backward, in fp32 on the input's device.  The TileLang kernels of ``kernels.quant.norm`` have the
same names and signatures; the contract is docs/contract/quant_norm.md.

    norm(x, weight=None, residual=None, eps=1e-6, out_scale=1.0) -> (out, rstd, norm_input)
    norm_bwd(grad_out, grad_norm_input, x, weight=None, residual=None, rstd=..., norm_input=...,
             eps=1e-6, out_scale=1.0) -> (grad_x, grad_weight, grad_residual)
    norm_forward_and_per_token_cast(x, weight=None, residual=None, eps=1e-6, out_scale=1.0, fmt="e4m3",
             num_per_channels=128, *, SF_OPTIONS) -> (data, sf, rstd, norm_input)

The last is `norm` followed by kernels.torch.quant.per_token_cast of out (SF_OPTIONS and the formats
are per_token_cast's; docs/contract/quant.md).

x (T, H) bfloat16 or float32 with contiguous rows (any row stride), H >= 1; weight None (unit
weight) or (H,) of x's dtype; residual None or x's shape and dtype.  eps a finite number > 0,
out_scale a finite number.  out and norm_input have x's dtype, rstd is float32 (T,).  Without a
residual norm_input is x itself.  grad_weight has the weight's dtype (None without a weight),
grad_residual is grad_x, the same tensor (None without a residual).  Bad arguments raise TypeError or ValueError
naming the argument.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ._checks import check_rows, check_tensor
from .quant import _check_per_token, per_token_cast

DTYPES = (torch.bfloat16, torch.float32)


def _check_like(name: str, t: Any, x: torch.Tensor, shape: tuple[int, ...]) -> None:
    """`t` a tensor of x's dtype and device with `shape` and contiguous rows."""
    check_tensor(name, t, (x.dtype,), len(shape), "like x")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if t.device != x.device:
        raise ValueError(f"{name} must be on x's device {x.device}, got {t.device}")
    if t.numel():  # an empty tensor has no layout (NumPy gives it zero strides)
        check_rows(name, t)


def _check_scalar(name: str, value: Any, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    v = float(value)
    if not math.isfinite(v) or (positive and v <= 0):
        raise ValueError(f"{name} must be a finite number{' > 0' if positive else ''}, got {value!r}")
    return v


def _check_norm_args(x: Any, weight: Any, residual: Any, eps: Any, out_scale: Any) -> tuple[float, float]:
    """The forward's checks; returns (eps, out_scale) as floats."""
    check_tensor("x", x, DTYPES, 2, "(T, H)")
    if x.numel():
        check_rows("x", x)
    if x.shape[1] < 1:
        raise ValueError(f"x must have at least one column (H >= 1), got shape {tuple(x.shape)}")
    if weight is not None:
        _check_like("weight", weight, x, (x.shape[1],))
    if residual is not None:
        _check_like("residual", residual, x, tuple(x.shape))
    return _check_scalar("eps", eps, True), _check_scalar("out_scale", out_scale, False)


def _check_norm_bwd_args(grad_out: Any, grad_norm_input: Any, x: Any, weight: Any, residual: Any, rstd: Any,
                        norm_input: Any, eps: Any, out_scale: Any) -> tuple[float, float]:
    """The backward's checks (the forward's, then the cotangents' and the saved tensors')."""
    eps_, scale = _check_norm_args(x, weight, residual, eps, out_scale)
    shape = tuple(x.shape)
    _check_like("grad_out", grad_out, x, shape)
    if grad_norm_input is not None:
        _check_like("grad_norm_input", grad_norm_input, x, shape)
    _check_like("norm_input", norm_input, x, shape)
    check_tensor("rstd", rstd, (torch.float32,), 1, "(T,)")
    if tuple(rstd.shape) != shape[:1] or rstd.device != x.device:
        raise ValueError(f"rstd must have shape {shape[:1]} on x's device, got {tuple(rstd.shape)} on {rstd.device}")
    return eps_, scale


def _scaled_weight(weight: torch.Tensor | None, hidden: int, out_scale: float, device: torch.device) -> torch.Tensor:
    """w c in fp32 (c rounded to fp32, one rounding of the product): the factor every row is multiplied by
    after rstd.  c is a Python scalar, not a tensor built on the device: copying a host value to the GPU
    waits for the device (reports/h200/sync-audit.txt listed norm, its backward and its cast for it)."""
    if weight is None:
        return torch.full((hidden,), out_scale, dtype=torch.float32, device=device)
    return weight.float() * float(out_scale)


def norm(x: torch.Tensor, weight: torch.Tensor | None = None, residual: torch.Tensor | None = None,
         eps: float = 1e-6, out_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, rstd, norm_input): s = x + residual in x's dtype, rstd = rsqrt(sum s^2 / H + eps) and
    out = s rstd (w c), in fp32, rounded once to x's dtype."""
    eps, out_scale = _check_norm_args(x, weight, residual, eps, out_scale)
    s = x if residual is None else (x.float() + residual.float()).to(x.dtype)
    sf = s.float()
    rstd = torch.rsqrt((sf * sf).sum(-1) / x.shape[1] + eps)
    out = (sf * rstd[:, None] * _scaled_weight(weight, x.shape[1], out_scale, x.device)).to(x.dtype)
    return out, rstd, s


def norm_bwd(grad_out: torch.Tensor, grad_norm_input: torch.Tensor | None, x: torch.Tensor,
             weight: torch.Tensor | None = None, residual: torch.Tensor | None = None, *, rstd: torch.Tensor,
             norm_input: torch.Tensor, eps: float = 1e-6, out_scale: float = 1.0):
    """(grad_x, grad_weight, grad_residual) from the forward's saved rstd and norm_input, in fp32:
    grad_s = gw rstd - s (rstd^3 D / H) + grad_norm_input with gw = G w c, D = sum gw s;
    grad_weight = c sum over tokens of G s rstd."""
    _, out_scale = _check_norm_bwd_args(grad_out, grad_norm_input, x, weight, residual, rstd, norm_input, eps,
                                       out_scale)
    hidden = x.shape[1]
    g, sf, r = grad_out.float(), norm_input.float(), rstd[:, None]
    gw = g * _scaled_weight(weight, hidden, out_scale, x.device)
    dot = (gw * sf).sum(-1, keepdim=True)
    grad_s = gw * r - sf * (r * r * r * dot / hidden)
    if grad_norm_input is not None:
        grad_s = grad_s + grad_norm_input.float()
    grad_x = grad_s.to(x.dtype)
    grad_weight = None
    if weight is not None:
        grad_weight = ((g * sf * r).sum(0) * out_scale).to(weight.dtype)
    return grad_x, grad_weight, (grad_x if residual is not None else None)


def norm_forward_and_per_token_cast(x: torch.Tensor, weight: torch.Tensor | None = None,
                                    residual: torch.Tensor | None = None, eps: float = 1e-6, out_scale: float = 1.0,
                                    fmt: str = "e4m3", num_per_channels: int = 128, *, round_sf: bool = False,
                                    use_ue8m0: bool = False, use_packed_ue8m0: bool = False,
                                    use_tma_aligned_col_major_sf: bool = False, clamp_min: float | None = None):
    """(data, sf, rstd, norm_input): `norm`, then kernels.torch.quant.per_token_cast of its out (x's dtype)
    with the sf options (their checks and errors are per_token_cast's)."""
    _check_norm_args(x, weight, residual, eps, out_scale)
    _check_per_token(x, fmt, num_per_channels, round_sf, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf,
                     clamp_min)
    out, rstd, s = norm(x, weight, residual, eps, out_scale)
    data, sf = per_token_cast(out, fmt, num_per_channels, round_sf=round_sf, use_ue8m0=use_ue8m0,
                              use_packed_ue8m0=use_packed_ue8m0,
                              use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf, clamp_min=clamp_min)
    return data, sf, rstd, s
