"""Comparison policies: how one output of an implementation is judged.

* `bitwise()`       same shape, dtype and bytes as the correctly rounded oracle
                    value (NaN payloads aside: every NaN the oracle means is one
                    NaN; ±0 count).
* `ulp(fmt, max)`   per-element ULP error against the exact float64 value.
* `codes(fmt, max)` code distance to the correctly rounded value, for quantised
                    outputs (the expected value is usually computed given the
                    implementation's own scale factor, see `OpSpec.given`).
* `relative(max)`   |actual - exact| / |exact| per element, for reductions whose
                    rounding order makes ULPs meaningless.
* `within(fmt)`     every element inside a `Bracket` [low, high] that the op's
                    spec computed per element (the results a working-precision
                    implementation may legitimately give), with the statistics
                    still measured against the exact value.
* `summation(fmt)`  per element |y - exact| <= the error bound of a sum
                    accumulated in a working precision (an `ErrorBound` the
                    op's spec derives from the sum of |terms|, see
                    `summation_error`) plus one rounding to fmt; holds where
                    terms cancel, ULP statistics still in fmt.

Every policy measures its output element by element into an `Outcome` (ULP
error, code distance and bitwise equality against the exact value, its own
verdict per element, and the share of its bound each element used: 0 exact,
1 at the bound, above 1 failing); `summarise` folds that into the `Comparison`
the report needs (count, exact share, max and mean ULP, a histogram of code
distances, the largest share of the bound used) and,
when it fails, a message from `failure_message`, one format for every policy,
that names the worst element the way `torch.testing` does:

    output 'indices' (int64, bitwise): 1 of 1 elements (100%) fail
      worst at index (0, 0): actual 5, expected 0 (codes 0x5 vs 0x0), ULP error 5

A policy with a range per element adds it at the end of the second line (within:
"; allowed [low, high] there").  An output rejected as a whole (shape, dtype,
layout) fails with `Comparison.rejected`: "output 'NAME': the reason".
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import numpy as np
import torch

from tkverify import formats

# Code-distance histogram buckets: exact counts up to 3, then powers of two.
_HIST_EDGES = (0, 1, 2, 3, 4, 8, 16, 256)


def hist_label(lo: int, hi: int | None) -> str:
    return str(lo) if hi == lo + 1 else (f"{lo}+" if hi is None else f"{lo}-{hi - 1}")


HIST_LABELS = tuple(
    hist_label(lo, hi) for lo, hi in zip(_HIST_EDGES, (*_HIST_EDGES[1:], None))
)


def distance_histogram(distance: np.ndarray) -> dict[str, int]:
    """Counts of code distances in the buckets of HIST_LABELS (empty buckets left out)."""
    d = np.asarray(distance, dtype=np.int64).ravel()
    out = {}
    for label, lo, hi in zip(HIST_LABELS, _HIST_EDGES, (*_HIST_EDGES[1:], None)):
        n = int(np.count_nonzero((d >= lo) & (d < hi) if hi is not None else d >= lo))
        if n:
            out[label] = n
    return out


@dataclasses.dataclass
class Comparison:
    """The verdict on one output of one implementation for one case."""

    output: str
    fmt: str
    policy: str
    count: int
    exact: int
    max_ulp: float
    sum_ulp: float
    hist: dict[str, int]
    passed: bool
    message: str = ""
    worst: dict[str, Any] | None = None
    # Extra figures a policy or op wants in the report (e.g. Sinkhorn's row sums).
    extra: dict[str, float] = dataclasses.field(default_factory=dict)
    # The largest share of its allowed error that an element used (0: exact, 1: at the bound, > 1: failing;
    # inf where a bitwise or zero-tolerance element differs); None where the policy does not measure it.
    bound_used: float | None = None

    @classmethod
    def rejected(cls, output: str, fmt: str, policy: str, reason: str) -> Comparison:
        """A failure of the output as a whole (its shape, dtype or layout), before any element is judged."""
        return cls(output, fmt, policy, 0, 0, math.inf, 0.0, {}, False, message=f"output {output!r}: {reason}")


@dataclasses.dataclass(frozen=True, eq=False)
class Outcome:
    """What a policy measured on one output, element by element; `summarise` folds it into a `Comparison`.

    Every array has the output's shape.  ``ulp_error``, ``distance`` and ``exact`` are measured
    against the exact (or correctly rounded) value whatever the policy is, so that every report row
    has the same statistics; ``passed`` is the policy's own verdict per element.
    """

    output: str             # the output's name
    fmt: str                # the format of its codes (an integer output: its dtype)
    policy: str             # the policy's name, as the report row gives it
    bound: str              # what the policy holds each element to, as the failure message states it
    ulp_error: np.ndarray   # ULP error against the exact value (inf where the bits must match and do not)
    distance: np.ndarray    # code distance to the correctly rounded value
    exact: np.ndarray       # bitwise equal to the correctly rounded value
    passed: np.ndarray      # the policy's verdict
    actual: np.ndarray      # the values, as the message names them
    expected: np.ndarray
    actual_codes: np.ndarray
    expected_codes: np.ndarray
    # What the policy adds about the worst element of a failure (the range it allowed there), from its index.
    detail: Callable[[tuple[int, ...]], str] | None = None
    # Per element, the share of its allowed error used (see Comparison.bound_used): 0 where the element is
    # exact, 1 at the bound; None: not measured.  `summarise` holds it to the verdict (`share_of_verdict`).
    share: np.ndarray | None = None


# The figures a policy with a numeric bound adds to `Comparison.extra`, so that a report row can state its
# bound: the most ULPs (ulp), codes (codes) or relative error (relative) an element may have.
ALLOWED_ULP, ALLOWED_CODES, ALLOWED_RELATIVE = "allowed_ulp", "allowed_codes", "allowed_relative"


def share_of_bound(error: np.ndarray, allowed: Any) -> np.ndarray:
    """error / allowed per element: 0 where the error is 0 (a zero bound included), inf where a positive
    error meets a zero bound, inf where the error is NaN."""
    error = np.asarray(error, dtype=np.float64)
    allowed = np.broadcast_to(np.asarray(allowed, dtype=np.float64), error.shape)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(allowed > 0, error / np.where(allowed > 0, allowed, 1.0), np.inf)
    return np.where(error == 0, 0.0, np.where(np.isnan(share), np.inf, share))


def share_of_verdict(share: np.ndarray, passed: np.ndarray) -> np.ndarray:
    """The share held to the verdict: at most 1 where an element passes, above 1 where it fails.

    A policy measures most elements as a distance against an allowance, and then the two agree; the
    elements it judges by a rule instead (an infinity that an overflowing sum allows, a NaN where a
    NaN must be) have no distance: a passing one counts as at the bound (1), a failing one as inf."""
    share = np.asarray(share, dtype=np.float64)
    at_most_one = np.where(share <= 1, share, 1.0)
    above_one = np.where(share > 1, share, np.inf)
    return np.where(passed, at_most_one, above_one)


def _as_numpy(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _index(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()


def _fmt_value(v: float) -> str:
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if math.isnan(v) or math.isinf(v):
        return str(v)
    return f"{v:.9g}"


def failure_message(output: str, fmt: str, bound: str, failing: int, count: int, worst: dict[str, Any],
                    detail: str = "") -> str:
    """The message of a failed output, the way `torch.testing` words one: how many elements fail, then
    the worst of them with its value, the expected value, both codes and its ULP error."""
    return (f"output {output!r} ({fmt}, {bound}): {failing} of {count} elements ({100.0 * failing / count:.3g}%) "
            f"fail\n  worst at index {tuple(worst['index'])}: actual {worst['actual']}, expected {worst['expected']} "
            f"(codes {worst['actual_code']:#x} vs {worst['expected_code']:#x}), ULP error {_fmt_value(worst['ulp'])}"
            f"{detail}")


def summarise(o: Outcome) -> Comparison:
    """Fold an `Outcome` into a Comparison; name the worst element, and on failure say why."""
    n = int(o.ulp_error.size)
    finite_err = np.where(np.isfinite(o.ulp_error), o.ulp_error, 0.0)
    comp = Comparison(
        output=o.output, fmt=o.fmt, policy=o.policy, count=n, exact=int(np.count_nonzero(o.exact)),
        max_ulp=float(o.ulp_error.max()) if n else 0.0, sum_ulp=float(finite_err.sum()),
        hist=distance_histogram(o.distance), passed=bool(o.passed.all()) if n else True,
        bound_used=None if o.share is None else (float(share_of_verdict(o.share, o.passed).max()) if n else 0.0),
    )
    if not n:
        return comp
    # The worst element: the largest error, the first mismatch among equals.
    bad = ~o.passed.ravel()
    pool = np.flatnonzero(bad) if bad.any() else np.arange(n)
    flat = int(pool[np.argmax(o.ulp_error.ravel()[pool])])
    idx = _index(flat, o.actual_codes.shape)
    comp.worst = {
        "index": list(idx),
        "actual": _fmt_value(o.actual.ravel()[flat]),
        "expected": _fmt_value(o.expected.ravel()[flat]),
        "actual_code": int(o.actual_codes.ravel()[flat]),
        "expected_code": int(o.expected_codes.ravel()[flat]),
        "ulp": float(o.ulp_error.ravel()[flat]),
    }
    if not comp.passed:
        comp.message = failure_message(o.output, o.fmt, o.bound, int(bad.sum()), n, comp.worst,
                                       o.detail(idx) if o.detail is not None else "")
    return comp


def identical(output: str, fmt: formats.Format, codes: np.ndarray) -> Comparison:
    """The bitwise Comparison of an output whose codes all equal the oracle's, without measuring each
    element: what `summarise` gives for that outcome (every distance and error 0, the first element the
    worst), at the cost of one pass over the codes instead of a dozen.  The production shapes (10^9
    elements) pass through here."""
    n = int(codes.size)
    comp = Comparison(output=output, fmt=fmt.name, policy="bitwise", count=n, exact=n, max_ulp=0.0, sum_ulp=0.0,
                      hist={HIST_LABELS[0]: n} if n else {}, passed=True, bound_used=0.0)
    if n:
        first = codes.ravel()[:1]
        value = _fmt_value(fmt.decode(first)[0])
        comp.worst = {"index": [0] * codes.ndim, "actual": value, "expected": value, "actual_code": int(first[0]),
                      "expected_code": int(first[0]), "ulp": 0.0}
    return comp


@dataclasses.dataclass(frozen=True)
class Policy:
    """Base class: `compare(output, actual, expected) -> Comparison`."""

    def compare(self, output: str, actual: Any, expected: Any) -> Comparison:  # pragma: no cover
        raise NotImplementedError

    @property
    def name(self) -> str:
        return type(self).__name__.lower()


def _float_format(fmt: str | formats.Format | None, actual: Any) -> formats.Format:
    if isinstance(fmt, formats.Format):
        return fmt
    if fmt is not None:
        return formats.get(fmt)
    if isinstance(actual, torch.Tensor) and actual.is_floating_point():
        return formats.of_dtype(actual.dtype)
    raise TypeError("the policy needs fmt= for outputs that are not float tensors")


def _shape_mismatch(output: str, actual_shape, expected_shape, policy: str, fmt: str) -> Comparison:
    return Comparison.rejected(output, fmt, policy,
                               f"shape {tuple(actual_shape)} differs from the expected {tuple(expected_shape)}")


def _codes_of(actual: Any, fmt: formats.Format) -> np.ndarray:
    """The codes of an output of `fmt`: a float tensor's bits, or codes given as integers."""
    if isinstance(actual, torch.Tensor) and actual.is_floating_point():
        return formats.codes_of(actual)
    return _as_numpy(actual).astype(fmt.code_dtype)


def _integer_outcome(output: str, actual: np.ndarray, expected: np.ndarray, policy: str, bound: str) -> Outcome:
    """Integers are their own codes: the distance and the "ULP error" are |actual - expected|;
    `passed` is exact equality (a policy with a tolerance replaces it)."""
    a = actual.astype(np.int64)
    e = expected.astype(np.int64)
    dist = np.abs(a - e)
    return Outcome(output, str(actual.dtype), policy, bound, dist.astype(np.float64), dist, dist == 0, dist == 0,
                   a, e, a, e, share=np.where(dist == 0, 0.0, np.inf))


def _code_outcome(output: str, fmt: formats.Format, a_codes: np.ndarray, expected: np.ndarray, policy: str,
                  bound: str) -> Outcome:
    """Codes of `fmt` against the exact float64 values `expected`; `passed` is bitwise equality to the
    correctly rounded value (NaN as NaN), which each policy but `bitwise` replaces by its own verdict and
    share (bitwise: 0 where the bits match, inf where not)."""
    exact = expected.astype(np.float64)
    e_codes = fmt.encode(exact)
    a_val = fmt.decode(a_codes)
    both_nan = np.isnan(a_val) & np.isnan(fmt.decode(e_codes))
    same_bits = (a_codes.astype(np.int64) == e_codes.astype(np.int64)) | both_nan
    return Outcome(output, fmt.name, policy, bound, fmt.ulp_error(a_val, exact), fmt.code_distance(a_codes, e_codes),
                   same_bits, same_bits, a_val, expected, a_codes, e_codes, share=np.where(same_bits, 0.0, np.inf))


@dataclasses.dataclass(frozen=True)
class Bitwise(Policy):
    """Same shape, dtype and bytes. `dtype` pins the expected output dtype."""

    dtype: torch.dtype | None = None

    def compare(self, output: str, actual: Any, expected: Any) -> Comparison:
        if self.dtype is not None and isinstance(actual, torch.Tensor) and actual.dtype != self.dtype:
            return Comparison.rejected(output, str(actual.dtype), "bitwise",
                                       f"dtype {actual.dtype}, expected {self.dtype}")
        if tuple(actual.shape) != tuple(expected.shape):
            return _shape_mismatch(output, actual.shape, expected.shape, "bitwise", str(getattr(actual, "dtype", "")))
        if not (isinstance(actual, torch.Tensor) and actual.is_floating_point()):
            return summarise(_integer_outcome(output, _as_numpy(actual), _as_numpy(expected), "bitwise", "bitwise"))
        fmt = formats.of_dtype(actual.dtype)
        if not isinstance(expected, torch.Tensor):
            return summarise(_code_outcome(output, fmt, formats.codes_of(actual), _as_numpy(expected), "bitwise",
                                           "bitwise"))
        if expected.dtype != actual.dtype:
            raise TypeError(f"output {output!r}: oracle gave {expected.dtype} for a {actual.dtype} output")
        # Moving bits: compare raw codes so NaN payloads count too.
        a, e = formats.codes_of(actual).astype(np.int64), formats.codes_of(expected).astype(np.int64)
        if np.array_equal(a, e):
            return identical(output, fmt, a)
        same = a == e
        dist = np.where(same, 0, fmt.code_distance(a, e).clip(min=1))
        return summarise(Outcome(output, fmt.name, "bitwise", "bitwise", np.where(same, 0.0, np.inf), dist, same,
                                 same, fmt.decode(a), fmt.decode(formats.codes_of(expected)), a, e,
                                 share=np.where(same, 0.0, np.inf)))


@dataclasses.dataclass(frozen=True)
class Ulp(Policy):
    """Per-element ULP error in `fmt` (default: the output's dtype) at most `max`."""

    fmt: str | None = None
    max: float = 0.5

    def compare(self, output: str, actual: Any, expected: Any) -> Comparison:
        if tuple(actual.shape) != tuple(expected.shape):
            return _shape_mismatch(output, actual.shape, expected.shape, "ulp", str(self.fmt))
        fmt = _float_format(self.fmt, actual)
        codes = formats.codes_of(actual) if isinstance(actual, torch.Tensor) else _as_numpy(actual)
        o = _code_outcome(output, fmt, codes, _as_numpy(expected), "ulp", f"ULP error <= {self.max:g}")
        comp = summarise(dataclasses.replace(o, passed=o.ulp_error <= self.max,
                                             share=share_of_bound(o.ulp_error, self.max)))
        comp.extra[ALLOWED_ULP] = float(self.max)
        return comp


@dataclasses.dataclass(frozen=True)
class Codes(Policy):
    """Code distance in `fmt` to the correctly rounded value at most `max`.

    `actual` may be a float tensor of a native dtype or an array of codes
    (packed formats are unpacked by the op's spec before they get here).
    """

    fmt: str
    max: int = 0

    def compare(self, output: str, actual: Any, expected: Any) -> Comparison:
        if tuple(actual.shape) != tuple(expected.shape):
            return _shape_mismatch(output, actual.shape, expected.shape, "codes", self.fmt)
        fmt = formats.get(self.fmt)
        o = _code_outcome(output, fmt, _codes_of(actual, fmt), _as_numpy(expected), "codes",
                          f"code distance <= {self.max}")
        comp = summarise(dataclasses.replace(o, passed=o.distance <= self.max,
                                             share=share_of_bound(o.distance, self.max)))
        comp.extra[ALLOWED_CODES] = float(self.max)
        return comp


@dataclasses.dataclass(frozen=True)
class Bracket:
    """The expected value of an output that may legitimately round either way.

    ``exact``: the exact values (float64; the ULP error and code distance in the
    report are measured against them).  ``low``, ``high``: per element, the
    lowest and highest acceptable values (float64 values of the format).  NaN
    in both means the element must be NaN; [-inf, inf] leaves it unconstrained,
    NaN included.
    """

    exact: Any
    low: Any
    high: Any


@dataclasses.dataclass(frozen=True)
class Within(Policy):
    """Every element inside the spec's `Bracket` [low, high]; statistics against the exact value.

    For an output whose correct value is a rounding of something a
    working-precision kernel can only approximate (a quantised element of a
    fused op, a scale factor computed from such values): the spec computes the
    range of results the declared error allows, and this policy enforces it.
    """

    fmt: str | None = None

    def compare(self, output: str, actual: Any, expected: Any) -> Comparison:
        if not isinstance(expected, Bracket):
            raise TypeError(f"output {output!r}: the within policy needs a Bracket, got {type(expected).__name__}")
        if tuple(actual.shape) != tuple(np.shape(expected.exact)):
            return _shape_mismatch(output, actual.shape, np.shape(expected.exact), "within", str(self.fmt))
        fmt = _float_format(self.fmt, actual)
        o = _code_outcome(output, fmt, _codes_of(actual, fmt), np.asarray(expected.exact, dtype=np.float64),
                          "within", "within the allowed range")
        a = o.actual
        low, high = (np.broadcast_to(np.asarray(v, dtype=np.float64), a.shape) for v in (expected.low, expected.high))
        unconstrained = (low == -np.inf) & (high == np.inf)
        nan_as_required = np.isnan(a) & np.isnan(low)
        ok = unconstrained | nan_as_required | ((a >= low) & (a <= high))
        share = self.share(a, o.expected.astype(np.float64), low, high, unconstrained | nan_as_required | o.exact)
        return summarise(dataclasses.replace(
            o, passed=ok, share=share,
            detail=lambda at: f"; allowed [{_fmt_value(low[at])}, {_fmt_value(high[at])}] there"))

    @staticmethod
    def share(a: np.ndarray, exact: np.ndarray, low: np.ndarray, high: np.ndarray, free: np.ndarray) -> np.ndarray:
        """Per element, how far `a` lies from the exact value towards the end of the bracket on its side:
        |a - exact| / (high - exact) above it, / (exact - low) below it (1: at the end, inf: a side of
        width 0 left); 0 where `a` is the exact value or `free` (unconstrained, the NaN it must be, or the
        correctly rounded value: a bracket whose ends are the two roundings of the exact value would
        otherwise count a correctly rounded element as using its whole bound)."""
        with np.errstate(invalid="ignore"):
            width = np.where(a > exact, high - exact, exact - low)
            share = share_of_bound(np.abs(a - exact), np.maximum(width, 0.0))
        return np.where(free | (a == exact), 0.0, share)


@dataclasses.dataclass(frozen=True)
class Relative(Policy):
    """|actual - exact| <= max * |exact| per element (NaN and inf must match exactly).

    The ULP figures in the report are still given in the output's format, so
    that a relative bound and the ULPs it allows can be read side by side; the
    failure message names the failing element of the largest ULP error, with
    its relative error.
    """

    max: float
    fmt: str | None = None

    def compare(self, output: str, actual: Any, expected: Any) -> Comparison:
        if tuple(actual.shape) != tuple(expected.shape):
            return _shape_mismatch(output, actual.shape, expected.shape, "relative", str(self.fmt))
        fmt = _float_format(self.fmt, actual)
        a_codes = formats.codes_of(actual) if isinstance(actual, torch.Tensor) else _as_numpy(actual)
        o = _code_outcome(output, fmt, a_codes, _as_numpy(expected), "relative", f"relative error <= {self.max:g}")
        a = o.actual
        x = _as_numpy(expected).astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            rel = np.abs(a - x) / np.abs(x)
        same_special = (np.isnan(a) & np.isnan(x)) | (a == x)
        rel = np.where(same_special, 0.0, np.where(np.isnan(rel), np.inf, rel))
        comp = summarise(dataclasses.replace(
            o, passed=rel <= self.max, share=share_of_bound(rel, self.max),
            detail=lambda at: f"; relative error {_fmt_value(rel[at])} there"))
        comp.extra["max_relative"] = float(rel.max()) if rel.size else 0.0
        comp.extra[ALLOWED_RELATIVE] = float(self.max)
        return comp


def bitwise(dtype: torch.dtype | None = None) -> Bitwise:
    return Bitwise(dtype)


def ulp(fmt: str | None = None, max: float = 0.5) -> Ulp:  # noqa: A002 - the design's name
    return Ulp(fmt, max)


def codes(fmt: str, max: int = 0) -> Codes:  # noqa: A002
    return Codes(fmt, max)


def relative(max: float, fmt: str | None = None) -> Relative:  # noqa: A002
    return Relative(max, fmt)


def within(fmt: str | None = None) -> Within:
    return Within(fmt)


# -- error bounds of sums accumulated in a working precision ---------------------------------
#
# A reduction's result depends on the order of its roundings, so neither bitwise
# agreement nor a fixed ULP bound judges it: where the terms cancel, the sum is
# tiny next to the terms and any order of fp32 additions may be many ULPs off.
# What holds for every order is the classical bound in terms of the absolute
# sum (Higham, "Accuracy and Stability of Numerical Algorithms", ch. 3-4):
#
#   |s_hat - S| <= ((1 + e_in)(1 + gamma_{n-1+r}) - 1) * sum_k |p_k| + (1 + gamma_{n-1}) * sum_k a_k
#
# for n terms p_k, each formed with r roundings (a product w*x: r = 1) from
# inputs that already carry a relative error e_in, and a_k the absolute errors
# the relative model misses (a product rounded in the subnormal range).  The
# result is then rounded once to the output format.  `summation_error` computes
# the first part, the `summation` policy adds the final rounding and judges
# each element, and reports the ULPs in the output format all the same.

FP32_UNIT_ROUNDOFF = 2.0**-24
# The most a product rounded into the fp32 subnormal range is off by: half the
# subnormal spacing 2^-149.  (Additions are exact there.)
FP32_UNDERFLOW = 2.0**-150


def gamma(n: Any, unit_roundoff: float = FP32_UNIT_ROUNDOFF) -> np.ndarray:
    """Higham's gamma_n = n u / (1 - n u): |prod (1 + d_i) - 1| <= gamma_n for n roundings |d_i| <= u."""
    nu = np.asarray(n, dtype=np.float64) * unit_roundoff
    if np.any(nu >= 1):
        raise ValueError(f"gamma_n needs n * u < 1, got n up to {np.max(n)} with u = {unit_roundoff:g}")
    return nu / (1 - nu)


def _additions(terms: Any) -> np.ndarray:
    """The additions of a sum of `terms` terms (n - 1, at least 0), per element."""
    return np.maximum(np.asarray(terms, dtype=np.float64) - 1, 0)


def summation_error(magnitude: Any, terms: Any, *, roundings_per_term: int = 1, term_error: Any = 0.0,
                    absolute: Any = 0.0, unit_roundoff: float = FP32_UNIT_ROUNDOFF) -> np.ndarray:
    """Absolute error bound of a sum accumulated in a working format, before its final rounding.

    magnitude           sum_k |p_k| of the exact terms, per element (float64).
    terms               n, the number of terms summed (an int or per element);
                        the bound holds for every summation order and tree,
                        with or without fused multiply-adds (an FMA rounds once
                        where a product and an addition round twice).
    roundings_per_term  r, roundings in forming one term from the inputs
                        (0: the terms are inputs; 1: w * x; 2: w * q * sf).
    term_error          relative error the inputs of each term already carry
                        (an input computed earlier in working precision).
    absolute            sum_k a_k, absolute errors outside the relative model:
                        a product rounded in the subnormal range (`FP32_UNDERFLOW`
                        per product), a constant rounded to the format.
    """
    n = _additions(terms)
    relative = (1 + np.asarray(term_error, dtype=np.float64)) * (1 + gamma(n + roundings_per_term, unit_roundoff)) - 1
    return relative * np.asarray(magnitude, dtype=np.float64) + (1 + gamma(n, unit_roundoff)) * np.asarray(absolute)


@dataclasses.dataclass(frozen=True)
class ErrorBound:
    """The expected value of an output computed in a working precision.

    ``exact``: the exact values (float64).  ``error``: per element, the
    absolute error the computation may add before the result is rounded to
    the output format (see `summation_error`).  ``fmt``: the format the output
    must have (None: the policy's, else the output's own dtype).
    """

    exact: Any
    error: Any
    fmt: str | None = None
    # What the positive and the negative terms can add up to in the working format, at most
    # (`signed_reach`): where one side can pass the overflow threshold, partial sums may overflow
    # whatever the exact sum is.  None: the summation policy assumes no intermediate overflow.
    reach: tuple[Any, Any] | None = None


def signed_reach(terms: Any, n: Any, *, roundings_per_term: int = 1, partial: Any = None,
                 unit_roundoff: float = FP32_UNIT_ROUNDOFF) -> tuple[np.ndarray, np.ndarray]:
    """(P, N): the largest magnitude a partial sum of only positive (only negative) computed terms
    can have, (1 + gamma_{n-1+r}) times the sum of their exact magnitudes; inf where a term of that
    sign is infinite.  `terms` stacks the exact terms on axis 0; NaN terms count on neither side.

    A partial sum of mixed signs is smaller in magnitude than the larger side, so no partial sum, in
    any order or tree, overflows to +inf (-inf) unless P (N) reaches the overflow threshold.

    `partial` (same shape as `terms`): for a term formed from more than two factors, the largest
    magnitude of any product of some of them (w q, q sf, w sf, w q sf): a term whose partial
    product overflows is infinite in fp32 whatever its exact value.  A zero term counts on both
    sides then (0 times an overflowed product is NaN), which also admits either infinity there:
    sound, not tight, in that corner."""
    t = np.asarray(terms, dtype=np.float64)
    size = np.abs(t) if partial is None else np.maximum(np.abs(t), np.asarray(partial, dtype=np.float64))
    grow = 1 + gamma(_additions(n) + roundings_per_term, unit_roundoff)
    with np.errstate(invalid="ignore", over="ignore"):
        positive = np.where(t >= 0, size, 0.0).sum(axis=0) * grow
        negative = np.where(t <= 0, size, 0.0).sum(axis=0) * grow
    return positive, negative


def _rounds_into(fmt: formats.Format, accumulator: formats.Format) -> bool:
    """Whether a value of `accumulator` needs rounding to be stored in `fmt`."""
    return not (fmt.precision >= accumulator.precision and fmt.emin <= accumulator.emin
                and fmt.emax >= accumulator.emax)


@dataclasses.dataclass(frozen=True)
class Summation(Policy):
    """Per element |y - exact| <= error + 0.5 ulp_fmt(|exact| + error), against an `ErrorBound`.

    ``error`` bounds the accumulation in `accumulator` (fp32); the half ULP is
    the one rounding of the accumulated value to the output format, left out
    when the output format holds every value of the accumulator's (an fp32
    sum stored as fp32).  The half ULP is taken at |exact| + error, the largest
    magnitude the accumulated value can have (the ULP grows with magnitude).
    An exact NaN must be NaN, an exact infinity the same infinity, unless the
    bound says how far each sign's terms reach (``ErrorBound.reach``): then a
    partial sum that may overflow explains an infinity or a NaN
    (`intermediate_overflow`).

    The report still measures the ULP error in the output format against the
    exact value (where terms cancel it can be large and still within the
    bound); ``extra`` adds the largest allowance in ULPs and the largest share
    of the allowance used.
    """

    fmt: str | None = None
    accumulator: str = "fp32"

    def compare(self, output: str, actual: Any, expected: Any) -> Comparison:
        if not isinstance(expected, ErrorBound):
            raise TypeError(f"output {output!r}: the summation policy needs an ErrorBound, "
                            f"got {type(expected).__name__}")
        exact = np.asarray(expected.exact, dtype=np.float64)
        if tuple(actual.shape) != exact.shape:
            return _shape_mismatch(output, actual.shape, exact.shape, "summation", str(expected.fmt or self.fmt))
        fmt = _float_format(expected.fmt or self.fmt, actual)
        if isinstance(actual, torch.Tensor) and actual.is_floating_point() and formats.of_dtype(actual.dtype) != fmt:
            return Comparison.rejected(output, fmt.name, "summation",
                                       f"dtype {actual.dtype}, expected a {fmt.name} output")
        codes = formats.codes_of(actual) if isinstance(actual, torch.Tensor) else _as_numpy(actual)
        y = fmt.decode(codes)
        error = np.broadcast_to(np.asarray(expected.error, dtype=np.float64), exact.shape)
        allowed = self.allowance(fmt, exact, error)
        with np.errstate(invalid="ignore"):
            deviation = np.abs(y - exact)
            # A finite sum whose accumulated value may reach the overflow threshold may round to
            # that infinity (and must, once every value the bound allows is past it).
            overflows = self.may_overflow(fmt, exact, error) & (y == np.copysign(np.inf, exact))
            ok = np.where(np.isfinite(exact), (np.isfinite(y) & (deviation <= allowed)) | overflows,
                          (np.isnan(exact) & np.isnan(y)) | (y == exact))
            if expected.reach is not None:
                ok |= self.intermediate_overflow(y, *expected.reach)
        ulp_of_exact = fmt.ulp(exact)
        o = _code_outcome(output, fmt, codes, exact, "summation", "|y - exact| <= summation bound")
        # The share of the bound: the deviation against the allowance; a NaN or an infinity that equals
        # the exact one is exact, any other non-finite element is judged by the rules above.
        same_special = (np.isnan(y) & np.isnan(exact)) | (y == exact)
        used = np.where(same_special, 0.0, share_of_bound(deviation, allowed))
        comp = summarise(dataclasses.replace(
            o, passed=ok, share=used, detail=lambda at: f"; allowed +-{_fmt_value(allowed[at])} "
                                                        f"({_fmt_value(allowed[at] / ulp_of_exact[at])} ULP) there"))
        finite = np.isfinite(exact) & np.isfinite(y)
        if exact.size:
            with np.errstate(invalid="ignore", divide="ignore"):
                comp.extra["max_allowed_ulp"] = float(np.max(np.where(finite, allowed / ulp_of_exact, 0.0)))
            comp.extra["max_bound_used"] = float(np.max(np.where(finite, used, 0.0)))
        return comp

    @staticmethod
    def may_overflow(fmt: formats.Format, exact: np.ndarray, error: np.ndarray) -> np.ndarray:
        """Where the accumulated value, within `error` of `exact`, can reach the format's overflow
        threshold (max finite + half its ULP: a tie there rounds to the infinity, max being odd)."""
        if not fmt.has_inf:
            return np.zeros(exact.shape, bool)
        threshold = fmt.overflow_threshold
        with np.errstate(invalid="ignore", over="ignore"):
            return np.abs(exact) + error >= threshold

    def intermediate_overflow(self, y: np.ndarray, positive: Any, negative: Any) -> np.ndarray:
        """Results that only an overflowing partial sum explains (the error bound assumes none):
        +inf if the positive terms can reach the accumulator's overflow threshold and no term is -inf,
        -inf likewise, NaN if both infinities can arise (an infinite term counts as reaching its side).
        Example (tests/regressions/mhc.post-partial-sum-overflow-nan.json, from a CPU fuzz): terms
        -1.4e37, -3.39e38 and +inf: exact +inf, but an fp32 sum that adds the two finite terms first
        reaches -inf, and -inf + inf is NaN."""
        threshold = formats.get(self.accumulator).overflow_threshold
        pos, neg = (np.broadcast_to(np.asarray(v, dtype=np.float64), y.shape) for v in (positive, negative))
        reach_pos, reach_neg = pos >= threshold, neg >= threshold
        return (((y == np.inf) & reach_pos & ~np.isinf(neg)) | ((y == -np.inf) & reach_neg & ~np.isinf(pos))
                | (np.isnan(y) & reach_pos & reach_neg))

    def allowance(self, fmt: formats.Format, exact: np.ndarray, error: np.ndarray) -> np.ndarray:
        """The largest |y - exact| allowed per element: the accumulation's error and the final rounding."""
        if not _rounds_into(fmt, formats.get(self.accumulator)):
            return error
        with np.errstate(invalid="ignore", over="ignore"):
            return error + 0.5 * fmt.ulp(np.abs(exact) + error)


def summation(fmt: str | None = None, accumulator: str = "fp32") -> Summation:
    return Summation(fmt, accumulator)
