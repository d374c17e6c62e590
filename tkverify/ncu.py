"""What bounds a kernel, from Nsight Compute's counters: the measured reason behind a missed bench target.

`scripts/gpu-run.sh --steps ncu` profiles each benchmark shape in a process of its own (`ncu --csv --page raw`
over `scripts/dram_counters.py --entry N`) and writes the CSV under the name `counters_file` gives;
`tkverify bench --ncu DIR` reads them back and adds to each profiled row a note of what its launches
show.  The verdict is one of three, from shares of peak over the op's launches (time-weighted):

- DRAM: the DRAM throughput share is at least DRAM_BOUND (torch's elementwise copies reach 88-92% on the
  H200: reports/evidence/framework.md#ncu-verdict);
- instructions: otherwise, the SMs issue an instruction on at least ISSUE_BOUND of their cycles;
- latency: neither, so warps mostly wait (the largest stall reasons say on what).

Plain Python (csv, gzip): the CSVs can be read on a machine without CUDA.
"""

from __future__ import annotations

import csv
import gzip
import io
import re
from pathlib import Path
from typing import Any

DRAM_BOUND = 85.0  # % of peak DRAM throughput
ISSUE_BOUND = 60.0  # % of cycles with an instruction issued

TIME = "gpu__time_duration.sum"
METRICS = {  # what a summary keeps, by the metric it reads
    "dram_pct": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "issue_pct": "sm__issue_active.avg.pct_of_peak_sustained_elapsed",
    "occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "registers": "launch__registers_per_thread",
}
STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio")


def counters_file(label: str, shape: str) -> str:
    """The file name of one benchmark shape's counters (a bench row's op label and shape name)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", f"{label}__{shape}").strip("_") + ".csv.gz"


def launches(text: str) -> list[dict[str, str]]:
    """One dict a kernel launch of ncu's raw CSV (a header, a units row, then a row a launch); lines
    that do not start with a quote (the profiled program's own output) are dropped."""
    rows = list(csv.reader(io.StringIO("\n".join(l for l in text.splitlines() if l.startswith('"')))))
    return [dict(zip(rows[0], r)) for r in rows[2:]] if rows else []


def read(path: Path) -> list[dict[str, str]]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return launches(f.read())


def number(launch: dict[str, str], metric: str) -> float | None:
    try:
        return float(launch.get(metric, "").replace(",", ""))
    except ValueError:
        return None


def is_torch(launch: dict[str, str]) -> bool:
    """torch's own kernels (the inputs' random fill, the references): not the op's."""
    return "at::" in launch.get("Kernel Name", "")


def summarize(rows: list[dict[str, str]]) -> dict[str, Any] | None:
    """The op's launches (torch's left out; of the last of its calls when the file holds several, each
    launching the same kernels): time, DRAM bytes, time-weighted shares, registers, the largest stalls."""
    ops = [r for r in rows if not is_torch(r) and number(r, TIME)]
    if not ops:
        return None
    names = [r.get("Kernel Name") for r in ops]
    n = len(ops) // 2  # dram_counters.py calls an op twice: keep the second call's launches
    if n and len(ops) == 2 * n and names[:n] == names[n:]:
        ops = ops[n:]
    times = [number(r, TIME) for r in ops]
    total = sum(times)

    def weighted(metric: str) -> float | None:
        values = [(number(r, metric), t) for r, t in zip(ops, times)]
        if any(v is None for v, _ in values):
            return None
        return sum(v * t for v, t in values) / total

    longest = ops[times.index(max(times))]
    stalls = sorted(((number(longest, m), STALL.fullmatch(m).group(1)) for m in longest
                     if STALL.fullmatch(m) and number(longest, m)), reverse=True)
    moved = sum((number(r, "dram__bytes_read.sum") or 0.0) + (number(r, "dram__bytes_write.sum") or 0.0) for r in ops)
    return {"launches": len(ops), "time_us": total / 1e3, "dram_TBps": moved / total / 1e3,
            **{k: weighted(m) for k, m in METRICS.items() if k != "registers"},
            "registers": number(longest, METRICS["registers"]), "stalls": [(n, v) for v, n in stalls[:3]]}


def bound(summary: dict[str, Any]) -> str:
    """DRAM, instructions or latency (see the module's docstring)."""
    if (summary.get("dram_pct") or 0.0) >= DRAM_BOUND:
        return "DRAM"
    if (summary.get("issue_pct") or 0.0) >= ISSUE_BOUND:
        return "instructions"
    return "latency"


def note(summary: dict[str, Any]) -> str:
    """The bench note: the verdict and the figures it rests on."""
    def pct(key: str) -> str:
        return "-" if summary.get(key) is None else f"{summary[key]:.0f}%"

    stalls = ", ".join(f"{n} {v:.1f}" for n, v in summary["stalls"])
    return (f"ncu: bound by {bound(summary)} (DRAM {summary['dram_TBps']:.2f} TB/s, {pct('dram_pct')} of peak; "
            f"issue {pct('issue_pct')}; occupancy {pct('occupancy_pct')}, {summary['registers']:.0f} registers; "
            f"largest stalls {stalls})")
