"""One line per kernel launch of a Nsight Compute raw CSV (`scripts/gpu-run.sh --steps ncu`'s ncu/*.csv.gz): what bounds it.

    python scripts/ncu_table.py results/ncu/engram.gate__T4096_hc4_H4096_bf16.csv.gz [--min-us 5] > ncu-summary.txt

Columns: time (us), DRAM bytes read and written (MB), their rate (TB/s), then shares of peak
(percent, over the launch): instructions issued, ALU, FMA, LSU pipe, XU (transcendentals), L1, L2,
DRAM throughput; registers a thread, achieved occupancy (warps), SM clock (GHz); and the three
largest warp stall reasons (average warps stalled for each issued instruction).  A launch with
DRAM near the copy's share is DRAM-bound; one with a high issue share and `not_selected` /
`math_pipe_throttle` stalls is bound by its instructions; one low on both, by latency.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tkverify import ncu  # noqa: E402

SHARES = (  # (column, metric)
    ("issue", "sm__issue_active.avg.pct_of_peak_sustained_elapsed"),
    ("alu", "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_elapsed"),
    ("fma", "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_elapsed"),
    ("lsu", "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_elapsed"),
    ("xu", "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_elapsed"),
    ("l1", "l1tex__throughput.avg.pct_of_peak_sustained_active"),
    ("l2", "lts__throughput.avg.pct_of_peak_sustained_elapsed"),
    ("dram", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"),
)


def number(row: dict[str, str], metric: str) -> float:
    value = ncu.number(row, metric)
    return math.nan if value is None else value


def line(row: dict[str, str]) -> str:
    name = re.sub(r"[<(].*", "", re.sub(r"^void ", "", row["Kernel Name"]))[-34:]
    us = number(row, "gpu__time_duration.sum") / 1e3
    read, written = number(row, "dram__bytes_read.sum") / 1e6, number(row, "dram__bytes_write.sum") / 1e6
    stalls = sorted(((number(row, m), ncu.STALL.fullmatch(m).group(1)) for m in row if ncu.STALL.fullmatch(m)), reverse=True)
    return (f"{name:34s} {us:8.1f} {read:8.1f} {written:8.1f} {(read + written) / us:5.2f} "
            + " ".join(f"{number(row, m):5.1f}" for _, m in SHARES)
            + f" {number(row, 'launch__registers_per_thread'):4.0f}"
            + f" {number(row, 'sm__warps_active.avg.pct_of_peak_sustained_active'):4.0f}"
            + f" {number(row, 'gpc__cycles_elapsed.avg.per_second') / 1e9:4.2f}  "
            + " ".join(f"{n} {v:.1f}" for v, n in stalls[:3]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", help="ncu --csv --page raw output, plain or gzipped")
    parser.add_argument("--min-us", type=float, default=5.0, help="leave out launches shorter than this")
    args = parser.parse_args()
    print(f"{'kernel':34s} {'us':>8s} {'MB read':>8s} {'MB writ':>8s} {'TB/s':>5s} "
          + " ".join(f"{c:>5s}" for c, _ in SHARES) + " regs  occ  GHz  largest stalls")
    for row in ncu.read(Path(args.csv)):
        if number(row, "gpu__time_duration.sum") / 1e3 >= args.min_us:
            print(line(row))


if __name__ == "__main__":
    main()
