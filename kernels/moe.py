"""MoE routing kernels in TileLang.

Signatures, return conventions and argument checks are those of
``kernels/torch/moe.py`` (its module docstring is the contract); each kernel's
design is described below, next to why it is exact.

topk_gate
---------
``topk_gate(scores, k)`` equals
``torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k]``.

One warp owns one row.  Every score is mapped to a 32-bit unsigned key whose
integer order is the order torch.sort (descending) uses (`_order_key`):

* non-negative x: bits + 0x80000000; negative x: -bits (mod 2**32), i.e.
  0x80000000 - |x|'s bits.  So -inf < finite < +inf, and -0.0 and +0.0 both
  map to 0x80000000: they compare equal (tie -> lower index);
* every NaN, whatever its sign or payload, becomes 0xFFFFFFFF, above +inf,
  because torch.sort puts NaN first when sorting descending (and, being one
  key, NaNs tie among themselves -> lower index first).

Every real key is >= key(-inf) = 0x00800000 > 0, so 0 marks "no element"
(padding past E, or an element already picked).

Lane l holds the keys of elements l, l + 32, l + 64, ... (coalesced loads) and
caches its own best (largest key, lowest index on ties: ascending scan with a
strict >).  Each of the k rounds then picks the row's best with two warp
reductions (redux.sync on sm_80+): the largest key among the lanes' cached
bests, then the smallest index among lanes whose cached key equals it.  That
element is the largest key with the lowest index, i.e. the next element of a
stable descending sort.  Its owner lane zeroes it and rescans.  Because k <= E,
each round still has an unpicked element with key > 0, so the k indices are
distinct and in [0, E).

The padded row width (32 .. 1024, a multiple of the warp size) is the only
static parameter; the number of rows, E and k are symbolic sizes.

group_count
-----------
Blocks of 256 threads take 2048 consecutive entries each (8 independent loads
per thread), count them into a shared histogram with integer atomics, and add
the non-zero bins to the zero-initialised global counts with integer atomics.
Integer addition is associative, so the result does not depend on the order
the atomics land in.  Entries are compared in their own width (an int64 entry
of 2**32 + 3 is not group 3).  Static configuration: the idx dtype.

fused_mapping
-------------
A deterministic counting sort of the P = T * K pairs, flat index i = t * K + k
(so flat order is (token, slot) order), in three kernels and one host sync:

1. count: the pairs are cut into chunks of ``chunk_batches * 256`` consecutive
   pairs, one warp per chunk.  The warp walks its chunk 32 pairs at a time in
   flat order and keeps a per-warp histogram in shared memory: bins 0..E-1
   for the experts, bin E for entries >= E (the error the host reports);
   negative entries are dropped.  In each group of 32, ``__match_any_sync``
   gives every lane the lanes holding the same bin; the lowest of them adds
   the group's count to the bin (one writer per bin, __syncwarp between
   groups), so no atomics are involved.  The warp writes its whole histogram
   row, zeros included, to counts[chunk, 0..E].
2. scan (one block of 1024 threads): thread e turns column e into exclusive
   prefix sums over the chunks, in place (counts[c, e] becomes the number of
   pairs of expert e in chunks before c), and gets the expert's total.  The
   aligned totals are scanned across experts (Hillis-Steele in shared memory)
   into expert_start / expert_end, and meta = (N, number of entries >= E).
3. (host) N and the error count are read back: the one device-to-host sync.
   pos_to_token / pos_to_token_topk are allocated with N rows, filled with -1.
4. place: the same warp-per-chunk walk.  Each warp seeds its shared counters
   with expert_start[e] + counts[chunk, e]; a lane's position is the counter
   of its expert plus the number of lower lanes of its group with the same
   expert (popc of the match mask below the lane); the lowest such lane then
   advances the counter by the group's count.  So a pair's position is
   expert_start[e] + (number of pairs with expert e at a lower flat index),
   exactly the stable order, whatever the chunk size and whatever order the
   warps and blocks run in: every value is computed, never raced for.
   token_topk_to_pos is written for every pair (-1 for dropped ones).

The chunk size only moves work between the scan (serial over chunks) and the
walks (serial over a chunk); `fused_mapping` picks it from P, and tests run
other sizes through `_fused_mapping` to check the layout does not change.

expand_to_fused
---------------
Moving bits, as raw integers:

1. row_src (N,) int32 is filled with -1 and a map kernel sets
   row_src[pos] = t for every pair whose position is a row (0 <= pos < N).
2. the row kernel (a scatter): logical block (t, tile) loads a tile of row t
   of x once (one unit of 16, 4, 2 or 1 bytes per thread) and stores it to
   out[pos] for each of the token's K slots with 0 <= pos < N; so x is read
   once and out written once.  Padding-row blocks (32 rows each) zero
   the rows with row_src < 0, the rows no pair reaches.
   Static configuration: the unit moved per thread access: 16 bytes (as
   int32x4) when the row length in bytes and x's address are multiples of 16,
   else 4, 2 or 1 bytes (the largest that divides both).
   Tuning candidates of the 16-byte kernel (`EXPAND_TUNE_CONFIGS`, not used unless
   `EXPAND_OVERRIDES` names one; benchmarks/tune.py times them): a tile of threads * units
   units, each thread loading its `units` before storing them; evict-first (st.global.cs)
   stores to out.  Padding logical blocks there take one tile of their 32 rows each.  The
   bytes stored are the same.  (Gone after losing: a persistent grid of whole-row CTAs, by
   11% in H200 runs 14 and 16, 719.6 and 712.6 us against 653.7 and 643.7 shipped; TMA bulk
   stores of a tile staged in shared memory, one cp.async.bulk a slot, four geometries at
   632-699 us eager and 649-716 us graph in runs 24 and 25 against 630 / 631 for 2 units a
   thread; the padding blocks launched first, 631-641 / 701-707 us in run 25; the gather asking
   for 12 or 16 CTAs an SM, 623.3 and 1112.1 us graph in run 48 against 600.7, the registers
   spilled.)
   What the 16-byte kernel ships instead (EXPAND_SHIPPED) is the gather, steps 2a-2b.
2a. the order kernel, a CTA a chunk of ORDER_SLOTS // K tokens: each pair with a row
   becomes (pos << 32) + token, counted into its position bucket (ceil(N / ORDER_SLOTS) rows)
   with shared-memory atomics; a scan of the counts places the chunk's pairs in bucket order,
   -1 after them.  It sets row_src too, so the map kernel is not launched.
2b. the gather kernel: padding blocks first (8 rows each, zeroing those with row_src < 0),
   then a CTA a slot of the order, which loads its token's whole row (7 units a thread) and
   stores it to its row.  CTAs that run together then write neighbouring rows of a few
   experts instead of one row in each of 256, and a source row's K loads fall within its
   chunk; the loads ask L2 to keep x (evict_last), the stores to let out go first
   (evict_first).  scripts/write_rate.cu measured the pattern (H200 runs 35-41: 3.87-3.90
   TB/s against 3.61-3.68 for the row kernel's); graph replay in H200 run 48 (fef8b5a): 601.1
   us in tkverify bench, 93% of copy, and 600.7 us in benchmarks/tune.py against 631.7 us for
   the row kernel of 2 units a thread.
   The order inside a bucket is the atomics' and may change from call to call: it decides
   which CTA writes a row when, never a byte.
3. sf rows: a row-major x_sf is one more call of the row kernel, or of the gather (with the
   same order) where its rows are 16-byte units (it is a (T, G) matrix like x).  A TMA-aligned
   column-major x_sf goes through a gather kernel that walks out_sf's storage in order (coalesced stores):
   out_sf[r, g] = x_sf[row_src[r], g], zero bits for padding rows and for the
   alignment rows between N and the padded column length.
   Static configuration: the sf element width (1 or 4 bytes).

reduce_fused
------------
A gather: logical block (t, tile) stages the token's K positions and weights
(and, for e4m3, the K row scales) in shared memory; each thread owns one
16-byte vector of columns (8 bf16, 4 fp32 or 16 e4m3 values) or, in the
fallback, one column.  It loads the rows of up to 8 slots at once (only
slots with 0 <= pos < N), then adds their terms in slot order:
acc = __fadd_rn(acc, __fmul_rn(w, x)) from acc = +0, with x = __fmul_rn(q, sf)
for e4m3.  The _rn intrinsics are never contracted into an FMA, so every
product and every sum is rounded once, as in the eager PyTorch
implementation, which this kernel matches bit for bit (NaN payloads aside:
the bf16 conversion, cvt.rn.bf16.f32, returns the canonical NaN).  One final
round-to-nearest-even conversion to the output dtype.
Static configuration: x dtype and vectorized (H a multiple of the vector and
16-byte aligned rows) or not.

normalize_weight
----------------
One thread per token: denom = __fadd_rn over the slots from +0, then
__fadd_rn(denom, 1e-20f) (the float nearest 1e-20, as torch rounds the
python scalar), weights = __fdiv_rn(w, denom): IEEE division, whatever nvcc's
-prec-div setting.

Large launches: grids are 1-D; kernels whose block count can exceed 2**31 - 1
take (num_blocks, block_offset) and the wrappers launch them in pieces.
All global accesses are guarded explicitly (tilelang's own bounds
legalisation is disabled, as in kernels/transpose.py, because it would add
per-lane checks that block vectorization).
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.
import math
import struct
from typing import NamedTuple

import torch

from . import _tilelang
from ._tilelang import KernelDef, tuning_only

MAX_EXPERTS = 1024
MAX_K = 32
WARP = 32
WARPS_PER_BLOCK = 4
# Row counts above this are processed in chunks (rows are int32 inside the kernel).
MAX_ROWS_PER_LAUNCH = 2**30

NAN_KEY = 0xFFFFFFFF
NO_KEY = 0


class TopkGateConfig(NamedTuple):
    width: int  # scores row length padded up to this (a multiple of 32)


WIDTHS = (32, 64, 128, 256, 512, 1024)
STATIC_CONFIGS = tuple(TopkGateConfig(width) for width in WIDTHS)


def _order_key(T, bits):
    """uint32 key of the float32 with IEEE bits `bits` (a uint32 variable).

    Its unsigned order is torch.sort's order.  Integer ops on the raw bits
    only, so no compiler flag about NaN or signed zeros can change it.
    Negative x: key = -bits (mod 2**32) = 0x80000000 - |x| bits, so -0.0
    lands on 0x80000000 like +0.0 and key(-inf) = 0x00800000.  Non-negative
    x: key = bits + 0x80000000.  NaN: NAN_KEY.
    """
    is_nan = (bits & T.uint32(0x7FFFFFFF)) > T.uint32(0x7F800000)
    is_negative = (bits & T.uint32(0x80000000)) != T.uint32(0)
    monotone = T.if_then_else(is_negative, ~bits + T.uint32(1), bits + T.uint32(0x80000000))
    return T.if_then_else(is_nan, T.uint32(NAN_KEY), monotone)


def build_topk_gate(config: TopkGateConfig):
    """prim_func(scores f32 (T, E), out int64 (T, k)) for rows of E <= config.width."""
    T = _tilelang.T()
    width = config.width
    per_lane = width // WARP  # keys each lane holds
    no_index = width  # larger than every real index
    num_tokens, num_experts, k = T.dynamic("num_tokens, num_experts, k")

    @T.prim_func
    def topk_gate(
        scores: T.Tensor((num_tokens, num_experts), "float32"),
        out: T.Tensor((num_tokens, k), "int64"),
    ):
        with T.Kernel(T.ceildiv(num_tokens, WARPS_PER_BLOCK), threads=WARPS_PER_BLOCK * WARP) as block:
            tx = T.get_thread_binding()
            lane = tx % WARP
            row = block * WARPS_PER_BLOCK + tx // WARP
            keys = T.alloc_local((per_lane,), "uint32")
            best_key = T.alloc_var("uint32", init=NO_KEY)
            best_index = T.alloc_var("int32", init=no_index)
            my_pick = T.alloc_var("int32", init=0)  # lane r keeps the index picked in round r
            # `row` is uniform across the warp, so the warp reductions below
            # always run with all 32 lanes.
            if row < num_tokens:
                for j in T.unroll(per_lane):
                    if j * WARP + lane < num_experts:
                        bits = T.reinterpret(scores[row, j * WARP + lane], "uint32")
                        keys[j] = _order_key(T, bits)
                    else:
                        keys[j] = T.uint32(NO_KEY)
                for j in T.unroll(per_lane):
                    if keys[j] > best_key:
                        best_key = keys[j]
                        best_index = j * WARP + lane
                for r in T.serial(k):
                    top_key = T.warp_reduce_max(best_key)
                    picked = T.warp_reduce_min(T.if_then_else(best_key == top_key, best_index, no_index))
                    if lane == r:
                        my_pick = picked
                    if best_index == picked:
                        # Owner lane: drop the picked key and find its next best.
                        best_key = T.uint32(NO_KEY)
                        best_index = no_index
                        for j in T.unroll(per_lane):
                            if j * WARP + lane == picked:
                                keys[j] = T.uint32(NO_KEY)
                            if keys[j] > best_key:
                                best_key = keys[j]
                                best_index = j * WARP + lane
                if lane < k:
                    out[row, lane] = T.Cast("int64", my_pick)

    return topk_gate


TOPK_GATE = KernelDef("moe.topk_gate", build_topk_gate, STATIC_CONFIGS)


def config_for_experts(num_experts: int) -> TopkGateConfig:
    """The narrowest static configuration whose width holds `num_experts`."""
    for config in STATIC_CONFIGS:
        if num_experts <= config.width:
            return config
    raise ValueError(f"scores: at most {MAX_EXPERTS} experts (columns) are supported, got {num_experts}")


def topk_gate(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest scores of each row, as a stable descending sort orders them.

    scores: float32 (T, E), contiguous, on a CUDA device, 1 <= E <= 1024.
    k: 1 <= k <= min(32, E).
    Returns int64 (T, k) equal to
    ``torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k]``
    (NaN first, then +inf, ..., -inf; -0.0 == +0.0; ties to the lower index).
    """
    eager._check_topk_gate_args(scores, k)
    _tilelang.require_cuda("scores", scores)
    num_tokens, num_experts = scores.shape
    k = int(k)
    out = torch.empty((num_tokens, k), dtype=torch.int64, device=scores.device)
    if num_tokens == 0:
        return out
    kernel = _tilelang.kernel_for(TOPK_GATE, config_for_experts(num_experts), scores.device)
    with _tilelang.device_guard(scores.device):
        for start in range(0, num_tokens, MAX_ROWS_PER_LAUNCH):
            stop = min(start + MAX_ROWS_PER_LAUNCH, num_tokens)
            kernel(scores[start:stop], out[start:stop])
    return out


# =============================================================================
# The routing chain: group_count, fused_mapping, expand_to_fused, reduce_fused,
# normalize_weight.  Designs in the module docstring.
# =============================================================================

from kernels.torch import moe as eager  # noqa: E402  (the argument checks are the eager module's)
from kernels.torch.moe import is_tma_column_major, tma_padded_rows  # noqa: E402  (the sf layout contract)

NORMALIZE_EPS = 1e-20
# Every access is guarded by hand (see the module docstring).
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}
# Grids are 1-D; larger launches are cut into pieces of at most this many blocks.

RAW_DTYPES = {1: "uint8", 2: "int16", 4: "int32"}
RAW_TORCH_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def _ceildiv(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------- group_count

GROUP_COUNT_THREADS = 256
GROUP_COUNT_ITEMS = 8  # entries per thread (independent loads)


class GroupCountConfig(NamedTuple):
    idx_dtype: str  # "int32" or "int64"


GROUP_COUNT_CONFIGS = (GroupCountConfig("int32"), GroupCountConfig("int64"))


def build_group_count(config: GroupCountConfig):
    """prim_func(idx (P,) int, counts (G,) int32 zeroed): counts[g] += #{i: idx[i] == g}."""
    T = _tilelang.T()
    threads, items = GROUP_COUNT_THREADS, GROUP_COUNT_ITEMS
    per_block = threads * items
    bins_per_thread = MAX_EXPERTS // threads
    idx_dtype = config.idx_dtype
    num_entries, num_groups = T.dynamic("num_entries, num_groups")

    @T.prim_func
    def group_count(
        idx: T.Tensor((num_entries,), idx_dtype),
        counts: T.Tensor((num_groups,), "int32"),
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(T.ceildiv(num_entries, per_block), threads=threads) as block:
            tx = T.get_thread_binding()
            hist = T.alloc_shared((MAX_EXPERTS,), "int32")
            values = T.alloc_local((items,), idx_dtype)
            for j in T.unroll(bins_per_thread):
                hist[j * threads + tx] = 0
            first = T.alloc_var("int64", init=T.Cast("int64", block) * per_block)
            for j in T.unroll(items):
                values[j] = T.Cast(idx_dtype, -1)
                if first + j * threads + tx < num_entries:
                    values[j] = idx[first + j * threads + tx]
            T.sync_threads()
            for j in T.unroll(items):
                if values[j] >= T.Cast(idx_dtype, 0) and values[j] < T.Cast(idx_dtype, num_groups):
                    T.atomic_add(hist[T.Cast("int32", values[j])], 1)
            T.sync_threads()
            for j in T.unroll(bins_per_thread):
                if j * threads + tx < num_groups:
                    if hist[j * threads + tx] != 0:
                        T.atomic_add(counts[j * threads + tx], hist[j * threads + tx])

    return group_count


GROUP_COUNT = KernelDef("moe.group_count", build_group_count, GROUP_COUNT_CONFIGS)


# -------------------------------------------------------------- argument checks
# kernels/torch/moe.py's own check functions (same errors for the same bad
# arguments), then what only the kernels need: a CUDA device (the eager checks
# already put every tensor on the reference tensor's device), dimensions that
# fit an int32.


def _check_fits(name: str, t: torch.Tensor) -> None:
    """Each dimension is bound to an int32 symbolic size inside the kernels."""
    _tilelang.check_dims_fit_int32(name, t)


def group_count(idx: torch.Tensor, num_groups: int) -> torch.Tensor:
    """int32 (num_groups,): how many entries of idx equal each g in [0, num_groups).

    idx: int32 or int64 (T, K), contiguous, on a CUDA device.  Negative entries
    and entries >= num_groups count nowhere.  No host synchronisation.
    """
    num_groups = eager._check_group_count_args(idx, num_groups)
    _tilelang.require_cuda("idx", idx)
    counts = torch.zeros(num_groups, dtype=torch.int32, device=idx.device)
    if idx.numel() == 0:
        return counts
    config = GroupCountConfig("int64" if idx.dtype == torch.int64 else "int32")
    kernel = _tilelang.kernel_for(GROUP_COUNT, config, idx.device)
    with _tilelang.device_guard(idx.device):
        kernel(idx.reshape(-1), counts)
    return counts


# -------------------------------------------------------------- fused_mapping

MAPPING_WARPS = 4  # warps (chunks) per block of the count and place kernels
MAPPING_GROUPS = 8  # groups of 32 pairs loaded at once by a warp
MAPPING_BATCH = MAPPING_GROUPS * WARP  # pairs per batch; a chunk is chunk_batches batches
MAPPING_BINS = MAX_EXPERTS + 1  # per-warp counters: the experts, then "entry >= E"
DROPPED = MAX_EXPERTS + 1  # bin of a negative entry or of a pair past the end: never counted
SCAN_THREADS = 1024
SCAN_BATCH = 8  # chunk counts loaded at once per scan thread


class MappingConfig(NamedTuple):
    stage: str  # "count", "scan" or "place"


MAPPING_CONFIGS = (MappingConfig("count"), MappingConfig("scan"), MappingConfig("place"))


def _mapping_bin(T, value, num_experts):
    """int32 bin of an int64 topk_idx entry: itself in [0, E), E if >= E, DROPPED if negative.

    The entry is clamped to MAX_EXPERTS (>= E) before it is compared or cast, so
    no rewrite of the comparison by the simplifier (such as E - 1 < v into
    E <= v + 1) can overflow on an entry near 2**63.
    """
    clamped = T.min(value, T.int64(MAX_EXPERTS))
    return T.if_then_else(
        value < T.int64(0),
        DROPPED,
        T.if_then_else(T.Cast("int32", clamped) >= num_experts, num_experts, T.Cast("int32", clamped)),
    )


def _build_mapping_count():
    T = _tilelang.T()
    warps, groups, batch = MAPPING_WARPS, MAPPING_GROUPS, MAPPING_BATCH
    num_pairs, num_chunks, num_bins = T.dynamic("num_pairs, num_chunks, num_bins")

    @T.prim_func
    def mapping_count(
        topk_idx: T.Tensor((num_pairs,), "int64"),
        counts: T.Tensor((num_chunks, num_bins), "int32"),
        chunk_batches: T.int32,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        num_experts = num_bins - 1
        with T.Kernel(T.ceildiv(num_chunks, warps), threads=warps * WARP) as block:
            tx = T.get_thread_binding()
            lane = tx % WARP
            warp = tx // WARP
            chunk = block * warps + warp
            below = (T.uint32(1) << T.Cast("uint32", lane)) - T.uint32(1)  # lanes lower than this one
            hist = T.alloc_shared((warps, MAPPING_BINS), "int32")
            bins = T.alloc_local((groups,), "int32")
            # `chunk` is uniform across the warp: whole warps take this branch,
            # as __match_any_sync and __syncwarp need.
            if chunk < num_chunks:
                for j in T.serial(T.ceildiv(num_bins, WARP)):
                    if j * WARP + lane < num_bins:
                        hist[warp, j * WARP + lane] = 0
                T.sync_warp()
                first = T.alloc_var("int64", init=T.Cast("int64", chunk) * chunk_batches * batch)
                for b in T.serial(chunk_batches):
                    for g in T.unroll(groups):
                        bins[g] = DROPPED
                        if first + b * batch + g * WARP + lane < num_pairs:
                            bins[g] = _mapping_bin(T, topk_idx[first + b * batch + g * WARP + lane], num_experts)
                    for g in T.unroll(groups):
                        peers = T.match_any_sync(bins[g])
                        # The lowest lane of each bin adds the group's count: one writer per bin.
                        if bins[g] != DROPPED and (peers & below) == T.uint32(0):
                            hist[warp, bins[g]] = hist[warp, bins[g]] + T.Cast("int32", T.popcount(peers))
                        T.sync_warp()
                for j in T.serial(T.ceildiv(num_bins, WARP)):
                    if j * WARP + lane < num_bins:
                        counts[chunk, j * WARP + lane] = hist[warp, j * WARP + lane]

    return mapping_count


def _build_mapping_scan():
    T = _tilelang.T()
    threads, unroll = SCAN_THREADS, SCAN_BATCH
    num_chunks, num_bins, num_experts = T.dynamic("num_chunks, num_bins, num_experts")

    @T.prim_func
    def mapping_scan(
        counts: T.Tensor((num_chunks, num_bins), "int32"),
        expert_start: T.Tensor((num_experts,), "int32"),
        expert_end: T.Tensor((num_experts,), "int32"),
        meta: T.Tensor((2,), "int32"),
        alignment: T.int32,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(1, threads=threads):
            tx = T.get_thread_binding()
            totals = T.alloc_shared((MAPPING_BINS,), "int32")
            scan = T.alloc_shared((threads,), "int32")
            loaded = T.alloc_local((unroll,), "int32")
            running = T.alloc_var("int32", init=0)
            aligned = T.alloc_var("int32", init=0)
            carry = T.alloc_var("int32", init=0)
            # Column e (bins 0..E, E <= 1024: at most two per thread) becomes
            # exclusive prefix sums over the chunks, in place.
            for rep in T.unroll(2):
                if rep * threads + tx < num_bins:
                    running = 0
                    for cb in T.serial(T.ceildiv(num_chunks, unroll)):
                        for u in T.unroll(unroll):
                            if cb * unroll + u < num_chunks:
                                loaded[u] = counts[cb * unroll + u, rep * threads + tx]
                        for u in T.unroll(unroll):
                            if cb * unroll + u < num_chunks:
                                counts[cb * unroll + u, rep * threads + tx] = running
                                running = running + loaded[u]
                    totals[rep * threads + tx] = running
            T.sync_threads()
            if tx < num_experts:
                # No overflow: the wrapper checked that every aligned sum fits int32.
                aligned = T.truncdiv(totals[tx] + alignment - 1, alignment) * alignment
            scan[tx] = aligned
            T.sync_threads()
            for d in T.unroll(10):  # inclusive Hillis-Steele scan over 1024 = 2**10 entries
                carry = 0
                if tx >= (1 << d):
                    carry = scan[tx - (1 << d)]
                T.sync_threads()
                scan[tx] = scan[tx] + carry
                T.sync_threads()
            if tx < num_experts:
                expert_start[tx] = scan[tx] - aligned
                expert_end[tx] = scan[tx] - aligned + totals[tx]
            if tx == 0:
                meta[0] = scan[threads - 1]
                meta[1] = totals[num_experts]

    return mapping_scan


def _build_mapping_place():
    T = _tilelang.T()
    warps, groups, batch = MAPPING_WARPS, MAPPING_GROUPS, MAPPING_BATCH
    num_pairs, num_chunks, num_bins, num_experts, num_rows = T.dynamic(
        "num_pairs, num_chunks, num_bins, num_experts, num_rows")

    @T.prim_func
    def mapping_place(
        topk_idx: T.Tensor((num_pairs,), "int64"),
        offsets: T.Tensor((num_chunks, num_bins), "int32"),
        expert_start: T.Tensor((num_experts,), "int32"),
        token_topk_to_pos: T.Tensor((num_pairs,), "int32"),
        pos_to_token: T.Tensor((num_rows,), "int32"),
        pos_to_token_topk: T.Tensor((num_rows,), "int32"),
        chunk_batches: T.int32,
        num_slots: T.int32,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(T.ceildiv(num_chunks, warps), threads=warps * WARP) as block:
            tx = T.get_thread_binding()
            lane = tx % WARP
            warp = tx // WARP
            chunk = block * warps + warp
            below = (T.uint32(1) << T.Cast("uint32", lane)) - T.uint32(1)
            next_row = T.alloc_shared((warps, MAPPING_BINS), "int32")
            bins = T.alloc_local((groups,), "int32")
            pos = T.alloc_var("int32", init=-1)
            if chunk < num_chunks:  # warp-uniform, see mapping_count
                # Counter of expert e: the row of its next pair in this chunk.
                for j in T.serial(T.ceildiv(num_experts, WARP)):
                    if j * WARP + lane < num_experts:
                        next_row[warp, j * WARP + lane] = (
                            expert_start[j * WARP + lane] + offsets[chunk, j * WARP + lane])
                T.sync_warp()
                first = T.alloc_var("int64", init=T.Cast("int64", chunk) * chunk_batches * batch)
                for b in T.serial(chunk_batches):
                    for g in T.unroll(groups):
                        bins[g] = DROPPED
                        if first + b * batch + g * WARP + lane < num_pairs:
                            bins[g] = _mapping_bin(T, topk_idx[first + b * batch + g * WARP + lane], num_experts)
                    for g in T.unroll(groups):
                        peers = T.match_any_sync(bins[g])
                        rank = T.Cast("int32", T.popcount(peers & below))  # same-expert lanes before this one
                        pos = -1
                        if bins[g] < num_experts:
                            pos = next_row[warp, bins[g]] + rank
                        T.sync_warp()  # every lane has read its counter
                        if bins[g] < num_experts and rank == 0:
                            next_row[warp, bins[g]] = pos + T.Cast("int32", T.popcount(peers))
                        T.sync_warp()
                        if first + b * batch + g * WARP + lane < num_pairs:
                            token_topk_to_pos[first + b * batch + g * WARP + lane] = pos
                            if pos >= 0 and pos < num_rows:
                                pos_to_token[pos] = T.Cast(
                                    "int32", T.truncdiv(first + b * batch + g * WARP + lane, num_slots))
                                pos_to_token_topk[pos] = T.Cast("int32", first + b * batch + g * WARP + lane)

    return mapping_place


def build_mapping(config: MappingConfig):
    """prim_func of one of fused_mapping's three kernels (see the module docstring)."""
    return {"count": _build_mapping_count, "scan": _build_mapping_scan, "place": _build_mapping_place}[config.stage]()


FUSED_MAPPING = KernelDef("moe.fused_mapping", build_mapping, MAPPING_CONFIGS)


def _check_fused_mapping_args(topk_idx, num_experts, alignment) -> tuple[int, int]:
    num_experts, alignment = eager._check_fused_mapping_args(topk_idx, num_experts, alignment)
    _tilelang.require_cuda("topk_idx", topk_idx)
    return num_experts, alignment


def default_chunk_batches(num_pairs: int) -> int:
    """Batches of 256 pairs per chunk: about sqrt(P / 2048), balancing the scan against the walks.

    P = 131072 (T = 16384, K = 8) gives 8 batches: 64 chunks of 2048 pairs.
    """
    return max(1, math.isqrt(num_pairs // 2048))


def _fused_mapping(topk_idx: torch.Tensor, num_experts: int, alignment: int, chunk_batches: int):
    """fused_mapping with an explicit chunk size (chunk_batches * 256 pairs); the result never depends on it."""
    num_experts, alignment = _check_fused_mapping_args(topk_idx, num_experts, alignment)
    chunk_batches = eager._check_int("chunk_batches", chunk_batches, 1, 2**20)
    device = topk_idx.device
    num_tokens, k = topk_idx.shape
    num_pairs = num_tokens * k
    expert_start = torch.zeros(num_experts, dtype=torch.int32, device=device)
    expert_end = torch.zeros(num_experts, dtype=torch.int32, device=device)
    if num_pairs == 0:
        empty = torch.empty(0, dtype=torch.int32, device=device)
        return empty, empty.clone(), torch.empty((num_tokens, k), dtype=torch.int32, device=device), \
            expert_start, expert_end, 0
    target = _tilelang.target_for(device)
    count = _tilelang.compiled_kernel(FUSED_MAPPING, MappingConfig("count"), target)
    scan = _tilelang.compiled_kernel(FUSED_MAPPING, MappingConfig("scan"), target)
    place = _tilelang.compiled_kernel(FUSED_MAPPING, MappingConfig("place"), target)
    flat = topk_idx.reshape(-1)
    num_chunks = _ceildiv(num_pairs, chunk_batches * MAPPING_BATCH)
    with _tilelang.device_guard(device):
        counts = torch.empty((num_chunks, num_experts + 1), dtype=torch.int32, device=device)
        meta = torch.empty(2, dtype=torch.int32, device=device)
        count(flat, counts, chunk_batches)
        scan(counts, expert_start, expert_end, meta, alignment)
        # The one device-to-host sync: N, and whether any entry names an expert beyond E.
        num_rows, too_large = meta.tolist()
        if too_large:
            raise ValueError(f"topk_idx holds {too_large} entries >= num_experts={num_experts}")
        pos_to_token = torch.full((num_rows,), -1, dtype=torch.int32, device=device)
        pos_to_token_topk = torch.full((num_rows,), -1, dtype=torch.int32, device=device)
        token_topk_to_pos = torch.empty((num_tokens, k), dtype=torch.int32, device=device)
        if num_rows == 0:  # every pair dropped
            token_topk_to_pos.fill_(-1)
        else:
            place(flat, counts, expert_start, token_topk_to_pos.reshape(-1), pos_to_token, pos_to_token_topk,
                  chunk_batches, k)
    return pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start, expert_end, int(num_rows)


def fused_mapping(topk_idx: torch.Tensor, num_experts: int, alignment: int):
    """The (token, slot) pairs sorted by expert into segments aligned to `alignment`.

    Returns (pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start,
    expert_end, N) as kernels/torch/moe.py does: int32 tensors on topk_idx's
    device and the python int N (one device-to-host sync).
    """
    num_experts, alignment = _check_fused_mapping_args(topk_idx, num_experts, alignment)
    return _fused_mapping(topk_idx, num_experts, alignment, default_chunk_batches(topk_idx.numel()))


# ------------------------------------------------------------ expand_to_fused

EXPAND_THREADS = 128
PAD_ROWS = 32  # rows checked (and zeroed if no pair reaches them) per padding block
MAP_THREADS = 256
SF_THREADS = 256
EXPAND_UNITS = (16, 4, 2, 1)  # bytes moved per thread access


ORDER_SLOTS = 2048  # pairs whose rows the gather writes in position-bucket order: a chunk of ORDER_SLOTS // K tokens
ORDER_THREADS = 1024


class ExpandConfig(NamedTuple):
    stage: str  # "map", "rows", "order", "gather" or "sf_columns"
    width: int  # rows, gather: bytes per unit (16, 4, 2, 1; gather 16); sf_columns: sf element bytes (4, 1); else 0
    # Tuning knobs of the row and gather kernels (the defaults are the base row kernel; see EXPAND_TUNE_CONFIGS):
    threads: int = EXPAND_THREADS  # threads of a CTA
    units: int = 1  # units a thread loads (all in flight) before it stores them: a tile is threads * units
    # rows: out (rows and padding zeros) stored with st.global.cs (16-byte units only);
    # gather: x loaded with L2 evict_last and out stored with L2 evict_first hints
    streaming: bool = False
    pad_rows: int = PAD_ROWS  # gather: rows a padding block checks (the row kernels check PAD_ROWS)


EXPAND_CONFIGS = (
    (ExpandConfig("map", 0), ExpandConfig("order", 0))
    + tuple(ExpandConfig("rows", unit) for unit in EXPAND_UNITS)
    + tuple(ExpandConfig("sf_columns", width) for width in (4, 1))
)

# Candidates benchmarks/tune.py times against the shipped 16-byte row kernel (the bench's
# T 16384, K 8, H 7168 bf16: rows of 896 units, a write-bound scatter, 1 byte read for 9 moved).
# Bitwise equal by construction: every out byte is one x byte or a padding zero, whoever stores it.
EXPAND_TUNE_CONFIGS = (
    # 2 loads in flight a thread and half the CTAs (a tile of 256 units): a gentle step from shipped
    ExpandConfig("rows", 16, units=2),
    # one CTA a whole row (1024-unit tile >= 896): 4 loads in flight, 1/7 the CTAs, and each CTA
    # writes its K rows of 14 KiB start to end (long DRAM write runs, fewer CTA launches)
    ExpandConfig("rows", 16, threads=256, units=4),
    # out is written once and never read here: evict-first stores leave L2 to the write-back stream
    ExpandConfig("rows", 16, streaming=True),
    ExpandConfig("rows", 16, threads=256, units=4, streaming=True),
    # One unit a thread and a whole 896-unit row a CTA: the pattern that moved expand's traffic fastest in
    # H200 run 19's write_rate (a unit read once and written 8 times, one unit a thread: 3.81 TB/s against
    # 3.57-3.59 grid-stride), with the positions read and the barrier paid once a row instead of 7 times
    # (run 19's ncu: mio_throttle, the shared-memory reads of the positions, the second largest stall)
    ExpandConfig("rows", 16, threads=896),
    ExpandConfig("rows", 16, threads=896, streaming=True),
    # half a row a CTA, 2 units a thread in flight
    ExpandConfig("rows", 16, threads=448, units=2),
    # the shipped 2 units a thread with evict-first stores (runs 23/24: evict-first 633-637 us eager)
    ExpandConfig("rows", 16, units=2, streaming=True),
    # The gather: a CTA a destination row, chunk-major in position-bucket order (the "order" kernel), so that
    # CTAs running together write neighbouring rows of few experts, not one row in each of 256; a source
    # row's 8 reads then fall within its chunk, and the L2 hints keep it there (scripts/write_rate.cu's
    # gather8keeppass, H200 run 39: 3.90 TB/s against 3.68 for the row kernel's pattern)
    ExpandConfig("gather", 16, threads=128, units=7, streaming=True),
    ExpandConfig("gather", 16, threads=128, units=7),
    # padding blocks of 8 rows: a block of 32 padding rows stores 448 KiB from 128 threads
    ExpandConfig("gather", 16, threads=128, units=7, streaming=True, pad_rows=8),
    ExpandConfig("gather", 16, threads=128, units=7, streaming=True, pad_rows=4),
    ExpandConfig("gather", 16, threads=128, units=7, streaming=True, pad_rows=16),
)
# The row kernel ships a tuning candidate where one was faster with the same bits: the base configuration
# of a unit -> the one used.  16-byte units: the gather with L2 hints and padding blocks of 8 rows, H200
# run 46 (T 16384, K 8, H 7168 bf16, scripts/expand_stages.py, each kernel's device time): 593.4 us for
# its three kernels against 625.9 for the row kernel of 2 units a thread (shipped from runs 23-24 to 46),
# every byte equal (tests/test_moe_kernels_gpu.py).
EXPAND_SHIPPED: dict[ExpandConfig, ExpandConfig] = {
    ExpandConfig("rows", 16): ExpandConfig("gather", 16, threads=128, units=7, streaming=True, pad_rows=8)}
# The base configuration -> the configuration to use instead (any of EXPAND_TO_FUSED.configs with
# the same stage and width), set by a tuning run.
EXPAND_OVERRIDES: dict[ExpandConfig, ExpandConfig] = {}



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


def build_expand(config: ExpandConfig):
    """prim_func of one of expand_to_fused's kernels (see the module docstring)."""
    if config.stage == "map":
        return _build_expand_map()
    if config.stage == "order":
        return _build_expand_order()
    if config.stage == "gather":
        return _build_expand_gather(config)
    if config.stage == "rows":
        if config == ExpandConfig("rows", config.width):
            return _build_expand_rows(config.width)  # the shipped kernel
        return _build_expand_rows_tuned(config)
    return _build_expand_sf_columns(config.width)


EXPAND_TO_FUSED = KernelDef("moe.expand_to_fused", build_expand, EXPAND_CONFIGS + EXPAND_TUNE_CONFIGS,
                            candidates=tuning_only(EXPAND_TUNE_CONFIGS, EXPAND_SHIPPED))


def _check_expand_args(x, token_topk_to_pos, num_expanded_rows, x_sf) -> int:
    num_rows = eager._check_expand_args(x, token_topk_to_pos, num_expanded_rows, x_sf)
    _tilelang.require_cuda("x", x)
    _check_fits("x", x)
    if x_sf is not None:
        _check_fits("x_sf", x_sf)
    return num_rows


def _row_unit(*tensors: torch.Tensor) -> int:
    """The largest unit (16, 4, 2, 1 bytes) dividing each tensor's row length in bytes and address."""
    for unit in EXPAND_UNITS:
        if all((t.shape[1] * t.element_size()) % unit == 0 and t.data_ptr() % unit == 0 for t in tensors):
            return unit
    return 1


def _as_units(t: torch.Tensor, unit: int) -> torch.Tensor:
    """A (rows, cols) contiguous tensor viewed as rows of raw `unit`-byte integers (16 bytes: 4 int32)."""
    return t.view(torch.uint8).view(RAW_TORCH_DTYPES[4 if unit == 16 else unit])


def _expand_rows(src: torch.Tensor, token_topk_to_pos: torch.Tensor, row_src: torch.Tensor,
                 out: torch.Tensor, order: torch.Tensor | None, target) -> None:
    """out[pos] = src[t] for the pairs, zero rows where row_src < 0 (src, out row-major contiguous).
    `order`: the gather's (_expand_order), where the caller has it."""
    unit = _row_unit(src, out)
    config = expand_rows_config(unit)
    kernel = _tilelang.compiled_kernel(EXPAND_TO_FUSED, config, target)
    num_units = src.shape[1] * src.element_size() // unit
    if num_units * (4 if unit == 16 else 1) > _tilelang.MAX_DIM:
        raise ValueError(f"x: rows of {src.shape[1] * src.element_size()} bytes are too long for this alignment "
                         f"(at most {_tilelang.MAX_DIM} units of {unit} bytes)")
    tiles = _ceildiv(num_units, config.threads * config.units)
    padding_blocks = _ceildiv(out.shape[0], config.pad_rows) * tiles
    if config.stage == "gather":
        if order is None:
            order = _expand_order(token_topk_to_pos, row_src, target)
        _tilelang.launch_in_pieces(kernel, order.numel() + padding_blocks, _as_units(src, unit), order, row_src,
                                   _as_units(out, unit))
        return
    total = src.shape[0] * tiles + padding_blocks
    _tilelang.launch_in_pieces(kernel, total, _as_units(src, unit), token_topk_to_pos, row_src, _as_units(out, unit))


def _expand_order(token_topk_to_pos: torch.Tensor, row_src: torch.Tensor, target) -> torch.Tensor:
    """The gather's order: (chunks * ORDER_SLOTS,) int64 (pos << 32) + token, in position-bucket order in
    each chunk of ORDER_SLOTS // K tokens, -1 for empty slots.  Sets row_src as the map kernel does."""
    num_tokens, k = token_topk_to_pos.shape
    chunk_tokens = ORDER_SLOTS // k
    num_chunks = _ceildiv(num_tokens, chunk_tokens)
    order = torch.empty((num_chunks * ORDER_SLOTS,), dtype=torch.int64, device=token_topk_to_pos.device)
    kernel = _tilelang.compiled_kernel(EXPAND_TO_FUSED, ExpandConfig("order", 0), target)
    kernel(token_topk_to_pos.reshape(-1), row_src, order, k, chunk_tokens * k, num_chunks,
           _ceildiv(row_src.numel(), ORDER_SLOTS))
    return order


def expand_rows_config(unit: int) -> ExpandConfig:
    """The row kernel's configuration for `unit`: the shipped one (EXPAND_SHIPPED's, else the base kernel),
    unless a tuning run overrides it (EXPAND_OVERRIDES, keyed by the base configuration)."""
    return _tilelang.chosen_config(ExpandConfig("rows", unit), EXPAND_SHIPPED, EXPAND_OVERRIDES)


def _expand_sf_columns(x_sf: torch.Tensor, row_src: torch.Tensor, num_rows: int, target) -> torch.Tensor:
    """out_sf (N, G), TMA-aligned column-major, gathered from a column-major x_sf through row_src."""
    num_tokens, num_cols = x_sf.shape
    width = x_sf.element_size()
    rows_padded = tma_padded_rows(num_rows, x_sf.dtype)
    storage = torch.empty((num_cols, rows_padded), dtype=x_sf.dtype, device=x_sf.device)
    kernel = _tilelang.compiled_kernel(EXPAND_TO_FUSED, ExpandConfig("sf_columns", width), target)
    in_stride = x_sf.stride(1)
    # Only the elements of the (T, G) view: a column-major tensor's last column may end before its padding.
    flat_in = torch.as_strided(x_sf, ((num_cols - 1) * in_stride + num_tokens,), (1,))
    raw = RAW_TORCH_DTYPES[width]
    total = _ceildiv(num_cols * rows_padded, SF_THREADS)
    _tilelang.launch_in_pieces(kernel, total, flat_in.view(raw), row_src, storage.view(raw), in_stride)
    return storage.T[:num_rows]


def expand_to_fused(x: torch.Tensor, token_topk_to_pos: torch.Tensor, num_expanded_rows: int,
                    x_sf: torch.Tensor | None = None):
    """out (N, H): row pos = token_topk_to_pos[t, k] holds x[t], padding rows zero; bits unchanged.

    With x_sf (the per-token sf of a quantised x), returns (out, out_sf):
    out_sf (N, G) holds the sf rows moved the same way, in x_sf's dtype and
    layout (row-major, or TMA-aligned column-major padded for N).  No host sync.
    """
    num_rows = _check_expand_args(x, token_topk_to_pos, num_expanded_rows, x_sf)
    device = x.device
    num_tokens, k = token_topk_to_pos.shape
    column_major_sf = x_sf is not None and is_tma_column_major(x_sf)
    if num_rows == 0 or num_tokens == 0:
        # Nothing to move: every row (if any) is padding.
        out = torch.zeros((num_rows, x.shape[1]), dtype=x.dtype, device=device)
        if x_sf is None:
            return out
        if column_major_sf:
            out_sf = torch.zeros((x_sf.shape[1], tma_padded_rows(num_rows, x_sf.dtype)), dtype=x_sf.dtype,
                                 device=device).T[:num_rows]
        else:
            out_sf = torch.zeros((num_rows, x_sf.shape[1]), dtype=x_sf.dtype, device=device)
        return out, out_sf
    target = _tilelang.target_for(device)
    with _tilelang.device_guard(device):
        row_src = torch.full((num_rows,), -1, dtype=torch.int32, device=device)
        out = torch.empty((num_rows, x.shape[1]), dtype=x.dtype, device=device)
        order = None
        if expand_rows_config(_row_unit(x, out)).stage == "gather":
            order = _expand_order(token_topk_to_pos, row_src, target)  # row_src with it
        else:
            mapper = _tilelang.compiled_kernel(EXPAND_TO_FUSED, ExpandConfig("map", 0), target)
            mapper(token_topk_to_pos.reshape(-1), row_src, k)
        _expand_rows(x, token_topk_to_pos, row_src, out, order, target)
        if x_sf is None:
            return out
        if column_major_sf:
            out_sf = _expand_sf_columns(x_sf, row_src, num_rows, target)
        else:
            out_sf = torch.empty((num_rows, x_sf.shape[1]), dtype=x_sf.dtype, device=device)
            _expand_rows(x_sf, token_topk_to_pos, row_src, out_sf, order, target)
    return out, out_sf


# --------------------------------------------------------------- reduce_fused

REDUCE_THREADS = 128
REDUCE_BATCH = 8  # slots whose rows a thread loads before adding them (bytes in flight)
REDUCE_VECTOR = {"bfloat16": 8, "float32": 4, "float8_e4m3fn": 16}  # elements per 16 bytes
REDUCE_OUT = {"bfloat16": "bfloat16", "float32": "float32", "float8_e4m3fn": "bfloat16"}
TORCH_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float8_e4m3fn: "float8_e4m3fn"}


class ReduceConfig(NamedTuple):
    dtype: str  # x dtype: "bfloat16", "float32" or "float8_e4m3fn" (with a per-row sf)
    vectorized: bool  # 16-byte accesses; needs H a multiple of 16 bytes' worth and aligned x, out


REDUCE_CONFIGS = tuple(ReduceConfig(dtype, vectorized) for dtype in REDUCE_VECTOR for vectorized in (True, False))


def build_reduce(config: ReduceConfig):
    """prim_func(x (N, H), topk_weights (T, K), token_topk_to_pos (T, K)[, sf (N,)], out (T, H), ...)."""
    T = _tilelang.T()
    threads, batch = REDUCE_THREADS, REDUCE_BATCH
    dtype, out_dtype = config.dtype, REDUCE_OUT[config.dtype]
    vec = REDUCE_VECTOR[dtype] if config.vectorized else 1
    scaled = dtype == "float8_e4m3fn"
    num_rows, num_vecs, num_tokens, num_slots, sf_rows = T.dynamic(
        "num_rows, num_vecs, num_tokens, num_slots, sf_rows")

    @T.macro
    def body(x, topk_weights, token_topk_to_pos, sf, out, num_blocks, block_offset):
        tiles = T.ceildiv(num_vecs, threads)
        with T.Kernel(num_blocks, threads=threads) as block:
            tx = T.get_thread_binding()
            logical = T.alloc_var("int64", init=block_offset + block)
            token = T.alloc_var("int64", init=T.truncdiv(logical, tiles))
            v = T.alloc_var("int32", init=T.Cast("int32", T.truncmod(logical, tiles)) * threads + tx)
            positions = T.alloc_shared((MAX_K,), "int32")
            weights = T.alloc_shared((MAX_K,), "float32")
            scales = T.alloc_shared((MAX_K,), "float32")
            rows = T.alloc_local((batch, vec), dtype)
            acc = T.alloc_local((vec,), "float32")
            if token < num_tokens:  # always true for launched blocks; block-uniform
                if tx < num_slots:
                    positions[tx] = token_topk_to_pos[token, tx]
                    weights[tx] = topk_weights[token, tx]
                    if scaled:
                        scales[tx] = T.float32(0)
                        if token_topk_to_pos[token, tx] >= 0 and token_topk_to_pos[token, tx] < num_rows:
                            scales[tx] = sf[token_topk_to_pos[token, tx]]
                T.sync_threads()
                if v < num_vecs:
                    for i in T.unroll(vec):
                        acc[i] = T.float32(0)
                    for kb in T.serial(T.ceildiv(num_slots, batch)):
                        # Loads of up to `batch` slots first (independent, in flight together) ...
                        for u in T.unroll(batch):
                            if kb * batch + u < num_slots:
                                if positions[kb * batch + u] >= 0 and positions[kb * batch + u] < num_rows:
                                    for i in T.vectorized(vec):
                                        rows[u, i] = x[positions[kb * batch + u], v * vec + i]
                        # ... then their terms, added in slot order, each op rounded once.
                        for u in T.unroll(batch):
                            if kb * batch + u < num_slots:
                                if positions[kb * batch + u] >= 0 and positions[kb * batch + u] < num_rows:
                                    for i in T.unroll(vec):
                                        if scaled:
                                            acc[i] = T.ieee_add(acc[i], T.ieee_mul(
                                                weights[kb * batch + u],
                                                T.ieee_mul(T.Cast("float32", rows[u, i]), scales[kb * batch + u])))
                                        else:
                                            acc[i] = T.ieee_add(acc[i], T.ieee_mul(
                                                weights[kb * batch + u], T.Cast("float32", rows[u, i])))
                    for i in T.vectorized(vec):
                        out[token, v * vec + i] = T.Cast(out_dtype, acc[i])

    if scaled:
        @T.prim_func
        def reduce_fused_scaled(
            x: T.Tensor((num_rows, num_vecs * vec), dtype),
            topk_weights: T.Tensor((num_tokens, num_slots), "float32"),
            token_topk_to_pos: T.Tensor((num_tokens, num_slots), "int32"),
            sf: T.Tensor((sf_rows,), "float32"),
            out: T.Tensor((num_tokens, num_vecs * vec), out_dtype),
            num_blocks: T.int32,
            block_offset: T.int64,
        ):
            T.annotate_pass_configs(PASS_CONFIGS)
            body(x, topk_weights, token_topk_to_pos, sf, out, num_blocks, block_offset)

        return reduce_fused_scaled

    @T.prim_func
    def reduce_fused(
        x: T.Tensor((num_rows, num_vecs * vec), dtype),
        topk_weights: T.Tensor((num_tokens, num_slots), "float32"),
        token_topk_to_pos: T.Tensor((num_tokens, num_slots), "int32"),
        out: T.Tensor((num_tokens, num_vecs * vec), out_dtype),
        num_blocks: T.int32,
        block_offset: T.int64,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        body(x, topk_weights, token_topk_to_pos, None, out, num_blocks, block_offset)

    return reduce_fused


REDUCE_FUSED = KernelDef("moe.reduce_fused", build_reduce, REDUCE_CONFIGS)


def _check_reduce_args(x, topk_weights, token_topk_to_pos, x_sf) -> None:
    eager._check_reduce_args(x, topk_weights, token_topk_to_pos, x_sf)
    _tilelang.require_cuda("x", x)
    _check_fits("x", x)


def reduce_fused(x: torch.Tensor, topk_weights: torch.Tensor, token_topk_to_pos: torch.Tensor,
                 x_sf: torch.Tensor | None = None) -> torch.Tensor:
    """out[t] = sum_k w[t, k] * x[pos(t, k)] over slots with 0 <= pos < N, fp32 in slot order, one rounding.

    x: (N, H) bfloat16, float32, or float8_e4m3fn with x_sf float32 (N, 1)
    (x = q * sf).  out: (T, H), bfloat16 (float32 for a float32 x).  Bitwise
    equal to kernels/torch/moe.py's reduce_fused.  No host sync.
    """
    _check_reduce_args(x, topk_weights, token_topk_to_pos, x_sf)
    num_rows, hidden = x.shape
    num_tokens, k = topk_weights.shape
    out_dtype = torch.float32 if x.dtype == torch.float32 else torch.bfloat16
    if num_tokens == 0 or num_rows == 0:  # no slot can reach a row: zeros
        return torch.zeros((num_tokens, hidden), dtype=out_dtype, device=x.device)
    out = torch.empty((num_tokens, hidden), dtype=out_dtype, device=x.device)
    name = TORCH_DTYPE_NAMES[x.dtype]
    vec = REDUCE_VECTOR[name]
    vectorized = hidden % vec == 0 and x.data_ptr() % 16 == 0 and out.data_ptr() % 16 == 0
    config = ReduceConfig(name, vectorized)
    kernel = _tilelang.kernel_for(REDUCE_FUSED, config, x.device)
    total = num_tokens * _ceildiv(hidden // vec if vectorized else hidden, REDUCE_THREADS)
    # fp8 data goes in as its own dtype (tilelang converts it); one sf per row, stride 1.
    args = (x, topk_weights, token_topk_to_pos)
    if x_sf is not None:
        args += (torch.as_strided(x_sf, (num_rows,), (1,)),)
    with _tilelang.device_guard(x.device):
        _tilelang.launch_in_pieces(kernel, total, *args, out)
    return out


# ----------------------------------------------------------- normalize_weight

NORMALIZE_THREADS = 128
# 1e-20 rounded to float32 (round to nearest, as torch converts the python scalar), by its bits:
# no decimal or hex-float literal left for a compiler to round.
NORMALIZE_EPS_BITS = struct.unpack("<I", struct.pack("<f", NORMALIZE_EPS))[0]


class NormalizeConfig(NamedTuple):
    pass


NORMALIZE_CONFIGS = (NormalizeConfig(),)


def build_normalize(config: NormalizeConfig):
    """prim_func(topk_weights (T, K), denom (T,), weights (T, K))."""
    T = _tilelang.T()
    threads = NORMALIZE_THREADS
    num_tokens, num_slots = T.dynamic("num_tokens, num_slots")

    @T.prim_func
    def normalize_weight(
        topk_weights: T.Tensor((num_tokens, num_slots), "float32"),
        denom: T.Tensor((num_tokens,), "float32"),
        weights: T.Tensor((num_tokens, num_slots), "float32"),
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(T.ceildiv(num_tokens, threads), threads=threads) as block:
            tx = T.get_thread_binding()
            token = T.alloc_var("int64", init=T.Cast("int64", block) * threads + tx)
            total = T.alloc_var("float32", init=T.float32(0))
            if token < num_tokens:
                for k in T.serial(num_slots):
                    total = T.ieee_add(total, topk_weights[token, k])
                total = T.ieee_add(total, T.reinterpret(T.uint32(NORMALIZE_EPS_BITS), "float32"))
                denom[token] = total
                for k in T.serial(num_slots):
                    weights[token, k] = T.ieee_fdiv(topk_weights[token, k], total)

    return normalize_weight


NORMALIZE_WEIGHT = KernelDef("moe.normalize_weight", build_normalize, NORMALIZE_CONFIGS)


def normalize_weight(topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(denom, topk_weights / denom): denom = sum_k w[t, k] in fp32 slot order, plus 1e-20 as fp32.

    IEEE sums and division (__fadd_rn, __fdiv_rn): bitwise equal to the eager
    PyTorch implementation.  No host sync.
    """
    eager._check_normalize_args(topk_weights)
    _tilelang.require_cuda("topk_weights", topk_weights)
    num_tokens, k = topk_weights.shape
    denom = torch.empty(num_tokens, dtype=torch.float32, device=topk_weights.device)
    weights = torch.empty_like(topk_weights)
    if num_tokens == 0:
        return denom, weights
    kernel = _tilelang.kernel_for(NORMALIZE_WEIGHT, NORMALIZE_CONFIGS[0], topk_weights.device)
    with _tilelang.device_guard(topk_weights.device):
        kernel(topk_weights, denom, weights)
    return denom, weights
