"""Bitwise (batched) transpose in TileLang.

``batched_transpose(x (B, M, N)) -> (B, N, M)`` with ``out[b, j, i] = x[b, i, j]``
and ``transpose(x (M, N)) -> (N, M)``.  Elements are moved as raw bits, so NaN
payloads, -0.0 and fp8 codes survive unchanged.  B, M and N are symbolic
sizes; the static configuration is the element width, the kernel and its tile.
Both kernels stage a 16 KiB tile per CTA of 256 threads (64 bytes per thread
each way) and move every interior byte with 16-byte global accesses:

* word kernel (M and N multiples of V = 16 / width, so every row of x and of
  out starts on a 16-byte boundary): x and out are viewed as 32-bit words
  holding `pack` = 4 / width elements.  Phase 1 copies 16-byte vectors of x
  rows into shared memory, vector c of row r at slot c ^ ((r // (4 pack)) % 8).
  Phase 2: a thread reads one word column of 4 * pack rows (conflict-free:
  the warp's 8 row groups sit in 8 different slots, its 4 columns in 4 words
  of a slot), transposes each pack x pack block in registers with byte
  permutes (2x2 halves for bf16, 4x4 bytes for e4m3) and writes `pack`
  16-byte vectors, one per output row.  Tiles: f32 64 x 64, bf16 64 x 128,
  e4m3 128 x 128 elements (rows x columns of x).
* any-shape kernel (anything else; its rows start anywhere within a 16-byte
  vector): flat element offsets; phase 1 loads the aligned 16-byte vectors
  that cover each tile row (one more than its 128 bytes need when the row
  starts mid-vector) and stages each whole vector at its own slot, so the
  row's shift is kept in shared memory instead of being realigned; phase 2
  gathers elements into the aligned 16-byte vectors of each output row and
  writes whole ones as vectors, the two partial ones at the ends of the
  tile's part of a row element by element.  Tiles: 128 rows x 128 bytes,
  staged in rows of 256 bytes (the swizzled slots of the extra vector).

Every global access is guarded explicitly (tail tiles are not legalised by
the compiler: its safe-memory pass is disabled because it would only add
redundant per-element checks that block vectorization); the any-shape
kernel also stops at the end of x, which need not be a whole vector.  Both
need x and out to start on 16-byte boundaries: the wrapper copies an x that
does not (a view at an odd offset).
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
WORD_BYTES = 4
# Bytes one thread moves per tile (four 16-byte vectors each way); with 256
# threads a tile is 16 KiB.
BYTES_PER_THREAD = 64
TILE_BYTES = THREADS * BYTES_PER_THREAD
# The XOR swizzles below spread a warp's shared-memory reads over 8 slots of
# 16 bytes (all 32 banks); rows are padded to multiples of 8 slots.
SWIZZLE_SLOTS = 8

# Raw-bits type moved for each element width (bytes).
RAW_DTYPES = {1: "uint8", 2: "int16", 4: "int32"}
RAW_TORCH_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32}
WIDTH_OF = {name: width for width, name in RAW_DTYPES.items()}

# Every access is guarded by hand; the compiler's own bounds legalisation would
# duplicate those guards per vector lane and defeat vectorization.
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}


class TransposeConfig(NamedTuple):
    dtype: str  # raw-bits type: "uint8", "int16" or "int32"
    aligned_rows: bool  # every row of x and of out starts on a 16-byte boundary (word kernel)
    tile_rows: int  # rows of x per tile (the word kernel's tile is 16 KiB, so this fixes its shape)


# Rows of x per tile, by element width.  Word kernel: rows x (16 KiB / rows)
# bytes; f32 64 x 64, bf16 64 x 128, e4m3 128 x 128 elements.  Any-shape
# kernel: rows x 128 bytes (its loads cover 128 bytes of each row plus one
# more vector for the row's misalignment).
WORD_TILE_ROWS = {1: 128, 2: 64, 4: 64}
ANY_TILE_ROWS = 128
# Resident CTAs per SM the kernels ask registers for (__launch_bounds__).
WORD_CTAS_PER_SM = 8
ANY_CTAS_PER_SM = 6

STATIC_CONFIGS = tuple(
    TransposeConfig(dtype, aligned, WORD_TILE_ROWS[width] if aligned else ANY_TILE_ROWS)
    for width, dtype in RAW_DTYPES.items() for aligned in (True, False))

# Alternatives a GPU run can time (compiled by kernels.precompile, never chosen
# by the wrappers): bf16 in 128 x 64 tiles (256-byte output rows instead of
# 256-byte input rows), f32 in 128 x 32 tiles (512-byte output rows).
TRANSPOSE_TUNE_CONFIGS = (
    TransposeConfig("int16", True, 128),
    TransposeConfig("int32", True, 128),
)


def elements_per_word(width: int) -> int:
    return WORD_BYTES // width


def tile_shape(config: TransposeConfig) -> tuple[int, int]:
    """(rows, columns) of x that one CTA transposes, in elements."""
    width = WIDTH_OF[config.dtype]
    if config.aligned_rows:
        return config.tile_rows, TILE_BYTES // (config.tile_rows * width)
    return config.tile_rows, SWIZZLE_SLOTS * VECTOR_BYTES // width


def _check_word_tile(width: int, tile_rows: int) -> None:
    pack = elements_per_word(width)
    words_per_row = TILE_BYTES // WORD_BYTES // tile_rows
    # Phase 2 gives a warp 8 groups of 4 * pack rows, phase 1 a quarter-warp
    # 8 vectors of one row.
    if tile_rows % (4 * pack * SWIZZLE_SLOTS) or words_per_row % (4 * SWIZZLE_SLOTS):
        raise ValueError(f"word tile of {tile_rows} rows unsupported for {width}-byte elements")


def _byte_perm(T, a, b, selector: int):
    """prmt: byte k of the result is byte (selector >> 4k) & 7 of the pair (b:a)."""
    return T.call_pure_extern("int32", "__byte_perm", a, b, selector)


def _transposed_pack(T, rows: list, pack: int) -> list:
    """A pack x pack block of elements, transposed in registers.

    rows[t] is the word holding elements 0..pack-1 of row t (element e in the
    e-th lowest bytes); result[e] is the word holding element e of rows
    0..pack-1 (row t in the t-th lowest bytes).
    """
    if pack == 1:
        return list(rows)
    if pack == 2:
        # halves: (a0, a1), (b0, b1) -> (a0, b0), (a1, b1)
        return [_byte_perm(T, rows[0], rows[1], 0x5410), _byte_perm(T, rows[0], rows[1], 0x7632)]
    # bytes, in two rounds: interleave rows 0/1 and rows 2/3 bytewise, then
    # pair the matching halves of the two interleaved words.
    low01 = _byte_perm(T, rows[0], rows[1], 0x5140)  # a0 b0 a1 b1
    high01 = _byte_perm(T, rows[0], rows[1], 0x7362)  # a2 b2 a3 b3
    low23 = _byte_perm(T, rows[2], rows[3], 0x5140)
    high23 = _byte_perm(T, rows[2], rows[3], 0x7362)
    return [_byte_perm(T, low01, low23, 0x5410), _byte_perm(T, low01, low23, 0x7632),
            _byte_perm(T, high01, high23, 0x5410), _byte_perm(T, high01, high23, 0x7632)]


def _build_words(dtype: str, tile_rows: int):
    """Kernel on 32-bit words: x as (B, M, N / pack) words, out as (B, N, M / pack).

    Phase 1 copies 16-byte vectors of x rows into a swizzled shared tile.
    Phase 2: a thread takes one word column J of the tile and 4 * pack
    consecutive rows (one 16-byte vector of each output row), reads those
    4 * pack words, transposes each pack x pack block in registers and writes
    `pack` output vectors (rows J * pack + e of out).
    """
    T = _tilelang.T()
    width = WIDTH_OF[dtype]
    pack = elements_per_word(width)
    _check_word_tile(width, tile_rows)
    words_per_row = TILE_BYTES // WORD_BYTES // tile_rows  # x words per tile row
    vec_words = VECTOR_BYTES // WORD_BYTES
    vectors_per_row = words_per_row // vec_words
    load_passes = tile_rows * vectors_per_row // THREADS
    rows_per_unit = vec_words * pack  # x rows behind one output vector
    units_per_column = tile_rows // rows_per_unit
    store_passes = words_per_row * units_per_column // THREADS
    # Sizes in 16-byte vectors: M = m_vecs * 4 * pack elements, N likewise.
    batch, m_vecs, n_vecs = T.dynamic("batch, m_vecs, n_vecs")
    rows = m_vecs * rows_per_unit
    x_words = n_vecs * vec_words  # words per x row
    y_words = m_vecs * vec_words  # words per out row

    @T.prim_func
    def batched_transpose_words(
        x: T.Tensor((batch, m_vecs * rows_per_unit, n_vecs * vec_words), "int32"),
        y: T.Tensor((batch, n_vecs * rows_per_unit, m_vecs * vec_words), "int32"),
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        tiles_m = T.ceildiv(rows, tile_rows)
        tiles_n = T.ceildiv(x_words, words_per_row)
        with T.Kernel(batch * tiles_m * tiles_n, threads=THREADS) as block:
            # 8 CTAs (2048 threads, 128 KiB of tiles) per SM: at most 32 registers.
            T.annotate_min_blocks_per_sm(WORD_CTAS_PER_SM)
            tx = T.get_thread_binding()
            b = T.alloc_var("int32", init=T.truncdiv(block, tiles_m * tiles_n))
            tm = T.alloc_var("int32", init=T.truncmod(T.truncdiv(block, tiles_n), tiles_m))
            tn = T.alloc_var("int32", init=T.truncmod(block, tiles_n))
            staged = T.alloc_shared((tile_rows * words_per_row,), "int32")
            gathered = T.alloc_local((rows_per_unit,), "int32")
            packed = T.alloc_local((rows_per_unit,), "int32")

            # Phase 1: a quarter-warp reads 8 consecutive vectors of one row;
            # vector c of row r goes to slot c ^ (group of r), the group being
            # the 4 * pack rows of one phase-2 unit.
            for p in T.unroll(load_passes):
                r = (p * THREADS + tx) // vectors_per_row
                c = (p * THREADS + tx) % vectors_per_row
                slot = c ^ ((r // rows_per_unit) % SWIZZLE_SLOTS)
                if tm * tile_rows + r < rows and tn * words_per_row + c * vec_words < x_words:
                    for v in T.vectorized(vec_words):
                        staged[r * words_per_row + slot * vec_words + v] = x[
                            b, tm * tile_rows + r, tn * words_per_row + c * vec_words + v]
            T.sync_threads()

            # Phase 2: in a warp, lane % 4 picks one of 4 adjacent word columns
            # and lane // 4 one of 8 consecutive units of rows (8 output vectors
            # making 128 contiguous bytes of each output row); the 8 units sit
            # in 8 different swizzle slots, so the 32 lanes hit 32 banks.
            for p in T.unroll(store_passes):
                unit = p * THREADS + tx
                column_group = (unit // WARP) % (words_per_row // vec_words)
                unit_group = (unit // WARP) // (words_per_row // vec_words)
                column = column_group * vec_words + unit % vec_words
                row_unit = unit_group * SWIZZLE_SLOTS + (unit % WARP) // vec_words
                slot = column_group ^ (row_unit % SWIZZLE_SLOTS)
                if tn * words_per_row + column < x_words and tm * tile_rows + row_unit * rows_per_unit < rows:
                    for t in T.unroll(rows_per_unit):
                        gathered[t] = staged[(row_unit * rows_per_unit + t) * words_per_row
                                             + slot * vec_words + unit % vec_words]
                    # Word g of output vector e: rows g * pack ... of the unit.
                    for g in T.unroll(vec_words):
                        block_rows = [gathered[g * pack + t] for t in range(pack)]
                        for e, word in enumerate(_transposed_pack(T, block_rows, pack)):
                            packed[e * vec_words + g] = word
                    for e in T.unroll(pack):
                        for g in T.vectorized(vec_words):
                            y[b, (tn * words_per_row + column) * pack + e,
                              tm * (tile_rows // pack) + row_unit * vec_words + g] = packed[e * vec_words + g]

    return batched_transpose_words


def _build_any(dtype: str, tile_rows: int):
    """Kernel for any M and N (rows start anywhere within a 16-byte vector).

    Sizes and indices are flat element offsets into x and out: row r of the
    tile starts `shift` elements into a 16-byte vector of x, so phase 1 loads
    the whole vectors covering the row's 128 bytes (one more than 128 / 16
    when shift > 0) and stages each at its own 16-byte slot; the tile element
    (r, c) then sits at position shift(r) + c of staged row r.  Phase 2 walks
    the 16-byte vectors of each output row the same way: a vector wholly
    inside the tile's part of that row is gathered and written as one vector,
    the partial ones at either end element by element (their other elements
    belong to the neighbouring tiles).
    """
    T = _tilelang.T()
    width = WIDTH_OF[dtype]
    vec = VECTOR_BYTES // width
    tile_cols = SWIZZLE_SLOTS * vec
    in_vectors = tile_cols // vec + 1  # per staged row
    out_vectors = tile_rows // vec + 1  # per output row
    # Vector k of row r sits at slot k ^ ((r // vec) % 8): slots up to
    # tile_cols // vec + 7.  Rows whose shifts agree (r mod vec) fall into
    # different slots of 8, which spreads phase 2's column reads over the banks.
    pitch = (tile_cols // vec + SWIZZLE_SLOTS) * vec
    load_items = tile_rows * in_vectors
    store_items = tile_cols * out_vectors
    batch, rows, cols = T.dynamic("batch, rows, cols")

    @T.prim_func
    def batched_transpose_any(
        x: T.Tensor((batch, rows, cols), dtype),
        y: T.Tensor((batch, cols, rows), dtype),
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        tiles_m = T.ceildiv(rows, tile_rows)
        tiles_n = T.ceildiv(cols, tile_cols)
        with T.Kernel(batch * tiles_m * tiles_n, threads=THREADS) as block:
            # As many CTAs per SM as their 32 KiB shared tiles allow: at most 40 registers.
            T.annotate_min_blocks_per_sm(ANY_CTAS_PER_SM)
            tx = T.get_thread_binding()
            b = T.alloc_var("int32", init=T.truncdiv(block, tiles_m * tiles_n))
            tm = T.alloc_var("int32", init=T.truncmod(T.truncdiv(block, tiles_n), tiles_m))
            tn = T.alloc_var("int32", init=T.truncmod(block, tiles_n))
            staged = T.alloc_shared((tile_rows * pitch,), dtype)
            column = T.alloc_local((vec,), dtype)
            total = T.alloc_var("int64", init=T.cast(batch, "int64") * rows * cols)
            valid_rows = T.alloc_var("int32", init=T.min(tile_rows, rows - tm * tile_rows))
            valid_cols = T.alloc_var("int32", init=T.min(tile_cols, cols - tn * tile_cols))
            # Flat offsets of x[b, tile's first row, tile's first column] and
            # of out[b, tile's first column, tile's first row].
            x_first = T.alloc_var("int64", init=(T.cast(b, "int64") * rows + tm * tile_rows) * cols + tn * tile_cols)
            y_first = T.alloc_var("int64", init=(T.cast(b, "int64") * cols + tn * tile_cols) * rows + tm * tile_rows)
            x_shift = T.alloc_var("int32", init=T.cast(T.floormod(x_first, vec), "int32"))
            y_shift = T.alloc_var("int32", init=T.cast(T.floormod(y_first, vec), "int32"))
            x_step = T.alloc_var("int32", init=T.floormod(cols, vec))  # shift gained per x row
            y_step = T.alloc_var("int32", init=T.floormod(rows, vec))  # per output row

            # Phase 1: consecutive threads load consecutive vectors of a row.
            for p in T.unroll(T.ceildiv(load_items, THREADS)):
                item = p * THREADS + tx
                r = item // in_vectors
                k = item % in_vectors
                shift = T.floormod(x_shift + r * x_step, vec)
                if item < load_items and r < valid_rows and k * vec < shift + valid_cols:
                    first = T.floordiv(x_first + T.cast(r, "int64") * cols, vec) + k  # in vectors
                    dest = r * pitch + (k ^ ((r // vec) % SWIZZLE_SLOTS)) * vec
                    if (first + 1) * vec <= total:
                        for v in T.vectorized(vec):
                            staged[dest + v] = x[0, 0, first * vec + v]
                    else:  # the last vector of x, cut short by its end
                        for v in T.unroll(vec):
                            if first * vec + v < total:
                                staged[dest + v] = x[0, 0, first * vec + v]
            T.sync_threads()

            # Phase 2: consecutive threads write consecutive vectors of an
            # output row (tile column jj); element v of vector k is tile row
            # k * vec + v - (that row's shift).
            for p in T.unroll(T.ceildiv(store_items, THREADS)):
                item = p * THREADS + tx
                jj = item // out_vectors
                k = item % out_vectors
                low = k * vec - T.floormod(y_shift + jj * y_step, vec)  # tile row of element 0
                if item < store_items and jj < valid_cols and low < valid_rows and low + vec > 0:
                    first = T.floordiv(y_first + T.cast(jj, "int64") * rows, vec) + k  # in vectors
                    if low >= 0 and low + vec <= valid_rows:
                        for v in T.unroll(vec):
                            column[v] = staged[_staged_index(T, low + v, jj, x_shift, x_step, vec, pitch, tile_rows)]
                        for v in T.vectorized(vec):
                            y[0, 0, first * vec + v] = column[v]
                    else:  # the tile's first or last vector of this row
                        for v in T.unroll(vec):
                            if low + v >= 0 and low + v < valid_rows:
                                y[0, 0, first * vec + v] = staged[
                                    _staged_index(T, low + v, jj, x_shift, x_step, vec, pitch, tile_rows)]

    return batched_transpose_any


def _staged_index(T, r, c, x_shift, x_step, vec: int, pitch: int, tile_rows: int):
    """Index in the any-shape kernel's shared tile of tile element (r, c), r >= 0."""
    # The mask (r < tile_rows already) bounds r for the compiler, which
    # otherwise computes the whole index in 64 bits.
    r = T.bitwise_and(r, tile_rows - 1)
    position = T.floormod(x_shift + r * x_step, vec) + c
    slot = (position // vec) ^ ((r // vec) % SWIZZLE_SLOTS)
    return r * pitch + slot * vec + position % vec


def build_batched_transpose(config: TransposeConfig):
    """prim_func(x, y) moving `config.dtype` raw bits (x and y as int32 words for the word kernel)."""
    if config.aligned_rows:
        return _build_words(config.dtype, config.tile_rows)
    return _build_any(config.dtype, config.tile_rows)


BATCHED_TRANSPOSE = KernelDef("transpose.batched_transpose", build_batched_transpose,
                              STATIC_CONFIGS + TRANSPOSE_TUNE_CONFIGS)


def _check_x(x, ndim: int, layout: str) -> None:
    """kernels/torch/transpose.py's checks (same errors for the same bad arguments), then a CUDA device."""
    eager._check_transpose_arg(x, ndim, layout)
    _tilelang.require_cuda("x", x)


def _choose_config(rows: int, cols: int, width: int) -> TransposeConfig:
    vec = VECTOR_BYTES // width
    aligned_rows = rows % vec == 0 and cols % vec == 0
    return TransposeConfig(RAW_DTYPES[width], aligned_rows,
                           WORD_TILE_ROWS[width] if aligned_rows else ANY_TILE_ROWS)


def _batches_per_launch(config: TransposeConfig, rows: int, cols: int) -> int:
    """Batches per launch: the grid stays below 2**31 CTAs, and a multiple of 16
    batches keeps every launch's first element on a 16-byte boundary (the
    kernels' vectors are aligned to the start of the tensors they are given).
    Any tensor that fits in memory has far fewer than 2**27 tiles per batch."""
    tile_rows, tile_cols = tile_shape(config)
    tiles = -(-rows // tile_rows) * -(-cols // tile_cols)
    fit = _tilelang.MAX_BLOCKS_PER_LAUNCH // tiles
    return max(VECTOR_BYTES, fit - fit % VECTOR_BYTES)


def batched_transpose(x: torch.Tensor) -> torch.Tensor:
    """(B, M, N) -> (B, N, M), out[b, j, i] = x[b, i, j], bit for bit.

    x: contiguous CUDA tensor of a 1-, 2- or 4-byte dtype, each dim <= 2**31 - 1024.
    An x that does not start on a 16-byte boundary (a view at an odd offset)
    is copied first.
    """
    _check_x(x, 3, "(B, M, N)")
    width = x.element_size()
    _tilelang.check_dims_fit_int32("x", x)
    batch, rows, cols = x.shape
    out = torch.empty((batch, cols, rows), dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return out
    config = _choose_config(rows, cols, width)
    raw_dtype = torch.int32 if config.aligned_rows else RAW_TORCH_DTYPES[width]
    raw_in = _tilelang.aligned(x, VECTOR_BYTES).view(raw_dtype)
    raw_out = out.view(raw_dtype)
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
