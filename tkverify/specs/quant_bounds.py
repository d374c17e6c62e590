"""The error analysis of the quantisation family: which results of a working-precision kernel
are correct, as per-element brackets for the `within` policy.  `tkverify.specs.quant_judge`
applies it to what an implementation returned; `tkverify.specs.quant` registers the ops.

data (every cast)
    Judged *given the implementation's own sf*: the exact quotient
    Q = x / sf_impl (float64) must round (RNE, satfinite) to the stored code.
    A kernel works in fp32, and one fp32 rounding of the quotient (IEEE
    division: <= 2^-24 relative; multiplying by a rounded reciprocal: < 2^-23;
    an approximate division such as div.approx.f32: <= 2 ULP, 2^-22) can carry
    Q across a rounding boundary of the format (a double rounding).  So an
    element may also take the code of Q * (1 +- 2^-22) (`CAST_WINDOW`): a
    neighbouring code, and only where Q lies within 2^-22 of a boundary.  Where
    sf_impl is a power of two (round_sf, ue8m0, or by chance) the quotient is
    exact in any precision and the window is 0: the code must be the correctly
    rounded one.  Truncation and an sf off by an ULP fail at once; ties-away
    fails where a quotient is exactly a tie and sf is a power of two (with a
    plain sf the window rightly accepts either neighbour of a tie).
    A block whose sf is NaN: every element must be NaN, except in e2m1 (which
    has no NaN) where the codes are unconstrained (not judged, counted as
    agreeing): the NaN sf already makes the block dequantise to NaN.
    clamp_min is the fp32 nearest the number given (1e-4 is 1.00000005e-4).
    A precomputed sf (any storage: fp32, ue8m0 bytes, packed ue8m0; any
    strides) is used as given, with IEEE division: sf = 0 gives +-inf (e5m6
    keeps it, e4m3 and e2m1 saturate to +-max), 0 / 0 is NaN; the judge
    applies the same rule with that sf.

sf (every cast)
    Against the oracle's sf from the exact amax.  round_sf, ue8m0 and packed
    ue8m0 are exact (a power of two found by exact comparison): within
    [sf, sf].  Plain fp32 sf = a / max_q: within 1.5 ULP (`SF_PLAIN_ULP`) of the
    exact quotient.  A correctly rounded division is <= 0.5 ULP; a kernel that
    multiplies by fl(1 / max_q) adds the reciprocal's error (< 2^-24 relative,
    i.e. < 1 ULP of the result), hence 1.5 (exhaustively over fp32 significands
    the worst is 8/7 ULP, for 448; torch on CUDA divides a tensor by a scalar
    this way).  Non-finite blocks: NaN (0xFF).

out (cast_back)
    Bitwise against the exact product q * sf rounded once to out_dtype
    (NaNs of any payload agree; signed zeros count).  IEEE overflow: a code
    can dequantise past the fp32 range (bf16's largest value with round_sf
    becomes 256 * 2^120 = 2^128), and then the correctly rounded result is inf.

swiglu_forward_and_per_token_cast
    y = l * sigmoid(l) * r * w is computed by a kernel in fp32, so its y is not
    the float64 y.  Error budget for an fp32 evaluation: exp <= 2 ULP, the add
    0.5, the reciprocal or division 1.5, three products 1.5, the quotient by
    sf 1.5: about 7 ULP (< 2^-20 relative); the declared relative bound is
    `SWIGLU_WINDOW` = 2^-18 (32 ULP; a fast-math __expf, whose error grows as
    1.17 |l| ULP, overruns it for |l| beyond ~25 and is meant to be reported).
    Below the normal fp32 range that relative bound cannot hold (sigmoid
    underflows to 0 or to subnormals - torch's does below l ~ -88 - and
    flush-to-zero kernels drop subnormal intermediates), so each element also
    gets an absolute allowance 2^-125 (1 + |l|)(1 + |r|)(1 + |w|)
    (`SWIGLU_ABSOLUTE`): one flushed intermediate of at most 2^-126 carried
    through the remaining factors, for any order of the products.  With y's
    range so bounded: data must round a value in [Q - d, Q + d] (d = the bound
    over sf_impl) and the sf must lie between the sf of the smallest and of the
    largest amax the bound allows (plain sf: with 1.5 ULP either side).
    clamped_count is bitwise: int64 counts, exact.
    Above the fp32 range: an element whose inputs are finite but for which
    some fp32 evaluation order can overflow (max(1,|l|) max(1,|r|) max(1,|w|)
    > the largest fp32) is unconstrained, and so is its block's sf: an fp32
    kernel may get inf, or inf * 0 = NaN where the exact y is finite (the
    suite finds such cases: w = 0 with |l r| ~ 1e75).  The other elements of
    such a block are still judged given whatever sf the kernel wrote (NaN sf:
    NaN codes).
    Padding rows (pos_to_token_topk == -1) are *written*, as if y were 0:
    codes +0 (any signed zero agrees) and the sf of an all-zero block
    (clamp_min / max_q, or its power of two); their x is never read (a NaN there
    changes nothing) and they are not counted in clamped_count.  Writing them
    rather than skipping them makes the output deterministic, and "sf = 0"
    would have no ue8m0 encoding.
    Non-finite values follow IEEE arithmetic: l = -inf gives -inf * 0 = NaN,
    and a NaN or an infinite y (also one past the fp32 range) makes its
    block's sf NaN.  The clamp never turns a NaN into a number.
"""

from __future__ import annotations

import numpy as np

import references.quant as ref
from tkverify import formats
from tkverify.policies import Bracket

CAST_WINDOW = 2.0**-22  # relative slack of a quotient by a plain sf: one fp32 rounding, approximate division included
SWIGLU_WINDOW = 2.0**-18  # relative error bound of an fp32 evaluation of y
SWIGLU_ABSOLUTE = 2.0**-125  # absolute allowance per unit of (1 + |l|)(1 + |r|)(1 + |w|): one flushed subnormal
SF_PLAIN_ULP = 1.5  # a plain fp32 sf: a / max_q within this many ULP


def unconstrained(bracket: Bracket, where: np.ndarray, actual_values: np.ndarray) -> Bracket:
    """The bracket with the elements `where` left unconstrained ([-inf, inf], NaN included).

    Their exact value is taken to be the actual one, so that they count as
    agreeing in the report instead of inflating its ULP figures.
    """
    return Bracket(np.where(where, actual_values, bracket.exact), np.where(where, -np.inf, bracket.low),
                   np.where(where, np.inf, bracket.high))


def element_bracket(q: np.ndarray, slack: np.ndarray, fmt: str, actual_codes: np.ndarray) -> Bracket:
    """The codes a value in [q - slack, q + slack] rounds to (RNE_sat), as a Bracket.

    NaN quotients must stay NaN; in e2m1 (no NaN) they are unconstrained.
    """
    f = formats.get(fmt)
    nan = np.isnan(q)
    finite_slack = np.where(np.isfinite(q) & np.isfinite(slack), slack, 0.0)
    safe = np.where(nan, 0.0, q)
    low = f.decode(f.encode(safe - finite_slack))
    high = f.decode(f.encode(safe + finite_slack))
    bracket = Bracket(q, np.where(nan, np.nan, low), np.where(nan, np.nan, high))
    if f.has_nan:
        return bracket
    return unconstrained(bracket, nan, f.decode(actual_codes))


def sf_bracket(a_low: np.ndarray, a_exact: np.ndarray, a_high: np.ndarray, fmt: str, round_sf: bool) -> Bracket:
    """The sf values allowed for clamped amax anywhere in [a_low, a_high] (exact: a_exact)."""
    exact = ref.scale_from_amax(a_exact, fmt, round_sf)
    low = ref.scale_from_amax(a_low, fmt, round_sf)
    high = ref.scale_from_amax(a_high, fmt, round_sf)
    if not round_sf:
        low = low - SF_PLAIN_ULP * formats.FP32.ulp(low)
        high = high + SF_PLAIN_ULP * formats.FP32.ulp(high)
    nan = np.isnan(exact)
    high = np.where(np.isnan(high), np.inf, high)  # a finite amax whose error bound reaches past fp32
    return Bracket(exact, np.where(nan, np.nan, low), np.where(nan, np.nan, high))


def quotient_slack(q: np.ndarray, sf_elements: np.ndarray, value_error: np.ndarray | None) -> np.ndarray:
    """How far from the exact quotient q = x / sf a kernel's quotient may lie: for exact inputs,
    CAST_WINDOW relative unless the sf is a power of two (then 0); for swiglu, y's error bound over |sf|."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if value_error is None:
            return np.where(ref.is_power_of_two(sf_elements), 0.0, CAST_WINDOW) * np.abs(q)
        return value_error / np.abs(sf_elements)


def swiglu_value_error(y: np.ndarray, l: np.ndarray, r: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Absolute error bound of an fp32 y: SWIGLU_WINDOW relative plus the SWIGLU_ABSOLUTE allowance."""
    with np.errstate(invalid="ignore", over="ignore"):
        floor = SWIGLU_ABSOLUTE * (1 + np.abs(l)) * (1 + np.abs(r)) * (1 + np.abs(w))[:, None]
        return SWIGLU_WINDOW * np.abs(y) + floor


def may_overflow_fp32(l: np.ndarray, r: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Finite elements some fp32 evaluation order of l * sigmoid(l) * r * w can overflow.

    Every intermediate product is at most max(1,|l|) max(1,|r|) max(1,|w|)
    (sigmoid <= 1); below the fp32 range no order overflows.  Infinite inputs
    are not included: IEEE gives them the same inf or NaN in every order.
    """
    w = w[:, None]
    with np.errstate(over="ignore", invalid="ignore"):
        biggest = np.maximum(1, np.abs(l)) * np.maximum(1, np.abs(r)) * np.maximum(1, np.abs(w))
    finite = np.isfinite(l) & np.isfinite(r) & np.isfinite(w)
    return finite & (biggest > formats.FP32.max_finite)
