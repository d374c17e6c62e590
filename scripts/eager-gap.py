#!/usr/bin/env python
# Where an eager call's time above its graph replay goes, per bench shape (a CUDA machine).
#
# The bench judges eager calls (tkverify.bench): CUDA events around the call, after an L2 flush queued ahead
# of it.  The flush (a 256 MiB read, about 60 us on an H200) hides that much of the call's host work before its
# first launch; host work beyond it, host work between the launches of a multi-kernel call, and device work
# that only the eager call does all show up as "eager above graph".  Four figures tell them apart:
#
#   host      the call's own host time (perf_counter around it) while the device is held busy by a spin
#             kernel, so that no launch waits for the queue: the wrapper's Python plus TileLang's launch path
#   device    CUDA events around the eager call queued behind that spin: the host work is hidden entirely,
#             so this is the device time of exactly what the eager call launches
#   eager     as the bench times it (L2 flushed before, host work exposed where the flush does not hide it)
#   graph     the call replayed from a CUDA graph (no host work), L2 flushed before
#
# eager - device is exposed host time; device - graph is device work the eager call adds (or a different L2
# state); kernels counts the device kernels one eager call launches and one replay runs (torch.profiler).
#
#   source .gpu/setup.sh && python3 scripts/eager-gap.py [-k OPS] [--impl tilelang] [--reps 30] [--out FILE]

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tkverify import bench, registry  # noqa: E402

SPIN_CYCLES = 2_000_000  # about 1 ms at the H200's clock: longer than any call's host work


def host_us(call, reps: int) -> float:
    """Median host microseconds of `call()` submitted while a spin kernel keeps the device busy."""
    times = []
    for _ in range(reps):
        torch.cuda._sleep(SPIN_CYCLES)
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
        torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def device_us(call, reps: int, flush) -> float:
    """Median event microseconds of `call()` queued behind a flush and a spin: its host work fully hidden."""
    def flush_then_spin():
        flush()
        torch.cuda._sleep(SPIN_CYCLES)

    return statistics.median(bench.rep_times_s(call, before=flush_then_spin, reps=reps)) * 1e6


def kernels_launched(call) -> tuple[int, list[str]]:
    """The device kernels one `call()` runs, counted by torch.profiler (names shortened)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
             and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
    return len(names), [n[:40] for n in names]


def measure(entry: bench.Entry, impl_name: str, reps: int, flush) -> dict | None:
    impl = entry.impls.get(impl_name)
    if impl is None or impl.unavailable_reason():
        return None
    inputs, params = entry.shape.make(torch.device("cuda"))
    fn = impl.function()
    call = lambda: fn(**inputs, **params)  # noqa: E731
    for _ in range(5):
        call()
    torch.cuda.synchronize()
    graph = bench.capture_graph(call)
    row = {
        "op": entry.label, "shape": entry.shape.name,
        "host": host_us(call, reps),
        "device": device_us(call, reps, flush),
        "eager": statistics.median(bench.rep_times_s(call, before=flush, reps=reps)) * 1e6,
        "graph": statistics.median(bench.rep_times_s(graph.replay, before=flush, reps=reps)) * 1e6,
    }
    row["kernels"], row["names"] = kernels_launched(call)
    row["graph_kernels"], _ = kernels_launched(graph.replay)
    return row


def markdown(rows: list[dict], impl: str) -> str:
    lines = ["| op | shape | host us | device us | eager us | graph us | eager - device | device - graph | "
             "kernels (eager / replay) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['op']} | {r['shape']} | {r['host']:.1f} | {r['device']:.1f} | {r['eager']:.1f} | "
                     f"{r['graph']:.1f} | {r['eager'] - r['device']:+.1f} | {r['device'] - r['graph']:+.1f} | "
                     f"{r['kernels']} / {r['graph_kernels']} |")
    return f"Implementation: {impl}; medians of the reps.\n\n" + "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description="where eager time above graph replay goes")
    parser.add_argument("-k", default=None, help="comma list of op-name substrings (default: every op)")
    parser.add_argument("--impl", default="tilelang")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("eager-gap.py needs CUDA", file=sys.stderr)
        return 2
    flush = bench.l2_flusher()
    rows = []
    for entry in bench.select(registry.all_specs(), args.k):
        try:
            row = measure(entry, args.impl, args.reps, flush)
        except Exception as e:  # noqa: BLE001 - one shape's failure is printed, the rest still run
            print(f"{entry.label} [{entry.shape.name}]: {type(e).__name__}: {e}"[:300], flush=True)
            continue
        torch.cuda.empty_cache()
        if row is not None:
            rows.append(row)
            print(f"{row['op']} [{row['shape']}]: host {row['host']:.1f}, device {row['device']:.1f}, eager "
                  f"{row['eager']:.1f}, graph {row['graph']:.1f} us; kernels {row['kernels']} {row['names'][:4]}",
                  flush=True)
    text = markdown(rows, args.impl)
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
