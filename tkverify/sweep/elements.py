"""The exhaustive element sweeps: every input of a domain through the registered implementations of
quant.per_token_cast_with_precomputed_sf and quant.cast_back, judged on the device against the
float64 encoder (`references.encode`).

* ``fp32``: every fp32 bit pattern as x, sf = 1 (so the quotient is x), per element format;
* ``bf16`` / ``fp16``: every bf16 code (a bf16 x) and every fp16 code (an fp32 x holding it: the op
  takes bf16 or fp32), at every sf of `domains.scale_factors`;
* ``cast_back``: every code of each element format at the same sf, dequantised to bf16 and fp32.

Each sweep runs in chunks; the oracle of a chunk is computed once and judged against every
implementation.  An implementation that refuses a format (`tkverify.Unsupported`) is recorded
with its reason; one that raises is recorded with the error; neither stops the others.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import torch

import references.encode as enc
from tkverify import formats
from tkverify.policies import Comparison
from tkverify.registry import Impl, OpSpec, Unsupported
from tkverify.report.rows import ResultRow, UnsupportedRow
from tkverify.sweep import domains
from tkverify.sweep.judge import Tally, data_allowance

DATA_POLICY = ("bitwise: the correctly rounded code of x / sf (float64 encoder on the device); a deviation "
               "fails unless the contract allows it (a zero of the other sign; where sf is not a power of two, "
               "the neighbour within 2^-22 of a rounding boundary)")
CAST_BACK_POLICY = "bitwise: q * sf (exact in float64) rounded once to out_dtype by the float64 encoder"
CAST_BACK_OUT = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclasses.dataclass
class Settings:
    """What a sweep covers: formats, the slice of each domain, the sf set, chunking and time."""

    fmts: tuple[str, ...] = ("e4m3", "e2m1", "e5m6")
    slice: int | None = None  # only the first N patterns or codes of each domain
    drawn_sf: int = 8
    sf_limit: int | None = None  # only the first K scale factors of the set
    seed: int = 29
    chunk: int = 1 << 26
    budget_s: float | None = None
    started: float = dataclasses.field(default_factory=time.perf_counter)

    def out_of_time(self) -> bool:
        return self.budget_s is not None and time.perf_counter() - self.started > self.budget_s

    def sf_set(self, fmt: str) -> list[domains.ScaleFactor]:
        return domains.scale_factors(fmt, self.drawn_sf, self.seed)[: self.sf_limit]


@dataclasses.dataclass
class SweepRun:
    """One sweep of one format: what it covered, its time, and a `Tally` per implementation."""

    name: str
    op: str
    fmt: str
    label: str
    total: int
    covered: int = 0
    wall_s: float = 0.0
    oracle_s: float = 0.0
    stopped: str | None = None  # why it ended early (the time budget)
    tallies: dict[str, Tally] = dataclasses.field(default_factory=dict)
    errors: dict[str, str] = dataclasses.field(default_factory=dict)
    refused: dict[str, str] = dataclasses.field(default_factory=dict)
    scale_factors: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def rows(self) -> list[ResultRow]:
        rows = [t.row("exhaustive") for t in self.tallies.values() if t.count]
        for impl, error in self.errors.items():
            row = ResultRow.of(self.op, impl, Comparison.rejected(self.label, self.fmt, "bitwise", error))
            row.coverage = "exhaustive"
            rows.append(row)
        return rows

    def unsupported(self) -> list[UnsupportedRow]:
        return [UnsupportedRow(self.op, impl, 1, {reason: 1}) for impl, reason in self.refused.items()]


def chosen_impls(spec: OpSpec, wanted: list[str] | None) -> tuple[dict[str, Impl], dict[str, str]]:
    """(available implementations asked for, {name: why not} of the unavailable ones)."""
    impls, unavailable = {}, {}
    for name, impl in spec.impls.items():
        if wanted is not None and name not in wanted:
            continue
        reason = impl.unavailable_reason()
        if reason:
            unavailable[name] = reason
        else:
            impls[name] = impl
    return impls, unavailable


def oracle_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def call(run: SweepRun, name: str, impl: Impl, kwargs: dict[str, Any]) -> Any:
    """The implementation's output, or None after recording its refusal or its error (it is then skipped)."""
    device = impl.resolve_device()
    start = time.perf_counter()
    try:
        out = impl.function()(**kwargs)
        _sync(device)
    except Unsupported as e:
        run.refused[name] = e.reason
        return None
    except Exception as e:  # noqa: BLE001 - recorded as the implementation's failure, the others go on
        run.errors[name] = f"the implementation raised {type(e).__name__}: {e}"[:400]
        return None
    if name in run.tallies:
        run.tallies[name].seconds += time.perf_counter() - start
    return out


def _live(run: SweepRun, impls: dict[str, Impl]) -> dict[str, Impl]:
    return {n: i for n, i in impls.items() if n not in run.refused and n not in run.errors}


def _hex(width: int) -> Callable[[int], str]:
    return lambda bits: f"0x{bits & ((1 << (4 * width)) - 1):0{width}x}"


def _quantise_chunk(run: SweepRun, impls: dict[str, Impl], values: torch.Tensor, bits: torch.Tensor,
                    sf_values: list[float], describe: Callable[[int], str]) -> None:
    """`values` (flat, bf16 or fp32, on the oracle's device) at every sf of `sf_values`, through each
    implementation; the oracle once, on the device."""
    fmt, odev = run.fmt, values.device
    count = values.numel()
    rows, width = domains.row_layout(count)
    npc = width if fmt == "e5m6" else domains.BLOCK
    x = domains.padded_rows(values, rows, width).repeat(len(sf_values), 1)
    sf_rows = torch.tensor(sf_values, dtype=torch.float32, device=odev).repeat_interleave(rows)
    valid = (torch.arange(len(sf_values), device=odev)[:, None] * rows * width
             + torch.arange(count, device=odev)[None, :]).reshape(-1)
    start = time.perf_counter()
    sf_elements = sf_rows.double().repeat_interleave(width).reshape(-1)[valid]
    quotient = x.double().reshape(-1)[valid] / sf_elements
    expected = enc.encode(quotient, fmt)
    free = torch.isnan(quotient) if not formats.get(fmt).has_nan else None
    _sync(odev)
    run.oracle_s += time.perf_counter() - start
    inputs = bits.repeat(len(sf_values))
    for name, impl in _live(run, impls).items():
        device = impl.resolve_device()
        sf = sf_rows[:, None].expand(-1, width // npc).contiguous()
        data = call(run, name, impl, {"x": x.to(device), "sf": sf.to(device), "fmt": fmt, "num_per_channels": npc})
        if data is None:
            continue
        actual = enc.storage_codes(data, fmt).to(odev).reshape(-1)[valid]
        run.tallies[name].add(actual, expected, quotient, inputs=inputs, sf=sf_elements, unconstrained=free,
                              allowance=data_allowance(fmt, quotient, sf_elements), describe=describe)


def _new_run(name: str, spec: OpSpec, fmt: str, label: str, total: int, impls: dict[str, Impl], fmt_of_codes: str,
             policy: str) -> SweepRun:
    run = SweepRun(name, spec.name, fmt_of_codes, label, total)
    run.tallies = {n: Tally(spec.name, label, fmt_of_codes, n, policy) for n in impls}
    return run


def fp32_sweep(spec: OpSpec, impls: dict[str, Impl], settings: Settings, log: Callable[[str], None]) -> list[SweepRun]:
    """Every fp32 bit pattern (or the first `settings.slice`) as x with sf = 1, per format."""
    total = min(settings.slice or domains.FP32_PATTERNS, domains.FP32_PATTERNS)
    domain = "every fp32 x" if total == domains.FP32_PATTERNS else f"fp32 x 0x00000000-0x{total - 1:08x}"
    odev = oracle_device()
    runs = [_new_run("fp32", spec, fmt, f"data @ {domain}, sf 1", total, impls, fmt, DATA_POLICY)
            for fmt in settings.fmts]
    for run in runs:
        run.scale_factors = [{"value": 1.0, "kind": "one"}]
    for start in range(0, total, settings.chunk):
        if settings.out_of_time():
            for run in runs:
                run.stopped = f"time budget of {settings.budget_s:g} s spent after {start} of {total} patterns"
            break
        stop = min(start + settings.chunk, total)
        values = domains.fp32_patterns(start, stop, odev)
        bits = values.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        for run in runs:
            began = time.perf_counter()
            _quantise_chunk(run, impls, values, bits, [1.0], _hex(8))
            run.wall_s += time.perf_counter() - began
            run.covered = stop
        log(f"fp32 sweep: {stop} of {total} patterns")
    return runs


def codes16_sweep(spec: OpSpec, impls: dict[str, Impl], settings: Settings, dtype_name: str,
                  log: Callable[[str], None]) -> list[SweepRun]:
    """Every bf16 or fp16 code (or the first `settings.slice`) as x at every sf of the set, per format.
    fp16 values travel as an fp32 x (the op takes bf16 or fp32; every fp16 is an fp32)."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    count = min(settings.slice or domains.CODES_16, domains.CODES_16)
    odev = oracle_device()
    domain = f"every {dtype_name} x" if count == domains.CODES_16 else f"{dtype_name} x 0x0000-0x{count - 1:04x}"
    if dtype_name == "fp16":
        domain += " (as fp32)"
    runs = []
    for fmt in settings.fmts:
        if settings.out_of_time():
            log(f"{dtype_name} sweep of {fmt}: not run, the time budget is spent")
            continue
        sfs = settings.sf_set(fmt)
        run = _new_run(dtype_name, spec, fmt, f"data @ {domain}, {len(sfs)} sf", count * len(sfs), impls, fmt,
                       DATA_POLICY)
        run.scale_factors = [dataclasses.asdict(s) for s in sfs]
        began = time.perf_counter()
        codes = domains.codes_16(dtype, count, odev)
        values = codes if dtype == torch.bfloat16 else codes.float()
        bits = codes.view(torch.int16).to(torch.int64) & 0xFFFF
        _quantise_chunk(run, impls, values, bits, [s.value for s in sfs], _hex(4))
        run.covered, run.wall_s = run.total, time.perf_counter() - began
        runs.append(run)
        log(f"{dtype_name} sweep of {fmt}: {run.total} elements in {run.wall_s:.2f} s")
    return runs


def _cast_back_layout(fmt: str, count: int) -> tuple[int, int]:
    """(H, bk) of a row holding `count` codes of fmt: e4m3 and e2m1 rows of whole 128-element blocks
    (the codes repeated to fill them), e5m6 one block of the whole row (its only geometry)."""
    if fmt == "e5m6":
        width = -(-count // 8) * 8
        return width, width
    return -(-count // domains.BLOCK) * domains.BLOCK, domains.BLOCK


def cast_back_sweep(spec: OpSpec, impls: dict[str, Impl], settings: Settings,
                    log: Callable[[str], None]) -> list[SweepRun]:
    """Every code of each element format (or the first `settings.slice`) at every sf of the set,
    dequantised to bf16 and to fp32 (e2m1's 16 codes fill a 128-element block eight times over)."""
    odev = oracle_device()
    runs = []
    for fmt in settings.fmts:
        f = formats.get(fmt)
        count = min(settings.slice or (1 << f.bits), 1 << f.bits)
        width, bk = _cast_back_layout(fmt, count)
        sfs = settings.sf_set(fmt)
        domain = f"every {fmt} code" if count == 1 << f.bits else f"{fmt} codes 0x0-{count - 1:#x}"
        codes_row = torch.arange(width, device=odev) % count
        codes = codes_row.repeat(len(sfs), 1)
        sf_rows = torch.tensor([s.value for s in sfs], dtype=torch.float32, device=odev)
        for out_name, out_dtype in CAST_BACK_OUT.items():
            if settings.out_of_time():
                log(f"cast_back sweep of {fmt} -> {out_name}: not run, the time budget is spent")
                continue
            run = _new_run("cast_back", spec, out_name, f"out @ {domain}, {len(sfs)} sf", width * len(sfs),
                           impls, out_name, CAST_BACK_POLICY)
            run.scale_factors = [dataclasses.asdict(s) for s in sfs]
            began = time.perf_counter()
            start = time.perf_counter()
            sf_elements = sf_rows.double()[:, None].expand(-1, width)
            exact = (enc.decode(codes, fmt) * sf_elements).reshape(-1)
            expected = enc.encode(exact, out_name)
            _sync(odev)
            run.oracle_s += time.perf_counter() - start
            for name, impl in _live(run, impls).items():
                device = impl.resolve_device()
                sf = sf_rows[:, None].expand(-1, width // bk).contiguous()
                out = call(run, name, impl, {"data": enc.storage_of_codes(codes, fmt).to(device),
                                             "sf": sf.to(device), "fmt": fmt, "block": [1, bk],
                                             "out_dtype": out_dtype})
                if out is None:
                    continue
                bits = formats.get(out_name).bits
                actual = out.view(torch.int16 if bits == 16 else torch.int32).to(odev).to(torch.int64).reshape(-1)
                actual = actual & ((1 << bits) - 1)
                run.tallies[name].add(actual, expected, exact, inputs=codes.reshape(-1), sf=sf_elements.reshape(-1),
                                      describe=_hex(-(-f.bits // 4)))
            run.covered, run.wall_s = run.total, time.perf_counter() - began
            runs.append(run)
            log(f"cast_back sweep of {fmt} -> {out_name}: {run.total} codes x sf in {run.wall_s:.2f} s")
    return runs
