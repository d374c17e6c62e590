"""multilayer_recompute on the GPU: the residual stream recomputed across layers by the TileLang
kernels of pre_apply_mix and post (kernels.mhc.apply_mix, kernels.mhc.post_mix), one launch of each
per layer.

Contract: ``docs/contract/mhc_fused.md#mhc.multilayer_recompute``; signature and argument checks:
``kernels/torch/mhc_fused.py``.  Layer l reads the residual that layer l - 1 wrote (bf16), so the
arithmetic of each layer is exactly that of the two kernels: fp32 sums from +0 in the kernels' order,
rounded once to bf16.  No kernel of its own: a fused kernel would keep each residual tile on chip
across layers; this composition reads and writes every layer's residual through global memory.
"""

import torch

from .. import _tilelang
from ..torch import mhc_fused as eager
from .apply_mix import pre_apply_mix
from .post_mix import post


def multilayer_recompute(initial_residual: torch.Tensor, pre_mix: torch.Tensor, layer_output: torch.Tensor,
                         post_mix: torch.Tensor, comb_mix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(layer_input bf16 (L, N, H), residual bf16 (P, N, m, H)): per layer pre_apply_mix, then post."""
    layers, posts = eager._check_recompute_args(initial_residual, pre_mix, layer_output, post_mix, comb_mix)
    _tilelang.require_cuda("initial_residual", initial_residual)
    tokens, m, hidden = initial_residual.shape
    device = initial_residual.device
    layer_input = torch.empty((layers, tokens, hidden), dtype=torch.bfloat16, device=device)
    residual = torch.empty((posts, tokens, m, hidden), dtype=torch.bfloat16, device=device)
    current = initial_residual[None]
    for layer in range(layers):
        layer_input[layer] = pre_apply_mix(current, pre_mix[layer][None, ..., None])[0]
        if layer < posts:
            residual[layer] = post(layer_output[layer][None], current, post_mix[layer][None, ..., None],
                                   comb_mix[layer][None])[0]
            current = residual[layer][None]
    return layer_input, residual
