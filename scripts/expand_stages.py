"""Where expand_to_fused's time goes: each kernel's device time, for the row kernel and its candidates.

    python scripts/expand_stages.py [--calls 20] [CONFIG ...]

At the bench's inputs (tkverify.specs.moe: T 16384, K 8, H 7168 bf16, DeepSeek-V3 routing aligned to
128 rows), every configuration of the 16-byte row kernel named (default: the shipped one and every
tuning candidate of the gather) is put in place through EXPAND_OVERRIDES and called `--calls` times
under torch.profiler; each CUDA kernel's mean device time is printed, with the bytes the bench counts
over the sum of the kernels (what the op would reach with no gaps between its launches).
A CONFIG is written as the ExpandConfig fields, e.g. gather,16,128,7,1,8.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from kernels import moe
from tkverify.specs import moe as moe_spec


def parse_config(text: str) -> moe.ExpandConfig:
    """stage,width[,threads,units,streaming,pad_rows]: ExpandConfig's fields in order, numbers for the rest."""
    stage, *numbers = text.split(",")
    config = moe.ExpandConfig(stage, *map(int, numbers))
    return config._replace(streaming=bool(config.streaming))


def kernel_times(fn, calls: int) -> dict[str, float]:
    """Mean device microseconds per call of each CUDA kernel fn launches."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            total[event.name] += event.device_time
    return {name: us / calls for name, us in total.items()}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("configs", nargs="*", type=parse_config)
    args = p.parse_args()
    configs = args.configs or [moe.expand_rows_config(16)] + [c for c in moe.EXPAND_TUNE_CONFIGS
                                                               if c.stage == "gather"]
    (shape,) = moe_spec.BENCH["moe.expand_to_fused"]
    inputs, params = shape.make(torch.device("cuda"))
    nbytes = shape.nbytes(inputs, params)
    base = moe.ExpandConfig("rows", 16)
    for config in configs:
        moe.EXPAND_OVERRIDES[base] = config
        times = kernel_times(lambda: moe.expand_to_fused(**inputs, **params), args.calls)
        kernels = sum(times.values())
        print(f"{config}: kernels {kernels:.1f} us, {nbytes / kernels / 1e6:.3f} TB/s")
        for name, us in sorted(times.items(), key=lambda item: -item[1]):
            print(f"    {us:9.1f} us  {name[:100]}")
    moe.EXPAND_OVERRIDES.pop(base, None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
