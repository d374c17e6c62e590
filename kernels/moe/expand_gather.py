"""expand_to_fused's gather for 16-byte rows: the order kernel, then a CTA a destination row.

The order kernel, a CTA a chunk of ORDER_SLOTS // K tokens: each pair with a row becomes
(pos << 32) + token, counted into its position bucket (ceil(N / ORDER_SLOTS) rows) with
shared-memory atomics; a scan of the counts places the chunk's pairs in bucket order, -1 after them.
It sets row_src too, so the map kernel is not launched.

The gather kernel: padding blocks first (8 rows each as shipped, zeroing those with row_src < 0), then
a CTA a slot of the order, which loads its token's whole row (7 units a thread) and stores it to its
row.  CTAs that run together then write neighbouring rows of a few experts instead of one row in each
of 256, and a source row's K loads fall within its chunk; the loads ask L2 to keep x (evict_last), the
stores to let out go first (evict_first).  Both halves are needed: in plain CUDA this pattern moves
3.87-3.90 TB/s against 3.61-3.68 for the row kernel's, where the order alone gains 1% and the hints
alone 2% (reports/evidence/moe.md#write-pattern).

The order inside a bucket is the atomics' and may change from call to call: it decides which CTA
writes a row when, never a byte.
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.
from .. import _tilelang
from .common import PASS_CONFIGS
from .expand_config import ExpandConfig

ORDER_SLOTS = 2048  # pairs whose rows the gather writes in position-bucket order: a chunk of ORDER_SLOTS // K tokens
ORDER_THREADS = 1024


def _build_expand_order():
    """order (chunks * ORDER_SLOTS,) int64: chunk c's pairs [c * chunk_pairs, (c + 1) * chunk_pairs) with a
    row (0 <= pos < N) as (pos << 32) + token, by position bucket (pos // bucket_rows, bucket_rows =
    ceil(N / ORDER_SLOTS): close to one pair a bucket), then -1 for the chunk's other slots; and
    row_src[pos] = token, the map kernel's job, for the pairs it reads.  32-bit arithmetic but for the key
    and the pair's flat index (a 64-bit division costs about 100 instructions).

    A counting sort, a CTA a chunk: shared-memory atomics count the buckets and give each pair its rank
    in its bucket, a scan of the counts gives each bucket's first slot.  The order inside a bucket is the
    atomics' and may change from call to call; it only says which CTA writes a row when, never a byte."""
    T = _tilelang.T()
    num_pairs, num_rows, num_order = T.dynamic("num_pairs, num_rows, num_order")
    per_thread = ORDER_SLOTS // ORDER_THREADS
    warps = ORDER_THREADS // 32
    assert per_thread == 2 and warps <= 32  # a thread scans its two buckets, warp 0 the warps' sums

    @T.prim_func
    def expand_order(
        token_topk_to_pos: T.Tensor((num_pairs,), "int32"),
        row_src: T.Tensor((num_rows,), "int32"),
        order: T.Tensor((num_order,), "int64"),
        num_slots: T.int32,
        chunk_pairs: T.int32,
        num_chunks: T.int32,
        bucket_rows: T.int32,
    ):
        T.annotate_pass_configs({**PASS_CONFIGS, "tl.disable_thread_storage_sync": True})
        with T.Kernel(num_chunks, threads=ORDER_THREADS) as chunk:
            tx = T.get_thread_binding()
            lane = tx % 32
            chunk_tokens = T.truncdiv(chunk_pairs, num_slots)
            first = T.alloc_shared((ORDER_SLOTS,), "int32")  # bucket counts, then each bucket's first slot
            sums = T.alloc_shared((warps + 1,), "int32")  # warps' first slots, then the chunk's count
            bucket = T.alloc_local((per_thread,), "int32")
            rank = T.alloc_local((per_thread,), "int32")
            key = T.alloc_local((per_thread,), "int64")
            scan = T.alloc_var("int32")
            up = T.alloc_var("int32")
            for h in T.unroll(per_thread):
                first[h * ORDER_THREADS + tx] = 0
            T.sync_threads()
            for h in T.unroll(per_thread):
                slot = h * ORDER_THREADS + tx
                pair = T.Cast("int64", chunk) * chunk_pairs + slot
                bucket[h] = -1
                if slot < chunk_pairs and pair < num_pairs:
                    if token_topk_to_pos[pair] >= 0 and token_topk_to_pos[pair] < num_rows:
                        token = chunk * chunk_tokens + T.truncdiv(slot, num_slots)
                        row_src[token_topk_to_pos[pair]] = token
                        key[h] = T.shift_left(T.Cast("int64", token_topk_to_pos[pair]), 32) + token
                        bucket[h] = T.truncdiv(token_topk_to_pos[pair], bucket_rows)
                        rank[h] = T.atomic_add(first[bucket[h]], 1, return_prev=True)
            T.sync_threads()
            # Exclusive scan of the counts: thread tx owns buckets 2 tx and 2 tx + 1.  The warp scans are
            # written out three times: a T.macro that assigns to a var it is passed rebinds the name instead
            # of storing to it (seen in the lowered CUDA), and the scan would be lost.
            scan = first[2 * tx] + first[2 * tx + 1]
            for d in T.unroll(5):
                up = T.shfl_up(scan, T.shift_left(1, d))
                if lane >= T.shift_left(1, d):
                    scan = scan + up
            if lane == 31:
                sums[tx // 32] = scan
            T.sync_threads()
            if tx < 32:
                up = 0
                if tx < warps:
                    up = sums[tx]
                scan = up
                for d in T.unroll(5):
                    up = T.shfl_up(scan, T.shift_left(1, d))
                    if lane >= T.shift_left(1, d):
                        scan = scan + up
                if tx < warps:
                    sums[tx] = scan - sums[tx]
                if tx == 31:
                    sums[warps] = scan
            T.sync_threads()
            scan = first[2 * tx] + first[2 * tx + 1]  # the thread's count again: its inclusive scan is gone
            for d in T.unroll(5):
                up = T.shfl_up(scan, T.shift_left(1, d))
                if lane >= T.shift_left(1, d):
                    scan = scan + up
            up = first[2 * tx]
            first[2 * tx] = sums[tx // 32] + scan - up - first[2 * tx + 1]
            first[2 * tx + 1] = first[2 * tx] + up
            T.sync_threads()
            for h in T.unroll(per_thread):
                if bucket[h] >= 0:
                    order[T.Cast("int64", chunk) * ORDER_SLOTS + first[bucket[h]] + rank[h]] = key[h]
                if h * ORDER_THREADS + tx >= sums[warps]:
                    order[T.Cast("int64", chunk) * ORDER_SLOTS + h * ORDER_THREADS + tx] = T.int64(-1)

    return expand_order


def _build_expand_gather(config: ExpandConfig):
    """out[pos] = x[token] for each slot's (pos << 32) + token of order, a CTA a slot (a whole row, tiles of
    threads * units units, each thread's units loaded before they are stored), after the padding blocks
    (first, so that the heavy ones, a whole expert's padding, do not make the grid's tail); 16-byte units."""
    T = _tilelang.T()
    threads, units, hinted, pad_rows = config.threads, config.units, config.streaming, config.pad_rows
    assert config.stage == "gather" and config.width == 16, config
    span = threads * units
    num_tokens, num_units, num_rows, num_order = T.dynamic("num_tokens, num_units, num_rows, num_order")

    @T.macro
    def load(unit_bits, j, x, token, u):
        if hinted:
            T.call_extern("handle", _tilelang.LOAD16_KEEP, T.address_of(unit_bits[j * 4]),
                          T.address_of(x[token, u * 4]))
        else:
            for v in T.vectorized(4):
                unit_bits[j * 4 + v] = x[token, u * 4 + v]

    @T.macro
    def store(out, row, u, unit_bits, j):
        if hinted:
            T.call_extern("handle", _tilelang.STORE16_PASS, T.address_of(out[row, u * 4]),
                          T.address_of(unit_bits[j * 4]))
        else:
            for v in T.vectorized(4):
                out[row, u * 4 + v] = unit_bits[j * 4 + v]

    @T.prim_func
    def expand_gather(
        x: T.Tensor((num_tokens, num_units * 4), "int32"),
        order: T.Tensor((num_order,), "int64"),
        row_src: T.Tensor((num_rows,), "int32"),
        out: T.Tensor((num_rows, num_units * 4), "int32"),
        num_blocks: T.int32,
        block_offset: T.int64,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        tiles = T.ceildiv(num_units, span)
        pad_blocks = T.ceildiv(T.Cast("int64", num_rows), pad_rows) * tiles
        with T.Kernel(num_blocks, threads=threads,
                      prelude=_tilelang.L2_HINTS_PRELUDE if hinted else None) as block:
            tx = T.get_thread_binding()
            logical = T.alloc_var("int64", init=block_offset + block)
            unit_bits = T.alloc_local((units * 4,), "int32")
            if logical >= pad_blocks:
                key = T.alloc_var("int64", init=order[logical - pad_blocks])
                row = T.Cast("int32", T.shift_right(key, 32))
                token = T.bitwise_and(key, 0xFFFFFFFF)
                if key >= 0 and row < num_rows:
                    for tile in T.serial(tiles):
                        for j in T.unroll(units):
                            if tile * span + j * threads + tx < num_units:
                                load(unit_bits, j, x, token, tile * span + j * threads + tx)
                        for j in T.unroll(units):
                            if tile * span + j * threads + tx < num_units:
                                store(out, row, tile * span + j * threads + tx, unit_bits, j)
            else:
                # Padding block: one tile of the rows [first, first + pad_rows) that no pair reaches, their
                # row_src read first, all in flight (the stores' asm would otherwise hold each load back).
                first = T.truncdiv(logical, tiles) * pad_rows
                first_unit = T.Cast("int32", T.truncmod(logical, tiles)) * span + tx
                sources = T.alloc_local((pad_rows,), "int32")
                for r in T.unroll(pad_rows):
                    sources[r] = 0
                    if first + r < num_rows:
                        sources[r] = row_src[first + r]
                for v in T.vectorized(4):
                    unit_bits[v] = 0
                for r in T.unroll(pad_rows):
                    if sources[r] < 0:
                        for j in T.unroll(units):
                            if first_unit + j * threads < num_units:
                                store(out, first + r, first_unit + j * threads, unit_bits, 0)

    return expand_gather
