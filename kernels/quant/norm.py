"""RMSNorm with a residual and an output scale in TileLang (quant.norm): the forward (kernel
quant.norm_fwd), the row part of the backward (quant.norm_bwd) and the weight gradient's column
sums (quant.norm_wgrad), with their wrappers.

Contract: docs/contract/quant_norm.md; signatures and argument checks: kernels/torch/quant_norm.py.
The wrappers fold out_scale into the weight once, ws = fp32(w) * fp32(c) (H elements), as the eager
implementation does.

* norm_fwd: one CTA of 128 threads per row; thread tx takes the row's 16-byte vectors tx, tx + 128,
  ...  Pass 1 forms s = x + residual in fp32 rounded to x's dtype (written as norm_input) and sums
  s^2 in fp32; the CTA adds the 128 partial sums in a tree in shared memory; rstd =
  rsqrt(sum / H + eps) (rsqrt.approx).  Pass 2 reads each thread's own s again (norm_input, or x
  without a residual: L1/L2 hits) and writes out = (s rstd) ws rounded to x's dtype.
* norm_bwd: one CTA per row; pass 1 sums D = sum (g ws) s, pass 2 writes
  grad_x = (g ws) rstd - s (rstd^3 D / H) (+ grad_norm_input), rounded to x's dtype.
* norm_wgrad: one thread per vector of columns and per split of ROWS_PER_SPLIT rows sums (g s) rstd
  over its rows in row order into an fp32 partial (splits, H); the wrapper adds the partials
  (torch, fp32), multiplies by out_scale and rounds to the weight's dtype.

norm_forward_and_per_token_cast runs norm_fwd, then the token_cast kernel (kernels.quant.per_token_cast)
on its out: two launches, out making one round trip through memory.

Sizes that are not a multiple of the 16-byte vector, or tensors not 16-byte aligned, run the same
arithmetic one element at a time (the scalar configurations).  Every global access is guarded.
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.

import itertools
from typing import NamedTuple

import torch

from .. import _tilelang
from .._tilelang import KernelDef
from ..torch import quant_norm as eager

THREADS = 128
ROWS_PER_SPLIT = 256
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}
_DTYPES = {torch.bfloat16: "bfloat16", torch.float32: "float32"}
_VECTOR = {"bfloat16": 8, "float32": 4}  # elements per 16 bytes


class RowConfig(NamedTuple):
    dtype: str  # "bfloat16" or "float32"
    extra: bool  # forward: a residual is added; backward: grad_norm_input is added
    vectorized: bool  # 16-byte accesses: H a multiple of the vector and every tensor aligned


class ColumnConfig(NamedTuple):
    dtype: str
    vectorized: bool


ROW_CONFIGS = tuple(RowConfig(d, e, v) for d, e, v in itertools.product(_VECTOR, (False, True), (True, False)))
COLUMN_CONFIGS = tuple(ColumnConfig(d, v) for d, v in itertools.product(_VECTOR, (True, False)))


def _vec(config) -> int:
    return _VECTOR[config.dtype] if config.vectorized else 1


_TREE = tuple(THREADS >> k for k in range(1, THREADS.bit_length()))  # 64, 32, ..., 1


def _block_sum_macro(T):
    @T.macro
    def block_sum(red, acc, tx):
        # the CTA's sum of acc over its threads, a tree in shared memory; red[0] for every thread after
        red[tx] = acc
        T.sync_threads()
        for stride in _TREE:
            if tx < stride:
                red[tx] = red[tx] + red[tx + stride]
            T.sync_threads()

    return block_sum


def build_norm_fwd(config: RowConfig):
    """prim_func(x, residual, ws, out, norm_input, rstd, eps, size, num_blocks, block_offset); residual and
    norm_input are x itself (neither read nor written) without a residual."""
    T = _tilelang.T()
    dt, vec, extra = config.dtype, _vec(config), config.extra
    rows, num_vecs = T.dynamic("rows, num_vecs")
    block_sum = _block_sum_macro(T)

    @T.prim_func
    def norm_fwd(
        x: T.Tensor((rows, num_vecs * vec), dt),
        residual: T.Tensor((rows, num_vecs * vec), dt),
        ws: T.Tensor((num_vecs * vec,), "float32"),
        out: T.Tensor((rows, num_vecs * vec), dt),
        norm_input: T.Tensor((rows, num_vecs * vec), dt),
        rstd: T.Tensor((rows,), "float32"),
        eps: T.float32,
        size: T.float32,
        num_blocks: T.int32,
        block_offset: T.int64,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(num_blocks, threads=THREADS) as block:
            tx = T.get_thread_binding()
            row = T.alloc_var("int64", init=block_offset + block)
            red = T.alloc_shared((THREADS,), "float32")
            a = T.alloc_local((vec,), dt)
            b = T.alloc_local((vec,), dt)
            f = T.alloc_local((vec,), "float32")
            w = T.alloc_local((vec,), "float32")
            acc = T.alloc_var("float32", init=T.float32(0))
            r = T.alloc_var("float32", init=T.float32(0))
            if row < rows:
                for i in T.serial(T.ceildiv(num_vecs, THREADS)):
                    v = i * THREADS + tx
                    if v < num_vecs:
                        for k in T.vectorized(vec):
                            a[k] = x[row, v * vec + k]
                        if extra:
                            for k in T.vectorized(vec):
                                b[k] = residual[row, v * vec + k]
                            for k in T.unroll(vec):
                                a[k] = T.Cast(dt, T.Cast("float32", a[k]) + T.Cast("float32", b[k]))
                            for k in T.vectorized(vec):
                                norm_input[row, v * vec + k] = a[k]
                        for k in T.unroll(vec):
                            f[k] = T.Cast("float32", a[k])
                            acc = acc + f[k] * f[k]
            block_sum(red, acc, tx)
            if row < rows:
                r = T.rsqrt(T.ieee_add(T.ieee_fdiv(red[0], size), eps))
                if tx == 0:
                    rstd[row] = r
                for i in T.serial(T.ceildiv(num_vecs, THREADS)):
                    v = i * THREADS + tx
                    if v < num_vecs:
                        if extra:
                            for k in T.vectorized(vec):
                                a[k] = norm_input[row, v * vec + k]
                        else:
                            for k in T.vectorized(vec):
                                a[k] = x[row, v * vec + k]
                        for k in T.vectorized(vec):
                            w[k] = ws[v * vec + k]
                        for k in T.unroll(vec):
                            b[k] = T.Cast(dt, T.ieee_mul(T.ieee_mul(T.Cast("float32", a[k]), r), w[k]))
                        for k in T.vectorized(vec):
                            out[row, v * vec + k] = b[k]

    return norm_fwd


def build_norm_bwd(config: RowConfig):
    """prim_func(grad_out, grad_norm_input, norm_input, ws, rstd, grad_x, size, num_blocks, block_offset);
    grad_norm_input is grad_out itself (not read) without one."""
    T = _tilelang.T()
    dt, vec, extra = config.dtype, _vec(config), config.extra
    rows, num_vecs = T.dynamic("rows, num_vecs")
    block_sum = _block_sum_macro(T)

    @T.prim_func
    def norm_bwd(
        grad_out: T.Tensor((rows, num_vecs * vec), dt),
        grad_norm_input: T.Tensor((rows, num_vecs * vec), dt),
        norm_input: T.Tensor((rows, num_vecs * vec), dt),
        ws: T.Tensor((num_vecs * vec,), "float32"),
        rstd: T.Tensor((rows,), "float32"),
        grad_x: T.Tensor((rows, num_vecs * vec), dt),
        size: T.float32,
        num_blocks: T.int32,
        block_offset: T.int64,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(num_blocks, threads=THREADS) as block:
            tx = T.get_thread_binding()
            row = T.alloc_var("int64", init=block_offset + block)
            red = T.alloc_shared((THREADS,), "float32")
            g = T.alloc_local((vec,), dt)
            s = T.alloc_local((vec,), dt)
            n = T.alloc_local((vec,), dt)
            w = T.alloc_local((vec,), "float32")
            gw = T.alloc_local((vec,), "float32")
            acc = T.alloc_var("float32", init=T.float32(0))
            r = T.alloc_var("float32", init=T.float32(0))
            coef = T.alloc_var("float32", init=T.float32(0))
            if row < rows:
                for i in T.serial(T.ceildiv(num_vecs, THREADS)):
                    v = i * THREADS + tx
                    if v < num_vecs:
                        for k in T.vectorized(vec):
                            g[k] = grad_out[row, v * vec + k]
                        for k in T.vectorized(vec):
                            s[k] = norm_input[row, v * vec + k]
                        for k in T.vectorized(vec):
                            w[k] = ws[v * vec + k]
                        for k in T.unroll(vec):
                            acc = acc + T.ieee_mul(T.Cast("float32", g[k]), w[k]) * T.Cast("float32", s[k])
            block_sum(red, acc, tx)
            if row < rows:
                r = rstd[row]
                coef = T.ieee_fdiv(T.ieee_mul(T.ieee_mul(T.ieee_mul(r, r), r), red[0]), size)
                for i in T.serial(T.ceildiv(num_vecs, THREADS)):
                    v = i * THREADS + tx
                    if v < num_vecs:
                        for k in T.vectorized(vec):
                            g[k] = grad_out[row, v * vec + k]
                        for k in T.vectorized(vec):
                            s[k] = norm_input[row, v * vec + k]
                        for k in T.vectorized(vec):
                            w[k] = ws[v * vec + k]
                        for k in T.unroll(vec):
                            gw[k] = T.ieee_sub(T.ieee_mul(T.ieee_mul(T.Cast("float32", g[k]), w[k]), r),
                                               T.ieee_mul(T.Cast("float32", s[k]), coef))
                        if extra:
                            for k in T.vectorized(vec):
                                n[k] = grad_norm_input[row, v * vec + k]
                            for k in T.unroll(vec):
                                gw[k] = T.ieee_add(gw[k], T.Cast("float32", n[k]))
                        for k in T.unroll(vec):
                            g[k] = T.Cast(dt, gw[k])
                        for k in T.vectorized(vec):
                            grad_x[row, v * vec + k] = g[k]

    return norm_bwd


def build_norm_wgrad(config: ColumnConfig):
    """prim_func(grad_out, norm_input, rstd, partial (splits, H) fp32, num_blocks, block_offset): block b
    takes column vectors [(b % cb) 128, +128) of the rows of split b // cb, cb = ceil(num_vecs / 128)."""
    T = _tilelang.T()
    dt, vec = config.dtype, _vec(config)
    rows, num_vecs, splits = T.dynamic("rows, num_vecs, splits")

    @T.prim_func
    def norm_wgrad(
        grad_out: T.Tensor((rows, num_vecs * vec), dt),
        norm_input: T.Tensor((rows, num_vecs * vec), dt),
        rstd: T.Tensor((rows,), "float32"),
        partial: T.Tensor((splits, num_vecs * vec), "float32"),
        num_blocks: T.int32,
        block_offset: T.int64,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(num_blocks, threads=THREADS) as block:
            tx = T.get_thread_binding()
            flat = T.alloc_var("int64", init=block_offset + block)
            col_blocks = T.ceildiv(num_vecs, THREADS)
            split = T.alloc_var("int64", init=T.truncdiv(flat, col_blocks))
            v = T.alloc_var("int64", init=T.truncmod(flat, col_blocks) * THREADS + tx)
            g = T.alloc_local((vec,), dt)
            s = T.alloc_local((vec,), dt)
            acc = T.alloc_local((vec,), "float32")
            r = T.alloc_var("float32", init=T.float32(0))
            if split < splits and v < num_vecs:
                for k in T.unroll(vec):
                    acc[k] = T.float32(0)
                for j in T.serial(ROWS_PER_SPLIT):
                    if split * ROWS_PER_SPLIT + j < rows:
                        r = rstd[split * ROWS_PER_SPLIT + j]
                        for k in T.vectorized(vec):
                            g[k] = grad_out[split * ROWS_PER_SPLIT + j, v * vec + k]
                        for k in T.vectorized(vec):
                            s[k] = norm_input[split * ROWS_PER_SPLIT + j, v * vec + k]
                        for k in T.unroll(vec):
                            acc[k] = T.ieee_add(acc[k], T.ieee_mul(
                                T.ieee_mul(T.Cast("float32", g[k]), T.Cast("float32", s[k])), r))
                for k in T.vectorized(vec):
                    partial[split, v * vec + k] = acc[k]

    return norm_wgrad


NORM_FWD = KernelDef("quant.norm_fwd", build_norm_fwd, ROW_CONFIGS)
NORM_BWD = KernelDef("quant.norm_bwd", build_norm_bwd, ROW_CONFIGS)
NORM_WGRAD = KernelDef("quant.norm_wgrad", build_norm_wgrad, COLUMN_CONFIGS)


# -- wrappers ------------------------------------------------------------------------


def _dense(name: str, t: torch.Tensor) -> torch.Tensor:
    """t's rows as one dense, 16-byte aligned block (a copy of a strided or misaligned view)."""
    return t if t.is_contiguous() and t.data_ptr() % 16 == 0 else t.contiguous().clone()


def _row_config(x: torch.Tensor, extra: bool, tensors: tuple[torch.Tensor, ...]) -> RowConfig:
    dt = _DTYPES[x.dtype]
    vectorized = x.shape[1] % _VECTOR[dt] == 0 and all(t.data_ptr() % 16 == 0 for t in tensors)
    return RowConfig(dt, extra, vectorized)


def _launch(kernel_def: KernelDef, config, device: torch.device, blocks: int, *args) -> None:
    kernel = _tilelang.kernel_for(kernel_def, config, device)
    with _tilelang.device_guard(device):
        _tilelang.launch_in_pieces(kernel, blocks, *args)


def _checked_on_cuda(x: torch.Tensor) -> None:
    _tilelang.require_cuda("x", x)
    _tilelang.check_dims_fit_int32("x", x)


def norm(x: torch.Tensor, weight: torch.Tensor | None = None, residual: torch.Tensor | None = None,
         eps: float = 1e-6, out_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, rstd, norm_input), as kernels.torch.quant_norm.norm; norm_input is x itself without a residual."""
    eps, out_scale = eager._check_norm_args(x, weight, residual, eps, out_scale)
    _checked_on_cuda(x)
    tokens, hidden = x.shape
    out = torch.empty((tokens, hidden), dtype=x.dtype, device=x.device)
    rstd = torch.empty(tokens, dtype=torch.float32, device=x.device)
    s = x if residual is None else torch.empty_like(out)
    if tokens == 0:
        return out, rstd, s
    xd = _dense("x", x)
    rd = xd if residual is None else _dense("residual", residual)
    nd = xd if residual is None else s
    ws = eager._scaled_weight(weight, hidden, out_scale, x.device)
    config = _row_config(x, residual is not None, (xd, rd, ws, out, nd))
    _launch(NORM_FWD, config, x.device, tokens, xd, rd, ws, out, nd, rstd, eps, float(hidden))
    return out, rstd, s


def norm_bwd(grad_out: torch.Tensor, grad_norm_input: torch.Tensor | None, x: torch.Tensor,
             weight: torch.Tensor | None = None, residual: torch.Tensor | None = None, *, rstd: torch.Tensor,
             norm_input: torch.Tensor, eps: float = 1e-6, out_scale: float = 1.0):
    """(grad_x, grad_weight, grad_residual), as kernels.torch.quant_norm.norm_bwd."""
    _, out_scale = eager._check_norm_bwd_args(grad_out, grad_norm_input, x, weight, residual, rstd, norm_input, eps,
                                             out_scale)
    _checked_on_cuda(x)
    tokens, hidden = x.shape
    grad_x = torch.empty((tokens, hidden), dtype=x.dtype, device=x.device)
    grad_weight = None if weight is None else torch.zeros_like(weight, memory_format=torch.contiguous_format)
    if tokens:
        g, s = _dense("grad_out", grad_out), _dense("norm_input", norm_input)
        n = g if grad_norm_input is None else _dense("grad_norm_input", grad_norm_input)
        r = rstd.contiguous()
        ws = eager._scaled_weight(weight, hidden, out_scale, x.device)
        config = _row_config(x, grad_norm_input is not None, (g, n, s, ws, grad_x))
        _launch(NORM_BWD, config, x.device, tokens, g, n, s, ws, r, grad_x, float(hidden))
        if weight is not None:
            splits = -(-tokens // ROWS_PER_SPLIT)
            partial = torch.empty((splits, hidden), dtype=torch.float32, device=x.device)
            column = ColumnConfig(config.dtype, config.vectorized and partial.data_ptr() % 16 == 0)
            col_blocks = -(-(hidden // _vec(column)) // THREADS)
            _launch(NORM_WGRAD, column, x.device, splits * col_blocks, g, s, r, partial)
            grad_weight = (partial.sum(0) * out_scale).to(weight.dtype)
    return grad_x, grad_weight, (grad_x if residual is not None else None)


def norm_forward_and_per_token_cast(x: torch.Tensor, weight: torch.Tensor | None = None,
                                    residual: torch.Tensor | None = None, eps: float = 1e-6, out_scale: float = 1.0,
                                    fmt: str = "e4m3", num_per_channels: int = 128, *, round_sf: bool = False,
                                    use_ue8m0: bool = False, use_packed_ue8m0: bool = False,
                                    use_tma_aligned_col_major_sf: bool = False, clamp_min: float | None = None):
    """(data, sf, rstd, norm_input), as kernels.torch.quant_norm.norm_forward_and_per_token_cast: the
    norm_fwd kernel, then the token_cast kernel (kernels.quant.per_token_cast) on its out."""
    from .token_cast import per_token_cast

    eager._check_norm_args(x, weight, residual, eps, out_scale)
    eager._check_per_token(x, fmt, num_per_channels, round_sf, use_ue8m0, use_packed_ue8m0,
                           use_tma_aligned_col_major_sf, clamp_min)
    out, rstd, s = norm(x, weight, residual, eps, out_scale)
    data, sf = per_token_cast(out, fmt, num_per_channels, round_sf=round_sf, use_ue8m0=use_ue8m0,
                              use_packed_ue8m0=use_packed_ue8m0,
                              use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf, clamp_min=clamp_min)
    return data, sf, rstd, s
