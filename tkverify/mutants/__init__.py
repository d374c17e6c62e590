"""Mutation testing: does the suite catch deliberately broken implementations?

`tkverify mutants --impl torch --profile ci` runs a catalogue of mutants -
implementations of the registered ops with one known bug each (top-k ties to
the higher index, truncation instead of round-to-nearest-even, a skipped tail
tile, ...) - through the same machinery as the differential suite, and
reports for each one whether the profile caught it and after how many
examples.  The catalogue lives in one module per family (``moe``, ``quant``,
``transpose``, ``engram``, ``mhc``), each a list ``MUTANTS`` of `Mutant`.

How a mutant is built
---------------------
A `Mutant` has up to two factories, each taking the function of the
implementation under test and returning the broken callable:

``eager``  for ``--impl torch`` only: the eager PyTorch code in
           ``kernels/torch/`` with the one relevant step changed - a private
           helper of the module swapped for a broken one during the call
           (`patched`), or a parametrised copy of that step.
``model``  for any implementation (``tilelang``, ``tile_kernels``, a user's
           own, and ``torch`` where there is no eager factory): the
           implementation itself, called on perturbed inputs or with its
           outputs perturbed so as to reproduce what the named bug does.  A
           compiled kernel's internals cannot be edited from Python, so this
           is how TileLang mutants work: e.g. "ties to the higher index" is
           the kernel run on the row-reversed scores with the indices mapped
           back, "truncation" re-rounds the kernel's codes towards zero
           given its own sf, "a skipped tail tile" zeroes what the partial
           tiles would have written.  Each factory's docstring says what it
           models and where the model is weaker than the real bug.
           ``--models`` applies these to the torch implementation too, which
           checks the GPU catalogue on a CPU.

A mutant whose op is not registered (say, Sinkhorn before the mhc family
lands), whose op lacks the implementation, or that has no factory for it is
reported as "not applicable" with the reason and does not count in M.

How a mutant is run
-------------------
It is registered as an `Impl` of its op under a temporary name
("mutant:NAME"), with the device and requirements of the implementation it
mutates, and judged by `tkverify.suite.verify` (or, for a mutant of a
backward, by `tkverify.gradients.verify`: forward unchanged, backward broken)
under the chosen hypothesis profile; the registry is restored afterwards.
The strategy is wrapped to count the examples drawn; the first example on
which a verdict fails (or the implementation raises) gives "caught after N
examples".  Shrinking is skipped (``--shrink`` turns it back on): it only
minimises a case that has already failed, so caught/missed and N are what
the profile gives either way; with ``derandomize`` (the ci profile) they are
the same on every run.  Only a `VerificationError` counts as caught; any
other exception (a defect of the mutant or of the checks) is an "error" and
counts as not caught.

Under the ci profile a forward mutant that passes its contract on every
example is also held to the accuracy claims of the implementation it mutates
(`ClaimsGate`: claims/torch.toml for eager torch on the CPU, torch-cuda.toml
on a GPU, tilelang.toml for a TileLang kernel), judged by
`tkverify.claims.judge` on the rows its examples fold into.  A mutant beyond
its claim is caught "by the claims" (the report's how column says so).  The
mutants marked ``claim_regression`` stay inside their op's contract and only
round worse than claimed, so only the claims catch them.  ``--claims none``
judges by the contract alone; other profiles draw examples the claims were
not measured on and judge by the contract alone too.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import pkgutil
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch
from hypothesis import Phase, settings
from hypothesis.errors import HypothesisWarning

from tkverify import claims, profiles, registry
from tkverify.check import VerificationError

Factory = Callable[[Callable[..., Any]], Callable[..., Any]]

CAUGHT, MISSED, ERROR, NOT_APPLICABLE = "caught", "missed", "error", "not applicable"
CONTRACT, CLAIMS = "contract", "claims"  # what caught a mutant


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One deliberately broken implementation of a registered op.

    name      unique, snake_case (``--only`` selects by it).
    op        the registered op it breaks ("moe.topk_gate").
    breaks    what it gets wrong, in a sentence.
    eager     factory for ``--impl torch``: eager function -> broken callable.
    model     factory for any implementation: its function -> broken callable.
    backward  True: the factories take and return the op's *backward*, and the
              gradient checks judge it (the forward stays the implementation's).
    note      why a factory is missing, where one is (shown as the reason).
    claim_regression  True: the mutant stays inside its op's contract and only rounds worse
              than the implementation claims (claims/<impl>.toml), so only the claims catch it.
    """

    name: str
    op: str
    breaks: str
    eager: Factory | None = None
    model: Factory | None = None
    backward: bool = False
    note: str = ""
    claim_regression: bool = False

    def factory(self, impl_name: str, models: bool = False) -> tuple[Factory | None, str]:
        """(factory, "eager" or "model") for this implementation, or (None, why not)."""
        if impl_name == "torch" and not models and self.eager is not None:
            return self.eager, "eager"
        if self.model is not None:
            return self.model, "model"
        return None, f"no factory for {impl_name!r}" + (f": {self.note}" if self.note else "")


@dataclasses.dataclass
class Outcome:
    mutant: Mutant
    impl: str
    status: str  # CAUGHT, MISSED, ERROR or NOT_APPLICABLE
    examples: int | None = None  # caught: examples up to and including the first failing one; missed: all tried
    how: str = ""  # "eager" or "model"
    by: str = ""  # what caught it: CONTRACT (a verdict, or the mutant raised) or CLAIMS
    detail: str = ""  # the first failure, the error, or why not applicable
    seconds: float = 0.0

    @property
    def counted(self) -> bool:
        return self.status != NOT_APPLICABLE

    def result(self) -> str:
        if self.status == CAUGHT:
            return f"caught after {self.examples} example{'s' if self.examples != 1 else ''}"
        if self.status == MISSED:
            return f"MISSED ({self.examples} examples)"
        if self.status == ERROR:
            return "ERROR"
        return f"not applicable ({self.detail})"

    def as_json(self) -> dict[str, Any]:
        return {"name": self.mutant.name, "op": self.mutant.op, "breaks": self.mutant.breaks,
                "backward": self.mutant.backward, "impl": self.impl, "status": self.status,
                "examples": self.examples, "how": self.how, "by": self.by, "detail": self.detail,
                "seconds": round(self.seconds, 3)}


# -- helpers for the family modules ----------------------------------------------------


def patched(fn: Callable[..., Any], module: str, **replacements: Any) -> Callable[..., Any]:
    """`fn` with attributes of `module` (e.g. a private rounding helper) replaced during each call.

    The eager code runs unchanged except for the swapped step; the module is
    restored after every call (the runner calls one implementation at a time).
    """
    mod = importlib.import_module(module)
    missing = [n for n in replacements if not hasattr(mod, n)]
    if missing:
        raise AttributeError(f"{module} has no {missing}: the mutant no longer matches the eager code")

    def call(*args: Any, **kwargs: Any) -> Any:
        saved = {n: getattr(mod, n) for n in replacements}
        for n, v in replacements.items():
            setattr(mod, n, v)
        try:
            return fn(*args, **kwargs)
        finally:
            for n, v in saved.items():
                setattr(mod, n, v)

    call.__name__ = getattr(fn, "__name__", "patched")
    return call


def original(module: str, name: str) -> Any:
    """The unpatched attribute (to wrap in a replacement)."""
    return getattr(importlib.import_module(module), name)


_RAW_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def unwritten_rows(t: torch.Tensor, written: torch.Tensor) -> torch.Tensor:
    """`t` as a kernel that writes only the rows `written` (bool, one per row of dim 0) leaves it.

    A fresh buffer with t's dtype, shape, strides and storage size, allocated with torch.empty (so
    it holds what the allocator hands out: the poison sentinel inside `tkverify.poison.poisoned`,
    recycled memory without it), gets t's written rows bit for bit and nothing else.
    """
    storage = torch.empty(t.untyped_storage().nbytes() // t.element_size(), dtype=t.dtype, device=t.device)
    out = storage.as_strided(t.shape, t.stride(), t.storage_offset())
    if t.numel():
        raw = _RAW_BITS[t.element_size()]
        rows = written.to(device=t.device, dtype=torch.bool)
        out.view(raw)[rows] = t.view(raw)[rows]
    return out


# -- the catalogue ------------------------------------------------------------------


def catalogue() -> list[Mutant]:
    """Every mutant declared by a module of this package (its ``MUTANTS``), in module order."""
    found: list[Mutant] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        found += list(getattr(importlib.import_module(f"{__name__}.{info.name}"), "MUTANTS", ()))
    names = [m.name for m in found]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"mutant names must be unique; repeated: {duplicates}")
    return found


# -- running one mutant ------------------------------------------------------------


class _Tracker:
    """Counts the examples drawn and notes the first failing one.

    An example is counted when the mutated implementation is first called in it (the hypothesis build context
    of the call is a new one), not through the strategy: even a ``map`` that only counts adds a span to each
    example, and hypothesis' mutations of later examples follow the spans, so the draws would no longer be the
    differential suite's (on which the ci profile's catches and the claims are measured)."""

    def __init__(self, claims: ClaimsGate | None = None) -> None:
        self.drawn = 0
        self.first_failure: int | None = None
        self.failure = ""
        self.claims = claims
        self._context = None  # the hypothesis build context counted last

    def count_call(self) -> None:
        from hypothesis.control import _current_build_context

        context = _current_build_context.value
        if context is not self._context:
            self._context = context
            self.drawn += 1

    def failed(self, why: str) -> None:
        if self.first_failure is None:
            self.first_failure = max(self.drawn, 1)
            self.failure = why

    def guarded(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.count_call()
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                self.failed(f"the implementation raised {type(e).__name__}: {e}")
                raise
        return call

    def record_forward(self, spec, impl, comparisons, case, timings=None) -> None:
        bad = [c for c in comparisons if not c.passed]
        if bad:
            self.failed("; ".join(c.message.strip().splitlines()[0] for c in bad))
        elif self.claims is not None:
            self.claims.add(spec.name, comparisons, max(self.drawn, 1))

    def record_gradient(self, check, describe: str) -> None:
        if not check.passed:
            self.failed(f"[{check.check}] {check.input}: {check.message.strip().splitlines()[0] if check.message else ''}")


class ClaimsGate:
    """Holds a mutant of an implementation to that implementation's accuracy claims.

    The verdicts of the examples fold into report rows under the mutated implementation's name, as the
    differential suite's collector folds them, and `tkverify.claims.judge` compares the rows with
    ``claims/<impl>.toml`` (``<impl>-cuda.toml`` for eager torch on a GPU, a release's file for a library)
    after each example: the first example after which a row goes beyond its claim is where the claims
    catch the mutant.  Only examples whose outputs all pass their contract are folded (a contract failure
    catches the mutant on its own, and `judge` holds passing rows only).
    """

    def __init__(self, impl: registry.Impl, claims_dir: Path, device: str) -> None:
        from tkverify.case import versions

        self.impl = impl.name
        self.claims_dir = claims_dir
        self.meta: dict[str, Any] = {"versions": versions()}
        if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
            from tkverify.report.files import device_info

            self.meta.update(device_info())  # names the compute capability: the GPU's claims file
        self.rows: dict[tuple[Any, ...], Any] = {}
        self.first_beyond: int | None = None
        self.beyond = ""

    @property
    def file(self) -> Path:
        return self.claims_dir / claims.file_name(self.impl, self.meta)

    def add(self, op: str, comparisons: list[Any], example: int) -> None:
        """Fold one example's verdicts (all passing) and note the first example that goes beyond a claim."""
        from tkverify.report.rows import ResultRow, fold_into

        for c in comparisons:
            fold_into(self.rows, ResultRow.of(op, self.impl, c))
        if self.first_beyond is not None:
            return
        exceeded = claims.judge(list(self.rows.values()), dict(self.meta), self.claims_dir)
        if exceeded:
            self.first_beyond = example
            self.beyond = f"beyond the claims of {self.file.name}: " + "; ".join(
                f"{r.output} {r.format}: {claims.exceeded_text(r)}" for r in exceeded)


@contextlib.contextmanager
def hypothesis_profile(name: str, shrink: bool = False) -> Iterator[settings]:
    """The named tkverify profile (without its shrink phase unless `shrink`), restored afterwards."""
    profiles.register_profiles()
    profiles.pin_constant_pool()  # the draws the differential suite makes (and the claims were measured on)
    if name not in profiles.PROFILES:
        raise ValueError(f"unknown profile {name!r}; choose from {', '.join(profiles.PROFILES)}")
    base = settings.get_profile(name)
    phases = tuple(base.phases) if shrink else tuple(p for p in base.phases if p != Phase.shrink)
    chosen = settings(base, phases=phases)
    previous = settings.get_current_profile_name()
    settings.register_profile("tkverify-mutants", chosen)
    settings.load_profile("tkverify-mutants")
    try:
        yield chosen
    finally:
        settings.load_profile(previous)


def _verification_errors(e: BaseException) -> list[VerificationError]:
    if isinstance(e, VerificationError):
        return [e]
    found: list[VerificationError] = []
    for sub in getattr(e, "exceptions", ()):  # an ExceptionGroup (hypothesis' Flaky ones included)
        found += _verification_errors(sub)
    return found


def _first_line(text: str, limit: int = 300) -> str:
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def temporary_name(mutant: Mutant) -> str:
    return f"mutant:{mutant.name}"


def run_mutant(mutant: Mutant, impl_name: str = "torch", *, models: bool = False,
               claims_dir: Path | None = None, device: str | None = None) -> Outcome:
    """Run one mutant under the hypothesis profile in force (see `hypothesis_profile`).

    With `claims_dir`, a forward mutant whose every example passes the contract is also held to the claims
    of the implementation it mutates (`ClaimsGate`); beyond them it is caught "by the claims".  `device`
    ("cpu", "cuda") runs the mutant there instead of where the implementation runs by default (an eager
    torch implementation: the GPU when there is one), and holds it to that device's claims."""
    from tkverify import gradients, suite

    start = time.perf_counter()

    def outcome(status: str, **kw: Any) -> Outcome:
        return Outcome(mutant, impl_name, status, seconds=time.perf_counter() - start, **kw)

    try:
        spec = registry.get(mutant.op)
    except KeyError:
        return outcome(NOT_APPLICABLE, detail=f"op {mutant.op} not registered")
    if mutant.backward and spec.backward is None:
        return outcome(NOT_APPLICABLE, detail=f"{mutant.op} declares no backward")
    impls = spec.backward.impls if mutant.backward else spec.impls
    base = impls.get(impl_name)
    forward = spec.impls.get(impl_name)
    if base is None or forward is None:
        return outcome(NOT_APPLICABLE, detail=f"{mutant.op} has no {impl_name!r} implementation"
                       + (" of its backward" if mutant.backward else ""))
    reason = base.unavailable_reason() or forward.unavailable_reason()
    if reason:
        return outcome(NOT_APPLICABLE, detail=reason)
    factory, how = mutant.factory(impl_name, models)
    if factory is None:
        return outcome(NOT_APPLICABLE, detail=how)

    device = device or base.device
    gate = ClaimsGate(base, claims_dir, device) if claims_dir is not None and not mutant.backward else None
    tracker = _Tracker(gate)
    try:
        broken = tracker.guarded(factory(base.function()))
    except Exception as e:  # the factory itself no longer fits the implementation
        return outcome(ERROR, how=how, detail=f"building the mutant raised {type(e).__name__}: {e}")
    name = temporary_name(mutant)
    # the layouts of the implementation it mutates: the differential suite's draws of that implementation
    mutated = registry.Impl(name, broken, device=device, requires=base.requires, layouts=dict(forward.layouts))
    saved = {"forward": spec.impls.get(name), "backward": spec.backward.impls.get(name) if spec.backward else None}
    try:
        if mutant.backward:
            spec.impls[name] = registry.Impl(name, forward.target, device=device, requires=forward.requires,
                                             layouts=dict(forward.layouts))
            spec.backward.impls[name] = mutated
            gradients.verify(spec, name, record=tracker.record_gradient)
        else:
            spec.impls[name] = mutated
            suite.verify(spec, mutated, record=tracker.record_forward)
    except Exception as e:
        errors = _verification_errors(e)
        if errors:
            return outcome(CAUGHT, examples=tracker.first_failure or tracker.drawn, how=how, by=CONTRACT,
                           detail=tracker.failure or _first_line(str(errors[0])))
        return outcome(ERROR, examples=tracker.drawn, how=how,
                       detail=f"{type(e).__name__}: {_first_line(str(e))}")
    finally:
        for where, impl in (("forward", spec.impls), ("backward", spec.backward.impls if spec.backward else None)):
            if impl is None:
                continue
            impl.pop(name, None)
            if saved[where] is not None:
                impl[name] = saved[where]
    if gate is not None and gate.first_beyond is not None:
        return outcome(CAUGHT, examples=gate.first_beyond, how=how, by=CLAIMS, detail=gate.beyond)
    return outcome(MISSED, examples=tracker.drawn, how=how,
                   detail=f"no disagreement in {tracker.drawn} examples"
                   + ("" if gate is None else f", none beyond the claims of {gate.file.name}"))


def run_all(mutants: Iterable[Mutant], impl_name: str = "torch", *, profile: str = "ci", models: bool = False,
            shrink: bool = False, progress: Callable[[Outcome], None] | None = None,
            claims_dir: Path | None = claims.DEFAULT_DIR, device: str | None = None) -> list[Outcome]:
    """Run each mutant under `profile` (on `device`, see `run_mutant`).  The claims (`claims_dir`; None:
    none) hold under the ci profile only, whose fixed draws they were measured on: under another profile a
    mutant is judged by the contract alone."""
    claims_dir = claims_dir if profile == "ci" else None
    outcomes = []
    with hypothesis_profile(profile, shrink), warnings.catch_warnings():
        # Reporting a failing case repr()s its tensors; its size is no concern here.
        warnings.filterwarnings("ignore", message="Generating overly large repr", category=HypothesisWarning)
        for m in mutants:
            o = run_mutant(m, impl_name, models=models, claims_dir=claims_dir, device=device)
            outcomes.append(o)
            if progress is not None:
                progress(o)
    return outcomes


# -- reporting --------------------------------------------------------------------------


def summary_line(outcomes: list[Outcome]) -> str:
    counted = [o for o in outcomes if o.counted]
    return f"{sum(o.status == CAUGHT for o in counted)} of {len(counted)} mutants caught"


def exit_code(outcomes: list[Outcome]) -> int:
    """1 if any counted mutant was missed (or errored); 2 if none could run at all; else 0."""
    counted = [o for o in outcomes if o.counted]
    if any(o.status != CAUGHT for o in counted):
        return 1
    return 0 if counted else 2


_COLUMNS = ("mutant", "op", "how", "time", "result")


def _op_label(m: Mutant) -> str:
    return m.op + (" (backward)" if m.backward else "")


def _how(o: Outcome) -> str:
    """How the mutant was built, and "by the claims" where only its implementation's claims caught it."""
    return (o.how or "-") + (" by the claims" if o.by == CLAIMS else "")


def _row(o: Outcome) -> tuple[str, ...]:
    return (o.mutant.name, _op_label(o.mutant), _how(o), f"{o.seconds:.1f}s", o.result())


def _widths(mutants: list[Mutant]) -> list[int]:
    """Column widths from the names (the result column, last, takes what it needs)."""
    return [max([len(_COLUMNS[0]), *(len(m.name) for m in mutants)]),
            max([len(_COLUMNS[1]), *(len(_op_label(m)) for m in mutants)]), len("model by the claims"), 6, 0]


def format_row(cells: tuple[str, ...], widths: list[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()


def closing_lines(outcomes: list[Outcome]) -> list[str]:
    """What follows the table: failures, the not-applicable note, and the final `N of M` line."""
    lines = []
    for o in outcomes:
        if o.status in (MISSED, ERROR):
            lines.append(f"{o.status.upper()} {o.mutant.name} ({o.mutant.op}): {o.mutant.breaks}")
            lines.append(f"    {o.detail}")
    skipped = [o for o in outcomes if not o.counted]
    if skipped:
        lines.append(f"{len(skipped)} not applicable here, not counted in M:")
        reasons: dict[str, list[str]] = {}
        for o in skipped:
            reasons.setdefault(o.detail, []).append(o.mutant.name)
        lines += [f"    {reason}: {', '.join(names)}" for reason, names in reasons.items()]
    if not any(o.counted for o in outcomes):
        lines.append("no mutant could run here: nothing was verified")
    lines.append(summary_line(outcomes))
    return lines


def claims_line(claims_dir: Path | None, profile: str) -> str:
    """Which claims the mutants were held to, in a sentence."""
    if claims_dir is None or profile != "ci":
        return "Claims: none (each mutant judged by its op's contract alone)."
    return (f"Claims: each mutant is also held to the accuracy claims of the implementation it mutates "
            f"(`{_shown(claims_dir)}/<impl>.toml`); \"by the claims\": inside the contract, beyond the claim.")


def _shown(path: Path) -> str:
    """`path` relative to the working folder where it lies below it (reports stay the same on every machine)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def markdown(outcomes: list[Outcome], impl_name: str, profile: str, models: bool,
             claims_dir: Path | None = None) -> str:
    lines = [f"# Mutation report: `--impl {impl_name}` `--profile {profile}`" + (" (models)" if models else ""), "",
             claims_line(claims_dir, profile), "",
             "| mutant | op | breaks | result | how | time |", "|---|---|---|---|---|---|"]
    for o in outcomes:
        cells = [o.mutant.name, _op_label(o.mutant), o.mutant.breaks, o.result(), _how(o), f"{o.seconds:.1f}s"]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines.append("")
    failures = [o for o in outcomes if o.status in (CAUGHT, MISSED, ERROR)]
    if failures:
        lines += ["## First failure of each mutant", ""]
        lines += [f"- `{o.mutant.name}`: {o.detail}" for o in failures]
        lines.append("")
    lines += closing_lines(outcomes)
    return "\n".join(lines) + "\n"


def write_report(out: Path, outcomes: list[Outcome], impl_name: str, profile: str, models: bool,
                 claims_dir: Path | None = None) -> list[Path]:
    """The markdown and json reports: `out` names either (PATH.md / PATH.json, written side by side) or a folder."""
    out = Path(out)
    if out.suffix in (".md", ".json"):
        md, js = out.with_suffix(".md"), out.with_suffix(".json")
    else:
        md, js = out / "mutants.md", out / "mutants.json"
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text(markdown(outcomes, impl_name, profile, models, claims_dir))
    counted = [o for o in outcomes if o.counted]
    js.write_text(json.dumps({
        "impl": impl_name, "profile": profile, "models": models,
        "claims": None if claims_dir is None or profile != "ci" else _shown(claims_dir),
        "caught": sum(o.status == CAUGHT for o in counted), "total": len(counted),
        "summary": summary_line(outcomes), "mutants": [o.as_json() for o in outcomes],
    }, indent=2) + "\n")
    return [md, js]


# -- the command ------------------------------------------------------------------------


def configure_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--impl", default="torch",
                   help="the implementation to mutate: torch (eager, CPU or GPU), tilelang (GPU), or any "
                        "registered name (model mutants only)")
    p.add_argument("--profile", default="ci", choices=profiles.PROFILES, help="hypothesis profile (default ci)")
    p.add_argument("--only", nargs="+", default=None, metavar="NAME", help="run only these mutants")
    p.add_argument("--out", default=None, type=Path,
                   help="write the mutation report: PATH.md and PATH.json (or a folder: mutants.md/.json)")
    p.add_argument("--models", action="store_true",
                   help="use the implementation-independent models (the ones the GPU runs) even for torch")
    p.add_argument("--shrink", action="store_true", help="keep hypothesis' shrink phase (slower; N is unchanged)")
    p.add_argument("--claims", default=None, metavar="DIR",
                   help="hold each mutant to the accuracy claims of the implementation it mutates in DIR under the "
                        "ci profile (default: TKVERIFY_CLAIMS, else the repository's claims/; none: the contract "
                        "alone)")
    p.add_argument("--list", action="store_true", dest="list_only", help="print the catalogue and exit")
    return p


def run_command(mutants: list[Mutant], impl_name: str, profile: str, *, models: bool = False, shrink: bool = False,
                out: Path | None = None, stream=None, claims_dir: Path | None = claims.DEFAULT_DIR) -> int:
    """Run, print the table as it fills and the closing lines; write the report; return the exit code."""
    stream = stream or sys.stdout
    widths = _widths(mutants)
    print(f"mutants of --impl {impl_name}, profile {profile}" + (" (models)" if models else "")
          + f": {len(mutants)} declared", file=stream)
    print(claims_line(claims_dir, profile), file=stream)
    print(format_row(_COLUMNS, widths), file=stream, flush=True)

    def progress(o: Outcome) -> None:
        print(format_row(_row(o), widths), file=stream, flush=True)

    outcomes = run_all(mutants, impl_name, profile=profile, models=models, shrink=shrink, progress=progress,
                       claims_dir=claims_dir)
    if out is not None:
        for path in write_report(out, outcomes, impl_name, profile, models, claims_dir):
            print(f"report: {path}", file=stream)
    for line in closing_lines(outcomes):
        print(line, file=stream)
    stream.flush()
    return exit_code(outcomes)


def main(args: argparse.Namespace) -> int:
    registry.load_plugins(getattr(args, "load", []) or [])
    mutants = catalogue()
    if args.only:
        known = {m.name for m in mutants}
        unknown = [n for n in args.only if n not in known]
        if unknown:
            print(f"tkverify mutants: no mutant named {', '.join(unknown)}; known: {', '.join(sorted(known))}",
                  file=sys.stderr)
            return 2
        mutants = [m for m in mutants if m.name in args.only]
    if args.list_only:
        for m in mutants:
            kinds = [k for k, f in (("eager", m.eager), ("model", m.model)) if f is not None]
            print(f"{m.name:32} {m.op + (' (backward)' if m.backward else ''):40} {'+'.join(kinds) or '-':12} "
                  f"{m.breaks}")
        return 0
    return run_command(mutants, args.impl, args.profile, models=args.models, shrink=args.shrink, out=args.out,
                       claims_dir=claims.claims_dir_from(args.claims))
