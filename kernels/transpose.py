"""Bitwise (batched) transpose in TileLang.

``batched_transpose(x (B, M, N)) -> (B, N, M)`` with ``out[b, j, i] = x[b, i, j]``
and ``transpose(x (M, N)) -> (N, M)``.  Elements are moved as raw integer bits
(uint8 / int16 / int32 views of 1-, 2- and 4-byte dtypes), so NaN payloads,
-0.0 and fp8 codes survive unchanged.  B, M and N are symbolic sizes; the
static configuration is the element width plus the choice of variant:

* vectorized (M and N multiples of V = 16 / width, 16-byte aligned data):
  each block stages a square tile (128 x 128 bytes for 1-byte elements, 64 x 64
  elements otherwise) in shared memory.  Global loads and stores are 16-byte
  vectors of V elements along the contiguous axis.  The shared tile is
  swizzled: chunk c (V elements) of tile row r is stored at chunk
  c ^ (r // V) of that row, which keeps both the row-wise vector stores and
  the column-wise element reads free of bank conflicts (a warp reads 8
  different chunk slots x 4 adjacent columns).  Because M and N are multiples
  of V, a vector is either wholly inside the matrix or wholly outside it, so
  the tail guards test the vector's first element.
* scalar (any M and N): a 64 x 64 tile, one element per access, the shared
  rows padded to an odd number of 32-bit words so that column reads are free
  of bank conflicts.  Every element access is guarded.

Both variants guard every global access explicitly (tail tiles are not
legalised by the compiler: its safe-memory pass is disabled because it would
only add redundant per-element checks that block vectorization).
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.
from typing import NamedTuple

import torch

from . import _tilelang
from .torch import transpose as eager
from ._tilelang import KernelDef

THREADS = 256
WARP = 32
VECTOR_BYTES = 16
SCALAR_TILE = 64

# Raw-bits type moved for each element width (bytes).
RAW_DTYPES = {1: "uint8", 2: "int16", 4: "int32"}
RAW_TORCH_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32}
WIDTH_OF = {name: width for width, name in RAW_DTYPES.items()}

# Every access is guarded by hand; the compiler's own bounds legalisation would
# duplicate those guards per vector lane and defeat vectorization.
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}

# Launches are split along B so that each grid stays below 2**31 blocks.


class TransposeConfig(NamedTuple):
    dtype: str  # raw-bits type: "uint8", "int16" or "int32"
    vectorized: bool  # 16-byte accesses; needs M, N multiples of 16 // width


STATIC_CONFIGS = tuple(TransposeConfig(dtype, vectorized) for dtype in RAW_DTYPES.values() for vectorized in (True, False))


def vector_tile(width: int) -> int:
    """Side of the square tile of the vectorized variant, in elements.

    Its rows must hold at least 8 chunks of 16 bytes so that the swizzle
    spreads a warp's column reads over all 32 banks.
    """
    return 128 if width == 1 else 64


def tile_side(config: TransposeConfig) -> int:
    return vector_tile(WIDTH_OF[config.dtype]) if config.vectorized else SCALAR_TILE


def _build_vectorized(dtype: str):
    T = _tilelang.T()
    width = WIDTH_OF[dtype]
    vec = VECTOR_BYTES // width  # elements per 16-byte chunk
    tile = vector_tile(width)
    chunks_per_row = tile // vec  # 8 or 16; also tile // vec rows of chunks
    passes = tile * chunks_per_row // THREADS
    # Phase 2 gives each warp 4 output rows x 8 consecutive chunks.
    chunk_groups_per_row = chunks_per_row // 8
    # M and N are declared as multiples of `vec`, which lets the compiler
    # prove that every vector access is aligned.
    batch, m_chunks, n_chunks = T.dynamic("batch, m_chunks, n_chunks")
    rows = m_chunks * vec
    cols = n_chunks * vec

    @T.prim_func
    def batched_transpose_vectorized(
        x: T.Tensor((batch, m_chunks * vec, n_chunks * vec), dtype),
        y: T.Tensor((batch, n_chunks * vec, m_chunks * vec), dtype),
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        tiles_m = T.ceildiv(rows, tile)
        tiles_n = T.ceildiv(cols, tile)
        with T.Kernel(batch * tiles_m * tiles_n, threads=THREADS) as block:
            tx = T.get_thread_binding()
            # Tile coordinates, computed once in 32-bit registers.
            b = T.alloc_var("int32", init=T.truncdiv(block, tiles_m * tiles_n))
            tm = T.alloc_var("int32", init=T.truncmod(T.truncdiv(block, tiles_n), tiles_m))
            tn = T.alloc_var("int32", init=T.truncmod(block, tiles_n))
            staged = T.alloc_shared((tile * tile,), dtype)
            column = T.alloc_local((vec,), dtype)

            # Phase 1: rows of x -> tile (consecutive threads: consecutive chunks of a row).
            for p in T.unroll(passes):
                r = (p * THREADS + tx) // chunks_per_row
                c = (p * THREADS + tx) % chunks_per_row
                if tm * tile + r < rows and tn * tile + c * vec < cols:
                    for v in T.vectorized(vec):
                        staged[r * tile + (c ^ (r // vec)) * vec + v] = x[b, tm * tile + r, tn * tile + c * vec + v]
            T.sync_threads()

            # Phase 2: tile columns -> rows of y.  Output chunk (j, i_chunk)
            # gathers x rows i_chunk * vec + v at column j.
            for p in T.unroll(passes):
                lane = tx % WARP
                group = (p * THREADS + tx) // WARP
                j = (group // chunk_groups_per_row) * 4 + lane // 8
                i_chunk = (group % chunk_groups_per_row) * 8 + lane % 8
                if tn * tile + j < cols and tm * tile + i_chunk * vec < rows:
                    for v in T.unroll(vec):
                        column[v] = staged[(i_chunk * vec + v) * tile + ((j // vec) ^ i_chunk) * vec + j % vec]
                    for v in T.vectorized(vec):
                        y[b, tn * tile + j, tm * tile + i_chunk * vec + v] = column[v]

    return batched_transpose_vectorized


def _build_scalar(dtype: str):
    T = _tilelang.T()
    width = WIDTH_OF[dtype]
    tile = SCALAR_TILE
    # Row pitch of 16 * width + 1 words (odd): the 32 lanes reading one tile
    # column hit 32 different banks.
    pitch = tile + 4 // width
    rows_per_pass = THREADS // tile
    passes = tile // rows_per_pass
    batch, rows, cols = T.dynamic("batch, rows, cols")

    @T.prim_func
    def batched_transpose_scalar(
        x: T.Tensor((batch, rows, cols), dtype),
        y: T.Tensor((batch, cols, rows), dtype),
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        tiles_m = T.ceildiv(rows, tile)
        tiles_n = T.ceildiv(cols, tile)
        with T.Kernel(batch * tiles_m * tiles_n, threads=THREADS) as block:
            tx = T.get_thread_binding()
            b = T.alloc_var("int32", init=T.truncdiv(block, tiles_m * tiles_n))
            tm = T.alloc_var("int32", init=T.truncmod(T.truncdiv(block, tiles_n), tiles_m))
            tn = T.alloc_var("int32", init=T.truncmod(block, tiles_n))
            staged = T.alloc_shared((tile * pitch,), dtype)

            # Phase 1: consecutive threads read consecutive elements of a row of x.
            for p in T.unroll(passes):
                r = p * rows_per_pass + tx // tile
                c = tx % tile
                if tm * tile + r < rows and tn * tile + c < cols:
                    staged[r * pitch + c] = x[b, tm * tile + r, tn * tile + c]
            T.sync_threads()

            # Phase 2: consecutive threads write consecutive elements of a row of y.
            for p in T.unroll(passes):
                j = p * rows_per_pass + tx // tile
                i = tx % tile
                if tn * tile + j < cols and tm * tile + i < rows:
                    y[b, tn * tile + j, tm * tile + i] = staged[i * pitch + j]

    return batched_transpose_scalar


def build_batched_transpose(config: TransposeConfig):
    """prim_func(x (B, M, N), y (B, N, M)) moving `config.dtype` raw bits."""
    if config.vectorized:
        return _build_vectorized(config.dtype)
    return _build_scalar(config.dtype)


BATCHED_TRANSPOSE = KernelDef("transpose.batched_transpose", build_batched_transpose, STATIC_CONFIGS)


def _check_x(x, ndim: int, layout: str) -> None:
    """kernels/torch/transpose.py's checks (same errors for the same bad arguments), then a CUDA device."""
    eager._check_transpose_arg(x, ndim, layout)
    _tilelang.require_cuda("x", x)


def _is_aligned(tensor: torch.Tensor) -> bool:
    return tensor.data_ptr() % VECTOR_BYTES == 0


def _choose_config(x: torch.Tensor, out: torch.Tensor, width: int) -> TransposeConfig:
    vec = VECTOR_BYTES // width
    _, rows, cols = x.shape
    vectorized = rows % vec == 0 and cols % vec == 0 and _is_aligned(x) and _is_aligned(out)
    return TransposeConfig(RAW_DTYPES[width], vectorized)


def _batches_per_launch(config: TransposeConfig, rows: int, cols: int) -> int:
    side = tile_side(config)
    tiles = -(-rows // side) * -(-cols // side)
    return max(1, _tilelang.MAX_BLOCKS_PER_LAUNCH // tiles)


def batched_transpose(x: torch.Tensor) -> torch.Tensor:
    """(B, M, N) -> (B, N, M), out[b, j, i] = x[b, i, j], bit for bit.

    x: contiguous CUDA tensor of a 1-, 2- or 4-byte dtype, each dim <= 2**31 - 1024.
    """
    _check_x(x, 3, "(B, M, N)")
    width = x.element_size()
    _tilelang.check_dims_fit_int32("x", x)
    batch, rows, cols = x.shape
    out = torch.empty((batch, cols, rows), dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return out
    raw_in = x.view(RAW_TORCH_DTYPES[width])
    raw_out = out.view(RAW_TORCH_DTYPES[width])
    config = _choose_config(x, out, width)
    kernel = _tilelang.kernel_for(BATCHED_TRANSPOSE, config, x.device)
    step = _batches_per_launch(config, rows, cols)
    with _tilelang.device_guard(x.device):
        for start in range(0, batch, step):
            stop = min(start + step, batch)
            kernel(raw_in[start:stop], raw_out[start:stop])
    return out


def transpose(x: torch.Tensor) -> torch.Tensor:
    """(M, N) -> (N, M), out[j, i] = x[i, j], bit for bit (see batched_transpose)."""
    _check_x(x, 2, "(M, N)")
    return batched_transpose(x.unsqueeze(0)).squeeze(0)
