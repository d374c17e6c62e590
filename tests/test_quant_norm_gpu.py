"""The TileLang RMSNorm kernels (kernels.quant.norm: quant.norm_fwd, quant.norm_bwd, quant.norm_wgrad) on a
CUDA device, against the float64 oracle through the spec's judges and against the eager code.

GPU tests (skipped, with the reason, without CUDA or tilelang):

* forward for bf16 and fp32, H in {1, 3, 8, 100, 1000, 1025, 7168, 8200} (H not a multiple of the
  16-byte vector runs the scalar configuration; 1025 and 8200 leave a partial last pass of the CTA's
  128 threads), with and without a weight and a residual, token counts 1, 7, 300: every output within
  the judge's bracket; norm_input bit for bit the eager one (a correctly rounded sum);
* rows with a zero, an infinity, a NaN, a sum of squares past fp32's range, subnormal squares: the
  contract's IEEE values, and a neighbour row untouched;
* a row-strided and a misaligned x (copied to a dense block; the misaligned one runs the scalar
  path), empty batches (no launch);
* backward: every gradient within the judge's bracket, with and without grad_norm_input, token counts
  across the weight gradient's row splits (1, 255, 256, 257, 1000); without a residual the same
  grad_x as with a zero one; without a weight no grad_weight;
* the spec's gradient checks and the strategy through the differential and gradient machinery;
* norm_forward_and_per_token_cast (norm_fwd, then the token_cast kernel): e4m3 and e2m1 blocks, a row
  with an infinity, and its strategy through the differential check.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings

import strategies.quant_norm as strat
from kernels.torch import quant_norm as eager
from tkverify import gradients, registry
from tkverify.case import Case
from tkverify.check import check_case

SPEC = registry.get("quant.norm")
BF16, F32 = torch.bfloat16, torch.float32
HIDDENS = [1, 3, 8, 100, 1000, 1025, 7168, 8200]
gpu_checks = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def norm_kernels(tilelang_family):
    tilelang_family("quant")
    import kernels.quant.norm as module

    return module


def _case(x, weight=None, residual=None, eps=1e-6, out_scale=1.0) -> Case:
    inputs = {"x": x}
    if weight is not None:
        inputs["weight"] = weight
    if residual is not None:
        inputs["residual"] = residual
    return Case(params={"eps": eps, "out_scale": out_scale}, inputs=inputs)


def _judge_forward(case: Case) -> None:
    for comparison in check_case(SPEC, SPEC.impls["tilelang"], case, case_dir=None, excuse=False):
        assert comparison.passed, comparison.message


def _inputs(tokens: int, hidden: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(tokens, hidden, generator=g).to(dtype), torch.randn(hidden, generator=g).to(dtype),
            torch.randn(tokens, hidden, generator=g).to(dtype))


@pytest.mark.parametrize("dtype", [BF16, F32])
@pytest.mark.parametrize("hidden", HIDDENS)
@pytest.mark.parametrize("tokens", [1, 7, 300])
@pytest.mark.parametrize("with_weight, with_residual", [(False, False), (True, True), (True, False)])
def test_forward(norm_kernels, dtype, hidden, tokens, with_weight, with_residual):
    x, w, r = _inputs(tokens, hidden, dtype, hidden + tokens)
    w = w if with_weight else None
    r = r if with_residual else None
    _judge_forward(_case(x, w, r, eps=1e-5, out_scale=0.5))
    out, rstd, s = norm_kernels.norm(x.cuda(), None if w is None else w.cuda(), None if r is None else r.cuda(),
                                     1e-5, 0.5)
    _, _, s_eager = eager.norm(x, w, r, 1e-5, 0.5)
    assert out.dtype == dtype and rstd.dtype == F32 and torch.equal(s.cpu(), s_eager)


@pytest.mark.parametrize("dtype", [BF16, F32])
def test_special_rows(norm_kernels, dtype):
    x = torch.randn(7, 64)
    x[0] = 0.0
    x[1, 3] = math.inf
    x[2, 5] = math.nan
    x[3] = 2.0**66
    x[4] *= 2.0**-140
    x[5, 0] = -math.inf
    case = _case(x.to(dtype), torch.randn(64).to(dtype), torch.zeros(7, 64, dtype=dtype))
    _judge_forward(case)
    out, rstd, _ = norm_kernels.norm(**{k: v.cuda() for k, v in case.inputs.items()}, eps=1e-6)
    assert rstd[1].item() == 0.0 and math.isnan(rstd[2].item())
    assert torch.isfinite(out[6]).all()  # the neighbour row is untouched


def test_strided_misaligned_and_empty(norm_kernels):
    wide = torch.randn(5, 300, device="cuda").to(BF16)
    x = wide[:, :128]  # a row stride of 300
    _judge_forward(_case(x.cpu(), torch.ones(128, dtype=BF16)))
    out, _, _ = norm_kernels.norm(x, torch.ones(128, dtype=BF16, device="cuda"))
    ref_out, _, _ = norm_kernels.norm(x.contiguous(), torch.ones(128, dtype=BF16, device="cuda"))
    assert torch.equal(out, ref_out)
    flat = torch.randn(5 * 64 + 1, device="cuda").to(BF16)
    misaligned = flat[1:].view(5, 64)  # 2 bytes past a 16-byte boundary
    out, _, _ = norm_kernels.norm(misaligned)
    assert torch.equal(out, norm_kernels.norm(misaligned.clone())[0])
    empty = torch.empty(0, 16, dtype=BF16, device="cuda")
    out, rstd, s = norm_kernels.norm(empty, None, empty)
    assert out.shape == (0, 16) and rstd.shape == (0,) and s.shape == (0, 16)


@pytest.mark.parametrize("dtype", [BF16, F32])
@pytest.mark.parametrize("hidden", [3, 100, 1025, 7168])
@pytest.mark.parametrize("tokens", [1, 255, 256, 257, 1000])
@pytest.mark.parametrize("with_grad_norm_input", [False, True])
def test_backward(norm_kernels, dtype, hidden, tokens, with_grad_norm_input):
    x, w, r = _inputs(tokens, hidden, dtype, 3 * hidden + tokens)
    case = _case(x, w, r, eps=1e-6, out_scale=3.0)
    g = torch.Generator().manual_seed(tokens)
    cots = {"out": torch.randn(tokens, hidden, generator=g).to(dtype),
            "norm_input": (torch.randn(tokens, hidden, generator=g).to(dtype) if with_grad_norm_input
                           else torch.zeros(tokens, hidden, dtype=dtype))}
    _, rstd, s = norm_kernels.norm(x.cuda(), w.cuda(), r.cuda(), 1e-6, 3.0)
    grads = norm_kernels.norm_bwd(cots["out"].cuda(), cots["norm_input"].cuda() if with_grad_norm_input else None,
                                  x.cuda(), w.cuda(), r.cuda(), rstd=rstd, norm_input=s, eps=1e-6, out_scale=3.0)
    bw = SPEC.backward
    exact = dict(zip(bw.grads, bw.oracle(cots["out"], cots["norm_input"], x, w, r, 1e-6, 3.0)))
    expected = bw.given(case, cots, exact)
    for (name, policy), got in zip(bw.grads.items(), grads):
        comparison = policy.compare(name, got.cpu(), expected[name])
        assert comparison.passed, comparison.message


def test_backward_without_residual_or_weight(norm_kernels):
    x, w, _ = (t.cuda() for t in _inputs(40, 96, BF16, 5))
    grad = torch.randn_like(x)
    _, rstd, s = norm_kernels.norm(x, w)
    gx, gw, gr = norm_kernels.norm_bwd(grad, None, x, w, rstd=rstd, norm_input=s)
    zx, zw, _ = norm_kernels.norm_bwd(grad, None, x, w, torch.zeros_like(x), rstd=rstd, norm_input=s)
    assert gr is None and torch.equal(gx, zx) and torch.equal(gw, zw)
    nx, nw, _ = norm_kernels.norm_bwd(grad, None, x, None, rstd=rstd, norm_input=s)
    assert nw is None and nx.shape == x.shape


@gpu_checks
@given(strat.norm_cases())
def test_strategy_through_the_differential_check(norm_kernels, case):
    _judge_forward(case)


@gpu_checks
@given(strat.norm_cases())
def test_strategy_through_the_gradient_checks(norm_kernels, case):
    gradients.check_gradients(SPEC, "tilelang", case, seed=3)


CAST = registry.get("quant.norm_forward_and_per_token_cast")


@pytest.mark.parametrize("dtype", [BF16, F32])
@pytest.mark.parametrize("hidden", [64, 100, 7168])
@pytest.mark.parametrize("fmt, npc", [("e4m3", 32), ("e4m3", 128), ("e2m1", 16)])
def test_norm_cast(norm_kernels, dtype, hidden, fmt, npc):
    npc = npc if hidden % npc == 0 else hidden
    x, w, r = _inputs(9, hidden, dtype, hidden)
    x[2, 5] = math.inf
    case = Case(params={"eps": 1e-6, "out_scale": 1.0, "fmt": fmt, "num_per_channels": npc, "round_sf": True},
                inputs={"x": x, "weight": w, "residual": r})
    for comparison in check_case(CAST, CAST.impls["tilelang"], case, case_dir=None, excuse=False):
        assert comparison.passed, comparison.message


@gpu_checks
@given(strat.norm_cast_cases())
def test_norm_cast_strategy_through_the_differential_check(norm_kernels, case):
    for comparison in check_case(CAST, CAST.impls["tilelang"], case, case_dir=None, excuse=False):
        assert comparison.passed, comparison.message
