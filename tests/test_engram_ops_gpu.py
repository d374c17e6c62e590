"""The TileLang kernels of engram.fused_weight, engram.grad_w_reduce and engram.hash on a GPU.

GPU tests (skipped, with the reason, without CUDA or tilelang): each kernel against the eager
implementation and the oracle through its spec, on the strategies' cases and on hand-made ones that
reach every static configuration and tail: fused_weight vectorised (hc H a multiple of 8) and scalar,
misaligned views, every bf16 bit pattern; grad_w_reduce from 0 to 300 partials, in place, bitwise
equal to the gate backward's own reduction when both weights are 1 and the accumulators 0, and
bitwise reproducible; the hash with and without a mask, at the bench's size, T = 0.  Bad arguments:
CPU tensors and hc H not a multiple of 4 (grad_w_reduce) are refused with ValueError.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given

import gpu_settings

import references.engram as ref
import references.engram_hash as ref_hash
from kernels.torch import engram as eager
from strategies import engram as strat
from strategies import engram_hash as strat_hash
from tkverify import registry
from tkverify.case import Case
from tkverify.check import check_case
from tkverify.specs import engram_ops as spec_module

BF16 = torch.bfloat16
FUSED, REDUCE, HASH = (registry.get(f"engram.{op}") for op in ("fused_weight", "grad_w_reduce", "hash"))
gpu_fuzz = gpu_settings.gpu_fuzz(60)


@pytest.fixture(scope="module")
def engram(tilelang_family):
    return tilelang_family("engram")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t


# -- fused_weight ---------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (4, 8), (3, 1030), (4, 7168), (8, 7168)])
def test_fused_weight_equals_the_correctly_rounded_product(engram, shape):
    rng = np.random.default_rng(sum(shape))
    bits = rng.integers(0, 2**16, size=(2, *shape)).astype(np.uint16).view(np.int16)
    wh, we = (torch.from_numpy(b.copy()).view(BF16).cuda() for b in bits)
    out = engram.fused_weight(wh, we)
    expected = eager.fused_weight(wh.cpu(), we.cpu())
    nan = torch.isnan(expected)
    assert out.dtype == torch.float32 and out.shape == shape
    assert torch.equal(torch.isnan(out.cpu()), nan)
    assert torch.equal(_bits(out.cpu())[~nan], _bits(expected)[~nan])
    assert FUSED.outputs["weight_fused"].compare("weight_fused", out.cpu(), ref.fused_weight(wh, we).numpy()).passed


def test_fused_weight_of_misaligned_views(engram):
    base = torch.randn(2, 4 * 64 + 1, device="cuda").to(BF16)
    wh, we = base[0, 1:].view(4, 64), base[1, 1:].view(4, 64)  # 2 bytes past a 16-byte boundary
    assert torch.equal(engram.fused_weight(wh, we).cpu(), eager.fused_weight(wh.cpu(), we.cpu()))


@gpu_fuzz
@given(case=strat.fused_weight_cases())
def test_fused_weight_passes_its_spec(engram, case):
    check_case(FUSED, FUSED.impls["tilelang"], case, case_dir=None)


# -- grad_w_reduce ---------------------------------------------------------------------------------


def _reduce_inputs(parts: int, heads: int, hidden: int, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return {"grad_w_partial": torch.randn((parts, heads, hidden), generator=gen, device="cuda"),
            "weight_hidden": torch.randn((heads, hidden), generator=gen, device="cuda").to(BF16),
            "weight_embed": torch.randn((heads, hidden), generator=gen, device="cuda").to(BF16),
            "grad_weight_hidden": torch.randn((heads, hidden), generator=gen, device="cuda"),
            "grad_weight_embed": torch.randn((heads, hidden), generator=gen, device="cuda")}


@pytest.mark.parametrize("parts, heads, hidden", [(0, 2, 8), (1, 1, 4), (7, 3, 12), (128, 4, 7168), (300, 8, 100)])
def test_grad_w_reduce_accumulates_in_place_within_its_bound(engram, parts, heads, hidden):
    inputs = _reduce_inputs(parts, heads, hidden)
    case = Case({}, {k: v.cpu() for k, v in inputs.items()})
    acc_h, acc_e = inputs["grad_weight_hidden"], inputs["grad_weight_embed"]
    out_h, out_e = engram.grad_w_reduce(**inputs)
    assert out_h is acc_h and out_e is acc_e
    bounds = spec_module.given_grad_w_reduce(case, {})
    for name, out in (("grad_weight_hidden", out_h), ("grad_weight_embed", out_e)):
        assert REDUCE.outputs[name].compare(name, out.cpu(), bounds[name]).passed, name
    if parts == 0:
        assert torch.equal(out_h.cpu(), case.inputs["grad_weight_hidden"])


def test_grad_w_reduce_sums_as_the_gate_backward_does_and_reproducibly(engram):
    """With both weights 1 and zero accumulators each result is S itself, in the same fixed order as the
    reduction inside the gate backward (the unfused configuration): bitwise equal, run after run."""
    from kernels import _tilelang

    inputs = _reduce_inputs(128, 4, 7168, seed=3)
    ones = torch.ones((4, 7168), dtype=BF16, device="cuda")
    results = []
    for _ in range(2):
        acc = [torch.zeros((4, 7168), device="cuda") for _ in range(2)]
        engram.grad_w_reduce(inputs["grad_w_partial"], ones, ones, *acc)
        results.append(acc[0])
        assert torch.equal(_bits(acc[0]), _bits(acc[1]))
    plain = torch.empty(4 * 7168, device="cuda")
    kernel = _tilelang.kernel_for(engram.GRAD_W_REDUCE, engram.ReduceConfig(), plain.device)
    kernel(inputs["grad_w_partial"].view(128, -1), plain)
    assert torch.equal(_bits(results[0].view(-1)), _bits(plain)) and torch.equal(results[0], results[1])


@gpu_fuzz
@given(case=strat.grad_w_reduce_cases())
def test_grad_w_reduce_passes_its_spec(engram, case):
    check_case(REDUCE, REDUCE.impls["tilelang"], case, case_dir=None)


def test_grad_w_reduce_refuses_columns_not_in_float4(engram):
    with pytest.raises(ValueError, match="multiple of 4"):
        engram.grad_w_reduce(**_reduce_inputs(2, 1, 6))


# -- hash ------------------------------------------------------------------------------------------


@gpu_fuzz
@given(case=strat_hash.engram_hash_cases())
def test_hash_passes_its_spec(engram, case):
    check_case(HASH, HASH.impls["tilelang"], case, case_dir=None)


@pytest.mark.parametrize("masked", [False, True])
def test_hash_at_the_bench_size_equals_the_oracle(engram, masked):
    inputs, _ = spec_module.bench_hash_inputs(torch.device("cuda"))
    if masked:
        inputs["image_token_mask"] = torch.arange(inputs["ngram_token_ids"].shape[0], device="cuda") % 3 == 0
    else:
        inputs["image_token_mask"] = None
    out = engram.engram_hash(**inputs)
    expected = ref_hash.engram_hash(**{k: (v.cpu() if v is not None else None) for k, v in inputs.items()})
    assert out.dtype == torch.int32 and torch.equal(out.cpu(), expected)


def test_hash_of_no_tokens_launches_nothing(engram):
    out = engram.engram_hash(torch.empty(0, 3, dtype=torch.int32, device="cuda"),
                             torch.ones(2, 3, dtype=torch.int64, device="cuda"),
                             torch.ones(2, 2, 8, dtype=torch.int32, device="cuda"),
                             torch.zeros(2, 16, dtype=torch.int32, device="cuda"))
    assert out.shape == (2, 0, 16)


# -- bad arguments ---------------------------------------------------------------------------------


def test_cpu_tensors_are_refused(engram):
    wh = torch.ones(2, 8, dtype=BF16)
    with pytest.raises(ValueError, match="CUDA"):
        engram.fused_weight(wh, wh.clone())
    with pytest.raises(ValueError, match="CUDA"):
        engram.grad_w_reduce(torch.zeros(1, 2, 8), wh, wh.clone(), torch.zeros(2, 8), torch.zeros(2, 8))
    with pytest.raises(ValueError, match="CUDA"):
        engram.engram_hash(torch.zeros(1, 3, dtype=torch.int32), torch.ones(1, 3, dtype=torch.int64),
                           torch.ones(1, 2, 1, dtype=torch.int32), torch.zeros(1, 2, dtype=torch.int32))
