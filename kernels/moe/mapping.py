"""fused_mapping: the (token, slot) pairs sorted by expert into aligned segments.

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
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.
import math
from typing import NamedTuple

import torch

from kernels.torch import moe as eager  # the argument checks are the eager module's

from .. import _tilelang
from .._tilelang import KernelDef
from .common import MAX_EXPERTS, PASS_CONFIGS, WARP, _ceildiv

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
