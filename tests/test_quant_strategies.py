"""The quantisation family's strategies: every named feature of the per-token, precomputed-sf, cast_back,
SwiGLU and block-cast strategies is reached, the cases stay within the declared sets and survive a case file,
and the fast e5m6 encode model equals the shipped one and the oracle."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

import references.quant as ref
import strategies.quant as sq
import strategies.quant_castback as sqc
from tkverify import formats
from tkverify.case import Case, load_case, save_case

NAN, INF = float("nan"), float("inf")
FORMATS = ("e4m3", "e2m1", "e5m6")


def search(max_examples: int) -> settings:
    return settings(max_examples=max_examples, derandomize=True, database=None, deadline=None,
                    phases=[Phase.generate], suppress_health_check=list(HealthCheck))

# -- (d) strategy coverage ---------------------------------------------------------------------------


def features_reached(strategy, features: dict, max_examples: int) -> set[str]:
    seen: set[str] = set()

    def all_seen(value) -> bool:
        seen.update(name for name, has in features.items() if name not in seen and has(value))
        return len(seen) == len(features)

    try:
        find(strategy, all_seen, settings=search(max_examples))
    except NoSuchExample:
        pass
    return seen


def _cast_view(case: Case, block=None):
    """(x64, block, exact clamped amax per block, oracle sf, quotients) of a cast case."""
    p = case.params
    block = block or (1, p["num_per_channels"])
    x64 = ref.as_float64(case.inputs["x"])
    amax = ref.block_amax(x64, block)
    sf = ref.stored_scales(ref.exact_scales(x64, p["fmt"], block, p["round_sf"], p["clamp_min"]))
    return x64, block, amax, sf, ref.quotients(x64, sf, block)


def _near_midpoint(case: Case, side: str) -> bool:
    x64, block, amax, sf, q = _cast_view(case)
    values = sq.format_values(case.params["fmt"])
    mids = (values[:-1] + values[1:]) / 2
    a = np.abs(q[np.isfinite(q) & (q != 0)])
    if not a.size:
        return False
    i = np.clip(np.searchsorted(mids, a), 1, len(mids) - 1)
    nearest = np.where(np.abs(mids[i] - a) < np.abs(mids[i - 1] - a), mids[i], mids[i - 1])
    rel = (a - nearest) / nearest
    close = 2.0**-7 if case.inputs["x"].dtype == torch.bfloat16 else 2.0**-21
    if side == "on":
        return bool(np.any(rel == 0))
    return bool(np.any((rel < 0) & (rel >= -close))) if side == "below" else bool(np.any((rel > 0) & (rel <= close)))


def _subnormal_output(fmt: str):
    def has(case: Case) -> bool:
        if case.params["fmt"] != fmt:
            return False
        _, _, _, _, q = _cast_view(case)
        f = formats.get(fmt)
        a = np.abs(q[np.isfinite(q)])
        return bool(np.any((a >= f.min_subnormal) & (a < 2.0**f.emin)))
    return has


def _amax_vs_clamp(where: int):
    def has(case: Case) -> bool:
        p = case.params
        x64, block, amax, _, _ = _cast_view(case)
        dtype = "bf16" if case.inputs["x"].dtype == torch.bfloat16 else "fp32"
        cm = ref.clamp_min_value(p["fmt"], p["clamp_min"])
        at = sq.round_to_dtype(np.array([cm]), dtype)
        target = sq.step_ulps(at, np.array([where]), dtype)[0]
        return bool(np.any(amax == target))
    return has


def _block_property(predicate):
    def has(case: Case) -> bool:
        x64, block, amax, sf, q = _cast_view(case)
        return bool(np.any(predicate(x64, block, amax, case)))
    return has


def _outlier_blocks(x64, block, amax, case):
    blocks = np.abs(sq._as_blocks(np.where(np.isfinite(x64), x64, 0.0), block))
    if not blocks.size:
        return False
    top2 = np.sort(blocks, axis=1)[:, -2:] if blocks.shape[1] > 1 else np.zeros((len(blocks), 2))
    return (top2[:, 1] > 0) & (top2[:, 1] >= 2.0**20 * np.maximum(top2[:, 0], 2.0**-149))


def _pow2_amax(offset: int):
    def has(case: Case) -> bool:
        p = case.params
        if case.inputs["x"].dtype != torch.bfloat16:
            return False
        _, _, amax, _, _ = _cast_view(case)
        a = amax[np.isfinite(amax) & (amax > 0)]
        below_power = sq.step_ulps(a, np.full(a.shape, -offset), "bf16") / ref.MAX_Q[p["fmt"]]
        return bool(np.any(ref.is_power_of_two(below_power)))
    return has


def _midpoint_feature(fmt: str, side: str):
    return lambda c: c.params["fmt"] == fmt and _near_midpoint(c, side)


PER_TOKEN_FEATURES = {
    **{f"{side}_midpoint_{fmt}": _midpoint_feature(fmt, side) for fmt in FORMATS for side in ("on", "below", "above")},
    "subnormal_e4m3": _subnormal_output("e4m3"),
    "subnormal_e2m1": _subnormal_output("e2m1"),
    "subnormal_e5m6": _subnormal_output("e5m6"),
    "amax_below_clamp_min": _amax_vs_clamp(-1),
    "amax_at_clamp_min": _amax_vs_clamp(0),
    "amax_above_clamp_min": _amax_vs_clamp(1),
    "subnormal_input": lambda c: bool(np.any((np.abs(ref.as_float64(c.inputs["x"])) < 2.0**-126)
                                             & (ref.as_float64(c.inputs["x"]) != 0))),
    "all_zero_block": _block_property(lambda x, b, amax, c: amax == 0),
    "saturation_edge": _block_property(
        lambda x, b, amax, c: np.isfinite(amax) & (amax > 0)
        & (amax / ref.stored_scales(ref.exact_scales(x, c.params["fmt"], b, c.params["round_sf"],
                                                     c.params["clamp_min"])) >= ref.MAX_Q[c.params["fmt"]])),
    "outlier": _block_property(_outlier_blocks),
    "nan_block": _block_property(lambda x, b, amax, c: np.isnan(amax)),
    "inf_block": _block_property(lambda x, b, amax, c: np.isinf(amax)),
    "pow2_amax_bf16": _pow2_amax(0),
    "pow2_amax_plus_one_ulp": _pow2_amax(1),
    "pow2_amax_minus_one_ulp": _pow2_amax(-1),
    "dtype_max": lambda c: bool(np.any(np.abs(ref.as_float64(c.inputs["x"])) >= 3.3e38)),
    "t0": lambda c: c.inputs["x"].shape[0] == 0,
    "t1": lambda c: c.inputs["x"].shape[0] == 1,
    "odd_t": lambda c: c.inputs["x"].shape[0] % 2 == 1 and c.inputs["x"].shape[0] > 1,
    "large_t": lambda c: c.inputs["x"].shape[0] > 129,
    "bf16": lambda c: c.inputs["x"].dtype == torch.bfloat16,
    "fp32": lambda c: c.inputs["x"].dtype == torch.float32,
    "e4m3": lambda c: c.params["fmt"] == "e4m3",
    "e2m1": lambda c: c.params["fmt"] == "e2m1",
    "e5m6": lambda c: c.params["fmt"] == "e5m6",
    "round_sf": lambda c: c.params["round_sf"] and not c.params["use_ue8m0"],
    "ue8m0": lambda c: c.params["use_ue8m0"] and not c.params["use_packed_ue8m0"],
    "packed_ue8m0": lambda c: c.params["use_packed_ue8m0"],
    "column_major": lambda c: c.params["use_tma_aligned_col_major_sf"],
    "custom_clamp_min": lambda c: c.params["clamp_min"] is not None,
    "npc_equals_h": lambda c: c.params["num_per_channels"] == c.inputs["x"].shape[1],
    "npc_16": lambda c: c.params["num_per_channels"] == 16,
}


def test_per_token_strategy_reaches_every_feature():
    seen = features_reached(sq.per_token_cast_cases(), PER_TOKEN_FEATURES, 600)
    assert seen == set(PER_TOKEN_FEATURES), set(PER_TOKEN_FEATURES) - seen


def _precomputed_past_max(case: Case) -> bool:
    p = case.params
    x64 = ref.as_float64(case.inputs["x"])
    sf = ref.sf_logical_values(case.inputs["sf"], x64.shape[1] // p["num_per_channels"])
    with np.errstate(invalid="ignore", divide="ignore"):
        q = np.abs(ref.quotients(x64, sf, (1, p["num_per_channels"])))
    return q


PAST_MAX_MIDPOINT = {"e4m3": 464.0, "e2m1": 7.0, "e5m6": 65280.0}


def _past_max(fmt: str, where: str):
    def has(case: Case) -> bool:
        if case.params["fmt"] != fmt:
            return False
        q, top = _precomputed_past_max(case), ref.MAX_Q[fmt]
        if where == "hair":
            return bool(np.any((q > top) & (q < top * 1.01)))
        return bool(np.any(np.isclose(q, PAST_MAX_MIDPOINT[fmt], rtol=2.0**-18)))
    return has


PRECOMPUTED_FEATURES = {
    **{f"past_max_{where}_{fmt}": _past_max(fmt, where) for fmt in FORMATS for where in ("hair", "midpoint")},
    "far_past_max": lambda c: bool(np.any(np.isfinite(_precomputed_past_max(c))
                                          & (_precomputed_past_max(c) > 1e5 * ref.MAX_Q[c.params["fmt"]]))),
    "zero_sf": lambda c: bool(np.any(ref.sf_logical_values(c.inputs["sf"], 1 << 30)[:, :] == 0)),
    "nan_sf": lambda c: bool(np.any(np.isnan(ref.as_float64(c.inputs["sf"])))) if c.inputs["sf"].dtype == torch.float32
    else bool(np.any(ref.sf_logical_values(c.inputs["sf"], 1 << 30) != ref.sf_logical_values(c.inputs["sf"], 1 << 30))),
    "ue8m0_sf": lambda c: c.inputs["sf"].dtype == torch.uint8,
    "packed_sf": lambda c: c.inputs["sf"].dtype == torch.int32,
}


def test_precomputed_sf_strategy_reaches_the_saturation_edges():
    seen = features_reached(sq.precomputed_sf_cases(), PRECOMPUTED_FEATURES, 600)
    assert seen == set(PRECOMPUTED_FEATURES), set(PRECOMPUTED_FEATURES) - seen


def _cast_back_view(case: Case) -> np.ndarray:
    return ref.dequantised(case.inputs["data"], case.inputs["sf"], case.params["fmt"], tuple(case.params["block"]))


def _cast_back_hidden(case: Case) -> int:
    width = case.inputs["data"].shape[1]
    return {"e4m3": width, "e2m1": 2 * width, "e5m6": 2 * width // 3}[case.params["fmt"]]


def _bf16_tie(case: Case) -> bool:
    if case.params["out_dtype"] != "bf16":
        return False
    p = _cast_back_view(case)
    p = p[np.isfinite(p) & (p != 0)]
    twice = formats.BF16.ulp(p) / 2  # p on a bf16 midpoint: (p - rounded) == half a bf16 ULP
    return bool(np.any(np.abs(p - formats.BF16.decode(formats.BF16.encode(p))) == twice))


CAST_BACK_FEATURES = {
    "bf16_tie": _bf16_tie,
    "overflow": lambda c: bool(np.any(np.isinf(_cast_back_view(c)) & np.isfinite(
        formats.get(c.params["fmt"]).decode(ref.data_codes(c.inputs["data"], c.params["fmt"]))))),
    "nan_code": lambda c: c.params["fmt"] != "e2m1" and bool(np.any(np.isnan(
        formats.get(c.params["fmt"]).decode(ref.data_codes(c.inputs["data"], c.params["fmt"]))))),
    "bf16_subnormal": lambda c: c.params["out_dtype"] == "bf16" and bool(np.any(
        (np.abs(_cast_back_view(c)) < 2.0**-126) & (_cast_back_view(c) != 0))),
    "per_block": lambda c: c.params["block"][0] > 1 and c.params["block"][1] > 1,
    "per_channel": lambda c: c.params["block"][1] == 1,
    "packed_sf": lambda c: c.inputs["sf"].dtype == torch.int32,
    "t0": lambda c: c.inputs["data"].shape[0] == 0,
    # rows that start inside an 8-element chunk (the TileLang kernel's flat path), per-token and per-channel
    "token_rows_off_chunks": lambda c: c.params["block"][0] == 1 and _cast_back_hidden(c) % 8 != 0
    and c.inputs["data"].shape[0] > 1,
    "channel_rows_off_chunks": lambda c: c.params["block"][1] == 1 and _cast_back_hidden(c) % 8 != 0
    and c.inputs["data"].shape[0] > 1,
}


def test_cast_back_strategy_reaches_every_feature():
    seen = features_reached(sqc.cast_back_cases(), CAST_BACK_FEATURES, 400)
    assert seen == set(CAST_BACK_FEATURES), set(CAST_BACK_FEATURES) - seen


def _swiglu_view(case: Case):
    return ref.swiglu_rows(case.inputs["x"], case.inputs.get("topk_weights"), case.inputs.get("pos_to_token_topk"),
                           case.params["clamp"])


SWIGLU_FEATURES = {
    "padding_rows": lambda c: bool(_swiglu_view(c)[4].any()),
    "all_padding": lambda c: c.inputs["x"].shape[0] > 0 and bool(_swiglu_view(c)[4].all()),
    "every_count": lambda c: min(_swiglu_view(c)[5]) > 0,
    "l_at_clamp": lambda c: c.params["clamp"] is not None and bool(np.any(
        ref.as_float64(c.inputs["x"])[:, : c.inputs["x"].shape[1] // 2] == np.float32(c.params["clamp"]))),
    "counter_near_int32": lambda c: "clamped_count" in c.inputs and int(c.inputs["clamped_count"][0]) == 2**31 - 1,
    "counter_near_uint32_with_clamps": lambda c: ("clamped_count" in c.inputs
                                                  and int(c.inputs["clamped_count"][0]) == 2**32 - 1
                                                  and min(_swiglu_view(c)[5]) > 0),
    "sigmoid_underflow": lambda c: bool(np.any(ref.as_float64(c.inputs["x"])[:, : c.inputs["x"].shape[1] // 2]
                                               < -88)),
    "nonfinite": lambda c: not bool(np.isfinite(ref.as_float64(c.inputs["x"])).all()),
    "zero_weight": lambda c: "topk_weights" in c.inputs and bool((c.inputs["topk_weights"] == 0).any()),
    "e2m1": lambda c: c.params["fmt"] == "e2m1",
    "e5m6": lambda c: c.params["fmt"] == "e5m6",
    "t0": lambda c: c.inputs["x"].shape[0] == 0,
}


def test_swiglu_strategy_reaches_every_feature():
    seen = features_reached(sq.swiglu_cases(), SWIGLU_FEATURES, 400)
    assert seen == set(SWIGLU_FEATURES), set(SWIGLU_FEATURES) - seen


@pytest.mark.parametrize("strategy", [sq.per_block_cast_cases, sq.per_channel_cast_cases])
def test_block_strategies_have_tails_and_partial_blocks(strategy):
    def partial(case: Case) -> bool:
        bm = case.params["block"][0] if "block" in case.params else case.params["num_per_tokens"]
        return case.inputs["x"].shape[0] % bm != 0 and case.inputs["x"].shape[0] > bm

    features = {"partial_last_block": partial, "t0": lambda c: c.inputs["x"].shape[0] == 0,
                "nan_block": lambda c: bool(np.isnan(ref.as_float64(c.inputs["x"])).any())}
    seen = features_reached(strategy(), features, 300)
    assert seen == set(features), set(features) - seen


def test_block_strategies_reach_the_block_cast_kernel_paths():
    """The TileLang block_cast kernel tiles 128 rows x 128 columns and takes 16-byte vectors
    where H % 8 == 0, else an element path: the strategies reach its tails on both paths."""
    def shape(case: Case) -> tuple[int, int]:
        return tuple(case.inputs["x"].shape)

    channel = {
        "element_path_odd_h": lambda c: shape(c)[1] % 2 == 1,
        "element_path_even_h": lambda c: shape(c)[1] % 8 != 0 and shape(c)[1] % 2 == 0,
        "element_path_past_a_chunk": lambda c: shape(c)[1] % 8 != 0 and shape(c)[1] > 8,
        "vector_path_column_tail": lambda c: shape(c)[1] % 8 == 0 and shape(c)[1] % 128 != 0,
        "vector_path_two_column_tiles": lambda c: shape(c)[1] % 8 == 0 and shape(c)[1] > 128,
        "two_row_tiles": lambda c: shape(c)[0] > 128,
        "fp32_element_path": lambda c: shape(c)[1] % 8 != 0 and c.inputs["x"].dtype == torch.float32,
    }
    seen = features_reached(sq.per_channel_cast_cases(), channel, 600)
    assert seen == set(channel), set(channel) - seen
    block = {
        "column_tail": lambda c: shape(c)[1] % 128 != 0 and shape(c)[1] > 128,
        "narrower_than_a_tile": lambda c: shape(c)[1] < 128,
        "two_row_tiles": lambda c: shape(c)[0] > 128,
        "row_tail_of_32": lambda c: c.params["block"][0] == 32 and shape(c)[0] % 32 != 0 and shape(c)[0] > 32,
    }
    seen = features_reached(sq.per_block_cast_cases(), block, 600)
    assert seen == set(block), set(block) - seen


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(case=st.one_of(sq.per_token_cast_cases(), sq.per_block_cast_cases(), sq.per_channel_cast_cases(),
                      sq.swiglu_cases(), sqc.cast_back_cases(), sq.precomputed_sf_cases()))
def test_cases_stay_within_the_declared_sets(case):
    p = case.params
    tensor = case.inputs.get("x", case.inputs.get("data"))
    assert tensor.numel() <= 2 * sq.MAX_ELEMENTS
    if "num_per_channels" in p:
        hidden = tensor.shape[1] // (2 if "clamp" in p else 1)
        assert p["num_per_channels"] in (*sq.TOKEN_BLOCKS, hidden)
    if "clamp_min" in p and p["clamp_min"] is not None:
        assert p["clamp_min"] in sq.OTHER_CLAMP_MINS[p["fmt"]]
    if "x" in case.inputs:
        assert case.inputs["x"].dtype in (torch.bfloat16, torch.float32)


@pytest.mark.parametrize("strategy", [sq.per_token_cast_cases, sq.precomputed_sf_cases, sq.per_block_cast_cases,
                                      sq.per_channel_cast_cases, sqc.cast_back_cases, sq.swiglu_cases])
def test_cases_survive_a_case_file(strategy, tmp_path):
    """Every tensor kind a quant case holds (bf16, fp8, int8, uint8, int32, int64) and every
    parameter (lists, None, strings) comes back from disk unchanged."""
    @settings(max_examples=15, deadline=None, derandomize=True, database=None)
    @given(case=strategy())
    def round_trip(case):
        path = save_case(tmp_path / "case", case, op="quant.test", impl="torch")
        loaded, _ = load_case(path)
        assert loaded.params == case.params
        assert set(loaded.inputs) == set(case.inputs)
        for name, t in case.inputs.items():
            assert loaded.inputs[name].dtype == t.dtype and loaded.inputs[name].shape == t.shape
            assert torch.equal(loaded.inputs[name].view(torch.uint8), t.contiguous().view(torch.uint8))
    round_trip()


def _e5m6_encode_models():
    """scripts/e5m6_encode_check.py: numpy models of the kernel's two e5m6 encodes."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "e5m6_encode_check.py"
    spec = importlib.util.spec_from_file_location("e5m6_encode_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fast_e5m6_encode_model_equals_the_shipped_one_and_the_oracle():
    """The bit recipe of kernels.quant._e5m6_code_fast (tuning knob fast_e5m6) against the shipped
    _e5m6_code's and the float64 oracle, on the edges and a sample of fp32 patterns (the script
    checks all 2^32: `python scripts/e5m6_encode_check.py --oracle`)."""
    m = _e5m6_encode_models()
    edges = [0.0, 2.0**-149, 2.0**-126, 2.0**-24, 2.0**-21, 2.0**-20, 1.5 * 2.0**-20, 2.5 * 2.0**-20,
             63.5 * 2.0**-20, 2.0**-14, 2.0**-14 * (1 + 2.0**-7), 2.0**-14 * (1 + 3 * 2.0**-7), 1.0 + 2.0**-7,
             1.0 + 3 * 2.0**-7, 1.0 + 2.0**-7 + 2.0**-23, 65024.0, 65279.0, 65280.0, 65536.0, 3e38, INF, NAN]
    e = np.array(edges + [-v for v in edges], np.float32).view(np.uint32)
    near = (e[:, None].astype(np.int64) + np.arange(-2, 3)).ravel() % 2**32
    rng = np.random.default_rng(0)
    b = np.concatenate([near.astype(np.uint32), rng.integers(0, 2**32, 2**20, dtype=np.uint64).astype(np.uint32),
                        np.arange(0x38000000, 0x38000000 + 2**18, dtype=np.uint32),  # around 2^-15 .. 2^-14
                        np.array([0x7F800001, 0x7FC00000, 0xFFFFFFFF, 0xFF800001], np.uint32)])
    fast = m.fast(b)
    np.testing.assert_array_equal(fast, m.shipped(b))
    q = b.view(np.float32)
    finite = np.isfinite(q)
    np.testing.assert_array_equal(fast[finite], formats.E5M6.encode(q[finite].astype(np.float64)).astype(np.uint32))
    assert (fast[~finite & np.isnan(q)] & 0x7FF == 0x7E0).all() and (fast[np.isinf(q)] & 0x7FF == 0x7BF).all()
