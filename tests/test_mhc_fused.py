"""mHC's fused pre-block pieces (mhc.norm_fn, mhc.reduce_partials_and_rmsnorm): the float64 oracles
(hand-worked values, the hand backward against torch.autograd and gradcheck), the eager
implementation against the oracle through the spec's policies (finite and extreme cases), the bounds
rejecting wrong formulas, bad arguments, empty batches, and the strategies' promised features."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import references.mhc_fused as ref
from kernels.torch import mhc_fused as impl
from strategies import mhc_fused as strat
from tkverify import gradients, registry
from tkverify.case import Case
from tkverify.check import check_case
from tkverify.specs import mhc_fused as spec_module

NORM_FN = registry.get("mhc.norm_fn")
REDUCE = registry.get("mhc.reduce_partials_and_rmsnorm")
F32, F64 = torch.float32, torch.float64
checks = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))


def _reduce_case(p, q, size=2, eps=0.25) -> Case:
    return Case(params={"rms_group_size": size, "rms_eps": eps},
                inputs={"out_mul_splitted": torch.tensor(p, dtype=F32), "sqrsum_splitted": torch.tensor(q, dtype=F32)})


# -- the oracles, by hand ------------------------------------------------------------------


def test_merge_by_hand():
    fn = torch.tensor([[1.0, -2.0, 3.0], [0.5, 0.0, -1.0]], dtype=F64)
    w = torch.tensor([2.0, -1.0, 0.25], dtype=F64)
    assert ref.fn_normw_merge(fn, w).tolist() == [[2.0, 2.0, 0.75], [1.0, -0.0, -0.25]]
    g = torch.tensor([[1.0, 1.0, 4.0], [2.0, -1.0, 1.0]], dtype=F64)
    grad_fn, grad_w = ref.fn_normw_merge_bwd(g, fn, w)
    assert grad_fn.tolist() == [[2.0, -1.0, 1.0], [4.0, 1.0, 0.25]]
    assert grad_w.tolist() == [1.0 + 1.0, -2.0 + 0.0, 12.0 - 1.0]


def test_reduce_by_hand():
    # two splits, one token, one group, M = 2; size 2, eps 0.25:
    # out_mul = (1 + 3, 2 - 2) = (4, 0), sqrsum = 3 + 5 = 8, r = (8 / 2 + 0.25)^-1/2 = 1 / sqrt(4.25)
    p = [[[[1.0, 2.0]]], [[[3.0, -2.0]]]]
    q = [[[3.0]], [[5.0]]]
    out_mul, sqrsum, out = ref.reduce_partials_and_rmsnorm(torch.tensor(p), torch.tensor(q), 2, 0.25)
    r = 1 / math.sqrt(4.25)
    assert out_mul.tolist() == [[[4.0, 0.0]]] and sqrsum.tolist() == [[8.0]]
    assert out.flatten().tolist() == pytest.approx([4.0 * r, 0.0], rel=1e-15)
    # two groups: out = out_mul_0 r_0 + out_mul_1 r_1, each group its own r
    p2 = [[[[1.0, 0.0], [0.0, 2.0]]]]
    q2 = [[[2.0, 6.0]]]
    r0, r1 = 1 / math.sqrt(1.25), 1 / math.sqrt(3.25)
    assert ref.reduce_partials_and_rmsnorm(torch.tensor(p2), torch.tensor(q2), 2, 0.25)[2].flatten().tolist() == \
        pytest.approx([r0, 2 * r1], rel=1e-15)
    # backward: grad_out = (1, 1): grad_out_mul = r on both splits, grad_sqrsum = -r^3 / 4 * (4 + 0)
    gp, gq = ref.reduce_partials_and_rmsnorm_bwd(torch.tensor([[1.0, 1.0]]), torch.tensor(p), torch.tensor(q), 2, 0.25)
    assert gp.shape == (2, 1, 1, 2) and gp.flatten().tolist() == pytest.approx([r] * 4, rel=1e-15)
    assert gq.flatten().tolist() == pytest.approx([-(r**3) / 4 * 4.0] * 2, rel=1e-15)


def test_reduce_zero_rows_and_infinite_sqrsum():
    # a zero row: out_mul = sqrsum = 0, r = eps^-1/2, out = 0; an infinite sqrsum gives r = 0
    out_mul, sqrsum, out = ref.reduce_partials_and_rmsnorm(torch.zeros(3, 1, 1, 4), torch.zeros(3, 1, 1), 7, 1e-6)
    assert out.abs().max() == 0 and sqrsum.item() == 0
    assert ref.rms_factor(torch.zeros(1), 7, 1e-6).item() == pytest.approx(1e3, rel=1e-12)
    out = ref.reduce_partials_and_rmsnorm(torch.ones(1, 1, 1, 2), torch.full((1, 1, 1), math.inf), 3, 1e-6)[2]
    assert out.tolist() == [[0.0, 0.0]]
    assert torch.isnan(ref.reduce_partials_and_rmsnorm(torch.ones(1, 1, 1, 2), -torch.ones(1, 1, 1), 1, 0.5)[2]).all()


@pytest.mark.parametrize("groups,splits", [(1, 1), (1, 3), (2, 2)])
def test_hand_backwards_match_autograd(groups, splits):
    torch.manual_seed(groups * 10 + splits)
    fn = torch.randn(5, 6, dtype=F64, requires_grad=True)
    w = torch.randn(6, dtype=F64, requires_grad=True)
    g = torch.randn(5, 6, dtype=F64)
    auto = torch.autograd.grad(ref.fn_normw_merge(fn, w), (fn, w), g)
    for mine, theirs in zip(ref.fn_normw_merge_bwd(g, fn, w), auto):
        torch.testing.assert_close(mine, theirs, rtol=1e-14, atol=0)
    p = torch.randn(splits, 4, groups, 3, dtype=F64, requires_grad=True)
    q = (torch.rand(splits, 4, groups, dtype=F64) * 3).requires_grad_(True)
    g = torch.randn(4, 3, dtype=F64)
    auto = torch.autograd.grad(ref.reduce_partials_and_rmsnorm(p, q, 5, 0.1)[2], (p, q), g)
    for mine, theirs in zip(ref.reduce_partials_and_rmsnorm_bwd(g, p, q, 5, 0.1), auto):
        torch.testing.assert_close(mine, theirs, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("spec", [NORM_FN, REDUCE], ids=lambda s: s.name)
@checks
@given(data=st.data())
def test_hand_backward_gradcheck(spec, data):
    case = data.draw(spec.strategy())
    for check in gradients.oracle_gradcheck(spec, case, seed=data.draw(st.integers(0, 2**31))):
        assert check.passed, check


# -- the eager implementation against the oracle ---------------------------------------------


@pytest.mark.parametrize("spec,strategy", [
    (NORM_FN, strat.fn_normw_merge_cases), (NORM_FN, strat.fn_normw_merge_extreme_cases),
    (REDUCE, strat.reduce_partials_and_rmsnorm_cases), (REDUCE, strat.reduce_partials_and_rmsnorm_extreme_cases),
], ids=["norm_fn", "norm_fn-extreme", "reduce", "reduce-extreme"])
@checks
@given(data=st.data())
def test_eager_forward_within_the_policies(spec, strategy, data):
    for comp in check_case(spec, spec.impls["torch"], data.draw(strategy()), case_dir=None):
        assert comp.passed, comp.message


@pytest.mark.parametrize("spec", [NORM_FN, REDUCE], ids=lambda s: s.name)
@checks
@given(data=st.data())
def test_eager_backward_against_the_oracle_and_its_forward(spec, data):
    case, seed = data.draw(spec.strategy()), data.draw(st.integers(0, 2**31))
    for check in gradients.run_checks(spec, "torch", case, seed):
        assert check.passed, check


def test_eager_float64_equals_the_oracle():
    torch.manual_seed(0)
    p, q = torch.randn(3, 5, 2, 8, dtype=F64), torch.rand(3, 5, 2, dtype=F64)
    mine, exact = impl.reduce_partials_and_rmsnorm(p, q, 4, 1e-3), ref.reduce_partials_and_rmsnorm(p, q, 4, 1e-3)
    for value, expected in zip(mine, exact):
        torch.testing.assert_close(value, expected, rtol=1e-14, atol=1e-300)


# -- the bounds reject wrong formulas ---------------------------------------------------------


def _judged(spec, case, outputs) -> list[bool]:
    expected = spec.given(case, outputs)
    return [spec.outputs[name].compare(name, outputs[name], expected[name]).passed for name in spec.outputs]


def test_reduce_bounds_reject_wrong_formulas():
    torch.manual_seed(1)
    case = Case(params={"rms_group_size": 64, "rms_eps": 1e-2},
                inputs={"out_mul_splitted": torch.randn(4, 9, 1, 24), "sqrsum_splitted": torch.rand(4, 9, 1) * 4})
    p, q = case.inputs["out_mul_splitted"], case.inputs["sqrsum_splitted"]
    right = dict(zip(REDUCE.outputs, impl.reduce_partials_and_rmsnorm(p, q, 64, 1e-2)))
    assert all(_judged(REDUCE, case, right))
    wrong = {
        "one split left out": impl.reduce_partials_and_rmsnorm(p[1:].contiguous(), q[1:].contiguous(), 64, 1e-2),
        "size off by one": impl.reduce_partials_and_rmsnorm(p, q, 63, 1e-2),
        "eps outside the root": (right["out_mul"], right["sqrsum"],
                                 right["out_mul"][:, 0] * (torch.rsqrt(right["sqrsum"] / 64) + 1e-2)),
        "eps in fp32 epsilon's place": impl.reduce_partials_and_rmsnorm(p, q, 64, 1e-6),
    }
    for why, outs in wrong.items():
        assert not all(_judged(REDUCE, case, dict(zip(REDUCE.outputs, outs)))), why


def test_reduce_gradient_bounds_reject_a_wrong_sign_and_factor():
    torch.manual_seed(2)
    case = Case(params={"rms_group_size": 16, "rms_eps": 1e-3},
                inputs={"out_mul_splitted": torch.randn(2, 7, 1, 8), "sqrsum_splitted": torch.rand(2, 7, 1) * 8})
    g = torch.randn(7, 8)
    p, q = case.inputs["out_mul_splitted"], case.inputs["sqrsum_splitted"]
    out_mul, sqrsum, _ = impl.reduce_partials_and_rmsnorm(p, q, 16, 1e-3)
    right = impl.reduce_partials_and_rmsnorm_bwd(g, p, q, out_mul, sqrsum, 16, 1e-3)
    exact = dict(zip(REDUCE.backward.grads, ref.reduce_partials_and_rmsnorm_bwd(g, p, q, 16, 1e-3)))
    expected = spec_module.given_reduce_backward(case, {"out": g}, exact)
    policy = REDUCE.backward.grads["grad_sqrsum_splitted"]
    assert policy.compare("grad_sqrsum_splitted", right[1], expected["grad_sqrsum_splitted"]).passed
    for wrong in (-right[1], right[1] * 2, right[1] * (1 + 1e-4)):
        assert not policy.compare("grad_sqrsum_splitted", wrong, expected["grad_sqrsum_splitted"]).passed


def test_merge_policy_demands_the_correctly_rounded_product():
    fn = torch.tensor([[1.0 + 2.0**-23, 3.0]])
    w = torch.tensor([1.0 + 2.0**-23, 1.0 / 3.0])
    case = Case(params={}, inputs={"fn": fn, "normw": w})
    (comp,) = check_case(NORM_FN, NORM_FN.impls["torch"], case, case_dir=None)
    assert comp.passed
    off = impl.fn_normw_merge(fn, w)
    off[0, 0] = torch.nextafter(off[0, 0], torch.tensor(2.0))
    exact = ref.fn_normw_merge(fn, w)
    assert not NORM_FN.outputs["out_fn"].compare("out_fn", off, exact).passed


# -- edges: empty batches, non-finite values --------------------------------------------------


def test_empty_batches():
    out_mul, sqrsum, out = impl.reduce_partials_and_rmsnorm(torch.zeros(16, 0, 1, 24), torch.zeros(16, 0, 1), 8, 1e-6)
    assert out_mul.shape == (0, 1, 24) and sqrsum.shape == (0, 1) and out.shape == (0, 24)
    gp, gq = impl.reduce_partials_and_rmsnorm_bwd(torch.zeros(0, 24), torch.zeros(16, 0, 1, 24), torch.zeros(16, 0, 1),
                                                  out_mul, sqrsum, 8, 1e-6)
    assert gp.shape == (16, 0, 1, 24) and gq.shape == (16, 0, 1)
    assert impl.fn_normw_merge(torch.zeros(24, 0), torch.zeros(0)).shape == (24, 0)
    grad_fn, grad_w = impl.fn_normw_merge_bwd(torch.zeros(0, 5), torch.zeros(0, 5), torch.ones(5))
    assert grad_fn.shape == (0, 5) and grad_w.tolist() == [0.0] * 5


def test_nonfinite_values_follow_ieee():
    fn = torch.tensor([[math.inf, math.nan, 1.0, -math.inf]])
    w = torch.tensor([0.0, 1.0, math.inf, -2.0])
    out = impl.fn_normw_merge(fn, w)
    assert torch.isnan(out[0, :2]).all() and out[0, 2] == math.inf and out[0, 3] == math.inf
    case = _reduce_case([[[[math.inf, 1.0, math.nan]]]], [[[4.0]]])
    for comp in check_case(REDUCE, REDUCE.impls["torch"], case, case_dir=None):
        assert comp.passed, comp.message


# -- bad arguments ------------------------------------------------------------------------------

GOOD_P, GOOD_Q = torch.zeros(2, 3, 1, 8), torch.zeros(2, 3, 1)


@pytest.mark.parametrize("call,error,word", [
    (lambda: impl.fn_normw_merge([[1.0]], torch.ones(1)), TypeError, "fn"),
    (lambda: impl.fn_normw_merge(torch.ones(2, 3, dtype=torch.bfloat16), torch.ones(3)), TypeError, "fn"),
    (lambda: impl.fn_normw_merge(torch.ones(2, 3), torch.ones(4)), ValueError, "normw"),
    (lambda: impl.fn_normw_merge(torch.ones(2, 3), torch.ones(3, dtype=F64)), TypeError, "normw"),
    (lambda: impl.fn_normw_merge(torch.ones(6), torch.ones(6)), ValueError, "fn"),
    (lambda: impl.fn_normw_merge(torch.ones(3, 2).t(), torch.ones(3)), ValueError, "contiguous"),
    (lambda: impl.fn_normw_merge_bwd(torch.ones(2, 2), torch.ones(2, 3), torch.ones(3)), ValueError, "grad_out_fn"),
    (lambda: impl.reduce_partials_and_rmsnorm(GOOD_P[0], GOOD_Q, 8, 1e-6), ValueError, "out_mul_splitted"),
    (lambda: impl.reduce_partials_and_rmsnorm(GOOD_P, GOOD_Q[:, :2], 8, 1e-6), ValueError, "sqrsum_splitted"),
    (lambda: impl.reduce_partials_and_rmsnorm(GOOD_P[:0], GOOD_Q[:0], 8, 1e-6), ValueError, "S, G, M >= 1"),
    (lambda: impl.reduce_partials_and_rmsnorm(GOOD_P, GOOD_Q, 0, 1e-6), ValueError, "rms_group_size"),
    (lambda: impl.reduce_partials_and_rmsnorm(GOOD_P, GOOD_Q, 8.0, 1e-6), TypeError, "rms_group_size"),
    (lambda: impl.reduce_partials_and_rmsnorm(GOOD_P, GOOD_Q, 8, 0.0), ValueError, "rms_eps"),
    (lambda: impl.reduce_partials_and_rmsnorm(GOOD_P, GOOD_Q, 8, math.nan), ValueError, "rms_eps"),
    (lambda: impl.reduce_partials_and_rmsnorm(GOOD_P, GOOD_Q, 8, "1e-6"), TypeError, "rms_eps"),
    (lambda: impl.reduce_partials_and_rmsnorm_bwd(torch.zeros(3, 7), GOOD_P, GOOD_Q, torch.zeros(3, 1, 8),
                                                  torch.zeros(3, 1), 8, 1e-6), ValueError, "grad_out"),
    (lambda: impl.reduce_partials_and_rmsnorm_bwd(torch.zeros(3, 8), GOOD_P, GOOD_Q, torch.zeros(3, 8),
                                                  torch.zeros(3, 1), 8, 1e-6), ValueError, "out_mul"),
    (lambda: impl.reduce_partials_and_rmsnorm_bwd(torch.zeros(3, 8), GOOD_P, GOOD_Q, torch.zeros(3, 1, 8),
                                                  torch.zeros(3, 1, dtype=F64), 8, 1e-6), TypeError, "sqrsum"),
])
def test_bad_arguments(call, error, word):
    with pytest.raises(error, match=word):
        call()


# -- the strategies ---------------------------------------------------------------------------


def _draw_many(strategy, n=60) -> list[Case]:
    cases = []

    @settings(max_examples=n, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def collect(case):
        cases.append(case)

    collect()
    return cases


def test_strategy_features():
    merge = _draw_many(strat.fn_normw_merge_cases())
    assert all(c.inputs["fn"].isfinite().all() and c.inputs["normw"].isfinite().all() for c in merge)
    assert any(c.inputs["fn"].shape[1] == 0 for c in merge)
    assert any((c.inputs["normw"] == 0).any() for c in merge)
    assert len({c.inputs["fn"].shape[0] for c in merge}) >= 4  # several m (m + 2), and m
    single = [c.inputs["fn"].shape[1] for c in merge if c.inputs["fn"].shape[0] == 1]  # M = 1: single rows
    assert any(k % strat.MERGE_VECTOR == 0 for k in single) and any(k % strat.MERGE_VECTOR for k in single)
    reduce = _draw_many(strat.reduce_partials_and_rmsnorm_cases())
    assert all((c.inputs["sqrsum_splitted"] >= 0).all() for c in reduce)
    assert any(c.inputs["out_mul_splitted"].shape[1] == 0 for c in reduce)  # empty batches
    assert {c.inputs["out_mul_splitted"].shape[0] for c in reduce} >= {1, 16}
    assert any(c.inputs["out_mul_splitted"].shape[2] > 1 for c in reduce)  # several RMS groups
    assert any((c.inputs["sqrsum_splitted"].sum(0) == 0).any() for c in reduce if c.inputs["sqrsum_splitted"].numel())
    extreme = _draw_many(strat.reduce_partials_and_rmsnorm_extreme_cases())
    assert any(not c.inputs["out_mul_splitted"].isfinite().all() for c in extreme)
    overflow = _draw_many(strat.fn_normw_merge_extreme_cases())
    assert any((c.inputs["fn"].double() * c.inputs["normw"].double()).abs().max() > 3.5e38
               for c in overflow if c.inputs["fn"].numel())


def test_benchmark_shapes_count_their_bytes(monkeypatch):
    monkeypatch.setattr(spec_module, "BENCH_TOKENS", 64)
    (shape,) = REDUCE.bench
    inputs, params = spec_module._reduce_inputs(torch.device("cpu"))
    assert params["rms_group_size"] == 4 * 7168
    assert shape.nbytes(inputs, params) == (16 * 64 * 24 + 16 * 64 + 64 * (24 + 1 + 24)) * 4
    np.testing.assert_array_equal(REDUCE.backward.bench[0].make(torch.device("cpu"))[0]["grad_out"].shape, (64, 24))


# -- mhc.multilayer_recompute -----------------------------------------------------------------

RECOMPUTE = registry.get("mhc.multilayer_recompute")
BF16 = torch.bfloat16


def _recompute_inputs(layers=2, posts=2, tokens=3, m=2, hidden=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"initial_residual": torch.randn(tokens, m, hidden, generator=g).to(BF16),
            "pre_mix": torch.rand(layers, tokens, m, generator=g),
            "layer_output": torch.randn(posts, tokens, hidden, generator=g).to(BF16),
            "post_mix": torch.rand(posts, tokens, m, generator=g) * 2,
            "comb_mix": torch.rand(posts, tokens, m, m, generator=g) / m}


def test_recompute_by_hand():
    # m = 2, H = 1, one token, two layers with a post step each:
    # residual_0 = (1, 2); layer_input_0 = 1 * 0.5 + 2 * 0.25 = 1
    # residual_1[n] = x post[n] + sum_i comb[i, n] residual_0[i] = 4 * (0.5, 1) + (1 * 1 + 2 * 0, 1 * 0.5 + 2 * 1)
    #              = (3, 6.5); layer_input_1 = 3 * 1 + 6.5 * 2 = 16
    # residual_2 = 0 * post + comb = identity: (3, 6.5)
    inputs = {"initial_residual": torch.tensor([[[1.0], [2.0]]], dtype=BF16),
              "pre_mix": torch.tensor([[[0.5, 0.25]], [[1.0, 2.0]]]),
              "layer_output": torch.tensor([[[4.0]], [[7.0]]], dtype=BF16),
              "post_mix": torch.tensor([[[0.5, 1.0]], [[0.0, 0.0]]]),
              "comb_mix": torch.tensor([[[[1.0, 0.5], [0.0, 1.0]]], [[[1.0, 0.0], [0.0, 1.0]]]])}
    layer_input, residual = ref.multilayer_recompute(**inputs)
    assert layer_input.flatten().tolist() == [1.0, 16.0]
    assert residual.flatten().tolist() == [3.0, 6.5, 3.0, 6.5]
    for value, exact in zip(impl.multilayer_recompute(**inputs), (layer_input, residual)):
        assert value.double().flatten().tolist() == exact.flatten().tolist()


def test_recompute_rounds_each_residual_to_bf16():
    # 1 + 2^-9 is no bf16 value: residual_1 is 1 (ties to even), and layer 1 reads that
    inputs = {"initial_residual": torch.tensor([[[1.0], [0.0]]], dtype=BF16), "pre_mix": torch.ones(2, 1, 2),
              "layer_output": torch.tensor([[[2.0**-9]]], dtype=BF16), "post_mix": torch.tensor([[[1.0, 0.0]]]),
              "comb_mix": torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]]])}
    layer_input, residual = ref.multilayer_recompute(**inputs)
    assert residual.flatten().tolist() == [1.0, 0.0] and layer_input.flatten().tolist() == [1.0, 1.0]


@pytest.mark.parametrize("layers,posts", [(1, 0), (1, 1), (3, 2), (3, 3)])
def test_recompute_layer_counts_and_empty_batches(layers, posts):
    for tokens in (0, 4):
        inputs = _recompute_inputs(layers, posts, tokens=tokens)
        layer_input, residual = impl.multilayer_recompute(**inputs)
        assert layer_input.shape == (layers, tokens, 5) and residual.shape == (posts, tokens, 2, 5)
        case = Case(params={}, inputs=inputs)
        for comp in check_case(RECOMPUTE, RECOMPUTE.impls["torch"], case, case_dir=None):
            assert comp.passed, comp.message


def test_recompute_judges_each_layer_from_the_implementations_residual():
    inputs = _recompute_inputs(layers=3, posts=3, tokens=4, m=4, hidden=9, seed=3)
    case = Case(params={}, inputs=inputs)
    layer_input, residual = impl.multilayer_recompute(**inputs)
    expected = RECOMPUTE.given(case, {"layer_input": layer_input, "residual": residual})
    judged = {n: RECOMPUTE.outputs[n].compare(n, v, expected[n]).passed
              for n, v in (("layer_input", layer_input), ("residual", residual))}
    assert all(judged.values())
    # post before pre_apply_mix in each layer (layer l mixing residual l + 1), or a transposed comb, is wrong
    from kernels.torch.mhc import pre_apply_mix
    late = torch.stack([pre_apply_mix(r[None], p[None, ..., None])[0] for r, p in zip(residual, inputs["pre_mix"])])
    assert not RECOMPUTE.outputs["layer_input"].compare("layer_input", late, expected["layer_input"]).passed
    transposed = dict(inputs, comb_mix=inputs["comb_mix"].transpose(-1, -2).contiguous())
    wrong = impl.multilayer_recompute(**transposed)[1]
    assert not RECOMPUTE.outputs["residual"].compare("residual", wrong, expected["residual"]).passed


def test_recompute_bad_arguments():
    good = _recompute_inputs(layers=2, posts=1)
    bad = [
        (dict(good, initial_residual=good["initial_residual"].float()), TypeError, "initial_residual"),
        (dict(good, initial_residual=torch.zeros(3, 9, 5, dtype=BF16)), ValueError, "initial_residual"),
        (dict(good, pre_mix=torch.zeros(0, 3, 2)), ValueError, "pre_mix"),
        (dict(good, layer_output=torch.zeros(3, 3, 5, dtype=BF16)), ValueError, "layer_output"),
        (dict(good, post_mix=torch.zeros(2, 3, 2)), ValueError, "post_mix"),
        (dict(good, comb_mix=torch.zeros(1, 3, 2, 2, dtype=F64)), TypeError, "comb_mix"),
    ]
    for args, error, word in bad:
        with pytest.raises(error, match=word):
            impl.multilayer_recompute(**args)


def test_recompute_strategy_features():
    cases = _draw_many(strat.multilayer_recompute_cases())
    posts = {(c.inputs["pre_mix"].shape[0], c.inputs["layer_output"].shape[0]) for c in cases}
    assert any(p == l for l, p in posts) and any(p == l - 1 for l, p in posts)
    assert any(c.inputs["initial_residual"].shape[0] == 0 for c in cases)
    assert any((c.inputs["post_mix"] == 0).any() for c in cases if c.inputs["post_mix"].numel())
    assert any(not c.inputs["initial_residual"].isfinite().all() for c in cases)
