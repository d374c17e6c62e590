"""The cast_back kernel (kernel quant.cast_back) and its wrapper: codes times their sf, rounded
once to bf16 or fp32.

The flat T * H output in *chunks* of w consecutive elements, one 16-byte vector store each (w = 8
for bf16, 4 for fp32); a chunk's codes come in one load (e4m3: w bytes, e2m1: w / 2, e5m6: 8
codes in three 32-bit words, 4 codes in two of them).  A thread takes K chunks,
(cta * K + k) * threads + t, a warp's loads and stores of one k contiguous; every data load (and
every per-chunk sf read) is issued before the first chunk is converted (K and the CTA size per
configuration: `CastBackConfig`).  Three paths, a kernel each, chosen by the wrapper:

* H % w == 0, bk > 1 (every (1, bk), (1, H) and 2-D block; bk is then a multiple of w): a chunk
  lies in one row (its index / (H / w) by a multiply-shift) and one sf block: one sf read per
  chunk.
* H % w == 0, bk == 1 ((bm, 1) blocks): an sf read per element (consecutive, L1 hits).
* H % w != 0 (e4m3 and e2m1 with (bm, 1) or (1, H) blocks only): chunks still start at multiples
  of w of the flat tensor, so the vectors stay aligned; each element's row is its index / H, and
  the last T * H % w elements are done one by one by one thread.

Decoding is exact: e4m3 by ``cvt.rn.f16x2.e4m3x2`` (every e4m3 value is an f16), e2m1 by one byte
permutation of a table of the magnitudes' f16 high bytes, e5m6 as the f16 with bits code << 4;
then f16 -> fp32.  fp32 out: q * sf by ``__fmul_rn``.  bf16 out: q * sf rounded to odd into fp32,
then ``cvt.rn.bf16x2.f32`` (RNE): one correct rounding (a double rounding through RNE fp32 would
not be).  Round to odd: t = ``__fmul_rz``(q, sf) and the sticky bit from r = fma(q, sf, -t) != 0,
which is exact when |sf| is a finite fp32 >= 2^-100 (q * sf is then a multiple of 2^-143); other
sf (0, subnormal, tiny, inf, NaN) take the exact product in fp64 and ``__double2float_rz`` (per
chunk, or per element where each has its own sf), out of line: the fp64 product for every sf costs
144 us against 90 us (reports/evidence/quant.md#cast-back-products).  NaN results are the
hardware's canonical NaN.

Launches are whole rows, at most 2^30 elements (int32 indices), a multiple of 8 rows where that
fits so that each starts on a chunk boundary; rows of more than 2^27 elements with H % w != 0 go
through aligned copies.  Static configurations: (format, out dtype, path), 14, plus the tuning
candidates `CAST_BACK_TUNE_CONFIGS`; the block geometry, sf storage, T and H are runtime
arguments.
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.
from typing import Any, NamedTuple

import torch

from .. import _tilelang
from .._tilelang import KernelDef
from ..torch import quant as eager
from .common import FORMATS, PASS_CONFIGS, VECTOR_BYTES, _fastdiv, _sf_args, _u, magic_divisor
from .prelude import PRELUDE
from .scale import _scale_macros

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


# Shipped chunks per thread, 128-thread CTAs.  CUDA-graph device time on the H200 at 16384 x 7168,
# copy 4.2 TB/s (reports/evidence/quant.md#cast-back-chunks): e4m3 (1, 128) -> bf16 90.2 us (94% of
# copy), -> fp32 153 us (92%); e2m1 (1, 32) -> bf16 83.5 us (88%), -> fp32 144 us (90%); e5m6
# (1, H) -> bf16 103 us (95%), -> fp32 163 us (94%).  For e4m3 -> bf16, 2 chunks: 90.0, 8: 92.0, 256
# threads x 4: 91.9 (the candidates below); per format, 4 or 8 chunks are within 2%.
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


# ------------------------------------------------------------------ the builder


def _chunk_macros(T, fmt, width, bf16, e5m6, read_scale):
    """(f16_value, decode_chunk, scale_at, convert_chunk): a chunk's codes to fp32 values, its sf,
    and the products rounded once to the out dtype."""

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
            # e5m6: codes h0..h7 in three words (docs/contract/quant.md)
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

    return f16_value, decode_chunk, scale_at, convert_chunk


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

    f16_value, decode_chunk, scale_at, convert_chunk = _chunk_macros(T, fmt, width, bf16, e5m6, read_scale)

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


# ------------------------------------------------------------------ host side


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
