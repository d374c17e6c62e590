"""Float64 oracle of the mHC Sinkhorn normalisation: the forward and its backward derived by hand.

The maths (OPS.md, "mhc"), on each (m, m) matrix of x (..., m, m):

    A = softmax(x, last axis) + eps                       (row softmax)
    P_1 = A / (column sums of A + eps)                    (step 1: columns)
    then repeat - 1 times:
        P <- P / (row sums of P + eps)                    (rows: sums over the last axis)
        P <- P / (column sums of P + eps)                 (columns: sums over axis -2)

so 2 repeat - 1 normalisations follow the softmax, the last one over columns.

Backward (reverse mode through exactly those steps, not the implicit gradient
of a fixed point).  With G = dL/dP' for a step P' = P / D:

    columns, D_j = sum_k P_kj + eps:  dL/dP_ij = (G_ij - sum_k G_kj P'_kj) / D_j
    rows,    D_i = sum_k P_ik + eps:  dL/dP_ij = (G_ij - sum_k G_ik P'_ik) / D_i

(from dP'_ij/dP_kl = [ij = kl] / D - P_ij / D^2 [same row/column]); "+ eps"
passes G unchanged; the softmax s gives dL/dx_ij = s_ij (G_ij - sum_k G_ik s_ik).
The steps are replayed in reverse order from the intermediates of a float64
forward recomputed from x.  `torch.autograd` is never called here; tests
compare this against autograd of `sinkhorn` (which is written with plain
differentiable torch operations so that it can be).

Non-finite inputs (the contract, see tkverify/specs/mhc.py): a NaN or +inf in
a matrix, or a row of it that is all -inf, makes that whole matrix NaN (the
softmax row turns NaN, and the first column normalisation spreads it to every
column); a -inf entry in a row with a finite maximum is an ordinary softmax
weight of 0.  Other matrices of the batch are unaffected.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from references import as_float64_tensor

DEFAULT_REPEAT = 10
DEFAULT_EPS = 1e-6




def _check(x: torch.Tensor, repeat: int) -> None:
    if x.dim() < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"x must have shape (..., m, m), got {tuple(x.shape)}")
    if int(repeat) < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Row softmax, max-shifted (a row with a NaN or +inf, or all -inf, gives NaN)."""
    shifted = x - x.max(-1, keepdim=True).values
    e = torch.exp(shifted)
    return e / e.sum(-1, keepdim=True)


def sinkhorn(x, repeat: int = DEFAULT_REPEAT, eps: float = DEFAULT_EPS) -> torch.Tensor:
    """Float64 forward: P (..., m, m)."""
    x = as_float64_tensor(x)
    _check(x, repeat)
    p = softmax(x) + eps
    p = p / (p.sum(-2, keepdim=True) + eps)
    for _ in range(int(repeat) - 1):
        p = p / (p.sum(-1, keepdim=True) + eps)
        p = p / (p.sum(-2, keepdim=True) + eps)
    return p


def steps(repeat: int) -> list[int]:
    """The axes summed by the normalisations, in order: -2 (columns) or -1 (rows)."""
    return [-2] + [-1, -2] * (int(repeat) - 1)


def sinkhorn_bwd(grad_out, x, repeat: int = DEFAULT_REPEAT, eps: float = DEFAULT_EPS) -> torch.Tensor:
    """Float64 backward, by hand: grad_x (..., m, m)."""
    with torch.no_grad():
        g, x = as_float64_tensor(grad_out), as_float64_tensor(x)
        _check(x, repeat)
        if tuple(g.shape) != tuple(x.shape):
            raise ValueError(f"grad_out must have x's shape {tuple(x.shape)}, got {tuple(g.shape)}")
        s = softmax(x)
        p = s + eps
        saved = []  # (axis, output P', denominator D) per normalisation
        for axis in steps(repeat):
            d = p.sum(axis, keepdim=True) + eps
            p = p / d
            saved.append((axis, p, d))
        for axis, out, d in reversed(saved):
            g = (g - (g * out).sum(axis, keepdim=True)) / d
        return s * (g - (g * s).sum(-1, keepdim=True))


def sum_deviation(p: Any) -> float:
    """max |row sum - 1| and |column sum - 1| over all matrices (NaN matrices left out)."""
    p = np.asarray(p, dtype=np.float64)
    if p.size == 0:
        return 0.0
    p = p.reshape(-1, p.shape[-2], p.shape[-1])
    finite = np.isfinite(p).all(axis=(-1, -2))
    if not finite.any():
        return 0.0
    p = p[finite]
    return float(max(np.abs(p.sum(-1) - 1).max(), np.abs(p.sum(-2) - 1).max()))
