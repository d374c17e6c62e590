"""Where an implementation's host time goes: cProfile of repeated calls on a CUDA device.

    python scripts/profile_host.py [-k OPS] [--impl tilelang] [--calls 200] > profile.txt

For every op with benchmark shapes (the registry's `BenchShape`s), one shape
each: the wall time per call when calls are issued back to back (the host
cost when the GPU keeps up), the device time from a CUDA graph for contrast,
and the functions with the most own time.  The difference between a call's
host time and its kernel time is what users pay in eager mode.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch

from tkverify import registry


def host_us_per_call(fn, calls: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    return 1e6 * host / calls


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("-k", default="")
    p.add_argument("--impl", default="tilelang")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--top", type=int, default=18)
    args = p.parse_args()
    device = torch.device("cuda")
    for spec in registry.all_specs():
        if not spec.bench or args.impl not in spec.impls or not any(k in spec.name for k in args.k.split(",")):
            continue
        impl = spec.impls[args.impl]
        if impl.unavailable_reason():
            continue
        shape = spec.bench[0]
        inputs, params = shape.make(device)
        fn = impl.function()

        def call():
            return fn(**inputs, **params)

        call()
        torch.cuda.synchronize()
        host = host_us_per_call(call, args.calls)
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.calls):
            call()
        profiler.disable()
        torch.cuda.synchronize()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.top)
        print(f"===== {spec.name} [{shape.name}] {args.impl}: {host:.1f} us of host time per call "
              f"(calls back to back, {args.calls} calls)")
        print("\n".join(out.getvalue().splitlines()[4:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
