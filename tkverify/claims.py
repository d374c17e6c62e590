"""Accuracy claims per implementation: what each implementation is held to beyond the contract.

Like glibc's libm-test-ulps, every implementation has a committed, reviewed file
(``claims/<impl>.toml`` at the repository root; a third-party library's name carries its release,
``claims/tile_kernels-2.1.0.toml``) that states, per (op, output, format):

* ``max_ulp``     the largest ULP (or code) error it shows against the float64 value;
* ``bound_used``  the largest share of its policy's allowed error (only where the policy measures it);
* ``bitwise``     whether every element is the correctly rounded value (exact share 1).

A report row whose observed error exceeds its implementation's claim fails even where the contract
passes: a kernel that stays inside the contract but rounds worse than it did is a regression.  A row
with no claim (a new op) is listed as unclaimed and not failed.  `tkverify claims --update` writes the
claims from a report (`claim_of_row`: a figure up to 1 ULP rounded up to 3 significant digits, a larger one
or a share of the bound up to a power of two; never lowered
without ``--tighten``); the file's diff is reviewed like code.
"""

from __future__ import annotations

import dataclasses
import decimal
import json
import math
import os
import sys
import tomllib
from pathlib import Path
from typing import Any, Iterable

# The claims of the implementations the repository ships, beside tkverify/.
DEFAULT_DIR = Path(__file__).resolve().parent.parent / "claims"

# Implementations from a released library: their claims are per release (the report meta's versions key).
VERSIONED = {"tile_kernels": "tile-kernels"}

# Implementations whose arithmetic depends on the device they run on: eager PyTorch rounds through the
# CPU's libm on the CPU and through CUDA's libdevice and fused kernels on a GPU, so a claim measured on one
# would hide a regression on the other.  Their claims on a GPU (a report whose meta names a compute
# capability) are <impl>-cuda.toml, beside <impl>.toml for the CPU.
PER_DEVICE = ("torch",)

SIGNIFICANT_DIGITS = 3

FILE_HEADER = (
    "# Accuracy claims of {impl}: per op, output and format, the largest error a passing report row showed,\n"
    "# up to 1 ULP rounded up to 3 significant digits, beyond it (and the share of the bound) up to a power of\n"
    "# two (tkverify claims --update; reviewed like code).  A row beyond its\n"
    "# claim fails the run even where the contract passes.\n"
    "#   max_ulp     ULP (or code) error against the float64 value\n"
    "#   bound_used  largest share of the policy's allowed error (where the policy measures it)\n"
    "#   bitwise     every element equal to the correctly rounded value\n"
)


@dataclasses.dataclass(frozen=True)
class Claim:
    """The claimed accuracy of one (op, output, format) of one implementation."""

    max_ulp: float
    bitwise: bool
    bound_used: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"max_ulp": self.max_ulp, "bound_used": self.bound_used, "bitwise": self.bitwise}

    def loosest(self, other: Claim) -> Claim:
        """The claim that admits what either admits (the larger figures; bitwise only if both are)."""
        bound = (self.bound_used if other.bound_used is None else other.bound_used if self.bound_used is None
                 else max(self.bound_used, other.bound_used))
        return Claim(max(self.max_ulp, other.max_ulp), self.bitwise and other.bitwise, bound)

    def exceeded_by(self, row: Any) -> list[str]:
        """What of `row` (a ResultRow) goes beyond this claim, in words; empty: within it."""
        over = []
        if row.max_ulp > self.max_ulp:
            over.append(f"max ULP {row.max_ulp:.9g} > claimed {self.max_ulp:.9g}")
        if self.bound_used is not None and row.bound_used is not None and row.bound_used > self.bound_used:
            over.append(f"bound used {row.bound_used:.4g} > claimed {self.bound_used:.4g}")
        if self.bitwise and row.count and row.exact_count < row.count:
            over.append(f"{row.count - row.exact_count} of {row.count} elements not bitwise, claimed bitwise")
        return over


Key = tuple[str, str, str]  # (op, output, format)
Claims = dict[Key, Claim]


def round_up(x: float, digits: int = SIGNIFICANT_DIGITS) -> float:
    """The smallest float of at most `digits` significant decimal digits that is >= x (0, inf and nan kept)."""
    if x == 0 or not math.isfinite(x):
        return x
    d = decimal.Decimal(repr(x))
    step = decimal.Decimal(1).scaleb(d.adjusted() - digits + 1)
    up = float(d.quantize(step, rounding=decimal.ROUND_CEILING))
    # The nearest double to the decimal is >= x (x is a double <= the decimal, rounding is monotone).
    return up


def power_of_two_at_least(x: float) -> float:
    """The smallest power of two >= x (0, inf and nan kept)."""
    if x <= 0 or not math.isfinite(x):
        return x
    return 2.0 ** math.ceil(math.log2(x))


def claimed_ulp(observed: float) -> float:
    """The ULP claim a row's observed max supports: up to 1 ULP (correctly rounded, or nearly: where a
    worse rounding is the regression to catch) the figure rounded up to 3 significant digits; beyond it
    (rows judged by an error analysis, whose sampled maximum moves from draw to draw by up to about 2x)
    the next power of two."""
    return round_up(observed) if observed <= 1 else power_of_two_at_least(observed)


def claim_of_row(row: Any) -> Claim:
    """The claim a passing row supports: its max ULP as `claimed_ulp` says, its share of the bound rounded up
    to a power of two (at most 1: the row passed), bitwise if every element was exact."""
    bound = None if row.bound_used is None else min(power_of_two_at_least(row.bound_used), 1.0)
    return Claim(claimed_ulp(row.max_ulp), bool(row.count == 0 or row.exact_count == row.count), bound)


def observed_claims(rows: Iterable[Any], impl: str) -> Claims:
    """Per (op, output, format), the claim the passing rows of `impl` support (rows of one key, e.g. sampled
    and exhaustive, give the loosest)."""
    out: Claims = {}
    for row in rows:
        if row.impl != impl or row.verdict != "pass":
            continue
        key = (row.op, row.output, row.format)
        claim = claim_of_row(row)
        out[key] = claim if key not in out else out[key].loosest(claim)
    return out


def file_name(impl: str, meta: dict[str, Any]) -> str:
    """The claims file of `impl` under a report's meta: <impl>.toml, <impl>-<release>.toml for a released
    library (its version in ``meta["versions"]``), <impl>-cuda.toml for a device-dependent one on a GPU."""
    package = VERSIONED.get(impl)
    versions = meta.get("versions", {})
    if package is not None and versions.get(package):
        return f"{impl}-{versions[package]}.toml"
    if impl in PER_DEVICE and meta.get("capability"):
        return f"{impl}-cuda.toml"
    return f"{impl}.toml"


# ---------------------------------------------------------------- the TOML file


def _toml_key(part: str) -> str:
    return json.dumps(part)  # a TOML basic string: the same escapes as JSON's


def _toml_float(x: float) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(float(x))


def dumps(impl: str, claims: Claims) -> str:
    """The claims file's text: a header, then one table per (op, output, format), sorted."""
    lines = [FILE_HEADER.format(impl=impl).rstrip("\n"), "", f"impl = {_toml_key(impl)}"]
    for key in sorted(claims):
        c = claims[key]
        lines += ["", "[" + ".".join(_toml_key(p) for p in key) + "]", f"max_ulp = {_toml_float(c.max_ulp)}"]
        if c.bound_used is not None:
            lines.append(f"bound_used = {_toml_float(c.bound_used)}")
        lines.append(f"bitwise = {'true' if c.bitwise else 'false'}")
    return "\n".join(lines) + "\n"


def loads(text: str) -> Claims:
    """The claims of a file `dumps` wrote (any TOML of the same shape)."""
    doc = tomllib.loads(text)
    out: Claims = {}
    for op, outputs in doc.items():
        if not isinstance(outputs, dict):
            continue  # top-level keys (impl)
        for output, fmts in outputs.items():
            for fmt, c in fmts.items():
                out[(op, output, fmt)] = Claim(float(c["max_ulp"]), bool(c["bitwise"]),
                                               None if "bound_used" not in c else float(c["bound_used"]))
    return out


def read(path: Path) -> Claims | None:
    """The claims in `path`, or None where there is no such file."""
    return loads(path.read_text()) if path.is_file() else None


# ---------------------------------------------------------------- updating and judging


def update(old: Claims, observed: Claims, tighten: bool = False) -> Claims:
    """The claims after a report: each observed key at least as loose as observed; without `tighten` never
    stricter than the old claim; keys the report lacks keep their old claim."""
    new = dict(old)
    for key, claim in observed.items():
        new[key] = claim if tighten or key not in old else old[key].loosest(claim)
    return new


def changes(old: Claims, new: Claims) -> list[str]:
    """The differences between two claim sets, one line each, sorted by key."""
    lines = []
    for key in sorted(set(old) | set(new)):
        name = ":".join(key)
        if key not in old:
            lines.append(f"+ {name}: {_claim_text(new[key])}")
        elif key not in new:
            lines.append(f"- {name}: {_claim_text(old[key])}")
        elif old[key] != new[key]:
            lines.append(f"~ {name}: {_claim_text(old[key])} -> {_claim_text(new[key])}")
    return lines


def _claim_text(c: Claim) -> str:
    bound = "" if c.bound_used is None else f", bound used {c.bound_used:.4g}"
    return f"max ULP {c.max_ulp:.4g}{bound}{', bitwise' if c.bitwise else ''}"


def judge(rows: list[Any], meta: dict[str, Any], claims_dir: Path, enforce: bool = True) -> list[Any]:
    """Set each row's `claim` (the claimed figures; None: unclaimed) and `claim_exceeded`, and name the
    claims files in ``meta["claims"]`` (impl -> file, None where it has none).  Returns the rows beyond
    their claim.

    The claims are measured on the ci profile's fixed draws, where a row beyond its claim means the
    implementation changed.  Other draws (a seed, dev, fuzz, worst) reach inputs the claim never saw, and
    beyond a claim there is news about the claim, not a regression: with `enforce` False the rows keep
    `claim_exceeded` False and ``meta["claims_beyond"]`` lists them for review (`tkverify claims --update`)."""
    files: dict[str, str | None] = {}
    loaded: dict[str, Claims] = {}
    for impl in sorted({r.impl for r in rows}):
        path = claims_dir / file_name(impl, meta)
        claims = read(path)
        files[impl] = str(path) if claims is not None else None
        loaded[impl] = claims or {}
    exceeded = []
    for row in rows:
        claim = loaded[row.impl].get((row.op, row.output, row.format))
        row.claim = None if claim is None else claim.to_json()
        # A row that fails its contract is already reported (or excused as a known discrepancy); a claim,
        # measured on passing rows, holds the passing ones to what they showed.
        beyond = bool(claim is not None and row.verdict == "pass" and claim.exceeded_by(row))
        row.claim_exceeded = beyond and enforce
        if beyond:
            exceeded.append(row)
    meta["claims"] = files
    meta["claims_enforced"] = enforce
    if not enforce:
        meta["claims_beyond"] = [f"{r.op}:{r.output} {r.format} [{r.impl}]: {exceeded_text(r)}" for r in exceeded]
    return exceeded


def row_claim(row: Any) -> Claim | None:
    """The Claim a judged row carries (`judge` stored it as a dict)."""
    c = row.claim
    return None if c is None else Claim(c["max_ulp"], c["bitwise"], c.get("bound_used"))


def exceeded_text(row: Any) -> str:
    """Why a row is beyond its claim, in words."""
    claim = row_claim(row)
    return "; ".join(claim.exceeded_by(row)) if claim is not None else ""


def claims_dir_from(choice: str | None) -> Path | None:
    """The claims folder the plugin judges against: `choice` (a folder, or "none": judge no claims), else
    TKVERIFY_CLAIMS, else the repository's claims/."""
    choice = choice or os.environ.get("TKVERIFY_CLAIMS") or str(DEFAULT_DIR)
    return None if choice.lower() == "none" else Path(choice)


# ---------------------------------------------------------------- tkverify claims


def _load_report(report_dir: Path) -> tuple[dict[str, Any], list[Any]]:
    from tkverify.report.rows import Report

    path = report_dir / "report.json" if report_dir.is_dir() else report_dir
    report = Report.from_json(json.loads(path.read_text()))
    return report.meta, report.results


def cmd_update(report_dir: Path, claims_dir: Path, impls: list[str] | None, tighten: bool) -> int:
    """Write or refresh the claims of each implementation of the report (or of `impls`); print what changed."""
    meta, rows = _load_report(report_dir)
    claims_dir.mkdir(parents=True, exist_ok=True)
    for impl in impls or sorted({r.impl for r in rows}):
        path = claims_dir / file_name(impl, meta)
        old = read(path) or {}
        new = update(old, observed_claims(rows, impl), tighten=tighten)
        lines = changes(old, new)
        if lines or not path.is_file():
            path.write_text(dumps(impl, new))
        print(f"{path}: {len(lines)} claims changed, {len(new)} in all")
        for line in lines:
            print(f"  {line}")
    return 0


def cmd_check(report_dir: Path, claims_dir: Path) -> int:
    """Compare a report's rows with the claims, writing nothing: exit 1 if a row exceeds its claim."""
    meta, rows = _load_report(report_dir)
    exceeded = judge(rows, meta, claims_dir)
    unclaimed = [r for r in rows if r.claim is None]
    for r in exceeded:
        print(f"EXCEEDED {r.op}:{r.output} {r.format} [{r.impl}]: {exceeded_text(r)}")
    for r in unclaimed:
        print(f"unclaimed {r.op}:{r.output} {r.format} [{r.impl}]")
    print(f"{len(rows) - len(exceeded) - len(unclaimed)} rows within their claims, {len(exceeded)} beyond, "
          f"{len(unclaimed)} unclaimed (claims: {claims_dir})")
    return 1 if exceeded else 0


def configure_parser(p: Any) -> Any:
    """The options of `tkverify claims`."""
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--update", type=Path, metavar="REPORT_DIR",
                      help="write or refresh the claims of each implementation in REPORT_DIR/report.json from its "
                           "passing rows (never lowered without --tighten) and print what changed")
    what.add_argument("--check", type=Path, metavar="REPORT_DIR",
                      help="compare REPORT_DIR/report.json with the claims, writing nothing (exit 1 on a row beyond "
                           "its claim)")
    p.add_argument("--impl", action="append", default=None, metavar="NAME",
                   help="--update only these implementations (repeatable; default: every one in the report)")
    p.add_argument("--tighten", action="store_true", help="--update may lower a claim to what the report shows")
    p.add_argument("--claims", type=Path, default=None, metavar="DIR",
                   help="the claims folder (default: TKVERIFY_CLAIMS, else the repository's claims/)")
    return p


def main(args: Any) -> int:
    claims_dir = args.claims or claims_dir_from(None) or DEFAULT_DIR
    target = args.update or args.check
    if not (target / "report.json").is_file() and not target.is_file():
        print(f"tkverify claims: {target} has no report.json", file=sys.stderr)
        return 2
    if args.update:
        return cmd_update(args.update, claims_dir, args.impl, args.tighten)
    return cmd_check(args.check, claims_dir)
