"""The gradient-check machinery (tkverify/gradients.py): it catches deliberately wrong
backwards - in the float64 oracle (gradcheck) and in an implementation (against the
oracle, and against its own forward) - and passes the right ones; the declaration,
the pytest parametrisation, the report's gradient table and the replay."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import references.engram as ref
import references.quant_swiglu as swiglu_ref
from kernels.torch import engram as torch_engram
from strategies import torch_copy
from tkverify import cli, gradients, registry
from tkverify.case import Case, load_case, save_case
from tkverify.plugin import gradient_params
from tkverify.registry import Backward, Impl
from tkverify.report import Collector, merge_gradient_shards, meta, write_report
from tkverify.suite import test_gradients  # noqa: F401  (the suite's gradient test, collected here too)

# -- backwards with one deliberate mistake each -----------------------------------------

VARIANTS = {
    # grad_x without the term through rx: - A rx^2 x / H
    "missing_term": {"x"},
    # drx/dx as if rx = 1 / (sqrt(m) + eps): -rx^2 x / (H sqrt(m)) instead of -rx^3 x / H
    "eps_outside_sqrt": {"x", "k"},
    # da/dz = 1 / (2 sqrt(max(|z|, c))) everywhere: the gate's gradient left on below the clamp
    "gate_on_below_clamp": {"x", "k", "w"},
}
# (and "gate_sign", the gradient through the gate negated: a gross mistake for the coarse check)


def backward_core(grad, x, k, v, w, d, g, rx, rk, clamp, variant=None):
    """The Engram backward's formulas (as in references/engram.py), with an optional mistake."""
    hidden = x.shape[-1]
    s = 1.0 / math.sqrt(hidden)
    gg = (grad * v[:, None, :]).sum(-1)
    z = d * rx * rk * s
    dadz = 0.5 * torch.rsqrt(torch.clamp(z.abs(), min=clamp))
    if variant != "gate_on_below_clamp":
        dadz = torch.where(z.abs() >= clamp, dadz, torch.zeros_like(dadz))
    gz = gg * g * (1 - g) * dadz
    if variant == "gate_sign":
        gz = -gz
    gd = gz * rx * rk * s
    a_ = gz * z
    if variant == "eps_outside_sqrt":
        cx = a_ * rx / (hidden * torch.sqrt((x * x).mean(-1)).clamp_min(1e-30))
        ck = a_ * rk / (hidden * torch.sqrt((k * k).mean(-1)).clamp_min(1e-30))
    else:
        cx, ck = a_ * rx * rx / hidden, a_ * rk * rk / hidden
    grad_x = grad + gd[..., None] * w * k
    if variant != "missing_term":
        grad_x = grad_x - cx[..., None] * x
    grad_k = gd[..., None] * w * x - ck[..., None] * k
    return grad_x, grad_k, (grad * g[..., None]).sum(1), (gd[..., None] * x * k).sum(0)


def oracle_backward(variant):
    """A float64 'hand-derived' backward with the mistake `variant`."""

    def bwd(grad_out, x, k, v, w, eps, clamp):
        f = [t.detach().double() for t in (grad_out, x, k, v, w)]
        _, d, g, rx, rk = ref.engram_gate_fwd(*f[1:], eps, clamp)
        return backward_core(f[0], *f[1:], d, g, rx, rk, clamp, variant)

    return bwd


def impl_backward(variant):
    """An implementation's backward with the mistake `variant`: fp32 maths on bf16, or float64."""

    def bwd(grad_out, x, k, v, w, d, g, rx, rk, eps, clamp):
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        f = [t.to(acc) for t in (grad_out, x, k, v)]
        gx, gk, gv, gw = backward_core(f[0], f[1], f[2], f[3], w, d, g, rx, rk, clamp, variant)
        return gx.to(x.dtype), gk.to(x.dtype), gv.to(x.dtype), gw

    return bwd


def spec_with(oracle_variant=None, impl_variant=None):
    """engram.gate with a broken float64 backward and/or a broken implementation "broken"."""
    base = registry.get("engram.gate")
    bw = base.backward
    impls = dict(base.impls)
    bimpls = {"torch": bw.impls["torch"]}
    if impl_variant is not None:
        impls["broken"] = Impl("broken", torch_engram.engram_gate_fwd, device="cpu")
        bimpls["broken"] = Impl("broken", impl_backward(impl_variant), device="cpu")
    oracle = oracle_backward(oracle_variant) if oracle_variant else bw.oracle
    return dataclasses.replace(base, impls=impls, backward=dataclasses.replace(bw, oracle=oracle, impls=bimpls))


def crafted_case(eps=1e-2, clamp=1e-3, seed=7):
    """Rows where each mistake matters: rms(x) = 0.1 (m = 0.01 ~ eps), head 0 live
    (|z| >> clamp), every token of head 1 in the clamp's dead zone (0 < |z| <= clamp / 2)."""
    rng = np.random.default_rng(seed)
    tokens, heads, hidden = 3, 2, 64
    x = torch_copy((rng.standard_normal((tokens, heads, hidden)) * 0.1).astype(np.float32)).to(torch.bfloat16)
    k = torch_copy(rng.standard_normal((tokens, heads, hidden)).astype(np.float32)).to(torch.bfloat16)
    v = torch_copy(rng.standard_normal((tokens, hidden)).astype(np.float32)).to(torch.bfloat16)
    w = rng.standard_normal((heads, hidden)).astype(np.float32)
    z = ref.gate_argument(x, k, torch.from_numpy(w), eps).numpy()
    w[1] *= np.float32(0.5 * clamp / np.abs(z[:, 1]).max())
    case = Case(params={"eps": eps, "clamp": clamp}, inputs={"x": x, "k": k, "v": v, "w": torch_copy(w)})
    z = ref.gate_argument(x, k, case.inputs["w"], eps)
    assert (z[:, 0].abs() > 50 * clamp).all() and (z[:, 1].abs() < clamp).all() and (z[:, 1] != 0).all()
    return case


def gate_dominated_case(eps=1e-2, clamp=1e-3, seed=11):
    """Like `crafted_case`, with the gate's terms large against the residual one: v ~ 64,
    head 0 live just above the clamp (|z| <= 4 clamp), k small."""
    rng = np.random.default_rng(seed)
    tokens, heads, hidden = 3, 2, 64
    x = torch_copy((rng.standard_normal((tokens, heads, hidden)) * 0.1).astype(np.float32)).to(torch.bfloat16)
    k = torch_copy((rng.standard_normal((tokens, heads, hidden)) * 0.1).astype(np.float32)).to(torch.bfloat16)
    v = torch_copy((rng.standard_normal((tokens, hidden)) * 64).astype(np.float32)).to(torch.bfloat16)
    w = rng.standard_normal((heads, hidden)).astype(np.float32)
    z = ref.gate_argument(x, k, torch.from_numpy(w), eps).numpy()
    w[0] *= np.float32(4 * clamp / np.abs(z[:, 0]).max())
    w[1] *= np.float32(0.5 * clamp / np.abs(z[:, 1]).max())
    return Case(params={"eps": eps, "clamp": clamp}, inputs={"x": x, "k": k, "v": v, "w": torch_copy(w)})


def failing_inputs(results, check):
    return {r.input for r in results if r.check == check and not r.passed}


# -- the correct backwards pass --------------------------------------------------------


def test_correct_float64_backward_passes_gradcheck():
    spec = registry.get("engram.gate")
    results = gradients.oracle_gradcheck(spec, crafted_case(), seed=3)
    assert {r.input for r in results} == {"x", "k", "v", "w"}
    assert all(r.passed and r.impl == gradients.ORACLE for r in results), [r.message for r in results]
    assert all(r.count == 1 and r.error <= r.bound for r in results)


@pytest.mark.parametrize("figures, passed", [((math.nan, 1.0, 1.0), False), ((math.nan, math.inf, 1.0), True),
                                             ((2.0, 1.0, 1.0), False)])
def test_the_oracles_directional_check_fails_a_nan_error_unless_its_bound_is_infinite(monkeypatch, figures, passed):
    """The float64 backward's central-difference check reads a NaN error as a miss (not as "not above the
    bound"), and an infinite bound as no claim, the rule of the implementations' consistency checks."""
    monkeypatch.setattr(gradients, "central_difference_float64", lambda *args: figures)
    results = gradients.oracle_gradcheck(registry.get("engram.gate"), crafted_case(), seed=3)
    assert results and all(r.passed == passed for r in results), [r.message for r in results]


@pytest.mark.parametrize("precision", ["float64", "working"])
def test_correct_implementation_passes(precision):
    spec = registry.get("engram.gate")
    case = crafted_case()
    results = gradients.impl_vs_oracle(spec, "torch", case, seed=3)
    results += gradients.consistency(spec, "torch", case, seed=3, precision=precision)
    assert {(r.check, r.input) for r in results} == {(c, i) for c in ("vs_oracle", "consistency")
                                                     for i in ("x", "k", "v", "w")}
    assert all(r.passed for r in results), [r.message for r in results if not r.passed]


# -- the wrong ones fail, and where they should -------------------------------------------


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_gradcheck_catches_a_wrong_float64_backward(variant):
    results = gradients.oracle_gradcheck(spec_with(oracle_variant=variant), crafted_case(), seed=3)
    assert failing_inputs(results, "gradcheck") == VARIANTS[variant]
    bad = [r for r in results if not r.passed]
    # torch.autograd.gradcheck itself fails, and so does the directional comparison beside it.
    assert all("Jacobian mismatch" in r.message and "central difference" in r.message for r in bad)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_comparison_with_the_oracle_catches_a_wrong_implementation(variant):
    results = gradients.impl_vs_oracle(spec_with(impl_variant=variant), "broken", crafted_case(), seed=3)
    assert failing_inputs(results, "vs_oracle") == VARIANTS[variant]
    assert all("worst at index" in r.message for r in results if not r.passed)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_consistency_in_float64_catches_a_wrong_implementation(variant):
    """The broken implementation's forward is right, its backward is not its derivative."""
    results = gradients.consistency(spec_with(impl_variant=variant), "broken", crafted_case(), seed=3,
                                    precision="float64")
    assert failing_inputs(results, "consistency") == VARIANTS[variant]


@pytest.mark.parametrize("variant, caught", [
    ("gate_on_below_clamp", {"k", "w"}),
    ("gate_sign", {"x", "k", "w"}),  # the gradient through the gate with the wrong sign: a gross mistake
    (None, set()),
])
def test_consistency_in_working_precision_catches_what_it_can_resolve(variant, caught):
    """In bf16/fp32 the check resolves a few % of a directional derivative (its bound is the
    rigorous fp32 noise of g times |v|, the bf16 gradient's rounding, and the truncation of a
    2^-4 step): it needs a case where the gate's terms dominate, and catches gross mistakes
    there; the subtler ones are left to the comparison with the oracle and to float64."""
    spec = spec_with(impl_variant=variant) if variant else registry.get("engram.gate")
    results = gradients.consistency(spec, "broken" if variant else "torch", gate_dominated_case(), seed=3,
                                    precision="working")
    assert {r.input for r in results} == {"x", "k", "v", "w"}
    assert failing_inputs(results, "consistency") == caught
    assert all(r.bound is not None and r.bound < 0.1 for r in results)  # informative, to 10 %


def test_working_precision_step_is_exactly_central():
    x = torch.tensor([1.0, 1.5, -2.0, 2.0**-133, 0.0, 3.3895e38], dtype=torch.bfloat16)
    target = torch.tensor([0.01, -0.02, 0.04, 1e-41, 1e-3, 1e37], dtype=torch.float64)
    delta = gradients._representable_step(x, target)
    x64 = x.double()
    for t in (x64 + delta, x64 - delta):
        assert torch.equal(t.to(torch.bfloat16).double(), t)  # both ends representable
    assert delta[-1] == 0  # the largest bf16 has no representable neighbour that far up


# -- steps far larger than the inputs: the finite differences' own error ----------------------------


def subnormal_swiglu_case():
    """quant.swiglu, fp32, clamp 0.5, one row (l | r) where every kept output is ~1e-44 (each r, or both l and
    r, subnormal) while fd_scale steps l and r by at least 2^-6: the u-steps are ~1e34 times the inputs, and
    the output silu(l4) r4 (l4, r4 both subnormal) has a central difference of ~1e23 (the term
    silu''(0) a^2 b / 2 of steps a, b) where its derivative is ~0.02."""
    x = [math.inf, 0.43131816387176514, -1.0229883193969727, math.nan, 1.3592595103950726e-43,
         7.006492321624085e-45, 0.7511647939682007,
         -math.inf, 1.1911036946760945e-43, 1.3032075718220799e-43, 0.006109460256993771, 4.90454462513686e-44,
         0.20830121636390686, 1.401298464324817e-43]
    x32 = torch.tensor([x], dtype=torch.float32)
    finite = torch.isfinite(x32)
    assert torch.equal(x32[finite].double(), torch.tensor([x], dtype=torch.float64)[finite])  # exact fp32 values
    return Case(params={"clamp": 0.5, "fmt": "fp32"}, inputs={"x": x32})


def wrong_swiglu_backward(variant):
    """quant.swiglu's float64 backward with a mistake: "dr_without_sigmoid" (dr = g w l'),
    "dl_sign" (dl negated)."""

    def bwd(grad_out, x, fmt="bf16", **kwargs):
        grad = swiglu_ref.swiglu_bwd(grad_out, x, fmt, **kwargs).clone()
        hidden = grad.shape[1] // 2
        if variant == "dl_sign":
            grad[:, :hidden] = -grad[:, :hidden]
        else:
            terms = swiglu_ref.SwigluTerms(torch.as_tensor(x).double().numpy(), clamp=kwargs.get("clamp"))
            g = torch.as_tensor(grad_out).double().numpy()
            dr = np.where(terms.r_passes & (g != 0), g * terms.l, 0.0)
            grad[:, hidden:] = torch.from_numpy(dr)
        return grad

    base = registry.get("quant.swiglu")
    return dataclasses.replace(base, backward=dataclasses.replace(base.backward, oracle=bwd))


def test_gradcheck_allows_the_truncation_of_steps_far_larger_than_the_inputs():
    """The hand backward is right here (torch.autograd agrees); gradcheck's numerical column of the output whose
    l and r are both subnormal is pure truncation (it quadruples when the step doubles), which the
    Richardson allowance measures."""
    spec, case = registry.get("quant.swiglu"), subnormal_swiglu_case()
    x = case.inputs["x"].double().requires_grad_(True)
    y = swiglu_ref.swiglu_fwd_torch(x, **case.params)
    cot = torch.from_numpy(np.random.default_rng(1).standard_normal(tuple(y.shape)))
    kept = torch.isfinite(y)
    (autograd,) = torch.autograd.grad(y[kept], x, cot[kept])
    hand = swiglu_ref.swiglu_bwd(torch.where(kept, cot, 0.0), case.inputs["x"], **case.params)
    stepped = gradients.fd_scales(spec, case)["x"] > 0  # an element of a finite (l, r) pair
    assert torch.allclose(hand[stepped], autograd[stepped], rtol=1e-15, atol=0)
    results = gradients.oracle_gradcheck(spec, case, seed=0)
    assert [r.input for r in results] == ["x"]
    assert all(r.passed for r in results), [r.message for r in results]


@pytest.mark.parametrize("variant", ["dl_sign", "dr_without_sigmoid"])
def test_gradcheck_still_catches_a_wrong_backward_at_steps_far_larger_than_the_inputs(variant):
    results = gradients.oracle_gradcheck(wrong_swiglu_backward(variant), subnormal_swiglu_case(), seed=0)
    assert failing_inputs(results, "gradcheck") == {"x"}
    assert all("Jacobian mismatch" in r.message and "own error" in r.message for r in results)


# -- running, recording, replaying -----------------------------------------------------


def test_check_gradients_saves_a_replayable_case(tmp_path, capsys):
    spec = spec_with(impl_variant="missing_term")
    case = crafted_case()
    seen = []
    with pytest.raises(gradients.GradientError) as info:
        gradients.check_gradients(spec, "broken", case, 5, case_dir=tmp_path, record=lambda r, d: seen.append(r))
    text = str(info.value)
    assert "gradient checks fail" in text and "tkverify replay" in text
    assert {r.check for r in seen} == {"vs_oracle", "consistency"} and any(not r.passed for r in seen)
    saved, about = load_case(info.value.case_file)
    assert about["gradient"]["seed"] == 5 and about["impl"] == "broken"
    assert torch.equal(saved.inputs["x"].view(torch.int16), case.inputs["x"].view(torch.int16))

    # The replay finds the same failure through the CLI, once the broken backward is registered.
    real = registry.get("engram.gate")
    real.impls["broken"], real.backward.impls["broken"] = spec.impls["broken"], spec.backward.impls["broken"]
    try:
        assert cli.main(["replay", str(info.value.case_file)]) == 1
        assert "FAIL" in capsys.readouterr().out
        assert cli.main(["replay", str(info.value.case_file), "--impl", "torch"]) == 0
        assert "PASS" in capsys.readouterr().out
    finally:
        del real.impls["broken"], real.backward.impls["broken"]


def test_backward_declaration_needs_one_gradient_per_input():
    with pytest.raises(ValueError, match="one gradient per differentiable input"):
        Backward(inputs=("x", "k"), grads={"grad_x": None}, outputs=("out",), oracle=ref.engram_gate_bwd, impls={})
    bw = registry.get("engram.gate").backward
    assert bw.grad_of("w") == "grad_w" and bw.saved == ("d", "g", "rx", "rk")


def test_gradient_parametrisation():
    ids = {p.id: p for p in gradient_params("auto")}
    assert "engram.gate-oracle" in ids and "engram.gate-torch" in ids
    assert not ids["engram.gate-torch"].marks
    tilelang = {p.id: p for p in gradient_params("tilelang")}["engram.gate-tilelang"]
    if not torch.cuda.is_available():
        assert any(m.name == "skip" for m in tilelang.marks)


def test_report_has_a_gradient_table(tmp_path):
    spec = registry.get("engram.gate")
    case = crafted_case()
    whole, shards = Collector(), [Collector(), Collector()]
    broken = spec_with(impl_variant="missing_term")
    checks = (gradients.oracle_gradcheck(spec, case, 1) + gradients.impl_vs_oracle(spec, "torch", case, 1)
              + gradients.consistency(spec, "torch", case, 1)
              + gradients.impl_vs_oracle(broken, "broken", case, 1))
    for i, r in enumerate(checks):
        whole.add_gradient(r, case.describe())
        shards[i % 2].add_gradient(r, case.describe())
    for i, s in enumerate(shards):
        s.write_shard(tmp_path / "shards" / f"gw{i}.json", worker=f"gw{i}", gpu=None, pid=0)
    merged = merge_gradient_shards((tmp_path / "shards").glob("*.json"))
    assert len(merged) == len(whole.gradients)
    for row in merged:
        ref_row = whole.gradients[row.key]
        for field in ("cases", "count", "failures", "verdict", "max_error", "max_bound"):
            assert getattr(row, field) == getattr(ref_row, field), field

    paths = write_report(tmp_path / "out", [], meta("ci", "torch"), gradients=merged)
    doc = json.loads(paths["json"].read_text())
    rows = doc["gradients"]
    assert {r["check"] for r in rows} == {"gradcheck", "vs_oracle", "consistency"}
    for r in rows:
        for key in ("op", "input", "impl", "check", "max_error", "unit", "verdict", "kind"):
            assert key in r
    failed = [r for r in rows if r["verdict"] == "fail"]
    assert {(r["impl"], r["input"]) for r in failed} == {("broken", "x")}
    md = paths["md"].read_text()
    assert "## Gradients" in md and "| engram.gate | x | broken | vs_oracle |" in md and "**FAIL**" in md
    assert "<h2>Gradients</h2>" in paths["html"].read_text()


# -- backward options: several cotangent dtypes, an optional output's gradient ----------------------------


def test_a_tuple_of_cotangent_dtypes_is_cycled_through_by_the_examples():
    bw = dataclasses.replace(registry.get("quant.swiglu").backward, grad_dtype=(torch.bfloat16, torch.float32))
    chosen = set()
    for i in range(12):
        case = Case(params={}, inputs={"x": torch.full((1, 4), float(i), dtype=torch.bfloat16)})
        first = bw.cotangent_dtype(case, seed=0)
        assert bw.cotangent_dtype(case, seed=0) == first  # deterministic per example
        chosen.add(first)
    assert chosen == {torch.bfloat16, torch.float32}
    fixed = dataclasses.replace(bw, grad_dtype=torch.float32)
    assert fixed.cotangent_dtype(Case(params={}, inputs={}), seed=5) == torch.float32


def test_a_case_chooses_its_cotangent_dtype_among_the_backwards():
    bw = dataclasses.replace(registry.get("quant.swiglu").backward, grad_dtype=(torch.bfloat16, torch.float32))
    x = {"x": torch.ones((1, 4), dtype=torch.bfloat16)}
    for name, dtype in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        assert all(bw.cotangent_dtype(Case({}, x, cotangent_dtype=name), seed) == dtype for seed in range(8))
    with pytest.raises(ValueError, match="takes bfloat16, float32"):
        bw.cotangent_dtype(Case({}, x, cotangent_dtype="float16"), seed=0)


def test_the_quant_swiglu_cases_cycle_the_cotangent_dtype_and_the_case_file_keeps_it(tmp_path):
    from hypothesis import find
    strategy = registry.get("quant.swiglu").strategy()
    for name in ("bfloat16", "float32"):
        case = find(strategy, lambda c, name=name: c.cotangent_dtype == name)
        loaded, _ = load_case(save_case(tmp_path / name, case, op="quant.swiglu", impl="torch"))
        assert loaded.cotangent_dtype == name


def test_an_optional_outputs_zero_cotangent_goes_to_the_backward_as_none():
    seen = []

    def backward(grad_out, grad_norm_input, x, weight=None, residual=None, **kwargs):
        seen.append(grad_norm_input)
        return grad_out, weight, grad_out

    spec = registry.get("quant.norm")
    bw = dataclasses.replace(spec.backward, impls={"fake": Impl("fake", backward, device="cpu")}, saved=())
    spec = dataclasses.replace(spec, backward=bw)
    x = torch.ones(2, 4)
    for cot, expect_none in ((torch.zeros(2, 4), True), (torch.ones(2, 4), False)):
        gradients._run_backward(spec, "fake", {"out": torch.ones(2, 4), "norm_input": cot},
                                {"x": x, "weight": torch.ones(4), "residual": x}, {}, {}, torch.device("cpu"))
        assert (seen[-1] is None) == expect_none
    not_optional = dataclasses.replace(spec, backward=dataclasses.replace(bw, optional_outputs=()))
    gradients._run_backward(not_optional, "fake", {"out": torch.ones(2, 4), "norm_input": torch.zeros(2, 4)},
                            {"x": x, "weight": torch.ones(4), "residual": x}, {}, {}, torch.device("cpu"))
    assert seen[-1] is not None  # only a declared optional output's gradient is left out


FREE_GRADIENT_CASE = Path(__file__).parent / "regressions" / "mhc.head_compute_mix-free-gradient-nan.json"


def _backward_with_nan_in(monkeypatch, grad_input: str) -> None:
    """torch's backward, with every element of the gradient of `grad_input` replaced by NaN."""
    spec = registry.get("mhc.head_compute_mix")
    run_backward = gradients._run_backward

    def nan_gradient(*args, **kwargs):
        grads = run_backward(*args, **kwargs)
        name = spec.backward.grad_of(grad_input)
        grads[name] = torch.full_like(grads[name], math.nan)
        return grads

    monkeypatch.setattr(gradients, "_run_backward", nan_gradient)


def _checks_of(grad_input: str) -> list[gradients.GradientCheck]:
    spec = registry.get("mhc.head_compute_mix")
    case, meta = load_case(FREE_GRADIENT_CASE)
    seed = meta["gradient"]["seed"]
    checks = gradients.impl_vs_oracle(spec, "torch", case, seed) + \
        gradients.consistency(spec, "torch", case, seed, precision="working")
    return [c for c in checks if c.input == grad_input]


def test_a_nan_gradient_where_the_contract_leaves_it_free_passes_both_checks(monkeypatch):
    """scale 0 and mixes near 1e38: grad_scale is an fp32 sum of terms near 1e37 that may overflow, so the contract
    takes any value there (vs_oracle's range is unbounded) and the consistency check, whose bound is then infinite,
    must not fail on the NaN a backward that overflows returns (tile-kernels 2.1.0 on the H200)."""
    _backward_with_nan_in(monkeypatch, "scale")
    checks = _checks_of("scale")
    assert [c.check for c in checks] == ["vs_oracle", "consistency"]
    assert all(c.passed for c in checks), [c.message for c in checks]


def test_a_nan_gradient_where_the_contract_bounds_it_still_fails(monkeypatch):
    """On the same case grad_base is bounded: a NaN there fails vs_oracle and the consistency check alike."""
    _backward_with_nan_in(monkeypatch, "base")
    checks = _checks_of("base")
    assert [c.check for c in checks] == ["vs_oracle", "consistency"]
    assert not any(c.passed for c in checks)
