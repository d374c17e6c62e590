"""The token_cast kernel (kernel quant.token_cast): per-token casts, and SwiGLU fused with a per-token cast.

x is read as 32-bit words in *chunks* of 8 consecutive elements (16 bytes of bf16, 32 of fp32);
every load is a 16-byte vector.  A block of npc = 8 * L * K elements (H % 8 == 0) belongs to a
group of L consecutive lanes of a warp (a power of two), each lane taking K chunks of it.  The
group's amax is reduced with ``__shfl_xor_sync`` (every lane of the warp takes part, lanes past
the end with 0), every lane computes the sf, and the group's first lane writes it.  Three paths,
picked per call on the host (`kernels.quant.token_cast._token_geometry`) and passed as ``path``:

* Fast paths (``path`` = K): the K chunks stay in registers.  bf16: K = 4 (npc / 32 a power of
  two <= 32: npc 32 .. 1024), else K = 2 (npc 16, or npc / 16 a power of two); fp32: K = 2.
  Lane j of block b takes the K contiguous chunks b * L * K + j * K + k, so that its codes
  leave in one vector store (e2m1 K = 4: 16 bytes; e4m3: 2 x 16; e5m6: 3 x 16) and a warp
  stores contiguous bytes.  A 256-thread CTA takes 1024 chunks (bf16; 512 for fp32: 64 bytes of
  input per lane, 128 for fp32 swiglu), every load issued first and unconditionally (lanes past
  the end load chunk 0 and store nothing: no branch for the compiler to schedule around).  Then
  per block: amax, shuffles, sf, the 8K quotients and codes, the store.  ptxas fits them in 85
  registers, 3 CTAs per SM (reports/evidence/quant.md#registers).
* Row path (`ROW_PATH`; npc = H not of that form, 32 <= H / 8 <= R * threads): a team of L
  threads (whole warps, L the least power of two >= 32 with L * R >= H / 8; R = `row_chunks`,
  32 words of input per thread: 8 chunks of bf16 x, 4 of fp32 x or bf16 swiglu, 2 of fp32
  swiglu) owns one row; thread j holds the row's chunks j, j + L, ... (at most R, a warp's
  loads of one slot are 512 contiguous bytes), every load issued before any use.  The warps'
  amaxes meet in shared memory (one barrier: one row per team, and every thread reaches it);
  the sf is computed by every thread, written by the team's first.  x's values are re-derived
  from the words for the encoding; swiglu's y is kept.  16384 x 7168 bf16: L = 128, 7 chunks
  per thread, two rows per 256-thread CTA.  The codes are stored chunk by chunk (e5m6: three
  words, a warp's stores of one slot contiguous).
* Generic path (0; rows of fewer than 32 chunks, or longer than a row path holds):
  L = gcd(npc / 8, 32), lane j's chunk k of block b is chunk (b * K + k) * L + j (a warp's loads
  of one k are contiguous); a loop over the K chunks for the amax, one load at a time, then a
  second loop (its loads hit L1 / L2) that quantises and stores chunk by chunk.

sf_only skips the data stores.  With a precomputed sf the kernel reads each block's sf (fp32,
ue8m0 or packed, any strides) and divides (``__fdiv_rn``: sf = 0, subnormal, inf or NaN give
what IEEE division gives); that path has kernels of its own (``precomputed = 1``), since its
8K inline IEEE divisions per lane would bloat the hot kernel's code.

SwiGLU is the same kernel with another source of values: block b of y is in row b / cols (a
multiply-shift division) of x (N, 2H); a chunk reads 8 values of l = x[row, :H] and of
r = x[row, H:] and computes, in fp32, l = min.NaN(l, c), r = max.NaN(min.NaN(r, c), -c) (a NaN
stays NaN; without a clamp c = +inf), y = ((l * sigmoid(l)) * r) * w with
sigmoid(l) = rcp.approx(1 + expf(-l)) (libdevice's accurate expf, not __expf) and each product
``__fmul_rn``.  Rows whose pos_to_token_topk is negative are padding: not read, y = 0; so are rows whose
index is at or past has_w, topk_weights' slot count (0: no weights), which the kernel never reads past.  The clamp
counts (l > c, r > c, r < -c, before clamping) are per-thread int32, summed over the warp and
added to the int64 clamped_count with one atomicAdd per warp and counter (int64 all the way, so
no count can overflow).  The routed call (has_pos, has_w, do_count and clamp are runtime
arguments) runs the same compiled kernel and path as the plain one, with one pos and one weight
read per lane and block, and 3 compares per element when counting.

Static configurations (`TokenConfig`): (source x / swiglu, input dtype, format), 12, plus the 6
per-token casts from a precomputed sf, plus the tuning candidates `TOKEN_TUNE_CONFIGS` (threads
per CTA, blocks per lane, CTAs per SM, the e5m6 encoder).  Everything else (npc, sf storage,
round_sf, layout, clamp_min, T, H, x's row stride) is a runtime argument.

x's rows may lie at any row stride whose rows start on 16-byte boundaries (the host copies other
layouts): ``row_pad`` counts the 16-byte vectors between the end of a row's chunks and the next
row's start, and every load of x adds ``row * row_pad`` vectors to the chunk's address (`load_chunk`),
so a contiguous x (row_pad = 0; swiglu: H / 8 chunks, the r half) and a strided one run the same
compiled configuration with the same 16-byte vector loads.
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.
from typing import NamedTuple

from .. import _tilelang
from .._tilelang import KernelDef
from .common import (CHUNK, DATA_WORDS_PER_CHUNK, F32_INF, FORMATS, PASS_CONFIGS, WARP, WORDS_PER_CHUNK, _bits,
                     _f32, _fastdiv, _u)
from .encode import _e2m1_nibble, _e5m6_code, _e5m6_code_fast
from .prelude import PRELUDE
from .scale import _scale_macros

THREADS = 256
# Fast paths: K chunks per lane and block held in registers (K in fast_paths()); a CTA takes
# FAST_CHUNKS chunks (every lane 64 bytes of input loaded at once; 128 for fp32 swiglu).
FAST_CHUNKS_PER_LANE = {("x", "bfloat16"): 4, ("x", "float32"): 2, ("swiglu", "bfloat16"): 4, ("swiglu", "float32"): 2}
FAST_CHUNKS = {key: chunks * THREADS for key, chunks in FAST_CHUNKS_PER_LANE.items()}
GENERIC_STEPS = 2  # blocks per lane in the generic (two-pass) path
ROW_PATH = 1  # `path` of the row path (fast paths: path = K; generic: 0)
# Row path: 32-bit input words a thread holds in registers (its chunks of one block, all loaded
# at once), as many as the K = 4 fast paths hold for bf16 x at steps = 2.
ROW_WORDS = 32


def fast_paths(source: str, dtype: str) -> tuple[int, ...]:
    """Chunks per lane (K) of the register-resident fast paths of a token_cast configuration."""
    return (2, 4) if dtype == "bfloat16" else (2,)


def row_chunks(source: str, dtype: str) -> int:
    """Most chunks of one block a thread of the row path holds (ROW_WORDS words of input)."""
    return ROW_WORDS // (WORDS_PER_CHUNK[dtype] * (2 if source == "swiglu" else 1))


class TokenConfig(NamedTuple):
    source: str  # "x" (per-token casts) or "swiglu"
    dtype: str  # input dtype: "bfloat16" or "float32"
    fmt: str  # "e4m3", "e2m1" or "e5m6"
    # Tuning knobs (benchmarks/tune.py times candidates; the defaults are the base configuration).
    threads: int = THREADS  # per CTA
    steps: int = 1  # fast paths: blocks of FAST_CHUNKS_PER_LANE chunks each lane loads before computing
    min_blocks: int = 3  # CTAs per SM promised to ptxas (caps registers at 65536 / (threads * min_blocks))
    # precomputed sf: 0 = never (the data follows from the kernel's own sf), 1 = always (the
    # _with_precomputed_sf kernel); 2 = a runtime argument (one kernel for both; the builder
    # supports it, no configuration lists it)
    precomputed: int = 0
    # e5m6 codes by `_e5m6_code_fast` (branch-free, 3 fp32 operations and ~7 integer ones an element)
    # instead of `_e5m6_code`: the same code for every fp32 quotient (scripts/e5m6_encode_check.py,
    # all 2^32 patterns); kernels with precomputed = 0 only (the precomputed path keeps `_e5m6_code`,
    # whose exactly infinite quotients get the inf code)
    fast_e5m6: bool = False


# Shipped geometry per (source, dtype, fmt) where benchmarks/tune.py finds a faster candidate than
# the defaults, bitwise equal to them.  Device time on the H200 at 16384 x 7168 bf16
# (reports/evidence/quant.md#token-cast-geometry): e4m3/128 102.1 -> 91.3 us, e2m1/32 97.8 ->
# 93.4 us, e5m6/H 161.2 -> 129.6 us (one row per 128-thread CTA and the branch-free encode).
# SwiGLU keeps the defaults (59.3 us, within 1% of the best candidate).
TUNED = {
    ("x", "bfloat16", "e4m3"): {"threads": 128, "min_blocks": 6},
    ("x", "bfloat16", "e2m1"): {"steps": 2, "min_blocks": 2},
    ("x", "bfloat16", "e5m6"): {"threads": 128, "min_blocks": 6, "fast_e5m6": True},
}


def _shipped(source: str, dtype: str, fmt: str, precomputed: int = 0) -> TokenConfig:
    return TokenConfig(source, dtype, fmt, precomputed=precomputed, **TUNED.get((source, dtype, fmt), {}))


TOKEN_CONFIGS = tuple(_shipped(source, dtype, fmt) for source in ("x", "swiglu")
                      for dtype in ("bfloat16", "float32") for fmt in FORMATS) + tuple(
    TokenConfig("x", dtype, fmt, precomputed=1) for dtype in ("bfloat16", "float32") for fmt in FORMATS)
# Candidates benchmarks/tune.py times against the shipped configurations (bitwise-checked there,
# and in tests/test_quant_token_cast_gpu.py on edge inputs).
TOKEN_TUNE_CONFIGS = (
    TokenConfig("x", "bfloat16", "e4m3", threads=128, steps=2, min_blocks=4),
    TokenConfig("x", "bfloat16", "e2m1", threads=128, min_blocks=6),
    TokenConfig("swiglu", "bfloat16", "e4m3", threads=128, min_blocks=6),
    # e5m6 whole rows: the defaults (256 threads, the branching encode), and each of the shipped
    # configuration's two changes alone (one row per 128-thread CTA; the branch-free encode)
    TokenConfig("x", "bfloat16", "e5m6"),
    TokenConfig("x", "bfloat16", "e5m6", threads=128, min_blocks=6),
    TokenConfig("x", "bfloat16", "e5m6", fast_e5m6=True),
)


# ------------------------------------------------------------------ the builder
# build_token_cast assembles the kernel from TileLang macros, made by the factories below from the
# configuration's static values: one chunk's values, amax and codes; a block's row and sf; the
# register paths (fast, generic); the row path.


def _chunk_macros(T, fmt, bf16, swiglu, wpc, fast_e5m6):
    """(load_chunk, chunk_values, chunk_amax, encode_chunk): one chunk's input words, fp32 values
    (swiglu: y), amax bits and packed codes."""

    def even_value(words, slot, base, p):
        """fp32 value of element 2p of the chunk in words[slot, base:] (bf16: the low half of word p)."""
        if bf16:
            return _f32(T, words[slot, base + p] << _u(T, 16))
        return _f32(T, words[slot, base + 2 * p])

    def odd_value(words, slot, base, p):
        """fp32 value of element 2p + 1 (bf16: the high half of word p)."""
        if bf16:
            return _f32(T, words[slot, base + p] & _u(T, 0xFFFF0000))
        return _f32(T, words[slot, base + 2 * p + 1])

    vectors = wpc // 4  # 16-byte vectors of input per chunk

    @T.macro
    def load_chunk(xw, words, slot, chunk, row, hidden_chunks, row_pad):
        # words[slot, :wpc] <- the chunk's input words (swiglu: l; r goes to words[slot, wpc:]).
        # Addresses count 16-byte vectors: chunk `chunk` (flat over the rows of y, row `row`) starts
        # chunk * vectors + row * row_pad vectors into x, row_pad the vectors from the end of a row's
        # chunks to the next row's start (the row stride less the row: 0 for contiguous x; swiglu:
        # the r half and any padding), so a row stride costs one multiply-add and keeps the vector.
        if swiglu:
            # l is the chunk's place in x (N, 2H) at row stride 2 H / 8 + padding; r H / 8 chunks further
            for v in T.vectorized(wpc):
                words[slot, v] = T.Cast("uint32", xw[(chunk * vectors + row * row_pad) * 4 + v])
            for v in T.vectorized(wpc):
                words[slot, wpc + v] = T.Cast(
                    "uint32", xw[((chunk + hidden_chunks) * vectors + row * row_pad) * 4 + v])
        else:
            for v in T.vectorized(wpc):
                words[slot, v] = T.Cast("uint32", xw[(chunk * vectors + row * row_pad) * 4 + v])

    @T.macro
    def swiglu_value(vals, i, lv, rv, weight, clamp, counts, count_now):
        if count_now:
            counts[0] = counts[0] + T.if_then_else(lv > clamp, 1, 0)
            counts[1] = counts[1] + T.if_then_else(rv > clamp, 1, 0)
            counts[2] = counts[2] + T.if_then_else(rv < -clamp, 1, 0)
        # NaN-propagating min / max (fminf / fmaxf would turn a NaN into the clamp)
        lc = T.call_extern("float32", "tkq_min_nan", lv, clamp)
        rc = T.call_extern("float32", "tkq_max_nan", T.call_extern("float32", "tkq_min_nan", rv, clamp), -clamp)
        sig = T.call_extern("float32", "tkq_rcp_approx", T.ieee_add(T.float32(1.0), T.exp(-lc)))
        vals[i] = T.ieee_mul(T.ieee_mul(T.ieee_mul(lc, sig), rc), weight)

    @T.macro
    def chunk_values(words, slot, vals, base, live, weight, clamp, counts, count_now):
        # vals[base : base + 8] <- the chunk's fp32 values (swiglu: y, 0 in padding rows)
        if swiglu:
            for i in T.unroll(CHUNK):
                vals[base + i] = T.float32(0)
            if live:
                for p in T.unroll(CHUNK // 2):
                    swiglu_value(vals, base + 2 * p, even_value(words, slot, 0, p), even_value(words, slot, wpc, p),
                                 weight, clamp, counts, count_now)
                    swiglu_value(vals, base + 2 * p + 1, odd_value(words, slot, 0, p), odd_value(words, slot, wpc, p),
                                 weight, clamp, counts, count_now)
        else:
            for p in T.unroll(CHUNK // 2):
                vals[base + 2 * p] = even_value(words, slot, 0, p)
                vals[base + 2 * p + 1] = odd_value(words, slot, 0, p)

    def chunk_amax(words, slot, vals, base):
        """uint32 amax bits of the chunk (NaN above inf): an integer max of |bits|."""
        if bf16 and not swiglu:
            # on the raw bf16 halves: per-halfword max, then the larger half
            pair = [words[slot, i] & _u(T, 0x7FFF7FFF) for i in range(4)]
            m = T.call_extern("uint32", "tkq_vmaxu2", T.call_extern("uint32", "tkq_vmaxu2", pair[0], pair[1]),
                              T.call_extern("uint32", "tkq_vmaxu2", pair[2], pair[3]))
            return T.max(m & _u(T, 0xFFFF), m >> _u(T, 16)) << _u(T, 16)
        # max.NaN of |v| (one FMNMX each, a NaN propagates); its bits are the amax bits
        m = T.abs(vals[base])
        for i in range(1, CHUNK):
            m = T.call_extern("float32", "tkq_max_nan", m, T.abs(vals[base + i]))
        return _bits(T, m)

    @T.macro
    def encode_chunk(vals, base, q, codes, st, precomputed, out, obase):
        # out[obase : obase + dpc] <- the data words of the codes of vals[base : base + 8] / sf
        if precomputed != 0:
            for i in T.unroll(CHUNK):
                q[i] = T.ieee_fdiv(vals[base + i], st[0])
        elif swiglu or fmt == "e2m1":
            # x * (1/sf) alone: within 2^-23 of x / sf.  e2m1: the spec's window is 2^-22, and the
            # correction would cost 2 of the ~17 instructions per element of this issue-bound cast;
            # swiglu: y itself is only judged to 2^-18.
            for i in T.unroll(CHUNK):
                q[i] = T.ieee_mul(vals[base + i], st[1])
        else:
            for i in T.unroll(CHUNK):
                q0 = T.ieee_mul(vals[base + i], st[1])
                residual = T.ieee_fmaf(q0, st[0], -vals[base + i])
                q[i] = T.ieee_fmaf(-residual, st[2], q0)
        if fmt == "e4m3":
            for w in T.unroll(2):
                out[obase + w] = T.call_extern("uint32", "tkq_e4m3x2", q[4 * w], q[4 * w + 1]) | (
                    T.call_extern("uint32", "tkq_e4m3x2", q[4 * w + 2], q[4 * w + 3]) << _u(T, 16))
        elif fmt == "e2m1":
            for i in T.unroll(CHUNK):
                codes[i] = _e2m1_nibble(T, q[i])
            # disjoint bit fields: sums, which the compiler turns into IMAD / LEA (an OR costs a shift too)
            pairs = [codes[2 * p] + codes[2 * p + 1] * _u(T, 16) for p in range(4)]
            out[obase] = (pairs[0] + pairs[1] * _u(T, 256)) + (pairs[2] + pairs[3] * _u(T, 256)) * _u(T, 65536)
        else:
            # e5m6: 8 codes h0..h7 in three words (docs/contract/quant.md)
            for i in T.unroll(CHUNK):
                if precomputed != 0:
                    inf_exact = T.Or((_bits(T, vals[base + i]) & _u(T, 0x7FFFFFFF)) == _u(T, F32_INF),
                                     st[0] == T.float32(0))
                    codes[i] = _e5m6_code(T, q[i], inf_exact)
                elif fast_e5m6:
                    codes[i] = _e5m6_code_fast(T, q[i])
                else:
                    codes[i] = _e5m6_code(T, q[i])
            h = [codes[i] for i in range(CHUNK)]
            out[obase] = (h[0] << _u(T, 20)) | (h[1] << _u(T, 8)) | (h[2] >> _u(T, 4))
            out[obase + 1] = (h[2] << _u(T, 28)) | (h[3] << _u(T, 16)) | (h[4] << _u(T, 4)) | (h[5] >> _u(T, 8))
            out[obase + 2] = (h[5] << _u(T, 24)) | (h[6] << _u(T, 12)) | h[7]

    return load_chunk, chunk_values, chunk_amax, encode_chunk


def _block_macros(T, swiglu, scale_of, read_scale, write_scale):
    """(row_of_block, block_scale): a block's row (swiglu: whether it is live, and its weight), and its sf."""

    @T.macro
    def row_of_block(pos, tw, block, valid, has_pos, has_w, cols_mul, cols_shift, rows, live, weight, u):
        # rows[u], live[u], weight[u] of block `block` (swiglu: padding rows are not live)
        rows[u] = T.if_then_else(valid, _fastdiv(T, block, cols_mul, cols_shift), 0)  # row 0: always there
        live[u] = 1
        weight[u] = T.float32(1.0)
        if swiglu:
            if valid and has_pos != 0:
                if pos[rows[u]] < 0:
                    live[u] = 0
                elif has_w != 0:  # has_w: topk_weights' slot count; an index past it is a padding row
                    if pos[rows[u]] < has_w:
                        weight[u] = tw[pos[rows[u]]]
                    else:
                        live[u] = 0

    @T.macro
    def block_scale(amax, valid, lane_in_group, precomputed, sf32, sf8, sf_mode, row, col, s0, s1, round_sf,
                    clamp_bits, st, ue):
        # st, ue <- the block's sf (computed and written by the group's first lane, or read)
        if precomputed != 0:
            if valid:
                read_scale(sf32, sf8, sf_mode, row, col, s0, s1, st, ue)
        else:
            scale_of(amax, round_sf, clamp_bits, st, ue)
            if valid and lane_in_group == 0:
                write_scale(sf32, sf8, sf_mode, row, col, s0, s1, st, ue)

    return row_of_block, block_scale


def _register_path_macros(T, threads, width, dpc, chunk_macros, block_macros):
    """(fast_path, generic_path): blocks of K chunks a lane, held in registers or looped over."""
    load_chunk, chunk_values, chunk_amax, encode_chunk = chunk_macros
    row_of_block, block_scale = block_macros

    @T.macro
    def fast_path(xw, dw, sf32, sf8, pos, tw, num_blocks, lanes_log2, cols, cols_mul, cols_shift, row0, s0, s1,
                  sf_mode, round_sf, clamp_bits, with_data, precomputed, hidden_chunks, row_pad, has_pos, has_w,
                  do_count, clamp, cta, tx, kf, nsteps, counts):
        # kf chunks per lane and block (static), nsteps blocks per lane; every load is issued first.
        # Out-of-range lanes load chunk 0 of row 0 (always there) instead of branching, and store nothing.
        lanes = 1 << lanes_log2
        lane_in_group = tx & (lanes - 1)
        groups = threads >> lanes_log2  # blocks per CTA step
        words = T.alloc_local((nsteps * kf, width), "uint32")
        vals = T.alloc_local((kf * CHUNK,), "float32")
        q = T.alloc_local((CHUNK,), "float32")
        st = T.alloc_local((3,), "float32")
        ue = T.alloc_local((1,), "uint32")
        codes = T.alloc_local((CHUNK,), "uint32")
        out = T.alloc_local((kf * dpc,), "uint32")
        rows = T.alloc_local((nsteps,), "int32")
        live = T.alloc_local((nsteps,), "int32")
        weight = T.alloc_local((nsteps,), "float32")
        amax = T.alloc_var("uint32", init=0)
        for u in T.unroll(nsteps):
            block = (cta * nsteps + u) * groups + (tx >> lanes_log2)
            row_of_block(pos, tw, block, block < num_blocks, has_pos, has_w, cols_mul, cols_shift, rows, live, weight,
                         u)
            for k in T.unroll(kf):
                chunk = T.if_then_else(block < num_blocks, (block * lanes + lane_in_group) * kf + k, 0)
                if live[u] != 0:
                    load_chunk(xw, words, u * kf + k, chunk, rows[u], hidden_chunks, row_pad)
        for u in T.unroll(nsteps):
            block = (cta * nsteps + u) * groups + (tx >> lanes_log2)
            valid = block < num_blocks
            amax = _u(T, 0)
            for k in T.unroll(kf):
                chunk_values(words, u * kf + k, vals, k * CHUNK, live[u] != 0, weight[u], clamp, counts,
                             T.And(do_count != 0, valid))
                amax = T.max(amax, chunk_amax(words, u * kf + k, vals, k * CHUNK))
            amax = T.if_then_else(valid, amax, _u(T, 0))
            for s in T.unroll(5):
                if s < lanes_log2:
                    amax = T.max(amax, T.shfl_xor(amax, 1 << s))
            block_scale(amax, valid, lane_in_group, precomputed, sf32, sf8, sf_mode, row0 + rows[u],
                        block - rows[u] * cols, s0, s1, round_sf, clamp_bits, st, ue)
            if with_data != 0:
                for k in T.unroll(kf):
                    encode_chunk(vals, k * CHUNK, q, codes, st, precomputed, out, k * dpc)
                if valid:
                    # the lane's kf chunks are contiguous: one vector store of kf * dpc words
                    for v in T.vectorized(kf * dpc):
                        dw[(block * lanes + lane_in_group) * (kf * dpc) + v] = T.Cast("int32", out[v])

    @T.macro
    def generic_path(xw, dw, sf32, sf8, pos, tw, num_blocks, lanes_log2, blk_k, cols, cols_mul, cols_shift, row0, s0,
                     s1, sf_mode, round_sf, clamp_bits, with_data, precomputed, hidden_chunks, row_pad, has_pos, has_w,
                     do_count, clamp, cta, tx, counts):
        # Any K (L = gcd(npc / 8, 32)): a loop over the block's chunks for the amax, then a second one
        # (its loads hit L1 / L2) that quantises.  GENERIC_STEPS blocks per lane.
        lanes = 1 << lanes_log2
        lane_in_group = tx & (lanes - 1)
        groups = threads >> lanes_log2
        words = T.alloc_local((1, width), "uint32")
        vals = T.alloc_local((CHUNK,), "float32")
        q = T.alloc_local((CHUNK,), "float32")
        st = T.alloc_local((3,), "float32")
        ue = T.alloc_local((1,), "uint32")
        codes = T.alloc_local((CHUNK,), "uint32")
        out = T.alloc_local((dpc,), "uint32")
        rows = T.alloc_local((1,), "int32")
        live = T.alloc_local((1,), "int32")
        weight = T.alloc_local((1,), "float32")
        amax = T.alloc_var("uint32", init=0)
        for u in T.serial(GENERIC_STEPS):
            block = (cta * GENERIC_STEPS + u) * groups + (tx >> lanes_log2)
            valid = block < num_blocks
            row_of_block(pos, tw, block, valid, has_pos, has_w, cols_mul, cols_shift, rows, live, weight, 0)
            amax = _u(T, 0)
            if valid:
                for k in T.serial(blk_k):
                    chunk = (block * blk_k + k) * lanes + lane_in_group
                    if live[0] != 0:
                        load_chunk(xw, words, 0, chunk, rows[0], hidden_chunks, row_pad)
                    chunk_values(words, 0, vals, 0, live[0] != 0, weight[0], clamp, counts, do_count != 0)
                    amax = T.max(amax, chunk_amax(words, 0, vals, 0))
            for s in T.unroll(5):
                if s < lanes_log2:
                    amax = T.max(amax, T.shfl_xor(amax, 1 << s))
            block_scale(amax, valid, lane_in_group, precomputed, sf32, sf8, sf_mode, row0 + rows[0],
                        block - rows[0] * cols, s0, s1, round_sf, clamp_bits, st, ue)
            if valid and with_data != 0:
                for k in T.serial(blk_k):
                    chunk = (block * blk_k + k) * lanes + lane_in_group
                    if live[0] != 0:
                        load_chunk(xw, words, 0, chunk, rows[0], hidden_chunks, row_pad)
                    chunk_values(words, 0, vals, 0, live[0] != 0, weight[0], clamp, counts, False)
                    encode_chunk(vals, 0, q, codes, st, precomputed, out, 0)
                    for v in T.unroll(dpc):
                        dw[chunk * dpc + v] = T.Cast("int32", out[v])

    return fast_path, generic_path


def _row_path_macro(T, threads, width, dpc, per_thread, swiglu, vals_stride, chunk_macros, block_macros):
    """row_path: one row (one block) per team of warps, its chunks spread over the team's threads."""
    load_chunk, chunk_values, chunk_amax, encode_chunk = chunk_macros
    row_of_block, block_scale = block_macros

    @T.macro
    def row_path(xw, dw, sf32, sf8, pos, tw, red, num_blocks, team_log2, blk_chunks, cols, cols_mul, cols_shift,
                 row0, s0, s1, sf_mode, round_sf, clamp_bits, with_data, precomputed, hidden_chunks, row_pad, has_pos,
                 has_w, do_count, clamp, cta, tx, counts):
        # A team of 2^team_log2 threads (whole warps, host: 32 <= team <= threads) per block of
        # blk_chunks chunks; thread j of the team takes the block's chunks j, j + team, ... (a warp's
        # loads of one slot are 512 contiguous bytes), at most `per_thread` of them (the host picks the
        # team so), all loaded before any is used.  The amax meets across the team's warps in shared
        # memory.  One block per team, so the CTA's single barrier is reached by every thread.
        team = 1 << team_log2
        lane_in_team = tx & (team - 1)
        block = cta * (threads >> team_log2) + (tx >> team_log2)
        valid = block < num_blocks
        words = T.alloc_local((per_thread, width), "uint32")
        # swiglu keeps y (its values cost ~30 instructions each); x's values are the words themselves
        vals = T.alloc_local(((per_thread if swiglu else 1) * CHUNK,), "float32")
        q = T.alloc_local((CHUNK,), "float32")
        st = T.alloc_local((3,), "float32")
        ue = T.alloc_local((1,), "uint32")
        codes = T.alloc_local((CHUNK,), "uint32")
        out = T.alloc_local((dpc,), "uint32")
        rows = T.alloc_local((1,), "int32")
        live = T.alloc_local((1,), "int32")
        weight = T.alloc_local((1,), "float32")
        amax = T.alloc_var("uint32", init=0)
        row_of_block(pos, tw, block, valid, has_pos, has_w, cols_mul, cols_shift, rows, live, weight, 0)
        for k in T.unroll(per_thread):
            if valid and k * team + lane_in_team < blk_chunks and live[0] != 0:
                load_chunk(xw, words, k, block * blk_chunks + k * team + lane_in_team, rows[0], hidden_chunks,
                           row_pad)
        amax = _u(T, 0)
        for k in T.unroll(per_thread):
            if valid and k * team + lane_in_team < blk_chunks:
                chunk_values(words, k, vals, k * vals_stride, live[0] != 0, weight[0], clamp, counts,
                             do_count != 0)
                amax = T.max(amax, chunk_amax(words, k, vals, k * vals_stride))
        if precomputed == 0:
            for s in T.unroll(5):
                amax = T.max(amax, T.shfl_xor(amax, 1 << s))
            if (tx & (WARP - 1)) == 0:
                red[tx >> 5] = amax
            T.sync_threads()
            # the team's warps are red[first : first + team / 32]
            for w in T.unroll(threads // WARP):
                if w < (team >> 5):
                    amax = T.max(amax, red[((tx >> team_log2) << (team_log2 - 5)) + w])
        block_scale(amax, valid, lane_in_team, precomputed, sf32, sf8, sf_mode, row0 + rows[0],
                    block - rows[0] * cols, s0, s1, round_sf, clamp_bits, st, ue)
        if with_data != 0:
            for k in T.unroll(per_thread):
                if valid and k * team + lane_in_team < blk_chunks:
                    if not swiglu:
                        chunk_values(words, k, vals, 0, True, weight[0], clamp, counts, False)
                    encode_chunk(vals, k * vals_stride, q, codes, st, precomputed, out, 0)
                    for v in T.unroll(dpc):
                        dw[(block * blk_chunks + k * team + lane_in_team) * dpc + v] = T.Cast("int32", out[v])

    return row_path


def build_token_cast(config: TokenConfig):
    """prim_func of the per-token cast (source x) or SwiGLU + per-token cast (source swiglu)."""
    T = _tilelang.T()
    source, dtype, fmt, threads, steps, min_blocks, static_precomputed = config[:7]
    fast_e5m6 = config.fast_e5m6 and fmt == "e5m6"
    swiglu = source == "swiglu"
    wpc = WORDS_PER_CHUNK[dtype]
    dpc = DATA_WORDS_PER_CHUNK[fmt]
    bf16 = dtype == "bfloat16"
    width = 2 * wpc if swiglu else wpc  # words a slot holds (swiglu: l, then r)
    fast_ks = fast_paths(source, dtype)
    fast_chunks = FAST_CHUNKS_PER_LANE[source, dtype] * threads * steps
    per_thread = row_chunks(source, dtype)
    vals_stride = CHUNK if swiglu else 0  # row path: where chunk k's values start in vals
    n_xw, n_dw, n_s32, n_s8, n_pos, n_tw, n_cnt = T.dynamic("n_xw, n_dw, n_s32, n_s8, n_pos, n_tw, n_cnt")
    # the quotient is x * (1/sf) alone for swiglu and e2m1 (see encode_chunk), with a correction otherwise
    scale_of, read_scale, write_scale = _scale_macros(T, fmt, exact_reciprocal=not (swiglu or fmt == "e2m1"))

    chunk_macros = _chunk_macros(T, fmt, bf16, swiglu, wpc, fast_e5m6)
    block_macros = _block_macros(T, swiglu, scale_of, read_scale, write_scale)
    fast_path, generic_path = _register_path_macros(T, threads, width, dpc, chunk_macros, block_macros)
    row_path = _row_path_macro(T, threads, width, dpc, per_thread, swiglu, vals_stride, chunk_macros, block_macros)

    # The two sources differ in their arguments only; one body serves both.
    @T.macro
    def kernel_body(xw, dw, sf32, sf8, pos, tw, cnt, num_chunks, num_blocks, path, lanes_log2, blk_k, cols, cols_mul,
                    cols_shift, row0, s0, s1, sf_mode, round_sf, clamp_min, with_data, precomputed, hidden_chunks,
                    row_pad, has_pos, has_w, do_count, clamp):
        # chunks per CTA: generic GENERIC_STEPS * threads * K; row path one block (blk_k chunks) per team of
        # 2^lanes_log2 threads; fast paths FAST_CHUNKS_PER_LANE * threads * steps
        chunks_per_cta = T.if_then_else(path == 0, GENERIC_STEPS * threads * blk_k, T.if_then_else(
            path == ROW_PATH, (threads >> lanes_log2) * blk_k, fast_chunks))
        with T.Kernel(T.ceildiv(num_chunks, chunks_per_cta), threads=threads, prelude=PRELUDE) as cta:
            # at most 85 registers: 3 CTAs (24 warps) per SM for the K = 4 paths (ptxas: no spills)
            T.annotate_min_blocks_per_sm(min_blocks)
            tx = T.get_thread_binding()
            counts = T.alloc_local((3,), "int32")
            red = T.alloc_shared((threads // WARP,), "uint32")  # row path: the warps' amaxes
            clamp_bits = _bits(T, clamp_min)
            for i in T.unroll(3):
                counts[i] = 0
            if path == 0:
                generic_path(xw, dw, sf32, sf8, pos, tw, num_blocks, lanes_log2, blk_k, cols, cols_mul, cols_shift,
                             row0, s0, s1, sf_mode, round_sf, clamp_bits, with_data, precomputed, hidden_chunks,
                             row_pad, has_pos, has_w, do_count, clamp, cta, tx, counts)
            elif path == ROW_PATH:
                row_path(xw, dw, sf32, sf8, pos, tw, red, num_blocks, lanes_log2, blk_k, cols, cols_mul, cols_shift,
                         row0, s0, s1, sf_mode, round_sf, clamp_bits, with_data, precomputed, hidden_chunks, row_pad,
                         has_pos, has_w, do_count, clamp, cta, tx, counts)
            elif path == 2:
                fast_path(xw, dw, sf32, sf8, pos, tw, num_blocks, lanes_log2, cols, cols_mul, cols_shift, row0, s0,
                          s1, sf_mode, round_sf, clamp_bits, with_data, precomputed, hidden_chunks, row_pad, has_pos,
                          has_w, do_count, clamp, cta, tx, 2, fast_chunks // (2 * threads), counts)
            elif 4 in fast_ks:
                fast_path(xw, dw, sf32, sf8, pos, tw, num_blocks, lanes_log2, cols, cols_mul, cols_shift, row0, s0,
                          s1, sf_mode, round_sf, clamp_bits, with_data, precomputed, hidden_chunks, row_pad, has_pos,
                          has_w, do_count, clamp, cta, tx, 4, fast_chunks // (4 * threads), counts)
            if swiglu:
                if do_count != 0:
                    for i in T.unroll(3):
                        total = T.warp_reduce_sum(counts[i])
                        if (tx & (WARP - 1)) == 0 and total != 0:
                            T.atomic_add(cnt[i], T.Cast("int64", total))

    if swiglu:
        @T.prim_func
        def token_cast_swiglu(
            xw: T.Tensor((n_xw,), "int32"),
            dw: T.Tensor((n_dw,), "int32"),
            sf32: T.Tensor((n_s32,), "float32"),
            sf8: T.Tensor((n_s8,), "uint8"),
            pos: T.Tensor((n_pos,), "int32"),
            tw: T.Tensor((n_tw,), "float32"),
            cnt: T.Tensor((n_cnt,), "int64"),
            num_chunks: T.int32,
            num_blocks: T.int32,
            path: T.int32,
            lanes_log2: T.int32,
            blk_k: T.int32,
            cols: T.int32,
            cols_mul: T.int64,
            cols_shift: T.int64,
            row0: T.int32,
            s0: T.int64,
            s1: T.int64,
            sf_mode: T.int32,
            round_sf: T.int32,
            clamp_min: T.float32,
            hidden_chunks: T.int32,
            row_pad: T.int32,
            has_pos: T.int32,
            has_w: T.int32,
            do_count: T.int32,
            clamp: T.float32,
        ):
            T.annotate_pass_configs(PASS_CONFIGS)
            kernel_body(xw, dw, sf32, sf8, pos, tw, cnt, num_chunks, num_blocks, path, lanes_log2, blk_k, cols,
                        cols_mul, cols_shift, row0, s0, s1, sf_mode, round_sf, clamp_min, 1, 0, hidden_chunks, row_pad,
                        has_pos, has_w, do_count, clamp)

        return token_cast_swiglu

    @T.prim_func
    def token_cast_x(
        xw: T.Tensor((n_xw,), "int32"),
        dw: T.Tensor((n_dw,), "int32"),
        sf32: T.Tensor((n_s32,), "float32"),
        sf8: T.Tensor((n_s8,), "uint8"),
        num_chunks: T.int32,
        num_blocks: T.int32,
        path: T.int32,
        lanes_log2: T.int32,
        blk_k: T.int32,
        cols: T.int32,
        cols_mul: T.int64,
        cols_shift: T.int64,
        row0: T.int32,
        s0: T.int64,
        s1: T.int64,
        sf_mode: T.int32,
        round_sf: T.int32,
        clamp_min: T.float32,
        with_data: T.int32,
        precomputed: T.int32,
        row_pad: T.int32,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        kernel_body(xw, dw, sf32, sf8, None, None, None, num_chunks, num_blocks, path, lanes_log2, blk_k, cols,
                    cols_mul, cols_shift, row0, s0, s1, sf_mode, round_sf, clamp_min, with_data,
                    precomputed if static_precomputed == 2 else static_precomputed, 0, row_pad, 0, 0, 0,
                    T.float32(0))

    return token_cast_x


TOKEN_CAST = KernelDef("quant.token_cast", build_token_cast, TOKEN_CONFIGS + TOKEN_TUNE_CONFIGS,
                       candidates=TOKEN_TUNE_CONFIGS)


# (source, dtype, fmt, precomputed) -> the configuration to use instead of the default: set by
# benchmarks/tune.py while it times a candidate (any config of TOKEN_CAST.configs).
TOKEN_OVERRIDES: dict[tuple[str, str, str, int], TokenConfig] = {}


def token_config(source: str, dtype: str, fmt: str, precomputed: bool = False) -> TokenConfig:
    """The configuration of a token_cast call: the shipped one, unless a tuning run overrides it."""
    key = (source, dtype, fmt, int(precomputed))
    return TOKEN_OVERRIDES.get(key) or (TokenConfig(source, dtype, fmt, precomputed=1) if precomputed
                                        else _shipped(source, dtype, fmt))
