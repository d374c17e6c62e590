"""The float64 encoder in torch: correctly rounded codes of float64 values, on any device.

`tkverify.formats` encodes with NumPy on the host; the exhaustive sweeps (`tkverify sweep`)
judge 2^32 quotients and cannot copy them to the host, so this module computes the same
codes with torch float64 operations on the tensor's own device (a GPU on the sweep's
machine, the CPU in the tests).  It is written from the format definitions of
docs/contract/README.md ("Number formats", "Encoding: rounding from float64"): a value is
rounded to the nearest code, ties to the even code, in every binade including subnormals;
saturating formats (e4m3, e2m1, e5m6) turn finite overflow into +-largest and an infinity
into +-largest where the format has none; IEEE formats (fp32, bf16, fp16) round past the
largest value to +-inf; NaN gives the format's quiet NaN with the input's sign.  e2m1 has
no NaN: `encode` writes code 0 there, as the quantisation oracle does, and the callers treat
those codes as unconstrained (docs/contract/quant.md).  A format is described by its
`tkverify.formats.Format` (exponent and mantissa bits, bias, specials); formats without
subnormals or without a sign (ue8m0) are not handled here.

Why float64 is exact here.  Every fp32, bf16, fp16 and element-format value is a float64, so
the inputs are held exactly.  The rounding itself uses only operations that are exact on
these values: `torch.frexp` (the binary exponent), a multiplication by a power of two (built
from its bits, `pow2`) that brings the value's binade to [2^mbits, 2^(mbits+1)) (exact: a
power-of-two scaling of a value between 2^-400 and 2^400 stays inside float64's normal range),
and `torch.round`, which rounds half to even, on a value below 2^25, where float64 holds every
half-integer exactly.  The integer it returns is the code's position in its binade, so the
code is correctly rounded.  The sweeps' quotients x / sf are float64 divisions; the docstring
of `tkverify.sweep.domains` says why they round as the exact quotients do for its inputs.
"""

from __future__ import annotations

import torch

from tkverify import formats
from tkverify.formats import Format

E2M1_NAN_CODE = 0  # the code the quantisation oracle writes for a NaN quotient in e2m1 (no NaN there)


def pow2(k: torch.Tensor) -> torch.Tensor:
    """2.0^k (float64) for integer k in float64's normal range, built from its bits: exact on every
    device (a pow() of the device's math library need not be)."""
    return ((k.to(torch.int64) + 1023) << 52).view(torch.float64)


def _format(fmt: Format | str) -> Format:
    f = formats.get(fmt) if isinstance(fmt, str) else fmt
    if not (f.signed and f.subnormals):
        raise ValueError(f"references.encode handles signed formats with subnormals, not {f.name}")
    return f


def _magnitudes(f: Format) -> tuple[int, int, int | None]:
    """(largest finite magnitude code, infinity's magnitude code or None, NaN's magnitude code or None)."""
    all_ones = (1 << (f.ebits + f.mbits)) - 1
    if f.specials == formats.IEEE:
        inf = ((1 << f.ebits) - 1) << f.mbits
        return inf - 1, inf, inf | (1 << (f.mbits - 1))
    if f.specials == formats.ALL_ONES_NAN:
        return all_ones - 1, None, all_ones
    return all_ones, None, None


def encode(values: torch.Tensor, fmt: Format | str, saturate: bool | None = None) -> torch.Tensor:
    """int64 codes of float64 `values` in `fmt`, correctly rounded (RNE), on the values' device.

    ``saturate`` None takes the format's default (`Format.saturates`).  See the module
    docstring for overflow, infinities and NaN.
    """
    f = _format(fmt)
    saturate = f.saturates if saturate is None else saturate
    max_mag, inf_mag, nan_mag = _magnitudes(f)
    v = values.to(torch.float64)
    a = v.abs()
    finite = torch.isfinite(v)
    a = torch.where(finite, a, torch.zeros_like(a))
    _, exponent = torch.frexp(a)  # a = m 2^exponent with m in [0.5, 1): floor(log2 a) = exponent - 1
    e = torch.where(a == 0, f.emin, torch.clamp_min(exponent.to(torch.int64) - 1, f.emin))
    scaled = a * pow2(f.mbits - e)
    mag = ((e - f.emin) << f.mbits) + torch.round(scaled).to(torch.int64)
    if saturate or inf_mag is None:
        overflow_mag = max_mag if saturate else nan_mag
        mag = torch.where(mag > max_mag, overflow_mag, mag)
    else:
        mag = torch.clamp_max(mag, inf_mag)  # the rounding already carries max + ulp/2 into the infinity code
    infinite_mag = inf_mag if inf_mag is not None else (max_mag if saturate else nan_mag)
    mag = torch.where(torch.isinf(v), infinite_mag, mag)
    mag = torch.where(torch.isnan(v), E2M1_NAN_CODE if nan_mag is None else nan_mag, mag)
    sign = torch.signbit(v).to(torch.int64) << (f.bits - 1)
    if nan_mag is None:
        sign = torch.where(torch.isnan(v), 0, sign)
    return mag | sign


def decode(codes: torch.Tensor, fmt: Format | str) -> torch.Tensor:
    """float64 values of integer `codes` in `fmt`, exactly, on the codes' device."""
    f = _format(fmt)
    max_mag, inf_mag, nan_mag = _magnitudes(f)
    c = codes.to(torch.int64)
    mag = c & ((1 << (f.ebits + f.mbits)) - 1)
    field = mag >> f.mbits
    mantissa = mag & ((1 << f.mbits) - 1)
    significand = torch.where(field == 0, mantissa, mantissa + (1 << f.mbits)).to(torch.float64)
    exponent = torch.where(field == 0, 1, field) - f.bias - f.mbits
    value = significand * pow2(exponent)
    if inf_mag is not None:
        value = torch.where(mag == inf_mag, torch.inf, value)
    if nan_mag is not None:
        nan = mag > inf_mag if inf_mag is not None else mag == nan_mag
        value = torch.where(nan, torch.nan, value)
    return torch.where((c >> (f.bits - 1)) & 1 == 1, -value, value)


def is_nan_code(codes: torch.Tensor, fmt: Format | str) -> torch.Tensor:
    return torch.isnan(decode(codes, fmt))


def ordinal(codes: torch.Tensor, fmt: Format | str) -> torch.Tensor:
    """Position of each code on the real line (both zeros 0, -k for the k-th negative value);
    NaN codes are left to the caller (`code_distance`)."""
    f = _format(fmt)
    c = codes.to(torch.int64)
    mag = c & ((1 << (f.ebits + f.mbits)) - 1)
    return torch.where((c >> (f.bits - 1)) & 1 == 1, -mag, mag)


def code_distance(a: torch.Tensor, b: torch.Tensor, fmt: Format | str) -> torch.Tensor:
    """Representable values strictly between two codes, plus one (0: the same value); two NaNs
    are 0 apart, a NaN and a number `formats.NAN_DISTANCE` (as `Format.code_distance`)."""
    nan_a, nan_b = is_nan_code(a, fmt), is_nan_code(b, fmt)
    d = (ordinal(a, fmt) - ordinal(b, fmt)).abs()
    d = torch.where(nan_a | nan_b, formats.NAN_DISTANCE, d)
    return torch.where(nan_a & nan_b, 0, d)


def ulp(values: torch.Tensor, fmt: Format | str) -> torch.Tensor:
    """glibc's ULP of float64 `values` in `fmt`: 2^(max(floor(log2|v|), emin) - mbits); the ULP of the
    largest value for infinities, NaN for NaN (as `Format.ulp`)."""
    f = _format(fmt)
    a = values.abs()
    ordinary = torch.isfinite(a) & (a > 0)
    _, exponent = torch.frexp(torch.where(ordinary, a, torch.ones_like(a)))
    e = torch.where(ordinary, torch.clamp_min(exponent.to(torch.int64) - 1, f.emin), f.emin)
    e = torch.where(torch.isinf(a), f.emax, e)
    out = pow2(e - f.mbits)
    return torch.where(torch.isnan(values), torch.nan, out)


def ulp_error(actual: torch.Tensor, exact: torch.Tensor, fmt: Format | str) -> torch.Tensor:
    """|actual - exact'| / ulp(exact') with exact' where correct rounding can reach (saturating formats
    clamp a finite overflow, and an infinity the format lacks, to +-largest; IEEE formats take a value
    past the overflow threshold as +-inf); equal infinities and two NaNs 0, one NaN inf (as
    `Format.ulp_error`)."""
    f = _format(fmt)
    x = exact.to(torch.float64)
    if f.saturates:
        clamp = (x.abs() > f.max_finite) & (torch.isfinite(x) | (not f.has_inf))
        x = torch.where(clamp, torch.copysign(torch.full_like(x, f.max_finite), x), x)
    else:
        threshold = f.overflow_threshold
        x = torch.where(x.abs() >= threshold, torch.copysign(torch.full_like(x, torch.inf), x), x)
    y = actual.to(torch.float64)
    err = (y - x).abs() / ulp(x, f)
    same = (torch.isinf(x) & (y == x)) | (torch.isnan(x) & torch.isnan(y))
    err = torch.where(same, 0.0, err)
    return torch.where(torch.isnan(x) ^ torch.isnan(y), torch.inf, err)


# -- the storage of the element formats (docs/contract/README.md, "Storage of the packed formats") --


def storage_codes(data: torch.Tensor, fmt: str) -> torch.Tensor:
    """int64 element codes (T, H) held by a quantised data tensor, on its device: e4m3 float8 bytes,
    e2m1 two codes a byte (the first in the low nibble), e5m6 eight codes in three little-endian
    uint32 words."""
    rows = data.shape[0]
    if fmt == "e4m3":
        return data.view(torch.uint8).to(torch.int64)
    raw = data.contiguous().view(torch.uint8).to(torch.int64)
    if fmt == "e2m1":
        return torch.stack([raw & 0xF, raw >> 4], dim=-1).reshape(rows, 2 * raw.shape[1])
    if fmt != "e5m6":
        raise ValueError(f"no storage known for {fmt!r}")
    b = raw.reshape(rows, raw.shape[1] // 12, 3, 4)
    w = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)
    w0, w1, w2 = w[..., 0], w[..., 1], w[..., 2]
    h = [w0 >> 20, (w0 >> 8) & 0xFFF, ((w0 & 0xFF) << 4) | (w1 >> 28), (w1 >> 16) & 0xFFF,
         (w1 >> 4) & 0xFFF, ((w1 & 0xF) << 8) | (w2 >> 24), (w2 >> 12) & 0xFFF, w2 & 0xFFF]
    return torch.stack(h, dim=-1).reshape(rows, 8 * raw.shape[1] // 12)


def storage_of_codes(codes: torch.Tensor, fmt: str) -> torch.Tensor:
    """The data tensor (the format's storage) holding int64 element codes (T, H): inverse of storage_codes."""
    rows, cols = codes.shape
    c = codes.to(torch.int64)
    if fmt == "e4m3":
        return c.to(torch.uint8).view(torch.float8_e4m3fn)
    if fmt == "e2m1":
        pairs = c.reshape(rows, cols // 2, 2)
        return (pairs[..., 0] | (pairs[..., 1] << 4)).to(torch.uint8).view(torch.int8)
    h = [c.reshape(rows, cols // 8, 8)[..., i] for i in range(8)]
    mask = 0xFFFFFFFF
    w0 = ((h[0] << 20) | (h[1] << 8) | (h[2] >> 4)) & mask
    w1 = ((h[2] << 28) | (h[3] << 16) | (h[4] << 4) | (h[5] >> 8)) & mask
    w2 = ((h[5] << 24) | (h[6] << 12) | h[7]) & mask
    words = torch.stack([w0, w1, w2], dim=-1)
    return torch.stack([(words >> (8 * i)) & 0xFF for i in range(4)], dim=-1).reshape(rows, 3 * cols // 2) \
        .to(torch.uint8)
