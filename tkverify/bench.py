"""`tkverify bench`: time every registered op's benchmark shapes, per implementation.

Effective bandwidth is the bytes an op must read and write, each counted once
(the shape's ``nbytes``), over the judged time; the device-to-device copy
measured in the same process is the ceiling it is compared against, and the
write-only fill the ceiling of the writes a shape declares (``BenchShape.written``).

Two series of timed repetitions per row, each kept as its p10, p50 (median) and p90:

* eager, ``time_p10_us`` / ``time_us`` / ``time_p90_us``: CUDA-event times
  around ``impl(**inputs, **params)`` (L2 flushed between runs) - what a
  caller sees, including the wrapper's host work whenever the host is slower
  than the GPU;
* graph, ``kernel_p10_us`` / ``kernel_us`` / ``kernel_p90_us``: the same call
  captured once into a CUDA graph and replayed (same flush): no host work.
  None (with ``graph_error``) when the call cannot be captured.

A row is judged by its eager p50 (`judged_time_us`): bandwidth, share of
copy, target verdict and the ratios to tile_kernels.  Users call these ops
eagerly, in training steps, and the graph time hides the host work they pay
(docs/DECISIONS.md#framework-bench-timing).  The graph time stays beside it:
an eager time well above it names host work in the row's notes.  A bench.json
written before the percentiles has ``time_us`` and ``kernel_us`` alone, the
same medians; it renders, merges and diffs with its p10 and p90 shown as "-".

The replays of some of our kernels can take longer than their eager calls, by
about one L2 flush's time, while Nsight Compute's own kernel durations match
the eager times (post 497 us: eager 501, replay 555; expand 648: 662 and 720;
reduce 474: 482 and 532; reports/evidence/framework.md#graph-replay-vs-eager);
with the flush by reading (`l2_flusher`) they are rarer, not gone
(reports/evidence/framework.md#l2-flush).  Their cause is not known; a row
whose p10 and p90 lie far apart says so in its notes, so a median that lands
in such a slow group shows.

The timing needs CUDA; everything else here (selecting ops, percentiles,
ratios, merging runs, the markdown) is plain Python and tested on CPU.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import statistics
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from tkverify import ncu
from tkverify.registry import Unsupported

L2_FLUSH_BYTES = 256 * 2**20  # larger than the H200's 60 MB L2


def l2_flusher() -> Callable[[], None]:
    """A call that evicts L2 by reading L2_FLUSH_BYTES of a buffer of its own (a sum).

    256 MiB of reads replace the H200's L2 several times over; that they evict
    as a write would is reasoned, not measured.

    Reading, not writing: a flush that writes (a 256 MiB zero_) leaves L2 full
    of dirty lines, and on the H200 some of the memory-bound calls timed right
    after it take one flush's time longer (about 60 us): expand_to_fused's reps
    are bimodal, 600 and 663 us, and the median of 30 lands on either (its
    bench row 601 or 660 us at the same kernels; reduce_fused 488 and 540).
    Flushed by reading, or by writing and then sleeping 2 ms, no rep of the
    per-rep series is slow, though a bench run can still show slow replays
    (module docstring).  Figures: reports/evidence/framework.md#l2-flush.
    """
    flush = torch.empty(L2_FLUSH_BYTES // 8, dtype=torch.int64, device="cuda")
    sink = torch.empty((), dtype=torch.int64, device="cuda")
    return lambda: torch.sum(flush, dim=0, out=sink)


def rep_times_s(fn: Callable[[], object], *, before: Callable[[], object] | None = None, warmup: int = 5,
                reps: int = 30) -> list[float]:
    """Seconds of each of `reps` runs of `fn()`, timed by CUDA events; `before()` (an L2 flush) is queued
    ahead of each run, untimed."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if before is not None:
            before()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    return times


def median_time_s(fn: Callable[[], object], *, warmup: int = 5, reps: int = 30, flush_l2: bool = True) -> float:
    """Median seconds of `fn()` over `reps` runs, each timed by CUDA events, L2 flushed between."""
    return statistics.median(rep_times_s(fn, before=l2_flusher() if flush_l2 else None, warmup=warmup, reps=reps))


PERCENTILES = ("p10", "p50", "p90")


def percentiles(samples: list[float]) -> dict[str, float]:
    """p10, p50 and p90 of `samples`: p50 their median; p10 and p90 interpolated linearly between the
    order statistics either side (`statistics.quantiles`' "inclusive" method, numpy's default), so
    both lie within the samples' range.  One sample is all three."""
    if not samples:
        raise ValueError("no samples")
    if len(samples) == 1:
        return dict.fromkeys(PERCENTILES, samples[0])
    deciles = statistics.quantiles(samples, n=10, method="inclusive")
    return {"p10": deciles[0], "p50": statistics.median(samples), "p90": deciles[-1]}


# the row fields of each series' (p10, p50, p90); the p50 fields are the medians every bench.json has
FIELDS = {"eager": ("time_p10_us", "time_us", "time_p90_us"), "graph": ("kernel_p10_us", "kernel_us", "kernel_p90_us")}


def record_times(row: dict[str, Any], series: str, times_s: list[float]) -> None:
    """Store the p10, p50 and p90 of one series ("eager" or "graph") of seconds in `row`, in us."""
    spread = percentiles(times_s)
    for field, name in zip(FIELDS[series], PERCENTILES):
        row[field] = spread[name] * 1e6


def capture_graph(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """`fn()` captured into a CUDA graph, whose replay launches it with no host work.

    Raises whatever capture raises (a call that synchronises, or launches on
    another stream, cannot be captured).
    """
    fn()  # compile and load outside the capture
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # warm the caching allocator on the capture stream, as torch's docs advise
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def graph_time_s(fn: Callable[[], object], *, reps: int = 30) -> float:
    """Median device seconds of `fn()` replayed from a CUDA graph (no host work timed), L2 flushed."""
    return median_time_s(capture_graph(fn).replay, reps=reps)


def copy_bandwidth(nbytes: int = 2 * 2**30) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = median_time_s(lambda: dst.copy_(src), flush_l2=False)
    return 2 * nbytes / t


def write_bandwidth(nbytes: int = 2 * 2**30) -> float:
    """Write-only bandwidth in bytes/s (a fill): the ceiling of ops that write far more than they read.

    The fill is of fp32, not bytes: torch fills a uint8 tensor 4 bytes a store, at 3.3 TB/s on the H200, where
    16-byte stores of noise write 4.3-4.6 TB/s (reports/evidence/framework.md#write-only-reference)."""
    dst = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda")
    return nbytes / median_time_s(lambda: dst.fill_(1.0), flush_l2=False)


# ------------------------------------------------------------------ selection


@dataclasses.dataclass(frozen=True)
class Entry:
    """One benchmark shape of one op (``part`` "forward" or "backward")."""

    op: str
    part: str
    shape: Any  # registry.BenchShape
    impls: dict[str, Any]  # name -> registry.Impl

    @property
    def label(self) -> str:
        return self.op if self.part == "forward" else f"{self.op} (backward)"


def select(specs: Iterable[Any], k: str | None = None) -> list[Entry]:
    """Every bench shape of the specs (forward, then backward), of the ops `k` selects.

    k: a comma list of substrings; an op is selected when its name contains
    one of them (None or "": every op).
    """
    words = [w.strip() for w in (k or "").split(",") if w.strip()]
    entries = []
    for spec in specs:
        if words and not any(w in spec.name for w in words):
            continue
        entries += [Entry(spec.name, "forward", shape, spec.impls) for shape in spec.bench]
        if spec.backward is not None:
            entries += [Entry(spec.name, "backward", shape, spec.backward.impls) for shape in spec.backward.bench]
    return entries


def wanted_impls(entries: list[Entry], impl: str | None) -> list[str]:
    """The implementation names asked for: a comma list, or (None / "all") the built-ins and every other name."""
    if impl and impl != "all":
        return [n.strip() for n in impl.split(",") if n.strip()]
    from tkverify.registry import BUILTIN_IMPLS

    # the built-ins always: one an op lacks is listed as not run, with the reason
    names = {n for e in entries for n in e.impls}
    return list(BUILTIN_IMPLS) + sorted(names - set(BUILTIN_IMPLS))


# --------------------------------------------------------------------- running


def _describe(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)}:{str(value.dtype).removeprefix('torch.')}"
    return value


def run(entries: list[Entry], impl_names: list[str], *, reps: int = 30, graphs: bool = True,
        log: Callable[[str], None] = print) -> dict[str, Any]:
    """Time every (entry, implementation) on the current CUDA device; returns the bench document."""
    device = torch.device("cuda")
    copy = copy_bandwidth()
    write = write_bandwidth()
    log(f"copy bandwidth {copy / 1e12:.3f} TB/s, write-only {write / 1e12:.3f} TB/s")
    flush = l2_flusher()
    rows, unavailable = [], []
    for entry in entries:
        impls = {}
        for name in impl_names:
            impl = entry.impls.get(name)
            reason = f"{entry.op} has no implementation {name!r}" if impl is None else impl.unavailable_reason()
            if reason:
                unavailable.append({"op": entry.label, "shape": entry.shape.name, "impl": name, "reason": reason})
            else:
                impls[name] = impl
        if not impls:
            continue
        inputs, params = entry.shape.make(device)
        row_base = {"op": entry.label, "shape": entry.shape.name, "bytes": entry.shape.nbytes(inputs, params),
                    "flops": entry.shape.flops(inputs, params) if entry.shape.flops else None,
                    "written": entry.shape.written(inputs, params) if entry.shape.written else None,
                    "target": entry.shape.target,
                    "params": {k: _describe(v) for k, v in params.items()},
                    "inputs": {k: _describe(v) for k, v in inputs.items()}}
        for name, impl in impls.items():
            fn = impl.function()
            call = lambda fn=fn: fn(**{k: v for k, v in inputs.items()}, **params)  # noqa: E731
            row = dict(row_base, impl=name)
            try:
                record_times(row, "eager", rep_times_s(call, before=flush, reps=reps))
            except Unsupported as e:  # the library lacks this shape or option: say so
                unavailable.append({"op": entry.label, "shape": entry.shape.name, "impl": name,
                                    "reason": f"unsupported: {e.msg if hasattr(e, 'msg') else e}"})
                log(f"{entry.label} [{entry.shape.name}] {name}: unsupported")
                continue
            except Exception as e:  # reported in the table, not hidden
                row["error"] = f"{type(e).__name__}: {e}"[:300]
                rows.append(row)
                log(f"{entry.label} [{entry.shape.name}] {name}: {row['error']}")
                continue
            if graphs:
                try:
                    record_times(row, "graph", rep_times_s(capture_graph(call).replay, before=flush, reps=reps))
                except Exception as e:  # reported: the eager time still stands
                    row["kernel_us"] = None
                    row["graph_error"] = f"{type(e).__name__}: {e}"[:200]
                    torch.cuda.synchronize()
            rows.append(row)
            log(f"{entry.label} [{entry.shape.name}] {name}: eager {spread_text(row, 'eager')} us"
                + (f", graph {spread_text(row, 'graph')} us" if row.get("kernel_us") else ""))
        del inputs
        torch.cuda.empty_cache()
    doc = {"meta": meta(), "copy_bandwidth_TBps": copy / 1e12, "write_bandwidth_TBps": write / 1e12,
           "reps": reps, "rows": rows, "unavailable": unavailable}
    return derive(doc)


def meta() -> dict[str, Any]:
    """Date, commit (TKVERIFY_COMMIT or git), device and driver, and the versions that matter."""
    from tkverify.report import device_info, git_commit

    versions = {"torch": torch.__version__}
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        version, PackageNotFoundError = None, Exception
    for dist in ("tilelang", "tile-kernels", "tkverify"):
        try:
            versions[dist] = version(dist)
        except PackageNotFoundError:
            versions[dist] = None
    return {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "commit": os.environ.get("TKVERIFY_COMMIT") or git_commit(),
            "versions": versions, **device_info()}


# ------------------------------------------------------------ derived columns


def derive(doc: dict[str, Any]) -> dict[str, Any]:
    """Fill each row's bandwidth, ceilings, FLOP/s, target verdict and ratios to tile_kernels (in place).

    A row is judged by its eager p50 (`judged_time_us`).  ``vs[name]`` is
    name's time over this row's time: above 1, this implementation is faster.
    Every implementation whose name starts with "tile_kernels" is a reference.
    """
    copy = doc["copy_bandwidth_TBps"] * 1e12
    write = doc.get("write_bandwidth_TBps")
    judged = {}
    for row in doc["rows"]:
        t = judged_time_us(row)
        if t is None:
            continue
        judged[row["op"], row["shape"], row["impl"]] = t
        row["TBps"] = row["bytes"] / (t * 1e-6) / 1e12
        row["of_copy"] = row["bytes"] / (t * 1e-6) / copy
        row["of_write"] = row["bytes"] / (t * 1e-6) / (write * 1e12) if write else None
        row["TFLOPs"] = row["flops"] / (t * 1e-6) / 1e12 if row.get("flops") else None
        row["met"] = None if row.get("target") is None else row["of_copy"] >= row["target"]
        if row.get("written") and write:
            row["write_floor_us"] = row["written"] / (write * 1e12) * 1e6
            if row.get("target"):
                row["target_us"] = row["bytes"] / (row["target"] * copy) * 1e6
        row["notes"] = measured_notes(row)
    for row in doc["rows"]:
        t = judged.get((row["op"], row["shape"], row["impl"]))
        row["vs"] = {}
        for (op, shape, impl), other in judged.items():
            if op == row["op"] and shape == row["shape"] and impl.startswith("tile_kernels") and impl != row["impl"] \
                    and t is not None:
                row["vs"][impl] = other / t
    return doc


HOST_GAP_US = 20.0  # eager time above the graph time by more than this (and a quarter): host-bound
GRAPH_EXCESS = 0.02  # a graph replay slower than the eager call by more than this share is noted
# p90 above p10 by more than this share of p50 is noted: a slow group is about one L2 flush's time, 51-60 us
# on 480-670 us calls (8-12%), where expand_to_fused's reps after a read flush lie within 0.2% from median to
# p90 (reports/evidence/framework.md#l2-flush)
SPREAD = 0.05


def measured_notes(row: dict[str, Any]) -> list[str]:
    """What the row's own measurements say bounds it (nothing is guessed: a target missed for a
    reason these figures do not show is marked as such)."""
    notes = []
    if row.get("met") is False and row.get("write_floor_us") is not None:
        # write-bound only if the declared writes alone overrun the target's time (a shape that declares
        # none is never called write-bound: bytes over the write-only rate say nothing without the mix)
        floor, allowed = row["write_floor_us"], row.get("target_us")
        if allowed is not None and floor >= allowed:
            notes.append(f"bound by writes: its {row['written'] / 1e6:.0f} MB of writes alone take {floor:.0f} us at "
                         f"the write-only rate measured here, more than the {allowed:.0f} us its target allows; it "
                         f"runs at {floor / judged_time_us(row):.0%} of that rate")
    eager, kernel = row.get("time_us"), row.get("kernel_us")
    if eager and kernel and eager - kernel > max(HOST_GAP_US, 0.25 * kernel):
        notes.append(f"eager call {eager - kernel:.0f} us above its device time (host work)")
    if eager and kernel and kernel > eager * (1 + GRAPH_EXCESS):
        notes.append(f"graph replay {kernel - eager:.0f} us slower than the eager call: judged by the eager time")
    for series, name in (("eager", "eager"), ("graph", "graph replay")):
        low, mid, high = (row.get(f) for f in FIELDS[series])
        if low is not None and mid and high is not None and high - low > SPREAD * mid:
            notes.append(f"{name} reps spread {low:.0f}-{high:.0f} us (p10-p90), {(high - low) / mid:.0%} of "
                         f"their median")
    if row.get("graph_error"):
        notes.append(f"not capturable in a CUDA graph ({row['graph_error'].split(':')[0]}): eager time only")
    if row.get("counters"):  # Nsight Compute's view of the same shape (attach_counters)
        notes.append(ncu.note(row["counters"]))
    if row.get("met") is False and not notes:
        notes.append("below target; not explained by these measurements")
    return notes


def attach_counters(doc: dict[str, Any], directory: Path, impl: str = "tilelang") -> int:
    """Give each `impl` row whose shape has a counters file under `directory` (the ncu/ folder of
    `scripts/gpu-run.sh --steps ncu`, named by tkverify.ncu.counters_file) a summary of its launches,
    and the note of what bounds it; returns how many rows got one."""
    count = 0
    for row in doc["rows"]:
        if row["impl"] != impl:
            continue
        path = directory / ncu.counters_file(row["op"], row["shape"])
        if not path.is_file():
            continue
        summary = ncu.summarize(ncu.read(path))
        if summary is not None:
            row["counters"] = summary
            row["notes"] = measured_notes(row)
            count += 1
    doc["counters"] = {"dir": str(directory), "impl": impl, "rows": count}
    return count


def judged_time_us(row: dict[str, Any]) -> float | None:
    """The time a row is judged by: its eager p50 (``time_us``, the eager median in a bench.json of any
    age), what a caller of the op pays; None for a row that errors."""
    return row.get("time_us") or None


def best_time_us(row: dict[str, Any]) -> float | None:
    """The smaller of the row's eager and graph-replayed medians: each bounds its device time from above.
    Not the bench's verdict (`judged_time_us`); `benchmarks/tune.py` ranks kernel configurations by it."""
    times = [t for t in (row.get("kernel_us"), row.get("time_us")) if t]
    return min(times) if times else None


# ------------------------------------------------------------------- merging


def merge(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """One document from several runs (e.g. tile-kernels 1.0.0 timed under another environment).

    Each run's ``tile_kernels`` rows become ``tile_kernels==<its version>``;
    other rows are kept from the first run that has them (a later run's
    duplicate is dropped and listed under ``dropped``).  Bandwidth ratios stay
    those of the run that measured the row (``copy_bandwidth_TBps`` is kept
    per row); the document's own ceilings are the first run's.
    """
    if not docs:
        raise ValueError("nothing to merge")
    rows, seen, dropped, unavailable = [], set(), [], []
    for doc in docs:
        version = (doc.get("meta", {}).get("versions") or {}).get("tile-kernels") or "?"
        for row in doc["rows"]:
            row = dict(row, copy_bandwidth_TBps=row.get("copy_bandwidth_TBps", doc["copy_bandwidth_TBps"]))
            if row["impl"] == "tile_kernels":
                row["impl"] = f"tile_kernels=={version}"
            key = (row["op"], row["shape"], row["impl"])
            if key in seen:
                dropped.append({"op": row["op"], "shape": row["shape"], "impl": row["impl"],
                                "commit": doc.get("meta", {}).get("commit")})
                continue
            seen.add(key)
            rows.append(row)
        unavailable += doc.get("unavailable", [])
    have = {(r["op"], r["shape"], r["impl"].split("==")[0]) for r in rows}
    unavailable = [u for u in unavailable if (u["op"], u["shape"], u["impl"]) not in have]
    reps = {d.get("reps") for d in docs}  # the reps a row's percentiles rest on, where every run agrees
    out = {"meta": docs[0].get("meta", {}), "runs": [d.get("meta", {}) for d in docs],
           "copy_bandwidth_TBps": docs[0]["copy_bandwidth_TBps"],
           "write_bandwidth_TBps": docs[0].get("write_bandwidth_TBps"),
           "reps": reps.pop() if len(reps) == 1 else None,
           "rows": rows, "unavailable": unavailable, "dropped": dropped}
    derive(out)
    # a row of another run is judged against that run's copy bandwidth
    for row in out["rows"]:
        t = judged_time_us(row)
        if t is not None:
            row["of_copy"] = row["bytes"] / (t * 1e-6) / (row["copy_bandwidth_TBps"] * 1e12)
            row["met"] = None if row.get("target") is None else row["of_copy"] >= row["target"]
    return out


# ------------------------------------------------------------------ markdown


def _fmt(value: Any, spec: str = ".1f", none: str = "-") -> str:
    if value is None:
        return none
    return format(value, spec)


def spread_text(row: dict[str, Any], series: str) -> str:
    """The p10 / p50 / p90 of one series ("eager" or "graph") of a row, "-" for a figure it lacks (a bench
    written before the percentiles has the p50 alone; a row without a graph time has none)."""
    if row.get(FIELDS[series][1]) is None:
        return "-"
    return " / ".join(_fmt(row.get(field)) for field in FIELDS[series])


def _impl_order(rows: list[dict[str, Any]]) -> list[str]:
    first = ("tilelang", "torch")
    names = {r["impl"] for r in rows}
    return [n for n in first if n in names] + sorted(n for n in names if n not in first)


def render_markdown(doc: dict[str, Any]) -> str:
    m = doc.get("meta", {})
    lines = ["# tkverify bench", ""]
    runs = doc.get("runs") or [m]
    for run_meta in runs:
        v = run_meta.get("versions", {})
        lines.append(f"- {run_meta.get('date', '?')}, commit {run_meta.get('commit', '?')}, "
                     f"{run_meta.get('device', '?')} (driver {run_meta.get('driver', '?')}), "
                     + ", ".join(f"{k} {v[k]}" for k in sorted(v) if v[k]))
    lines += [f"- copy bandwidth {doc['copy_bandwidth_TBps']:.3f} TB/s (read + write), write-only "
              f"{_fmt(doc.get('write_bandwidth_TBps'), '.3f')} TB/s",
              "- eager: CUDA-event times of the call, L2 flushed by reading 256 MiB before each; graph: the same call "
              "replayed from a CUDA graph (no host work); each as p10 / p50 / p90 of its "
              + (f"{doc['reps']} reps" if doc.get("reps") else "reps (\"-\": a figure the run did not keep)")
              + ". Bandwidth, ratios and verdicts use the eager p50: what a caller pays, host work included."]
    if doc.get("counters"):
        c = doc["counters"]
        lines.append(f"- counters: Nsight Compute of {c['rows']} {c['impl']} rows (`{c['dir']}`, one process a shape, "
                     f"at the bench's clocks); a row's `ncu:` note says what its launches show bounds it "
                     f"(tkverify/ncu.py)")
    lines.append("")
    rows = doc["rows"]
    impls = _impl_order(rows)
    lines += ["## Summary (eager p50 in us, the time each row is judged by, and its share of copy bandwidth; "
              "graph times in the table of every row)", "",
              "| op | shape | " + " | ".join(impls) + " |", "|---|---|" + "---|" * len(impls)]
    shapes = list(dict.fromkeys((r["op"], r["shape"]) for r in rows))
    by_key = {(r["op"], r["shape"], r["impl"]): r for r in rows}
    for op, shape in shapes:
        cells = []
        for impl in impls:
            r = by_key.get((op, shape, impl))
            if r is None:
                cells.append("")
            elif "error" in r:
                cells.append("error")
            else:
                # a call that cannot be captured has no graph time to tell its host work from its kernel's
                eager_only = "*" if r.get("graph_error") and not r.get("kernel_us") else ""
                cells.append(f"{judged_time_us(r):.1f}{eager_only} ({r['of_copy']:.0%})")
        lines.append(f"| {op} | {shape} | " + " | ".join(cells) + " |")
    if any(r.get("graph_error") and not r.get("kernel_us") for r in rows if "error" not in r):
        lines += ["", "\\* no graph time: the call cannot be captured in a CUDA graph (see its notes below); its "
                  "eager time includes any device sync inside it, with no kernel time beside it to tell them apart."]
    lines += ["", "## Every row", "",
              "| op | shape | impl | eager us p10 / p50 / p90 | graph us p10 / p50 / p90 | TB/s | of copy | of write | "
              "TFLOP/s | target | met | "
              "vs tile_kernels | notes (from these measurements) |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['op']} | {r['shape']} | {r['impl']} | error: {r['error']} |"
                         + " |" * 9)
            continue
        vs = ", ".join(f"{k}: {v:.2f}x" for k, v in sorted(r.get("vs", {}).items())) or "-"
        target = "-" if r.get("target") is None else f"{r['target']:.0%}"
        met = {None: "-", True: "yes", False: "**no**"}[r.get("met")]
        lines.append(f"| {r['op']} | {r['shape']} | {r['impl']} | {spread_text(r, 'eager')} | "
                     f"{spread_text(r, 'graph')} | {_fmt(r.get('TBps'), '.2f')} | {_fmt(r.get('of_copy'), '.0%')} | "
                     f"{_fmt(r.get('of_write'), '.0%')} | {_fmt(r.get('TFLOPs'), '.2f')} | {target} | {met} | {vs} | "
                     f"{'; '.join(r.get('notes', [])) or '-'} |")
    if doc.get("unavailable"):
        lines += ["", "## Not run", ""]
        lines += [f"- {u['op']} [{u['shape']}] {u['impl']}: {u['reason']}" for u in doc["unavailable"]]
    if doc.get("dropped"):
        lines += ["", "## Duplicates dropped while merging (the first run's row is kept)", ""]
        lines += [f"- {d['op']} [{d['shape']}] {d['impl']} (commit {d['commit']})" for d in doc["dropped"]]
    return "\n".join(lines) + "\n"


def write(doc: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "bench.json", "md": out_dir / "bench.md"}
    paths["json"].write_text(json.dumps(doc, indent=1, default=str))
    paths["md"].write_text(render_markdown(doc))
    return paths
