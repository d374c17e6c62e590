"""quant.norm on the CPU: the float64 oracle by hand and against autograd, the error analysis's brackets,
the eager implementation against the oracle through the spec's judges (the residual and the weight
absent, non-finite rows, rows past the fp32 range of the sum of squares, empty batches), its backward
through the gradient checks, and bad arguments; norm_forward_and_per_token_cast as the cast of the rounded
norm, judged through the cast's judge."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings

import references.quant_norm as ref
import strategies.quant_norm as strat
from kernels.torch import quant_norm as eager
from tkverify import formats, gradients, registry
from tkverify.case import Case
from tkverify.check import VerificationError, check_case
from tkverify.registry import Impl

SPEC = registry.get("quant.norm")
BF16, F32, F64 = torch.bfloat16, torch.float32, torch.float64
checks = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))


def _case(x, weight=None, residual=None, eps=1e-6, out_scale=1.0) -> Case:
    inputs = {"x": x}
    if weight is not None:
        inputs["weight"] = weight
    if residual is not None:
        inputs["residual"] = residual
    return Case(params={"eps": eps, "out_scale": out_scale}, inputs=inputs)


def _judge_torch(case: Case) -> None:
    for comparison in check_case(SPEC, SPEC.impls["torch"], case, case_dir=None):
        assert comparison.passed, comparison.message


# -- the oracle by hand ------------------------------------------------------------------


def test_forward_by_hand():
    # s = [1 + 2, 5 - 1] = [3, 4]; m = (9 + 16) / 2 + 3.5 = 16, rstd = 1/4; out = s / 4 * w * c
    x = torch.tensor([[1.0, 5.0]], dtype=F32)
    r = torch.tensor([[2.0, -1.0]], dtype=F32)
    w = torch.tensor([2.0, -1.0], dtype=F32)
    out, rstd, s = ref.norm(x, w, r, eps=3.5, out_scale=0.5)
    assert s.tolist() == [[3.0, 4.0]]
    assert rstd.tolist() == [0.25]
    assert out.tolist() == [[0.75, -0.5]]


def test_norm_input_is_rounded_to_the_dtype():
    # bf16 near 1 has spacing 2^-7: 1 + 2^-9 rounds down, 1 + 2^-8 is a tie to the even 1,
    # 1 + 3 * 2^-8 a tie to the even 1 + 2^-6
    x = torch.ones(1, 3, dtype=BF16)
    r = torch.tensor([[2.0**-9, 2.0**-8, 3 * 2.0**-8]], dtype=BF16)
    assert ref.norm_input(x, r).tolist() == [[1.0, 1.0, 1.0 + 2.0**-6]]
    # float64 inputs (the gradient checks') are not rounded
    assert ref.norm_input(x.double(), r.double()).tolist() == [[1.0 + 2.0**-9, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8]]


def test_zero_infinite_and_nan_rows():
    x = torch.tensor([[0.0, 0.0], [math.inf, 2.0], [math.nan, 1.0], [-math.inf, -3.0]], dtype=F32)
    out, rstd, _ = ref.norm(x, eps=0.25)
    assert rstd[0] == 2.0 and out[0].tolist() == [0.0, 0.0]
    assert rstd[1] == 0.0 and math.isnan(out[1, 0]) and out[1, 1] == 0.0
    assert math.isnan(rstd[2]) and torch.isnan(out[2]).all()
    assert rstd[3] == 0.0 and math.isnan(out[3, 0]) and out[3, 1] == 0.0


def test_backward_by_hand():
    # H = 1: out = x / sqrt(x^2 + eps) w c; at x = 1, eps = 3: rstd = 1/2, dout/dx = eps rstd^3 w c = 3/8 * 2
    x, w = torch.tensor([[1.0]], dtype=F64), torch.tensor([2.0], dtype=F64)
    r = torch.zeros_like(x)
    grad_x, grad_w, grad_r = ref.norm_bwd(torch.ones_like(x), None, x, w, r, eps=3.0, out_scale=1.0)
    assert grad_x.tolist() == [[0.75]] and grad_r.tolist() == [[0.75]]
    assert grad_w.tolist() == [0.5]  # G s rstd c
    # grad_norm_input passes straight through to x and the residual
    grad_x, _, _ = ref.norm_bwd(torch.ones_like(x), torch.full_like(x, 2.0), x, w, r, eps=3.0)
    assert grad_x.tolist() == [[2.75]]


@pytest.mark.parametrize("hidden", [1, 3, 64])
def test_hand_backward_equals_autograd_and_passes_gradcheck(hidden):
    g = torch.Generator().manual_seed(hidden)
    x, r = (torch.randn(5, hidden, generator=g, dtype=F64) for _ in range(2))
    w = torch.randn(hidden, generator=g, dtype=F64)
    leaves = [t.clone().requires_grad_(True) for t in (x, w, r)]
    out, _, s = ref.norm(*leaves[:1], leaves[1], leaves[2], eps=1e-2, out_scale=0.5)
    grad_out, grad_s = torch.randn_like(out), torch.randn_like(out)
    auto = torch.autograd.grad((out * grad_out).sum() + (s * grad_s).sum(), leaves)
    hand = ref.norm_bwd(grad_out, grad_s, x, w, r, eps=1e-2, out_scale=0.5)
    for a, h in zip(auto, hand):
        torch.testing.assert_close(h, a, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda *t: ref.norm(t[0], t[1], t[2], 1e-2, 0.5)[0], tuple(leaves))


# -- the error analysis ----------------------------------------------------------------------


@checks
@given(strat.norm_cases())
def test_correctly_rounded_oracle_lies_in_every_bracket(case):
    """The float64 values rounded once to each output's dtype: what an exact implementation returns."""
    out, rstd, s = (t.numpy() for t in ref.norm(**case.inputs, **case.params))
    expected = SPEC.given(case, {})
    for name, exact in (("out", out), ("rstd", rstd), ("norm_input", s)):
        b = expected[name]
        fmt = formats.of_dtype(b.dtype)
        rounded = fmt.decode(fmt.encode(exact))
        assert np.all((b.low <= rounded) & (rounded <= b.high)), name


def test_brackets_are_tight_on_a_benign_row():
    g = torch.Generator().manual_seed(3)
    case = _case(torch.randn(4, 256, generator=g), torch.randn(256, generator=g), torch.randn(4, 256, generator=g))
    expected = SPEC.given(case, {})
    b = expected["rstd"]
    # the worst case of an fp32 sum of 256 squares: (H + 3) 2^-24 on m, half of it on rstd, either side
    rstd_width = (b.high - b.low) / b.exact
    assert np.all(rstd_width < 2.0**-15)
    b = expected["out"]
    width = (b.high - b.low) / np.abs(b.exact)
    # out's interval is rstd's, widened by its three fp32 products (and by nothing else on normal values)
    assert np.all(width < rstd_width[:, None] + 2.0**-20)


def test_sum_of_squares_past_fp32_frees_the_row_only():
    x = torch.ones(2, 64)
    x[1] = 2.0**70  # s^2 = 2^140 overflows fp32
    expected = SPEC.given(_case(x), {})
    assert np.all(np.isinf(expected["out"].low[1])) and np.all(np.isfinite(expected["out"].low[0]))
    assert np.isinf(expected["rstd"].high[1]) and np.isfinite(expected["rstd"].high[0])


# -- the eager implementation against the oracle ------------------------------------------------


@pytest.mark.parametrize("dtype", [BF16, F32])
@pytest.mark.parametrize("hidden", [1, 3, 100, 7168])
@pytest.mark.parametrize("with_weight, with_residual", [(False, False), (True, False), (False, True), (True, True)])
def test_torch_forward_against_the_oracle(dtype, hidden, with_weight, with_residual):
    g = torch.Generator().manual_seed(hidden)
    x = torch.randn(5, hidden, generator=g).to(dtype)
    w = torch.randn(hidden, generator=g).to(dtype) if with_weight else None
    r = torch.randn(5, hidden, generator=g).to(dtype) if with_residual else None
    _judge_torch(_case(x, w, r, eps=1e-5, out_scale=3.0))
    out, rstd, s = eager.norm(x, w, r)
    assert out.dtype == dtype and rstd.dtype == F32 and s.dtype == dtype
    assert (s is x) == (r is None)


def test_torch_forward_on_non_finite_zero_and_huge_rows():
    x = torch.randn(6, 48)
    x[0] = 0.0
    x[1, 3] = math.inf
    x[2, 5] = math.nan
    x[3] = 2.0**66  # past fp32's sum of squares: free
    x[4] *= 2.0**-140  # subnormal squares
    _judge_torch(_case(x.to(BF16), torch.randn(48).to(BF16)))
    _judge_torch(_case(x, torch.randn(48), torch.zeros(6, 48)))


def test_empty_batch():
    x = torch.empty(0, 16, dtype=BF16)
    out, rstd, s = eager.norm(x, torch.ones(16, dtype=BF16), torch.empty(0, 16, dtype=BF16))
    assert out.shape == (0, 16) and rstd.shape == (0,) and s.shape == (0, 16)
    gx, gw, gr = eager.norm_bwd(torch.empty_like(x), None, x, torch.ones(16, dtype=BF16), x, rstd=rstd,
                                norm_input=s)
    assert gx.shape == (0, 16) and gw.tolist() == [0.0] * 16 and gr is gx


@pytest.mark.parametrize("wrong, output", [
    (lambda **kw: eager.norm(**{**kw, "out_scale": 1.0}), "out"),  # out_scale ignored
    (lambda **kw: eager.norm(**{**kw, "eps": 1e-3}), "rstd"),  # another eps
    (lambda **kw: (lambda o, r, s: (o, r, s.to(torch.float32)))(*eager.norm(**kw)), "norm_input"),  # wrong dtype
    (lambda **kw: eager.norm(kw["x"], kw["weight"], None, kw["eps"], kw["out_scale"]), "norm_input"),  # no residual
])
def test_a_wrong_implementation_is_caught(wrong, output):
    g = torch.Generator().manual_seed(9)
    x, w, r = torch.randn(3, 32, generator=g) * 2.0**-12, torch.randn(32, generator=g), torch.randn(3, 32, generator=g)
    case = _case(x.to(BF16), w.to(BF16), (r * 2.0**-12).to(BF16), out_scale=3.0)
    with pytest.raises(VerificationError, match=output):
        check_case(SPEC, Impl("wrong", wrong, device="cpu"), case, case_dir=None, excuse=False)


# -- the backward ----------------------------------------------------------------------------


@checks
@given(strat.norm_cases())
def test_torch_backward_passes_the_gradient_checks(case):
    gradients.check_gradients(SPEC, "torch", case, seed=1)


def test_backward_without_residual_is_the_zero_residual_gradient():
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(4, 40, generator=g).to(BF16), torch.randn(40, generator=g).to(BF16)
    grad = torch.randn(4, 40, generator=g).to(BF16)
    _, rstd, s = eager.norm(x, w)
    gx, gw, gr = eager.norm_bwd(grad, None, x, w, rstd=rstd, norm_input=s)
    zx, zw, _ = eager.norm_bwd(grad, None, x, w, torch.zeros_like(x), rstd=rstd, norm_input=s)
    assert gr is None and torch.equal(gx, zx) and torch.equal(gw, zw)
    gx, gw, gr = eager.norm_bwd(grad, None, x, None, rstd=rstd, norm_input=s)
    assert gw is None


# -- bad arguments ---------------------------------------------------------------------------


def _fwd_args(**change):
    args = {"x": torch.randn(3, 8), "weight": torch.randn(8), "residual": torch.randn(3, 8), "eps": 1e-6,
            "out_scale": 1.0}
    args.update(change)
    return args


@pytest.mark.parametrize("change, error, name", [
    ({"x": torch.randn(3, 8, dtype=F64)}, TypeError, "x"),
    ({"x": torch.randn(8)}, ValueError, "x"),
    ({"x": torch.randn(3, 0), "weight": torch.randn(0), "residual": torch.randn(3, 0)}, ValueError, "x"),
    ({"x": torch.randn(8, 3).t()}, ValueError, "x"),
    ({"weight": torch.randn(8, dtype=BF16)}, TypeError, "weight"),
    ({"weight": torch.randn(9)}, ValueError, "weight"),
    ({"residual": torch.randn(3, 9)}, ValueError, "residual"),
    ({"residual": [[0.0] * 8] * 3}, TypeError, "residual"),
    ({"eps": 0.0}, ValueError, "eps"),
    ({"eps": math.nan}, ValueError, "eps"),
    ({"eps": "1e-6"}, TypeError, "eps"),
    ({"out_scale": math.inf}, ValueError, "out_scale"),
    ({"out_scale": True}, TypeError, "out_scale"),
])
def test_forward_refuses_bad_arguments(change, error, name):
    with pytest.raises(error, match=name):
        eager.norm(**_fwd_args(**change))


@pytest.mark.parametrize("change, error, name", [
    ({"grad_out": torch.randn(3, 8, dtype=BF16)}, TypeError, "grad_out"),
    ({"grad_out": torch.randn(3, 7)}, ValueError, "grad_out"),
    ({"grad_norm_input": torch.randn(2, 8)}, ValueError, "grad_norm_input"),
    ({"rstd": torch.ones(3, dtype=F64)}, TypeError, "rstd"),
    ({"rstd": torch.ones(4)}, ValueError, "rstd"),
    ({"norm_input": torch.randn(3, 7)}, ValueError, "norm_input"),
])
def test_backward_refuses_bad_arguments(change, error, name):
    args = {"grad_out": torch.randn(3, 8), "grad_norm_input": None, **_fwd_args(), "rstd": torch.ones(3),
            "norm_input": torch.randn(3, 8)}
    args.update(change)
    with pytest.raises(error, match=name):
        eager.norm_bwd(**args)


# -- quant.norm_forward_and_per_token_cast ------------------------------------------------------------

CAST = registry.get("quant.norm_forward_and_per_token_cast")


def test_norm_cast_oracle_is_the_cast_of_the_rounded_norm():
    import references.quant as quant_ref

    g = torch.Generator().manual_seed(4)
    x, w, r = torch.randn(3, 64, generator=g).to(BF16), torch.randn(64, generator=g).to(BF16), \
        torch.randn(3, 64, generator=g).to(BF16)
    data, sf, rstd, s = ref.norm_forward_and_per_token_cast(x, w, r, 1e-6, 0.5, "e4m3", 32, round_sf=True)
    out, rstd_norm, s_norm = ref.norm(x, w, r, 1e-6, 0.5)
    want_data, want_sf = quant_ref.per_token_cast(out.to(BF16), "e4m3", 32, round_sf=True)
    assert torch.equal(data.view(torch.uint8), want_data.view(torch.uint8)) and torch.equal(sf, want_sf)
    assert torch.equal(rstd, rstd_norm) and torch.equal(s, s_norm)


@checks
@given(strat.norm_cast_cases())
def test_norm_cast_torch_against_the_oracle(case):
    for comparison in check_case(CAST, CAST.impls["torch"], case, case_dir=None):
        assert comparison.passed, comparison.message


def test_norm_cast_non_finite_rows():
    x = torch.randn(4, 64)
    x[1, 3] = math.inf
    x[2, 40] = math.nan
    x[3] = 2.0**66  # free
    case = Case(params={"eps": 1e-6, "out_scale": 1.0, "fmt": "e4m3", "num_per_channels": 32},
                inputs={"x": x.to(BF16), "weight": torch.ones(64, dtype=BF16), "residual": torch.zeros(4, 64, dtype=BF16)})
    for comparison in check_case(CAST, CAST.impls["torch"], case, case_dir=None):
        assert comparison.passed, comparison.message
    data, sf, _, _ = eager.norm_forward_and_per_token_cast(**case.inputs, **case.params)
    assert torch.isnan(sf[1, 0]) and torch.isfinite(sf[1, 1])  # the inf's block only (out = s * 0 elsewhere)
    assert torch.isnan(sf[2]).all()


def test_norm_cast_wrong_implementation_is_caught():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(3, 64, generator=g).to(BF16)
    case = Case(params={"eps": 1e-6, "out_scale": 0.25, "fmt": "e4m3", "num_per_channels": 32},
                inputs={"x": x, "weight": torch.ones(64, dtype=BF16), "residual": torch.zeros_like(x)})
    wrong = Impl("wrong", lambda **kw: eager.norm_forward_and_per_token_cast(**{**kw, "out_scale": 1.0}), device="cpu")
    with pytest.raises(VerificationError, match="sf"):
        check_case(CAST, wrong, case, case_dir=None, excuse=False)


@pytest.mark.parametrize("change, error, name", [
    ({"fmt": "e3m4"}, ValueError, "fmt"),
    ({"num_per_channels": 3}, ValueError, "num_per_channels"),
    ({"eps": -1.0}, ValueError, "eps"),
    ({"x": torch.randn(3, 8, dtype=F64)}, TypeError, "x"),
])
def test_norm_cast_refuses_bad_arguments(change, error, name):
    args = {**_fwd_args(), "fmt": "e4m3", "num_per_channels": 8}
    args.update(change)
    with pytest.raises(error, match=name):
        eager.norm_forward_and_per_token_cast(**args)
