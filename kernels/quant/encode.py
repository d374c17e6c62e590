"""The element encoders: the code of an fp32 quotient q = x / sf in each element format.

All round to nearest even with satfinite (the codes themselves: docs/contract/quant.md).

* e4m3: the prelude's ``tkq_e4m3x2``, the hardware conversion ``cvt.rn.satfinite.e4m3x2.f32``
  (sm_89+, one instruction for two values), with a bit-exact integer model for other targets;
  the kernels call it inline, two codes at a time.
* e2m1 (`_e2m1_nibble`; sm_90 has no conversion instruction for it): y = min(|q|, 6) (every
  value past 5 rounds to 6; NaN gives 6); with M = 2^23 the fp32 operations fma(y, 2, M),
  y + (M + 2) and fma(y, 1/2, M + 4) round 2y, y and y/2 to integers (RNE, in the adder): the
  e2m1 grids of [0, 2), [2, 4) and [4, 8) offset by each binade's first code.  Each
  over-estimates the code outside its binade, so the code is the low 3 bits of the least of the
  three (one 3-input integer min); the sign (bit 3 of q >> 28) is muxed in with one LOP3.
  Exact for subnormal quotients (e2m1 at sf = 2^-126) as everywhere.
* e5m6 (`_e5m6_code`; never via fp16, which would round twice): C = 2^(max(e, -14) + 17), e the
  binade of |q| (clamped at 2^16), makes the fp32 adder round |q| + C at e5m6's spacing in that
  binade (RNE, subnormals included); the code is bits(|q| + C) - bits(C) plus the binade's first
  code, saturated at 0x7BF (65024).  NaN gives 0x7E0; an exactly infinite quotient (a
  precomputed sf of 0, or x = +-inf) 0x7C0, while an fp32 overflow of a finite one saturates;
  sign 0x800.
* e5m6 without a branch (`_e5m6_code_fast`, TokenConfig.fast_e5m6): the same code for every
  fp32 q, from r = (a + C) - C and bits(r * 2^-112) = code << 17.  It takes about 156 instead of
  212 SASS instructions per 8-element chunk of the token cast's row path, because the NaN select
  of `_e5m6_code` compiles to a branch per element (reports/evidence/quant.md#e5m6-fast-encode).
  Kernels with a precomputed sf keep `_e5m6_code`, whose exactly infinite quotients get the
  inf code.
"""

from .common import F32_INF, _bits, _f32, _u


def _e2m1_nibble(T, q):
    """e2m1 code (sign in bit 3) of the fp32 quotient q, RNE with satfinite (see the module docstring).

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
    """12-bit e5m6 code of the fp32 quotient q, RNE with satfinite (see the module docstring).

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
