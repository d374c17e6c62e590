"""The kernel paths the differential suite reaches, measured on a machine without a GPU.

The coverage table of a GPU report (`tkverify.coverage`) says which shipped TileLang configurations, and
which of their boundary classes, the ci examples launched.  Which configuration a wrapper launches is
decided on the host, from shapes, dtypes, strides, arguments and the device's SM count; the kernel itself
decides nothing.  So the same table can be computed on a CPU: each TileLang wrapper runs on the example's
inputs with its launches stubbed (`stubbed_launches`: `compiled_kernel` records the (kernel, config) it
is asked for and returns a kernel that does nothing; the device checks pass for CPU tensors; the SM count
is the H200's), and the eager torch implementation's outputs are judged in its place, so that every
example passes and the run goes on.

The examples are those of ``pytest tests/test_differential.py --tk-impl tilelang`` under the profile in
force: the same test functions (`tkverify.suite.verify`, `tkverify.gradients.verify`), strategies and
layouts (the TileLang implementation's), hence, under the derandomised ci profile and the same hypothesis
version, the same draws.  What differs: nothing is judged against the TileLang outputs (this measures
reach, not correctness), and a wrapper that reads its kernels' outputs on the host to choose a later
launch (fused_mapping's count) sees zeros.

    tkverify coverage [-k OPS] [--out DIR]    (DIR/coverage.json, and the gaps on stdout)
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import importlib
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from tkverify import coverage, gradients, registry, suite

# The SM count the wrappers size their grids by: one H200, the GPU the committed reports come from.
H200_SMS = 132


class _NoKernel:
    """A compiled kernel that launches nothing (`stubbed_launches`) and writes zeros into every tensor it is
    given (the stand-in passes copies): a wrapper that reads a kernel's output on the host to choose its next
    launch (fused_mapping's per-expert counts) reads a valid result, not the poisoned sentinels."""

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        for value in (*args, *kwargs.values()):
            if isinstance(value, torch.Tensor) and value.numel():
                value.zero_()
        return None

    def __getattr__(self, name: str) -> Any:  # a wrapper asking for the kernel's source or attributes
        raise AttributeError(f"a stubbed kernel has no {name!r}")


@contextlib.contextmanager
def stubbed_launches() -> Iterator[None]:
    """Inside the block, TileLang wrappers run on CPU tensors and launch nothing: `compiled_kernel` records
    what it is asked for (`kernels._tilelang.launches` hears it) and returns `_NoKernel`; `require_cuda`
    accepts any device; the target is sm_90 and the SM count the H200's."""
    from kernels import _tilelang  # layer: the launch path being stubbed (imports no tilelang)

    def compiled_kernel(kernel, config, target):
        if _tilelang._LISTENERS:
            _tilelang._note_launch(kernel.name, config)
        if config not in kernel.configs:
            raise ValueError(f"{kernel.name}: {config!r} is not one of its static configurations")
        return _NoKernel()

    properties = types.SimpleNamespace(multi_processor_count=H200_SMS, name="stubbed H200")
    saved = (_tilelang.compiled_kernel, _tilelang.require_cuda, _tilelang.target_for,
             torch.cuda.get_device_properties)
    _tilelang.compiled_kernel = compiled_kernel
    _tilelang.require_cuda = lambda name, t: None
    _tilelang.target_for = lambda device: _tilelang.SM90
    torch.cuda.get_device_properties = lambda device=None: properties
    try:
        yield
    finally:
        (_tilelang.compiled_kernel, _tilelang.require_cuda, _tilelang.target_for,
         torch.cuda.get_device_properties) = saved


def _copy(value: Any) -> Any:
    """A tensor's copy with the same sizes, strides, storage offset and alignment (a row-strided view stays
    one: the wrappers choose paths by layout); other values as they are."""
    if not isinstance(value, torch.Tensor):
        return value
    storage = value.untyped_storage().clone()
    return torch.empty(0, dtype=value.dtype).set_(storage, value.storage_offset(), value.size(), value.stride())


@dataclasses.dataclass
class DryErrors:
    """Per (row, impl), how many examples' stubbed wrapper raised, and the first such error."""

    counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    first: dict[str, str] = dataclasses.field(default_factory=dict)

    def add(self, row: str, error: BaseException) -> None:
        self.counts[row] += 1
        self.first.setdefault(row, f"{type(error).__name__}: {str(error).strip().splitlines()[0][:200]}"
                              if str(error).strip() else type(error).__name__)


def stand_in(stubbed: registry.Impl, judged: registry.Impl, row: str, errors: DryErrors) -> registry.Impl:
    """`stubbed` (a TileLang implementation) run on copies of the inputs with its launches stubbed, then
    `judged` (the torch one) on the inputs, whose outputs are returned; named and laid out as `stubbed`, on
    the CPU.  What the stubbed call raises before its first launch is the wrapper's own refusal and passes
    through, as it would on the GPU (`Unsupported`, the argument checks' TypeError and ValueError: the
    gradient checks try float64 inputs first and fall back to the working precision on a TypeError); what
    it raises after a launch comes from reading a stubbed kernel's output (fused_mapping's count) and is
    counted in `errors`, the example going on with the launches heard so far."""
    from kernels import _tilelang  # layer: the launch recorder

    def call(*args, **kwargs):
        with _tilelang.launches() as heard:
            try:
                with stubbed_launches():
                    stubbed.function()(*(_copy(a) for a in args), **{k: _copy(v) for k, v in kwargs.items()})
            except Exception as e:
                if not heard:
                    raise
                errors.add(row, e)
        return judged.function()(*args, **kwargs)

    return dataclasses.replace(stubbed, target=call, device="cpu", requires=())


@dataclasses.dataclass
class Reach:
    """What the ci examples of the TileLang implementation reach, per (row, impl): coverage labels' counts
    (as a report's `SpeedRow.coverage`), and the stubbed calls that raised."""

    labels: dict[tuple[str, str], collections.Counter]
    errors: DryErrors

    def coverage_list(self) -> dict[str, Any]:
        return coverage.coverage_list({key: dict(c) for key, c in self.labels.items() if c})


def _dry_spec(spec: registry.OpSpec, impl_name: str, torch_name: str, errors: DryErrors) -> registry.OpSpec:
    """`spec` whose `impl_name` forward (and backward) are stand-ins over the torch implementation's."""
    impls = {**spec.impls, impl_name: stand_in(spec.impls[impl_name], spec.impls[torch_name], spec.name, errors)}
    spec = dataclasses.replace(spec, impls=impls)
    bw = spec.backward
    if bw is not None and impl_name in bw.impls and torch_name in bw.impls:
        row = gradients.backward_row(spec.name)
        bw_impls = {**bw.impls, impl_name: stand_in(bw.impls[impl_name], bw.impls[torch_name], row, errors)}
        spec = dataclasses.replace(spec, backward=dataclasses.replace(bw, impls=bw_impls))
    return spec


def reach(specs: list[registry.OpSpec], impl_name: str = "tilelang", torch_name: str = "torch") -> Reach:
    """Run the differential suite's and the gradient checks' examples of `impl_name` on every spec that has
    it and a torch implementation, stubbed (`stand_in`), recording each example's coverage labels."""
    labels: dict[tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
    errors = DryErrors()

    def seen(op, impl, classes, paths):
        labels[(op, impl)].update(paths)

    for spec in specs:
        if impl_name not in spec.impls or torch_name not in spec.impls:
            continue
        dry = _dry_spec(spec, impl_name, torch_name, errors)
        suite.verify(dry, dry.impls[impl_name], record_coverage=seen, record_unsupported=lambda *a: None)
        if dry.backward is not None and impl_name in dry.backward.impls:
            gradients.verify(dry, impl_name, record_coverage=seen, record_unsupported=lambda *a: None)
    return Reach(dict(labels), errors)


def selected_specs(wanted: str | None) -> list[registry.OpSpec]:
    """Every registered spec, or those whose name contains one of the comma list `wanted`'s items."""
    items = [w.strip() for w in (wanted or "").split(",") if w.strip()]
    return [s for s in registry.all_specs() if not items or any(w in s.name for w in items)]


def configure_parser(p: Any) -> Any:
    """The options of `tkverify coverage`."""
    p.add_argument("-k", default=None, metavar="OPS", help="comma list of op-name substrings (default: every op)")
    p.add_argument("--profile", default="ci", help="the hypothesis profile whose examples are measured (default ci)")
    p.add_argument("--seed", type=int, default=None, help="hypothesis' seed (as pytest's --hypothesis-seed)")
    p.add_argument("--out", type=Path, default=None, metavar="DIR", help="write DIR/coverage.json")
    p.add_argument("--write-gaps", type=Path, default=None, metavar="FILE",
                   help="write the gaps to FILE (tests/data/reach-gaps.txt: what tests/test_dry_run.py holds the ci "
                        "examples to), headed by the hypothesis version that drew them")
    return p


GAPS_HEADER = "# hypothesis {version}, max_examples {examples}"


def draws_signature() -> str:
    """What decides the ci examples besides the code: hypothesis' version and the profile's max_examples."""
    import hypothesis
    from hypothesis import settings

    return GAPS_HEADER.format(version=hypothesis.__version__, examples=settings().max_examples)


def write_gaps(path: Path, missing: list[str]) -> None:
    """The gaps, one a line, after a line naming the draws they are of (`draws_signature`)."""
    path.write_text(draws_signature() + "\n" + "".join(f"{gap}\n" for gap in sorted(missing)))


def read_gaps(path: Path) -> tuple[str, list[str]]:
    """(the draws' signature line, the gaps) of a file `write_gaps` wrote."""
    lines = path.read_text().splitlines()
    if not lines or not lines[0].startswith("# hypothesis "):
        raise ValueError(f"{path}: the first line must be the draws' signature, {GAPS_HEADER!r}")
    return lines[0], [line for line in lines[1:] if line.strip()]


def main(args: Any) -> int:
    """Measure the reach of the TileLang implementation's examples; print the gaps (exit 1 if any) and the
    stubbed calls that raised (their examples' reach is unknown)."""
    import json

    import hypothesis
    from hypothesis import settings

    from tkverify import profiles

    for module in getattr(args, "load", []) or []:
        importlib.import_module(module)
    profiles.register_profiles()
    settings.load_profile(args.profile)
    profiles.pin_constant_pool()
    if args.seed is not None:
        hypothesis.core.global_force_seed = args.seed
    start = time.perf_counter()
    result = reach(selected_specs(args.k))
    listed = result.coverage_list()
    if args.k:  # a selection answers for the kernels it launched, not for every shipped one
        listed = {kernel: configs for kernel, configs in listed.items()
                  if any(entry["examples"] for entry in configs.values())}
    missing = coverage.gaps(listed)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "coverage.json").write_text(json.dumps(listed, separators=(",", ":"), sort_keys=True))
    if args.write_gaps is not None:
        write_gaps(args.write_gaps, missing)
    for row, n in sorted(result.errors.counts.items()):
        print(f"stubbed call raised in {n} examples of {row}: {result.errors.first[row]}")
    for gap in missing:
        print(f"gap: {gap}")
    configs = sum(len(c) for c in listed.values())
    print(f"{configs} shipped configurations, {len(missing)} gaps, {time.perf_counter() - start:.1f} s "
          f"(profile {args.profile}{'' if args.seed is None else f', seed {args.seed}'})")
    return 1 if missing else 0
