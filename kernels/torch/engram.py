"""Eager PyTorch Engram gating, in working precision: bf16 in and out, fp32 maths.

The contract, what every implementation computes and refuses, is
docs/contract/engram.md#engram.gate.  The signatures below are every
implementation's, the TileLang kernels of ``kernels.engram`` included (they
take and return the same tensors, and raise the same errors for the same bad
arguments):

``engram_gate_fwd(x, k, v, w, eps=1e-6, clamp=1e-6) -> (out, d, g, rx, rk)``
    x, k   bf16 (T, hc, H), contiguous, on one device
    v      bf16 (T, H)
    w      fp32 (hc, H): the fused weight wh * we
    eps    float > 0 (finite), added to the mean of squares
    clamp  float > 0 (finite), the gate's clamp c
    out    bf16 (T, hc, H) = x + g v, computed in fp32 and rounded once
    d, g, rx, rk  fp32 (T, hc): saved for the backward

``engram_gate_bwd(grad_out, x, k, v, w, d, g, rx, rk, eps=1e-6, clamp=1e-6)
-> (grad_x, grad_k, grad_v, grad_w)``
    grad_out  bf16 (T, hc, H); x, k, v, w as for the forward; d, g, rx, rk
              the forward's fp32 (T, hc) outputs for these inputs
    grad_x, grad_k  bf16 (T, hc, H)
    grad_v          bf16 (T, H)      sum over heads of grad_out * g
    grad_w          fp32 (hc, H)     summed over tokens
    eps is accepted for a uniform call and unused (rx and rk carry it); clamp
    decides where the gate is dead (|z| < clamp: no gradient through d).

``EngramGate.apply(x, k, v, w, eps, clamp) -> out``: the autograd Function over
the two (gradients for x, k, v, w), and ``engram_gate(x, k, v, wh, we, eps,
clamp)``, which fuses w = wh * we with autograd so that grad_wh = grad_w * we and
grad_we = grad_w * wh.

Both functions also accept x, k, v, w (and grad_out, d, g, rx, rk) all in
float64, and then compute and return everything in float64.  That is not part
of the kernel contract: it lets tkverify's gradient consistency check
differentiate this implementation's own formulas in float64.

The per-row maths, s = 1/sqrt(H):
    rx = rsqrt(mean(x^2) + eps), rk likewise, d = sum x w k, z = d rx rk s,
    g = sigmoid(sign(z) sqrt(max(|z|, clamp))), out = x + g v;
    gg = sum G v, gz = gg g (1-g) / (2 sqrt|z|) where |z| >= clamp else 0,
    gd = gz rx rk s, A = gz z,
    grad_x = G + gd w k - A rx^2 x / H, grad_k = gd w x - A rk^2 k / H,
    grad_v = sum_h G g, grad_w = sum_t gd x k.
"""

from __future__ import annotations

import math
import numbers

import torch

_WORKING = (torch.bfloat16, torch.float32)  # (activation dtype, weight and saved dtype)
_FLOAT64 = (torch.float64, torch.float64)


def _check_tensor(name: str, t: object, dtype: torch.dtype, shape: tuple[int, ...], device: torch.device | None,
                  what: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {what} = {shape}, got {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} must be on {device} (where x is), got {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {t.stride()}")


def _check_rank(name: str, t: object, ndim: int, layout: str, least: tuple[int, str, int] | None = None) -> None:
    """t is a torch.Tensor with ndim dimensions named `layout`; least = (axis, its name, low) also asks
    t.shape[axis] >= low."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim or (least is not None and t.shape[least[0]] < least[2]):
        bound = "" if least is None else f" with {least[1]} >= {least[2]}"
        raise ValueError(f"{name} must be {ndim}-D {layout}{bound}, got shape {tuple(t.shape)}")


def _check_scalar(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    value = float(value)
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(f"{name} must be finite and > 0, got {value}")
    return value


def _check_inputs(x, k, v, w, eps, clamp) -> tuple[tuple[torch.dtype, torch.dtype], float, float]:
    """Validate the forward's arguments; returns the dtype pair in use and eps, clamp."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.bfloat16, torch.float64):
        raise TypeError(f"x must have dtype torch.bfloat16, got {x.dtype}")
    dtypes = _WORKING if x.dtype == torch.bfloat16 else _FLOAT64
    if x.dim() != 3:
        raise ValueError(f"x must be 3-D (T, hc, H), got shape {tuple(x.shape)}")
    tokens, heads, hidden = x.shape
    if heads < 1 or hidden < 1:
        raise ValueError(f"x must have hc >= 1 and H >= 1, got shape {tuple(x.shape)}")
    _check_tensor("x", x, dtypes[0], tuple(x.shape), None, "(T, hc, H)")
    _check_tensor("k", k, dtypes[0], (tokens, heads, hidden), x.device, "(T, hc, H)")
    _check_tensor("v", v, dtypes[0], (tokens, hidden), x.device, "(T, H)")
    _check_tensor("w", w, dtypes[1], (heads, hidden), x.device, "(hc, H)")
    return dtypes, _check_scalar("eps", eps), _check_scalar("clamp", clamp)


def _gate_argument(d: torch.Tensor, rx: torch.Tensor, rk: torch.Tensor, hidden: int) -> torch.Tensor:
    return d * rx * rk * (1.0 / math.sqrt(hidden))


def engram_gate_fwd(x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor,
                    eps: float = 1e-6, clamp: float = 1e-6):
    """(out bf16 (T, hc, H), d, g, rx, rk fp32 (T, hc)); see the module docstring."""
    (act, acc), eps, clamp = _check_inputs(x, k, v, w, eps, clamp)
    hidden = x.shape[-1]
    xf, kf, vf = x.to(acc), k.to(acc), v.to(acc)
    rx = torch.rsqrt(xf.square().mean(-1) + eps)
    rk = torch.rsqrt(kf.square().mean(-1) + eps)
    d = (xf * w * kf).sum(-1)
    z = _gate_argument(d, rx, rk, hidden)
    g = torch.sigmoid(torch.sign(z) * torch.sqrt(torch.clamp(z.abs(), min=clamp)))
    out = (xf + g[..., None] * vf[:, None, :]).to(act)
    return out, d, g, rx, rk


def engram_gate_bwd(grad_out: torch.Tensor, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor,
                    d: torch.Tensor, g: torch.Tensor, rx: torch.Tensor, rk: torch.Tensor,
                    eps: float = 1e-6, clamp: float = 1e-6):
    """(grad_x, grad_k bf16 (T, hc, H), grad_v bf16 (T, H), grad_w fp32 (hc, H)); see the module docstring."""
    (act, acc), _, clamp = _check_inputs(x, k, v, w, eps, clamp)
    tokens, heads, hidden = x.shape
    _check_tensor("grad_out", grad_out, act, (tokens, heads, hidden), x.device, "(T, hc, H)")
    for name, saved in (("d", d), ("g", g), ("rx", rx), ("rk", rk)):
        _check_tensor(name, saved, acc, (tokens, heads), x.device, "(T, hc)")

    grad, xf, kf, vf = grad_out.to(acc), x.to(acc), k.to(acc), v.to(acc)
    gg = (grad * vf[:, None, :]).sum(-1)
    z = _gate_argument(d, rx, rk, hidden)
    live = z.abs() >= clamp
    # 1/(2 sqrt|z|) where the gate is live; exactly 0 where it is clamped (no 0 * inf).
    dadz = torch.where(live, 0.5 * torch.rsqrt(torch.clamp(z.abs(), min=clamp)), torch.zeros_like(z))
    gz = gg * (g * (1.0 - g)) * dadz
    gd = gz * rx * rk * (1.0 / math.sqrt(hidden))
    a_ = gz * z
    grad_x = grad + gd[..., None] * w * kf - (a_ * rx * rx / hidden)[..., None] * xf
    grad_k = gd[..., None] * w * xf - (a_ * rk * rk / hidden)[..., None] * kf
    grad_v = (grad * g[..., None]).sum(1)
    grad_w = (gd[..., None] * xf * kf).sum(0)
    return grad_x.to(act), grad_k.to(act), grad_v.to(act), grad_w


def gate_function(forward, backward, name: str = "EngramGate") -> type[torch.autograd.Function]:
    """An autograd Function over a forward and a backward with this module's signatures (this
    module's own pair, or the TileLang kernels'): ``apply(x, k, v, w, eps, clamp) -> out``,
    differentiable in x, k, v and w."""

    class Gate(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, k, v, w, eps=1e-6, clamp=1e-6):
            out, d, g, rx, rk = forward(x, k, v, w, eps, clamp)
            ctx.save_for_backward(x, k, v, w, d, g, rx, rk)
            ctx.eps, ctx.clamp = eps, clamp
            return out

        @staticmethod
        def backward(ctx, grad_out):
            x, k, v, w, d, g, rx, rk = ctx.saved_tensors
            grads = backward(grad_out.contiguous(), x, k, v, w, d, g, rx, rk, ctx.eps, ctx.clamp)
            return (*grads, None, None)

    Gate.__name__ = Gate.__qualname__ = name
    return Gate


def apply_unfused(function: type[torch.autograd.Function], x: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  wh: torch.Tensor, we: torch.Tensor, eps: float, clamp: float) -> torch.Tensor:
    """`function` (a `gate_function`) with the unfused weights: w = wh * we (fp32) under autograd,
    so that grad_wh = grad_w * we and grad_we = grad_w * wh."""
    # wh and we are checked as w would be: their product would otherwise hide a wrong dtype (promoted to
    # fp32), shape (broadcast) or device from the checks of the Function.
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 3:
        weight = _FLOAT64[1] if x.dtype == torch.float64 else _WORKING[1]
        for name, t in (("wh", wh), ("we", we)):
            _check_tensor(name, t, weight, tuple(x.shape[1:]), x.device, "(hc, H)")
    return function.apply(x, k, v, (wh * we).contiguous(), eps, clamp)


# out = EngramGate.apply(x, k, v, w, eps, clamp), differentiable in x, k, v and w.
EngramGate = gate_function(engram_gate_fwd, engram_gate_bwd)


def engram_gate(x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, wh: torch.Tensor, we: torch.Tensor,
                eps: float = 1e-6, clamp: float = 1e-6) -> torch.Tensor:
    """Engram gating with the unfused weights: w = wh * we (fp32), through `EngramGate`."""
    return apply_unfused(EngramGate, x, k, v, wh, we, eps, clamp)


# -- the weight kernels around the gate and the n-gram hash ---------------------------------------
#
# docs/contract/engram.md#engram.fused_weight, #engram.grad_w_reduce, #engram.hash.
#
# ``fused_weight(weight_hidden, weight_embed) -> w``
#     weight_hidden, weight_embed  bf16 (hc, H), contiguous, on one device
#     w                            fp32 (hc, H) = weight_hidden * weight_embed (exact but for
#                                  overflow and underflow: correctly rounded)
# ``grad_w_reduce(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed)
# -> (grad_weight_hidden, grad_weight_embed)``
#     grad_w_partial            fp32 (P, hc, H): per-block partial sums of the fused weight's gradient
#     weight_hidden, weight_embed  bf16 (hc, H)
#     grad_weight_hidden, grad_weight_embed  fp32 (hc, H), updated in place and returned (the same
#                               tensors): += S * weight_embed and += S * weight_hidden, S = sum_b partial[b]
# ``engram_hash(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask=None) -> indices``
#     ngram_token_ids  int32 (T, N), N >= 2; multipliers int64 (L, N); vocab_sizes int32 (L, N - 1, K);
#     offsets int32 (L, (N - 1) K); image_token_mask bool (T,) or None
#     indices          int32 (L, T, (N - 1) K)


def _check_pair(name: str, t: object, dtype: torch.dtype, like: torch.Tensor | None, what: str) -> None:
    """A weight-shaped tensor: `dtype`, 2-D, and (like given) like's shape and device."""
    if like is None:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2 or min(t.shape) < 1:
            raise ValueError(f"{name} must be 2-D {what} with hc >= 1 and H >= 1, got shape {tuple(t.shape)}")
        _check_tensor(name, t, dtype, tuple(t.shape), None, what)
    else:
        _check_tensor(name, t, dtype, tuple(like.shape), like.device, what)


def _check_fused_weight(weight_hidden, weight_embed) -> None:
    """Validate fused_weight's arguments."""
    _check_pair("weight_hidden", weight_hidden, torch.bfloat16, None, "(hc, H)")
    _check_pair("weight_embed", weight_embed, torch.bfloat16, weight_hidden, "(hc, H)")


def fused_weight(weight_hidden: torch.Tensor, weight_embed: torch.Tensor) -> torch.Tensor:
    """weight_hidden * weight_embed, fp32 (hc, H): one IEEE product per element."""
    _check_fused_weight(weight_hidden, weight_embed)
    return weight_hidden.float() * weight_embed.float()


def _check_grad_w_reduce(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed) -> int:
    """Validate grad_w_reduce's arguments; returns P, the number of partials."""
    _check_pair("weight_hidden", weight_hidden, torch.bfloat16, None, "(hc, H)")
    _check_pair("weight_embed", weight_embed, torch.bfloat16, weight_hidden, "(hc, H)")
    _check_rank("grad_w_partial", grad_w_partial, 3, "(P, hc, H)")
    parts = grad_w_partial.shape[0]
    _check_tensor("grad_w_partial", grad_w_partial, torch.float32, (parts, *weight_hidden.shape),
                  weight_hidden.device, "(P, hc, H)")
    for name, acc in (("grad_weight_hidden", grad_weight_hidden), ("grad_weight_embed", grad_weight_embed)):
        _check_pair(name, acc, torch.float32, weight_hidden, "(hc, H)")
    if grad_weight_hidden is grad_weight_embed:
        raise ValueError("grad_weight_hidden and grad_weight_embed must be distinct tensors (both are accumulated)")
    return parts


def grad_w_reduce(grad_w_partial: torch.Tensor, weight_hidden: torch.Tensor, weight_embed: torch.Tensor,
                  grad_weight_hidden: torch.Tensor, grad_weight_embed: torch.Tensor):
    """(grad_weight_hidden, grad_weight_embed), updated in place: S = sum_b grad_w_partial[b] (fp32),
    then grad_weight_hidden += S * weight_embed and grad_weight_embed += S * weight_hidden."""
    _check_grad_w_reduce(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed)
    total = grad_w_partial.sum(0)
    grad_weight_hidden.add_(total * weight_embed.float())
    grad_weight_embed.add_(total * weight_hidden.float())
    return grad_weight_hidden, grad_weight_embed


def _check_hash(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask) -> tuple[int, int, int, int]:
    """Validate engram_hash's arguments; returns (T, N, L, K)."""
    _check_rank("ngram_token_ids", ngram_token_ids, 2, "(T, N)", (1, "N", 2))
    tokens, ngram = ngram_token_ids.shape
    device = ngram_token_ids.device
    _check_tensor("ngram_token_ids", ngram_token_ids, torch.int32, (tokens, ngram), None, "(T, N)")
    _check_rank("multipliers", multipliers, 2, "(L, N)", (0, "L", 1))
    layers = multipliers.shape[0]
    _check_tensor("multipliers", multipliers, torch.int64, (layers, ngram), device, "(L, N)")
    _check_rank("vocab_sizes", vocab_sizes, 3, "(L, N - 1, K)", (2, "K", 1))
    per_ngram = vocab_sizes.shape[2]
    _check_tensor("vocab_sizes", vocab_sizes, torch.int32, (layers, ngram - 1, per_ngram), device, "(L, N - 1, K)")
    _check_tensor("offsets", offsets, torch.int32, (layers, (ngram - 1) * per_ngram), device, "(L, (N - 1) K)")
    if image_token_mask is not None:
        _check_tensor("image_token_mask", image_token_mask, torch.bool, (tokens,), device, "(T,)")
    return tokens, ngram, layers, per_ngram


def engram_hash(ngram_token_ids: torch.Tensor, multipliers: torch.Tensor, vocab_sizes: torch.Tensor,
                offsets: torch.Tensor, image_token_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Embedding indices, int32 (L, T, (N - 1) K): int64 products and xors, the non-negative residue
    (torch.remainder) plus the table's offset, -1 on every index of an image token."""
    tokens, ngram, layers, per_ngram = _check_hash(ngram_token_ids, multipliers, vocab_sizes, offsets,
                                                  image_token_mask)
    products = ngram_token_ids.long()[None, :, :] * multipliers[:, None, :]  # (L, T, N)
    out = torch.empty((layers, tokens, ngram - 1, per_ngram), dtype=torch.int64, device=ngram_token_ids.device)
    mix = products[:, :, 0]
    for n in range(2, ngram + 1):
        mix = torch.bitwise_xor(mix, products[:, :, n - 1])
        out[:, :, n - 2] = torch.remainder(mix[:, :, None], vocab_sizes[:, None, n - 2].long())
    out = out.view(layers, tokens, (ngram - 1) * per_ngram) + offsets.long()[:, None, :]
    if image_token_mask is not None:
        out[:, image_token_mask] = -1
    return out.to(torch.int32)
