"""The plain SwiGLU on the GPU: forward, backward, and the backward of an e4m3 x fused with a per-token
cast (docs/contract/quant_swiglu.md; the eager twins and the metadata checks the wrappers share:
kernels/torch/quant_swiglu.py).  The wrappers read no tensor value back to the host.

Kernel quant.swiglu_plain: one CTA per (row, SWIGLU_THREADS vectors of the row); a thread takes `vec`
consecutive columns of l and the same of r (8: one 16-byte load of bf16, two of fp32, one 8-byte load
of e4m3 codes; 1: the scalar configuration for H % 8 != 0 or rows not 16-byte aligned).  Per element,
in fp32 with explicit round-to-nearest operations (no contraction into FMAs, no flush to zero):

    l' = l > c ? c : l,  r' = r > c ? c : (r < -c ? -c : r)        (NaN stays NaN; no clamp: c = inf)
    s = 1 / (1 + expf(-l'))                                            (libdevice expf, IEEE division)
    forward   y  = ((l' s) r') w
    backward  dl = ((g w) r') (s (1 + l' (1 - s)))   0 where l > c
              dr = (g w) (l' s)                      0 where r > c or r < -c

w is topk_weights.flatten()[pos_to_token_topk[row]] (1 without weights); rows whose index is -1 are
padding: x is not read and the outputs are +0.  The index is bounded on the device: one below 0, or (with
weights) at or past num_slots = T * K, makes the row a padding row, so an index outside the contract's
range (which the wrappers do not read back to check) is never read out of bounds.  The e4m3
configuration reads x as codes and multiplies each by its block's x_sf (one IEEE product) and writes
the fp32 gradient (N, 2H), which the wrapper rounds to bf16 and hands to the TileLang per-token cast
(kernels/quant/token_cast.py) in 1 x npc blocks over its 2H columns: the cast sees the same fp32 values
tile-kernels' fused kernel casts, at the cost of one more pass over them.  npc is checked against H
(the contract's rule: a token block, or H itself, so that no block straddles l and r); at npc = H the
cast takes two blocks a row and writes the (N, 2) sf in place in every storage and layout, with no
extra pass where H % 8 == 0 (otherwise each half is zero-padded to whole chunks first, as a row of
H % 8 != 0 is in per_token_cast).
"""

# No `from __future__ import annotations` here: tilelang evaluates the prim_func parameter annotations.

import math
from typing import NamedTuple

import torch

from .. import _tilelang
from .._tilelang import KernelDef
from ..torch import quant_swiglu as eager
from ..torch._checks import rows_aligned
from .block_cast import per_channel_cast
from .common import PASS_CONFIGS
from .token_cast import _token_cast

SWIGLU_THREADS = 128
SWIGLU_VECTOR = 8
_TL_DTYPES = {torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float8_e4m3fn: "float8_e4m3"}


class SwigluPlainConfig(NamedTuple):
    mode: str  # "fwd" or "bwd"
    x_dtype: str  # "bfloat16", "float32", or "float8_e4m3" (bwd only: codes times x_sf)
    grad_dtype: str  # the cotangent's dtype (bwd), "" (fwd)
    out_dtype: str  # "bfloat16" or "float32"
    vec: int  # SWIGLU_VECTOR or 1


def _all_configs() -> tuple[SwigluPlainConfig, ...]:
    configs = []
    for vec in (SWIGLU_VECTOR, 1):
        for x in ("bfloat16", "float32"):
            for out in ("bfloat16", "float32"):
                configs.append(SwigluPlainConfig("fwd", x, "", out, vec))
                for grad in ("bfloat16", "float32"):
                    configs.append(SwigluPlainConfig("bwd", x, grad, out, vec))
        for grad in ("bfloat16", "float32"):
            configs.append(SwigluPlainConfig("bwd", "float8_e4m3", grad, "float32", vec))
    return tuple(configs)


SWIGLU_PLAIN_CONFIGS = _all_configs()


def build_swiglu_plain(config: SwigluPlainConfig):
    """prim_func(x (N, 2H), x_sf (N, sf_cols) fp32, grad (N, H), pos (P,) int32, weights (K,) fp32,
    out (N, H) fwd / (N, 2H) bwd, has_pos, has_w, num_slots, clamp, num_per_channels), H = vec * hidden_vecs;
    num_slots: the weights a pos may index (T * K; 0 for an empty topk_weights)."""
    T = _tilelang.T()
    vec = config.vec
    backward = config.mode == "bwd"
    quantised = config.x_dtype == "float8_e4m3"
    grad_dtype = config.grad_dtype or "float32"
    num_rows = T.dynamic("num_rows")
    hidden_vecs = T.dynamic("hidden_vecs")
    sf_cols = T.dynamic("sf_cols")
    pos_len = T.dynamic("pos_len")
    weights_len = T.dynamic("weights_len")
    hidden = hidden_vecs * vec
    out_cols = 2 * hidden if backward else hidden
    # Buffers a configuration does not read take a one-element placeholder, under their own size symbol.
    sf_shape = (num_rows, sf_cols) if quantised else (T.dynamic("sf_len"),)
    grad_shape = (num_rows, hidden) if backward else (T.dynamic("grad_len"),)

    @T.macro
    def clamped(lv, rv, clamp, lc, rc):
        lc[0] = T.if_then_else(lv > clamp, clamp, lv)
        rc[0] = T.if_then_else(rv > clamp, clamp, T.if_then_else(rv < -clamp, -clamp, rv))

    @T.prim_func
    def swiglu_plain(
        x: T.Tensor((num_rows, 2 * hidden), config.x_dtype),
        x_sf: T.Tensor(sf_shape, "float32"),
        grad: T.Tensor(grad_shape, grad_dtype),
        pos: T.Tensor((pos_len,), "int32"),
        weights: T.Tensor((weights_len,), "float32"),
        out: T.Tensor((num_rows, out_cols), config.out_dtype),
        has_pos: T.int32,
        has_w: T.int32,
        num_slots: T.int32,
        clamp: T.float32,
        num_per_channels: T.int32,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(num_rows, T.ceildiv(hidden_vecs, SWIGLU_THREADS), threads=SWIGLU_THREADS) as (row, bx):
            tx = T.get_thread_binding()
            v = T.alloc_var("int32", init=bx * SWIGLU_THREADS + tx)
            live = T.alloc_var("int32", init=1)
            w = T.alloc_var("float32", init=1.0)
            xl = T.alloc_local((vec,), config.x_dtype)
            xr = T.alloc_local((vec,), config.x_dtype)
            g = T.alloc_local((vec,), grad_dtype)
            res_l = T.alloc_local((vec,), config.out_dtype)
            res_r = T.alloc_local((vec,), config.out_dtype)
            lc = T.alloc_local((1,), "float32")
            rc = T.alloc_local((1,), "float32")
            if v < hidden_vecs:
                if has_pos != 0:
                    if pos[row] < 0:
                        live = 0
                    elif has_w != 0:
                        if pos[row] < num_slots:
                            w = weights[pos[row]]
                        else:
                            live = 0  # past the slots: outside the contract, taken for padding
                for e in T.unroll(vec):
                    res_l[e] = T.Cast(config.out_dtype, 0)
                    res_r[e] = T.Cast(config.out_dtype, 0)
                if live != 0:
                    for e in T.vectorized(vec):
                        xl[e] = x[row, v * vec + e]
                    for e in T.vectorized(vec):
                        xr[e] = x[row, hidden + v * vec + e]
                    if backward:
                        for e in T.vectorized(vec):
                            g[e] = grad[row, v * vec + e]
                    for e in T.unroll(vec):
                        lv = T.Cast("float32", xl[e])
                        rv = T.Cast("float32", xr[e])
                        if quantised:
                            lv = T.ieee_mul(lv, x_sf[row, (v * vec + e) // num_per_channels])
                            rv = T.ieee_mul(rv, x_sf[row, (hidden + v * vec + e) // num_per_channels])
                        clamped(lv, rv, clamp, lc, rc)
                        s = T.ieee_fdiv(T.float32(1.0), T.ieee_add(T.float32(1.0), T.exp(-lc[0])))
                        silu = T.ieee_mul(lc[0], s)
                        if backward:
                            gw = T.ieee_mul(T.Cast("float32", g[e]), w)
                            slope = T.ieee_mul(s, T.ieee_add(T.float32(1.0),
                                                             T.ieee_mul(lc[0], T.ieee_sub(T.float32(1.0), s))))
                            dl = T.ieee_mul(T.ieee_mul(gw, rc[0]), slope)
                            dr = T.ieee_mul(gw, silu)
                            res_l[e] = T.Cast(config.out_dtype, T.if_then_else(lv > clamp, T.float32(0), dl))
                            res_r[e] = T.Cast(config.out_dtype,
                                              T.if_then_else((rv > clamp) or (rv < -clamp), T.float32(0), dr))
                        else:
                            res_l[e] = T.Cast(config.out_dtype, T.ieee_mul(T.ieee_mul(silu, rc[0]), w))
                for e in T.vectorized(vec):
                    out[row, v * vec + e] = res_l[e]
                if backward:
                    for e in T.vectorized(vec):
                        out[row, hidden + v * vec + e] = res_r[e]

    return swiglu_plain


SWIGLU_PLAIN = KernelDef("quant.swiglu_plain", build_swiglu_plain, SWIGLU_PLAIN_CONFIGS)


# -- wrappers ----------------------------------------------------------------------------------------


def _routing_args(x: torch.Tensor, topk_weights, pos_to_token_topk) -> tuple:
    """(pos, weights, has_pos, has_w, num_slots) for the kernel; num_slots (T * K, capped at the largest int32,
    which no int32 index reaches) bounds the weight the kernel reads."""
    device = x.device
    pos = pos_to_token_topk.contiguous() if pos_to_token_topk is not None else _tilelang.placeholder(torch.int32,
                                                                                                       device)
    weights = topk_weights.reshape(-1) if topk_weights is not None else None
    num_slots = min(weights.numel(), 2**31 - 1) if weights is not None else 0
    if weights is None or weights.numel() == 0:  # no slot to read (every row is padding)
        weights = _tilelang.placeholder(torch.float32, device)
    return pos, weights, int(pos_to_token_topk is not None), int(topk_weights is not None), num_slots


def _launch(mode: str, x: torch.Tensor, x_sf, grad, out: torch.Tensor, hidden: int, num_per_channels: int,
            clamp, topk_weights, pos_to_token_topk) -> None:
    """Run the kernel over x's rows (x and grad_out as contiguous, 16-byte aligned copies where they are not;
    the scalar configuration where a row is not a whole number of 16-byte vectors)."""
    device = x.device
    x = _tilelang.aligned(x.contiguous())
    grad = _tilelang.aligned(grad.contiguous()) if grad is not None else _tilelang.placeholder(torch.float32,
                                                                                                device)
    # contiguous, 16-byte aligned starts: every row is aligned where its length in bytes is a multiple of 16
    vectorized = hidden % SWIGLU_VECTOR == 0 and rows_aligned(x, 16) and (mode == "fwd" or rows_aligned(grad, 16))
    vec = SWIGLU_VECTOR if vectorized else 1
    config = SwigluPlainConfig(mode, _TL_DTYPES[x.dtype], _TL_DTYPES[grad.dtype] if mode == "bwd" else "",
                               _TL_DTYPES[out.dtype], vec)
    sf = x_sf.contiguous() if x_sf is not None else _tilelang.placeholder(torch.float32, device)
    kernel = _tilelang.kernel_for(SWIGLU_PLAIN, config, device)
    pos, weights, has_pos, has_w, num_slots = _routing_args(x, topk_weights, pos_to_token_topk)
    with _tilelang.device_guard(device):
        kernel(x, sf, grad, pos, weights, out, has_pos, has_w, num_slots, math.inf if clamp is None else clamp,
               num_per_channels)


def _check_kernel(named) -> None:
    for name, t in named:
        if t is not None:
            _tilelang.require_cuda(name, t)
            _tilelang.check_dims_fit_int32(name, t)


def swiglu(x: torch.Tensor, fmt: str = "bf16", *, topk_weights: torch.Tensor | None = None,
           pos_to_token_topk: torch.Tensor | None = None, clamp: float | None = None) -> torch.Tensor:
    """y (N, H) in fmt; see kernels/torch/quant_swiglu.py.  pos_to_token_topk's range is not checked (no
    read back): an index outside [-1, T*K) is outside the contract and makes its row a padding row."""
    hidden, c = eager._check_swiglu_args(x, fmt, topk_weights, pos_to_token_topk, clamp)
    _check_kernel((("x", x),))
    out = torch.empty((x.shape[0], hidden), dtype=eager._OUT_DTYPES[fmt], device=x.device)
    if x.shape[0]:
        _launch("fwd", x, None, None, out, hidden, 1, c, topk_weights, pos_to_token_topk)
    return out


def swiglu_bwd(grad_out: torch.Tensor, x: torch.Tensor, fmt: str = "bf16", *,
               topk_weights: torch.Tensor | None = None, pos_to_token_topk: torch.Tensor | None = None,
               clamp: float | None = None) -> torch.Tensor:
    """grad_x (N, 2H) in fmt; see kernels/torch/quant_swiglu.py.  An index outside [-1, T*K) makes its row a
    padding row (zero gradient), as in `swiglu`."""
    hidden, c = eager._check_swiglu_args(x, fmt, topk_weights, pos_to_token_topk, clamp)
    eager._check_grad_out(grad_out, x, hidden)
    _check_kernel((("x", x), ("grad_out", grad_out)))
    out = torch.empty((x.shape[0], 2 * hidden), dtype=eager._OUT_DTYPES[fmt], device=x.device)
    if x.shape[0]:
        _launch("bwd", x, None, grad_out, out, hidden, 1, c, topk_weights, pos_to_token_topk)
    return out


def swiglu_backward_and_per_token_cast(
    x: torch.Tensor, x_sf: torch.Tensor, grad_out: torch.Tensor, fmt: str = "e4m3", num_per_channels: int = 128, *,
    topk_weights: torch.Tensor | None = None, pos_to_token_topk: torch.Tensor | None = None,
    clamp: float | None = None, round_sf: bool = False, use_ue8m0: bool = False, use_packed_ue8m0: bool = False,
    use_tma_aligned_col_major_sf: bool = False, clamp_min: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_grad bf16, data, sf); see kernels/torch/quant_swiglu.py.  An index outside [-1, T*K) makes its row a
    padding row (zero gradient, +0 codes, the sf of a zero block), as in `swiglu`."""
    hidden, fmt, n, cm, c = eager._check_backward_cast_args(
        x, x_sf, grad_out, fmt, num_per_channels, topk_weights, pos_to_token_topk, clamp, round_sf, use_ue8m0,
        use_packed_ue8m0, use_tma_aligned_col_major_sf, clamp_min)
    _check_kernel((("x", x), ("x_sf", x_sf), ("grad_out", grad_out)))
    grad = torch.empty((x.shape[0], 2 * hidden), dtype=torch.float32, device=x.device)
    if x.shape[0]:
        _launch("bwd", x, x_sf, grad_out, grad, hidden, n, c, topk_weights, pos_to_token_topk)
    # n was checked against H, not against the gradient's 2H columns (at n = H: two blocks a row), so the
    # cast is called past per_token_cast's own check of n against its row length
    data, sf = _token_cast(grad, fmt, n, round_sf, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf, cm,
                           True)
    return grad.to(torch.bfloat16), data, sf


def swiglu_forward_and_per_channel_cast_and_transpose(
    x: torch.Tensor, fmt: str = "e4m3", num_per_tokens: int = 128, *, clamp: float | None = None,
    transpose: bool = True, round_sf: bool = False, use_ue8m0: bool = False, use_packed_ue8m0: bool = False,
    use_tma_aligned_col_major_sf: bool = False, clamp_min: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, sf); see kernels/torch/quant_swiglu.py.  y comes from this module's kernel in fp32, the cast
    from the TileLang per_channel_cast, the transpose from torch."""
    hidden, n, cm, c = eager._check_per_channel_transpose_args(
        x, fmt, num_per_tokens, clamp, transpose, round_sf, use_ue8m0, use_packed_ue8m0,
        use_tma_aligned_col_major_sf, clamp_min)
    _check_kernel((("x", x),))
    y = swiglu(x, "fp32", clamp=clamp)
    data, sf = per_channel_cast(y, "e4m3", n, round_sf=round_sf, use_ue8m0=use_ue8m0,
                                use_packed_ue8m0=use_packed_ue8m0,
                                use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf, clamp_min=clamp_min)
    return (data.t().contiguous() if transpose else data), sf
