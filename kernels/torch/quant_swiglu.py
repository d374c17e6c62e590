"""Eager PyTorch SwiGLU, plain forward and backward, and the backward fused with a per-token cast
(docs/contract/quant_swiglu.md), in fp32 like the kernels:

    swiglu(x, fmt="bf16", *, topk_weights=None, pos_to_token_topk=None, clamp=None) -> out (N, H)
    swiglu_bwd(grad_out, x, fmt="bf16", *, topk_weights=None, pos_to_token_topk=None, clamp=None)
        -> grad_x (N, 2H)
    swiglu_backward_and_per_token_cast(x, x_sf, grad_out, fmt="e4m3", num_per_channels=128, *,
        topk_weights=None, pos_to_token_topk=None, clamp=None, round_sf=False, use_ue8m0=False,
        use_packed_ue8m0=False, use_tma_aligned_col_major_sf=False, clamp_min=None)
        -> (x_grad bf16 (N, 2H), data, sf)

l = x[:, :H], r = x[:, H:]; with a clamp c, l' = min(l, c), r' = clamp(r, -c, c); w the row's
router weight; y = l' sigmoid(l') r' w.  The backward: dl = g w r' s (1 + l' (1 - s)) where
l <= c (else 0), dr = g w l' s where -c <= r <= c (else 0).  Padding rows (pos_to_token_topk
== -1) are not read and come out zero.  Argument checks raise TypeError / ValueError naming the
argument; the TileLang wrappers (kernels/quant/swiglu_plain.py) call the same metadata checks
(`_check_swiglu_args`, `_check_backward_cast_args`: no tensor value is read), and only these eager
functions read pos_to_token_topk's range back to the host (`quant._check_routing_values`).
"""

from __future__ import annotations

import torch

from . import quant as q
from ._checks import check_rows, check_tensor

OUT_FORMATS = ("bf16", "fp32")
_OUT_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


# -- argument checks -----------------------------------------------------------------------------


def _check_swiglu_args(x, fmt, topk_weights, pos_to_token_topk, clamp) -> tuple[int, float | None]:
    """Checks the metadata (no tensor value is read); returns (H, clamp in force as fp32 or None)."""
    q._check_fmt(fmt, OUT_FORMATS, " (the plain SwiGLU writes bf16 or fp32)")
    x = q._check_x(x, "(N, 2H)")
    if x.shape[1] % 2:
        raise ValueError(f"x must have an even number of columns (l and r halves), got {x.shape[1]}")
    c = q._check_swiglu_extras(x, topk_weights, pos_to_token_topk, clamp, None)
    return x.shape[1] // 2, c


def _check_grad_out(grad_out: object, x: torch.Tensor, hidden: int) -> torch.Tensor:
    check_tensor("grad_out", grad_out, q.INPUT_DTYPES, 2, "(N, H)")
    if grad_out.numel():  # an empty tensor has no layout to refuse (torch gives some strides 0)
        check_rows("grad_out", grad_out)
    if tuple(grad_out.shape) != (x.shape[0], hidden):
        raise ValueError(f"grad_out must have shape (N, H) = {(x.shape[0], hidden)}, got {tuple(grad_out.shape)}")
    q._check_same_device(x, grad_out=grad_out)
    return grad_out


def _check_backward_cast_args(x, x_sf, grad_out, fmt, num_per_channels, topk_weights, pos_to_token_topk, clamp,
                             round_sf, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf,
                             clamp_min) -> tuple[int, str, int, float, float | None]:
    """Checks the metadata (no tensor value is read); returns (H, fmt, num_per_channels, clamp_min in force,
    clamp in force or None)."""
    check_tensor("x", x, (torch.float8_e4m3fn,), 2, "(N, 2H) e4m3 codes")
    if x.numel():
        check_rows("x", x)
    if x.shape[1] == 0 or x.shape[1] % 2:
        raise ValueError(f"x must have an even, non-zero number of columns (l and r halves), got {x.shape[1]}")
    hidden = x.shape[1] // 2
    fmt = q._check_fmt(fmt)
    if fmt == "e5m6":  # one block per row, but the gradient's blocks never straddle its l and r halves
        raise ValueError("fmt e5m6 is not taken here: e5m6 casts a row as one block, and this cast's blocks "
                         "stay within the gradient's l or r half (e4m3 or e2m1)")
    q._check_row_format(fmt, hidden)
    n = q._check_num_per_channels(fmt, num_per_channels, hidden)
    check_tensor("x_sf", x_sf, (torch.float32,), 2, "(N, 2H / num_per_channels)")
    q._check_contiguous("x_sf", x_sf)
    if tuple(x_sf.shape) != (x.shape[0], 2 * hidden // n):
        raise ValueError(f"x_sf must have shape (N, 2H / num_per_channels) = {(x.shape[0], 2 * hidden // n)}, "
                         f"got {tuple(x_sf.shape)}")
    q._check_same_device(x, x_sf=x_sf)
    _check_grad_out(grad_out, x, hidden)
    cm = q._check_sf_options(fmt, round_sf, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf, clamp_min)
    c = q._check_swiglu_extras(x, topk_weights, pos_to_token_topk, clamp, None)
    return hidden, fmt, n, cm, c


# -- the computation, fp32 -------------------------------------------------------------------------


def _routing(num_rows: int, topk_weights, pos_to_token_topk, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(live rows, w per row in fp32; 1 without weights)."""
    live = torch.ones(num_rows, dtype=torch.bool, device=device)
    w = torch.ones(num_rows, dtype=torch.float32, device=device)
    if pos_to_token_topk is not None:
        live = pos_to_token_topk >= 0
        if topk_weights is not None and num_rows:
            w = topk_weights.reshape(-1)[pos_to_token_topk.clamp_min(0).long()]
    return live, w


def _halves(x32: torch.Tensor, hidden: int, c: float | None):
    """(l', r', l passes, r passes): the clamped halves and where the gradient passes the clamp."""
    l, r = x32[:, :hidden], x32[:, hidden:]
    if c is None:
        return l, r, None, None
    return torch.clamp_max(l, c), torch.clamp(r, -c, c), ~(l > c), ~((r > c) | (r < -c))  # NaN stays NaN


def _forward_fp32(x32: torch.Tensor, hidden: int, c, live, w) -> torch.Tensor:
    l, r, _, _ = _halves(x32, hidden, c)
    y = l * torch.sigmoid(l) * r * w[:, None]
    return torch.where(live[:, None], y, torch.zeros_like(y))


def _backward_fp32(g: torch.Tensor, x32: torch.Tensor, hidden: int, c, live, w) -> torch.Tensor:
    """(dl | dr) in fp32, zero on padding rows and past the clamp."""
    l, r, l_passes, r_passes = _halves(x32, hidden, c)
    s = torch.sigmoid(l)
    gw = g.float() * w[:, None]
    dl = gw * r * (s * (1 + l * (1 - s)))
    dr = gw * (l * s)
    if c is not None:
        dl = torch.where(l_passes, dl, torch.zeros_like(dl))
        dr = torch.where(r_passes, dr, torch.zeros_like(dr))
    grad = torch.cat([dl, dr], dim=1)
    return torch.where(live[:, None], grad, torch.zeros_like(grad))


def swiglu(x: torch.Tensor, fmt: str = "bf16", *, topk_weights: torch.Tensor | None = None,
           pos_to_token_topk: torch.Tensor | None = None, clamp: float | None = None) -> torch.Tensor:
    """y = l' sigmoid(l') r' w (N, H) in fmt (bf16 or fp32), computed in fp32."""
    hidden, c = _check_swiglu_args(x, fmt, topk_weights, pos_to_token_topk, clamp)
    q._check_routing_values(topk_weights, pos_to_token_topk)
    live, w = _routing(x.shape[0], topk_weights, pos_to_token_topk, x.device)
    return _forward_fp32(x.float(), hidden, c, live, w).to(_OUT_DTYPES[fmt])


def swiglu_bwd(grad_out: torch.Tensor, x: torch.Tensor, fmt: str = "bf16", *,
               topk_weights: torch.Tensor | None = None, pos_to_token_topk: torch.Tensor | None = None,
               clamp: float | None = None) -> torch.Tensor:
    """grad_x (N, 2H) in fmt: (dl | dr), computed in fp32."""
    hidden, c = _check_swiglu_args(x, fmt, topk_weights, pos_to_token_topk, clamp)
    _check_grad_out(grad_out, x, hidden)
    q._check_routing_values(topk_weights, pos_to_token_topk)
    live, w = _routing(x.shape[0], topk_weights, pos_to_token_topk, x.device)
    return _backward_fp32(grad_out, x.float(), hidden, c, live, w).to(_OUT_DTYPES[fmt])


def _dequantised(x: torch.Tensor, x_sf: torch.Tensor, num_per_channels: int) -> torch.Tensor:
    """codes * sf in fp32 (one rounding; exact where sf is a power of two)."""
    return x.float() * torch.repeat_interleave(x_sf, num_per_channels, dim=1)


def swiglu_backward_and_per_token_cast(
    x: torch.Tensor, x_sf: torch.Tensor, grad_out: torch.Tensor, fmt: str = "e4m3", num_per_channels: int = 128, *,
    topk_weights: torch.Tensor | None = None, pos_to_token_topk: torch.Tensor | None = None,
    clamp: float | None = None, round_sf: bool = False, use_ue8m0: bool = False, use_packed_ue8m0: bool = False,
    use_tma_aligned_col_major_sf: bool = False, clamp_min: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_grad bf16, data, sf): the fp32 gradient of x = codes * x_sf, rounded to bf16, and its per-token
    cast in 1 x num_per_channels blocks over the 2H columns."""
    hidden, fmt, n, cm, c = _check_backward_cast_args(
        x, x_sf, grad_out, fmt, num_per_channels, topk_weights, pos_to_token_topk, clamp, round_sf, use_ue8m0,
        use_packed_ue8m0, use_tma_aligned_col_major_sf, clamp_min)
    q._check_routing_values(topk_weights, pos_to_token_topk)
    live, w = _routing(x.shape[0], topk_weights, pos_to_token_topk, x.device)
    grad = _backward_fp32(grad_out, _dequantised(x, x_sf, n), hidden, c, live, w)
    data, sf = q._cast(grad, fmt, (1, n), round_sf, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf, cm)
    return grad.to(torch.bfloat16), data, sf


def _check_per_channel_transpose_args(x, fmt, num_per_tokens, clamp, transpose, round_sf, use_ue8m0,
                                      use_packed_ue8m0, use_tma_aligned_col_major_sf,
                                      clamp_min) -> tuple[int, int, float, float | None]:
    """Returns (H, num_per_tokens, clamp_min in force, clamp in force or None)."""
    q._check_fmt(fmt, ("e4m3",), " (the transposed per-channel cast writes e4m3 codes, one a byte)")
    hidden, c = _check_swiglu_args(x, "fp32", None, None, clamp)
    q._check_bool("transpose", transpose)
    _, n, cm = q._check_per_channel_args(x[:, :hidden], fmt, num_per_tokens, round_sf, use_ue8m0,
                                         use_packed_ue8m0, use_tma_aligned_col_major_sf, clamp_min)
    return hidden, n, cm, c


def swiglu_forward_and_per_channel_cast_and_transpose(
    x: torch.Tensor, fmt: str = "e4m3", num_per_tokens: int = 128, *, clamp: float | None = None,
    transpose: bool = True, round_sf: bool = False, use_ue8m0: bool = False, use_packed_ue8m0: bool = False,
    use_tma_aligned_col_major_sf: bool = False, clamp_min: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, sf): y (fp32) cast per channel in num_per_tokens x 1 blocks, data (H, N) when transposed."""
    hidden, n, cm, c = _check_per_channel_transpose_args(
        x, fmt, num_per_tokens, clamp, transpose, round_sf, use_ue8m0, use_packed_ue8m0,
        use_tma_aligned_col_major_sf, clamp_min)
    live, w = _routing(x.shape[0], None, None, x.device)
    y = _forward_fp32(x.float(), hidden, c, live, w)
    data, sf = q._cast(y, "e4m3", (n, 1), round_sf, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf, cm)
    return (data.t().contiguous() if transpose else data), sf
