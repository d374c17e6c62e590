"""tile-kernels as the implementation "tile_kernels" of mHC's fused pre-block pieces:
mhc.norm_fn and mhc.reduce_partials_and_rmsnorm, forward and backward, and mhc.multilayer_recompute.

What maps to what (the contract's signatures: kernels/torch/mhc_fused.py); 2.x is tile_kernels.mhc,
1.0 the kernel builders of tile_kernels.mhc.norm_fn_kernel:

* mhc.norm_fn: 2.x mhc_fn_normw_merge_fwd(fn, normw, out_fn); 1.0 _mhc_fn_normw_merge_fwd(M, K)(the same).
* its backward: 2.x mhc_fn_normw_merge_bwd(fn, normw, grad, fn_grad, normw_grad); 1.0
  _mhc_fn_normw_merge_bwd(M, K)(the same).
* mhc.reduce_partials_and_rmsnorm: 2.x mhc_reduce_partials_and_rmsnorm_fwd(P, Q, out_mul, sqrsum, out,
  size, eps, S); 1.0 _mhc_pre_norm_fn_fwd_norm(M, G, size, eps, S)(P, Q, out_mul, sqrsum, out).
* its backward: 2.x mhc_reduce_partials_and_rmsnorm_bwd(grad, out_mul, sqrsum, out_mul_grad, sqrsum_grad,
  size, eps); 1.0 _mhc_pre_norm_fn_bwd_norm(M, G, size, eps)(grad, out_mul, sqrsum, out_mul_grad,
  sqrsum_grad).
* mhc.multilayer_recompute: both releases' tile_kernels.mhc.multilayer_recompute_kernel.
  mhc_multilayer_recompute(initial_residual, pre_mix_list, layer_output_list, post_mix_list,
  comb_mix_list, layer_input_list, residual_list), with lists of per-layer views of our stacked
  tensors ((N, m) mixes, (N, m, m) comb) and of the outputs allocated here, which it writes.

1.0 exposes these steps only inside its modeling op ``mhc_pre_norm_fn`` (which adds the projection
GEMM, with fn rounded to TF32); the kernel builders it calls are the ones mapped here, with the
argument order of its calls.  Both releases write into buffers allocated here; the backward of the
merge accumulates into its gradient buffers (1.0's modeling op hands them its main_grad), so they are
zeroed first.  The backward of the reduction returns the gradients of the sums; every split's
gradient is that of the sum, returned as an expanded view over the S splits.
"""

from __future__ import annotations

import torch

from tkverify.adapters.tile_kernels import _call, _gen, _tk


def _merge_kernels(rows: int, cols: int):
    """The (forward, backward) callables of the merge for the installed release."""
    if _gen() == 1:
        module = _tk("mhc.norm_fn_kernel")
        return module._mhc_fn_normw_merge_fwd(rows, cols), module._mhc_fn_normw_merge_bwd(rows, cols)
    module = _tk("mhc")
    return module.mhc_fn_normw_merge_fwd, module.mhc_fn_normw_merge_bwd


def fn_normw_merge(fn, normw):
    out = torch.empty_like(fn)
    forward, _ = _merge_kernels(*fn.shape)
    _call(forward, fn, normw, out)
    return out


def fn_normw_merge_bwd(grad_out_fn, fn, normw):
    grad_fn, grad_normw = torch.zeros_like(fn), torch.zeros_like(normw)
    _, backward = _merge_kernels(*fn.shape)
    _call(backward, fn, normw, grad_out_fn, grad_fn, grad_normw)
    return grad_fn, grad_normw


def reduce_partials_and_rmsnorm(out_mul_splitted, sqrsum_splitted, rms_group_size, rms_eps):
    splits, tokens, groups, width = out_mul_splitted.shape
    device = out_mul_splitted.device
    out_mul = torch.empty((tokens, groups, width), dtype=torch.float32, device=device)
    sqrsum = torch.empty((tokens, groups), dtype=torch.float32, device=device)
    out = torch.empty((tokens, width), dtype=torch.float32, device=device)
    if _gen() == 1:
        kernel = _call(_tk("mhc.norm_fn_kernel")._mhc_pre_norm_fn_fwd_norm, width, groups, rms_group_size, rms_eps,
                       splits)
        _call(kernel, out_mul_splitted, sqrsum_splitted, out_mul, sqrsum, out)
    else:
        _call(_tk("mhc").mhc_reduce_partials_and_rmsnorm_fwd, out_mul_splitted, sqrsum_splitted, out_mul, sqrsum,
              out, rms_group_size, rms_eps, splits)
    return out_mul, sqrsum, out


def reduce_partials_and_rmsnorm_bwd(grad_out, out_mul_splitted, sqrsum_splitted, out_mul, sqrsum, rms_group_size,
                                    rms_eps):
    splits, _, groups, width = out_mul_splitted.shape
    grad_out_mul, grad_sqrsum = torch.empty_like(out_mul), torch.empty_like(sqrsum)
    if _gen() == 1:
        kernel = _call(_tk("mhc.norm_fn_kernel")._mhc_pre_norm_fn_bwd_norm, width, groups, rms_group_size, rms_eps)
        _call(kernel, grad_out, out_mul, sqrsum, grad_out_mul, grad_sqrsum)
    else:
        _call(_tk("mhc").mhc_reduce_partials_and_rmsnorm_bwd, grad_out, out_mul, sqrsum, grad_out_mul, grad_sqrsum,
              rms_group_size, rms_eps)
    return grad_out_mul.expand(splits, *grad_out_mul.shape), grad_sqrsum.expand(splits, *grad_sqrsum.shape)


def multilayer_recompute(initial_residual, pre_mix, layer_output, post_mix, comb_mix):
    layers, posts = pre_mix.shape[0], layer_output.shape[0]
    tokens, m, hidden = initial_residual.shape
    device = initial_residual.device
    layer_input = torch.empty((layers, tokens, hidden), dtype=torch.bfloat16, device=device)
    residual = torch.empty((posts, tokens, m, hidden), dtype=torch.bfloat16, device=device)
    _call(_tk("mhc.multilayer_recompute_kernel").mhc_multilayer_recompute, initial_residual, list(pre_mix),
          list(layer_output), list(post_mix), list(comb_mix), list(layer_input), list(residual))
    return layer_input, residual


# Registered by tkverify.adapters.tile_kernels.register_all.
FORWARD = {
    "mhc.norm_fn": fn_normw_merge,
    "mhc.reduce_partials_and_rmsnorm": reduce_partials_and_rmsnorm,
    "mhc.multilayer_recompute": multilayer_recompute,
}
BACKWARD = {
    "mhc.norm_fn": fn_normw_merge_bwd,
    "mhc.reduce_partials_and_rmsnorm": reduce_partials_and_rmsnorm_bwd,
}
