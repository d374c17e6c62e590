"""Exact number formats: encode, decode, ULPs and code distances.

Every format here is a sign-magnitude (or unsigned) binary floating-point
format described by a handful of parameters: exponent bits, mantissa bits,
bias, whether exponent field 0 holds subnormals, and which codes are special.
One piece of code serves all of them:

* ``decode`` turns codes into float64 values, exactly (every value of every
  format here is a float64).
* ``encode`` rounds float64 values to the nearest code, ties to the even code,
  exactly, in every range including subnormals.  It never goes through an
  intermediate format, so there is no double rounding.
* ``ulp``, ``ulp_error``, ``ordinal`` and ``code_distance`` are the measures the
  report uses (docs/contract/README.md, "ULPs and code distance").

The formats (docs/contract/README.md, "Number formats"): fp32, bf16, fp16, e4m3
(float8_e4m3fn), e5m2, e2m1 (fp4), e5m6 (the top 12 bits of an fp16) and ue8m0
(a bare exponent).

Edge semantics of ``encode`` (``saturate=None`` means the format's default,
``Format.saturates``):

* Round to nearest; a tie goes to the code whose integer is even.  For formats
  with mantissa bits that is IEEE's "even last significand digit"; for ue8m0,
  which has none, it is the natural extension (ml_dtypes' float8_e8m0fnu
  differs there: it rounds those ties up).
* ``saturate=True`` (satfinite): a finite input never becomes infinite or NaN;
  finite overflow gives +-max_finite.  An infinite input stays infinite where
  the format has infinities (fp32, bf16, fp16, e5m2, e5m6) and becomes
  +-max_finite where it has none (e4m3: +-448, e2m1: +-6, ue8m0: 2^127).
* ``saturate=False`` (IEEE): overflow rounds to +-inf by round-to-nearest-even;
  on a format without infinities it gives NaN (the OCP "non-saturating" mode
  of e4m3, as ml_dtypes does); e2m1 has neither, so it refuses.
* NaN gives the format's NaN code, with the input's sign for signed formats:
  the quiet NaN with only the top mantissa bit set for IEEE-like formats
  (0x7FC00000, 0x7FC0, 0x7E00, 0x7E, 0x7E0), S.1111.111 for e4m3, 0xFF for
  ue8m0.  e2m1 has no NaN: encoding one raises ValueError.
* ue8m0 is unsigned and has no zero: a negative input raises ValueError; zero
  and anything below 2^-127 give code 0 (2^-127, the nearest value).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

# ordinal() of a NaN code: not a position on the real line, only a marker.
NAN_ORDINAL = np.iinfo(np.int64).min
# code_distance() between a NaN and a non-NaN code: farther than any two
# values of any format here (fp32 spans fewer than 2^33 codes).
NAN_DISTANCE = 2**62

_SMALLEST_FLOAT64 = float(np.nextafter(0.0, 1.0))  # 2^-1074

# Which codes are special.
IEEE = "ieee"  # exponent field all ones: mantissa 0 is +-inf, others NaN
ALL_ONES_NAN = "all_ones_nan"  # only the all-ones magnitude is NaN (e4m3fn, ue8m0)
NO_SPECIALS = "none"  # every code is a finite value (e2m1)


def _code_dtype(bits: int) -> np.dtype:
    for dtype in (np.uint8, np.uint16, np.uint32):
        if bits <= np.dtype(dtype).itemsize * 8:
            return np.dtype(dtype)
    raise ValueError(f"no code dtype for {bits} bits")


def _binary_exponent(ax: np.ndarray) -> np.ndarray:
    """floor(log2(ax)) for finite ax > 0, exactly (frexp is exact)."""
    return np.frexp(ax)[1].astype(np.int64) - 1


# Formats whose codes, shifted left, are the bits of a float numpy has (fp32,
# bf16 = the top half of an fp32, fp16, e5m6 = the top 12 bits of an fp16):
# (ebits, mbits, bias, specials, subnormals) -> ((uint dtype, float dtype), shift).
_NATIVE_BITS = {
    (8, 23, 127, "ieee", True): ((np.uint32, np.float32), 0),
    (8, 7, 127, "ieee", True): ((np.uint32, np.float32), 16),
    (5, 10, 15, "ieee", True): ((np.uint16, np.float16), 0),
    (5, 6, 15, "ieee", True): ((np.uint16, np.float16), 4),
}


@dataclasses.dataclass(frozen=True)
class Format:
    """A binary floating-point format: sign, ``ebits`` exponent bits, ``mbits``
    mantissa bits, exponent ``bias``.

    ``subnormals``: exponent field 0 encodes subnormals (and zero); False means
    it is an ordinary binade (ue8m0: code 0 is 2^-127, there is no zero).
    ``specials``: IEEE, ALL_ONES_NAN or NO_SPECIALS.
    ``saturates``: the default of ``encode(..., saturate=None)``.
    """

    name: str
    ebits: int
    mbits: int
    bias: int
    signed: bool = True
    subnormals: bool = True
    specials: str = IEEE
    saturates: bool = False

    # Derived in __post_init__.
    bits: int = dataclasses.field(init=False)
    precision: int = dataclasses.field(init=False)
    emin: int = dataclasses.field(init=False)
    emax: int = dataclasses.field(init=False)
    max_finite: float = dataclasses.field(init=False)
    min_subnormal: float = dataclasses.field(init=False)
    has_inf: bool = dataclasses.field(init=False)
    has_nan: bool = dataclasses.field(init=False)
    code_dtype: np.dtype = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        def set_(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        set_("bits", int(self.signed) + self.ebits + self.mbits)
        set_("precision", self.mbits + 1)
        # The exponent of the lowest binade: field 1 with subnormals below it,
        # field 0 without.
        set_("emin", (1 if self.subnormals else 0) - self.bias)
        set_("has_inf", self.specials == IEEE)
        set_("has_nan", self.specials != NO_SPECIALS)
        set_("code_dtype", _code_dtype(self.bits))
        set_("emax", (self._max_mag >> self.mbits) - self.bias)
        set_("max_finite", float(self._decode_magnitude(np.array([self._max_mag]))[0]))
        lowest = self.emin - self.mbits if self.subnormals else self.emin
        set_("min_subnormal", float(np.ldexp(1.0, lowest)))

    # -- code layout -------------------------------------------------------

    @property
    def _mag_mask(self) -> int:
        return (1 << (self.ebits + self.mbits)) - 1

    @property
    def _sign_bit(self) -> int:
        return 1 << (self.bits - 1) if self.signed else 0

    @property
    def _inf_mag(self) -> int:
        """Magnitude code of infinity (IEEE formats): exponent all ones, mantissa 0."""
        return ((1 << self.ebits) - 1) << self.mbits

    @property
    def _max_mag(self) -> int:
        """Magnitude code of the largest finite value."""
        if self.specials == IEEE:
            return self._inf_mag - 1
        if self.specials == ALL_ONES_NAN:
            return self._mag_mask - 1
        return self._mag_mask

    @property
    def _nan_mag(self) -> int:
        """Magnitude code of the NaN that encode produces."""
        if self.specials == IEEE:
            return self._inf_mag | (1 << (self.mbits - 1))
        if self.specials == ALL_ONES_NAN:
            return self._mag_mask
        raise ValueError(f"{self.name} has no NaN")

    def _check_codes(self, codes: Any) -> np.ndarray:
        """Codes as int64, refusing anything that is not a code of this format."""
        c = np.asarray(codes)
        if c.dtype.kind not in "ui":
            raise ValueError(f"{self.name} codes must be integers, got dtype {c.dtype}")
        c = c.astype(np.int64)
        if c.size and (c.min() < 0 or c.max() >= 1 << self.bits):
            raise ValueError(
                f"{self.name} codes must lie in [0, 2^{self.bits}); got values in "
                f"[{c.min()}, {c.max()}]"
            )
        return c

    def _split(self, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(negative?, magnitude code) of int64 codes."""
        negative = (c & self._sign_bit) != 0 if self.signed else np.zeros(c.shape, bool)
        return negative, c & self._mag_mask

    def _mag_is_nan(self, mag: np.ndarray) -> np.ndarray:
        if self.specials == IEEE:
            return mag > self._inf_mag
        if self.specials == ALL_ONES_NAN:
            return mag == self._mag_mask
        return np.zeros(mag.shape, bool)

    # -- decode ------------------------------------------------------------

    def _decode_magnitude(self, mag: np.ndarray) -> np.ndarray:
        """Value of finite magnitude codes: significand * 2^exponent, exact."""
        field = mag >> self.mbits
        mantissa = mag & ((1 << self.mbits) - 1)
        implicit = 1 << self.mbits
        if self.subnormals:
            significand = np.where(field == 0, mantissa, mantissa + implicit)
            exponent = np.where(field == 0, 1, field) - self.bias - self.mbits
        else:
            significand = mantissa + implicit
            exponent = field - self.bias - self.mbits
        return np.ldexp(significand.astype(np.float64), exponent.astype(np.int32))

    def decode(self, codes: Any) -> np.ndarray:
        """float64 values of ``codes`` (any integer array), exactly."""
        c = self._check_codes(codes)
        native = _NATIVE_BITS.get((self.ebits, self.mbits, self.bias, self.specials, self.subnormals))
        if native is not None:  # the bits are an IEEE float numpy has: reinterpret (a judge's hot path)
            view, shift = native
            with np.errstate(invalid="ignore"):  # signalling NaN bit patterns stay NaN
                return (c.astype(np.uint32) << shift).astype(view[0]).view(view[1]).astype(np.float64)
        negative, mag = self._split(c)
        value = self._decode_magnitude(np.minimum(mag, self._max_mag))
        if self.has_inf:
            value = np.where(mag == self._inf_mag, np.inf, value)
        value = np.where(self._mag_is_nan(mag), np.nan, value)
        return np.where(negative, -value, value)

    def is_nan(self, codes: Any) -> np.ndarray:
        return self._mag_is_nan(self._split(self._check_codes(codes))[1])

    def all_codes(self) -> np.ndarray:
        """Every code, NaN codes included (formats of at most 16 bits)."""
        if self.bits > 16:
            raise ValueError(f"{self.name} has 2^{self.bits} codes; all_codes is for <= 16 bits")
        return np.arange(1 << self.bits, dtype=self.code_dtype)

    # -- encode ------------------------------------------------------------

    def _round_magnitude(self, ax: np.ndarray) -> np.ndarray:
        """Magnitude code nearest to finite ax >= 0, ties to the even code,
        with an unbounded exponent range above (may exceed the largest code).

        Within a binade of exponent e the codes are evenly spaced by
        2^(e - mbits), and the code of a value v is an affine function of
        v / 2^(e - mbits); rounding that quotient to an integer is rounding to
        the nearest code.  The quotient is exact (a power-of-two scaling whose
        result lies in [0, 2^(mbits+1))), so the rounding is exact.
        """
        # Zero's exponent is taken from the smallest float64, which lands it
        # in the lowest binade like every subnormal.
        e = np.maximum(_binary_exponent(np.maximum(ax, _SMALLEST_FLOAT64)), self.emin)
        scaled = np.ldexp(ax, (self.mbits - e).astype(np.int32))
        whole = np.floor(scaled)
        fraction = scaled - whole
        # code = ((e - emin) << mbits) + scaled, less the implicit bit when
        # field 0 is a normal binade (then there is no subnormal range).
        offset = 0 if self.subnormals else 1 << self.mbits
        below = ((e - self.emin) << self.mbits) + whole.astype(np.int64) - offset
        up = (fraction > 0.5) | ((fraction == 0.5) & (below % 2 == 1))
        # Without subnormals (and zero), anything under the lowest value
        # rounds to it.
        return np.maximum(below + up, 0)

    def encode(self, x: Any, saturate: bool | None = None) -> np.ndarray:
        """Codes (``code_dtype``, same shape) nearest to float64 ``x``.

        See the module docstring for ties, overflow, infinities and NaN.
        """
        saturate = self.saturates if saturate is None else bool(saturate)
        if not (saturate or self.has_inf or self.has_nan):
            raise ValueError(f"{self.name} has neither inf nor NaN: it can only be encoded saturating")
        x = np.asarray(x, dtype=np.float64)
        nan = np.isnan(x)
        if nan.any() and not self.has_nan:
            raise ValueError(f"{self.name} has no NaN: cannot encode NaN input")
        if not self.signed and (x < 0).any():
            raise ValueError(f"{self.name} is unsigned: cannot encode negative input")
        ax = np.abs(x)
        finite = np.isfinite(x)
        mag = self._round_magnitude(np.where(finite, ax, 0.0))
        mag = np.where(finite, self._limit_overflow(mag, saturate), self._infinite_mag(saturate))
        if self.has_nan:
            mag = np.where(nan, self._nan_mag, mag)
        if self.signed:
            mag |= np.signbit(x).astype(np.int64) << (self.bits - 1)
        return mag.astype(self.code_dtype)

    def _limit_overflow(self, mag: np.ndarray, saturate: bool) -> np.ndarray:
        """Rounded magnitudes past the largest finite code, per the overflow rule."""
        if saturate:
            return np.minimum(mag, self._max_mag)
        if self.has_inf:
            # The rounding already carried max + ulp/2 (and beyond) into the
            # infinity code, exactly as IEEE's overflow threshold says.
            return np.minimum(mag, self._inf_mag)
        return np.where(mag > self._max_mag, self._nan_mag, mag)

    def _infinite_mag(self, saturate: bool) -> int:
        """Magnitude code for an infinite input."""
        if self.has_inf:
            return self._inf_mag
        return self._max_mag if saturate else self._nan_mag

    # -- measures ------------------------------------------------------------

    @property
    def overflow_threshold(self) -> float:
        """max_finite + half its ULP: where rounding to nearest leaves the finite range (at the
        threshold itself the tie goes to the even code, past max_finite for IEEE formats)."""
        return float(self.max_finite + self.ulp(self.max_finite) / 2)

    def ulp(self, x: Any) -> np.ndarray:
        """glibc's ULP of float64 ``x`` in this format: 2^(max(e(x), emin) - p + 1).

        0 and subnormals get the subnormal spacing; +-inf the ULP of max_finite;
        NaN gives NaN.  For ue8m0 (p = 1) this is 2^e(x): the gap from 2^e(x)
        to the next power of two.
        """
        x = np.asarray(x, dtype=np.float64)
        ax = np.abs(x)
        finite_nonzero = np.isfinite(ax) & (ax > 0)
        e = _binary_exponent(np.where(finite_nonzero, ax, 1.0))
        e = np.where(finite_nonzero, np.maximum(e, self.emin), self.emin)
        e = np.where(np.isinf(ax), self.emax, e)
        out = np.ldexp(1.0, (e - self.mbits).astype(np.int32))
        return np.where(np.isnan(x), np.nan, out)

    def _rounding_target(self, x: np.ndarray, saturate: bool) -> np.ndarray:
        """The exact value x, moved to where correct rounding can reach.

        Saturating: finite |x| beyond max_finite is clamped (satfinite makes
        +-max the correctly rounded answer), and so is an infinite x where the
        format has no infinity.  Non-saturating: |x| that rounds past
        max_finite becomes +-inf (NaN where the format has no inf).  ue8m0
        has no zero: non-negative x below its lowest value is raised to it.
        """
        ax = np.abs(x)
        if saturate:
            clamp = (ax > self.max_finite) & (np.isfinite(ax) | (not self.has_inf))
            x = np.where(clamp, np.copysign(self.max_finite, x), x)
        else:
            threshold = self.overflow_threshold
            # At the threshold itself the tie goes to the even code: past
            # max_finite iff max_finite's code is odd (it is for IEEE formats).
            overflow = (ax > threshold) | ((ax == threshold) & (self._max_mag % 2 == 1))
            beyond = np.copysign(np.inf, x) if self.has_inf else np.nan
            x = np.where(overflow, beyond, x)
        if not self.subnormals:
            x = np.where((x >= 0) & (x < self.min_subnormal), self.min_subnormal, x)
        return x

    def ulp_error(self, y: Any, x: Any, saturate: bool | None = None) -> np.ndarray:
        """|y - x| / ulp(x): actual values y (decoded) against exact values x.

        x first goes where correct rounding can reach (``_rounding_target``).
        Then: both infinite with the same sign -> 0; both NaN -> 0; exactly one
        NaN, or infinities that differ -> +inf.
        """
        saturate = self.saturates if saturate is None else bool(saturate)
        y = np.asarray(y, dtype=np.float64)
        x = self._rounding_target(np.asarray(x, dtype=np.float64), saturate)
        y, x = np.broadcast_arrays(y, x)
        with np.errstate(invalid="ignore"):
            err = np.abs(y - x) / self.ulp(x)
        same_inf = np.isinf(x) & (y == x)
        both_nan = np.isnan(x) & np.isnan(y)
        one_nan = np.isnan(x) ^ np.isnan(y)
        err = np.where(same_inf | both_nan, 0.0, err)
        return np.where(one_nan, np.inf, err)

    def ordinal(self, codes: Any) -> np.ndarray:
        """Position of each code on the real line (int64).

        +k for the k-th positive value, -k for the k-th negative one, 0 for
        both zeros; +-inf is one past +-max_finite.  ue8m0 has no zero, so its
        code c is the (c+1)-th positive value.  NaN codes give NAN_ORDINAL.
        """
        negative, mag = self._split(self._check_codes(codes))
        position = mag if self.subnormals else mag + 1
        position = np.where(negative, -position, position)
        return np.where(self._mag_is_nan(mag), NAN_ORDINAL, position)

    def code_distance(self, a: Any, b: Any) -> np.ndarray:
        """|ordinal(a) - ordinal(b)|: representable values strictly between two
        codes, plus one (0 = the same value; +0 and -0 are the same value).
        Two NaNs are 0 apart; a NaN and a non-NaN NAN_DISTANCE apart."""
        oa, ob = np.broadcast_arrays(self.ordinal(a), self.ordinal(b))
        nan_a, nan_b = oa == NAN_ORDINAL, ob == NAN_ORDINAL
        d = np.abs(np.where(nan_a, 0, oa) - np.where(nan_b, 0, ob))
        d = np.where(nan_a | nan_b, NAN_DISTANCE, d)
        return np.where(nan_a & nan_b, 0, d)


FP32 = Format("fp32", ebits=8, mbits=23, bias=127)
BF16 = Format("bf16", ebits=8, mbits=7, bias=127)
FP16 = Format("fp16", ebits=5, mbits=10, bias=15)
E4M3 = Format("e4m3", ebits=4, mbits=3, bias=7, specials=ALL_ONES_NAN, saturates=True)
E5M2 = Format("e5m2", ebits=5, mbits=2, bias=15)
E2M1 = Format("e2m1", ebits=2, mbits=1, bias=1, specials=NO_SPECIALS, saturates=True)
E5M6 = Format("e5m6", ebits=5, mbits=6, bias=15, saturates=True)
UE8M0 = Format(
    "ue8m0", ebits=8, mbits=0, bias=127, signed=False, subnormals=False,
    specials=ALL_ONES_NAN, saturates=True,
)

FORMATS: dict[str, Format] = {
    f.name: f for f in (FP32, BF16, FP16, E4M3, E5M2, E2M1, E5M6, UE8M0)
}


def get(name: str) -> Format:
    try:
        return FORMATS[name]
    except KeyError:
        raise KeyError(f"unknown format {name!r}; known: {', '.join(FORMATS)}") from None


# -- torch bridge (torch is imported only here, lazily) ----------------------

_TORCH_NATIVE = {
    "float32": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "float8_e4m3fn": "e4m3",
    "float8_e5m2": "e5m2",
}


def _torch_dtype_of(fmt: Format):
    import torch

    for dtype_name, name in _TORCH_NATIVE.items():
        if name == fmt.name:
            return getattr(torch, dtype_name)
    raise ValueError(f"{fmt.name} is not a torch dtype; torch-native: {', '.join(_TORCH_NATIVE.values())}")


def _torch_int_of_width(bits: int):
    """The torch integer dtype used to view raw bits of a float of this width."""
    import torch

    return {8: torch.uint8, 16: torch.int16, 32: torch.int32}[bits]


def of_dtype(dtype: Any) -> Format:
    """The Format of a torch floating dtype (float32, bfloat16, float16,
    float8_e4m3fn, float8_e5m2)."""
    import torch

    if isinstance(dtype, torch.dtype):
        name = str(dtype).removeprefix("torch.")
        if name in _TORCH_NATIVE:
            return FORMATS[_TORCH_NATIVE[name]]
    raise ValueError(f"no format for dtype {dtype}; supported: {', '.join(_TORCH_NATIVE)}")


def codes_of(t: Any) -> np.ndarray:
    """Raw codes of a float torch tensor (any device) as a numpy array."""
    import torch

    fmt = of_dtype(t.dtype)
    # clone(contiguous_format), not .contiguous(): an empty transposed tensor
    # keeps strides under .contiguous() that forbid a view of another width.
    raw = t.detach().cpu().clone(memory_format=torch.contiguous_format).view(_torch_int_of_width(fmt.bits))
    return raw.numpy().view(fmt.code_dtype)


def to_tensor(codes: Any, fmt: Format | str, device: Any = None):
    """The torch tensor whose raw codes are ``codes`` (inverse of codes_of)."""
    import torch

    fmt = get(fmt) if isinstance(fmt, str) else fmt
    dtype = _torch_dtype_of(fmt)
    c = fmt._check_codes(codes).astype(fmt.code_dtype)
    carrier = np.dtype(f"i{fmt.bits // 8}") if fmt.bits > 8 else np.dtype(np.uint8)
    t = torch.from_numpy(np.ascontiguousarray(c).view(carrier)).view(dtype)
    return t if device is None else t.to(device)


# -- packed storage (docs/contract/README.md, "Storage of the packed formats") --
# Each function takes numpy arrays or torch tensors and returns the same kind
# (a torch result lands on the input's device).


def _as_numpy(a: Any) -> tuple[np.ndarray, Any]:
    """(numpy array, function that turns a numpy result back into a's kind)."""
    if type(a).__module__.startswith("torch"):
        import torch

        device = a.device
        arr = a.detach().cpu().contiguous().numpy()
        return arr, lambda r: torch.from_numpy(np.ascontiguousarray(r)).to(device)
    return np.asarray(a), lambda r: r


def _grouped(a: np.ndarray, group: int, what: str) -> np.ndarray:
    """a (..., group*n) as (..., n, group), checking divisibility."""
    if a.ndim == 0 or a.shape[-1] % group:
        raise ValueError(f"{what}: last dimension {a.shape[-1:]} is not a multiple of {group}")
    return np.ascontiguousarray(a).reshape(*a.shape[:-1], a.shape[-1] // group, group)


def _check_width(a: np.ndarray, bits: int, what: str) -> np.ndarray:
    if a.dtype.kind not in "ui" or (a.size and (a.min() < 0 or a.max() >= 1 << bits)):
        raise ValueError(f"{what}: expected {bits}-bit codes, got dtype {a.dtype}")
    return a


def pack_e2m1(codes: Any):
    """e2m1 codes uint8 (..., 2n) -> int8 (..., n); the first in the low nibble."""
    a, back = _as_numpy(codes)
    pairs = _grouped(_check_width(a, 4, "pack_e2m1"), 2, "pack_e2m1").astype(np.uint8)
    packed = pairs[..., 0] | (pairs[..., 1] << 4)
    return back(packed.view(np.int8))


def unpack_e2m1(packed: Any):
    """int8 (..., n) -> e2m1 codes uint8 (..., 2n)."""
    a, back = _as_numpy(packed)
    b = np.ascontiguousarray(a).view(np.uint8)
    pairs = np.stack([b & 0xF, b >> 4], axis=-1)
    return back(pairs.reshape(*b.shape[:-1], 2 * b.shape[-1]))


def pack_e5m6(codes: Any):
    """e5m6 codes (..., 8n) -> uint8 (..., 12n): each 8 codes h0..h7 as three
    little-endian uint32 words (docs/contract/README.md)."""
    a, back = _as_numpy(codes)
    h = _grouped(_check_width(a, 12, "pack_e5m6"), 8, "pack_e5m6").astype(np.uint32)
    h = [h[..., i] for i in range(8)]
    # uint32 shifts drop the bits that belong to the neighbouring word.
    w0 = (h[0] << 20) | (h[1] << 8) | (h[2] >> 4)
    w1 = (h[2] << 28) | (h[3] << 16) | (h[4] << 4) | (h[5] >> 8)
    w2 = (h[5] << 24) | (h[6] << 12) | h[7]
    words = np.stack([w0, w1, w2], axis=-1).astype("<u4")  # (..., n, 3)
    return back(words.view(np.uint8).reshape(*words.shape[:-2], 12 * words.shape[-2]))


def unpack_e5m6(packed: Any):
    """uint8 (..., 12n) -> e5m6 codes uint16 (..., 8n)."""
    a, back = _as_numpy(packed)
    b = _grouped(np.ascontiguousarray(a).view(np.uint8), 12, "unpack_e5m6")
    w = b.view("<u4").astype(np.uint32)  # (..., n, 3)
    w0, w1, w2 = w[..., 0], w[..., 1], w[..., 2]
    h = [
        w0 >> 20,
        (w0 >> 8) & 0xFFF,
        ((w0 & 0xFF) << 4) | (w1 >> 28),
        (w1 >> 16) & 0xFFF,
        (w1 >> 4) & 0xFFF,
        ((w1 & 0xF) << 8) | (w2 >> 24),
        (w2 >> 12) & 0xFFF,
        w2 & 0xFFF,
    ]
    codes = np.stack(h, axis=-1).astype(np.uint16)  # (..., n, 8)
    return back(codes.reshape(*codes.shape[:-2], 8 * codes.shape[-2]))


def pack_ue8m0(codes: Any):
    """ue8m0 codes uint8 (..., 4n) -> int32 (..., n); the first in the low byte."""
    a, back = _as_numpy(codes)
    quads = _grouped(_check_width(a, 8, "pack_ue8m0"), 4, "pack_ue8m0").astype(np.uint8)
    return back(quads.view("<i4")[..., 0].astype(np.int32))


def unpack_ue8m0(packed: Any):
    """int32 (..., n) -> ue8m0 codes uint8 (..., 4n)."""
    a, back = _as_numpy(packed)
    if a.ndim == 0 or a.dtype.kind not in "ui" or a.dtype.itemsize != 4:
        raise ValueError(f"unpack_ue8m0: expected an array of 32-bit integers, got {a.dtype} {a.shape}")
    b = np.ascontiguousarray(a.astype("<i4")).view(np.uint8)
    return back(b.reshape(*a.shape[:-1], 4 * a.shape[-1]))
