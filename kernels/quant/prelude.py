"""`PRELUDE`: the device helpers placed before every quant kernel's generated code.

The asm paths are the ones compiled for the GPU; the portable paths are bit-exact models, used
on other architectures and by a CPU emulation of the generated source.  The cast kernels call
them through ``T.call_extern``: ``tkq_e4m3x2`` is the e4m3 encoder (``cvt.rn.satfinite.e4m3x2.f32``,
sm_89+: RNE in every range including subnormals, finite overflow and +-inf to +-448, NaN to NaN),
``tkq_mux_low3`` finishes the e2m1 encoder (`kernels.quant.encode`), ``tkq_vmaxu2`` takes the
amax of raw bf16 halves, ``tkq_min_nan`` / ``tkq_max_nan`` are NaN-propagating min / max.

No flush-to-zero where it matters: tilelang compiles without --use_fast_math, and every
rounding-sensitive operation is an explicit ``_rn`` intrinsic (never contracted into an FMA).
The only .ftz operations are ``tkq_rcp_approx`` of sf (a normal number with a normal
reciprocal) and of SwiGLU's 1 + exp(-l) (a flushed sigmoid is inside the spec's allowance).

The text of `PRELUDE` is part of every kernel's CUDA source, comments included: editing it
changes the source (and tilelang's cache key) of every quant configuration.
"""

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
