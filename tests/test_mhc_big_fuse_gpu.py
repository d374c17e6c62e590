"""The TileLang implementation of mhc.pre_big_fuse (kernels.mhc.big_fuse: the four stages' kernels in
sequence) on a CUDA device.

GPU tests (skipped, with the reason, without CUDA or tilelang):

* every output within the spec's bounds (through tkverify.check.check_case) for m 2..8, S 1, 3, 16, token
  counts of 1 and odd counts, H with and without 16-byte vectors, repeat 1 and 10;
* the outputs bit for bit those of the four stage kernels called by hand (the composition adds nothing);
* zero rows, post_mult 0, NaN partials and an infinite residual value, an empty batch (no launch);
* the argument checks before any launch (float64 refused, sinkhorn_repeat beyond the kernel's limit).
"""

from __future__ import annotations

import math

import pytest
import torch

from tkverify import registry
from tkverify.case import Case
from tkverify.check import check_case

BIG_FUSE = registry.get("mhc.pre_big_fuse")
PARAMS = {"rms_eps": 1e-6, "pre_eps": 1e-2, "sinkhorn_eps": 1e-6, "post_mult": 2.0, "sinkhorn_repeat": 10}


@pytest.fixture(scope="module")
def big_fuse(tilelang_family):
    return tilelang_family("mhc.big_fuse")


def _case(tokens: int, m: int, hidden: int, splits: int, seed: int = 0, **params) -> Case:
    g = torch.Generator().manual_seed(seed)
    residual = torch.randn(tokens, m, hidden, generator=g).to(torch.bfloat16)
    x = residual.double().reshape(tokens, m * hidden)
    fn = torch.randn(m * (m + 2), m * hidden, generator=g, dtype=torch.float64) / math.sqrt(m * hidden)
    cuts = torch.linspace(0, m * hidden, splits + 1).round().long().tolist()
    p = torch.stack([x[:, lo:hi] @ fn[:, lo:hi].T for lo, hi in zip(cuts, cuts[1:])]).float()
    q = torch.stack([(x[:, lo:hi] ** 2).sum(-1) for lo, hi in zip(cuts, cuts[1:])]).float()
    return Case(params={**PARAMS, **params},
                inputs={"gemm_out_mul": p, "gemm_out_sqrsum": q, "scale": torch.rand(3, generator=g) + 0.5,
                        "base": torch.randn(m * (m + 2), generator=g), "residual": residual})


def _on_cuda(case: Case) -> dict[str, torch.Tensor]:
    return {k: v.cuda() for k, v in case.inputs.items()}


def _within(case: Case) -> None:
    for comp in check_case(BIG_FUSE, BIG_FUSE.impls["tilelang"], case, case_dir=None):
        assert comp.passed, comp.message


@pytest.mark.parametrize("m", range(2, 9))
@pytest.mark.parametrize("splits", [1, 3, 16])
def test_within_the_bounds(big_fuse, m, splits):
    _within(_case(tokens=33, m=m, hidden=129 if m % 2 else 128, splits=splits, seed=m + splits))


@pytest.mark.parametrize("repeat", [1, 10])
def test_bench_like_shape_within_the_bounds(big_fuse, repeat):
    _within(_case(tokens=257, m=4, hidden=7168, splits=16, seed=5, sinkhorn_repeat=repeat))


def test_bit_for_bit_the_stage_kernels(big_fuse, tilelang_family):
    from kernels.mhc.fused_norm import reduce_partials_and_rmsnorm
    mhc = tilelang_family("mhc")
    case = _case(tokens=17, m=4, hidden=1000, splits=3, seed=7)
    c, prm = _on_cuda(case), case.params
    post, comb, layer_input = big_fuse.pre_big_fuse(**c, **prm)
    _, _, mixes = reduce_partials_and_rmsnorm(c["gemm_out_mul"][:, :, None], c["gemm_out_sqrsum"][:, :, None], 4000,
                                              prm["rms_eps"])
    pre, post_ref, logits = mhc.pre_split_mixes(mixes[None], c["scale"], c["base"], 4, prm["post_mult"], prm["pre_eps"])
    assert torch.equal(post, post_ref[0, :, :, 0])
    assert torch.equal(comb, mhc.sinkhorn(logits[0], prm["sinkhorn_repeat"], prm["sinkhorn_eps"]))
    assert torch.equal(layer_input, mhc.pre_apply_mix(c["residual"][None], pre)[0])


def test_edges(big_fuse):
    case = _case(tokens=5, m=4, hidden=64, splits=2, seed=9, post_mult=0.0)
    case.inputs["gemm_out_mul"][:, 1] = 0.0
    case.inputs["gemm_out_sqrsum"][:, 1] = 0.0
    case.inputs["gemm_out_mul"][0, 2, 3] = math.nan
    case.inputs["residual"][3, 1, 7] = math.inf
    _within(case)
    post, comb, layer_input = big_fuse.pre_big_fuse(**_on_cuda(case), **case.params)
    assert (post[[0, 1, 3, 4]] == 0).all() and torch.isnan(layer_input[2]).all() and layer_input[3, 7].isinf()
    empty = _case(tokens=0, m=4, hidden=64, splits=16)
    post, comb, layer_input = big_fuse.pre_big_fuse(**_on_cuda(empty), **empty.params)
    assert post.shape == (0, 4) and comb.shape == (0, 4, 4) and layer_input.shape == (0, 64)


def test_argument_checks_before_any_launch(big_fuse):
    case = _case(tokens=3, m=4, hidden=16, splits=2)
    c = _on_cuda(case)
    with pytest.raises(TypeError, match="gemm_out_mul"):
        big_fuse.pre_big_fuse(**{**c, "gemm_out_mul": c["gemm_out_mul"].double()}, **case.params)
    with pytest.raises(ValueError, match="sinkhorn_repeat"):
        big_fuse.pre_big_fuse(**c, **{**case.params, "sinkhorn_repeat": 2**29 + 1})
