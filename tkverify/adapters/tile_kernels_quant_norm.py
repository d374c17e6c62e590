"""tile-kernels' RMSNorm as the "tile_kernels" implementation of quant.norm and its backward
(contract: docs/contract/quant_norm.md).

2.1.0 exports ``quant.norm_forward(x, weight, eps, residual=None, out_scale=1.0, ..., with_rstd=False)``,
returning (out, rstd or None, norm_input) with norm_input aliasing x without a residual, and
``quant.norm_backward(out_grad, x, weight, rstd, residual_out_grad=None, out_scale=1.0)``, taking the
forward's norm_input as x and returning (x_grad, weight_grad); the residual's gradient is x_grad
too.  Both are called with the contract's arguments unchanged (with_rstd=True).  2.1.0's
``quant.norm_forward_and_per_token_cast`` (e4m3 with 32-column blocks only: its asserts make other
cases `Unsupported`) maps quant.norm_forward_and_per_token_cast, its sf flags and sf storage converted
as for per_token_cast.  1.0.0 has none of them (`MISSING`): its calls raise `Unsupported` naming the
release.
"""

from __future__ import annotations

from tkverify.adapters.tile_kernels import (_call, _clamp_min, _fmt, _gen, _their_sf_flags, _tk, _v,
                                            our_sf)
from tkverify.registry import Unsupported

# What each API generation lacks among this module's ops (tkverify.adapters.tile_kernels.MISSING's format).
MISSING = {1: {"quant.norm": "tile-kernels 1.x has no norm_forward / norm_backward in tile_kernels.quant",
               "quant.norm_forward_and_per_token_cast": "tile-kernels 1.x has no norm_forward_and_per_token_cast"}}


def _require(op: str) -> None:
    why = MISSING.get(_gen(), {}).get(op)
    if why:
        raise Unsupported(f"{_v()} lacks {op}: {why}")


def norm(x, weight=None, residual=None, eps=1e-6, out_scale=1.0):
    _require("quant.norm")
    out, rstd, norm_input = _call(_tk("quant").norm_forward, x, weight, eps, residual=residual,
                                  out_scale=out_scale, with_rstd=True)
    return out, rstd, norm_input


def norm_bwd(grad_out, grad_norm_input, x, weight=None, residual=None, *, rstd, norm_input, eps=1e-6,
             out_scale=1.0):
    _require("quant.norm")
    grad_x, grad_weight = _call(_tk("quant").norm_backward, grad_out, norm_input, weight, rstd,
                                residual_out_grad=grad_norm_input, out_scale=out_scale)
    return grad_x, grad_weight, (grad_x if residual is not None else None)


def norm_forward_and_per_token_cast(x, weight=None, residual=None, eps=1e-6, out_scale=1.0, fmt="e4m3",
                                    num_per_channels=128, *, round_sf=False, use_ue8m0=False, use_packed_ue8m0=False,
                                    use_tma_aligned_col_major_sf=False, clamp_min=None):
    _require("quant.norm_forward_and_per_token_cast")
    with _clamp_min(_fmt(fmt), clamp_min):
        (data, sf), _, rstd, norm_input = _call(
            _tk("quant").norm_forward_and_per_token_cast, x, weight, eps, fmt, num_per_channels, residual=residual,
            out_scale=out_scale, with_rstd=True, **_their_sf_flags(round_sf, use_ue8m0, use_tma_aligned_col_major_sf))
    rows, cols = x.shape[0], x.shape[1] // num_per_channels
    return (data, our_sf(sf, rows, cols, use_ue8m0=use_ue8m0, use_packed_ue8m0=use_packed_ue8m0,
                         column_major=use_tma_aligned_col_major_sf), rstd, norm_input)


# Registered by tkverify.adapters.tile_kernels.register_all.
FORWARD = {"quant.norm": norm, "quant.norm_forward_and_per_token_cast": norm_forward_and_per_token_cast}
BACKWARD = {"quant.norm": norm_bwd}
