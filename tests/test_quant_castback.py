"""The quantisation round trips on the CPU (docs/contract/quant_castback.md): the composed oracles by
hand, the eager implementations against them through the spec's judges, the round trip's bracket
(one value with round_sf, a result outside it refused), bad arguments, and the tile-kernels mapping
(per_token_cast_back as an implementation of quant.cast_back, the in-place round trip on a clone)
with a stand-in for tile-kernels."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings

import references.quant as quant_ref
import references.quant_castback as ref
from kernels.torch import quant as eager_quant
from kernels.torch import quant_castback as eager
from tkverify import registry
from tkverify.adapters import tile_kernels as tk
from tkverify.adapters import tile_kernels_quant_castback as adapter
from tkverify.case import Case
from tkverify.check import VerificationError, check_case
from tkverify.registry import Impl, Unsupported
from tkverify.specs.quant_castback import round_trip_bracket

ROUND_TRIP = registry.get("quant.per_token_cast_and_cast_back")
UNPACK = registry.get("quant.unpack_from_e2m1fn_x2")
BF16, F32 = torch.bfloat16, torch.float32
checks = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))


def _judge(spec, impl, case) -> None:
    for comparison in check_case(spec, impl, case, case_dir=None):
        assert comparison.passed, comparison.message


# -- the oracles by hand --------------------------------------------------------------------


def test_round_trip_by_hand_e4m3():
    # amax 448 = max_q: sf = 1; 0.3 lies between the e4m3 values 0.28125 and 0.3125, nearer 0.3125
    x = torch.tensor([[1.0, -3.0, 0.3, 448.0]], dtype=BF16)
    out = ref.per_token_cast_and_cast_back(x, "e4m3", 4)
    assert out.dtype == BF16
    assert out.float().tolist() == [[1.0, -3.0, 0.3125, 448.0]]


def test_round_trip_by_hand_e2m1_round_sf():
    # sf = 2^ceil(log2(448 / 6)) = 128; x / sf = 1/128 -> 0, -3/128 -> -0, 448/128 = 3.5: a tie of 3
    # (code 5) and 4 (code 6), to the even code, 4 -> 512
    x = torch.tensor([[1.0, -3.0, 0.3, 448.0]], dtype=F32)
    out = ref.per_token_cast_and_cast_back(x, "e2m1", 4, round_sf=True)
    assert out.tolist() == [[0.0, 0.0, 0.0, 512.0]]
    assert torch.signbit(out).tolist() == [[False, True, False, False]]


def test_round_trip_nan_block_and_empty():
    x = torch.tensor([[1.0, float("nan"), 2.0, 3.0], [1.0, 2.0, 3.0, 4.0]], dtype=F32)
    out = ref.per_token_cast_and_cast_back(x, "e4m3", 2)
    assert torch.isnan(out[0, :2]).all() and torch.isfinite(out[0, 2:]).all() and torch.isfinite(out[1]).all()
    assert ref.per_token_cast_and_cast_back(torch.empty(0, 64, dtype=BF16), "e4m3", 32).shape == (0, 64)


def test_unpack_by_hand():
    # 0x21: low nibble 1 (0.5), high 2 (1.0); 0x87: low 7 (6), high 8 (-0); 0xF0: 0, then 0xF (-6)
    x = torch.tensor([0x21, 0x87, 0xF0], dtype=torch.uint8)
    out = ref.unpack_from_e2m1fn_x2(x)
    assert out.dtype == F32 and out.tolist() == [0.5, 1.0, 6.0, -0.0, 0.0, -6.0]
    assert torch.signbit(out).tolist() == [False, False, False, True, False, True]
    three = ref.unpack_from_e2m1fn_x2(x.view(torch.int8).repeat(4).reshape(2, 2, 3), "bf16")
    assert three.shape == (2, 2, 6) and three.dtype == BF16
    assert three.float().reshape(4, 6).tolist() == [out.tolist()] * 4


def test_unpack_is_every_code():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    out = ref.unpack_from_e2m1fn_x2(codes).reshape(256, 2)
    magnitudes = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    for byte in (0x00, 0x35, 0x7F, 0xA9, 0xFE):
        lo, hi = byte & 0xF, byte >> 4
        want = [(-1) ** (n >> 3) * magnitudes[n & 7] for n in (lo, hi)]
        assert out[byte].tolist() == want


# -- the round trip's bracket -----------------------------------------------------------------


def test_bracket_is_one_value_with_round_sf():
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1)) * 100
    exact = quant_ref.as_float64(ref.per_token_cast_and_cast_back(x, "e4m3", 32, round_sf=True))
    b = round_trip_bracket(quant_ref.as_float64(x), "e4m3", 32, True, None, F32, exact)
    assert np.array_equal(b.low, exact) and np.array_equal(b.high, exact)


def test_bracket_holds_the_oracle_and_is_narrow_with_a_plain_sf():
    x = torch.randn(4, 128, generator=torch.Generator().manual_seed(2))
    exact = quant_ref.as_float64(ref.per_token_cast_and_cast_back(x, "e4m3", 64))
    b = round_trip_bracket(quant_ref.as_float64(x), "e4m3", 64, False, None, F32, exact)
    assert np.all(b.low <= exact) and np.all(exact <= b.high)
    # never wider than a code step (2^-3 relative in e4m3's normal range) plus the sf's slack
    nonzero = exact != 0
    assert np.all((b.high - b.low)[nonzero] <= np.abs(exact[nonzero]) * 2.0**-2)


def _sf_scaled(factor: float):
    """A round trip whose sf is the right one times `factor` (then cast and cast back with it)."""
    def impl(x, fmt="e4m3", num_per_channels=128, *, round_sf=False, clamp_min=None):
        sf = eager_quant.per_token_cast_with_sf_only(x, fmt, num_per_channels, round_sf=round_sf,
                                                     clamp_min=clamp_min)
        sf = (sf.double() * factor).float()
        data = eager_quant.per_token_cast_with_precomputed_sf(x, sf, fmt, num_per_channels)
        return eager_quant.cast_back(data, sf, fmt, (1, num_per_channels), out_dtype=x.dtype)
    return Impl("broken", impl, device="cpu")


def test_an_sf_within_its_bound_passes_and_one_off_by_8_ulp_fails():
    x = torch.randn(2, 128, generator=torch.Generator().manual_seed(3)) * 7
    case = Case(params={"fmt": "e4m3", "num_per_channels": 128, "round_sf": False, "clamp_min": None},
                inputs={"x": x})
    _judge(ROUND_TRIP, _sf_scaled(1 + 2.0**-24), case)
    with pytest.raises(VerificationError, match="out"):
        _judge(ROUND_TRIP, _sf_scaled(1 + 2.0**-20), case)


def test_no_quantisation_fails():
    x = torch.randn(2, 128, generator=torch.Generator().manual_seed(4))
    case = Case(params={"fmt": "e4m3", "num_per_channels": 128, "round_sf": True, "clamp_min": None},
                inputs={"x": x})
    with pytest.raises(VerificationError):
        _judge(ROUND_TRIP, Impl("identity", lambda x, **_: x.clone(), device="cpu"), case)
    with pytest.raises(VerificationError, match="dtype"):
        _judge(ROUND_TRIP, Impl("wrong_dtype", lambda x, **p: eager.per_token_cast_and_cast_back(x, **p).double(),
                                device="cpu"), case)


# -- the eager implementations against the oracles ---------------------------------------------


@checks
@given(case=ROUND_TRIP.strategy())
def test_eager_round_trip_matches_the_oracle(case):
    _judge(ROUND_TRIP, ROUND_TRIP.impls["torch"], case)


@checks
@given(case=UNPACK.strategy())
def test_eager_unpack_matches_the_oracle(case):
    _judge(UNPACK, UNPACK.impls["torch"], case)


def test_eager_round_trip_leaves_x_alone():
    x = torch.randn(3, 64, dtype=BF16)
    before = x.clone()
    out = eager.per_token_cast_and_cast_back(x, "e4m3", 32)
    assert torch.equal(x, before) and out.data_ptr() != x.data_ptr()


# -- bad arguments -------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, error, name", [
    ({"x": torch.ones(2, 64, dtype=torch.int32)}, TypeError, "x"),
    ({"x": torch.ones(2, 64), "num_per_channels": 48}, ValueError, "num_per_channels"),
    ({"x": torch.ones(2, 128), "fmt": "e5m2"}, ValueError, "fmt"),
    ({"x": torch.ones(2, 128), "round_sf": 1}, TypeError, "round_sf"),
    ({"x": torch.ones(2, 128), "clamp_min": float("nan")}, ValueError, "clamp_min"),
])
def test_round_trip_bad_arguments(kwargs, error, name):
    with pytest.raises(error, match=name):
        eager.per_token_cast_and_cast_back(**kwargs)


@pytest.mark.parametrize("x, out_dtype, error, name", [
    (torch.ones(4), F32, TypeError, "x"),
    (torch.tensor(3, dtype=torch.int8), F32, ValueError, "x"),
    (torch.zeros(2, 0, dtype=torch.int8), F32, ValueError, "x"),
    (torch.zeros(4, 4, dtype=torch.int8).t(), F32, ValueError, "x"),
    (torch.zeros(2, 2, dtype=torch.int8), torch.float16, TypeError, "out_dtype"),
    (torch.zeros(2, 2, dtype=torch.int8), "fp16", ValueError, "out_dtype"),
    ("bytes", F32, TypeError, "x"),
])
def test_unpack_bad_arguments(x, out_dtype, error, name):
    with pytest.raises(error, match=name):
        eager.unpack_from_e2m1fn_x2(x, out_dtype)


# -- the tile-kernels mapping, with a stand-in ---------------------------------------------------


@pytest.fixture
def fake_quant(monkeypatch):
    calls = []

    def per_token_cast_back(x, fmt, num_per_channels, x_special_fmt=None):
        calls.append(("per_token_cast_back", x, fmt, num_per_channels, x_special_fmt))
        return torch.zeros(1)

    def per_token_cast_and_cast_back(x, fmt, num_per_channels, round_sf=False, use_e4m3_sf=False):
        calls.append(("round_trip", x, fmt, num_per_channels, round_sf))
        x.fill_(7.0)  # in place, as tile-kernels does

    quant = types.SimpleNamespace(per_token_cast_back=per_token_cast_back,
                                  per_token_cast_and_cast_back=per_token_cast_and_cast_back)
    monkeypatch.setattr(tk, "installed_version", lambda: "2.1.0")
    monkeypatch.setattr(adapter, "_tk", lambda sub: {"quant": quant}[sub])
    return calls


def test_registered_names():
    assert adapter.PER_TOKEN_CAST_BACK in registry.get("quant.cast_back").impls
    assert "tile_kernels" in ROUND_TRIP.impls and "tile_kernels" in UNPACK.impls
    assert "lacks quant.per_token_cast_and_cast_back" in tk.missing_reason("quant.per_token_cast_and_cast_back",
                                                                         "1.0.0")
    assert tk.missing_reason("quant.per_token_cast_and_cast_back", "2.1.0") is None
    assert tk.missing_reason("quant.unpack_from_e2m1fn_x2", "1.0.0") is None


def test_per_token_cast_back_maps_per_token_blocks_only(fake_quant):
    data = torch.zeros(3, 64, dtype=torch.int8)  # e2m1: H = 128
    sf = torch.full((3, 1), 127, dtype=torch.uint8)  # ue8m0 2^0
    adapter.per_token_cast_back(data, sf, "e2m1", (1, 128), out_dtype="float32")
    (name, (d, s), out_name, bk, special), = fake_quant
    assert name == "per_token_cast_back" and out_name == "fp32" and bk == 128 and special is None
    assert d is data and s.dtype == F32 and s.tolist() == [[1.0]] * 3
    with pytest.raises(Unsupported, match="per-token"):
        adapter.per_token_cast_back(data, sf, "e2m1", (32, 32))


def test_round_trip_runs_on_a_clone(fake_quant):
    x = torch.ones(2, 64, dtype=BF16)
    out = adapter.per_token_cast_and_cast_back(x, "e4m3", 32, round_sf=True)
    assert torch.equal(x, torch.ones(2, 64, dtype=BF16))
    assert out.float().eq(7.0).all() and fake_quant[0][1] is out and fake_quant[0][4] is True


def test_round_trip_refused_by_1_0(monkeypatch):
    monkeypatch.setattr(tk, "installed_version", lambda: "1.0.0")
    with pytest.raises(Unsupported, match="1.0.0 lacks"):
        adapter.per_token_cast_and_cast_back(torch.ones(1, 64), "e4m3", 32)
