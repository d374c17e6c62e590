"""Float64 oracles of the mHC operators: Sinkhorn (with its backward derived by hand) and the
three mix operators `pre_split_mixes`, `pre_apply_mix`, `post` (their backward passes derived by
hand at the end of the module).

Sinkhorn
--------

The maths (docs/contract/mhc.md#mhc.sinkhorn), on each (m, m) matrix of x (..., m, m):

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

Non-finite inputs (the contract, docs/contract/mhc.md#mhc.sinkhorn): a NaN or +inf in
a matrix, or a row of it that is all -inf, makes that whole matrix NaN (the
softmax row turns NaN, and the first column normalisation spreads it to every
column); a -inf entry in a row with a finite maximum is an ordinary softmax
weight of 0.  Other matrices of the batch are unaffected.

The mix operators (docs/contract/mhc.md, "The mix operators")
-------------------------------------------------------------
With s the per-entry scale (scale[0] on entries [0, m), scale[1] on [m, 2m),
scale[2] on [2m, m(m + 2))):

    u    = mixes * s + base
    pre  = sigmoid(u[:m]) + pre_eps           (a, b, m, 1)
    post = sigmoid(u[m:2m]) * post_mult       (a, b, m, 1)
    comb = u[2m:] viewed row-major (m, m)     (a, b, m, m)
    pre_apply_mix: out[..., h] = sum_i x[..., i, h] mix[..., i, 0]
    post:          out[..., n, h] = x[..., h] post[..., n, 0] + sum_i comb[..., i, n] residual[..., i, h]

All in float64 from the exactly widened inputs, IEEE arithmetic on the exact
values: sigmoid(+inf) = 1, sigmoid(-inf) = 0, NaN propagates (inf * 0 is NaN).
Every product of two inputs (fp32 by fp32, or fp32 by bf16) is exact in
float64, and the sums are compensated (`references.exact_sum`), so the results
are within a few float64 ULPs of the exact values.  u's sum and the sigmoid
round once each in float64 (relative 2^-53, far below any fp32 error).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from references import as_float64, as_float64_tensor, exact_sum

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


# -- the mix operators -------------------------------------------------------------------


def mix_scales(scale: Any, m: int) -> np.ndarray:
    """The per-entry scale s (m (m + 2),) in float64: scale[0] x m, scale[1] x m, scale[2] x m m."""
    scale = as_float64(scale)
    if scale.shape != (3,):
        raise ValueError(f"scale must have shape (3,), got {scale.shape}")
    return np.repeat(scale, [m, m, m * m])


def sigmoid(u: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-u) in float64 without overflow: e^u / (1 + e^u) for u < 0; +-inf give 1 and 0, NaN stays."""
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(-np.abs(u))  # in (0, 1]: never overflows
        return np.where(u >= 0, 1.0 / (1.0 + e), e / (1.0 + e)) + np.where(np.isnan(u), u, 0.0)


def mix_logits(mixes: Any, scale: Any, base: Any, m: int) -> np.ndarray:
    """u = mixes * s + base in float64 (a, b, m (m + 2)); the product is exact, the sum rounds once."""
    mixes = as_float64(mixes)
    base = as_float64(base)
    if mixes.ndim != 3 or mixes.shape[-1] != m * (m + 2):
        raise ValueError(f"mixes must have shape (a, b, {m * (m + 2)}) for m = {m}, got {mixes.shape}")
    if base.shape != (m * (m + 2),):
        raise ValueError(f"base must have shape ({m * (m + 2)},), got {base.shape}")
    with np.errstate(invalid="ignore"):
        return mixes * mix_scales(scale, m) + base


def pre_split_mixes(mixes: Any, scale: Any, base: Any, m: int, post_mult: float,
                    pre_eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pre (a, b, m, 1), post (a, b, m, 1), comb (a, b, m, m)) in float64; see the module docstring."""
    u = mix_logits(mixes, scale, base, m)
    lead = u.shape[:-1]
    with np.errstate(invalid="ignore"):
        pre = sigmoid(u[..., :m]) + float(pre_eps)
        post = sigmoid(u[..., m:2 * m]) * float(post_mult)
    return pre.reshape(*lead, m, 1), post.reshape(*lead, m, 1), u[..., 2 * m:].reshape(*lead, m, m)


def pre_apply_mix_terms(x: Any, mix: Any) -> list[np.ndarray]:
    """The m exact products x[..., i, :] * mix[..., i, 0], each (a, b, H)."""
    x, mix = as_float64(x), as_float64(mix)
    if x.ndim != 4 or mix.shape != x.shape[:-1] + (1,):
        raise ValueError(f"x must be (a, b, m, H) and mix (a, b, m, 1), got {x.shape} and {mix.shape}")
    with np.errstate(invalid="ignore"):
        return [x[..., i, :] * mix[..., i, :] for i in range(x.shape[-2])]


def pre_apply_mix(x: Any, mix: Any) -> np.ndarray:
    """out (a, b, H) = sum_i x[..., i, :] mix[..., i, 0], exactly (float64, compensated)."""
    terms = pre_apply_mix_terms(x, mix)
    x = as_float64(x)
    return exact_sum(terms, x.shape[:2] + x.shape[3:])


def post_terms(x: Any, residual: Any, post: Any, comb: Any) -> list[np.ndarray]:
    """The m + 1 exact products of output row n, each (a, b, m, H): x post[n], then comb[i, n] residual[i]."""
    x, residual, post, comb = (as_float64(t) for t in (x, residual, post, comb))
    if residual.ndim != 4 or x.shape != residual.shape[:2] + residual.shape[3:]:
        raise ValueError(f"x must be (a, b, H) and residual (a, b, m, H), got {x.shape} and {residual.shape}")
    m = residual.shape[2]
    if post.shape != residual.shape[:2] + (m, 1) or comb.shape != residual.shape[:2] + (m, m):
        raise ValueError(f"post must be (a, b, m, 1) and comb (a, b, m, m), got {post.shape} and {comb.shape}")
    with np.errstate(invalid="ignore"):
        terms = [x[..., None, :] * post]
        terms += [comb[..., i, :, None] * residual[..., i, None, :] for i in range(m)]
    return terms


def post(x: Any, residual: Any, post: Any, comb: Any) -> np.ndarray:  # noqa: A002 - the op's own names
    """out (a, b, m, H), out[..., n, :] = x post[n] + sum_i comb[i, n] residual[i], exactly."""
    return exact_sum(post_terms(x, residual, post, comb), tuple(as_float64(residual).shape))


# -- the mix operators' backward passes ----------------------------------------------------
#
# Both ops are bilinear, so each gradient is a sum of exact products of an input and the
# cotangent (docs/contract/mhc.md, the Backward subsections):
#
#   pre_apply_mix, out[h] = sum_i x[i, h] mix[i]:
#       grad_x[i, h] = grad_out[h] mix[i]                 (one term)
#       grad_mix[i]  = sum_h grad_out[h] x[i, h]          (H terms, reduced over the token's row)
#   post, out[n, h] = x[h] post[n] + sum_i comb[i, n] residual[i, h]:
#       grad_x[h]           = sum_n grad_out[n, h] post[n]        (m terms)
#       grad_residual[i, h] = sum_n comb[i, n] grad_out[n, h]     (m terms)
#       grad_post[n]        = sum_h grad_out[n, h] x[h]           (H terms)
#       grad_comb[i, n]     = sum_h residual[i, h] grad_out[n, h] (H terms)
#
# The gradient is defined on tokens whose inputs are all finite; on a token with a NaN or an
# infinity in any input the float64 backward returns 0 for that token's gradients (the judges
# leave them unconstrained and the gradient checks zero that token's cotangents).


def nonfinite_tokens(*tensors: Any) -> np.ndarray:
    """(a, b) True where any of the (a, b, ...) tensors has a non-finite entry in that token."""
    arrays = [as_float64(t) for t in tensors]
    lead = arrays[0].shape[:2]
    bad = np.zeros(lead, dtype=bool)
    for a in arrays:
        bad |= ~np.isfinite(a).all(axis=tuple(range(2, a.ndim)))
    return bad


def _zero_tokens(values: np.ndarray, bad: np.ndarray) -> np.ndarray:
    return np.where(bad.reshape(bad.shape + (1,) * (values.ndim - 2)), 0.0, values)


def pre_apply_mix_bwd_terms(grad_out: Any, x: Any, mix: Any) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(the 1 term of grad_x (a, b, m, H), the H terms of grad_mix (a, b, m, 1)), exact products."""
    g, x, mix = as_float64(grad_out), as_float64(x), as_float64(mix)
    if x.ndim != 4 or mix.shape != x.shape[:-1] + (1,) or g.shape != x.shape[:2] + x.shape[3:]:
        raise ValueError(f"grad_out must be (a, b, H), x (a, b, m, H) and mix (a, b, m, 1), got {g.shape}, "
                         f"{x.shape} and {mix.shape}")
    with np.errstate(invalid="ignore", over="ignore"):
        grad_x_terms = [g[..., None, :] * mix]
        grad_mix_terms = [x[..., h:h + 1] * g[..., None, h:h + 1] for h in range(x.shape[-1])]
    return grad_x_terms, grad_mix_terms


def pre_apply_mix_bwd(grad_out: Any, x: Any, mix: Any) -> tuple[np.ndarray, np.ndarray]:
    """(grad_x (a, b, m, H), grad_mix (a, b, m, 1)) in float64, exactly; 0 on tokens with a non-finite input."""
    gx_terms, gm_terms = pre_apply_mix_bwd_terms(grad_out, x, mix)
    x, mix = as_float64(x), as_float64(mix)
    bad = nonfinite_tokens(x, mix)
    grad_x = exact_sum(gx_terms, x.shape)
    grad_mix = exact_sum(gm_terms, mix.shape)
    return _zero_tokens(grad_x, bad), _zero_tokens(grad_mix, bad)


def post_bwd_terms(grad_out: Any, x: Any, residual: Any, post: Any, comb: Any) -> dict[str, list[np.ndarray]]:
    """The exact products summed by each of post's four gradients (names as `post_bwd` returns them)."""
    g, x, residual, post, comb = (as_float64(t) for t in (grad_out, x, residual, post, comb))
    post_terms(x, residual, post, comb)  # the shape checks
    if g.shape != residual.shape:
        raise ValueError(f"grad_out must have residual's shape {residual.shape}, got {g.shape}")
    m, hidden = residual.shape[2], residual.shape[3]
    with np.errstate(invalid="ignore", over="ignore"):
        return {
            "grad_x": [g[..., n, :] * post[..., n, :] for n in range(m)],
            "grad_residual": [comb[..., :, n, None] * g[..., n, None, :] for n in range(m)],
            "grad_post": [g[..., h:h + 1] * x[..., None, h:h + 1] for h in range(hidden)],
            "grad_comb": [residual[..., :, None, h] * g[..., None, :, h] for h in range(hidden)],
        }


def post_bwd(grad_out: Any, x: Any, residual: Any, post: Any,  # noqa: A002 - the op's own names
             comb: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(grad_x (a, b, H), grad_residual (a, b, m, H), grad_post (a, b, m, 1), grad_comb (a, b, m, m)) in
    float64, exactly; 0 on tokens with a non-finite input."""
    terms = post_bwd_terms(grad_out, x, residual, post, comb)
    arrays = [as_float64(t) for t in (x, residual, post, comb)]
    bad = nonfinite_tokens(*arrays)
    return tuple(_zero_tokens(exact_sum(terms[name], a.shape), bad)
                 for name, a in zip(("grad_x", "grad_residual", "grad_post", "grad_comb"), arrays))


# -- pre_split_mixes' backward ---------------------------------------------------------------
#
# With t = dL/du (docs/contract/mhc.md, mhc.pre_split_mixes, "Backward") and sigmoid'(u) =
# sigmoid(u) sigmoid(-u):
#
#   t[j]          = grad_pre[j] sigmoid'(u[j])                    j in [0, m)
#   t[m + j]      = grad_post[j] post_mult sigmoid'(u[m + j])     j in [0, m)
#   t[2m + i m + n] = grad_comb[i, n]                              (comb is u itself)
#   grad_mixes    = t s                                            per token (a, b, m (m + 2))
#   grad_scale[k] = sum over tokens and the entries j of segment k of t[j] mixes[j]     (3,)
#   grad_base[j]  = sum over tokens of t[j]                                             (m (m + 2),)
#
# post_mult = 0 makes post the constant 0, so its segment's t is exactly 0 (never 0 / 0).  The
# gradient is defined on tokens whose mixes are all finite, and on none where scale or base has a
# non-finite entry; the float64 backward puts t = 0 on the tokens outside (grad_mixes 0 there, and
# they add nothing to grad_scale and grad_base).


def split_outside_tokens(mixes: Any, scale: Any, base: Any) -> np.ndarray:
    """(a, b) True for tokens outside pre_split_mixes' gradient domain (see above)."""
    mixes = as_float64(mixes)
    bad = ~np.isfinite(mixes).all(axis=-1)
    if not (np.isfinite(as_float64(scale)).all() and np.isfinite(as_float64(base)).all()):
        bad[...] = True
    return bad


def pre_split_mixes_slopes(grad_pre: Any, grad_post: Any, grad_comb: Any, mixes: Any, scale: Any, base: Any,
                           m: int, post_mult: float) -> np.ndarray:
    """t = dL/du (a, b, m (m + 2)) in float64, 0 on tokens outside the domain."""
    from references.mhc_head import sigmoid_slope  # imported here: references.mhc_head imports this module

    u = mix_logits(mixes, scale, base, m)
    lead = u.shape[:-1]
    g_pre, g_post, g_comb = (as_float64(t) for t in (grad_pre, grad_post, grad_comb))
    if g_pre.shape != lead + (m, 1) or g_post.shape != lead + (m, 1) or g_comb.shape != lead + (m, m):
        raise ValueError(f"grad_pre, grad_post must be {lead + (m, 1)} and grad_comb {lead + (m, m)}, got "
                         f"{g_pre.shape}, {g_post.shape} and {g_comb.shape}")
    with np.errstate(invalid="ignore", over="ignore"):
        t = np.concatenate([g_pre.reshape(lead + (m,)) * sigmoid_slope(u[..., :m]),
                            g_post.reshape(lead + (m,)) * float(post_mult) * sigmoid_slope(u[..., m:2 * m]),
                            g_comb.reshape(lead + (m * m,))], axis=-1)
    return np.where(split_outside_tokens(mixes, scale, base)[..., None], 0.0, t)


def pre_split_mixes_bwd(grad_pre: Any, grad_post: Any, grad_comb: Any, mixes: Any, scale: Any, base: Any, m: int,
                        post_mult: float, pre_eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(grad_mixes (a, b, m (m + 2)), grad_scale (3,), grad_base (m (m + 2),)) in float64; the sums over
    tokens correctly rounded.  pre_eps does not enter (pre's offset has no gradient)."""
    from references.mhc_head import _sum  # imported here: references.mhc_head imports this module

    t = pre_split_mixes_slopes(grad_pre, grad_post, grad_comb, mixes, scale, base, m, post_mult)
    outside = split_outside_tokens(mixes, scale, base)[..., None]
    x = np.where(outside, 0.0, as_float64(mixes))
    width = m * (m + 2)
    with np.errstate(invalid="ignore"):
        grad_mixes = np.where(outside, 0.0, t * mix_scales(scale, m))
    products = (t * x).reshape(-1, width)
    bounds = (0, m, 2 * m, width)
    grad_scale = np.array([_sum(products[:, lo:hi].reshape(-1)) for lo, hi in zip(bounds, bounds[1:])])
    grad_base = np.array([_sum(column) for column in t.reshape(-1, width).T])
    return grad_mixes, grad_scale, grad_base
