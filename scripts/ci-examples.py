#!/usr/bin/env python
# How many examples each op needs under the ci profile.
#
# For every registered op with a torch implementation, under the ci profile's settings (derandomised, no
# shrinking) with --examples examples per op, this script
#   * runs the differential suite's own verify (tkverify.suite.judged_classes: the same strategy, the same
#     layouts the torch implementation takes, hence the same draws as `pytest tests/test_differential.py`
#     under ci; tests/test_classes.py counts the same draws) and records the example (1-based, the examples
#     judged or refused counted) at which each input class of the op's strategy is first judged
#     (`<strategy>.classify`, strategies.classes.tagging);
#   * runs the op's mutants of the public catalogue (tkverify.mutants.run_all, --impl torch) and reads
#     "caught after N examples" (the mutant runner counts every drawn case through a map of the strategy,
#     which changes which cases are drawn: its figures are of its own draws);
# and writes a table - op, examples until every listed class was seen, the slowest class, examples until
# each mutant was caught - with the date, machine, versions and commit to --out.  The examples an op needs
# are the larger of its two figures; the ci profile's max_examples (tkverify/profiles.py) should be at least
# twice the largest need.
#
# Call it from the repository root:
#   CI=true .venv/bin/python scripts/ci-examples.py [--examples 30 60] [--only OP ...] \
#       [--out reports/cpu/ci-examples.md] [--suite-times "30=5m31s" ...]
# Each --examples value gets a table of its own: hypothesis draws a different sequence for each
# max_examples, so the table at N says what a ci profile of N examples reaches, and no other.  --suite-times adds the
# measured wall time of the CI suite at each max_examples to the report (measure it separately:
#   time CI=true TKVERIFY_CI_EXAMPLES=N .venv/bin/python -m pytest -q -p no:cacheprovider \
#        tests/test_differential.py tests/test_gradients.py -n 2).

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--examples", type=int, nargs="+", default=[30, 60],
                   help="max_examples values of the ci profile to measure, a table each")
    p.add_argument("--only", nargs="*", default=None, help="ops to measure (default: every op with a torch impl)")
    p.add_argument("--out", type=Path, default=ROOT / "reports/cpu/ci-examples.md")
    p.add_argument("--suite-times", nargs="*", default=[], metavar="N=TIME",
                   help="wall times of the CI suite measured at max_examples N, written into the report")
    return p.parse_args(argv)


@dataclasses.dataclass
class OpNeeds:
    """What one op needed: the first example of each class it drew, and each mutant's outcome."""

    op: str
    listed: tuple[str, ...]
    first_seen: dict[str, int]  # every class judged -> the first example it was in
    drawn: int
    failure: str = ""  # the torch implementation itself disagreed (the measurement stops there)
    mutants: list = dataclasses.field(default_factory=list)  # tkverify.mutants.Outcome

    def classes_until(self) -> int | None:
        """Examples until every listed class was judged (0: the op lists none); None where one never was."""
        if any(c not in self.first_seen for c in self.listed):
            return None
        return max((self.first_seen[c] for c in self.listed), default=0)

    def slowest(self) -> str:
        unseen = [c for c in self.listed if c not in self.first_seen]
        if unseen:
            return "never: " + ", ".join(f"`{c}`" for c in unseen)
        if not self.listed:
            return "-"
        c = max(self.listed, key=lambda c: self.first_seen[c])
        return f"`{c}` ({self.first_seen[c]})"

    def need(self) -> int | None:
        """The examples this op needs: every listed class seen and every counted mutant caught."""
        figures = [self.classes_until()]
        for o in self.mutants:
            if o.counted:
                figures.append(o.examples if o.status == "caught" else None)
        return None if any(f is None for f in figures) else max(figures, default=0)


def measure(ops: list[str] | None, examples: int) -> list[OpNeeds]:
    os.environ["TKVERIFY_CI_EXAMPLES"] = str(examples)  # read when the profiles are registered
    from tkverify import mutants, profiles, registry, suite

    profiles.register_profiles()
    profiles.pin_constant_pool()
    catalogue = mutants.catalogue()
    found = []
    for spec in registry.all_specs():
        impl = spec.impls.get("torch")
        if impl is None or (ops and spec.name not in ops) or impl.unavailable_reason():
            continue
        start = time.perf_counter()
        with mutants.hypothesis_profile("ci"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            judged = suite.judged_classes(spec, impl)
        needs = OpNeeds(spec.name, tuple(getattr(spec.strategy, "classes", ())), judged.first, judged.drawn,
                        judged.failure)
        needs.mutants = mutants.run_all([m for m in catalogue if m.op == spec.name], "torch", profile="ci")
        print(f"{spec.name}: classes until {needs.classes_until()}, mutants "
              f"{[(o.mutant.name, o.status, o.examples) for o in needs.mutants]} "
              f"({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
        found.append(needs)
    return found


def git(*args: str) -> str:
    import subprocess

    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10, cwd=ROOT).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def mutant_cell(outcomes) -> str:
    cells = []
    for o in outcomes:
        if not o.counted:
            continue
        cells.append(f"{o.mutant.name} {o.examples}" if o.status == "caught" else f"{o.mutant.name} {o.status.upper()}")
    return "; ".join(cells) or "-"


def header(examples: list[int], suite_times: list[str], seconds: float) -> list[str]:
    from tkverify.case import versions

    dirty = git("status", "--porcelain", "--untracked-files=no")
    lines = [
        "# Examples each op needs under the ci profile",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}",
        f"- machine: {platform.node()}, {platform.machine()}, {os.cpu_count()} cores, CPU only (torch impl)",
        f"- versions: {', '.join(f'{k} {v}' for k, v in versions().items())}",
        f"- commit: {git('rev-parse', '--short=12', 'HEAD')}{' (working tree modified)' if dirty else ''}",
        f"- settings: the ci profile (derandomised, no shrinking) at max_examples = "
        f"{', '.join(map(str, examples))}; `scripts/ci-examples.py --examples {' '.join(map(str, examples))}` "
        f"({seconds / 60:.1f} min)",
        "",
        "An example is a judged or refused case, counted from 1.  *classes*: the example",
        "by which every class the op's strategy lists (its spec docstring's list) has been judged at least",
        "once; *need*: the larger of that and every mutant's \"caught after N\" (— where one is not reached).",
        "The draws are the differential suite's own (`tkverify.suite.verify`, the torch implementation's",
        "layouts, `tkverify.suite.judged_classes`), which tests/test_classes.py counts as well; a mutant's",
        "figure counts the draws of the mutant runner, which counts cases through a map of the strategy",
        "and so draws other cases.",
    ]
    if suite_times:
        lines += ["", "Wall time of the CI suite (`CI=true TKVERIFY_CI_EXAMPLES=N .venv/bin/python -m pytest -q "
                  "-p no:cacheprovider tests/test_differential.py tests/test_gradients.py -n 2`, this machine):", ""]
        lines += [f"- max_examples = {t.split('=', 1)[0]}: {t.split('=', 1)[1]}" for t in suite_times]
    return lines


def section(results: list[OpNeeds], examples: int) -> list[str]:
    lines = [
        "", f"## max_examples = {examples}", "",
        "| op | classes | slowest class (example) | mutants: caught after N examples | need |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        until = r.classes_until()
        need = r.need()
        op = r.op + (f" (torch impl failed: {r.failure})" if r.failure else "")
        until_cell = "no list" if not r.listed else ("—" if until is None else until)
        lines.append(f"| {op} | {until_cell} | {r.slowest()} | {mutant_cell(r.mutants)} | "
                     f"{'—' if need is None else need} |")
    needs = [r.need() for r in results if r.need() is not None]
    unreached = [r.op for r in results if r.need() is None]
    lines += ["", f"Largest need: {max(needs, default=0)} examples"
              + (f"; not reached within {examples}: {', '.join(unreached)}" if unreached else "") + "."]
    lines += ["", f"First example of every class judged (max_examples = {examples}; listed classes in bold):", ""]
    for r in results:
        if not r.first_seen:
            continue
        cells = [f"**{c}** {n}" if c in r.listed else f"{c} {n}"
                 for c, n in sorted(r.first_seen.items(), key=lambda kv: kv[1])]
        lines.append(f"- {r.op} ({r.drawn} drawn): " + ", ".join(cells))
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    sections = []
    for examples in args.examples:
        sections += section(measure(args.only, examples), examples)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    lines = header(args.examples, args.suite_times, time.perf_counter() - start) + sections
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
