"""The block_cast kernel (kernel quant.block_cast) and its wrappers: per_block_cast (blocks of
bm x bk = 128 x 128 or 32 x 32), its sf-only and precomputed-sf variants
(per_block_cast_with_sf_only, per_block_cast_with_precomputed_sf), and per_channel_cast (blocks of
num_per_tokens x 1).

Blocks of bm x bk, bm in {16, 32, 64, 128}, bk in {1, 32, 128}.  A CTA (256 threads) takes a tile
of 128 rows (whole blocks: bm divides 128) by 128 columns (whole blocks: bk divides 128); thread
t owns the chunk of 8 consecutive columns 8 (t % 16) in the 8 rows 8 (t / 16) .. + 7
(`BlockConfig`: threads and rows per thread; the tile is always 128 rows by 8 * lanes columns).

* Loads: the thread's 8 chunks are loaded first, all of them before any use, and stay in
  registers until they are quantised: x is read from DRAM once.  Vector path (H % 8 == 0, chosen
  on the host): one 16-byte load per chunk (two for fp32) of a flat int32 view.  Element path
  (any H: per_channel's odd H, e2m1's H = 2 mod 8): element loads into the same registers,
  guarded per element.  Rows past T and columns past H read as 0 (no amax moves).
* amax: per column over the thread's rows (bf16: per-halfword max of the raw words), then per
  block: bk = 1: each column is a block slot; bk >= 32: the chunk's max, reduced over the block's
  bk / 8 lanes with shuffles.  Each row group writes its slots to shared memory; one thread per
  block of the tile takes the max over the block's bm / 8 row groups, computes the sf
  (`scale_of`), writes it (`write_scale`) and puts sf, 1 / sf and the correction factor in
  shared memory, where every thread reads those of its 8 columns.
* Quantise: q = x * r with the Markstein correction for both formats (these kernels are not
  issue-bound), codes by `tkq_e4m3x2` / `_e2m1_nibble`; vector path: one 8-byte (e4m3) or 4-byte
  (e2m1) store per chunk; element path: byte stores, guarded.

* sf only (``with_data`` = 0, a runtime argument): the same kernel without the quantise pass and
  its stores (data is a placeholder).
* Precomputed sf (``precomputed`` = 1, a static field of `BlockConfig`, kernels of their own): no
  amax; one thread per block of the tile reads the block's given sf (fp32, ue8m0 or packed, any
  strides: `read_scale`) into shared memory, and every quotient is an IEEE division x / sf
  (``__fdiv_rn``: an sf of 0, subnormal, inf or NaN gives what IEEE division gives).  64 inline
  divisions per thread would bloat the computed-sf kernel's code, hence a static field.

The work split changes no arithmetic: every configuration gives the same bits (the 4 shipped
ones, input dtype x format, their 4 precomputed-sf twins, and the 2 tuning candidates
`BLOCK_TUNE_CONFIGS`).  ptxas (sm_90)
gives bf16 80 registers (3 CTAs per SM, 96 KB of input in flight) and fp32 at most 128 (2 CTAs)
(reports/evidence/quant.md#registers).  The wrappers launch in pieces of whole tile rows: at most
2^31 - 1 CTAs, and on the vector path fewer than 2^31 elements (its flat views have int32
sizes).  Everything but the input dtype and the format (block geometry, sf storage, round_sf,
layout, clamp_min, T, H, with_data) is a runtime argument.

x is read dense (row stride H), as tile-kernels' per_block_cast and per_channel_cast read it (both
releases assert a contiguous x): a row-strided x is refused by name (`check_dense_rows`).
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.
from typing import NamedTuple

import torch

from .. import _tilelang
from .._tilelang import KernelDef
from ..torch import quant as eager
from ..torch._checks import check_dense_rows
from .common import (CHUNK, DATA_WORDS_PER_CHUNK, IN_DTYPES, PASS_CONFIGS, VECTOR_BYTES, WORDS_PER_CHUNK, _bits,
                     _f32, _new_data, _new_sf, _sf_args, _u, _words)
from .encode import _e2m1_nibble
from .prelude import PRELUDE
from .scale import _scale_macros

BLOCK_TILE_ROWS = 128  # rows of a CTA tile: a multiple of every bm (16 .. 128), so blocks never straddle tiles
BLOCK_MIN_BM = 16  # the least bm (per_channel_cast's smallest num_per_tokens): sizes the scale table
BLOCK_KS = (1, 32, 128)  # every bk; a tile's column span must be a multiple of the largest
# Each launch's flat word views of x and data stay below 2^31 elements (their sizes are int32
# symbolic sizes): the rows of one launch hold at most this many elements, and a row of more than
# BLOCK_MAX_ELEMENTS_PER_LAUNCH / BLOCK_TILE_ROWS elements takes the element path (never vectors).
BLOCK_MAX_ELEMENTS_PER_LAUNCH = 2**31 - 1
RAW_INPUT = {"bfloat16": "int16", "float32": "int32"}


class BlockConfig(NamedTuple):
    dtype: str  # input dtype: "bfloat16" or "float32"
    fmt: str  # "e4m3" or "e2m1"
    # Geometry (tuning knobs; every choice computes the same bits, see build_block_cast):
    threads: int = 256  # per CTA
    rows: int = 8  # rows per thread R (a divisor of BLOCK_MIN_BM); BLOCK_TILE_ROWS / R row groups per tile
    min_blocks: int = 2  # CTAs per SM promised to ptxas (caps registers at 65536 / (threads * min_blocks))
    # 1: the sf is given (read, not computed) and every quotient is an IEEE division (see the module docstring)
    precomputed: int = 0


def block_geometry(config: BlockConfig) -> tuple[int, int, int]:
    """(row groups G, lanes L per row group, tile columns 8L) of a configuration.

    A tile is BLOCK_TILE_ROWS x 8L; thread t is lane t % L of row group t // L and owns the
    chunk of 8 columns 8 (t % L) of the tile in R consecutive rows.
    """
    groups = BLOCK_TILE_ROWS // config.rows
    lanes = config.threads // groups
    tile_cols = CHUNK * lanes
    if (BLOCK_MIN_BM % config.rows or groups * config.rows != BLOCK_TILE_ROWS or lanes * groups != config.threads
            or tile_cols % max(BLOCK_KS) or lanes & (lanes - 1)):
        raise ValueError(f"{config}: not a block_cast geometry (R must divide {BLOCK_MIN_BM}, and the lanes "
                         f"per row group be a power of two spanning a multiple of {max(BLOCK_KS)} columns)")
    return groups, lanes, tile_cols


# Shipped: 256 threads, 8 rows each (16 row groups x 16 lanes: 128 x 128 tiles).  bf16 holds 32
# words of input per thread and fits 3 CTAs per SM; fp32 holds 64 and fits 2.
BLOCK_MIN_BLOCKS = {"bfloat16": 3, "float32": 2}
BLOCK_CONFIGS = tuple(BlockConfig(dtype, fmt, min_blocks=BLOCK_MIN_BLOCKS[dtype], precomputed=precomputed)
                      for precomputed in (0, 1) for dtype in ("bfloat16", "float32") for fmt in ("e4m3", "e2m1"))
# Candidates for a tuning run (compiled by precompile, never used by default; bitwise equal by
# construction: only the work split changes).  512 threads x 4 rows: half the registers of input
# per thread, 128 x 128 tiles (64 registers, 2 CTAs per SM); 128 threads x 16 rows: 64 words in
# flight per thread, 128 x 128 tiles (168 registers, 3 CTAs per SM: a 4-CTA promise caps it at 128
# registers, and ptxas spills 88 bytes; reports/evidence/quant.md#registers).
BLOCK_TUNE_CONFIGS = (
    BlockConfig("bfloat16", "e4m3", threads=512, rows=4, min_blocks=2),
    BlockConfig("bfloat16", "e4m3", threads=128, rows=16, min_blocks=3),
)
# (dtype, fmt) -> the configuration to use instead of the shipped one (for a tuning run).
BLOCK_OVERRIDES: dict[tuple[str, str], BlockConfig] = {}


def block_config(dtype: str, fmt: str, precomputed: bool = False) -> BlockConfig:
    """The configuration of a block_cast call: the shipped one, unless a tuning run overrides it (computed
    sf only)."""
    if precomputed:
        return BlockConfig(dtype, fmt, min_blocks=BLOCK_MIN_BLOCKS[dtype], precomputed=1)
    return BLOCK_OVERRIDES.get((dtype, fmt)) or BlockConfig(dtype, fmt, min_blocks=BLOCK_MIN_BLOCKS[dtype])


# ------------------------------------------------------------------ the builder
# build_block_cast assembles the kernel from TileLang macros, made by the factories below from the
# configuration's static values: the tile's loads and column amaxes; the blocks' amaxes and sf; the
# quotients, codes and stores.


def _tile_load_macros(T, bf16, wpc, rows_per_thread, num_rows, hidden):
    """(load_rows, amax_of_rows): a thread's chunk in its rows, and the per-column amax over them."""

    @T.macro
    def load_rows(x, xw, words, vec, row0, col0):
        # words[i] <- the chunk (row0 + i, col0 .. col0 + 7), zeros past T or H; every load is issued
        # before any use (no value is read until the amax pass)
        for i in T.unroll(rows_per_thread):
            for v in T.unroll(wpc):
                words[i, v] = _u(T, 0)
        for i in T.unroll(rows_per_thread):
            if vec != 0:
                # H % 8 == 0: a chunk is all in or all out; chunk (row, col0 / 8) is 16 * wpc / 4 bytes at
                # word (row * H / 8 + col0 / 8) * wpc of the flat view
                if row0 + i < num_rows and col0 < hidden:
                    for v in T.vectorized(wpc):
                        words[i, v] = T.Cast("uint32", xw[((row0 + i) * (hidden >> 3) + (col0 >> 3)) * wpc + v])
            elif row0 + i < num_rows:
                for e in T.unroll(CHUNK):
                    if col0 + e < hidden:
                        if bf16:
                            words[i, e // 2] = words[i, e // 2] | (
                                T.Cast("uint32", T.Cast("uint16", x[row0 + i, col0 + e])) << _u(T, 16 * (e % 2)))
                        else:
                            words[i, e] = T.Cast("uint32", x[row0 + i, col0 + e])

    @T.macro
    def amax_of_rows(words, cam):
        # cam <- per-column |x| bits maxima over the thread's rows (integer order: NaN above inf)
        for v in T.unroll(wpc):
            cam[v] = _u(T, 0)
        for i in T.unroll(rows_per_thread):
            for v in T.unroll(wpc):
                if bf16:
                    cam[v] = T.call_extern("uint32", "tkq_vmaxu2", cam[v], words[i, v] & _u(T, 0x7FFF7FFF))
                else:
                    cam[v] = T.max(cam[v], words[i, v] & _u(T, 0x7FFFFFFF))

    return load_rows, amax_of_rows


def _tile_scale_macros(T, bf16, threads, tile_cols, tile_cols_log2, tile_rows_log2, rows_log2, slots, scale_macros,
                       num_rows, hidden):
    """(publish_amax, scales_of_tile, given_scales_of_tile, chunk_scales): each block's amax and sf (computed,
    or read from a given sf), through shared memory."""
    scale_of, read_scale, write_scale = scale_macros

    def column_amax(cam, p, h):
        """amax bits of column 2p + h of the chunk over the thread's rows (bf16: cam holds halfword maxima)."""
        if bf16:
            if h == 0:
                return (cam[p] & _u(T, 0xFFFF)) << _u(T, 16)
            return cam[p] & _u(T, 0xFFFF0000)
        return cam[2 * p + h]

    def chunk_amax(cam):
        """amax bits of the whole chunk over the thread's rows."""
        if bf16:
            m = T.call_extern("uint32", "tkq_vmaxu2", T.call_extern("uint32", "tkq_vmaxu2", cam[0], cam[1]),
                              T.call_extern("uint32", "tkq_vmaxu2", cam[2], cam[3]))
            return T.max(m & _u(T, 0xFFFF), m >> _u(T, 16)) << _u(T, 16)
        m = cam[0]
        for e in range(1, CHUNK):
            m = T.max(m, cam[e])
        return m

    @T.macro
    def publish_amax(red, cam, col_amax, bk_log2, group, lane):
        # red[group, slot] <- this row group's amax of each block slot of the tile (a slot is a
        # column for bk = 1, else a block of bk columns, reduced over its bk / 8 lanes by shuffles)
        if bk_log2 == 0:
            for p in T.unroll(CHUNK // 2):
                col_amax[2 * p] = column_amax(cam, p, 0)
                col_amax[2 * p + 1] = column_amax(cam, p, 1)
            for e in T.vectorized(CHUNK):
                red[group * tile_cols + lane * CHUNK + e] = col_amax[e]
        else:
            m = T.alloc_var("uint32", init=chunk_amax(cam))
            for s in T.unroll(5):
                if s < bk_log2 - 3:  # bk / 8 lanes, consecutive in the warp
                    m = T.max(m, T.shfl_xor(m, 1 << s))
            if ((lane * CHUNK) & ((1 << bk_log2) - 1)) == 0:
                red[group * tile_cols + ((lane * CHUNK) >> bk_log2)] = m

    @T.macro
    def scales_of_tile(red, sst, sf32, sf8, tile_row, tile_col, tx, bm_log2, bk_log2, block_row0, s0, s1, sf_mode,
                       round_sf, clamp_bits, amax, st1, ue1):
        # One thread per block of the tile: its amax over the block's row groups, its sf (written to
        # the sf storage, and with 1 / sf and the correction factor to sst for the quantise pass)
        slots_log2 = tile_cols_log2 - bk_log2  # block slots per row group
        groups_log2 = bm_log2 - rows_log2  # row groups per block row
        blocks = 1 << (tile_rows_log2 - bm_log2 + slots_log2)  # blocks of the tile: block row b, slot j
        for it in T.serial(T.ceildiv(blocks, threads)):
            p = it * threads + tx
            if p < blocks:
                b = p >> slots_log2
                j = p & ((1 << slots_log2) - 1)
                amax[0] = _u(T, 0)
                for k in T.serial(1 << groups_log2):
                    amax[0] = T.max(amax[0], red[((b << groups_log2) + k) * tile_cols + j])
                scale_of(amax[0], round_sf, clamp_bits, st1, ue1)
                sst[p] = st1[0]
                sst[slots + p] = st1[1]
                sst[2 * slots + p] = st1[2]
                first_row = tile_row * BLOCK_TILE_ROWS + (b << bm_log2)
                first_col = tile_col * tile_cols + (j << bk_log2)
                if first_row < num_rows and first_col < hidden:
                    write_scale(sf32, sf8, sf_mode, block_row0 + (first_row >> bm_log2), first_col >> bk_log2, s0, s1,
                                st1, ue1)

    @T.macro
    def given_scales_of_tile(sst, sf32, sf8, tile_row, tile_col, tx, bm_log2, bk_log2, block_row0, s0, s1, sf_mode,
                             st1, ue1):
        # One thread per block of the tile: its given sf, read from the sf storage into sst (blocks past T
        # or H, whose elements are never stored, get 0)
        slots_log2 = tile_cols_log2 - bk_log2
        blocks = 1 << (tile_rows_log2 - bm_log2 + slots_log2)
        for it in T.serial(T.ceildiv(blocks, threads)):
            p = it * threads + tx
            if p < blocks:
                first_row = tile_row * BLOCK_TILE_ROWS + ((p >> slots_log2) << bm_log2)
                first_col = tile_col * tile_cols + ((p & ((1 << slots_log2) - 1)) << bk_log2)
                st1[0] = T.float32(0)
                if first_row < num_rows and first_col < hidden:
                    read_scale(sf32, sf8, sf_mode, block_row0 + (first_row >> bm_log2), first_col >> bk_log2, s0, s1,
                               st1, ue1)
                sst[p] = st1[0]

    @T.macro
    def chunk_scales(sst, stv, st, bm_log2, bk_log2, group, lane):
        # st[e] <- (sf, 1 / sf, correction) of column e of the thread's chunk, from sst
        base = ((group >> (bm_log2 - rows_log2)) << (tile_cols_log2 - bk_log2))  # the thread's block row
        if bk_log2 == 0:
            for j in T.unroll(3):
                for e in T.vectorized(CHUNK):
                    stv[j, e] = sst[j * slots + base + lane * CHUNK + e]
        else:
            for j in T.unroll(3):
                for e in T.unroll(CHUNK):
                    stv[j, e] = sst[j * slots + base + ((lane * CHUNK) >> bk_log2)]
        for e in T.unroll(CHUNK):
            for j in T.unroll(3):
                st[e, j] = stv[j, e]

    return publish_amax, scales_of_tile, given_scales_of_tile, chunk_scales


def _tile_store_macros(T, fmt, bf16, rows_per_thread, dpc, num_rows, hidden, precomputed):
    """store_rows: the quotients of a thread's rows, their codes, and the stores of the data."""

    @T.macro
    def quotient(v, st, q, i):
        if precomputed:
            q[i] = T.ieee_fdiv(v, st[i, 0])
        else:
            q0 = T.ieee_mul(v, st[i, 1])
            q[i] = T.ieee_fmaf(-T.ieee_fmaf(q0, st[i, 0], -v), st[i, 2], q0)

    # Element 2p + h of a chunk (h = 0, 1 static: a loop variable cannot pick a Python branch) is, in
    # bf16, half h of word p.
    def value(words, i, p, h):
        """fp32 value of element 2p + h of the chunk of row i."""
        if bf16:
            if h == 0:
                return _f32(T, words[i, p] << _u(T, 16))
            return _f32(T, words[i, p] & _u(T, 0xFFFF0000))
        return _f32(T, words[i, 2 * p + h])

    @T.macro
    def encode(words, i, st, q, out):
        # out <- the data words of row i's chunk (codes in column order, little-endian bytes)
        for p in T.unroll(CHUNK // 2):
            quotient(value(words, i, p, 0), st, q, 2 * p)
            quotient(value(words, i, p, 1), st, q, 2 * p + 1)
        if fmt == "e4m3":
            for w in T.unroll(2):
                out[w] = T.call_extern("uint32", "tkq_e4m3x2", q[4 * w], q[4 * w + 1]) | (
                    T.call_extern("uint32", "tkq_e4m3x2", q[4 * w + 2], q[4 * w + 3]) << _u(T, 16))
        else:
            # disjoint bit fields: sums (the byte of columns 2p, 2p + 1 is nibble(2p) | nibble(2p + 1) << 4)
            pairs = [_e2m1_nibble(T, q[2 * p]) + _e2m1_nibble(T, q[2 * p + 1]) * _u(T, 16) for p in range(4)]
            out[0] = (pairs[0] + pairs[1] * _u(T, 256)) + (pairs[2] + pairs[3] * _u(T, 256)) * _u(T, 65536)

    @T.macro
    def store_rows(data, dw, words, st, q, out, vec, row0, col0):
        for i in T.unroll(rows_per_thread):
            encode(words, i, st, q, out)
            if vec != 0:
                if row0 + i < num_rows and col0 < hidden:
                    for v in T.vectorized(dpc):
                        dw[((row0 + i) * (hidden >> 3) + (col0 >> 3)) * dpc + v] = T.Cast("int32", out[v])
            elif row0 + i < num_rows:
                if fmt == "e4m3":
                    for e in T.unroll(CHUNK):
                        if col0 + e < hidden:
                            data[row0 + i, col0 + e] = T.Cast(
                                "uint8", (out[e // 4] >> _u(T, 8 * (e % 4))) & _u(T, 0xFF))
                else:
                    for p in T.unroll(CHUNK // 2):
                        if col0 + 2 * p < hidden:  # H is even: the pair's second column is there too
                            data[row0 + i, (col0 >> 1) + p] = T.Cast("uint8", (out[0] >> _u(T, 8 * p)) & _u(T, 0xFF))

    return store_rows


def build_block_cast(config: BlockConfig):
    """prim_func of per_block_cast / per_channel_cast: blocks of bm x bk, bm in {16, 32, 64, 128}, bk in {1, 32, 128}.

    Arguments: x (T, H) raw bits and data bytes (T, width) for the element path; xw / dw, the
    same memory as flat int32 words for the vector path (vec = 1: H % 8 == 0, x 16-byte and
    data 8-byte aligned; else one-element placeholders); the sf views; log2 bm, log2 bk; the
    tile columns per tile row; the sf row of the launch's first block row; the sf options;
    with_data (0: sf only, no data written).  With config.precomputed the sf views are the
    given sf, read (round_sf and clamp_min unused).
    """
    T = _tilelang.T()
    dtype, fmt, threads, rows_per_thread, min_blocks, precomputed = config
    groups, lanes, tile_cols = block_geometry(config)
    raw = RAW_INPUT[dtype]
    bf16 = dtype == "bfloat16"
    wpc = WORDS_PER_CHUNK[dtype]  # input words per chunk
    dpc = DATA_WORDS_PER_CHUNK[fmt]  # data words per chunk
    lanes_log2 = lanes.bit_length() - 1
    tile_rows_log2 = BLOCK_TILE_ROWS.bit_length() - 1
    tile_cols_log2 = tile_cols.bit_length() - 1
    rows_log2 = rows_per_thread.bit_length() - 1
    slots = (BLOCK_TILE_ROWS // BLOCK_MIN_BM) * tile_cols  # blocks a tile can hold (bm = 16, bk = 1)
    scale_macros = _scale_macros(T, fmt)
    num_rows, hidden, width, n_xw, n_dw, n_s32, n_s8 = T.dynamic("num_rows, hidden, width, n_xw, n_dw, n_s32, n_s8")

    load_rows, amax_of_rows = _tile_load_macros(T, bf16, wpc, rows_per_thread, num_rows, hidden)
    publish_amax, scales_of_tile, given_scales_of_tile, chunk_scales = _tile_scale_macros(
        T, bf16, threads, tile_cols, tile_cols_log2, tile_rows_log2, rows_log2, slots, scale_macros, num_rows, hidden)
    store_rows = _tile_store_macros(T, fmt, bf16, rows_per_thread, dpc, num_rows, hidden, precomputed != 0)

    @T.prim_func
    def block_cast(
        x: T.Tensor((num_rows, hidden), raw),
        data: T.Tensor((num_rows, width), "uint8"),
        xw: T.Tensor((n_xw,), "int32"),
        dw: T.Tensor((n_dw,), "int32"),
        sf32: T.Tensor((n_s32,), "float32"),
        sf8: T.Tensor((n_s8,), "uint8"),
        vec: T.int32,
        bm_log2: T.int32,
        bk_log2: T.int32,
        col_tiles: T.int32,
        block_row0: T.int32,
        s0: T.int64,
        s1: T.int64,
        sf_mode: T.int32,
        round_sf: T.int32,
        clamp_min: T.float32,
        with_data: T.int32,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(T.ceildiv(num_rows, BLOCK_TILE_ROWS) * col_tiles, threads=threads, prelude=PRELUDE) as cta:
            T.annotate_min_blocks_per_sm(min_blocks)
            tx = T.get_thread_binding()
            words = T.alloc_local((rows_per_thread, wpc), "uint32")
            cam = T.alloc_local((wpc,), "uint32")
            col_amax = T.alloc_local((CHUNK,), "uint32")
            stv = T.alloc_local((3, CHUNK), "float32")
            st = T.alloc_local((CHUNK, 3), "float32")
            amax = T.alloc_local((1,), "uint32")
            st1 = T.alloc_local((3,), "float32")
            ue1 = T.alloc_local((1,), "uint32")
            q = T.alloc_local((CHUNK,), "float32")
            out = T.alloc_local((dpc,), "uint32")
            red = T.alloc_shared((groups * tile_cols,), "uint32")
            sst = T.alloc_shared((3 * slots,), "float32")
            tile_row = T.alloc_var("int32", init=cta // col_tiles)
            tile_col = T.alloc_var("int32", init=cta % col_tiles)
            group = tx >> lanes_log2
            lane = tx & (lanes - 1)
            row0 = tile_row * BLOCK_TILE_ROWS + group * rows_per_thread
            col0 = tile_col * tile_cols + lane * CHUNK
            load_rows(x, xw, words, vec, row0, col0)
            if precomputed != 0:
                given_scales_of_tile(sst, sf32, sf8, tile_row, tile_col, tx, bm_log2, bk_log2, block_row0, s0, s1,
                                     sf_mode, st1, ue1)
            else:
                amax_of_rows(words, cam)
                publish_amax(red, cam, col_amax, bk_log2, group, lane)
                T.sync_threads()
                scales_of_tile(red, sst, sf32, sf8, tile_row, tile_col, tx, bm_log2, bk_log2, block_row0, s0, s1,
                               sf_mode, round_sf, _bits(T, clamp_min), amax, st1, ue1)
            T.sync_threads()
            if with_data != 0:
                chunk_scales(sst, stv, st, bm_log2, bk_log2, group, lane)
                store_rows(data, dw, words, st, q, out, vec, row0, col0)

    return block_cast


BLOCK_CAST = KernelDef("quant.block_cast", build_block_cast, BLOCK_CONFIGS + BLOCK_TUNE_CONFIGS,
                       candidates=BLOCK_TUNE_CONFIGS)


# ------------------------------------------------------------------ host side


def _block_vectors(x: torch.Tensor) -> bool:
    """Whether block_cast takes the vector path for x: rows of whole 16-byte chunks (H % 8 == 0)
    whose tile of BLOCK_TILE_ROWS rows fits a launch.  Else the element path (odd H in
    per_channel_cast, e2m1's H = 2 mod 8, rows too long for int32 flat views)."""
    hidden = x.shape[1]
    return hidden % CHUNK == 0 and hidden * BLOCK_TILE_ROWS <= BLOCK_MAX_ELEMENTS_PER_LAUNCH


def _launch_blocks(x: torch.Tensor, data: torch.Tensor | None, sf: torch.Tensor, fmt: str, bm: int, bk: int,
                   round_sf: bool, clamp_min: float, precomputed: bool = False) -> None:
    """block_cast over x (T, H) in blocks of bm x bk (bk in {1, 32, 128}), in pieces of whole tile rows.

    data None: sf only (nothing but the sf written).  precomputed: sf is the given sf, read.  A piece
    is at most MAX_BLOCKS_PER_LAUNCH CTAs, and on the vector path at most
    BLOCK_MAX_ELEMENTS_PER_LAUNCH elements (its flat int32 views have int32 sizes).
    """
    device = x.device
    num_rows, hidden = x.shape
    config = block_config(IN_DTYPES[x.dtype], fmt, precomputed)
    _, _, tile_cols = block_geometry(config)
    kernel = _tilelang.kernel_for(BLOCK_CAST, config, device)
    args = _sf_args(sf)
    col_tiles = -(-hidden // tile_cols)
    tiles_per_launch = max(1, _tilelang.MAX_BLOCKS_PER_LAUNCH // col_tiles)
    vec = _block_vectors(x)
    if vec:
        x = _tilelang.aligned(x, VECTOR_BYTES)  # data is a fresh allocation: aligned
        tiles_per_launch = min(tiles_per_launch, BLOCK_MAX_ELEMENTS_PER_LAUNCH // (hidden * BLOCK_TILE_ROWS))
    raw = x.view(torch.int16) if x.dtype == torch.bfloat16 else x.view(torch.int32)
    with_data = data is not None
    # sf only: a one-column stand-in of x's rows for the data argument (the kernel stores nothing)
    data8 = data.view(torch.uint8) if with_data else torch.empty((num_rows, 1), dtype=torch.uint8, device=device)
    no_words = _tilelang.placeholder(torch.int32, device)
    rows_per_launch = tiles_per_launch * BLOCK_TILE_ROWS  # a multiple of bm: blocks stay whole
    with _tilelang.device_guard(device):
        for r0 in range(0, num_rows, rows_per_launch):
            r1 = min(num_rows, r0 + rows_per_launch)
            xw = _words(x[r0:r1]) if vec else no_words
            dw = _words(data[r0:r1]) if vec and with_data else no_words
            kernel(raw[r0:r1], data8[r0:r1], xw, dw, args.flat_f32, args.flat_u8, int(vec), bm.bit_length() - 1,
                   bk.bit_length() - 1, col_tiles, r0 // bm, args.s0, args.s1, args.mode, int(round_sf), clamp_min,
                   int(with_data))


def _check_kernel_x(x: torch.Tensor) -> None:
    """What the kernel adds to the eager checks: dense rows, CUDA, int32 dimensions."""
    check_dense_rows("x", x)
    _tilelang.require_cuda("x", x)
    _tilelang.check_dims_fit_int32("x", x)


def _per_block(x: torch.Tensor, fmt: str, block: tuple[int, int], round_sf: bool, use_ue8m0: bool,
               use_packed_ue8m0: bool, col_major: bool, clamp_min: float,
               with_data: bool) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(data or None, sf) of a checked x in bm x bk blocks."""
    num_rows, hidden = x.shape
    bm, bk = block
    sf = _new_sf(-(-num_rows // bm), hidden // bk, use_ue8m0, use_packed_ue8m0, col_major, x.device)
    data = _new_data(num_rows, hidden, fmt, x.device) if with_data else None
    if num_rows:
        _launch_blocks(x, data, sf, fmt, bm, bk, round_sf, clamp_min)
    return data, sf


def per_block_cast(x: torch.Tensor, fmt: str = "e4m3", block: tuple[int, int] | list[int] = (128, 128), *,
                   round_sf: bool = False, use_ue8m0: bool = False, use_packed_ue8m0: bool = False,
                   use_tma_aligned_col_major_sf: bool = False,
                   clamp_min: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, sf) of x (T, H) quantised in 2-D blocks of bm x bk (sf (ceil(T/bm), H/bk))."""
    fmt, block, cm = eager._check_per_block_args(x, fmt, block, round_sf, use_ue8m0, use_packed_ue8m0,
                                                 use_tma_aligned_col_major_sf, clamp_min)
    _check_kernel_x(x)
    return _per_block(x, fmt, block, round_sf, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf, cm, True)


def per_block_cast_with_sf_only(x: torch.Tensor, fmt: str = "e4m3", block: tuple[int, int] | list[int] = (128, 128),
                                *, round_sf: bool = False, use_ue8m0: bool = False, use_packed_ue8m0: bool = False,
                                use_tma_aligned_col_major_sf: bool = False,
                                clamp_min: float | None = None) -> torch.Tensor:
    """The sf per_block_cast would return, without the data (x is read once, nothing else written)."""
    fmt, block, cm = eager._check_per_block_args(x, fmt, block, round_sf, use_ue8m0, use_packed_ue8m0,
                                                 use_tma_aligned_col_major_sf, clamp_min)
    _check_kernel_x(x)
    return _per_block(x, fmt, block, round_sf, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf, cm,
                      False)[1]


def per_block_cast_with_precomputed_sf(x: torch.Tensor, sf: torch.Tensor, fmt: str = "e4m3",
                                       block: tuple[int, int] | list[int] = (128, 128)) -> torch.Tensor:
    """The data of x (T, H) quantised in bm x bk blocks with a given sf (ceil(T/bm), H/bk) of any storage
    (fp32, ue8m0 bytes, packed ue8m0) and strides."""
    fmt, (bm, bk) = eager._check_block_precomputed_args(x, sf, fmt, block)
    _check_kernel_x(x)
    _tilelang.check_dims_fit_int32("sf", sf)
    num_rows, hidden = x.shape
    data = _new_data(num_rows, hidden, fmt, x.device)
    if num_rows:
        _launch_blocks(x, data, sf, fmt, bm, bk, False, 1.0, precomputed=True)
    return data


def per_channel_cast(x: torch.Tensor, fmt: str = "e4m3", num_per_tokens: int = 128, *, round_sf: bool = False,
                     use_ue8m0: bool = False, use_packed_ue8m0: bool = False,
                     use_tma_aligned_col_major_sf: bool = False,
                     clamp_min: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, sf) of x (T, H) quantised in blocks of num_per_tokens x 1 (sf (ceil(T/npt), H))."""
    fmt, n, cm = eager._check_per_channel_args(x, fmt, num_per_tokens, round_sf, use_ue8m0, use_packed_ue8m0,
                                               use_tma_aligned_col_major_sf, clamp_min)
    _check_kernel_x(x)
    num_rows, hidden = x.shape
    sf = _new_sf(-(-num_rows // n), hidden, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf, x.device)
    data = _new_data(num_rows, hidden, fmt, x.device)
    if num_rows:
        _launch_blocks(x, data, sf, fmt, n, 1, round_sf, cm)
    return data, sf
