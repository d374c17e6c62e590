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
