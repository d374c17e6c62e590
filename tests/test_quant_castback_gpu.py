"""The TileLang round trips (kernels.quant.quant_castback: the token_cast and cast_back kernels
composed) on the GPU: judged against the oracles through the specs, and compared with the eager
compositions on the same device (skipped, with the reason, without CUDA or tilelang).

With round_sf both compositions are exact (a power-of-two sf, codes correctly rounded, one rounding
of the product), so the TileLang round trip must equal the eager one bit for bit; with a plain sf
each is judged within the round trip's bracket.  unpack is exact: bit for bit everywhere.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings

import kernels.torch.quant_castback as eager
from tkverify import registry
from tkverify.check import check_case

ROUND_TRIP = registry.get("quant.per_token_cast_and_cast_back")
UNPACK = registry.get("quant.unpack_from_e2m1fn_x2")
checks = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def quant(tilelang_family):
    tilelang_family("quant")
    import kernels.quant.quant_castback as composed

    return composed


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    nan = torch.isnan(a) & torch.isnan(b)
    same = a.view(torch.int16 if a.element_size() == 2 else torch.int32) == \
        b.view(torch.int16 if b.element_size() == 2 else torch.int32)
    return bool((same | nan).all())


@pytest.mark.parametrize("spec", [ROUND_TRIP, UNPACK], ids=lambda s: s.name)
def test_tilelang_against_the_oracle(quant, spec):
    @checks
    @given(case=spec.strategy())
    def run(case):
        for comparison in check_case(spec, spec.impls["tilelang"], case, case_dir=None):
            assert comparison.passed, comparison.message
    run()


@pytest.mark.parametrize("fmt, npc", [("e4m3", 128), ("e4m3", 32), ("e2m1", 16), ("e2m1", 64), ("e5m6", 7168)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("num_rows", [0, 1, 37, 1025])
def test_round_sf_round_trip_equals_the_eager_one(quant, fmt, npc, dtype, num_rows):
    g = torch.Generator("cuda").manual_seed(num_rows + npc)
    x = (torch.randn(num_rows, 7168, device="cuda", generator=g) * 30).to(dtype)
    if num_rows:
        x[0, :5] = torch.tensor([0.0, -0.0, float("nan"), 1e-40, 3e38], device="cuda").to(dtype)
    ours = quant.per_token_cast_and_cast_back(x, fmt, npc, round_sf=True)
    want = eager.per_token_cast_and_cast_back(x, fmt, npc, round_sf=True)
    assert ours.dtype == dtype and ours.shape == x.shape and _bits_equal(ours, want)


def test_round_trip_of_a_row_strided_x(quant):
    buf = torch.randn(64, 7168 + 128, device="cuda").to(torch.bfloat16)
    x = buf[:, :7168]
    ours = quant.per_token_cast_and_cast_back(x, "e4m3", 128, round_sf=True)
    assert _bits_equal(ours, quant.per_token_cast_and_cast_back(x.contiguous(), "e4m3", 128, round_sf=True))


@pytest.mark.parametrize("shape", [(1,), (3, 5), (2, 7, 3584), (0, 4)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_unpack_equals_the_eager_one(quant, shape, out_dtype):
    codes = torch.randint(0, 256, shape, dtype=torch.int32, device="cuda").to(torch.uint8)
    ours = quant.unpack_from_e2m1fn_x2(codes, out_dtype)
    assert ours.shape == (*shape[:-1], 2 * shape[-1])
    assert _bits_equal(ours, eager.unpack_from_e2m1fn_x2(codes, out_dtype))
