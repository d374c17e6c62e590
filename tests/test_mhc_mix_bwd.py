"""The backward passes of mHC's pre_split_mixes, pre_apply_mix and post: the float64 oracle (hand-worked
values, against torch.autograd of the float64 forward, gradcheck), the eager backward against it, the
judges rejecting wrong gradients, empty batches and bad arguments."""

import numpy as np
import pytest
import torch

import references.mhc as ref
from kernels.torch import mhc as impl
from tkverify import gradients, registry
from tkverify.case import Case

BF16, F32, F64 = torch.bfloat16, torch.float32, torch.float64


def _apply_inputs(seed=0, a=2, b=3, m=4, h=9):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(a, b, h, generator=g).to(BF16), torch.randn(a, b, m, h, generator=g).to(BF16),
            torch.rand(a, b, m, 1, generator=g))


def _post_inputs(seed=0, a=2, b=3, m=4, h=9):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(a, b, m, h, generator=g).to(BF16), torch.randn(a, b, h, generator=g).to(BF16),
            torch.randn(a, b, m, h, generator=g).to(BF16), torch.rand(a, b, m, 1, generator=g) * 2,
            torch.rand(a, b, m, m, generator=g))


def test_apply_mix_backward_hand_worked():
    # one token, m = 2, H = 2: out = x0 mix0 + x1 mix1
    g = np.array([[[1.0, -2.0]]])
    x = np.array([[[[1.0, 2.0], [3.0, 4.0]]]])
    mix = np.array([[[[0.5], [-1.0]]]])
    grad_x, grad_mix = ref.pre_apply_mix_bwd(g, x, mix)
    assert np.array_equal(grad_x, [[[[0.5, -1.0], [-1.0, 2.0]]]])
    assert np.array_equal(grad_mix, [[[[1 * 1 - 2 * 2], [1 * 3 - 2 * 4]]]])


def test_post_backward_hand_worked():
    # one token, m = 2, H = 1: out[n] = x post[n] + sum_i comb[i, n] residual[i]
    g = np.array([[[[1.0], [2.0]]]])
    x = np.array([[[3.0]]])
    residual = np.array([[[[5.0], [7.0]]]])
    post = np.array([[[[0.5], [0.25]]]])
    comb = np.array([[[[1.0, 2.0], [3.0, 4.0]]]])
    gx, gr, gp, gc = ref.post_bwd(g, x, residual, post, comb)
    assert np.array_equal(gx, [[[1 * 0.5 + 2 * 0.25]]])
    assert np.array_equal(gr, [[[[1 * 1 + 2 * 2], [3 * 1 + 4 * 2]]]])
    assert np.array_equal(gp, [[[[1 * 3.0], [2 * 3.0]]]])
    assert np.array_equal(gc, [[[[5 * 1, 5 * 2], [7 * 1, 7 * 2]]]])


def _autograd(forward, cot, *inputs):
    leaves = [torch.tensor(np.asarray(t, dtype=np.float64), requires_grad=True) for t in inputs]
    out = forward(*leaves)
    return [t.numpy() for t in torch.autograd.grad(out, leaves, torch.tensor(np.asarray(cot, dtype=np.float64)))]


def test_backward_oracles_equal_float64_autograd():
    g, x, mix = (t.double().numpy() for t in _apply_inputs(1))
    auto = _autograd(lambda x, mix: (x * mix).sum(-2), g, x, mix)
    for hand, want in zip(ref.pre_apply_mix_bwd(g, x, mix), auto):
        np.testing.assert_allclose(hand, want, rtol=1e-12, atol=1e-12)
    g, x, residual, post, comb = (t.double().numpy() for t in _post_inputs(2))
    auto = _autograd(lambda x, r, p, c: x[..., None, :] * p + torch.einsum("abin,abih->abnh", c, r),
                     g, x, residual, post, comb)
    for hand, want in zip(ref.post_bwd(g, x, residual, post, comb), auto):
        np.testing.assert_allclose(hand, want, rtol=1e-12, atol=1e-12)


def test_oracle_is_zero_on_tokens_with_a_nonfinite_input():
    g, x, mix = _apply_inputs(3)
    x[0, 1, 2, 4] = float("inf")
    grad_x, grad_mix = ref.pre_apply_mix_bwd(g, x, mix)
    assert not grad_x[0, 1].any() and not grad_mix[0, 1].any()
    assert grad_x[0, 0].any() and np.isfinite(grad_mix).all()


@pytest.mark.parametrize("op, inputs", [("mhc.pre_apply_mix", _apply_inputs), ("mhc.post", _post_inputs)])
def test_float64_backward_passes_gradcheck_and_eager_backward_is_within_its_bounds(op, inputs):
    spec = registry.get(op)
    names = ("x", "mix") if op == "mhc.pre_apply_mix" else ("x", "residual", "post", "comb")
    case = Case(params={}, inputs=dict(zip(names, inputs(4)[1:])))
    checks = gradients.run_checks(spec, gradients.ORACLE, case, seed=5)
    assert checks and all(c.passed for c in checks), [c.message for c in checks]
    checks = gradients.run_checks(spec, "torch", case, seed=6)
    assert checks and all(c.passed for c in checks), [c.message for c in checks]


def test_bracket_rejects_a_gradient_one_term_off():
    spec = registry.get("mhc.pre_apply_mix")
    g, x, mix = _apply_inputs(7)
    case = Case(params={}, inputs={"x": x, "mix": mix})
    exact = dict(zip(("grad_x", "grad_mix"), (torch.from_numpy(t) for t in ref.pre_apply_mix_bwd(g, x, mix))))
    expected = spec.backward.given(case, {"out": g}, exact)
    grad_x, grad_mix = impl.pre_apply_mix_bwd(g, x, mix)
    assert spec.backward.grads["grad_mix"].compare("grad_mix", grad_mix, expected["grad_mix"]).passed
    wrong = grad_mix - (g.float()[..., None, -1:] * x.float()[..., -1:])  # the last channel left out
    assert not spec.backward.grads["grad_mix"].compare("grad_mix", wrong, expected["grad_mix"]).passed
    assert not spec.backward.grads["grad_x"].compare("grad_x", grad_x.float(), expected["grad_x"]).passed  # dtype


def test_empty_batches():
    g, x, mix = _apply_inputs(a=1, b=0)
    grad_x, grad_mix = impl.pre_apply_mix_bwd(g, x, mix)
    assert grad_x.shape == x.shape and grad_mix.shape == mix.shape
    outs = impl.post_bwd(*_post_inputs(a=0, b=2))
    assert [o.numel() for o in outs] == [0, 0, 0, 0]


def test_bad_arguments_name_the_argument():
    g, x, mix = _apply_inputs()
    with pytest.raises(TypeError, match="grad_out"):
        impl.pre_apply_mix_bwd(g.float(), x, mix)
    with pytest.raises(ValueError, match="grad_out"):
        impl.pre_apply_mix_bwd(g[..., :-1].contiguous(), x, mix)
    with pytest.raises(TypeError, match="mix"):
        impl.pre_apply_mix_bwd(g, x, mix.double())
    g, x, residual, post, comb = _post_inputs()
    with pytest.raises(ValueError, match="grad_out"):
        impl.post_bwd(g[:, :, :-1].contiguous(), x, residual, post, comb)
    with pytest.raises(TypeError, match="comb"):
        impl.post_bwd(g, x, residual, post, comb.to(BF16))
    with pytest.raises(ValueError, match="grad_out"):
        impl.post_bwd(g.transpose(-1, -2), x, residual, post, comb)


# -- pre_split_mixes' backward ----------------------------------------------------------------

SPLIT = registry.get("mhc.pre_split_mixes")


def _split_case(m=3, a=2, b=3, post_mult=2.0, seed=0) -> Case:
    g = torch.Generator().manual_seed(seed)
    width = m * (m + 2)
    return Case(params={"m": m, "post_mult": post_mult, "pre_eps": 1e-6},
                inputs={"mixes": torch.randn(a, b, width, generator=g) * 2, "scale": torch.rand(3, generator=g) + 0.5,
                        "base": torch.randn(width, generator=g)})


def _split_cotangents(case: Case, seed=1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lead, m = tuple(case.inputs["mixes"].shape[:2]), case.params["m"]
    return {"pre": torch.randn(*lead, m, 1, generator=g), "post": torch.randn(*lead, m, 1, generator=g),
            "comb": torch.randn(*lead, m, m, generator=g)}


def _split_bwd(impl_fn, case: Case, cots: dict[str, torch.Tensor]):
    return impl_fn(cots["pre"], cots["post"], cots["comb"], **case.inputs, **case.params)


def test_split_mixes_backward_hand_worked():
    # one token, m = 2, every u exactly 0 (sigmoid 1/2, sigmoid' 1/4); scale (1, 2, 3), post_mult 1/2
    mixes = np.array([[[1.0, -2.0, 0.5, 1.0, 1.0, -1.0, 2.0, 0.5]]])
    base = np.array([-1.0, 2.0, -1.0, -2.0, -3.0, 3.0, -6.0, -1.5])
    scale = np.array([1.0, 2.0, 3.0])
    grad_pre, grad_post = np.array([[[[1.0], [2.0]]]]), np.array([[[[4.0], [-4.0]]]])
    grad_comb = np.array([[[[1.0, 2.0], [3.0, 4.0]]]])
    grad_mixes, grad_scale, grad_base = ref.pre_split_mixes_bwd(grad_pre, grad_post, grad_comb, mixes, scale, base,
                                                                2, 0.5, 1e-6)
    t = [0.25, 0.5, 0.5, -0.5, 1.0, 2.0, 3.0, 4.0]
    assert np.array_equal(grad_base, t)
    assert np.array_equal(grad_mixes, [[[0.25, 0.5, 1.0, -1.0, 3.0, 6.0, 9.0, 12.0]]])
    assert np.array_equal(grad_scale, [0.25 * 1 - 0.5 * 2, 0.5 * 0.5 - 0.5 * 1, 1 * 1 - 2 * 1 + 3 * 2 + 4 * 0.5])


@pytest.mark.parametrize("post_mult", [2.0, 0.0, -1.5])
def test_split_mixes_backward_equals_float64_autograd(post_mult):
    case = _split_case(m=4, post_mult=post_mult, seed=2)
    cots = _split_cotangents(case)
    m = 4
    leaves = [case.inputs[n].double().requires_grad_(True) for n in ("mixes", "scale", "base")]
    u = leaves[0] * leaves[1].repeat_interleave(torch.tensor([m, m, m * m])) + leaves[2]
    outs = (torch.sigmoid(u[..., :m]) + 1e-6, torch.sigmoid(u[..., m:2 * m]) * post_mult, u[..., 2 * m:])
    loss = sum((o * cots[n].double().reshape(o.shape)).sum() for o, n in zip(outs, ("pre", "post", "comb")))
    auto = torch.autograd.grad(loss, leaves)
    hand = _split_bwd(ref.pre_split_mixes_bwd, case, cots)
    for h, want in zip(hand, auto):
        np.testing.assert_allclose(h, want.numpy(), rtol=1e-12, atol=1e-12)
    if post_mult == 0.0:
        assert not hand[0][..., m:2 * m].any() and hand[1][1] == 0.0 and not hand[2][m:2 * m].any()


def test_split_mixes_oracle_leaves_out_tokens_outside_the_domain():
    case = _split_case(seed=3)
    cots = _split_cotangents(case)
    inside = _split_bwd(ref.pre_split_mixes_bwd, case, cots)
    case.inputs["mixes"][1, 2, 4] = float("inf")
    grad_mixes, grad_scale, grad_base = _split_bwd(ref.pre_split_mixes_bwd, case, cots)
    assert not grad_mixes[1, 2].any() and np.array_equal(grad_mixes[:1], inside[0][:1])
    assert np.isfinite(grad_scale).all() and np.isfinite(grad_base).all()
    assert not np.array_equal(grad_base, inside[2])  # that token's terms are gone


@pytest.mark.parametrize("m, post_mult", [(2, 2.0), (4, 0.0), (8, -1.5)])
def test_split_mixes_backward_gradchecks_and_eager_within_its_bounds(m, post_mult):
    case = _split_case(m=m, post_mult=post_mult, seed=m)
    for impl_name in (gradients.ORACLE, "torch"):
        checks = gradients.run_checks(SPLIT, impl_name, case, seed=m + 1)
        assert checks and all(c.passed for c in checks), [c.message for c in checks if not c.passed]


def test_split_mixes_bracket_rejects_wrong_gradients():
    case = _split_case(m=3, a=1, b=40, post_mult=2.0, seed=5)
    cots = _split_cotangents(case)
    exact = dict(zip(SPLIT.backward.grads, (torch.from_numpy(t) for t in _split_bwd(ref.pre_split_mixes_bwd, case,
                                                                                     cots))))
    expected = SPLIT.backward.given(case, cots, exact)
    grad_mixes, grad_scale, grad_base = _split_bwd(impl.pre_split_mixes_bwd, case, cots)
    policies = SPLIT.backward.grads
    for name, got in zip(policies, (grad_mixes, grad_scale, grad_base)):
        assert policies[name].compare(name, got, expected[name]).passed
    short = dict(case.inputs, mixes=case.inputs["mixes"][:, 1:].contiguous())  # one token's terms left out
    short_cots = {n: c[:, 1:].contiguous() for n, c in cots.items()}
    _, scale_short, base_short = impl.pre_split_mixes_bwd(short_cots["pre"], short_cots["post"], short_cots["comb"],
                                                          **short, **case.params)
    assert not policies["grad_base"].compare("grad_base", base_short, expected["grad_base"]).passed
    assert not policies["grad_scale"].compare("grad_scale", scale_short, expected["grad_scale"]).passed
    unscaled = dict(case.params, post_mult=1.0)  # post_mult left out of post's slopes
    wrong = impl.pre_split_mixes_bwd(cots["pre"], cots["post"], cots["comb"], **case.inputs, **unscaled)[0]
    assert not policies["grad_mixes"].compare("grad_mixes", wrong, expected["grad_mixes"]).passed


def test_split_mixes_backward_empty_batch():
    case = _split_case(a=2, b=0)
    grad_mixes, grad_scale, grad_base = _split_bwd(impl.pre_split_mixes_bwd, case, _split_cotangents(case))
    assert grad_mixes.shape == (2, 0, 15) and not grad_scale.any() and not grad_base.any()
    assert grad_scale.shape == (3,) and grad_base.shape == (15,)


def test_split_mixes_backward_bad_arguments_name_the_argument():
    case = _split_case()
    cots = _split_cotangents(case)
    with pytest.raises(TypeError, match="grad_pre"):
        impl.pre_split_mixes_bwd(cots["pre"].double(), cots["post"], cots["comb"], **case.inputs, **case.params)
    with pytest.raises(ValueError, match="grad_post"):
        impl.pre_split_mixes_bwd(cots["pre"], cots["post"][..., :2, :].contiguous(), cots["comb"], **case.inputs,
                                 **case.params)
    with pytest.raises(ValueError, match="grad_comb"):
        impl.pre_split_mixes_bwd(cots["pre"], cots["post"], cots["comb"].transpose(-1, -2), **case.inputs,
                                 **case.params)
    with pytest.raises(ValueError, match="m"):
        impl.pre_split_mixes_bwd(cots["pre"], cots["post"], cots["comb"], **case.inputs,
                                 **dict(case.params, m=4))
