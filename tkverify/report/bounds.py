"""How a report row stands against its policy's bound, in words and colours.

A row is judged by its policy's bound, not by raw ULPs: a sum judged by its error bound may be
10^9 ULPs from the exact value and pass.  So each row states its bound in words (`bound_text`),
the largest fraction of it an element used (`fraction_text`, from `ResultRow.bound_used`), and
gives ULP figures only where the bound is in ULPs (`in_ulps`).  `bound_class` sorts a row into
the four colours of the report: exact (grey), at most half the bound (green), at most the bound
(amber), past it or failing (red).
"""

from __future__ import annotations

import math

from tkverify import formats
from tkverify.policies import ALLOWED_CODES, ALLOWED_RELATIVE, ALLOWED_ULP
from tkverify.report.rows import ResultRow

# The policies whose bound is a number of ULPs or codes of the output's format.
ULP_POLICIES = ("ulp", "codes", "bitwise")

# The bound of a policy whose bound is a rule rather than a number, in words.
RULE_BOUNDS = {
    "bitwise": "bitwise",
    "within": "within the fp32 error analysis",
    "summation": "within the fp32 summation error bound",
}

# The colour classes, mildest first: (class, what it means, background, text colour).
BOUND_CLASSES = (
    ("exact", "exact: bitwise equal to the correctly rounded value everywhere", "#e4e4e4", "#333333"),
    ("inside", "at most half of the bound used", "#c8ecc8", "#14451a"),
    ("near", "more than half of the bound used, within it", "#fbe0a0", "#5a3d00"),
    ("over", "past the bound: failing", "#f5b8b8", "#7a0d0d"),
)
# The classes the histogram bars take (stronger than a table cell's background).
BAR_COLOURS = {"exact": "#9e9e9e", "inside": "#3a9a4a", "near": "#d9a21b", "over": "#c62828", "": "#7f8c99"}


def in_ulps(row: ResultRow) -> bool:
    """Whether the row's bound is in ULPs or codes of a float format, so that its ULP figures mean something."""
    return row.policy in ULP_POLICIES and row.format in formats.FORMATS


def _plural(n: float, unit: str) -> str:
    return f"{n:g} {unit}" + ("" if n == 1 else "s")


def bound_text(row: ResultRow) -> str:
    """The row's bound in words: "≤ 0.5 ULP", "≤ 1 code", "relative ≤ 1e-06", "within the fp32 error
    analysis", "bitwise"; the policy's name where it states no bound (an output rejected whole)."""
    extra = row.extra
    if row.policy == "ulp" and ALLOWED_ULP in extra:
        return f"≤ {extra[ALLOWED_ULP]:g} ULP"
    if row.policy == "codes" and ALLOWED_CODES in extra:
        return "≤ " + _plural(extra[ALLOWED_CODES], "code")
    if row.policy == "relative" and ALLOWED_RELATIVE in extra:
        return f"relative ≤ {extra[ALLOWED_RELATIVE]:g}"
    return RULE_BOUNDS.get(row.policy, row.policy)


def fraction_text(used: float | None) -> str:
    """A fraction of the bound: "0", "0.83", "1", "∞" (an element off where nothing was allowed);
    "-": not measured."""
    if used is None:
        return "-"
    if math.isinf(used):
        return "∞"
    return "0" if used == 0 else f"{used:.3g}"


def ulp_text(ulps: float) -> str:
    return "inf" if math.isinf(ulps) else f"{ulps:.3g}"


def bound_class(row: ResultRow) -> str:
    """The row's colour class: "over" if it fails, "exact" if every element is the correctly rounded
    value, else by the fraction of the bound used ("inside" up to 0.5, "near" up to 1); "" where a
    passing row does not say how much of its bound it used."""
    if row.verdict != "pass":
        return "over"
    if row.count and row.exact_count == row.count:
        return "exact"
    return share_class(row.bound_used)


def share_class(used: float | None) -> str:
    """The colour class of a fraction of the bound (None: not measured, no class)."""
    if used is None:
        return ""
    if used == 0:
        return "exact"
    return "inside" if used <= 0.5 else ("near" if used <= 1 else "over")


def bucket_classes(row: ResultRow, labels: tuple[str, ...]) -> list[str]:
    """The colour class of each bar of the row's code distance histogram: distance 0 is exact; where the
    bound is a number of codes (codes, bitwise), a bucket is coloured by the fraction of it its smallest
    distance uses; otherwise the row's own class colours every bucket but the first."""
    allowed = {"bitwise": 0.0, "codes": row.extra.get(ALLOWED_CODES)}.get(row.policy)
    own = bound_class(row) if bound_class(row) != "exact" else "inside"
    classes = []
    for label in labels:
        lo = int(label.split("-")[0].rstrip("+"))
        if lo == 0:
            classes.append("exact")
        elif allowed is not None:
            classes.append(share_class(lo / allowed if allowed else math.inf))
        else:
            classes.append(own)
    return classes
