"""The quantisation layout ops' TileLang implementations on a GPU against the oracles, through the specs'
judges (skipped without CUDA): the lossless kernel on every configuration and the strategy's edges, the
transposed per-channel cast (a composition of our cast and transpose kernels); the weight sf re-layout kernel
on every configuration, and tile-kernels' batched call of two weights against two single calls."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings

import strategies.quant_layout as strat
from kernels.quant.lossless import LOSSLESS_CONFIGS
from tkverify import registry
from tkverify.case import Case
from tkverify.check import check_case

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
LOSSLESS = registry.get("quant.per_block_cast_lossless")
TRANSPOSE = registry.get("quant.per_channel_cast_and_transpose")
checks = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))


def _judge(spec, case: Case) -> None:
    for comparison in check_case(spec, spec.impls["tilelang"], case, case_dir=None):
        assert comparison.passed, comparison.message


@checks
@given(case=strat.per_block_cast_lossless_cases())
def test_lossless_kernel_against_the_oracle(case: Case):
    _judge(LOSSLESS, case)


@pytest.mark.parametrize("config", LOSSLESS_CONFIGS, ids=str)
@pytest.mark.parametrize("num_rows", [1, 129, 1000])
def test_lossless_kernel_every_configuration(config, num_rows):
    g = torch.Generator().manual_seed(num_rows)
    hidden = 384 if config.out_cols == 128 else 96
    x = torch.randint(-128, 128, (num_rows, hidden // 2), dtype=torch.int8, generator=g)
    exponents = torch.randint(-14, 1, (num_rows, hidden // config.in_cols), generator=g)
    case = Case(params={"x_block_size": (1, config.in_cols), "out_block_size": (config.out_rows, config.out_cols)},
                inputs={"x": x, "x_sf": torch.pow(2.0, exponents.double()).float()})
    _judge(LOSSLESS, case)


@pytest.mark.parametrize("refused, use_ue8m0", [(3.0, False), (0.0, False), (-1.0, False), (float("inf"), False),
                                               (2.0**-128, False), (2.0**-18, False), (2.0**-122, True)], ids=str)
def test_lossless_kernel_makes_a_refused_out_block_nan(refused, use_ue8m0):
    """An input sf the contract refuses is not checked by the TileLang wrapper (no read back): its out block
    comes out NaN (sf and every code), and every other block is the valid call's, bit for bit."""
    from kernels.quant.lossless import per_block_cast_lossless

    g = torch.Generator().manual_seed(11)
    x = torch.randint(-128, 128, (4, 128), dtype=torch.int8, generator=g).cuda()  # T = 4, H = 256
    valid = torch.pow(2.0, torch.randint(-3, 4, (4, 8), generator=g).double()).float().cuda()
    spoiled = valid.clone()
    # out block (1, 1) covers the input sf [1, 4:8]
    if use_ue8m0:  # all four 2^-122: the out sf 2^-128, below the least ue8m0
        spoiled[1, 4:] = refused
    else:
        spoiled[1, 5] = refused
    kwargs = {"x_block_size": (1, 32), "out_block_size": (1, 128), "use_ue8m0": use_ue8m0}
    want_data, want_sf = per_block_cast_lossless(x, valid, **kwargs)
    data, sf = per_block_cast_lossless(x, spoiled, **kwargs)
    torch.cuda.synchronize()
    nan_sf = (sf == 0xFF) if use_ue8m0 else torch.isnan(sf)
    assert nan_sf[1, 1] and nan_sf.sum() == 1
    assert torch.isnan(data[1, 128:].float()).all()
    keep = torch.ones(4, 2, dtype=torch.bool, device="cuda")
    keep[1, 1] = False
    assert torch.equal(sf[keep].view(torch.uint8), want_sf[keep].view(torch.uint8))
    elements = keep.repeat_interleave(128, dim=1)
    assert torch.equal(data[elements].view(torch.uint8), want_data[elements].view(torch.uint8))


@checks
@given(case=strat.per_channel_cast_and_transpose_cases())
def test_channel_transpose_against_the_oracle(case: Case):
    _judge(TRANSPOSE, case)


@checks
@given(case=strat.per_channel_cast_fused_cases())
def test_channel_fused_against_the_oracle(case: Case):
    _judge(registry.get("quant.per_channel_cast_fused"), case)



WEIGHT_SF = registry.get("quant.batched_transpose_weight_sf")


@checks
@given(case=strat.batched_transpose_weight_sf_cases())
def test_weight_sf_kernel_against_the_oracle(case: Case):
    _judge(WEIGHT_SF, case)


@pytest.mark.parametrize("block_size", [32, 128])
@pytest.mark.parametrize("shape", [(7168, 2048), (640, 384), (128, 128)], ids=str)
@pytest.mark.parametrize("groups", [None, 3])
@pytest.mark.parametrize("transpose_sf1", [False, True])
def test_weight_sf_kernel_every_configuration(block_size, shape, groups, transpose_sf1):
    g = torch.Generator().manual_seed(shape[0] + block_size)
    sf_shape = ((groups,) if groups else ()) + (shape[0] // block_size, shape[1] // block_size)
    exponents = torch.randint(-127, 128, sf_shape, generator=g)
    case = Case(params={"block_size": block_size, "transpose_sf1": transpose_sf1},
                inputs={"sf": torch.pow(2.0, exponents.double()).float()})
    _judge(WEIGHT_SF, case)


def test_tile_kernels_batching_changes_nothing():
    """tile-kernels converts two weights in one call exactly as in two calls of one weight each."""
    from tkverify.adapters import tile_kernels, tile_kernels_quant_layout as adapter

    why = tile_kernels.missing_reason("quant.batched_transpose_weight_sf", tile_kernels.installed_version())
    if why:
        pytest.skip(why)
    g = torch.Generator().manual_seed(7)
    sfs = [torch.pow(2.0, torch.randint(-20, 21, shape, generator=g).double()).float().cuda()
           for shape in ((3, 5, 7), (16, 24))]
    flags = [True, False]
    together = adapter.weight_sf_batch(sfs, 128, flags)
    for sf, flag, pair in zip(sfs, flags, together):
        alone = adapter.weight_sf_batch([sf], 128, [flag])[0]
        for mine, theirs in zip(pair, alone):
            assert mine.shape == theirs.shape and mine.stride() == theirs.stride()
            assert torch.equal(mine, theirs)
