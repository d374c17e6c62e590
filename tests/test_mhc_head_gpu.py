"""The TileLang kernels of the ends of the mHC stack (kernels.mhc.expand, kernels.mhc.head_mix) on a
CUDA device, against the float64 oracle through the ops' policies and against the eager code.

GPU tests (skipped, with the reason, without CUDA or tilelang):

* expand_to_mhc: the forward bit for bit equal to the eager copy, the backward bit for bit equal to
  the eager fp32 sum in stream order and within the summation bound of the oracle, for m = 2..8 and
  H in {1, 7, 8, 9, 1000, 1024, 1025, 7168} (H % 8 != 0 runs the scalar configuration, and so does a
  misaligned view), leading shapes of rank 1 to 3 with 0 tokens included;
* head_compute_mix: the forward within the sigmoid bracket (NaN and infinities included), the
  backward's three gradients within their brackets, for token counts around the CTA and grid sizes
  (0, 1, 255, 257, a grid-stride run over more tokens than 4 CTAs per SM hold);
* bad arguments rejected before any launch, and the hypothesis strategies through check_case.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings

import references.mhc_head as ref
from kernels.torch import mhc_head as eager
from strategies import mhc_head as strat
from tkverify import gradients, registry
from tkverify.case import Case
from tkverify.check import check_case
from tkverify.specs import mhc_head as spec

EXPAND = registry.get("mhc.expand_to_mhc")
HEAD = registry.get("mhc.head_compute_mix")
gpu_checks = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def expand(tilelang_family):
    tilelang_family("mhc")
    import kernels.mhc.expand as module

    return module


@pytest.fixture(scope="module")
def head_mix(tilelang_family):
    tilelang_family("mhc")
    import kernels.mhc.head_mix as module

    return module


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.cpu().view(torch.int16)


@pytest.mark.parametrize("m", range(2, 9))
@pytest.mark.parametrize("hidden", [1, 7, 8, 9, 1000, 1024, 1025, 7168])
def test_expand_matches_the_eager_code_bitwise(expand, m, hidden):
    g = torch.Generator().manual_seed(m * 7919 + hidden)
    x = torch.randn(3, 5, hidden, generator=g).to(torch.bfloat16)
    x.view(-1)[::7] = float("nan")
    grad_out = torch.randn(3, 5, m, hidden, generator=g).to(torch.bfloat16)
    out = expand.expand_to_mhc(x.cuda(), m)
    assert torch.equal(_bits(out), _bits(eager.expand_to_mhc(x, m)))
    grad_x = expand.expand_to_mhc_bwd(grad_out.cuda(), x.cuda(), m)
    assert torch.equal(_bits(grad_x), _bits(eager.expand_to_mhc_bwd(grad_out, x, m)))
    case = Case(params={"m": m}, inputs={"x": x})
    exact = {"grad_x": torch.from_numpy(ref.expand_to_mhc_bwd(grad_out, x, m))}
    expected = spec.given_expand_backward(case, {"out": grad_out}, exact)["grad_x"]
    assert EXPAND.backward.grads["grad_x"].compare("grad_x", grad_x.cpu(), expected).passed


@pytest.mark.parametrize("shape", [(0, 8), (4, 0, 16), (9,), (2, 3, 4, 24)])
def test_expand_leading_shapes_and_empty(expand, shape):
    x = torch.randn(shape).to(torch.bfloat16).cuda()
    out = expand.expand_to_mhc(x, 4)
    assert out.shape == (*shape[:-1], 4, shape[-1])
    assert torch.equal(_bits(out), _bits(eager.expand_to_mhc(x.cpu(), 4)))
    grad = expand.expand_to_mhc_bwd(out, x, 4)
    assert torch.equal(_bits(grad), _bits(eager.expand_to_mhc_bwd(out.cpu(), x.cpu(), 4)))


def test_expand_misaligned_view_runs_the_scalar_path(expand):
    base = torch.randn(2 * 1024 + 1).to(torch.bfloat16).cuda()
    x = base[1:].view(2, 1024)  # 2 bytes past a 16-byte boundary
    assert torch.equal(_bits(expand.expand_to_mhc(x, 3)), _bits(eager.expand_to_mhc(x.cpu(), 3)))


@pytest.mark.parametrize("call, error, word", [
    (lambda k: k.expand_to_mhc(torch.zeros(2, 8, device="cuda"), 4), TypeError, "x"),
    (lambda k: k.expand_to_mhc(torch.zeros(2, 8, dtype=torch.bfloat16), 4), ValueError, "CUDA device"),
    (lambda k: k.expand_to_mhc(torch.zeros(2, 8, dtype=torch.bfloat16, device="cuda"), 9), ValueError, "m"),
    (lambda k: k.expand_to_mhc_bwd(torch.zeros(2, 3, 8, dtype=torch.bfloat16, device="cuda"),
                                   torch.zeros(2, 8, dtype=torch.bfloat16, device="cuda"), 4), ValueError, "grad_out"),
])
def test_expand_bad_arguments(expand, call, error, word):
    with pytest.raises(error, match=word):
        call(expand)


def _head_case(tokens: int, m: int, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    mixes = rng.standard_normal((1, tokens, m)) * 4
    mixes[0, :: 17, 0] = 3e4  # saturated
    inputs = {"mixes": torch.from_numpy(mixes.astype(np.float32)), "scale": torch.tensor([0.8]),
              "base": torch.from_numpy(rng.standard_normal(m).astype(np.float32))}
    return Case(params={"pre_eps": 1e-6}, inputs=inputs)


@pytest.mark.parametrize("m", [2, 3, 4, 7, 8])
@pytest.mark.parametrize("tokens", [0, 1, 255, 257, 200_001])
def test_head_forward_and_backward_within_their_brackets(head_mix, m, tokens):
    case = _head_case(tokens, m, seed=m * 1000 + tokens)
    (comp,) = check_case(HEAD, HEAD.impls["tilelang"], case, case_dir=None)
    assert comp.passed, comp.message
    results = gradients.impl_vs_oracle(HEAD, "tilelang", case, seed=tokens + m)
    assert all(r.passed for r in results), [r.message for r in results if not r.passed]


def test_head_forward_nonfinite_and_unvectorised(head_mix):
    mixes = torch.tensor([[[float("nan"), float("inf"), -float("inf")], [0.0, 1.0, -1.0]]])
    scale, base = torch.tensor([2.0]), torch.zeros(3)
    out = head_mix.head_compute_mix(mixes.cuda(), scale.cuda(), base.cuda(), 0.5).cpu()  # 6 elements: scalar path
    assert out[0, 0, 0].isnan() and out[0, 0, 1] == 1.5 and out[0, 0, 2] == 0.5 and out[0, 1, 0] == 1.0


@pytest.mark.parametrize("call, error, word", [
    (lambda k: k.head_compute_mix(torch.zeros(1, 2, 4, dtype=torch.float64, device="cuda"),
                                  torch.ones(1, dtype=torch.float64, device="cuda"),
                                  torch.zeros(4, dtype=torch.float64, device="cuda"), 0.0), TypeError, "mixes"),
    (lambda k: k.head_compute_mix(torch.zeros(1, 2, 4), torch.ones(1), torch.zeros(4), 0.0), ValueError, "CUDA device"),
    (lambda k: k.head_compute_mix_bwd(torch.zeros(1, 2, 4, device="cuda"), torch.zeros(1, 2, 4, device="cuda"),
                                      torch.ones(1, device="cuda"), torch.zeros(5, device="cuda"), 0.0),
     ValueError, "base"),
])
def test_head_bad_arguments(head_mix, call, error, word):
    with pytest.raises(error, match=word):
        call(head_mix)


@gpu_checks
@given(case=strat.expand_to_mhc_cases())
def test_expand_strategy_cases(expand, case):
    assert all(c.passed for c in check_case(EXPAND, EXPAND.impls["tilelang"], case, case_dir=None))
    assert all(r.passed for r in gradients.impl_vs_oracle(EXPAND, "tilelang", case, seed=11))


@gpu_checks
@given(case=strat.head_compute_mix_nonfinite_cases())
def test_head_nonfinite_strategy_cases(head_mix, case):
    assert all(c.passed for c in check_case(HEAD, HEAD.impls["tilelang"], case, case_dir=None))
