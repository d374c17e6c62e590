"""Float64 oracles of mHC's fused pre-block pieces: the norm weight folded into the mix projection
(`fn_normw_merge`) and the reduction of the projection GEMM's split-K partials with the RMSNorm
statistics (`reduce_partials_and_rmsnorm`), each with its backward derived by hand; and the
recomputation of the residual stream across layers (`multilayer_recompute`, forward only), composed
from references.mhc's pre_apply_mix and post.

The maths (docs/contract/mhc_fused.md)
--------------------------------------

mHC's pre-block computes, per token, the mix logits of an RMS-normalised residual:
mixes = RMSNorm(x) @ fn^T with x the token's m streams flattened (K = m H values), fn the
projection (M, K), M = m (m + 2), and the RMSNorm weight w (K,).  It is evaluated as

    fn' = fn * w                      (fn_normw_merge: w folded into the projection, per column)
    P_s = x_s @ fn'_s^T, Q_s = sum x_s^2   over each of S slices s of K (the GEMM's split-K partials)
    out_mul = sum_s P_s, sqrsum = sum_s Q_s
    out = out_mul * (sqrsum / K + eps)^(-1/2)   (reduce_partials_and_rmsnorm)

With RMS groups (K cut into G groups of `rms_group_size` values, each normalised on its own),
P, Q, out_mul and sqrsum carry a group axis and out = sum_g out_mul_g * r_g with
r_g = (sqrsum_g / rms_group_size + eps)^(-1/2).

fn_normw_merge:            out_fn[j, k] = fn[j, k] w[k]
  backward (cotangent G):  grad_fn[j, k] = G[j, k] w[k];  grad_w[k] = sum_j G[j, k] fn[j, k]

reduce_partials_and_rmsnorm, inputs out_mul_splitted (S, N, G, M), sqrsum_splitted (S, N, G):
  out_mul (N, G, M) = sum_s out_mul_splitted[s];  sqrsum (N, G) = sum_s sqrsum_splitted[s]
  out (N, M)        = sum_g out_mul[:, g, :] r_g,  r_g = (sqrsum[:, g] / rms_group_size + eps)^(-1/2)
  backward (cotangent G of out; out_mul and sqrsum are saved for it, not differentiated):
    d out / d out_mul[:, g, j]  = r_g                           -> grad_out_mul = G r_g
    d out / d sqrsum[:, g]      = -r_g^3 / (2 rms_group_size) out_mul[:, g, :]
                                                                -> grad_sqrsum = -r_g^3 / (2 size) sum_j G_j out_mul_gj
  and every split's gradient is that of the sum it enters: grad_*_splitted[s] = grad_*.

Everything is float64 from the exactly widened fp32 inputs; a product of two fp32 values is exact
in float64 and a sum of n of them errs by at most n 2^-53 of the sum of magnitudes, far below any
fp32 bound (docs/contract/mhc_fused.md says how each output is judged).  Non-finite values follow
IEEE arithmetic: NaN propagates, inf * 0 is NaN, an infinite sqrsum gives r = 0, and a negative one
(outside the domain: partials of sums of squares are >= 0) gives NaN.

multilayer_recompute, L layers, P = L or L - 1 of them with a post step, residual_0 the initial one:

    layer_input[l] = pre_apply_mix(residual_l, pre_mix[l])                       l < L
    residual_{l+1} = RN_bf16(post(layer_output[l], residual_l, post_mix[l], comb_mix[l]))   l < P
    residual[l]    = residual_{l+1}

Each layer's sums are exact (references.mhc) and rounded once to bf16, the format the residual is
stored in, so the next layer starts from the correctly rounded residual.

The forwards of the ops with a backward are plain differentiable torch operations, so that tests
compare the hand backward with torch.autograd; `torch.autograd` is never called here.
"""

from __future__ import annotations

from typing import Any

import torch

import references.mhc as mhc
from references import as_float64, as_float64_tensor
from references.encode import decode, encode


def fn_normw_merge(fn: Any, normw: Any) -> torch.Tensor:
    """out_fn (M, K) = fn (M, K) * normw (K,) per column, float64."""
    fn, normw = as_float64_tensor(fn), as_float64_tensor(normw)
    if fn.dim() != 2 or tuple(normw.shape) != (fn.shape[1],):
        raise ValueError(f"fn must be (M, K) and normw (K,), got {tuple(fn.shape)} and {tuple(normw.shape)}")
    return fn * normw


def fn_normw_merge_bwd(grad_out_fn: Any, fn: Any, normw: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_fn (M, K), grad_normw (K,)) by hand: G * normw, and sum_j G[j] fn[j]."""
    with torch.no_grad():
        g, fn, normw = as_float64_tensor(grad_out_fn), as_float64_tensor(fn), as_float64_tensor(normw)
        if tuple(g.shape) != tuple(fn.shape):
            raise ValueError(f"grad_out_fn must have fn's shape {tuple(fn.shape)}, got {tuple(g.shape)}")
        return g * normw, (g * fn).sum(0)


def _check_partials(out_mul_splitted: torch.Tensor, sqrsum_splitted: torch.Tensor) -> None:
    if out_mul_splitted.dim() != 4 or tuple(sqrsum_splitted.shape) != tuple(out_mul_splitted.shape[:3]):
        raise ValueError(f"out_mul_splitted must be (S, N, G, M) and sqrsum_splitted (S, N, G), got "
                         f"{tuple(out_mul_splitted.shape)} and {tuple(sqrsum_splitted.shape)}")


def rms_factor(sqrsum: Any, rms_group_size: int, rms_eps: float) -> torch.Tensor:
    """r = (sqrsum / rms_group_size + eps)^(-1/2), float64 (differentiable)."""
    return (as_float64_tensor(sqrsum) / int(rms_group_size) + float(rms_eps)) ** -0.5


def reduce_partials_and_rmsnorm(out_mul_splitted: Any, sqrsum_splitted: Any, rms_group_size: int,
                                rms_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out_mul (N, G, M), sqrsum (N, G), out (N, M)) in float64; see the module docstring."""
    p, q = as_float64_tensor(out_mul_splitted), as_float64_tensor(sqrsum_splitted)
    _check_partials(p, q)
    out_mul, sqrsum = p.sum(0), q.sum(0)
    out = (out_mul * rms_factor(sqrsum, rms_group_size, rms_eps)[..., None]).sum(1)
    return out_mul, sqrsum, out


def reduce_partials_and_rmsnorm_bwd(grad_out: Any, out_mul_splitted: Any, sqrsum_splitted: Any, rms_group_size: int,
                                    rms_eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_out_mul_splitted (S, N, G, M), grad_sqrsum_splitted (S, N, G)) by hand, float64."""
    with torch.no_grad():
        g = as_float64_tensor(grad_out)
        p, q = as_float64_tensor(out_mul_splitted), as_float64_tensor(sqrsum_splitted)
        _check_partials(p, q)
        splits, tokens, _, width = p.shape
        if tuple(g.shape) != (tokens, width):
            raise ValueError(f"grad_out must be (N, M) = {(tokens, width)}, got {tuple(g.shape)}")
        out_mul, r = p.sum(0), rms_factor(q.sum(0), rms_group_size, rms_eps)
        grad_out_mul = g[:, None, :] * r[..., None]
        grad_sqrsum = -(r**3) / (2 * int(rms_group_size)) * (g[:, None, :] * out_mul).sum(-1)
        return grad_out_mul.expand(splits, *grad_out_mul.shape), grad_sqrsum.expand(splits, *grad_sqrsum.shape)


def round_bf16(values: Any) -> torch.Tensor:
    """float64 values rounded to the nearest bf16 value (ties to even; overflow to infinity), as float64."""
    return decode(encode(as_float64_tensor(values), "bf16"), "bf16")


def multilayer_recompute(initial_residual: Any, pre_mix: Any, layer_output: Any, post_mix: Any,
                         comb_mix: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(layer_input (L, N, H), residual (P, N, m, H)), each element the exact layer sum rounded to bf16.

    initial_residual (N, m, H); pre_mix (L, N, m); layer_output (P, N, H); post_mix (P, N, m);
    comb_mix (P, N, m, m); P = L or L - 1."""
    residual = as_float64(initial_residual)
    pre_mix, layer_output = as_float64(pre_mix), as_float64(layer_output)
    post_mix, comb_mix = as_float64(post_mix), as_float64(comb_mix)
    layers, posts = pre_mix.shape[0], layer_output.shape[0]
    if posts not in (layers, layers - 1) or layers < 1:
        raise ValueError(f"layer_output must hold L or L - 1 layers (L = {layers} >= 1), got {posts}")
    inputs, residuals = [], []
    for layer in range(layers):
        inputs.append(round_bf16(mhc.pre_apply_mix(residual[None], pre_mix[layer][None, ..., None]))[0])
        if layer < posts:
            exact = mhc.post(layer_output[layer][None], residual[None], post_mix[layer][None, ..., None],
                             comb_mix[layer][None])
            residual = round_bf16(exact)[0].numpy()
            residuals.append(torch.from_numpy(residual))
    tokens, m, hidden = residual.shape
    stacked = torch.stack(residuals) if residuals else torch.zeros((0, tokens, m, hidden), dtype=torch.float64)
    return torch.stack(inputs), stacked
