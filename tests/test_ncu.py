"""tkverify.ncu: what an op's Nsight Compute counters say bounds it, and the bench note made of it."""

from __future__ import annotations

import csv
import gzip
import io
from pathlib import Path

import pytest

from tkverify import bench, ncu

# Nsight Compute's raw page of an H200 probe of engram.gate, its backward, expand_to_fused and cast_back
# at their bench shapes (tests/data/README.md says where it was measured).
PROBE = Path(__file__).resolve().parent / "data" / "ncu" / "engram-expand-cast_back.csv.gz"
STALLED = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"


def _launch(name, ns, dram=50.0, issue=30.0, read=1e6, written=1e6, **stalls):
    row = {"Kernel Name": name, ncu.TIME: f"{ns:,.0f}", ncu.METRICS["dram_pct"]: dram, ncu.METRICS["issue_pct"]: issue,
           ncu.METRICS["occupancy_pct"]: 50.0, ncu.METRICS["registers"]: 40, "dram__bytes_read.sum": read,
           "dram__bytes_write.sum": written}
    row.update({STALLED.format(k): v for k, v in stalls.items()})
    return row


def _csv(launches) -> str:
    """ncu's raw page as it prints it: the program's own lines, a header, a units row, a row a launch."""
    keys = sorted({k for launch in launches for k in launch})
    out = io.StringIO()
    out.write("# engram.gate [T4096]: spec bytes 1\n==PROF== Connected to process 1\n")
    w = csv.writer(out, quoting=csv.QUOTE_ALL)
    w.writerows([keys, ["" for _ in keys]] + [[launch.get(k, "") for k in keys] for launch in launches])
    return out.getvalue()


def test_summary_keeps_the_ops_last_call_and_weights_shares_by_time():
    torch_fill = _launch("void at::native::vectorized_elementwise_kernel<4, FillFunctor>", 5000, dram=90.0)
    call = [_launch("expand_map_kernel", 1000, dram=10.0, issue=10.0, wait=9.0),
            _launch("expand_rows_kernel", 3000, dram=70.0, issue=20.0, long_scoreboard=20.0, mio_throttle=15.0)]
    first = [dict(c, **{ncu.TIME: "9,000"}) for c in call]  # a first call (compiling, cold): not counted
    s = ncu.summarize(ncu.launches(_csv([torch_fill, *first, *call])))
    assert s["launches"] == 2 and s["time_us"] == pytest.approx(4.0)
    assert s["dram_pct"] == pytest.approx((10 * 1 + 70 * 3) / 4) and s["issue_pct"] == pytest.approx(17.5)
    assert s["dram_TBps"] == pytest.approx(4e6 / 4000 / 1e3)
    assert [n for n, _ in s["stalls"]] == ["long_scoreboard", "mio_throttle"]  # of the longest launch
    assert ncu.summarize(ncu.launches(_csv([torch_fill]))) is None


@pytest.mark.parametrize("dram, issue, verdict", [(85.0, 90.0, "DRAM"), (84.9, 60.0, "instructions"),
                                                  (84.9, 59.9, "latency")])
def test_the_verdict_follows_the_thresholds(dram, issue, verdict):
    s = ncu.summarize(ncu.launches(_csv([_launch("k", 1000, dram=dram, issue=issue, wait=1.0)])))
    assert ncu.bound(s) == verdict and ncu.note(s).startswith(f"ncu: bound by {verdict} (")


def test_h200_counters_say_what_bounds_the_engram_kernels():
    """An H200 profile at the bench's clocks: the 512-thread Engram forward issues on 69% of its cycles
    with DRAM at 77% (bound by instructions); the backward, one CTA an SM, at 37% and 71% (bound by
    latency, waiting at its barrier)."""
    launches = ncu.read(PROBE)
    fwd = ncu.summarize([r for r in launches if "engram_gate_fwd" in r["Kernel Name"]])
    bwd = ncu.summarize([r for r in launches if "engram_gate_bwd" in r["Kernel Name"]
                         or "engram_grad_w_reduce" in r["Kernel Name"]])
    assert ncu.bound(fwd) == "instructions" and fwd["issue_pct"] == pytest.approx(69.4, abs=0.2)
    assert ncu.bound(bwd) == "latency" and bwd["stalls"][0][0] == "barrier" and bwd["registers"] == 126


def test_bench_rows_get_the_counters_note_and_keep_it_through_a_merge(tmp_path):
    rows = [{"op": "engram.gate (backward)", "shape": "T4096 hc4", "impl": impl, "bytes": 4_200_000,
             "time_us": 2.0, "kernel_us": 1.5, "target": 0.8, "flops": None} for impl in ("tilelang", "torch")]
    doc = bench.derive({"meta": {"commit": "abc", "versions": {}}, "copy_bandwidth_TBps": 4.2,
                        "write_bandwidth_TBps": 4.3, "rows": rows, "unavailable": []})
    assert doc["rows"][0]["notes"] == ["below target; not explained by these measurements"]
    launches = [_launch("engram_gate_bwd_kernel", 1500, dram=71.0, issue=37.0, barrier=2.8)]
    with gzip.open(tmp_path / ncu.counters_file("engram.gate (backward)", "T4096 hc4"), "wt") as f:
        f.write(_csv(launches))
    assert ncu.counters_file("engram.gate (backward)", "T4096 hc4") == "engram.gate_backward___T4096_hc4.csv.gz"
    assert bench.attach_counters(doc, tmp_path) == 1
    tilelang, torch_row = doc["rows"]
    assert tilelang["notes"] == [ncu.note(tilelang["counters"])] and "bound by latency" in tilelang["notes"][0]
    assert "counters" not in torch_row
    md = bench.render_markdown(doc)
    assert "- counters: Nsight Compute of 1 tilelang rows" in md and "ncu: bound by latency" in md
    merged = bench.merge([doc])
    assert merged["rows"][0]["notes"] == tilelang["notes"]
