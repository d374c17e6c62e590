"""`tkverify sweep` on the CPU: the float64 torch encoder against tkverify.formats, the argument that
the float64 quotient never double-rounds (against fractions.Fraction), sliced sweeps through the torch
implementation, a deliberately broken encoder caught with the right counts, and production-shape rows
at a shrunken scale.  The sweeps themselves run on a GPU (README, "Sweeps and production shapes")."""

from __future__ import annotations

import argparse
import json
from fractions import Fraction

import numpy as np
import pytest
import torch

import references.encode as enc
from tkverify import formats, registry
from tkverify.cli import build_parser
from tkverify.sweep import domains
from tkverify.sweep.elements import Settings, codes16_sweep, fp32_sweep

ENCODED = ("fp32", "bf16", "fp16", "e4m3", "e5m2", "e2m1", "e5m6")


def _same_codes(got: np.ndarray, want: np.ndarray, fmt: formats.Format) -> np.ndarray:
    nan = np.isnan(fmt.decode(want)) & np.isnan(fmt.decode(got))
    return (got == want) | nan


def _edge_values(fmt: formats.Format) -> np.ndarray:
    """Every code's value, every midpoint of neighbours and a float64 step either side of it, the
    saturation edges, subnormals, +-0, +-inf and NaN (where the format has one)."""
    if fmt.bits <= 16:
        values = fmt.decode(fmt.all_codes())
    else:  # fp32: a sample of codes, every binade's ends and subnormals
        rng = np.random.default_rng(1)
        codes = np.concatenate([rng.integers(0, 1 << 32, 1 << 16, dtype=np.uint64).astype(np.uint32),
                                np.arange(0, 1 << 12, dtype=np.uint32), (np.arange(256, dtype=np.uint32) << 23),
                                (np.arange(256, dtype=np.uint32) << 23) - 1])
        values = fmt.decode(codes)
    finite = np.unique(values[np.isfinite(values)])
    mids = (finite[:-1] + finite[1:]) / 2
    edges = [fmt.max_finite, fmt.overflow_threshold, fmt.min_subnormal, fmt.min_subnormal / 2, 0.0, -0.0,
             np.inf, -np.inf, 2.0 ** fmt.emin, 1e300, 1e-300]
    out = np.concatenate([finite, mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf), edges,
                          -np.asarray(edges)])
    return out  # NaN is checked apart (e2m1 has none)


@pytest.mark.parametrize("name", ENCODED)
def test_encoder_matches_the_numpy_reference(name):
    fmt = formats.get(name)
    rng = np.random.default_rng(7)
    patterns = rng.integers(0, 1 << 32, 1 << 18, dtype=np.uint64).astype(np.uint32).view(np.float32)
    with np.errstate(invalid="ignore"):  # signalling NaN patterns
        values = np.concatenate([_edge_values(fmt), patterns.astype(np.float64)])
    values = values[~np.isnan(values)]
    got = enc.encode(torch.from_numpy(values), fmt).numpy()
    want = fmt.encode(values).astype(np.int64)
    assert _same_codes(got, want, fmt).all(), values[~_same_codes(got, want, fmt)][:5]
    if fmt.has_nan:
        nan_codes = enc.encode(torch.tensor([np.nan, -np.nan]), fmt)
        assert torch.isnan(enc.decode(nan_codes, fmt)).all()
    else:
        assert enc.encode(torch.tensor([np.nan]), fmt).tolist() == [enc.E2M1_NAN_CODE]
    if fmt.bits <= 16:
        codes = fmt.all_codes()
        np.testing.assert_array_equal(enc.decode(torch.from_numpy(codes.astype(np.int64)), fmt).numpy(),
                                      fmt.decode(codes))
        np.testing.assert_array_equal(enc.code_distance(torch.from_numpy(codes.astype(np.int64)),
                                                        torch.zeros(codes.size, dtype=torch.int64), fmt).numpy(),
                                      fmt.code_distance(codes, np.zeros_like(codes)))
    exact = values[np.isfinite(values)][:5000]
    np.testing.assert_allclose(enc.ulp_error(enc.decode(torch.from_numpy(want[:5000]), fmt), torch.from_numpy(exact),
                                             fmt).numpy(), fmt.ulp_error(fmt.decode(want[:5000]), exact))


def test_encoder_refuses_formats_without_zero_or_sign():
    with pytest.raises(ValueError, match="ue8m0"):
        enc.encode(torch.ones(1, dtype=torch.float64), "ue8m0")


def _exact_code(q: Fraction, negative: bool, fmt: formats.Format, values: list[Fraction], codes: list[int]) -> int:
    """RNE_sat of an exact rational among the format's non-negative values (codes ascending); `negative`
    is the sign (a zero keeps its own)."""
    a = abs(q)
    if a >= values[-1]:
        code = codes[-1]
    else:
        i = max(k for k, v in enumerate(values) if v <= a)
        low, high = values[i], values[i + 1]
        up = a - low > high - a or (a - low == high - a and codes[i] % 2 == 1)
        code = codes[i + 1] if up else codes[i]
    return code | (1 << (fmt.bits - 1)) if negative else code


@pytest.mark.parametrize("name", ("e4m3", "e2m1", "e5m6"))
@pytest.mark.parametrize("dtype", ("bf16", "fp16"))
def test_float64_quotient_never_double_rounds(name, dtype):
    """x of bf16 or fp16, sf of fp32: encode(fl64(x / sf)) equals RNE_sat of the exact quotient, on random
    pairs and on x placed on a rounding boundary times sf and one input ULP either side."""
    fmt, src = formats.get(name), formats.get(dtype)
    finite = fmt.decode(fmt.all_codes())
    positive = np.unique(np.abs(finite[np.isfinite(finite)]))  # +0, not -0, for the zero
    values = [Fraction(v) for v in positive]
    codes = [int(fmt.encode(np.array([v]))[0]) for v in positive]
    rng = np.random.default_rng(11)
    sf = np.float32(np.exp2(rng.uniform(-12, 12, 400)) * rng.uniform(1, 2, 400)).astype(np.float64)
    boundaries = np.concatenate([positive, (positive[:-1] + positive[1:]) / 2])
    targets = boundaries[rng.integers(0, boundaries.size, 400)] * sf
    near = src.decode(src.encode(targets))
    step = src.ulp(near)
    x = np.concatenate([near, near + step, near - step, src.decode(src.encode(rng.standard_normal(400) * 8))])
    sf = np.tile(sf, 4)
    x = src.decode(src.encode(x))  # every x a value of the input dtype
    keep = np.isfinite(x)
    x, sf = x[keep], sf[keep]
    got = enc.encode(torch.from_numpy(x) / torch.from_numpy(sf), fmt).tolist()
    want = [_exact_code(Fraction(a) / Fraction(b), bool(np.signbit(a)), fmt, values, codes) for a, b in zip(x, sf)]
    assert got == want


def _torch_only() -> dict:
    return {"torch": registry.get("quant.per_token_cast_with_precomputed_sf").impls["torch"]}


def test_sliced_sweeps_of_the_torch_implementation_have_no_deviation():
    spec = registry.get("quant.per_token_cast_with_precomputed_sf")
    settings = Settings(slice=1 << 16, sf_limit=3)
    runs = fp32_sweep(spec, _torch_only(), settings, log=lambda _: None)
    runs += codes16_sweep(spec, _torch_only(), Settings(slice=512, sf_limit=3), "bf16", log=lambda _: None)
    assert [r.fmt for r in runs] == ["e4m3", "e2m1", "e5m6"] * 2
    for run in runs:
        (tally,) = run.tallies.values()
        assert tally.deviations == 0, tally.examples
        assert tally.count == (1 << 16 if run.name == "fp32" else 512 * 3)
        (row,) = run.rows()
        assert row.coverage == "exhaustive" and row.verdict == "pass" and row.exact == 1.0
        assert row.count == tally.count and row.max_ulp <= 0.5


def truncating_e4m3(x, sf, fmt="e4m3", num_per_channels=128):
    """A broken e4m3 encoder: the fp32 quotient truncated towards zero at e4m3's spacing, not rounded."""
    q = (x.float() / sf.float().repeat_interleave(num_per_channels, 1)).double()
    mag = q.abs()
    _, exponent = torch.frexp(mag)
    e = torch.clamp_min(exponent.long() - 1, -6)
    step = enc.pow2(e - 3)
    truncated = torch.clamp_max(torch.floor(mag / step) * step, 448.0)
    return torch.copysign(torch.where(torch.isnan(q), q, truncated), q).float().to(torch.float8_e4m3fn)


def test_a_truncating_encoder_is_caught_with_the_right_counts():
    spec = registry.get("quant.per_token_cast_with_precomputed_sf")
    broken = {"truncating": registry.Impl("truncating", truncating_e4m3, device="cpu")}
    settings = Settings(fmts=("e4m3",), slice=1 << 16, sf_limit=3)
    (run,) = codes16_sweep(spec, broken, settings, "bf16", log=lambda _: None)
    tally = run.tallies["truncating"]
    # The expected count: the elements whose correctly rounded code is not the truncated one.
    x = domains.codes_16(torch.bfloat16, 1 << 16, torch.device("cpu")).double()
    wrong = 0
    for sf in settings.sf_set("e4m3"):
        q = x / sf.value
        finite = torch.isfinite(q)
        truncated = truncating_e4m3(x.reshape(1, -1).float(), torch.tensor([[sf.value]]), num_per_channels=1 << 16)
        codes = truncated.view(torch.uint8).reshape(-1).long()
        right = enc.encode(q, "e4m3")
        wrong += int(((codes != right) & finite & (enc.decode(right, "e4m3") != 0)).sum())
    assert tally.deviations - tally.allowed == wrong > 1000
    (row,) = run.rows()
    assert row.verdict == "fail" and row.exact < 1 and len(tally.examples) == 10
    assert not tally.examples[0]["allowed"] and tally.examples[0]["actual_code"] != tally.examples[0]["expected_code"]


def _run_cli(tmp_path, *argv) -> tuple[int, dict]:
    args = build_parser().parse_args(["sweep", "--out", str(tmp_path), "--impl", "torch", *argv])
    rc = args.func(args)
    return rc, json.loads((tmp_path / "sweep.json").read_text())


def test_sweep_command_writes_reports_and_deviation_tables(tmp_path):
    rc, doc = _run_cli(tmp_path, "--parts", "bf16,cast_back", "--slice", "512", "--sf-limit", "3")
    assert rc == 0
    labels = {(r["op"], r["output"], r["format"]) for r in doc["rows"]}
    assert ("quant.per_token_cast_with_precomputed_sf", "data @ bf16 x 0x0000-0x01ff, 3 sf", "e5m6") in labels
    assert ("quant.cast_back", "out @ every e4m3 code, 3 sf", "bf16") in labels
    assert all(r["coverage"] == "exhaustive" and r["verdict"] == "pass" for r in doc["rows"])
    assert {s["sweep"] for s in doc["sweeps"]} == {"bf16", "cast_back"}
    assert all(s["wall_s"] >= s["oracle_s"] >= 0 for s in doc["sweeps"])
    report = json.loads((tmp_path / "report.json").read_text())
    assert len(report["results"]) == len(doc["rows"]) and report["meta"]["profile"] == "sweep"
    assert "## Sweeps" in (tmp_path / "sweep.md").read_text()


def test_production_rows_at_a_shrunken_scale(tmp_path):
    rc, doc = _run_cli(tmp_path, "--parts", "none", "--production", "-k",
                       "per_token_cast_with_precomputed,quant.cast_back", "--shape-scale", "0.0005")
    assert rc == 0
    outputs = {(r["op"], r["output"]) for r in doc["rows"]}
    assert ("quant.cast_back", "out @ bench T16384 H7168 e4m3/128 -> bf16") in outputs
    assert all(r["coverage"] == "sampled" and r["count"] > 0 for r in doc["rows"])
    assert all(p["oracle"] == "device float64" and p["oracle_s"] > 0 for p in doc["production"])


def test_production_shapes_are_written_as_they_finish_and_judge_host_ops_once(tmp_path, monkeypatch):
    """A run cut short keeps the shapes it judged (the report is rewritten after each), and a host-judged op's
    float64 oracle runs once per shape, whatever the number of implementations."""
    from tkverify.sweep import production
    calls = []
    real_oracle = production.oracle_outputs
    monkeypatch.setattr(production, "oracle_outputs", lambda spec, case: calls.append(spec.name) or real_oracle(spec, case))
    written = []
    real_write = __import__("tkverify.sweep", fromlist=["write_outputs"]).write_outputs

    def counting_write(out, doc, sweeps, shapes):
        written.append(len(shapes))
        return real_write(out, doc, sweeps, shapes)

    monkeypatch.setattr("tkverify.sweep.write_outputs", counting_write)
    real_chosen = production.chosen_impls

    def twice(spec, wanted):  # the torch implementation under two names: two implementations of one shape
        impls, unavailable = real_chosen(spec, wanted)
        return {**impls, "torch_again": impls["torch"]}, unavailable

    monkeypatch.setattr(production, "chosen_impls", twice)
    rc, doc = _run_cli(tmp_path, "--parts", "none", "--production", "-k", "moe.normalize_weight",
                       "--shape-scale", "0.001", "--impl", "torch")
    assert rc == 0 and doc["production"], doc
    shapes = len(doc["production"])
    assert written == [0, *range(1, shapes + 1), shapes]
    judged = [p for p in doc["production"] if not p.get("skipped")]
    assert calls.count("moe.normalize_weight") == 2 * len(judged)  # the pilot's and the shape's, not one an impl
    assert {r["impl"] for r in doc["rows"]} == {"torch", "torch_again"}


def test_routed_pilots_keep_every_position_inside_their_rows():
    """A routed bench shape's pilot is its routing rebuilt for fewer tokens: cutting the inputs' leading
    dimension would leave positions past the cut rows (a kernel reading out of bounds)."""
    device = torch.device("cpu")
    for op in ("moe.expand_to_fused", "moe.reduce_fused"):
        shape = registry.get(op).bench[0]
        inputs, params = shape.pilot(device, 1 / 64)
        pos = inputs["token_topk_to_pos"]
        rows = params["num_expanded_rows"] if op == "moe.expand_to_fused" else inputs["x"].shape[0]
        whole = 16384 * 8 + 256 * 127  # the most rows the whole shape's routing can have
        assert pos.shape[0] == 16384 // 64 and int(pos.max()) < rows < whole // 4, (op, rows)


def test_the_pilot_cuts_the_token_axis_behind_a_leading_one():
    """An mHC residual is (a = 1, tokens, H): its pilot cuts the tokens, not the singleton, and every other
    input along the same axis wherever it has it."""
    from tkverify.sweep import production
    inputs = {"x": torch.zeros(1, 256, 8), "mix": torch.zeros(2, 256, 4), "w": torch.zeros(8)}
    cut = production.shrink(inputs, 1 / 64)
    assert [tuple(v.shape) for v in cut.values()] == [(1, 4, 8), (2, 4, 4), (8,)]
    assert production.shrink({"x": torch.zeros(1, 1)}, 1 / 64)["x"].shape == (1, 1)  # nothing longer than one


@pytest.mark.parametrize("op", ["mhc.pre_big_fuse", "mhc.reduce_partials_and_rmsnorm"])
def test_a_shape_whose_first_axis_is_not_the_tokens_is_cut_along_its_token_axis(op):
    """The split-K partials (S, tokens, ...) come first: the cut keeps the 16 splits and cuts the tokens, in
    every input that has them (the residual's first axis, the partials' second)."""
    from tkverify.sweep import chunks, production
    (shape,) = registry.get(op).bench
    inputs, _ = shape.make(torch.device("cpu"))
    assert chunks.token_count(inputs, shape.token_axis) == 16384
    cut = production.shrink(inputs, 40 / 16384, shape.token_axis)
    for name, value in inputs.items():
        expected = tuple(40 if n == 16384 else n for n in value.shape)
        assert tuple(cut[name].shape) == expected, name


@pytest.mark.parametrize("op", ["mhc.post", "mhc.multilayer_recompute", "mhc.pre_big_fuse",
                                "mhc.reduce_partials_and_rmsnorm"])
def test_a_row_local_shape_judged_in_chunks_gives_the_whole_shapes_rows(op):
    """Token chunks on two threads fold into the rows the whole shape gives: the same counts,
    errors, histogram, share of the bound and verdict, the worst element named by its index in the whole
    output (only ``cases``, the chunks, differs)."""
    from tkverify.sweep import chunks, production
    spec = registry.get(op)
    (shape,) = spec.bench
    assert shape.row_local
    inputs, params = shape.make(torch.device("cpu"))
    inputs = production.shrink(inputs, 40 / 16384, shape.token_axis)  # 40 tokens (no other axis is 40 long)
    impl = spec.impls["torch"]
    outputs = production.name_outputs(spec, impl.function()(**inputs, **params), "torch")
    run = production.ShapeRun(op, shape.name, "host numpy")
    whole = production.HostOracle(spec, inputs, params).rows(run, "torch", outputs)
    chunked = chunks.judge_in_chunks(spec, inputs, params, {"torch": outputs}, run.label, workers=2, chunk_tokens=5,
                                     token_axis=shape.token_axis)
    assert len(chunked) == len(whole)
    for w in whole:
        (c,) = [r for r in chunked if r.key == w.key]
        assert c.cases == 8 and w.cases == 1
        for field in ("count", "exact_count", "max_ulp", "hist", "verdict", "bound_used", "extra"):
            assert getattr(c, field) == getattr(w, field), (w.output, field)
        assert c.sum_ulp == pytest.approx(w.sum_ulp, rel=1e-12, abs=1e-300)
        if w.max_ulp > 0:
            assert c.worst["ulp"] == w.worst["ulp"]
            index = tuple(c.worst["index"])
            named = float(outputs[w.output.split(" @")[0]][index])  # the value at that index of the whole output
            assert float(c.worst["actual"]) == pytest.approx(named, rel=1e-8)  # as the row prints it: 9 digits


def test_the_pilot_estimate_scales_by_output_elements(monkeypatch):
    """The host oracle's estimate is the pilot's seconds times the ratio of output elements, measured: a
    cut that leaves the outputs whole (ratio 1) is not multiplied by the fraction of tokens it cut."""
    from tkverify.sweep import production

    def one_second(self, run, name, actual):
        run.oracle_s += 1.0
        return []

    monkeypatch.setattr(production.HostOracle, "rows", one_second)
    spec = registry.get("moe.normalize_weight")
    shape, impl = spec.bench[0], spec.impls["torch"]
    inputs, params = shape.make(torch.device("cpu"))
    pilot = production.shrink(inputs, 1 / production.PILOT_FRACTION)
    pilot_elements = production._elements(production.name_outputs(spec, impl.function()(**pilot, **params), "torch"))
    assert pilot_elements < 16384
    estimate = production._pilot_estimate(spec, shape, "torch", impl, inputs, params, {"w": torch.zeros(16)})
    assert estimate == 1.0  # outputs no larger than the pilot's: its seconds, never less
    assert production._pilot_estimate(spec, shape, "torch", impl, inputs, params, {"w": torch.zeros(10 ** 6)}) \
        == pytest.approx(10 ** 6 / pilot_elements)


@pytest.mark.parametrize("estimate, judged", [(10.0, 2), (1e9, 0)])
def test_a_chunked_shape_is_estimated_once_and_judged_whole_or_not_at_all(monkeypatch, estimate, judged):
    """A row-local shape judged in chunks gets one pilot estimate (the first implementation's): under the
    limit every implementation is judged, over it none (no implementation's rows without the others')."""
    from tkverify.sweep import production
    calls = []

    def pilot(*args, **kwargs):
        calls.append(args[2])
        return estimate

    monkeypatch.setattr(production, "_pilot_estimate", pilot)
    spec = registry.get("mhc.post")
    impls = {"torch": spec.impls["torch"], "again": spec.impls["torch"]}
    run = production.shape_run(spec, spec.bench[0], impls, scale=24 / 16384, host_limit_s=100.0, log=lambda m: None,
                               workers=2)
    assert calls == ["torch"]
    assert len({r.impl for r in run.rows}) == judged and (run.skipped is None) == (judged == 2)


def test_drawn_scale_factors_are_recorded_and_seeded():
    a = domains.scale_factors("e4m3", 8, seed=5)
    assert [s.value for s in a] == [s.value for s in domains.scale_factors("e4m3", 8, seed=5)]
    assert [s.kind for s in a[:3]] == ["one", "clamp", "drawn"]
    assert {"power of two", "binade edge", "subnormal"} <= {s.kind for s in a}
    assert len({s.value for s in a}) == len(a)
    assert isinstance(build_parser().parse_args(["sweep"]), argparse.Namespace)
