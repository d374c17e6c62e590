"""expand_to_fused's scatter kernels: the map kernel, the row kernel and its tuning variant, the sf-column kernel.

Map: row_src (N,) int32, filled with -1 by the wrapper, gets row_src[pos] = t for every pair whose
position is a row (0 <= pos < N).

Row kernel (a scatter): logical block (t, tile) loads a tile of row t of x once (one unit of 16, 4, 2
or 1 bytes per thread) and stores it to out[pos] for each of the token's K slots with 0 <= pos < N; so
x is read once and out written once.  Padding-row blocks (32 rows each) zero the rows with
row_src < 0, the rows no pair reaches.  Static configuration: the unit moved per thread access: 16
bytes (as int32x4) when the row length in bytes and x's address are multiples of 16, else 4, 2 or 1
bytes (the largest that divides both).  16-byte rows ship the gather instead (expand_config).

Its tuning variant (EXPAND_TUNE_CONFIGS): a tile of threads * units units, each thread loading its
`units` before storing them; optionally evict-first (st.global.cs) stores to out.  Padding blocks there
take one tile of their 32 rows each.  The bytes stored are the same.  Both store from registers: TMA
bulk stores of a tile staged in shared memory (one cp.async.bulk a slot) take 632-699 us eager
against 630 us for 2 units a thread (reports/evidence/moe.md#tma-bulk-stores).

SF columns: a TMA-aligned column-major x_sf, walked in out_sf's storage order (coalesced stores):
out_sf[r, g] = x_sf[row_src[r], g], zero bits for padding rows and for the alignment rows between N
and the padded column length.  Static configuration: the sf element width (1 or 4 bytes).
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.
from .. import _tilelang
from .common import MAX_K, PASS_CONFIGS
from .expand_config import EXPAND_THREADS, PAD_ROWS, RAW_DTYPES, ExpandConfig

MAP_THREADS = 256
SF_THREADS = 256


def _build_expand_map():
    T = _tilelang.T()
    num_pairs, num_rows = T.dynamic("num_pairs, num_rows")

    @T.prim_func
    def expand_map(
        token_topk_to_pos: T.Tensor((num_pairs,), "int32"),
        row_src: T.Tensor((num_rows,), "int32"),
        num_slots: T.int32,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(T.ceildiv(num_pairs, MAP_THREADS), threads=MAP_THREADS) as block:
            tx = T.get_thread_binding()
            pair = T.alloc_var("int64", init=T.Cast("int64", block) * MAP_THREADS + tx)
            if pair < num_pairs:
                pos = token_topk_to_pos[pair]
                if pos >= 0 and pos < num_rows:
                    row_src[pos] = T.Cast("int32", T.truncdiv(pair, num_slots))

    return expand_map


def _build_expand_rows(unit: int):
    T = _tilelang.T()
    threads = EXPAND_THREADS
    raw = "int32" if unit == 16 else RAW_DTYPES[unit]
    lanes = 4 if unit == 16 else 1
    num_tokens, num_units, num_rows, num_slots = T.dynamic("num_tokens, num_units, num_rows, num_slots")

    @T.prim_func
    def expand_rows(
        x: T.Tensor((num_tokens, num_units * lanes), raw),
        token_topk_to_pos: T.Tensor((num_tokens, num_slots), "int32"),
        row_src: T.Tensor((num_rows,), "int32"),
        out: T.Tensor((num_rows, num_units * lanes), raw),
        num_blocks: T.int32,
        block_offset: T.int64,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        tiles = T.ceildiv(num_units, threads)
        with T.Kernel(num_blocks, threads=threads) as block:
            tx = T.get_thread_binding()
            logical = T.alloc_var("int64", init=block_offset + block)
            positions = T.alloc_shared((MAX_K,), "int32")
            unit_bits = T.alloc_local((lanes,), raw)
            if logical < T.Cast("int64", num_tokens) * tiles:
                # Token block: one tile of row `token`, to each of its rows.
                token = T.alloc_var("int64", init=T.truncdiv(logical, tiles))
                u = T.alloc_var("int32", init=T.Cast("int32", T.truncmod(logical, tiles)) * threads + tx)
                # The row's load is issued before the positions' so that their latencies overlap.
                if u < num_units:
                    for v in T.vectorized(lanes):
                        unit_bits[v] = x[token, u * lanes + v]
                if tx < num_slots:
                    positions[tx] = token_topk_to_pos[token, tx]
                T.sync_threads()  # block-uniform branch
                if u < num_units:
                    for k in T.serial(num_slots):
                        if positions[k] >= 0 and positions[k] < num_rows:
                            for v in T.vectorized(lanes):
                                out[positions[k], u * lanes + v] = unit_bits[v]
            else:
                # Padding block: rows [first, first + PAD_ROWS) that no pair reaches become zero.
                first = T.alloc_var("int64", init=(logical - T.Cast("int64", num_tokens) * tiles) * PAD_ROWS)
                for j in T.unroll(PAD_ROWS):
                    if first + j < num_rows:
                        if row_src[first + j] < 0:
                            for tile in T.serial(tiles):
                                if tile * threads + tx < num_units:
                                    for v in T.vectorized(lanes):
                                        out[first + j, (tile * threads + tx) * lanes + v] = T.Cast(raw, 0)

    return expand_rows


def _build_expand_rows_tuned(config: ExpandConfig):
    """The row kernel with tuning knobs (EXPAND_TUNE_CONFIGS); the same bytes as _build_expand_rows.

    A tile is threads * units consecutive units; thread tx loads units tile_start + j * threads + tx
    (j < units, coalesced for each j), all before its first store.  Padding logical block p zeroes
    tile p % tiles of the rows [32 (p // tiles), + 32) that no pair reaches.
    """
    T = _tilelang.T()
    unit, threads, units, streaming = config.width, config.threads, config.units, config.streaming
    assert config.stage == "rows" and (unit == 16 or not streaming), config
    raw = "int32" if unit == 16 else RAW_DTYPES[unit]
    lanes = 4 if unit == 16 else 1
    span = threads * units  # units of a tile
    num_tokens, num_units, num_rows, num_slots = T.dynamic("num_tokens, num_units, num_rows, num_slots")

    @T.macro
    def move(x, token_topk_to_pos, row_src, out, positions, unit_bits, logical, tx, token_blocks, total, tiles):
        """Logical block `logical`: a token block's tile, or a padding block's (block-uniform branches)."""
        if logical < token_blocks:
            token = T.truncdiv(logical, tiles)
            first_unit = T.Cast("int32", T.truncmod(logical, tiles)) * span + tx
            for j in T.unroll(units):
                if first_unit + j * threads < num_units:
                    for v in T.vectorized(lanes):
                        unit_bits[j * lanes + v] = x[token, (first_unit + j * threads) * lanes + v]
            if tx < num_slots:
                positions[tx] = token_topk_to_pos[token, tx]
            T.sync_threads()
            for k in T.serial(num_slots):
                if positions[k] >= 0 and positions[k] < num_rows:
                    for j in T.unroll(units):
                        if first_unit + j * threads < num_units:
                            if streaming:
                                T.call_extern("handle", _tilelang.STORE16_STREAM,
                                              T.address_of(out[positions[k], (first_unit + j * threads) * 4]),
                                              T.address_of(unit_bits[j * 4]))
                            else:
                                for v in T.vectorized(lanes):
                                    out[positions[k], (first_unit + j * threads) * lanes + v] = unit_bits[j * lanes + v]
        elif logical < total:
            # Padding block: one tile of the rows [first, first + PAD_ROWS) that no pair reaches.
            pad = logical - token_blocks
            first = T.truncdiv(pad, tiles) * PAD_ROWS
            first_unit = T.Cast("int32", T.truncmod(pad, tiles)) * span + tx
            if streaming:  # the zeros the streaming store copies (a padding block loads no row)
                for v in T.vectorized(lanes):
                    unit_bits[v] = T.Cast(raw, 0)
            for r in T.unroll(PAD_ROWS):
                if first + r < num_rows:
                    if row_src[first + r] < 0:
                        for j in T.unroll(units):
                            if first_unit + j * threads < num_units:
                                if streaming:
                                    T.call_extern("handle", _tilelang.STORE16_STREAM,
                                                  T.address_of(out[first + r, (first_unit + j * threads) * 4]),
                                                  T.address_of(unit_bits[0]))
                                else:
                                    for v in T.vectorized(lanes):
                                        out[first + r, (first_unit + j * threads) * lanes + v] = T.Cast(raw, 0)

    @T.prim_func
    def expand_rows(
        x: T.Tensor((num_tokens, num_units * lanes), raw),
        token_topk_to_pos: T.Tensor((num_tokens, num_slots), "int32"),
        row_src: T.Tensor((num_rows,), "int32"),
        out: T.Tensor((num_rows, num_units * lanes), raw),
        num_blocks: T.int32,
        block_offset: T.int64,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        tiles = T.ceildiv(num_units, span)
        token_blocks = T.Cast("int64", num_tokens) * tiles
        total = token_blocks + T.ceildiv(T.Cast("int64", num_rows), PAD_ROWS) * tiles
        with T.Kernel(num_blocks, threads=threads,
                      prelude=_tilelang.STORE16_STREAM_PRELUDE if streaming else None) as block:
            tx = T.get_thread_binding()
            positions = T.alloc_shared((MAX_K,), "int32")
            unit_bits = T.alloc_local((units * lanes,), raw)
            move(x, token_topk_to_pos, row_src, out, positions, unit_bits, block_offset + block, tx, token_blocks,
                 total, tiles)

    return expand_rows


def _build_expand_sf_columns(width: int):
    T = _tilelang.T()
    raw = RAW_DTYPES[width]
    threads = SF_THREADS
    in_len, num_rows, num_cols, rows_padded = T.dynamic("in_len, num_rows, num_cols, rows_padded")

    @T.prim_func
    def expand_sf_columns(
        sf: T.Tensor((in_len,), raw),  # column-major storage: element (t, g) at g * in_stride + t
        row_src: T.Tensor((num_rows,), "int32"),
        out: T.Tensor((num_cols, rows_padded), raw),  # out_sf's storage: element (r, g) at [g, r]
        in_stride: T.int32,
        num_blocks: T.int32,
        block_offset: T.int64,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(num_blocks, threads=threads) as block:
            tx = T.get_thread_binding()
            element = T.alloc_var("int64", init=(block_offset + block) * threads + tx)
            src = T.alloc_var("int32", init=-1)
            col = T.alloc_var("int64", init=T.truncdiv(element, rows_padded))
            row = T.alloc_var("int64", init=T.truncmod(element, rows_padded))
            if col < num_cols:
                if row < num_rows:
                    src = row_src[row]
                if src >= 0:
                    out[col, row] = sf[col * in_stride + src]
                else:
                    out[col, row] = T.Cast(raw, 0)

    return expand_sf_columns
