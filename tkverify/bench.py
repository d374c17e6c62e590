"""Timing on a CUDA device: median kernel time from CUDA events, and the copy roofline.

Effective bandwidth is the bytes an op must read and write, each counted once,
over the median time; the device-to-device copy measured in the same process
is the ceiling it is compared against.
"""

from __future__ import annotations

import statistics
from typing import Callable

import torch

_L2_FLUSH_BYTES = 256 * 2**20  # larger than the H200's 60 MB L2


def median_time_s(fn: Callable[[], object], *, warmup: int = 5, reps: int = 30, flush_l2: bool = True) -> float:
    """Median seconds of `fn()` over `reps` runs, each timed by CUDA events, L2 flushed between."""
    flush = torch.empty(_L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda") if flush_l2 else None
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if flush is not None:
            flush.zero_()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    return statistics.median(times)


def copy_bandwidth(nbytes: int = 2 * 2**30) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = median_time_s(lambda: dst.copy_(src), flush_l2=False)
    return 2 * nbytes / t


def write_bandwidth(nbytes: int = 2 * 2**30) -> float:
    """Write-only bandwidth in bytes/s (a fill): the ceiling of ops that write far more than they read."""
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    return nbytes / median_time_s(lambda: dst.fill_(1), flush_l2=False)
