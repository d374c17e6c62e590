"""What bounds a kernel that misses its bandwidth target: its DRAM traffic and throughput from Nsight Compute.

    ncu --csv --metrics <METRICS below> --kernel-name regex:'<KERNELS>' \
        python scripts/dram_counters.py [-k OPS] > counters.csv

For each op with benchmark shapes (the registry's `BenchShape`s; -k picks ops by substring),
the tilelang implementation is called twice (the first call compiles or loads; ncu counts
both), and a 2 GiB device-to-device copy is made once as the reference the bench divides by.
The counters say, per kernel launch: the bytes DRAM really moved (read and written; against
the bytes the spec counts), the DRAM throughput as a share of its sustained peak, and the
SMs' own throughput share: a kernel whose DRAM share is near the copy's is bound by DRAM, one
whose DRAM share is low with a high SM share by its instructions, one low on both by latency.
"""

from __future__ import annotations

import argparse

import torch

from tkverify import registry

METRICS = ",".join((
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "launch__registers_per_thread",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default="", help="comma list of op-name substrings (default: every op)")
    args = parser.parse_args()
    words = [w for w in args.k.split(",") if w]
    device = torch.device("cuda")
    nbytes = 2 * 2**30
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    torch.empty_like(src).copy_(src)  # the reference: what the bench's copy bandwidth measures
    del src
    for spec in registry.all_specs():
        if words and not any(w in spec.name for w in words):
            continue
        parts = [("forward", spec.bench, spec.impls)]
        if spec.backward is not None:
            parts.append(("backward", spec.backward.bench, spec.backward.impls))
        for part, shapes, impls in parts:
            impl = impls.get("tilelang")
            if impl is None or impl.unavailable_reason():
                continue
            for shape in shapes:
                inputs, params = shape.make(device)
                fn = impl.function()
                for _ in range(2):
                    fn(**inputs, **params)
                torch.cuda.synchronize()
                print(f"# {spec.name} {part} [{shape.name}]: spec bytes {shape.nbytes(inputs, params)}"
                      + (f", written {shape.written(inputs, params)}" if shape.written else ""), flush=True)
                del inputs
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
