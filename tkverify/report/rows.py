"""The rows of a report: one dataclass per table, each folding and serialising the same way.

* `ResultRow`       the verdicts on one output of an op under one implementation, in one format
                    (key: op, output, format, impl);
* `GradientRow`     one gradient check of one differentiable input (key: op, input, impl, check);
* `SpeedRow`        where the time of fuzzing (op, impl) went;
* `UnsupportedRow`  the cases an implementation refused, per reason, (op, impl).

What they share lives in `Row`: a key, an empty row of the same key (`empty`), `fold` (add a row
of the same key into this one), and the dict report.json and the shards store (`to_json`,
`from_json`).  A collector folds single verdicts into rows; a merge folds the rows of several
shards the same way, so the merged report equals the union of the shards whatever the split.
`Report` is the whole document.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, TypeVar

from tkverify.policies import HIST_LABELS, Comparison
from tkverify.registry import KnownDiscrepancy

R = TypeVar("R", bound="Row")


@dataclasses.dataclass
class Row:
    """What every report row has: a key among its fields, and a fold of rows of the same key."""

    KEY: ClassVar[tuple[str, ...]] = ()
    # The fields an empty row of a key takes from a row of it: the key and what describes it.
    IDENTITY: ClassVar[tuple[str, ...]] = ()

    @property
    def key(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.KEY)

    def empty(self: R) -> R:
        """A row of the same key with nothing folded into it."""
        return type(self)(**{name: getattr(self, name) for name in self.IDENTITY})

    def fold(self, other: R) -> None:  # pragma: no cover
        """Add `other`, a row of the same key, into this one."""
        raise NotImplementedError

    def to_json(self) -> dict[str, Any]:
        """The dict report.json and the shards hold, its keys in the order of the fields."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls: type[R], doc: dict[str, Any]) -> R:
        """The row of a dict `to_json` wrote; a field that a row from an older version lacks takes its default."""
        names = {f.name for f in dataclasses.fields(cls) if f.init}
        return cls(**{k: v for k, v in doc.items() if k in names})


def fold_into(table: dict[tuple[Any, ...], R], row: R) -> None:
    """Fold `row` into the row of its key in `table` (an empty one if the key is new)."""
    if row.key not in table:
        table[row.key] = row.empty()
    table[row.key].fold(row)


@dataclasses.dataclass
class ResultRow(Row):
    """The verdicts on one output (op, output, format, impl): element counts, ULP errors, the code
    distance histogram, the worst element, and the figures a policy adds (`extra`, their maxima).
    ``exact``, ``mean_ulp`` and ``verdict`` derive from the counts (`fold` keeps them up to date)."""

    KEY = ("op", "output", "format", "impl")
    IDENTITY = (*KEY, "policy", "coverage")

    op: str
    output: str
    format: str
    impl: str
    policy: str
    cases: int = 0
    count: int = 0
    exact_count: int = 0
    exact: float = 1.0
    max_ulp: float = 0.0
    sum_ulp: float = 0.0
    mean_ulp: float = 0.0
    hist: dict[str, int] = dataclasses.field(default_factory=dict)
    failures: int = 0
    verdict: str = "pass"
    worst: dict[str, Any] | None = None
    extra: dict[str, float] = dataclasses.field(default_factory=dict)
    # The largest share of the policy's allowed error any element used (Comparison.bound_used; None: the
    # policy does not measure it).
    bound_used: float | None = None
    # The case file of the row's worst example (replayable with `tkverify replay`), where one was kept.
    worst_case: str | None = None
    # The case file of a failing example of the row, where one was saved.
    failing_case: str | None = None
    # "sampled" (examples drawn: the errors are lower bounds of the worst) or "exhaustive" (every input of
    # the stated domain was judged: the errors are the worst there is).
    coverage: str = "sampled"
    # The implementation's accuracy claim for this (op, output, format) (tkverify.claims: max_ulp, bound_used,
    # bitwise), set when the report is judged against the claims; None: no claim (or not judged).
    claim: dict[str, Any] | None = None
    # Whether the row's observed error goes beyond its claim (a failure even where the contract passes).
    claim_exceeded: bool = False

    @classmethod
    def of(cls, op: str, impl: str, c: Comparison, case_desc: str = "") -> ResultRow:
        """The row of one verdict; its worst element names the case (`Case.describe`)."""
        return cls(op, c.output, c.fmt, impl, c.policy, cases=1, count=c.count, exact_count=c.exact,
                   max_ulp=c.max_ulp, sum_ulp=c.sum_ulp, hist=dict(c.hist), failures=0 if c.passed else 1,
                   worst=None if c.worst is None else {**c.worst, "case": case_desc}, extra=dict(c.extra),
                   bound_used=c.bound_used)

    def fold(self, other: ResultRow) -> None:
        self.cases += other.cases
        self.count += other.count
        self.exact_count += other.exact_count
        self.sum_ulp += other.sum_ulp
        self.failures += other.failures
        for k, v in other.hist.items():
            self.hist[k] = self.hist.get(k, 0) + v
        for k, v in other.extra.items():
            self.extra[k] = max(self.extra.get(k, -math.inf), v)
        if other.worst is not None and (self.worst is None or other.max_ulp > self.max_ulp):
            self.worst = other.worst
        # The worst case follows the larger share of the bound where both rows measure it, else the larger ULP error.
        if other.bound_used is not None and self.bound_used is not None:
            further = other.bound_used > self.bound_used
        else:
            further = other.max_ulp > self.max_ulp
        if other.bound_used is not None:
            self.bound_used = other.bound_used if self.bound_used is None else max(self.bound_used, other.bound_used)
        if other.worst_case is not None and (self.worst_case is None or further):
            self.worst_case = other.worst_case
        if self.failing_case is None:
            self.failing_case = other.failing_case
        if self.claim is None:
            self.claim = other.claim
        self.claim_exceeded = self.claim_exceeded or other.claim_exceeded
        self.max_ulp = max(self.max_ulp, other.max_ulp)
        self.exact = self.exact_count / self.count if self.count else 1.0
        self.mean_ulp = self.sum_ulp / self.count if self.count else 0.0
        self.verdict = "fail" if self.failures else "pass"
        self.hist = {k: self.hist[k] for k in HIST_LABELS if k in self.hist} | {
            k: v for k, v in self.hist.items() if k not in HIST_LABELS
        }


@dataclasses.dataclass
class GradientRow(Row):
    """The verdicts of one gradient check (op, input, impl, check; see tkverify.gradients): the largest
    error (in ``unit``), the largest bound it was held to, and the worst verdict (a failure over a
    pass, then the larger error)."""

    KEY = ("op", "input", "impl", "check")
    IDENTITY = (*KEY, "unit", "policy")

    kind: str = dataclasses.field(default="gradient", init=False)  # tells these rows from result rows
    op: str
    input: str
    impl: str
    check: str
    unit: str
    policy: str
    cases: int = 0
    count: int = 0
    exact_count: int = 0
    max_error: float = 0.0
    sum_error: float = 0.0
    max_bound: float | None = None
    failures: int = 0
    verdict: str = "pass"
    worst: dict[str, Any] | None = None

    @classmethod
    def of(cls, check: Any, case_desc: str = "") -> GradientRow:
        """The row of one `tkverify.gradients.GradientCheck`."""
        return cls(check.op, check.input, check.impl, check.check, check.unit, check.policy, cases=1,
                   count=check.count, exact_count=check.exact, max_error=check.error, sum_error=check.sum_error,
                   max_bound=check.bound, failures=0 if check.passed else 1,
                   worst={"failed": not check.passed, "error": check.error, "bound": check.bound,
                          "message": check.message, "element": check.worst, "case": case_desc})

    def fold(self, other: GradientRow) -> None:
        self.cases += other.cases
        self.count += other.count
        self.exact_count += other.exact_count
        self.sum_error += other.sum_error
        self.failures += other.failures

        def rank(w: dict[str, Any] | None) -> tuple[bool, float]:
            return (False, -math.inf) if w is None else (bool(w["failed"]), w["error"])

        if other.worst is not None and rank(other.worst) > rank(self.worst):
            self.worst = other.worst
        self.max_error = max(self.max_error, other.max_error)
        if other.max_bound is not None:
            self.max_bound = other.max_bound if self.max_bound is None else max(self.max_bound, other.max_bound)
        self.verdict = "fail" if self.failures else "pass"


# Where a judged example's time goes, and "refused": examples the implementation refused
# (`Unsupported`), whole.  SpeedRow has a field `<phase>_s` for each.
SPEED_PHASES = ("transfer", "impl", "oracle", "judge", "refused")


@dataclasses.dataclass
class SpeedRow(Row):
    """Where the time of fuzzing (op, impl) went: judged examples, the wall time of the hypothesis
    runs (drawing and shrinking included) and the seconds of each phase; ``first_impl_s`` is the
    first call of a process (compilation or a kernel-cache load), also counted in ``impl_s``."""

    KEY = IDENTITY = ("op", "impl")

    op: str
    impl: str
    examples: int = 0
    wall_s: float = 0.0
    first_impl_s: float = 0.0
    transfer_s: float = 0.0
    impl_s: float = 0.0
    oracle_s: float = 0.0
    judge_s: float = 0.0
    refused_s: float = 0.0
    # Judged examples per drawn layout of each input, "<input>=<class>" (strategies.layouts.layout_labels).
    layouts: dict[str, int] = dataclasses.field(default_factory=dict)
    # Judged examples per input class the strategy tagged ("class: <name>" events, tkverify.coverage).
    classes: dict[str, int] = dataclasses.field(default_factory=dict)
    # Judged examples per kernel path launched, and per path and boundary class (tkverify.coverage labels).
    coverage: dict[str, int] = dataclasses.field(default_factory=dict)

    def phase_s(self, phase: str) -> float:
        return getattr(self, f"{phase}_s")

    def fold(self, other: SpeedRow) -> None:
        for name in ("examples", "wall_s", "first_impl_s", *(f"{p}_s" for p in SPEED_PHASES)):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for mine, theirs in ((self.layouts, other.layouts), (self.classes, other.classes),
                             (self.coverage, other.coverage)):
            for label, n in theirs.items():
                mine[label] = mine.get(label, 0) + n


def fuzzed_rows(speed: list[SpeedRow]) -> list[SpeedRow]:
    """The rows of the differential suite's hypothesis runs, the ones with a wall time (a backward's
    refusals leave a row of refused seconds only)."""
    return [r for r in speed if r.wall_s > 0]


def phase_split(rows: list[SpeedRow]) -> dict[str, float]:
    """Each phase's share of the rows' summed wall time, and "other" (drawing, shrinking, the rest)."""
    wall = sum(r.wall_s for r in rows)
    if not wall:
        return {}
    shares = {p: sum(r.phase_s(p) for r in rows) / wall for p in SPEED_PHASES}
    return {**shares, "other": max(1.0 - sum(shares.values()), 0.0)}


@dataclasses.dataclass
class UnsupportedRow(Row):
    """The cases of (op, impl) refused as unsupported (`tkverify.Unsupported`) or excused as a
    known discrepancy: in all, and per reason, the most frequent first."""

    KEY = IDENTITY = ("op", "impl")

    op: str
    impl: str
    cases: int = 0
    reasons: dict[str, int] = dataclasses.field(default_factory=dict)

    def fold(self, other: UnsupportedRow) -> None:
        for reason, n in other.reasons.items():
            self.reasons[reason] = self.reasons.get(reason, 0) + n
        self.reasons = dict(sorted(self.reasons.items(), key=lambda kv: (-kv[1], kv[0])))
        self.cases = sum(self.reasons.values())


def split_known(rows: list[UnsupportedRow]) -> tuple[list[UnsupportedRow], list[UnsupportedRow]]:
    """(refusals, known discrepancies): the same rows, each keeping only its reasons of that kind."""
    def part(known: bool) -> list[UnsupportedRow]:
        out = []
        for r in rows:
            reasons = {k: n for k, n in r.reasons.items() if k.startswith(KnownDiscrepancy.PREFIX) == known}
            if reasons:
                out.append(dataclasses.replace(r, cases=sum(reasons.values()), reasons=reasons))
        return out
    return part(False), part(True)


@dataclasses.dataclass
class Report:
    """A whole report: what it ran on (`meta`: date, commit, profile, versions, device; and
    ``partial`` or ``merged`` for a report put together from shards) and its four tables."""

    meta: dict[str, Any]
    results: list[ResultRow]
    gradients: list[GradientRow] = dataclasses.field(default_factory=list)
    speed: list[SpeedRow] = dataclasses.field(default_factory=list)
    unsupported: list[UnsupportedRow] = dataclasses.field(default_factory=list)

    TABLES: ClassVar[dict[str, type[Row]]] = {
        "results": ResultRow, "gradients": GradientRow, "speed": SpeedRow, "unsupported": UnsupportedRow}

    def to_json(self) -> dict[str, Any]:
        return {"meta": self.meta, **{name: [r.to_json() for r in getattr(self, name)] for name in self.TABLES}}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Report:
        """A report.json's document; a table that an older report lacks is empty."""
        return cls(doc["meta"], **{name: [row.from_json(r) for r in doc.get(name, [])]
                                   for name, row in cls.TABLES.items()})
