"""tile-kernels' backward passes of mHC's pre_split_mixes, pre_apply_mix and post, as the "tile_kernels"
backward of mhc.pre_split_mixes, mhc.pre_apply_mix and mhc.post (contract: docs/contract/mhc.md, the
Backward subsections).

2.1.0 exports ``mhc_pre_split_mixes_bwd(pre_grad, post_grad, comb_grad, input_mixes, post_layer_mix,
scale, base, input_mixes_grad, scale_grad, base_grad, post_mult)`` on flat (T, .) tensors: it takes the
forward's post output (computed here with 2.1.0's own forward, as a training step has it), writes the
gradients into the buffers it is handed (allocated here as zeros), and reduces the scale and base
gradients over tokens.  1.0.0 has pre_split_mixes' backward only through the autograd Function
``modeling.mhc.ops.mhc_pre_split_mixes``, which is differentiated here.

2.1.0 exports ``mhc_pre_apply_mix_bwd(o_grad, x, mix, x_grad)``, which adds x's gradient into the
bf16 x_grad it is given (allocated here as zeros, so that it holds the gradient itself) and returns
mix's per-token fp32 gradient (T, m), and ``mhc_post_bwd(x, residual, post, comb, d_o)``, returning
(d_x, d_residual) in bf16 and (d_post, d_comb) per token in fp32.  1.0.0 has the same post backward in
``mhc.post_kernel`` (its ``fuse_grad_acc`` is turned off: it would attach d_residual to residual's
storage for a later pre_apply_mix backward to accumulate into), and pre_apply_mix's backward only
through the autograd Function ``modeling.mhc.ops.mhc_pre_apply_mix``, which is differentiated here.
Both releases' gradients have the contract's dtypes and shapes (views), so nothing is converted.
"""

from __future__ import annotations

import torch

from tkverify.adapters.tile_kernels import _call, _gen, _tk


def _autograd(function, grads, inputs, *args):
    """The gradients of `function(*inputs, *args)`'s outputs against the cotangents `grads`, w.r.t. `inputs`."""
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    outputs = _call(function, *leaves, *args)
    return torch.autograd.grad(outputs, leaves, grads)


def pre_split_mixes_bwd(grad_pre, grad_post, grad_comb, mixes, scale, base, m, post_mult, pre_eps):
    if _gen() == 1:
        return tuple(_autograd(_tk("modeling.mhc.ops").mhc_pre_split_mixes, (grad_pre, grad_post, grad_comb),
                               (mixes, scale, base), m, post_mult, pre_eps))
    tk_mhc = _tk("mhc")
    tokens, width = mixes.shape[0] * mixes.shape[1], mixes.shape[-1]
    flat = mixes.reshape(tokens, width).contiguous()
    pre, post = (torch.empty((tokens, m), dtype=torch.float32, device=mixes.device) for _ in range(2))
    comb = torch.empty((tokens, m * m), dtype=torch.float32, device=mixes.device)
    _call(tk_mhc.mhc_pre_split_mixes_fwd, flat, scale, base, pre, post, comb, post_mult, pre_eps)
    grad_mixes, grad_scale, grad_base = torch.zeros_like(flat), torch.zeros_like(scale), torch.zeros_like(base)
    _call(tk_mhc.mhc_pre_split_mixes_bwd, grad_pre.reshape(tokens, m).contiguous(),
          grad_post.reshape(tokens, m).contiguous(), grad_comb.reshape(tokens, m * m).contiguous(), flat, post,
          scale, base, grad_mixes, grad_scale, grad_base, post_mult)
    return grad_mixes.view(mixes.shape), grad_scale, grad_base


def pre_apply_mix_bwd(grad_out, x, mix):
    if _gen() == 1:
        return tuple(_autograd(_tk("modeling.mhc.ops").mhc_pre_apply_mix, grad_out, (x, mix)))
    a, b, m, hidden = x.shape
    grad_x = torch.zeros_like(x)
    grad_mix = _call(_tk("mhc").mhc_pre_apply_mix_bwd, grad_out.reshape(-1, hidden).contiguous(),
                     x.reshape(-1, m, hidden), mix.reshape(-1, m), grad_x.view(-1, m, hidden))
    return grad_x, grad_mix.reshape(a, b, m, 1)


def post_bwd(grad_out, x, residual, post, comb):
    if _gen() == 1:
        return _call(_tk("mhc.post_kernel").mhc_post_bwd, x, residual, post, comb, grad_out, fuse_grad_acc=False)
    return _call(_tk("mhc").mhc_post_bwd, x, residual, post, comb, grad_out)


# Registered by tkverify.adapters.tile_kernels.register_all.
BACKWARD = {"mhc.pre_split_mixes": pre_split_mixes_bwd, "mhc.pre_apply_mix": pre_apply_mix_bwd,
            "mhc.post": post_bwd}
