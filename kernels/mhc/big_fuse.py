"""pre_big_fuse on the GPU: mHC's fused pre-block forward as the composition of the TileLang kernels of
its four stages (kernels.mhc.fused_norm's reduction, kernels.mhc's pre_split_mixes, sinkhorn and
pre_apply_mix), one launch of each.

Contract: ``docs/contract/mhc_big_fuse.md#mhc.pre_big_fuse``; signature and argument checks:
``kernels/torch/mhc_big_fuse.py``.  The arithmetic is exactly that of the four kernels, so each output
is correct by construction of its stage.  No kernel of its own: a fused kernel keeps a token's mixes,
pre weights and Sinkhorn matrix on chip and reads the partials and the residual once; this composition
writes the mixes, the three split outputs and the logits through global memory (a few hundred bytes a
token beside the residual's 2 m H), which is what the bench row of this op measures against copy
bandwidth without a target.
"""

from __future__ import annotations

import torch

from .. import _tilelang
from ..torch import mhc_big_fuse as eager
from .apply_mix import pre_apply_mix
from .fused_norm import reduce_partials_and_rmsnorm
from .sinkhorn_kernels import MAX_REPEAT, sinkhorn
from .split_mixes import pre_split_mixes


def pre_big_fuse(gemm_out_mul: torch.Tensor, gemm_out_sqrsum: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
                 residual: torch.Tensor, rms_eps: float, pre_eps: float, sinkhorn_eps: float, post_mult: float,
                 sinkhorn_repeat: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(post_mix fp32 (N, m), comb_mix fp32 (N, m, m), layer_input bf16 (N, H)): the four stages' kernels."""
    rms_eps, pre_eps, sinkhorn_eps, post_mult, sinkhorn_repeat = eager._check_pre_big_fuse_args(
        gemm_out_mul, gemm_out_sqrsum, scale, base, residual, rms_eps, pre_eps, sinkhorn_eps, post_mult,
        sinkhorn_repeat)
    if sinkhorn_repeat > MAX_REPEAT:
        raise ValueError(f"sinkhorn_repeat must be <= {MAX_REPEAT} (the Sinkhorn kernel's int32 step count), "
                         f"got {sinkhorn_repeat}")
    _tilelang.require_cuda("residual", residual)
    _, m, hidden = residual.shape
    _, _, mixes = reduce_partials_and_rmsnorm(gemm_out_mul[:, :, None], gemm_out_sqrsum[:, :, None], m * hidden,
                                              rms_eps)
    pre, post, logits = pre_split_mixes(mixes[None], scale, base, m, post_mult, pre_eps)
    comb = sinkhorn(logits[0], sinkhorn_repeat, sinkhorn_eps)
    layer_input = pre_apply_mix(residual[None], pre)[0]
    return post[0, :, :, 0].contiguous(), comb, layer_input
