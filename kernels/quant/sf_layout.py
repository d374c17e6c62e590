"""quant.batched_transpose_weight_sf on the GPU (docs/contract/quant_layout.md): kernel quant.weight_sf_layout
and its wrapper.

The wrapper checks the arguments (`kernels.torch.quant_layout._check_weight_sf_args`) and allocates the two
outputs as word-major storages, (G, words0, n) and (G, words1, k) contiguous, which are exactly the memory of
deep_gemm's MN-major layouts: sf0[g, r, w] and sf1[g, c, w] (or, with transpose_sf1, sf1[g, w, c]) lie at
word w's row of its storage.  transpose_sf1 therefore changes only the view returned, not the kernel.

The kernel writes both storages in one launch.  A thread takes a *chunk*: one word w of four consecutive
rows r..r+3 (n and k are multiples of 128, so a chunk never crosses a row of the other output, and the four
rows share one block row r // bs since bs >= 32): it packs the ue8m0 bytes of up to four sf values (the fp32
exponent field of each, which is e + 127 for 2^e, 2^-127 the subnormal with field 0), the j-th in byte j,
the bytes past the last sf zero, and writes the word to the four rows with one 16-byte store.  The sf
tensor is small (1 / bs^2 of the weight) and read through the cache.  The chunks of sf0 come first, then
those of sf1; 256 threads a CTA.  Static configurations: block_size, 2; G, n and k are runtime sizes.
"""

# No `from __future__ import annotations` here: tilelang evaluates the prim_func parameter annotations.
from typing import NamedTuple

import torch

from .. import _tilelang
from .._tilelang import KernelDef
from ..torch import quant_layout as eager
from .common import PASS_CONFIGS, _bits, _u

WEIGHT_SF_THREADS = 256
ROWS_PER_CHUNK = 4  # one 16-byte store of int32 words
MAX_CHUNKS = 2**31 - 1 - WEIGHT_SF_THREADS  # chunk indices stay int32


class WeightSfConfig(NamedTuple):
    block_size: int  # the weight's scaling block (32 or 128)


WEIGHT_SF_CONFIGS = tuple(WeightSfConfig(bs) for bs in eager.WEIGHT_SF_BLOCKS)


def build_weight_sf_layout(config: WeightSfConfig):
    """prim_func(sf fp32 (G, num_sf_n, num_sf_k), out0 int32 (G, words0, n), out1 int32 (G, words1, k)), with
    n = num_sf_n * bs, k = num_sf_k * bs, words0 = ceil(num_sf_k / 4), words1 = ceil(num_sf_n / 4)."""
    T = _tilelang.T()
    bs = config.block_size
    chunks_per_block = bs // ROWS_PER_CHUNK  # chunks of rows in one block row of sf
    groups = T.dynamic("groups")
    sf_n = T.dynamic("sf_n")
    sf_k = T.dynamic("sf_k")
    words0 = T.dynamic("words0")
    words1 = T.dynamic("words1")
    row_chunks0 = sf_n * chunks_per_block  # n / 4
    row_chunks1 = sf_k * chunks_per_block  # k / 4
    chunks0 = groups * words0 * row_chunks0
    chunks1 = groups * words1 * row_chunks1

    def ue8m0_byte(value):
        return (_bits(T, value) >> _u(T, 23)) & _u(T, 0xFF)

    @T.prim_func
    def weight_sf_layout(
        sf: T.Tensor((groups, sf_n, sf_k), "float32"),
        out0: T.Tensor((groups, words0, sf_n * bs), "int32"),
        out1: T.Tensor((groups, words1, sf_k * bs), "int32"),
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(T.ceildiv(chunks0 + chunks1, WEIGHT_SF_THREADS), threads=WEIGHT_SF_THREADS) as bx:
            tx = T.get_thread_binding()
            res = T.alloc_local((ROWS_PER_CHUNK,), "int32")
            chunk = T.alloc_var("int32", init=bx * WEIGHT_SF_THREADS + tx)
            word = T.alloc_var("uint32", init=0)
            # the chunk's group, word and row chunk, held in registers (not re-derived per use)
            g = T.alloc_var("int32", init=0)
            w = T.alloc_var("int32", init=0)
            pos = T.alloc_var("int32", init=0)
            if chunk < chunks0:
                g = chunk // (words0 * row_chunks0)
                w = (chunk // row_chunks0) % words0
                pos = chunk % row_chunks0
                for j in T.unroll(4):  # sf[g, r // bs, 4w + j]
                    if w * 4 + j < sf_k:
                        word = word | (ue8m0_byte(sf[g, pos // chunks_per_block, w * 4 + j]) << _u(T, 8 * j))
                for e in T.unroll(ROWS_PER_CHUNK):
                    res[e] = T.reinterpret(word, "int32")
                for e in T.vectorized(ROWS_PER_CHUNK):
                    out0[g, w, pos * ROWS_PER_CHUNK + e] = res[e]
            elif chunk < chunks0 + chunks1:
                chunk = chunk - chunks0
                g = chunk // (words1 * row_chunks1)
                w = (chunk // row_chunks1) % words1
                pos = chunk % row_chunks1
                for j in T.unroll(4):  # sf[g, 4w + j, c // bs]
                    if w * 4 + j < sf_n:
                        word = word | (ue8m0_byte(sf[g, w * 4 + j, pos // chunks_per_block]) << _u(T, 8 * j))
                for e in T.unroll(ROWS_PER_CHUNK):
                    res[e] = T.reinterpret(word, "int32")
                for e in T.vectorized(ROWS_PER_CHUNK):
                    out1[g, w, pos * ROWS_PER_CHUNK + e] = res[e]

    return weight_sf_layout


WEIGHT_SF_LAYOUT = KernelDef("quant.weight_sf_layout", build_weight_sf_layout, WEIGHT_SF_CONFIGS)


def batched_transpose_weight_sf(sf: torch.Tensor, block_size: int = 128,
                                transpose_sf1: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(sf0, sf1) int32 packed ue8m0 in deep_gemm's MN-major layouts; see kernels/torch/quant_layout.py."""
    groups, num_sf_n, num_sf_k, bs = eager._check_weight_sf_args(sf, block_size, transpose_sf1)
    _tilelang.require_cuda("sf", sf)
    _tilelang.check_dims_fit_int32("sf", sf)
    n, k = num_sf_n * bs, num_sf_k * bs
    words0, words1 = -(-num_sf_k // 4), -(-num_sf_n // 4)
    chunks = groups * (words0 * n + words1 * k) // ROWS_PER_CHUNK
    if chunks > MAX_CHUNKS:
        raise ValueError(f"sf: at most {MAX_CHUNKS} chunks of {ROWS_PER_CHUNK} output words, got {chunks}")
    storage0 = torch.empty((groups, words0, n), dtype=torch.int32, device=sf.device)
    storage1 = torch.empty((groups, words1, k), dtype=torch.int32, device=sf.device)
    kernel = _tilelang.kernel_for(WEIGHT_SF_LAYOUT, WeightSfConfig(bs), sf.device)
    with _tilelang.device_guard(sf.device):
        kernel(sf.reshape(groups, num_sf_n, num_sf_k), storage0, storage1)
    return eager._weight_sf_views(storage0, storage1, bs, transpose_sf1, sf.dim() == 3)
