"""quant.per_block_cast_lossless on the GPU (docs/contract/quant_layout.md): kernel quant.lossless and its
wrapper.

The wrapper checks the arguments' metadata (`kernels.torch.quant_layout._check_lossless_args`) and computes
the out sf with torch on the device (`kernels.torch.quant_layout._lossless_out_sf`: small tensors, 1/16 or
1/32 of the elements); it reads no tensor value back to the host, so an input sf the contract refuses is
not refused here: its out block comes out NaN, sf and every code (below).  The kernel re-codes the data.
A thread takes a chunk of 16 elements: one 8-byte load of e2m1 codes, one 16-byte store of e4m3 codes;
the chunk lies in one input block (16 or 32 columns) and one out block (32 or 128 columns), so it reads
one input sf and one out sf (fp32).  Per element, exactly:

    c     = the e2m1 value, built from the code's bits (s.e1e0.m -> fp32 sign, exponent, mantissa)
    ratio = in sf / out sf       (two powers of two: an exact quotient in [2^-14, 2^6], or NaN)
    code  = e4m3(c * ratio)      (the product is an e4m3 value, so the conversion does not round)

A NaN out sf (a NaN input sf in the block, or a block the contract refuses) makes every code of the block
NaN, whatever the input sf: in sf / NaN is NaN for every fp32 in sf.  The flat T * H / 16 chunks
go one per thread, 256 threads a CTA.  Static configurations: (input block columns, out block rows, out
block columns), 6; T and H are runtime sizes.
"""

# No `from __future__ import annotations` here: tilelang evaluates the prim_func parameter annotations.
from typing import NamedTuple

import torch

from .. import _tilelang
from .._tilelang import KernelDef
from ..torch import quant_layout as eager
from .common import PASS_CONFIGS, _f32, _u

LOSSLESS_THREADS = 256
CHUNK_BYTES = 8  # e2m1 bytes per chunk: 16 elements, one 16-byte store of e4m3 codes
MAX_CHUNKS = 2**31 - 1 - LOSSLESS_THREADS  # chunk indices stay int32


class LosslessConfig(NamedTuple):
    in_cols: int  # input block columns (16 or 32; one row)
    out_rows: int  # out block rows
    out_cols: int  # out block columns


LOSSLESS_CONFIGS = tuple(LosslessConfig(i[1], o[0], o[1]) for i in eager.LOSSLESS_IN_BLOCKS
                         for o in eager.LOSSLESS_OUT_BLOCKS)


def build_lossless(config: LosslessConfig):
    """prim_func(x int8 (T, H / 2), in_sf fp32 (T, H / in_cols), out_sf fp32 (ceil(T / out_rows), H / out_cols),
    out e4m3 (T, H))."""
    T = _tilelang.T()
    num_rows = T.dynamic("num_rows")
    row_chunks = T.dynamic("row_chunks")  # H / 16
    out_sf_rows = T.dynamic("out_sf_rows")
    width = row_chunks * CHUNK_BYTES
    hidden = width * 2

    @T.prim_func
    def lossless(
        x: T.Tensor((num_rows, width), "int8"),
        in_sf: T.Tensor((num_rows, hidden // config.in_cols), "float32"),
        out_sf: T.Tensor((out_sf_rows, hidden // config.out_cols), "float32"),
        out: T.Tensor((num_rows, hidden), "float8_e4m3"),
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(T.ceildiv(num_rows * row_chunks, LOSSLESS_THREADS), threads=LOSSLESS_THREADS) as bx:
            tx = T.get_thread_binding()
            codes = T.alloc_local((CHUNK_BYTES,), "int8")
            res = T.alloc_local((2 * CHUNK_BYTES,), "float8_e4m3")
            chunk = T.alloc_var("int32", init=bx * LOSSLESS_THREADS + tx)
            ratio = T.alloc_var("float32", init=0.0)
            if chunk < num_rows * row_chunks:
                row = chunk // row_chunks
                col = (chunk % row_chunks) * (2 * CHUNK_BYTES)
                for e in T.vectorized(CHUNK_BYTES):
                    codes[e] = x[row, col // 2 + e]
                ratio = T.ieee_fdiv(in_sf[row, col // config.in_cols],
                                    out_sf[row // config.out_rows, col // config.out_cols])
                for e in T.unroll(2 * CHUNK_BYTES):
                    n = (T.Cast("uint32", T.Cast("int32", codes[e // 2])) >> _u(T, 4 * (e % 2))) & _u(T, 15)
                    exponent = (n >> _u(T, 1)) & _u(T, 3)
                    mantissa = n & _u(T, 1)
                    magnitude = T.if_then_else(exponent == _u(T, 0), mantissa * _u(T, 0x3F000000),
                                               ((exponent + _u(T, 126)) << _u(T, 23)) | (mantissa << _u(T, 22)))
                    value = _f32(T, magnitude | ((n & _u(T, 8)) << _u(T, 28)))
                    res[e] = T.Cast("float8_e4m3", T.ieee_mul(value, ratio))
                for e in T.vectorized(2 * CHUNK_BYTES):
                    out[row, col + e] = res[e]

    return lossless


LOSSLESS = KernelDef("quant.lossless", build_lossless, LOSSLESS_CONFIGS)


def per_block_cast_lossless(x: torch.Tensor, x_sf: torch.Tensor, fmt: str = "e4m3",
                            x_block_size: tuple[int, int] | list[int] = (1, 32),
                            out_block_size: tuple[int, int] | list[int] = (128, 128), *, use_ue8m0: bool = False,
                            use_packed_ue8m0: bool = False,
                            use_tma_aligned_col_major_sf: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(data e4m3 (T, H), sf); see kernels/torch/quant_layout.py.

    x_sf's values are not checked (that would read them back to the host): an out block that the contract
    refuses (an input sf that is not 2^k, -127 <= k <= 127, or NaN; a spread past 2^14; a ue8m0 out sf below
    2^-127) comes out as a NaN block, its sf NaN (ue8m0 0xFF) and every code NaN, deterministic and in
    bounds; docs/contract/quant_layout.md."""
    hidden, in_block, out_block = eager._check_lossless_args(x, x_sf, fmt, x_block_size, out_block_size, use_ue8m0,
                                                            use_packed_ue8m0, use_tma_aligned_col_major_sf)
    for name, t in (("x", x), ("x_sf", x_sf)):
        _tilelang.require_cuda(name, t)
        _tilelang.check_dims_fit_int32(name, t)
    in_sf = eager._input_scales(x_sf, hidden // in_block[1])
    out_sf, _ = eager._lossless_out_sf(in_sf, in_block, out_block, use_ue8m0)  # the refusals: read by eager only
    num_rows = x.shape[0]
    data = torch.empty((num_rows, hidden), dtype=torch.float8_e4m3fn, device=x.device)
    chunks = num_rows * hidden // (2 * CHUNK_BYTES)
    if chunks > MAX_CHUNKS:
        raise ValueError(f"x: at most {MAX_CHUNKS} chunks of 16 elements, got {chunks}")
    if chunks:
        kernel = _tilelang.kernel_for(LOSSLESS, LosslessConfig(in_block[1], *out_block), x.device)
        with _tilelang.device_guard(x.device):
            kernel(_tilelang.aligned(x.contiguous()), in_sf, out_sf, data)
    return data, eager._store_out_sf(out_sf, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf)
