"""Tests of tkverify.formats against independent references.

References: numpy's and ml_dtypes' casts where they have the format, and a
brute-force nearest-value search over each format's whole code table.
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tkverify import formats as F
from tkverify.formats import BF16, E2M1, E4M3, E5M2, E5M6, FP16, FP32, UE8M0

SMALL = [BF16, FP16, E4M3, E5M2, E2M1, E5M6, UE8M0]  # <= 16 bits: full tables
ALL = [FP32, *SMALL]
RNG_SEED = 20260401


def ids(fmts):
    return [f.name for f in fmts]


# -- the contract's table ------------------------------------------------------


@pytest.mark.parametrize(
    "fmt, bits, max_finite, min_subnormal, has_inf, has_nan",
    [
        (FP32, 32, float(np.finfo(np.float32).max), 2.0**-149, True, True),
        (BF16, 16, float(ml_dtypes.finfo(ml_dtypes.bfloat16).max), 2.0**-133, True, True),
        (FP16, 16, 65504.0, 2.0**-24, True, True),
        (E4M3, 8, 448.0, 2.0**-9, False, True),
        (E5M2, 8, 57344.0, 2.0**-16, True, True),
        (E2M1, 4, 6.0, 0.5, False, False),
        (E5M6, 12, 65024.0, 2.0**-20, True, True),
        (UE8M0, 8, 2.0**127, 2.0**-127, False, True),
    ],
    ids=ids(ALL),
)
def test_format_parameters(fmt, bits, max_finite, min_subnormal, has_inf, has_nan):
    assert (fmt.bits, fmt.max_finite, fmt.min_subnormal) == (bits, max_finite, min_subnormal)
    assert (fmt.has_inf, fmt.has_nan) == (has_inf, has_nan)
    assert np.iinfo(fmt.code_dtype).bits >= bits
    assert np.ldexp(1.0, fmt.emax) <= fmt.max_finite < np.ldexp(1.0, fmt.emax + 1)
    assert fmt.min_subnormal == fmt.ulp(0.0)


def test_saturating_defaults():
    assert {f.name for f in ALL if f.saturates} == {"e4m3", "e2m1", "e5m6", "ue8m0"}


def test_registry():
    assert set(F.FORMATS) == {"fp32", "bf16", "fp16", "e4m3", "e5m2", "e2m1", "e5m6", "ue8m0"}
    assert F.get("e5m6") is E5M6
    with pytest.raises(KeyError, match="e4m3"):
        F.get("fp8")


# -- decode against independent decoders ---------------------------------------


def independent_decode(fmt, codes):
    """Values of codes from numpy / ml_dtypes views, or from the OPS formulas."""
    if fmt is FP32:
        return codes.astype(np.uint32).view(np.float32).astype(np.float64)
    if fmt is FP16:
        return codes.astype(np.uint16).view(np.float16).astype(np.float64)
    if fmt is BF16:
        return codes.astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)
    if fmt is E4M3:
        return codes.astype(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    if fmt is E5M2:
        return codes.astype(np.uint8).view(ml_dtypes.float8_e5m2).astype(np.float64)
    if fmt is E2M1:
        return codes.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    if fmt is E5M6:  # docs/contract/README.md: code c is the fp16 with bits c << 4
        return (codes.astype(np.uint16) << 4).view(np.float16).astype(np.float64)
    if fmt is UE8M0:  # 2^(c - 127), 0xFF = NaN
        c = codes.astype(np.int64)
        return np.where(c == 0xFF, np.nan, np.ldexp(1.0, (c - 127).astype(np.int32)))
    raise AssertionError(fmt)


def assert_same_values(a, b):
    """Equal values, same sign of zero, NaN where NaN (sign of NaN ignored)."""
    nan = np.isnan(a)
    np.testing.assert_array_equal(nan, np.isnan(b))
    np.testing.assert_array_equal(a[~nan], b[~nan])
    np.testing.assert_array_equal(np.signbit(a[~nan]), np.signbit(b[~nan]))


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")  # signalling NaNs
@pytest.mark.parametrize("fmt", SMALL, ids=ids(SMALL))
def test_decode_matches_independent_decoder(fmt):
    codes = fmt.all_codes()
    decoded = fmt.decode(codes)
    assert decoded.dtype == np.float64 and decoded.shape == codes.shape
    assert_same_values(decoded, independent_decode(fmt, codes))
    np.testing.assert_array_equal(fmt.is_nan(codes), np.isnan(decoded))


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")  # signalling NaNs
def test_decode_fp32_sample():
    codes = np.random.default_rng(RNG_SEED).integers(0, 2**32, 300_000, dtype=np.uint32)
    codes[:6] = [0, 0x80000000, 1, 0x7F800000, 0xFF800000, 0x7FC00001]
    assert_same_values(FP32.decode(codes), independent_decode(FP32, codes))


def test_decode_rejects_codes_out_of_range():
    with pytest.raises(ValueError, match="e5m6"):
        E5M6.decode(np.array([4096], np.uint16))
    with pytest.raises(ValueError, match="e2m1"):
        E2M1.decode(np.array([16], np.uint8))
    with pytest.raises(ValueError):
        E4M3.decode(np.array([1.0]))


# -- round trips ---------------------------------------------------------------


@pytest.mark.parametrize("fmt", SMALL, ids=ids(SMALL))
def test_every_code_round_trips(fmt):
    codes = fmt.all_codes()
    again = fmt.encode(fmt.decode(codes))
    assert again.dtype == fmt.code_dtype
    nan = fmt.is_nan(codes)
    np.testing.assert_array_equal(again[~nan], codes[~nan])  # +-0 and +-inf included
    assert fmt.is_nan(again[nan]).all()
    if fmt.signed:  # a NaN keeps its sign
        sign = 1 << (fmt.bits - 1)
        np.testing.assert_array_equal(again[nan] & sign, codes[nan] & sign)


def test_fp32_sampled_codes_round_trip():
    codes = np.random.default_rng(RNG_SEED + 1).integers(0, 2**32, 300_000, dtype=np.uint32)
    nan = FP32.is_nan(codes)
    np.testing.assert_array_equal(FP32.encode(FP32.decode(codes))[~nan], codes[~nan])


# -- brute-force reference -----------------------------------------------------


@functools.lru_cache(maxsize=None)
def nonnegative_table(fmt):
    """(values, codes) of the non-negative finite values, ascending, with one
    virtual value past max_finite: the code max+1 in an unbounded exponent
    range (overflow lands there)."""
    codes = fmt.all_codes().astype(np.int64)
    values = fmt.decode(codes)
    keep = np.isfinite(values) & ~np.signbit(values)
    values, codes = values[keep], codes[keep]
    order = np.argsort(values, kind="stable")
    values, codes = values[order], codes[order]
    assert (np.diff(values) > 0).all() and (np.diff(codes) == 1).all()
    # The top binade's spacing continues past max (max and the value below it
    # share a binade in every format with mantissa bits); ue8m0's next value
    # is the next power of two.
    virtual = 2 * values[-1] if fmt.mbits == 0 else 2 * values[-1] - values[-2]
    return np.append(values, virtual), np.append(codes, codes[-1] + 1)


def brute_force_encode(fmt, x, saturate=None):
    """Nearest code by search over the table; ties to the even code."""
    saturate = fmt.saturates if saturate is None else saturate
    x = np.asarray(x, dtype=np.float64)
    assert not np.isnan(x).any()
    values, codes = nonnegative_table(fmt)
    ax = np.minimum(np.abs(x), values[-1])  # at or past the virtual value: overflow
    lo = np.clip(np.searchsorted(values, ax, side="right") - 1, 0, len(values) - 2)
    hi = lo + 1
    mid = (values[lo] + values[hi]) / 2  # exact in float64 for every format here
    take_hi = (ax > mid) | ((ax == mid) & (codes[lo] % 2 == 1))
    mag = np.where(take_hi, codes[hi], codes[lo])
    # ue8m0 has no zero: below its lowest value the nearest is that value.
    mag = np.where(ax < values[0], codes[0], mag)
    # The virtual code past max is +inf in the IEEE-like formats and the
    # all-ones NaN in e4m3 and ue8m0: exactly where non-saturating overflow
    # goes.  Saturating, it becomes max, unless an infinity stays infinite.
    overflow = (mag == codes[-1]) | np.isinf(x)
    if saturate:
        keep_inf = np.isinf(x) & fmt.has_inf
        mag = np.where(keep_inf, codes[-1], np.where(overflow, codes[-2], mag))
    else:
        mag = np.where(overflow, codes[-1], mag)
    if fmt.signed:
        mag = mag | np.where(np.signbit(x), 1 << (fmt.bits - 1), 0)
    return mag.astype(fmt.code_dtype)


def sweep(fmt, rng, n_random=20_000):
    """Every value, every midpoint, both float64 neighbours of each, values
    past max, tiny values, zeros, and random float64 values of both signs."""
    values, _ = nonnegative_table(fmt)
    mids = (values[:-1] + values[1:]) / 2
    points = np.concatenate([values[:-1], mids])
    special = [
        0.0, 5e-324, fmt.min_subnormal / 2, fmt.min_subnormal / 4, fmt.max_finite * 1.5,
        fmt.max_finite * 2, fmt.max_finite * 4, 1e300, np.finfo(np.float64).max, np.inf,
    ]
    log_uniform = np.exp2(rng.uniform(np.log2(fmt.min_subnormal) - 4, np.log2(fmt.max_finite) + 2, n_random))
    any_bits = rng.integers(0, 2**63, n_random, dtype=np.uint64).view(np.float64)
    x = np.concatenate([
        points, np.nextafter(points, -np.inf), np.nextafter(points, np.inf),
        special, log_uniform, any_bits[np.isfinite(any_bits)],
    ])
    x = x[x >= 0]
    return np.concatenate([x, -x]) if fmt.signed else x


@pytest.mark.parametrize("fmt", SMALL, ids=ids(SMALL))
@pytest.mark.parametrize("saturate", [None, True, False])
def test_encode_matches_brute_force(fmt, saturate):
    if saturate is False and not (fmt.has_inf or fmt.has_nan):
        with pytest.raises(ValueError, match="saturating"):
            fmt.encode(np.ones(3), saturate=False)
        return
    x = sweep(fmt, np.random.default_rng(RNG_SEED))
    got = fmt.encode(x, saturate=saturate)
    want = brute_force_encode(fmt, x, saturate)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{fmt.name}: x={x[bad[:5]]!r} got={got[bad[:5]]} want={want[bad[:5]]}"


@pytest.mark.parametrize("fmt", SMALL, ids=ids(SMALL))
@settings(max_examples=300, deadline=None)
@given(x=st.floats(allow_nan=False))
def test_encode_matches_brute_force_hypothesis(fmt, x):
    if not fmt.signed:
        x = abs(x)
    assert fmt.encode(x) == brute_force_encode(fmt, x)


def test_fp32_encode_around_sampled_codes():
    """fp32's table is too large to search: check the rounding at the
    midpoints of a random sample of adjacent code pairs instead."""
    rng = np.random.default_rng(RNG_SEED + 2)
    lo = rng.integers(0, 0x7F7FFFFF, 300_000, dtype=np.uint32)  # lo and lo+1 finite
    lo[:3] = [0, 0x007FFFFF, 0x7F7FFFFE]  # zero, subnormal/normal boundary, top
    hi = lo + 1
    mid = (FP32.decode(lo) + FP32.decode(hi)) / 2
    even = np.where(lo % 2 == 0, lo, hi)
    np.testing.assert_array_equal(FP32.encode(mid), even)
    np.testing.assert_array_equal(FP32.encode(np.nextafter(mid, -np.inf)), lo)
    np.testing.assert_array_equal(FP32.encode(np.nextafter(mid, np.inf)), hi)
    np.testing.assert_array_equal(FP32.encode(-mid), even | 0x80000000)
    # Past the top: max + ulp/2 is the IEEE overflow threshold.
    top = FP32.max_finite + 2.0**103
    assert FP32.encode(top) == 0x7F800000
    assert FP32.encode(np.nextafter(top, 0)) == 0x7F7FFFFF
    assert FP32.encode(top, saturate=True) == 0x7F7FFFFF


# -- agreement with numpy / ml_dtypes casts --------------------------------------


REFERENCE_CASTS = {
    "fp32": np.float32,
    "fp16": np.float16,
    "bf16": ml_dtypes.bfloat16,
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "e2m1": ml_dtypes.float4_e2m1fn,
}


def reference_cast(fmt, x):
    dtype = np.dtype(REFERENCE_CASTS[fmt.name])
    if fmt.saturates:  # ml_dtypes turns e4m3 overflow into NaN: clamp first
        x = np.clip(x, -fmt.max_finite, fmt.max_finite)
    with np.errstate(over="ignore", invalid="ignore"):
        out = x.astype(dtype)
    return out.view(np.dtype(f"u{dtype.itemsize}")).astype(fmt.code_dtype)


NUMPY_CASTS = [FP32, FP16]  # numpy rounds float64 directly to these
ML_DTYPES_CASTS = [BF16, E4M3, E5M2, E2M1]


def reference_sweep(fmt, rng):
    if fmt is not FP32:
        return sweep(fmt, rng)
    codes = rng.integers(0, 0x7F800000, 200_000, dtype=np.uint32)
    v, w = FP32.decode(codes), FP32.decode(codes + 1)
    mids = (v + w) / 2
    x = np.concatenate([v, mids, np.nextafter(mids, 0), np.nextafter(mids, np.inf)])
    return np.concatenate([x, -x, rng.standard_normal(10_000) * 1e-40, [1e39, -np.inf, 0.0, -0.0]])


def is_float32(x):
    with np.errstate(over="ignore"):
        return x.astype(np.float32).astype(np.float64) == x


@pytest.mark.parametrize("fmt", NUMPY_CASTS, ids=ids(NUMPY_CASTS))
def test_encode_matches_numpy(fmt):
    x = reference_sweep(fmt, np.random.default_rng(RNG_SEED + 3))
    np.testing.assert_array_equal(fmt.encode(x), reference_cast(fmt, x))


@pytest.mark.parametrize("fmt", ML_DTYPES_CASTS, ids=ids(ML_DTYPES_CASTS))
def test_encode_matches_ml_dtypes(fmt):
    """ml_dtypes casts float64 to these types through float32, which rounds
    twice: a value just off a midpoint of the target first lands on the
    midpoint, and the tie then goes to the even code (e.g. bf16: x =
    nextafter(midpoint(code 1, code 2), 0) gives code 2; the brute-force
    search and we give code 1).  So: exact agreement on float32-representable
    inputs, where the first rounding is exact, and every disagreement
    elsewhere explained by that first rounding."""
    x = sweep(fmt, np.random.default_rng(RNG_SEED + 3))
    if fmt is E2M1:
        x = x[np.isfinite(x)]  # ml_dtypes has its own rules for inf -> e2m1
    ours, theirs = fmt.encode(x), reference_cast(fmt, x)
    exact = is_float32(x)
    np.testing.assert_array_equal(ours[exact], theirs[exact])
    differ = ours != theirs
    with np.errstate(over="ignore"):
        via_float32 = x[differ].astype(np.float32).astype(np.float64)
    np.testing.assert_array_equal(reference_cast(fmt, via_float32), theirs[differ])
    np.testing.assert_array_equal(fmt.encode(x[differ]), brute_force_encode(fmt, x[differ]))


def test_e4m3_non_saturating_matches_ml_dtypes():
    """saturate=False is OCP's non-saturating mode: overflow -> NaN, as in
    ml_dtypes (compared on float32-representable inputs, as above)."""
    x = sweep(E4M3, np.random.default_rng(RNG_SEED + 4))
    x = x[is_float32(x)]
    got = E4M3.encode(x, saturate=False)
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    nan = E4M3.is_nan(want)
    np.testing.assert_array_equal(E4M3.is_nan(got), nan)
    np.testing.assert_array_equal(got[~nan], want[~nan])
    assert E4M3.encode(464.0, saturate=False) == 0x7E  # the tie goes to 448 (even code)
    assert E4M3.is_nan(E4M3.encode(np.nextafter(464.0, np.inf), saturate=False))


def test_ue8m0_matches_ml_dtypes_away_from_ties():
    """ml_dtypes' float8_e8m0fnu rounds the ties 1.5 * 2^k up whatever the
    code's parity; we take the even code.  It also rounds through float32
    (see above) and misrounds float32 subnormal inputs (1.25 * 2^-127 gives
    2^-126).  On float32-representable normal inputs away from ties the two
    agree."""
    x = sweep(UE8M0, np.random.default_rng(RNG_SEED + 5))
    x = x[(x >= 2.0**-126) & (x <= UE8M0.max_finite) & is_float32(x)]
    tie = np.frexp(x)[0] == 0.75
    assert tie.any()
    want = x.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)
    got = UE8M0.encode(x)
    np.testing.assert_array_equal(got[~tie], want[~tie])
    assert (got[tie] % 2 == 0).all()
    assert UE8M0.encode(3.0) == 128 and UE8M0.encode(6.0) == 130  # 3 = tie(2, 4) -> 2; 6 -> 8


# -- special inputs --------------------------------------------------------------


def test_nan_and_inf_inputs():
    x = np.array([np.nan, -np.nan, np.inf, -np.inf])
    assert list(FP32.encode(x)) == [0x7FC00000, 0xFFC00000, 0x7F800000, 0xFF800000]
    assert list(BF16.encode(x)) == [0x7FC0, 0xFFC0, 0x7F80, 0xFF80]
    assert list(FP16.encode(x)) == [0x7E00, 0xFE00, 0x7C00, 0xFC00]
    assert list(E5M2.encode(x)) == [0x7E, 0xFE, 0x7C, 0xFC]
    assert list(E5M6.encode(x)) == [0x7E0, 0xFE0, 0x7C0, 0xFC0]  # satfinite keeps inf
    assert list(E4M3.encode(x)) == [0x7F, 0xFF, 0x7E, 0xFE]  # inf saturates to 448
    assert list(E4M3.encode(x, saturate=False)) == [0x7F, 0xFF, 0x7F, 0xFF]
    assert list(E5M2.encode(x, saturate=True)) == [0x7E, 0xFE, 0x7C, 0xFC]
    assert list(E5M2.encode([1e6, -1e6], saturate=True)) == [0x7B, 0xFB]
    assert list(E2M1.encode([np.inf, -np.inf, 100.0])) == [0x7, 0xF, 0x7]
    assert list(UE8M0.encode([np.nan, np.inf, 2.0**200, 0.0, -0.0, 1.0])) == [0xFF, 0xFE, 0xFE, 0, 0, 127]


def test_invalid_inputs_raise():
    with pytest.raises(ValueError, match="NaN"):
        E2M1.encode(np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="saturating"):
        E2M1.encode(1.0, saturate=False)
    with pytest.raises(ValueError, match="negative"):
        UE8M0.encode(np.array([1.0, -1.0]))


def test_signed_zero_and_shapes():
    x = np.array([[0.0, -0.0], [-1e-300, 1e-300]])
    for fmt in ALL:
        if not fmt.signed:
            continue
        codes = fmt.encode(x)
        assert codes.shape == (2, 2) and codes.dtype == fmt.code_dtype
        sign = 1 << (fmt.bits - 1)
        assert codes.tolist() == [[0, sign], [sign, 0]]
    assert FP16.encode(1.0).shape == ()


# -- ulp -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fmt, x, want",
    [
        (E4M3, 1.0, 0.125), (E4M3, 448.0, 32.0), (E4M3, 0.0, 2.0**-9), (E4M3, 2.0**-8, 2.0**-9),
        (E4M3, 2.0**-6, 2.0**-9), (E4M3, 2.0**-5, 2.0**-8), (E4M3, -1.5, 0.125), (E4M3, 1e6, 2.0**16),
        (BF16, 1.0, 2.0**-7), (FP16, 1.0, 2.0**-10), (FP32, 1.0, 2.0**-23), (FP32, 0.0, 2.0**-149),
        (E2M1, 1.0, 0.5), (E2M1, 6.0, 2.0), (E2M1, 0.5, 0.5), (E2M1, 0.0, 0.5), (E2M1, 2.0, 1.0),
        (E5M6, 1.0, 2.0**-6), (E5M6, 0.0, 2.0**-20), (E5M6, 65024.0, 512.0), (E5M2, 57344.0, 8192.0),
        (UE8M0, 1.0, 1.0), (UE8M0, 3.0, 2.0), (UE8M0, 0.0, 2.0**-127), (UE8M0, 2.0**127, 2.0**127),
        (E4M3, np.inf, 32.0), (E5M6, -np.inf, 512.0),
    ],
)
def test_ulp_known_values(fmt, x, want):
    assert fmt.ulp(x) == want


def test_ulp_of_nan_is_nan():
    for fmt in ALL:
        assert np.isnan(fmt.ulp(np.nan))


@pytest.mark.parametrize("fmt", ALL, ids=ids(ALL))
def test_ulp_is_the_gap_above_each_code(fmt):
    """ulp(v) = next value - v for every finite v >= 0 below max (at a power
    of two that is the gap above it), and the gap around any x in between."""
    if fmt is FP32:
        codes = np.random.default_rng(RNG_SEED + 6).integers(0, 0x7F7FFFFF, 300_000, dtype=np.uint32)
        lo, hi = FP32.decode(codes), FP32.decode(codes + 1)
    else:
        values, _ = nonnegative_table(fmt)
        lo, hi = values[:-2], values[1:-1]  # every adjacent pair of finite values
    gap = hi - lo
    np.testing.assert_array_equal(fmt.ulp(lo), gap)
    np.testing.assert_array_equal(fmt.ulp(-lo), gap)
    inside = np.nextafter(hi, 0)
    np.testing.assert_array_equal(fmt.ulp(inside), gap)
    np.testing.assert_array_equal(fmt.ulp((lo + hi) / 2), gap)


# -- ulp_error -------------------------------------------------------------------


@pytest.mark.parametrize("fmt", SMALL, ids=ids(SMALL))
def test_ulp_error_of_midpoints_is_half(fmt):
    values, _ = nonnegative_table(fmt)
    lo, hi = values[:-2], values[1:-1]
    mid = (lo + hi) / 2
    np.testing.assert_array_equal(fmt.ulp_error(lo, mid), 0.5)
    np.testing.assert_array_equal(fmt.ulp_error(hi, mid), 0.5)
    np.testing.assert_array_equal(fmt.ulp_error(-hi, -mid), 0.5)
    np.testing.assert_array_equal(fmt.ulp_error(lo, lo), 0.0)


@pytest.mark.parametrize("fmt", ALL, ids=ids(ALL))
def test_correct_rounding_has_ulp_error_at_most_half(fmt):
    x = sweep(FP16 if fmt is FP32 else fmt, np.random.default_rng(RNG_SEED + 7), n_random=5_000)
    if fmt is FP32:
        x = np.concatenate([x, [3.5e38, 3.4028235e38, 1e39, -np.inf]])
    y = fmt.decode(fmt.encode(x))
    err = fmt.ulp_error(y, x)
    assert (err <= 0.5).all(), x[err > 0.5][:5]
    # The next code up is at least half an ulp away (exactly half at a tie
    # that went down), for finite targets away from the top.
    top = int(fmt.encode(fmt.max_finite))
    nxt = fmt.decode(np.minimum(fmt.encode(np.abs(x)).astype(np.int64) + 1, top))
    inside = (np.abs(x) < fmt.max_finite / 2) & (nxt != np.abs(y))
    assert (fmt.ulp_error(nxt[inside], np.abs(x)[inside]) >= 0.5).all()


def test_ulp_error_saturation_rule():
    assert E4M3.ulp_error(448.0, 1e6) == 0
    assert E4M3.ulp_error(416.0, 1e6) == 1
    assert E4M3.ulp_error(448.0, np.inf) == 0  # no inf in e4m3: +-inf saturates
    assert E4M3.ulp_error(-448.0, -np.inf) == 0
    assert E4M3.ulp_error(np.nan, 1e6, saturate=False) == 0  # OCP non-saturating: NaN
    assert E2M1.ulp_error(6.0, 100.0) == 0
    assert E5M6.ulp_error(65024.0, 1e9) == 0
    assert E5M6.ulp_error(65024.0, np.inf) == np.inf  # e5m6 has inf: inf stays inf
    assert E5M6.ulp_error(np.inf, 1e9) == np.inf
    assert E5M2.ulp_error(57344.0, 1e9, saturate=True) == 0
    assert UE8M0.ulp_error(2.0**-127, 0.0) == 0  # no zero: 2^-127 is the nearest


def test_ulp_error_overflow_rule():
    # fp16: max 65504, ulp 32, so |x| >= 65520 rounds to inf.
    assert FP16.ulp_error(np.inf, 65520.0) == 0
    assert FP16.ulp_error(65504.0, 65520.0) == np.inf
    assert FP16.ulp_error(65504.0, np.nextafter(65520.0, 0)) < 0.5
    assert FP16.ulp_error(-np.inf, -1e10) == 0
    assert FP16.ulp_error(np.inf, -1e10) == np.inf


def test_ulp_error_nan_and_inf_rules():
    for fmt in (FP32, BF16, FP16, E5M2, E5M6):
        assert fmt.ulp_error(np.inf, np.inf) == 0
        assert fmt.ulp_error(-np.inf, np.inf) == np.inf
        assert fmt.ulp_error(fmt.max_finite, np.inf) == np.inf
        assert fmt.ulp_error(np.inf, 1.0) == np.inf
    for fmt in ALL:
        assert fmt.ulp_error(np.nan, np.nan) == 0
        assert fmt.ulp_error(np.nan, 1.0) == np.inf
        assert fmt.ulp_error(1.0, np.nan) == np.inf
    assert E2M1.ulp_error(6.0, np.nan) == np.inf
    err = FP16.ulp_error(np.array([1.0, np.nan, np.inf]), np.array([[1.0], [np.nan]]))
    assert err.tolist() == [[0.0, np.inf, np.inf], [np.inf, 0.0, np.inf]]


# -- ordinal and code distance ---------------------------------------------------


@pytest.mark.parametrize("fmt", SMALL, ids=ids(SMALL))
def test_ordinal_counts_values_on_the_real_line(fmt):
    """Ordinal differences equal rank differences among the distinct values."""
    codes = fmt.all_codes()
    values = fmt.decode(codes)
    nan = np.isnan(values)
    distinct = np.unique(values[~nan])  # -0 and +0 are one value
    rank = np.searchsorted(distinct, values[~nan])
    ordinal = fmt.ordinal(codes)
    assert (ordinal[nan] == F.NAN_ORDINAL).all()
    offset = ordinal[~nan] - rank
    assert (offset == offset[0]).all()
    if fmt.signed:
        assert fmt.ordinal(fmt.encode([0.0, -0.0])).tolist() == [0, 0]
    else:
        assert fmt.ordinal(0).tolist() == 1  # 2^-127 is the first positive value


def test_ordinal_of_infinity_is_one_past_max():
    for fmt in (FP32, BF16, FP16, E5M2, E5M6):
        inf = fmt.ordinal(fmt.encode([np.inf, -np.inf]))
        top = fmt.ordinal(fmt.encode([fmt.max_finite, -fmt.max_finite]))
        assert (inf - top).tolist() == [1, -1]


@pytest.mark.parametrize("fmt", [E4M3, E5M2, E2M1, UE8M0], ids=ids([E4M3, E5M2, E2M1, UE8M0]))
def test_code_distance_all_pairs(fmt):
    codes = fmt.all_codes()
    a, b = np.meshgrid(codes, codes, indexing="ij")
    d = fmt.code_distance(a, b)
    np.testing.assert_array_equal(d, d.T)  # symmetric
    va, vb = fmt.decode(a), fmt.decode(b)
    nan_a, nan_b = np.isnan(va), np.isnan(vb)
    np.testing.assert_array_equal(d[nan_a & nan_b], 0)
    np.testing.assert_array_equal(d[nan_a ^ nan_b], F.NAN_DISTANCE)
    # Elsewhere: the number of distinct values strictly between, plus one.
    distinct = np.unique(va[~nan_a])
    ok = ~(nan_a | nan_b)
    lo, hi = np.minimum(va[ok], vb[ok]), np.maximum(va[ok], vb[ok])
    between = np.searchsorted(distinct, hi, side="left") - np.searchsorted(distinct, lo, side="right")
    np.testing.assert_array_equal(d[ok], np.where(lo == hi, 0, between + 1))


def test_code_distance_examples():
    assert E4M3.code_distance(0x00, 0x80) == 0  # +0, -0
    assert E4M3.code_distance(0x01, 0x81) == 2  # +-min subnormal
    assert E4M3.code_distance(0x38, 0x39) == 1
    assert E4M3.code_distance(0x7F, 0xFF) == 0  # both NaN
    assert E4M3.code_distance(0x7F, 0x00) == F.NAN_DISTANCE
    assert FP16.code_distance(0x7C00, 0x7BFF) == 1  # inf, max
    assert FP32.code_distance(0x3F800000, 0xBF800000) == 2 * 0x3F800000
    assert FP32.code_distance(0x7FC00000, 0x7F800001) == 0
    assert E5M6.code_distance(np.array([1, 2, 3], np.uint16), 0).tolist() == [1, 2, 3]


# -- packing ---------------------------------------------------------------------


def test_pack_e2m1_nibble_order():
    packed = F.pack_e2m1(np.array([[0x1, 0x2, 0xF, 0x8]], np.uint8))
    assert packed.dtype == np.int8 and packed.tolist() == [[0x21, 0x8F - 256]]
    assert F.unpack_e2m1(packed).tolist() == [[0x1, 0x2, 0xF, 0x8]]


def test_pack_e5m6_hand_worked_example():
    h = np.array([0x123, 0x456, 0x789, 0xABC, 0xDEF, 0x012, 0x345, 0x678], np.uint16)
    # By hand from the contract's formulas (docs/contract/README.md; uint32 arithmetic):
    # w0 = 0x123<<20 | 0x456<<8 | 0x789>>4          = 0x12300000|0x45600|0x78  = 0x12345678
    # w1 = 0x789<<28 | 0xABC<<16 | 0xDEF<<4 | 0x012>>8 = 0x90000000|0xABC0000|0xDEF0|0 = 0x9ABCDEF0
    # w2 = 0x012<<24 | 0x345<<12 | 0x678            = 0x12000000|0x345000|0x678 = 0x12345678
    # each word little-endian in memory:
    want = [0x78, 0x56, 0x34, 0x12, 0xF0, 0xDE, 0xBC, 0x9A, 0x78, 0x56, 0x34, 0x12]
    packed = F.pack_e5m6(h)
    assert packed.dtype == np.uint8 and packed.tolist() == want
    np.testing.assert_array_equal(F.unpack_e5m6(packed), h)


def test_pack_ue8m0_byte_order():
    packed = F.pack_ue8m0(np.array([0x01, 0x02, 0x03, 0x80], np.uint8))
    assert packed.dtype == np.int32 and packed.tolist() == [0x80030201 - 2**32]
    assert F.unpack_ue8m0(packed).tolist() == [0x01, 0x02, 0x03, 0x80]


@pytest.mark.parametrize(
    "pack, unpack, bits, group, packed_per_group",
    [
        (F.pack_e2m1, F.unpack_e2m1, 4, 2, 1),
        (F.pack_e5m6, F.unpack_e5m6, 12, 8, 12),
        (F.pack_ue8m0, F.unpack_ue8m0, 8, 4, 1),
    ],
    ids=["e2m1", "e5m6", "ue8m0"],
)
def test_packing_round_trips(pack, unpack, bits, group, packed_per_group):
    rng = np.random.default_rng(RNG_SEED + 8)
    dtype = np.uint8 if bits <= 8 else np.uint16
    for shape in [(group,), (3, 5 * group), (2, 0, 4 * group), (2, 3, 0)]:
        codes = rng.integers(0, 2**bits, shape, dtype=dtype)
        packed = pack(codes)
        assert packed.shape == (*shape[:-1], shape[-1] // group * packed_per_group)
        back = unpack(packed)
        assert back.dtype == dtype
        np.testing.assert_array_equal(back, codes)
    # torch in, torch out
    codes = torch.from_numpy(rng.integers(0, 2**bits, (4, 2 * group), dtype=dtype))
    packed = pack(codes)
    assert isinstance(packed, torch.Tensor)
    np.testing.assert_array_equal(unpack(packed).numpy(), codes.numpy())
    with pytest.raises(ValueError, match="multiple"):
        pack(np.zeros((2, group + 1), dtype))
    if bits < 8 * np.dtype(dtype).itemsize:
        with pytest.raises(ValueError, match="bit codes"):
            pack(np.full((group,), 2**bits, dtype))


def test_unpack_rejects_bad_lengths():
    with pytest.raises(ValueError, match="multiple"):
        F.unpack_e5m6(np.zeros(10, np.uint8))


# -- torch bridge ----------------------------------------------------------------


TORCH_NATIVE = [
    (torch.float32, FP32), (torch.bfloat16, BF16), (torch.float16, FP16),
    (torch.float8_e4m3fn, E4M3), (torch.float8_e5m2, E5M2),
]


@pytest.mark.parametrize("dtype, fmt", TORCH_NATIVE, ids=ids([f for _, f in TORCH_NATIVE]))
def test_torch_bridge(dtype, fmt):
    assert F.of_dtype(dtype) is fmt
    values = np.array([0.0, -0.0, 1.0, -1.5, fmt.max_finite, -fmt.min_subnormal, 3.0])
    t = torch.tensor(values, dtype=torch.float64).to(dtype).reshape(7, 1)
    codes = F.codes_of(t)
    assert codes.dtype == fmt.code_dtype and codes.shape == (7, 1)
    np.testing.assert_array_equal(codes[:, 0], fmt.encode(values))
    back = F.to_tensor(codes, fmt)
    assert back.dtype == dtype and torch.equal(back.view(-1), t.view(-1))
    assert F.to_tensor(codes, fmt.name).dtype == dtype


def test_torch_bridge_rejects_other_dtypes():
    with pytest.raises(ValueError):
        F.of_dtype(torch.int32)
    with pytest.raises(ValueError):
        F.to_tensor(np.zeros(2, np.uint8), E2M1)
