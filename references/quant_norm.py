"""Float64 oracle of RMSNorm with an optional residual and an output scale (quant.norm), and its
backward derived by hand (docs/contract/quant_norm.md).

Per row (token) t of x (T, H), with residual r (or none), weight w (or unit weight) and the
output scale c:

    s     = x + r, rounded once to x's dtype     (norm_input; s = x without residual)
    m     = sum_i s_i^2 / H + eps
    rstd  = 1 / sqrt(m)
    out_i = s_i rstd w_i c                      (rounded once to x's dtype by an implementation)

s is what the implementations normalise and return, so the oracle rounds it exactly as they
must (bf16 + bf16 and fp32 + fp32 are exact in float64, and rounding that sum to the dtype is
the correctly rounded sum).  For float64 inputs nothing is rounded: the backward declaration's
finite differences and gradcheck run on that smooth function.

Backward, from the cotangents G = dL/dout and N = dL/dnorm_input (T, H).  With
gw_i = G_i w_i c and D = sum_i gw_i s_i per row, and drstd/ds_i = -rstd^3 s_i / H:

    grad_s_i      = rstd gw_i - s_i rstd^3 D / H + N_i
    grad_x        = grad_residual = grad_s       (s = x + r)
    grad_weight_i = c sum_t G_{t,i} s_{t,i} rstd_t

Non-finite values follow IEEE arithmetic in float64: a row holding an infinity has sum s^2 = inf,
rstd = 0, out = s * 0 (NaN where s is infinite, a signed zero elsewhere); a NaN makes the row's
rstd and out NaN.  Everything is computed with torch on the CPU; the forward uses plain
differentiable operations so that autograd checks the hand-written backward independently.
"""

from __future__ import annotations

from typing import Any

import torch

from references import as_float64_tensor, quant

ROUNDED_DTYPES = (torch.bfloat16, torch.float32)


def _checked(x: torch.Tensor, weight: Any, residual: Any) -> tuple[int, int]:
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (T, H), got shape {tuple(x.shape)}")
    tokens, hidden = x.shape
    if weight is not None and tuple(weight.shape) != (hidden,):
        raise ValueError(f"weight must have shape (H,) = {(hidden,)}, got {tuple(weight.shape)}")
    if residual is not None and tuple(residual.shape) != tuple(x.shape):
        raise ValueError(f"residual must have x's shape {tuple(x.shape)}, got {tuple(residual.shape)}")
    return tokens, hidden


def norm_input(x: Any, residual: Any = None) -> torch.Tensor:
    """s = x + residual rounded once to x's dtype (bf16 or fp32; float64 inputs: unrounded), as float64."""
    dtype = x.dtype if isinstance(x, torch.Tensor) else torch.float64
    s = as_float64_tensor(x)
    if residual is not None:
        s = s + as_float64_tensor(residual)
        if dtype in ROUNDED_DTYPES:
            s = s.detach().to(dtype).to(torch.float64)
    return s


def inv_rms(s: torch.Tensor, eps: float) -> torch.Tensor:
    """rstd = 1 / sqrt(sum of squares over the last axis / H + eps), float64."""
    return 1.0 / torch.sqrt((s * s).sum(-1) / s.shape[-1] + eps)


def _weight(weight: Any, hidden: int) -> torch.Tensor:
    return torch.ones(hidden, dtype=torch.float64) if weight is None else as_float64_tensor(weight)


def norm(x: Any, weight: Any = None, residual: Any = None, eps: float = 1e-6, out_scale: float = 1.0):
    """Float64 forward: (out (T, H), rstd (T,), norm_input (T, H)), float64 tensors."""
    _checked(x, weight, residual)
    s = norm_input(x, residual)
    rstd = inv_rms(s, eps)
    out = s * rstd[:, None] * _weight(weight, s.shape[-1]) * float(out_scale)
    return out, rstd, s


def norm_bwd(grad_out: Any, grad_norm_input: Any, x: Any, weight: Any = None, residual: Any = None,
             eps: float = 1e-6, out_scale: float = 1.0):
    """Float64 backward, by hand: (grad_x, grad_weight, grad_residual); the last is None without a residual.

    Recomputes s and rstd from the inputs (it is the exact reference, not a consumer of saved tensors)."""
    with torch.no_grad():
        _, hidden = _checked(x, weight, residual)
        s = norm_input(x, residual)
        g = as_float64_tensor(grad_out)
        if tuple(g.shape) != tuple(s.shape):
            raise ValueError(f"grad_out must have x's shape {tuple(s.shape)}, got {tuple(g.shape)}")
        rstd = inv_rms(s, eps)[:, None]
        c = float(out_scale)
        gw = g * _weight(weight, hidden) * c
        dot = (gw * s).sum(-1, keepdim=True)
        grad_s = gw * rstd - s * (rstd * rstd * rstd * dot / hidden)
        if grad_norm_input is not None:
            grad_s = grad_s + as_float64_tensor(grad_norm_input)
        grad_weight = (g * s * rstd).sum(0) * c
    return grad_s, grad_weight, (grad_s.clone() if residual is not None else None)


# -- RMSNorm then the per-token cast -------------------------------------------------------------


def norm_forward_and_per_token_cast(x: Any, weight: Any = None, residual: Any = None, eps: float = 1e-6,
                                    out_scale: float = 1.0, fmt: str = "e4m3", num_per_channels: int = 128,
                                    **sf_options: Any):
    """(data, sf, rstd, norm_input): quant.per_token_cast (references.quant) of norm's out rounded once to
    x's dtype, with norm's rstd and norm_input.  sf_options are per_token_cast's keyword options."""
    out, rstd, s = norm(x, weight, residual, eps, out_scale)
    dtype = x.dtype if x.dtype in ROUNDED_DTYPES else torch.float64
    data, sf = quant.per_token_cast(out.to(dtype), fmt, num_per_channels, **sf_options)
    return data, sf, rstd, s
