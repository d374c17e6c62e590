"""Self-checks of the quantisation oracles (references/quant.py): hand-worked
examples, and agreement with an independent exact-rational computation."""

from __future__ import annotations

import bisect
import functools
from fractions import Fraction

import numpy as np
import pytest
import torch

from references import quant as ref
from tkverify import formats

NAN, INF = float("nan"), float("inf")
FP32_1E4 = float(np.float32(1e-4))


def row(values, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor([values], dtype=torch.float64).to(dtype)


def values_of(data: torch.Tensor, fmt: str) -> np.ndarray:
    return formats.get(fmt).decode(ref.data_codes(data, fmt))


# -- an independent exact rounding: rationals and a sorted table of the format's values ----


@functools.lru_cache(maxsize=None)
def _table(fmt: str) -> tuple[list[Fraction], list[int]]:
    f = formats.get(fmt)
    codes = f.all_codes()
    values = f.decode(codes)
    keep = np.isfinite(values) & ~(np.signbit(values) & (values == 0))  # one zero, no NaN or inf
    pairs = sorted((Fraction(float(v)), int(c)) for v, c in zip(values[keep], codes[keep]))
    return [p[0] for p in pairs], [p[1] for p in pairs]


def rational_rne_sat(v: Fraction, fmt: str) -> float:
    """The value of fmt nearest to v (ties to the even code), saturating: no formats.encode involved."""
    values, codes = _table(fmt)
    if v >= values[-1]:
        return float(values[-1])
    if v <= values[0]:
        return float(values[0])
    i = bisect.bisect_left(values, v)
    if values[i] == v:
        return float(v)
    lo, hi = values[i - 1], values[i]
    if v - lo != hi - v:
        return float(lo if v - lo < hi - v else hi)
    # A tie: the even code.  e2m1/e4m3/e5m6 codes of one sign are ordered like values.
    return float(lo if codes[i - 1] % 2 == 0 else hi)


def rational_fp32(v: Fraction) -> float:
    """v correctly rounded to fp32 (normal range), by exact arithmetic."""
    e = v.numerator.bit_length() - v.denominator.bit_length()
    if Fraction(2) ** e > v:
        e -= 1
    spacing = Fraction(2) ** (e - 23)
    k, rest = divmod(v, spacing)
    if rest * 2 > spacing or (rest * 2 == spacing and k % 2 == 1):
        k += 1
    return float(k * spacing)


# -- scale factors ----------------------------------------------------------------------


@pytest.mark.parametrize("amax, fmt, expected", [
    (448.0, "e4m3", 1.0),
    (3.5, "e4m3", 2.0**-7),  # 3.5 / 448 = 1/128 exactly
    (6.0, "e2m1", 1.0),
    (65024.0, "e5m6", 1.0),
    (1.0, "e4m3", float(np.float32(1 / 448))),
])
def test_plain_sf_of_known_amax(amax, fmt, expected):
    _, sf = ref.per_token_cast(row([amax, -amax / 2, 0.0, 1e-3, 0.0, 0.0, 0.0, 0.0]), fmt, 8)
    assert sf.dtype == torch.float32 and sf.shape == (1, 1)
    assert sf.item() == expected


def test_plain_sf_is_the_correctly_rounded_quotient():
    rng = np.random.default_rng(7)
    amax = np.float32(np.exp2(rng.uniform(-20, 20, 300)) * rng.uniform(1, 2, 300))
    for fmt in ("e4m3", "e2m1", "e5m6"):
        sf = ref.stored_scales(ref.scale_from_amax(amax.astype(np.float64), fmt, round_sf=False))
        exact = [rational_fp32(Fraction(float(a)) / Fraction(ref.MAX_Q[fmt])) for a in amax]
        assert sf.tolist() == exact


@pytest.mark.parametrize("fmt, expected", [
    ("e4m3", float(np.float32(FP32_1E4 / 448))),
    ("e5m6", float(np.float32(FP32_1E4 / 65024))),
    ("e2m1", 2.0**-126),  # 6 * 2^-126 / 6: the smallest normal fp32
])
def test_all_zero_block_gets_the_clamp_min_sf(fmt, expected):
    x = torch.zeros(1, 8)
    x[0, 3] = -0.0
    data, sf = ref.per_token_cast(x, fmt, 8)
    assert sf.item() == expected
    assert np.all(values_of(data, fmt) == 0)


@pytest.mark.parametrize("amax, fmt, expected", [
    (448.0, "e4m3", 1.0),
    (449.0, "e4m3", 2.0),  # just past max_q * 2^0: the next power
    (float(np.nextafter(np.float32(448), np.float32(0))), "e4m3", 1.0),
    (448.0 * 2.0**-3, "e4m3", 2.0**-3),
    (448.0 * 2.0**-3 * (1 + 2.0**-7), "e4m3", 2.0**-2),  # one bf16 ULP above
    (6.0, "e2m1", 1.0),
    (6.0 * (1 + 2.0**-23), "e2m1", 2.0),
    (65024.0, "e5m6", 1.0),
    (65024.0 * 2.0**10, "e5m6", 2.0**10),
    (1e-30, "e4m3", 2.0**-22),  # clamped: 1e-4 / 448 = 2^-22.1, up to 2^-22
])
def test_round_sf_is_the_exact_power_of_two(amax, fmt, expected):
    x = row([amax, 0.5 * amax] + [0.0] * 6)
    _, sf = ref.per_token_cast(x, fmt, 8, round_sf=True)
    assert sf.item() == expected
    _, byte = ref.per_token_cast(x, fmt, 8, round_sf=True, use_ue8m0=True)
    assert byte.dtype == torch.uint8 and byte.item() == int(np.log2(expected)) + 127


def test_ue8m0_bytes_and_packed_byte_order():
    # Five blocks of 1 x 16: amax = 448 * 2^k for k = 0, 1, -3, 3, 0
    ks = [0, 1, -3, 3, 0]
    x = torch.zeros(1, 80)
    for i, k in enumerate(ks):
        x[0, 16 * i + 5] = 448.0 * 2.0**k
    _, sf = ref.per_token_cast(x, "e4m3", 16, round_sf=True, use_ue8m0=True)
    assert sf.tolist() == [[127, 128, 124, 130, 127]]
    _, packed = ref.per_token_cast(x, "e4m3", 16, round_sf=True, use_ue8m0=True, use_packed_ue8m0=True)
    assert packed.dtype == torch.int32 and packed.shape == (1, 2)
    first = 127 | 128 << 8 | 124 << 16 | 130 << 24  # the first byte lowest
    assert packed.tolist() == [[first - 2**32, 127]]  # the last group padded with zero bytes


@pytest.mark.parametrize("rows, options, padded", [
    (5, {}, 8),  # fp32: 4 a 16 bytes
    (5, {"round_sf": True, "use_ue8m0": True}, 16),  # uint8: 16
    (17, {"round_sf": True, "use_ue8m0": True, "use_packed_ue8m0": True}, 20),  # int32: 4
    (4, {}, 4),
    (1, {}, 4),
])
def test_tma_aligned_column_major_layout(rows, options, padded):
    x = torch.randn(rows, 128)
    _, flat = ref.per_token_cast(x, "e4m3", 16, **options)
    _, sf = ref.per_token_cast(x, "e4m3", 16, use_tma_aligned_col_major_sf=True, **options)
    assert sf.shape == flat.shape and sf.stride() == (1, padded)
    assert torch.equal(sf.contiguous(), flat)  # the same logical tensor


def test_empty_input_gives_empty_outputs_of_the_right_shapes():
    x = torch.empty(0, 64, dtype=torch.bfloat16)
    for fmt, width in (("e4m3", 64), ("e2m1", 32), ("e5m6", 96)):
        data, sf = ref.per_token_cast(x, fmt, 64 if fmt == "e5m6" else 16, use_tma_aligned_col_major_sf=True)
        assert data.shape == (0, width) and sf.shape == (0, 1 if fmt == "e5m6" else 4)
    data, sf = ref.per_block_cast(x, "e4m3", (32, 32))
    assert data.shape == (0, 64) and sf.shape == (0, 2)
    data, sf = ref.per_channel_cast(x, "e2m1", 16, round_sf=True, use_ue8m0=True, use_packed_ue8m0=True)
    assert data.shape == (0, 32) and sf.shape == (0, 16) and sf.dtype == torch.int32
    assert ref.cast_back(data, sf, "e2m1", (16, 1), "fp32").shape == (0, 64)


@pytest.mark.parametrize("special", [NAN, INF, -INF])
def test_non_finite_block_gets_nan_sf_and_nan_elements(special):
    x = row([1.0, special, 3.0, -0.0, 5.0, 6.0, 7.0, 8.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
    data, sf = ref.per_token_cast(x, "e4m3", 8)
    assert np.isnan(sf[0, 0].item()) and sf[0, 1].item() == float(np.float32(8 / 448))
    q = values_of(data, "e4m3")
    assert np.isnan(q[0, :8]).all() and np.isfinite(q[0, 8:]).all()
    _, byte = ref.per_token_cast(x, "e4m3", 8, round_sf=True, use_ue8m0=True)
    assert byte[0, 0].item() == 0xFF
    data, _ = ref.per_token_cast(x, "e5m6", 16)
    assert np.isnan(values_of(data, "e5m6")).all()
    data, _ = ref.per_token_cast(x, "e2m1", 8)  # no NaN in e2m1: the oracle writes code 0
    assert (ref.data_codes(data, "e2m1")[0, :8] == 0).all()


# -- element rounding -----------------------------------------------------------------------


@pytest.mark.parametrize("fmt, quotient, expected", [
    ("e4m3", 0.5 * 2.0**-9, 0.0),  # the tie between 0 and the smallest subnormal: to 0 (even)
    ("e4m3", 1.5 * 2.0**-9, 2.0**-8),  # a subnormal tie: codes 1 and 2, to 2
    ("e4m3", 2.5 * 2.0**-9, 2.0**-8),  # codes 2 and 3, to 2
    ("e4m3", 9.0, 9.0),  # representable: unchanged
    ("e4m3", 8.5, 8.0),  # tie between 8 and 9: 8 (even code)
    ("e4m3", 9.5, 10.0),
    ("e4m3", 464.0, 448.0),  # past the top: saturates
    ("e4m3", 1e30, 448.0),
    ("e2m1", 0.25, 0.0),
    ("e2m1", 0.75, 1.0),  # codes 1 (0.5) and 2 (1.0): to 2
    ("e2m1", 1.25, 1.0),  # codes 2 and 3 (1.5): to 2
    ("e2m1", 2.5, 2.0),
    ("e2m1", 5.0, 4.0),  # codes 6 (4) and 7 (6): to 6
    ("e2m1", 7.0, 6.0),
    ("e5m6", 2.0**-21, 0.0),
    ("e5m6", 3 * 2.0**-21, 2.0**-19),
    ("e5m6", 65280.0, 65024.0),
    ("e5m6", 1 + 2.0**-7, 1.0),
])
def test_hand_worked_roundings_at_unit_scale(fmt, quotient, expected):
    # sf = 1: a precomputed sf, so that quotients past max_q are possible
    x = row([quotient, -quotient] + [0.0] * 6, torch.float64)
    data = ref.per_token_cast_with_precomputed_sf(x, torch.ones(1, 1), fmt, 8)
    got = values_of(data, fmt)[0]
    assert got[0] == expected and got[1] == -expected
    if quotient <= ref.MAX_Q[fmt]:  # and the same in a block whose amax is max_q: sf = 1 again
        y = row([ref.MAX_Q[fmt], quotient, -quotient] + [0.0] * 5, torch.float64)
        data, sf = ref.per_token_cast(y, fmt, 8, round_sf=True)
        assert sf.item() == 1.0 and values_of(data, fmt)[0, 1:3].tolist() == [expected, -expected]


def test_elements_match_an_independent_exact_rounding():
    rng = np.random.default_rng(11)
    for fmt, npc in (("e4m3", 16), ("e2m1", 16), ("e5m6", 32)):
        for round_sf in (False, True):
            x = (rng.standard_normal((6, 32)) * np.exp2(rng.uniform(-12, 12, (6, 1)))).astype(np.float32)
            x[0, :4] = [1e-38, -3e-39, 0.0, 7e-45]  # subnormal inputs
            data, sf = ref.per_token_cast(torch.from_numpy(x), fmt, npc, round_sf=round_sf)
            sf64 = ref.as_float64(sf)
            got = values_of(data, fmt)
            for i in range(x.shape[0]):
                for j in range(x.shape[1]):
                    exact = Fraction(float(x[i, j])) / Fraction(float(sf64[i, j // npc]))
                    assert got[i, j] == rational_rne_sat(exact, fmt) or (got[i, j] == 0 and exact == 0), (fmt, i, j)


def test_precomputed_sf_reproduces_the_cast_and_divides_by_zero_ieee_style():
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    data, sf = ref.per_token_cast(x, "e4m3", 32, round_sf=True, use_ue8m0=True, use_packed_ue8m0=True,
                                  use_tma_aligned_col_major_sf=True)
    again = ref.per_token_cast_with_precomputed_sf(x, sf, "e4m3", 32)
    assert torch.equal(again.view(torch.uint8), data.view(torch.uint8))
    zero_sf = torch.zeros(1, 1)
    out = ref.per_token_cast_with_precomputed_sf(row([1.0, -2.0, 0.0] + [0.0] * 5), zero_sf, "e5m6", 8)
    got = values_of(out, "e5m6")[0]
    assert got[0] == INF and got[1] == -INF and np.isnan(got[2])  # 1/0, -2/0, 0/0
    out = ref.per_token_cast_with_precomputed_sf(row([1.0, -2.0] + [0.0] * 14), torch.zeros(1, 1), "e4m3", 16)
    assert values_of(out, "e4m3")[0, :2].tolist() == [448.0, -448.0]  # no inf in e4m3: satfinite


# -- cast_back ------------------------------------------------------------------------------------


def test_cast_back_is_the_product_rounded_once():
    codes = formats.E4M3.encode(np.array([[1.5, -448.0, 1.0, 0.0]]))
    data = formats.to_tensor(codes, "e4m3")
    sf = torch.tensor([[0.125]])
    assert ref.cast_back(data, sf, "e4m3", (1, 4), torch.float32).tolist() == [[0.1875, -56.0, 0.125, 0.0]]
    # 1 * (1 + 2^-8 + 2^-30): above the bf16 midpoint 1 + 2^-8 by less than half an fp32 ULP of it; a
    # product rounded to fp32 first lands on the midpoint and then ties down to 1.
    sf = torch.tensor([[1 + 2.0**-8 + 2.0**-22]], dtype=torch.float32)
    out = ref.cast_back(data, sf, "e4m3", (1, 4), "bf16")
    assert out[0, 2].item() == 1 + 2.0**-7
    # NaN sf, 2^127 overflowing bf16 and fp32, NaN code
    sf = torch.tensor([[2.0**127]])
    out = ref.cast_back(data, sf, "e4m3", (1, 4), torch.float32)
    assert out[0, 1].item() == -INF and out[0, 2].item() == 2.0**127


# -- swiglu ----------------------------------------------------------------------------------------


def test_swiglu_rows_by_hand():
    c = 2.0
    x = torch.tensor([[0.0, 1.0, 3.0, -5.0, 2.0, 3.0, 0.5, -2.5],
                      [NAN, 1.0, 1.0, 1.0, 5.0, 5.0, 5.0, 5.0]])
    pos = torch.tensor([1, -1], dtype=torch.int32)
    weights = torch.tensor([[9.0, 0.5]])
    y, l, r, w, padding, counts = ref.swiglu_rows(x, weights, pos, clamp=c)
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    assert padding.tolist() == [False, True] and w.tolist() == [0.5, 0.0]
    expected = [0.0, 1 * sig(1) * 2 * 0.5, 2 * sig(2) * 0.5 * 0.5, -5 * sig(-5) * -2 * 0.5]
    assert np.allclose(y[0], expected, rtol=1e-15)
    assert (y[1] == 0).all()  # padding: not read, not counted
    assert counts == (1, 1, 1)  # l = 3 > 2; r = 3 > 2; r = -2.5 < -2


def test_swiglu_oracle_counts_padding_zero_rows_and_nonfinite():
    x = torch.tensor([[-INF, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0], [NAN, 0.0, 0.0, 0.0]])
    pos = torch.tensor([0, -1, 1], dtype=torch.int32)
    count = torch.tensor([2**31 - 1, 0, 5], dtype=torch.int64)
    data, sf, after = ref.swiglu_forward_and_per_token_cast(x, "e4m3", 2, pos_to_token_topk=pos, clamp=0.5,
                                                            clamped_count=count)
    assert np.isnan(sf[0, 0].item())  # -inf * sigmoid(-inf) = -inf * 0 = NaN
    assert sf[1, 0].item() == float(np.float32(FP32_1E4 / 448))  # padding: an all-zero block's sf
    assert (values_of(data, "e4m3")[1] == 0).all()
    assert np.isnan(sf[2, 0].item())  # NaN never clamped into a number
    assert after.tolist() == [2**31 - 1 + 1, 0 + 2, 5]  # l: 1 > 0.5 (row 0); r: 1, 1 (row 0)
    assert count.tolist() == [2**31 - 1, 0, 5]  # the oracle leaves its input alone
