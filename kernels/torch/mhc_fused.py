"""Eager PyTorch implementations of mHC's fused pre-block pieces, in working precision (fp32).

The contract is docs/contract/mhc_fused.md.  The signatures and argument checks below are every
implementation's, the TileLang kernels of ``kernels.mhc.fused_norm`` included (same tensors, same
errors: a TypeError or ValueError naming the argument):

``fn_normw_merge(fn, normw) -> out_fn``
    fn     fp32 (M, K), contiguous, M, K >= 0 (mHC: M = m (m + 2), K = m H)
    normw  fp32 (K,), contiguous, on fn's device
    out_fn fp32 (M, K) = fn[j, k] * normw[k], one rounding per element

``fn_normw_merge_bwd(grad_out_fn, fn, normw) -> (grad_fn, grad_normw)``
    grad_out_fn fp32 (M, K); grad_fn = grad_out_fn * normw (one rounding per element);
    grad_normw (K,) = sum_j grad_out_fn[j, k] fn[j, k], accumulated in fp32 in any order

``reduce_partials_and_rmsnorm(out_mul_splitted, sqrsum_splitted, rms_group_size, rms_eps)
-> (out_mul, sqrsum, out)``
    out_mul_splitted fp32 (S, N, G, M), S >= 1, N >= 0, G >= 1, M >= 1, contiguous
    sqrsum_splitted  fp32 (S, N, G), contiguous, on out_mul_splitted's device
    rms_group_size   int >= 1 (the count each group's mean square divides by)
    rms_eps          float, finite, > 0 and within fp32's range
    out_mul (N, G, M) and sqrsum (N, G): the sums over the S splits, fp32 in any order;
    out (N, M) = sum_g out_mul[:, g] * r_g, r_g = 1 / sqrt(sqrsum[:, g] / rms_group_size + rms_eps)

``reduce_partials_and_rmsnorm_bwd(grad_out, out_mul_splitted, sqrsum_splitted, out_mul, sqrsum,
rms_group_size, rms_eps) -> (grad_out_mul_splitted, grad_sqrsum_splitted)``
    grad_out fp32 (N, M); out_mul, sqrsum: the forward's saved outputs (the backward reads these, not
    the partials, whose shapes only are checked); the gradients of every split are those of the sum,
    grad_out_mul = grad_out * r_g and grad_sqrsum = -r_g^3 / (2 rms_group_size) sum_j grad_out_j
    out_mul_gj, returned as (S, ...) views that repeat them over the splits.

``multilayer_recompute(initial_residual, pre_mix, layer_output, post_mix, comb_mix) -> (layer_input, residual)``
    initial_residual bf16 (N, m, H), 2 <= m <= 8, H >= 1, N >= 0
    pre_mix          fp32 (L, N, m), L >= 1
    layer_output     bf16 (P, N, H), P = L or L - 1
    post_mix         fp32 (P, N, m); comb_mix fp32 (P, N, m, m); all contiguous, on one device
    layer_input      bf16 (L, N, H): layer l's pre_apply_mix of its residual with pre_mix[l]
    residual         bf16 (P, N, m, H): layer l's post of layer_output[l] into its residual, which
                     is the next layer's residual (the first layer's is initial_residual); each
                     sum accumulated in fp32 and rounded once to bf16, as pre_apply_mix and post

All follow IEEE arithmetic (NaN propagates, inf * 0 is NaN, no flush of subnormals).  They also
accept float64 tensors (all of one dtype) and then compute in float64: tkverify's gradient
consistency check differentiates these formulas in float64; that is not part of the kernel
contract.  Sums are written as plain reductions, never as a matmul (no TF32 path on CUDA).
"""

from __future__ import annotations

import numbers

import torch

from . import mhc as eager_mhc
from .mhc import _check_float, _check_m, _check_tensor

FLOATS = (torch.float32, torch.float64)


def _check_like(name: str, t: object, dtype: torch.dtype, device: torch.device, shape: tuple[int, ...],
                what: str, device_of: str) -> None:
    """A tensor of `dtype` (the leading argument's), on `device`, contiguous, of `shape`."""
    if isinstance(t, torch.Tensor) and t.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype} ({device_of}'s), got {t.dtype}")
    _check_tensor(name, t, (dtype,), device, device_of)
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {what} = {shape}, got {tuple(t.shape)}")


def _check_fn_normw_merge_args(fn, normw) -> None:
    """fn_normw_merge's checks (every implementation's)."""
    _check_tensor("fn", fn, FLOATS)
    if fn.dim() != 2:
        raise ValueError(f"fn must have shape (M, K), got {tuple(fn.shape)}")
    _check_like("normw", normw, fn.dtype, fn.device, (fn.shape[1],), "(K,)", "fn")


def _check_fn_normw_merge_bwd_args(grad_out_fn, fn, normw) -> None:
    _check_fn_normw_merge_args(fn, normw)
    _check_like("grad_out_fn", grad_out_fn, fn.dtype, fn.device, tuple(fn.shape), "fn's (M, K)", "fn")


def _check_group_size(rms_group_size: object) -> int:
    if isinstance(rms_group_size, bool) or not isinstance(rms_group_size, numbers.Integral):
        raise TypeError(f"rms_group_size must be an int, got {type(rms_group_size).__name__}")
    if rms_group_size < 1:
        raise ValueError(f"rms_group_size must be >= 1, got {rms_group_size}")
    return int(rms_group_size)


def _check_eps(rms_eps: object) -> float:
    eps = _check_float("rms_eps", rms_eps)
    if not eps > 0:
        raise ValueError(f"rms_eps must be > 0, got {eps}")
    return eps


def _check_reduce_args(out_mul_splitted, sqrsum_splitted, rms_group_size, rms_eps) -> tuple[int, float]:
    """reduce_partials_and_rmsnorm's checks (every implementation's): (rms_group_size, rms_eps)."""
    _check_tensor("out_mul_splitted", out_mul_splitted, FLOATS)
    if out_mul_splitted.dim() != 4:
        raise ValueError(f"out_mul_splitted must have shape (S, N, G, M), got {tuple(out_mul_splitted.shape)}")
    splits, _, groups, width = out_mul_splitted.shape
    if splits < 1 or groups < 1 or width < 1:
        raise ValueError(f"out_mul_splitted must have S, G, M >= 1, got shape {tuple(out_mul_splitted.shape)}")
    _check_like("sqrsum_splitted", sqrsum_splitted, out_mul_splitted.dtype, out_mul_splitted.device,
                tuple(out_mul_splitted.shape[:3]), "(S, N, G)", "out_mul_splitted")
    return _check_group_size(rms_group_size), _check_eps(rms_eps)


def _check_reduce_bwd_args(grad_out, out_mul_splitted, sqrsum_splitted, out_mul, sqrsum, rms_group_size,
                          rms_eps) -> tuple[int, float]:
    """reduce_partials_and_rmsnorm_bwd's checks (every implementation's): (rms_group_size, rms_eps)."""
    size, eps = _check_reduce_args(out_mul_splitted, sqrsum_splitted, rms_group_size, rms_eps)
    _, tokens, groups, width = out_mul_splitted.shape
    dtype, device = out_mul_splitted.dtype, out_mul_splitted.device
    _check_like("grad_out", grad_out, dtype, device, (tokens, width), "(N, M)", "out_mul_splitted")
    _check_like("out_mul", out_mul, dtype, device, (tokens, groups, width), "(N, G, M)", "out_mul_splitted")
    _check_like("sqrsum", sqrsum, dtype, device, (tokens, groups), "(N, G)", "out_mul_splitted")
    return size, eps


def fn_normw_merge(fn: torch.Tensor, normw: torch.Tensor) -> torch.Tensor:
    """out_fn = fn * normw per column; see the module docstring."""
    _check_fn_normw_merge_args(fn, normw)
    with torch.no_grad():
        return fn * normw


def fn_normw_merge_bwd(grad_out_fn: torch.Tensor, fn: torch.Tensor,
                       normw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_fn, grad_normw); see the module docstring."""
    _check_fn_normw_merge_bwd_args(grad_out_fn, fn, normw)
    with torch.no_grad():
        return grad_out_fn * normw, (grad_out_fn * fn).sum(0)


def _rms_factor(sqrsum: torch.Tensor, size: int, eps: float) -> torch.Tensor:
    return torch.rsqrt(sqrsum / size + eps)


def reduce_partials_and_rmsnorm(out_mul_splitted: torch.Tensor, sqrsum_splitted: torch.Tensor, rms_group_size: int,
                                rms_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out_mul (N, G, M), sqrsum (N, G), out (N, M)); see the module docstring."""
    size, eps = _check_reduce_args(out_mul_splitted, sqrsum_splitted, rms_group_size, rms_eps)
    with torch.no_grad():
        out_mul, sqrsum = out_mul_splitted.sum(0), sqrsum_splitted.sum(0)
        out = (out_mul * _rms_factor(sqrsum, size, eps)[..., None]).sum(1)
        return out_mul, sqrsum, out


def reduce_partials_and_rmsnorm_bwd(grad_out: torch.Tensor, out_mul_splitted: torch.Tensor,
                                    sqrsum_splitted: torch.Tensor, out_mul: torch.Tensor, sqrsum: torch.Tensor,
                                    rms_group_size: int, rms_eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_out_mul_splitted (S, N, G, M), grad_sqrsum_splitted (S, N, G)); see the module docstring."""
    size, eps = _check_reduce_bwd_args(grad_out, out_mul_splitted, sqrsum_splitted, out_mul, sqrsum,
                                      rms_group_size, rms_eps)
    splits = out_mul_splitted.shape[0]
    with torch.no_grad():
        r = _rms_factor(sqrsum, size, eps)
        grad_out_mul = grad_out[:, None, :] * r[..., None]
        grad_sqrsum = (grad_out[:, None, :] * out_mul).sum(-1) * (r * r * r * (-0.5 / size))
        return grad_out_mul.expand(splits, *grad_out_mul.shape), grad_sqrsum.expand(splits, *grad_sqrsum.shape)


def _check_recompute_args(initial_residual, pre_mix, layer_output, post_mix, comb_mix) -> tuple[int, int]:
    """multilayer_recompute's checks (every implementation's): (L, P)."""
    _check_tensor("initial_residual", initial_residual, (torch.bfloat16,))
    if initial_residual.dim() != 3 or initial_residual.shape[-1] < 1:
        raise ValueError(f"initial_residual must have shape (N, m, H) with H >= 1, got {tuple(initial_residual.shape)}")
    _check_m("initial_residual", initial_residual.shape[1])
    tokens, m, hidden = initial_residual.shape
    device = initial_residual.device
    _check_tensor("pre_mix", pre_mix, (torch.float32,), device, "initial_residual")
    if pre_mix.dim() != 3 or pre_mix.shape[0] < 1 or tuple(pre_mix.shape[1:]) != (tokens, m):
        raise ValueError(f"pre_mix must have shape (L, N, m) = (L >= 1, {tokens}, {m}), got {tuple(pre_mix.shape)}")
    layers = pre_mix.shape[0]
    _check_tensor("layer_output", layer_output, (torch.bfloat16,), device, "initial_residual")
    if layer_output.dim() != 3 or layer_output.shape[0] not in (layers, layers - 1) \
            or tuple(layer_output.shape[1:]) != (tokens, hidden):
        raise ValueError(f"layer_output must have shape (P, N, H) with P = L or L - 1 = {layers} or {layers - 1}, "
                         f"N, H = {tokens}, {hidden}, got {tuple(layer_output.shape)}")
    posts = layer_output.shape[0]
    _check_like("post_mix", post_mix, torch.float32, device, (posts, tokens, m), "(P, N, m)", "initial_residual")
    _check_like("comb_mix", comb_mix, torch.float32, device, (posts, tokens, m, m), "(P, N, m, m)",
                "initial_residual")
    return layers, posts


def multilayer_recompute(initial_residual: torch.Tensor, pre_mix: torch.Tensor, layer_output: torch.Tensor,
                         post_mix: torch.Tensor, comb_mix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(layer_input (L, N, H), residual (P, N, m, H)), bf16; see the module docstring."""
    layers, posts = _check_recompute_args(initial_residual, pre_mix, layer_output, post_mix, comb_mix)
    residual = initial_residual[None]
    inputs, residuals = [], []
    for layer in range(layers):
        inputs.append(eager_mhc.pre_apply_mix(residual, pre_mix[layer][None, ..., None])[0])
        if layer < posts:
            residual = eager_mhc.post(layer_output[layer][None], residual, post_mix[layer][None, ..., None],
                                      comb_mix[layer][None])
            residuals.append(residual[0])
    tokens, m, hidden = initial_residual.shape
    stacked = torch.stack(residuals) if residuals else initial_residual.new_empty((0, tokens, m, hidden))
    return torch.stack(inputs), stacked
