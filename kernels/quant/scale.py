"""A block's amax, its scale factor, and the sf storage: the macros every cast kernel shares.

* amax on the fp32 bits: |x| is ``bits & 0x7FFFFFFF`` (for bf16 input, on the raw halves: a
  per-halfword unsigned max), whose integer order is the order of the magnitudes with every NaN
  above +inf; for computed values (fp32 input, SwiGLU's y) a ``max.NaN`` of |v|.  Either way a
  NaN reaches the amax (no maxNum drops it), and a block is non-finite iff its amax bits are
  >= 0x7F800000.  a = max(amax, clamp_min) is an integer max of the bits.
* A non-finite block gets sf = NaN, and so is its reciprocal: every quotient of the block is NaN.
* Plain sf = a / max_q by IEEE division (``__fdiv_rn``).  The quotient x / sf:
  - e4m3, e5m6: q = x * r (``__fmul_rn``, r = ``__fdiv_rn(1, sf)``) and one Markstein
    correction q' = q - (q * sf - x) * r (two ``__fmaf_rn``): with r the correctly rounded
    reciprocal and q within an ULP, the residual is exact and q' is the correctly rounded
    quotient, as an IEEE division gives.  The residual is exact unless x is tiny
    (|x| <~ 2^-100); the correction is applied in blocks with a >= 2^-60
    (`CORRECTION_MIN_BITS`), where every x that can round to a non-zero code is large enough.
    Below that (a tiny clamp_min) q alone is within 2^-23 of x / sf.  The negated form keeps -0
    a -0.
  - The token cast's e2m1 and SwiGLU: q = x * r alone, r = rcp.approx(sf) (within 1 ULP): q is
    within 1.5 * 2^-23 of x / sf, inside the spec's 2^-22 window (a code may be the neighbour
    where x / sf lies that close to a rounding boundary; the report counts those); for SwiGLU, y
    itself is judged to 2^-18.  These two casts are issue-bound, and the correction would cost
    2 of their about 17 (e2m1) and 30 (SwiGLU) instructions per element
    (reports/evidence/quant.md#quotient-cost).
* round_sf: sf = 2^k with k the least integer such that max_q * 2^k >= a, read off the bits
  exactly: with a = 1.m_a * 2^e_a and max_q = 1.m_q * 2^e_q, k = e_a - e_q + (m_a > m_q).  sf and
  1 / sf are built from exponent bits (both normal: a >= max_q * 2^-126 by the clamp_min check),
  so x * 2^-k is the exact quotient (the correction then adds an exact zero).
* The ue8m0 byte is the biased exponent k + 127 of that power of two (0xFF for NaN), never a
  cast.  Packed storage: byte c of a row goes to byte c % 4 of int32 word c / 4
  (little-endian), written as a byte into the int32 storage; the padding bytes of a last
  partial word come from the wrapper's torch.zeros.
* sf layouts: sf element (row, col) is at row * s0 + col * s1 (sf elements, int64) of the flat
  storage, so the row-major and the TMA-aligned column-major layouts (and, for a precomputed sf
  read as input, any strides) are one code path.  A precomputed ue8m0 byte b reads as
  2^(b - 127) (0: the subnormal 2^-127; 0xFF: NaN).
"""

import struct

from .common import F32_INF, F32_QNAN, MAX_Q, SF_FP32, SF_UE8M0, _f32, _u

# max_q = 1.m_q * 2^e_q: the exponent and the mantissa bits, for round_sf.
_MAXQ_BITS = {fmt: struct.unpack("<I", struct.pack("<f", value))[0] for fmt, value in MAX_Q.items()}
MAXQ_EXP = {fmt: ((bits >> 23) & 0xFF) - 127 for fmt, bits in _MAXQ_BITS.items()}
MAXQ_MANT = {fmt: bits & 0x7FFFFF for fmt, bits in _MAXQ_BITS.items()}

# The Markstein correction is applied in blocks with a >= 2^-60 (see the module docstring).
CORRECTION_MIN_BITS = (127 - 60) << 23


def _ue8m0_value(T, byte):
    """fp32 value 2^(byte - 127) of a ue8m0 byte (uint32); 0xFF is NaN, 0 is 2^-127."""
    return _f32(T, T.if_then_else(
        byte == _u(T, 0xFF), _u(T, F32_QNAN),
        T.if_then_else(byte == _u(T, 0), _u(T, 0x00400000), byte << _u(T, 23))))


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
