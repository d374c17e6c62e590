"""mHC's fused pre-block forward (mhc.pre_big_fuse): the float64 oracle (hand-worked values, and equal to
its stages' oracles), the eager implementation against the oracle through the spec's policies, the
bounds rejecting wrong formulas, empty batches, non-finite values, and the strategy's promised features.
Bad arguments: tests/bad_inputs_mhc.py's MHC_BIG_FUSE table."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import references.mhc as ref_mhc
import references.mhc_big_fuse as ref
from kernels.torch import mhc as eager_mhc
from kernels.torch import mhc_big_fuse as impl
from kernels.torch import mhc_fused as eager_fused
from strategies import mhc_big_fuse as strat
from tkverify import registry
from tkverify.case import Case
from tkverify.check import check_case
from tkverify.specs import mhc_big_fuse as spec_module

BIG_FUSE = registry.get("mhc.pre_big_fuse")
F32, BF16 = torch.float32, torch.bfloat16
checks = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
PARAMS = {"rms_eps": 1e-6, "pre_eps": 1e-2, "sinkhorn_eps": 1e-6, "post_mult": 2.0, "sinkhorn_repeat": 10}


def _sigmoid(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v))


# -- the oracle, by hand -------------------------------------------------------------------


def test_oracle_by_hand():
    # m = 2 (M = 8), H = 1, one split.  Token 0 is zero (partials 0: u = base = 0): pre = 0.5 + 0 and
    # post = 0.5 * 2 = 1; the comb logits are all 0, so the softmax is 1/2 everywhere and one column
    # normalisation gives (1/2 + e) / (1 + 2 e + e).  Token 1: out_mul = (2, -2, 0, ...), sqrsum 8 over
    # m H = 2 values with rms_eps 1/4: r = (8 / 2 + 1/4)^-1/2, mixes (2 r, -2 r, 0, ...), u = mixes (scale 1,
    # base 0), so post = 2 sigmoid(0) = 1 again and layer_input = sigmoid(2 r) 1 + sigmoid(-2 r) 3.
    e = 1e-3
    p = torch.zeros(1, 2, 8, dtype=torch.float64)
    p[0, 1, :2] = torch.tensor([2.0, -2.0])
    q = torch.tensor([[0.0, 8.0]], dtype=torch.float64)
    residual = torch.tensor([[[2.0], [4.0]], [[1.0], [3.0]]], dtype=torch.float64)
    post, comb, layer_input = ref.pre_big_fuse(p, q, torch.ones(3, dtype=torch.float64), torch.zeros(8), residual,
                                               rms_eps=0.25, pre_eps=0.0, sinkhorn_eps=e, post_mult=2.0,
                                               sinkhorn_repeat=1)
    assert post[0].tolist() == [1.0, 1.0] and post[1].tolist() == [1.0, 1.0]
    np.testing.assert_allclose(comb, np.full((2, 2, 2), (0.5 + e) / (1 + 3 * e)), rtol=1e-15)
    r = 1 / math.sqrt(4.25)
    np.testing.assert_allclose(layer_input[:, 0], [0.5 * 2 + 0.5 * 4, _sigmoid(2 * r) * 1 + _sigmoid(-2 * r) * 3],
                               rtol=1e-15)


def test_oracle_is_the_composition_of_the_stages():
    case = next(c for c in _draw_many(strat.pre_big_fuse_cases(), 30) if c.inputs["residual"].shape[0] > 2)
    c, params = case.inputs, case.params
    s = ref.stages(**c, **params)
    _, m, hidden = c["residual"].shape
    _, _, mixes = eager_fused.reduce_partials_and_rmsnorm(c["gemm_out_mul"][:, :, None].double(),
                                                          c["gemm_out_sqrsum"][:, :, None].double(), m * hidden,
                                                          params["rms_eps"])
    np.testing.assert_allclose(s["mixes"], mixes.numpy(), rtol=1e-12)
    pre, post, logits = ref_mhc.pre_split_mixes(s["mixes"][None], c["scale"], c["base"], m, params["post_mult"],
                                                params["pre_eps"])
    np.testing.assert_array_equal(s["post"], post[0, :, :, 0])
    np.testing.assert_array_equal(s["comb"], ref_mhc.sinkhorn(logits[0], params["sinkhorn_repeat"],
                                                              params["sinkhorn_eps"]).numpy())
    np.testing.assert_array_equal(s["layer_input"], ref_mhc.pre_apply_mix(c["residual"][None], pre)[0])


# -- the eager implementation against the oracle ---------------------------------------------


@checks
@given(data=st.data())
def test_eager_forward_within_the_policies(data):
    for comp in check_case(BIG_FUSE, BIG_FUSE.impls["torch"], data.draw(strat.pre_big_fuse_cases()), case_dir=None):
        assert comp.passed, comp.message


# -- the bounds reject wrong formulas ---------------------------------------------------------


def _case(tokens=9, m=4, hidden=40, splits=4, seed=1, **params) -> Case:
    g = torch.Generator().manual_seed(seed)
    residual = torch.randn(tokens, m, hidden, generator=g).to(BF16)
    x = residual.double().reshape(tokens, m * hidden)
    fn = torch.randn(m * (m + 2), m * hidden, generator=g, dtype=torch.float64) / math.sqrt(m * hidden)
    cuts = torch.linspace(0, m * hidden, splits + 1).round().long().tolist()
    p = torch.stack([x[:, lo:hi] @ fn[:, lo:hi].T for lo, hi in zip(cuts, cuts[1:])]).float()
    q = torch.stack([(x[:, lo:hi] ** 2).sum(-1) for lo, hi in zip(cuts, cuts[1:])]).float()
    return Case(params={**PARAMS, **params},
                inputs={"gemm_out_mul": p, "gemm_out_sqrsum": q, "scale": torch.rand(3, generator=g) + 0.5,
                        "base": torch.randn(m * (m + 2), generator=g), "residual": residual})


def _judged(case: Case, outputs: dict[str, torch.Tensor]) -> dict[str, bool]:
    expected = BIG_FUSE.given(case, outputs)
    return {name: policy.compare(name, outputs[name], expected[name]).passed
            for name, policy in BIG_FUSE.outputs.items()}


def _composed(case: Case, rms_group_size=None, repeat=None, pre_eps=None, post_mult=None) -> dict[str, torch.Tensor]:
    """The eager stages with one parameter replaced (a formula error of one stage)."""
    c, prm = case.inputs, case.params
    _, m, hidden = c["residual"].shape
    _, _, mixes = eager_fused.reduce_partials_and_rmsnorm(c["gemm_out_mul"][:, :, None], c["gemm_out_sqrsum"][:, :, None],
                                                          rms_group_size or m * hidden, prm["rms_eps"])
    pre, post, logits = eager_mhc.pre_split_mixes(mixes[None], c["scale"], c["base"], m,
                                                  prm["post_mult"] if post_mult is None else post_mult,
                                                  prm["pre_eps"] if pre_eps is None else pre_eps)
    comb = eager_mhc.sinkhorn(logits[0], repeat or prm["sinkhorn_repeat"], prm["sinkhorn_eps"])
    return {"post_mix": post[0, :, :, 0].contiguous(), "comb_mix": comb,
            "layer_input": eager_mhc.pre_apply_mix(c["residual"][None], pre)[0]}


def test_bounds_reject_wrong_formulas():
    case = _case()
    assert all(_judged(case, _composed(case)).values())
    _, m, hidden = case.inputs["residual"].shape
    wrong = {
        "an RMS group of H, not m H": (_composed(case, rms_group_size=hidden), ("post_mix", "comb_mix", "layer_input")),
        "one Sinkhorn sweep fewer": (_composed(case, repeat=case.params["sinkhorn_repeat"] - 1), ("comb_mix",)),
        "pre without pre_eps": (_composed(case, pre_eps=0.0), ("layer_input",)),
        "post without post_mult": (_composed(case, post_mult=1.0), ("post_mix",)),
    }
    for why, (outputs, caught) in wrong.items():
        judged = _judged(case, outputs)
        assert not any(judged[name] for name in caught), (why, judged)


def test_bounds_carry_the_mixes_error_but_not_more():
    """A mixes value one fp32 step off per token passes (within the reduction's bracket); 2^-10 off does not."""
    case = _case(seed=3)
    c, prm = case.inputs, case.params
    _, m, hidden = c["residual"].shape
    _, _, mixes = eager_fused.reduce_partials_and_rmsnorm(c["gemm_out_mul"][:, :, None],
                                                          c["gemm_out_sqrsum"][:, :, None], m * hidden, prm["rms_eps"])

    def with_mixes(values):
        pre, post, logits = eager_mhc.pre_split_mixes(values[None], c["scale"], c["base"], m, prm["post_mult"],
                                                      prm["pre_eps"])
        return {"post_mix": post[0, :, :, 0].contiguous(),
                "comb_mix": eager_mhc.sinkhorn(logits[0], prm["sinkhorn_repeat"], prm["sinkhorn_eps"]),
                "layer_input": eager_mhc.pre_apply_mix(c["residual"][None], pre)[0]}

    assert all(_judged(case, with_mixes(torch.nextafter(mixes, torch.full_like(mixes, math.inf)))).values())
    assert not all(_judged(case, with_mixes(mixes * (1 + 2.0**-10))).values())


# -- edges: empty batches, zero rows, post_mult 0, non-finite values ----------------------------


def test_empty_batch():
    case = _case(tokens=0)
    post, comb, layer_input = impl.pre_big_fuse(**case.inputs, **case.params)
    assert post.shape == (0, 4) and comb.shape == (0, 4, 4) and layer_input.shape == (0, 40)
    assert layer_input.dtype == BF16 and post.dtype == comb.dtype == F32
    for comp in check_case(BIG_FUSE, BIG_FUSE.impls["torch"], case, case_dir=None):
        assert comp.passed, comp.message


def test_zero_rows_and_post_mult_zero():
    case = _case(tokens=3, post_mult=0.0)
    case.inputs["gemm_out_mul"][:, 1] = 0.0
    case.inputs["gemm_out_sqrsum"][:, 1] = 0.0
    post, comb, _ = impl.pre_big_fuse(**case.inputs, **case.params)
    assert (post == 0).all()
    exact = ref.stages(**case.inputs, **case.params)
    np.testing.assert_allclose(exact["comb_logits"][1].reshape(-1), case.inputs["base"][8:].double().numpy())
    for comp in check_case(BIG_FUSE, BIG_FUSE.impls["torch"], case, case_dir=None):
        assert comp.passed, comp.message


def test_nonfinite_values_follow_ieee():
    case = _case(tokens=3)
    case.inputs["gemm_out_mul"][0, 0, 0] = math.nan  # token 0: a NaN pre logit
    case.inputs["gemm_out_mul"][0, 1, 10] = math.nan  # token 1: a NaN comb logit
    case.inputs["residual"][2, 0, 5] = math.inf  # token 2: an infinite residual value
    post, comb, layer_input = impl.pre_big_fuse(**case.inputs, **case.params)
    assert torch.isnan(layer_input[0]).all() and torch.isfinite(post[0]).all()
    assert torch.isnan(comb[1]).all() and torch.isfinite(comb[[0, 2]]).all()
    assert layer_input[2, 5].isinf() and torch.isfinite(layer_input[2, :5]).all()
    for comp in check_case(BIG_FUSE, BIG_FUSE.impls["torch"], case, case_dir=None):
        assert comp.passed, comp.message


# -- the strategy -----------------------------------------------------------------------------


def _draw_many(strategy, n=80) -> list[Case]:
    cases = []

    @settings(max_examples=n, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def collect(case):
        cases.append(case)

    collect()
    return cases


def test_strategy_features():
    cases = _draw_many(strat.pre_big_fuse_cases())
    tokens = [c.inputs["residual"].shape[0] for c in cases]
    assert 0 in tokens and any(t > 1 for t in tokens)
    assert {c.inputs["residual"].shape[1] for c in cases} >= {2, 4, 8}
    assert {c.inputs["gemm_out_mul"].shape[0] for c in cases} >= {1, 16}
    assert any(c.params["post_mult"] == 0.0 for c in cases)
    assert any((c.inputs["gemm_out_sqrsum"].sum(0) == 0).any() for c in cases if tokens)  # zero rows
    assert any(c.inputs["scale"].abs().max() >= 2.0**8 for c in cases)  # huge mixes
    assert any(c.inputs["scale"].abs().max() <= 2.0**-18 for c in cases)  # tiny mixes
    assert any(c.inputs["base"].abs().max() >= 8 for c in cases)  # Sinkhorn stress in the comb logits
    assert any(not (c.inputs["gemm_out_mul"].isfinite().all() and c.inputs["residual"].isfinite().all())
               for c in cases)
    for c in cases:  # the sums of squares are those of the residual's values
        assert (c.inputs["gemm_out_sqrsum"] >= 0).all()


def test_benchmark_shape_counts_its_bytes(monkeypatch):
    monkeypatch.setattr(spec_module, "BENCH_TOKENS", 8)
    monkeypatch.setattr(spec_module, "BENCH_HIDDEN", 16)
    (shape,) = BIG_FUSE.bench
    inputs, params = spec_module._bench_inputs(torch.device("cpu"))
    assert shape.target is None
    expected_in = (16 * 8 * 24 + 16 * 8 + 3 + 24) * 4 + 8 * 4 * 16 * 2
    assert shape.nbytes(inputs, params) == expected_in + 8 * ((4 + 16) * 4 + 16 * 2)
