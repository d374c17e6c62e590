"""Quantisation kernels in TileLang: per-token, per-block and per-channel casts to
e4m3 / e2m1 / e5m6 with block scale factors, cast_back, and SwiGLU fused with a
per-token cast.

Signatures, argument checks (the same TypeError / ValueError, naming the
argument: kernels/torch/quant.py's own check functions are called), return
conventions and layouts are those of ``kernels/torch/quant.py`` (its module
docstring is the contract); how outputs are judged is
``tkverify/specs/quant.py``.  In addition every tensor must be on one CUDA
device and every dimension fit an int32.

Numerics (every kernel)
-----------------------
* amax on the fp32 bits: |x| is ``bits & 0x7FFFFFFF`` (for bf16 input, on the
  raw halves: a per-halfword unsigned max), whose integer order is the order
  of the magnitudes with every NaN above +inf; for computed values (fp32
  input, SwiGLU's y) a ``max.NaN`` of |v|.  Either way a NaN reaches the amax
  (no maxNum that drops it), and a block is non-finite iff its amax bits are
  >= 0x7F800000.  a = max(amax, clamp_min) is an integer max of the bits.
* sf of a non-finite block: NaN (ue8m0 0xFF), and so is its reciprocal: every
  quotient of the block is NaN (e2m1, which has no NaN, gets code 7 there).
* plain sf = a / max_q by IEEE division (``__fdiv_rn``).  The quotient x / sf:
  - e4m3, e5m6: q = x * r (``__fmul_rn``, r = ``__fdiv_rn(1, sf)``) and one
    Markstein correction q' = q - (q * sf - x) * r (two ``__fmaf_rn``): with r
    the correctly rounded reciprocal and q within an ULP, the residual is
    exact and q' is the correctly rounded quotient, as an IEEE division gives.
    The residual is exact unless x is tiny (|x| <~ 2^-100); the correction is
    applied in blocks with a >= 2^-60, where every x that can round to a
    non-zero code is large enough.  Below that (tiny clamp_min) q alone is
    within 2^-23 of x / sf.  The negated form keeps -0 a -0.
  - e2m1 and SwiGLU: q = x * r alone, r = rcp.approx(sf) (within 1 ULP): q is
    within 1.5 * 2^-23 of x / sf, inside the spec's 2^-22 window (a code may
    be the neighbour where x / sf lies that close to a rounding boundary; the
    report counts those); for SwiGLU y itself is judged to 2^-18.  These two
    casts are issue-bound, and the correction would cost 2 of their ~17
    (e2m1) and ~30 (SwiGLU) instructions per element.
* round_sf: sf = 2^k with k the least integer such that max_q * 2^k >= a, read
  off the bits exactly: with a = 1.m_a * 2^e_a and max_q = 1.m_q * 2^e_q,
  k = e_a - e_q + (m_a > m_q).  sf and 1 / sf are built from exponent bits
  (both normal: a >= max_q * 2^-126 by the clamp_min check), so x * 2^-k is
  the exact quotient (the correction then adds an exact zero).
* ue8m0 byte: the biased exponent k + 127 of that power of two (0xFF for NaN),
  never a cast.  Packed: byte c of a row goes to byte c % 4 of int32 word
  c / 4 (little-endian), written as a byte into the int32 storage; the padding
  bytes of a last partial word come from the wrapper's torch.zeros.
* sf layouts: sf element (row, col) is at row * s0 + col * s1 (sf elements,
  int64) of the flat storage, so the row-major and the TMA-aligned
  column-major layouts (and, for a precomputed sf read as input, any strides)
  are one code path.  A precomputed ue8m0 byte b reads as 2^(b - 127) (0: the
  subnormal 2^-127; 0xFF: NaN).
* Rounding to the element formats, all round-to-nearest-even with satfinite:
  - e4m3: the hardware conversion ``cvt.rn.satfinite.e4m3x2.f32`` (sm_89+, one
    instruction for two values): RNE in every range including subnormals,
    finite overflow and +-inf to +-448, NaN to NaN (PTX ISA, cvt).  Prelude
    ``tkq_e4m3x2``, with a bit-exact integer model for other targets and the
    CPU emulation.
  - e2m1 (no conversion instruction on sm_90): y = min(|q|, 6) (every value
    past 5 rounds to 6; NaN gives 6); with M = 2^23 the fp32 operations
    fma(y, 2, M), y + (M + 2) and fma(y, 1/2, M + 4) round 2y, y and y/2 to
    integers (RNE, in the adder): the e2m1 grids of [0, 2), [2, 4) and [4, 8)
    offset by each binade's first code.  Each over-estimates the code outside
    its binade, so the code is the low 3 bits of the least of the three (one
    3-input integer min); the sign (bit 3 of q >> 28) is muxed in with one
    LOP3.  Exact for subnormal quotients (e2m1 at sf = 2^-126) as everywhere.
  - e5m6 (never via fp16, which would round twice): C = 2^(max(e, -14) + 17),
    e the binade of |q| (clamped at 2^16), makes the fp32 adder round |q| + C
    at e5m6's spacing in that binade (RNE, subnormals included); the code is
    bits(|q| + C) - bits(C) plus the binade's first code, saturated at 0x7BF
    (65024).  NaN -> 0x7E0; an exactly infinite quotient (a precomputed sf of
    0, or x = +-inf) -> 0x7C0 (an fp32 overflow of a finite one saturates);
    sign 0x800.
    TokenConfig.fast_e5m6 (precomputed = 0 only; shipped for bf16 x, see TUNED): `_e5m6_code_fast`,
    the same code for every fp32 q without a per-element branch (r = (a + C) - C, bits(r * 2^-112) =
    code << 17; ~156 instead of ~212 SASS instructions per 8-element chunk of the row path).
* No flush-to-zero where it matters: tilelang compiles without
  --use_fast_math, and every rounding-sensitive operation is an explicit
  ``_rn`` intrinsic (never contracted into an FMA).  The only .ftz operations
  are the rcp.approx of sf (a normal number with a normal reciprocal) and of
  SwiGLU's 1 + exp(-l) (a flushed sigmoid is inside the spec's allowance).

per-token casts and swiglu_forward_and_per_token_cast (kernel quant.token_cast)
-------------------------------------------------------------------------------
x is read as 32-bit words in *chunks* of 8 consecutive elements (16 bytes of
bf16, 32 of fp32); every load is a 16-byte vector.  A block of npc = 8 * L * K
elements (H % 8 == 0) belongs to a group of L consecutive lanes of a warp (a
power of two), each lane taking K chunks of it.  The group's amax is reduced
with ``__shfl_xor_sync`` (every lane of the warp takes part, lanes past the
end with 0), every lane computes the sf, and the group's first lane writes it.

* Fast paths (``path`` = K): the K chunks stay in registers.  bf16: K = 4
  (npc / 32 a power of two <= 32: npc 32 .. 1024), else K = 2 (npc 16, or
  npc / 16 a power of two); fp32: K = 2.  Lane j of block b takes the K
  contiguous chunks b * L * K + j * K + k, so that its codes leave in one
  vector store (e2m1 K = 4: 16 bytes; e4m3: 2 x 16; e5m6: 3 x 16) and a warp
  stores contiguous bytes.  A 256-thread CTA takes 1024 chunks (bf16; 512 for
  fp32: 64 bytes of input per lane, 128 for fp32 swiglu), every load issued
  first and unconditionally (lanes past the end load chunk 0 and store
  nothing: no branch for the compiler to schedule around).  Then per block:
  amax, shuffles, sf, the 8K quotients and codes, the store.  At most 85
  registers (3 CTAs per SM).
* Row path (ROW_PATH = 1; npc = H not of that form, 32 <= H / 8 <= R * threads):
  a team of L threads (whole warps, L the least power of two >= 32 with
  L * R >= H / 8; R = `row_chunks`, 32 words of input per thread: 8 chunks of
  bf16 x, 4 of fp32 x or bf16 swiglu, 2 of fp32 swiglu) owns one row; thread j
  holds the row's chunks j, j + L, ... (at most R, a warp's loads of one slot
  are 512 contiguous bytes), every load issued before any use.  The warps'
  amaxes meet in shared memory (one barrier: one row per team, and every
  thread reaches it); the sf is computed by every thread, written by the
  team's first.  x's values are re-derived from the words for the encoding;
  swiglu's y is kept.  16384 x 7168 bf16: L = 128, 7 chunks per thread, two
  rows per 256-thread CTA.  The codes are stored chunk by chunk (e5m6: three
  words, a warp's stores of one slot contiguous).
* Generic path (0; rows of fewer than 32 chunks, or longer than a row path
  holds): L = gcd(npc / 8, 32), lane j's chunk k of block b is chunk
  (b * K + k) * L + j (a warp's loads of one k are contiguous); a loop over the
  K chunks for the amax, one load at a time, then a second loop (its loads hit
  L1 / L2) that quantises and stores chunk by chunk.
* H % 8 != 0 (only with npc = H): the wrapper zero-pads the rows to a
  multiple of 8 (zeros do not move an amax) and crops the data.
* sf_only skips the data stores; precomputed sf reads each block's sf (fp32,
  ue8m0 or packed, any strides) and divides (``__fdiv_rn``: sf = 0,
  subnormal, inf or NaN give what IEEE division gives).

SwiGLU is the same kernel with another source of values: block b of y is in
row b / cols (a multiply-shift division) of x (N, 2H); a chunk reads 8 values
of l = x[row, :H] and of r = x[row, H:] and computes, in fp32,
l = min.NaN(l, c), r = max.NaN(min.NaN(r, c), -c) (a NaN stays NaN; without a
clamp c = +inf), y = ((l * sigmoid(l)) * r) * w with sigmoid(l) =
rcp.approx(1 + expf(-l)) (libdevice's accurate expf, not __expf) and each
product ``__fmul_rn``.  Rows whose pos_to_token_topk is -1 are padding: not
read, y = 0 (codes +0, the sf of a zero block), not counted.  The clamp counts
(l > c, r > c, r < -c, before clamping) are per-thread int32, summed over the
warp and added to the int64 clamped_count with one atomicAdd per warp and
counter (int64 all the way, so no count can overflow).
The routed call runs the same compiled kernel and path as the plain one (has_pos, has_w,
do_count and clamp are runtime arguments; the path depends on npc alone), with one pos and one
weight read per lane and block, and 3 compares per element when counting.  Its wrapper is
slower: the pos_to_token_topk range check reads pos on the host (docs/DECISIONS.md), a device
sync, so the call cannot be captured in a CUDA graph and its eager time holds the sync and the
host work after it (the bench's routed row: 250-334 us eager, never a graph time; the plain
call: 55 us in a graph).
benchmarks.tune's routed group times the call without the check, in a graph.

per_block_cast / per_channel_cast (kernel quant.block_cast)
-----------------------------------------------------------
Blocks of bm x bk, bm in {16, 32, 64, 128}, bk in {1, 32, 128}.  A CTA (256 threads) takes a
tile of 128 rows (whole blocks: bm divides 128) by 128 columns (whole blocks: bk divides 128);
thread t owns the chunk of 8 consecutive columns 8 (t % 16) in the 8 rows 8 (t / 16) .. + 7
(`BlockConfig`: threads and rows per thread; the tile is always 128 rows by 8 * lanes columns).
* Loads: the thread's 8 chunks are loaded first, all of them before any use, and stay in
  registers until they are quantised: x is read from DRAM once.  Vector path (H % 8 == 0,
  chosen on the host): one 16-byte load per chunk (two for fp32) of a flat int32 view.
  Element path (any H: per_channel's odd H, e2m1's H = 2 mod 8): element loads into the same
  registers, guarded per element.  Rows past T and columns past H read as 0 (no amax moves).
* amax: per column over the thread's rows (bf16: per-halfword max of the raw words), then
  per block: bk = 1: each column is a block slot; bk >= 32: the chunk's max, reduced over the
  block's bk / 8 lanes with shuffles.  Each row group writes its slots to shared memory; one
  thread per block of the tile takes the max over the block's bm / 8 row groups, computes the
  sf (`scale_of`), writes it (`write_scale`) and puts sf, 1 / sf and the correction factor in
  shared memory, where every thread reads those of its 8 columns.
* Quantise: q = x * r with the Markstein correction for both formats (these kernels are not
  issue-bound), codes by `tkq_e4m3x2` / `_e2m1_nibble`; vector path: one 8-byte (e4m3) or
  4-byte (e2m1) store per chunk; element path: byte stores, guarded.
The work split changes no arithmetic: every configuration gives the same bits (the 4 shipped
ones, input dtype x format, and the 2 tuning candidates `BLOCK_TUNE_CONFIGS`).  Registers
(ptxas, sm_90): bf16 80 (3 CTAs per SM, 96 KB of input in flight), fp32 <= 128 (2 CTAs).  A
launch on the vector path covers fewer than 2^31 elements (its flat views have int32 sizes).

cast_back (kernel quant.cast_back)
----------------------------------
The flat T * H output in *chunks* of w consecutive elements, one 16-byte vector store each (w = 8
for bf16, 4 for fp32); a chunk's codes come in one load (e4m3: w bytes, e2m1: w / 2, e5m6: 8
codes in three 32-bit words, 4 codes in two of them).  A thread takes K chunks, (cta * K + k) *
threads + t, a warp's loads and stores of one k contiguous; every data load (and every per-chunk
sf read) is issued before the first chunk is converted (K and the CTA size per configuration:
``CastBackConfig``).  Three paths, a kernel each, chosen by the wrapper:

* H % w == 0, bk > 1 (every (1, bk), (1, H) and 2-D block; bk is then a multiple of w): a chunk
  lies in one row (its index / (H / w) by a multiply-shift) and one sf block: one sf read per chunk.
* H % w == 0, bk == 1 ((bm, 1) blocks): an sf read per element (consecutive, L1 hits).
* H % w != 0 (e4m3 and e2m1 with (bm, 1) or (1, H) blocks only): chunks still start at multiples
  of w of the flat tensor, so the vectors stay aligned; each element's row is its index / H, and
  the last T * H % w elements are done one by one by one thread.

Decoding is exact: e4m3 by ``cvt.rn.f16x2.e4m3x2`` (every e4m3 value is an f16), e2m1 by one byte
permutation of a table of the magnitudes' f16 high bytes, e5m6 as the f16 with bits code << 4; then
f16 -> fp32.  fp32 out: q * sf by ``__fmul_rn``.  bf16 out: q * sf rounded to odd into fp32, then
``cvt.rn.bf16x2.f32`` (RNE): one correct rounding (a double rounding through RNE fp32 would not
be).  Round to odd: t = ``__fmul_rz``(q, sf) and the sticky bit from r = fma(q, sf, -t) != 0, which
is exact when |sf| is a finite fp32 >= 2^-100 (q * sf is then a multiple of 2^-143); other sf (0,
subnormal, tiny, inf, NaN) take the exact product in fp64 and ``__double2float_rz`` (per chunk,
or per element where each has its own sf).  NaN results are the hardware's canonical NaN.
Launches are whole rows, at most 2^30 elements (int32 indices), a multiple of 8 rows where that
fits so that each starts on a chunk boundary; rows of more than 2^27 elements with H % w != 0 go
through aligned copies.

Launches and sizes
------------------
Indices are int32 within a launch (sf offsets int64); the wrappers cut row
ranges so that one token_cast launch covers at most 2^26 chunks of y and no
grid exceeds 2^31 - 1 CTAs.  T = 0 returns empty outputs without a launch.
Every global access is guarded by hand (tilelang's safe-memory legalisation
is disabled, as in the other kernel families).

Static configurations: token_cast (source x / swiglu, input dtype, format) 12, plus the 6 per-token
casts from a precomputed sf (a kernel of their own since the precomputed path's inline IEEE
divisions, 8K per lane, bloated the hot kernel's code), plus the tuning candidates
(`TOKEN_TUNE_CONFIGS`: threads per CTA, blocks per lane, CTAs per SM),
block_cast (input dtype, format e4m3 / e2m1) 4, cast_back (format, out dtype, path) 16, plus
2 tuning candidates (`CAST_BACK_TUNE_CONFIGS`).
Everything else (npc, block geometry, sf storage, round_sf, layout, clamp_min,
T, H) is a runtime argument.
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.
import functools
import math
import struct
from typing import Any, NamedTuple

import torch

from . import _tilelang
from ._tilelang import KernelDef
from .torch import quant as eager

# ----------------------------------------------------------------- constants

FORMATS = eager.FORMATS
MAX_Q = eager.MAX_Q
IN_DTYPES = {torch.bfloat16: "bfloat16", torch.float32: "float32"}
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}

THREADS = 256
CHUNK = 8  # elements per chunk
VECTOR_BYTES = 16
WARP = 32
WORDS_PER_CHUNK = {"bfloat16": 4, "float32": 8}  # 32-bit words of input per chunk
DATA_WORDS_PER_CHUNK = {"e4m3": 2, "e2m1": 1, "e5m6": 3}
# Fast paths: K chunks per lane and block held in registers (K in fast_paths()); a CTA takes
# FAST_CHUNKS chunks (every lane 64 bytes of input loaded at once; 128 for fp32 swiglu).
FAST_CHUNKS_PER_LANE = {("x", "bfloat16"): 4, ("x", "float32"): 2, ("swiglu", "bfloat16"): 4, ("swiglu", "float32"): 2}
FAST_CHUNKS = {key: chunks * THREADS for key, chunks in FAST_CHUNKS_PER_LANE.items()}
GENERIC_STEPS = 2  # blocks per lane in the generic (two-pass) path
ROW_PATH = 1  # `path` of the row path (fast paths: path = K; generic: 0)
# Row path: 32-bit input words a thread holds in registers (its chunks of one block, all loaded
# at once), as many as the K = 4 fast paths hold for bf16 x at steps = 2.
ROW_WORDS = 32
MAX_CHUNKS_PER_LAUNCH = 2**26  # token_cast: chunks of y per launch (x indices stay below 2^31)


def fast_paths(source: str, dtype: str) -> tuple[int, ...]:
    """Chunks per lane (K) of the register-resident fast paths of a token_cast configuration."""
    return (2, 4) if dtype == "bfloat16" else (2,)


def row_chunks(source: str, dtype: str) -> int:
    """Most chunks of one block a thread of the row path holds (ROW_WORDS words of input)."""
    return ROW_WORDS // (WORDS_PER_CHUNK[dtype] * (2 if source == "swiglu" else 1))


SF_FP32, SF_UE8M0, SF_PACKED = 0, 1, 2

# max_q = 1.m_q * 2^e_q: the exponent and the mantissa bits, for round_sf.
_MAXQ_BITS = {fmt: struct.unpack("<I", struct.pack("<f", value))[0] for fmt, value in MAX_Q.items()}
MAXQ_EXP = {fmt: ((bits >> 23) & 0xFF) - 127 for fmt, bits in _MAXQ_BITS.items()}
MAXQ_MANT = {fmt: bits & 0x7FFFFF for fmt, bits in _MAXQ_BITS.items()}

F32_INF = 0x7F800000
F32_QNAN = 0x7FC00000
# The Markstein correction is applied in blocks with a >= 2^-60 (see the docstring).
CORRECTION_MIN_BITS = (127 - 60) << 23

# --------------------------------------------------------------------- prelude
# Device helpers placed before the generated kernel.  The asm paths are the
# ones compiled for the GPU; the portable paths are bit-exact models used on
# other architectures and by CPU emulation of the generated source.
PRELUDE = r"""
#ifndef TKQ_PRELUDE
#define TKQ_PRELUDE
#if defined(__CUDACC__)
#include <cuda_bf16.h>
#endif
// RNE + satfinite e4m3 code of one float (integer model of the hardware cvt).
__device__ __forceinline__ unsigned tkq_soft_e4m3(float f) {
  unsigned b = __float_as_uint(f);
  unsigned s = (b >> 24) & 0x80u;
  unsigned u = b & 0x7fffffffu;
  if (u > 0x7f800000u) return 0x7fu;                 // NaN
  if (u >= 0x43e00000u) return s | 0x7eu;            // >= 448 (incl. inf): satfinite
  int e = (int)(u >> 23) - 127;
  unsigned code;
  if (e >= -6) {                                     // normal e4m3: keep 3 mantissa bits
    code = ((u + 0x7ffffu + ((u >> 20) & 1u)) >> 20) - (120u << 3);
  } else {                                           // subnormal e4m3: multiples of 2^-9
    unsigned mant = (u & 0x7fffffu) | 0x800000u;
    int sh = 14 - e;
    if (sh > 25) sh = 25;
    code = (mant + (1u << (sh - 1)) - 1u + ((mant >> sh) & 1u)) >> sh;
  }
  if (code > 0x7eu) code = 0x7eu;
  return s | code;
}
// Two e4m3 codes: lo in bits 0-7, hi in bits 8-15.
__device__ __forceinline__ unsigned tkq_e4m3x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 890)
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return (unsigned)r;
#else
  return tkq_soft_e4m3(lo) | (tkq_soft_e4m3(hi) << 8);
#endif
}
// (lo & 7) | (hi & ~7) in one LOP3 (the compiler splits the C form into two).
__device__ __forceinline__ unsigned tkq_mux_low3(unsigned hi, unsigned lo) {
#if defined(__CUDA_ARCH__)
  unsigned r;
  asm("lop3.b32 %0, %1, %2, %3, 0xd8;" : "=r"(r) : "r"(hi), "r"(lo), "r"(7u));
  return r;
#else
  return (lo & 7u) | (hi & ~7u);
#endif
}
// 1 / x to within 1 ULP (rcp.approx.ftz).  Used where x is normal and a result below 2^-126
// either cannot happen (x = sf in [2^-126, 2^126]) or is covered by the spec (swiglu's
// sigmoid 1 / (1 + exp(-l)), whose absolute allowance takes a flushed intermediate).
__device__ __forceinline__ float tkq_rcp_approx(float x) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
#else
  return 1.0f / x;
#endif
}
// NaN-propagating min / max (min.NaN / max.NaN, sm_80+): one FMNMX, and a NaN operand gives NaN.
__device__ __forceinline__ float tkq_min_nan(float a, float b) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return (a != a || b != b) ? __uint_as_float(0x7fffffffu) : (a < b ? a : b);
#endif
}
__device__ __forceinline__ float tkq_max_nan(float a, float b) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return (a != a || b != b) ? __uint_as_float(0x7fffffffu) : (a > b ? a : b);
#endif
}
// Per-halfword unsigned max of two words.
__device__ __forceinline__ unsigned tkq_vmaxu2(unsigned a, unsigned b) {
#if defined(__CUDA_ARCH__)
  return __vmaxu2(a, b);
#else
  unsigned lo = (a & 0xffffu) > (b & 0xffffu) ? (a & 0xffffu) : (b & 0xffffu);
  unsigned hi = (a >> 16) > (b >> 16) ? (a >> 16) : (b >> 16);
  return lo | (hi << 16);
#endif
}
// bf16 bits of q * sf rounded once (RNE): the exact product in fp64, rounded to odd
// into fp32 (toward zero, then the sticky bit), then RNE to bf16.
__device__ __forceinline__ unsigned tkq_bf16_product(float q, float sf) {
  double p = (double)q * (double)sf;
#if defined(__CUDA_ARCH__)
  float t = __double2float_rz(p);
#else
  float t = (float)p;                            // round to nearest, then one step toward zero if it went up
  if (t == t && fabs((double)t) > fabs(p)) t = __uint_as_float(__float_as_uint(t) - 1u);
#endif
  unsigned tb = __float_as_uint(t);
  if ((double)t != p && p == p) tb |= 1u;
#if defined(__CUDA_ARCH__)
  return (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(__uint_as_float(tb)));
#else
  if ((tb & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
  return (tb + 0x7fffu + ((tb >> 16) & 1u)) >> 16;
#endif
}
#endif
"""

# ------------------------------------------------------------------- TIR helpers


def _bits(T, f):
    return T.reinterpret(f, "uint32")


def _f32(T, u):
    return T.reinterpret(u, "float32")


def _u(T, v):
    return T.uint32(v)


def _e2m1_nibble(T, q):
    """e2m1 code (sign in bit 3) of the fp32 quotient q, RNE with satfinite (see the docstring).

    y = min(|q|, 6) (6 saturates: every y > 5 rounds to 6; NaN gives 6); the code
    is the least of the three candidates' low bits, muxed into q >> 28 (whose
    bit 3 is the sign) in one LOP3.
    """
    y = T.min(T.abs(q), T.float32(6.0))
    t1 = _bits(T, T.ieee_fmaf(y, T.float32(2.0), T.float32(2.0**23)))
    t2 = _bits(T, T.ieee_add(y, T.float32(2.0**23 + 2)))
    t3 = _bits(T, T.ieee_fmaf(y, T.float32(0.5), T.float32(2.0**23 + 4)))
    code = T.min(T.min(t1, t2), t3)
    # q >> 28 has the sign in bit 3; its bits 0-2 are replaced by the code's
    return T.call_extern("uint32", "tkq_mux_low3", _bits(T, q) >> _u(T, 28), code)


def _e5m6_code(T, q, inf_exact=None):
    """12-bit e5m6 code of the fp32 quotient q, RNE with satfinite (see the docstring).

    inf_exact: where the exact quotient is infinite (precomputed sf only); an
    infinite q elsewhere is an fp32 overflow of a finite quotient and saturates.
    """
    b = _bits(T, q)
    u = b & _u(T, 0x7FFFFFFF)
    uc = T.min(u, _u(T, 0x47800000))  # 2^16: past the top, keeps C finite
    e = T.max(uc >> _u(T, 23), _u(T, 113))  # biased binade, at least e5m6's emin (-14)
    c_bits = (e + _u(T, 17)) << _u(T, 23)  # C = 2^(e - 127 + 17): ulp(C) is the e5m6 spacing
    v = T.ieee_add(_f32(T, uc), _f32(T, c_bits))
    code = T.min(_bits(T, v) - c_bits + ((e - _u(T, 113)) << _u(T, 6)), _u(T, 0x7BF))
    code = T.if_then_else(T.Cast("int32", u) > F32_INF, _u(T, 0x7E0), code)
    if inf_exact is not None:
        code = T.if_then_else(T.And(inf_exact, u == _u(T, F32_INF)), _u(T, 0x7C0), code)
    return code | ((b >> _u(T, 20)) & _u(T, 0x800))


def _e5m6_code_fast(T, q):
    """The 12-bit e5m6 code `_e5m6_code(T, q)` gives (inf_exact None), with fewer instructions and no branch.

    a = min.NaN(|q|, 65024) (one FMNMX: satfinite, a NaN stays NaN); C = 2^(max(e, -14) + 17) from
    a's exponent bits (e its binade); r = (a + C) - C is a rounded at e5m6's spacing in that binade
    (RNE in the fp32 adder, subnormals included, r <= 65024; exact subtraction); t = r * 2^-112 is
    exact, and its bits are code << 17: for r >= 2^-14 an fp32 normal whose exponent field is the
    e5m6 one and whose 6 top mantissa bits are e5m6's, for r < 2^-14 (a multiple of 2^-20) an fp32
    subnormal k * 2^-132, bits k << 17.  NaN: t is the canonical NaN 0x7FFFFFFF, which the integer min
    with 0x7E0 << 17 turns into the NaN code (every finite t is below it: t <= 65024 * 2^-112).
    Sign 0x800 as in `_e5m6_code`.  Checked equal to `_e5m6_code` on all 2^32 fp32 patterns of q
    and to the float64 oracle on the finite ones (scripts/e5m6_encode_check.py).
    """
    b = _bits(T, q)
    a = T.call_extern("float32", "tkq_min_nan", T.abs(q), T.float32(65024.0))
    c_bits = T.max((_bits(T, a) & _u(T, 0x7F800000)) + _u(T, 0x08800000), _u(T, 0x41000000))
    c = _f32(T, c_bits)
    r = T.ieee_sub(T.ieee_add(a, c), c)
    t = T.min(_bits(T, T.ieee_mul(r, T.float32(2.0**-112))), _u(T, 0x7E0 << 17))
    return (t >> _u(T, 17)) | ((b >> _u(T, 20)) & _u(T, 0x800))


def _ue8m0_value(T, byte):
    """fp32 value 2^(byte - 127) of a ue8m0 byte (uint32); 0xFF is NaN, 0 is 2^-127."""
    return _f32(T, T.if_then_else(
        byte == _u(T, 0xFF), _u(T, F32_QNAN),
        T.if_then_else(byte == _u(T, 0), _u(T, 0x00400000), byte << _u(T, 23))))


def _fastdiv(T, n, mul, shift):
    """n // d for 0 <= n < 2^31, with (mul, shift) = `magic_divisor(d)`."""
    return T.Cast("int32", (T.Cast("int64", n) * mul) >> shift)


@functools.lru_cache(maxsize=None)  # per launch otherwise; pure in its arguments
def magic_divisor(d: int) -> tuple[int, int]:
    """(mul, shift) with n // d == (n * mul) >> shift for every 0 <= n < 2^31 (1 <= d < 2^31).

    mul = ceil(2^(31 + l) / d) with l = ceil(log2 d): mul * d - 2^(31 + l) < d <= 2^l,
    so the error of n * mul / 2^(31 + l) against n / d stays below 1 / d.
    """
    if not 1 <= d < 2**31:
        raise ValueError(f"divisor out of range: {d}")
    l = (d - 1).bit_length()
    shift = 31 + l
    mul = -(-(1 << shift) // d)
    return mul, shift


def _scale_macros(T, fmt: str, exact_reciprocal: bool = True):
    """(scale_of, read_scale, write_scale) macros shared by the cast kernels.

    exact_reciprocal: 1 / sf correctly rounded (``__fdiv_rn``), as the Markstein
    correction needs; else rcp.approx (within 1 ULP), for the paths that
    multiply by it without a correction (their quotient stays within 1.5 * 2^-23).

    scale_of(amax_bits, round_sf, clamp_bits, st, ue): st[0] = sf, st[1] = 1 / sf,
    st[2] = 1 / sf where the Markstein correction applies (else 0), ue[0] = the
    ue8m0 byte (round_sf), from the block's amax bits (see the module docstring).
    read_scale / write_scale: sf element (row, col) of the flat storage views
    (fp32, ue8m0 bytes, or packed: byte col % 4 of int32 word (row, col // 4)).
    """
    max_q = MAX_Q[fmt]
    maxq_exp = MAXQ_EXP[fmt]
    maxq_mant = MAXQ_MANT[fmt]

    @T.macro
    def scale_of(amax, round_sf, clamp_bits, st, ue):
        # st[0] = sf, st[1] = 1/sf, st[2] = 1/sf where the correction applies (else 0); ue[0] = ue8m0 byte
        a = T.max(amax, clamp_bits)
        # Signed comparisons: a <= 0x7FFFFFFF, and unsigned ones trip tilelang's simplifier
        # (a >= C becomes a division, a > C - 1 a negative unsigned literal).
        if T.Cast("int32", a) > F32_INF - 1:
            st[0] = _f32(T, _u(T, F32_QNAN))
            st[1] = _f32(T, _u(T, F32_QNAN))
            st[2] = _f32(T, _u(T, F32_QNAN))
            ue[0] = _u(T, 0xFF)
        elif round_sf != 0:
            kexp = (a >> _u(T, 23)) - _u(T, maxq_exp) + T.if_then_else(
                (a & _u(T, 0x7FFFFF)) > _u(T, maxq_mant), _u(T, 1), _u(T, 0))
            st[0] = _f32(T, kexp << _u(T, 23))
            st[1] = _f32(T, (_u(T, 254) - kexp) << _u(T, 23))
            st[2] = T.float32(0)
            ue[0] = kexp
        else:
            st[0] = T.ieee_fdiv(_f32(T, a), T.float32(max_q))
            if exact_reciprocal:
                st[1] = T.ieee_fdiv(T.float32(1.0), st[0])
            else:
                st[1] = T.call_extern("float32", "tkq_rcp_approx", st[0])
            st[2] = T.if_then_else(T.Cast("int32", a) > CORRECTION_MIN_BITS - 1, st[1], T.float32(0))
            ue[0] = _u(T, 0)

    @T.macro
    def read_scale(sf32, sf8, sf_mode, row, col, s0, s1, st, ue):
        # st[0] <- the given sf of block (row, col)
        if sf_mode == SF_FP32:
            st[0] = sf32[T.Cast("int64", row) * s0 + T.Cast("int64", col) * s1]
        else:
            if sf_mode == SF_UE8M0:
                ue[0] = T.Cast("uint32", sf8[T.Cast("int64", row) * s0 + T.Cast("int64", col) * s1])
            else:
                packed = T.Cast("int64", row) * s0 + T.Cast("int64", col // 4) * s1
                ue[0] = T.Cast("uint32", sf8[packed * 4 + col % 4])
            st[0] = _ue8m0_value(T, ue[0])

    @T.macro
    def write_scale(sf32, sf8, sf_mode, row, col, s0, s1, st, ue):
        if sf_mode == SF_FP32:
            sf32[T.Cast("int64", row) * s0 + T.Cast("int64", col) * s1] = st[0]
        elif sf_mode == SF_UE8M0:
            sf8[T.Cast("int64", row) * s0 + T.Cast("int64", col) * s1] = T.Cast("uint8", ue[0])
        else:
            packed = T.Cast("int64", row) * s0 + T.Cast("int64", col // 4) * s1
            sf8[packed * 4 + col % 4] = T.Cast("uint8", ue[0])

    return scale_of, read_scale, write_scale


# ------------------------------------------------------------ token_cast kernel


class TokenConfig(NamedTuple):
    source: str  # "x" (per-token casts) or "swiglu"
    dtype: str  # input dtype: "bfloat16" or "float32"
    fmt: str  # "e4m3", "e2m1" or "e5m6"
    # Tuning knobs (benchmarks/tune.py times candidates; the defaults are the shipped ones).
    threads: int = THREADS  # per CTA
    steps: int = 1  # fast paths: blocks of FAST_CHUNKS_PER_LANE chunks each lane loads before computing
    min_blocks: int = 3  # CTAs per SM promised to ptxas (caps registers at 65536 / (threads * min_blocks))
    # precomputed sf: 0 = never (the data follows from the kernel's own sf), 1 = always (the
    # _with_precomputed_sf kernel); 2 = a runtime argument (one kernel for both, the layout before
    # the split, timed within 3% of the split kernel on 2026-11-29: no configuration ships it)
    precomputed: int = 0
    # e5m6 codes by `_e5m6_code_fast` (branch-free, 3 fp32 operations and ~7 integer ones an element)
    # instead of `_e5m6_code`: the same code for every fp32 quotient (scripts/e5m6_encode_check.py,
    # all 2^32 patterns); kernels with precomputed = 0 only (the precomputed path keeps `_e5m6_code`,
    # whose exactly infinite quotients get the inf code)
    fast_e5m6: bool = False


# Shipped geometry per (source, dtype, fmt) where a tuning run found a faster one than the
# defaults, each bitwise equal to them (benchmarks/tune.py; H200, 2026-11-29, device time at
# 16384 x 7168 bf16: e4m3/128 102.1 -> 91.3 us, e2m1/32 97.8 -> 93.4 us; swiglu stayed at
# the defaults, 59.3 us, within 1% of the best candidate).
TUNED = {
    ("x", "bfloat16", "e4m3"): {"threads": 128, "min_blocks": 6},
    ("x", "bfloat16", "e2m1"): {"steps": 2, "min_blocks": 2},
    # H200 runs 14 and 16 (e5m6/H, 16384 x 7168 bf16): 161.2 / 160.6 us shipped before, 129.6 / 128.8 us
    # with one row a 128-thread CTA and the branch-free encode, bitwise equal
    ("x", "bfloat16", "e5m6"): {"threads": 128, "min_blocks": 6, "fast_e5m6": True},
}


def _shipped(source: str, dtype: str, fmt: str, precomputed: int = 0) -> TokenConfig:
    return TokenConfig(source, dtype, fmt, precomputed=precomputed, **TUNED.get((source, dtype, fmt), {}))


TOKEN_CONFIGS = tuple(_shipped(source, dtype, fmt) for source in ("x", "swiglu")
                      for dtype in ("bfloat16", "float32") for fmt in FORMATS) + tuple(
    TokenConfig("x", dtype, fmt, precomputed=1) for dtype in ("bfloat16", "float32") for fmt in FORMATS)
# Candidates benchmarks/tune.py times against the shipped configurations (bitwise-checked there
# too); the losers of the 2026-11-29 run (512 threads, the pre-split precomputed kernel) are gone.
TOKEN_TUNE_CONFIGS = (
    TokenConfig("x", "bfloat16", "e4m3", threads=128, steps=2, min_blocks=4),
    TokenConfig("x", "bfloat16", "e2m1", threads=128, min_blocks=6),
    TokenConfig("swiglu", "bfloat16", "e4m3", threads=128, min_blocks=6),
    # e5m6 whole rows: the configuration shipped before (256 threads, the branching encode), and each
    # of the shipped one's two changes alone (one row per 128-thread CTA; the branch-free encode)
    TokenConfig("x", "bfloat16", "e5m6"),
    TokenConfig("x", "bfloat16", "e5m6", threads=128, min_blocks=6),
    TokenConfig("x", "bfloat16", "e5m6", fast_e5m6=True),
)


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

    @T.macro
    def load_chunk(xw, words, slot, chunk, row, hidden_chunks):
        # words[slot, :wpc] <- the chunk's input words (swiglu: l; r goes to words[slot, wpc:])
        if swiglu:
            # chunk c of row `row` of y: l is chunk c + row * H/8 of x (N, 2H), r H/8 chunks further
            for v in T.vectorized(wpc):
                words[slot, v] = T.Cast("uint32", xw[(chunk + row * hidden_chunks) * wpc + v])
            for v in T.vectorized(wpc):
                words[slot, wpc + v] = T.Cast("uint32", xw[(chunk + row * hidden_chunks + hidden_chunks) * wpc + v])
        else:
            for v in T.vectorized(wpc):
                words[slot, v] = T.Cast("uint32", xw[chunk * wpc + v])

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
            # e5m6: 8 codes h0..h7 in three words (OPS.md)
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
                elif has_w != 0:
                    weight[u] = tw[pos[rows[u]]]

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

    @T.macro
    def fast_path(xw, dw, sf32, sf8, pos, tw, num_blocks, lanes_log2, cols, cols_mul, cols_shift, row0, s0, s1,
                  sf_mode, round_sf, clamp_bits, with_data, precomputed, hidden_chunks, has_pos, has_w, do_count,
                  clamp, cta, tx, kf, nsteps, counts):
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
                    load_chunk(xw, words, u * kf + k, chunk, rows[u], hidden_chunks)
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
                     s1, sf_mode, round_sf, clamp_bits, with_data, precomputed, hidden_chunks, has_pos, has_w,
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
                        load_chunk(xw, words, 0, chunk, rows[0], hidden_chunks)
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
                        load_chunk(xw, words, 0, chunk, rows[0], hidden_chunks)
                    chunk_values(words, 0, vals, 0, live[0] != 0, weight[0], clamp, counts, False)
                    encode_chunk(vals, 0, q, codes, st, precomputed, out, 0)
                    for v in T.unroll(dpc):
                        dw[chunk * dpc + v] = T.Cast("int32", out[v])

    @T.macro
    def row_path(xw, dw, sf32, sf8, pos, tw, red, num_blocks, team_log2, blk_chunks, cols, cols_mul, cols_shift,
                 row0, s0, s1, sf_mode, round_sf, clamp_bits, with_data, precomputed, hidden_chunks, has_pos, has_w,
                 do_count, clamp, cta, tx, counts):
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
                load_chunk(xw, words, k, block * blk_chunks + k * team + lane_in_team, rows[0], hidden_chunks)
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

    # The two sources differ in their arguments only; one body serves both.
    @T.macro
    def kernel_body(xw, dw, sf32, sf8, pos, tw, cnt, num_chunks, num_blocks, path, lanes_log2, blk_k, cols, cols_mul,
                    cols_shift, row0, s0, s1, sf_mode, round_sf, clamp_min, with_data, precomputed, hidden_chunks,
                    has_pos, has_w, do_count, clamp):
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
                             has_pos, has_w, do_count, clamp, cta, tx, counts)
            elif path == ROW_PATH:
                row_path(xw, dw, sf32, sf8, pos, tw, red, num_blocks, lanes_log2, blk_k, cols, cols_mul, cols_shift,
                         row0, s0, s1, sf_mode, round_sf, clamp_bits, with_data, precomputed, hidden_chunks, has_pos,
                         has_w, do_count, clamp, cta, tx, counts)
            elif path == 2:
                fast_path(xw, dw, sf32, sf8, pos, tw, num_blocks, lanes_log2, cols, cols_mul, cols_shift, row0, s0,
                          s1, sf_mode, round_sf, clamp_bits, with_data, precomputed, hidden_chunks, has_pos, has_w,
                          do_count, clamp, cta, tx, 2, fast_chunks // (2 * threads), counts)
            elif 4 in fast_ks:
                fast_path(xw, dw, sf32, sf8, pos, tw, num_blocks, lanes_log2, cols, cols_mul, cols_shift, row0, s0,
                          s1, sf_mode, round_sf, clamp_bits, with_data, precomputed, hidden_chunks, has_pos, has_w,
                          do_count, clamp, cta, tx, 4, fast_chunks // (4 * threads), counts)
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
            has_pos: T.int32,
            has_w: T.int32,
            do_count: T.int32,
            clamp: T.float32,
        ):
            T.annotate_pass_configs(PASS_CONFIGS)
            kernel_body(xw, dw, sf32, sf8, pos, tw, cnt, num_chunks, num_blocks, path, lanes_log2, blk_k, cols,
                        cols_mul, cols_shift, row0, s0, s1, sf_mode, round_sf, clamp_min, 1, 0, hidden_chunks,
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
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        kernel_body(xw, dw, sf32, sf8, None, None, None, num_chunks, num_blocks, path, lanes_log2, blk_k, cols,
                    cols_mul, cols_shift, row0, s0, s1, sf_mode, round_sf, clamp_min, with_data,
                    precomputed if static_precomputed == 2 else static_precomputed, 0, 0, 0, 0, T.float32(0))

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


# ------------------------------------------------------------ block_cast kernel
# per_block_cast (bm x bk = 128 x 128 or 32 x 32) and per_channel_cast (npt x 1).

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
BLOCK_CONFIGS = tuple(BlockConfig(dtype, fmt, min_blocks=BLOCK_MIN_BLOCKS[dtype])
                      for dtype in ("bfloat16", "float32") for fmt in ("e4m3", "e2m1"))
# Candidates for a tuning run (compiled by precompile, never used by default; bitwise equal by
# construction: only the work split changes).  512 threads x 4 rows: half the registers of input
# per thread, 128 x 128 tiles (64 registers, 2 CTAs per SM);  128 threads x 16 rows: 64 words in
# flight per thread, 128 x 128 tiles (168 registers, 3 CTAs per SM: with 4, ptxas spilled 88 bytes).
BLOCK_TUNE_CONFIGS = (
    BlockConfig("bfloat16", "e4m3", threads=512, rows=4, min_blocks=2),
    BlockConfig("bfloat16", "e4m3", threads=128, rows=16, min_blocks=3),
)
# (dtype, fmt) -> the configuration to use instead of the shipped one (for a tuning run).
BLOCK_OVERRIDES: dict[tuple[str, str], BlockConfig] = {}


def block_config(dtype: str, fmt: str) -> BlockConfig:
    """The configuration of a block_cast call: the shipped one, unless a tuning run overrides it."""
    return BLOCK_OVERRIDES.get((dtype, fmt)) or BlockConfig(dtype, fmt, min_blocks=BLOCK_MIN_BLOCKS[dtype])


def build_block_cast(config: BlockConfig):
    """prim_func of per_block_cast / per_channel_cast: blocks of bm x bk, bm in {16, 32, 64, 128}, bk in {1, 32, 128}.

    Arguments: x (T, H) raw bits and data bytes (T, width) for the element path; xw / dw, the
    same memory as flat int32 words for the vector path (vec = 1: H % 8 == 0, x 16-byte and
    data 8-byte aligned; else one-element placeholders); the sf views; log2 bm, log2 bk; the
    tile columns per tile row; the sf row of the launch's first block row; the sf options.
    """
    T = _tilelang.T()
    dtype, fmt, threads, rows_per_thread, min_blocks = config
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
    scale_of, _, write_scale = _scale_macros(T, fmt)
    num_rows, hidden, width, n_xw, n_dw, n_s32, n_s8 = T.dynamic("num_rows, hidden, width, n_xw, n_dw, n_s32, n_s8")

    @T.macro
    def quotient(v, st, q, i):
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
            amax_of_rows(words, cam)
            publish_amax(red, cam, col_amax, bk_log2, group, lane)
            T.sync_threads()
            scales_of_tile(red, sst, sf32, sf8, tile_row, tile_col, tx, bm_log2, bk_log2, block_row0, s0, s1, sf_mode,
                           round_sf, _bits(T, clamp_min), amax, st1, ue1)
            T.sync_threads()
            chunk_scales(sst, stv, st, bm_log2, bk_log2, group, lane)
            store_rows(data, dw, words, st, q, out, vec, row0, col0)

    return block_cast


BLOCK_CAST = KernelDef("quant.block_cast", build_block_cast, BLOCK_CONFIGS + BLOCK_TUNE_CONFIGS,
                       candidates=BLOCK_TUNE_CONFIGS)


# ------------------------------------------------------------- cast_back kernel
# The flat (T * H) tensor in chunks of `width` consecutive elements, one 16-byte vector store of
# output each (module docstring).

BACK_WIDTH = {"bfloat16": 8, "float32": 4}  # elements per chunk: 16 bytes of output
# Paths, each a kernel of its own (chosen by the wrapper from H and the block):
#   "block":  H % width == 0, bk > 1: a chunk lies in one row and one sf block (one sf read per chunk)
#   "column": H % width == 0, bk == 1: a chunk lies in one row, an sf per element
#   "flat":   H % width != 0: a chunk may span rows, each element's row found by a division
BACK_PATHS = ("block", "column", "flat")
BACK_MAX_ELEMENTS = 2**30  # elements per launch: every in-kernel index stays an int32


class CastBackConfig(NamedTuple):
    fmt: str  # "e4m3", "e2m1" or "e5m6"
    out_dtype: str  # "bfloat16" or "float32"
    path: str = "block"  # one of BACK_PATHS
    # Geometry (tuning knobs): a CTA of `threads` threads takes threads * chunks chunks, thread t
    # the chunks (cta * chunks + k) * threads + t, k < chunks, all of their loads issued first.
    threads: int = 128
    chunks: int = 8
    min_blocks: int = 8  # CTAs per SM promised to ptxas (registers <= 65536 / (threads * min_blocks))


# Shipped chunks per thread, 128-thread CTAs.  H200, 16384 x 7168, CUDA-graph device time, copy
# 4.2 TB/s (2026-11-29): e4m3 (1, 128) -> bf16 90.2 us (94% of copy; the one-thread-per-code kernel
# took 496 us), -> fp32 153 us (92%); e2m1 (1, 32) -> bf16 83.5 us (88%), -> fp32 144 us (90%); e5m6
# (1, H) -> bf16 103 us (95%), -> fp32 163 us (94%).  For e4m3 -> bf16, 2 chunks: 90.0, 8: 92.0, 256
# threads x 4: 91.9 (the candidates below); per format, 4 or 8 chunks were within 2%.
BACK_CHUNKS = {("e4m3", "bfloat16"): 4, ("e4m3", "float32"): 8, ("e2m1", "bfloat16"): 4,
               ("e2m1", "float32"): 8, ("e5m6", "bfloat16"): 4, ("e5m6", "float32"): 4}
CAST_BACK_CONFIGS = tuple(CastBackConfig(fmt, out, path, chunks=BACK_CHUNKS[fmt, out])
                          for fmt in FORMATS for out in ("bfloat16", "float32") for path in BACK_PATHS
                          if fmt != "e5m6" or path == "block")  # e5m6: (1, H) blocks, H % 8 == 0
_SHIPPED_BACK = {(c.fmt, c.out_dtype, c.path): c for c in CAST_BACK_CONFIGS}
# Candidates a tuning run may time against the shipped geometry (compiled by precompile, never
# used by default; select one through CAST_BACK_OVERRIDES).
CAST_BACK_TUNE_CONFIGS = (
    CastBackConfig("e4m3", "bfloat16", threads=256, chunks=4, min_blocks=4),
    CastBackConfig("e4m3", "bfloat16", threads=128, chunks=8, min_blocks=8),
)
# (fmt, out dtype, path) -> the configuration to use instead of the shipped one (any of CAST_BACK.configs).
CAST_BACK_OVERRIDES: dict[tuple[str, str, str], CastBackConfig] = {}

CAST_BACK_PRELUDE = PRELUDE + r"""
#ifndef TKQ_BACK_PRELUDE
#define TKQ_BACK_PRELUDE
// Two e4m3 codes (bits 0-7: first, 8-15: second) as an f16x2 (exact: every e4m3 value is an
// f16; S.1111.111 is NaN).
__device__ __forceinline__ unsigned tkq_e4m3x2_f16x2(unsigned v) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 890)
  unsigned r;
  asm("{\n\t.reg .b16 a;\n\tcvt.u16.u32 a, %1;\n\tcvt.rn.f16x2.e4m3x2 %0, a;\n\t}" : "=r"(r) : "r"(v));
  return r;
#else
  unsigned r = 0;
  for (int h = 0; h < 2; ++h) {
    unsigned b = (v >> (8 * h)) & 0xffu, e = (b >> 3) & 15u, m = b & 7u, f;
    if ((b & 0x7fu) == 0x7fu) f = 0x7fffu;
    else if (e) f = ((e + 8u) << 10) | (m << 7);
    else if (m == 0) f = 0;
    else { unsigned k = m >= 4 ? 2u : (m >= 2 ? 1u : 0u); f = ((6u + k) << 10) | ((m - (1u << k)) << (10 - k)); }
    r |= (f | ((b & 0x80u) << 8)) << (16 * h);
  }
  return r;
#endif
}
// Two e2m1 codes as e4m3 codes of their values / 64, for tkq_e4m3x2_f16x2: s.e1e0.m0 -> s.00e1e0.m00
// (e4m3's subnormals line up with e2m1's: 0.5 -> 2^-7).  w holds 8 codes, the first in the low
// nibble; bits 0-15 of the result are codes 2p and 2p + 1.
__device__ __forceinline__ unsigned tkq_e2m1x2_e4m3x2(unsigned w, unsigned p) {
  unsigned even = ((w << 2) & 0x1c1c1c1cu) | ((w << 4) & 0x80808080u);  // codes 0, 2, 4, 6
  unsigned odd = ((w >> 2) & 0x1c1c1c1cu) | (w & 0x80808080u);         // codes 1, 3, 5, 7
#if defined(__CUDA_ARCH__)
  return __byte_perm(even, odd, p | ((p + 4u) << 4));
#else
  return ((even >> (8 * p)) & 0xffu) | (((odd >> (8 * p)) & 0xffu) << 8);
#endif
}
// fp32 value of the f16 in bits 0-15 (exact).
__device__ __forceinline__ float tkq_f16_to_f32(unsigned h) {
#if defined(__CUDA_ARCH__)
  float f;
  unsigned short s = (unsigned short)(h & 0xffffu);
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(s));
  return f;
#else
  unsigned e = (h >> 10) & 31u, m = h & 0x3ffu, s = (h & 0x8000u) << 16;
  if (e == 31u) return __uint_as_float(s | 0x7f800000u | (m << 13));
  if (e) return __uint_as_float(s | ((e + 112u) << 23) | (m << 13));
  return __uint_as_float(s | __float_as_uint((float)m * 5.9604644775390625e-8f));
#endif
}
// 1 where q * sf rounded to odd is exact through tkq_odd_product_fast: |sf| a finite fp32 >= 2^-100.
__device__ __forceinline__ unsigned tkq_odd_fast_ok(float sf) {
  return ((__float_as_uint(sf) & 0x7fffffffu) - 0x0d800000u) < (0x7f800000u - 0x0d800000u) ? 1u : 0u;
}
// 1 where x != 0, else 0 (one integer min).
__device__ __forceinline__ unsigned tkq_nonzero(unsigned x) {
#if defined(__CUDA_ARCH__)
  unsigned r;
  asm("min.u32 %0, %1, 1;" : "=r"(r) : "r"(x));
  return r;
#else
  return x ? 1u : 0u;
#endif
}
// q * sf rounded to odd into fp32 (toward zero, then the sticky bit), for a decoded code q and an sf
// with tkq_odd_fast_ok.  t = RZ(q * sf); r = q * sf - t by one FMA is exact: every code's last bit
// is at least 2^-20 and sf's at least 2^-123, so q * sf is a multiple of 2^-143, as is t, and
// |r| < ulp(t); r = 0 exactly when t is.  An overflow gives t = FLT_MAX (odd already, r != 0), an
// infinite or NaN q an infinite or NaN t, which stays as it is.
__device__ __forceinline__ float tkq_odd_product_fast(float q, float sf) {
#if defined(__CUDA_ARCH__)
  float t = __fmul_rz(q, sf);
  unsigned rb = __float_as_uint(__fmaf_rn(q, sf, -t));
  unsigned tb = __float_as_uint(t);
  if (fabsf(t) < __uint_as_float(0x7f800000u)) tb |= tkq_nonzero(rb);  // r != 0 (an exact 0 is +0)
  return __uint_as_float(tb);
#else
  double p = (double)q * (double)sf;
  float t = (float)p;
  if (t == t && fabs((double)t) > fabs(p)) t = __uint_as_float(__float_as_uint(t) - 1u);
  unsigned tb = __float_as_uint(t);
  if ((double)t != p && p == p) tb |= 1u;
  return __uint_as_float(tb);
#endif
}
// The same where q is never infinite (e4m3, e2m1): a NaN t (q NaN) stays NaN with its last bit set.
__device__ __forceinline__ float tkq_odd_product_fast_finite(float q, float sf) {
#if defined(__CUDA_ARCH__)
  float t = __fmul_rz(q, sf);
  unsigned rb = __float_as_uint(__fmaf_rn(q, sf, -t));
  return __uint_as_float(__float_as_uint(t) | tkq_nonzero(rb));
#else
  return tkq_odd_product_fast(q, sf);
#endif
}
// The same for any sf: the exact product in fp64 (8 + 24 significant bits), as tkq_bf16_product.
// (Out of line: the fallback of every chunk would otherwise be inlined in the unrolled hot loop.)
__device__ __noinline__ float tkq_odd_product_exact(float q, float sf) {
  double p = (double)q * (double)sf;
#if defined(__CUDA_ARCH__)
  float t = __double2float_rz(p);
#else
  float t = (float)p;
  if (t == t && fabs((double)t) > fabs(p)) t = __uint_as_float(__float_as_uint(t) - 1u);
#endif
  unsigned tb = __float_as_uint(t);
  if ((double)t != p && p == p) tb |= 1u;
  return __uint_as_float(tb);
}
__device__ __forceinline__ float tkq_odd_product(float q, float sf) {
  return tkq_odd_fast_ok(sf) ? tkq_odd_product_fast(q, sf) : tkq_odd_product_exact(q, sf);
}
// Two fp32 rounded (RNE) to bf16: lo in bits 0-15, hi in bits 16-31 (__float2bfloat16_rn of each).
__device__ __forceinline__ unsigned tkq_bf16x2_rn(float lo, float hi) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  unsigned r = 0;
  float v[2] = {lo, hi};
  for (int h = 0; h < 2; ++h) {
    unsigned tb = __float_as_uint(v[h]);
    unsigned b = (tb & 0x7fffffffu) > 0x7f800000u ? 0x7fffu : (tb + 0x7fffu + ((tb >> 16) & 1u)) >> 16;
    r |= (b & 0xffffu) << (16 * h);
  }
  return r;
#endif
}
#endif
"""


def build_cast_back(config: CastBackConfig):
    """prim_func(data, sf views, out (flat T * H), ...): out = q * sf rounded once to the out dtype."""
    T = _tilelang.T()
    fmt, out_dtype, path, threads, chunks, min_blocks = config
    bf16 = out_dtype == "bfloat16"
    width = BACK_WIDTH[out_dtype]
    out_raw = "int16" if bf16 else "float32"
    _, read_scale, _ = _scale_macros(T, fmt)
    n_data, n_data8, n_out, n_s32, n_s8 = T.dynamic("n_data, n_data8, n_out, n_s32, n_s8")
    e5m6 = fmt == "e5m6"
    # data per chunk, in `data` elements: e4m3 width bytes (2 or 1 int32 words), e2m1 width / 2 bytes
    # (1 int32 word, or 1 uint16 for width 4), e5m6 8 codes in 3 int32 words (4 codes, half a group,
    # lie in 2 of them)
    data_dtype = "uint16" if (fmt == "e2m1" and width == 4) else "int32"
    per_chunk = {"e4m3": width // 4, "e2m1": 1, "e5m6": 3 if width == 8 else 2}[fmt]

    def data_word(codes, k, w):
        """uint32 word w of chunk k's data (e4m3 / e2m1: its bytes 4w.., little-endian)."""
        return T.Cast("uint32", codes[k, w])

    # e4m3 and e2m1 codes are never infinite (a shorter round to odd, tkq_odd_product_fast_finite)
    fast_product = "tkq_odd_product_fast" if e5m6 else "tkq_odd_product_fast_finite"

    def f16_value(h):
        """fp32 value of the f16 in the low 16 bits of h (exact)."""
        return T.call_extern("float32", "tkq_f16_to_f32", h)

    def e5m6_value(h):
        """fp32 value of the e5m6 code in the low 12 bits of h: the f16 with bits code << 4 (exact)."""
        return f16_value((h & _u(T, 0xFFF)) << _u(T, 4))

    @T.macro
    def decode_chunk(codes, k, c, q):
        # q[0:width] <- the fp32 values of chunk k's codes (exact)
        if fmt == "e4m3":
            for p in T.unroll(width // 2):
                h2 = T.call_extern("uint32", "tkq_e4m3x2_f16x2", data_word(codes, k, p // 2) >> _u(T, 16 * (p % 2)))
                q[2 * p] = f16_value(h2)
                q[2 * p + 1] = f16_value(h2 >> _u(T, 16))
        elif fmt == "e2m1":
            # as e4m3 codes of value / 64, then * 64 (exact)
            for p in T.unroll(width // 2):
                h2 = T.call_extern("uint32", "tkq_e4m3x2_f16x2", T.call_extern(
                    "uint32", "tkq_e2m1x2_e4m3x2", data_word(codes, k, 0), T.Cast("uint32", p)))
                q[2 * p] = T.ieee_mul(f16_value(h2), T.float32(64.0))
                q[2 * p + 1] = T.ieee_mul(f16_value(h2 >> _u(T, 16)), T.float32(64.0))
        elif width == 8:
            # e5m6: codes h0..h7 in three words (OPS.md)
            w0 = data_word(codes, k, 0)
            w1 = data_word(codes, k, 1)
            w2 = data_word(codes, k, 2)
            q[0] = e5m6_value(w0 >> _u(T, 20))
            q[1] = e5m6_value(w0 >> _u(T, 8))
            q[2] = e5m6_value(((w0 & _u(T, 0xFF)) << _u(T, 4)) | (w1 >> _u(T, 28)))
            q[3] = e5m6_value(w1 >> _u(T, 16))
            q[4] = e5m6_value(w1 >> _u(T, 4))
            q[5] = e5m6_value(((w1 & _u(T, 0xF)) << _u(T, 8)) | (w2 >> _u(T, 24)))
            q[6] = e5m6_value(w2 >> _u(T, 12))
            q[7] = e5m6_value(w2)
        else:
            # e5m6, half a group: chunk 2g has h0..h3 of group g in bits 63..16 of (w0, w1), chunk
            # 2g + 1 h4..h7 in bits 47..0 of (w1, w2) (its words start one later)
            pair = (T.Cast("uint64", data_word(codes, k, 0)) << T.uint64(32)) | T.Cast("uint64", data_word(codes, k, 1))
            pair = pair << T.Cast("uint64", (c & 1) * 16)
            for i in T.unroll(4):
                q[i] = e5m6_value(T.Cast("uint32", pair >> T.Cast("uint64", 52 - 12 * i)))

    @T.macro
    def scale_at(sf32, sf8, sf_mode, sf_row, sf_col, s0, s1, st, ue, dst, i):
        # dst[i] <- sf (sf_row, sf_col)
        read_scale(sf32, sf8, sf_mode, sf_row, sf_col, s0, s1, st, ue)
        dst[i] = st[0]

    @T.macro
    def convert_chunk(q, sfs, k, per_element, t, res):
        # res[0:width] <- q[i] * sf rounded once (sf = sfs[i] per element, else sfs[k])
        if bf16:
            if per_element:
                for i in T.unroll(width):
                    t[i] = T.call_extern("float32", "tkq_odd_product", q[i], sfs[i])
            elif T.call_extern("uint32", "tkq_odd_fast_ok", sfs[k]) != _u(T, 0):
                for i in T.unroll(width):
                    t[i] = T.call_extern("float32", fast_product, q[i], sfs[k])
            else:
                for i in T.unroll(width):
                    t[i] = T.call_extern("float32", "tkq_odd_product_exact", q[i], sfs[k])
            for p in T.unroll(width // 2):
                pair = T.call_extern("uint32", "tkq_bf16x2_rn", t[2 * p], t[2 * p + 1])
                res[2 * p] = T.Cast("int16", pair & _u(T, 0xFFFF))
                res[2 * p + 1] = T.Cast("int16", pair >> _u(T, 16))
        else:
            if per_element:
                for i in T.unroll(width):
                    res[i] = T.ieee_mul(q[i], sfs[i])
            else:
                for i in T.unroll(width):
                    res[i] = T.ieee_mul(q[i], sfs[k])

    @T.prim_func
    def cast_back(
        data: T.Tensor((n_data,), data_dtype),
        data8: T.Tensor((n_data8,), "uint8"),
        sf32: T.Tensor((n_s32,), "float32"),
        sf8: T.Tensor((n_s8,), "uint8"),
        out: T.Tensor((n_out,), out_raw),
        num_elements: T.int32,
        hidden: T.int32,
        row_mul: T.int64,
        row_shift: T.int64,
        bm_log2: T.int32,
        bk_log2: T.int32,
        row0: T.int32,
        s0: T.int64,
        s1: T.int64,
        sf_mode: T.int32,
    ):
        # data (whole chunks) and data8 (bytes, for path flat's last partial chunk) are this launch's
        # data, out its output, flat, from row row0 on; (row_mul, row_shift) divide a chunk index
        # by H / width (paths block and column) or an element index by H (path flat).
        T.annotate_pass_configs(PASS_CONFIGS)
        full_chunks = num_elements // width
        with T.Kernel(T.ceildiv(T.ceildiv(num_elements, width), threads * chunks), threads=threads,
                      prelude=CAST_BACK_PRELUDE) as cta:
            T.annotate_min_blocks_per_sm(min_blocks)
            tx = T.get_thread_binding()
            codes = T.alloc_local((chunks, per_chunk), data_dtype)
            sfc = T.alloc_local((chunks,), "float32")  # path block: chunk k's sf
            sfe = T.alloc_local((width,), "float32")  # paths column, flat: the sf of each element
            st = T.alloc_local((3,), "float32")
            ue = T.alloc_local((1,), "uint32")
            q = T.alloc_local((width,), "float32")
            t = T.alloc_local((width,), "float32")
            res = T.alloc_local((width,), out_raw)
            # Every load first: the chunks' data, then (path block) their sf.
            for k in T.unroll(chunks):
                c = (cta * chunks + k) * threads + tx
                if c < full_chunks:
                    if e5m6:
                        for v in T.unroll(per_chunk):
                            codes[k, v] = data[(c * 3 if width == 8 else (c >> 1) * 3 + (c & 1)) + v]
                    else:
                        for v in T.vectorized(per_chunk):
                            codes[k, v] = data[c * per_chunk + v]
            if path == "block":
                for k in T.unroll(chunks):
                    c = (cta * chunks + k) * threads + tx
                    if c < full_chunks:
                        row = _fastdiv(T, c, row_mul, row_shift)
                        scale_at(sf32, sf8, sf_mode, (row0 + row) >> bm_log2,
                                 ((c - row * (hidden // width)) * width) >> bk_log2, s0, s1, st, ue, sfc, k)
            for k in T.unroll(chunks):
                c = (cta * chunks + k) * threads + tx
                if c < full_chunks:
                    decode_chunk(codes, k, c, q)
                    if path == "block":
                        convert_chunk(q, sfc, k, False, t, res)
                    else:
                        # an sf per element: read here, chunk by chunk (mostly L1 / L2 hits)
                        if path == "flat":
                            for i in T.unroll(width):
                                row = _fastdiv(T, c * width + i, row_mul, row_shift)
                                scale_at(sf32, sf8, sf_mode, (row0 + row) >> bm_log2,
                                         (c * width + i - row * hidden) >> bk_log2, s0, s1, st, ue, sfe, i)
                        else:
                            row = _fastdiv(T, c, row_mul, row_shift)
                            for i in T.unroll(width):
                                scale_at(sf32, sf8, sf_mode, (row0 + row) >> bm_log2,
                                         (c - row * (hidden // width)) * width + i, s0, s1, st, ue, sfe, i)
                        convert_chunk(q, sfe, 0, True, t, res)
                    for v in T.vectorized(width):  # one 16-byte store
                        out[c * width + v] = res[v]
            if path == "flat":
                # the last num_elements % width elements, one by one (one thread)
                if cta == 0 and tx == 0:
                    for j in T.serial(num_elements - full_chunks * width):
                        e = full_chunks * width + j
                        row = _fastdiv(T, e, row_mul, row_shift)
                        scale_at(sf32, sf8, sf_mode, (row0 + row) >> bm_log2, (e - row * hidden) >> bk_log2, s0, s1,
                                 st, ue, sfe, 0)
                        if fmt == "e4m3":
                            sfe[1] = f16_value(T.call_extern("uint32", "tkq_e4m3x2_f16x2", T.Cast("uint32", data8[e])))
                        else:
                            sfe[1] = T.ieee_mul(f16_value(T.call_extern("uint32", "tkq_e4m3x2_f16x2", T.call_extern(
                                "uint32", "tkq_e2m1x2_e4m3x2", T.Cast("uint32", data8[e >> 1]), _u(T, 0))) >> T.Cast(
                                "uint32", (e & 1) * 16)), T.float32(64.0))
                        # sfe[0]: the sf, sfe[1]: the value of the code
                        if bf16:
                            out[e] = T.Cast("int16", T.call_extern(
                                "uint32", "tkq_bf16x2_rn", T.call_extern("float32", "tkq_odd_product", sfe[1], sfe[0]),
                                T.float32(0)) & _u(T, 0xFFFF))
                        else:
                            out[e] = T.ieee_mul(sfe[1], sfe[0])

    return cast_back


CAST_BACK = KernelDef("quant.cast_back", build_cast_back, CAST_BACK_CONFIGS + CAST_BACK_TUNE_CONFIGS,
                      candidates=CAST_BACK_TUNE_CONFIGS)


# =============================================================================
# Host side: argument checks (kernels/torch/quant.py's), storage, launches.
# =============================================================================

_DATA_DTYPES = {"e4m3": torch.float8_e4m3fn, "e2m1": torch.int8, "e5m6": torch.uint8}


def _words(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor whose byte size is a multiple of 4 as a flat int32 tensor (same memory)."""
    return t.reshape(-1).view(torch.uint8).view(torch.int32)


@functools.lru_cache(maxsize=None)  # per launch otherwise; pure in its arguments
def _token_geometry(config: "TokenConfig", num_per_channels: int) -> tuple[int, int, int, int]:
    """(path, log2 L, K, chunks per CTA) for blocks of num_per_channels elements (npc / 8 chunks).

    A fast path (path = K) holds a lane's K chunks in registers: K = 4 when npc / 32 is a
    power of two up to 32 (and the configuration has that path), else K = 2 when npc / 16
    is.  Otherwise (npc = H) the row path (ROW_PATH) when a team of L threads, L the least
    power of two >= 32 with L * row_chunks >= npc / 8, fits the CTA (K = npc / 8 there);
    rows of fewer than 32 chunks, or too long for the CTA's registers, take the generic path.
    """
    chunks = num_per_channels // CHUNK
    for k in sorted(fast_paths(config.source, config.dtype), reverse=True):
        lanes = chunks // k
        if chunks % k == 0 and lanes & (lanes - 1) == 0 and lanes <= WARP:
            return k, lanes.bit_length() - 1, k, FAST_CHUNKS_PER_LANE[config.source, config.dtype] * config.threads \
                * config.steps
    per_thread = row_chunks(config.source, config.dtype)
    if WARP <= chunks <= per_thread * config.threads:
        team = max(WARP, 1 << (-(-chunks // per_thread) - 1).bit_length())
        return ROW_PATH, team.bit_length() - 1, chunks, (config.threads // team) * chunks
    return _generic_geometry(config, num_per_channels)


def _generic_geometry(config: "TokenConfig", num_per_channels: int) -> tuple[int, int, int, int]:
    """The generic path's (0, log2 L, K, chunks per CTA): L = gcd(npc / 8, 32) lanes loop over K = npc / 8L chunks.

    It takes any npc % 8 == 0 (the GPU tests compare the other paths with it).
    """
    chunks = num_per_channels // CHUNK
    lanes = math.gcd(chunks, WARP)
    return 0, lanes.bit_length() - 1, chunks // lanes, GENERIC_STEPS * config.threads * (chunks // lanes)


class _SfArgs(NamedTuple):
    """The sf storage as the kernels see it: flat fp32 and byte views, strides, storage mode."""

    flat_f32: torch.Tensor
    flat_u8: torch.Tensor
    s0: int
    s1: int
    mode: int


def _sf_args(sf: torch.Tensor) -> _SfArgs:
    """Kernel view of an sf tensor of any storage (fp32 / ue8m0 uint8 / packed int32) and strides.

    The flat views start at sf's first element and reach its last one; sf
    element (row, col) is at row * s0 + col * s1 of them (for packed storage in
    int32 words, whose byte col % 4 holds the code).
    """
    device = sf.device
    extent = 1 + sum((size - 1) * stride for size, stride in zip(sf.shape, sf.stride())) if sf.numel() else 1
    flat = torch.as_strided(sf, (extent,), (1,)) if sf.numel() else torch.zeros(1, dtype=sf.dtype, device=device)
    s0, s1 = sf.stride()
    if sf.dtype == torch.float32:
        return _SfArgs(flat, _tilelang.placeholder(torch.uint8, device), s0, s1, SF_FP32)
    if sf.dtype == torch.uint8:
        return _SfArgs(_tilelang.placeholder(torch.float32, device), flat, s0, s1, SF_UE8M0)
    return _SfArgs(_tilelang.placeholder(torch.float32, device), flat.view(torch.uint8), s0, s1, SF_PACKED)


def _new_sf(rows: int, cols: int, use_ue8m0: bool, use_packed_ue8m0: bool, col_major: bool,
            device: torch.device) -> torch.Tensor:
    """An sf output (rows, cols) in the storage and layout the options ask for (see the eager module).

    Packed storage whose last word is partial starts zeroed (its padding bytes
    must be 0 and the kernels write only the codes); everything else is
    written by the kernels (the column-major padding rows are never read).
    """
    dtype = torch.int32 if use_packed_ue8m0 else (torch.uint8 if use_ue8m0 else torch.float32)
    stored_cols = -(-cols // 4) if use_packed_ue8m0 else cols
    alloc = torch.zeros if use_packed_ue8m0 and cols % 4 else torch.empty
    if col_major:
        per_16_bytes = eager.TMA_ALIGN_BYTES // torch.tensor([], dtype=dtype).element_size()
        padded_rows = -(-rows // per_16_bytes) * per_16_bytes
        return alloc((stored_cols, padded_rows), dtype=dtype, device=device).T[:rows]
    return alloc((rows, stored_cols), dtype=dtype, device=device)


def _new_data(rows: int, hidden: int, fmt: str, device: torch.device) -> torch.Tensor:
    width = {"e4m3": hidden, "e2m1": hidden // 2, "e5m6": 3 * hidden // 2}[fmt]
    return torch.empty((rows, width), dtype=_DATA_DTYPES[fmt], device=device)


def _crop_data(data: torch.Tensor, hidden: int, fmt: str) -> torch.Tensor:
    width = {"e4m3": hidden, "e2m1": hidden // 2, "e5m6": 3 * hidden // 2}[fmt]
    return data[:, :width].contiguous()


def _token_launch(config: TokenConfig, x_rows: torch.Tensor, data: torch.Tensor | None, sf: _SfArgs,
                  num_per_channels: int, round_sf: bool, clamp_min: float, precomputed: bool,
                  swiglu: dict | None = None) -> None:
    """Run token_cast over x_rows (T, H8) (swiglu: (N, 2 H8)), H8 % 8 == 0, in row pieces.

    data: (T, width) output or None (sf only).  sf: the sf (output, or input
    when precomputed).  swiglu: the extra arguments of the swiglu source.
    """
    device = x_rows.device
    x_rows = _tilelang.aligned(x_rows, VECTOR_BYTES)  # rows keep the alignment: H % 8 == 0
    num_rows = x_rows.shape[0]
    hidden = x_rows.shape[1] // 2 if swiglu is not None else x_rows.shape[1]
    cols = hidden // num_per_channels
    chunks_per_row = hidden // CHUNK
    path, lanes_log2, blk_k, _ = _token_geometry(config, num_per_channels)
    cols_mul, cols_shift = magic_divisor(cols)
    kernel = _tilelang.kernel_for(TOKEN_CAST, config, device)
    rows_per_launch = max(1, MAX_CHUNKS_PER_LAUNCH // chunks_per_row)
    dummy_words = _tilelang.placeholder(torch.int32, device)
    with _tilelang.device_guard(device):
        for r0 in range(0, num_rows, rows_per_launch):
            r1 = min(num_rows, r0 + rows_per_launch)
            xw = _words(x_rows[r0:r1])
            dw = _words(data[r0:r1]) if data is not None else dummy_words
            common = ((r1 - r0) * chunks_per_row, (r1 - r0) * cols, path, lanes_log2, blk_k, cols, cols_mul, cols_shift,
                      r0, sf.s0, sf.s1, sf.mode, int(round_sf), clamp_min)
            if swiglu is None:
                kernel(xw, dw, sf.flat_f32, sf.flat_u8, *common, int(data is not None), int(precomputed))
            else:
                pos = swiglu["pos"][r0:r1] if swiglu["has_pos"] else swiglu["pos"]
                kernel(xw, dw, sf.flat_f32, sf.flat_u8, pos, swiglu["weights"], swiglu["counts"], *common,
                       chunks_per_row, int(swiglu["has_pos"]), int(swiglu["has_w"]), int(swiglu["do_count"]),
                       swiglu["clamp"])


def _padded_hidden(hidden: int) -> int:
    return -(-hidden // CHUNK) * CHUNK


def _token_cast(x: torch.Tensor, fmt: str, n: int, round_sf: bool, use_ue8m0: bool, use_packed_ue8m0: bool,
                col_major: bool, clamp_min: float, with_data: bool):
    num_rows, hidden = x.shape
    device = x.device
    cols = hidden // n
    sf = _new_sf(num_rows, cols, use_ue8m0, use_packed_ue8m0, col_major, device)
    data = _new_data(num_rows, hidden, fmt, device) if with_data else None
    if num_rows == 0:
        return data, sf
    config = token_config("x", IN_DTYPES[x.dtype], fmt)
    if hidden % CHUNK:
        # n == H: pad the row with zeros to a whole number of chunks, crop the data.
        h8 = _padded_hidden(hidden)
        xp = torch.zeros((num_rows, h8), dtype=x.dtype, device=device)
        xp[:, :hidden] = x
        dp = _new_data(num_rows, h8, fmt, device) if with_data else None
        _token_launch(config, xp, dp, _sf_args(sf), h8, round_sf, clamp_min, False)
        return (_crop_data(dp, hidden, fmt) if with_data else None), sf
    _token_launch(config, x, data, _sf_args(sf), n, round_sf, clamp_min, False)
    return data, sf


def per_token_cast(x: torch.Tensor, fmt: str = "e4m3", num_per_channels: int = 128, *, round_sf: bool = False,
                   use_ue8m0: bool = False, use_packed_ue8m0: bool = False,
                   use_tma_aligned_col_major_sf: bool = False,
                   clamp_min: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, sf) of x (T, H) quantised in blocks of 1 x num_per_channels (see kernels/torch/quant.py)."""
    fmt, n, cm = eager._check_per_token(x, fmt, num_per_channels, round_sf, use_ue8m0, use_packed_ue8m0,
                                        use_tma_aligned_col_major_sf, clamp_min)
    _tilelang.require_cuda("x", x)
    _tilelang.check_dims_fit_int32("x", x)
    return _token_cast(x, fmt, n, round_sf, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf, cm, True)


def per_token_cast_with_sf_only(x: torch.Tensor, fmt: str = "e4m3", num_per_channels: int = 128, *,
                                round_sf: bool = False, use_ue8m0: bool = False, use_packed_ue8m0: bool = False,
                                use_tma_aligned_col_major_sf: bool = False,
                                clamp_min: float | None = None) -> torch.Tensor:
    """The sf per_token_cast would return, without the data (x is read once, nothing else written)."""
    fmt, n, cm = eager._check_per_token(x, fmt, num_per_channels, round_sf, use_ue8m0, use_packed_ue8m0,
                                        use_tma_aligned_col_major_sf, clamp_min)
    _tilelang.require_cuda("x", x)
    _tilelang.check_dims_fit_int32("x", x)
    return _token_cast(x, fmt, n, round_sf, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf, cm,
                       False)[1]


def per_token_cast_with_precomputed_sf(x: torch.Tensor, sf: torch.Tensor, fmt: str = "e4m3",
                                       num_per_channels: int = 128) -> torch.Tensor:
    """The data of x (T, H) quantised with a given sf (T, H / num_per_channels) of any storage and strides."""
    fmt, n = eager._check_precomputed_args(x, sf, fmt, num_per_channels)
    num_rows, hidden = x.shape
    _tilelang.require_cuda("x", x)
    _tilelang.check_dims_fit_int32("x", x)
    device = x.device
    if num_rows == 0:
        return _new_data(0, hidden, fmt, device)
    config = token_config("x", IN_DTYPES[x.dtype], fmt, precomputed=True)
    if hidden % CHUNK:
        h8 = _padded_hidden(hidden)
        xp = torch.zeros((num_rows, h8), dtype=x.dtype, device=device)
        xp[:, :hidden] = x
        dp = _new_data(num_rows, h8, fmt, device)
        _token_launch(config, xp, dp, _sf_args(sf), h8, False, 1.0, True)
        return _crop_data(dp, hidden, fmt)
    data = _new_data(num_rows, hidden, fmt, device)
    _token_launch(config, x, data, _sf_args(sf), n, False, 1.0, True)
    return data


def swiglu_forward_and_per_token_cast(x: torch.Tensor, fmt: str = "e4m3", num_per_channels: int = 128, *,
                                      topk_weights: torch.Tensor | None = None,
                                      pos_to_token_topk: torch.Tensor | None = None,
                                      clamp: float | None = None, clamped_count: torch.Tensor | None = None,
                                      round_sf: bool = False, use_ue8m0: bool = False,
                                      use_packed_ue8m0: bool = False, use_tma_aligned_col_major_sf: bool = False,
                                      clamp_min: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, sf) of y = l * sigmoid(l) * r * w, per-token cast (see kernels/torch/quant.py).

    Padding rows (pos_to_token_topk == -1) are written as y = 0 (codes +0, the
    sf of a zero block), their x is not read and they are not counted.
    clamped_count is updated in place (int64 atomics).
    """
    hidden, fmt, n, cm, c = eager._check_swiglu_args(x, fmt, num_per_channels, topk_weights, pos_to_token_topk,
                                                     clamp, clamped_count, round_sf, use_ue8m0, use_packed_ue8m0,
                                                     use_tma_aligned_col_major_sf, clamp_min)
    _tilelang.require_cuda("x", x)
    _tilelang.check_dims_fit_int32("x", x)
    return _swiglu_checked(x, hidden, fmt, n, cm, c, topk_weights, pos_to_token_topk, clamped_count, round_sf,
                           use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf)


def _swiglu_checked(x, hidden, fmt, n, cm, c, topk_weights, pos_to_token_topk, clamped_count, round_sf, use_ue8m0,
                    use_packed_ue8m0, use_tma_aligned_col_major_sf):
    """swiglu_forward_and_per_token_cast after its argument checks.  Those read pos_to_token_topk's
    range on the host (a device sync, uncapturable): benchmarks.tune times this part alone in a CUDA
    graph, the routed kernel's device time, with the checks run once outside the timing."""
    device = x.device
    num_rows = x.shape[0]
    sf = _new_sf(num_rows, hidden // n, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf, device)
    data = _new_data(num_rows, hidden, fmt, device)
    if num_rows == 0:
        return data, sf
    extras = {
        "pos": pos_to_token_topk.contiguous() if pos_to_token_topk is not None else _tilelang.placeholder(torch.int32, device),
        "has_pos": pos_to_token_topk is not None,
        "weights": topk_weights.reshape(-1) if topk_weights is not None else _tilelang.placeholder(torch.float32, device),
        "has_w": topk_weights is not None,
        "counts": clamped_count if (clamped_count is not None and c is not None) else _tilelang.placeholder(torch.int64, device),
        "do_count": clamped_count is not None and c is not None,
        "clamp": c if c is not None else math.inf,
    }
    if extras["has_w"] and extras["weights"].numel() == 0:
        extras["weights"] = _tilelang.placeholder(torch.float32, device)  # no slot to read (every row is padding)
    config = token_config("swiglu", IN_DTYPES[x.dtype], fmt)
    if hidden % CHUNK:
        h8 = _padded_hidden(hidden)
        xp = torch.zeros((num_rows, 2 * h8), dtype=x.dtype, device=device)
        xp[:, :hidden] = x[:, :hidden]
        xp[:, h8:h8 + hidden] = x[:, hidden:]
        dp = _new_data(num_rows, h8, fmt, device)
        _token_launch(config, xp, dp, _sf_args(sf), h8, round_sf, cm, False, extras)
        return _crop_data(dp, hidden, fmt), sf
    _token_launch(config, x, data, _sf_args(sf), n, round_sf, cm, False, extras)
    return data, sf


def _block_vectors(x: torch.Tensor) -> bool:
    """Whether block_cast takes the vector path for x: rows of whole 16-byte chunks (H % 8 == 0)
    whose tile of BLOCK_TILE_ROWS rows fits a launch.  Else the element path (odd H in
    per_channel_cast, e2m1's H = 2 mod 8, rows too long for int32 flat views)."""
    hidden = x.shape[1]
    return hidden % CHUNK == 0 and hidden * BLOCK_TILE_ROWS <= BLOCK_MAX_ELEMENTS_PER_LAUNCH


def _launch_blocks(x: torch.Tensor, data: torch.Tensor, sf: torch.Tensor, fmt: str, bm: int, bk: int,
                   round_sf: bool, clamp_min: float) -> None:
    """block_cast over x (T, H) in blocks of bm x bk (bk in {1, 32, 128}), in pieces of whole tile rows.

    A piece is at most MAX_BLOCKS_PER_LAUNCH CTAs, and on the vector path at most
    BLOCK_MAX_ELEMENTS_PER_LAUNCH elements (its flat int32 views have int32 sizes).
    """
    device = x.device
    num_rows, hidden = x.shape
    config = block_config(IN_DTYPES[x.dtype], fmt)
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
    data8 = data.view(torch.uint8)
    no_words = _tilelang.placeholder(torch.int32, device)
    rows_per_launch = tiles_per_launch * BLOCK_TILE_ROWS  # a multiple of bm: blocks stay whole
    with _tilelang.device_guard(device):
        for r0 in range(0, num_rows, rows_per_launch):
            r1 = min(num_rows, r0 + rows_per_launch)
            xw = _words(x[r0:r1]) if vec else no_words
            dw = _words(data[r0:r1]) if vec else no_words
            kernel(raw[r0:r1], data8[r0:r1], xw, dw, args.flat_f32, args.flat_u8, int(vec), bm.bit_length() - 1,
                   bk.bit_length() - 1, col_tiles, r0 // bm, args.s0, args.s1, args.mode, int(round_sf), clamp_min)


def per_block_cast(x: torch.Tensor, fmt: str = "e4m3", block: tuple[int, int] | list[int] = (128, 128), *,
                   round_sf: bool = False, use_ue8m0: bool = False, use_packed_ue8m0: bool = False,
                   use_tma_aligned_col_major_sf: bool = False,
                   clamp_min: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, sf) of x (T, H) quantised in 2-D blocks of bm x bk (sf (ceil(T/bm), H/bk))."""
    fmt, (bm, bk), cm = eager._check_per_block_args(x, fmt, block, round_sf, use_ue8m0, use_packed_ue8m0,
                                                    use_tma_aligned_col_major_sf, clamp_min)
    _tilelang.require_cuda("x", x)
    _tilelang.check_dims_fit_int32("x", x)
    num_rows, hidden = x.shape
    sf = _new_sf(-(-num_rows // bm), hidden // bk, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf,
                 x.device)
    data = _new_data(num_rows, hidden, fmt, x.device)
    if num_rows:
        _launch_blocks(x, data, sf, fmt, bm, bk, round_sf, cm)
    return data, sf


def per_channel_cast(x: torch.Tensor, fmt: str = "e4m3", num_per_tokens: int = 128, *, round_sf: bool = False,
                     use_ue8m0: bool = False, use_packed_ue8m0: bool = False,
                     use_tma_aligned_col_major_sf: bool = False,
                     clamp_min: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, sf) of x (T, H) quantised in blocks of num_per_tokens x 1 (sf (ceil(T/npt), H))."""
    fmt, n, cm = eager._check_per_channel_args(x, fmt, num_per_tokens, round_sf, use_ue8m0, use_packed_ue8m0,
                                               use_tma_aligned_col_major_sf, clamp_min)
    _tilelang.require_cuda("x", x)
    _tilelang.check_dims_fit_int32("x", x)
    num_rows, hidden = x.shape
    sf = _new_sf(-(-num_rows // n), hidden, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf, x.device)
    data = _new_data(num_rows, hidden, fmt, x.device)
    if num_rows:
        _launch_blocks(x, data, sf, fmt, n, 1, round_sf, cm)
    return data, sf


def _cast_back_config(fmt: str, out_dtype: str, path: str) -> CastBackConfig:
    """The configuration of a cast_back call: the shipped one, unless CAST_BACK_OVERRIDES names another."""
    return CAST_BACK_OVERRIDES.get((fmt, out_dtype, path)) or _SHIPPED_BACK[fmt, out_dtype, path]


def cast_back(data: torch.Tensor, sf: torch.Tensor, fmt: str = "e4m3", block: tuple[int, int] | list[int] = (1, 128),
              out_dtype: Any = torch.bfloat16) -> torch.Tensor:
    """q * sf per element, correctly rounded to out_dtype (bf16 or fp32), shape (T, H)."""
    fmt, out_dtype, hidden, (bm, bk) = eager._check_cast_back_args(data, sf, fmt, block, out_dtype)
    num_rows = data.shape[0]
    _tilelang.require_cuda("data", data)
    _tilelang.check_dims_fit_int32("data", data)
    device = data.device
    out = torch.empty((num_rows, hidden), dtype=out_dtype, device=device)
    if num_rows == 0:
        return out
    bf16 = out_dtype == torch.bfloat16
    out_name = "bfloat16" if bf16 else "float32"
    width = BACK_WIDTH[out_name]
    if hidden % width:
        path, divisor = "flat", hidden  # an element's row: element // H
    else:
        path, divisor = ("column" if bk == 1 else "block"), hidden // width  # a chunk's row: chunk // (H / width)
    config = _cast_back_config(fmt, out_name, path)
    kernel = _tilelang.kernel_for(CAST_BACK, config, device)
    args = _sf_args(sf)
    # bk == H (one sf column) need not be a power of two: shifting a column index by 31 gives 0.
    bk_log2 = bk.bit_length() - 1 if bk & (bk - 1) == 0 else 31
    row_mul, row_shift = magic_divisor(divisor)
    data = _tilelang.aligned(data, VECTOR_BYTES)  # the vector loads count chunks from its start
    flat = data.view(torch.uint8).reshape(-1)
    per_row = flat.numel() // num_rows  # bytes
    word = torch.uint16 if (fmt == "e2m1" and width == 4) else torch.int32  # the kernel's data elements
    word_bytes = 2 if word == torch.uint16 else 4
    out_flat = (out.view(torch.int16) if bf16 else out).reshape(-1)
    # Launches of whole rows, at most BACK_MAX_ELEMENTS elements (int32 indices) and a multiple of 8
    # rows where that fits, so that each starts on a chunk boundary (r0 * H % width == 0).  Only rows
    # longer than BACK_MAX_ELEMENTS / 8 with H % width != 0 can start elsewhere: those go through
    # aligned copies.
    rows_per_launch = max(1, BACK_MAX_ELEMENTS // hidden)
    if rows_per_launch < num_rows and rows_per_launch >= 8:
        rows_per_launch -= rows_per_launch % 8
    rows_per_launch = min(rows_per_launch, max(1, _tilelang.MAX_BLOCKS_PER_LAUNCH * config.threads * config.chunks
                                                  * width // hidden))
    with _tilelang.device_guard(device):
        for r0 in range(0, num_rows, rows_per_launch):
            r1 = min(num_rows, r0 + rows_per_launch)
            piece, target = flat[r0 * per_row:r1 * per_row], out_flat[r0 * hidden:r1 * hidden]
            aligned = (r0 * hidden) % width == 0
            if not aligned:
                piece, target = piece.clone(), torch.empty_like(target)
            # whole words (the bytes past the last whole chunk are read from the byte view)
            words = piece[:piece.numel() - piece.numel() % word_bytes].view(word)
            kernel(words if words.numel() else _tilelang.placeholder(word, device), piece, args.flat_f32, args.flat_u8,
                   target, (r1 - r0) * hidden, hidden, row_mul, row_shift, bm.bit_length() - 1, bk_log2, r0,
                   args.s0, args.s1, args.mode)
            if not aligned:
                out_flat[r0 * hidden:r1 * hidden].copy_(target)
    return out
