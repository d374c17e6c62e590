"""tile-kernels as the implementation "tile_kernels" of mhc.expand_to_mhc and mhc.head_compute_mix,
forward and backward (the conventions of ``tkverify.adapters.tile_kernels``, whose helpers this uses).

Both releases offer both ops:

* 1.0.0 through the autograd Functions of ``tile_kernels.modeling.mhc.ops``: ``expand_to_mhc(hidden,
  mhc_mult)`` and ``mhc_head_compute_mix(input_mix, mhc_scale, mhc_base, mhc_pre_eps)`` (input_mix
  (a, b, m)); their backwards are reached through ``torch.autograd.grad``.
* 2.1.0 through the out-parameter kernels of ``tile_kernels.mhc``: ``expand_to_mhc_fwd(x (T, H),
  o (T, m, H))``, ``expand_to_mhc_bwd(o_grad (T, m, H), x_grad (T, H))``,
  ``mhc_head_compute_mix_fwd(input_mix (T, m), mhc_scale, mhc_base, output_mix, mhc_pre_eps)`` and
  ``mhc_head_compute_mix_bwd(output_mix_grad, input_mix, mhc_scale, mhc_base, input_mix_grad,
  mhc_scale_grad_partial (S, 1), mhc_base_grad_partial (S, m), num_sms)``, whose per-SM partial
  gradients are added here in fp32 (``.sum(0)``), as 1.0.0's autograd Function does itself.

Tensors are flattened to the token-major 2-D/3-D views each release asks for (no value moves).
Every input arrives contiguous (no layout other than the contiguous one is declared).
"""

from __future__ import annotations

import torch

from tkverify.adapters.tile_kernels import _call, _gen, _tk


def expand_to_mhc(x, m):
    if _gen() == 1:
        return _call(_tk("modeling.mhc.ops").expand_to_mhc, x, m)
    hidden = x.shape[-1]
    out = torch.empty((*x.shape[:-1], m, hidden), dtype=x.dtype, device=x.device)
    _call(_tk("mhc").expand_to_mhc_fwd, x.reshape(-1, hidden), out.view(-1, m, hidden))
    return out


def expand_to_mhc_bwd(grad_out, x, m):
    if _gen() == 1:  # 1.0's public backward is its autograd Function's
        leaf = x.detach().clone().requires_grad_(True)
        out = _call(_tk("modeling.mhc.ops").expand_to_mhc, leaf, m)
        (grad,) = torch.autograd.grad(out, leaf, grad_out)
        return grad
    hidden = x.shape[-1]
    grad_x = torch.empty_like(x)
    _call(_tk("mhc").expand_to_mhc_bwd, grad_out.reshape(-1, m, hidden), grad_x.view(-1, hidden))
    return grad_x


def head_compute_mix(mixes, scale, base, pre_eps):
    if _gen() == 1:
        return _call(_tk("modeling.mhc.ops").mhc_head_compute_mix, mixes, scale, base, pre_eps)
    m = mixes.shape[-1]
    mix = torch.empty_like(mixes)
    _call(_tk("mhc").mhc_head_compute_mix_fwd, mixes.reshape(-1, m), scale, base, mix.view(-1, m), pre_eps)
    return mix


def head_compute_mix_bwd(grad_mix, mixes, scale, base, pre_eps):
    if _gen() == 1:
        leaves = [t.detach().clone().requires_grad_(True) for t in (mixes, scale, base)]
        mix = _call(_tk("modeling.mhc.ops").mhc_head_compute_mix, *leaves, pre_eps)
        return torch.autograd.grad(mix, leaves, grad_mix)
    m = mixes.shape[-1]
    num_sms = _tk("config").get_num_sms()
    grad_mixes = torch.empty_like(mixes)
    scale_partial = torch.empty((num_sms, 1), dtype=torch.float32, device=mixes.device)
    base_partial = torch.empty((num_sms, m), dtype=torch.float32, device=mixes.device)
    _call(_tk("mhc").mhc_head_compute_mix_bwd, grad_mix.reshape(-1, m), mixes.reshape(-1, m), scale, base,
          grad_mixes.view(-1, m), scale_partial, base_partial, num_sms)
    return grad_mixes, scale_partial.sum(0), base_partial.sum(0)


# Registered by tkverify.adapters.tile_kernels.register_all.
FORWARD = {"mhc.expand_to_mhc": expand_to_mhc, "mhc.head_compute_mix": head_compute_mix}
BACKWARD = {"mhc.expand_to_mhc": expand_to_mhc_bwd, "mhc.head_compute_mix": head_compute_mix_bwd}
