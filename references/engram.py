"""Float64 oracles of Engram gating (the forward and its backward derived by hand) and of the weight
kernels around it, fused_weight and grad_w_reduce (at the end of the module; the n-gram hash is
references/engram_hash.py).

The maths (docs/contract/engram.md#engram.gate).  Per token t and head h (one *row* (t, h)), with
x, k of shape (T, hc, H), v (T, H), the fused weight w = wh * we (hc, H):

    rx = 1 / sqrt(mean_i x_i^2 + eps)           rk likewise for k
    d  = sum_i x_i w_i k_i
    z  = d rx rk / sqrt(H)
    a  = sign(z) sqrt(max(|z|, c))              (c = clamp; a = 0 at z = 0)
    g  = sigmoid(a)
    out_i = x_i + g v_i

Backward, from a cotangent G = dL/dout of shape (T, hc, H).  Write s = 1/sqrt(H)
and, per row:

    gg = dL/dg = sum_i G_i v_i
    dL/da = gg g (1 - g)                         (sigmoid' = g (1 - g))
    da/dz = 1 / (2 sqrt|z|)  where |z| >= c      (both signs: a = +-sqrt(+-z))
          = 0                where |z| <  c      (a = +-sqrt(c) is constant there)
    gz = dL/dz = gg g (1 - g) da/dz
    gd = dL/dd (at fixed rx, rk) = gz rx rk s
    A  = gz z  ( = rx dL/drx = rk dL/drk, since z is linear in rx and rk)

and drx/dx_i = -rx^3 x_i / H (from rx = (m + eps)^(-1/2), m = sum x^2 / H), so

    grad_x_i = G_i + gd w_i k_i - A rx^2 x_i / H
    grad_k_i =       gd w_i x_i - A rk^2 k_i / H
    grad_v[t, i] = sum_h G[t, h, i] g[t, h]
    grad_w[h, i] = sum_t gd[t, h] x[t, h, i] k[t, h, i]

and for the unfused weights (w = wh * we elementwise): grad_wh = grad_w * we,
grad_we = grad_w * wh (`fused_weight_grads`).  At |z| = c exactly the gate
counts as live (the contract switches the gradient off only where |z| < c); at
z = 0 the gate jumps from sigmoid(-sqrt c) to 1/2 to sigmoid(sqrt c), and the
gradient through d there is 0 (|0| < c).

Everything is computed in float64 with torch on the CPU, from the inputs'
exact values (bf16 and fp32 widen to float64 exactly; each product x w k has at
most 8 + 24 + 8 significant bits, so it is exact too).  The forward is written
with plain differentiable torch operations, so that `torch.autograd` can
differentiate it as an independent check of the hand-written backward, which
itself never calls autograd.  It is also the "float64 forward usable by
autograd" of the op's backward declaration.
"""

from __future__ import annotations

import math

import torch

from references import as_float64_tensor, exact_sum


def _shapes(x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor) -> tuple[int, int, int]:
    if x.dim() != 3:
        raise ValueError(f"x must be 3-D (T, hc, H), got shape {tuple(x.shape)}")
    t, hc, h = x.shape
    if tuple(k.shape) != (t, hc, h):
        raise ValueError(f"k must have x's shape {(t, hc, h)}, got {tuple(k.shape)}")
    if tuple(v.shape) != (t, h):
        raise ValueError(f"v must have shape (T, H) = {(t, h)}, got {tuple(v.shape)}")
    if tuple(w.shape) != (hc, h):
        raise ValueError(f"w must have shape (hc, H) = {(hc, h)}, got {tuple(w.shape)}")
    return t, hc, h


def inv_rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """1 / sqrt(mean of squares over the last axis + eps)."""
    return 1.0 / torch.sqrt((x * x).mean(-1) + eps)


def gate(z: torch.Tensor, clamp: float) -> torch.Tensor:
    """sigmoid(sign(z) sqrt(max(|z|, clamp))): 1/2 at z = 0, constant on 0 < |z| < clamp."""
    return torch.sigmoid(torch.sign(z) * torch.sqrt(torch.clamp(z.abs(), min=clamp)))


def engram_gate_fwd(x, k, v, w, eps: float = 1e-6, clamp: float = 1e-6):
    """Float64 forward: (out (T, hc, H), d, g, rx, rk (T, hc)), all float64 tensors."""
    x, k, v, w = as_float64_tensor(x), as_float64_tensor(k), as_float64_tensor(v), as_float64_tensor(w)
    _, _, hidden = _shapes(x, k, v, w)
    rx = inv_rms(x, eps)
    rk = inv_rms(k, eps)
    d = (x * w * k).sum(-1)
    z = d * rx * rk / math.sqrt(hidden)
    g = gate(z, clamp)
    out = x + g[..., None] * v[:, None, :]
    return out, d, g, rx, rk


def gate_argument(x, k, w, eps: float) -> torch.Tensor:
    """z = d rx rk / sqrt(H) per row (T, hc), float64 (for strategies and specs)."""
    x, k, w = as_float64_tensor(x), as_float64_tensor(k), as_float64_tensor(w)
    hidden = x.shape[-1]
    return (x * w * k).sum(-1) * inv_rms(x, eps) * inv_rms(k, eps) / math.sqrt(hidden)


def engram_gate_bwd(grad_out, x, k, v, w, eps: float = 1e-6, clamp: float = 1e-6):
    """Float64 backward, by hand: (grad_x, grad_k (T, hc, H), grad_v (T, H), grad_w (hc, H)).

    Recomputes the forward's intermediates from the inputs in float64 (it is
    the exact reference, not a consumer of anyone's saved tensors).
    """
    with torch.no_grad():
        grad, x, k, v, w = as_float64_tensor(grad_out), as_float64_tensor(x), as_float64_tensor(k), as_float64_tensor(v), as_float64_tensor(w)
        _, _, hidden = _shapes(x, k, v, w)
        if tuple(grad.shape) != tuple(x.shape):
            raise ValueError(f"grad_out must have x's shape {tuple(x.shape)}, got {tuple(grad.shape)}")
        s = 1.0 / math.sqrt(hidden)
        rx = inv_rms(x, eps)
        rk = inv_rms(k, eps)
        d = (x * w * k).sum(-1)
        z = d * rx * rk * s
        g = gate(z, clamp)

        gg = (grad * v[:, None, :]).sum(-1)
        live = z.abs() >= clamp
        # da/dz on the live side only; the dead side's placeholder 1 avoids 1/sqrt(0).
        dadz = torch.where(live, 0.5 / torch.sqrt(torch.where(live, z.abs(), torch.ones_like(z))), 0.0)
        gz = gg * g * (1.0 - g) * dadz
        gd = gz * rx * rk * s
        a_ = gz * z

        grad_x = grad + gd[..., None] * w * k - (a_ * rx * rx / hidden)[..., None] * x
        grad_k = gd[..., None] * w * x - (a_ * rk * rk / hidden)[..., None] * k
        grad_v = (grad * g[..., None]).sum(1)
        grad_w = (gd[..., None] * x * k).sum(0)
    return grad_x, grad_k, grad_v, grad_w


def fused_weight_grads(grad_w, wh, we):
    """(grad_wh, grad_we) from grad_w for w = wh * we (elementwise, broadcasting):
    grad_wh = grad_w * we and grad_we = grad_w * wh, each summed back to its
    operand's shape where it was broadcast."""
    grad_w, wh, we = as_float64_tensor(grad_w), as_float64_tensor(wh), as_float64_tensor(we)

    def reduce_to(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        while t.dim() > len(shape):
            t = t.sum(0)
        for axis, n in enumerate(shape):
            if n == 1 and t.shape[axis] != 1:
                t = t.sum(axis, keepdim=True)
        return t

    return reduce_to(grad_w * we, wh.shape), reduce_to(grad_w * wh, we.shape)


# -- the weight kernels around the gate: fused_weight and grad_w_reduce --------------------------
#
# docs/contract/engram.md#engram.fused_weight and #engram.grad_w_reduce.  A product of two bf16
# (8 significant bits each) has at most 16 significant bits and an exponent far inside float64's
# range, so float64 holds it exactly (NaN and infinities as IEEE makes them); a partial (fp32, 24
# bits) times a bf16 weight (8 bits) is exact too.


def fused_weight(weight_hidden, weight_embed) -> torch.Tensor:
    """weight_hidden * weight_embed, exact, float64 (hc, H): the fp32 result is its correct rounding."""
    wh, we = as_float64_tensor(weight_hidden), as_float64_tensor(weight_embed)
    if wh.shape != we.shape:
        raise ValueError(f"weight_embed must have weight_hidden's shape {tuple(wh.shape)}, got {tuple(we.shape)}")
    return wh * we


def grad_w_reduce_terms(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed):
    """The exact terms of both accumulations, as float64 numpy arrays of shape (hc, H) each:
    ([grad_weight_hidden, p_0 we, ..., p_{P-1} we], [grad_weight_embed, p_0 wh, ..., p_{P-1} wh]),
    where p_b = grad_w_partial[b].  Each product is exact in float64."""
    p = as_float64_tensor(grad_w_partial).numpy()
    wh, we = as_float64_tensor(weight_hidden).numpy(), as_float64_tensor(weight_embed).numpy()
    acc_h, acc_e = as_float64_tensor(grad_weight_hidden).numpy(), as_float64_tensor(grad_weight_embed).numpy()
    if p.ndim != 3 or p.shape[1:] != wh.shape or we.shape != wh.shape or acc_h.shape != wh.shape \
            or acc_e.shape != wh.shape:
        raise ValueError(f"grad_w_partial must be (P, hc, H) and the four others (hc, H), got {p.shape}, "
                         f"{wh.shape}, {we.shape}, {acc_h.shape}, {acc_e.shape}")
    return [acc_h, *(p[b] * we for b in range(p.shape[0]))], [acc_e, *(p[b] * wh for b in range(p.shape[0]))]


def grad_w_reduce(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed):
    """(grad_weight_hidden + S * weight_embed, grad_weight_embed + S * weight_hidden), S = sum over b of
    grad_w_partial[b]: the accumulators after the call, float64 (hc, H), each summed nearly exactly
    (`exact_sum`).  S is the fused weight's gradient, so these are grad_wh and grad_we of
    `fused_weight_grads` added to the accumulators."""
    hidden_terms, embed_terms = grad_w_reduce_terms(grad_w_partial, weight_hidden, weight_embed,
                                                    grad_weight_hidden, grad_weight_embed)
    shape = hidden_terms[0].shape
    return (torch.from_numpy(exact_sum(hidden_terms, shape)), torch.from_numpy(exact_sum(embed_terms, shape)))
