"""Eager PyTorch mHC Sinkhorn normalisation, in working precision (fp32).

The signatures below are the contract of every implementation of the op, the
TileLang kernel in ``kernels/mhc.py`` included (same tensors, same errors for
the same bad arguments):

``sinkhorn(x, repeat=10, eps=1e-6) -> P``
    x       fp32 (..., m, m), 2 <= m <= 8, contiguous; any number (>= 0) of
            leading batch dimensions, any of them 0
    repeat  int >= 1: one column normalisation, then repeat - 1 (row, column) sweeps
    eps     float, finite, > 0 (every entry stays >= a multiple of eps: no 0 / 0)
    P       fp32 (..., m, m), on x's device

``sinkhorn_bwd(grad_out, x, repeat=10, eps=1e-6) -> grad_x``
    grad_out fp32 with x's shape; grad_x fp32 with x's shape.  The forward's
    intermediates are recomputed from x (nothing is saved but x).

``Sinkhorn.apply(x, repeat, eps) -> P``: the autograd Function over the two.

Both functions also accept x (and grad_out) in float64 and then compute and
return float64.  That is not part of the kernel contract: it lets tkverify's
gradient consistency check differentiate this implementation's own formulas
in float64.

Maths (OPS.md "mhc", references/mhc.py): A = softmax(x) + eps; P = A / (column
sums + eps); repeat - 1 times P = P / (row sums + eps), P = P / (column sums +
eps).  Backward of P' = P / D along an axis: (G - sum_axis(G P')) / D; of the
softmax: s (G - sum_row(G s)).  NaN or +inf anywhere in a matrix (or a row
all -inf) makes the whole matrix NaN, as in the oracle.
"""

from __future__ import annotations

import math
import numbers

import torch

MIN_M, MAX_M = 2, 8
DEFAULT_REPEAT = 10
DEFAULT_EPS = 1e-6
ROWS, COLUMNS = -1, -2  # the axis summed by a row / a column normalisation


def _check_x(name: str, x: object, dtype: torch.dtype | None = None, shape: tuple[int, ...] | None = None,
             device: torch.device | None = None) -> torch.dtype:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if dtype is None:
        if x.dtype not in (torch.float32, torch.float64):
            raise TypeError(f"{name} must have dtype torch.float32, got {x.dtype}")
    elif x.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype} (x's), got {x.dtype}")
    if shape is None:
        if x.dim() < 2 or x.shape[-1] != x.shape[-2]:
            raise ValueError(f"{name} must have shape (..., m, m), got {tuple(x.shape)}")
        if not MIN_M <= x.shape[-1] <= MAX_M:
            raise ValueError(f"{name} must have {MIN_M} <= m <= {MAX_M}, got m = {x.shape[-1]}")
    elif tuple(x.shape) != shape:
        raise ValueError(f"{name} must have x's shape {shape}, got {tuple(x.shape)}")
    if device is not None and x.device != device:
        raise ValueError(f"{name} must be on {device} (where x is), got {x.device}")
    if not x.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {x.stride()}")
    return x.dtype


def _check_params(repeat: object, eps: object) -> tuple[int, float]:
    if isinstance(repeat, bool) or not isinstance(repeat, numbers.Integral):
        raise TypeError(f"repeat must be an int, got {type(repeat).__name__}")
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    eps = float(eps)
    if not (math.isfinite(eps) and eps > 0.0):
        raise ValueError(f"eps must be finite and > 0, got {eps}")
    return int(repeat), eps


def _axes(repeat: int, swapped: bool = False) -> list[int]:
    """The summed axis of each normalisation, in order (`swapped`: rows and columns exchanged)."""
    first, second = (ROWS, COLUMNS) if not swapped else (COLUMNS, ROWS)
    return [second] + [first, second] * (repeat - 1)


def _softmax(x: torch.Tensor) -> torch.Tensor:
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def _forward(x: torch.Tensor, repeat: int, eps: float, swapped: bool = False):
    """(P, softmax s, [(axis, P', D)] per normalisation)."""
    s = _softmax(x)
    p = s + eps
    saved = []
    for axis in _axes(repeat, swapped):
        d = p.sum(axis, keepdim=True) + eps
        p = p / d
        saved.append((axis, p, d))
    return p, s, saved


def _backward(g: torch.Tensor, s: torch.Tensor, saved, skip: int | None = None) -> torch.Tensor:
    """Reverse sweep; `skip` (mutants only) leaves out the step of that index in reverse order."""
    for index, (axis, out, d) in enumerate(reversed(saved)):
        if index == skip:
            continue
        g = (g - (g * out).sum(axis, keepdim=True)) / d
    return s * (g - (g * s).sum(-1, keepdim=True))


def sinkhorn(x: torch.Tensor, repeat: int = DEFAULT_REPEAT, eps: float = DEFAULT_EPS) -> torch.Tensor:
    """P (..., m, m), x's dtype; see the module docstring."""
    _check_x("x", x)
    repeat, eps = _check_params(repeat, eps)
    with torch.no_grad():
        return _forward(x, repeat, eps)[0]


def sinkhorn_bwd(grad_out: torch.Tensor, x: torch.Tensor, repeat: int = DEFAULT_REPEAT,
                 eps: float = DEFAULT_EPS) -> torch.Tensor:
    """grad_x (..., m, m), x's dtype; see the module docstring."""
    dtype = _check_x("x", x)
    _check_x("grad_out", grad_out, dtype, tuple(x.shape), x.device)
    repeat, eps = _check_params(repeat, eps)
    with torch.no_grad():
        _, s, saved = _forward(x, repeat, eps)
        return _backward(grad_out, s, saved)


class Sinkhorn(torch.autograd.Function):
    """P = Sinkhorn.apply(x, repeat, eps), differentiable in x."""

    @staticmethod
    def forward(ctx, x, repeat=DEFAULT_REPEAT, eps=DEFAULT_EPS):
        p = sinkhorn(x, repeat, eps)
        ctx.save_for_backward(x)
        ctx.repeat, ctx.eps = repeat, eps
        return p

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return sinkhorn_bwd(grad_out.contiguous(), x, ctx.repeat, ctx.eps), None, None
