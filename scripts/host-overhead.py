#!/usr/bin/env python
# The host time of each TileLang wrapper's own Python, per call, with its launches stubbed.
#
# An eager call of one of our ops costs its wrapper's Python (argument checks, output allocation, the
# dispatch to a configuration, the compiled-kernel lookup) plus TileLang's launch path (the packed call,
# tensor conversion) plus the kernel.  Under `tkverify.dry_run.stubbed_launches` the launch path and the
# kernel cost nothing, so what is timed here is the wrapper's part alone; beside an H200 bench's eager-minus-
# graph figures it says how much of the overhead is ours to remove.  Each op's (and backward's) first bench
# shape is cut to a few tokens (its `pilot`, else `production.shrink`): the wrapper's Python does not grow
# with the tokens, and the CPU tensors' own work (allocation, copies) would otherwise swamp it.  The figure is
# the median of --calls calls after one warm call, torch on one thread.
#
# Call it from the repository root (CPU or GPU machine; nothing is launched):
#   .venv/bin/python scripts/host-overhead.py [--calls 200] [--out reports/cpu/host-overhead.md]

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tkverify import registry  # noqa: E402
from tkverify.case import versions  # noqa: E402
from tkverify.dry_run import stubbed_launches  # noqa: E402
from tkverify.sweep.production import shrink  # noqa: E402

CUT = 1 / 8192  # of the bench shape's tokens: 2 of 16384
LARGEST = 1 << 20  # elements an input may keep after the cut: beyond it the CPU tensors' own work is timed


def small_inputs(shape) -> tuple[dict, dict]:
    """The bench shape's inputs with a few tokens, on the CPU."""
    if shape.pilot is not None:
        return shape.pilot(torch.device("cpu"), CUT)
    inputs, params = shape.make(torch.device("cpu"))
    return shrink(inputs, CUT, shape.token_axis), params


def median_us(fn, kwargs: dict, calls: int) -> float:
    fn(**kwargs)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn(**kwargs)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def measure(calls: int) -> list[tuple[str, str, str]]:
    """(op, shape, figure) of every TileLang wrapper with a bench shape; the figure or why there is none."""
    rows = []
    for spec in registry.all_specs():
        parts = [(spec.name, spec.impls, spec.bench)]
        if spec.backward is not None:
            parts.append((f"{spec.name} (backward)", spec.backward.impls, spec.backward.bench))
        for label, impls, bench in parts:
            if "tilelang" not in impls or not bench:
                continue
            try:
                inputs, params = small_inputs(bench[0])
                largest = max((v.numel() for v in inputs.values() if isinstance(v, torch.Tensor)), default=0)
                if largest > LARGEST:
                    raise ValueError(f"the cut leaves an input of {largest} elements")
                with stubbed_launches():
                    figure = f"{median_us(impls['tilelang'].function(), {**inputs, **params}, calls):.1f}"
            except Exception as e:  # noqa: BLE001 - a shape that does not cut: named, not timed
                figure = f"not timed: the cut shape fails ({type(e).__name__}: {str(e)[:80]})"
            rows.append((label, bench[0].name, figure))
            print(f"{label}: {figure}", flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = measure(args.calls)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [
        "# Host time of each TileLang wrapper's own Python (launches stubbed)",
        "",
        f"`.venv/bin/python scripts/host-overhead.py --calls {args.calls}` on {platform.node() or 'this machine'} "
        f"({platform.processor() or platform.machine()}, {torch.get_num_threads()} torch thread), "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {commit}; "
        + ", ".join(f"{k} {v}" for k, v in sorted(versions().items())) + ".",
        "",
        "Median microseconds per call of the wrapper with `tkverify.dry_run.stubbed_launches` (no TileLang launch, "
        "no kernel), on the op's first bench shape cut to a few tokens (scripts/host-overhead.py says why).",
        "",
        "| op | bench shape (cut) | us per call |",
        "|---|---|---|",
    ]
    lines += [f"| {op} | {shape} | {figure} |" for op, shape, figure in sorted(rows, key=_slowest_first)]
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    else:
        print(text)
    return 0


def _slowest_first(row: tuple[str, str, str]) -> tuple[float, str]:
    try:
        return (-float(row[2]), row[0])
    except ValueError:
        return (0.0, row[0])


if __name__ == "__main__":
    raise SystemExit(main())
