"""Judging codes on the device: an implementation's codes against the correctly rounded ones.

A `Tally` gathers, over the chunks of one sweep (or one production shape) of one (op, format,
implementation), what a report row needs (elements, exact share, ULP errors, the code distance
histogram, the worst element) and what the sweep's own tables add: every deviation from the
correctly rounded code is counted, with up to `EXAMPLES` examples, the count per sf, and how
many of them the op's contract allows.  Everything is computed with torch on the device that
holds the codes; only counts, maxima and the few examples reach the host.

The policy is bitwise: an element is exact when its code equals the correctly rounded one (two
NaN codes agree; an element the contract leaves unconstrained, e2m1's NaN quotient, agrees).  A
deviation fails the row unless the contract allows it (`allowed`): for the quantised data, a
zero of the other sign, or, where sf is not a power of two, the neighbour that the quotient's one
fp32 rounding can reach (the code of Q (1 +- 2^-22), `tkverify.specs.quant_bounds.CAST_WINDOW`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import torch

import references.encode as enc
from tkverify.policies import Comparison, distance_histogram
from tkverify.report.rows import ResultRow
from tkverify.specs.quant_bounds import CAST_WINDOW

EXAMPLES = 10
_HIST_CAP = 256  # distances from here on share the histogram's last bucket


def hist_of_counts(counts: list[int]) -> dict[str, int]:
    """The report's histogram (`distance_histogram`'s buckets) of counts per distance 0.._HIST_CAP."""
    out: dict[str, int] = {}
    for distance, n in enumerate(counts):
        if n:
            label = next(iter(distance_histogram([distance])))
            out[label] = out.get(label, 0) + n
    return out


def is_power_of_two(v: torch.Tensor) -> torch.Tensor:
    """Finite positive powers of two (their reciprocal, and so the fp32 quotient by them, is exact)."""
    mantissa, _ = torch.frexp(torch.where(torch.isfinite(v), v, torch.zeros_like(v)))
    return torch.isfinite(v) & (v > 0) & (mantissa.abs() == 0.5)


def data_allowance(fmt: str, quotient: torch.Tensor, sf: torch.Tensor) -> Callable[..., torch.Tensor]:
    """The contract's allowance for quantised data at the deviating elements `at`: a zero of the other sign,
    or, where sf is not a power of two, a code between those of Q (1 - w) and Q (1 + w) (w = CAST_WINDOW).
    Returns (allowed, share of the window used) for the elements `at` given their actual codes."""
    def allowance(at: torch.Tensor, actual: torch.Tensor, expected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = quotient.reshape(-1)[at]
        s = sf.reshape(-1)[at] if sf.numel() > 1 else sf.reshape(-1).expand(at.numel())
        a_val, e_val = enc.decode(actual, fmt), enc.decode(expected, fmt)
        zeros = (a_val == 0) & (e_val == 0)
        slack = CAST_WINDOW * q.abs()
        low = enc.decode(enc.encode(q - slack, fmt), fmt)
        high = enc.decode(enc.encode(q + slack, fmt), fmt)
        window = ~is_power_of_two(s) & torch.isfinite(q) & (a_val >= low) & (a_val <= high)
        boundary = (a_val + e_val) / 2
        share = torch.where(zeros, 0.0, (q - boundary).abs() / slack)
        allowed = zeros | window
        return allowed, torch.where(allowed, share, torch.inf)
    return allowance


@dataclasses.dataclass
class Tally:
    """What one (op, output label, format, implementation) has been judged on so far."""

    op: str
    output: str
    fmt: str  # the format of the judged codes
    impl: str
    policy: str
    cases: int = 0
    count: int = 0
    exact: int = 0
    max_ulp: float = 0.0
    sum_ulp: float = 0.0
    distances: list[int] = dataclasses.field(default_factory=lambda: [0] * (_HIST_CAP + 1))
    deviations: int = 0
    allowed: int = 0
    failing_chunks: int = 0
    by_sf: dict[str, int] = dataclasses.field(default_factory=dict)
    examples: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    worst: dict[str, Any] | None = None
    bound_used: float = 0.0
    seconds: float = 0.0  # the implementation's calls

    def add(self, actual: torch.Tensor, expected: torch.Tensor, exact_values: torch.Tensor, *,
            inputs: torch.Tensor, sf: torch.Tensor, unconstrained: torch.Tensor | None = None,
            allowance: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None,
            describe: Callable[[int], str] = str) -> None:
        """Judge one chunk: flat int64 codes `actual` and `expected` (the correctly rounded codes of the
        float64 `exact_values`), the input bit patterns `inputs` and sf of each element (for examples and
        the per-sf counts; `sf` may be one value), the elements the contract leaves unconstrained, and
        the contract's `allowance` of a deviation (None: none allowed)."""
        fmt = self.fmt
        nan_a, nan_e = enc.is_nan_code(actual, fmt), enc.is_nan_code(expected, fmt)
        same = (actual == expected) | (nan_a & nan_e)
        free = torch.zeros_like(same) if unconstrained is None else unconstrained
        same = same | free
        ulp = torch.where(free, 0.0, enc.ulp_error(enc.decode(actual, fmt), exact_values, fmt))
        distance = torch.where(free, 0, enc.code_distance(actual, expected, fmt))
        finite_ulp = torch.where(torch.isfinite(ulp), ulp, 0.0)
        self.cases += 1
        self.count += actual.numel()
        self.exact += int(same.sum())
        self.sum_ulp += float(finite_ulp.sum())
        if ulp.numel():
            self.max_ulp = max(self.max_ulp, float(torch.nan_to_num(ulp, nan=math.inf).max()))
        for d, n in enumerate(torch.bincount(distance.clamp(max=_HIST_CAP), minlength=_HIST_CAP + 1).tolist()):
            self.distances[d] += n
        at = torch.nonzero(~same).reshape(-1)
        allowed = torch.zeros(at.numel(), dtype=torch.bool, device=at.device)
        share = torch.full((at.numel(),), torch.inf, dtype=torch.float64, device=at.device)
        if at.numel() and allowance is not None:
            allowed, share = allowance(at, actual[at], expected[at])
        self.deviations += at.numel()
        self.allowed += int(allowed.sum())
        if at.numel():
            self.bound_used = max(self.bound_used, float(share.max()))
        if at.numel() and not bool(allowed.all()):
            self.failing_chunks += 1
        self._count_by_sf(sf, at)
        self._keep_examples(at, allowed, actual, expected, inputs, sf, describe)
        self._keep_worst(ulp, allowed, at, actual, expected, exact_values, inputs, describe)

    def _count_by_sf(self, sf: torch.Tensor, at: torch.Tensor) -> None:
        if not at.numel():
            return
        values = sf.reshape(-1)[at] if sf.numel() > 1 else sf.reshape(-1).expand(at.numel())
        unique, counts = torch.unique(values, return_counts=True)
        for v, n in zip(unique.tolist(), counts.tolist()):
            key = f"{v:.9g}"
            self.by_sf[key] = self.by_sf.get(key, 0) + n

    def _keep_examples(self, at, allowed, actual, expected, inputs, sf, describe) -> None:
        room = EXAMPLES - len(self.examples)
        if room <= 0 or not at.numel():
            return
        picked = at[:room]
        sf_flat = sf.reshape(-1)
        for i, flat in enumerate(picked.tolist()):
            self.examples.append({
                "input": describe(int(inputs.reshape(-1)[flat])),
                "sf": float(sf_flat[flat] if sf_flat.numel() > 1 else sf_flat[0]),
                "actual_code": int(actual[flat]), "expected_code": int(expected[flat]),
                "allowed": bool(allowed[i]),
            })

    def _keep_worst(self, ulp, allowed, at, actual, expected, exact_values, inputs, describe) -> None:
        """The element of the largest ULP error, a deviation the contract does not allow first."""
        disallowed = at[~allowed]
        pool = disallowed if disallowed.numel() else torch.arange(ulp.numel(), device=ulp.device)
        if not pool.numel():
            return
        flat = int(pool[torch.argmax(torch.nan_to_num(ulp[pool], nan=math.inf))])
        rank = (bool(disallowed.numel()), float(ulp[flat]))
        if self.worst is not None and rank <= (self.worst["failed"], self.worst["ulp"]):
            return
        a_val, e_val = enc.decode(actual[flat:flat + 1], self.fmt), enc.decode(expected[flat:flat + 1], self.fmt)
        self.worst = {"index": [flat], "actual": f"{float(a_val):.9g}", "expected": f"{float(exact_values[flat]):.9g}",
                      "actual_code": int(actual[flat]), "expected_code": int(expected[flat]), "ulp": rank[1],
                      "rounded": f"{float(e_val):.9g}", "failed": rank[0],
                      "case": describe(int(inputs.reshape(-1)[flat]))}

    @property
    def disallowed(self) -> int:
        return self.deviations - self.allowed

    def row(self, coverage: str) -> ResultRow:
        """The report row of what was judged."""
        comparison = Comparison(self.output, self.fmt, self.policy, self.count, self.exact, self.max_ulp,
                                self.sum_ulp, hist_of_counts(self.distances), self.disallowed == 0,
                                worst=self.worst, bound_used=self.bound_used)
        row = ResultRow.of(self.op, self.impl, comparison)
        row.fold(row.empty())  # derives exact, mean_ulp and the verdict from the counts
        row.cases, row.failures = self.cases, self.failing_chunks
        row.verdict = "fail" if self.failing_chunks else "pass"
        row.coverage = coverage
        return row

    def summary(self) -> dict[str, Any]:
        """The sweep table's entry: counts, deviations, allowed ones, per sf, examples, time."""
        return {"op": self.op, "output": self.output, "format": self.fmt, "impl": self.impl, "count": self.count,
                "exact": self.exact, "deviations": self.deviations, "allowed": self.allowed,
                "disallowed": self.disallowed, "max_ulp": self.max_ulp, "by_sf": self.by_sf,
                "examples": self.examples, "impl_s": self.seconds}
