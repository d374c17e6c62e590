"""DeepSeek's tile-kernels as the implementation "tile_kernels" of quant.swiglu (forward and backward),
quant.swiglu_backward_and_per_token_cast and quant.swiglu_forward_and_per_channel_cast_and_transpose.

The conventions of ``tkverify/adapters/tile_kernels.py`` (whose helpers this module calls): public
functions only, an assert or ValueError of tile-kernels' own code becomes `Unsupported`, the installed
release picks the API.  FORWARD and BACKWARD are registered by that module's register_all.

* 2.1.0: ``quant.swiglu_forward`` / ``quant.swiglu_backward`` (fmt "bf16" / "fp32") and
  ``quant.swiglu_backward_and_per_token_cast`` (x an e4m3 ``(data, sf)`` pair) take the router weight
  per expanded row, ``topk_weights`` (N,), and mark padding through ``psum_num_tokens_per_expert``.
  The adapter passes our weights gathered per row (1 for rows without weights) and no expert layout; a
  padding row gets the weight 0, which makes its outputs zero, as the contract's are, as long as its x
  is finite (0 * inf is NaN): a padding row holding a non-finite x is `Unsupported`.  Its backward wants
  the cotangent in x's dtype: a bf16 cotangent of an fp32 x is widened (exactly), the converse is
  `Unsupported`.
* 1.0.0 has no plain swiglu_forward or swiglu_backward (`Unsupported`, naming the release).  Its
  ``swiglu_backward_and_per_token_cast(x, grad_out, weight, pos_to_token_topk, token_topk_to_pos,
  num_per_channels, round_sf, swiglu_clamp_value)`` takes a bf16 cotangent, e4m3 only and no ue8m0,
  layout or clamp_min option: the rest is `Unsupported`.  The routing is ours (weights (T, K) gathered
  through pos_to_token_topk, -1 for padding rows, whose weight it takes as 0 and whose x it reads: a
  non-finite x there is `Unsupported`); without routing the adapter builds the identity one (K = 1,
  unit weights).  Its sf (``x_grad_fp8_sf_invs``) is the dequantisation scale, as its casts' are.
* swiglu_forward_and_per_channel_cast_and_transpose exists in 1.0.0 only (2.1.0: `Unsupported`): bf16 x,
  e4m3, N and 2H multiples of 128 (its asserts), ``without_transpose = not transpose``, a row-major fp32
  sf (no ue8m0, layout or clamp_min option: `Unsupported`).
"""

from __future__ import annotations

import numpy as np
import torch

from tkverify.adapters.tile_kernels import (_call, _clamp_min, _DEFAULT_CLAMP_MIN, _gen, _their_sf_flags, _tk, _v,
                                            our_sf)
from tkverify.registry import Unsupported


def _rows_weights(x: torch.Tensor, topk_weights, pos_to_token_topk) -> torch.Tensor | None:
    """The router weight per row (N,) fp32 as 2.1 takes it: gathered, 0 on padding rows; None without routing."""
    if pos_to_token_topk is None:
        return None
    _refuse_nonfinite_padding(x, pos_to_token_topk)
    live = pos_to_token_topk >= 0
    if topk_weights is None:
        w = torch.ones(x.shape[0], dtype=torch.float32, device=x.device)
    else:
        w = topk_weights.reshape(-1)[pos_to_token_topk.clamp_min(0).long()] if x.shape[0] else \
            torch.ones(0, dtype=torch.float32, device=x.device)
    return torch.where(live, w, torch.zeros_like(w)).contiguous()


def _refuse_nonfinite_padding(x: torch.Tensor, pos_to_token_topk: torch.Tensor) -> None:
    padding = pos_to_token_topk < 0
    if bool(padding.any()) and not bool(torch.isfinite(x[padding].float()).all()):
        raise Unsupported(f"{_v()} reads padding rows (weighted 0 here): a non-finite x in one would make its "
                          "outputs NaN where the contract has zeros")


def _plain_release() -> None:
    if _gen() == 1:
        raise Unsupported(f"{_v()} has no plain swiglu_forward / swiglu_backward (2.1.0 added them)")


def swiglu(x, fmt="bf16", *, topk_weights=None, pos_to_token_topk=None, clamp=None):
    _plain_release()
    x = x.contiguous()
    w = _rows_weights(x, topk_weights, pos_to_token_topk)
    return _call(_tk("quant").swiglu_forward, x, fmt, None, w, None, clamp)


def swiglu_bwd(grad_out, x, fmt="bf16", *, topk_weights=None, pos_to_token_topk=None, clamp=None):
    _plain_release()
    x = x.contiguous()
    if grad_out.dtype != x.dtype:
        if x.dtype != torch.float32:
            raise Unsupported(f"{_v()} swiglu_backward wants the cotangent in x's dtype ({x.dtype}); "
                              f"{grad_out.dtype} would be rounded")
        grad_out = grad_out.float()  # bf16 -> fp32 is exact
    w = _rows_weights(x, topk_weights, pos_to_token_topk)
    result = _call(_tk("quant").swiglu_backward, x, grad_out.contiguous(), fmt, None, w, None, clamp)
    return result[0]


def _identity_routing(num_rows: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.ones((num_rows, 1), dtype=torch.float32, device=device),
            torch.arange(num_rows, dtype=torch.int32, device=device))


def _v1_routing(x: torch.Tensor, topk_weights, pos_to_token_topk):
    """(weight (T, K), pos_to_token_topk (N,), token_topk_to_pos (T, K)) for 1.0.0."""
    num_rows = x.shape[0]
    if pos_to_token_topk is None:
        weight, pos = _identity_routing(num_rows, x.device)
    else:
        _refuse_nonfinite_padding(x, pos_to_token_topk)
        pos = pos_to_token_topk.contiguous()
        if topk_weights is not None:
            weight = topk_weights.contiguous()
        else:
            slots = int(pos.max()) + 1 if num_rows and bool((pos >= 0).any()) else 1
            weight = torch.ones((slots, 1), dtype=torch.float32, device=x.device)
    inverse = torch.full((weight.numel(),), -1, dtype=torch.int32, device=x.device)
    rows = torch.arange(num_rows, dtype=torch.int32, device=x.device)
    live = pos >= 0
    inverse[pos[live].long()] = rows[live]
    return weight, pos, inverse.view(weight.shape)


def swiglu_backward_and_per_token_cast(x, x_sf, grad_out, fmt="e4m3", num_per_channels=128, *, topk_weights=None,
                                       pos_to_token_topk=None, clamp=None, round_sf=False, use_ue8m0=False,
                                       use_packed_ue8m0=False, use_tma_aligned_col_major_sf=False, clamp_min=None):
    quant = _tk("quant")
    x = x.contiguous()
    rows, cols = x.shape[0], x.shape[1] // num_per_channels
    if _gen() == 1:
        if fmt != "e4m3" or use_ue8m0 or use_tma_aligned_col_major_sf:
            raise Unsupported(f"{_v()} swiglu_backward_and_per_token_cast casts to e4m3 with a row-major fp32 sf "
                              "only")
        if clamp_min is not None and np.float32(clamp_min) != np.float32(_DEFAULT_CLAMP_MIN["e4m3"]):
            raise Unsupported(f"{_v()} swiglu_backward_and_per_token_cast has no clamp_min option")
        if grad_out.dtype != torch.bfloat16:
            raise Unsupported(f"{_v()} swiglu_backward_and_per_token_cast takes a bf16 cotangent only")
        weight, pos, inverse = _v1_routing(x, topk_weights, pos_to_token_topk)
        _, (data, sf), x_grad, _ = _call(quant.swiglu_backward_and_per_token_cast, (x, x_sf.contiguous()),
                                         grad_out.contiguous(), weight, pos, inverse, num_per_channels,
                                         round_sf, clamp)
        return x_grad, data, sf.contiguous()
    w = _rows_weights(x, topk_weights, pos_to_token_topk)
    with _clamp_min(fmt, clamp_min):
        result = _call(quant.swiglu_backward_and_per_token_cast, (x, x_sf.contiguous()), grad_out.contiguous(),
                       fmt, num_per_channels, None, w, None,
                       **_their_sf_flags(round_sf, use_ue8m0, use_tma_aligned_col_major_sf), clamp_value=clamp)
    x_grad, (data, sf) = result[0], result[1]
    return x_grad, data, our_sf(sf, rows, cols, use_ue8m0=use_ue8m0, use_packed_ue8m0=use_packed_ue8m0,
                                column_major=use_tma_aligned_col_major_sf)


def swiglu_forward_and_per_channel_cast_and_transpose(x, fmt="e4m3", num_per_tokens=128, *, clamp=None,
                                                      transpose=True, round_sf=False, use_ue8m0=False,
                                                      use_packed_ue8m0=False, use_tma_aligned_col_major_sf=False,
                                                      clamp_min=None):
    if _gen() != 1:
        raise Unsupported(f"{_v()} has no swiglu_forward_and_per_channel_cast_and_transpose (1.0.0 only)")
    if use_ue8m0 or use_tma_aligned_col_major_sf:
        raise Unsupported(f"{_v()} swiglu_forward_and_per_channel_cast_and_transpose writes a row-major fp32 sf only")
    if clamp_min is not None and np.float32(clamp_min) != np.float32(_DEFAULT_CLAMP_MIN["e4m3"]):
        raise Unsupported(f"{_v()} swiglu_forward_and_per_channel_cast_and_transpose has no clamp_min option")
    return _call(_tk("quant").swiglu_forward_and_per_channel_cast_and_transpose, x.contiguous(), fmt,
                 num_per_tokens, round_sf, not transpose, clamp)


# Registered by tkverify.adapters.tile_kernels.register_all.
FORWARD = {
    "quant.swiglu": swiglu,
    "quant.swiglu_backward_and_per_token_cast": swiglu_backward_and_per_token_cast,
    "quant.swiglu_forward_and_per_channel_cast_and_transpose": swiglu_forward_and_per_channel_cast_and_transpose,
}
BACKWARD = {"quant.swiglu": swiglu_bwd}
