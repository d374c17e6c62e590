"""tile-kernels as the implementation "tile_kernels" of mhc.pre_big_fuse, mHC's fused pre-block forward
(forward only: neither release has a backward of it).

What maps to what (the contract's signature: kernels/torch/mhc_big_fuse.py):

* 2.x: tile_kernels.mhc.mhc_pre_big_fuse_fwd(gemm_out_mul, gemm_out_sqrsum, mhc_scale, mhc_base, residual,
  post_mix, comb_mix, layer_input, rms_eps, mhc_pre_eps, mhc_sinkhorn_eps, mhc_post_mult_value,
  sinkhorn_repeat, n_splits=S).
* 1.0: the kernel builder behind its modeling op ``modeling.mhc.ops.mhc_pre_big_fuse`` (which adds the
  projection GEMM), tile_kernels.mhc.pre_big_fuse_kernel._mhc_pre_big_fuse(hidden_size, rms_eps,
  mhc_pre_eps, mhc_sinkhorn_eps, mhc_post_mult_value, sinkhorn_repeat, n_splits=S, mhc_mult=m), called
  with the same eight tensors.

Both write post_mix (N, m), comb_mix (N, m m) and layer_input (N, H) into buffers allocated here; comb_mix
is returned as the contract's (N, m, m) view.  Both normalise over the token's m H residual values.
"""

from __future__ import annotations

import torch

from tkverify.adapters.tile_kernels import _call, _gen, _tk


def pre_big_fuse(gemm_out_mul, gemm_out_sqrsum, scale, base, residual, rms_eps, pre_eps, sinkhorn_eps, post_mult,
                 sinkhorn_repeat):
    splits, tokens, _ = gemm_out_mul.shape
    _, m, hidden = residual.shape
    device = residual.device
    post_mix = torch.empty((tokens, m), dtype=torch.float32, device=device)
    comb_mix = torch.empty((tokens, m * m), dtype=torch.float32, device=device)
    layer_input = torch.empty((tokens, hidden), dtype=torch.bfloat16, device=device)
    tensors = (gemm_out_mul, gemm_out_sqrsum, scale, base, residual, post_mix, comb_mix, layer_input)
    if _gen() == 1:
        kernel = _call(_tk("mhc.pre_big_fuse_kernel")._mhc_pre_big_fuse, hidden, rms_eps, pre_eps, sinkhorn_eps,
                       post_mult, sinkhorn_repeat, n_splits=splits, mhc_mult=m)
        _call(kernel, *tensors)
    else:
        _call(_tk("mhc").mhc_pre_big_fuse_fwd, *tensors, rms_eps, pre_eps, sinkhorn_eps, post_mult, sinkhorn_repeat,
              n_splits=splits)
    return post_mix, comb_mix.view(tokens, m, m), layer_input


# Registered by tkverify.adapters.tile_kernels.register_all; 1.0.0 and 2.1.0 both have it (MISSING is empty).
FORWARD = {"mhc.pre_big_fuse": pre_big_fuse}
BACKWARD: dict = {}
