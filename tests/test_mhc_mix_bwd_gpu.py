"""The TileLang backward kernels of mHC's mix ops (kernels.mhc.apply_mix_bwd, kernels.mhc.post_bwd,
kernels.mhc.split_mixes_bwd) on a CUDA device, against the float64 oracle through the spec's judges
and against the eager code.

GPU tests (skipped, with the reason, without CUDA or tilelang):

* for m = 2..8 and H in {1, 7, 8, 9, 1000, 1024, 1025, 7168} (H % 8 != 0 runs the scalar
  configuration; 1025 and 7168 leave a partial last pass of the CTA's 128 threads): the gradients that
  are sums of m terms or fewer (pre_apply_mix's grad_x, post's grad_x and grad_residual) bit for bit
  equal to the eager code, which forms them in the same fp32 order; every gradient within the judge's
  bracket of the float64 backward (the per-token sums over H included);
* a misaligned view (the scalar path), empty batches (no launch, empty gradients), a token with a
  NaN or an infinity leaving its neighbours' gradients untouched;
* the spec's gradient checks (vs the float64 backward and vs finite differences of the TileLang
  forward) and the hypothesis strategies of both ops through the gradient machinery;
* bad arguments rejected before any launch, naming the argument;
* pre_split_mixes' backward for m = 2..8 and post_mult 0, for token counts around the CTA and grid
  sizes (1, 127, 129, a grid-stride run over more tokens than 4 CTAs per SM hold), its empty batch
  (zero scale and base gradients), its strategy through the gradient machinery, and bad arguments.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings

import strategies.mhc as strat
from kernels.torch import mhc as eager
from tkverify import gradients, registry
from tkverify.case import Case

BF16 = torch.bfloat16
APPLY = registry.get("mhc.pre_apply_mix")
POST = registry.get("mhc.post")
SPLIT = registry.get("mhc.pre_split_mixes")
HIDDENS = [1, 7, 8, 9, 1000, 1024, 1025, 7168]
gpu_checks = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def mhc(tilelang_family):
    return tilelang_family("mhc")


def _apply_inputs(m: int, hidden: int, seed: int, a: int = 2, b: int = 3) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(a, b, hidden, generator=g).to(BF16), torch.randn(a, b, m, hidden, generator=g).to(BF16),
            torch.randn(a, b, m, 1, generator=g))


def _post_inputs(m: int, hidden: int, seed: int, a: int = 2, b: int = 3) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(a, b, m, hidden, generator=g).to(BF16), torch.randn(a, b, hidden, generator=g).to(BF16),
            torch.randn(a, b, m, hidden, generator=g).to(BF16), torch.rand(a, b, m, 1, generator=g) * 2,
            torch.randn(a, b, m, m, generator=g))


def _judge(spec, grad_out: torch.Tensor, inputs: dict[str, torch.Tensor], actual: tuple[torch.Tensor, ...]) -> None:
    """Every gradient of `actual` (in the spec's order) within the judge's bracket of the float64 backward."""
    bw = spec.backward
    exact = dict(zip(bw.grads, (torch.from_numpy(t) for t in bw.oracle(grad_out, **inputs))))
    expected = bw.given(Case(params={}, inputs=inputs), {"out": grad_out}, exact)
    for (name, policy), got in zip(bw.grads.items(), actual):
        comparison = policy.compare(name, got.cpu(), expected[name])
        assert comparison.passed, comparison.message


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.cpu().view(torch.int16)


def _cuda(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.cuda() for t in tensors]


@pytest.mark.parametrize("m", range(2, 9))
@pytest.mark.parametrize("hidden", HIDDENS)
def test_pre_apply_mix_bwd(mhc, m, hidden):
    grad_out, x, mix = _apply_inputs(m, hidden, seed=m * 7919 + hidden)
    grad_x, grad_mix = mhc.pre_apply_mix_bwd(*_cuda(grad_out, x, mix))
    assert grad_x.dtype == BF16 and grad_mix.dtype == torch.float32 and grad_mix.shape == mix.shape
    assert torch.equal(_bits(grad_x), _bits(eager.pre_apply_mix_bwd(grad_out, x, mix)[0]))
    _judge(APPLY, grad_out, {"x": x, "mix": mix}, (grad_x, grad_mix))


@pytest.mark.parametrize("m", range(2, 9))
@pytest.mark.parametrize("hidden", HIDDENS)
def test_post_bwd(mhc, m, hidden):
    grad_out, x, residual, post, comb = _post_inputs(m, hidden, seed=m * 6007 + hidden)
    got = mhc.post_bwd(*_cuda(grad_out, x, residual, post, comb))
    assert [t.dtype for t in got] == [BF16, BF16, torch.float32, torch.float32]
    assert [t.shape for t in got] == [x.shape, residual.shape, post.shape, comb.shape]
    want = eager.post_bwd(grad_out, x, residual, post, comb)
    assert torch.equal(_bits(got[0]), _bits(want[0])) and torch.equal(_bits(got[1]), _bits(want[1]))
    _judge(POST, grad_out, {"x": x, "residual": residual, "post": post, "comb": comb}, got)


def test_misaligned_views_run_the_scalar_path(mhc):
    m, hidden, tokens = 4, 1024, 3
    grad_out, x, mix = _apply_inputs(m, hidden, seed=1, a=1, b=tokens)
    shifted = torch.empty(x.numel() + 1, dtype=BF16, device="cuda")[1:].view(x.shape)  # 2 bytes past 16
    shifted.copy_(x)
    got = mhc.pre_apply_mix_bwd(grad_out.cuda(), shifted, mix.cuda())
    assert torch.equal(_bits(got[0]), _bits(eager.pre_apply_mix_bwd(grad_out, x, mix)[0]))
    _judge(APPLY, grad_out, {"x": x, "mix": mix}, got)
    grad_out, x, residual, post, comb = _post_inputs(m, hidden, seed=2, a=1, b=tokens)
    shifted = torch.empty(residual.numel() + 1, dtype=BF16, device="cuda")[1:].view(residual.shape)
    shifted.copy_(residual)
    got = mhc.post_bwd(grad_out.cuda(), x.cuda(), shifted, post.cuda(), comb.cuda())
    _judge(POST, grad_out, {"x": x, "residual": residual, "post": post, "comb": comb}, got)


@pytest.mark.parametrize("a, b", [(0, 3), (2, 0)])
def test_empty_batches(mhc, a, b):
    grad_x, grad_mix = mhc.pre_apply_mix_bwd(*_cuda(*_apply_inputs(4, 16, seed=3, a=a, b=b)))
    assert grad_x.shape == (a, b, 4, 16) and grad_mix.shape == (a, b, 4, 1)
    got = mhc.post_bwd(*_cuda(*_post_inputs(4, 16, seed=4, a=a, b=b)))
    assert [tuple(t.shape) for t in got] == [(a, b, 16), (a, b, 4, 16), (a, b, 4, 1), (a, b, 4, 4)]


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_nonfinite_token_leaves_its_neighbours_alone(mhc, bad):
    m, hidden = 3, 1032
    grad_out, x, mix = _apply_inputs(m, hidden, seed=5)
    x[0, 1, 2, 700] = bad
    got = mhc.pre_apply_mix_bwd(*_cuda(grad_out, x, mix))
    assert not got[1][0, 1].isfinite().all()  # the per-token sum of the token itself
    _judge(APPLY, grad_out, {"x": x, "mix": mix}, got)  # its neighbours within their brackets
    grad_out, x, residual, post, comb = _post_inputs(m, hidden, seed=6)
    residual[1, 0, 1, 5] = bad
    got = mhc.post_bwd(*_cuda(grad_out, x, residual, post, comb))
    assert not got[3][1, 0].isfinite().all()
    _judge(POST, grad_out, {"x": x, "residual": residual, "post": post, "comb": comb}, got)


@pytest.mark.parametrize("spec, inputs", [(APPLY, _apply_inputs), (POST, _post_inputs)])
@pytest.mark.parametrize("m", [2, 5, 8])
def test_gradient_checks_of_the_spec(mhc, spec, inputs, m):
    names = ("x", "mix") if spec is APPLY else ("x", "residual", "post", "comb")
    case = Case(params={}, inputs=dict(zip(names, inputs(m, 1025, seed=m)[1:])))
    checks = gradients.run_checks(spec, "tilelang", case, seed=m + 10)
    assert checks and all(c.passed for c in checks), [c.message for c in checks if not c.passed]


@gpu_checks
@given(case=strat.pre_apply_mix_cases())
def test_pre_apply_mix_strategy_cases(mhc, case):
    results = gradients.impl_vs_oracle(APPLY, "tilelang", case, seed=17)
    assert results and all(r.passed for r in results), [r.message for r in results if not r.passed]


@gpu_checks
@given(case=strat.post_cases())
def test_post_strategy_cases(mhc, case):
    results = gradients.impl_vs_oracle(POST, "tilelang", case, seed=19)
    assert results and all(r.passed for r in results), [r.message for r in results if not r.passed]


def _apply_call(k, grad_out=None, x=None, mix=None):
    d_grad_out, d_x, d_mix = _cuda(*_apply_inputs(4, 16, seed=7))
    return k.pre_apply_mix_bwd(d_grad_out if grad_out is None else grad_out, d_x if x is None else x,
                               d_mix if mix is None else mix)


def _post_call(k, **changed):
    names = ("grad_out", "x", "residual", "post", "comb")
    args = dict(zip(names, _cuda(*_post_inputs(4, 16, seed=8))))
    args.update(changed)
    return k.post_bwd(*(args[n] for n in names))


@pytest.mark.parametrize("call, error, word", [
    (lambda k: _apply_call(k, grad_out=torch.zeros(2, 3, 16, device="cuda")), TypeError, "grad_out"),
    (lambda k: _apply_call(k, grad_out=torch.zeros(2, 3, 15, dtype=BF16, device="cuda")), ValueError, "grad_out"),
    (lambda k: _apply_call(k, mix=torch.zeros(2, 3, 4, 1, dtype=torch.float64, device="cuda")), TypeError, "mix"),
    (lambda k: k.pre_apply_mix_bwd(*_apply_inputs(4, 16, seed=9)), ValueError, "CUDA device"),
    (lambda k: k.pre_apply_mix_bwd(*_cuda(*_apply_inputs(9, 16, seed=9))), ValueError, "m"),
    (lambda k: _post_call(k, grad_out=torch.zeros(2, 3, 4, 16, device="cuda")), TypeError, "grad_out"),
    (lambda k: _post_call(k, grad_out=torch.zeros(2, 3, 16, 4, dtype=BF16, device="cuda").transpose(-1, -2)),
     ValueError, "grad_out"),
    (lambda k: _post_call(k, comb=torch.zeros(2, 3, 4, 3, device="cuda")), ValueError, "comb"),
    (lambda k: k.post_bwd(*_post_inputs(4, 16, seed=10)), ValueError, "CUDA device"),
])
def test_bad_arguments_name_the_argument(mhc, call, error, word):
    with pytest.raises(error, match=word):
        call(mhc)


def _split_case(m: int, tokens: int, post_mult: float, seed: int) -> Case:
    g = torch.Generator().manual_seed(seed)
    width = m * (m + 2)
    mixes = torch.randn(1, tokens, width, generator=g) * 3
    mixes[0, ::17, 0] = 3e4  # saturated: sigmoid' 0
    return Case(params={"m": m, "post_mult": post_mult, "pre_eps": 1e-6},
                inputs={"mixes": mixes, "scale": torch.rand(3, generator=g) * 2 - 1, "base": torch.randn(width,
                                                                                                    generator=g)})


@pytest.mark.parametrize("m", range(2, 9))
@pytest.mark.parametrize("tokens, post_mult", [(1, 2.0), (127, 0.0), (129, -1.5), (200_001, 1.0)])
def test_pre_split_mixes_bwd_within_its_brackets(mhc, m, tokens, post_mult):
    case = _split_case(m, tokens, post_mult, seed=m * 1000 + tokens)
    results = gradients.impl_vs_oracle(SPLIT, "tilelang", case, seed=m + tokens)
    assert len(results) == 3 and all(r.passed for r in results), [r.message for r in results if not r.passed]


def test_pre_split_mixes_bwd_post_mult_zero_gives_zero_post_gradients(mhc):
    m = 4
    case = _split_case(m, 300, 0.0, seed=7)
    g = torch.Generator().manual_seed(8)
    grads = [torch.randn(1, 300, m, 1, generator=g), torch.randn(1, 300, m, 1, generator=g),
             torch.randn(1, 300, m, m, generator=g)]
    inputs = {n: t.cuda() for n, t in case.inputs.items()}
    grad_mixes, grad_scale, grad_base = mhc.pre_split_mixes_bwd(*_cuda(*grads), **inputs, **case.params)
    assert not grad_mixes[..., m:2 * m].cpu().any() and grad_scale[1].item() == 0.0
    assert not grad_base[m:2 * m].cpu().any()


def test_pre_split_mixes_bwd_empty_batch(mhc):
    m = 3
    inputs = {"mixes": torch.zeros(2, 0, 15, device="cuda"), "scale": torch.ones(3, device="cuda"),
              "base": torch.zeros(15, device="cuda")}
    grads = [torch.zeros(2, 0, m, 1, device="cuda"), torch.zeros(2, 0, m, 1, device="cuda"),
             torch.zeros(2, 0, m, m, device="cuda")]
    grad_mixes, grad_scale, grad_base = mhc.pre_split_mixes_bwd(*grads, **inputs, m=m, post_mult=2.0, pre_eps=0.0)
    assert grad_mixes.shape == (2, 0, 15) and not grad_scale.cpu().any() and not grad_base.cpu().any()


@gpu_checks
@given(case=strat.pre_split_mixes_cases())
def test_pre_split_mixes_strategy_cases(mhc, case):
    results = gradients.impl_vs_oracle(SPLIT, "tilelang", case, seed=23)
    assert results and all(r.passed for r in results), [r.message for r in results if not r.passed]


def _split_call(k, **changed):
    m = 4
    args = {"grad_pre": torch.zeros(1, 2, m, 1), "grad_post": torch.zeros(1, 2, m, 1),
            "grad_comb": torch.zeros(1, 2, m, m), "mixes": torch.zeros(1, 2, 24), "scale": torch.ones(3),
            "base": torch.zeros(24)}
    args = {n: t.cuda() for n, t in args.items()}
    args.update(changed)
    return k.pre_split_mixes_bwd(**args, m=m, post_mult=2.0, pre_eps=0.0)


@pytest.mark.parametrize("changed, error, word", [
    ({"grad_pre": torch.zeros(1, 2, 4, 1, dtype=torch.float64)}, TypeError, "grad_pre"),
    ({"grad_post": torch.zeros(1, 2, 3, 1)}, ValueError, "grad_post"),
    ({"grad_comb": torch.zeros(1, 2, 4, 4, dtype=BF16)}, TypeError, "grad_comb"),
    ({"mixes": torch.zeros(1, 2, 23)}, ValueError, "mixes"),
    ({"scale": torch.ones(2)}, ValueError, "scale"),
])
def test_pre_split_mixes_bwd_bad_arguments(mhc, changed, error, word):
    with pytest.raises(error, match=word):
        _split_call(mhc, **{n: t.cuda() for n, t in changed.items()})
