"""The TileLang kernels of mHC's fused pre-block pieces (kernels.mhc.fused_norm) on a CUDA device.

GPU tests (skipped, with the reason, without CUDA or tilelang):

* norm_fn: bit for bit the fp32 product fn * normw (the eager code's on the same device), for K
  with and without 16-byte vectors (K % 4, a misaligned view), non-finite values and subnormals;
  its backward: grad_fn bit for bit, grad_normw bit for bit a float32 sum in row order from +0.
* reduce_partials_and_rmsnorm: out_mul and sqrsum bit for bit float32 sums in split order; out
  within the spec's bracket; for S in 1, 3, 16, G in 1, 2, M = m (m + 2) for m 2..8, token
  counts that are not a multiple of the block; zero rows, infinite and NaN partials; its backward
  within the spec's brackets.
* multilayer_recompute (pre_apply_mix and post kernels per layer): every layer within the spec's
  bounds, judged from the residual the kernels wrote; P = L and L - 1; m 2..8; H with and without
  16-byte vectors; layer l's outputs bit for bit those of the two kernels called by hand.
* Empty batches (no launch) and the argument checks (float64 refused before any launch).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import references.mhc_fused as ref
from tkverify import registry
from tkverify.case import Case
from tkverify.specs import mhc_fused as spec

REDUCE = registry.get("mhc.reduce_partials_and_rmsnorm")
RECOMPUTE = registry.get("mhc.multilayer_recompute")


@pytest.fixture(scope="module")
def fused(tilelang_family):
    return tilelang_family("mhc.fused_norm")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("rows,k", [(24, 28672), (24, 7), (8, 4), (80, 1001), (3, 1)])
def test_norm_fn_is_the_fp32_product(fused, rows, k):
    fn = torch.randn(rows, k, generator=_gen(k))
    w = torch.randn(k, generator=_gen(k + 1))
    fn[0, :3] = torch.tensor([float("inf"), float("nan"), 2.0**-140])[: min(3, k)]
    w[: min(2, k)] = torch.tensor([0.0, 1.0])[: min(2, k)]
    out = fused.fn_normw_merge(fn.cuda(), w.cuda()).cpu()
    torch.testing.assert_close(out, fn * w, rtol=0, atol=0, equal_nan=True)


def test_norm_fn_misaligned_view_runs_the_scalar_configuration(fused):
    buf = torch.randn(24 * 64 + 1, device="cuda")
    fn = buf[1:].view(24, 64)
    w = torch.randn(64, device="cuda")
    torch.testing.assert_close(fused.fn_normw_merge(fn, w), fn * w, rtol=0, atol=0)


@pytest.mark.parametrize("rows,k", [(24, 28672), (15, 9), (80, 1000)])
def test_norm_fn_backward_in_row_order(fused, rows, k):
    fn, g = torch.randn(rows, k, generator=_gen(3)), torch.randn(rows, k, generator=_gen(4))
    w = torch.randn(k, generator=_gen(5))
    grad_fn, grad_w = (t.cpu() for t in fused.fn_normw_merge_bwd(g.cuda(), fn.cuda(), w.cuda()))
    torch.testing.assert_close(grad_fn, g * w, rtol=0, atol=0)
    acc = np.zeros(k, dtype=np.float32)
    for j in range(rows):
        acc = acc + g[j].numpy() * fn[j].numpy()  # float32 products and sums, each rounded once
    np.testing.assert_array_equal(grad_w.numpy(), acc)


def _partials(splits, tokens, groups, width, seed):
    p = torch.randn(splits, tokens, groups, width, generator=_gen(seed))
    q = torch.rand(splits, tokens, groups, generator=_gen(seed + 1)) * 50
    if tokens > 2:
        p[:, 0], q[:, 0] = 0.0, 0.0  # a zero row
        p[0, 1, 0, 0], q[-1, 2, 0] = float("inf"), float("nan")
    return p, q


@pytest.mark.parametrize("splits,groups", [(1, 1), (3, 1), (16, 1), (2, 2)])
@pytest.mark.parametrize("m", range(2, 9))
def test_reduce_against_split_order_sums_and_the_bound(fused, splits, groups, m):
    width, tokens, size = m * (m + 2), 133, 4 * 7168
    p, q = _partials(splits, tokens, groups, width, seed=m * 100 + splits)
    out_mul, sqrsum, out = (t.cpu() for t in fused.reduce_partials_and_rmsnorm(p.cuda(), q.cuda(), size, 1e-6))
    np.testing.assert_array_equal(out_mul.numpy(), np.cumsum(p.numpy(), axis=0, dtype=np.float32)[-1])
    np.testing.assert_array_equal(sqrsum.numpy(), np.cumsum(q.numpy(), axis=0, dtype=np.float32)[-1])
    case = Case(params={"rms_group_size": size, "rms_eps": 1e-6}, inputs={"out_mul_splitted": p, "sqrsum_splitted": q})
    expected = spec.given_reduce(case, {})
    for name, value in (("out_mul", out_mul), ("sqrsum", sqrsum), ("out", out)):
        comp = REDUCE.outputs[name].compare(name, value, expected[name])
        assert comp.passed, comp.message


@pytest.mark.parametrize("splits,groups,tokens", [(16, 1, 16384), (3, 2, 129), (1, 1, 1)])
def test_reduce_backward_within_the_bound(fused, splits, groups, tokens):
    width, size = 24, 28672
    p, q = _partials(splits, tokens, groups, width, seed=7)
    p, q = p.nan_to_num(0.0, 0.0, 0.0), q.nan_to_num(0.0, 0.0, 0.0)
    g = torch.randn(tokens, width, generator=_gen(9))
    dev = [t.cuda() for t in (p, q)]
    out_mul, sqrsum, _ = fused.reduce_partials_and_rmsnorm(*dev, size, 1e-6)
    grads = fused.reduce_partials_and_rmsnorm_bwd(g.cuda(), *dev, out_mul, sqrsum, size, 1e-6)
    case = Case(params={"rms_group_size": size, "rms_eps": 1e-6}, inputs={"out_mul_splitted": p, "sqrsum_splitted": q})
    exact = dict(zip(REDUCE.backward.grads, ref.reduce_partials_and_rmsnorm_bwd(g, p, q, size, 1e-6)))
    expected = spec.given_reduce_backward(case, {"out": g}, exact)
    for (name, policy), value in zip(REDUCE.backward.grads.items(), grads):
        assert value.shape == (splits, *exact[name].shape[1:])
        comp = policy.compare(name, value.cpu(), expected[name])
        assert comp.passed, comp.message


def test_empty_batches_and_refusals(fused):
    out_mul, sqrsum, out = fused.reduce_partials_and_rmsnorm(torch.zeros(16, 0, 1, 24, device="cuda"),
                                                             torch.zeros(16, 0, 1, device="cuda"), 8, 1e-6)
    assert out_mul.shape == (0, 1, 24) and out.shape == (0, 24)
    assert fused.fn_normw_merge(torch.zeros(24, 0, device="cuda"), torch.zeros(0, device="cuda")).shape == (24, 0)
    with pytest.raises(TypeError, match="float32"):
        fused.fn_normw_merge(torch.zeros(2, 3, dtype=torch.float64, device="cuda"),
                             torch.zeros(3, dtype=torch.float64, device="cuda"))
    with pytest.raises(ValueError, match="CUDA"):
        fused.reduce_partials_and_rmsnorm(torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1), 8, 1e-6)
    with pytest.raises(ValueError, match="rms_eps"):
        fused.reduce_partials_and_rmsnorm(torch.zeros(1, 2, 1, 8, device="cuda"), torch.zeros(1, 2, 1, device="cuda"),
                                          8, -1.0)


@pytest.fixture(scope="module")
def recompute(tilelang_family):
    return tilelang_family("mhc.fused_recompute")


@pytest.mark.parametrize("layers,posts", [(1, 0), (3, 2), (4, 4)])
@pytest.mark.parametrize("m,hidden", [(2, 7), (4, 7168), (8, 129)])
def test_recompute_within_the_bounds_and_as_its_kernels(recompute, layers, posts, m, hidden):
    from kernels.mhc.apply_mix import pre_apply_mix
    from kernels.mhc.post_mix import post

    tokens = 67
    g = _gen(layers * 10 + m)
    inputs = {"initial_residual": torch.randn(tokens, m, hidden, generator=g).to(torch.bfloat16),
              "pre_mix": torch.rand(layers, tokens, m, generator=g),
              "layer_output": torch.randn(posts, tokens, hidden, generator=g).to(torch.bfloat16),
              "post_mix": torch.rand(posts, tokens, m, generator=g) * 2,
              "comb_mix": torch.rand(posts, tokens, m, m, generator=g) / m}
    dev = {k: v.cuda() for k, v in inputs.items()}
    layer_input, residual = recompute.multilayer_recompute(**dev)
    expected = RECOMPUTE.given(Case(params={}, inputs=inputs), {"layer_input": layer_input, "residual": residual})
    for name, value in (("layer_input", layer_input), ("residual", residual)):
        comp = RECOMPUTE.outputs[name].compare(name, value.cpu(), expected[name])
        assert comp.passed, comp.message
    current = dev["initial_residual"][None]
    for layer in range(layers):
        assert torch.equal(layer_input[layer], pre_apply_mix(current, dev["pre_mix"][layer][None, ..., None])[0])
        if layer < posts:
            current = post(dev["layer_output"][layer][None], current, dev["post_mix"][layer][None, ..., None],
                           dev["comb_mix"][layer][None])
            assert torch.equal(residual[layer], current[0])


def test_recompute_empty_batch(recompute):
    layer_input, residual = recompute.multilayer_recompute(
        torch.zeros(0, 4, 8, dtype=torch.bfloat16, device="cuda"), torch.zeros(2, 0, 4, device="cuda"),
        torch.zeros(2, 0, 8, dtype=torch.bfloat16, device="cuda"), torch.zeros(2, 0, 4, device="cuda"),
        torch.zeros(2, 0, 4, 4, device="cuda"))
    assert layer_input.shape == (2, 0, 8) and residual.shape == (2, 0, 4, 8)
