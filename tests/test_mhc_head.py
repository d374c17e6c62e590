"""The ends of the mHC stack on the CPU: mhc.expand_to_mhc and mhc.head_compute_mix.

The float64 oracles against hand-worked values, their hand-derived backwards against
torch.autograd in float64 and by gradcheck; the eager implementations against the oracles
through the op's policies (forward and backward, empty batches and non-finite inputs
included); bad arguments; the bounds rejecting plausible wrong implementations; the
strategies' promised features; the benchmark shapes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import references.mhc_head as ref
from kernels.torch import mhc_head as impl
from strategies import mhc_head as strat
from tkverify import gradients, registry
from tkverify.case import Case
from tkverify.check import check_case
from tkverify.specs import mhc_head as spec_module

EXPAND = registry.get("mhc.expand_to_mhc")
HEAD = registry.get("mhc.head_compute_mix")
BF16, F32, F64 = torch.bfloat16, torch.float32, torch.float64
checks = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))


# -- the oracles, by hand ------------------------------------------------------------------


def test_expand_oracle_by_hand():
    x = torch.tensor([[1.5, -0.0, math.inf]], dtype=BF16)
    out = ref.expand_to_mhc(x, 3)
    assert out.shape == (1, 3, 3)
    for k in range(3):
        assert list(out[0, k]) == [1.5, 0.0, math.inf] and math.copysign(1, out[0, k, 1]) == -1


def test_expand_backward_oracle_is_the_exact_sum():
    # 1 + 2^-24 + 2^-24 is not an fp32 sum of these in order (each addition rounds back to 1)
    g = np.array([[[1.0], [2.0**-24], [2.0**-24]]])
    assert ref.expand_to_mhc_bwd(g, np.zeros((1, 1)), 3)[0, 0] == 1.0 + 2.0**-23


def test_head_oracle_by_hand():
    # u = mixes * 0.5 + base = (0, ln 3); sigmoid = (1/2, 3/4); slope = (1/4, 3/16)
    mixes = np.array([[[0.0, 2.0 * math.log(3)]]])
    scale, base = np.array([0.5]), np.array([0.0, 0.0])
    assert ref.head_compute_mix(mixes, scale, base, 0.25) == pytest.approx(np.array([[[0.75, 1.0]]]), abs=1e-15)
    g = np.array([[[1.0, -2.0]]])
    grad_mixes, grad_scale, grad_base = ref.head_compute_mix_bwd(g, mixes, scale, base, 0.25)
    t = np.array([0.25, -2.0 * 3 / 16])
    assert grad_mixes[0, 0] == pytest.approx(t * 0.5, rel=1e-15)
    assert grad_scale[0] == pytest.approx(t[1] * 2.0 * math.log(3), rel=1e-15)
    assert grad_base == pytest.approx(t, rel=1e-15)


def test_head_oracle_saturates_and_propagates_nan():
    mixes = np.array([[[math.inf, -math.inf, math.nan]]])
    out = ref.head_compute_mix(mixes, np.array([1.0]), np.zeros(3), 1e-6)
    assert out[0, 0, 0] == 1.0 + 1e-6 and out[0, 0, 1] == 1e-6 and math.isnan(out[0, 0, 2])
    grad_mixes, grad_scale, _ = ref.head_compute_mix_bwd(np.ones((1, 1, 3)), mixes, np.array([1.0]), np.zeros(3), 0)
    assert list(grad_mixes[0, 0, :2]) == [0.0, 0.0]  # the slope is 0 at +-inf
    assert math.isnan(grad_scale[0])  # 0 * inf


def test_empty_batches():
    assert ref.expand_to_mhc_bwd(np.zeros((0, 2, 5)), np.zeros((0, 5)), 2).shape == (0, 5)
    grads = ref.head_compute_mix_bwd(np.zeros((0, 3, 4)), np.zeros((0, 3, 4)), np.ones(1), np.zeros(4), 0)
    assert [g.shape for g in grads] == [(0, 3, 4), (1,), (4,)] and not grads[1].any() and not grads[2].any()
    assert impl.expand_to_mhc(torch.zeros(2, 0, 7, dtype=BF16), 4).shape == (2, 0, 4, 7)
    _, grad_scale, grad_base = impl.head_compute_mix_bwd(*(torch.zeros(0, 1, 3),) * 2, torch.ones(1),
                                                         torch.zeros(3), 0.0)
    assert grad_scale.tolist() == [0.0] and grad_base.tolist() == [0.0] * 3


# -- the hand-derived backwards against autograd, and by gradcheck ----------------------------


@pytest.mark.parametrize("m, tokens", [(2, 1), (4, 5), (8, 3)])
def test_backwards_match_autograd_in_float64(m, tokens):
    g = torch.Generator().manual_seed(m * 10 + tokens)
    x = torch.randn(2, tokens, 9, generator=g, dtype=F64, requires_grad=True)
    out = x.unsqueeze(-2).expand(2, tokens, m, 9)
    cot = torch.randn(out.shape, generator=g, dtype=F64)
    (auto,) = torch.autograd.grad(out, x, cot)
    # autograd sums in float64, in its own order
    assert np.allclose(ref.expand_to_mhc_bwd(cot, x.detach(), m), auto.numpy(), rtol=1e-12, atol=1e-13)

    mixes = (torch.randn(2, tokens, m, generator=g, dtype=F64) * 3).requires_grad_(True)
    scale = torch.tensor([0.7], dtype=F64, requires_grad=True)
    base = torch.randn(m, generator=g, dtype=F64, requires_grad=True)
    mix = torch.sigmoid(mixes * scale + base) + 1e-6
    cot = torch.randn(mix.shape, generator=g, dtype=F64)
    auto = torch.autograd.grad(mix, (mixes, scale, base), cot)
    hand = ref.head_compute_mix_bwd(cot, mixes.detach(), scale.detach(), base.detach(), 1e-6)
    for a, h in zip(auto, hand):
        assert np.allclose(h, a.numpy(), rtol=1e-12, atol=1e-15)


@checks
@given(case=strat.head_compute_mix_cases(), seed=st.integers(0, 2**16))
def test_head_float64_backward_passes_gradcheck(case, seed):
    results = gradients.oracle_gradcheck(HEAD, case, seed)
    assert all(r.passed for r in results), [r.message for r in results if not r.passed]


@checks
@given(case=strat.expand_to_mhc_cases(), seed=st.integers(0, 2**16))
def test_expand_float64_backward_passes_gradcheck(case, seed):
    results = gradients.oracle_gradcheck(EXPAND, case, seed)
    assert all(r.passed for r in results), [r.message for r in results if not r.passed]


# -- the eager implementations against the oracles --------------------------------------------


@checks
@given(case=strat.expand_to_mhc_cases())
def test_eager_expand_passes_forward_and_backward(case):
    assert all(c.passed for c in check_case(EXPAND, EXPAND.impls["torch"], case, case_dir=None))
    assert all(r.passed for r in gradients.impl_vs_oracle(EXPAND, "torch", case, seed=3))


@checks
@given(case=strat.head_compute_mix_cases())
def test_eager_head_passes_forward_and_backward(case):
    assert all(c.passed for c in check_case(HEAD, HEAD.impls["torch"], case, case_dir=None))
    results = gradients.impl_vs_oracle(HEAD, "torch", case, seed=5)
    assert all(r.passed for r in results), [r.message for r in results if not r.passed]


@checks
@given(case=strat.head_compute_mix_nonfinite_cases())
def test_eager_head_passes_with_nonfinite_inputs(case):
    assert all(c.passed for c in check_case(HEAD, HEAD.impls["torch"], case, case_dir=None))


def test_expand_backward_sums_extremes_within_the_bound():
    """bf16's largest values: the fp32 sum may overflow where the float64 one does not round to
    bf16's infinity (the policy accepts what the signed reach explains); cancelling pairs give 0."""
    big = 3.3895313892515355e38
    grad_out = torch.tensor([[[big, 1.0], [big, -1.0], [-big, 2.0**-133]]], dtype=BF16)
    x = torch.zeros(1, 2, dtype=BF16)
    case = Case(params={"m": 3}, inputs={"x": x})
    expected = spec_module.given_expand_backward(case, {"out": grad_out},
                                                 {"grad_x": torch.from_numpy(ref.expand_to_mhc_bwd(grad_out, x, 3))})
    comp = EXPAND.backward.grads["grad_x"].compare("grad_x", impl.expand_to_mhc_bwd(grad_out, x, 3),
                                                  expected["grad_x"])
    assert comp.passed, comp.message


# -- the bounds reject plausible wrong implementations ------------------------------------


def _head_case(seed=0, tokens=64, m=4):
    rng = np.random.default_rng(seed)
    inputs = {"mixes": torch.from_numpy(rng.standard_normal((1, tokens, m)).astype(np.float32) * 2),
              "scale": torch.tensor([0.75]), "base": torch.from_numpy(rng.standard_normal(m).astype(np.float32))}
    return Case(params={"pre_eps": 1e-6}, inputs=inputs)


def _judge_head_backward(case, grads, seed=1):
    mixes = case.inputs["mixes"]
    cot = torch.from_numpy(np.random.default_rng(seed).standard_normal(mixes.shape).astype(np.float32))
    exact = dict(zip(HEAD.backward.grads, (torch.from_numpy(g) for g in
                                           ref.head_compute_mix_bwd(cot, **case.inputs, **case.params))))
    expected = spec_module.given_head_backward(case, {"mix": cot}, exact)
    actual = dict(zip(HEAD.backward.grads, grads(cot, **case.inputs, **case.params)))
    return {name: policy.compare(name, actual[name], expected[name]).passed
            for name, policy in HEAD.backward.grads.items()}


def test_head_backward_bounds_pass_the_eager_code_and_fail_wrong_ones():
    case = _head_case()
    assert all(_judge_head_backward(case, impl.head_compute_mix_bwd).values())

    def slope_of_u_not_of_sigmoid(g, mixes, scale, base, pre_eps):  # t = g * u (1 - u): a wrong slope
        u = mixes * scale + base
        t = g * u * (1 - u)
        return t * scale, (t * mixes).reshape(1, -1).sum(-1), t.reshape(-1, mixes.shape[-1]).sum(0)

    def scale_gradient_in_bf16(g, mixes, scale, base, pre_eps):  # the token sums rounded to bf16 each step
        grad_mixes, _, grad_base = impl.head_compute_mix_bwd(g, mixes, scale, base, pre_eps)
        s = torch.sigmoid(mixes * scale + base)
        terms = (g * s * (1 - s) * mixes).reshape(-1)
        acc = torch.zeros((), dtype=BF16)
        for term in terms:
            acc = (acc.float() + term).to(BF16)
        return grad_mixes, acc.float().reshape(1), grad_base

    assert not any(_judge_head_backward(case, slope_of_u_not_of_sigmoid).values())
    verdict = _judge_head_backward(case, scale_gradient_in_bf16)
    assert verdict == {"grad_mixes": True, "grad_scale": False, "grad_base": True}


def test_head_forward_bracket_rejects_a_shifted_base():
    case = _head_case(seed=2)
    inputs = case.inputs
    wrong = impl.head_compute_mix(inputs["mixes"], inputs["scale"], inputs["base"].roll(1), 1e-6)
    expected = spec_module.given_head(case, {"mix": wrong})["mix"]
    assert not HEAD.outputs["mix"].compare("mix", wrong, expected).passed
    right = impl.head_compute_mix(**inputs, pre_eps=1e-6)
    assert HEAD.outputs["mix"].compare("mix", right, expected).passed


def test_expand_backward_accumulated_in_bf16_fails():
    """Rounding each partial sum to bf16 loses what the fp32 accumulation keeps."""
    # exact 1 + 3 2^-9, nearest bf16 1 + 2^-7; in bf16 every 1 + 2^-9 ties back to 1
    grad_out = torch.tensor([[[1.0], [2.0**-9], [2.0**-9], [2.0**-9]]], dtype=BF16)
    x = torch.zeros(1, 1, dtype=BF16)
    bf16_sum = grad_out[:, 0]
    for k in range(1, 4):
        bf16_sum = bf16_sum + grad_out[:, k]
    assert bf16_sum.item() == 1.0
    case = Case(params={"m": 4}, inputs={"x": x})
    exact = {"grad_x": torch.from_numpy(ref.expand_to_mhc_bwd(grad_out, x, 4))}
    expected = spec_module.given_expand_backward(case, {"out": grad_out}, exact)["grad_x"]
    policy = EXPAND.backward.grads["grad_x"]
    assert not policy.compare("grad_x", bf16_sum, expected).passed
    assert policy.compare("grad_x", impl.expand_to_mhc_bwd(grad_out, x, 4), expected).passed


# -- bad arguments ---------------------------------------------------------------------


def _bf16(*shape):
    return torch.zeros(*shape, dtype=BF16)


@pytest.mark.parametrize("call, error, word", [
    (lambda: impl.expand_to_mhc(torch.zeros(2, 8), 4), TypeError, "x"),
    (lambda: impl.expand_to_mhc(_bf16(2, 8), 1), ValueError, "m"),
    (lambda: impl.expand_to_mhc(_bf16(2, 8), 9), ValueError, "m"),
    (lambda: impl.expand_to_mhc(_bf16(2, 8), 4.0), TypeError, "m"),
    (lambda: impl.expand_to_mhc(_bf16(2, 0), 4), ValueError, "x"),
    (lambda: impl.expand_to_mhc(_bf16(8, 2).t(), 4), ValueError, "x"),
    (lambda: impl.expand_to_mhc_bwd(_bf16(2, 3, 8), _bf16(2, 8), 4), ValueError, "grad_out"),
    (lambda: impl.expand_to_mhc_bwd(torch.zeros(2, 4, 8), _bf16(2, 8), 4), TypeError, "grad_out"),
    (lambda: impl.head_compute_mix(torch.zeros(2, 4, dtype=F32), torch.ones(1), torch.zeros(4), 0.0), ValueError,
     "mixes"),
    (lambda: impl.head_compute_mix(torch.zeros(1, 2, 9), torch.ones(1), torch.zeros(9), 0.0), ValueError, "mixes"),
    (lambda: impl.head_compute_mix(torch.zeros(1, 2, 4), torch.ones(2), torch.zeros(4), 0.0), ValueError, "scale"),
    (lambda: impl.head_compute_mix(torch.zeros(1, 2, 4), torch.ones(1), torch.zeros(3), 0.0), ValueError, "base"),
    (lambda: impl.head_compute_mix(torch.zeros(1, 2, 4), torch.ones(1, dtype=F64), torch.zeros(4), 0.0), TypeError,
     "scale"),
    (lambda: impl.head_compute_mix(torch.zeros(1, 2, 4), torch.ones(1), torch.zeros(4), -1.0), ValueError,
     "pre_eps"),
    (lambda: impl.head_compute_mix(torch.zeros(1, 2, 4), torch.ones(1), torch.zeros(4), math.nan), ValueError,
     "pre_eps"),
    (lambda: impl.head_compute_mix_bwd(torch.zeros(1, 3, 4), torch.zeros(1, 2, 4), torch.ones(1), torch.zeros(4), 0.0),
     ValueError, "grad_mix"),
])
def test_bad_arguments(call, error, word):
    with pytest.raises(error, match=word):
        call()


# -- the strategies --------------------------------------------------------------------


def _collect(strategy, examples=300):
    seen = []

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def collect(case):
        seen.append(case)

    collect()
    return seen


def test_expand_strategy_features():
    cases = _collect(strat.expand_to_mhc_cases())
    assert {c.params["m"] for c in cases} == set(range(2, 9))
    assert any(c.inputs["x"].numel() == 0 for c in cases)  # empty batches
    assert any(c.inputs["x"].shape[-1] % 8 for c in cases)  # partial vectors: the scalar tail
    assert any(c.inputs["x"].shape[-1] > 128 and c.inputs["x"].shape[-1] % 128 for c in cases)  # partial tiles
    assert any(c.inputs["x"].dim() == 2 for c in cases)  # another leading shape
    assert any(c.inputs["x"].float().isnan().any() for c in cases)
    assert any(c.inputs["x"].float().isinf().any() for c in cases)
    assert any((c.inputs["x"].float().abs() > 1e38).any() for c in cases)  # bf16's largest values


def test_head_strategy_features():
    cases = _collect(strat.head_compute_mix_cases())
    assert {c.inputs["mixes"].shape[-1] for c in cases} == set(range(2, 9))
    assert any(c.inputs["mixes"].numel() == 0 for c in cases)
    assert all(torch.isfinite(c.inputs[n]).all() for c in cases for n in ("mixes", "scale", "base"))
    assert any(c.inputs["scale"].item() == 0 for c in cases)
    logits = [ref.head_logits(**c.inputs) for c in cases]
    assert any((u == 0).any() for u in logits)  # the slope's maximum
    assert any((np.abs(u) > 400).any() for u in logits)  # saturated: slope 0
    assert any(((c.inputs["mixes"].abs() < 2.0**-126) & (c.inputs["mixes"] != 0)).any() for c in cases)
    assert any((c.inputs["mixes"].abs() > 2.0**126).any() for c in cases)
    assert {c.params["pre_eps"] for c in cases} >= {0.0, 1e-6}
    nonfinite = _collect(strat.head_compute_mix_nonfinite_cases(), 100)
    assert all(any(not torch.isfinite(c.inputs[n]).all() for n in ("mixes", "scale", "base"))
               for c in nonfinite if c.inputs["mixes"].numel())


# -- the benchmark shapes ----------------------------------------------------------------


def test_benchmark_shapes_run_and_count_their_bytes(monkeypatch):
    monkeypatch.setattr(spec_module, "BENCH_TOKENS", 8)
    monkeypatch.setattr(spec_module, "BENCH_HIDDEN", 16)
    cpu = torch.device("cpu")
    for op, fwd, bwd, per_token in [("mhc.expand_to_mhc", impl.expand_to_mhc, impl.expand_to_mhc_bwd, (5 * 32, 5 * 32)),
                                    ("mhc.head_compute_mix", impl.head_compute_mix, impl.head_compute_mix_bwd,
                                     (2 * 16, 3 * 16))]:
        spec = registry.get(op)
        for shape, fn, bytes_per_token in [(spec.bench[0], fwd, per_token[0]),
                                           (spec.backward.bench[0], bwd, per_token[1])]:
            inputs, params = shape.make(cpu)
            fn(**inputs, **params)
            fixed = 0 if op == "mhc.expand_to_mhc" else (1 + 4) * 4 * (1 if fn is fwd else 2)
            assert shape.nbytes(inputs, params) == 8 * bytes_per_token + fixed, (op, shape.name)
    assert registry.get("mhc.expand_to_mhc").bench[0].target == 0.9
