"""The quantisation family: round trips and rounding bias of the implementations,
argument checks, what the spec's judgement catches (and what it lets through),
and regressions found by the differential suite (the strategies' coverage: tests/test_quant_strategies.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

import references.quant as ref
import strategies.quant as sq
import strategies.quant_block as sqb
from kernels.torch import quant as kq
from tkverify import formats, registry
from tkverify.case import Case
from tkverify.check import VerificationError, check_case
from tkverify.registry import Impl
from tkverify.specs.quant import ReturningClampedCount

NAN, INF = float("nan"), float("inf")
FORMATS = ("e4m3", "e2m1", "e5m6")
IMPLS = ("torch", "tilelang")


def implementation(op: str, name: str) -> Impl:
    spec = registry.get(f"quant.{op}")
    impl = spec.impls[name]
    reason = impl.unavailable_reason()
    if reason:
        pytest.skip(reason)
    return impl


def search(max_examples: int) -> settings:
    return settings(max_examples=max_examples, derandomize=True, database=None, deadline=None,
                    phases=[Phase.generate], suppress_health_check=list(HealthCheck))


def first_failure(op: str, fn, max_examples: int = 300) -> VerificationError | None:
    """The first case of the op's strategy on which `fn` fails the spec (None if it never does)."""
    spec = registry.get(f"quant.{op}")
    impl = Impl("broken", fn, device="cpu")
    failures: list[VerificationError] = []

    def fails(case: Case) -> bool:
        try:
            check_case(spec, impl, case, case_dir=None)
        except VerificationError as e:
            failures.append(e)
            return True
        return False

    try:
        find(spec.strategy(), fails, settings=search(max_examples))
    except NoSuchExample:
        return None
    return failures[-1]


def run_spec(op: str, fn, case: Case):
    spec = registry.get(f"quant.{op}")
    return check_case(spec, Impl("under_test", fn, device="cpu"), case, case_dir=None)


# -- (a) round trip ----------------------------------------------------------------------------


@pytest.mark.parametrize("impl_name", IMPLS)
@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=sq.per_token_cast_cases())
def test_round_trip_is_within_half_a_code_at_the_block_scale(impl_name, case):
    cast = implementation("per_token_cast", impl_name)
    back = implementation("cast_back", impl_name)
    device = cast.resolve_device()
    params = case.params
    fmt, npc = params["fmt"], params["num_per_channels"]
    x = case.inputs["x"].to(device)
    data, sf = cast.function()(x, **params)
    out = back.function()(data, sf, fmt, [1, npc], "fp32")
    x64, out64 = ref.as_float64(x), ref.as_float64(out)
    sf64 = ref.expand_to_elements(ref.sf_logical_values(sf, x64.shape[1] // npc), x64.shape, (1, npc))
    finite = np.isfinite(sf64)
    with np.errstate(invalid="ignore", divide="ignore"):
        q = x64 / sf64
    # Half a code where x / sf lands (the format's spacing there), a hair more for an fp32 quotient
    # that rounded across a boundary, and half an fp32 ULP for the output's own rounding.
    bound = (0.5 + 2.0**-20) * formats.get(fmt).ulp(q) * sf64 + 0.5 * formats.FP32.ulp(out64)
    error = np.abs(out64 - x64)
    # A code can dequantise past the fp32 range (bf16's max with round_sf: 256 * 2^120 = 2^128);
    # correctly rounded, that is inf, and only there may the round trip leave the range.
    exact = ref.dequantised(data, sf, fmt, (1, npc))
    in_range = finite & (np.abs(exact) < 2.0**128 * (1 - 2.0**-25))
    assert np.all(error[in_range] <= bound[in_range]), case.describe()
    assert np.all(np.isinf(out64[finite & ~in_range]))
    if fmt != "e2m1":
        assert np.isnan(out64[~finite]).all()  # NaN blocks stay NaN


# -- (b) rounding bias --------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_to_nearest_even_is_unbiased(fmt):
    """Over values spread uniformly inside random code intervals, half round down; every
    exact midpoint goes to the even code, which is up about half the time."""
    rng = np.random.default_rng(2024)
    values = sq.format_values(fmt)
    n = 200_000
    lo_index = rng.integers(0, len(values) - 1, size=n)
    lo, hi = values[lo_index], values[lo_index + 1]
    x = np.float32(lo + rng.random(n) * (hi - lo)).astype(np.float64)  # fp32: exact as a quotient by sf = 1
    signs = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    midpoints = (lo + hi) / 2
    width = 8 * (n // 8)
    q = np.concatenate([x[:width] * signs[:width], midpoints[:width] * signs[:width]]).reshape(-1, 64)
    data = kq.per_token_cast_with_precomputed_sf(torch.from_numpy(q.astype(np.float32)), torch.ones(len(q), 1),
                                                 fmt, 64)
    got = np.abs(formats.get(fmt).decode(ref.data_codes(data, fmt))).ravel()
    a = np.abs(q).ravel()
    random_part, tie_part = slice(0, width), slice(width, 2 * width)
    inexact = got[random_part] != a[random_part]
    down = np.count_nonzero(got[random_part][inexact] < a[random_part][inexact])
    m = np.count_nonzero(inexact)
    assert abs(down / m - 0.5) <= 4 * math.sqrt(0.25 / m), (down, m)
    # Ties: always the even code, so up exactly where the interval's lower code is odd (half the
    # intervals of e4m3 and e5m6; 3 of the 7 of e2m1)
    codes = formats.get(fmt).encode(got[tie_part])
    assert np.all(codes % 2 == 0)
    up = got[tie_part] > a[tie_part]
    lower_code_odd = (formats.get(fmt).encode(lo[:width]) % 2 == 1)
    assert np.array_equal(up, lower_code_odd)
    share = np.mean(formats.get(fmt).encode(values[:-1]) % 2 == 1)
    assert abs(np.mean(up) - share) <= 4 * math.sqrt(share * (1 - share) / width)


# -- (c) bad input ----------------------------------------------------------------------------------

X = torch.randn(4, 64)
SF = torch.ones(4, 4)
DATA = torch.zeros(4, 64, dtype=torch.float8_e4m3fn)

BAD_CALLS = [
    # (function, args, kwargs, exception, the name the message must contain)
    (kq.per_token_cast, (X.numpy(),), {}, TypeError, "x"),
    (kq.per_token_cast, (X.half(),), {}, TypeError, "x"),
    (kq.per_token_cast, (X[0],), {}, ValueError, "x"),
    (kq.per_token_cast, (X.t(),), {"num_per_channels": 4}, ValueError, "contiguous"),
    (kq.per_token_cast, (torch.randn(4, 0),), {}, ValueError, "x"),
    (kq.per_token_cast, (X, 8), {}, TypeError, "fmt"),
    (kq.per_token_cast, (X, "e5m2"), {}, ValueError, "fmt"),
    (kq.per_token_cast, (X, "e4m3", 48), {}, ValueError, "num_per_channels"),
    (kq.per_token_cast, (X, "e4m3", 16.0), {}, TypeError, "num_per_channels"),
    (kq.per_token_cast, (torch.randn(4, 48), "e4m3", 32), {}, ValueError, "num_per_channels"),
    (kq.per_token_cast, (X, "e5m6", 32), {}, ValueError, "num_per_channels"),
    (kq.per_token_cast, (torch.randn(4, 12), "e5m6", 12), {}, ValueError, "e5m6"),
    (kq.per_token_cast, (torch.randn(4, 7), "e2m1", 7), {}, ValueError, "e2m1"),
    (kq.per_token_cast, (X, "e4m3", 16), {"use_ue8m0": True}, ValueError, "use_ue8m0"),
    (kq.per_token_cast, (X, "e4m3", 16), {"round_sf": True, "use_packed_ue8m0": True}, ValueError,
     "use_packed_ue8m0"),
    (kq.per_token_cast, (X, "e4m3", 16), {"round_sf": 1}, TypeError, "round_sf"),
    (kq.per_token_cast, (X, "e4m3", 16), {"use_tma_aligned_col_major_sf": "yes"}, TypeError,
     "use_tma_aligned_col_major_sf"),
    (kq.per_token_cast, (X, "e4m3", 16), {"clamp_min": 0.0}, ValueError, "clamp_min"),
    (kq.per_token_cast, (X, "e4m3", 16), {"clamp_min": INF}, ValueError, "clamp_min"),
    (kq.per_token_cast, (X, "e4m3", 16), {"clamp_min": "small"}, TypeError, "clamp_min"),
    (kq.per_token_cast, (X, "e2m1", 16), {"clamp_min": 1e-40}, ValueError, "clamp_min"),
    (kq.per_token_cast_with_sf_only, (X, "e4m3", 48), {}, ValueError, "num_per_channels"),
    (kq.per_token_cast_with_sf_only, (X.double(),), {}, TypeError, "x"),
    (kq.per_token_cast_with_precomputed_sf, (X, SF.double(), "e4m3", 16), {}, TypeError, "sf"),
    (kq.per_token_cast_with_precomputed_sf, (X, torch.ones(4, 3), "e4m3", 16), {}, ValueError, "sf"),
    (kq.per_token_cast_with_precomputed_sf, (X, torch.ones(4), "e4m3", 16), {}, ValueError, "sf"),
    (kq.per_token_cast_with_precomputed_sf, (X, torch.ones(4, 4, dtype=torch.int32), "e4m3", 16), {}, ValueError,
     "sf"),
    (kq.per_token_cast_with_precomputed_sf, (X, [1.0], "e4m3", 16), {}, TypeError, "sf"),
    (kq.per_block_cast, (X, "e4m3", (64, 64)), {}, ValueError, "block"),
    (kq.per_block_cast, (X, "e4m3", 32), {}, TypeError, "block"),
    (kq.per_block_cast, (torch.randn(4, 48), "e4m3", (32, 32)), {}, ValueError, "block"),
    (kq.per_block_cast, (X, "e5m6", (32, 32)), {}, ValueError, "fmt"),
    (kq.per_block_cast, (X, "e4m3", (32, 32)), {"use_ue8m0": True}, ValueError, "use_ue8m0"),
    (kq.per_block_cast_with_sf_only, (X, "e4m3", (64, 64)), {}, ValueError, "block"),
    (kq.per_block_cast_with_sf_only, (X, "e5m6", (32, 32)), {}, ValueError, "fmt"),
    (kq.per_block_cast_with_precomputed_sf, (X, torch.ones(4, 1), "e4m3", (32, 32)), {}, ValueError, "sf"),
    (kq.per_block_cast_with_precomputed_sf, (X, torch.ones(1, 1), "e4m3", (128, 128)), {}, ValueError, "block"),
    (kq.per_block_cast_with_precomputed_sf, (X, torch.ones(1, 1).double(), "e4m3", (32, 32)), {}, TypeError, "sf"),
    (kq.per_channel_cast, (X, "e4m3", 8), {}, ValueError, "num_per_tokens"),
    (kq.per_channel_cast, (X, "e5m6", 16), {}, ValueError, "fmt"),
    (kq.per_channel_cast, (torch.randn(4, 5), "e2m1", 16), {}, ValueError, "e2m1"),
    (kq.per_channel_cast, (X.int(), "e4m3", 16), {}, TypeError, "x"),
    (kq.cast_back, (X, SF, "e4m3", (1, 16)), {}, TypeError, "data"),
    (kq.cast_back, (DATA, SF, "e4m3", (1, 16), torch.float16), {}, TypeError, "out_dtype"),
    (kq.cast_back, (DATA, SF, "e4m3", (1, 16), "fp16"), {}, ValueError, "out_dtype"),
    (kq.cast_back, (DATA, SF, "e4m3", (1, 48)), {}, ValueError, "block"),
    (kq.cast_back, (DATA, SF, "e4m3", (2, 2)), {}, ValueError, "block"),
    (kq.cast_back, (DATA, SF, "e4m3", (1, 32)), {}, ValueError, "sf"),
    (kq.cast_back, (DATA, SF.half(), "e4m3", (1, 16)), {}, TypeError, "sf"),
    (kq.cast_back, (DATA.t(), SF, "e4m3", (1, 16)), {}, ValueError, "contiguous"),
    (kq.cast_back, (torch.zeros(4, 10, dtype=torch.uint8), torch.ones(4, 1), "e5m6", (1, 8)), {}, ValueError,
     "data"),
    (kq.cast_back, (torch.zeros(4, 48, dtype=torch.uint8), torch.ones(4, 2), "e5m6", (1, 16)), {}, ValueError,
     "block"),
    (kq.cast_back, (DATA, SF, "e4m3", "1x16"), {}, TypeError, "block"),
]

SWIGLU_X = torch.randn(6, 64)
POS = torch.tensor([0, 1, -1, 2, 3, 4], dtype=torch.int32)
WEIGHTS = torch.rand(3, 2)
COUNT = torch.zeros(3, dtype=torch.int64)
swiglu = kq.swiglu_forward_and_per_token_cast
BAD_CALLS += [
    (swiglu, (torch.randn(6, 63),), {"num_per_channels": 16}, ValueError, "x"),
    (swiglu, (SWIGLU_X, "e4m3", 16), {"topk_weights": WEIGHTS}, ValueError, "pos_to_token_topk"),
    (swiglu, (SWIGLU_X, "e4m3", 16), {"topk_weights": WEIGHTS.double(), "pos_to_token_topk": POS}, TypeError,
     "topk_weights"),
    (swiglu, (SWIGLU_X, "e4m3", 16), {"pos_to_token_topk": POS.long()}, TypeError, "pos_to_token_topk"),
    (swiglu, (SWIGLU_X, "e4m3", 16), {"pos_to_token_topk": POS[:5]}, ValueError, "pos_to_token_topk"),
    (swiglu, (SWIGLU_X, "e4m3", 16), {"pos_to_token_topk": POS - 1}, ValueError, "pos_to_token_topk"),
    (swiglu, (SWIGLU_X, "e4m3", 16), {"topk_weights": WEIGHTS[:2], "pos_to_token_topk": POS}, ValueError,
     "pos_to_token_topk"),
    (swiglu, (SWIGLU_X, "e4m3", 16), {"clamp": -1.0}, ValueError, "clamp"),
    (swiglu, (SWIGLU_X, "e4m3", 16), {"clamp": NAN}, ValueError, "clamp"),
    (swiglu, (SWIGLU_X, "e4m3", 16), {"clamp": "7"}, TypeError, "clamp"),
    (swiglu, (SWIGLU_X, "e4m3", 16), {"clamped_count": COUNT.int()}, TypeError, "clamped_count"),
    (swiglu, (SWIGLU_X, "e4m3", 16), {"clamped_count": torch.zeros(4, dtype=torch.int64)}, ValueError,
     "clamped_count"),
    (swiglu, (SWIGLU_X, "e4m3", 48), {}, ValueError, "num_per_channels"),
    (swiglu, (SWIGLU_X, "e4m3", 16), {"use_packed_ue8m0": True}, ValueError, "use_packed_ue8m0"),
    (swiglu, (SWIGLU_X.bfloat16(), "e5m6", 16), {}, ValueError, "num_per_channels"),
]


@pytest.mark.parametrize("fn, args, kwargs, exception, name", BAD_CALLS,
                         ids=[f"{c[0].__name__}-{c[4]}-{i}" for i, c in enumerate(BAD_CALLS)])
def test_bad_input_is_refused_naming_the_argument(fn, args, kwargs, exception, name):
    with pytest.raises(exception, match=name):
        fn(*args, **kwargs)


def test_every_public_function_is_covered_by_the_bad_input_table():
    public = {n for n in dir(kq) if not n.startswith("_") and callable(getattr(kq, n))
              and getattr(getattr(kq, n), "__module__", "") == kq.__name__}
    assert public == {c[0].__name__ for c in BAD_CALLS}


def test_devices_must_agree():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device to put tensors on two devices")
    with pytest.raises(ValueError, match="sf"):
        kq.per_token_cast_with_precomputed_sf(X.cuda(), SF, "e4m3", 16)


# -- what the judgement catches, and what it lets through ---------------------------------------


def _codes_by_rule(q: np.ndarray, fmt: str, rule: str) -> np.ndarray:
    """Codes of exact quotients rounded by a wrong rule: "truncate" (toward zero) or
    "ties_away" (a tie goes to the larger magnitude); NaN, inf and saturation as RNE_sat."""
    f = formats.get(fmt)
    table = sq.format_values(fmt)
    a = np.abs(np.where(np.isfinite(q), q, 0.0))
    i = np.clip(np.searchsorted(table, a, side="right") - 1, 0, len(table) - 1)
    below, above = table[i], table[np.minimum(i + 1, len(table) - 1)]
    if rule == "truncate":
        magnitude = below
    else:
        tie = (a - below) == (above - a)
        magnitude = np.where(tie, above, f.decode(f.encode(a)))
    magnitude = np.where(a > table[-1], table[-1], magnitude)
    chosen = np.where(np.isfinite(q), np.copysign(magnitude, q), q)
    if not f.has_nan:
        chosen = np.where(np.isnan(chosen), 0.0, chosen)
    return f.encode(chosen)


def _recast_with_rule(rule: str):
    def per_token_cast(x, fmt="e4m3", num_per_channels=128, **options):
        data, sf = kq.per_token_cast(x, fmt, num_per_channels, **options)
        x64 = ref.as_float64(x)
        values = ref.sf_logical_values(sf, x64.shape[1] // num_per_channels)
        q = ref.quotients(x64, values, (1, num_per_channels))
        return ref.pack_data(_codes_by_rule(q, fmt, rule), fmt), sf
    return per_token_cast


def test_truncation_is_caught():
    failure = first_failure("per_token_cast", _recast_with_rule("truncate"))
    assert failure is not None and "output 'data'" in str(failure)


def test_ties_away_from_zero_is_caught():
    failure = first_failure("per_token_cast", _recast_with_rule("ties_away"))
    assert failure is not None and "output 'data'" in str(failure) and "allowed" in str(failure)


def per_token_cast_by_reciprocal(x, fmt="e4m3", num_per_channels=128, **options):
    """A legitimate fp32 kernel: q = x * fl(1 / sf), then RNE of that fp32 product."""
    data, sf = kq.per_token_cast(x, fmt, num_per_channels, **options)
    values = kq._sf_values(sf.contiguous() if not options.get("use_tma_aligned_col_major_sf") else sf,
                           x.shape[1] // num_per_channels)
    reciprocal = 1.0 / kq._to_elements(values, x.shape, (1, num_per_channels))
    q = (x.float() * reciprocal).double().numpy()
    return ref.pack_data(ref.encode_elements(q, fmt), fmt), sf


def test_multiplying_by_a_rounded_reciprocal_passes():
    assert first_failure("per_token_cast", per_token_cast_by_reciprocal, max_examples=80) is None


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_plain_sf_bound_covers_multiplying_by_the_reciprocal_of_max_q(fmt):
    """Exhaustively over fp32 significands (powers of two scale exactly, and a / max_q stays
    normal): fl(a * fl(1 / max_q)) is within the spec's 1.5 ULP of a / max_q (the worst is
    8/7 ULP, for 448; torch on CUDA computes tensor / scalar this way)."""
    from tkverify.specs.quant import SF_PLAIN_ULP
    max_q = ref.MAX_Q[fmt]
    a = (np.arange(2**23, dtype=np.uint32) | np.uint32(0x3F800000)).view(np.float32)
    product = (a * np.float32(1 / np.float32(max_q))).astype(np.float64)
    exact = a.astype(np.float64) / max_q
    worst = float((np.abs(product - exact) / formats.FP32.ulp(exact)).max())
    assert 0.5 < worst <= SF_PLAIN_ULP


def test_an_sf_two_ulps_off_is_caught():
    def sloppy(x, fmt="e4m3", num_per_channels=128, **options):
        data, sf = kq.per_token_cast(x, fmt, num_per_channels, **options)
        if options.get("round_sf") or sf.numel() == 0:
            return data, sf
        off = (sf.contiguous().view(torch.int32) + 2).view(torch.float32)  # 2 ULP up
        return data, kq._column_major(off) if options.get("use_tma_aligned_col_major_sf") else off
    failure = first_failure("per_token_cast", sloppy)
    assert failure is not None and "output 'sf'" in str(failure)


def test_an_amax_that_drops_nan_is_caught():
    def fmax_amax(x, fmt="e4m3", num_per_channels=128, **options):
        return kq.per_token_cast(torch.nan_to_num(x, nan=0.0), fmt, num_per_channels, **options)
    failure = first_failure("per_token_cast", fmax_amax)
    assert failure is not None and "nan" in str(failure).lower()


def test_flushing_subnormal_inputs_to_zero_is_caught():
    """e2m1's default clamp_min puts a block of tiny values at sf = 2^-126, where fp32 subnormal
    inputs quantise to 0.5 and 1: a flush-to-zero kernel writes 0 there (the strategy's clamp_edge
    blocks hold such inputs)."""
    def flush(x, fmt="e4m3", num_per_channels=128, **options):
        tiny = x.float().abs() < 2.0**-126
        return kq.per_token_cast(torch.where(tiny, torch.zeros_like(x), x), fmt, num_per_channels, **options)

    x = torch.zeros(1, 16)
    x[0, :4] = torch.tensor([2.0**-127, -(2.0**-128), 3 * 2.0**-128, 2.0**-149])  # /2^-126: .5, -.25, .75, ~0
    case = Case({"fmt": "e2m1", "num_per_channels": 16}, {"x": x})
    comparisons = run_spec("per_token_cast", kq.per_token_cast, case)
    data = ref.data_codes(kq.per_token_cast(x, "e2m1", 16)[0], "e2m1")
    assert formats.E2M1.decode(data)[0, :4].tolist() == [0.5, -0.0, 1.0, 0.0] and all(c.passed for c in comparisons)
    with pytest.raises(VerificationError, match="output 'data'"):
        run_spec("per_token_cast", flush, case)


def test_a_row_major_sf_where_column_major_was_asked_fails_naming_the_layout():
    x = torch.randn(5, 64)
    params = {"fmt": "e4m3", "num_per_channels": 16, "use_tma_aligned_col_major_sf": True}

    def row_major(x, **kw):
        data, sf = kq.per_token_cast(x, **kw)
        return data, sf.contiguous()

    with pytest.raises(VerificationError, match=r"stride\(0\) == 1"):
        run_spec("per_token_cast", row_major, Case(params, {"x": x}))

    def unpadded(x, **kw):
        data, sf = kq.per_token_cast(x, **kw)
        return data, sf.t().contiguous().t()  # column-major, but 5 rows not padded to 8

    with pytest.raises(VerificationError, match=r"stride\(1\) == 8"):
        run_spec("per_token_cast", unpadded, Case(params, {"x": x}))


def test_swiglu_counting_in_int32_is_caught():
    def int32_counter(**kw):
        count = kw.get("clamped_count")
        if count is not None:
            narrow = count.to(torch.int32)
            kw["clamped_count"] = narrow.to(torch.int64)
            data, sf = kq.swiglu_forward_and_per_token_cast(**kw)
            count.copy_(kw["clamped_count"].to(torch.int32).to(torch.int64))  # wraps past 2^31
            return data, sf
        return kq.swiglu_forward_and_per_token_cast(**kw)

    failure = first_failure("swiglu_forward_and_per_token_cast", ReturningClampedCount(int32_counter))
    assert failure is not None and "clamped_count" in str(failure)


def test_swiglu_padding_rows_with_sf_zero_are_caught():
    def zero_sf_padding(**kw):
        count = kw.get("clamped_count")
        data, sf = kq.swiglu_forward_and_per_token_cast(**{**kw, "clamped_count": count})
        pos = kw.get("pos_to_token_topk")
        if pos is not None and not kw.get("use_ue8m0") and sf.numel():
            sf = sf.clone()
            sf[pos < 0] = 0.0
        return data, sf, count if count is not None else torch.empty(0, dtype=torch.int64)

    failure = first_failure("swiglu_forward_and_per_token_cast", zero_sf_padding)
    assert failure is not None and "output 'sf'" in str(failure)


# -- regressions found by the differential suite ---------------------------------------------------


def test_regression_empty_e5m6_cast_back():
    """kernels.torch.quant reshaped (0, 48) bytes with a -1 dimension, which torch cannot infer."""
    case = Case({"fmt": "e5m6", "block": [1, 32], "out_dtype": "bf16"},
                {"data": torch.zeros(0, 48, dtype=torch.uint8), "sf": torch.zeros(0, 1, dtype=torch.uint8)})
    run_spec("cast_back", kq.cast_back, case)


def test_regression_empty_column_major_sf_has_no_layout_to_judge():
    """The spec demanded stride(1) == 0 of a (0, 2) sf; strides of an empty tensor mean nothing."""
    case = Case({"fmt": "e4m3", "num_per_tokens": 16, "round_sf": False, "use_ue8m0": False,
                 "use_packed_ue8m0": False, "use_tma_aligned_col_major_sf": True, "clamp_min": None},
                {"x": torch.empty(0, 2, dtype=torch.bfloat16)})
    run_spec("per_channel_cast", kq.per_channel_cast, case)


def test_regression_swiglu_fp32_overflow_of_an_intermediate():
    """w = 0 and |l * r| ~ 1e75: exactly y = 0, but ((l * sigmoid(l)) * r) * w overflows fp32 to
    inf * 0 = NaN.  The spec leaves elements some fp32 evaluation order can overflow unconstrained
    (their sf too); both answers pass, and a neighbouring finite row is still judged."""
    x = torch.tensor([[3.3895e37, 2.0, -4.3532e37, 1.0], [1.0, 2.0, 3.0, 4.0]], dtype=torch.bfloat16)
    x = torch.cat([x[:, :2].repeat(1, 8), x[:, 2:].repeat(1, 8)], dim=1)
    case = Case({"fmt": "e4m3", "num_per_channels": 16, "clamp": None},
                {"x": x, "pos_to_token_topk": torch.tensor([0, 1], dtype=torch.int32),
                 "topk_weights": torch.tensor([[0.0], [1.0]])})
    spec_impl = registry.get("quant.swiglu_forward_and_per_token_cast").impls["torch"].target
    data, sf, _ = spec_impl(**case.inputs, **case.params)
    assert math.isnan(sf[0, 0].item())  # what torch's fp32 evaluation does
    run_spec("swiglu_forward_and_per_token_cast", spec_impl, case)

    def exact_zero(**kw):  # the exact answer: y = 0, the sf of a zero block, +0 codes
        data, sf, count = spec_impl(**kw)
        sf, data = sf.clone(), data.clone()
        sf[0, 0] = 1e-4 / 448
        data[0] = 0.0
        return data, sf, count
    run_spec("swiglu_forward_and_per_token_cast", exact_zero, case)

    def wrong_second_row(**kw):
        data, sf, count = spec_impl(**kw)
        sf = sf.clone()
        sf[1, 0] *= 2
        return data, sf, count
    with pytest.raises(VerificationError, match="output 'sf'"):
        run_spec("swiglu_forward_and_per_token_cast", wrong_second_row, case)


def test_regression_cast_back_rounds_once_to_bf16():
    """torch's float64 -> bfloat16 cast goes through float32 and rounds twice; the product
    1 * (1 + 2^-8 + 2^-22) must round up to 1 + 2^-7 in bf16."""
    data = formats.to_tensor(formats.E4M3.encode(np.ones((1, 16))), "e4m3")
    sf = torch.tensor([[1 + 2.0**-8 + 2.0**-22]])
    assert torch.tensor(1 + 2.0**-8 + 2.0**-30, dtype=torch.float64).to(torch.bfloat16).item() == 1.0
    assert kq.cast_back(data, sf, "e4m3", (1, 16), "bf16")[0, 0].item() == 1 + 2.0**-7
    run_spec("cast_back", kq.cast_back, Case({"fmt": "e4m3", "block": [1, 16], "out_dtype": "bf16"},
                                             {"data": data, "sf": sf}))


def test_regression_bf16_quotient_double_rounding_is_a_reported_neighbour():
    """bf16 inputs and a plain sf: the fp32 quotient x / sf can round onto an e4m3 midpoint that the
    exact quotient misses, and then tie the other way (found on random bf16 data).  The spec allows
    that neighbour (it counts it in the report); with a power-of-two sf it allows nothing."""
    x = torch.tensor([[448.0, 0.0] + [0.0] * 14], dtype=torch.bfloat16)
    rng = np.random.default_rng(0)
    found = None
    for _ in range(2000):
        amax = float(torch.tensor(rng.uniform(1, 2), dtype=torch.bfloat16))
        v = float(torch.tensor(rng.uniform(0, amax), dtype=torch.bfloat16))
        x[0, 0], x[0, 1] = amax, v
        sf = np.float32(amax / 448)
        exact = formats.E4M3.encode(v / float(sf))
        fp32 = formats.E4M3.encode(float(np.float32(v) / sf))
        if exact != fp32:
            found = x.clone()
            break
    assert found is not None
    comparisons = run_spec("per_token_cast", kq.per_token_cast, Case({"fmt": "e4m3", "num_per_channels": 16},
                                                                     {"x": found}))
    data = next(c for c in comparisons if c.output == "data")
    assert data.hist.get("1") == 1  # reported as one code off

    def exact_quotient(x, **kw):  # the correctly rounded code passes too
        data, sf = kq.per_token_cast(x, **kw)
        q = ref.quotients(ref.as_float64(x), ref.as_float64(sf), (1, 16))
        return ref.pack_data(ref.encode_elements(q, "e4m3"), "e4m3"), sf
    run_spec("per_token_cast", exact_quotient, Case({"fmt": "e4m3", "num_per_channels": 16}, {"x": found}))


# -- the per-block cast's variants: sf only, precomputed sf --------------------------------------------


def test_block_oracles_on_hand_worked_values():
    """(32, 32) blocks of a 33 x 64 x: the last block row is one row.  Block (0, 0) has amax 896: sf = 896 / 448
    = 2, and x / 2 codes; the zero block (0, 1) the sf of clamp_min; block (1, 0) (row 32) amax 44.8."""
    x = torch.zeros(33, 64)
    x[0, :4] = torch.tensor([1.0, 3.0, -5.0, 896.0])
    x[32, 0] = 44.8
    sf = ref.per_block_cast_with_sf_only(x, "e4m3", (32, 32))
    assert sf.shape == (2, 2)
    assert sf[0, 0].item() == 2.0
    assert sf[0, 1].item() == np.float32(np.float32(1e-4) / np.float32(448.0))
    assert sf[1, 0].item() == np.float32(np.float32(44.8) / np.float32(448.0))
    data = ref.per_block_cast_with_precomputed_sf(x, torch.tensor([[2.0, 0.0], [0.25, float("nan")]]), "e4m3",
                                                  (32, 32))
    decoded = data.float()
    assert decoded[0, :4].tolist() == [0.5, 1.5, -2.5, 448.0]  # 896 / 2 = 448: the largest code, exactly
    assert torch.isnan(decoded[0, 32:]).all()  # 0 / 0 in block (0, 1)
    assert decoded[32, 0].item() == 176.0  # fp32 44.8 / 0.25 = 179.2..., RNE in e4m3 (spacing 16 there)
    assert torch.isnan(decoded[32, 32:]).all()  # a NaN sf
    saturating = ref.per_block_cast_with_precomputed_sf(x, torch.tensor([[2**-20, 2.0], [2.0, 2.0]]), "e4m3", (32, 32))
    assert saturating.float()[0, :4].tolist() == [448.0, 448.0, -448.0, 448.0]


@pytest.mark.parametrize("options", [{}, {"round_sf": True, "use_ue8m0": True, "use_packed_ue8m0": True,
                                           "use_tma_aligned_col_major_sf": True}])
def test_block_sf_only_and_precomputed_reproduce_per_block_cast(options):
    """Both oracles and both torch variants: the sf of per_block_cast, and its data given that sf."""
    x = torch.randn(130, 256) * torch.exp2(torch.randint(-8, 8, (130, 1)).float())
    for impl in (ref, kq):
        data, sf = impl.per_block_cast(x, "e2m1", (32, 32), **options)
        sf_only = impl.per_block_cast_with_sf_only(x, "e2m1", (32, 32), **options)
        assert sf_only.stride() == sf.stride() and torch.equal(sf_only, sf)
        given = impl.per_block_cast_with_precomputed_sf(x, sf, "e2m1", [32, 32])
        assert torch.equal(given, data)


@pytest.mark.parametrize("op, strategy", [("per_block_cast_with_sf_only", sq.per_block_cast_cases),
                                          ("per_block_cast_with_precomputed_sf", sqb.block_precomputed_sf_cases)])
@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_block_variants_torch_impl_passes_the_spec(op, strategy, data):
    case = data.draw(strategy())
    run_spec(op, getattr(kq, op), case)


def test_block_precomputed_sf_of_the_first_block_row_only_is_caught():
    """A precomputed cast that divides every block row by the first block row's sf fails the spec."""
    def first_block_row(x, sf, fmt="e4m3", block=(128, 128)):
        return kq.per_block_cast_with_precomputed_sf(x, sf[:1].expand(sf.shape) if sf.shape[0] else sf, fmt, block)
    assert first_failure("per_block_cast_with_precomputed_sf", first_block_row) is not None


def test_block_sf_only_of_the_first_row_only_is_caught():
    """An sf-only cast whose amax reads only the first row of each block row fails the spec."""
    def first_rows(x, fmt="e4m3", block=(128, 128), **options):
        bm = block[0]
        firsts = x[::bm].repeat_interleave(bm, 0)[:x.shape[0]] if x.shape[0] else x
        return kq.per_block_cast_with_sf_only(firsts, fmt, block, **options)
    assert first_failure("per_block_cast_with_sf_only", first_rows) is not None
