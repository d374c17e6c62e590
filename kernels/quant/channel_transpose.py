"""quant.per_channel_cast_and_transpose and quant.per_channel_cast_fused on the GPU
(docs/contract/quant_layout.md): compositions of our TileLang wrappers, no kernel of their own.

per_channel_cast_and_transpose: the per-channel cast (kernel quant.block_cast, through
`kernels.quant.block_cast.per_channel_cast`) writes the e4m3 data (T, H), and the transpose (kernel
transpose.batched_transpose, through `kernels.transpose.transpose`) writes it as (H, T).  The data makes one
more round trip through memory than a fused kernel's would (5 bytes per bf16 element against the fused
2 + 1), so it cannot reach 90% of copy bandwidth over the fused op's bytes.

per_channel_cast_fused: the cast_back kernel (fp32 out) where x is quantised, the row gather by
pos_to_token in torch (index_select), then the per-channel cast: two more passes over the values than a
fused kernel makes.  Nothing is read back to the host: pos_to_token's range is not checked here (the eager
function checks it), and the gather bounds each index on the device, an index outside [0, T) giving a
zero row as -1 does.
"""

from __future__ import annotations

import torch

from .. import _tilelang
from ..torch import quant_layout as eager
from ..transpose import transpose
from .block_cast import per_channel_cast
from .dequant import cast_back


def per_channel_cast_and_transpose(x: torch.Tensor, fmt: str = "e4m3", num_per_tokens: int = 128, *,
                                   round_sf: bool = False, use_ue8m0: bool = False, use_packed_ue8m0: bool = False,
                                   use_tma_aligned_col_major_sf: bool = False,
                                   clamp_min: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(data e4m3 (H, T), sf); see kernels/torch/quant_layout.py."""
    eager._check_channel_transpose_fmt(fmt)
    data, sf = per_channel_cast(x, fmt, num_per_tokens, round_sf=round_sf, use_ue8m0=use_ue8m0,
                                use_packed_ue8m0=use_packed_ue8m0,
                                use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf, clamp_min=clamp_min)
    return transpose(data), sf


def per_channel_cast_fused(x: torch.Tensor, x_sf: torch.Tensor | None = None, fmt: str = "e4m3",
                           num_per_tokens: int = 128, num_per_channels: int | None = None,
                           pos_to_token: torch.Tensor | None = None, *, round_sf: bool = False,
                           use_ue8m0: bool = False, use_packed_ue8m0: bool = False,
                           use_tma_aligned_col_major_sf: bool = False,
                           clamp_min: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(data e4m3 (N, H), sf); see kernels/torch/quant_layout.py.  A composition: the TileLang cast_back (fp32)
    where x is quantised, the row gather in torch (no kernel of ours gathers rows by pos_to_token), the
    TileLang per-channel cast.

    pos_to_token's values are not checked (that would read them back to the host): an index outside
    [-1, T) is outside the contract; the gather bounds it on the device and writes that row as a padding
    row (-1): zero values, +0 codes."""
    n = eager._check_fused_args(x, x_sf, fmt, num_per_tokens, num_per_channels, pos_to_token, round_sf, use_ue8m0,
                                use_packed_ue8m0, use_tma_aligned_col_major_sf, clamp_min)
    _tilelang.require_cuda("x", x)  # x_sf and pos_to_token are on x's device (checked)
    return eager._fused_cast(x, x_sf, n, pos_to_token, cast_back, per_channel_cast, num_per_tokens,
                            round_sf=round_sf, use_ue8m0=use_ue8m0, use_packed_ue8m0=use_packed_ue8m0,
                            use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf, clamp_min=clamp_min)
