"""The quantisation layout ops on the CPU: the lossless oracle by hand (its edges: the largest and smallest
codes, the 2^14 spread, NaN sf, signed zeros), its refusals, the eager implementations against the oracles
through the specs' judges, a wrong implementation caught, and bad arguments."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings

import references.quant_layout as ref
import strategies.quant_layout as strat
from kernels.torch import quant_layout as eager
from tkverify import registry
from tkverify.case import Case
from tkverify.check import VerificationError, check_case
from tkverify.registry import Impl

LOSSLESS = registry.get("quant.per_block_cast_lossless")
TRANSPOSE = registry.get("quant.per_channel_cast_and_transpose")
checks = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))


def _packed(codes: list[list[int]]) -> torch.Tensor:
    c = torch.tensor(codes, dtype=torch.int16)
    byte = c[:, 0::2] | (c[:, 1::2] << 4)
    return torch.where(byte >= 128, byte - 256, byte).to(torch.int8)


def _e4m3_bits(data: torch.Tensor) -> list[int]:
    return data.view(torch.uint8).flatten().tolist()


def test_lossless_by_hand():
    # one row, H = 32, input blocks (1, 16) with sf 2^3 and 2^-11 (the 2^14 spread), one (32, 32) out block
    codes = [[7, 15, 1, 9, 8, 0] + [2] * 10 + [1, 9, 7] + [0] * 13]
    x = _packed(codes)
    x_sf = torch.tensor([[2.0**3, 2.0**-11]])
    data, sf = ref.per_block_cast_lossless(x, x_sf, x_block_size=(1, 16), out_block_size=(32, 32))
    assert sf.tolist() == [[2.0**-3]]  # 2^-6 * 2^3
    bits = _e4m3_bits(data)
    # ratio 2^6: +-6 -> +-384 = 1.5 * 2^8 (0 1111 100); +-0.5 -> 32 = 2^5 (0 1100 000); -0 and +0 kept
    assert bits[:6] == [0x7C, 0xFC, 0x60, 0xE0, 0x80, 0x00]
    assert bits[6] == 0x68  # 1.0 -> 64 = 2^6 (0 1101 000)
    # ratio 2^-8: +-0.5 -> +-2^-9, the smallest subnormal (0x01, 0x81); 6 -> 1.5 * 2^-6 (0 0001 100)
    assert bits[16:19] == [0x01, 0x81, 0x0C]


def test_lossless_nan_sf_makes_its_out_block_nan():
    x = _packed([[2] * 32, [2] * 32])
    x_sf = torch.tensor([[1.0, float("nan")], [1.0, 1.0]])
    data, sf = ref.per_block_cast_lossless(x, x_sf, x_block_size=(1, 16), out_block_size=(32, 32))
    assert torch.isnan(sf).all() and torch.isnan(data.float()).all()
    data, sf = eager.per_block_cast_lossless(x, x_sf, x_block_size=(1, 16), out_block_size=(32, 32))
    assert torch.isnan(sf).all() and torch.isnan(data.float()).all()


@pytest.mark.parametrize("fn", [ref.per_block_cast_lossless, eager.per_block_cast_lossless])
def test_lossless_refuses_a_spread_past_2_to_14(fn):
    x = _packed([[1] * 32])
    fine = torch.tensor([[1.0, 2.0**-14]])
    fn(x, fine, x_block_size=(1, 16), out_block_size=(32, 32))
    with pytest.raises(ValueError, match="x_sf"):
        fn(x, torch.tensor([[1.0, 2.0**-15]]), x_block_size=(1, 16), out_block_size=(32, 32))
    with pytest.raises(ValueError, match="x_sf"):  # the out sf 2^-133 has no ue8m0 byte
        fn(x, torch.tensor([[2.0**-127, 2.0**-127]]), x_block_size=(1, 16), out_block_size=(32, 32),
           use_ue8m0=True)


def test_eager_refuses_an_sf_that_is_not_a_power_of_two():
    with pytest.raises(ValueError, match="x_sf"):
        eager.per_block_cast_lossless(_packed([[1] * 32]), torch.tensor([[1.0, 3.0]]), x_block_size=(1, 16),
                                      out_block_size=(32, 32))


@pytest.mark.parametrize("kwargs, error, match", [
    ({"fmt": "e2m1"}, ValueError, "fmt"),
    ({"x_block_size": (1, 64)}, ValueError, "x_block_size"),
    ({"out_block_size": (64, 64)}, ValueError, "out_block_size"),
    ({"use_packed_ue8m0": True}, ValueError, "use_packed_ue8m0"),
    ({"use_ue8m0": 1}, TypeError, "use_ue8m0"),
])
def test_lossless_bad_arguments(kwargs, error, match):
    x, x_sf = _packed([[1] * 128]), torch.ones(1, 4)
    with pytest.raises(error, match=match):
        eager.per_block_cast_lossless(x, x_sf, **kwargs)


def test_lossless_bad_tensors():
    with pytest.raises(TypeError, match="x"):
        eager.per_block_cast_lossless(torch.zeros(1, 64, dtype=torch.uint8), torch.ones(1, 4))
    with pytest.raises(ValueError, match="x_sf"):
        eager.per_block_cast_lossless(torch.zeros(1, 64, dtype=torch.int8), torch.ones(1, 3))
    with pytest.raises(ValueError, match="H"):
        eager.per_block_cast_lossless(torch.zeros(1, 16, dtype=torch.int8), torch.ones(1, 1))


def test_transpose_refuses_e2m1():
    with pytest.raises(ValueError, match="fmt"):
        eager.per_channel_cast_and_transpose(torch.randn(4, 8), "e2m1", 16)


def _judge(spec, impl, case):
    for comparison in check_case(spec, impl, case, case_dir=None):
        assert comparison.passed, comparison.message


@checks
@given(case=strat.per_block_cast_lossless_cases())
def test_lossless_eager_against_the_oracle(case: Case):
    _judge(LOSSLESS, LOSSLESS.impls["torch"], case)


@checks
@given(case=strat.per_channel_cast_and_transpose_cases())
def test_channel_transpose_eager_against_the_oracle(case: Case):
    _judge(TRANSPOSE, TRANSPOSE.impls["torch"], case)


def test_a_wrong_lossless_implementation_is_caught():
    def one_code_off(**kwargs):
        data, sf = eager.per_block_cast_lossless(**kwargs)
        bits = data.view(torch.uint8).clone()
        bits[0, 0] ^= 1
        return bits.view(torch.float8_e4m3fn), sf

    case = Case(params={"x_block_size": (1, 16), "out_block_size": (32, 32)},
                inputs={"x": _packed([[3] * 32]), "x_sf": torch.ones(1, 2)})
    with pytest.raises(VerificationError, match="data"):
        for comparison in check_case(LOSSLESS, Impl("wrong", one_code_off, device="cpu"), case, case_dir=None,
                                     excuse=False):
            pass


def test_an_untransposed_output_is_caught():
    def untransposed(**kwargs):
        data, sf = eager.per_channel_cast_and_transpose(**kwargs)
        return data.t(), sf

    case = Case(params={"fmt": "e4m3", "num_per_tokens": 16}, inputs={"x": torch.randn(20, 8)})
    with pytest.raises(VerificationError, match="data"):
        for comparison in check_case(TRANSPOSE, Impl("wrong", untransposed, device="cpu"), case, case_dir=None,
                                     excuse=False):
            pass


# -- per_channel_cast_fused ------------------------------------------------------------------------------

FUSED = registry.get("quant.per_channel_cast_fused")


def test_fused_values_by_hand():
    # codes 1.5 and -448 with sf 2^-3 and 3 (fp32): 0.1875 exact, -1344 exact; rows gathered 1, -1, 0
    codes = torch.tensor([[1.5] * 16, [-448.0] * 16]).to(torch.float8_e4m3fn)
    x_sf = torch.tensor([[2.0**-3], [3.0]])
    pos = torch.tensor([1, -1, 0], dtype=torch.int32)
    values = ref.fused_cast_values(codes, x_sf, 16, pos)
    assert values[:, 0].tolist() == [-1344.0, 0.0, 0.1875]
    # an sf whose product rounds in fp32: 1.5 * (1 + 2^-23) = 1.5 + 1.5 * 2^-23, rounded to 1.5 + 2^-22 (RNE)
    odd = torch.tensor([[1.0 + 2.0**-23]])
    assert ref.fused_cast_values(codes[:1], odd, 16)[0, 0] == 1.5 + 2.0**-22


@pytest.mark.parametrize("kwargs, error, match", [
    ({"num_per_channels": 16}, ValueError, "num_per_channels"),
    ({"pos_to_token": torch.tensor([0, 4], dtype=torch.int32)}, ValueError, "pos_to_token"),
    ({"pos_to_token": torch.tensor([-2], dtype=torch.int32)}, ValueError, "pos_to_token"),
    ({"pos_to_token": torch.tensor([0], dtype=torch.int64)}, TypeError, "pos_to_token"),
    ({"fmt": "e2m1"}, ValueError, "fmt"),
])
def test_fused_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        eager.per_channel_cast_fused(torch.randn(4, 32), **kwargs)


def test_fused_bad_quantised_x():
    codes = torch.zeros(4, 32).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="x_sf"):
        eager.per_channel_cast_fused(codes, torch.ones(4, 3), num_per_channels=16)
    with pytest.raises(ValueError, match="num_per_channels"):
        eager.per_channel_cast_fused(codes, torch.ones(4, 1), num_per_channels=48)
    with pytest.raises(TypeError, match="x"):
        eager.per_channel_cast_fused(torch.zeros(4, 32), torch.ones(4, 2), num_per_channels=16)


@checks
@given(case=strat.per_channel_cast_fused_cases())
def test_fused_eager_against_the_oracle(case: Case):
    _judge(FUSED, FUSED.impls["torch"], case)


def test_a_fused_cast_without_the_gather_is_caught():
    def ungathered(pos_to_token=None, **kwargs):
        return eager.per_channel_cast_fused(**kwargs)

    case = Case(params={"fmt": "e4m3", "num_per_tokens": 16},
                inputs={"x": torch.randn(3, 8), "pos_to_token": torch.tensor([2, 0, 1], dtype=torch.int32)})
    with pytest.raises(VerificationError):
        for comparison in check_case(FUSED, Impl("wrong", ungathered, device="cpu"), case, case_dir=None,
                                     excuse=False):
            pass


# -- batched_transpose_weight_sf ---------------------------------------------------------------------------

WEIGHT_SF = registry.get("quant.batched_transpose_weight_sf")


def _word(*byte_values: int) -> int:
    """The int32 word of up to four bytes, the first lowest (zero bytes after them)."""
    value = sum(b << (8 * j) for j, b in enumerate(byte_values))
    return value - 2**32 if value >= 2**31 else value


def test_weight_sf_by_hand():
    # bs = 128, n = 256, k = 640: sf (2, 5) = 2^e; ue8m0 bytes e + 127 (2^-127 -> 0, 2^127 -> 254)
    exponents = [[0, 1, -127, 127, -1], [2, 3, 4, 5, 6]]
    sf = torch.tensor([[2.0**e for e in row] for row in exponents])
    sf0, sf1 = ref.batched_transpose_weight_sf(sf, 128, False)
    assert sf0.shape == (256, 2) and sf0.stride() == (1, 256)
    # weight rows 0..127 take sf row 0: bytes 127, 128, 0, 254 | 126 then three zero padding bytes
    assert sf0[0].tolist() == [_word(127, 128, 0, 254), _word(126)]
    assert sf0[127].tolist() == sf0[0].tolist()
    assert sf0[128].tolist() == [_word(129, 130, 131, 132), _word(133)]
    # sf1 (k, ceil(2 / 4)) = (640, 1): column c packs sf[0, c // 128], sf[1, c // 128], then two zero bytes
    assert sf1.shape == (640, 1)
    assert [sf1[c, 0].item() for c in (0, 128, 256, 384, 639)] == [
        _word(127, 129), _word(128, 130), _word(0, 131), _word(254, 132), _word(126, 133)]
    _, sf1_t = ref.batched_transpose_weight_sf(sf, 128, True)
    assert sf1_t.shape == (1, 640) and torch.equal(sf1_t, sf1.t())


def test_weight_sf_groups_are_independent():
    sf = torch.pow(2.0, torch.arange(-12.0, 12.0)).reshape(2, 4, 3)
    sf0, sf1 = ref.batched_transpose_weight_sf(sf, 32, True)
    assert sf0.shape == (2, 128, 1) and sf1.shape == (2, 1, 96)
    for g in range(2):
        one0, one1 = ref.batched_transpose_weight_sf(sf[g].contiguous(), 32, True)
        assert torch.equal(sf0[g], one0) and torch.equal(sf1[g], one1)


@pytest.mark.parametrize("value", [3.0, 0.0, -1.0, float("inf"), float("nan"), 2.0**-128])
def test_weight_sf_oracle_refuses_values_outside_the_contract(value):
    sf = torch.ones(1, 1)
    sf[0, 0] = value
    with pytest.raises(ValueError, match="sf"):
        ref.batched_transpose_weight_sf(sf, 128)


@checks
@given(case=strat.batched_transpose_weight_sf_cases())
def test_weight_sf_eager_against_the_oracle(case: Case):
    _judge(WEIGHT_SF, WEIGHT_SF.impls["torch"], case)


@pytest.mark.parametrize("spoil", ["padding", "strides", "one_byte"])
def test_a_wrong_weight_sf_layout_is_caught(spoil):
    def wrong(**kwargs):
        sf0, sf1 = eager.batched_transpose_weight_sf(**kwargs)
        if spoil == "padding":  # a non-zero byte past the last sf of sf0's words
            sf0 = sf0.clone()
            sf0[:, -1] |= 1 << 24  # k / 128 = 5 sf: the last word holds one, its byte 3 is padding
        elif spoil == "strides":  # the right values, row-major instead of MN-major
            sf0 = sf0.contiguous()
        else:
            sf1 = sf1 ^ 1
        return sf0, sf1

    case = Case(params={"block_size": 128, "transpose_sf1": False},
                inputs={"sf": torch.pow(2.0, torch.arange(10.0)).reshape(2, 5)})
    with pytest.raises(VerificationError, match="sf1" if spoil == "one_byte" else "sf0"):
        for comparison in check_case(WEIGHT_SF, Impl("wrong", wrong, device="cpu"), case, case_dir=None,
                                     excuse=False):
            pass


@pytest.mark.parametrize("kwargs, error, match", [
    ({"block_size": 64}, ValueError, "block_size"),
    ({"block_size": True}, TypeError, "block_size"),
    ({"transpose_sf1": 1}, TypeError, "transpose_sf1"),
    ({"sf": torch.ones(2, 3, dtype=torch.float64)}, TypeError, "sf"),
    ({"sf": torch.ones(0, 2, 3)}, ValueError, "sf"),
    ({"sf": torch.ones(3, 2).t()}, ValueError, "sf"),
    ({"sf": torch.ones(5, 3), "block_size": 32}, ValueError, "sf"),
])
def test_weight_sf_bad_arguments(kwargs, error, match):
    args = {"sf": torch.ones(2, 3), **kwargs}
    with pytest.raises(error, match=match):
        eager.batched_transpose_weight_sf(**args)


@pytest.mark.parametrize("refused", [3.0, 0.0, -1.0, float("inf"), 2.0**-128, 2.0**-18])
def test_lossless_out_sf_is_nan_on_a_refused_block(refused):
    """The out sf the TileLang wrapper uses (computed on the device, nothing read back): a block the contract
    refuses is NaN, the others are 2^-6 times their largest input sf; the flags refuse it for the eager cast."""
    in_sf = torch.pow(2.0, torch.tensor([[0.0, -2.0, 1.0, 3.0], [2.0, -1.0, 0.0, 1.0]]))
    in_sf[1, 2] = refused
    out_sf, refusals = eager._lossless_out_sf(in_sf, (1, 32), (1, 64), use_ue8m0=False)
    assert out_sf[0].tolist() == [2.0**-6 * 1.0, 2.0**-6 * 8.0] and out_sf[1, 0].item() == 2.0**-6 * 4.0
    assert torch.isnan(out_sf[1, 1]) and refusals.any()
    with pytest.raises(ValueError, match="^x_sf"):
        eager._check_lossless_refusals(refusals)


def test_gather_rows_takes_an_index_outside_the_tokens_for_padding():
    """The fused cast's gather (shared with the TileLang wrapper, which reads no index back): an index below -1
    or at or past T gives a zero row, as -1 does; nothing is read out of bounds."""
    values = torch.arange(1.0, 7.0).reshape(3, 2)
    pos = torch.tensor([2, -1, 3, -5, 0, 2**31 - 1], dtype=torch.int32)
    assert eager._gather_rows(values, pos).tolist() == [[5, 6], [0, 0], [0, 0], [0, 0], [1, 2], [0, 0]]
    with pytest.raises(ValueError, match="^pos_to_token"):
        eager._check_pos_to_token_values(pos, 3)
