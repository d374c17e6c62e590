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

Every policy returns a `Comparison` carrying the statistics the report needs
(count, exact share, max and mean ULP, a histogram of code distances) and, when
it fails, a message that names the worst element the way `torch.testing` does.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

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


def _shape_mismatch(output: str, actual_shape, expected_shape, policy: str, fmt: str) -> Comparison:
    return Comparison(
        output, fmt, policy, 0, 0, math.inf, 0.0, {}, False,
        message=f"output {output!r}: shape {tuple(actual_shape)} differs from the expected {tuple(expected_shape)}",
    )


def _summarise(output, fmt_name, policy, err, distance, exact_mask, passed_mask, actual_v, expected_v,
               actual_codes, expected_codes, shape, describe_policy) -> Comparison:
    """Fold per-element errors into a Comparison; name the worst element on failure."""
    n = int(err.size)
    finite_err = np.where(np.isfinite(err), err, 0.0)
    max_ulp = float(err.max()) if n else 0.0
    comp = Comparison(
        output=output, fmt=fmt_name, policy=policy, count=n,
        exact=int(np.count_nonzero(exact_mask)), max_ulp=max_ulp,
        sum_ulp=float(finite_err.sum()), hist=distance_histogram(distance),
        passed=bool(passed_mask.all()) if n else True,
    )
    if n:
        # The worst element: the largest error, the first mismatch among equals.
        bad = ~passed_mask.ravel()
        pool = np.flatnonzero(bad) if bad.any() else np.arange(n)
        flat = int(pool[np.argmax(err.ravel()[pool])])
        idx = _index(flat, shape)
        comp.worst = {
            "index": list(idx),
            "actual": _fmt_value(actual_v.ravel()[flat]),
            "expected": _fmt_value(expected_v.ravel()[flat]),
            "actual_code": int(actual_codes.ravel()[flat]),
            "expected_code": int(expected_codes.ravel()[flat]),
            "ulp": float(err.ravel()[flat]),
        }
        if not comp.passed:
            w = comp.worst
            n_bad = int(bad.sum())
            comp.message = (
                f"output {output!r} ({fmt_name}, {describe_policy}): {n_bad} of {n} elements "
                f"({100.0 * n_bad / n:.3g}%) fail\n"
                f"  worst at index {tuple(w['index'])}: actual {w['actual']}, expected {w['expected']} "
                f"(codes {w['actual_code']:#x} vs {w['expected_code']:#x}), ULP error {_fmt_value(w['ulp'])}"
            )
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


def _compare_integers(output: str, actual: np.ndarray, expected: np.ndarray, policy: str, max_dist: int) -> Comparison:
    """Integers are their own codes: the distance is |actual - expected|."""
    a = actual.astype(np.int64)
    e = expected.astype(np.int64)
    dist = np.abs(a - e)
    return _summarise(
        output, str(actual.dtype), policy, dist.astype(np.float64), dist, dist == 0, dist <= max_dist,
        a, e, a, e, actual.shape, policy if policy == "bitwise" else f"{policy} <= {max_dist}",
    )


def _compare_codes(output: str, fmt: formats.Format, a_codes: np.ndarray, expected: np.ndarray,
                   policy: str, bound_desc: str, max_ulp: float | None, max_dist: int | None,
                   bitwise: bool) -> Comparison:
    """Judge codes of `fmt` against the exact float64 values `expected`."""
    e_codes = fmt.encode(expected.astype(np.float64))
    a_val = fmt.decode(a_codes)
    err = fmt.ulp_error(a_val, expected.astype(np.float64))
    dist = fmt.code_distance(a_codes, e_codes)
    both_nan = np.isnan(a_val) & np.isnan(fmt.decode(e_codes))
    same_bits = (a_codes.astype(np.int64) == e_codes.astype(np.int64)) | both_nan
    if bitwise:
        ok = same_bits
    elif max_dist is not None:
        ok = dist <= max_dist
    else:
        ok = err <= max_ulp
    return _summarise(
        output, fmt.name, policy, err, dist, same_bits, ok, a_val, expected, a_codes, e_codes,
        a_codes.shape, bound_desc,
    )


@dataclasses.dataclass(frozen=True)
class Bitwise(Policy):
    """Same shape, dtype and bytes. `dtype` pins the expected output dtype."""

    dtype: torch.dtype | None = None

    def compare(self, output: str, actual: Any, expected: Any) -> Comparison:
        if self.dtype is not None and isinstance(actual, torch.Tensor) and actual.dtype != self.dtype:
            return Comparison(output, str(actual.dtype), "bitwise", 0, 0, math.inf, 0.0, {}, False,
                              message=f"output {output!r}: dtype {actual.dtype}, expected {self.dtype}")
        if tuple(actual.shape) != tuple(expected.shape):
            return _shape_mismatch(output, actual.shape, expected.shape, "bitwise", str(getattr(actual, "dtype", "")))
        if isinstance(actual, torch.Tensor) and actual.is_floating_point():
            fmt = formats.of_dtype(actual.dtype)
            exp = expected
            if isinstance(expected, torch.Tensor):
                if expected.dtype != actual.dtype:
                    raise TypeError(f"output {output!r}: oracle gave {expected.dtype} for a {actual.dtype} output")
                exp = fmt.decode(formats.codes_of(expected))
                # Moving bits: compare raw codes so NaN payloads count too.
                a, e = formats.codes_of(actual).astype(np.int64), formats.codes_of(expected).astype(np.int64)
                same = a == e
                dist = np.where(same, 0, fmt.code_distance(a, e).clip(min=1))
                return _summarise(output, fmt.name, "bitwise", np.where(same, 0.0, np.inf), dist, same, same,
                                  fmt.decode(a), exp, a, e, a.shape, "bitwise")
            return _compare_codes(output, fmt, formats.codes_of(actual), _as_numpy(exp), "bitwise", "bitwise",
                                  None, None, bitwise=True)
        return _compare_integers(output, _as_numpy(actual), _as_numpy(expected), "bitwise", 0)


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
        return _compare_codes(output, fmt, codes, _as_numpy(expected), "ulp", f"ULP error <= {self.max:g}",
                              self.max, None, bitwise=False)


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
        codes = formats.codes_of(actual) if isinstance(actual, torch.Tensor) and actual.is_floating_point() \
            else _as_numpy(actual).astype(fmt.code_dtype)
        return _compare_codes(output, fmt, codes, _as_numpy(expected), "codes", f"code distance <= {self.max}",
                              None, self.max, bitwise=False)


@dataclasses.dataclass(frozen=True)
class Relative(Policy):
    """|actual - exact| <= max * |exact| per element (NaN and inf must match exactly).

    The ULP figures in the report are still given in the output's format, so
    that a relative bound and the ULPs it allows can be read side by side.
    """

    max: float
    fmt: str | None = None

    def compare(self, output: str, actual: Any, expected: Any) -> Comparison:
        if tuple(actual.shape) != tuple(expected.shape):
            return _shape_mismatch(output, actual.shape, expected.shape, "relative", str(self.fmt))
        fmt = _float_format(self.fmt, actual)
        a_codes = formats.codes_of(actual) if isinstance(actual, torch.Tensor) else _as_numpy(actual)
        comp = _compare_codes(output, fmt, a_codes, _as_numpy(expected), "relative",
                              f"relative error <= {self.max:g}", math.inf, None, bitwise=False)
        a = fmt.decode(a_codes)
        x = _as_numpy(expected).astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            rel = np.abs(a - x) / np.abs(x)
        same_special = (np.isnan(a) & np.isnan(x)) | (a == x)
        rel = np.where(same_special, 0.0, np.where(np.isnan(rel), np.inf, rel))
        ok = rel <= self.max
        comp.passed = bool(ok.all())
        comp.extra["max_relative"] = float(rel.max()) if rel.size else 0.0
        if not comp.passed:
            flat = int(np.argmax(np.where(ok, -1.0, rel).ravel()))
            idx = _index(flat, a.shape)
            comp.message = (
                f"output {output!r} ({fmt.name}, relative error <= {self.max:g}): "
                f"{int((~ok).sum())} of {a.size} elements fail\n"
                f"  worst at index {idx}: actual {_fmt_value(a.ravel()[flat])}, "
                f"expected {_fmt_value(x.ravel()[flat])}, relative error {_fmt_value(rel.ravel()[flat])}"
            )
        return comp


def bitwise(dtype: torch.dtype | None = None) -> Bitwise:
    return Bitwise(dtype)


def ulp(fmt: str | None = None, max: float = 0.5) -> Ulp:  # noqa: A002 - the design's name
    return Ulp(fmt, max)


def codes(fmt: str, max: int = 0) -> Codes:  # noqa: A002
    return Codes(fmt, max)


def relative(max: float, fmt: str | None = None) -> Relative:  # noqa: A002
    return Relative(max, fmt)
