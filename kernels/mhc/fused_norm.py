"""mHC's fused pre-block pieces in TileLang: the RMSNorm weight folded into the mix projection
(kernels mhc.norm_fn and mhc.norm_fn_bwd) and the split-K partials reduced with the RMSNorm applied
(mhc.reduce_partials_and_rmsnorm and mhc.reduce_partials_and_rmsnorm_bwd), with their wrappers.

Contract: ``docs/contract/mhc_fused.md``; signatures and argument checks: ``kernels/torch/mhc_fused.py``
(fp32 only here).  Every product and sum is an IEEE fp32 operation (``T.ieee_mul`` / ``T.ieee_add``, no
contraction into an fma, no flush of subnormals); r = rsqrtf(sqrsum / size + eps) (rsqrt.approx,
within 2^-20).

* norm_fn: one thread per 16-byte vector (4 fp32) of fn's rows, out = fn * normw; the scalar
  configuration (K % 4 != 0 or a misaligned tensor) runs the same arithmetic one element at a time.
* norm_fn_bwd: one thread per vector of columns walks the M rows: grad_fn = grad * normw, and
  grad_normw accumulates grad * fn from +0 in row order.
* reduce_partials_and_rmsnorm: one thread per (token, j): for each group it sums the S partials of
  out_mul (and of sqrsum) in split order, writes them (sqrsum by the thread of j = 0), and adds
  out_mul_g * r_g to out in group order.
* reduce_partials_and_rmsnorm_bwd: one thread per (token, group): grad_out_mul = grad_out * r, and
  grad_sqrsum = (sum_j grad_out_j out_mul_j, from +0 in j order) * (r r r coef), coef = fp32(-0.5 / size).
  The gradients of the splits are the sums' (S, ...) repeated: expanded views, never copies.

Launches are cut into pieces so that grid sizes stay in range; every global access is guarded by hand.
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.

from typing import NamedTuple

import torch

from .. import _tilelang
from .._tilelang import KernelDef
from ..torch import mhc_fused as eager
from .shared import PASS_CONFIGS

THREADS = 128
VECTOR = 4  # fp32 per 16 bytes


class MergeConfig(NamedTuple):
    vectorized: bool  # 16-byte accesses: K % 4 == 0 and every tensor 16-byte aligned


MERGE_CONFIGS = (MergeConfig(True), MergeConfig(False))


class ReduceConfig(NamedTuple):
    pass


REDUCE_CONFIGS = (ReduceConfig(),)


def build_fn_normw_merge(config: MergeConfig):
    """prim_func(fn (M, K), normw (K,), out_fn (M, K), num_blocks, block_offset), fp32."""
    T = _tilelang.T()
    vec = VECTOR if config.vectorized else 1
    rows, num_vecs = T.dynamic("rows, num_vecs")

    @T.prim_func
    def fn_normw_merge(
        fn: T.Tensor((rows, num_vecs * vec), "float32"),
        normw: T.Tensor((num_vecs * vec,), "float32"),
        out_fn: T.Tensor((rows, num_vecs * vec), "float32"),
        num_blocks: T.int32,
        block_offset: T.int64,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(num_blocks, threads=THREADS) as block:
            tx = T.get_thread_binding()
            flat = T.alloc_var("int64", init=(block_offset + block) * THREADS + tx)
            row = T.alloc_var("int64", init=T.truncdiv(flat, num_vecs))
            v = T.alloc_var("int32", init=T.Cast("int32", T.truncmod(flat, num_vecs)))
            a = T.alloc_local((vec,), "float32")
            w = T.alloc_local((vec,), "float32")
            if row < rows:
                for k in T.vectorized(vec):
                    a[k] = fn[row, v * vec + k]
                for k in T.vectorized(vec):
                    w[k] = normw[v * vec + k]
                for k in T.unroll(vec):
                    a[k] = T.ieee_mul(a[k], w[k])
                for k in T.vectorized(vec):
                    out_fn[row, v * vec + k] = a[k]

    return fn_normw_merge


def build_fn_normw_merge_bwd(config: MergeConfig):
    """prim_func(grad (M, K), fn (M, K), normw (K,), grad_fn (M, K), grad_normw (K,), num_blocks, block_offset)."""
    T = _tilelang.T()
    vec = VECTOR if config.vectorized else 1
    rows, num_vecs = T.dynamic("rows, num_vecs")

    @T.prim_func
    def fn_normw_merge_bwd(
        grad: T.Tensor((rows, num_vecs * vec), "float32"),
        fn: T.Tensor((rows, num_vecs * vec), "float32"),
        normw: T.Tensor((num_vecs * vec,), "float32"),
        grad_fn: T.Tensor((rows, num_vecs * vec), "float32"),
        grad_normw: T.Tensor((num_vecs * vec,), "float32"),
        num_blocks: T.int32,
        block_offset: T.int64,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(num_blocks, threads=THREADS) as block:
            tx = T.get_thread_binding()
            v = T.alloc_var("int64", init=(block_offset + block) * THREADS + tx)
            w = T.alloc_local((vec,), "float32")
            g = T.alloc_local((vec,), "float32")
            f = T.alloc_local((vec,), "float32")
            acc = T.alloc_local((vec,), "float32")
            if v < num_vecs:
                for k in T.vectorized(vec):
                    w[k] = normw[v * vec + k]
                for k in T.unroll(vec):
                    acc[k] = T.float32(0)
                for j in T.serial(rows):
                    for k in T.vectorized(vec):
                        g[k] = grad[j, v * vec + k]
                    for k in T.vectorized(vec):
                        f[k] = fn[j, v * vec + k]
                    for k in T.unroll(vec):
                        acc[k] = T.ieee_add(acc[k], T.ieee_mul(g[k], f[k]))
                        g[k] = T.ieee_mul(g[k], w[k])
                    for k in T.vectorized(vec):
                        grad_fn[j, v * vec + k] = g[k]
                for k in T.vectorized(vec):
                    grad_normw[v * vec + k] = acc[k]

    return fn_normw_merge_bwd


def build_reduce(config: ReduceConfig):
    """prim_func(partials (S, N, G, M), squares (S, N, G), out_mul (N, G, M), sqrsum (N, G), out (N, M),
    size, eps, num_blocks, block_offset): size is rms_group_size as an fp32 scalar (divided by, in fp32)."""
    T = _tilelang.T()
    splits, tokens, groups, width = T.dynamic("splits, tokens, groups, width")

    @T.prim_func
    def reduce_partials_and_rmsnorm(
        partials: T.Tensor((splits, tokens, groups, width), "float32"),
        squares: T.Tensor((splits, tokens, groups), "float32"),
        out_mul: T.Tensor((tokens, groups, width), "float32"),
        sqrsum: T.Tensor((tokens, groups), "float32"),
        out: T.Tensor((tokens, width), "float32"),
        size: T.float32,
        eps: T.float32,
        num_blocks: T.int32,
        block_offset: T.int64,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(num_blocks, threads=THREADS) as block:
            tx = T.get_thread_binding()
            flat = T.alloc_var("int64", init=(block_offset + block) * THREADS + tx)
            token = T.alloc_var("int64", init=T.truncdiv(flat, width))
            j = T.alloc_var("int32", init=T.Cast("int32", T.truncmod(flat, width)))
            p = T.alloc_var("float32", init=T.float32(0))
            q = T.alloc_var("float32", init=T.float32(0))
            acc = T.alloc_var("float32", init=T.float32(0))
            if token < tokens:
                for g in T.serial(groups):
                    p = T.float32(0)
                    q = T.float32(0)
                    for s in T.serial(splits):
                        p = T.ieee_add(p, partials[s, token, g, j])
                        q = T.ieee_add(q, squares[s, token, g])
                    out_mul[token, g, j] = p
                    if j == 0:
                        sqrsum[token, g] = q
                    acc = T.ieee_add(acc, T.ieee_mul(p, T.rsqrt(T.ieee_add(T.ieee_fdiv(q, size), eps))))
                out[token, j] = acc

    return reduce_partials_and_rmsnorm


def build_reduce_bwd(config: ReduceConfig):
    """prim_func(grad_out (N, M), out_mul (N, G, M), sqrsum (N, G), grad_out_mul (N, G, M), grad_sqrsum (N, G),
    size, eps, coef, num_blocks, block_offset): coef = fp32(-0.5 / size)."""
    T = _tilelang.T()
    tokens, groups, width = T.dynamic("tokens, groups, width")

    @T.prim_func
    def reduce_partials_and_rmsnorm_bwd(
        grad_out: T.Tensor((tokens, width), "float32"),
        out_mul: T.Tensor((tokens, groups, width), "float32"),
        sqrsum: T.Tensor((tokens, groups), "float32"),
        grad_out_mul: T.Tensor((tokens, groups, width), "float32"),
        grad_sqrsum: T.Tensor((tokens, groups), "float32"),
        size: T.float32,
        eps: T.float32,
        coef: T.float32,
        num_blocks: T.int32,
        block_offset: T.int64,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(num_blocks, threads=THREADS) as block:
            tx = T.get_thread_binding()
            flat = T.alloc_var("int64", init=(block_offset + block) * THREADS + tx)
            token = T.alloc_var("int64", init=T.truncdiv(flat, groups))
            g = T.alloc_var("int32", init=T.Cast("int32", T.truncmod(flat, groups)))
            r = T.alloc_var("float32", init=T.float32(0))
            acc = T.alloc_var("float32", init=T.float32(0))
            if token < tokens:
                r = T.rsqrt(T.ieee_add(T.ieee_fdiv(sqrsum[token, g], size), eps))
                for j in T.serial(width):
                    acc = T.ieee_add(acc, T.ieee_mul(grad_out[token, j], out_mul[token, g, j]))
                    grad_out_mul[token, g, j] = T.ieee_mul(grad_out[token, j], r)
                grad_sqrsum[token, g] = T.ieee_mul(acc, T.ieee_mul(T.ieee_mul(T.ieee_mul(r, r), r), coef))

    return reduce_partials_and_rmsnorm_bwd


NORM_FN = KernelDef("mhc.norm_fn", build_fn_normw_merge, MERGE_CONFIGS)
NORM_FN_BWD = KernelDef("mhc.norm_fn_bwd", build_fn_normw_merge_bwd, MERGE_CONFIGS)
REDUCE_RMSNORM = KernelDef("mhc.reduce_partials_and_rmsnorm", build_reduce, REDUCE_CONFIGS)
REDUCE_RMSNORM_BWD = KernelDef("mhc.reduce_partials_and_rmsnorm_bwd", build_reduce_bwd, REDUCE_CONFIGS)


def _require_fp32(name: str, t: torch.Tensor) -> None:
    if t.dtype != torch.float32:
        raise TypeError(f"{name} must have dtype torch.float32 (the TileLang kernels are fp32 only), got {t.dtype}")


def _merge_config(k: int, tensors: tuple[torch.Tensor, ...]) -> MergeConfig:
    return MergeConfig(k % VECTOR == 0 and all(t.data_ptr() % 16 == 0 for t in tensors))


def _launch(kernel_def: KernelDef, config, device: torch.device, total_threads: int, *args) -> None:
    kernel = _tilelang.kernel_for(kernel_def, config, device)
    with _tilelang.device_guard(device):
        _tilelang.launch_in_pieces(kernel, -(-total_threads // THREADS), *args)


def _check_fits(name: str, t: torch.Tensor) -> None:
    if t.numel() > _tilelang.MAX_DIM or any(d > _tilelang.MAX_DIM for d in t.shape):
        raise ValueError(f"{name}: at most {_tilelang.MAX_DIM} elements, got shape {tuple(t.shape)}")


def fn_normw_merge(fn: torch.Tensor, normw: torch.Tensor) -> torch.Tensor:
    """out_fn (M, K) = fn * normw per column, fp32 (one IEEE product per element)."""
    eager._check_fn_normw_merge_args(fn, normw)
    _require_fp32("fn", fn)
    _tilelang.require_cuda("fn", fn)
    _check_fits("fn", fn)
    out = torch.empty_like(fn)
    rows, k = fn.shape
    if out.numel() == 0:
        return out
    config = _merge_config(k, (fn, normw, out))
    vec = VECTOR if config.vectorized else 1
    _launch(NORM_FN, config, fn.device, rows * (k // vec), fn, normw, out)
    return out


def fn_normw_merge_bwd(grad_out_fn: torch.Tensor, fn: torch.Tensor,
                       normw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_fn = grad * normw, grad_normw = sum over rows of grad * fn from +0 in row order), fp32."""
    eager._check_fn_normw_merge_bwd_args(grad_out_fn, fn, normw)
    _require_fp32("fn", fn)
    _tilelang.require_cuda("fn", fn)
    _check_fits("fn", fn)
    rows, k = fn.shape
    grad_fn = torch.empty_like(fn)
    grad_normw = torch.empty_like(normw)
    if k == 0:
        return grad_fn, grad_normw
    if rows == 0:
        return grad_fn, grad_normw.zero_()
    config = _merge_config(k, (grad_out_fn, fn, normw, grad_fn, grad_normw))
    vec = VECTOR if config.vectorized else 1
    _launch(NORM_FN_BWD, config, fn.device, k // vec, grad_out_fn, fn, normw, grad_fn, grad_normw)
    return grad_fn, grad_normw


def reduce_partials_and_rmsnorm(out_mul_splitted: torch.Tensor, sqrsum_splitted: torch.Tensor, rms_group_size: int,
                                rms_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out_mul (N, G, M), sqrsum (N, G), out (N, M)), fp32; sums in split order, out in group order."""
    size, eps = eager._check_reduce_args(out_mul_splitted, sqrsum_splitted, rms_group_size, rms_eps)
    _require_fp32("out_mul_splitted", out_mul_splitted)
    _tilelang.require_cuda("out_mul_splitted", out_mul_splitted)
    _check_fits("out_mul_splitted", out_mul_splitted)
    _, tokens, groups, width = out_mul_splitted.shape
    device = out_mul_splitted.device
    out_mul = torch.empty((tokens, groups, width), dtype=torch.float32, device=device)
    sqrsum = torch.empty((tokens, groups), dtype=torch.float32, device=device)
    out = torch.empty((tokens, width), dtype=torch.float32, device=device)
    if tokens == 0:
        return out_mul, sqrsum, out
    _launch(REDUCE_RMSNORM, REDUCE_CONFIGS[0], device, tokens * width, out_mul_splitted, sqrsum_splitted,
            out_mul, sqrsum, out, float(size), eps)
    return out_mul, sqrsum, out


def reduce_partials_and_rmsnorm_bwd(grad_out: torch.Tensor, out_mul_splitted: torch.Tensor,
                                    sqrsum_splitted: torch.Tensor, out_mul: torch.Tensor, sqrsum: torch.Tensor,
                                    rms_group_size: int, rms_eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_out_mul_splitted (S, N, G, M), grad_sqrsum_splitted (S, N, G)) as expanded views of the sums'
    gradients; the partials' shapes only are read."""
    size, eps = eager._check_reduce_bwd_args(grad_out, out_mul_splitted, sqrsum_splitted, out_mul, sqrsum,
                                            rms_group_size, rms_eps)
    _require_fp32("out_mul_splitted", out_mul_splitted)
    _tilelang.require_cuda("out_mul_splitted", out_mul_splitted)
    _check_fits("out_mul_splitted", out_mul_splitted)
    splits, tokens, groups, width = out_mul_splitted.shape
    grad_out_mul = torch.empty_like(out_mul)
    grad_sqrsum = torch.empty_like(sqrsum)
    if tokens:
        _launch(REDUCE_RMSNORM_BWD, REDUCE_CONFIGS[0], out_mul.device, tokens * groups, grad_out, out_mul, sqrsum,
                grad_out_mul, grad_sqrsum, float(size), eps, -0.5 / size)
    return grad_out_mul.expand(splits, *grad_out_mul.shape), grad_sqrsum.expand(splits, *grad_sqrsum.shape)
