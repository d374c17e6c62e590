"""swiglu_forward_and_per_token_cast on the GPU: the token_cast kernel with the swiglu source.

The kernel computes y = ((l * sigmoid(l)) * r) * w per chunk and casts it per token
(`kernels.quant.token_kernel` says how; docs/contract/quant.md what).  Padding rows
(pos_to_token_topk == -1) are not read; they get y = 0 and are not counted.

The routed call (pos_to_token_topk, topk_weights, clamp, clamped_count) runs the same compiled
kernel as the plain one.  Its checks read no tensor value back to the host (no device sync: the call
can be captured in a CUDA graph); pos_to_token_topk's range is the eager implementation's check only.
The kernel bounds the index itself: a negative one, or (with topk_weights) one at or past T * K, makes
the row a padding row, so no weight is read out of bounds.

x is read in place at any row stride (its gate and up halves at the row's start and H further),
where its data pointer and row stride in bytes are multiples of 16; otherwise from a contiguous
copy (`kernels.quant.token_cast` says why).
"""

import math

import torch

from .. import _tilelang
from ..torch import quant as eager
from .common import CHUNK, IN_DTYPES, _crop_data, _new_data, _new_sf, _sf_args
from .token_cast import _padded_hidden, _token_launch
from .token_kernel import token_config


def swiglu_forward_and_per_token_cast(x: torch.Tensor, fmt: str = "e4m3", num_per_channels: int = 128, *,
                                      topk_weights: torch.Tensor | None = None,
                                      pos_to_token_topk: torch.Tensor | None = None,
                                      clamp: float | None = None, clamped_count: torch.Tensor | None = None,
                                      round_sf: bool = False, use_ue8m0: bool = False,
                                      use_packed_ue8m0: bool = False, use_tma_aligned_col_major_sf: bool = False,
                                      clamp_min: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, sf) of y = l * sigmoid(l) * r * w, per-token cast (see kernels/torch/quant.py).

    Padding rows (pos_to_token_topk == -1) are written as y = 0 (codes +0, the
    sf of a zero block), their x is not read and they are not counted.  An index
    outside [-1, T*K) is outside the contract (not checked: no read back) and
    makes its row such a padding row.
    clamped_count is updated in place (int64 atomics).  x at any row stride: read in place where
    its rows start on 16-byte boundaries, else from a contiguous copy.
    """
    hidden, fmt, n, cm, c = eager._check_swiglu_args(x, fmt, num_per_channels, topk_weights, pos_to_token_topk,
                                                     clamp, clamped_count, round_sf, use_ue8m0, use_packed_ue8m0,
                                                     use_tma_aligned_col_major_sf, clamp_min)
    _tilelang.require_cuda("x", x)
    _tilelang.check_dims_fit_int32("x", x)
    return _swiglu_checked(x, hidden, fmt, n, cm, c, topk_weights, pos_to_token_topk, clamped_count, round_sf,
                           use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf)


def _swiglu_checked(x, hidden, fmt, n, cm, c, topk_weights, pos_to_token_topk, clamped_count, round_sf, use_ue8m0,
                    use_packed_ue8m0, use_tma_aligned_col_major_sf):
    """swiglu_forward_and_per_token_cast after its argument checks: the outputs' allocation and the launch."""
    device = x.device
    num_rows = x.shape[0]
    sf = _new_sf(num_rows, hidden // n, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf, device)
    data = _new_data(num_rows, hidden, fmt, device)
    if num_rows == 0:
        return data, sf
    do_count = clamped_count is not None and c is not None
    extras = {
        "pos": (pos_to_token_topk.contiguous() if pos_to_token_topk is not None
                else _tilelang.placeholder(torch.int32, device)),
        "has_pos": pos_to_token_topk is not None,
        "weights": (topk_weights.reshape(-1) if topk_weights is not None
                    else _tilelang.placeholder(torch.float32, device)),
        # topk_weights' slot count: the kernel treats an index at or past it as a padding row (0: no weights)
        "has_w": min(topk_weights.numel(), 2**31 - 1) if topk_weights is not None else 0,
        "counts": clamped_count if do_count else _tilelang.placeholder(torch.int64, device),
        "do_count": do_count,
        "clamp": c if c is not None else math.inf,
    }
    if topk_weights is not None and extras["weights"].numel() == 0:
        extras["weights"] = _tilelang.placeholder(torch.float32, device)  # no slot to read (every row is padding)
    config = token_config("swiglu", IN_DTYPES[x.dtype], fmt)
    if hidden % CHUNK:
        h8 = _padded_hidden(hidden)
        xp = torch.zeros((num_rows, 2 * h8), dtype=x.dtype, device=device)
        xp[:, :hidden] = x[:, :hidden]
        xp[:, h8:h8 + hidden] = x[:, hidden:]
        dp = _new_data(num_rows, h8, fmt, device)
        _token_launch(config, xp, dp, _sf_args(sf), h8, round_sf, cm, False, extras)
        return _crop_data(dp, hidden, fmt), sf
    _token_launch(config, x, data, _sf_args(sf), n, round_sf, cm, False, extras)
    return data, sf
