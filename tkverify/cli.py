"""The `tkverify` command: list, report, replay, shards, bench, diff, claims, mutants."""

from __future__ import annotations

import argparse
import inspect
import json
import subprocess
import sys
from pathlib import Path

from tkverify import profiles, registry
from tkverify.check import cuda_context_lost


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


def default_workers() -> int | None:
    """`tkverify report`'s pytest-xdist workers when -n is not given: one a host core but one (the controller's)
    where a CUDA device is present and pytest-xdist is installed, else None (one process).  On a GPU machine
    the suite's time is host time (the float64 oracles, tile-kernels' JIT compiles), which the host's cores
    share; on a CPU machine the implementations' own torch threads already use them."""
    import importlib.util
    import os

    import torch

    if not torch.cuda.is_available() or importlib.util.find_spec("xdist") is None:
        return None
    return max(1, (os.cpu_count() or 2) - 1)


def pytest_command(args: argparse.Namespace) -> list[str]:
    # --opt=value in one word: pytest takes a bare existing path among its arguments for a test path.
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "tkverify.suite", "-p", "no:cacheprovider",
           f"--tk-impl={args.impl}", f"--tk-report={args.out}"]
    if args.profile:
        cmd.append(f"--tk-profile={args.profile}")
    cmd += [f"--tk-load={m}" for m in args.load]
    workers = args.workers if args.workers is not None else default_workers()
    if workers and str(workers) != "0":
        cmd += ["-n", str(workers)]
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


UNSUPPORTED_EXIT = 3  # replay: the implementation refused the case (the library lacks what it asks for)


_VERDICTS = {0: "PASS", 1: "FAIL", 2: "CANNOT RUN", UNSUPPORTED_EXIT: "UNSUPPORTED"}


def cmd_replay(args: argparse.Namespace) -> int:
    """Replay one case file, or several in one process (one import, one JIT cache: fast on a GPU).

    Exit status: one file, its verdict (0 pass, 1 fail, 2 cannot run, 3 unsupported);
    several, 1 if any failed, else 2 if any could not run, else 3 if any was refused, else 0.
    """
    registry.load_plugins(args.load)
    if args.resize:
        return cmd_replay_resized(args)
    if len(args.paths) == 1:
        return _replay_one(Path(args.paths[0]), args.impl)
    verdicts = []
    for i, path in enumerate(args.paths):
        print(f"=== {path}", flush=True)
        try:
            rc = _replay_one(Path(path), args.impl)
        except Exception as e:  # noqa: BLE001 - one broken case must not hide the verdicts of the others
            print(f"tkverify replay: {path}: {type(e).__name__}: {e}", file=sys.stderr)
            rc = 2
        verdicts.append((rc, path))
        print(flush=True)
        rest = args.paths[i + 1:]
        if rest and cuda_context_lost():
            # a device-side assert (or a fault) ends the CUDA context of the process: every later call would
            # raise it again, so the cases left go to a fresh process
            print(f"tkverify replay: the CUDA context was lost in {path}; the {len(rest)} cases left replay in a "
                  "fresh process", flush=True)
            verdicts.append((_replay_in_fresh_process(rest, args), f"({len(rest)} cases, fresh process: above)"))
            break
    print(f"replayed {len(args.paths)} case files" + (f" against {args.impl}" if args.impl else ""))
    for rc, path in verdicts:
        print(f"  {_VERDICTS[rc]:<11} {path}")
    codes = {rc for rc, _ in verdicts}
    return next((rc for rc in (1, 2, UNSUPPORTED_EXIT) if rc in codes), 0)


def _replay_in_fresh_process(paths: list[str], args: argparse.Namespace) -> int:
    """`tkverify replay` of `paths` in a new Python process (its output goes to ours); its exit status."""
    import subprocess

    command = [sys.executable, "-m", "tkverify.cli", "replay", *paths]
    if args.impl:
        command += ["--impl", args.impl]
    for module in args.load or []:
        command += ["--load", module]
    sys.stdout.flush()
    return subprocess.call(command)


def _replay_one(path: Path, impl_name: str | None) -> int:
    loaded = _load_for_replay(path, impl_name)
    if isinstance(loaded, int):
        return loaded
    return _replay_loaded(*loaded)


def _load_for_replay(path: Path, impl_name: str | None):
    """(spec, implementation name, case, meta) of a case file, or the exit status saying why it cannot run."""
    from tkverify.case import CaseFileError, load_case

    try:
        case, meta = load_case(path)
    except CaseFileError as e:
        print(f"tkverify replay: {e}", file=sys.stderr)
        return 2
    try:
        spec = registry.get(meta["op"])
    except KeyError as e:
        print(f"tkverify replay: {path}: {e.args[0]}", file=sys.stderr)
        return 2
    misfit = _misfit(spec, case)
    if misfit:
        print(f"tkverify replay: {path}: {misfit}", file=sys.stderr)
        return 2
    impl_name = impl_name or meta["impl"]
    if "gradient" in meta and impl_name == "oracle":  # the gradcheck of the float64 backward: no implementation
        return spec, impl_name, case, meta
    if impl_name not in spec.impls:
        print(f"tkverify replay: {spec.name} has no implementation {impl_name!r} here "
              f"(registered: {', '.join(spec.impls)}; use --load for your own)", file=sys.stderr)
        return 2
    reason = spec.impls[impl_name].unavailable_reason()
    if reason:
        print(f"tkverify replay: {reason}", file=sys.stderr)
        return 2
    return spec, impl_name, case, meta


def _replay_loaded(spec, impl_name: str, case, meta: dict) -> int:
    """Run a loaded case (its forward check, or its gradient checks) and print the verdict."""
    from tkverify.check import VerificationError, check_case

    if "gradient" in meta:
        try:
            return _replay_gradients(spec, impl_name, case, meta)
        except registry.Unsupported as e:
            print(f"UNSUPPORTED: {e.reason}")
            return UNSUPPORTED_EXIT
    try:
        print(f"replaying {spec.name} [{impl_name}] on {case.describe()}")
        print(f"  recorded with: {meta.get('versions', {})}")
        try:
            comparisons = check_case(spec, spec.impls[impl_name], case, case_dir=None, excuse=False)
        except VerificationError as e:
            print(f"FAIL\n{e}")
            _print_recorded_worst(meta, e.comparisons)
            return 1
    except registry.Unsupported as e:
        print(f"UNSUPPORTED: {e.reason}")
        return UNSUPPORTED_EXIT
    for c in comparisons:
        print(f"  {c.output} ({c.fmt}, {c.policy}): {c.count} elements, {c.exact} exact, max ULP {c.max_ulp:.3g}"
              + _worst(c.worst))
    _print_recorded_worst(meta, comparisons)
    print("PASS")
    return 0


def parse_resize(text: str) -> list[tuple[str, int]]:
    """`x:-1,comb:2,comb:3` -> [("x", -1), ("comb", 2), ("comb", 3)]: the tensors' dimensions --resize
    changes together."""
    axes = []
    for item in filter(None, text.split(",")):
        name, sep, dim = item.partition(":")
        try:
            axes.append((name, int(dim)))
        except ValueError:
            raise argparse.ArgumentTypeError(f"--resize takes NAME:DIM[,NAME:DIM...], got {item!r}") from None
        if not sep or not name:
            raise argparse.ArgumentTypeError(f"--resize takes NAME:DIM[,NAME:DIM...], got {item!r}")
    return axes


def _axes_text(axes: list[tuple[str, int]]) -> str:
    return ",".join(f"{name}:{dim}" for name, dim in axes)


def cmd_replay_resized(args: argparse.Namespace) -> int:
    """One case replayed at each size of --sizes along the --resize axes; a verdict table at the end.
    Exit status: 1 if any size failed, else 2 if any could not run, else 3 if any was refused, else 0."""
    if len(args.paths) != 1:
        print("tkverify replay: --resize takes one case file", file=sys.stderr)
        return 2
    loaded = _load_for_replay(Path(args.paths[0]), args.impl)
    if isinstance(loaded, int):
        return loaded
    spec, impl_name, case, meta = loaded
    verdicts = []
    for size in args.sizes:
        print(f"=== {_axes_text(args.resize)} = {size}", flush=True)
        try:
            rc = _replay_loaded(spec, impl_name, case.resized(args.resize, size), meta)
        except Exception as e:  # noqa: BLE001 - a size the harness cannot build or run: its verdict, not a crash
            print(f"tkverify replay: size {size}: {type(e).__name__}: {e}", file=sys.stderr)
            rc = 2
        verdicts.append((rc, size))
        print(flush=True)
    print(f"{spec.name} [{impl_name}] along {_axes_text(args.resize)}:")
    for rc, size in verdicts:
        print(f"  {_VERDICTS[rc]:<11} {size}")
    codes = {rc for rc, _ in verdicts}
    return next((rc for rc in (1, 2, UNSUPPORTED_EXIT) if rc in codes), 0)


def _print_recorded_worst(meta: dict, comparisons) -> None:
    """For a report row's worst case (DIR/worst/, its "worst" field): the error it was kept for, and the
    same measure (`tkverify.check.output_error`) on this replay."""
    from tkverify.check import output_error

    recorded = meta.get("worst")
    if not isinstance(recorded, dict):
        return
    replayed = [output_error(c) for c in comparisons if c.output == recorded.get("output")]
    now = f"replayed {replayed[0][1]!r}" if replayed else "not measured on this replay"
    print(f"  worst case of its report row: {recorded.get('label')} recorded {recorded.get('error')!r}, {now}")


def _worst(worst: dict | None) -> str:
    """What the implementation returned at the worst element, as the report records it."""
    if not worst:
        return ""
    index = tuple(worst.get("index", ()))
    return f"; worst at {index}: actual {worst.get('actual')}, expected {worst.get('expected')}"


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


def cmd_shards(args: argparse.Namespace) -> int:
    """What each pytest-xdist worker of a report did, and whether the merge lost nothing.

    A run cut short leaves shards (rewritten as it goes) but no report.json; --merge then writes
    the report of what it judged, marked partial."""
    from tkverify.report import merge_partial_run, shard_summary

    if not (args.report_dir / "report.json").exists():
        if not args.merge:
            print(f"tkverify shards: {args.report_dir} has no report.json: the run did not finish "
                  "(--merge writes a partial report from its shards)", file=sys.stderr)
            return 1
        paths = merge_partial_run(args.report_dir)
        partial = "partial" in json.loads(paths["json"].read_text())["meta"]
        what = ("partial report from the shards of a run that did not finish" if partial
                else "report from the final shards of finished runs")
        print(f"{what}: {paths['md']}")
    workers, union_equal = shard_summary(args.report_dir)
    for w in workers:
        touched = w["peak_bytes_per_gpu"]
        gpus = "-" if touched is None else ", ".join(f"cuda:{i} {b / 2**20:.0f} MiB" for i, b in enumerate(touched))
        print(f"{w['worker']}: pid {w['pid']} pinned to {w['gpu']}; peak memory {gpus}; "
              f"{w['examples']} judged examples in {w['rows']} rows, {w['gradients']} gradient rows")
    print(f"report.json rows {'equal' if union_equal else 'DIFFER FROM'} the union of {len(workers)} shards")
    return 0 if union_equal else 1


def cmd_bench(args: argparse.Namespace) -> int:
    import json

    from tkverify import bench

    if args.merge:
        docs = []
        for path in args.merge:
            try:
                docs.append(json.loads(Path(path).read_text()))
            except (OSError, ValueError) as e:
                print(f"tkverify bench --merge: cannot read {path}: {e}", file=sys.stderr)
                return 2
        doc = bench.merge(docs)
    else:
        import torch

        registry.load_plugins(args.load)
        entries = bench.select(registry.all_specs(), args.k)
        if not entries:
            print(f"tkverify bench: no op with benchmark shapes matches -k {args.k!r}", file=sys.stderr)
            return 2
        if not torch.cuda.is_available():
            print("tkverify bench: timing needs a CUDA device, which this machine lacks", file=sys.stderr)
            return 2
        doc = bench.run(entries, bench.wanted_impls(entries, args.impl), reps=args.reps, graphs=not args.no_graph)
    if args.ncu:
        if not args.ncu.is_dir():
            print(f"tkverify bench --ncu: {args.ncu} is not a folder", file=sys.stderr)
            return 2
        print(f"counters: {bench.attach_counters(doc, args.ncu)} rows from {args.ncu}")
    paths = bench.write(doc, args.out)
    for u in doc.get("unavailable", []):
        print(f"not run: {u['op']} [{u['shape']}] {u['impl']}: {u['reason']}")
    print(f"bench: {paths['md']} (and {paths['json'].name})")
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
    r.add_argument("--profile", default=None, choices=profiles.PROFILES)
    r.add_argument("--out", default="tkverify-report", type=Path, help="output folder (default tkverify-report)")
    r.add_argument("-n", dest="workers", default=None,
                   help="pytest-xdist workers (e.g. 8 or auto; 0: one process); default: the host's cores but one "
                        "where a CUDA device is present, else one process")
    r.add_argument("-k", default=None, help="pytest -k expression to select ops")
    r.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    r.set_defaults(func=cmd_report)

    rp = with_load(sub.add_parser("replay", help="re-run saved failing cases and print each verdict (exit 0 pass, "
                                  "1 fail, 2 cannot run, 3 unsupported by the implementation; several "
                                  "files: 1 if any failed, else 2, else 3, else 0)"))
    rp.add_argument("paths", nargs="+", metavar="path",
                    help="the case file (.json; its .npz lies beside it); several are replayed in one process")
    rp.add_argument("--impl", default=None, help="run another implementation than the recorded one")
    rp.add_argument("--resize", type=parse_resize, default=None, metavar="NAME:DIM[,NAME:DIM...]",
                    help="replay the case at each of --sizes along these tensors' dimensions (the values tiled "
                         "along them), to find where along one size a failure begins")
    rp.add_argument("--sizes", type=lambda t: [int(v) for v in t.split(",") if v], default=[],
                    help="the sizes of --resize, a comma list")
    rp.set_defaults(func=cmd_replay)

    sh = sub.add_parser("shards", help="per-worker summary of a report's shards, and a check of their merge")
    sh.add_argument("report_dir", type=Path, help="the folder given to --tk-report")
    sh.add_argument("--merge", action="store_true",
                    help="if the run did not finish (no report.json), write its report from the shards, marked partial")
    sh.set_defaults(func=cmd_shards)

    b = with_load(sub.add_parser("bench", help="time every op's benchmark shapes against the copy roofline"))
    b.add_argument("--impl", default=None, help="comma list (default: every implementation an op has; "
                   "unavailable ones are listed with the reason)")
    b.add_argument("-k", default=None, help="comma list of substrings: only ops whose name contains one")
    b.add_argument("--out", default="tkverify-bench", type=Path, help="output folder (default tkverify-bench)")
    b.add_argument("--reps", default=30, type=int, help="timed repetitions per row (default 30); each row keeps their p10, p50 and p90, "
                        "eager and graph")
    b.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph (device-only) timing")
    b.add_argument("--merge", nargs="+", metavar="JSON", help="join the bench.json of several runs instead of "
                   "timing (each run's tile_kernels rows become tile_kernels==<its version>)")
    b.add_argument("--ncu", type=Path, metavar="DIR", help="Nsight Compute counters of the shapes "
                   "(the ncu/ folder of scripts/gpu-run.sh --steps ncu): each tilelang row gets a note of what bounds it")
    b.set_defaults(func=cmd_bench)

    # Two reports or two benches compared (tkverify/diff.py): the options live beside the comparison.
    from tkverify import diff
    diff.configure_parser(sub.add_parser(
        "diff", help="regressions, improvements, new and vanished rows between two report.json or two bench.json "
        "files (exit 1 on a regression, 2 on bad input)")).set_defaults(func=diff.main)

    # Exhaustive sweeps and production shapes (tkverify/sweep): the options live beside the runner.
    from tkverify import sweep
    sweep.add_parser(sub)

    # Accuracy claims per implementation (tkverify/claims.py): the options live beside the claims.
    from tkverify import claims
    claims.configure_parser(sub.add_parser(
        "claims", help="write (--update) or check (--check) each implementation's accuracy claims "
        "(claims/<impl>.toml) against a report (exit 1 on a row beyond its claim, 2 on bad input)")) \
        .set_defaults(func=claims.main)

    # Kernel-path reach measured without a GPU (tkverify/dry_run.py): the options live beside it.
    from tkverify import dry_run
    dry_run.configure_parser(with_load(sub.add_parser(
        "coverage", help="the shipped TileLang configurations and boundary classes the examples reach, measured "
        "on the CPU with the launches stubbed (exit 1 on a gap)"))).set_defaults(func=dry_run.main)

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
