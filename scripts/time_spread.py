"""How the bench's per-rep times spread, and whether the way L2 is flushed before a rep moves them.

    python scripts/time_spread.py [--reps 60] [--sleep-ms 2] [OP ...]

H200 runs 47-49 timed expand_to_fused at 601 to 660 us (graph replay) with the same kernels, and one
process's reps were bimodal: most near 600 us, some near 663 (reduce_fused: 488 and 534), after the bench
flushed L2 by writing 256 MiB.  For each op named (default: expand_to_fused, reduce_fused, and two ops whose
inputs fit in L2) at its bench shape, replayed from a CUDA graph, and for a 2 GiB copy, this prints the
spread of `--reps` CUDA-event times under five ways to start a rep: flushing L2 by writing (the bench
before 2026-11-30), by reading (the bench since), either followed by a `--sleep-ms` GPU sleep (time for
write-backs to drain, and for the host to queue the replay before the GPU reaches the start event), and no
flush; and how long the host takes to launch a replay.  An op whose inputs fit in L2 shows whether a way
of flushing evicts them.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from tkverify import bench, registry

DEFAULT_OPS = ("moe.expand_to_fused", "moe.reduce_fused", "moe.topk_gate", "moe.normalize_weight")


def spread(times: list[float]) -> str:
    q = statistics.quantiles(times, n=10)
    return (f"min {min(times):7.1f}  p10 {q[0]:7.1f}  median {statistics.median(times):7.1f}  "
            f"p90 {q[-1]:7.1f}  max {max(times):7.1f} us")


def calls(names, device):
    """(label, call, bytes moved) of each op's tilelang implementation at its first bench shape, and a copy."""
    for name in names:
        spec = registry.get(name)
        shape = spec.bench[0]
        inputs, params = shape.make(device)
        fn = spec.impls["tilelang"].function()
        yield name, (lambda fn=fn, i=inputs, p=params: fn(**i, **p)), shape.nbytes(inputs, params)
    src = torch.empty(2 * 2**30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    yield "copy 2 GiB", (lambda: dst.copy_(src)), 2 * src.numel()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=60)
    p.add_argument("--sleep-ms", type=float, default=2.0)
    p.add_argument("ops", nargs="*", default=DEFAULT_OPS)
    args = p.parse_args()
    registry.load_plugins()
    device = torch.device("cuda")
    written = torch.empty(bench.L2_FLUSH_BYTES, dtype=torch.uint8, device=device)
    cycles = int(args.sleep_ms * 1.98e6)  # the H200's SM clock under load, 1980 MHz
    starts = {
        "flush by writing": written.zero_,
        "flush by reading (the bench)": (read := bench.l2_flusher()),
        f"flush by writing, {args.sleep_ms} ms sleep": lambda: (written.zero_(), torch.cuda._sleep(cycles)),
        f"flush by reading, {args.sleep_ms} ms sleep": lambda: (read(), torch.cuda._sleep(cycles)),
        "no flush": lambda: None,
    }
    for name, fn, nbytes in calls(args.ops, device):
        graph = bench.capture_graph(fn)
        host = []  # microseconds each replay() call took to return to the host (its launch)

        def replay():
            t = time.perf_counter()
            graph.replay()
            host.append((time.perf_counter() - t) * 1e6)

        for start_name, before in starts.items():
            host.clear()
            times = [t * 1e6 for t in bench.rep_times_s(replay, before=before, warmup=3, reps=args.reps)]
            launches = host[-args.reps:]  # the timed reps', not the warm-up's
            rate = nbytes / statistics.median(times) / 1e6
            print(f"{name:22s} {start_name:34s} {spread(times)}  at the median {rate:.3f} TB/s; "
                  f"replay() returns in {statistics.median(launches):.1f} us (max {max(launches):.1f})",
                  flush=True)
        del graph
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
