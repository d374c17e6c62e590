"""Float64 oracles of the plain SwiGLU and of its backward fused with a per-token cast
(docs/contract/quant_swiglu.md).

x (N, 2H) holds l = x[:, :H] and r = x[:, H:].  With a clamp c (the fp32 nearest the given
number) the forward multiplies l' = min(l, c) and r' = clamp(r, -c, c); w is the row's router
weight (topk_weights.flatten()[pos_to_token_topk[n]], 1 without weights) and rows whose
pos_to_token_topk is -1 are padding, whose x is never read:

    y = l' sigmoid(l') r' w                                     (0 on padding rows)

The backward, from the maths, with s = sigmoid(l') and silu(l') = l' s:

    dl = g w r' s (1 + l' (1 - s))   where l <= c, else 0
    dr = g w silu(l')                where -c <= r <= c, else 0

The clamp's gradient is the one-sided derivative from inside the range: an element exactly at
the clamp (l == c, r == +-c) passes its gradient, one strictly past it gets 0 (its output does
not move with it).  Padding rows get a zero gradient, and so does an element whose cotangent is 0
(nothing flows back from it, even where the derivative is not finite).  Non-finite inputs follow IEEE arithmetic
in float64 here; the spec leaves the gradient of an element whose l or r is not finite
unconstrained (the derivative is not defined there).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import references.quant as ref
from references import as_float64
from tkverify import formats

_OUT_FORMATS = {"bf16": formats.BF16, "fp32": formats.FP32}


def rounded(values: np.ndarray, fmt: str) -> torch.Tensor:
    """float64 values correctly rounded (RNE, overflow to inf) to the bf16 / fp32 tensor of `fmt`."""
    f = _OUT_FORMATS[fmt]
    return formats.to_tensor(f.encode(values), f).reshape(values.shape)


def routing(num_rows: int, topk_weights: Any = None, pos_to_token_topk: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """(w, padding) per row: the gathered router weight (1 without weights, 0 on padding rows)."""
    padding = np.zeros(num_rows, dtype=bool)
    w = np.ones(num_rows)
    if pos_to_token_topk is None:
        return w, padding
    index = np.asarray(pos_to_token_topk.detach().cpu().numpy() if isinstance(pos_to_token_topk, torch.Tensor)
                       else pos_to_token_topk, dtype=np.int64).reshape(num_rows)
    padding = index < 0
    if topk_weights is not None and num_rows:
        w = np.where(padding, 0.0, as_float64(topk_weights).reshape(-1)[np.maximum(index, 0)])
    return w, padding


def dequantised_x(x: Any, x_sf: Any = None) -> np.ndarray:
    """x as float64: plain, or e4m3 codes times their per-row block sf (the product is exact)."""
    if x_sf is None:
        return as_float64(x)
    codes = as_float64(x)
    sf = as_float64(x_sf)
    return codes * np.repeat(sf, codes.shape[1] // sf.shape[1], axis=1) if codes.size else codes


class SwigluTerms:
    """The pieces of the forward and backward of one call, in float64, per element (N, H)."""

    def __init__(self, x64: np.ndarray, topk_weights: Any = None, pos_to_token_topk: Any = None,
                 clamp: float | None = None):
        num_rows, width = x64.shape
        hidden = width // 2
        self.l_raw, self.r_raw = x64[:, :hidden], x64[:, hidden:]
        self.w, self.padding = routing(num_rows, topk_weights, pos_to_token_topk)
        self.clamp = None if clamp is None else float(np.float32(clamp))
        l, r = self.l_raw, self.r_raw
        self.l_passes = np.ones(l.shape, dtype=bool)
        self.r_passes = np.ones(r.shape, dtype=bool)
        if self.clamp is not None:
            c = self.clamp
            self.l_passes = ~(l > c)
            self.r_passes = ~((r > c) | (r < -c))
            l = np.minimum(l, c)  # NaN stays NaN
            r = np.clip(r, -c, c)
        self.l, self.r = l, r
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            self.s = 1.0 / (1.0 + np.exp(-l))
            self.silu = l * self.s
        self.live = ~self.padding[:, None]

    def forward(self) -> np.ndarray:
        """y = silu(l') r' w, 0 on padding rows."""
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            y = self.silu * self.r * self.w[:, None]
        return np.where(self.live, y, 0.0)

    def silu_slope(self) -> np.ndarray:
        """d silu / dl at l': s (1 + l' (1 - s))."""
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            return self.s * (1.0 + self.l * (1.0 - self.s))

    def backward(self, grad_out: Any) -> np.ndarray:
        """(dl | dr) (N, 2H) for the cotangent grad_out (N, H)."""
        g = as_float64(grad_out)
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            gw = g * self.w[:, None]
            dl = np.where(self.l_passes, gw * self.r * self.silu_slope(), 0.0)
            dr = np.where(self.r_passes, gw * self.silu, 0.0)
            zero = g == 0  # a zero cotangent contributes nothing, even where the derivative is not finite
            dl, dr = np.where(zero, 0.0, dl), np.where(zero, 0.0, dr)
        return np.concatenate([np.where(self.live, dl, 0.0), np.where(self.live, dr, 0.0)], axis=1)


def swiglu(x: Any, fmt: str = "bf16", *, topk_weights: Any = None, pos_to_token_topk: Any = None,
           clamp: float | None = None) -> torch.Tensor:
    """y (N, H) of x (N, 2H), exact in float64 (the spec rounds it to fmt when judging)."""
    return torch.from_numpy(SwigluTerms(as_float64(x), topk_weights, pos_to_token_topk, clamp).forward())


def swiglu_bwd(grad_out: Any, x: Any, fmt: str = "bf16", *, topk_weights: Any = None,
               pos_to_token_topk: Any = None, clamp: float | None = None) -> torch.Tensor:
    """grad_x (N, 2H) in float64: (dl | dr) of the module docstring."""
    terms = SwigluTerms(as_float64(x), topk_weights, pos_to_token_topk, clamp)
    return torch.from_numpy(terms.backward(grad_out))


def swiglu_fwd_torch(x: torch.Tensor, fmt: str = "bf16", *, topk_weights: Any = None, pos_to_token_topk: Any = None,
                     clamp: float | None = None) -> torch.Tensor:
    """The forward in float64 torch, differentiable in x: what gradcheck takes differences of."""
    num_rows, width = x.shape
    hidden = width // 2
    l, r = x[:, :hidden], x[:, hidden:]
    w, padding = routing(num_rows, topk_weights, pos_to_token_topk)
    if clamp is not None:
        c = float(np.float32(clamp))
        l = torch.clamp(l, max=c)
        r = torch.clamp(r, -c, c)
    y = l * torch.sigmoid(l) * r * torch.from_numpy(w)[:, None]
    return torch.where(torch.from_numpy(~padding)[:, None], y, torch.zeros_like(y))


def swiglu_backward_and_per_token_cast(
    x: Any,
    x_sf: Any,
    grad_out: Any,
    fmt: str = "e4m3",
    num_per_channels: int = 128,
    *,
    topk_weights: Any = None,
    pos_to_token_topk: Any = None,
    clamp: float | None = None,
    round_sf: bool = False,
    use_ue8m0: bool = False,
    use_packed_ue8m0: bool = False,
    use_tma_aligned_col_major_sf: bool = False,
    clamp_min: float | None = None,
):
    """(x_grad bf16, data, sf): the gradient of x = codes * x_sf for grad_out, rounded once to bf16,
    and the per-token cast (1 x num_per_channels blocks over its 2H columns) of the exact gradient.

    A gradient beyond the fp32 range counts as infinite (its block's sf is NaN), as an fp32
    kernel's would be.
    """
    grad = SwigluTerms(dequantised_x(x, x_sf), topk_weights, pos_to_token_topk, clamp).backward(grad_out)
    grad = ref.fp32_range(grad)
    data, sf = ref.cast_in_blocks(grad, fmt, (1, num_per_channels), round_sf, use_ue8m0, use_packed_ue8m0,
                                  use_tma_aligned_col_major_sf, clamp_min)
    return rounded(grad, "bf16"), data, sf


def swiglu_forward_and_per_channel_cast_and_transpose(
    x: Any,
    fmt: str = "e4m3",
    num_per_tokens: int = 128,
    *,
    clamp: float | None = None,
    transpose: bool = True,
    round_sf: bool = False,
    use_ue8m0: bool = False,
    use_packed_ue8m0: bool = False,
    use_tma_aligned_col_major_sf: bool = False,
    clamp_min: float | None = None,
):
    """(data, sf): the per-channel cast (num_per_tokens x 1 blocks) of y (N, H), data transposed to (H, N)
    unless transpose is False; sf (ceil(N / num_per_tokens), H) in the storage the flags ask for."""
    y = ref.fp32_range(SwigluTerms(as_float64(x), clamp=clamp).forward())
    data, sf = ref.cast_in_blocks(y, fmt, (num_per_tokens, 1), round_sf, use_ue8m0, use_packed_ue8m0,
                                  use_tma_aligned_col_major_sf, clamp_min)
    return (data.t().contiguous() if transpose else data), sf
