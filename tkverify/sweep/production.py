"""Verification at production shapes: each op's bench shapes (as `tkverify bench` builds them) judged
once against the float64 oracle, for every implementation, as report rows of their own.

The casts are judged on the device (the oracle in float64 on the GPU, `references.encode`): the data
given the implementation's own sf, exactly as the contract's data policy says, and cast_back's
output bitwise; a cast's sf is judged on the host by the spec's own judgement (`quant_judge.Cast`),
which needs only the block maxima.  Every other op is judged on the host by its spec (oracle,
given, policies), after a pilot on 1/`PILOT_FRACTION` of the tokens estimates the time the whole
shape would take: the pilot's oracle seconds times the ratio of the whole shape's output elements to
the pilot's (measured, not assumed: a cut that leaves the outputs whole costs what the whole shape
does; a row-local shape judged in chunks divides it by the host threads and multiplies it by the
implementations, all judged at once).  A shape estimated over `host_limit_s` is skipped and listed with
the estimate.  The pilot is
the shape's own `BenchShape.pilot` where it has one (a routing rebuilt for fewer tokens), else the
inputs with their token axis cut (the first one's first dimension longer than one, wherever another
input has a dimension of that length); ``shape_scale`` cuts the same way, so that the CPU tests run the
same code.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import torch

import references.encode as enc
from tkverify import formats
from tkverify.case import Case
from tkverify.check import judge, name_outputs, oracle_outputs, run_oracle
from tkverify.policies import Comparison
from tkverify.registry import Impl, OpSpec, Unsupported
from tkverify.report.rows import ResultRow
from tkverify.specs.quant_judge import Cast
from tkverify.sweep.chunks import judge_in_chunks, on_host, token_count, token_rows
from tkverify.sweep.elements import DATA_POLICY, chosen_impls, oracle_device
from tkverify.sweep.judge import Tally, data_allowance

PILOT_FRACTION = 64
# The block of each cast whose data the device path judges, from its parameters.
CAST_BLOCKS: dict[str, Callable[[dict[str, Any]], tuple[int, int]]] = {
    "quant.per_token_cast": lambda p: (1, p.get("num_per_channels", 128)),
    "quant.per_token_cast_with_precomputed_sf": lambda p: (1, p.get("num_per_channels", 128)),
    "quant.per_block_cast": lambda p: tuple(p.get("block", (128, 128))),
    "quant.per_channel_cast": lambda p: (p.get("num_per_tokens", 128), 1),
}
DEVICE_PATHS = (*CAST_BLOCKS, "quant.cast_back")


@dataclasses.dataclass
class ShapeRun:
    """One bench shape of one op: its rows, the oracle's seconds and where it ran, or why it was skipped."""

    op: str
    shape: str
    oracle: str  # "device float64" or "host numpy"
    rows: list[ResultRow] = dataclasses.field(default_factory=list)
    oracle_s: float = 0.0
    impl_s: dict[str, float] = dataclasses.field(default_factory=dict)
    skipped: str | None = None
    refused: dict[str, str] = dataclasses.field(default_factory=dict)
    unavailable: dict[str, str] = dataclasses.field(default_factory=dict)

    def label(self, output: str) -> str:
        return f"{output} @ bench {self.shape}"

    def summary(self) -> dict[str, Any]:
        return {"op": self.op, "shape": self.shape, "oracle": self.oracle, "oracle_s": self.oracle_s,
                "impl_s": self.impl_s, "skipped": self.skipped, "refused": self.refused,
                "unavailable": self.unavailable, "rows": len(self.rows)}


def shrink(inputs: dict[str, Any], fraction: float, axis: tuple[str, int] | None = None) -> dict[str, Any]:
    """The inputs with their token axis cut to `fraction` of it (at least one): `axis` (the shape's
    `token_axis`), else the first dimension of the first tensor that is longer than one (an mHC residual's
    (a = 1, tokens, H) its second), and in every other tensor the first dimension of that length (a stack of
    layers' (L, tokens, m) mixes, its second), as `tkverify.sweep.chunks` cuts a shape into chunks."""
    tokens = token_count(inputs, axis)
    if fraction >= 1 or tokens == 1:
        return inputs
    keep = max(1, int(tokens * fraction))
    return {k: token_rows(v, tokens, 0, keep) for k, v in inputs.items()}


def _call(run: ShapeRun, name: str, impl: Impl, inputs: dict[str, Any], params: dict[str, Any]) -> Any:
    device = impl.resolve_device()
    moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    start = time.perf_counter()
    out = impl.function()(**moved, **params)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    run.impl_s[name] = run.impl_s.get(name, 0.0) + time.perf_counter() - start
    return out


def sf_values(sf: torch.Tensor, cols: int) -> torch.Tensor:
    """float64 (rows, cols) values of a stored sf of any storage and layout, on its device."""
    if sf.dtype == torch.float32:
        return sf.double()
    codes = sf if sf.dtype == torch.uint8 else sf.contiguous().view(torch.uint8).reshape(sf.shape[0], -1)[:, :cols]
    codes = codes.to(torch.int64)
    return torch.where(codes == 0xFF, torch.nan, enc.pow2(codes - 127))


def _device_data(run: ShapeRun, name: str, spec: OpSpec, x: torch.Tensor, data: Any, sf: torch.Tensor,
                 params: dict[str, Any]) -> None:
    """The data row of a cast, judged on the device given the sf it was quantised with."""
    fmt = params.get("fmt", "e4m3")
    bm, bk = CAST_BLOCKS[spec.name](params)
    odev = oracle_device()
    tally = Tally(spec.name, run.label("data"), fmt, name, DATA_POLICY)
    start = time.perf_counter()
    x64 = x.to(odev).double()
    rows, cols = x64.shape
    sf64 = sf_values(sf.to(odev), cols // bk).repeat_interleave(bm, 0)[:rows].repeat_interleave(bk, 1)
    quotient = (x64 / sf64).reshape(-1)
    expected = enc.encode(quotient, fmt)
    free = torch.isnan(quotient) if not formats.get(fmt).has_nan else None
    if odev.type == "cuda":
        torch.cuda.synchronize(odev)
    run.oracle_s += time.perf_counter() - start
    actual = enc.storage_codes(data.to(odev), fmt).reshape(-1)
    bits = x.to(odev).view(torch.int16 if x.element_size() == 2 else torch.int32).to(torch.int64).reshape(-1)
    width = 2 * x.element_size()  # hex digits of an input's bits
    tally.add(actual, expected, quotient, inputs=bits & ((1 << 4 * width) - 1), sf=sf64.reshape(-1),
              unconstrained=free, allowance=data_allowance(fmt, quotient, sf64.reshape(-1)),
              describe=lambda b: f"x bits 0x{b:0{width}x}")
    run.rows.append(tally.row("sampled"))


def _host_sf(run: ShapeRun, name: str, spec: OpSpec, x: torch.Tensor, sf: torch.Tensor,
             params: dict[str, Any]) -> None:
    """The sf row of a cast, judged on the host by the spec's own judgement."""
    start = time.perf_counter()
    cast = Cast(x.detach().cpu().double().numpy(), params.get("fmt", "e4m3"), CAST_BLOCKS[spec.name](params),
                round_sf=params.get("round_sf", False), use_ue8m0=params.get("use_ue8m0", False),
                use_packed_ue8m0=params.get("use_packed_ue8m0", False),
                col_major=params.get("use_tma_aligned_col_major_sf", False), clamp_min=params.get("clamp_min"))
    judgement, _ = cast.judge_sf(sf.cpu())
    comparison = spec.outputs["sf"].compare(run.label("sf"), None, judgement)
    run.oracle_s += time.perf_counter() - start
    run.rows.append(ResultRow.of(spec.name, name, comparison))


def _device_cast_back(run: ShapeRun, name: str, out: torch.Tensor, inputs: dict[str, Any],
                      params: dict[str, Any]) -> None:
    fmt = params.get("fmt", "e4m3")
    out_fmt = formats.of_dtype(out.dtype).name
    bm, bk = tuple(params.get("block", (1, 128)))
    odev = oracle_device()
    start = time.perf_counter()
    codes = enc.storage_codes(inputs["data"].to(odev), fmt)
    rows, cols = codes.shape
    sf64 = sf_values(inputs["sf"].to(odev), cols // bk).repeat_interleave(bm, 0)[:rows].repeat_interleave(bk, 1)
    exact = (enc.decode(codes, fmt) * sf64).reshape(-1)
    expected = enc.encode(exact, out_fmt)
    if odev.type == "cuda":
        torch.cuda.synchronize(odev)
    run.oracle_s += time.perf_counter() - start
    bits = formats.get(out_fmt).bits
    actual = out.to(odev).view(torch.int16 if bits == 16 else torch.int32).to(torch.int64).reshape(-1)
    tally = Tally(run.op, run.label("out"), out_fmt, name, "bitwise: q * sf (exact) rounded once to out_dtype")
    tally.add(actual & ((1 << bits) - 1), expected, exact, inputs=codes.reshape(-1), sf=sf64.reshape(-1),
              describe=lambda c: f"code {c:#x}")
    run.rows.append(tally.row("sampled"))


def _judge_on_device(run: ShapeRun, name: str, spec: OpSpec, outputs: dict[str, Any], inputs: dict[str, Any],
                     params: dict[str, Any]) -> None:
    if spec.name == "quant.cast_back":
        _device_cast_back(run, name, outputs["out"], inputs, params)
        return
    given_sf = inputs.get("sf")
    sf = given_sf if given_sf is not None else outputs["sf"]
    if given_sf is None:
        _host_sf(run, name, spec, inputs["x"], outputs["sf"], params)
    try:
        _device_data(run, name, spec, inputs["x"], outputs["data"], sf, params)
    except (RuntimeError, ValueError) as e:  # a malformed data or sf tensor: the output fails as a whole
        run.rows.append(ResultRow.of(spec.name, name, Comparison.rejected(
            run.label("data"), params.get("fmt", "e4m3"), "bitwise", f"cannot be judged: {e}")))


class HostOracle:
    """The float64 oracle of one shape on the host, computed once for all its implementations (its outputs
    do not depend on the implementation; the spec's `given` part, which does, runs per implementation)."""

    def __init__(self, spec: OpSpec, inputs: dict[str, Any], params: dict[str, Any]):
        self.spec = spec
        self.case = Case(params, {k: v.detach().cpu() for k, v in inputs.items() if isinstance(v, torch.Tensor)})
        self.outputs: dict[str, Any] | None = None

    def rows(self, run: ShapeRun, name: str, actual: dict[str, Any]) -> list[ResultRow]:
        """The rows of implementation `name`'s outputs; the oracle's and the judging's seconds go to run.oracle_s."""
        start = time.perf_counter()
        if self.outputs is None:
            self.outputs = oracle_outputs(self.spec, self.case)
        comparisons = judge(self.spec, actual, run_oracle(self.spec, self.case, actual, oracle=self.outputs))
        run.oracle_s += time.perf_counter() - start
        return [ResultRow.of(self.spec.name, name, dataclasses.replace(c, output=run.label(c.output)))
                for c in comparisons]


def _elements(outputs: dict[str, Any]) -> int:
    return sum(v.numel() for v in outputs.values() if isinstance(v, torch.Tensor)) or 1


def _pilot_estimate(spec: OpSpec, shape: Any, name: str, impl: Impl, inputs: dict[str, Any],
                    params: dict[str, Any], outputs: dict[str, Any]) -> float:
    """Seconds the host oracle and judgement would take on the whole shape (whose implementation
    `outputs` are given), from a pilot on 1/PILOT_FRACTION of its tokens, scaled by output elements."""
    if shape.pilot is not None:
        pilot_inputs, pilot_params = shape.pilot(oracle_device(), 1 / PILOT_FRACTION)
    else:
        pilot_inputs, pilot_params = shrink(inputs, 1 / PILOT_FRACTION, shape.token_axis), params
    probe = ShapeRun(spec.name, "pilot", "host numpy")
    pilot_outputs = name_outputs(spec, _call(probe, name, impl, pilot_inputs, pilot_params), name)
    HostOracle(spec, pilot_inputs, pilot_params).rows(probe, name, pilot_outputs)
    return probe.oracle_s * max(1.0, _elements(outputs) / _elements(pilot_outputs))


def shape_run(spec: OpSpec, shape: Any, impls: dict[str, Impl], *, scale: float, host_limit_s: float,
              log: Callable[[str], None], workers: int = 1) -> ShapeRun:
    """Every implementation of `impls` on one bench shape, judged: a row-local shape on the host in token
    chunks on `workers` threads (`tkverify.sweep.chunks`), once every implementation has run."""
    device = oracle_device()
    inputs, params = shape.make(device)
    inputs = shrink(inputs, scale, shape.token_axis)
    on_device = spec.name in DEVICE_PATHS
    chunked = not on_device and shape.row_local and workers > 1
    run = ShapeRun(spec.name, shape.name, "device float64" if on_device else
                   f"host numpy, {workers} threads" if chunked else "host numpy")
    host = None if on_device or chunked else HostOracle(spec, inputs, params)  # chunks copy their own slices
    pending: dict[str, dict[str, Any]] = {}
    estimated = on_device  # the host oracle's time is estimated once, on the first implementation that runs
    for name, impl in impls.items():
        try:
            outputs = name_outputs(spec, _call(run, name, impl, inputs, params), name)
            if not estimated:
                estimated = True
                try:
                    estimate = _pilot_estimate(spec, shape, name, impl, inputs, params, outputs)
                    estimate *= len(impls) / workers if chunked else 1
                except Unsupported:
                    raise
                except Exception as e:  # noqa: BLE001 - a cut shape the op rejects: its time stays unknown
                    run.skipped = (f"the pilot on 1/{PILOT_FRACTION} of the tokens failed ({type(e).__name__}: "
                                   f"{str(e)[:150]}), so the host oracle's time is not known")
                    break
                if estimate > host_limit_s:
                    run.skipped = (f"the host oracle would take about {estimate:.0f} s (a pilot on 1/"
                                   f"{PILOT_FRACTION} of the tokens), over the {host_limit_s:g} s limit")
            if run.skipped:
                break
        except Unsupported as e:
            run.refused[name] = e.reason
            continue
        except Exception as e:  # noqa: BLE001 - the implementation's failure, recorded in its rows
            message = f"the implementation raised {type(e).__name__}: {e}"[:400]
            run.rows += [ResultRow.of(spec.name, name, Comparison.rejected(run.label(o), "", "", message))
                         for o in spec.outputs]
            continue
        if on_device:
            _judge_on_device(run, name, spec, outputs, inputs, params)
        elif chunked:
            pending[name] = on_host(outputs)
        else:
            run.rows += host.rows(run, name, outputs)
    if pending:
        start = time.perf_counter()
        run.rows += judge_in_chunks(spec, inputs, params, pending, run.label, workers=workers,
                                    chunk_tokens=max(1, token_count(inputs, shape.token_axis) // (4 * workers)),
                                    token_axis=shape.token_axis)
        run.oracle_s += time.perf_counter() - start
    log(f"production {spec.name} [{shape.name}]: {len(run.rows)} rows, oracle {run.oracle_s:.2f} s ({run.oracle})"
        + (f"; skipped: {run.skipped}" if run.skipped else ""))
    return run


def production_runs(specs: list[OpSpec], wanted: list[str] | None, *, scale: float, host_limit_s: float,
                    out_of_time: Callable[[], bool], log: Callable[[str], None],
                    done: Callable[[list[ShapeRun]], None] = lambda runs: None, workers: int = 1) -> list[ShapeRun]:
    """Every forward bench shape of `specs`, each judged for every available implementation asked for;
    `done` gets the runs so far after each shape (the caller writes them, so a run cut short keeps them)."""
    runs: list[ShapeRun] = []
    for spec in specs:
        for shape in spec.bench:
            if out_of_time():
                runs.append(ShapeRun(spec.name, shape.name, "-", skipped="the time budget is spent"))
                continue
            impls, unavailable = chosen_impls(spec, wanted)
            run = shape_run(spec, shape, impls, scale=scale, host_limit_s=host_limit_s, log=log, workers=workers)
            run.unavailable = unavailable
            runs.append(run)
            done(runs)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return runs
