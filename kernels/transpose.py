"""Bitwise (batched) transpose in TileLang.

``batched_transpose(x (B, M, N)) -> (B, N, M)`` with ``out[b, j, i] = x[b, i, j]``
and ``transpose(x (M, N)) -> (N, M)``.  Elements are moved as raw integer bits
(uint8 / int16 / int32 views of 1-, 2- and 4-byte dtypes), so NaN payloads,
-0.0 and fp8 codes survive unchanged.  B, M and N are symbolic sizes; the
static configuration is the element width plus the choice of variant:

* vectorized (M and N multiples of V = 16 / width, x's rows and y 16-byte aligned):
  each block stages a square tile (128 x 128 bytes for 1-byte elements, 64 x 64
  elements otherwise) in shared memory.  Global loads are 16-byte vectors of
  V elements along the contiguous axis; so are the stores as written, but
  nvcc splits the f32 and bf16 ones into 4-byte stores (see the candidates
  below, which the vectorized variant ships).  The shared tile is
  swizzled: chunk c (V elements) of tile row r is stored at chunk
  c ^ (r // V) of that row, which keeps both the row-wise vector stores and
  the column-wise element reads free of bank conflicts (a warp reads 8
  different chunk slots x 4 adjacent columns).  Because M and N are multiples
  of V, a vector is either wholly inside the matrix or wholly outside it, so
  the tail guards test the vector's first element.
* scalar (any M and N): a 64 x 64 tile, one element per access, the shared
  rows padded to an odd number of 32-bit words so that column reads are free
  of bank conflicts.  Every element access is guarded.

x is read in place at any row and batch strides (its last dimension contiguous): every variant
takes x as one flat span and its two strides as runtime arguments, so a contiguous and a strided
x run the same compiled configuration; the vectorized ones write the index as whole vectors times
V plus the column (`_x_vector_index`), which keeps their 16-byte loads.  A layout whose rows do
not start on 16-byte boundaries takes the scalar variant.  y is always contiguous.

Both variants guard every global access explicitly (tail tiles are not
legalised by the compiler: its safe-memory pass is disabled because it would
only add redundant per-element checks that block vectorization).

Tuning candidates of the vectorized variant (`TRANSPOSE_TUNE_CONFIGS`;
benchmarks/tune.py times them; `TRANSPOSE_SHIPPED` names the one each width
ships, `TRANSPOSE_OVERRIDES` another for a tuning run).  At 8192 x 8192 on an
H200 the base kernel above moves 78% (f32), 64% (bf16) and 71% (e4m3) of the
copy bandwidth measured beside it, the shipped candidates 93%, 89% and 82%
(reports/evidence/transpose.md#shipped-candidates).  Why the candidates can be
faster, from the base kernel's PTX and geometry:

* its stores are not all 16 bytes: nvcc splits the f32 and bf16 output
  vectors (built in a local array) into four 4-byte stores (st.global.u32,
  st.global.v2.u16), four times the store instructions and partial sectors
  for L2 to merge.  The tuned kernel stores through tk_transpose_block, whose
  st.global.v4 is spelled out in PTX (`read_bytes` = the width: the base kernel's
  element reads with whole 16-byte stores);
* phase 2 reads single elements, 16 (f32, bf16) or 64 (e4m3) shared loads a
  thread.  With `read_bytes` of 4, 8 or 16 a
  thread reads V = 16 / width rows of the tile, that many bytes of each (a
  V x read_bytes / width block), transposes the block in registers with
  byte permutes and stores read_bytes / width output vectors: 16-byte reads
  cut the shared loads V-fold.  The swizzle keeps them conflict-free: the 8
  consecutive lanes of a quarter-warp read 8 consecutive row chunks, which
  sit in 8 different bank groups;
* few bytes in flight: 32 (bf16) or 64 bytes of loads a thread, then a
  barrier.  `tile_m` x `tile_n` tiles of 16 or 32 KiB, or fewer `threads` for
  the same tile, give each thread 8 or 16 loads, all issued before the first
  shared store; a taller tile also writes longer runs of each output row
  (256 or 512 bytes instead of 128);
* traffic spread over many DRAM rows: the base kernel's order walks whole tile
  rows, so the CTAs resident at once read a few long bands of x but write
  128-byte pieces to every one of y's 8192 rows.  `group` walks bands of
  that many tile rows column by column, so the resident CTAs read and write
  more compact regions of both.

Each candidate moves the same bits: every output element is one staged input
element; only which thread moves it, and how many at once, change.
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.
from typing import NamedTuple

import torch

from . import _tilelang
from .torch import transpose as eager
from .torch._checks import rows_aligned, span_view
from ._tilelang import KernelDef, tuning_only

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
    # Tuning knobs of the vectorized kernel (the defaults are the base kernel; see TRANSPOSE_TUNE_CONFIGS):
    tile_m: int = 0  # rows of x a tile stages (0: vector_tile(width), the base square tile)
    tile_n: int = 0  # columns of x a tile stages (0: vector_tile(width))
    threads: int = THREADS
    # bytes of a staged row phase 2 reads at once, moved by tk_transpose_block with explicit 16-byte stores
    # (0: the base phase 2, elements gathered and stored as TileLang and nvcc see fit; the base
    # kernel only: any other knob needs a read size)
    read_bytes: int = 0
    group: int = 0  # tile rows walked together, tile column by tile column (0: one tile row after another)


STATIC_CONFIGS = tuple(TransposeConfig(dtype, vectorized) for dtype in RAW_DTYPES.values() for vectorized in (True, False))

# Candidates benchmarks/tune.py times against the base vectorized kernel (the bench's 8192 x 8192;
# the module docstring says why each might be faster).  Bitwise equal by construction: every output
# element is one staged input element, whichever thread moves it and however many at once.
TRANSPOSE_TUNE_CONFIGS = (
    # f32: the base kernel's reads, but 16-byte stores for sure (nvcc splits the base ones into 4 bytes)
    TransposeConfig("int32", True, read_bytes=4),
    # 4 x 4 blocks read as 16-byte rows (4 shared reads a thread instead of 16)
    TransposeConfig("int32", True, read_bytes=16),
    # ... in a tile twice as tall: 512-byte output runs, 8 loads in flight a thread
    TransposeConfig("int32", True, tile_m=128, tile_n=64, read_bytes=16),
    # ... walking 16 (8) tile rows at a time: reads and writes both in compact regions
    TransposeConfig("int32", True, read_bytes=16, group=16),
    TransposeConfig("int32", True, tile_m=128, tile_n=64, read_bytes=16, group=8),
    # bf16: the base kernel's reads, 16-byte stores for sure (the base ones are 4 bytes)
    TransposeConfig("int16", True, read_bytes=2),
    # element pairs read as 32-bit words (8 shared reads a thread instead of 16)
    TransposeConfig("int16", True, read_bytes=4),
    # 8 x 8 blocks read as 16-byte rows, one a thread: in a 128 x 128 tile (8 loads in flight a thread) ...
    TransposeConfig("int16", True, tile_m=128, tile_n=128, read_bytes=16),
    # ... in the base 64 x 64 tile of 64 threads (8 loads in flight, 4x the CTAs resident) ...
    TransposeConfig("int16", True, threads=64, read_bytes=16),
    # ... in a 128 x 64 tile of 128 threads (256-byte output runs, 8 loads in flight)
    TransposeConfig("int16", True, tile_m=128, tile_n=64, threads=128, read_bytes=16),
    TransposeConfig("int16", True, tile_m=128, tile_n=128, read_bytes=16, group=8),
    # e4m3: 32-bit shared reads (16 a thread instead of 64 single bytes), base tile
    TransposeConfig("uint8", True, read_bytes=4),
    # 16 rows x 8 bytes a thread, 128 threads: 8 loads in flight, 16 shared reads for 8 output vectors
    TransposeConfig("uint8", True, threads=128, read_bytes=8),
    # 16 x 16 blocks, 64 threads: 16 loads in flight, 16 shared reads for 16 output vectors
    TransposeConfig("uint8", True, threads=64, read_bytes=16),
    # a 256 x 128 tile (256-byte output runs), 8 loads in flight, 16 rows x 8 bytes a thread
    TransposeConfig("uint8", True, tile_m=256, tile_n=128, read_bytes=8),
    TransposeConfig("uint8", True, threads=128, read_bytes=8, group=8),
)
# The vectorized kernel ships the fastest candidate of each width: the base configuration -> the one used.
# At 8192 x 8192 (graph replay, base kernel in brackets; reports/evidence/transpose.md#shipped-candidates):
# f32 16-byte block reads 136.8 us [164.1], bf16 128 x 128 tiles of 8 x 8 blocks in bands of 8 tile rows
# 71.3 us [98.7], e4m3 256 x 128 tiles of 16 x 8-byte blocks 38.9 us [44.8]; every candidate bitwise equal
# to the base kernel.
TRANSPOSE_SHIPPED: dict[TransposeConfig, TransposeConfig] = {
    TransposeConfig("int32", True): TransposeConfig("int32", True, read_bytes=16),
    TransposeConfig("int16", True): TransposeConfig("int16", True, tile_m=128, tile_n=128, read_bytes=16, group=8),
    TransposeConfig("uint8", True): TransposeConfig("uint8", True, tile_m=256, tile_n=128, read_bytes=8),
}
# The base configuration -> the configuration to use instead (a TRANSPOSE_TUNE_CONFIGS entry of the
# same dtype, vectorized, or the base itself), set by a tuning run.
TRANSPOSE_OVERRIDES: dict[TransposeConfig, TransposeConfig] = {}


def vector_tile(width: int) -> int:
    """Side of the square tile of the vectorized variant, in elements.

    Its rows must hold at least 8 chunks of 16 bytes so that the swizzle
    spreads a warp's column reads over all 32 banks.
    """
    return 128 if width == 1 else 64


def tile_shape(config: TransposeConfig) -> tuple[int, int]:
    """(rows, columns) of x one CTA transposes, in elements."""
    if not config.vectorized:
        return SCALAR_TILE, SCALAR_TILE
    side = vector_tile(WIDTH_OF[config.dtype])
    return config.tile_m or side, config.tile_n or side


def _x_vector_index(T, vec: int, b, row, batch_stride, row_stride, column):
    """Flat index of x's element (b, row, column) at these strides (elements, multiples of `vec`), in a
    form whose alignment the vectorizer sees: (b * batch_stride / vec + row * row_stride / vec) * vec +
    column, column a vector's first element plus its lane."""
    vectors = T.Cast("int64", b) * (batch_stride // vec) + T.Cast("int64", row) * (row_stride // vec)
    return vectors * vec + column


def _build_vectorized(dtype: str):
    T = _tilelang.T()
    width = WIDTH_OF[dtype]
    vec = VECTOR_BYTES // width  # elements per 16-byte chunk
    tile = vector_tile(width)
    chunks_per_row = tile // vec  # 8 or 16; also tile // vec rows of chunks
    passes = tile * chunks_per_row // THREADS
    # Phase 2 gives each warp 4 output rows x 8 consecutive chunks.
    chunk_groups_per_row = chunks_per_row // 8
    # M and N are declared as multiples of `vec`, and x's element (b, i, j) is at
    # vector b * x_batch_stride / vec + i * x_row_stride / vec, element j (`_x_vector_index`), which
    # lets the compiler prove that every vector access is aligned.
    batch, m_chunks, n_chunks, x_span = T.dynamic("batch, m_chunks, n_chunks, x_span")
    rows = m_chunks * vec
    cols = n_chunks * vec

    @T.prim_func
    def batched_transpose_vectorized(
        x: T.Tensor((x_span,), dtype),
        y: T.Tensor((batch, n_chunks * vec, m_chunks * vec), dtype),
        x_batch_stride: T.int64,
        x_row_stride: T.int64,
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
                        staged[r * tile + (c ^ (r // vec)) * vec + v] = x[_x_vector_index(
                            T, vec, b, tm * tile + r, x_batch_stride, x_row_stride, tn * tile + c * vec + v)]
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


# Moves a block of V = 16 / W rows x R bytes of the staged tile (row u at src + u * src_pitch bytes,
# shared) to R / W output vectors of 16 bytes (vector e at dst + e * dst_pitch bytes, global): vector e
# holds element e of each of the V rows, in row order.  The block is transposed in registers with byte
# permutes (prmt): 2 x 2 halves for 2-byte elements, 4 x 4 bytes for 1-byte elements (interleave rows
# 0/1 and 2/3 bytewise, then pair the matching halves of the two interleaved words); 4-byte elements
# only change registers.  Element e of a row is the e-th lowest W bytes of its little-endian words.
TRANSPOSE_BLOCK = "tk_transpose_block"
TRANSPOSE_BLOCK_PRELUDE = r"""
#ifndef TK_TRANSPOSE_BLOCK
#define TK_TRANSPOSE_BLOCK
template <int W, int R>
__device__ __forceinline__ void tk_transpose_block(void* dst, long long dst_pitch, const void* src, int src_pitch) {
  constexpr int V = 16 / W;            // rows of the block: elements of an output vector
  constexpr int K = R < 4 ? 1 : R / 4; // registers a row of the block takes
  constexpr int E = R / W;             // elements of a block row: output vectors
  static_assert(R >= W && 16 % R == 0, "a piece is whole elements of one 16-byte chunk");
  const char* s = (const char*)src;
  unsigned in[V * K];
  if constexpr (R == 16) {
#pragma unroll
    for (int u = 0; u < V; ++u) {
      uint4 q = *(const uint4*)(s + u * src_pitch);
      in[u * 4] = q.x; in[u * 4 + 1] = q.y; in[u * 4 + 2] = q.z; in[u * 4 + 3] = q.w;
    }
  } else if constexpr (R == 8) {
#pragma unroll
    for (int u = 0; u < V; ++u) {
      uint2 q = *(const uint2*)(s + u * src_pitch);
      in[u * 2] = q.x; in[u * 2 + 1] = q.y;
    }
  } else if constexpr (R == 4) {
#pragma unroll
    for (int u = 0; u < V; ++u) in[u] = *(const unsigned*)(s + u * src_pitch);
  } else {  // one element, zero-extended
#pragma unroll
    for (int u = 0; u < V; ++u)
      in[u] = R == 1 ? (unsigned)*(const unsigned char*)(s + u * src_pitch)
                     : (unsigned)*(const unsigned short*)(s + u * src_pitch);
  }
  unsigned out[E * 4];  // word w of vector e: rows w * 4 / W ... of the block at element e
  if constexpr (R < 4) {
    // one element a row: pack 4 / W rows a word
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      unsigned word = 0;
#pragma unroll
      for (int k = 0; k < 4 / W; ++k) word |= in[w * (4 / W) + k] << (8 * W * k);
      out[w] = word;
    }
  } else if constexpr (W == 4) {
#pragma unroll
    for (int e = 0; e < E; ++e)
#pragma unroll
      for (int w = 0; w < 4; ++w) out[e * 4 + w] = in[w * K + e];
  } else if constexpr (W == 2) {
#pragma unroll
    for (int e = 0; e < E; ++e)
#pragma unroll
      for (int w = 0; w < 4; ++w)
        out[e * 4 + w] = __byte_perm(in[2 * w * K + e / 2], in[(2 * w + 1) * K + e / 2], (e & 1) ? 0x7632 : 0x5410);
  } else {
#pragma unroll
    for (int w = 0; w < 4; ++w)
#pragma unroll
      for (int q = 0; q < K; ++q) {
        unsigned x0 = in[(4 * w) * K + q], x1 = in[(4 * w + 1) * K + q];
        unsigned x2 = in[(4 * w + 2) * K + q], x3 = in[(4 * w + 3) * K + q];
        unsigned low01 = __byte_perm(x0, x1, 0x5140), high01 = __byte_perm(x0, x1, 0x7362);
        unsigned low23 = __byte_perm(x2, x3, 0x5140), high23 = __byte_perm(x2, x3, 0x7362);
        out[(4 * q) * 4 + w] = __byte_perm(low01, low23, 0x5410);
        out[(4 * q + 1) * 4 + w] = __byte_perm(low01, low23, 0x7632);
        out[(4 * q + 2) * 4 + w] = __byte_perm(high01, high23, 0x5410);
        out[(4 * q + 3) * 4 + w] = __byte_perm(high01, high23, 0x7632);
      }
  }
  char* d = (char*)dst;
#pragma unroll
  for (int e = 0; e < E; ++e) {
#if defined(__CUDA_ARCH__)
    // nvcc splits some plain uint4 stores of these registers into four 4-byte stores: spell out the one
    size_t g = __cvta_generic_to_global(d + e * dst_pitch);
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};"
                 :: "l"(g), "r"(out[e * 4]), "r"(out[e * 4 + 1]), "r"(out[e * 4 + 2]), "r"(out[e * 4 + 3]) : "memory");
#else
    *(uint4*)(d + e * dst_pitch) = make_uint4(out[e * 4], out[e * 4 + 1], out[e * 4 + 2], out[e * 4 + 3]);
#endif
  }
}
#endif
"""


def _check_tuned_tile(config: TransposeConfig) -> None:
    """The tile geometry the tuned kernel's swizzle and thread mapping rely on (ValueError otherwise)."""
    width = WIDTH_OF[config.dtype]
    vec = VECTOR_BYTES // width
    tile_m, tile_n = tile_shape(config)
    read = config.read_bytes
    row_chunks, column_chunks = tile_n // vec, tile_m // vec
    problems = [
        # the XOR swizzle stays within a row of a power of two chunks, and spreads 8 of them over the banks
        tile_n % vec or row_chunks < 8 or row_chunks & (row_chunks - 1),
        # phase 2 gives 8 consecutive lanes 8 consecutive chunks of an output row
        tile_m % (8 * vec),
        config.threads % WARP,
        tile_m * row_chunks % config.threads,
        read not in (width, 4, 8, 16) or read < width
        or column_chunks * row_chunks * (VECTOR_BYTES // read) % config.threads,  # whole passes of work items
        config.group < 0,
    ]
    if not config.vectorized or any(problems):
        raise ValueError(f"unsupported tuned transpose configuration {config!r}")


def _build_vectorized_tuned(config: TransposeConfig):
    """The vectorized kernel with tuning knobs (TRANSPOSE_TUNE_CONFIGS); the same bits as _build_vectorized.

    Phase 1 loads every vector a thread stages before storing any.  Phase 2 cuts each 16-byte chunk of
    the staged tile into pieces of read_bytes; a work item is one piece of V = 16 / width consecutive rows
    (a V x read_bytes / width block, moved by tk_transpose_block).  Consecutive lanes take the same piece
    of 8 consecutive row chunks, which the swizzle puts in 8 different bank groups, and write 128
    contiguous bytes of each output row.
    """
    T = _tilelang.T()
    _check_tuned_tile(config)
    dtype, threads, group = config.dtype, config.threads, config.group
    width = WIDTH_OF[dtype]
    vec = VECTOR_BYTES // width
    tile_m, tile_n = tile_shape(config)
    read = config.read_bytes
    row_chunks = tile_n // vec  # chunks of a staged row
    column_chunks = tile_m // vec  # chunks of the tile's part of an output row
    load_passes = tile_m * row_chunks // threads
    pieces = VECTOR_BYTES // read  # pieces of a chunk
    piece_elements = read // width
    item_passes = column_chunks * row_chunks * pieces // threads
    move = f"{TRANSPOSE_BLOCK}<{width}, {read}>"
    batch, m_chunks, n_chunks, x_span = T.dynamic("batch, m_chunks, n_chunks, x_span")
    rows = m_chunks * vec
    cols = n_chunks * vec

    @T.prim_func
    def batched_transpose_tuned(
        x: T.Tensor((x_span,), dtype),
        y: T.Tensor((batch, n_chunks * vec, m_chunks * vec), dtype),
        x_batch_stride: T.int64,
        x_row_stride: T.int64,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        tiles_m = T.ceildiv(rows, tile_m)
        tiles_n = T.ceildiv(cols, tile_n)
        with T.Kernel(batch * tiles_m * tiles_n, threads=threads, prelude=TRANSPOSE_BLOCK_PRELUDE) as block:
            tx = T.get_thread_binding()
            b = T.alloc_var("int32", init=T.truncdiv(block, tiles_m * tiles_n))
            tile = T.alloc_var("int32", init=T.truncmod(block, tiles_m * tiles_n))
            tm = T.alloc_var("int32")
            tn = T.alloc_var("int32")
            if group == 0:
                tm = T.truncdiv(tile, tiles_n)
                tn = T.truncmod(tile, tiles_n)
            else:
                # Bands of `group` tile rows, each walked tile column by tile column (the last band
                # may be shorter): the CTAs resident at once cover a compact region of x and of y.
                band = T.alloc_var("int32", init=T.truncdiv(tile, group * tiles_n))
                band_rows = T.alloc_var("int32", init=T.min(tiles_m - band * group, group))
                tm = band * group + T.truncmod(T.truncmod(tile, group * tiles_n), band_rows)
                tn = T.truncdiv(T.truncmod(tile, group * tiles_n), band_rows)
            staged = T.alloc_shared((tile_m * tile_n,), dtype)
            held = T.alloc_local((load_passes * vec,), dtype)

            # Phase 1: consecutive threads load consecutive chunks of a row; all loads before any store.
            for p in T.unroll(load_passes):
                r = (p * threads + tx) // row_chunks
                c = (p * threads + tx) % row_chunks
                if tm * tile_m + r < rows and tn * tile_n + c * vec < cols:
                    for v in T.vectorized(vec):
                        held[p * vec + v] = x[_x_vector_index(T, vec, b, tm * tile_m + r, x_batch_stride, x_row_stride,
                                                              tn * tile_n + c * vec + v)]
            for p in T.unroll(load_passes):
                r = (p * threads + tx) // row_chunks
                c = (p * threads + tx) % row_chunks
                if tm * tile_m + r < rows and tn * tile_n + c * vec < cols:
                    for v in T.vectorized(vec):
                        staged[r * tile_n + (c ^ ((r // vec) % row_chunks)) * vec + v] = held[p * vec + v]
            T.sync_threads()

            # Phase 2: item = row chunk i_low + 8 (piece + pieces (row chunk group + groups * column chunk)).
            for p in T.unroll(item_passes):
                item = p * threads + tx
                i_chunk = (item // (8 * pieces)) % (column_chunks // 8) * 8 + item % 8
                piece = (item // 8) % pieces
                j_chunk = item // (pieces * column_chunks)
                j = j_chunk * vec + piece * piece_elements  # first tile column (output row) of the piece
                if tn * tile_n + j < cols and tm * tile_m + i_chunk * vec < rows:
                    T.call_extern("handle", move,
                                  T.address_of(y[b, tn * tile_n + j, tm * tile_m + i_chunk * vec]),
                                  T.Cast("int64", rows) * width,
                                  T.address_of(staged[i_chunk * vec * tile_n + (j_chunk ^ (i_chunk % row_chunks)) * vec
                                                      + piece * piece_elements]),
                                  tile_n * width)

    return batched_transpose_tuned


def _build_scalar(dtype: str):
    T = _tilelang.T()
    width = WIDTH_OF[dtype]
    tile = SCALAR_TILE
    # Row pitch of 16 * width + 1 words (odd): the 32 lanes reading one tile
    # column hit 32 different banks.
    pitch = tile + 4 // width
    rows_per_pass = THREADS // tile
    passes = tile // rows_per_pass
    batch, rows, cols, x_span = T.dynamic("batch, rows, cols, x_span")

    @T.prim_func
    def batched_transpose_scalar(
        x: T.Tensor((x_span,), dtype),
        y: T.Tensor((batch, cols, rows), dtype),
        x_batch_stride: T.int64,
        x_row_stride: T.int64,
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
                    staged[r * pitch + c] = x[T.Cast("int64", b) * x_batch_stride + T.Cast("int64", tm * tile + r)
                                              * x_row_stride + (tn * tile + c)]
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
    if config == TransposeConfig(config.dtype, config.vectorized):
        if config.vectorized:
            return _build_vectorized(config.dtype)  # the base kernels
        return _build_scalar(config.dtype)
    return _build_vectorized_tuned(config)


BATCHED_TRANSPOSE = KernelDef("transpose.batched_transpose", build_batched_transpose,
                              STATIC_CONFIGS + TRANSPOSE_TUNE_CONFIGS,
                              candidates=tuning_only(TRANSPOSE_TUNE_CONFIGS, TRANSPOSE_SHIPPED))


def _check_x(x, ndim: int, layout: str) -> None:
    """kernels/torch/transpose.py's checks (same errors for the same bad arguments: any row and batch
    strides, the last dimension contiguous, no overlap), then a CUDA device."""
    eager._check_transpose_arg(x, ndim, layout)
    _tilelang.require_cuda("x", x)


def _is_aligned(tensor: torch.Tensor) -> bool:
    return tensor.data_ptr() % VECTOR_BYTES == 0


def _choose_config(x: torch.Tensor, out: torch.Tensor, width: int) -> TransposeConfig:
    vec = VECTOR_BYTES // width
    _, rows, cols = x.shape
    # x's rows (and batch entries) must start on 16-byte boundaries for the vector loads
    vectorized = rows % vec == 0 and cols % vec == 0 and rows_aligned(x, VECTOR_BYTES) and _is_aligned(out)
    return _tilelang.chosen_config(TransposeConfig(RAW_DTYPES[width], vectorized), TRANSPOSE_SHIPPED,
                                   TRANSPOSE_OVERRIDES)


def _batches_per_launch(config: TransposeConfig, rows: int, cols: int) -> int:
    tile_m, tile_n = tile_shape(config)
    tiles = -(-rows // tile_m) * -(-cols // tile_n)
    return max(1, _tilelang.MAX_BLOCKS_PER_LAUNCH // tiles)


def batched_transpose(x: torch.Tensor) -> torch.Tensor:
    """(B, M, N) -> (B, N, M), out[b, j, i] = x[b, i, j], bit for bit.

    x: CUDA tensor of a 1-, 2- or 4-byte dtype, each dim <= 2**31 - 1024, its last dimension
    contiguous at any row and batch strides (a slice ``buf[..., :N]`` of a wider buffer, a slice of
    a batch), read in place: the kernels take x's strides as arguments.  The vectorized variant needs
    x's rows to start on 16-byte boundaries (data pointer, row and batch strides in bytes multiples
    of 16); other layouts take the scalar variant, which needs no alignment.
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
            kernel(span_view(raw_in[start:stop]), raw_out[start:stop], raw_in.stride(0), raw_in.stride(1))
    return out


def transpose(x: torch.Tensor) -> torch.Tensor:
    """(M, N) -> (N, M), out[j, i] = x[i, j], bit for bit (see batched_transpose)."""
    _check_x(x, 2, "(M, N)")
    return batched_transpose(x.unsqueeze(0)).squeeze(0)
