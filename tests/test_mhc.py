"""mHC Sinkhorn: the float64 oracle (hand-worked m = 2 values, its hand-derived backward against
torch.autograd), the eager implementation (values, autograd Function, bad arguments), NaN and
infinity behaviour, the spec's bounds and report extras, and the strategy's promised features."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import references.mhc as ref
from kernels.torch import mhc as impl
from strategies import mhc as strat
from tkverify import registry
from tkverify.case import Case
from tkverify.check import check_case
from tkverify.specs import mhc as spec_module

SPEC = registry.get("mhc.sinkhorn")
F32, F64 = torch.float32, torch.float64
checks = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))


def t64(a) -> torch.Tensor:
    return torch.tensor(a, dtype=F64)


# -- the oracle, by hand (m = 2) ------------------------------------------------------


def test_hand_worked_uniform_m2():
    # x = 0: softmax 1/2 everywhere; A = 1/2 + eps; each step divides by (2 (1/2 + eps)... + eps).
    eps = 1e-6
    a = 0.5 + eps
    a = a / (2 * a + eps)  # columns
    assert ref.sinkhorn(torch.zeros(2, 2), repeat=1, eps=eps).numpy() == pytest.approx(np.full((2, 2), a), abs=0)
    for _ in range(2):  # repeat = 3: two more sweeps
        a = a / (2 * a + eps)
        a = a / (2 * a + eps)
    assert ref.sinkhorn(torch.zeros(1, 2, 2), repeat=3, eps=eps).numpy() == pytest.approx(np.full((1, 2, 2), a), rel=1e-15)


def test_hand_worked_m2_one_column_step():
    # x = [[0, ln 3], [ln 3, 0]], eps = 0.1: softmax rows (1/4, 3/4), (3/4, 1/4);
    # A = (0.35, 0.85; 0.85, 0.35); column sums 1.2 + eps = 1.3.
    x = t64([[0.0, math.log(3)], [math.log(3), 0.0]])
    out = ref.sinkhorn(x, repeat=1, eps=0.1).numpy()
    assert out == pytest.approx(np.array([[0.35, 0.85], [0.85, 0.35]]) / 1.3, rel=1e-14)


def test_hand_worked_m2_two_repeats_asymmetric():
    # x = [[ln 3, 0], [ln 3, 0]], eps = 0: softmax rows (3/4, 1/4) twice.
    # columns: sums (3/2, 1/2) -> (1/2, 1/2; 1/2, 1/2); rows, columns: unchanged (doubly stochastic).
    x = t64([[math.log(3), 0.0], [math.log(3), 0.0]])
    assert ref.sinkhorn(x, repeat=1, eps=0.0).numpy() == pytest.approx(np.full((2, 2), 0.5), rel=1e-15)
    assert ref.sinkhorn(x, repeat=2, eps=0.0).numpy() == pytest.approx(np.full((2, 2), 0.5), rel=1e-15)
    # eps = 1: A = (7/4, 5/4) per row; columns: (7/4)/(7/2 + 1) = 7/18, (5/4)/(5/2 + 1) = 5/14.
    out = ref.sinkhorn(x, repeat=1, eps=1.0).numpy()
    assert out == pytest.approx(np.array([[7 / 18, 5 / 14], [7 / 18, 5 / 14]]), rel=1e-15)
    # then rows: sum 7/18 + 5/14 + 1 = (49 + 45 + 126) / 126 = 220/126; columns again.
    r = np.array([7 / 18, 5 / 14]) / (220 / 126)
    c = r / (2 * r + 1)
    assert ref.sinkhorn(x, repeat=2, eps=1.0).numpy() == pytest.approx(np.array([c, c]), rel=1e-14)


def test_hand_worked_backward_m2_one_step():
    # repeat = 1, eps = 0: P = s / colsum(s).  With x = 0: s = 1/2, colsum 1, P = 1/2.
    # Column step: dL/ds_ij = (G_ij - sum_k G_kj P_kj) / 1; softmax: s (g - sum_k g_ik s_ik).
    g = t64([[1.0, 0.0], [0.0, 0.0]])
    gs = np.array([[1.0 - 0.5, 0.0], [0.0 - 0.5, 0.0]])  # column 0 mean-removed
    expected = 0.5 * (gs - (gs * 0.5).sum(-1, keepdims=True))
    assert ref.sinkhorn_bwd(g, torch.zeros(2, 2), repeat=1, eps=0.0).numpy() == pytest.approx(expected, abs=1e-16)
    assert expected.tolist() == [[0.125, -0.125], [-0.125, 0.125]]


@pytest.mark.parametrize("m, repeat, eps, scale, batch", [
    (2, 1, 1e-6, 1.0, (3,)), (2, 10, 1e-6, 5.0, (1,)), (3, 2, 1e-3, 2.0, (2, 2)), (4, 10, 1e-6, 1.0, (5,)),
    (5, 7, 1e-8, 20.0, (3,)), (8, 30, 1e-6, 3.0, (2,)), (8, 1, 1e-6, 100.0, (2,)), (6, 4, 0.1, 0.5, (1,)),
])
def test_hand_backward_matches_autograd(m, repeat, eps, scale, batch):
    gen = torch.Generator().manual_seed(m * 100 + repeat)
    x = (torch.randn(*batch, m, m, generator=gen, dtype=F64) * scale).requires_grad_()
    g = torch.randn(*batch, m, m, generator=gen, dtype=F64)
    (auto,) = torch.autograd.grad(ref.sinkhorn(x, repeat, eps), x, g)
    hand = ref.sinkhorn_bwd(g, x.detach(), repeat, eps)
    assert torch.allclose(hand, auto, rtol=1e-10, atol=1e-13)
    # And the eager implementation in float64 computes the same formulas.
    assert torch.allclose(impl.sinkhorn_bwd(g, x.detach(), repeat, eps), auto, rtol=1e-10, atol=1e-13)


def test_steps_order():
    assert ref.steps(1) == [-2]
    assert ref.steps(3) == [-2, -1, -2, -1, -2]


# -- the eager implementation ----------------------------------------------------------


def test_eager_float64_equals_oracle_and_fp32_is_close():
    x = torch.randn(7, 4, 4, generator=torch.Generator().manual_seed(1), dtype=F64) * 3
    assert torch.equal(impl.sinkhorn(x), ref.sinkhorn(x))
    out = impl.sinkhorn(x.float())
    assert out.dtype == F32 and out.shape == x.shape
    b = spec_module.forward_bound(x.float(), 10, 1e-6)
    assert (np.abs(out.double().numpy() - ref.sinkhorn(x.float()).numpy()) <= b * ref.sinkhorn(x.float()).numpy()).all()


def test_autograd_function():
    x = (torch.randn(3, 4, 4, generator=torch.Generator().manual_seed(2)) * 2).requires_grad_()
    p = impl.Sinkhorn.apply(x, 5, 1e-6)
    g = torch.randn_like(p)
    p.backward(g)
    assert torch.equal(p.detach(), impl.sinkhorn(x.detach(), 5, 1e-6))
    assert torch.equal(x.grad, impl.sinkhorn_bwd(g, x.detach(), 5, 1e-6))


def test_empty_batches():
    for shape in ((0, 3, 3), (2, 0, 5, 5)):
        x = torch.zeros(shape)
        assert impl.sinkhorn(x).shape == shape
        assert impl.sinkhorn_bwd(x, x).shape == shape


@pytest.mark.parametrize("call, error, word", [
    (lambda: impl.sinkhorn([[0.0, 0.0], [0.0, 0.0]]), TypeError, "x"),
    (lambda: impl.sinkhorn(torch.zeros(2, 2, dtype=torch.bfloat16)), TypeError, "x"),
    (lambda: impl.sinkhorn(torch.zeros(2, 3)), ValueError, "x"),
    (lambda: impl.sinkhorn(torch.zeros(4)), ValueError, "x"),
    (lambda: impl.sinkhorn(torch.zeros(1, 1)), ValueError, "x"),
    (lambda: impl.sinkhorn(torch.zeros(9, 9)), ValueError, "x"),
    (lambda: impl.sinkhorn(torch.zeros(4, 4).t()), ValueError, "x"),
    (lambda: impl.sinkhorn(torch.zeros(3, 4, 4).transpose(0, 1)), ValueError, "x"),
    (lambda: impl.sinkhorn(torch.zeros(2, 2), repeat=0), ValueError, "repeat"),
    (lambda: impl.sinkhorn(torch.zeros(2, 2), repeat=2.0), TypeError, "repeat"),
    (lambda: impl.sinkhorn(torch.zeros(2, 2), repeat=True), TypeError, "repeat"),
    (lambda: impl.sinkhorn(torch.zeros(2, 2), eps=-1e-6), ValueError, "eps"),
    (lambda: impl.sinkhorn(torch.zeros(2, 2), eps=0.0), ValueError, "eps"),
    (lambda: impl.sinkhorn(torch.zeros(2, 2), eps=math.nan), ValueError, "eps"),
    (lambda: impl.sinkhorn(torch.zeros(2, 2), eps="1e-6"), TypeError, "eps"),
    (lambda: impl.sinkhorn_bwd(torch.zeros(2, 2, dtype=F64), torch.zeros(2, 2)), TypeError, "grad_out"),
    (lambda: impl.sinkhorn_bwd(torch.zeros(3, 3), torch.zeros(2, 2)), ValueError, "grad_out"),
    (lambda: impl.sinkhorn_bwd(torch.zeros(2, 2), torch.zeros(2, 2, dtype=torch.float16)), TypeError, "x"),
])
def test_bad_arguments(call, error, word):
    with pytest.raises(error, match=rf"\b{word}\b"):
        call()


# -- NaN and infinities ------------------------------------------------------------------


@pytest.mark.parametrize("fn", [ref.sinkhorn, impl.sinkhorn], ids=["oracle", "eager"])
@pytest.mark.parametrize("value, where", [(math.nan, (0, 1)), (math.inf, (1, 0)), (-math.inf, "row")])
def test_nonfinite_poisons_its_matrix_only(fn, value, where):
    x = torch.randn(3, 4, 4, generator=torch.Generator().manual_seed(3))
    if where == "row":
        x[1, 2, :] = value
    else:
        x[1, where[0], where[1]] = value
    out = fn(x if fn is impl.sinkhorn else x.double())
    assert torch.isnan(out[1]).all()
    assert torch.isfinite(out[0]).all() and torch.isfinite(out[2]).all()


@pytest.mark.parametrize("fn", [ref.sinkhorn, impl.sinkhorn], ids=["oracle", "eager"])
def test_negative_infinity_entry_is_a_zero_weight(fn):
    x = torch.zeros(1, 3, 3)
    x[0, 0, 2] = -math.inf
    y = x.clone()
    y[0, 0, 2] = -1e4  # exp underflows to exact 0 in fp32 and float64 alike
    a, b = fn(x if fn is impl.sinkhorn else x.double()), fn(y if fn is impl.sinkhorn else y.double())
    assert torch.isfinite(a).all() and torch.equal(a, b)


@checks
@given(case=strat.sinkhorn_nonfinite_cases())
def test_nonfinite_cases_pass_the_forward_checks(case):
    """The eager implementation against the oracle's brackets (NaN matrices must be NaN)."""
    (comp,) = check_case(SPEC, SPEC.impls["torch"], case, case_dir=None)
    assert comp.passed


def test_nan_bracket_demands_nan():
    x = torch.zeros(1, 2, 2)
    x[0, 0, 0] = math.nan
    case = Case({"repeat": 3, "eps": 1e-6}, {"x": x})
    brackets = spec_module.given_forward(case, {})
    assert np.isnan(brackets["out"].low).all() and np.isnan(brackets["out"].high).all()
    good = SPEC.outputs["out"].compare("out", torch.full((1, 2, 2), math.nan), brackets["out"])
    bad = SPEC.outputs["out"].compare("out", torch.full((1, 2, 2), 0.5), brackets["out"])
    assert good.passed and not bad.passed


# -- the spec's bounds and report extras --------------------------------------------------


@checks
@given(case=strat.sinkhorn_cases())
def test_forward_bound_has_margin(case):
    """The eager fp32 result stays within a quarter of the bound (observed: ~0.12), so the assumed
    gain K = 2 of the analysis is not what keeps it inside."""
    x, r, e = case.inputs["x"], case.params["repeat"], case.params["eps"]
    got = impl.sinkhorn(x, r, e).double().numpy()
    exact = ref.sinkhorn(x, r, e).numpy()
    b = spec_module.forward_bound(x, r, e)
    assert (np.abs(got - exact) <= 0.25 * b * exact).all()


@checks
@given(case=strat.sinkhorn_cases(), seed=st.integers(0, 2**31))
def test_gradient_bound_has_margin(case, seed):
    x, r, e = case.inputs["x"], case.params["repeat"], case.params["eps"]
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed))
    got = impl.sinkhorn_bwd(g, x, r, e).double().numpy()
    exact = ref.sinkhorn_bwd(g, x, r, e).numpy()
    assert (np.abs(got - exact) <= 0.25 * spec_module.gradient_bound(x, g, r, e)).all()


def test_report_extras_row_and_column_sums():
    x = torch.randn(5, 4, 4, generator=torch.Generator().manual_seed(4)) * 4
    case = Case({"repeat": 10, "eps": 1e-6}, {"x": x})
    comps = check_case(SPEC, SPEC.impls["torch"], case, case_dir=None)
    (comp,) = comps
    assert comp.passed
    oracle = ref.sum_deviation(ref.sinkhorn(x, 10, 1e-6).numpy())
    assert comp.extra["oracle_max_sum_deviation"] == oracle
    # The same device as check_case used (CUDA where present): fp32 results differ across devices.
    on_device = x.to(SPEC.impls["torch"].resolve_device())
    assert comp.extra["max_sum_deviation"] == ref.sum_deviation(impl.sinkhorn(on_device, 10, 1e-6).cpu().numpy())
    assert 0 < oracle < 1  # eps and 10 sweeps: not exactly doubly stochastic


def test_one_sweep_fewer_and_swapped_fall_outside_the_bound():
    x = torch.randn(3, 4, 4, generator=torch.Generator().manual_seed(5)) * 3
    case = Case({"repeat": 10, "eps": 1e-6}, {"x": x})
    br = spec_module.given_forward(case, {})["out"]
    for wrong in (impl.sinkhorn(x, 9), impl._forward(x, 10, 1e-6, swapped=True)[0]):
        assert not SPEC.outputs["out"].compare("out", wrong, br).passed


def test_dtype_is_checked():
    x = torch.zeros(1, 2, 2)
    br = spec_module.given_forward(Case({"repeat": 1, "eps": 1e-6}, {"x": x}), {})["out"]
    assert not SPEC.outputs["out"].compare("out", impl.sinkhorn(x.double(), 1), br).passed


# -- the strategy's features ---------------------------------------------------------------


def _features(case: Case) -> set[str]:
    x = case.inputs["x"].double()
    found = set()
    if x.numel() == 0:
        return {"empty"}
    if x.shape[0] == 1 and x.dim() == 3:
        found.add("one")
    m = x.shape[-1]
    s = torch.softmax(x, -1)
    if ((s == 0).any(-1) & (s == 1).any(-1)).any():
        found.add("saturated")
    if (x == x[..., :1]).all(-1).all(-1).any():
        found.add("equal_rows")
    if (x.abs() > 80).any():
        found.add("beyond_80")
    if ((s > 0.1 * case.params["eps"]) & (s < 10 * case.params["eps"])).any():
        found.add("eps_entries")
    top = s.max(-1).values
    if (top > 0.999).all(-1).any() and not (s == 1).all():
        found.add("dominant")
    cols = s.argmax(-1)
    perm = torch.tensor([len(set(c.tolist())) == m for c in cols.reshape(-1, m)])
    if (perm & (top.reshape(-1, m) > 0.999).all(-1)).any():
        found.add("near_permutation")
    return found


def test_strategy_features():
    seen: set[str] = set()
    ms, repeats, tokens = set(), set(), set()

    @settings(max_examples=200, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=strat.sinkhorn_cases())
    def run(case):
        x = case.inputs["x"]
        assert x.dtype == F32 and x.is_contiguous() and torch.isfinite(x).all()
        assert x.abs().max() <= strat.MAX_LOGIT if x.numel() else True
        seen.update(_features(case))
        ms.add(x.shape[-1])
        repeats.add(case.params["repeat"])
        if x.dim() == 3:
            tokens.add(x.shape[0])

    run()
    assert ms == set(range(2, 9))
    assert {1, 10, 30} <= repeats
    assert 0 in tokens and 1 in tokens and any(t % 2 and t > 1 for t in tokens)
    assert {"saturated", "equal_rows", "beyond_80", "eps_entries", "dominant", "near_permutation",
            "empty", "one"} <= seen


def test_nonfinite_strategy_features():
    kinds: set[str] = set()

    @settings(max_examples=60, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=strat.sinkhorn_nonfinite_cases())
    def run(case):
        x = case.inputs["x"]
        if torch.isnan(x).any():
            kinds.add("nan")
        if (x == math.inf).any():
            kinds.add("+inf")
        if (x == -math.inf).any():
            kinds.add("-inf")
        if x.numel() and (x == -math.inf).all(-1).any():
            kinds.add("row")

    run()
    assert kinds == {"nan", "+inf", "-inf", "row"}


def test_gradient_mask_and_scales():
    x = torch.zeros(2, 3, 3)
    x[1, 0, 0] = math.nan
    case = Case({"repeat": 2, "eps": 1e-6}, {"x": x})
    assert spec_module.mask(case, None)["out"].reshape(-1).tolist() == [False, True]
    scale = spec_module.fd_scale(case)["x"]
    assert torch.isfinite(scale).all() and scale[0].eq(1).all()


# == the mix operators: pre_split_mixes, pre_apply_mix, post =================================

SPLIT, APPLY, POST = (registry.get(f"mhc.{n}") for n in ("pre_split_mixes", "pre_apply_mix", "post"))
BF16 = torch.bfloat16


def split_case(mixes, scale, base, m, post_mult=2.0, pre_eps=1e-6) -> Case:
    return Case({"m": m, "post_mult": post_mult, "pre_eps": pre_eps},
                {"mixes": torch.tensor(mixes, dtype=F32), "scale": torch.tensor(scale, dtype=F32),
                 "base": torch.tensor(base, dtype=F32)})


def judge(spec, case: Case, actual: dict) -> dict:
    expected = {**dict(zip(spec.outputs, _tuple(spec.oracle(**case.inputs, **case.params)))),
                **spec.given(case, actual)}
    return {name: policy.compare(name, actual[name], expected[name]) for name, policy in spec.outputs.items()}


def _tuple(result):
    return result if isinstance(result, tuple) else (result,)


# -- the oracles, by hand ----------------------------------------------------------------


def test_split_oracle_by_hand_m2():
    # m = 2: 8 entries; s = (1, 1, 2, 2, 3, 3, 3, 3).  u = mixes * s + base.
    mixes = [[[0.0, math.log(3), 1.0, -1.0, 1.0, 2.0, 3.0, 4.0]]]
    base = [0.0, 0.0, -1.0, 2.0, 0.0, 0.0, 0.0, 0.5]
    pre, post, comb = ref.pre_split_mixes(t64(mixes), t64([1.0, 2.0, 3.0]), t64(base), 2, post_mult=2.0, pre_eps=0.25)
    assert pre.shape == (1, 1, 2, 1) and post.shape == (1, 1, 2, 1) and comb.shape == (1, 1, 2, 2)
    assert pre.ravel().tolist() == pytest.approx([0.5 + 0.25, 0.75 + 0.25], rel=1e-15)  # sigmoid(ln 3) = 3/4
    assert post.ravel().tolist() == pytest.approx([2.0 / (1 + math.exp(-1.0)), 2.0 / (1 + math.exp(-0.0))], rel=1e-15)
    assert comb[0, 0].tolist() == [[3.0, 6.0], [9.0, 12.5]]  # row-major: entries 2m.. are comb[0, 0], comb[0, 1], ...


def test_split_oracle_nonfinite():
    inf, nan = math.inf, math.nan
    mixes = [[[inf, -inf, nan, inf, 1.0, 1.0, 1.0, 1.0]]]
    pre, post, comb = ref.pre_split_mixes(torch.tensor(mixes), torch.tensor([1.0, 0.0, 1.0]), torch.zeros(8),
                                          2, post_mult=-3.0, pre_eps=1e-6)
    assert pre.ravel().tolist() == [1.0 + 1e-6, 1e-6]  # sigmoid(+inf) = 1, sigmoid(-inf) = 0
    assert math.isnan(post.ravel()[0]) and math.isnan(post.ravel()[1])  # NaN, and inf * scale 0
    assert ref.sigmoid(np.array([-800.0, 800.0])).tolist() == [0.0, 1.0]  # no overflow warning turned NaN


def test_apply_oracle_against_fractions():
    from fractions import Fraction

    gen = torch.Generator().manual_seed(11)
    x = (torch.randn(2, 1, 3, 5, generator=gen) * 1e3).to(BF16)
    x[0, 0, 1] = x[0, 0, 0]  # two equal rows with opposite weights: exact cancellation
    mix = torch.randn(2, 1, 3, 1, generator=gen)
    mix[0, 0, 1] = -mix[0, 0, 0]
    mix[1, 0, 2] = 2.0**-100  # a term far below the others' rounding
    got = ref.pre_apply_mix(x, mix)
    xs, ws = x.double().numpy(), mix.double().numpy()
    for idx in np.ndindex(got.shape):
        a, b, h = idx
        exact = sum(Fraction(float(xs[a, b, i, h])) * Fraction(float(ws[a, b, i, 0])) for i in range(3))
        assert Fraction(float(got[idx])) == exact or abs(Fraction(float(got[idx])) - exact) <= abs(exact) * Fraction(1, 2**52)


def post_inputs(seed: int, m: int, h: int, b: int = 2):
    """(x, residual, post = 0, comb = I), bf16 normal rows."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(1, b, h, generator=gen).to(BF16)
    residual = torch.randn(1, b, m, h, generator=gen).to(BF16)
    return x, residual, torch.zeros(1, b, m, 1), torch.eye(m).expand(1, b, m, m).contiguous()


def test_post_oracle_identity_comb_and_zero_post():
    m, h = 3, 7
    x, residual, zero, eye = post_inputs(12, m, h)
    gen = torch.Generator().manual_seed(12)
    assert np.array_equal(ref.post(x, residual, zero, eye), residual.double().numpy())
    post = torch.rand(1, 2, m, 1, generator=gen)
    expected = x.double().numpy()[:, :, None, :] * post.double().numpy()
    assert np.array_equal(ref.post(x, residual, post, torch.zeros(1, 2, m, m)), expected)
    # comb[i, n] weighs residual row i into output row n: a single 1 at (0, 2) moves row 0 to row 2.
    comb = torch.zeros(1, 2, m, m)
    comb[..., 0, 2] = 1.0
    out = ref.post(x, residual, zero, comb)
    assert np.array_equal(out[:, :, 2], residual[:, :, 0].double().numpy()) and not out[:, :, :2].any()


# -- the eager implementations --------------------------------------------------------------


def test_eager_split_shapes_and_empty():
    for a, b in ((0, 3), (2, 0), (1, 1)):
        pre, post, comb = impl.pre_split_mixes(torch.zeros(a, b, 24), torch.ones(3), torch.zeros(24), 4, 2.0, 0.0)
        assert pre.shape == (a, b, 4, 1) and post.shape == (a, b, 4, 1) and comb.shape == (a, b, 4, 4)
        assert all(t.dtype == F32 and t.is_contiguous() for t in (pre, post, comb))
        if a * b:
            assert pre.eq(0.5).all() and post.eq(1.0).all() and comb.eq(0).all()


def test_eager_post_and_apply_identities():
    m = 4
    x, residual, zero, eye = post_inputs(13, m, 33, b=3)
    assert torch.equal(impl.post(x, residual, zero, eye), residual)
    one_hot = torch.zeros(1, 3, m, 1)
    one_hot[..., 2, 0] = 1.0
    assert torch.equal(impl.pre_apply_mix(residual, one_hot), residual[:, :, 2])


def _mix_inputs():
    split = (torch.zeros(1, 2, 24), torch.ones(3), torch.zeros(24), 4, 2.0, 1e-6)
    apply = (torch.zeros(1, 2, 4, 9, dtype=BF16), torch.zeros(1, 2, 4, 1))
    post = (torch.zeros(1, 2, 9, dtype=BF16), torch.zeros(1, 2, 4, 9, dtype=BF16), torch.zeros(1, 2, 4, 1),
            torch.zeros(1, 2, 4, 4))
    return split, apply, post


def _replace(args, index, value):
    return tuple(value if i == index else a for i, a in enumerate(args))


_SPLIT_ARGS, _APPLY_ARGS, _POST_ARGS = _mix_inputs()
_BAD_MIX = [
    # (function, args, index, bad value, error, the argument named)
    (impl.pre_split_mixes, _SPLIT_ARGS, 0, [[0.0] * 24], TypeError, "mixes"),
    (impl.pre_split_mixes, _SPLIT_ARGS, 0, torch.zeros(1, 2, 24, dtype=F64), TypeError, "mixes"),
    (impl.pre_split_mixes, _SPLIT_ARGS, 0, torch.zeros(2, 24), ValueError, "mixes"),
    (impl.pre_split_mixes, _SPLIT_ARGS, 0, torch.zeros(1, 2, 25), ValueError, "mixes"),
    (impl.pre_split_mixes, _SPLIT_ARGS, 0, torch.zeros(1, 2, 48)[..., ::2], ValueError, "mixes"),
    (impl.pre_split_mixes, _SPLIT_ARGS, 1, torch.ones(3, dtype=BF16), TypeError, "scale"),
    (impl.pre_split_mixes, _SPLIT_ARGS, 1, torch.ones(4), ValueError, "scale"),
    (impl.pre_split_mixes, _SPLIT_ARGS, 1, torch.ones(6)[::2], ValueError, "scale"),
    (impl.pre_split_mixes, _SPLIT_ARGS, 1, torch.ones(3, device="meta"), ValueError, "scale"),
    (impl.pre_split_mixes, _SPLIT_ARGS, 2, torch.zeros(24, dtype=torch.int32), TypeError, "base"),
    (impl.pre_split_mixes, _SPLIT_ARGS, 2, torch.zeros(1, 24), ValueError, "base"),
    (impl.pre_split_mixes, _SPLIT_ARGS, 2, torch.zeros(48)[::2], ValueError, "base"),
    (impl.pre_split_mixes, _SPLIT_ARGS, 2, torch.zeros(24, device="meta"), ValueError, "base"),
    (impl.pre_split_mixes, _SPLIT_ARGS, 3, 4.0, TypeError, "m"),
    (impl.pre_split_mixes, _SPLIT_ARGS, 3, True, TypeError, "m"),
    (impl.pre_split_mixes, _SPLIT_ARGS, 3, 1, ValueError, "m"),
    (impl.pre_split_mixes, _SPLIT_ARGS, 3, 9, ValueError, "m"),
    (impl.pre_split_mixes, _SPLIT_ARGS, 3, 3, ValueError, "mixes"),  # 3 * 5 != 24
    (impl.pre_split_mixes, _SPLIT_ARGS, 4, "2", TypeError, "post_mult"),
    (impl.pre_split_mixes, _SPLIT_ARGS, 4, math.inf, ValueError, "post_mult"),
    (impl.pre_split_mixes, _SPLIT_ARGS, 4, 1e39, ValueError, "post_mult"),
    (impl.pre_split_mixes, _SPLIT_ARGS, 5, None, TypeError, "pre_eps"),
    (impl.pre_split_mixes, _SPLIT_ARGS, 5, -1e-6, ValueError, "pre_eps"),
    (impl.pre_split_mixes, _SPLIT_ARGS, 5, math.nan, ValueError, "pre_eps"),
    (impl.pre_apply_mix, _APPLY_ARGS, 0, torch.zeros(1, 2, 4, 9), TypeError, "x"),
    (impl.pre_apply_mix, _APPLY_ARGS, 0, np.zeros((1, 2, 4, 9)), TypeError, "x"),
    (impl.pre_apply_mix, _APPLY_ARGS, 0, torch.zeros(2, 4, 9, dtype=BF16), ValueError, "x"),
    (impl.pre_apply_mix, _APPLY_ARGS, 0, torch.zeros(1, 2, 4, 0, dtype=BF16), ValueError, "x"),
    (impl.pre_apply_mix, _APPLY_ARGS, 0, torch.zeros(1, 2, 1, 9, dtype=BF16), ValueError, "x"),
    (impl.pre_apply_mix, _APPLY_ARGS, 0, torch.zeros(1, 2, 9, 9, dtype=BF16), ValueError, "x"),
    (impl.pre_apply_mix, _APPLY_ARGS, 0, torch.zeros(1, 2, 9, 4, dtype=BF16).transpose(2, 3), ValueError, "x"),
    (impl.pre_apply_mix, _APPLY_ARGS, 1, torch.zeros(1, 2, 4, 1, dtype=BF16), TypeError, "mix"),
    (impl.pre_apply_mix, _APPLY_ARGS, 1, torch.zeros(1, 2, 4), ValueError, "mix"),
    (impl.pre_apply_mix, _APPLY_ARGS, 1, torch.zeros(1, 2, 3, 1), ValueError, "mix"),
    (impl.pre_apply_mix, _APPLY_ARGS, 1, torch.zeros(1, 2, 4, 2)[..., :1], ValueError, "mix"),
    (impl.pre_apply_mix, _APPLY_ARGS, 1, torch.zeros(1, 2, 4, 1, device="meta"), ValueError, "mix"),
    (impl.post, _POST_ARGS, 0, torch.zeros(1, 2, 9), TypeError, "x"),
    (impl.post, _POST_ARGS, 0, torch.zeros(2, 9, dtype=BF16), ValueError, "x"),
    (impl.post, _POST_ARGS, 0, torch.zeros(1, 2, 0, dtype=BF16), ValueError, "x"),
    (impl.post, _POST_ARGS, 0, torch.zeros(1, 9, 2, dtype=BF16).transpose(1, 2), ValueError, "x"),
    (impl.post, _POST_ARGS, 1, torch.zeros(1, 2, 4, 9), TypeError, "residual"),
    (impl.post, _POST_ARGS, 1, torch.zeros(1, 2, 4, 8, dtype=BF16), ValueError, "residual"),
    (impl.post, _POST_ARGS, 1, torch.zeros(1, 3, 4, 9, dtype=BF16), ValueError, "residual"),
    (impl.post, _POST_ARGS, 1, torch.zeros(1, 2, 9, dtype=BF16), ValueError, "residual"),
    (impl.post, _POST_ARGS, 1, torch.zeros(1, 2, 1, 9, dtype=BF16), ValueError, "residual"),
    (impl.post, _POST_ARGS, 1, torch.zeros(1, 2, 9, 9, dtype=BF16), ValueError, "residual"),
    (impl.post, _POST_ARGS, 1, torch.zeros(1, 2, 9, 4, dtype=BF16).transpose(2, 3), ValueError, "residual"),
    (impl.post, _POST_ARGS, 1, torch.zeros(1, 2, 4, 9, dtype=BF16, device="meta"), ValueError, "residual"),
    (impl.post, _POST_ARGS, 2, torch.zeros(1, 2, 4, 1, dtype=F64), TypeError, "post"),
    (impl.post, _POST_ARGS, 2, torch.zeros(1, 2, 4), ValueError, "post"),
    (impl.post, _POST_ARGS, 2, torch.zeros(1, 2, 4, 2)[..., :1], ValueError, "post"),
    (impl.post, _POST_ARGS, 2, torch.zeros(1, 2, 4, 1, device="meta"), ValueError, "post"),
    (impl.post, _POST_ARGS, 3, torch.zeros(1, 2, 4, 4, dtype=BF16), TypeError, "comb"),
    (impl.post, _POST_ARGS, 3, torch.zeros(1, 2, 4, 3), ValueError, "comb"),
    (impl.post, _POST_ARGS, 3, torch.zeros(1, 2, 4, 4).transpose(2, 3), ValueError, "comb"),
    (impl.post, _POST_ARGS, 3, torch.zeros(1, 2, 4, 4, device="meta"), ValueError, "comb"),
]


@pytest.mark.parametrize("fn, args, index, value, error, word", _BAD_MIX,
                         ids=[f"{c[0].__name__}-{c[5]}-{i}" for i, c in enumerate(_BAD_MIX)])
def test_mix_bad_arguments(fn, args, index, value, error, word):
    with pytest.raises(error, match=rf"\b{word}\b"):
        fn(*_replace(args, index, value))


def test_mix_good_arguments_pass_the_checks():
    """The base arguments of the table above are valid, so each row fails on its own change."""
    for fn, args in ((impl.pre_split_mixes, _SPLIT_ARGS), (impl.pre_apply_mix, _APPLY_ARGS), (impl.post, _POST_ARGS)):
        fn(*args)


# -- the bounds: what they accept and what they reject ---------------------------------------


def test_comb_bracket_takes_the_fma_and_the_two_step_sum():
    # p = mixes * s is not an fp32 value; base = -RN(p): an fma gives p - RN(p) != 0, mul + add gives 0.
    mix, s = np.float32(1 + 2.0**-20), np.float32(1 + 2.0**-21 + 2.0**-23)
    p = float(mix) * float(s)
    rounded = float(mix * s)
    assert p != rounded
    base = [0.0] * 4 + [-rounded] + [0.0] * 3
    case = split_case([[[0.0] * 4 + [float(mix)] + [0.0] * 3]], [1.0, 1.0, float(s)], base, 2)
    residue = np.float32(p - rounded)  # exactly representable: the product's rounding error
    policy = SPLIT.outputs["comb"]
    for value, ok in ((residue, True), (0.0, True), (2 * residue, False), (-residue, False)):
        comb = torch.zeros(1, 1, 2, 2)
        comb[0, 0, 0, 0] = float(value)
        pre, post, _ = impl.pre_split_mixes(**case.inputs, **case.params)
        verdict = judge(SPLIT, case, {"pre": pre, "post": post, "comb": comb})
        assert verdict["comb"].passed is ok, (value, verdict["comb"].message)
    assert str(policy).startswith("within")


def test_saturated_sigmoid_allows_a_flushed_subnormal_but_not_tanh():
    """sigmoid(-100) ~ 3.7e-44 (an fp32 subnormal): 0 is within TINY.  sigmoid(-30) ~ 9.4e-14:
    0.5 + 0.5 tanh(-15) rounds to 0 in fp32 and must fail (no relative accuracy)."""
    case = split_case([[[-100.0, -30.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]], [1.0, 1.0, 1.0], [0.0] * 8, 2, 1.0, 0.0)
    pre, post, comb = impl.pre_split_mixes(**case.inputs, **case.params)
    assert judge(SPLIT, case, {"pre": pre, "post": post, "comb": comb})["pre"].passed
    flushed = pre.clone()
    flushed[0, 0, 0, 0] = 0.0
    assert judge(SPLIT, case, {"pre": flushed, "post": post, "comb": comb})["pre"].passed
    tanh_form = (0.5 + 0.5 * torch.tanh(torch.tensor([-50.0, -15.0]))).reshape(1, 1, 2, 1)
    assert tanh_form[0, 0, 1, 0] == 0.0
    assert not judge(SPLIT, case, {"pre": tanh_form, "post": post, "comb": comb})["pre"].passed


def test_split_bracket_demands_nan_and_infinities():
    case = split_case([[[math.nan, math.inf, math.inf, 0.0, math.inf, -math.inf, 0.0, 0.0]]], [1.0, 0.0, 1.0],
                      [0.0] * 8, 2, 2.0, 0.0)
    pre, post, comb = impl.pre_split_mixes(**case.inputs, **case.params)
    good = judge(SPLIT, case, {"pre": pre, "post": post, "comb": comb})
    assert all(c.passed for c in good.values()), [c.message for c in good.values()]
    assert torch.isnan(pre[0, 0, 0]).all() and pre[0, 0, 1].item() == 1.0  # sigmoid(+inf) = 1
    assert torch.isnan(post[0, 0, 0]).all() and post[0, 0, 1].item() == 1.0  # inf * scale 0 is NaN
    assert comb[0, 0, 0].tolist() == [math.inf, -math.inf]
    for name, wrong in (("pre", pre.nan_to_num(0.5)), ("post", post.nan_to_num(0.0)), ("comb", comb.clamp(-1, 1))):
        assert not judge(SPLIT, case, {"pre": pre, "post": post, "comb": comb, name: wrong})[name].passed


def test_wrong_scale_and_transposed_comb_fail():
    gen = torch.Generator().manual_seed(14)
    m = 4
    case = Case({"m": m, "post_mult": 2.0, "pre_eps": 1e-6},
                {"mixes": torch.randn(1, 3, 24, generator=gen), "scale": torch.tensor([0.5, 1.5, 3.0]),
                 "base": torch.randn(24, generator=gen)})
    wrong = dict(case.inputs, scale=torch.tensor([0.5, 1.5, 1.5]))
    out = dict(zip(SPLIT.outputs, impl.pre_split_mixes(**wrong, **case.params)))
    verdict = judge(SPLIT, case, out)
    assert verdict["pre"].passed and verdict["post"].passed and not verdict["comb"].passed

    x = torch.randn(1, 3, 17, generator=gen).to(BF16)
    residual = torch.randn(1, 3, m, 17, generator=gen).to(BF16)
    post, comb = torch.rand(1, 3, m, 1, generator=gen), torch.rand(1, 3, m, m, generator=gen)
    pcase = Case({}, {"x": x, "residual": residual, "post": post, "comb": comb})
    assert judge(POST, pcase, {"out": impl.post(x, residual, post, comb)})["out"].passed
    transposed = impl.post(x, residual, post, comb.transpose(-1, -2).contiguous())
    assert not judge(POST, pcase, {"out": transposed})["out"].passed


def test_cancelling_sum_is_judged_by_the_terms():
    """Equal rows with opposite weights: S = 0, and an fp32 residue within gamma sum|p| passes,
    one beyond fails; an fp32 output (wrong dtype) fails."""
    x = torch.full((1, 1, 2, 3), 1.0 + 2.0**-7).to(BF16)
    mix = torch.tensor([0.1, -0.1]).reshape(1, 1, 2, 1)
    case = Case({}, {"x": x, "mix": mix})
    bound = spec_module.given_apply(case, {})["out"]
    assert np.array_equal(bound.exact, np.zeros((1, 1, 3)))
    ok = torch.full((1, 1, 3), float(bound.error.max()) * 0.9).to(BF16)
    far = torch.full((1, 1, 3), float(bound.error.max()) * 4).to(BF16)
    policy = APPLY.outputs["out"]
    assert policy.compare("out", ok, bound).passed and not policy.compare("out", far, bound).passed
    assert not policy.compare("out", torch.zeros(1, 1, 3), bound).passed


# -- the strategies promise their features ------------------------------------------------------


def _draw_many(strategy, n):
    cases = []

    @settings(max_examples=n, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def run(case):
        cases.append(case)

    run()
    return cases


def test_split_strategy_features():
    seen, ms = set(), set()
    for case in _draw_many(strat.pre_split_mixes_cases(), 200):
        m = case.params["m"]
        ms.add(m)
        mixes = case.inputs["mixes"]
        assert mixes.dtype == F32 and mixes.is_contiguous() and mixes.shape[-1] == m * (m + 2)
        u = ref.mix_logits(**{k: case.inputs[k] for k in ("mixes", "scale", "base")}, m=m)
        if mixes.shape[0] * mixes.shape[1] == 0:
            seen.add("empty")
        with np.errstate(invalid="ignore", over="ignore"):
            p = mixes.double().numpy() * ref.mix_scales(case.inputs["scale"], m)  # exact
            two_step = p.astype(np.float32).astype(np.float64) + case.inputs["base"].double().numpy()
        seen.update({name for name, hit in (
            ("saturated", (np.abs(u) > 90).any()), ("zero_u", (u == 0).any()),
            ("nan", np.isnan(u).any()), ("inf", np.isinf(u).any()),
            ("scale_zero", (case.inputs["scale"] == 0).any()),
            ("subnormal", ((np.abs(u) < 2.0**-126) & (u != 0)).any()),
            ("overflow", (np.isfinite(u) & (np.abs(p) > 3.4028234663852886e38)).any()),  # RN(p) is inf
            ("cancel", ((two_step == 0) & (u != 0)).any()),  # an fma and mul + add differ
        ) if hit})
    assert ms == set(range(2, 9))
    assert {"empty", "saturated", "zero_u", "nan", "inf", "scale_zero", "subnormal", "overflow", "cancel"} <= seen


def _sum_features(terms: list[np.ndarray], exact: np.ndarray, values: list[torch.Tensor]) -> set[str]:
    found = set()
    v = np.concatenate([t.double().numpy().ravel() for t in values])
    if (np.abs(v) >= 2.0**127).any():
        found.add("bf16_max")
    if ((np.abs(v) < 2.0**-126) & (v != 0)).any():
        found.add("subnormal")
    if np.isnan(exact).any() or np.isinf(exact).any():
        found.add("nonfinite")
    with np.errstate(invalid="ignore"):
        magnitude = np.sum([np.abs(t) for t in terms], axis=0)
        if ((exact == 0) & (magnitude > 0)).any():
            found.add("cancel")
    return found


def test_apply_and_post_strategy_features():
    for strategy, spec, rows in ((strat.pre_apply_mix_cases(), APPLY, "x"), (strat.post_cases(), POST, "residual")):
        seen, hidden = set(), set()
        for case in _draw_many(strategy, 150):
            t = case.inputs[rows]
            assert t.dtype == BF16 and all(v.is_contiguous() for v in case.inputs.values())
            assert t.numel() <= strat.MIX_ELEMENTS
            hidden.add(t.shape[-1])
            if t.numel() == 0:
                seen.add("empty")
                continue
            terms = ref.pre_apply_mix_terms(**case.inputs) if spec is APPLY else ref.post_terms(**case.inputs)
            exact = spec.oracle(**case.inputs)
            assert np.isfinite(exact[np.isfinite(np.sum([np.abs(p) for p in terms], axis=0))]).all()
            assert (np.abs(exact[np.isfinite(exact)]) < 2.0**127.5).all()  # no sum beyond bf16
            seen |= _sum_features(terms, exact, list(case.inputs.values()))
        assert {"empty", "bf16_max", "subnormal", "nonfinite", "cancel"} <= seen, (spec.name, seen)
        assert 1 in hidden and any(h % 8 for h in hidden if h > 8) and max(hidden) >= 4095, (spec.name, hidden)


def test_strategies_draw_their_dispatch_corners():
    """The corners `corner_sizes` plants come with the drawn cases (post's single vectorised rows at m 2, 3,
    its kernels padded to 4 streams, and vectorised rows at m 5 .. 7; pre_split_mixes' single rows at m <= 4
    and m > 4), and a corner keeps a b m H within MIX_ELEMENTS."""
    post = [c.inputs["residual"].shape for c in _draw_many(strat.post_cases(), 100)]
    assert any(a * b == 1 and m in (2, 3) and h % 8 == 0 for a, b, m, h in post)
    assert any(a * b and m in (5, 6, 7) and h % 8 == 0 for a, b, m, h in post)
    split = [(c.inputs["mixes"].shape[0] * c.inputs["mixes"].shape[1], c.params["m"])
             for c in _draw_many(strat.pre_split_mixes_cases(), 100)]
    assert any(rows == 1 and m <= 4 for rows, m in split) and any(rows == 1 and m > 4 for rows, m in split)
    for draws in range(20):
        (m, a, b, h), corner = strat.corner_sizes((draws,), (8, 3, 129, 7169), strat.POST_CORNERS, share=1.0)
        assert corner in strat.POST_CORNERS and h % 8 == 0 and m in corner.m
        assert 1 <= a * b * m * h <= strat.MIX_ELEMENTS
        assert (a, b) == (1, 1) if corner.single else a == 3


def test_benchmark_shapes_run_and_count_their_bytes(monkeypatch):
    """Every mhc benchmark shape (smaller b here) runs on the eager implementation, and nbytes
    counts each tensor read and written once."""
    monkeypatch.setattr(spec_module, "BENCH_TOKENS", 8)
    cpu = torch.device("cpu")
    expected = {  # bytes per token (a = 1) at m = 4, H = 7168
        "mhc.pre_split_mixes": 24 * 4 + (4 + 4 + 16) * 4,
        "mhc.pre_apply_mix": 4 * 7168 * 2 + 4 * 4 + 7168 * 2,
        "mhc.post": 7168 * 2 + 4 * 7168 * 2 + 4 * 4 + 16 * 4 + 4 * 7168 * 2,
    }
    for name, per_token in expected.items():
        spec = registry.get(name)
        (shape,) = spec.bench
        inputs, params = shape.make(cpu)
        spec.impls["torch"].function()(**inputs, **params)
        fixed = (3 + 24) * 4 if name == "mhc.pre_split_mixes" else 0  # scale and base
        assert shape.nbytes(inputs, params) == 8 * per_token + fixed, name
    sinkhorn = registry.get("mhc.sinkhorn")
    inputs, params = sinkhorn.bench[0].make(cpu)
    assert sinkhorn.bench[0].target is None and sinkhorn.bench[0].nbytes(inputs, params) == 2 * 65536 * 64
    inputs, params = sinkhorn.backward.bench[0].make(cpu)
    impl.sinkhorn_bwd(**inputs, **params)
    assert sinkhorn.backward.bench[0].nbytes(inputs, params) == 3 * 65536 * 64
