"""The TileLang mHC kernels (kernels.mhc) on a CUDA device, against the float64 oracle and the eager code.

GPU tests (skipped, with the reason, without CUDA or tilelang):

* Sinkhorn forward and backward within the spec's per-matrix / per-element
  bounds (tkverify/specs/mhc.py), for every m in 2..8, repeat 1..30, the eps
  values the strategy draws and an eps below 2^-64 (the kernels' exact-division
  path); batch sizes that are not a multiple of a block; leading dims of any
  rank, 0 included (empty in, empty out); NaN / +inf / all -inf rows make
  exactly their own matrix NaN; the autograd Function against the two kernels
  (bit for bit: it calls them); float64 and bad arguments rejected before any
  launch.
* The mix ops against a float64 model of their contract (with the same fp32
  roundings and order where the contract fixes them): pre_split_mixes with
  +-inf and NaN logits (sigmoid exactly 0 and 1), pre_apply_mix and post for
  m = 2..8 and H in {1, 7, 8, 9, 1000, 1024, 7168} (H % 8 != 0 runs the scalar
  configuration, a misaligned view too).
"""

from __future__ import annotations


import numpy as np
import pytest
import torch

import references.mhc as ref
from tkverify.specs import mhc as spec


@pytest.fixture(scope="module")
def mhc(tilelang_family):
    return tilelang_family("mhc")


def _logits(shape, seed, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * scale
    flat = x.view(-1, shape[-2], shape[-1])
    if flat.shape[0] > 2:
        flat[0, :, 0] += 30.0  # a dominant column: the badly conditioned case
        flat[1] += torch.eye(shape[-1]) * 20.0  # near a permutation
        flat[-1, 0, :] -= 20.0  # entries with softmax weights near eps
    return x


def _check_forward(x_cpu, out, repeat, eps):
    exact = ref.sinkhorn(x_cpu.double(), repeat, eps)
    bound = torch.from_numpy(spec.forward_bound(x_cpu, repeat, eps))
    got = out.cpu().double()
    assert torch.equal(got.isnan(), exact.isnan())
    finite = ~exact.isnan()
    err = ((got - exact).abs() - bound * exact.abs())[finite]
    assert err.numel() == 0 or err.max().item() <= 0, f"forward outside the bound by {err.max().item():.3g}"


def _check_backward(x_cpu, g_cpu, grad, repeat, eps):
    exact = ref.sinkhorn_bwd(g_cpu.double(), x_cpu.double(), repeat, eps)
    bound = torch.from_numpy(spec.gradient_bound(x_cpu, g_cpu, repeat, eps))
    excess = (grad.cpu().double() - exact).abs() - bound
    assert excess.max().item() <= 0, f"gradient outside the bound by {excess.max().item():.3g}"


@pytest.mark.parametrize("m", range(2, 9))
@pytest.mark.parametrize("repeat,eps", [(1, 1e-6), (10, 1e-6), (3, 1e-3), (30, 1e-8), (10, 2.0**-70)])
def test_sinkhorn_within_bounds(mhc, m, repeat, eps):
    x = _logits((301, m, m), seed=m * 100 + repeat)
    g = _logits((301, m, m), seed=m * 100 + repeat + 1, scale=1.0)
    out = mhc.sinkhorn(x.cuda(), repeat, eps)
    _check_forward(x, out, repeat, eps)
    grad = mhc.sinkhorn_bwd(g.cuda(), x.cuda(), repeat, eps)
    _check_backward(x, g, grad, repeat, eps)


def test_sinkhorn_default_shape_and_large_batch(mhc):
    x = _logits((3, 65536 // 3 + 7, 4, 4), seed=1)
    out = mhc.sinkhorn(x.cuda())
    assert out.shape == x.shape and out.dtype == torch.float32
    _check_forward(x[:, :500], out[:, :500], 10, 1e-6)
    _check_forward(x[:, -500:], out[:, -500:], 10, 1e-6)


@pytest.mark.parametrize("shape", [(0, 4, 4), (2, 0, 3, 3), (0, 8, 8), (4, 4)])
def test_sinkhorn_empty_and_unbatched(mhc, shape):
    x = _logits(shape, seed=2).cuda()
    out = mhc.sinkhorn(x)
    grad = mhc.sinkhorn_bwd(torch.ones_like(x), x)
    assert out.shape == grad.shape == x.shape
    if x.numel():
        _check_forward(x.cpu(), out, 10, 1e-6)


@pytest.mark.parametrize("m", [3, 4, 7])
def test_sinkhorn_nonfinite_matrices(mhc, m):
    x = torch.randn(9, m, m)
    x[1, 0, 1] = float("nan")
    x[2, m - 1, m - 1] = float("inf")
    x[3, 1, :] = float("-inf")  # a row of -inf: NaN
    x[4, 0, 0] = float("-inf")  # a single -inf: weight 0, an ordinary matrix
    x[5] = float("nan")
    out = mhc.sinkhorn(x.cuda()).cpu()
    nan = [1, 2, 3, 5]
    for i in range(9):
        if i in nan:
            assert out[i].isnan().all(), i
        else:
            assert out[i].isfinite().all(), i
    _check_forward(x, out, 10, 1e-6)


def test_autograd_function_calls_the_kernels(mhc):
    x = _logits((37, 4, 4), seed=3).cuda().requires_grad_()
    g = torch.randn(37, 4, 4, device="cuda")
    p = mhc.Sinkhorn.apply(x, 7, 1e-6)
    (grad,) = torch.autograd.grad(p, x, g)
    assert torch.equal(p.detach(), mhc.sinkhorn(x.detach(), 7, 1e-6))
    assert torch.equal(grad, mhc.sinkhorn_bwd(g, x.detach(), 7, 1e-6))
    # a non-contiguous cotangent is made contiguous by the Function
    gt = g.transpose(-1, -2).contiguous().transpose(-1, -2)
    (grad_t,) = torch.autograd.grad(mhc.Sinkhorn.apply(x, 7, 1e-6), x, gt)
    assert torch.equal(grad_t, mhc.sinkhorn_bwd(g.contiguous(), x.detach(), 7, 1e-6))


def test_sinkhorn_rejects_bad_arguments(mhc):
    x = torch.randn(4, 4, 4, device="cuda")
    with pytest.raises(TypeError, match="x"):
        mhc.sinkhorn(x.double())
    with pytest.raises(TypeError, match="x"):
        mhc.sinkhorn_bwd(x.double(), x.double())
    with pytest.raises(TypeError, match="grad_out"):
        mhc.sinkhorn_bwd(x.double(), x)
    with pytest.raises(ValueError, match="x"):
        mhc.sinkhorn(torch.randn(4, 9, 9, device="cuda"))
    with pytest.raises(ValueError, match="x"):
        mhc.sinkhorn(torch.randn(4, 1, 1, device="cuda"))
    with pytest.raises(ValueError, match="x"):
        mhc.sinkhorn(torch.randn(4, 3, 4, device="cuda"))
    with pytest.raises(ValueError, match="x"):
        mhc.sinkhorn(x.transpose(-1, -2))
    with pytest.raises(ValueError, match="x"):
        mhc.sinkhorn(x.cpu())
    with pytest.raises(ValueError, match="grad_out"):
        mhc.sinkhorn_bwd(torch.randn(3, 4, 4, device="cuda"), x)
    with pytest.raises(TypeError, match="repeat"):
        mhc.sinkhorn(x, 2.0)
    with pytest.raises(ValueError, match="repeat"):
        mhc.sinkhorn(x, 0)
    with pytest.raises(ValueError, match="eps"):
        mhc.sinkhorn(x, 10, 0.0)
    with pytest.raises(ValueError, match="eps"):
        mhc.sinkhorn(x, 10, float("inf"))


# ------------------------------------------------------------------ mix ops


def _sigmoid32(u: torch.Tensor) -> torch.Tensor:
    return 1.0 / (1.0 + torch.exp(-u))


@pytest.mark.parametrize("m", [2, 4, 8])
def test_pre_split_mixes(mhc, m):
    a, b, width = 3, 41, m * (m + 2)
    g = torch.Generator().manual_seed(m)
    mixes = torch.randn(a, b, width, generator=g) * 4
    mixes[0, 0, 0], mixes[0, 0, m] = float("inf"), float("-inf")
    mixes[0, 1, 1], mixes[0, 1, m + 1] = float("-inf"), float("inf")
    mixes[0, 2, 0], mixes[0, 2, 2 * m] = float("nan"), float("nan")
    scale = torch.tensor([1.5, 0.5, 2.0])
    base = torch.randn(width, generator=g)
    pre, post, comb = mhc.pre_split_mixes(mixes.cuda(), scale.cuda(), base.cuda(), m, 2.0, 1e-6)
    s = torch.cat([scale[0].expand(m), scale[1].expand(m), scale[2].expand(m * m)])
    u = mixes * s + base  # fp32, two roundings, as the kernel
    want_pre = (_sigmoid32(u[..., :m]) + 1e-6).unsqueeze(-1)
    want_post = (_sigmoid32(u[..., m:2 * m]) * 2.0).unsqueeze(-1)
    want_comb = u[..., 2 * m:].reshape(a, b, m, m)
    for got, want in ((pre, want_pre), (post, want_post), (comb, want_comb)):
        assert got.shape == want.shape and got.dtype == torch.float32
        torch.testing.assert_close(got.cpu(), want, rtol=2**-21, atol=0, equal_nan=True)
    assert post[0, 0, 0, 0].item() == 0.0 and post[0, 1, 1, 0].item() == 2.0
    assert pre[0, 1, 1, 0].item() == np.float32(1e-6)
    assert pre[0, 2, 0, 0].isnan() and comb[0, 2, 0, 0].isnan()
    empty = mhc.pre_split_mixes(mixes[:, :0].cuda(), scale.cuda(), base.cuda(), m, 2.0, 1e-6)
    assert [t.shape for t in empty] == [(a, 0, m, 1), (a, 0, m, 1), (a, 0, m, m)]


def _apply_mix_model(x, mix):
    acc = torch.zeros(x.shape[:2] + x.shape[3:], dtype=torch.float32)
    for i in range(x.shape[2]):
        acc = acc + x[:, :, i].float() * mix[:, :, i]
    return acc.to(torch.bfloat16)


def _post_model(x, residual, post, comb):
    m = residual.shape[2]
    outs = []
    for n in range(m):
        acc = x.float() * post[:, :, n]
        for i in range(m):
            acc = acc + comb[:, :, i, n, None] * residual[:, :, i].float()
        outs.append(acc.to(torch.bfloat16))
    return torch.stack(outs, dim=2)


# 2056, 4104: one 16-byte vector past post's CTA spans (256 and 512 vectors); 7168: a last CTA with
# half its chunks; 4097, 7169: the scalar configuration across many CTAs.  m = 3, 5 leave padded
# rows of MP = 4, 8.
@pytest.mark.parametrize("m", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("hidden", [1, 7, 8, 9, 1000, 1024, 2056, 4097, 4104, 7168, 7169])
def test_pre_apply_mix_and_post(mhc, m, hidden):
    a, b = 2, 5
    g = torch.Generator().manual_seed(m * 10000 + hidden)
    x = (torch.randn(a, b, m, hidden, generator=g) * 2).to(torch.bfloat16)
    mix = torch.randn(a, b, m, 1, generator=g)
    got = mhc.pre_apply_mix(x.cuda(), mix.cuda())
    assert got.shape == (a, b, hidden) and got.dtype == torch.bfloat16
    assert torch.equal(got.cpu(), _apply_mix_model(x, mix))

    xh = torch.randn(a, b, hidden, generator=g).to(torch.bfloat16)
    post = torch.rand(a, b, m, 1, generator=g) * 2
    comb = torch.rand(a, b, m, m, generator=g)
    got = mhc.post(xh.cuda(), x.cuda(), post.cuda(), comb.cuda())
    assert got.shape == (a, b, m, hidden) and got.dtype == torch.bfloat16
    assert torch.equal(got.cpu(), _post_model(xh, x, post, comb))


@pytest.mark.parametrize("hidden", [8, 1000, 2056, 4104, 7168])
def test_post_tuning_candidates_match_the_model(mhc, hidden):
    """Every configuration a tuning run may time (kernels.mhc.POST_TUNE_CONFIGS) is exact too."""
    a, b, m = 1, 3, 4
    g = torch.Generator().manual_seed(hidden)
    x = torch.randn(a, b, hidden, generator=g).to(torch.bfloat16)
    residual = (torch.randn(a, b, m, hidden, generator=g) * 2).to(torch.bfloat16)
    post = torch.rand(a, b, m, 1, generator=g) * 2
    comb = torch.randn(a, b, m, m, generator=g)
    want = _post_model(x, residual, post, comb)
    for config in mhc.POST_TUNE_CONFIGS:
        mhc.POST_OVERRIDES[(config.vectorized, config.padded)] = config
        try:
            got = mhc.post(x.cuda(), residual.cuda(), post.cuda(), comb.cuda())
        finally:
            mhc.POST_OVERRIDES.clear()
        assert torch.equal(got.cpu(), want), config


def test_mix_ops_misaligned_and_empty(mhc):
    m, hidden = 4, 64
    storage = torch.randn(3 * m * hidden + 1, device="cuda").to(torch.bfloat16)
    x = storage[1:].view(1, 3, m, hidden)  # 2-byte offset: the scalar configuration
    mix = torch.randn(1, 3, m, 1, device="cuda")
    assert torch.equal(mhc.pre_apply_mix(x, mix).cpu(), _apply_mix_model(x.cpu(), mix.cpu()))
    assert mhc.pre_apply_mix(x[:, :0], mix[:, :0]).shape == (1, 0, hidden)
    xh = torch.randn(1, 0, hidden, device="cuda").to(torch.bfloat16)
    out = mhc.post(xh, x[:, :0], mix[:, :0], torch.zeros(1, 0, m, m, device="cuda"))
    assert out.shape == (1, 0, m, hidden)


def test_mix_ops_nan_propagates(mhc):
    m, hidden = 4, 16
    x = torch.randn(1, 2, m, hidden, device="cuda").to(torch.bfloat16)
    mix = torch.randn(1, 2, m, 1, device="cuda")
    mix[0, 1, 2, 0] = float("nan")
    out = mhc.pre_apply_mix(x, mix)
    assert out[0, 1].isnan().all() and not out[0, 0].isnan().any()
    comb = torch.rand(1, 2, m, m, device="cuda")
    comb[0, 0, 3, 1] = float("nan")
    res = mhc.post(x[:, :, 0].contiguous(), x, torch.rand(1, 2, m, 1, device="cuda"), comb)
    assert res[0, 0, 1].isnan().all()
    assert not res[0, 0, 0].isnan().any() and not res[0, 1].isnan().any()


def test_mix_ops_reject_bad_arguments(mhc):
    m, hidden = 4, 16
    x = torch.randn(1, 2, m, hidden, device="cuda").to(torch.bfloat16)
    mix = torch.randn(1, 2, m, 1, device="cuda")
    with pytest.raises(TypeError, match="x"):
        mhc.pre_apply_mix(x.float(), mix)
    with pytest.raises(TypeError, match="mix"):
        mhc.pre_apply_mix(x, mix.double())
    with pytest.raises(ValueError, match="mix"):
        mhc.pre_apply_mix(x, mix[:, :, :3])
    with pytest.raises(ValueError, match="x"):
        mhc.pre_apply_mix(x[..., :0], mix)
    with pytest.raises(ValueError, match="x"):
        mhc.pre_apply_mix(x.transpose(-1, -2), mix)
    with pytest.raises(ValueError, match="x"):
        mhc.pre_apply_mix(torch.zeros(1, 2, 9, 4, dtype=torch.bfloat16, device="cuda"), torch.zeros(1, 2, 9, 1,
                                                                                                  device="cuda"))
    comb = torch.rand(1, 2, m, m, device="cuda")
    xh = x[:, :, 0].contiguous()
    with pytest.raises(ValueError, match="x"):
        mhc.post(x[:, :, 0], x, mix, comb)  # a strided view
    with pytest.raises(ValueError, match="comb"):
        mhc.post(xh, x, mix, comb[..., :3].contiguous())
    with pytest.raises(ValueError, match="residual"):
        mhc.post(xh, x[..., :8].contiguous(), mix, comb)
    with pytest.raises(TypeError, match="post"):
        mhc.post(xh, x, mix.half(), comb)
    mixes = torch.randn(1, 2, m * (m + 2), device="cuda")
    scale, base = torch.ones(3, device="cuda"), torch.zeros(m * (m + 2), device="cuda")
    with pytest.raises(ValueError, match="mixes"):
        mhc.pre_split_mixes(mixes, scale, base, 3, 1.0, 0.0)
    with pytest.raises(ValueError, match="m"):
        mhc.pre_split_mixes(mixes, scale, base, 9, 1.0, 0.0)
    with pytest.raises(ValueError, match="pre_eps"):
        mhc.pre_split_mixes(mixes, scale, base, m, 1.0, -1.0)
    with pytest.raises(ValueError, match="post_mult"):
        mhc.pre_split_mixes(mixes, scale, base, m, float("nan"), 0.0)
    with pytest.raises(ValueError, match="scale"):
        mhc.pre_split_mixes(mixes, scale[:2], base, m, 1.0, 0.0)
