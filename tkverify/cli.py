"""The `tkverify` command: list, report, replay."""

from __future__ import annotations

import argparse
import inspect
import subprocess
import sys
from pathlib import Path

from tkverify import registry


def cmd_list(args: argparse.Namespace) -> int:
    registry.load_plugins(args.load)
    for spec in registry.all_specs():
        impls = []
        for name, impl in spec.impls.items():
            reason = impl.unavailable_reason()
            impls.append(name if reason is None else f"{name} (unavailable here)")
        print(spec.name)
        print(f"  implementations: {', '.join(impls)}")
        for output, policy in spec.outputs.items():
            print(f"  output {output}: {policy}")
        if spec.backward is not None:
            print(f"  backward: {', '.join(spec.backward.impls) or 'oracle only'}")
            for grad, policy in spec.backward.grads.items():
                print(f"  gradient {grad}: {policy}")
    return 0


def pytest_command(args: argparse.Namespace) -> list[str]:
    # --opt=value in one word: pytest takes a bare existing path among its arguments for a test path.
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "tkverify.suite", "-p", "no:cacheprovider",
           f"--tk-impl={args.impl}", f"--tk-report={args.out}"]
    if args.profile:
        cmd.append(f"--tk-profile={args.profile}")
    cmd += [f"--tk-load={m}" for m in args.load]
    if args.workers:
        cmd += ["-n", str(args.workers)]
    if args.k:
        cmd += ["-k", args.k]
    return cmd + ["-q", *args.pytest_args]


def cmd_report(args: argparse.Namespace) -> int:
    cmd = pytest_command(args)
    print("$ " + " ".join(cmd), flush=True)
    rc = subprocess.call(cmd)
    md = Path(args.out) / "report.md"
    if md.is_file():
        print(f"report: {md} (and report.json, report.html)")
    # pytest's 1 means some verdict failed: the report is still written and is the product.
    return rc


def cmd_replay(args: argparse.Namespace) -> int:
    from tkverify.case import CaseFileError, load_case
    from tkverify.check import VerificationError, check_case

    try:
        case, meta = load_case(args.path)
    except CaseFileError as e:
        print(f"tkverify replay: {e}", file=sys.stderr)
        return 2
    registry.load_plugins(args.load)
    try:
        spec = registry.get(meta["op"])
    except KeyError as e:
        print(f"tkverify replay: {args.path}: {e.args[0]}", file=sys.stderr)
        return 2
    misfit = _misfit(spec, case)
    if misfit:
        print(f"tkverify replay: {args.path}: {misfit}", file=sys.stderr)
        return 2
    impl_name = args.impl or meta["impl"]
    if "gradient" in meta and impl_name == "oracle":  # the gradcheck of the float64 backward: no implementation
        return _replay_gradients(spec, impl_name, case, meta)
    if impl_name not in spec.impls:
        print(f"tkverify replay: {spec.name} has no implementation {impl_name!r} here "
              f"(registered: {', '.join(spec.impls)}; use --load for your own)", file=sys.stderr)
        return 2
    impl = spec.impls[impl_name]
    reason = impl.unavailable_reason()
    if reason:
        print(f"tkverify replay: {reason}", file=sys.stderr)
        return 2
    if "gradient" in meta:
        return _replay_gradients(spec, impl_name, case, meta)
    print(f"replaying {spec.name} [{impl_name}] on {case.describe()}")
    print(f"  recorded with: {meta.get('versions', {})}")
    try:
        comparisons = check_case(spec, impl, case, case_dir=None)
    except VerificationError as e:
        print(f"FAIL\n{e}")
        return 1
    for c in comparisons:
        print(f"  {c.output} ({c.fmt}, {c.policy}): {c.count} elements, {c.exact} exact, max ULP {c.max_ulp:.3g}")
    print("PASS")
    return 0


def _misfit(spec, case) -> str | None:
    """Why the case's tensors and parameters cannot be a call of the op (its oracle's signature), or None.

    Without this a case file edited or saved for another op would reach the
    implementation and come back as its failure (rc 1), not as a bad file.
    """
    both = sorted(set(case.inputs) & set(case.params))
    if both:
        return f"{', '.join(both)} is both a tensor and a parameter"
    try:
        signature = inspect.signature(spec.oracle)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to compare against
        return None
    try:
        signature.bind(**case.inputs, **case.params)
    except TypeError as e:
        return f"its tensors ({', '.join(case.inputs)}) and parameters ({', '.join(case.params)}) are not " \
               f"arguments of {spec.name}: {e}"
    return None


def _replay_gradients(spec, impl_name: str, case, meta: dict) -> int:
    """A case saved by a gradient check: run those checks again."""
    from tkverify import gradients

    print(f"replaying the gradient checks of {spec.name} [{impl_name}] on {case.describe()} "
          f"(cotangent seed {meta['gradient']['seed']})")
    print(f"  recorded with: {meta.get('versions', {})}")
    try:
        results = gradients.replay(spec, impl_name, case, meta["gradient"])
    except gradients.GradientError as e:
        print(f"FAIL\n{e}")
        return 1
    for r in results:
        if r.count == 0 and r.check != "vs_oracle":
            print(f"  {r.check} d/d{r.input}: not informative here (the step's effect is below the bound)")
            continue
        bound = "" if r.bound is None else f" (bound {r.bound:.3g})"
        print(f"  {r.check} d/d{r.input}: max error {r.error:.3g} {r.unit}{bound}")
    print("PASS")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tkverify", description="Differential testing of GPU kernels against "
                                "float64 oracles.")
    sub = p.add_subparsers(dest="command", required=True)

    def with_load(sp):
        sp.add_argument("--load", action="append", default=[], metavar="MODULE",
                        help="import MODULE first (your own registrations)")
        return sp

    with_load(sub.add_parser("list", help="every registered op, its implementations and policies")) \
        .set_defaults(func=cmd_list)

    r = with_load(sub.add_parser("report", help="run the differential suite and write the ULP report"))
    r.add_argument("--impl", default="auto", help="auto, all, torch, tilelang, tile_kernels or a comma list")
    r.add_argument("--profile", default=None, choices=("ci", "dev", "fuzz"))
    r.add_argument("--out", default="tkverify-report", type=Path, help="output folder (default tkverify-report)")
    r.add_argument("-n", dest="workers", default=None, help="pytest-xdist workers (e.g. 8 or auto)")
    r.add_argument("-k", default=None, help="pytest -k expression to select ops")
    r.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    r.set_defaults(func=cmd_report)

    rp = with_load(sub.add_parser("replay", help="re-run a saved failing case and print the verdict"))
    rp.add_argument("path", help="the case file (.json; its .npz lies beside it)")
    rp.add_argument("--impl", default=None, help="run another implementation than the recorded one")
    rp.set_defaults(func=cmd_replay)

    # Mutation testing (tkverify/mutants): the options live beside the runner.
    from tkverify import mutants
    mutants.configure_parser(with_load(sub.add_parser(
        "mutants", help="run the catalogue of deliberately broken implementations; exit 1 if any is missed"))) \
        .set_defaults(func=mutants.main)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
