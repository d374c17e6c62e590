"""Float64 oracles of the two ends of the mHC stack, each with its backward derived by hand:
`expand_to_mhc` (the entry: one hidden state copied into m residual streams) and
`head_compute_mix` (the output head's mix weights).  The contract: docs/contract/mhc.md,
sections mhc.expand_to_mhc and mhc.head_compute_mix.

expand_to_mhc
-------------

    out[..., k, h] = x[..., h]                 for k = 0 .. m - 1
    backward:  grad_x[..., h] = sum_k grad_out[..., k, h]

The forward moves values (NaN payloads aside, the exact input); the backward is a sum of m
exact inputs, computed compensated (`references.exact_sum`).

head_compute_mix
----------------

    u   = mixes * scale[0] + base[j]           (mixes (a, b, m), scale (1,), base (m,))
    mix = sigmoid(u) + pre_eps
    backward, with t = grad_mix * sigmoid'(u) and sigmoid'(u) = sigmoid(u) sigmoid(-u):
        grad_mixes = t * scale[0]
        grad_scale = sum over tokens and j of t * mixes       (shape (1,))
        grad_base  = sum over tokens of t                     (shape (m,))

IEEE arithmetic on the exact values: sigmoid(+-inf) is 1 and 0, so sigmoid' is 0 there; NaN
propagates, inf * 0 is NaN (an infinite mix whose t is 0 makes grad_scale NaN).  The product
mixes * scale of two fp32 values is exact in float64; u, sigmoid and t round in float64
(relative 2^-53 each, far below any fp32 error), and the sums over tokens are correctly rounded
(math.fsum).
`torch.autograd` is never called here; tests compare these against autograd of the forwards.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from references import as_float64, exact_sum
from references.mhc import sigmoid


def _check_m(m: int) -> int:
    if int(m) < 1:
        raise ValueError(f"m must be >= 1, got {m}")
    return int(m)


def expand_to_mhc(x: Any, m: int) -> np.ndarray:
    """out (..., m, H) in float64: x (..., H) repeated along a new axis -2."""
    x = as_float64(x)
    if x.ndim < 1:
        raise ValueError(f"x must have shape (..., H), got {x.shape}")
    m = _check_m(m)
    return np.ascontiguousarray(np.broadcast_to(x[..., None, :], x.shape[:-1] + (m,) + x.shape[-1:]))


def expand_to_mhc_terms(grad_out: Any) -> list[np.ndarray]:
    """The m terms of grad_x: grad_out[..., k, :] for k = 0 .. m - 1."""
    g = as_float64(grad_out)
    return [g[..., k, :] for k in range(g.shape[-2])]


def expand_to_mhc_bwd(grad_out: Any, x: Any, m: int) -> np.ndarray:
    """grad_x (..., H) = sum over the m streams of grad_out (..., m, H), exactly."""
    g, x = as_float64(grad_out), as_float64(x)
    m = _check_m(m)
    if g.shape != x.shape[:-1] + (m,) + x.shape[-1:]:
        raise ValueError(f"grad_out must have shape (..., m, H) = {x.shape[:-1] + (m,) + x.shape[-1:]}, "
                         f"got {g.shape}")
    return exact_sum(expand_to_mhc_terms(g), x.shape)


def _head_inputs(mixes: Any, scale: Any, base: Any) -> tuple[np.ndarray, float, np.ndarray]:
    mixes, scale, base = as_float64(mixes), as_float64(scale), as_float64(base)
    if mixes.ndim != 3:
        raise ValueError(f"mixes must have shape (a, b, m), got {mixes.shape}")
    if scale.shape != (1,):
        raise ValueError(f"scale must have shape (1,), got {scale.shape}")
    if base.shape != mixes.shape[-1:]:
        raise ValueError(f"base must have shape (m,) = {mixes.shape[-1:]}, got {base.shape}")
    return mixes, float(scale[0]), base


def head_logits(mixes: Any, scale: Any, base: Any) -> np.ndarray:
    """u = mixes * scale[0] + base in float64 (a, b, m): the product is exact, the sum rounds once."""
    mixes, s, base = _head_inputs(mixes, scale, base)
    with np.errstate(invalid="ignore"):
        return mixes * s + base


def sigmoid_slope(u: np.ndarray) -> np.ndarray:
    """sigmoid'(u) = sigmoid(u) sigmoid(-u) in float64: 0 at +-inf, NaN for NaN, never 0 * inf."""
    return sigmoid(u) * sigmoid(-u)


def head_compute_mix(mixes: Any, scale: Any, base: Any, pre_eps: float) -> np.ndarray:
    """mix (a, b, m) = sigmoid(mixes * scale[0] + base) + pre_eps, float64."""
    return sigmoid(head_logits(mixes, scale, base)) + float(pre_eps)


def head_compute_mix_slopes(grad_mix: Any, mixes: Any, scale: Any, base: Any) -> np.ndarray:
    """t = grad_mix * sigmoid'(u), (a, b, m) in float64."""
    u = head_logits(mixes, scale, base)
    g = as_float64(grad_mix)
    if g.shape != u.shape:
        raise ValueError(f"grad_mix must have mixes' shape {u.shape}, got {g.shape}")
    with np.errstate(invalid="ignore"):
        return g * sigmoid_slope(u)


def head_compute_mix_bwd(grad_mix: Any, mixes: Any, scale: Any, base: Any,
                         pre_eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(grad_mixes (a, b, m), grad_scale (1,), grad_base (m,)) in float64; see the module docstring."""
    t = head_compute_mix_slopes(grad_mix, mixes, scale, base)
    x, s, _ = _head_inputs(mixes, scale, base)
    m = x.shape[-1]
    with np.errstate(invalid="ignore"):
        grad_mixes = t * s
        products = (t * x).reshape(-1)
    grad_scale = np.array([_sum(products)])
    grad_base = np.array([_sum(column) for column in t.reshape(-1, m).T])
    return grad_mixes, grad_scale, grad_base


def _sum(values: np.ndarray) -> float:
    """The correctly rounded float64 sum (math.fsum) of finite values; IEEE's (NaN, or the one
    infinity) where a value is not finite, which no order of summation changes."""
    if np.isfinite(values).all():
        return math.fsum(values.tolist())
    with np.errstate(invalid="ignore"):
        return float(np.sum(values))
