"""Call each benchmark shape's tilelang implementation, for Nsight Compute to count (`scripts/gpu-run.sh --steps ncu`).

    python scripts/dram_counters.py -k OPS --list     # index and counters file of each shape
    ncu ... python scripts/dram_counters.py -k OPS --entry I > <its counters file>   # one shape a process

For each op with benchmark shapes (the registry's `BenchShape`s; -k picks ops by substring), the
tilelang implementation is called twice (the first call compiles or loads; tkverify.ncu keeps the
second).  Without --entry, a 2 GiB device-to-device copy and a 2 GiB fill are made first, the
references the bench divides by (copy bandwidth, write-only rate).  What the counters say bounds
each shape: tkverify/ncu.py.
"""

from __future__ import annotations

import argparse

import torch

from tkverify import bench, ncu, registry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default="", help="comma list of op-name substrings (default: every op)")
    parser.add_argument("--entry", type=int, help="only the selection's entry of this index (one ncu process a shape)")
    parser.add_argument("--list", action="store_true",
                        help="print each selected entry's index and counters file name (tkverify.ncu), run nothing")
    args = parser.parse_args()
    entries = bench.select(registry.all_specs(), args.k)  # the bench's shapes, forward then backward
    if args.list:
        for i, entry in enumerate(entries):
            if "tilelang" in entry.impls:
                print(i, ncu.counters_file(entry.label, entry.shape.name))
        return
    device = torch.device("cuda")
    # random bytes, as a kernel's data would be (2^31 of them: torch runs the fill as two launches of 1 GiB,
    # and the copy through cudaMemcpyAsync, which ncu does not list as a kernel)
    if args.entry is None:  # the references once, in the run over every shape
        src = torch.randint(0, 256, (2 * 2**30,), dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        dst.copy_(src)  # the reference: what the bench's copy bandwidth measures
        dst.view(torch.float32).fill_(1.0)  # and its write-only rate (bench.write_bandwidth)
        del src, dst
    for i, entry in enumerate(entries):
        if args.entry is not None and i != args.entry:
            continue
        impl = entry.impls.get("tilelang")
        if impl is None or impl.unavailable_reason():
            continue
        inputs, params = entry.shape.make(device)
        fn = impl.function()
        # the op's own launches inside an NVTX range, so that ncu can leave out the inputs' making
        # (ncu --nvtx --nvtx-include "tkverify-op/")
        torch.cuda.nvtx.range_push("tkverify-op")
        for _ in range(2):
            fn(**inputs, **params)
        torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
        print(f"# {entry.label} [{entry.shape.name}]: spec bytes {entry.shape.nbytes(inputs, params)}"
              + (f", written {entry.shape.written(inputs, params)}" if entry.shape.written else ""), flush=True)
        del inputs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
